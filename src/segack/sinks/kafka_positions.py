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

A real-time stream's tasks never end, and keys such as order ids are never seen again: there a
key's position is dropped once every event of its key group below it is done for good
(:meth:`~segack.sinks.KafkaSink.done_below`), and a tombstone (a record with no value) for it goes
with the task's next transaction, so that compaction removes it from the topic too. A task then
holds the keys of the events it has read and not yet saved, not every key it ever saw.

The driver keeps each run to the topic the checkpoint's first run recorded (:func:`recorded_topic`,
:func:`keep_to_recorded`): its name, its partition count and its topic id. The positions are the
only record of what was applied, so a topic gone, or deleted and made again (empty, with another
id), is refused: a resume would apply again every event it hands over.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

from segack.sinks.kafka_output import KafkaClients
from segack.sinks.key_text import key_text
from segack.spark_adapter.errors import SinkError, one_line
from segack.spark_adapter.handlers import EventIdentity
from segack.spark_adapter.store.kafka_sink_files import positions_topic, record_positions_topic
from segack.spark_adapter.store.storage import Files

__all__ = ["CACHED_KEYS", "READ_SECONDS", "PositionsPartition", "described_topic_id", "keep_to_recorded",
           "position_key", "positions_partition", "recorded_topic"]

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

#: The topic id of brokers that give none (before Kafka 2.8, KIP-516).
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
#: What a positions topic lost costs, as its refusals say.
_LOST = ("the positions this checkpoint's runs recorded are lost, and a resume would apply their events "
         "again (a read_committed consumer would see their output twice)")
#: How a user who restored the positions topic lets the checkpoint's runs take it.
_TAKE_RESTORED = "delete \"topic_id\" from the checkpoint's kafka-positions.json"


def recorded_topic(files: Files, name: str, found: Any) -> dict[str, Any] | None:
    """The positions topic the checkpoint records (``None``: none yet), ``found`` the metadata of
    topic ``name`` (``None``: missing). Refused if the checkpoint records another topic (the
    positions recorded would not be found) or if the topic is gone (they are lost; one made again
    would be empty): only a checkpoint that records none may make one."""
    recorded = positions_topic(files)
    if recorded is None:
        return None
    if recorded["topic"] != name:
        raise SinkError(f"KafkaSink: this checkpoint's positions are in topic {recorded['topic']}, "
                        f"not in {name}: the positions recorded would not be found, and events would "
                        f"be applied again")
    if found is None:
        raise SinkError(f"KafkaSink: this checkpoint's positions topic {name} does not exist: {_LOST}; "
                        f"restore it with its records (from a backup or a mirror, then {_TAKE_RESTORED}), "
                        f"or start a new checkpoint")
    return recorded


def described_topic_id(admin: Any, name: str, seconds: float) -> str | None:
    """The topic id of topic ``name`` (KIP-516) as an ``AdminClient`` describes it in ``seconds``;
    ``None`` from brokers that give none."""
    from confluent_kafka import TopicCollection

    try:
        described = admin.describe_topics(TopicCollection([name]), request_timeout=seconds)[name].result()
    except Exception as error:
        raise SinkError(f"KafkaSink cannot describe its positions topic {name}: {one_line(error)}") from None
    found = None if described.topic_id is None else str(described.topic_id)
    return None if found == _NO_TOPIC_ID else found


def keep_to_recorded(files: Files, recorded: dict[str, Any] | None, name: str, partitions: int,
                     topic_id: str | None) -> int:
    """The partition count that places the run's positions: the one the checkpoint's first run
    recorded (a key's position is in partition ``key_group % count``: partitions added since stay
    unused), or ``partitions``, recorded now with the topic's id. A record without an id (an older
    release's) gets it now; a topic of another id was deleted and made again since, and is refused:
    the positions recorded are lost."""
    if recorded is None:
        record_positions_topic(files, name, partitions, topic_id)
        return partitions
    count: int = recorded["partitions"]
    known = recorded.get("topic_id")
    if known is None and topic_id is not None:
        record_positions_topic(files, name, count, topic_id)
    elif known is not None and topic_id != known:
        raise SinkError(f"KafkaSink: positions topic {name} was deleted and made again (topic id {topic_id}, "
                        f"not {known}): {_LOST}; if it holds this checkpoint's positions again (restored "
                        f"from a backup or a mirror), {_TAKE_RESTORED}; else start a new checkpoint")
    return count


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

    def catch_up(self, consumer_config: Mapping[str, Any], clients: KafkaClients | None = None) -> int:
        """Read what transactions committed to the partition since :attr:`next_offset`, up to its
        end as it is now; returns the records read. Raises
        :class:`~segack.spark_adapter.SinkError` if records it has not read were deleted (the
        positions they held are lost), or if it cannot learn the end (the partition not listed: a
        broker starting again, or the topic gone) or reach it in :data:`READ_SECONDS` each.
        ``clients`` makes the consumers (confluent-kafka's unless given)."""
        from confluent_kafka import TopicPartition

        clients = clients or KafkaClients()
        where = f"partition {self.partition} of positions topic {self.topic}"
        low, high = self._ends(consumer_config, where, clients)
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
        consumer = clients.consumer({**consumer_config, "group.id": f"segack-{self.topic}",
                                     "isolation.level": "read_committed", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(self.topic, self.partition, self.next_offset)])
            return self._read_to(consumer, high, where)
        finally:
            consumer.close()

    def _ends(self, consumer_config: Mapping[str, Any], where: str, clients: KafkaClients) -> tuple[int, int]:
        """The partition's first offset and the offset after its last record, committed or not.

        Asked of a ``read_uncommitted`` client: a ``read_committed`` one is told where the oldest
        transaction still open starts, and a reader that stopped there would miss what was committed
        above it (by another task, or by a transaction whose commit returned before its markers
        were written). Asked again, by a new client (a client keeps the metadata it got for
        minutes), while the errors pass (:data:`_PASSING`), for up to :data:`READ_SECONDS`."""
        from confluent_kafka import KafkaException, TopicPartition

        config = {**consumer_config, "group.id": f"segack-{self.topic}",
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False}
        deadline, waited = time.monotonic() + READ_SECONDS, False
        while True:
            consumer = clients.consumer(config)
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
                if raw is None or not raw.startswith(prefix):
                    continue  # another checkpoint's, sharing the topic (or another writer's)
                try:
                    key = raw[len(prefix):].decode("utf-8")
                    if value is None:  # a tombstone: the key's position can skip nothing any more
                        positions.pop(key, None)
                        read += 1
                        continue
                    position = int(value)
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

    def forget_below(self, key_group: int, position: int, kept: Collection[str] = frozenset()) -> list[str]:
        """Drop the positions of ``key_group``'s keys last applied below ``position`` but those
        ``kept``, once every event of it below ``position`` is done for good but the dead letters
        of the keys ``kept`` (no run hands the others again, so their positions can make no event
        be skipped); the keys dropped (:func:`position_key`'s, as ``kept`` names them)."""
        prefix = f"{key_group}/"
        with self.lock:
            dropped = [key for key, at in self.positions.items()
                       if at < position and key.startswith(prefix) and key not in kept]
            for key in dropped:
                del self.positions[key]
        return dropped


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
