"""Spark benchmarks: whole ``segack replay`` runs against a hand-written pipeline, resumes, columns.

Whole-process timings: each pipeline is a fresh ``python`` process (JVM start
included), run alternately, best of three. While segack runs, a thread samples
the checkpoint's bytes. Column timings share one session and aggregate the
column so that Spark cannot skip computing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import best_of, print_table, save

ROOT = Path(__file__).resolve().parents[1]
SEGMENTS = 2
REPEATS = 3
#: The resume bench's timings move more between runs than the others': more tries.
RESUME_REPEATS = 5


class _PeakSize:
    """Samples a checkpoint directory's bytes (its state file plus progress files) while a run goes on."""

    def __init__(self, location: str) -> None:
        from segack.spark_adapter.store.checkpoint import CheckpointStore

        self.store = CheckpointStore(location)
        self.peak = 0
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while self._running.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.store.size_bytes())
            time.sleep(0.05)

    def __enter__(self) -> _PeakSize:
        self._running.set()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._running.clear()
        self._thread.join()
        self.peak = max(self.peak, self.store.size_bytes())


def _timed(command: list[str], expect_success: bool = True) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if expect_success and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - began


def _segack(data: str, checkpoint: str, handler: str = "bench.handwritten_pipeline:handle",
            segments: int = SEGMENTS) -> list[str]:
    return [sys.executable, "-m", "segack", "replay", data, "--key", "user", "--order", "ts",
            "--handler", handler, "--checkpoint", checkpoint, "--segments", str(segments)]


def _replay_vs_handwritten(rows: list[dict[str, Any]], sizes: list[dict[str, Any]], events: int,
                           data: str, workdir: str) -> None:
    handwritten = [sys.executable, "-m", "bench.handwritten_pipeline", data, "user", "ts", str(SEGMENTS)]
    best_segack = best_handwritten = float("inf")
    peak = 0
    for attempt in range(REPEATS):
        checkpoint = os.path.join(workdir, f"checkpoint-{events}-{attempt}")
        best_handwritten = min(best_handwritten, _timed(handwritten))
        with _PeakSize(checkpoint) as size:
            best_segack = min(best_segack, _timed(_segack(data, checkpoint)))
        peak = max(peak, size.peak)
        shutil.rmtree(checkpoint)
    rows.append({"workload": f"{events:,} events, no-op handler, whole process",
                 "segack": f"{best_segack:.1f} s", "competitor": f"{best_handwritten:.1f} s",
                 "segack / competitor": f"{best_segack / best_handwritten:.2f}x",
                 "competitor is": "repartition + sortWithinPartitions + mapInPandas"})
    sizes.append({"workload": f"{events:,} skewed events", "peak checkpoint + progress": f"{peak:,} bytes"})


