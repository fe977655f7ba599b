"""Segments that change while a run goes on, with real Spark: a replay split and merged while it
runs (as processes), and a Structured Streaming query scaled between micro-batches and killed."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segack.cli import main
from segack.demo import generate_events
from segack.kernel import SegmentSet, spark_hash
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.spark_handlers import LOG_ENV, read_log
from tests.test_spark_adapter import assert_each_key_in_order

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _wait_for(condition, seconds, what, process=None):
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended while waiting for {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}{_last_words(process)}")
        time.sleep(0.1)


def _last_words(process):
    """What a process still running printed, read after killing it (and its group, if it leads one)."""
    if process is None:
        return ""
    if os.getpgid(process.pid) == process.pid:
        os.killpg(process.pid, signal.SIGKILL)
    else:
        process.kill()
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        return "; it printed nothing in 30 s after being killed"
    return f"; its last output: {err[-3000:]}"


def _history(checkpoint):
    state = CheckpointStore(checkpoint).load()
    return [] if state is None else state.settings.get("segment_history", [])


def assert_each_event_ran_in_its_members_partition(logged, sets):
    """One Spark stage per set of ``sets``, in order, and each logged event (from
    :func:`tests.spark_handlers.record_with_task`) handled in its stage by the partition of its
    key's member. Returns the partitions each stage ran in."""
    stages = sorted({event["stage"] for event in logged})
    assert len(stages) == len(sets), (stages, sets)
    ran = []
    for stage, members in zip(stages, sets, strict=True):
        here = [event for event in logged if event["stage"] == stage]
        misplaced = [(event["user"], event["partition"]) for event in here
                     if event["partition"] != members.owner_index(spark_hash(event["user"]))]
        assert not misplaced, f"stage {stage} over {members.ids}: {misplaced[:5]}"
        ran.append({event["partition"] for event in here})
    return ran


def test_a_replay_split_twice_and_merged_once_while_it_runs_handles_each_event_once(tmp_path, s3, capsys):
    # On the S3 server: a local checkpoint splits live in test_exactly_once's kill test.
    total = 16_000
    table = generate_events(total, seed=41)
    pq.write_table(table, tmp_path / "events.parquet")
    log, checkpoint = str(tmp_path / "log.jsonl"), f"{s3}/checkpoint"
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--handler", "tests.spark_handlers:record_with_task",
               "--checkpoint", checkpoint, "--segments", "2", "--flush-interval", "0.3",
               "--master", "local[4]"]
    process = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, **{LOG_ENV: log}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(read_log(log)) > 500, 300, "the replay to handle events", process)
        changes = [(["split", checkpoint, "0"], [0, 1, 2]), (["split", checkpoint, "1"], [0, 1, 2, 3]),
                   (["merge", checkpoint, "3"], [0, 1, 2])]
        for number, (arguments, wanted) in enumerate(changes, start=2):
            assert main(arguments) == 0
            out = capsys.readouterr().out
            assert "; it applies them within seconds" in out, out
            _wait_for(lambda number=number: len(_history(checkpoint)) == number, 60,
                      f"change {number - 1} to apply", process)
            assert _history(checkpoint)[-1]["segments"] == wanted
            # Let the new job handle events before the next change.
            applied_at = len(read_log(log))
            _wait_for(lambda applied_at=applied_at: len(read_log(log)) > applied_at + 500, 120,
                      "events under the new set", process)
            assert len(read_log(log)) < total, "the run ended before the change: the test proved nothing"
        out, err = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "over 3 segments" in out and "the segments changed 3 times while it ran" in out, out
    handled = read_log(log)
    # Each event exactly once, each key in order.
    assert len(handled) == total
    assert_each_key_in_order(handled, table)
    history = _history(checkpoint)
    assert [entry["segments"] for entry in history] == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2]]
    assert [entry["why"].split(" (by")[0] for entry in history] == [
        history[0]["why"], "split segment 0", "split segment 1", "merge segment 3"]
    assert history[0]["why"].startswith("start of run ")
    # One Spark job per set, each event in its key's member's partition; each new member (2, then
    # 3) handled some of the 500 events its job was given at least.
    ran = assert_each_event_ran_in_its_members_partition(
        handled, [SegmentSet.from_ids(entry["segments"]) for entry in history])
    assert 2 in ran[1] and 3 in ran[2], ran
    state = CheckpointStore(checkpoint).load()
    assert state.tokens.complete and state.settings["status"] == "complete"
    assert state.settings["segments"] == [0, 1, 2]
    assert CheckpointStore(checkpoint).read_segments_request() is None


def _stream(tmp_path, segments, log, run):
    command = [sys.executable, "-m", "tests.stream_process", str(tmp_path / "source"),
               str(tmp_path / "checkpoint"), str(tmp_path / "stream-checkpoint"), segments]
    return subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, **{LOG_ENV: log, "SEGACK_TEST_RUN": run}),
                            start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _completed_batch(checkpoint):
    state = CheckpointStore(checkpoint).load()
    return -1 if state is None else state.settings.get("stream", {}).get("completed_batch", -1)


