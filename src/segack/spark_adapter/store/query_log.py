"""What Spark's own checkpoint of a query segack runs says (``CHECKPOINT/stream``), read with the
checkpoint's files, so that segack's record of each micro-batch can be held against it.

Spark keeps, under a query's ``checkpointLocation``::

    metadata        {"id": "..."}: the query's id, for as long as the checkpoint lives
    offsets/N       written before micro-batch N runs: a version line, the batch's own metadata,
                    then one line per source: the source's end offset for the batch (JSON), or
                    "-" for a source with none yet
    commits/N       written once micro-batch N is complete (``foreachBatch`` returned)

A batch starts where the one before it ended. Spark runs a batch again, with the same offsets,
when its commit is missing; a checkpoint without offsets starts a new query, from the source's
starting options. segack records each batch's query id and end offsets with the batch
(:mod:`~segack.spark_adapter.coordinator.streaming`) and refuses a batch they do not match.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from segack.spark_adapter.errors import CheckpointError
from segack.spark_adapter.store.storage import Files

__all__ = ["QueryLog"]


class QueryLog:
    """Spark's checkpoint of one query, at ``directory`` of ``files``; ``location`` is how a user
    names it (the ``checkpointLocation`` Spark was given)."""

    def __init__(self, files: Files, directory: str, location: str) -> None:
        self.files, self.directory, self.location = files, directory, location

    def __repr__(self) -> str:
        return f"QueryLog({self.location!r})"

    def _numbered(self, kind: str) -> list[int]:
        """The batch ids with a file in ``kind`` (``offsets``, ``commits``), in order."""
        listed = self.files.list(posixpath.join(self.directory, kind))
        names = (posixpath.basename(path) for path, _ in listed)
        return sorted(int(name) for name in names if name.isdigit())

    def query_id(self) -> str | None:
        """The query's id, ``None`` before Spark started a query here."""
        data = self.files.read(posixpath.join(self.directory, "metadata"))
        if data is None:
            return None
        try:
            found = json.loads(data.decode("utf-8")).get("id")
        except (UnicodeDecodeError, ValueError, AttributeError):
            found = None
        if not isinstance(found, str):
            raise CheckpointError(f"{self.location}/metadata is not the metadata of a Spark query")
        return found

    def batches(self) -> list[int]:
        """The micro-batches Spark planned here (an offsets file each), in order."""
        return self._numbered("offsets")

    def committed(self) -> list[int]:
        """The micro-batches Spark recorded complete here, in order."""
        return self._numbered("commits")

    def kafka_initial_offsets(self) -> dict[tuple[str, int], int] | None:
        """Where Spark's Kafka source started the query (``sources/0/0``, written before its first
        micro-batch is planned: Spark ignores ``startingOffsets`` from then on), ``None`` if it has
        not written them."""
        where = posixpath.join(self.directory, "sources", "0", "0")
        data = self.files.read(where)
        if data is None:
            return None
        # A zero byte first (Spark 2.1's format), a version line, then the offsets' JSON.
        lines = data.lstrip(b"\0").decode("utf-8", errors="replace").split("\n", 1)
        damaged = CheckpointError(f"{self.location}/sources/0/0 is not a Kafka source's starting offsets")
        if len(lines) != 2 or not lines[0].startswith("v"):
            raise damaged
        try:
            parsed = json.loads(lines[1])
            return {(str(topic), int(partition)): int(offset) for topic, partitions in parsed.items()
                    for partition, offset in partitions.items()}
        except (ValueError, TypeError, AttributeError):
            raise damaged from None

    def end_offsets(self, batch_id: int) -> list[Any] | None:
        """Each source's end offset for micro-batch ``batch_id`` (parsed JSON; ``None`` for a source
        with none), ``None`` if Spark has not planned it."""
        data = self.files.read(posixpath.join(self.directory, "offsets", str(batch_id)))
        where = f"{self.location}/offsets/{batch_id}"
        if data is None:
            return None
        lines = data.decode("utf-8", errors="replace").split("\n")
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise CheckpointError(f"{where} is not a Spark offset log entry")
        try:
            return [None if line == "-" else json.loads(line) for line in lines[2:] if line]
        except ValueError:
            raise CheckpointError(f"{where} is not a Spark offset log entry") from None
