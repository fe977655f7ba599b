"""A Structured Streaming query that replays Parquet files through segack's ``foreach_batch``: a
process the rescale tests start, scale and kill.

``python -m tests.stream_process SOURCE CHECKPOINT STREAM_CHECKPOINT SEGMENTS`` runs until the
file ``SOURCE.stop`` appears (or the process is killed); ``SEGMENTS`` is a count, or ``-`` for the
checkpoint's own set.
"""

from __future__ import annotations

import os
import sys
import time

from segack.spark_adapter import foreach_batch
from segack.spark_adapter.spark.session import local_session
from tests.spark_handlers import record_with_task


def main(source: str, checkpoint: str, stream_checkpoint: str, segments: str) -> None:
    spark = local_session("segack-stream-test", master="local[4]")
    first = sorted(name for name in os.listdir(source) if name.endswith(".parquet"))[0]
    schema = spark.read.parquet(os.path.join(source, first)).schema
    process_batch = foreach_batch(record_with_task, key="user", order="ts", checkpoint=checkpoint,
                                  segments=None if segments == "-" else int(segments), flush_interval=0.3)
    query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
             .writeStream.foreachBatch(process_batch).option("checkpointLocation", stream_checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    while not os.path.exists(source + ".stop"):
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        time.sleep(0.2)
    query.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
