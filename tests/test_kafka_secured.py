"""Streams against the secured listeners of the tests' broker (``tests/kafka.py``: SASL_SSL with
SCRAM-SHA-512 and PLAIN users, SSL with client certificates, a CA of the broker's own), given the
``kafka.*`` options once, as Spark's Kafka connector takes them: micro-batches (Spark's Java
client), real time and ``KafkaSink`` (librdkafka) each reach the cluster with them, the group
follows, nothing secret is printed or written, and a wrong password or CA is one line, exit 4."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from segack.cli import ExitCode
from tests.spark_handlers import KAFKA_CLUSTER_ENV, read_log
from tests.test_kafka import (
    ROOT,
    _wait_for,
    account_events,
    committed_offsets,
    end_offsets,
    environment,
    make_topic,
    produce,
    stream_command,
)
from tests.test_kafka_sink import _outputs, assert_each_event_once_in_order
from tests.test_realtime import _stopped

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _flags(options: dict[str, str]) -> list[str]:
    """``--option NAME=VALUE`` for each ``kafka.*`` option but the servers (the command names them)."""
    return [part for name, value in options.items() if name != "kafka.bootstrap.servers"
            for part in ("--option", f"{name}={value}")]


def _command(tmp_path: Path, options: dict[str, str], topic: str, handler: str, *extra: str) -> list[str]:
    return stream_command(tmp_path, options["kafka.bootstrap.servers"], topic, handler, *_flags(options),
                          *extra)


def _environment(tmp_path: Path, options: dict[str, str], plaintext: str, topic: str) -> dict[str, str]:
    """The command's environment: the ledger sink given the stream's options (a file), the tests'
    own look at the topics over the plaintext listener."""
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(options))
    return {**environment(tmp_path, "0", None, plaintext, topic), KAFKA_CLUSTER_ENV: str(cluster)}


def _input_and_outputs(plaintext: str, topic: str, partitions: int, seed: int) -> list[tuple[str, bytes]]:
    """``topic`` of ``partitions`` holding 600 account records, and the ledger sink's topics; the
    records."""
    make_topic(plaintext, topic, partitions)
    _outputs(plaintext, topic)
    records = account_events(600, users=30, seed=seed)
    produce(plaintext, topic, records)
    return records


def _files_text(directory: Path) -> str:
    """Every file under ``directory`` as text (bytes read as Latin-1): what a secret must not be in."""
    return "\n".join(path.read_bytes().decode("latin-1") for path in directory.rglob("*") if path.is_file())


def _assert_nothing_says(secret: str, directory: Path, *outputs: str) -> None:
    assert all(secret not in output for output in outputs), "a secret in the command's output"
    checkpoint = directory / "checkpoint"
    assert checkpoint.is_dir() and secret not in _files_text(checkpoint), "a secret in the checkpoint"


def test_a_micro_batch_stream_into_a_kafka_sink_over_sasl_ssl_with_sparks_spelling(tmp_path, kafka_broker):
    secured, plaintext = kafka_broker.secured, kafka_broker.bootstrap
    topic, group = "secured-micro-batches", "segack-secured-micro-batches"
    records = _input_and_outputs(plaintext, topic, 3, seed=41)
    options = secured.sasl_options("SCRAM-SHA-512")
    # The login and the CA from a client's properties file, as Kafka users keep them: out of ps's view.
    properties = tmp_path / "client.properties"
    properties.write_text("".join(f"{name.removeprefix('kafka.')}={value}\n"
                                  for name, value in options.items() if name != "kafka.bootstrap.servers"))
    command = stream_command(tmp_path, options["kafka.bootstrap.servers"], topic,
                             "tests.spark_handlers:kafka_ledger_sink", "--kafka-properties", str(properties),
                             "--commit-offsets-to", group)
    assert secured.scram_user[1] not in " ".join(command)
    done = subprocess.run(command,
                          cwd=ROOT, env=_environment(tmp_path, options, plaintext, topic),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    assert_each_event_once_in_order(plaintext, topic, records)
    assert committed_offsets(plaintext, topic, group) == end_offsets(plaintext, topic)
    _assert_nothing_says(secured.scram_user[1], tmp_path, done.stdout, done.stderr)


def test_a_real_time_stream_into_a_kafka_sink_over_sasl_ssl_with_sparks_spelling(tmp_path, kafka_broker):
    secured, plaintext = kafka_broker.secured, kafka_broker.bootstrap
    topic, group = "secured-real-time", "segack-secured-real-time"
    records = _input_and_outputs(plaintext, topic, 2, seed=42)
    options = secured.sasl_options("PLAIN")
    process = subprocess.Popen(
        _command(tmp_path, options, topic, "tests.spark_handlers:kafka_ledger_sink", "--trigger", "real-time",
                 "--commit-interval", "0.5", "--commit-offsets-to", group, "--verbose"),
        cwd=ROOT, env=_environment(tmp_path, options, plaintext, topic), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: committed_offsets(plaintext, topic, group) == end_offsets(plaintext, topic), 240,
              "the group's offsets at the end", process)
    out, err = _stopped(process)
    assert_each_event_once_in_order(plaintext, topic, records)
    _assert_nothing_says(secured.plain_user[1], tmp_path, out, err)


def test_a_real_time_stream_shows_a_client_certificate_with_sparks_spelling(tmp_path, kafka_broker):
    secured, plaintext = kafka_broker.secured, kafka_broker.bootstrap
    topic = "secured-mtls"
    make_topic(plaintext, topic, 1)
    records = account_events(100, users=10, seed=43)
    produce(plaintext, topic, records)
    options = secured.mtls_options()
    log = str(tmp_path / "log.jsonl")
    process = subprocess.Popen(
        _command(tmp_path, options, topic, "tests.spark_handlers:record_kafka", "--trigger", "real-time",
                 "--commit-interval", "0.5"),
        cwd=ROOT, env=environment(tmp_path, "0"), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: len(read_log(log)) >= len(records), 240, "every record handled", process)
    _stopped(process)


@pytest.mark.parametrize("mode", [(), ("--trigger", "real-time")], ids=["micro-batches", "real-time"])
@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_a_wrong_password_or_ca_is_one_line_exit_4_as_the_broker_answers(tmp_path, kafka_broker, mode, wrong):
    secured = kafka_broker.secured
    topic = "secured-refused"
    if wrong == "password":
        options = secured.sasl_options(password="not-" + secured.scram_user[1])
    else:
        options = secured.sasl_options(ca=secured.other_ca)
    began = time.monotonic()
    done = subprocess.run(_command(tmp_path, options, topic, "tests.spark_handlers:record_kafka", *mode),
                          cwd=ROOT, env=environment(tmp_path, "0"), capture_output=True, text=True,
                          timeout=300)
    print(f"refused in {time.monotonic() - began:.1f} s")
    # Said from the client's own error (not a timeout's): it comes as soon as the broker answers.
    said = {"password": "authentication failed", "ca": "certificate"}[wrong]
    assert done.returncode == ExitCode.REFUSED, done.stderr[-3000:]
    # One line of segack's (the JVM adds its own "Using incubator modules" warning).
    lines = [line for line in done.stderr.splitlines()
             if line.strip() and not line.startswith("WARNING: ")]
    assert len(lines) == 1 and said in lines[0].lower(), done.stderr[-3000:]
    assert secured.scram_user[1] not in done.stdout + done.stderr


def test_a_querys_plan_hides_the_key_material_and_logins_its_reader_options_hold(spark, kafka_broker):
    """Spark prints a query's reader options in its plans, its UI and its event logs, hiding those
    that match ``spark.redaction.regex``: segack's session adds a Kafka client's keys and JAAS lines
    to Spark's own pattern."""
    secret_key = "-----BEGIN PRIVATE KEY-----\nMIIEsecretkeymaterial\n-----END PRIVATE KEY-----"
    options = {**kafka_broker.secured.sasl_options(), "kafka.ssl.keystore.type": "PEM",
               "kafka.ssl.keystore.key": secret_key, "kafka.ssl.keystore.certificate.chain": "CHAIN",
               "subscribe": "secured-plan"}
    records = spark.readStream.format("kafka").options(**options).load()
    plan = records._jdf.queryExecution().toString()
    assert "kafka.sasl.jaas.config" in plan and "kafka.ssl.keystore.key" in plan, plan
    assert kafka_broker.secured.scram_user[1] not in plan and "secretkeymaterial" not in plan, plan
