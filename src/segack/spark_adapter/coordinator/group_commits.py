"""A real-time stream's consumer group, committed by the driver from what the checkpoint holds.

The tasks save each partition's progress (:mod:`~segack.spark_adapter.store.partitions`); the
driver, every ``commit_interval``, reads it and commits each partition's ``next`` whose epoch is
settled. A partition's saved progress never goes backwards (an epoch takes over what the one below
it holds, and nothing an older holder writes later counts), so an offset committed from it is at
most every later one: the group is never ahead of the checkpoint, even when a task or a driver that
was paused anywhere wakes and commits what it read long ago. A commit that fails is tried again at
the next look, whether the partition moved or not, and at a stop until it succeeds
(:data:`STOP_SECONDS`); the next run starts by committing what its checkpoint holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from segack.spark_adapter.errors import CheckpointError, one_line
from segack.spark_adapter.sources.kafka_settings import ClientLog
from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.partitions import PartitionView

__all__ = ["STOP_SECONDS", "GroupCommits"]

log = logging.getLogger(__name__)

#: How long a stopping stream tries to commit what its checkpoint holds before it gives up (saying
#: so: the next run commits it).
STOP_SECONDS = 30.0
#: Seconds a commit, or the read of what the group holds, may take.
_REQUEST_SECONDS = 10.0
#: The errors of a read of what the group holds that pass: its coordinator not known, moving or still
#: loading the group's offsets (a broker just started, or its leader changed), which librdkafka does not
#: call retriable.
_COORDINATOR_PASSING = ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
                        "_TIMED_OUT", "_TRANSPORT", "_WAIT_COORD")


class GroupCommits:
    """Group ``group``'s offsets of the partitions ``pairs`` numbers (``(topic, partition)`` by
    number, as :class:`~segack.spark_adapter.coordinator.stream_partitions.StreamPartitions` numbers
    a stream's), through a consumer of the driver's own, made by ``consumer`` from its settings
    (``confluent_kafka.Consumer`` unless given). Every method takes and gives partitions by number;
    ``pairs`` may be given more partitions (numbered after the others) while the stream runs."""

    def __init__(self, settings: Mapping[str, Any], group: str, pairs: Sequence[tuple[str, int]],
                 consumer: Callable[[dict[str, Any]], Any] | None = None) -> None:
        from confluent_kafka import Consumer

        self.group, self.pairs = group, pairs
        self._consumer = (consumer or Consumer)({**settings, "group.id": group, "enable.auto.commit": False,
                                                 "enable.partition.eof": False,
                                                 "logger": ClientLog(f"{__name__}.client")})
        #: What the group holds, as last read or committed, by partition number.
        self.committed: dict[int, int] = {}
        self._failing = False

    def read(self, partitions: list[int], sleep: Callable[[float], Any] = time.sleep) -> dict[int, int]:
        """What the group holds now of ``partitions`` (those it has an offset for), kept in
        :attr:`committed` beside what it holds of the others. Asked again while the group's
        coordinator is not ready (not known, moving, or loading the group's offsets), for up to 10
        seconds."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        passing = {getattr(KafkaError, name) for name in _COORDINATOR_PASSING}
        wanted = [TopicPartition(*self.pairs[partition]) for partition in partitions]
        numbers = {self.pairs[partition]: partition for partition in partitions}
        deadline = time.monotonic() + _REQUEST_SECONDS
        while True:
            try:
                found = self._consumer.committed(wanted, timeout=max(1.0, deadline - time.monotonic()))
                break
            except KafkaException as error:
                reason = error.args[0] if error.args else None
                if not isinstance(reason, KafkaError) or time.monotonic() >= deadline or not (
                        reason.retriable() or reason.code() in passing):
                    raise
                log.info("group %s's coordinator is not ready (asked again): %s", self.group, one_line(error))
                sleep(0.2)
        held = {numbers[(where.topic, where.partition)]: where.offset for where in found if where.offset >= 0}
        for partition in partitions:
            self.committed.pop(partition, None)
        self.committed.update(held)
        return held

    def behind(self, views: Mapping[int, PartitionView]) -> dict[int, int]:
        """The partitions whose settled ``next`` the group does not hold, and that ``next``."""
        return {partition: int(view.state["next"]) for partition, view in views.items()
                if view.settled and view.state is not None
                and self.committed.get(partition) != int(view.state["next"])}

    def lags(self, views: Mapping[int, PartitionView]) -> bool:
        """Whether the group lacks some partition's progress: a settled one it does not hold, or
        one whose newest holder has not settled it (a takeover cut short: the next run commits it)."""
        return bool(self.behind(views)) or any(not view.settled for view in views.values())

    def commit(self, views: Mapping[int, PartitionView]) -> bool:
        """Commit each settled partition's ``next`` that the group does not hold; whether the group
        holds them all now. A failure is said once while it lasts, and the commit is made again at
        the next call."""
        from confluent_kafka import TopicPartition

        wanted = self.behind(views)
        if not wanted:
            return True
        try:
            with durable_write("group-commit"):
                self._consumer.commit(offsets=[TopicPartition(*self.pairs[partition], offset)
                                               for partition, offset in sorted(wanted.items())],
                                      asynchronous=False)
        except Exception as error:
            if not self._failing:
                log.warning("could not commit the offsets of %s to group %s (it is tried again): %s",
                            self._topics(), self.group, one_line(error))
            self._failing = True
            return False
        if self._failing:
            log.info("committed the offsets of %s to group %s again", self._topics(), self.group)
        self._failing = False
        self.committed.update(wanted)
        return True

    def commit_until(self, views: Callable[[], Mapping[int, PartitionView]], seconds: float = STOP_SECONDS,
                     sleep: Callable[[float], Any] = time.sleep) -> bool:
        """Commit what ``views()`` says until the group holds it or ``seconds`` pass (a stop);
        whether it does (``False`` at once for a partition no holder has settled: nobody will)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                current = views()
                if self.commit(current):
                    return not self.lags(current)
            except (OSError, CheckpointError) as error:  # the store out of reach for a moment
                log.warning("could not read the partitions' progress to commit it: %s", error)
            if time.monotonic() >= deadline:
                log.warning("gave up committing the offsets of %s to group %s after %g s: the next run "
                            "commits what the checkpoint holds", self._topics(), self.group, seconds)
                return False
            sleep(1.0)

    def _topics(self) -> str:
        return ", ".join(dict.fromkeys(topic for topic, _ in self.pairs))

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as error:
            log.warning("could not close the consumer of group %s: %s", self.group, one_line(error))
