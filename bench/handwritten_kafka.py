"""The competitor of ``segack stream --format kafka``: the ordered consumer a PySpark user writes by
hand.

``python -m bench.handwritten_kafka BOOTSTRAP TOPIC SCHEMA BOUND PARTITIONS JARS CHECKPOINT``:
``readStream`` kafka with ``maxOffsetsPerTrigger=BOUND``, ``availableNow``; in ``foreachBatch``,
the values parsed by ``SCHEMA``, ``repartition`` by key, ``sortWithinPartitions`` by offset, and
``foreachPartition`` calling a no-op handler once per row (as a dict). No index, no claim, no dead
letters, no resume inside a batch: the floor segack's extra work is measured against.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any


def handle(event: dict[str, Any]) -> None:
    """The no-op handler both pipelines call."""


def _each(rows: Iterator[Any]) -> None:
    for row in rows:
        handle(row.asDict())


def main(argv: list[str]) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType

    from segack.spark_adapter import local_session

    bootstrap, topic, schema, bound, partitions, jars, checkpoint = argv
    spark = local_session("handwritten-kafka", **{"spark.jars": jars})
    value_type = DataType.fromDDL(schema)

    def batch(frame: Any, batch_id: int) -> None:
        events = frame.select(F.col("key").cast("string").alias("key"), "partition", "offset",
                              F.from_json(F.col("value").cast("string"), value_type).alias("v")).select(
            "key", "partition", "offset", "v.*")
        events.repartition(int(partitions), "key").sortWithinPartitions("offset").foreachPartition(_each)

    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", bound).load()
             .writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
