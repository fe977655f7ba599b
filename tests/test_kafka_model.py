"""The model of Kafka that the simulation runs against (``tests/kafka_model.py``), kept true: the same
traces of records, transactions, reads, positions and commits run against the real broker the tests
start (with the real client, ``confluent-kafka``) and against the model, and what each shows must
be the same, event for event."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError

from tests.kafka_model import ModelBroker, ModelConsumer, ModelProducer

pytestmark = [pytest.mark.kafka]
_LOOK_SECONDS = 0.2


class _Real:
    """The broker the tests start, through the real client."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = f"model-trace-{uuid.uuid4().hex[:8]}"
        self._open: dict[int, Any] = {}

    def topic(self, name: str, partitions: int = 1) -> str:
        from tests.test_kafka import make_topic

        make_topic(self.bootstrap, f"{self.prefix}-{name}", partitions)
        return f"{self.prefix}-{name}"

    def produce(self, topic: str, partition: int, count: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for index in range(count):
            producer.produce(topic, key=b"k", value=str(index).encode(), partition=partition)
        assert producer.flush(30) == 0

    def begin(self, topic: str, partition: int, count: int) -> int:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": uuid.uuid4().hex})
        producer.init_transactions(30)
        producer.begin_transaction()
        for index in range(count):
            producer.produce(topic, key=b"k", value=str(index).encode(), partition=partition)
        assert producer.flush(30) == 0
        self._open[id(producer)] = producer
        return id(producer)

    def end(self, topic: str, partition: int, transaction: int, commit: bool) -> None:
        producer = self._open.pop(transaction)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    def recreate(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
        admin.delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + 60
        while True:
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
                break
            except Exception as error:  # the deletion is still under way
                assert time.monotonic() < deadline, error
                time.sleep(0.5)
        while not admin.list_topics(topic, timeout=10).topics[topic].partitions:
            time.sleep(0.2)

    def consumer(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import Consumer

        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.prefix}-reader", **config})

    def producer(self, transactional_id: str) -> Any:
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap,
                         "transactional.id": f"{self.prefix}-{transactional_id}"})

    #: Empty looks in a row (of :data:`_LOOK_SECONDS` each) after which a real consumer has nothing
    #: more for now.
    idle_looks = 5


class _Model:
    """The model, given the same trace."""

    def __init__(self) -> None:
        self.broker = ModelBroker()

    def topic(self, name: str, partitions: int = 1) -> str:
        self.broker.create_topic(name, partitions)
        return name

    def produce(self, topic: str, partition: int, count: int) -> None:
        for index in range(count):
            self.broker.produce(topic, partition, b"k", str(index).encode())

    def begin(self, topic: str, partition: int, count: int) -> int:
        return self.broker.begin(topic, partition, [(b"k", str(index).encode()) for index in range(count)])

    def end(self, topic: str, partition: int, transaction: int, commit: bool) -> None:
        self.broker.end(topic, partition, transaction, commit)

    def recreate(self, topic: str) -> None:
        self.broker.recreate_topic(topic)

    def consumer(self, config: dict[str, Any]) -> ModelConsumer:
        return ModelConsumer(self.broker, {"group.id": "reader", **config})

    def producer(self, transactional_id: str) -> ModelProducer:
        return ModelProducer(self.broker, {"transactional.id": transactional_id})

    idle_looks = 1


def _read(cluster: Any, consumer: Any, topic: str) -> list[Any]:
    """What ``consumer`` gives until it has nothing more for now, then its position and the ends it
    knows (cached) and asks."""
    from confluent_kafka import KafkaError, TopicPartition

    seen: list[Any] = []
    empty = 0
    while empty < cluster.idle_looks:
        messages = consumer.consume(500, _LOOK_SECONDS)
        empty = 0 if messages else empty + 1
        for message in messages:
            error = message.error()
            if error is None:
                seen.append(("record", message.offset()))
            else:  # an EOF event says where the end is; other errors say nothing of an offset
                eof = error.code() == KafkaError._PARTITION_EOF
                seen.append(("error", error.code(), message.offset() if eof else None))
    where = TopicPartition(topic, 0)
    seen.append(("position", consumer.position([where])[0].offset))
    seen.append(("ends known", consumer.get_watermark_offsets(where, cached=True)))
    seen.append(("ends", consumer.get_watermark_offsets(where, timeout=10)))
    return seen


