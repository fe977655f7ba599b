"""``KafkaSink(values=RegistryValues(...))`` on the real broker and Karapace: ``apply`` gives dicts or
Protobuf messages, the sink sends them in Confluent's wire format (by confluent-kafka's own
serializers), each event's once; read back by segack's own decoder and checked against the
registry's subjects. Refusals before any event, in one line."""

from __future__ import annotations

import json
import uuid

import pytest

from segack.errors import SegackTypeError, SegackValueError
from segack.sinks import KafkaSink, RegistryValues
from segack.spark_adapter.errors import SchemaRegistryError, SinkError
from segack.spark_adapter.worker.schema_registry import RegistrySettings, SchemaRegistry
from segack.spark_adapter.worker.wire_format import WireFormat
from tests.kafka import committed_messages
from tests.ports import free_port
from tests.protobuf_messages import Order
from tests.registry_faults import Fault, faulty_front
from tests.test_kafka import account_events, make_topic
from tests.test_kafka_sink import _events, _run, _task
from tests.test_schema_registry import ACCOUNT_V1

pytestmark = [pytest.mark.kafka]


class AvroAccounts:
    """``apply``: each account event as a dict of its Avro schema, to ``topic``; ``bad_seq`` makes
    that event's amount a text, which the schema refuses."""

    def __init__(self, topic: str, bad_seq: int | None = None) -> None:
        self.topic, self.bad_seq = topic, bad_seq

    def __call__(self, output, event) -> None:
        amount = "lots" if event["seq"] == self.bad_seq else event["amount"]
        output.produce(self.topic, value={"user": event["user"], "seq": event["seq"], "amount": amount},
                       key=event["user"])


class ProtobufOrders:
    """``apply``: each account event as a ``segacktests.Order`` message (``tests/protobuf_messages.py``,
    a class the tasks import), to ``topic``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def __call__(self, output, event) -> None:
        message = Order(user=event["user"], seq=event["seq"], amount=event["amount"])
        output.produce(self.topic, value=message, key=event["user"])


class JsonAccounts:
    """``apply``: each account event as a dict of a JSON Schema, to ``topic``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    def __call__(self, output, event) -> None:
        output.produce(self.topic, value={"user": event["user"], "seq": event["seq"]}, key=event["user"])


ACCOUNT_JSON = json.dumps({"type": "object", "properties": {"user": {"type": "string"},
                                                            "seq": {"type": "integer"}},
                           "required": ["user", "seq"]})


def _registry(url: str) -> dict[str, str]:
    """A stream's options, as a sink is given them: the registry's among the Kafka reader's."""
    return {"schema.registry.url": url, "subscribe": "accounts", "kafka.bootstrap.servers": "127.0.0.1:9"}


def _sink(bootstrap: str, topic: str, values: RegistryValues, apply) -> KafkaSink:
    return KafkaSink({"bootstrap.servers": bootstrap, "linger.ms": 5}, apply, topics=[topic],
                     positions_partitions=2, values=values)


@pytest.mark.parametrize(("arguments", "error", "said"), [
    (("xml", _registry("http://r:8081")), SegackValueError, "value_format must be one of avro"),
    (("avro", {"subscribe": "a"}), SegackValueError, "registry must give schema.registry.url"),
    (("avro", {"schema.registry.url": "http://r:8081", "schema.registry.bearer.auth.token": "t0k"}),
     SegackValueError, "bearer.auth.token is not taken for writing"),
    (("avro", {"schema.registry.url": "http://me:s3cret@r:8081"}), SegackValueError,
     "registry's address alone"),
    (("protobuf", _registry("http://r:8081"), {"out": "{}"}), SegackTypeError,
     "must be its Protobuf message"),
    (("avro", _registry("http://r:8081"), {"out": '"string"'}), SegackValueError, "give a record's schema"),
    (("json-schema", _registry("http://r:8081"), {"out": '{"type": 5}'}), SegackValueError,
     "is not json-schema's: SchemaError"),
    (("json-schema", _registry("http://r:8081"), {"out": '{"type": "array"}'}), SegackValueError,
     'give a schema of "type": "object"'),
    (("avro", _registry("http://r:8081"), {"out": "not json"}), SegackValueError, "is not avro's"),
    (("avro", _registry("http://r:8081"), {"out": '{"type": "recrod", "name": "A"}'}), SegackValueError,
     "is not avro's"),
    (("avro", _registry("http://r:8081"), {"out": 5}), SegackTypeError, "must be its JSON text"),
    (("avro", ["schema.registry.url"]), SegackTypeError, "must be mappings"),
])
def test_values_it_cannot_write_are_refused_naming_why(arguments, error, said):
    with pytest.raises(error, match=said) as refused:
        RegistryValues(*arguments)
    assert "s3cret" not in str(refused.value) and "t0k" not in str(refused.value)


