"""A model of a Kafka broker and of librdkafka's consumer, as segack's real-time task and the
driver's group commits use them, for the simulation tests (``tests/test_realtime_simulation.py``):
no broker, no JVM, no threads, every fault a switch.

What it keeps of Kafka's rules (``tests/test_kafka_model.py`` replays traces of them against the
real broker the tests start, with the real client, and compares):

- **A partition is a log** of entries, one per offset: records, the markers that end transactions
  (control records: never delivered, but they take an offset), records of aborted transactions
  (never delivered to ``read_committed`` consumers), and holes that compaction leaves. Its *high
  watermark* is the offset after the last entry; its *last stable offset* is where the oldest open
  transaction starts (a ``read_committed`` consumer reads no further until it ends).
- **The consumer's position** is where it fetches next: it passes every entry it does not deliver
  (markers, aborted records, holes) as it reaches it, so after a transaction's last record the
  position is past its marker. A position below the log's start or above its end is out of range:
  with ``auto.offset.reset=error``, an ``_AUTO_OFFSET_RESET`` error event, and nothing read there.
- **Partition-EOF events** (``enable.partition.eof``) come once each time the position reaches the
  high watermark. librdkafka from 2.2 to 2.13.0 then reports the position one too far, until it
  delivers another record (the fetch itself is right): :attr:`ModelBroker.eof_quirk` turns that on.
- **The consumer knows a partition's end** (``get_watermark_offsets(cached=True)``) as of its last
  fetch from it (the real end); asked, it learns the end anew, and a ``read_committed`` consumer is
  told, as the end, where the oldest open transaction starts.
- **Commits** store a group's offset per partition; a commit can fail before it is applied, or
  after (a request that timed out once the broker had it): :attr:`ModelBroker.commit_faults`; a
  read of what a group holds can find no coordinator yet: :attr:`ModelBroker.read_faults`.
- **A topic deleted and made again** starts its partitions over at offset 0.
"""

from __future__ import annotations

import itertools
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

__all__ = ["Entry", "ModelBroker", "ModelConsumer", "ModelMessage"]


@dataclass
class Entry:
    """One offset of a partition: a record (``kind`` ``"record"``), a transaction's marker
    (``"marker"``), or a record of an aborted or still open transaction (``"pending"`` until it
    ends, then ``"aborted"`` or ``"record"``); ``None`` key and value for a marker."""

    kind: str
    key: bytes | None = None
    value: bytes | None = None
    timestamp: int = 0
    #: The transaction it belongs to, if any.
    transaction: int | None = None


@dataclass
class _Partition:
    entries: dict[int, Entry] = field(default_factory=dict)
    high: int = 0
    start: int = 0

    def stable(self) -> int:
        """The last stable offset: where the oldest transaction still open starts."""
        opened = [offset for offset, entry in self.entries.items() if entry.kind == "pending"]
        return min(opened, default=self.high)


