"""What the adapter tells an operator through logging (no Spark): what runs decide, and what its
background threads could not do."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

from segack.cli import main
from segack.kernel import SegmentSet
from segack.spark_adapter import merge, split
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.claims import ClaimKeeper, acquire, force_release
from segack.spark_adapter.store.rescale import RequestWatcher, SegmentChange, record_segments
from segack.spark_adapter.store.tokens import KeyGroupTokens


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(str(tmp_path / "checkpoint"))


def _lines(caplog, level=logging.INFO):
    return [(record.levelname, record.getMessage()) for record in caplog.records if record.levelno >= level
            and record.name.startswith("segack")]


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.claims
def test_claims_taken_taken_over_released_and_forced(store, caplog):
    caplog.set_level(logging.INFO, logger="segack")
    location = store.location
    first = acquire(store, "first", 60)
    with ClaimKeeper(store, first):
        pass
    second = acquire(store, "second", 0.05)
    time.sleep(0.1)
    third = acquire(store, "third", 60)
    force_release(store, "an operator")
    assert _lines(caplog) == [
        ("INFO", f"{location}: run first holds claim 1"),
        ("INFO", f"{location}: run first released claim 1"),
        ("INFO", f"{location}: run second holds claim 2"),
        ("INFO", f"{location}: run third took the checkpoint over from {second.owner()}, whose claim lapsed"),
        ("INFO", f"{location}: run third holds claim 3"),
        ("INFO", f"{location}: an operator released the claim of {third.owner()}"),
    ]


@pytest.mark.claims
def test_a_claim_whose_owner_died_is_taken_over_and_said_so(store, caplog):
    caplog.set_level(logging.INFO, logger="segack")
    crashed = acquire(store, "crashed", 3600)
    gone = dataclasses.replace(crashed, pid=_dead_pid())
    store.write_claim_file(crashed.number, gone.to_bytes())
    acquire(store, "next", 60)
    assert ("INFO", f"{store.location}: run next took the checkpoint over from {gone.owner()}, whose claim "
                    f"outlived its process") in _lines(caplog)


@pytest.mark.claims
def test_a_keeper_says_when_it_could_not_extend_or_release_and_when_its_claim_was_lost(store, caplog):
    caplog.set_level(logging.INFO, logger="segack")
    # Last extended 30 s ago: the warning must name that time, not the moment of the failed write.
    claim = acquire(store, "run", 60)
    claim = dataclasses.replace(claim, extended_at=claim.extended_at - 30)
    store.write_claim_file(claim.number, claim.to_bytes())
    real = store.write_claim_file

    def unreachable(number, data):
        raise OSError("the store is unreachable")

    with ClaimKeeper(store, claim) as keeper:
        store.write_claim_file = unreachable
        assert keeper.tick() is False
    store.write_claim_file = real
    stamp = time.strftime("%H:%M:%S", time.localtime(claim.extended_at))
    location = store.location
    assert _lines(caplog, logging.WARNING) == [
        ("WARNING", f"{location}: could not extend the claim of run run (it expires 60 s after {stamp}): the "
                    f"store is unreachable"),
        ("WARNING", f"{location}: could not release the claim of run run; it expires 60 s after it was last "
                    f"extended: the store is unreachable"),
    ]
    caplog.clear()
    with ClaimKeeper(store, claim) as keeper:
        force_release(store, "an operator")
        assert keeper.tick() is True
        [(level, message)] = _lines(caplog)[1:]
        assert level == "INFO" and message.startswith("run run lost its claim on checkpoint")
        caplog.clear()
    assert _lines(caplog) == []  # lost already: nothing to release, nothing more to say


@pytest.mark.claims
def test_a_claim_another_run_took_is_said_lost_at_the_end_not_released(store, caplog):
    caplog.set_level(logging.INFO, logger="segack")
    claim = acquire(store, "run", 60)
    with ClaimKeeper(store, claim):
        force_release(store, "an operator")
        caplog.clear()
    [(level, message)] = _lines(caplog)
    assert level == "INFO" and message.startswith("run run lost its claim")


def _checkpoint(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    tokens = KeyGroupTokens.empty(4, pa.null(), pa.null())
    tokens.set_counts(np.ones(16, dtype=np.int64))
    state = Checkpoint(settings={"key": "user", "key_group_bits": 4}, tokens=tokens)
    record_segments(state, SegmentSet.balanced(2), "start")
    store.save(state)
    return store


@pytest.mark.rescale
def test_changes_of_segments_are_said_recorded_or_asked(tmp_path, caplog):
    store = _checkpoint(tmp_path)
    caplog.set_level(logging.INFO, logger="segack.spark_adapter.store.rescale")
    split(store, 1)
    live = acquire(store, "live", 60)
    merge(store, 1)
    assert _lines(caplog) == [
        ("INFO", f"{store.location}: split segment 1 (2 -> 3 segments) recorded for the next run"),
        ("INFO", f"{store.location}: merge segment 1 (3 -> 2 segments) asked of {live.owner()}"),
    ]


@pytest.mark.rescale
def test_the_watcher_says_once_why_it_ignores_a_request_and_when_it_sees_a_change(tmp_path, caplog):
    store = _checkpoint(tmp_path)
    caplog.set_level(logging.INFO, logger="segack.spark_adapter.store.rescale")
    watcher = RequestWatcher(store, SegmentSet.balanced(2), lambda change: None)
    store.write_segments_request(b"junk")
    assert [watcher.tick() for _ in range(3)] == [False] * 3
    store.write_segments_request(b'{"segments": [0, 2], "why": "x", "requested_at": 1, "by": "y"}')
    watcher.tick()
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 2 and all(message.startswith(f"{store.location}: ignoring the segment request: "
                                                         f"the segment request of {store.location} is not")
                                      for _, message in warnings)
    store.write_segments_request(SegmentChange((0, 1, 3), "split segment 1", 1.0, "pid 7 on h").to_bytes())
    assert watcher.tick() is True
    assert _lines(caplog)[-1] == ("INFO", f"{store.location}: split segment 1 (by pid 7 on h): the run's "
                                          f"tasks stop at their next flush")


def test_the_command_shows_warnings_and_with_verbose_what_runs_decide(tmp_path, capsys):
    from segack.cli.entry import log_to_stderr

    store = _checkpoint(tmp_path)
    assert main(["split", store.location, "1"]) == 0
    assert capsys.readouterr().err == ""  # quiet by default: the command says what it did itself
    log_to_stderr(verbose=True)
    try:
        logging.getLogger("segack.spark_adapter.store.claims").info("%s: a decision", "here")
        logging.getLogger("segack.spark_adapter.store.claims").warning("%s: a problem", "there")
    finally:
        log_to_stderr(verbose=False)
    logging.getLogger("segack.spark_adapter.store.claims").info("%s: not shown", "here")
    assert capsys.readouterr().err == "segack: here: a decision\nsegack: warning: there: a problem\n"
