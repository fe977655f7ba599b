"""The Schema Registry client and the wire format's decoder where things go wrong: a registry that
is not one, answers late or cut off, redirects, is not trusted, serves schemas segack cannot read;
values whose logical types are moments, days and decimals. Against Karapace
(``tests/schema_registry.py``), with faults put in front of it by ``tests/registry_faults.py``."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import struct
import uuid

import pytest

from segack.spark_adapter import InputError, OptionError, SchemaRegistryError, UnparsedValueError
from segack.spark_adapter.sources.value_formats import known_topics, wire_format
from segack.spark_adapter.worker.kafka_records import RecordEvents, ValueFields, check_fields
from segack.spark_adapter.worker.schema_registry import RegistrySettings, SchemaRegistry, UnknownSchemaError
from segack.spark_adapter.worker.wire_format import UndecodableValueError, WireFormat
from tests.ports import free_port
from tests.registry_faults import Fault, faulty_front
from tests.schema_registry import register
from tests.test_schema_registry import ACCOUNT_V1, ACCOUNT_V2, avro_values

pytestmark = [pytest.mark.kafka]


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_wrong_address_is_not_taken_for_a_schema_the_registry_lacks(schema_registry):
    # Karapace's 404 for an id it lacks carries its error code: the id is unknown, and said so.
    with pytest.raises(UnknownSchemaError):
        SchemaRegistry(RegistrySettings(schema_registry)).schema(987654)
    # A path that is not the registry's (a prefix too many) is a 404 without such a code.
    wrong = RegistrySettings(schema_registry + "/registry")
    with pytest.raises(SchemaRegistryError, match="is it a Schema Registry"):
        SchemaRegistry(wrong).schema(1)
    # So a run over it stops when it starts, rather than setting every record aside.
    with pytest.raises(InputError, match="is it a Schema Registry"):
        wire_format({"schema.registry.url": wrong.url}, "avro", ["accounts"])


@pytest.mark.parametrize("url", ["me:s3cret@registry:8081", "ftp://me:s3cret@registry",
                                 "http://registry:8081/?token=s3cret", "http://registry:8081#s3cret",
                                 "http://registry:8081,https://me:s3cret@other:8081",
                                 "http://me:s3#cret@registry", "http://me:s3?cret@registry",
                                 "http://me:s3://cret@registry", "https://me:s3,cret@registry"])
def test_an_address_holding_a_secret_is_refused_without_showing_it(url):
    with pytest.raises(OptionError) as refused:
        RegistrySettings(url)
    assert not {"s3", "cret"} & set(str(refused.value).replace("/", " ").replace(":", " ").split())
    assert "s3" not in str(refused.value) and "registry" in str(refused.value)


def test_a_token_or_password_with_a_line_break_is_refused_unshown():
    for given in ({"bearer_token": "t0ken-s3cret\n"}, {"user_info": "me:s3cret\r\n"}, {"bearer_token": ""}):
        with pytest.raises(OptionError, match="control character") as refused:
            RegistrySettings("http://registry:8081", **given)
        assert "s3cret" not in str(refused.value)


def test_a_redirect_is_refused_and_the_credentials_go_nowhere_else(schema_registry):
    with faulty_front(schema_registry) as elsewhere, faulty_front(schema_registry) as front:
        front.inject(Fault(307, headers={"Location": f"{elsewhere.url}/schemas/types"}))
        client = SchemaRegistry(RegistrySettings(front.url, user_info="me:hunter2"))
        with pytest.raises(SchemaRegistryError, match=r"redirect \(307\) to http://127\.0\.0\.1") as refused:
            client.formats()
        assert "hunter2" not in str(refused.value)
        assert elsewhere.requests == []
        assert front.requests[0][1]["Authorization"].startswith("Basic ")


def test_every_format_has_the_registry_asked_when_a_run_starts(schema_registry, quick_registry_retries):
    away = f"http://127.0.0.1:{free_port()}"
    for value_format in ("protobuf", "json-schema"):
        with pytest.raises(InputError, match=r"did not answer .* asked 4 times for /schemas/types"):
            wire_format({"schema.registry.url": away}, value_format, ["a"])
    # Avro under subscribePattern names no topic: the registry is asked all the same.
    options = {"schema.registry.url": away, "subscribePattern": "accounts.*"}
    with pytest.raises(InputError, match="asked 4 times for /schemas/types"):
        wire_format(options, "avro", known_topics(options))
    with faulty_front(schema_registry) as front:
        front.inject(Fault(200, b'["AVRO"]'))
        with pytest.raises(InputError, match=r"holds no protobuf schemas \(it holds AVRO\)"):
            wire_format({"schema.registry.url": front.url}, "protobuf", ["a"])
    wire, rest = wire_format({"schema.registry.url": schema_registry, "subscribe": "a"}, "protobuf", ["a"])
    assert wire is not None and wire.readers == {} and rest == {"subscribe": "a"}


def test_the_topics_a_reader_names():
    assert known_topics({"subscribe": " a, b ,"}) == ["a", "b"]
    assert known_topics({"assign": json.dumps({"b": [0], "a": [1, 2]})}) == ["a", "b"]
    assert known_topics({"subscribePattern": "a.*"}) == []


def test_a_topic_the_run_did_not_know_is_resolved_to_its_subjects_latest(schema_registry):
    topic = _topic("pattern")
    older = avro_values(schema_registry, topic, ACCOUNT_V1, [{"user": "u1", "seq": 0, "amount": 5}])[0]
    avro_values(schema_registry, topic, ACCOUNT_V2, [{"user": "u1", "seq": 1, "amount": 6}])
    registry = RegistrySettings(schema_registry)
    # A topic of subscribePattern (not among the readers): v2 is asked for, and v1's value takes its defaults.
    assert WireFormat("avro", registry).decode(topic, older) == {
        "user": "u1", "seq": 0, "amount": 5, "region": "eu", "note": None}
    # A topic the run asked for and found no subject of is read by each writer's own schema.
    assert WireFormat("avro", registry, {topic: None}).decode(topic, older) == {
        "user": "u1", "seq": 0, "amount": 5}


def test_a_schema_segack_cannot_read_sets_values_aside_saying_why(schema_registry):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from segack.spark_adapter.sources.kafka import unparsed_refusal

    topic = _topic("referencing")
    address = json.dumps({"type": "record", "name": "Address", "namespace": "shop",
                          "fields": [{"name": "city", "type": "string"}]})
    register(schema_registry, f"{topic}-address", address)
    customer = json.dumps({"type": "record", "name": "Customer", "namespace": "shop", "fields": [
        {"name": "user", "type": "string"}, {"name": "home", "type": "shop.Address"}]})
    reference = {"name": "shop.Address", "subject": f"{topic}-address", "version": 1}
    schema_id = register_with_references(schema_registry, f"{topic}-value", customer, [reference])
    value = b"\x00" + struct.pack(">I", schema_id) + b"\x04u1\x04ab"
    wire = WireFormat("avro", RegistrySettings(schema_registry), {topic: None})
    with pytest.raises(UndecodableValueError, match="names a type defined by another subject"):
        wire.decode(topic, value)
    fields, unparsed = ValueFields((("user", "string"),), wire).parse(topic, value)
    assert fields is None and base64.b64decode(unparsed) == value
    schema = StructType([StructField("user", StringType()), StructField("seq", LongType())])
    with pytest.raises(UnparsedValueError, match="names a type defined by another subject"):
        unparsed_refusal(schema, wire).check({"topic": topic, "partition": 0, "offset": 7,
                                              "unparsed_value": unparsed})


def register_with_references(url: str, subject: str, schema: str, references: list[dict]) -> int:
    import urllib.request

    body = json.dumps({"schema": schema, "references": references}).encode()
    request = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=body,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(json.loads(answer.read())["id"])


def test_a_protobuf_schema_served_as_text_is_said_to_be(schema_registry):
    from tests.test_schema_registry import payment_class, protobuf_values

    topic = _topic("proto-text")
    value = protobuf_values(schema_registry, topic, [payment_class()(user="u1")])[0]
    with faulty_front(schema_registry) as front:
        text = {"schemaType": "PROTOBUF", "schema": 'syntax = "proto3"; message Payment {}'}
        front.inject(Fault(200, json.dumps(text).encode(),
                           path_holds="format=serialized"))
        with pytest.raises(UndecodableValueError, match=r"as \.proto text, not serialized"):
            WireFormat("protobuf", RegistrySettings(front.url)).decode(topic, value)


LOGICAL = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "user", "type": "string"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}, "default": 0}]})


def test_avro_logical_types_fill_timestamp_date_and_decimal_fields(schema_registry):
    from pyspark.sql.types import DecimalType, LongType, StringType, StructField, StructType, TimestampType

    topic = _topic("logical")
    moment = dt.datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=dt.UTC)
    value = avro_values(schema_registry, topic, LOGICAL, [
        {"user": "u1", "at": moment, "day": dt.date(2026, 3, 1), "price": decimal.Decimal("12.34"),
         "local": dt.datetime(1970, 1, 1)}])[0]
    wire = WireFormat("avro", RegistrySettings(schema_registry))
    declared = (("user", "string"), ("at", "timestamp"), ("day", "date"), ("price", "decimal(10,3)"),
                ("local", "timestamp_ntz"))
    fields, unparsed = ValueFields(declared, wire).parse(topic, value)
    assert unparsed is None
    assert dict(fields) == {"user": "u1", "at": moment, "day": dt.date(2026, 3, 1),
                            "price": decimal.Decimal("12.340"), "local": dt.datetime(1970, 1, 1)}
    # A moment without a zone is not a TIMESTAMP, nor one with a zone a TIMESTAMP_NTZ.
    assert ValueFields((("local", "timestamp"),), wire).parse(topic, value)[0] is None
    assert ValueFields((("at", "timestamp_ntz"),), wire).parse(topic, value)[0] is None
    # In real time the moment is in the session's zone, as the record's own timestamp is.
    event = RecordEvents(declared, "America/New_York", wire).event(topic, 0, 0, b"u1", value, 0)
    assert event["at"] == moment and event["at"].utcoffset() == dt.timedelta(hours=-5)
    # A decimal that does not fit is the value unparsed; so is a moment declared BIGINT, the
    # refusal naming the field.
    assert ValueFields((("price", "decimal(3,1)"),), wire).parse(topic, value)[0] is None
    schema = StructType([StructField("user", StringType()), StructField("at", LongType())])
    assert ValueFields(check_fields(schema, value_format="avro"), wire).parse(topic, value)[0] is None
    from segack.spark_adapter.sources.kafka import unparsed_refusal

    with pytest.raises(UnparsedValueError, match=r"holds field 'at' as datetime, which its declared type "
                                                 r"BIGINT"):
        unparsed_refusal(schema, wire).check({"topic": topic, "partition": 0, "offset": 1,
                                              "unparsed_value": base64.b64encode(value).decode()})
    # JSON values still take the scalar types alone.
    with pytest.raises(OptionError, match="field 'at' is TIMESTAMP"):
        check_fields(StructType([StructField("at", TimestampType())]))
    declared = StructType([StructField("at", TimestampType()), StructField("p", DecimalType(5, 2))])
    assert check_fields(declared, value_format="avro") == (("at", "timestamp"), ("p", "decimal(5,2)"))
    # JSON Schema's values are JSON, which has no moments; Protobuf has moments, not decimals.
    with pytest.raises(OptionError, match="field 'at' is TIMESTAMP"):
        check_fields(declared, value_format="json-schema")
    with pytest.raises(OptionError, match=r"field 'p' is DECIMAL\(5,2\)"):
        check_fields(declared, value_format="protobuf")


def test_decoded_batches_give_spark_the_logical_types(schema_registry):
    import pyarrow as pa

    from segack.spark_adapter.worker.kafka_records import DecodedBatches

    topic = _topic("logical-batch")
    moment = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    value = avro_values(schema_registry, topic, LOGICAL, [
        {"user": "u1", "at": moment, "day": dt.date(2026, 3, 1), "price": decimal.Decimal("1.50"),
         "local": dt.datetime(1970, 1, 1)}])[0]
    values = ValueFields((("at", "timestamp"), ("day", "date"), ("price", "decimal(9,2)")),
                         WireFormat("avro", RegistrySettings(schema_registry)))
    batch = pa.RecordBatch.from_pydict({"key": [b"u1"], "topic": [topic], "partition": [0], "offset": [0],
                                        "timestamp": [moment], "value": [value]})
    (out,) = DecodedBatches(values)(iter([batch]))
    assert out.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert out.schema.field("price").type == pa.decimal128(9, 2)
    assert out.to_pylist()[0]["at"] == moment and out.to_pylist()[0]["price"] == decimal.Decimal("1.50")


def test_bytes_after_an_avro_record_are_undecodable(schema_registry):
    topic = _topic("trailing")
    value = avro_values(schema_registry, topic, ACCOUNT_V1, [{"user": "u1", "seq": 0, "amount": 5}])[0]
    with pytest.raises(UndecodableValueError, match="has 2 bytes after its Avro record"):
        WireFormat("avro", RegistrySettings(schema_registry), {topic: None}).decode(
            topic, value + b"\x00\x00")


def test_an_id_past_a_signed_integer_is_undecodable_without_asking(schema_registry):
    with faulty_front(schema_registry) as front:
        with pytest.raises(UndecodableValueError, match="names schema id -1, which no registry holds"):
            WireFormat("avro", RegistrySettings(front.url), {"t": None}).decode(
                "t", b"\x00\xff\xff\xff\xff\x02")
        assert front.paths() == []


def test_the_caches_keep_one_users_answers_from_another(schema_registry):
    topic = _topic("two-users")
    value = avro_values(schema_registry, topic, ACCOUNT_V1, [{"user": "u1", "seq": 0, "amount": 5}])[0]
    with faulty_front(schema_registry) as front:
        for user in ("reader:a", "admin:b", "reader:a"):
            wire = WireFormat("avro", RegistrySettings(front.url, user_info=user), {topic: None})
            wire.decode(topic, value)
        assert len(front.paths()) == 2  # each user asked once


def test_an_unknown_id_is_asked_once_and_a_client_is_made_once(schema_registry):
    with faulty_front(schema_registry) as front:
        settings = RegistrySettings(front.url)
        wire = WireFormat("avro", settings, {"t": None})
        for _ in range(3):
            with pytest.raises(UndecodableValueError, match="does not hold"):
                wire.decode("t", b"\x00" + struct.pack(">I", 987654) + b"\x02")
        assert front.paths() == ["/schemas/ids/987654"]
        assert SchemaRegistry.of(settings) is SchemaRegistry.of(RegistrySettings(front.url))


@pytest.mark.parametrize("faults", [
    [Fault(429, b"slow down"), Fault(408)], [Fault(503)], [Fault(200, b'{"schema": "x"', cut=True)],
    [Fault(404, b'{"error_code"', cut=True)]])
def test_what_is_worth_asking_again_is_asked_again(schema_registry, faults, quick_registry_retries):
    topic = _topic("retried")
    value = avro_values(schema_registry, topic, ACCOUNT_V1, [{"user": "u1", "seq": 0, "amount": 5}])[0]
    with faulty_front(schema_registry) as front:
        front.inject(*faults)
        wire = WireFormat("avro", RegistrySettings(front.url), {topic: None})
        assert wire.decode(topic, value)["amount"] == 5
        assert len(front.paths()) == len(faults) + 1


@pytest.mark.parametrize("body", [b"<html>Sign in</html>", b'{"id": 1}', b'[{"schema": "{}"}]'])
def test_an_answer_that_is_not_a_registrys_is_said_to_be_at_once(schema_registry, body):
    with faulty_front(schema_registry) as front:
        front.inject(Fault(200, body))
        with pytest.raises(SchemaRegistryError, match="is it a Schema Registry"):
            SchemaRegistry(RegistrySettings(front.url)).schema(1)
        assert len(front.paths()) == 1


def test_a_registry_without_schema_types_holds_avro_alone(schema_registry):
    with faulty_front(schema_registry) as front:  # Confluent's before 5.5 has no /schemas/types
        front.inject(Fault(404, b'{"error_code": 404, "message": "HTTP 404 Not Found"}'))
        assert SchemaRegistry(RegistrySettings(front.url)).formats() == ("AVRO",)
        assert front.paths() == ["/schemas/types", "/config"]
        front.inject(Fault(404, b"Not Found"), Fault(404, b"Not Found"))
        with pytest.raises(InputError, match="is it a Schema Registry"):
            wire_format({"schema.registry.url": front.url}, "avro", [])


def test_several_addresses_are_asked_in_turn(schema_registry):
    away = f"http://127.0.0.1:{free_port()}"
    assert "AVRO" in SchemaRegistry(RegistrySettings(f"{away},{schema_registry}")).formats()


def test_a_registry_over_tls_is_trusted_by_its_ca_alone(schema_registry, tmp_path):
    from tests.kafka import certificate

    ca_key, ca = certificate(tmp_path, "registry-ca", None, None)
    _, other_ca = certificate(tmp_path, "other-ca", None, None)
    served = certificate(tmp_path, "registry", str(ca), str(ca_key))
    with faulty_front(schema_registry, served) as front:
        assert front.url.startswith("https://")
        with pytest.raises(SchemaRegistryError, match=r"not trusted .*give the PEM file of the CA .* as "
                                                      r"schema\.registry\.ssl\.ca\.location"):
            SchemaRegistry(RegistrySettings(front.url)).formats()
        with pytest.raises(SchemaRegistryError, match=r"not trusted .* by the CA in schema\.registry\.ssl"):
            SchemaRegistry(RegistrySettings(front.url, ca_location=str(other_ca))).formats()
        assert "AVRO" in SchemaRegistry(RegistrySettings(front.url, ca_location=str(ca))).formats()
        capitals = front.url.replace("https://", "HTTPS://")
        assert "AVRO" in SchemaRegistry(RegistrySettings(capitals, ca_location=str(ca))).formats()
        # The CA is read where the client is made: an executor without the file says which it lacks.
        copied = tmp_path / "copied-ca.crt"
        copied.write_bytes(ca.read_bytes())
        settings = RegistrySettings(front.url, ca_location=str(copied))
        copied.unlink()
        with pytest.raises(SchemaRegistryError, match=r"copied-ca\.crt cannot be read on this host"):
            SchemaRegistry(settings)
    # An https:// address of a registry that speaks plain HTTP.
    plain = schema_registry.replace("http://", "https://")
    with pytest.raises(SchemaRegistryError, match=r"does not speak TLS: is its address http://"):
        SchemaRegistry(RegistrySettings(plain)).formats()


def test_a_ca_file_is_checked_before_anything_runs(tmp_path):
    with pytest.raises(OptionError, match="names no file"):
        RegistrySettings("https://registry:8081", ca_location=str(tmp_path / "none.pem"))
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(OptionError, match="is not a CA's certificate in PEM"):
        RegistrySettings("https://registry:8081", ca_location=str(tmp_path / "bad.pem"))
    with pytest.raises(OptionError, match="is the CA of an https:// registry"):
        RegistrySettings("http://registry:8081", ca_location=str(tmp_path / "bad.pem"))


def _stamped_class():
    """A Protobuf message type with a ``google.protobuf.Timestamp`` field, made as protoc would."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    kinds = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name=f"stamped_{uuid.uuid4().hex[:8]}.proto", package="shop",
                                              syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    message = file.message_type.add(name="Stamped")
    message.field.add(name="user", number=1, type=kinds.TYPE_STRING, label=kinds.LABEL_OPTIONAL)
    message.field.add(name="at", number=2, type=kinds.TYPE_MESSAGE, label=kinds.LABEL_OPTIONAL,
                      type_name=".google.protobuf.Timestamp")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Stamped"))


def test_a_protobuf_timestamp_is_a_moment_and_one_past_year_9999_is_undecodable(schema_registry):
    from tests.test_schema_registry import protobuf_values

    topic = _topic("stamped")
    stamped = _stamped_class()
    good, late = stamped(user="u1"), stamped(user="u2")
    good.at.FromDatetime(dt.datetime(2026, 3, 1, 12, 0, 5))
    late.at.seconds = 400_000_000_000  # about year 14645: a Timestamp that holds it, a datetime that cannot
    values = protobuf_values(schema_registry, topic, [good, late])
    wire = WireFormat("protobuf", RegistrySettings(schema_registry))
    fields, unparsed = ValueFields((("user", "string"), ("at", "timestamp")), wire).parse(topic, values[0])
    assert unparsed is None and dict(fields)["at"] == dt.datetime(2026, 3, 1, 12, 0, 5, tzinfo=dt.UTC)
    with pytest.raises(UndecodableValueError, match=r"does not decode as Protobuf message shop\.Stamped"):
        wire.decode(topic, values[1])
