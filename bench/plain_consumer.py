"""The floor of the latency bench (:mod:`bench.latency`): a plain ``confluent-kafka`` consumer in a
loop that calls the handler on each record as it comes, one process, no Spark, no order kept
across calls (there is one call at a time), nothing saved.

``python -m bench.plain_consumer BOOTSTRAP TOPIC MODULE:FUNCTION`` runs until SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import sys
from typing import Any

from segack.spark_adapter.coordinator.replay import load_handler


def main(bootstrap: str, topic: str, handler_name: str) -> None:
    from confluent_kafka import Consumer

    handler = load_handler(handler_name)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-plain-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    stopping: list[Any] = []
    signal.signal(signal.SIGTERM, lambda number, frame: stopping.append(number))
    while not stopping:
        for message in consumer.consume(500, 0.02):
            if message.error() is not None:
                continue
            event = json.loads(message.value())
            event.update(key=message.key().decode(), partition=message.partition(), offset=message.offset(),
                         timestamp=dt.datetime.fromtimestamp(message.timestamp()[1] / 1000, dt.UTC))
            handler(event)
    consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
