"""What a :class:`~segack.sinks.KafkaSink`'s ``apply`` writes to (:class:`KafkaOutput`), and the
Kafka clients the sink makes (:class:`KafkaClients`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from segack.errors import SegackTypeError, SegackValueError

if TYPE_CHECKING:
    from segack.sinks.registry_values import RegistryValues

__all__ = ["KafkaClients", "KafkaOutput"]

_PAYLOAD_TYPES = (str, bytes, type(None))


class KafkaOutput:
    """What a :class:`~segack.sinks.KafkaSink`'s ``apply`` writes its records to, as it would to a
    ``confluent_kafka.Producer``: the records go to Kafka after ``apply`` returns, in the call's
    transaction, with the positions of the call's keys."""

    __slots__ = ("_topics", "_values", "records")

    def __init__(self, topics: frozenset[str], values: RegistryValues | None = None) -> None:
        self._topics = topics
        self._values = values
        #: ``(topic, value, key, partition, headers, timestamp)`` of each record, in order.
        self.records: list[tuple[str, Any, Any, int, Any, int]] = []

    def produce(self, topic: str, value: Any = None, key: str | bytes | None = None,
                partition: int = -1, *, headers: Any = None, timestamp: int = 0) -> None:
        """Add a record to the call's transaction.

        Parameters
        ----------
        topic : str
            One of the sink's ``topics``.
        value, key : str, bytes or None
            As ``confluent_kafka.Producer.produce`` takes them (a str is sent as UTF-8). With the
            sink's ``values`` (:class:`~segack.sinks.registry_values.RegistryValues`), a value may
            also be a dict or a Protobuf message, sent in Confluent's wire format.
        partition : int, default ``-1``
            The partition; ``-1`` lets the producer's partitioner choose from the key.
        headers, timestamp
            As ``confluent_kafka.Producer.produce`` takes them.

        Raises
        ------
        SegackValueError
            ``topic`` is not one of the sink's ``topics`` (the run checked only those).
        SegackTypeError
            ``value`` or ``key`` is not a str, bytes or None (nor, with ``values``, what it takes).
        ~segack.spark_adapter.SchemaRegistryError
            With ``values``: the registry does not answer.
        """
        if topic not in self._topics:
            raise SegackValueError(f"KafkaOutput: topic {topic!r} is not one of the sink's topics "
                                   f"({', '.join(sorted(self._topics))}); name it in KafkaSink(topics=...)")
        if self._values is not None and not isinstance(value, _PAYLOAD_TYPES):
            value = self._values.serialize(topic, value)
        if not isinstance(value, _PAYLOAD_TYPES) or not isinstance(key, _PAYLOAD_TYPES):
            raise SegackTypeError(f"KafkaOutput: a record's value and key must be str, bytes or None, not "
                                  f"{type(value).__name__} and {type(key).__name__}")
        self.records.append((topic, value, key, partition, headers, timestamp))

    def __len__(self) -> int:
        return len(self.records)


class KafkaClients:
    """Makes the Kafka clients a :class:`~segack.sinks.KafkaSink` uses, from their settings:
    confluent-kafka's. Give :class:`~segack.sinks.KafkaSink` (``clients=``) an object with the same
    three methods to make them otherwise: clients with callbacks set, or a test's model of Kafka. It
    is pickled with the sink into every task."""

    def producer(self, config: dict[str, Any]) -> Any:
        """A ``confluent_kafka.Producer``."""
        from confluent_kafka import Producer

        return Producer(config)

    def consumer(self, config: dict[str, Any]) -> Any:
        """A ``confluent_kafka.Consumer``."""
        from confluent_kafka import Consumer

        return Consumer(config)

    def admin(self, config: dict[str, Any]) -> Any:
        """A ``confluent_kafka.admin.AdminClient``."""
        from confluent_kafka.admin import AdminClient

        return AdminClient(config)
