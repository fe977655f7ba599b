"""The competitor of ``segack replay``: the ordered pipeline a PySpark user would write by hand.

``python -m bench.handwritten_pipeline INPUT KEY ORDER PARTITIONS``: repartition by key,
sort within partitions by order, ``mapInPandas`` calling a no-op handler once per row (as a
dict). No index, no checkpoint, no resume: the floor segack's extra work is measured against.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any


def handle(event: dict[str, Any]) -> None:
    """The no-op handler both pipelines call."""


def handle_before_cut(event: dict[str, Any]) -> None:
    """No-op up to ``$SEGACK_BENCH_STOP_AT`` (a ``ts``); raises from there, so each segment stops at it."""
    if event["ts"] >= int(os.environ["SEGACK_BENCH_STOP_AT"]):
        raise RuntimeError("the bench stops here")


def _process(frames: Iterator[Any]) -> Iterator[Any]:
    import pandas as pd

    handled = 0
    for frame in frames:
        for event in frame.to_dict("records"):
            handle(event)
            handled += 1
    yield pd.DataFrame({"handled": [handled]})


def main(argv: list[str]) -> int:
    from segack.spark_adapter import local_session

    path, key, order, partitions = argv
    spark = local_session("handwritten")
    frame = spark.read.parquet(path)
    ordered = frame.repartition(int(partitions), key).sortWithinPartitions(order)
    total = sum(row["handled"] for row in ordered.mapInPandas(_process, "handled long").collect())
    print(f"handled {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