class ModelBroker:
    """The brokers of one cluster: topics of partitions, groups' offsets, and the faults to inject."""

    def __init__(self) -> None:
        self.topics: dict[str, list[_Partition]] = {}
        #: Each topic's id (another once it is made again) and settings.
        self.ids: dict[str, str] = {}
        self.configs: dict[str, dict[str, str]] = {}
        #: The brokers' number, and each topic's copies of a partition.
        self.brokers = 1
        self.replication: dict[str, int] = {}
        self.groups: dict[tuple[str, str, int], int] = {}
        #: Each transactional id's epoch, and the transaction its producer has open (its id, and
        #: the partitions it wrote to).
        self.producers: dict[str, tuple[int, Any]] = {}
        #: What the next transactions' commits do: ``"abortable"`` (not ended: to abort),
        #: ``"retriable"`` (not ended: to ask again), ``"landed"`` (committed, the client told an
        #: error; an abort is refused).
        self.transaction_faults: list[str] = []
        #: The producer starts to fail (each takes its epoch, fencing the earlier ones, and the
        #: client is told it timed out).
        self.init_faults = 0
        #: librdkafka's position one too far after a partition-EOF event (2.2 to 2.13.0).
        self.eof_quirk = False
        #: What the next commits do: ``"fail"`` (not applied), ``"timeout"`` (applied, then an error).
        self.commit_faults: list[str] = []
        self.commits = 0
        #: Reads of a group's offsets that fail next, as a broker just started answers them (its
        #: coordinator still loading the offsets topic: NOT_COORDINATOR, which librdkafka does not call
        #: retriable).
        self.read_faults = 0
        self._transactions = itertools.count(1)
        self._clock = itertools.count(1_700_000_000_000)

    # ------------------------------------------------------------------ topics and records

    def create_topic(self, topic: str, partitions: int, config: dict[str, str] | None = None,
                     replication: int = 1) -> None:
        self.topics[topic] = [_Partition() for _ in range(partitions)]
        self.replication[topic] = replication
        self.ids[topic] = uuid.uuid4().hex
        self.configs[topic] = {"cleanup.policy": "delete", **(config or {})}

    def recreate_topic(self, topic: str) -> None:
        """The topic deleted and made again with as many partitions: every log starts at 0."""
        self.create_topic(topic, len(self.topics[topic]), self.configs[topic], self.replication[topic])

    def delete_topic(self, topic: str) -> None:
        del self.topics[topic], self.ids[topic], self.configs[topic]

    def _append(self, topic: str, partition: int, entry: Entry) -> int:
        log = self.topics[topic][partition]
        offset = log.high
        entry.timestamp = next(self._clock)
        log.entries[offset] = entry
        log.high += 1
        return offset

    def produce(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> int:
        """A record outside any transaction; its offset."""
        return self._append(topic, partition, Entry("record", key, value))

    def begin(self, topic: str, partition: int, records: Iterable[tuple[bytes | None, bytes | None]],
              transaction: int | None = None) -> int:
        """A transaction's records, left open; its id (:meth:`end` ends it)."""
        transaction = next(self._transactions) if transaction is None else transaction
        for key, value in records:
            self._append(topic, partition, Entry("pending", key, value, transaction=transaction))
        return transaction

    def end(self, topic: str, partition: int, transaction: int, commit: bool) -> None:
        """End an open transaction: its records delivered (or never), its marker written."""
        log = self.topics[topic][partition]
        for entry in log.entries.values():
            if entry.transaction == transaction and entry.kind == "pending":
                entry.kind = "record" if commit else "aborted"
        self._append(topic, partition, Entry("marker", transaction=transaction))

    def compact(self, topic: str, partition: int, offset: int) -> bool:
        """Remove the record at ``offset`` if a later record has its key, as compaction does;
        whether it did."""
        log = self.topics[topic][partition]
        entry = log.entries.get(offset)
        if entry is None or entry.kind != "record" or entry.key is None:
            return False
        later = any(other.kind == "record" and other.key == entry.key
                    for at, other in log.entries.items() if at > offset)
        if later:
            del log.entries[offset]
        return later

    def delete_before(self, topic: str, partition: int, offset: int) -> None:
        """Retention: the log starts at ``offset`` now."""
        log = self.topics[topic][partition]
        log.start = max(log.start, min(offset, log.high))
        for at in [at for at in log.entries if at < log.start]:
            del log.entries[at]

    def deliverable(self, topic: str, partition: int) -> dict[int, Entry]:
        """What a ``read_committed`` consumer can ever be given of the partition now: its committed
        records (those of open transactions not yet)."""
        log = self.topics[topic][partition]
        return {offset: entry for offset, entry in log.entries.items() if entry.kind == "record"}

    def ends(self, topic: str, partition: int) -> tuple[int, int]:
        log = self.topics[topic][partition]
        return log.start, log.high

    # ------------------------------------------------------------------ groups

    def commit(self, group: str, offsets: Iterable[TopicPartition]) -> None:
        self.commits += 1
        fault = self.commit_faults.pop(0) if self.commit_faults else None
        if fault == "fail":
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "the model failed a commit"))
        for where in offsets:
            self.groups[(group, where.topic, where.partition)] = where.offset
        if fault == "timeout":
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "the model timed a commit out"))

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        return self.groups.get((group, topic, partition))


class ModelMessage:
    """A record, or an error event, as ``Consumer.consume`` gives them."""

    def __init__(self, topic: str, partition: int, offset: int, entry: Entry | None = None,
                 error: KafkaError | None = None) -> None:
        self._topic, self._partition, self._offset, self._entry, self._error = (
            topic, partition, offset, entry, error)

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None if self._entry is None else self._entry.key

    def value(self) -> bytes | None:
        return None if self._entry is None else self._entry.value

    def timestamp(self) -> tuple[int, int]:
        return (1, 0 if self._entry is None else self._entry.timestamp)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """The model's records have no headers: ``None``, as the client gives for such a record."""
        return None


@dataclass
class _Assigned:
    position: int
    paused: bool = False
    #: The high watermark as of the consumer's last fetch (``-1``: none yet).
    known_high: int = -1
    #: The position at which an EOF event was given last, and whether the quirk shows now.
    eof_at: int | None = None
    quirk: bool = False
    failed: bool = False


