"""The competitor of ``segack stream --format kafka``: the ordered consumer a PySpark user writes by
hand.

``python -m bench.handwritten_kafka BOOTSTRAP TOPIC SCHEMA BOUND PARTITIONS JARS CHECKPOINT
[TRIGGER HANDLER]``: ``readStream`` kafka with ``maxOffsetsPerTrigger=BOUND``, ``availableNow`` (or
a ``processingTime`` of TRIGGER seconds, until SIGTERM); in ``foreachBatch``, the values parsed by
``SCHEMA``, ``repartition`` by key, ``sortWithinPartitions`` by offset, and ``foreachPartition``
calling HANDLER (``MODULE:FUNCTION``, default :func:`handle`) once per row (as a dict). A HANDLER
with ``per_partition`` set is a writer that keeps no order: it gets each partition's rows as read,
without the shuffle or the sort. No index, no claim, no dead letters, no resume inside a batch: the
floor segack's extra work is measured against. Prints ``batch ID: ROWS rows in SECONDS s`` for
each micro-batch that read rows.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Where :func:`note_latency` appends (an environment variable, so that executors see it).
LATENCY_LOG = "SEGACK_BENCH_LATENCY_LOG"


def handle(event: dict[str, Any]) -> None:
    """The no-op handler both pipelines call."""


def note_latency(event: dict[str, Any]) -> None:
    """The steady-producer bench's handler: appends the seconds from the record's Kafka timestamp
    to this call, and the timestamp, to the file :data:`LATENCY_LOG` names."""
    produced = event["timestamp"].timestamp()
    with open(os.environ[LATENCY_LOG], "a") as log:
        log.write(f"{produced:.3f} {time.time() - produced:.4f}\n")


#: The account whose records :func:`note_latency_beside_a_slow_key` takes 50 ms over.
SLOW_KEY = "acct-0"


def note_latency_beside_a_slow_key(event: dict[str, Any]) -> None:
    """:func:`note_latency`, but each record of :data:`SLOW_KEY` takes 50 ms and is not noted: the
    other keys' latency beside one slow key."""
    if event["key"] == SLOW_KEY:
        time.sleep(0.05)
        return
    note_latency(event)


#: The variable that makes the job read Avro by one fixed schema (its JSON text) instead of JSON.
AVRO_SCHEMA = "SEGACK_BENCH_AVRO_SCHEMA"


def _each(handler: Callable[[dict[str, Any]], Any]) -> Callable[[Iterator[Any]], None]:
    def each(rows: Iterator[Any]) -> None:
        for row in rows:
            handler(row.asDict())
    return each


def _report(query: Any) -> None:
    """Print each reported micro-batch that read rows, as ``segack stream`` does."""
    seen = -1
    while query.isActive:
        time.sleep(0.2)
        for progress in query.recentProgress:
            if int(progress["batchId"]) > seen and progress.get("numInputRows"):
                seen = int(progress["batchId"])
                seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
                print(f"batch {seen}: {progress['numInputRows']} rows in {seconds:.2f} s", flush=True)


def main(argv: list[str]) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType

    from segack.spark_adapter import load_handler, local_session

    bootstrap, topic, schema, bound, partitions, jars, checkpoint, *rest = argv
    trigger = rest[0] if rest else "available-now"
    handler_name = rest[1] if len(rest) > 1 else "bench.handwritten_kafka:handle"
    spark = local_session("handwritten-kafka", **{"spark.jars": jars})
    value_type = DataType.fromDDL(schema)
    handler = load_handler(handler_name)
    unordered = getattr(handler, "per_partition", False)
    # The backlog bench's no-op gets what the floor job passes; a handler that times records
    # gets their Kafka timestamp too.
    record = ["key", "partition", "offset", *(["timestamp"] if rest[1:] else [])]

    # The formats bench's floor: Avro in Confluent's wire format read as open-source Spark can, the
    # 5-byte header cut off and every value read by one fixed schema (Spark's from_avro).
    avro_schema = os.environ.get(AVRO_SCHEMA)

    def value() -> Any:
        if avro_schema is None:
            return F.from_json(F.col("value").cast("string"), value_type)
        from pyspark.sql.avro.functions import from_avro

        return from_avro(F.expr("substring(value, 6, length(value) - 5)"), avro_schema)

    def batch(frame: Any, batch_id: int) -> None:
        events = frame.select(F.col("key").cast("string").alias("key"), *record[1:],
                              value().alias("v")).select(*record, "v.*")
        if unordered:  # a writer of whole partitions (bench.kafka_sink), as read
            events.foreachPartition(handler)
        else:
            events.repartition(int(partitions), "key").sortWithinPartitions("offset").foreachPartition(
                _each(handler))

    how = ({"availableNow": True} if trigger == "available-now"
           else {"processingTime": f"{float(trigger)} seconds"})
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", bound).load()
             .writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
             .trigger(**how).start())
    signal.signal(signal.SIGTERM, lambda number, frame: threading.Thread(target=query.stop).start())
    _report(query)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
