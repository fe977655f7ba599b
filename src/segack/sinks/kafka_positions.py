"""Each key's last applied position, as a :class:`~segack.sinks.KafkaSink` keeps it: a compacted
topic, and in each process the partitions of it that its tasks read.

The topic holds one record per transaction and key: ``CHECKPOINT_ID/KEY_GROUP/KEY`` as the
record's key (the key's text, :func:`~segack.sinks.key_text.key_text`), the position as its value
(ASCII digits), in partition ``key_group % partitions``. The key group is in the record's key
because a position counts within its key group: a real-time stream's key group is the input's
partition, and a key written to two partitions has a position in each. Compaction keeps the newest
record of each, so the topic's size follows the number of keys, never the number of events.

A task reads only the partitions its key groups map to, once (:meth:`PositionsPartition.catch_up`),
and then keeps them in memory, adding what it commits: within a run, a key is handled by one task
at a time, so nobody else moves its position. A process keeps what its tasks read: the next task
that needs the same partition reads only what was committed to it since.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from segack.sinks.key_text import key_text
from segack.spark_adapter.errors import SinkError, one_line
from segack.spark_adapter.handlers import EventIdentity

__all__ = ["CACHED_KEYS", "READ_SECONDS", "PositionsPartition", "position_key", "positions_partition"]

log = logging.getLogger(__name__)

#: How long a task waits to read a partition of positions up to its end: a transaction that a
#: producer left open holds a ``read_committed`` reader back until it ends or times out.
READ_SECONDS = 120.0
#: Records asked of the consumer at a time while a partition is read.
_READ_BATCH = 10_000
#: The keys a process keeps positions of, beyond those of the partition just asked for: at about
#: 130 bytes a key, 260 MB.
CACHED_KEYS = 2_000_000
#: The errors a broker that is starting again gives for a while (its partitions not yet led, led
#: by another broker than its clients last heard, or not yet in the metadata a new client gets):
#: the ends are asked again until :data:`READ_SECONDS` have passed, as for any error librdkafka
#: calls retriable. librdkafka does not call a watermark request's NOT_LEADER_FOR_PARTITION
#: retriable.
_PASSING = ("_UNKNOWN_PARTITION", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "LEADER_NOT_AVAILABLE",
            "NOT_LEADER_FOR_PARTITION", "REPLICA_NOT_AVAILABLE", "FENCED_LEADER_EPOCH",
            "UNKNOWN_LEADER_EPOCH")


def position_key(identity: EventIdentity) -> str:
    """What follows the checkpoint's prefix in the key of ``identity``'s position record:
    ``KEY_GROUP/KEY``."""
    return f"{identity.key_group}/{key_text(identity.key)}"


def _passes(error: Any) -> bool:
    """Whether a ``KafkaError`` is one to wait out (:data:`_PASSING`, or retriable)."""
    from confluent_kafka import KafkaError

    return bool(error.retriable()) or error.code() in {getattr(KafkaError, name) for name in _PASSING}


class PositionsPartition:
    """One partition of the positions topic as this process read it: :attr:`positions` holds the
    position of each key whose record starts with :attr:`prefix` (the checkpoint's), as of the records
    below :attr:`next_offset`, and what tasks here committed since. Hold :attr:`lock` to read it
    further or to add to it."""

    def __init__(self, topic: str, partition: int, prefix: str) -> None:
        self.topic, self.partition, self.prefix = topic, partition, prefix
        self.positions: dict[str, int] = {}
        self.next_offset = 0
        self.lock = threading.Lock()

    def catch_up(self, consumer_config: Mapping[str, Any]) -> int:
        """Read what transactions committed to the partition since :attr:`next_offset`, up to its
        end as it is now; returns the records read. Raises
        :class:`~segack.spark_adapter.SinkError` if records it has not read were deleted (the
        positions they held are lost), or if it cannot learn the end (the partition not listed: a
        broker starting again, or the topic gone) or reach it in :data:`READ_SECONDS` each."""
        from confluent_kafka import Consumer, TopicPartition

        where = f"partition {self.partition} of positions topic {self.topic}"
        low, high = self._ends(consumer_config, where)
        if high < self.next_offset:
            raise SinkError(f"KafkaSink: {where} ends at offset {high}, but this process read it up to "
                            f"{self.next_offset}: the topic was deleted and made again, and the "
                            f"positions it held are lost")
        if self.next_offset < low:
            raise SinkError(f"KafkaSink: the records of {where} from offset {self.next_offset} to {low} "
                            f"were deleted, and the positions they held with them; the topic must be "
                            f"compacted, never cleaned by time or size")
        if self.next_offset >= high:
            return 0
        consumer = Consumer({**consumer_config, "group.id": f"segack-{self.topic}",
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(self.topic, self.partition, self.next_offset)])
            return self._read_to(consumer, high, where)
        finally:
            consumer.close()

    def _ends(self, consumer_config: Mapping[str, Any], where: str) -> tuple[int, int]:
        """The partition's first offset and the offset after its last record, committed or not.

        Asked of a ``read_uncommitted`` client: a ``read_committed`` one is told where the oldest
        transaction still open starts, and a reader that stopped there would miss what was committed
        above it (by another task, or by a transaction whose commit returned before its markers
        were written). Asked again, by a new client (a client keeps the metadata it got for
        minutes), while the errors pass (:data:`_PASSING`), for up to :data:`READ_SECONDS`."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        config = {**consumer_config, "group.id": f"segack-{self.topic}",
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False}
        deadline, waited = time.monotonic() + READ_SECONDS, False
        while True:
            consumer = Consumer(config)
            try:
                ends: tuple[int, int] = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, self.partition), timeout=max(1.0, deadline - time.monotonic()))
                return ends
            except KafkaException as error:
                if not (error.args and _passes(error.args[0])) or time.monotonic() >= deadline:
                    raise SinkError(f"KafkaSink cannot read {where}: {one_line(error)}") from None
                if not waited:
                    log.warning("KafkaSink waits to read %s: %s", where, one_line(error))
                waited = True
            finally:
                consumer.close()
            time.sleep(1.0)

    def _read_to(self, consumer: Any, end: int, where: str) -> int:
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + READ_SECONDS
        positions, prefix, read = self.positions, self.prefix.encode("utf-8"), 0
        while True:
            for message in consumer.consume(_READ_BATCH, 0.05):
                if message.error() is not None:
                    if not _passes(message.error()):
                        raise SinkError(f"KafkaSink cannot read {where}: {message.error().str()}")
                    log.warning("KafkaSink waits to read %s: %s", where, message.error().str())
                    continue
                value, raw = message.value(), message.key()
                if value is None or raw is None or not raw.startswith(prefix):
                    continue  # another checkpoint's, sharing the topic (or another writer's)
                try:
                    key, position = raw[len(prefix):].decode("utf-8"), int(value)
                except ValueError:  # UnicodeDecodeError is one
                    raise SinkError(f"KafkaSink: the record at offset {message.offset()} of {where} is no "
                                    f"position of this checkpoint's (its key is not UTF-8, or its value "
                                    f"not a number): give the sink a positions_topic no other writer "
                                    f"uses") from None
                if position > positions.get(key, -1):
                    positions[key] = position
                read += 1
            # A read_committed consumer's position passes the markers that end transactions too,
            # and stops where a transaction still open starts, until it ends.
            reached = consumer.position([TopicPartition(self.topic, self.partition)])[0].offset
            if reached >= end:
                self.next_offset = reached
                return read
            if time.monotonic() > deadline:
                raise SinkError(f"KafkaSink could not read {where} up to offset {end} in "
                                f"{READ_SECONDS:.0f} s (it reached {reached}): a transaction that no run "
                                f"fenced holds it back")

    def record(self, positions: Mapping[str, int]) -> None:
        """Add the positions a task here committed."""
        with self.lock:
            known = self.positions
            for key, position in positions.items():
                if position > known.get(key, -1):
                    known[key] = position


#: What this process read, by ``(servers, topic, partition, prefix)``, least recently used first.
_read: collections.OrderedDict[tuple[str, str, int, str], PositionsPartition] = collections.OrderedDict()
_read_lock = threading.Lock()


def positions_partition(servers: str, topic: str, partition: int, prefix: str) -> PositionsPartition:
    """This process's copy of ``partition`` of ``topic`` on the cluster at ``servers``, for the
    checkpoint whose keys start with ``prefix``. The copies of the partitions used least recently go
    once the others hold more than :data:`CACHED_KEYS` keys (a task that holds one keeps it; the
    next task that needs it reads it again)."""
    with _read_lock:
        found = _read.pop((servers, topic, partition, prefix), None)
        if found is None:
            found = PositionsPartition(topic, partition, prefix)
        _read[(servers, topic, partition, prefix)] = found
        held = sum(len(other.positions) for other in _read.values())
        while held > CACHED_KEYS and len(_read) > 1:
            _, dropped = _read.popitem(last=False)
            held -= len(dropped.positions)
        return found
