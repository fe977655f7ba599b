"""Changing a checkpoint's segments on real checkpoint directories (no Spark): applied at once on
an idle checkpoint, asked of a live run otherwise, refused (changing nothing) when invalid."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from segack.cli import main
from segack.kernel import SegmentSet
from segack.spark_adapter import CheckpointLocationError, OptionError, SegmentChangeError, merge, scale, split
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.store.claims import ClaimKeeper, acquire, latest_claim, previous_run
from segack.spark_adapter.store.rescale import (
    AUTO_MARGIN,
    HISTORY_LENGTH,
    RequestWatcher,
    SegmentChange,
    auto_change,
    key_group_load,
    largest_share,
    pending_change,
    record_segments,
    recorded_segments,
)
from segack.spark_adapter.store.tokens import KeyGroupTokens
from tests.outcomes import exactly, starting


def _files(path):
    return sorted((entry.relative_to(path), entry.read_bytes())
                  for entry in path.rglob("*") if entry.is_file())


def _checkpoint(tmp_path, segments=None, bits=4, counts=None):
    """A checkpoint a finished run left: its segments recorded, its claim released."""
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
    if counts is not None:
        tokens.set_counts(np.asarray(counts, dtype=np.int64))
    state = Checkpoint(settings={"key": "user", "key_group_bits": tokens.bits}, tokens=tokens)
    record_segments(state, segments or SegmentSet.balanced(2), "start of run r1")
    claim = acquire(store, "r1", 60)
    with ClaimKeeper(store, claim):
        store.save(state, claim.number)
    return store


def _segments(store):
    return SegmentSet.from_ids(store.load().settings["segments"])


def test_split_merge_and_scale_apply_at_once_on_an_idle_checkpoint_and_keep_a_history(tmp_path):
    store = _checkpoint(tmp_path)
    outcome = split(store, 1)
    assert outcome.applied and outcome.run is None
    assert outcome.before == SegmentSet.balanced(2)
    assert _segments(store) == SegmentSet.from_ids([0, 1, 3]) == outcome.segments
    assert merge(store, 3).segments == SegmentSet.balanced(2) == _segments(store)
    assert scale(store, 4).segments == SegmentSet.balanced(4) == _segments(store)
    assert scale(store, [0, 1]).segments == SegmentSet.balanced(2) == _segments(store)
    history = store.load().settings["segment_history"]
    assert [entry["segments"] for entry in history] == [[0, 1], [0, 1, 3], [0, 1], [0, 1, 2, 3], [0, 1]]
    assert [entry["why"].split(" (by")[0] for entry in history[1:]] == [
        "split segment 1", "merge segment 3", "scale to 4 segments", "scale to 2 segments"]
    assert all(earlier["at"] <= later["at"] for earlier, later in itertools.pairwise(history))
    # Each change took a short claim and released it; none is left asked of a run.
    assert latest_claim(store).released and pending_change(store) is None


def test_the_same_set_again_changes_nothing(tmp_path):
    store = _checkpoint(tmp_path)
    before = _files(tmp_path)
    outcome = scale(store, 2)
    assert outcome.applied is False and outcome.segments == outcome.before
    assert _files(tmp_path) == before


CHANGE = SegmentChangeError


@pytest.mark.parametrize(("change", "error", "message"), [
    (lambda store: split(store, 7), CHANGE, "segment 7 is not live; the live segments are [0, 1, 3]"),
    (lambda store: merge(store, 0), CHANGE, "its sibling (id 1 at mask 1) is not live, it is split further"),
    (lambda store: merge(store, 5), SegmentChangeError, "segment 5 is not live"),
    (lambda store: split(store, True), OptionError, "split needs a segment id"),
    (lambda store: scale(store, [0, 2]), CHANGE, "segment id 2 cannot arise from splits of the root"),
    (lambda store: scale(store, [0, 1, 1, 3]), SegmentChangeError, "segment id 1 is given twice"),
    (lambda store: scale(store, 0), OptionError, "segments must be a positive int"),
    (lambda store: scale(store, "many"), OptionError, "not 'many'"),
    (lambda store: scale(store, 32), SegmentChangeError, "finer than"),
    (lambda store: scale(store, "auto"), SegmentChangeError, "there are none yet"),
    (lambda store: scale(store, 2, workers=0), OptionError, "workers must be a positive int"),
    (lambda store: split(store, 1, claim_timeout=0), OptionError, "claim_timeout must be a positive number"),
])
def test_a_change_that_is_not_valid_is_refused_and_changes_nothing(tmp_path, change, error, message):
    store = _checkpoint(tmp_path, SegmentSet.from_ids([0, 1, 3]))
    before = _files(tmp_path)
    with pytest.raises(error) as refused:
        change(store)
    assert message in str(refused.value)
    assert _files(tmp_path) == before


def test_a_merge_of_the_root_and_a_split_finer_than_the_key_groups_are_refused(tmp_path):
    root = _checkpoint(tmp_path / "root", SegmentSet.balanced(1))
    with pytest.raises(SegmentChangeError, match="whole hash space"):
        merge(root, 0)
    fine = _checkpoint(tmp_path / "fine", SegmentSet.balanced(2), bits=1)
    before = _files(tmp_path / "fine")
    with pytest.raises(SegmentChangeError, match="finer than"):
        split(fine, 0)
    assert _files(tmp_path / "fine") == before


def test_a_checkpoint_without_segments_is_refused(tmp_path):
    with pytest.raises(CheckpointLocationError, match="no checkpoint at"):
        split(str(tmp_path / "nothing"), 0)
    assert not (tmp_path / "nothing").exists()
    CheckpointStore(str(tmp_path / "nothing")).save(Checkpoint())
    before = _files(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="no segments recorded"):
        split(str(tmp_path / "nothing"), 0)
    assert _files(tmp_path / "nothing") == before


def test_on_a_live_run_a_change_is_asked_of_it_and_the_next_builds_on_the_request(tmp_path):
    store = _checkpoint(tmp_path)
    live = acquire(store, "live", 60)
    state_before = store.load()
    outcome = split(store, 0)
    assert not outcome.applied and outcome.run == live.owner()
    assert pending_change(store).segments == (0, 1, 2)
    # The run's state is untouched until it applies the change.
    assert store.load().settings == state_before.settings
    assert latest_claim(store) == live
    # A second change is checked against the pending set, not the recorded one.
    split(store, 2)
    assert pending_change(store).segment_set == SegmentSet.from_ids([0, 1, 2, 6])
    assert pending_change(store).why == "split segment 2"
    merge(store, 6)
    assert pending_change(store).segment_set == SegmentSet.from_ids([0, 1, 2])
    before = _files(tmp_path)
    with pytest.raises(SegmentChangeError, match="segment 6 is not live"):
        merge(store, 6)
    assert _files(tmp_path) == before


def test_a_change_on_a_crashed_runs_checkpoint_passes_that_runs_progress_on(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    crashed = acquire(store, "crashed", 0.1)
    tokens = KeyGroupTokens.empty(4, pa.null(), pa.null())
    state = Checkpoint(settings={"key": "user", "key_group_bits": tokens.bits}, tokens=tokens)
    record_segments(state, SegmentSet.balanced(2), "start of run crashed")
    store.save(state, crashed.number)
    time.sleep(0.2)  # its claim expires, unreleased
    assert split(store, 0).applied
    change_claim = latest_claim(store)
    assert change_claim.released and change_claim.progress_of == "crashed"
    # The next run merges the crashed run's progress files, not the change's (it has none).
    after = acquire(store, "after", 60)
    assert previous_run(store, after) == "crashed"


def test_a_pending_request_that_applies_is_recorded_with_the_next_change_applied_on_top(tmp_path):
    store = _checkpoint(tmp_path)
    live = acquire(store, "live", 0.1)
    split(store, 0)  # asked of the live run, which then dies
    store.save(store.load(), live.number)
    time.sleep(0.2)
    outcome = split(store, 1)
    assert outcome.applied and outcome.before == SegmentSet.from_ids([0, 1, 2])
    assert _segments(store) == SegmentSet.from_ids([0, 1, 2, 3])
    assert pending_change(store) is None


def test_the_history_keeps_its_last_entries_and_skips_a_set_recorded_already():
    state = Checkpoint(settings={}, tokens=None)
    for number in range(HISTORY_LENGTH + 5):
        record_segments(state, SegmentSet.balanced(1 + number % 2), f"change {number}")
    record_segments(state, SegmentSet.balanced(1 + (HISTORY_LENGTH + 4) % 2), "the same again")
    history = state.settings["segment_history"]
    assert len(history) == HISTORY_LENGTH
    assert history[-1]["why"] == f"change {HISTORY_LENGTH + 4}" and history[0]["why"] == "change 5"


def test_a_request_file_round_trips_and_a_damaged_one_is_a_checkpoint_error(tmp_path):
    change = SegmentChange((0, 1, 3), "split segment 1", 12.5, "pid 1 on h")
    assert SegmentChange.from_bytes(change.to_bytes(), "here") == change
    for damaged in (b"", b"{}", b'{"segments": [0, 2], "why": "x", "requested_at": 1, "by": "y"}', b"\xff"):
        with pytest.raises(CheckpointError, match="is not a segack segment request"):
            SegmentChange.from_bytes(damaged, "here")


def test_the_watcher_fires_once_on_a_request_for_another_set(tmp_path):
    store = _checkpoint(tmp_path)
    seen = []
    with RequestWatcher(store, SegmentSet.balanced(2), seen.append, poll=0.01) as watcher:
        store.write_segments_request(SegmentChange((0, 1), "same", 1.0, "me").to_bytes())
        time.sleep(0.1)
        assert seen == [] and watcher.change is None
        store.write_segments_request(b"not json")
        time.sleep(0.1)
        assert seen == []
        wanted = SegmentChange((0, 1, 3), "split segment 1", 2.0, "me")
        store.write_segments_request(wanted.to_bytes())
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        store.write_segments_request(SegmentChange((1, 2, 0), "later", 3.0, "me").to_bytes())
        time.sleep(0.1)
    assert seen == [wanted] and watcher.change == wanted


def test_auto_changes_the_set_only_for_a_clear_gain():
    bits = 4
    tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
    even = np.full(1 << bits, 100, dtype=np.int64)
    tokens.set_counts(even)
    assert auto_change(tokens, SegmentSet.balanced(4), 4) is None
    skewed = even.copy()
    skewed[0] = 500  # segment 0 of balanced(2) carries 60 % of the events
    tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
    tokens.set_counts(skewed)
    before = largest_share(skewed, SegmentSet.balanced(2), bits)
    planned, why = auto_change(tokens, SegmentSet.balanced(2), 8)
    assert before == pytest.approx(0.6)
    assert largest_share(skewed, planned, bits) == pytest.approx(0.25)
    assert largest_share(skewed, planned, bits) <= AUTO_MARGIN * before
    assert why == "auto: largest share 60.0% -> 25.0% (8 segments for 8 workers)"
    # Already as good as a plan can be: no change, however often it is asked.
    assert auto_change(tokens, planned, 8) is None
    # A gain smaller than the margin is no reason to change: the hot key group bounds any plan.
    skewed[0] = 3000
    tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
    tokens.set_counts(skewed)
    assert largest_share(skewed, SegmentSet.balanced(2), bits) * AUTO_MARGIN < 3000 / skewed.sum()
    assert auto_change(tokens, SegmentSet.balanced(2), 8) is None


def test_the_commands_apply_refuse_and_report(tmp_path, capsys):
    store = _checkpoint(tmp_path)
    location = str(tmp_path / "checkpoint")
    assert main(["split", location, "1"]) == 0
    assert "2 -> 3 segments (0,1,3); the next run starts over them" in capsys.readouterr().out
    before = _files(tmp_path)
    assert main(["merge", location, "0"]) == 4  # ExitCode.REFUSED
    assert "segack merge: segment 0 cannot be merged: its sibling (id 1 at mask 1) is not live" in (
        capsys.readouterr().err)
    assert _files(tmp_path) == before
    assert main(["scale", location, "--segments", "0,1,3"]) == 0
    assert "already; nothing to do" in capsys.readouterr().out
    live = acquire(store, "live", 60)
    assert main(["scale", location, "--segments", "4"]) == 0
    out = capsys.readouterr().out
    assert f"asked {live.owner()} to change 3 -> 4 segments (0,1,2,3)" in out
    assert main(["status", location]) == 0
    out = capsys.readouterr().out
    assert "segment sets    2 sets, newest last" in out
    assert "split segment 1 (by pid" in out
    assert "requested       scale to 4 segments -> 4 segments" in out
    assert "segments        3 now" in out


def test_a_change_made_while_another_thread_runs_the_live_run_is_seen_by_its_watcher(tmp_path):
    store = _checkpoint(tmp_path)
    acquire(store, "live", 60)
    fired = threading.Event()
    with RequestWatcher(store, SegmentSet.balanced(2), lambda change: fired.set(), poll=0.01):
        split(store, 1)
        assert fired.wait(5)


def test_a_request_file_is_sorted_json_and_damage_names_the_checkpoint(tmp_path):
    change = SegmentChange((0, 1, 3), "split segment 1", 12.5, "pid 1 on h")
    assert change.to_bytes() == (b'{"by": "pid 1 on h", "requested_at": 12.5, "segments": [0, 1, 3], '
                                 b'"why": "split segment 1"}\n')
    store = _checkpoint(tmp_path)
    store.write_segments_request(b"junk")
    with pytest.raises(CheckpointError, match=starting(
            f"the segment request of {store.location} is not a segack segment request")):
        pending_change(store)


def test_recording_the_same_set_again_keeps_it_and_a_checkpoint_without_segments_has_none():
    state = Checkpoint(settings={})
    assert recorded_segments(state) is None
    state.settings["segments"] = []
    assert recorded_segments(state) is None
    record_segments(state, SegmentSet.balanced(2), "first")
    state.settings["segments"] = "stale"
    record_segments(state, SegmentSet.balanced(2), "again")
    assert state.settings["segments"] == [0, 1] and len(state.settings["segment_history"]) == 1


def test_merge_and_split_refuse_with_what_was_asked(tmp_path):
    store = _checkpoint(tmp_path)
    with pytest.raises(OptionError, match=starting("merge needs a segment id")):
        merge(store, "0")
    with pytest.raises(OptionError, match=starting("split needs a segment id")):
        split(store, None)
    assert merge(store, 1).segments == SegmentSet.balanced(1)


def test_the_load_and_share_of_segments():
    tokens = KeyGroupTokens.empty(2, pa.null(), pa.null())
    tokens.committed[:] = [1, 2, 3, 4]
    assert key_group_load(tokens).tolist() == [1, 2, 3, 4]
    tokens.set_counts(np.array([5, 5, 5, 5]))
    assert key_group_load(tokens).tolist() == [5, 5, 5, 5] and key_group_load(tokens).dtype == np.int64
    assert largest_share(np.zeros(4), SegmentSet.balanced(2), 2) == 1.0
    # The last members own no load: the share is still the heaviest's of the whole.
    assert largest_share(np.array([3, 0, 1, 0]), SegmentSet.balanced(4), 2) == 0.75


def test_auto_changes_the_set_when_the_planned_share_is_at_most_the_margin():
    bits = 2
    tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
    # balanced(1) carries everything; the best plan for 4 workers carries 80 % of it: exactly the
    # margin, so the set changes; with one more event in the hot key group, it is above it.
    tokens.set_counts(np.array([8, 1, 1, 0]))
    planned, _ = auto_change(tokens, SegmentSet.balanced(1), 4)
    assert largest_share(tokens.count, planned, bits) == AUTO_MARGIN
    tokens.set_counts(np.array([9, 1, 1, 0]))
    assert auto_change(tokens, SegmentSet.balanced(1), 4) is None


@pytest.mark.parametrize("count", [1, 2])
def test_scale_to_small_counts_and_auto_for_one_worker(tmp_path, count):
    store = _checkpoint(tmp_path, segments=SegmentSet.balanced(4), counts=[9] * 16)
    assert scale(store, count).segments == SegmentSet.balanced(count)
    assert scale(store, "auto", workers=1).segments == SegmentSet.balanced(1)
    outcome = scale(store, "auto", workers=3)
    assert len(outcome.segments) == 3
    assert store.load().settings["segment_history"][-1]["why"].startswith("scale to auto for 3 workers")
    assert scale(store, "auto").segments == outcome.segments  # the current count, planned again


@pytest.mark.parametrize("workers", [0, True, 2.0, "2"])
def test_scale_refuses_workers_that_are_not_a_positive_int(tmp_path, workers):
    store = _checkpoint(tmp_path)
    with pytest.raises(OptionError, match=exactly(f"workers must be a positive int, not {workers!r}")):
        scale(store, "auto", workers=workers)


def test_a_change_applied_at_once_is_saved_under_its_own_claim_which_it_releases(tmp_path):
    store = _checkpoint(tmp_path)
    outcome = split(store, 0)
    assert outcome.applied is True
    claim = latest_claim(store)
    assert claim.run_id.startswith("rescale-") and len(claim.run_id) == len("rescale-") + 8
    assert claim.released and claim.progress_of == "r1"
    assert store.state_file().endswith(f"checkpoint-{claim.number:012d}.json")
    live = acquire(store, "live", 60)
    asked = split(store, 1)
    assert asked.applied is False and asked.run == live.owner()
    assert pending_change(store).by.startswith("pid ")
    assert split(store, 1).applied is False  # the same set as the pending one: nothing to do


def test_a_checkpoint_with_segments_but_no_tokens_is_refused(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    state = Checkpoint(settings={"key": "user"})
    record_segments(state, SegmentSet.balanced(2), "start")
    store.save(state)
    with pytest.raises(CheckpointError, match=starting("no segments recorded at")):
        split(store, 0)


def test_the_watcher_thread_is_named_for_a_thread_dump(tmp_path):
    store = _checkpoint(tmp_path)
    with RequestWatcher(store, SegmentSet.balanced(2), lambda change: None, poll=0.01):
        assert "segack-requests" in [thread.name for thread in threading.enumerate()]


def test_the_commands_without_spark_import_none_of_it(tmp_path):
    # In a fresh interpreter: what `segack status` and the operator's commands import is theirs.
    _checkpoint(tmp_path)
    location = str(tmp_path / "checkpoint")
    commands = [["status", location], ["dead-letters", location], ["split", location, "1"],
                ["scale", location, "--segments", "2"], ["release", location, "--force"],
                ["locate", "a", "b"]]
    script = ("import sys\nfrom segack.cli import main\n"
              f"codes = [int(main(words)) for words in {commands!r}]\n"
              "print(codes, sorted({name for name in sys.modules if name.startswith(('pyspark', 'py4j'))}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[0, 0, 0, 0, 0, 0] []"