@pytest.mark.streams
@pytest.mark.faults
def test_a_stream_scaled_while_it_runs_and_killed_once_keeps_each_keys_order_and_loses_nothing(tmp_path):
    from segack.spark_adapter import scale

    files, size = 12, 400
    table = generate_events(files * size, seed=43).sort_by("ts")
    source = tmp_path / "source"
    source.mkdir()

    def add(numbers):
        for number in numbers:
            # Written under a hidden name, then renamed: the file source must never list a file
            # half written, or before its time is set. A file it lists with today's time makes
            # every later file (with older times) older than its maxFileAge, never read: the test
            # waited for every event in vain once in CI.
            hidden, path = source / f".part-{number:02d}.parquet", source / f"part-{number:02d}.parquet"
            pq.write_table(table.slice(number * size, size), hidden)
            # The file source takes files oldest first; make "oldest" unambiguous.
            os.utime(hidden, (1_700_000_000 + number * 100,) * 2)
            os.replace(hidden, path)

    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    add(range(2))
    first = _stream(tmp_path, "2", log, "1")
    second = None
    try:
        _wait_for(lambda: _completed_batch(checkpoint) >= 0, 300, "the first batch", first)
        scale(checkpoint, 5)
        add(range(2, 5))
        _wait_for(lambda: _completed_batch(checkpoint) >= 3, 120, "batches over 5 segments", first)
        # Kill the query in the middle of a batch.
        handled = len(read_log(log))
        add(range(5, 7))
        _wait_for(lambda: len(read_log(log)) > handled + 50, 120, "the next batch to start", first)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = _stream(tmp_path, "-", log, "2")
        _wait_for(lambda: _completed_batch(checkpoint) >= 6, 300, "the restarted query", second)
        scale(checkpoint, 3)
        add(range(7, files))
        everything = {(user, seq) for user, seq in zip(table.column("user").to_pylist(),
                                                      table.column("seq").to_pylist(), strict=True)}
        _wait_for(lambda: {(e["user"], e["seq"]) for e in read_log(log)} == everything, 300,
                  "every event", second)
        (tmp_path / "source.stop").touch()
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    handled = read_log(log)
    # No event lost; each key in order across every batch, the killed one included (whose events
    # may run twice: at least once).
    assert_each_key_in_order(handled, table)
    history = _history(checkpoint)
    assert [len(entry["segments"]) for entry in history] == [2, 5, 3]
    assert history[1]["why"].startswith("scale to 5 segments")
    # Batches ran over each set: the first stage over 2 partitions, some over 5, the last over 3.
    partitions = collections.defaultdict(set)
    for event in handled:
        partitions[event["run"], event["stage"]].add(event["partition"])
    widths = [len(partitions[stage]) for stage in sorted(partitions)]
    assert widths[0] <= 2 and 5 in widths and widths[-1] <= 3, widths
    state = CheckpointStore(checkpoint).load()
    assert state.settings["segments"] == list(SegmentSet.balanced(3).ids)
    assert int(state.tokens.committed.sum()) == files * size


@pytest.mark.streams
def test_a_change_asked_during_a_micro_batch_applies_at_the_next_one(spark, tmp_path):
    from segack.spark_adapter import foreach_batch
    from segack.spark_adapter.store.rescale import pending_change
    from tests.spark_handlers import ScalesOnce

    table = generate_events(1200, seed=44).sort_by("ts")
    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    process_batch = foreach_batch(ScalesOnce(log, checkpoint, 5), key="user", order="ts",
                                  checkpoint=checkpoint, segments=2)
    process_batch(spark.createDataFrame(table.slice(0, 600)), 0)
    # The batch ran over its set; the change waits for the next one.
    assert [len(entry["segments"]) for entry in _history(checkpoint)] == [2]
    assert pending_change(CheckpointStore(checkpoint)).segment_set == SegmentSet.balanced(5)
    process_batch(spark.createDataFrame(table.slice(600, 600)), 1)
    history = _history(checkpoint)
    assert [len(entry["segments"]) for entry in history] == [2, 5]
    assert history[1]["why"].startswith("scale to 5 segments (by pid ") and history[1]["why"].endswith(
        "at batch 1")
    assert pending_change(CheckpointStore(checkpoint)) is None
    handled = read_log(log)
    assert len(handled) == 1200
    assert_each_key_in_order(handled, table)


@pytest.mark.streams
def test_a_stream_with_auto_segments_plans_from_the_load_so_far_and_does_not_flap(spark, tmp_path):
    import pyarrow as pa

    from segack.spark_adapter import foreach_batch
    from segack.spark_adapter.store.rescale import largest_share
    from tests.spark_handlers import Recorder

    # Every key hashes into segment 0 of the balanced set of 4: one task would carry all events.
    rows = 900
    crowded = [user for user in (f"u{number}" for number in range(2000)) if spark_hash(user) & 3 == 0][:90]
    users = [crowded[number % len(crowded)] for number in range(rows)]
    table = pa.table({"user": users, "seq": list(range(rows)), "ts": list(range(rows))})
    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    process_batch = foreach_batch(Recorder(log), key="user", order="ts", checkpoint=checkpoint,
                                  segments="auto", key_group_bits=6)
    for batch in range(3):
        process_batch(spark.createDataFrame(table.slice(batch * 300, 300)), batch)
    history = _history(checkpoint)
    first = SegmentSet.balanced(int(spark.conf.get("spark.sql.shuffle.partitions")))
    assert history[0]["segments"] == list(first.ids)
    state = CheckpointStore(checkpoint).load()
    load = state.tokens.committed
    # The first batch's load made the second plan its set; the third found nothing better.
    assert len(history) == 2 and history[1]["why"].startswith("auto: largest share")
    planned = SegmentSet.from_ids(history[1]["segments"])
    assert largest_share(load, first, 6) == 1.0
    assert largest_share(load, planned, 6) < 0.6  # two segments share what one carried
    assert len(read_log(log)) == rows
