"""Streams of files under faults, through ``segack stream`` as a user meets it: dead letters over
many micro-batches, Spark's query checkpoint lost or replaced, a task that stops without handling
its events. Kafka's own cases are in ``tests/test_kafka.py``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode
from segack.spark_adapter import ClaimLostError, foreach_batch
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.claims import ClaimKeeper, acquire
from segack.spark_adapter.store.crash_points import ENV
from tests.spark_handlers import LOG_ENV, read_log

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _events(spans: dict[str, range], start_ts: int) -> pa.Table:
    """Each user's events of ``spans`` (their ``seq``), interleaved, ``ts`` counting up from ``start_ts``."""
    rows = []
    longest = max(len(span) for span in spans.values())
    for step in range(longest):
        for user, span in spans.items():
            if step < len(span):
                rows.append({"user": user, "seq": span[step]})
    return pa.table({"user": [row["user"] for row in rows], "seq": [row["seq"] for row in rows],
                     "ts": list(range(start_ts, start_ts + len(rows)))})


def _write_files(source: Path, tables: list[pa.Table], first: int = 0) -> None:
    """``tables`` as ``part-N.parquet`` in ``source``, N from ``first``, each file a minute newer than
    the one before: Spark's file source takes them in that order, one per micro-batch with
    ``maxFilesPerTrigger=1``."""
    source.mkdir(exist_ok=True)
    for number, table in enumerate(tables, start=first):
        path = source / f"part-{number}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + 60 * number, 1_700_000_000 + 60 * number))


def _stream(tmp_path: Path, source: Path, handler: str, *extra: str, run: str = "0",
            checkpoint: Path | None = None, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "segack", "stream", str(source), "--key", "user", "--order", "ts",
               "--handler", handler, "--checkpoint", str(checkpoint or tmp_path / "checkpoint"),
               "--segments", "2", *extra]
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": run},
                       **(env or {}))
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)


