"""``segack replay`` and ``segack status`` as processes: crashes, rescales, failures, damage."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segack.cli import main
from segack.demo import generate_events
from segack.spark_adapter.checkpoint import CheckpointStore
from tests import expected
from tests.spark_handlers import LOG_ENV, read_log
from tests.test_spark_adapter import assert_each_key_in_order

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _start(tmp_path, handler, segments, run, extra=()):
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": str(run)})
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"),
               "--key", "user", "--order", "ts", "--handler", handler,
               "--checkpoint", str(tmp_path / "checkpoint"), "--segments", str(segments), *extra]
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_group(process):
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed replay left processes behind")


def _done_events(tmp_path, table):
    """The events the checkpoint calls done, counting progress files a killed run left behind
    (the next run merges them)."""
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    state = store.load()
    if state is None or state.tokens is None:
        return set()
    tokens = state.tokens.copy()
    for _, updates in store.read_progress(store.progress_files()):
        tokens.apply(updates)
    return expected.done_events(table, tokens)


def test_sigkilled_replays_resume_rescale_and_finish(tmp_path):
    total = 12_000
    table = generate_events(total, seed=21)
    pq.write_table(table, tmp_path / "events.parquet")
    rng = random.Random(2026)
    done_before = []
    handled_per_run = []
    for run, segments in enumerate([2, 5, 3]):
        done_before.append(_done_events(tmp_path, table))
        # The second run keeps several calls in flight when it is killed.
        concurrent = ["--concurrency", "4"] if run == 1 else []
        process = _start(tmp_path, "tests.spark_handlers:record_slowly", segments, run,
                         ["--flush-every", "300", "--flush-interval", "0.3", *concurrent])
        # Kill at a random moment once this run has started handling events.
        handled_so_far = len(read_log(str(tmp_path / "log.jsonl")))
        deadline = time.monotonic() + 180
        while (process.poll() is None and time.monotonic() < deadline
               and len(read_log(str(tmp_path / "log.jsonl"))) == handled_so_far):
            time.sleep(0.1)
        time.sleep(rng.uniform(0.2, 2.5))
        if process.poll() is None:
            _kill_group(process)
    done_before.append(_done_events(tmp_path, table))
    final = _start(tmp_path, "tests.spark_handlers:record_slowly", 4, 3, ["--concurrency", "8"])
    out, err = final.communicate(timeout=600)
    assert final.returncode == 0, err

    handled = read_log(str(tmp_path / "log.jsonl"))
    assert_each_key_in_order(handled, table)
    for run in range(4):
        events = {(e["user"], e["seq"]) for e in handled if e["run"] == str(run)}
        handled_per_run.append(len(events))
        assert not events & done_before[run], f"run {run} redid work the checkpoint had recorded"
    assert len(done_before[3]) > 0, "no kill landed after the first flush; the test proved nothing"
    assert handled_per_run[3] == total - len(done_before[3])
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.tokens.complete and state.settings["segments"] == list(range(4))
    assert "already done" in out


def test_handler_failure_exits_non_zero_with_one_line_naming_the_event(tmp_path):
    import pyarrow as pa

    users = [f"u{n % 5}" for n in range(100)]
    seqs = [n // 5 for n in range(100)]
    table = pa.table({"user": users, "seq": seqs, "ts": [1000 + n for n in range(100)]})
    pq.write_table(table, tmp_path / "events.parquet")
    process = _start(tmp_path, "tests.spark_handlers:fail_on_tenth", 2, 0)
    _, err = process.communicate(timeout=600)
    reason = [line for line in err.splitlines() if line.startswith("segack replay:")]
    assert process.returncode == 1
    assert len(reason) == 1
    assert "key 'u1'" in reason[0] and "order 1051" in reason[0] and "cannot apply this part" in reason[0]
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["status"] == "failed"
    done = expected.done_events(table, state.tokens)
    assert ("u1", 10) not in done and ("u1", 9) in done


BANNER = ("Using Spark's default log4j profile", "Setting default log level", "To adjust logging level")


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_spark_banner_lines_only_with_verbose(tmp_path, verbose):
    import pyarrow as pa

    table = pa.table({"user": ["u1", "u2"], "seq": [0, 0], "ts": [1, 2]})
    pq.write_table(table, tmp_path / "events.parquet")
    process = _start(tmp_path, "tests.spark_handlers:record_slowly", 1, 0, ["--verbose"] if verbose else [])
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    banner = [line for line in err.splitlines() if line.startswith(BANNER)]
    if verbose:
        assert len(banner) >= 2, err
    else:
        assert banner == []
        assert "segack replay: 2 events handled" in out


def test_a_damaged_checkpoint_fails_the_command_and_is_kept(tmp_path, capsys):
    (tmp_path / "checkpoint").mkdir()
    state = tmp_path / "checkpoint" / "checkpoint.json"
    state.write_bytes(b'{"format": "segack-checkpoint", "version": 1, "crc32": 1}')
    pq.write_table(generate_events(10), tmp_path / "events.parquet")
    code = main(["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                 "--handler", "tests.spark_handlers:record_slowly",
                 "--checkpoint", str(tmp_path / "checkpoint")])
    assert code == 1
    assert "damaged" in capsys.readouterr().err
    assert state.read_bytes() == b'{"format": "segack-checkpoint", "version": 1, "crc32": 1}'
    assert main(["status", str(tmp_path / "checkpoint")]) == 1


def test_status_shows_progress_per_segment_and_the_size(tmp_path, capsys):
    import numpy as np
    import pyarrow as pa

    from segack.spark_adapter.checkpoint import Checkpoint
    from segack.spark_adapter.tokens import KeyGroupTokens

    tokens = KeyGroupTokens.empty(2, pa.int64(), pa.string())
    tokens.set_counts(np.array([5, 0, 3, 2]))
    tokens.committed[:] = [5, 0, 1, 0]
    tokens.run_start[:] = [4, 0, 0, 0]
    tokens.boundaries = {0: (9, "a", 1), 2: (3, "b", 2)}
    tokens.extras = {3: {1}}
    settings = {"total": 10, "key": "user", "segments": [0, 1], "key_group_bits": 2, "status": "failed"}
    store = CheckpointStore(str(tmp_path / "c"))
    store.save(Checkpoint(settings, tokens))
    assert main(["status", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "events          7 of 10 done (70.0%)" in out
    assert "key groups      4 (2 bits): 3 with events, 1 of them done" in out
    # Segment 0 (id 0, mask 1) owns key groups 0 and 2; segment 1 owns 1 and 3.
    assert re.search(r"#0 +id 0 +mask 1 +8 events +6 done +2 key groups", out)
    assert re.search(r"#1 +id 1 +mask 1 +2 events +1 done +2 key groups", out)
    assert f"size            {store.size_bytes():,} bytes (checkpoint.json and 0 progress files)" in out
    assert "status          failed" in out and "key             user" in out
    assert main(["status", str(tmp_path / "missing")]) == 1

    tokens.counted = False
    store.save(Checkpoint(settings, tokens))
    assert main(["status", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "events          7 done; not counted until a run ends without a failure" in out
    assert re.search(r"#0 +id 0 +mask 1 +\? events +6 done", out)


def test_replay_rejects_a_handler_it_cannot_import(tmp_path, capsys):
    pq.write_table(generate_events(10), tmp_path / "events.parquet")
    code = main(["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                 "--handler", "no_such_module:handle", "--checkpoint", str(tmp_path / "checkpoint")])
    assert code == 1
    assert "cannot import handler module 'no_such_module'" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint").exists()
