"""Spark benchmarks: whole ``segack replay`` runs against a hand-written pipeline, and columns.

Whole-process timings: each pipeline is a fresh ``python`` process (JVM start
included), run alternately, best of two. Column timings share one session and
aggregate the column so that Spark cannot skip computing it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import best_of, print_table, save

ROOT = Path(__file__).resolve().parents[1]
SEGMENTS = 2


def _timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def _replay_vs_handwritten(rows: list[dict[str, Any]], events: int, workdir: str) -> None:
    import pyarrow.parquet as pq

    from segack.demo import generate_events

    data = os.path.join(workdir, f"events-{events}.parquet")
    pq.write_table(generate_events(events), data)
    handwritten = [sys.executable, "-m", "bench.handwritten_pipeline", data, "user", "ts", str(SEGMENTS)]
    best_segack = best_handwritten = float("inf")
    for attempt in range(2):
        checkpoint = os.path.join(workdir, f"checkpoint-{events}-{attempt}")
        segack = [sys.executable, "-m", "segack", "replay", data, "--key", "user", "--order", "ts",
                  "--handler", "bench.handwritten_pipeline:handle", "--checkpoint", checkpoint,
                  "--segments", str(SEGMENTS)]
        best_handwritten = min(best_handwritten, _timed(handwritten))
        best_segack = min(best_segack, _timed(segack))
        shutil.rmtree(checkpoint)
    rows.append({"workload": f"{events:,} events, no-op handler, whole process",
                 "segack": f"{best_segack:.1f} s", "competitor": f"{best_handwritten:.1f} s",
                 "segack / competitor": f"{best_segack / best_handwritten:.2f}x",
                 "competitor is": "repartition + sortWithinPartitions + mapInPandas"})


def _columns(rows: list[dict[str, Any]]) -> None:
    from pyspark.sql import functions as F

    from segack.kernel import ROOT as WHOLE
    from segack.kernel import Segment, SegmentSet
    from segack.spark_adapter import local_session
    from segack.spark_adapter.columns import hash_column, segment_column

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
    column_rows: list[dict[str, Any]] = []
    _columns(column_rows)
    print_table("Spark columns (floor: segment column <= 1.1x Spark's own hash() & mask)", column_rows,
                ["workload", "column", "seconds", "vs Spark alone"])
    save("spark-columns", column_rows)
    replay_rows: list[dict[str, Any]] = []
    workdir = tempfile.mkdtemp(prefix="segack-bench-")
    try:
        for events in (200_000, 1_000_000):
            _replay_vs_handwritten(replay_rows, events, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table("segack replay vs a hand-written pipeline (floor: <= 1.5x)", replay_rows,
                ["workload", "segack", "competitor", "segack / competitor", "competitor is"])
    save("spark-replay", replay_rows)
