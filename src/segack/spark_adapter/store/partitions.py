"""A real-time stream's progress in each Kafka partition, kept in the checkpoint
(``partitions/``), and the rule that its checkpoint is its mode's alone.

A partition's progress (:mod:`~segack.spark_adapter.worker.partition_task`) is ``next``, the offset
below which every record is done; ``done``, the intervals of offsets done above it; the counts; the
run's claim. Only the partition's current holder writes it, and that rule is kept by the writes
themselves, not by a look before them (which a paused process passes, and acts on much later):

- **Epochs.** Each holder of a partition has an epoch of its own, a file
  ``partition-NNNNN.eEEEEEEEEEE.json`` that it alone replaces, atomically, at every save. The
  partition's progress is what the highest epoch holds.
- **Taking a partition over** (:meth:`PartitionStates.take_over`) is three writes, in this order:
  (1) create the next epoch's file, exclusively (of two attempts at once one wins; the other makes
  the epoch after it), holding only its owner: a *marker*; (2) read the progress of the highest
  epoch below it that holds some; (3) write that progress into the new epoch. From (1) on, nothing
  the older holder writes is the partition's progress any more, wherever it was paused; what it
  wrote before (2) is in the new epoch. So the progress never goes backwards, and every value it
  ever had is at most every later one.
- **A marker** (a taker that has done (1) but not (3)) leaves the partition's progress unsettled:
  readers show the epoch below it, but nothing is committed to a consumer group from it
  (:attr:`PartitionView.settled`), since its holder could still move it before (2).
- **Epochs below** the highest settled one are deleted by its holder; an older holder that writes
  its epoch again only makes a file no reader takes.

A partition nobody has held yet gets its start recorded by the driver
(:meth:`PartitionStates.record_starts`, epoch 1) before any task reads it: a run that starts at
``latest`` and dies before its first save starts there again, not at a later ``latest``.

Checkpoints of segack before epochs hold ``partition-NNNNN.json``: it is read as epoch 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import CheckpointError, ForeignInputError
from segack.spark_adapter.results import PartitionReport
from segack.spark_adapter.store.crash_points import durable_write

if TYPE_CHECKING:
    from segack.spark_adapter.store.storage import Files

__all__ = ["DRIVER", "PARTITIONS_DIR", "REAL_TIME_MODE", "Lease", "PartitionStates", "PartitionView",
           "refuse_real_time"]

#: Where a real-time stream's tasks keep each Kafka partition's progress.
PARTITIONS_DIR = "partitions"
#: The ``mode`` setting of a real-time stream's checkpoint, whose positions are Kafka offsets: no
#: replay or micro-batch stream may use it.
REAL_TIME_MODE = "real-time"
#: The ``attempt`` of an epoch the driver made (a partition's recorded start), not a task.
DRIVER = "driver"
#: Takeovers tried in a row before giving up: each failed one means another attempt made an epoch.
_TAKE_OVER_TRIES = 100
_NAME = re.compile(r"partition-(\d{5,})(?:\.e(\d{10}))?\.json")


def refuse_real_time(settings: Mapping[str, Any], location: str) -> None:
    """Refuse (:class:`~segack.spark_adapter.ForeignInputError`) a real-time stream's checkpoint,
    whose ``settings`` these are, to a replay or a micro-batch stream."""
    if settings.get("mode") == REAL_TIME_MODE:
        raise ForeignInputError(f"checkpoint {location} is a real-time stream's (its positions are Kafka "
                                f"offsets); use a new checkpoint location, or --trigger real-time")


@dataclass(frozen=True)
class Lease:
    """A partition held in one epoch: by a task attempt (``owner["attempt"]``, its token), or by the
    driver's start record."""

    partition: int
    epoch: int
    #: ``run``, ``claim`` and ``attempt`` of the holder.
    owner: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class PartitionView:
    """One partition as the checkpoint holds it at one moment."""

    partition: int
    #: The highest epoch, and its owner.
    epoch: int
    owner: dict[str, Any]
    #: The partition's progress: the highest epoch's, or if that one is a marker, the highest
    #: epoch's below it that has some (``None``: none has).
    state: dict[str, Any] | None
    #: Whether the highest epoch holds the progress (not a marker): only then may it go to a
    #: consumer group.
    settled: bool