def test_a_sink_refuses_values_of_another_kind_or_for_a_topic_it_does_not_write():
    values = RegistryValues("avro", _registry("http://r:8081"), {"elsewhere": ACCOUNT_V1})
    with pytest.raises(SegackValueError, match="values has a schema for elsewhere, not one of the sink's"):
        KafkaSink({"bootstrap.servers": "127.0.0.1:9"}, AvroAccounts("out"), topics=["out"], values=values)
    with pytest.raises(SegackTypeError, match="values must be a RegistryValues"):
        KafkaSink({"bootstrap.servers": "127.0.0.1:9"}, AvroAccounts("out"), topics=["out"], values={})


@pytest.mark.spark
def test_avro_values_are_registered_once_and_each_events_sent_once_in_the_wire_format(
        tmp_path, kafka_broker, schema_registry):
    topic = f"out-avro-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 2)
    records = account_events(200, users=10, seed=3)
    events, identities = _events(records, tmp_path)
    with faulty_front(schema_registry) as front:
        sink = _sink(kafka_broker.bootstrap, topic, RegistryValues("avro", _registry(front.url),
                                                                   {topic: ACCOUNT_V1}), AvroAccounts(topic))
        sink.prepare(_run(tmp_path, 1))
        registered = SchemaRegistry(RegistrySettings(schema_registry)).latest(f"{topic}-value")
        assert json.loads(registered.text)["name"] == "Account"
        task = _task(sink)
        task(events[:120], identities[:120])
        _task(sink)(events, identities)  # another attempt from the start: the first 120 are not sent again
        task.close()
        # Registered once for the process, by the driver's check: the tasks' serializers share it.
        posted = [path.partition("?")[0] for path in front.paths("POST")]
        assert posted == [f"/subjects/{topic}-value/versions"]
    wire = WireFormat("avro", RegistrySettings(schema_registry), {topic: None})
    sent = [(message.value()[1:5], wire.decode(topic, message.value()))
            for message in committed_messages(kafka_broker.bootstrap, topic)]
    assert {header for header, _ in sent} == {registered.schema_id.to_bytes(4, "big")}
    assert sorted((value["user"], value["seq"], value["amount"]) for _, value in sent) == sorted(
        (event["user"], event["seq"], event["amount"]) for event in events)


