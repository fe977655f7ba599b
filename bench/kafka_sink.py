"""The handlers of the Kafka sink bench (:func:`bench.kafka.run_sink`), importable by Spark's Python
workers: the database is the one the environment variable :data:`DSN` names.

- :data:`sink`: segack's :class:`~segack.sinks.SqlSink` with ``apply_many`` (each list one
  transaction, its events recorded once);
- :func:`write_partition`: the hand-written ``foreachPartition`` writer of :mod:`bench.sinks`
  (``executemany`` in 1,000-row transactions, no order, no dedupe).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from bench.sinks import Connect, apply_many, by_hand
from segack.sinks import SqlSink

#: The environment variable naming the database.
DSN = "SEGACK_BENCH_DSN"

sink = SqlSink(Connect(os.environ.get(DSN, "")), apply_many=apply_many)


def write_partition(rows: Iterator[Any]) -> None:
    """A partition's rows into the ledger and balances by hand."""
    by_hand(Connect(os.environ[DSN]), rows)


#: bench.handwritten_kafka calls it with a partition's rows, not with each row.
write_partition.per_partition = True  # type: ignore[attr-defined]
