"""A real-time stream's progress in each Kafka partition, kept in the checkpoint
(``partitions/partition-NNNNN.json``), and the rule that its checkpoint is its mode's alone.

Each file is one partition's latest progress as its task recorded it
(:mod:`~segack.spark_adapter.worker.partition_task`): ``next``, the offset below which every record
is done; ``done``, the intervals of offsets done above it; the counts; the run's claim. A task
replaces it whole and atomically, as a task's progress file (the ``progress`` crash points).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import CheckpointError, ForeignInputError
from segack.spark_adapter.results import PartitionReport
from segack.spark_adapter.store.crash_points import durable_write

if TYPE_CHECKING:
    from segack.spark_adapter.store.storage import Files

__all__ = ["PARTITIONS_DIR", "REAL_TIME_MODE", "PartitionStates", "refuse_real_time"]

#: Where a real-time stream's tasks keep each Kafka partition's progress.
PARTITIONS_DIR = "partitions"
#: The ``mode`` setting of a real-time stream's checkpoint, whose positions are Kafka offsets: no
#: replay or micro-batch stream may use it.
REAL_TIME_MODE = "real-time"
_PREFIX, _SUFFIX, _OWNER = "partition-", ".json", ".owner"


def refuse_real_time(settings: Mapping[str, Any], location: str) -> None:
    """Refuse (:class:`~segack.spark_adapter.ForeignInputError`) a real-time stream's checkpoint,
    whose ``settings`` these are, to a replay or a micro-batch stream."""
    if settings.get("mode") == REAL_TIME_MODE:
        raise ForeignInputError(f"checkpoint {location} is a real-time stream's (its positions are Kafka "
                                f"offsets); use a new checkpoint location, or --trigger real-time")


class PartitionStates:
    """The partitions' progress files of the checkpoint at ``location``, through ``files``."""

    def __init__(self, files: Files, location: str) -> None:
        self.files, self.location = files, location

    def _path(self, partition: int) -> str:
        return self.files.path(PARTITIONS_DIR, f"{_PREFIX}{partition:05d}{_SUFFIX}")

    def _parse(self, data: bytes | None, partition: int) -> dict[str, Any] | None:
        """A file's progress; a damaged one is a :class:`~segack.spark_adapter.CheckpointError`."""
        if data is None:
            return None
        where = f"{self.location}/{PARTITIONS_DIR}/{_PREFIX}{partition:05d}{_SUFFIX}"
        try:
            state = json.loads(data)
        except ValueError:
            raise CheckpointError(f"{where} is damaged: not JSON") from None
        if not isinstance(state, dict) or not isinstance(state.get("next"), int):
            raise CheckpointError(f"{where} is damaged: it has no next offset")
        return state

    def read(self, partition: int) -> dict[str, Any] | None:
        """What the tasks last recorded of ``partition``, ``None`` if nothing."""
        return self._parse(self.files.read(self._path(partition)), partition)

    def write(self, partition: int, state: dict[str, Any]) -> None:
        """Record ``partition``'s progress, atomically."""
        data = json.dumps(state, sort_keys=True).encode("utf-8")
        with durable_write("progress"):
            self.files.write(self._path(partition), data)

    def own(self, partition: int, token: str) -> None:
        """Make the task attempt ``token`` the one that reads ``partition``: an earlier attempt still
        running (its executor out of reach, not gone) sees it at its next save and writes nothing
        more."""
        with durable_write("progress"):
            self.files.write(self.files.path(PARTITIONS_DIR, f"{_PREFIX}{partition:05d}{_OWNER}"),
                             token.encode("ascii"))

    def owner(self, partition: int) -> str | None:
        """The task attempt that reads ``partition`` now (:meth:`own`)."""
        data = self.files.read(self.files.path(PARTITIONS_DIR, f"{_PREFIX}{partition:05d}{_OWNER}"))
        return None if data is None else data.decode("ascii", errors="replace")

    def all(self) -> dict[int, dict[str, Any]]:
        """Every partition's progress, by partition."""
        found: dict[int, dict[str, Any]] = {}
        for path, _ in self.files.list(self.files.path(PARTITIONS_DIR)):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
                partition = int(name[len(_PREFIX):-len(_SUFFIX)])
                state = self._parse(self.files.read(path), partition)
                if state is not None:
                    found[partition] = state
        return found

    def reports(self) -> tuple[PartitionReport, ...]:
        """Every partition's progress as a :class:`~segack.spark_adapter.PartitionReport`, by partition."""
        return tuple(PartitionReport(
            partition, int(state["next"]), int(state.get("read", state["next"])), state.get("end"),
            int(state.get("pending", 0)), len(state.get("done", [])), int(state.get("handled_total", 0)),
        ) for partition, state in sorted(self.all().items()))