class ModelConsumer:
    """A ``confluent_kafka.Consumer`` over a :class:`ModelBroker`, for assigned partitions."""

    def __init__(self, broker: ModelBroker, config: dict[str, Any]) -> None:
        self.broker, self.config = broker, dict(config)
        self.group = str(config.get("group.id"))
        self.eof = str(config.get("enable.partition.eof", False)).lower() == "true"
        self.committed_only = str(config.get("isolation.level", "read_committed")) == "read_committed"
        self.reset = str(config.get("auto.offset.reset", "latest"))
        self.assigned: dict[tuple[str, int], _Assigned] = {}
        self.closed = False

    def _log(self, topic: str, partition: int) -> _Partition:
        return self.broker.topics[topic][partition]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = {(where.topic, where.partition): _Assigned(where.offset) for where in partitions}

    def pause(self, partitions: list[TopicPartition]) -> None:
        for where in partitions:
            self.assigned[(where.topic, where.partition)].paused = True

    def resume(self, partitions: list[TopicPartition]) -> None:
        for where in partitions:
            self.assigned[(where.topic, where.partition)].paused = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[ModelMessage]:
        """What a fetch gives now, up to ``num_messages``: each unpaused partition in turn, from its
        position to its end (or last stable offset); no wait."""
        messages: list[ModelMessage] = []
        for (topic, partition), state in self.assigned.items():
            if state.paused or state.failed or len(messages) >= num_messages:
                continue
            log = self._log(topic, partition)
            state.known_high = log.high
            if not log.start <= state.position <= log.high:
                state.failed = True
                code = (KafkaError._AUTO_OFFSET_RESET if self.reset == "error"
                        else KafkaError.OFFSET_OUT_OF_RANGE)
                messages.append(ModelMessage(topic, partition, state.position, error=KafkaError(
                    code, f"fetch position {state.position} is out of range")))
                continue
            end = log.stable() if self.committed_only else log.high
            while state.position < end and len(messages) < num_messages:
                entry = log.entries.get(state.position)
                at = state.position
                state.position += 1
                passed = entry is None or entry.kind == "marker" or (
                    entry.kind == "aborted" and self.committed_only)
                if passed:
                    continue
                messages.append(ModelMessage(topic, partition, at, entry))
                state.quirk = False
            if self.eof and state.position == log.high and state.eof_at != state.position \
                    and len(messages) < num_messages:
                state.eof_at = state.position
                state.quirk = self.broker.eof_quirk
                messages.append(ModelMessage(topic, partition, state.position, error=KafkaError(
                    KafkaError._PARTITION_EOF, "Broker: No more messages")))
        return messages

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        found = []
        for where in partitions:
            state = self.assigned[(where.topic, where.partition)]
            reported = state.position + (1 if state.quirk else 0)
            found.append(TopicPartition(where.topic, where.partition, reported))
        return found

    def _high(self, log: _Partition) -> int:
        """The end as this consumer is told it when it asks: a ``read_committed`` one, where the
        oldest open transaction starts (a fetch tells it the real end)."""
        return log.stable() if self.committed_only else log.high

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        log = self._log(partition.topic, partition.partition)
        if cached:
            state = self.assigned.get((partition.topic, partition.partition))
            high = -1 if state is None else state.known_high
            return (-1 if high < 0 else log.start, high)
        return log.start, self._high(log)

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None:
        assert offsets is not None and not asynchronous, "segack commits given offsets, synchronously"
        self.broker.commit(self.group, offsets)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None
                  ) -> list[TopicPartition]:
        if self.broker.read_faults:
            self.broker.read_faults -= 1
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "Failed to get committed offsets: "
                                            "Broker: Not coordinator"))
        found = []
        for where in partitions:
            offset = self.broker.committed(self.group, where.topic, where.partition)
            found.append(TopicPartition(where.topic, where.partition, -1001 if offset is None else offset))
        return found

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------- producers and admin