def _segack(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "segack", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.faults
@pytest.mark.streams
def test_dead_letters_of_one_key_over_three_micro_batches_are_all_kept_and_retried_in_order(tmp_path):
    """u1's tenth event fails in the first micro-batch; its later events, in that batch and the next
    two, are parked behind it. Every one of them is a dead letter, and a retry handles them all."""
    source = tmp_path / "source"
    _write_files(source, [_events({"u1": range(0, 12), "u2": range(0, 6)}, 0),
                          _events({"u1": range(12, 14), "u2": range(6, 9)}, 100),
                          _events({"u1": range(14, 16), "u2": range(9, 12)}, 200)])
    handler = "tests.spark_handlers:record_refusing_tenth_until_fixed"
    first = _stream(tmp_path, source, handler, "--option", "maxFilesPerTrigger=1",
                    "--on-error", "dead-letter")
    assert first.returncode == ExitCode.DEAD_LETTERS, first.stderr
    assert "3 micro-batches" in first.stdout, first.stdout
    assert "6 events set aside as dead letters remain" in first.stderr, first.stderr
    letters = CheckpointStore(str(tmp_path / "checkpoint")).read_dead_letters(["user", "seq"])
    assert letters is not None
    pairs = zip(letters.column("user").to_pylist(), letters.column("seq").to_pylist(), strict=True)
    assert sorted(pairs) == [("u1", seq) for seq in range(10, 16)]
    listed = _segack("dead-letters", str(tmp_path / "checkpoint"))
    assert listed.returncode == ExitCode.OK, listed.stderr
    assert "6 events" in listed.stdout, listed.stdout
    fixed = _stream(tmp_path, source, handler, "--retry-dead-letters", run="fixed")
    assert fixed.returncode == ExitCode.OK, fixed.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert [event["seq"] for event in handled if event["user"] == "u1"] == list(range(16))
    assert [event["seq"] for event in handled if event["user"] == "u2"] == list(range(12))
    assert [event["seq"] for event in handled if event["run"] == "fixed"] == list(range(10, 16))


@pytest.mark.streams
def test_a_run_woken_after_a_takeover_says_it_lost_its_claim_before_reading_the_takers_batches(
        tmp_path, spark):
    """A run paused past its claim's timeout wakes to a checkpoint the taker has moved on (micro-batch 2
    in progress, where it was delivered micro-batch 1): it stops with the lost claim, which is what
    happened, not with a checkpoint restored from an older copy, and writes nothing."""
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    stale = acquire(store, "stale", 0.05)
    time.sleep(0.1)
    taker = acquire(store, "taker", 60)
    ClaimKeeper(store, taker).save(Checkpoint({"stream": {"completed_batch": 0, "batch": {"id": 2}}}))
    before = sorted((path.name, path.read_bytes()) for path in (tmp_path / "checkpoint").rglob("*")
                    if path.is_file())
    replay = foreach_batch(lambda event: None, key="user", order="ts", checkpoint=store)
    batch = spark.createDataFrame([("u1", 1)], "user string, ts long")
    with pytest.raises(ClaimLostError):
        replay.process(batch, 1, ClaimKeeper(store, stale))
    assert sorted((path.name, path.read_bytes()) for path in (tmp_path / "checkpoint").rglob("*")
                  if path.is_file()) == before


def _recorded(checkpoint: Path) -> dict:
    state = CheckpointStore(str(checkpoint)).load()
    assert state is not None
    return state.settings["stream"]


@pytest.mark.streams
def test_spark_checkpoint_removed_or_replaced_is_refused_before_any_event(tmp_path):
    """Two files handled as two micro-batches; then Spark's checkpoint of the query is removed, or
    replaced by another query's, and a third file added: the next run refuses in one line (exit
    4), handling nothing and changing nothing of segack's checkpoint."""
    source = tmp_path / "source"
    tables = [_events({"u1": range(10 * n, 10 * n + 10), "u2": range(10 * n, 10 * n + 5)}, 100 * n)
              for n in range(3)]
    _write_files(source, tables[:2])
    handler = "tests.spark_handlers:record_slowly"
    first = _stream(tmp_path, source, handler, "--option", "maxFilesPerTrigger=1")
    assert first.returncode == ExitCode.OK, first.stderr
    assert "2 micro-batches, 30 events handled" in first.stdout, first.stdout
    checkpoint = tmp_path / "checkpoint"
    assert _recorded(checkpoint)["completed_end"] == [{"logOffset": 1}]
    # Another query over the same files, whose Spark checkpoint will stand in for the first one's.
    other = _stream(tmp_path, source, "tests.spark_handlers:discard", checkpoint=tmp_path / "other")
    assert other.returncode == ExitCode.OK, other.stderr
    _write_files(source, tables[2:], first=2)
    before = sorted(path.read_bytes() for path in checkpoint.glob("checkpoint-*.json"))
    shutil.rmtree(checkpoint / "stream")
    gone = _stream(tmp_path, source, handler, "--option", "maxFilesPerTrigger=10")
    assert gone.returncode == ExitCode.REFUSED, gone.stderr
    [line] = [line for line in gone.stderr.splitlines() if line.startswith("segack stream:")]
    assert line == (f"segack stream: checkpoint {checkpoint}: Spark's checkpoint of the query "
                    f"({checkpoint}/stream) is gone, but segack's has micro-batches through 1 complete, and "
                    f"only a Kafka query or a Delta change feed restarts from segack's record; put Spark's "
                    f"checkpoint back, or use a new checkpoint")
    shutil.copytree(tmp_path / "other" / "stream", checkpoint / "stream")
    replaced = _stream(tmp_path, source, handler, "--option", "maxFilesPerTrigger=10")
    assert replaced.returncode == ExitCode.REFUSED, replaced.stderr
    [line] = [line for line in replaced.stderr.splitlines() if line.startswith("segack stream:")]
    assert line.startswith(f"segack stream: checkpoint {checkpoint}: Spark's checkpoint of the query "
                           f"({checkpoint}/stream) is of query "), line
    assert "it was replaced or restored from another copy" in line
    assert len(read_log(str(tmp_path / "log.jsonl"))) == 30
    assert sorted(path.read_bytes() for path in checkpoint.glob("checkpoint-*.json")) == before


@pytest.mark.command
def test_a_handler_failure_in_a_stream_is_one_line_naming_the_event(tmp_path):
    """No Spark or Py4J trace reaches the terminal: stderr holds the JVM launcher's one warning and
    segack's line."""
    source = tmp_path / "source"
    _write_files(source, [_events({"u1": range(0, 20), "u2": range(0, 20)}, 0)])
    failed = _stream(tmp_path, source, "tests.spark_handlers:record_refusing_tenth_until_fixed")
    assert failed.returncode == ExitCode.HANDLER_FAILED, failed.stderr
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert lines[0] == "WARNING: Using incubator modules: jdk.incubator.vector", lines
    assert len(lines) == 2 and lines[1].startswith("segack stream: handler failed on the event with key 'u1' "
                                                   "and order 20 "), lines
    assert lines[1].endswith("RuntimeError: cannot apply this part yet"), lines

@pytest.mark.faults
@pytest.mark.streams
def test_a_task_that_stops_because_of_a_failure_whose_report_was_lost_fails_the_batch(tmp_path):
    """With task retries (``local[2,4]``): u1's tenth event fails, its task asks the others to stop,
    and its Python worker dies before its result reaches the driver (killed at the crash point just
    after the stop request). Spark runs the task again, which sees the stop request and handles
    nothing: the batch must not be called complete, nor its events done."""
    source = tmp_path / "source"
    _write_files(source, [_events({"u1": range(0, 30), "u2": range(0, 30)}, 0)])
    handler = "tests.spark_handlers:record_refusing_tenth_until_fixed"
    crashed = _stream(tmp_path, source, handler, "--master", "local[2,4]", "--segments", "1",
                      env={ENV: "after-stop-request"})
    assert crashed.returncode == ExitCode.FAILED, crashed.stderr
    [line] = [line for line in crashed.stderr.splitlines() if line.startswith("segack stream:")]
    assert line.startswith("segack stream: the tasks of segments 0 stopped before the end of their events "
                           "(the handler failed in segment 0)"), line
    assert _recorded(tmp_path / "checkpoint")["completed_batch"] == -1
    again = _stream(tmp_path, source, handler)
    assert again.returncode == ExitCode.HANDLER_FAILED, again.stderr
    fixed = _stream(tmp_path, source, handler, run="fixed")
    assert fixed.returncode == ExitCode.OK, fixed.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert sorted({event["seq"] for event in handled if event["user"] == "u1"}) == list(range(30))
    assert [event["seq"] for event in handled if event["run"] == "fixed" and event["user"] == "u1"] == \
        list(range(10, 30))


def _start(tmp_path: Path, command: list[str]) -> subprocess.Popen[str]:
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": "0"})
    return subprocess.Popen([sys.executable, "-m", "segack", *command], cwd=ROOT, env=environment,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_events(tmp_path: Path, process: subprocess.Popen[str], count: int) -> None:
    deadline = time.monotonic() + 180
    while len(read_log(str(tmp_path / "log.jsonl"))) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out waiting for events"
        time.sleep(0.05)


@pytest.mark.faults
@pytest.mark.command
@pytest.mark.parametrize("times", [1, 2], ids=["once", "twice"])
def test_ctrl_c_stops_a_stream_at_the_end_of_its_micro_batch_and_twice_at_once(tmp_path, times):
    """Ctrl-C as a terminal sends it (SIGINT to the command's whole process group): once, the
    micro-batch under way ends and the command exits 0; twice, it stops at once and exits 1. Never a
    traceback, and the next run goes on from there."""
    source = tmp_path / "source"
    tables = [_events({f"u{n}": range(100 * batch, 100 * batch + 100) for n in range(40)}, 10_000 * batch)
              for batch in range(3)]
    _write_files(source, tables)
    command = ["stream", str(source), "--key", "user", "--order", "ts", "--handler",
               "tests.spark_handlers:record_slowly", "--checkpoint", str(tmp_path / "checkpoint"),
               "--segments", "2", "--option", "maxFilesPerTrigger=1", "--trigger", "1s"]
    process = _start(tmp_path, command)
    _wait_for_events(tmp_path, process, 500)
    for _ in range(times):
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.2)
    out, err = process.communicate(timeout=180)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "taken over" not in err, err
    if times == 1:
        assert process.returncode == ExitCode.OK, err
        assert "segack stream: stopping at the end of the micro-batch under way (again: now)" in err, err
        assert "segack stream: stopped as asked: 1 micro-batch, 4,000 events handled" in out, out
        assert _recorded(tmp_path / "checkpoint")["batch"] is None
    else:
        assert process.returncode == ExitCode.FAILED, err
        assert "segack stream: stopped at once as asked, its micro-batch under way incomplete" in err, err
    rest = _stream(tmp_path, source, "tests.spark_handlers:record_slowly", "--option", "maxFilesPerTrigger=1")
    assert rest.returncode == ExitCode.OK, rest.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert {(event["user"], event["seq"]) for event in handled} == {
        (f"u{n}", seq) for n in range(40) for seq in range(300)}
    if times == 1:  # stopped at a commit: nothing handled twice
        assert len(handled) == 12_000


@pytest.mark.faults
@pytest.mark.command
@pytest.mark.parametrize("master", ["local[2]", "local-cluster[1,1,1024]"])
def test_sigterm_to_the_process_group_stops_a_stream_without_a_traceback_and_it_resumes(tmp_path, master):
    """SIGTERM to the command's process group (``kill -TERM -PGID``, systemd's default
    ``KillMode=control-group``) reaches the driver's JVM too, which stops at once: the command
    says so in lines of its own, never a traceback, and the next run loses nothing."""
    source = tmp_path / "source"
    _write_files(source, [_events({f"u{n}": range(100 * batch, 100 * batch + 100) for n in range(40)},
                                  10_000 * batch) for batch in range(3)])
    command = ["stream", str(source), "--key", "user", "--order", "ts", "--handler",
               "tests.spark_handlers:record_slowly", "--checkpoint", str(tmp_path / "checkpoint"),
               "--segments", "2", "--option", "maxFilesPerTrigger=1", "--trigger", "1s", "--master", master]
    process = _start(tmp_path, command)
    _wait_for_events(tmp_path, process, 500)
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=180)
    assert "Traceback" not in err and process.returncode in (ExitCode.OK, ExitCode.FAILED), err
    rest = _stream(tmp_path, source, "tests.spark_handlers:record_slowly", "--option", "maxFilesPerTrigger=1")
    assert rest.returncode == ExitCode.OK, rest.stderr
    assert {(event["user"], event["seq"]) for event in read_log(str(tmp_path / "log.jsonl"))} == {
        (f"u{n}", seq) for n in range(40) for seq in range(300)}


