"""What a :class:`~segack.sinks.KafkaSink` keeps in the checkpoint:

- the Kafka transactional ids its tasks used, each recorded before it was used: a run that takes
  the checkpoint over fences every one of them, so that no producer of an older run can commit
  after it started;
- its positions topic, that topic's partition count and its Kafka topic id, recorded by the first
  run: a key's position is in partition ``key_group % partitions``, so a later run with another
  count would look for it in another partition, and apply the key's events again; and a topic of
  the same name with another id (deleted and made again) has lost the positions.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.storage import Files

__all__ = ["SINK_POSITIONS_FILE", "SINK_PRODUCERS_DIR", "forget_producers", "positions_topic",
           "record_positions_topic", "register_producer", "registered_producers"]

#: Where the ids are: one empty file per id, named by it.
SINK_PRODUCERS_DIR = "kafka-producers"
#: The positions topic: ``{"topic": NAME, "partitions": COUNT, "topic_id": ID}`` (no ``topic_id``:
#: recorded by an older release, or by brokers that give none).
SINK_POSITIONS_FILE = "kafka-positions.json"


def register_producer(files: Files, transactional_id: str) -> None:
    """Record that a task is about to use ``transactional_id``, before it does."""
    with durable_write("sink-setup"):
        files.write(files.path(SINK_PRODUCERS_DIR, transactional_id), b"")


def registered_producers(files: Files) -> list[str]:
    """The ids recorded and not yet forgotten, sorted."""
    names = (posixpath.basename(path) for path, _ in files.list(files.path(SINK_PRODUCERS_DIR)))
    return sorted(name for name in names if not name.endswith(".tmp"))  # a write that did not finish


def forget_producers(files: Files, transactional_ids: list[str]) -> None:
    """Forget ids that were fenced: no producer of theirs can commit any more."""
    with durable_write("sink-setup"):
        for transactional_id in transactional_ids:
            files.delete(files.path(SINK_PRODUCERS_DIR, transactional_id))


def positions_topic(files: Files) -> dict[str, Any] | None:
    """The positions topic the checkpoint's first run recorded (``None``: none yet)."""
    data = files.read(files.path(SINK_POSITIONS_FILE))
    found: dict[str, Any] | None = None if data is None else json.loads(data)
    return found


def record_positions_topic(files: Files, topic: str, partitions: int, topic_id: str | None) -> None:
    """Record the positions topic of the checkpoint's runs, its partition count and its topic id."""
    body = {"topic": topic, "partitions": partitions, "topic_id": topic_id}
    with durable_write("sink-setup"):
        files.write(files.path(SINK_POSITIONS_FILE), json.dumps(body).encode("utf-8"))