def _records_and_eof_events(cluster: Any) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = cluster.topic("eof")
    cluster.produce(topic, 0, 5)
    consumer = cluster.consumer({"enable.partition.eof": True, "enable.auto.commit": False,
                                 "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = _read(cluster, consumer, topic)
    cluster.produce(topic, 0, 1)
    seen += _read(cluster, consumer, topic)
    consumer.close()
    return seen


def _transactions_markers_and_aborts(cluster: Any) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = cluster.topic("transactions")
    cluster.end(topic, 0, cluster.begin(topic, 0, 3), True)  # 0-2, marker 3
    cluster.end(topic, 0, cluster.begin(topic, 0, 2), False)  # 4-5 aborted, marker 6
    cluster.produce(topic, 0, 1)  # 7
    seen = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = cluster.consumer({"isolation.level": isolation, "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen += [isolation, *_read(cluster, consumer, topic)]
        consumer.close()
    return seen


def _a_transaction_left_open(cluster: Any) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = cluster.topic("open")
    cluster.produce(topic, 0, 2)  # 0-1
    transaction = cluster.begin(topic, 0, 2)  # 2-3, open
    cluster.produce(topic, 0, 1)  # 4, above the open transaction
    consumer = cluster.consumer({"enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = _read(cluster, consumer, topic)  # stops where the open transaction starts
    cluster.end(topic, 0, transaction, True)  # its marker: 5
    seen += _read(cluster, consumer, topic)
    consumer.close()
    return seen


def _out_of_range_and_a_topic_made_again(cluster: Any) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = cluster.topic("remade")
    cluster.produce(topic, 0, 4)
    config = {"enable.auto.commit": False, "auto.offset.reset": "error"}
    consumer = cluster.consumer(config)
    consumer.assign([TopicPartition(topic, 0, 9)])  # past the end
    seen = [event for event in _read(cluster, consumer, topic) if event[0] == "error"]
    consumer.close()
    cluster.recreate(topic)
    cluster.produce(topic, 0, 1)
    consumer = cluster.consumer(config)
    consumer.assign([TopicPartition(topic, 0, 4)])  # where a reader of the old topic had got to
    seen += [event for event in _read(cluster, consumer, topic) if event[0] == "error"]
    consumer.close()
    return seen


def _commits(cluster: Any) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = cluster.topic("commits", 2)
    consumer = cluster.consumer({"enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    both = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    before = [where.offset for where in consumer.committed(both, timeout=10)]
    consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    consumer.commit(offsets=[TopicPartition(topic, 1, 0), TopicPartition(topic, 0, 1)], asynchronous=False)
    after = [where.offset for where in consumer.committed(both, timeout=10)]
    consumer.close()
    return [before, after]


def _a_producer_fenced_by_a_newer_one(cluster: Any) -> list[Any]:
    """Two producers of one transactional id: the newer one's start aborts what the older one left
    open, and the older one fails at its next step, fatally; what the newer one commits is read."""
    from confluent_kafka import KafkaException, TopicPartition

    topic = cluster.topic("fenced")
    older = cluster.producer("task-0")
    older.init_transactions(30)
    older.begin_transaction()
    older.produce(topic, value=b"older", key=b"k", partition=0)
    older.flush(30)
    newer = cluster.producer("task-0")
    newer.init_transactions(30)
    seen: list[Any] = []
    for step in (older.commit_transaction, older.begin_transaction):
        try:
            step()
            seen.append("went through")
        except KafkaException as error:
            seen.append(("failed", error.args[0].code() == KafkaError._FENCED, error.args[0].fatal()))
    newer.begin_transaction()
    newer.produce(topic, value=b"newer", key=b"k", partition=0)
    newer.commit_transaction(30)
    consumer = cluster.consumer({"enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen += _read(cluster, consumer, topic)
    consumer.close()
    return seen


TRACES: list[Callable[[Any], list[Any]]] = [
    _records_and_eof_events, _transactions_markers_and_aborts, _a_transaction_left_open,
    _out_of_range_and_a_topic_made_again, _commits, _a_producer_fenced_by_a_newer_one]


@pytest.mark.parametrize("trace", TRACES, ids=[trace.__name__.strip("_") for trace in TRACES])
def test_the_model_shows_what_the_real_broker_shows(kafka_broker, trace):
    real = trace(_Real(kafka_broker.bootstrap))
    assert trace(_Model()) == real