@pytest.mark.spark
@pytest.mark.parametrize(("value_format", "schema", "apply", "fields"), [
    ("protobuf", Order, ProtobufOrders, ("user", "seq", "amount")),
    ("json-schema", ACCOUNT_JSON, JsonAccounts, ("user", "seq")),
], ids=["protobuf", "json-schema"])
def test_protobuf_and_json_schema_values_are_registered_first_and_sent_in_the_wire_format(
        tmp_path, kafka_broker, schema_registry, value_format, schema, apply, fields):
    topic = f"out-{value_format}-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 1)
    events, identities = _events(account_events(30, users=3, seed=5), tmp_path)
    sink = _sink(kafka_broker.bootstrap, topic, RegistryValues(value_format, _registry(schema_registry),
                                                               {topic: schema}), apply(topic))
    sink.prepare(_run(tmp_path, 1))
    registered = SchemaRegistry(RegistrySettings(schema_registry)).latest(f"{topic}-value")
    # Registered by the driver, before any event: the schema the values then name.
    assert registered.schema_type == {"protobuf": "PROTOBUF", "json-schema": "JSON"}[value_format]
    _task(sink)(events, identities)
    sent = list(committed_messages(kafka_broker.bootstrap, topic))
    assert {message.value()[1:5] for message in sent} == {registered.schema_id.to_bytes(4, "big")}
    wire = WireFormat(value_format, RegistrySettings(schema_registry))
    decoded = [wire.decode(topic, message.value()) for message in sent]
    assert sorted(tuple(value[name] for name in fields) for value in decoded) == sorted(
        tuple(event[name] for name in fields) for event in events)


def test_a_registry_failing_mid_run_is_the_registrys_failure_not_the_values(schema_registry):
    with faulty_front(schema_registry) as front:
        logged_in = {**_registry(front.url), "schema.registry.basic.auth.user.info": "me:s3cret"}
        values = RegistryValues("avro", logged_in, {"out-mid-run": ACCOUNT_V1})
        front.inject(*[Fault(503, b"<html>down for maintenance</html>")] * 8)
        with pytest.raises(SchemaRegistryError, match=r"answered 503") as failed:
            values.serialize("out-mid-run", {"user": "u1", "seq": 0, "amount": 1})
        assert "s3cret" not in str(failed.value) and "maintenance" not in str(failed.value)
        front.faults.clear()
        front.inject(Fault(401, b'{"error_code": 40101, "message": "Unauthorized"}'))
        with pytest.raises(SinkError, match="refused segack's credentials") as refused:
            values.prepare()
        assert "s3cret" not in str(refused.value)


@pytest.mark.spark
def test_a_value_its_schema_refuses_fails_its_call_and_sends_nothing(tmp_path, kafka_broker, schema_registry):
    topic = f"out-refused-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 1)
    events, identities = _events(account_events(20, users=2, seed=7), tmp_path)
    bad = events[5]["seq"]
    sink = _sink(kafka_broker.bootstrap, topic, RegistryValues("avro", _registry(schema_registry),
                                                               {topic: ACCOUNT_V1}), AvroAccounts(topic, bad))
    sink.prepare(_run(tmp_path, 1))
    with pytest.raises(SegackValueError, match=f"a value for {topic} does not fit its avro schema"):
        _task(sink)(events, identities)
    assert list(committed_messages(kafka_broker.bootstrap, topic)) == []


@pytest.mark.spark
def test_a_run_is_refused_in_one_line_when_its_schema_cannot_be_had(tmp_path, kafka_broker, schema_registry,
                                                                   quick_registry_retries):
    topic = f"out-unregistered-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 1)
    # A registry where producers may not register, lacking the schema.
    values = RegistryValues("avro", _registry(schema_registry), {topic: ACCOUNT_V1}, auto_register=False)
    with pytest.raises(SinkError, match=r"answered 404 \(error code 40401\)") as refused:
        _sink(kafka_broker.bootstrap, topic, values, AvroAccounts(topic)).prepare(_run(tmp_path, 1))
    assert "\n" not in str(refused.value)
    # A schema the subject's compatibility refuses: v1 registered, then a field without a default.
    RegistryValues("avro", _registry(schema_registry), {topic: ACCOUNT_V1}).prepare()
    breaking = json.loads(ACCOUNT_V1)
    breaking["fields"].append({"name": "region", "type": "string"})
    values = RegistryValues("avro", _registry(schema_registry), {topic: json.dumps(breaking)})
    with pytest.raises(SinkError, match=r"answered 409"):
        values.prepare()
    away = RegistryValues("avro", _registry(f"http://127.0.0.1:{free_port()}"), {topic: ACCOUNT_V1})
    with pytest.raises(SinkError, match=r"did not answer"):
        away.prepare()