class PartitionStates:
    """The partitions' progress files of the checkpoint at ``location``, through ``files``."""

    def __init__(self, files: Files, location: str) -> None:
        self.files, self.location = files, location

    # ------------------------------------------------------------------ names and files

    def _path(self, partition: int, epoch: int) -> str:
        name = f"partition-{partition:05d}" + ("" if epoch == 0 else f".e{epoch:010d}")
        return self.files.path(PARTITIONS_DIR, f"{name}.json")

    def _epochs(self, only: int | None = None) -> dict[int, dict[int, str]]:
        """Each partition's epochs and their files, as one listing finds them."""
        found: dict[int, dict[int, str]] = {}
        for path, _ in self.files.list(self.files.path(PARTITIONS_DIR)):
            matched = _NAME.fullmatch(path.rsplit("/", 1)[-1])
            if matched is None:
                continue  # a temporary file, the owner file of an older segack
            partition = int(matched[1])
            if only is None or partition == only:
                found.setdefault(partition, {})[int(matched[2] or 0)] = path
        return found

    def _parse(self, data: bytes, partition: int, epoch: int) -> dict[str, Any]:
        """An epoch file's content; a damaged one is a :class:`~segack.spark_adapter.CheckpointError`."""
        where = f"{self.location}/{self._path(partition, epoch).rsplit('/', 2)[-2]}/" \
                f"{self._path(partition, epoch).rsplit('/', 1)[-1]}"
        try:
            content = json.loads(data)
        except ValueError:
            raise CheckpointError(f"{where} is damaged: not JSON") from None
        if not isinstance(content, dict):
            raise CheckpointError(f"{where} is damaged: not an object")
        if epoch == 0:  # an older segack's: progress alone
            content = {"owner": {}, **content}
        if not isinstance(content.get("owner"), dict) or (
                "next" in content and not isinstance(content["next"], int)) or (
                "next" not in content and epoch == 0):
            raise CheckpointError(f"{where} is damaged: it has no owner or no next offset")
        return content

    def _read(self, path: str, partition: int, epoch: int) -> dict[str, Any] | None:
        data = self.files.read(path)
        return None if data is None else self._parse(data, partition, epoch)

    @staticmethod
    def _progress(content: dict[str, Any]) -> dict[str, Any] | None:
        """The progress an epoch's file holds; ``None`` for a marker."""
        if "next" not in content:
            return None
        return {name: value for name, value in content.items() if name not in ("owner", "epoch")}

    def _view(self, partition: int, epochs: dict[int, str]) -> PartitionView | None:
        """``partition`` as its files ``epochs`` hold it; ``None`` if they are all gone (deleted
        since the listing: the caller lists again)."""
        top: tuple[int, dict[str, Any]] | None = None
        for epoch in sorted(epochs, reverse=True):
            content = self._read(epochs[epoch], partition, epoch)
            if content is None:
                if top is None:
                    return None  # the highest is gone: a newer one was made since
                continue  # deleted below a settled epoch: the one above holds what it held
            if top is None:
                top = (epoch, content)
            progress = self._progress(content)
            if progress is not None:
                return PartitionView(partition, top[0], top[1]["owner"], progress, epoch == top[0])
        if top is None:
            return None
        return PartitionView(partition, top[0], top[1]["owner"], None, False)

    # ------------------------------------------------------------------ reading

    def views(self) -> dict[int, PartitionView]:
        """Every partition, by partition, at one moment (a partition whose files change while they
        are read is read again)."""
        found: dict[int, PartitionView] = {}
        for _ in range(_TAKE_OVER_TRIES):
            epochs = self._epochs()
            again = False
            for partition, files in sorted(epochs.items()):
                if partition in found:
                    continue
                view = self._view(partition, files)
                if view is None:
                    again = True
                else:
                    found[partition] = view
            if not again:
                return found
        raise CheckpointError(f"{self.location}/{PARTITIONS_DIR}: its files kept changing while read")

    def view(self, partition: int) -> PartitionView | None:
        """``partition`` now; ``None`` if it has no file."""
        for _ in range(_TAKE_OVER_TRIES):
            epochs = self._epochs(partition).get(partition)
            if not epochs:
                return None
            view = self._view(partition, epochs)
            if view is not None:
                return view
        raise CheckpointError(f"{self.location}/{PARTITIONS_DIR}: partition {partition}'s files kept "
                              f"changing while read")

    def read(self, partition: int) -> dict[str, Any] | None:
        """``partition``'s progress, ``None`` if it has none."""
        view = self.view(partition)
        return None if view is None else view.state

    def all(self) -> dict[int, dict[str, Any]]:
        """Every partition's progress, by partition."""
        return {partition: view.state for partition, view in self.views().items() if view.state is not None}

    def reports(self, views: Mapping[int, PartitionView] | None = None) -> tuple[PartitionReport, ...]:
        """Every partition's progress as a :class:`~segack.spark_adapter.PartitionReport` (its topic
        and Kafka partition as its state names them), by number (from ``views`` if given)."""
        views = self.views() if views is None else views
        return tuple(PartitionReport(
            int(state.get("partition", number)), int(state["next"]), int(state.get("read", state["next"])),
            state.get("end"), int(state.get("pending", 0)), len(state.get("done", [])),
            int(state.get("handled_total", 0)), state.get("topic"), number,
        ) for number, view in sorted(views.items()) if (state := view.state) is not None)

    # ------------------------------------------------------------------ writing

    def _content(self, lease: Lease, state: Mapping[str, Any] | None) -> bytes:
        return json.dumps({**(state or {}), "epoch": lease.epoch, "owner": lease.owner},
                          sort_keys=True).encode("utf-8")

    def record_starts(self, states: Mapping[int, Mapping[str, Any]], owner: Mapping[str, Any]) -> list[int]:
        """Record where each partition of ``states`` that nobody has held yet starts (its state's
        ``next``), as its epoch 1; the partitions recorded (one listing for them all)."""
        held = self._epochs()
        recorded = []
        for partition, state in sorted(states.items()):
            if held.get(partition):
                continue
            lease = Lease(partition, 1, {**owner, "attempt": DRIVER})
            with durable_write("progress"):
                if self.files.create(self._path(partition, 1), self._content(lease, state)):
                    recorded.append(partition)
        return recorded

    def take_over(self, partition: int, owner: Mapping[str, Any], start: Mapping[str, Any]
                  ) -> tuple[Lease, dict[str, Any]]:
        """Hold ``partition`` in a new epoch (the module's three writes): the lease, and the
        progress it starts from, ``start`` if no epoch below has any (an older segack's checkpoint,
        or a driver that did not record one). Either is in the new epoch when this returns: the
        holder starts from a durable record."""
        for _ in range(_TAKE_OVER_TRIES):
            epochs = self._epochs(partition).get(partition, {})
            lease = Lease(partition, max(epochs, default=0) + 1, dict(owner))
            with durable_write("progress"):  # 1
                made = self.files.create(self._path(partition, lease.epoch), self._content(lease, None))
            if not made:
                continue  # another attempt made that epoch: make the next one
            progress = self._below(lease)  # 2
            if progress is None:
                progress = dict(start)
            self.save(lease, progress)  # 3
            self._delete_below(lease)
            return lease, progress
        raise CheckpointError(f"{self.location}: partition {partition} could not be taken over: other "
                              f"attempts kept taking it")

    def _below(self, lease: Lease) -> dict[str, Any] | None:
        """The progress of the highest epoch below ``lease``'s that has some; ``None`` if none has."""
        for _ in range(_TAKE_OVER_TRIES):
            epochs = self._epochs(lease.partition).get(lease.partition, {})
            gone = False
            for epoch in sorted((epoch for epoch in epochs if epoch < lease.epoch), reverse=True):
                content = self._read(epochs[epoch], lease.partition, epoch)
                if content is None:
                    gone = True  # deleted by a taker above it, whose epoch holds what it held: list again
                    break
                progress = self._progress(content)
                if progress is not None:
                    return progress
            if not gone:
                return None
        raise CheckpointError(f"{self.location}: partition {lease.partition}'s files kept changing while "
                              f"it was taken over")

    def save(self, lease: Lease, state: Mapping[str, Any]) -> None:
        """Record ``state`` as the progress of ``lease``'s epoch, atomically. It is the partition's
        progress for as long as no newer epoch exists; a holder that was taken over writes a file
        no reader takes (it learns it from :meth:`superseded`)."""
        with durable_write("progress"):
            self.files.write(self._path(lease.partition, lease.epoch), self._content(lease, state))

    def _delete_below(self, lease: Lease, epochs: Iterable[int] | None = None) -> None:
        """Delete the epochs below ``lease``'s (settled): nobody reads them any more."""
        found = self._epochs(lease.partition).get(lease.partition, {})
        for epoch in sorted(found if epochs is None else epochs):
            if epoch < lease.epoch and epoch in found:
                with durable_write("progress-delete"):
                    self.files.delete(found[epoch])

    def superseded(self, leases: Iterable[Lease]) -> list[int]:
        """The partitions of ``leases`` that a newer epoch holds now, in one listing; epochs below a
        lease that are still there (an older holder wrote again) are deleted."""
        epochs = self._epochs()
        lost = []
        for lease in leases:
            found = epochs.get(lease.partition, {})
            if max(found, default=0) > lease.epoch:
                lost.append(lease.partition)
            elif any(epoch < lease.epoch for epoch in found):
                self._delete_below(lease, [epoch for epoch in found if epoch < lease.epoch])
        return sorted(lost)