def _resume_vs_fresh_remainder(rows: list[dict[str, Any]], events: int, data: str, workdir: str) -> None:
    """A resume with 90 % done against a fresh run over just the remaining 10 %: the resume skipping
    the check of its done events (the same file, unchanged), and checking them (``--verify always``)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from segack.spark_adapter.store.checkpoint import CheckpointStore

    table = pq.read_table(data)
    cut = int(pc.quantile(table.column("ts"), 0.9)[0].as_py())
    remainder = os.path.join(workdir, f"remainder-{events}.parquet")
    pq.write_table(table.filter(pc.greater_equal(table.column("ts"), cut)), remainder)
    best = {"fresh": float("inf"), "auto": float("inf"), "always": float("inf")}
    done_before = 0
    for attempt in range(RESUME_REPEATS):
        checkpoint = os.path.join(workdir, f"resume-{events}-{attempt}")
        # Every event from the cut on raises. One segment, so the run stops right there: in every
        # key group, the events before the cut are done and no other.
        os.environ["SEGACK_BENCH_STOP_AT"] = str(cut)
        _timed(_segack(data, checkpoint, "bench.handwritten_pipeline:handle_before_cut", segments=1),
               expect_success=False)
        del os.environ["SEGACK_BENCH_STOP_AT"]
        state = CheckpointStore(checkpoint).load()
        assert state is not None and state.tokens is not None
        done_before = state.tokens.done
        assert done_before == table.num_rows - pq.read_metadata(remainder).num_rows
        shutil.copytree(checkpoint, checkpoint + "-always")
        fresh = os.path.join(workdir, f"fresh-{events}-{attempt}")
        best["fresh"] = min(best["fresh"], _timed(_segack(remainder, fresh)))
        for verify, location in (("auto", checkpoint), ("always", checkpoint + "-always")):
            best[verify] = min(best[verify], _timed(_segack(data, location) + ["--verify", verify]))
        for location in (checkpoint, checkpoint + "-always", fresh):
            shutil.rmtree(location)
    for what, verify in (("resume, input unchanged: no check", "auto"),
                         ("resume, --verify always", "always")):
        rows.append({"workload": f"{events:,} events, no-op handler, whole process",
                     "done before": f"{done_before:,}", "run": what, "resume": f"{best[verify]:.1f} s",
                     "fresh run of the rest": f"{best['fresh']:.1f} s",
                     "resume / fresh": f"{best[verify] / best['fresh']:.2f}x"})


def _concurrency(rows: list[dict[str, Any]]) -> None:
    """Events/s of a 2 ms handler over 8 segments, one session, at concurrency 1 and 64 (threads,
    and an ``async def`` handler), and the unordered ``foreachPartition`` + 64-thread pool a user
    would write by hand."""
    import numpy as np
    import pyarrow as pa

    from bench.sleepy import nothing, nothing_in_lists, unordered_pool, wait, wait_async
    from segack.spark_adapter import local_session, replay

    spark = local_session("segack-bench-concurrency")

    def frame(events: int, partitions: int) -> Any:
        keys = np.random.default_rng(1).integers(0, 5000, events)
        table = pa.table({"user": [f"user-{key}" for key in keys.tolist()], "ts": np.arange(events)})
        frame = spark.createDataFrame(table).repartition(partitions).cache()
        frame.count()
        return frame

    def segack_rate(events: int, concurrency: int, handler: Any = wait, **options: Any) -> tuple[float, int]:
        data = frame(events, 2)
        with tempfile.TemporaryDirectory() as checkpoint:
            began = time.perf_counter()
            result = replay(data, key="user", order="ts", handler=handler, checkpoint=checkpoint, segments=8,
                            concurrency=concurrency, **options)
            seconds = time.perf_counter() - began
        data.unpersist()
        return events / seconds, result.peak_pending

    segack_rate(2000, 8)  # warms the session up
    # Fewer events at concurrency 1, which handles them ~500 per second per task.
    one, _ = segack_rate(4000, 1)
    many = max(segack_rate(100_000, 64) for _ in range(2))
    many_async = max(segack_rate(100_000, 64, wait_async) for _ in range(2))
    # A no-op handler at concurrency 1: the plain loop; the loop with retries and dead letters on;
    # and the dispatcher, which a timeout needs (a watchdog thread, calls on a pool of one).
    loop = max(segack_rate(1_000_000, 1, nothing)[0] for _ in range(3))
    careful = max(segack_rate(1_000_000, 1, nothing, retries=2, on_error="dead-letter")[0] for _ in range(3))
    dispatched = max(segack_rate(1_000_000, 1, nothing, timeout=60.0)[0] for _ in range(3))
    in_lists, in_lists_pending = max(segack_rate(1_000_000, 1, nothing_in_lists, batch_size=1000)
                                     for _ in range(3))
    data = frame(100_000, 8)
    by_hand = 0.0
    for _ in range(2):
        began = time.perf_counter()
        data.foreachPartition(unordered_pool)
        by_hand = max(by_hand, 100_000 / (time.perf_counter() - began))
    spark.stop()
    rows.append({"workload": "2 ms handler, 8 segments, 5,000 keys", "pipeline": "segack, concurrency 1",
                 "events/s": f"{one:,.0f}", "vs concurrency 1": "1.0x", "peak pending": "0"})
    rows.append({"workload": "2 ms handler, 8 segments, 5,000 keys", "pipeline": "segack, concurrency 64",
                 "events/s": f"{many[0]:,.0f}", "vs concurrency 1": f"{many[0] / one:.1f}x",
                 "peak pending": f"{many[1]:,}"})
    rows.append({"workload": "2 ms handler, 8 segments, 5,000 keys",
                 "pipeline": "segack, concurrency 64, async def handler",
                 "events/s": f"{many_async[0]:,.0f}", "vs concurrency 1": f"{many_async[0] / one:.1f}x",
                 "peak pending": f"{many_async[1]:,}"})
    rows.append({"workload": "2 ms handler, 8 partitions, 5,000 keys",
                 "pipeline": "by hand: foreachPartition + 64 threads, no order, no checkpoint",
                 "events/s": f"{by_hand:,.0f}", "vs concurrency 1": f"{by_hand / one:.1f}x",
                 "peak pending": ""})
    workload = "no-op handler, 1,000,000 events, 8 segments"
    rows.append({"workload": workload, "pipeline": "segack, concurrency 1 (the plain loop)",
                 "events/s": f"{loop:,.0f}", "vs concurrency 1": "1.0x", "peak pending": "0"})
    for pipeline, rate, pending in (
            ("segack, concurrency 1, retries=2, on_error='dead-letter' (the same loop)", careful, "0"),
            ("segack, concurrency 1, timeout=60 (through the dispatcher)", dispatched, "1"),
            ("segack, concurrency 1, batch_size=1000 (lists, through the dispatcher)", in_lists,
             f"{in_lists_pending:,}")):
        rows.append({"workload": workload, "pipeline": pipeline, "events/s": f"{rate:,.0f}",
                     "vs concurrency 1": f"{rate / loop:.2f}x (time {loop / rate:.2f}x)",
                     "peak pending": pending})


def _replay_seconds(frame: Any, segments: Any) -> float:
    """Best of two no-op replays of ``frame`` over ``segments``, each into a new checkpoint."""
    from bench.sleepy import nothing
    from segack.spark_adapter import replay

    def run() -> None:
        with tempfile.TemporaryDirectory() as checkpoint:
            replay(frame, key="user", order="ts", handler=nothing, checkpoint=checkpoint, segments=segments)

    return best_of(run, 2)


def _planning(rows: list[dict[str, Any]], count: int) -> None:
    """The planned set's largest share against ``SegmentSet.balanced(N)``'s on two skewed inputs,
    and the time of a no-op replay over each set for N = 8, in one session."""
    import numpy as np
    import pyarrow as pa

    from segack.demo import generate_events
    from segack.spark_adapter import local_session
    from segack.spark_adapter.coordinator.planning import plan

    spark = local_session("segack-bench-planning")
    zipf = np.random.default_rng(7).zipf(1.1, count)
    inputs = {
        "demo events": generate_events(count).select(["user", "ts"]),
        "Zipf(1.1) keys": pa.table({"user": np.char.add("k", zipf.astype(str)).tolist(),
                                    "ts": np.arange(count)}),
    }
    for name, table in inputs.items():
        frame = spark.createDataFrame(table).cache()
        frame.count()
        workload = f"{count // 1_000_000}M events, {name}"
        for workers in (4, 8, 16, 64):
            measured = plan(frame, key="user", workers=workers)
            planned, balanced = measured.segments, measured.balanced
            row = {"workload": workload, "N": workers, "hottest key": f"{measured.hottest_share:.2%}",
                   "planned largest": f"{measured.largest_share(planned):.1%}",
                   "balanced largest": f"{measured.largest_share(balanced):.1%}",
                   "speed-up planned / balanced": f"{measured.speedup(planned):.1f}x / "
                                                  f"{measured.speedup(balanced):.1f}x",
                   "replay planned / balanced": ""}
            if workers == 8:
                mine, axon = _replay_seconds(frame, planned), _replay_seconds(frame, balanced)
                row["replay planned / balanced"] = f"{mine:.1f} s / {axon:.1f} s = {mine / axon:.2f}x"
            rows.append(row)
        frame.unpersist()
    spark.stop()


def _rescaling(rows: list[dict[str, Any]]) -> None:
    """Seconds from a change of segments to the first event handled over the new set: segack's
    live change (a split while a replay runs; a scale between a stream's micro-batches) against
    what Spark offers otherwise (cancel the job, or stop the query, and start again over the new
    set), in one session. A 1 ms handler, 2 -> 3 segments; the median of three of each."""
    import statistics

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.sleepy import STAGE_LOG, wait_noting_stages
    from segack.spark_adapter import (
        CheckpointStore,
        ReplayError,
        foreach_batch,
        local_session,
        replay,
        scale,
        split,
    )

    workdir = tempfile.mkdtemp(prefix="segack-bench-rescale-")
    stage_log = os.path.join(workdir, "stages.log")
    # Through the session's executor environment: the JVM may have started before this group.
    spark = local_session("segack-bench-rescale", master="local[4]",
                          **{f"spark.executorEnv.{STAGE_LOG}": stage_log})
    count = 20_000
    keys = np.random.default_rng(3).integers(0, 5000, count)
    table = pa.table({"user": [f"user-{key}" for key in keys.tolist()], "ts": np.arange(count)})
    frame = spark.createDataFrame(table).repartition(4).cache()
    frame.count()

    def latency(checkpoint: str, asked_at: float) -> float:
        """From ``asked_at`` to the first event of a Spark stage that began once the new set was
        recorded."""
        recorded = CheckpointStore(checkpoint).load().settings["segment_history"][-1]["at"]
        since = max(asked_at, recorded)
        firsts: dict[int, float] = {}
        with open(stage_log) as log:
            for line in log:
                stage, at = line.split()
                firsts[int(stage)] = min(firsts.get(int(stage), float("inf")), float(at))
        return min(at for at in firsts.values() if at >= since) - asked_at

    def replay_in_background(checkpoint: str, segments: int) -> tuple[threading.Thread, threading.Event]:
        started = threading.Event()

        def run() -> None:
            with contextlib.suppress(ReplayError):
                replay(frame, key="user", order="ts", handler=wait_noting_stages, checkpoint=checkpoint,
                       segments=segments, flush_interval=0.5,
                       progress=lambda progress: progress.done > 2000 and started.set())

        thread = threading.Thread(target=run)
        thread.start()
        return thread, started

    def live_replay(number: int) -> float:
        checkpoint = os.path.join(workdir, f"replay-live-{number}")
        thread, started = replay_in_background(checkpoint, 2)
        started.wait()
        asked_at = time.time()
        split(checkpoint, 0)
        thread.join()
        return latency(checkpoint, asked_at)

    def restarted_replay(number: int) -> float:
        checkpoint = os.path.join(workdir, f"replay-restart-{number}")
        thread, started = replay_in_background(checkpoint, 2)
        started.wait()
        asked_at = time.time()
        spark.sparkContext.cancelAllJobs()
        thread.join()
        replay(frame, key="user", order="ts", handler=wait_noting_stages, checkpoint=checkpoint, segments=3,
               flush_interval=0.5)
        return latency(checkpoint, asked_at)

    source = os.path.join(workdir, "source")
    os.makedirs(source)
    for number in range(40):
        path = os.path.join(source, f"part-{number:02d}.parquet")
        pq.write_table(table.slice(number * 500, 500), path)
        os.utime(path, (1_700_000_000 + number * 100,) * 2)

    def stream_query(name: str, segments: int) -> Any:
        process = foreach_batch(wait_noting_stages, key="user", order="ts", segments=segments,
                                checkpoint=os.path.join(workdir, name), flush_interval=0.5)
        stream = spark.readStream.schema(frame.schema).option("maxFilesPerTrigger", 1).parquet(source)
        return (stream.writeStream.foreachBatch(process)
                .option("checkpointLocation", os.path.join(workdir, f"{name}-q")).start())

    def batches_done(name: str) -> int:
        state = CheckpointStore(os.path.join(workdir, name)).load()
        return -1 if state is None else state.settings["stream"]["completed_batch"]

    def wait_until(condition: Any) -> None:
        while not condition():
            time.sleep(0.05)

    def live_stream(number: int) -> float:
        name = f"stream-live-{number}"
        query = stream_query(name, 2)
        wait_until(lambda: batches_done(name) >= 2)
        asked_at = time.time()
        scale(os.path.join(workdir, name), 3)
        wait_until(lambda: batches_done(name) >= 8)
        query.stop()
        return latency(os.path.join(workdir, name), asked_at)

    def restarted_stream(number: int) -> float:
        name = f"stream-restart-{number}"
        query = stream_query(name, 2)
        wait_until(lambda: batches_done(name) >= 2)
        asked_at = time.time()
        query.stop()
        query = stream_query(name, 3)
        wait_until(lambda: batches_done(name) >= 8)
        query.stop()
        return latency(os.path.join(workdir, name), asked_at)

    try:
        measured = {}
        for what, function in (("replay, split while it runs", live_replay),
                               ("replay, cancel the job and start again", restarted_replay),
                               ("stream, scale while it runs", live_stream),
                               ("stream, stop the query and start again", restarted_stream)):
            measured[what] = statistics.median(function(number) for number in range(3))
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for mine, theirs in (("replay, split while it runs", "replay, cancel the job and start again"),
                         ("stream, scale while it runs", "stream, stop the query and start again")):
        for what in (mine, theirs):
            rows.append({"workload": "20,000 events, 1 ms handler, 2 -> 3 segments", "change": what,
                         "seconds to the first event over the new set": f"{measured[what]:.2f}",
                         "vs segack live": f"{measured[what] / measured[mine]:.1f}x"})


def _claim_cost(rows: list[dict[str, Any]]) -> None:
    """What claims cost a 1M-event no-op replay: each claim operation timed on a real checkpoint,
    times how often a run makes it (a task looks at the claims at every flush, the driver before
    every save, the keeper extends every few seconds), as a share of the run's time."""
    import numpy as np
    import pyarrow as pa

    from bench.sleepy import nothing
    from segack.spark_adapter import local_session, replay
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire

    spark = local_session("segack-bench-claims")
    count, segments, flush_every, flush_interval = 1_000_000, 8, 10_000, 5.0
    keys = np.random.default_rng(5).integers(0, 50_000, count)
    frame = spark.createDataFrame(pa.table({"user": [f"user-{key}" for key in keys.tolist()],
                                            "ts": np.arange(count)})).repartition(2).cache()
    frame.count()
    with tempfile.TemporaryDirectory() as checkpoint:
        replay(frame, key="user", order="ts", handler=nothing, checkpoint=checkpoint, segments=segments)
    with tempfile.TemporaryDirectory() as checkpoint:
        began = time.perf_counter()
        replay(frame, key="user", order="ts", handler=nothing, checkpoint=checkpoint, segments=segments,
               flush_every=flush_every, flush_interval=flush_interval)
        seconds = time.perf_counter() - began
        store = CheckpointStore(checkpoint)
        tasks = store.for_tasks("bench", 1)
        task_check = best_of(lambda: [tasks.fenced() for _ in range(1000)]) / 1000
        def claim_and_release() -> None:
            with ClaimKeeper(store, acquire(store, "bench", 60)):
                pass

        acquired_once = best_of(claim_and_release, 20)
        keeper = ClaimKeeper(store, acquire(store, "bench-extend", 60))
        extend = best_of(lambda: [keeper.extend() for _ in range(100)]) / 100
        driver_check = best_of(lambda: [keeper.check() for _ in range(100)]) / 100
    spark.stop()
    flushes = count / flush_every + segments * seconds / flush_interval
    saves = seconds / flush_interval + 3
    extends = seconds / keeper.interval
    # The tasks' checks run in parallel with each other; counted here as if one after another.
    spent = flushes * task_check + saves * driver_check + extends * extend + acquired_once
    rows.append({"workload": "1,000,000 events, no-op handler, 8 segments",
                 "run": f"{seconds:.2f} s",
                 "claim operations": f"{flushes:,.0f} task checks x {task_check * 1e6:,.0f} us, "
                                     f"{saves:,.0f} driver checks x {driver_check * 1e6:,.0f} us, "
                                     f"{extends:,.1f} extends x {extend * 1e6:,.0f} us, "
                                     f"claim + release {acquired_once * 1e3:.1f} ms",
                 "claims' share of the run": f"{spent / seconds:.3%}"})


def _columns(rows: list[dict[str, Any]]) -> None:
    from pyspark.sql import functions as F

    from segack.kernel import ROOT as WHOLE
    from segack.kernel import Segment, SegmentSet
    from segack.spark_adapter import local_session
    from segack.spark_adapter.spark.columns import hash_column, segment_column

    spark = local_session("segack-bench")
    count = 4_000_000
    frame = spark.range(count).select(F.concat(F.lit("user-"), F.col("id").cast("string")).alias("k")).cache()
    frame.count()

    def total(column: Any) -> Any:
        return lambda: frame.select(column.alias("v")).agg(F.sum("v")).collect()

    total(F.hash("k"))()  # warm the JVM before the first timing
    native = best_of(total(F.hash("k").bitwiseAND(F.lit(7))))
    balanced = best_of(total(segment_column(frame, "k", SegmentSet.balanced(8), "spark")))
    uneven_set = SegmentSet(Segment.split_balanced(WHOLE, 23))
    uneven = best_of(total(segment_column(frame, "k", uneven_set, "spark")))
    for what, seconds in [("hash(k) & 7 (Spark alone)", native),
                          ("segment column, 8 balanced segments", balanced),
                          ("segment column, 24 uneven segments", uneven)]:
        rows.append({"workload": f"{count // 1_000_000}M string keys, spark hash", "column": what,
                     "seconds": f"{seconds:.2f}", "vs Spark alone": f"{seconds / native:.2f}x"})
    reflect = best_of(total(hash_column("k", "string", "java", "reflect")))
    arrow = best_of(total(hash_column("k", "string", "java", "arrow")))
    for what, seconds in [("java hash: reflect Objects.hashCode", reflect),
                          ("java hash: Arrow UDF over the kernel", arrow)]:
        rows.append({"workload": f"{count // 1_000_000}M string keys, java hash", "column": what,
                     "seconds": f"{seconds:.2f}", "vs Spark alone": f"{seconds / native:.2f}x"})
    spark.stop()


def run() -> None:
    import pyarrow.parquet as pq

    from segack.demo import generate_events

    column_rows: list[dict[str, Any]] = []
    _columns(column_rows)
    print_table("Spark columns (floor: segment column <= 1.1x Spark's own hash() & mask)", column_rows,
                ["workload", "column", "seconds", "vs Spark alone"])
    save("spark-columns", column_rows)
    concurrency_rows: list[dict[str, Any]] = []
    _concurrency(concurrency_rows)
    print_table("Concurrent handler calls (floors: concurrency 64 >= 20x concurrency 1 with threads, "
                "30x async)", concurrency_rows,
                list(concurrency_rows[0]))
    save("spark-concurrency", concurrency_rows)
    planning_rows: list[dict[str, Any]] = []
    _planning(planning_rows, 5_000_000)
    print_table("Planned segments vs SegmentSet.balanced(N): largest segment's share of events, and a no-op "
                "replay over each for N = 8 (local[2])", planning_rows, list(planning_rows[0]))
    save("spark-planning", planning_rows)
    rescale_rows: list[dict[str, Any]] = []
    _rescaling(rescale_rows)
    print_table("A change of segments while a run goes on, against stopping and starting again",
                rescale_rows, list(rescale_rows[0]))
    save("spark-rescale", rescale_rows)
    claim_rows: list[dict[str, Any]] = []
    _claim_cost(claim_rows)
    print_table("What claims cost a replay (goal: lost in the noise)", claim_rows, list(claim_rows[0]))
    save("spark-claims", claim_rows)
    replay_rows: list[dict[str, Any]] = []
    size_rows: list[dict[str, Any]] = []
    resume_rows: list[dict[str, Any]] = []
    workdir = tempfile.mkdtemp(prefix="segack-bench-")
    try:
        for events in (1_000_000, 5_000_000):
            data = os.path.join(workdir, f"events-{events}.parquet")
            pq.write_table(generate_events(events), data)
            _replay_vs_handwritten(replay_rows, size_rows, events, data, workdir)
        _resume_vs_fresh_remainder(resume_rows, 5_000_000, os.path.join(workdir, "events-5000000.parquet"),
                                   workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table("segack replay vs a hand-written pipeline (floor: <= 1.10x)", replay_rows,
                ["workload", "segack", "competitor", "segack / competitor", "competitor is"])
    save("spark-replay", replay_rows)
    print_table("Peak checkpoint bytes during those runs (must not grow with events)", size_rows,
                ["workload", "peak checkpoint + progress"])
    save("spark-checkpoint", size_rows)
    print_table("Resume with 90 % done vs a fresh run of the remaining 10 % (goal: close to 1x)", resume_rows,
                list(resume_rows[0]))
    save("spark-resume", resume_rows)
