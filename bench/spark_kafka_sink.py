"""The competitor of a :class:`~segack.sinks.KafkaSink` stream: Kafka to Kafka as a PySpark user
writes it with Spark's own Kafka sink.

``python -m bench.spark_kafka_sink BOOTSTRAP TOPIC OUTPUT SCHEMA BOUND JARS CHECKPOINT``:
``readStream`` kafka with ``maxOffsetsPerTrigger=BOUND``, ``availableNow``; each value parsed by
``SCHEMA`` (``from_json``) and written again as JSON (``to_json``), keyed as read, by
``writeStream.format("kafka")`` to OUTPUT. At least once (a retried task or batch writes its
records again), no order across a key's records beyond the input partition's.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType

    from segack.spark_adapter import local_session

    bootstrap, topic, output, schema, bound, jars, checkpoint = argv
    spark = local_session("spark-kafka-sink", **{"spark.jars": jars})
    value_type = DataType.fromDDL(schema)
    records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", topic).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", bound).load())
    written = records.select("key", F.to_json(F.from_json(F.col("value").cast("string"), value_type))
                             .alias("value"))
    query = (written.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", output).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
