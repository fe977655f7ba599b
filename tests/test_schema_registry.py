"""Values in Confluent's wire format, through a real Schema Registry (Karapace, ``tests/schema_registry.py``):
written by confluent-kafka's own serializers, decoded by segack's
:class:`~segack.spark_adapter.worker.wire_format.WireFormat` by each writer's schema, in both stream
modes; a value that is not in the format, or names an id the registry lacks, is a dead letter."""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter import SchemaRegistryError
from segack.spark_adapter.worker.kafka_records import ValueFields
from segack.spark_adapter.worker.schema_registry import RegistrySettings, SchemaRegistry
from segack.spark_adapter.worker.wire_format import UndecodableValueError, WireFormat, message_indexes
from tests.ports import free_port
from tests.spark_handlers import read_log
from tests.test_kafka import make_topic, produce, run_stream

pytestmark = [pytest.mark.kafka]

ACCOUNT_V1 = json.dumps({"type": "record", "name": "Account", "namespace": "shop", "fields": [
    {"name": "user", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "amount", "type": "long"}]})
# v2 adds a field with a default: a backward-compatible change the registry takes by default.
ACCOUNT_V2 = json.dumps({"type": "record", "name": "Account", "namespace": "shop", "fields": [
    {"name": "user", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "amount", "type": "long"},
    {"name": "region", "type": "string", "default": "eu"}, {"name": "note", "type": ["null", "bytes"],
                                                            "default": None}]})


def _client(url: str):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def avro_values(url: str, topic: str, schema: str, values: list[dict]) -> list[bytes]:
    """``values`` as confluent-kafka's Avro serializer writes them for ``topic``, registering
    ``schema`` under ``<topic>-value`` as a producer does."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(_client(url), schema)
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(value, context) for value in values]


def payment_class():
    """A Protobuf message type made at run time, as protoc would: ``shop.Payment``, the second
    message of its file (so its message indexes are not the default), with a nested message, an
    enum, a repeated field and bytes."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kinds = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name=f"payments_{uuid.uuid4().hex[:8]}.proto", package="shop",
                                              syntax="proto3")
    file.message_type.add(name="Header").field.add(name="note", number=1, type=kinds.TYPE_STRING,
                                                   label=kinds.LABEL_OPTIONAL)
    payment = file.message_type.add(name="Payment")
    detail = payment.nested_type.add(name="Detail")
    detail.field.add(name="shop_id", number=1, type=kinds.TYPE_INT32, label=kinds.LABEL_OPTIONAL)
    kind = file.enum_type.add(name="Kind")
    kind.value.add(name="CARD", number=0)
    kind.value.add(name="CASH", number=1)
    one, many = kinds.LABEL_OPTIONAL, kinds.LABEL_REPEATED
    for number, (name, kind_of, label) in enumerate([
            ("user", kinds.TYPE_STRING, one), ("seq", kinds.TYPE_INT64, one),
            ("amount", kinds.TYPE_INT64, one), ("kind", kinds.TYPE_ENUM, one),
            ("detail", kinds.TYPE_MESSAGE, one), ("tags", kinds.TYPE_STRING, many),
            ("blob", kinds.TYPE_BYTES, one)], start=1):
        added = payment.field.add(name=name, number=number, type=kind_of, label=label)
        if name == "kind":
            added.type_name = ".shop.Kind"
        if name == "detail":
            added.type_name = ".shop.Payment.Detail"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))