@pytest.mark.faults
@pytest.mark.command
def test_ctrl_c_stops_a_replay_at_once_and_it_resumes(tmp_path):
    pq.write_table(_events({f"u{n}": range(300) for n in range(40)}, 0), tmp_path / "events.parquet")
    command = ["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts", "--handler",
               "tests.spark_handlers:record_slowly", "--checkpoint", str(tmp_path / "checkpoint"),
               "--segments", "2", "--flush-every", "100"]
    process = _start(tmp_path, command)
    _wait_for_events(tmp_path, process, 1000)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=180)
    assert process.returncode == ExitCode.FAILED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "segack replay: stopping now; the progress saved so far is kept" in err, err
    assert f"segack replay: stopped as asked; run it again to resume ({tmp_path / 'checkpoint'})" in err
    again = _start(tmp_path, command)
    _, err = again.communicate(timeout=300)
    assert again.returncode == ExitCode.OK, err
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert {(event["user"], event["seq"]) for event in handled} == {
        (f"u{n}", seq) for n in range(40) for seq in range(300)}


def test_a_micro_batch_refused_because_a_stop_was_asked_is_kept_as_the_stop_not_a_failure():
    """Spark may start the next micro-batch as a stop is asked: the batch refuses to start, and the
    query that ends on that refusal ended because it was asked to (the command exits 0)."""
    import threading

    from segack.spark_adapter.coordinator.query_watch import QueryBatches, StoppedError

    batches = QueryBatches(replay=None, keeper=None)
    now = threading.Event()

    class Query:
        stopped = False

        def stop(self):
            self.stopped = True

    query = Query()
    batches.stop_when_idle(query, now)
    assert query.stopped and not batches.interrupted
    with pytest.raises(StoppedError, match="batch 7 not started: the stream was asked to stop"):
        batches(None, 7)
    assert isinstance(batches.error, StoppedError)