class _Done:
    """A future that is done: its result, or its error."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


class ModelProducer:
    """A transactional ``confluent_kafka.Producer`` over a :class:`ModelBroker` (the only kind the
    sink makes): ``init_transactions`` takes the next epoch of its ``transactional.id``, which
    fences every producer of an earlier epoch (its next transactional call fails, fatally) and
    aborts the transaction it left open."""

    def __init__(self, broker: ModelBroker, config: dict[str, Any]) -> None:
        self.broker, self.id = broker, str(config["transactional.id"])
        self.epoch: int | None = None
        self._open: list[tuple[str, int]] = []
        self._transaction: int | None = None

    def _check(self) -> None:
        if self.epoch is None or self.broker.producers.get(self.id, (0, None))[0] != self.epoch:
            raise KafkaException(KafkaError(KafkaError._FENCED, "the model fenced this producer", fatal=True))

    def init_transactions(self, timeout: float | None = None) -> None:
        epoch, open_transaction = self.broker.producers.get(self.id, (0, None))
        if open_transaction is not None:
            transaction, where = open_transaction
            for topic, partition in where:
                self.broker.end(topic, partition, transaction, commit=False)
        self.epoch = epoch + 1
        self.broker.producers[self.id] = (self.epoch, None)
        if self.broker.init_faults:
            self.broker.init_faults -= 1
            self.epoch = None  # the client never learnt its epoch
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the model's coordinator did not answer"))

    def begin_transaction(self) -> None:
        self._check()
        self._transaction, self._open = next(self.broker._transactions), []

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                headers: Any = None, timestamp: int = 0) -> None:
        self._check()
        assert self._transaction is not None, "the sink produces inside a transaction"
        count = len(self.broker.topics[topic])
        if partition < 0:
            partition = zlib.crc32(key if isinstance(key, bytes) else str(key).encode()) % count
        encoded = [part.encode() if isinstance(part, str) else part for part in (key, value)]
        self.broker.begin(topic, partition, [(encoded[0], encoded[1])], transaction=self._transaction)
        if (topic, partition) not in self._open:
            self._open.append((topic, partition))
        self.broker.producers[self.id] = (self.broker.producers[self.id][0], (self._transaction, self._open))

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._check()
        fault = self.broker.transaction_faults.pop(0) if self.broker.transaction_faults else None
        if fault == "abortable":
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the model failed a commit",
                                            txn_requires_abort=True))
        if fault == "retriable":  # not ended: asked again, it commits
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the model timed a commit out",
                                            retriable=True))
        self._end(commit=True)
        if fault == "landed":  # committed, the answer lost until the client gave up
            self._landed = True
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            "the model's commit landed, its answer lost"))

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._check()
        if getattr(self, "_landed", False):  # librdkafka refuses an abort while a commit is pending
            raise KafkaException(KafkaError(KafkaError._CONFLICT, "the model's commit is still pending"))
        self._end(commit=False)

    def _end(self, commit: bool) -> None:
        if self._transaction is not None:
            for topic, partition in self._open:
                self.broker.end(topic, partition, self._transaction, commit)
        self._transaction, self._open = None, []
        self.broker.producers[self.id] = (self.broker.producers[self.id][0], None)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def close(self) -> None:
        """Nothing to let go of."""


class _PartitionMetadata:
    def __init__(self, replicas: int) -> None:
        self.replicas = list(range(1, replicas + 1))


class _Topic:
    def __init__(self, partitions: int, replicas: int = 1) -> None:
        self.partitions = {number: _PartitionMetadata(replicas) for number in range(partitions)}
        self.error = None


class _Metadata:
    def __init__(self, topics: dict[str, _Topic], brokers: int = 1) -> None:
        self.topics = topics
        self.brokers = {number: None for number in range(1, brokers + 1)}


class _Described:
    def __init__(self, topic_id: str) -> None:
        self.topic_id = topic_id


class _ConfigEntry:
    def __init__(self, value: str) -> None:
        self.value = value


class ModelAdmin:
    """A ``confluent_kafka.admin.AdminClient`` over a :class:`ModelBroker`, for what the sink asks."""

    def __init__(self, broker: ModelBroker, config: dict[str, Any]) -> None:
        self.broker = broker

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        return _Metadata({name: _Topic(len(partitions), self.broker.replication[name])
                          for name, partitions in self.broker.topics.items()}, self.broker.brokers)

    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, _Done]:
        made = {}
        for topic in topics:
            if topic.topic in self.broker.topics:
                error = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "TOPIC_ALREADY_EXISTS"))
                made[topic.topic] = _Done(error=error)
                continue
            if topic.replication_factor > self.broker.brokers:
                error = KafkaException(KafkaError(KafkaError.INVALID_REPLICATION_FACTOR,
                                                  "INVALID_REPLICATION_FACTOR"))
                made[topic.topic] = _Done(error=error)
                continue
            self.broker.create_topic(topic.topic, topic.num_partitions, dict(topic.config or {}),
                                     topic.replication_factor)
            made[topic.topic] = _Done()
        return made

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, _Done]:
        found = {}
        for resource in resources:
            settings = self.broker.configs.get(resource.name, {})
            found[resource] = _Done({name: _ConfigEntry(value) for name, value in settings.items()})
        return found

    def describe_topics(self, topics: Any, request_timeout: float = 10, **_: Any) -> dict[str, _Done]:
        return {name: _Done(_Described(self.broker.ids[name])) for name in topics.topic_names}


class ModelClients:
    """The clients a :class:`~segack.sinks.KafkaSink` makes, over a :class:`ModelBroker`."""

    def __init__(self, broker: ModelBroker) -> None:
        self.broker = broker

    def producer(self, config: dict[str, Any]) -> ModelProducer:
        return ModelProducer(self.broker, config)

    def consumer(self, config: dict[str, Any]) -> ModelConsumer:
        return ModelConsumer(self.broker, config)

    def admin(self, config: dict[str, Any]) -> ModelAdmin:
        return ModelAdmin(self.broker, config)