def protobuf_values(url: str, topic: str, messages: list) -> list[bytes]:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = ProtobufSerializer(type(messages[0]), _client(url), {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(message, context) for message in messages]


def test_each_avro_value_is_read_by_its_own_writer_and_resolved_to_the_reader(schema_registry):
    topic = f"wire-avro-{uuid.uuid4().hex[:8]}"
    first = avro_values(schema_registry, topic, ACCOUNT_V1, [{"user": "u1", "seq": 0, "amount": 5}])
    second = avro_values(schema_registry, topic, ACCOUNT_V2, [
        {"user": "u1", "seq": 1, "amount": 6, "region": "us", "note": b"\x00\xff"}])
    registry = RegistrySettings(schema_registry)
    assert struct.unpack(">I", first[0][1:5]) != struct.unpack(">I", second[0][1:5])  # two writers
    latest = WireFormat("avro", registry, {topic: ACCOUNT_V2})
    # v1's record takes v2's defaults; v2's bytes are base64 text, as for every binary field.
    assert latest.decode(topic, first[0]) == {"user": "u1", "seq": 0, "amount": 5, "region": "eu",
                                              "note": None}
    assert latest.decode(topic, second[0]) == {"user": "u1", "seq": 1, "amount": 6, "region": "us",
                                               "note": base64.b64encode(b"\x00\xff").decode()}
    # Read by v1 (the latest when a run started before v2 was registered): v2's new fields dropped.
    older = WireFormat("avro", registry, {topic: ACCOUNT_V1})
    assert older.decode(topic, second[0]) == {"user": "u1", "seq": 1, "amount": 6}
    # A topic whose subject had no version when the run started is read by each writer's schema.
    assert WireFormat("avro", registry, {topic: None}).decode(topic, first[0]) == {
        "user": "u1", "seq": 0, "amount": 5}
    # A reader given (avroSchema) rules over every topic's latest, and over a topic it does not name.
    given = WireFormat("avro", registry, {topic: ACCOUNT_V2}, reader=ACCOUNT_V1)
    assert given.decode(topic, second[0]) == given.decode("another-topic", second[0]) == {
        "user": "u1", "seq": 1, "amount": 6}


def test_protobuf_values_honour_their_message_indexes(schema_registry):
    topic = f"wire-protobuf-{uuid.uuid4().hex[:8]}"
    payment = payment_class()
    message = payment(user="u7", seq=3, amount=40, kind=1, tags=["a", "b"], blob=b"\x01")
    message.detail.shop_id = 12
    value = protobuf_values(schema_registry, topic, [message, payment(user="u8")])
    assert message_indexes(value[0], 5)[0] == (1,)  # the file's second message
    decoded = WireFormat("protobuf", RegistrySettings(schema_registry)).decode(topic, value[0])
    assert decoded == {"user": "u7", "seq": 3, "amount": 40, "kind": "CASH", "detail": {"shop_id": 12},
                       "tags": ["a", "b"], "blob": base64.b64encode(b"\x01").decode()}
    # proto3 gives an unset scalar its default and an unset message as null.
    empty = WireFormat("protobuf", RegistrySettings(schema_registry)).decode(topic, value[1])
    assert empty["seq"] == 0 and empty["kind"] == "CARD" and empty["detail"] is None and empty["tags"] == []


def test_message_indexes_are_zigzag_varints_with_zero_for_the_first_message():
    assert message_indexes(b"\x00") == ((0,), 1)
    # Two indexes, 1 then 300: zigzag doubles them (2, 600), 600 as a two-byte varint.
    assert message_indexes(bytes([4, 2, 0xD8, 0x04]) + b"rest") == ((1, 300), 4)
    with pytest.raises(UndecodableValueError, match="ends inside its Protobuf message indexes"):
        message_indexes(bytes([4, 2]))


def test_a_json_schema_value_is_its_json_after_the_header(schema_registry):
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"wire-json-{uuid.uuid4().hex[:8]}"
    schema = json.dumps({"type": "object", "properties": {"user": {"type": "string"},
                                                          "seq": {"type": "integer"}}})
    value = JSONSerializer(schema, _client(schema_registry))({"user": "u1", "seq": 9},
                                                             SerializationContext(topic, MessageField.VALUE))
    assert WireFormat("json-schema", RegistrySettings(schema_registry)).decode(topic, value) == {
        "user": "u1", "seq": 9}
    # An Avro stream given this value's id is told it is not Avro (its topic's subject, asked for a
    # reader, holds JSON Schema too: no reader, and the writer says what it is).
    with pytest.raises(UndecodableValueError, match="whose schema is JSON Schema, not Avro"):
        WireFormat("avro", RegistrySettings(schema_registry)).decode(topic, value)


def test_what_is_not_in_the_wire_format_or_names_an_unknown_id_is_undecodable_and_unparsed(schema_registry):
    wire = WireFormat("avro", RegistrySettings(schema_registry), {"t": None})
    with pytest.raises(UndecodableValueError, match=r"not in Confluent's wire format .*0x7b"):
        wire.decode("t", b'{"user": "u1"}')
    with pytest.raises(UndecodableValueError, match=r"not in Confluent's wire format .*nothing"):
        wire.decode("t", b"")
    with pytest.raises(UndecodableValueError, match=r"schema id 987654, which the registry .* does not hold"):
        wire.decode("t", b"\x00" + struct.pack(">I", 987654) + b"\x02")
    values = ValueFields((("user", "string"), ("seq", "bigint")), wire)
    fields, unparsed = values.parse("t", b"\x01\x02")
    assert fields is None and base64.b64decode(unparsed) == b"\x01\x02"


def test_a_registry_that_does_not_answer_is_an_error_after_its_retries_not_an_unparsed_value():
    wire = WireFormat("avro", RegistrySettings(f"http://127.0.0.1:{free_port()}"), {"t": None})
    began = time.monotonic()
    with pytest.raises(SchemaRegistryError, match=r"did not answer .* asked 4 times"):
        ValueFields((("user", "string"),), wire).parse("t", b"\x00" + struct.pack(">I", 5) + b"\x02")
    assert time.monotonic() - began >= 3.5  # the three pauses between its four asks


def test_registry_settings_are_checked_and_keep_their_secrets(schema_registry):
    with pytest.raises(ValueError, match=r"credentials go in schema\.registry\.basic\.auth\.user\.info"):
        RegistrySettings("http://me:secret@registry:8081")
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        RegistrySettings("http://registry:8081", user_info="me")
    settings = RegistrySettings(schema_registry, user_info="me:hunter2")
    assert "hunter2" not in repr(settings)
    assert SchemaRegistry(settings).latest  # Karapace here has no authentication: the header is ignored


@pytest.mark.spark
@pytest.mark.handlers
def test_a_micro_batch_stream_of_two_avro_writers_handles_each_once_and_sets_bad_values_aside(
        tmp_path, kafka_broker, schema_registry, capsys):
    topic = f"accounts-avro-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 2)
    older = [{"user": f"u{n % 5}", "seq": n // 5, "amount": n} for n in range(100)]
    newer = [{"user": f"u{n % 5}", "seq": n // 5, "amount": n, "region": "us", "note": None}
             for n in range(100, 200)]
    # Each record says its writer in a header: the headers reach the handler through the decoding too.
    encoded = (avro_values(schema_registry, topic, ACCOUNT_V1, older)
               + avro_values(schema_registry, topic, ACCOUNT_V2, newer))
    records = [(value["user"], payload, [("writer", b"v1" if value["amount"] < 100 else b"v2")])
               for value, payload in zip(older + newer, encoded, strict=True)]
    # u1's next record is not in the wire format, u2's names an id the registry lacks: each a dead
    # letter, with its key's later records parked behind it.
    records += [("u1", b'{"user": "u1"}'), ("u2", b"\x00" + struct.pack(">I", 987654) + b"\x02")]
    records += [(value["user"], encoded) for value, encoded in zip(
        newer[:10], avro_values(schema_registry, topic, ACCOUNT_V2,
                                [{**value, "seq": value["seq"] + 20} for value in newer[:10]]), strict=True)]
    produce(kafka_broker.bootstrap, topic, records)
    finished = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_event",
                          "--value-format", "avro", "--schema-registry", schema_registry,
                          "--value-schema", "user STRING, seq BIGINT, amount BIGINT, region STRING",
                          "--on-error", "dead-letter", "--option", "includeHeaders=true")
    assert finished.returncode == ExitCode.DEAD_LETTERS, finished.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert sorted(event["amount"] for event in handled) == sorted([*range(200), *(
        value["amount"] for value in newer[:10] if value["user"] not in ("u1", "u2"))])
    assert {event["region"] for event in handled if event["amount"] < 100} == {"eu"}  # v2's default
    assert {event["region"] for event in handled if event["amount"] >= 100} == {"us"}
    for event in handled:  # the records written after the bad ones have no headers
        writer = None if event["seq"] >= 40 else [
            {"key": "writer", "value": "b'v1'" if event["amount"] < 100 else "b'v2'"}]
        assert event["headers"] == writer, event
    for user in {event["user"] for event in handled}:
        seqs = [event["seq"] for event in handled if event["user"] == user]
        assert seqs == sorted(seqs)
    assert "6 events set aside as dead letters" in finished.stdout, finished.stdout
    assert main(["dead-letters", str(tmp_path / "checkpoint")]) == ExitCode.OK
    listed = capsys.readouterr().out
    assert "not in Confluent's wire format" in listed and "schema id 987654" in listed, listed


@pytest.mark.spark
def test_a_real_time_stream_reads_a_version_registered_while_it_runs(tmp_path, kafka_broker, schema_registry):
    from tests.test_kafka import _wait_for, start_stream
    from tests.test_realtime import REAL_TIME, _stopped

    topic = f"accounts-avro-live-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 2)
    older = [{"user": f"u{n % 4}", "seq": n // 4, "amount": n} for n in range(80)]
    produce(kafka_broker.bootstrap, topic, [(value["user"], encoded) for value, encoded in zip(
        older, avro_values(schema_registry, topic, ACCOUNT_V1, older), strict=True)])
    log = str(tmp_path / "log.jsonl")
    process = start_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_event",
                           *REAL_TIME, "--value-format", "avro", "--schema-registry", schema_registry)
    _wait_for(lambda: len(read_log(log)) >= 80, 240, "the first writer's records handled", process)
    # v2 is registered by its first producer while the stream runs (its reader is v1, the latest at
    # its start): v2's records are read without a restart, its new fields dropped.
    newer = [{"user": f"u{n % 4}", "seq": n // 4, "amount": n, "region": "us", "note": b"x"}
             for n in range(80, 160)]
    produce(kafka_broker.bootstrap, topic, [(value["user"], encoded) for value, encoded in zip(
        newer, avro_values(schema_registry, topic, ACCOUNT_V2, newer), strict=True)])
    _wait_for(lambda: len(read_log(log)) >= 160, 120, "the second writer's records handled", process)
    _stopped(process)
    handled = read_log(log)
    assert sorted(event["amount"] for event in handled) == list(range(160))
    assert all(set(event) >= {"user", "seq", "amount"} and "region" not in event for event in handled)
    for user in {event["user"] for event in handled}:
        seqs = [event["seq"] for event in handled if event["user"] == user]
        assert seqs == list(range(len(seqs)))


@pytest.mark.spark
@pytest.mark.handlers
def test_a_real_time_stream_of_protobuf_values_sets_an_undecodable_one_aside(
        tmp_path, kafka_broker, schema_registry, capsys):
    from tests.test_kafka import _wait_for, start_stream
    from tests.test_realtime import REAL_TIME, _stopped

    topic = f"payments-protobuf-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 2)
    payment = payment_class()
    messages = [payment(user=f"u{n % 3}", seq=n // 3, amount=n, tags=["t"]) for n in range(60)]
    records = [(message.user, value) for message, value in zip(
        messages, protobuf_values(schema_registry, topic, messages), strict=True)]
    # A value written by an Avro producer to the same topic: its id names an Avro schema.
    records.insert(30, ("u0", avro_values(schema_registry, f"{topic}-other", ACCOUNT_V1,
                                          [{"user": "u0", "seq": 99, "amount": 0}])[0]))
    produce(kafka_broker.bootstrap, topic, records)
    log = str(tmp_path / "log.jsonl")
    process = start_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_event",
                           *REAL_TIME, "--value-format", "protobuf", "--schema-registry", schema_registry,
                           "--value-schema", "user STRING, seq BIGINT, amount BIGINT, tags STRING",
                           "--on-error", "dead-letter")
    behind = sum(1 for message in messages[30:] if message.user == "u0")
    _wait_for(lambda: len(read_log(log)) >= 60 - behind, 240, "the decodable records handled", process)
    _stopped(process, ExitCode.DEAD_LETTERS)
    handled = read_log(log)
    assert sorted(event["amount"] for event in handled) == sorted(
        message.amount for index, message in enumerate(messages) if index < 30 or message.user != "u0")
    assert {event["tags"] for event in handled} == {'["t"]'}  # a repeated field, as JSON text
    assert main(["dead-letters", str(tmp_path / "checkpoint")]) == ExitCode.OK
    assert "whose schema is Avro, not Protobuf" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["available-now", "real-time"])
@pytest.mark.parametrize(("flags", "said"), [
    (["--value-format", "avro"], "--value-format avro reads each value's schema from a Schema Registry"),
    (["--schema-registry", "http://127.0.0.1:9"],
     "a Schema Registry is for values in Confluent's wire format"),
    (["--value-format", "protobuf", "--schema-registry", "http://127.0.0.1:9",
      "--option", "schema.registry.basic.auth.user.info=me:hunter2",
      "--option", "schema.registry.bearer.auth.token=t0k"], "are two ways to log in: give one"),
    (["--value-format", "avro", "--schema-registry", "http://127.0.0.1:9",
      "--option", "schema.registry.auto.register.schemas=true"],
     "schema.registry.auto.register.schemas is not a registry"),
    (["--value-format", "avro", "--schema-registry", "registry:8081"],
     "must be an http:// or https:// address"),
    (["--value-format", "avro", "--schema-registry", "https://127.0.0.1:9",
      "--option", "schema.registry.ssl.ca.location=/nonexistent/ca.pem"],
     "names no file: /nonexistent/ca.pem"),
])
def test_registry_flags_that_do_not_go_together_are_refused_before_spark_starts(
        tmp_path, capsys, monkeypatch, mode, flags, said):
    from segack.cli import runs

    def no_spark(*_: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(runs, "start_session", no_spark)
    assert main(["stream", "--format", "kafka", "--option", "kafka.bootstrap.servers=127.0.0.1:9",
                 "--option", "subscribe=a", "--value-schema", "user STRING", "--key", "key",
                 "--order", "offset", "--handler", "tests.spark_handlers:record_kafka",
                 "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", mode, *flags]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert "hunter2" not in err and "t0k" not in err
    assert not (tmp_path / "checkpoint").exists()


def test_a_registry_away_when_the_run_starts_is_refused_as_input(quick_registry_retries):
    from segack.spark_adapter import InputError
    from segack.spark_adapter.sources.value_formats import wire_format

    with pytest.raises(InputError, match=r"did not answer .* asked 4 times for /schemas/types"):
        wire_format({"schema.registry.url": f"http://127.0.0.1:{free_port()}"}, "avro", ["accounts"])
