"""The Kafka transactional ids a :class:`~segack.sinks.KafkaSink`'s tasks used, recorded in the
checkpoint before each was used: a run that takes the checkpoint over fences every one of them, so
that no producer of an older run can commit after it started."""

from __future__ import annotations

import posixpath

from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.storage import Files

__all__ = ["SINK_PRODUCERS_DIR", "forget_producers", "register_producer", "registered_producers"]

#: Where they are: one empty file per id, named by it.
SINK_PRODUCERS_DIR = "kafka-producers"


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
