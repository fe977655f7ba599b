"""Sinks: handlers whose effects land exactly once, whatever runs crashed, resumed or were fenced.

A key's events reach the handler in the order of their positions, and an event's position is the
same in every run of its checkpoint (:class:`~segack.spark_adapter.EventIdentity`). So a
sink that records, in the same transaction as its effects, the position of the last event of each
key it applied, and skips events at or below it, applies each event once and in order. The one
assumption: the effects and that record commit together.

- :class:`SqlSink` does this for any DB-API 2 database (PostgreSQL through psycopg 3, SQLite
  through ``sqlite3``, others through their ``paramstyle``): the record is a table.
- :class:`KafkaSink` does it for Kafka topics: the record is a compacted topic, written in the
  same Kafka transaction as the output records, and a run that takes a checkpoint over fences
  every transactional id the earlier runs used; its values may be Avro, Protobuf or JSON Schema
  through a Schema Registry (:class:`RegistryValues`).

For a service that takes idempotency keys, subclass :class:`~segack.spark_adapter.Sink` and send
each event's :attr:`~segack.spark_adapter.EventIdentity.idempotency_key`.
"""

from segack.sinks.kafka import KafkaClients, KafkaOutput, KafkaSink
from segack.sinks.registry_values import RegistryValues
from segack.sinks.sql import SESSION_PREFIX, SqlSink
from segack.spark_adapter.handlers import Sink

__all__ = ["SESSION_PREFIX", "KafkaClients", "KafkaOutput", "KafkaSink", "RegistryValues", "Sink", "SqlSink"]
