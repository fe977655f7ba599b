"""Plain binary Avro values (no header, no registry: what Spark's ``to_avro`` writes), read by the
schema ``--avro-schema`` gives (the option ``avroSchema``, as Spark's ``from_avro`` takes it): decoded
alike in both stream modes, a value the schema does not read a dead letter, and the options that do
not go together refused before Spark starts."""

from __future__ import annotations

import base64
import io
import json
import uuid

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.sources.value_formats import value_registry, wire_format
from segack.spark_adapter.worker.wire_format import UndecodableValueError, WireFormat

ACCOUNT = json.dumps({"type": "record", "name": "Account", "namespace": "shop", "fields": [
    {"name": "user", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "amount", "type": "long"},
    {"name": "note", "type": ["null", "bytes"], "default": None}]})


def plain(values: list[dict], schema: str = ACCOUNT) -> list[bytes]:
    """``values`` in Avro's binary encoding, one record each with no header, as ``to_avro`` writes."""
    import fastavro

    parsed = fastavro.parse_schema(json.loads(schema))
    encoded = []
    for value in values:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        encoded.append(out.getvalue())
    return encoded


def test_a_plain_avro_value_is_read_by_the_schema_given_and_what_it_cannot_read_is_undecodable():
    wire, rest = wire_format({"avroSchema": ACCOUNT, "subscribe": "t"}, "avro", ["t"])
    assert isinstance(wire, WireFormat) and wire.registry is None and rest == {"subscribe": "t"}
    [value] = plain([{"user": "u1", "seq": 3, "amount": 7, "note": b"\x00\xff"}])
    assert wire.decode("t", value) == {"user": "u1", "seq": 3, "amount": 7,
                                       "note": base64.b64encode(b"\x00\xff").decode()}
    with pytest.raises(UndecodableValueError, match="1 bytes after its Avro record"):
        wire.decode("t", value + b"\x00")
    with pytest.raises(UndecodableValueError, match="does not decode as plain Avro by the schema given"):
        wire.decode("t", value[:3])


@pytest.mark.parametrize(("options", "value_format", "said"), [
    ({"avroSchema": ACCOUNT}, "json", "avroSchema is the schema Avro values are read by"),
    ({"avroSchema": ACCOUNT}, "protobuf", "avroSchema is the schema Avro values are read by"),
    ({"avroSchema": "{not json"}, "avro", "avroSchema is not an Avro schema fastavro reads"),
    ({"avroSchema": '"string"'}, "avro", "avroSchema must be an Avro record schema"),
    ({}, "avro", "or, for plain binary Avro with no header, its schema: --avro-schema FILE"),
])
def test_an_avro_schema_that_does_not_go_with_the_format_is_refused(options, value_format, said):
    with pytest.raises(OptionError, match=said):
        value_registry(options, value_format)


@pytest.mark.parametrize("mode", ["available-now", "real-time"])
def test_a_schema_file_that_cannot_be_read_is_refused_before_spark_starts(tmp_path, capsys, mode):
    given = tmp_path / "account.avsc"
    given.write_text('"string"')
    command = ["stream", "--format", "kafka", "--option", "kafka.bootstrap.servers=127.0.0.1:9",
               "--option", "subscribe=t", "--value-schema", "user STRING", "--value-format", "avro",
               "--key", "key", "--order", "offset", "--handler", "builtins:print",
               "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", mode]
    with pytest.raises(SystemExit) as exited:  # the parser's own refusal
        main([*command, "--avro-schema", str(tmp_path / "missing.avsc")])
    assert exited.value.code == ExitCode.USAGE
    assert "--avro-schema: cannot read" in capsys.readouterr().err
    assert main([*command, "--avro-schema", str(given)]) == ExitCode.USAGE
    assert "avroSchema must be an Avro record schema" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint").exists()


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.streams
def test_plain_avro_values_are_handled_alike_in_both_modes_and_a_foreign_one_is_a_dead_letter(
        tmp_path, kafka_broker, capsys):
    from tests.spark_handlers import read_log
    from tests.test_kafka import _wait_for, make_topic, produce, run_stream, start_stream
    from tests.test_realtime import REAL_TIME, _stopped

    topic = f"accounts-plain-avro-{uuid.uuid4().hex[:8]}"
    make_topic(kafka_broker.bootstrap, topic, 2)
    values = [{"user": f"u{n % 4}", "seq": n // 4, "amount": n, "note": None} for n in range(40)]
    records = [(value["user"], encoded) for value, encoded in zip(values, plain(values), strict=True)]
    # u3's next record is JSON text, which the schema does not read: a dead letter, u3's later ones
    # parked behind it.
    records.insert(20, ("u3", b'{"user": "u3", "seq": 5, "amount": 0}'))
    produce(kafka_broker.bootstrap, topic, records)
    schema = tmp_path / "account.avsc"
    schema.write_text(ACCOUNT)
    flags = ("--value-format", "avro", "--avro-schema", str(schema), "--value-schema",
             "user STRING, seq BIGINT, amount BIGINT", "--on-error", "dead-letter")
    expected = sorted(value["amount"] for value in values if value["user"] != "u3" or value["seq"] < 5)
    batches = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_event", *flags,
                         checkpoint=str(tmp_path / "batches"))
    assert batches.returncode == ExitCode.DEAD_LETTERS, batches.stderr[-3000:]
    in_batches = read_log(str(tmp_path / "log.jsonl"))
    assert sorted(event["amount"] for event in in_batches) == expected
    live = start_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_event", *flags,
                        *REAL_TIME, run="1", checkpoint=str(tmp_path / "live"))
    _wait_for(lambda: len(read_log(str(tmp_path / "log.jsonl"))) >= 2 * len(expected), 240,
              "the records handled in real time", live)
    _stopped(live, ExitCode.DEAD_LETTERS)
    in_real_time = read_log(str(tmp_path / "log.jsonl"))[len(in_batches):]

    def fields(events: list[dict]) -> list[tuple]:
        return sorted((event["user"], event["seq"], event["amount"]) for event in events)

    assert fields(in_real_time) == fields(in_batches)
    for checkpoint in ("batches", "live"):
        assert main(["dead-letters", str(tmp_path / checkpoint)]) == ExitCode.OK
        assert "does not decode as plain Avro by the schema given" in capsys.readouterr().out
