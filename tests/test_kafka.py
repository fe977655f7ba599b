"""``segack stream`` over a real Kafka broker (``tests/kafka.py``): key order inside partitions, offsets
committed back to a consumer group, records whose value does not parse, kills and resumes with
effects exactly once, a broker that goes away, and every refusal in one line."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter import serve_metrics
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.crash_points import ENV
from tests import maven
from tests.spark_handlers import DSN_ENV, KAFKA_ENV, KAFKA_TOPIC_ENV, LOG_ENV, fold, read_log
from tests.test_metrics import sample_value, scrape

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "user STRING, seq BIGINT, amount BIGINT"


def produce(bootstrap: str, topic: str, records: list[tuple[Any, ...]]) -> None:
    """Write ``(key, value)`` records, or ``(key, value, headers)``, to ``topic``: each key to one
    partition, in the list's order (a key of ``None``: a record without one)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for key, value, *headers in records:
        while True:
            try:
                producer.produce(topic, key=None if key is None else key.encode(), value=value,
                                 headers=headers[0] if headers else None)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)


def make_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in created.values():
        future.result(30)


def account_events(count: int, users: int, seed: int, start: dict[str, int] | None = None,
                   ) -> list[tuple[str, bytes]]:
    """``count`` JSON records of ``users`` users, a few of them hot; each user's ``seq`` counts up
    from ``start`` (where an earlier call left it)."""
    rng = random.Random(seed)
    seqs = dict(start or {})
    names = [f"user-{n}" for n in range(users)]
    hot = names[:3]
    records = []
    for _ in range(count):
        user = rng.choice(hot) if rng.random() < 0.3 else rng.choice(names)
        seq = seqs.get(user, 0)
        seqs[user] = seq + 1
        records.append((user, json.dumps({"user": user, "seq": seq, "amount": rng.randint(1, 100)}).encode()))
    if start is not None:
        start.update(seqs)
    return records


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "segack-tests-inspector"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {partition: consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1]
                for partition in partitions}
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        deadline = time.monotonic() + 60
        while True:
            try:
                found = consumer.committed([TopicPartition(topic, partition) for partition in partitions],
                                           timeout=30)
                return {where.partition: where.offset for where in found if where.offset >= 0}
            except KafkaException as error:
                # A group's coordinator moves or loads while the broker starts: ask again.
                moving = error.args[0].code() in {KafkaError.NOT_COORDINATOR,
                                                  KafkaError.COORDINATOR_NOT_AVAILABLE,
                                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
                if not (moving or error.args[0].retriable()) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def stream_command(tmp_path: Path, bootstrap: str, topic: str, handler: str, *extra: str,
                   checkpoint: str | None = None, run: str = "0", dsn: str | None = None) -> list[str]:
    command = [sys.executable, "-m", "segack", "stream", "--format", "kafka",
               "--option", f"kafka.bootstrap.servers={bootstrap}", "--option", f"subscribe={topic}",
               "--value-schema", SCHEMA,
               "--key", "key", "--order", "offset", "--handler", handler,
               "--checkpoint", checkpoint or str(tmp_path / "checkpoint"),
               "--conf", "spark.jars=" + ",".join(map(str, maven.spark_kafka())), *extra]
    return command


def environment(tmp_path: Path, run: str, dsn: str | None = None, bootstrap: str | None = None,
                topic: str | None = None) -> dict[str, str]:
    found = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": run})
    if bootstrap is not None and topic is not None:
        found.update({KAFKA_ENV: bootstrap, KAFKA_TOPIC_ENV: topic})
    if dsn is not None:
        found[DSN_ENV] = dsn
    return found


def run_stream(tmp_path: Path, bootstrap: str, topic: str, handler: str, *extra: str, run: str = "0",
               checkpoint: str | None = None, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    command = stream_command(tmp_path, bootstrap, topic, handler, *extra, checkpoint=checkpoint)
    return subprocess.run(command, cwd=ROOT, env=environment(tmp_path, run, dsn, bootstrap, topic),
                          capture_output=True,
                          text=True, timeout=600)


def start_stream(tmp_path: Path, bootstrap: str, topic: str, handler: str, *extra: str, run: str = "0",
                 dsn: str | None = None, checkpoint: str | None = None,
                 variables: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = stream_command(tmp_path, bootstrap, topic, handler, *extra, checkpoint=checkpoint)
    return subprocess.Popen(command, cwd=ROOT, env={**environment(tmp_path, run, dsn, bootstrap, topic),
                                                    **(variables or {})},
                            start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_each_key_in_offset_order(handled: list[dict], records: list[tuple[str, bytes]]) -> None:
    """Every record handled, once per run at least, each key's first handlings in ``seq`` order."""
    expected: dict[str, int] = {}
    for key, _ in records:
        expected[key] = expected.get(key, 0) + 1
    seen: dict[str, int] = {}
    for event in handled:
        # A record handled again after a kill comes back in order from where its key was recorded.
        assert event["seq"] <= seen.get(event["user"], 0), f"{event['user']} {event['seq']} skipped ahead"
        if event["seq"] == seen.get(event["user"], 0):
            seen[event["user"]] = event["seq"] + 1
    assert seen == expected


@pytest.mark.versions
def test_a_topic_is_handled_in_offset_order_per_key_and_the_group_sees_every_partition_done(
        tmp_path, kafka_broker, capsys):
    topic = "accounts-drained"
    make_topic(kafka_broker.bootstrap, topic, 6)
    records = account_events(3000, users=200, seed=1)
    produce(kafka_broker.bootstrap, topic, records)
    done = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                      "--commit-offsets-to", "segack-drained", "--segments", "3",
                      "--option", "maxOffsetsPerTrigger=1000")
    assert done.returncode == 0, done.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert len(handled) == len(records)
    assert_each_key_in_offset_order(handled, records)
    assert committed_offsets(kafka_broker.bootstrap, topic, "segack-drained") == end_offsets(
        kafka_broker.bootstrap, topic)
    batches = [line for line in done.stdout.splitlines() if line.startswith("segack stream: batch ")]
    assert len(batches) >= 3, done.stdout  # bounded micro-batches
    assert "the input is drained" in done.stdout and "3,000 events handled" in done.stdout
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    status = capsys.readouterr().out
    assert f"{topic}/0" in status and "committed" in status and "lag 0" in status, status
    with serve_metrics(str(tmp_path / "checkpoint"), 0) as server:
        samples = scrape(server.port)
    assert {int(labels["partition"]): found for labels, found in samples["segack_kafka_next_offset"]
            if labels["topic"] == topic} == end_offsets(kafka_broker.bootstrap, topic)
    assert {found for _, found in samples["segack_kafka_lag_records"]} == {0}
    assert sample_value(samples, "segack_events_done_total") == 3000
    assert sample_value(samples, "segack_events_handled_total") == 3000
    assert sample_value(samples, "segack_stream_completed_batch") == int(batches[-1].split()[3].rstrip(":"))
    assert sample_value(samples, "segack_stream_batch_duration_seconds") > 0
    [(labels, _)] = samples["segack_run_info"]
    assert labels["kind"] == "stream" and labels["state"] == "stopped"  # a stream has no end


def _group_command_lags(broker, group: str, topic: str) -> dict[int, int]:
    """Each partition's lag as Kafka's own consumer group command describes it."""
    described = subprocess.run(
        ["java", "-cp", broker.classpath, "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", broker.bootstrap, "--describe", "--group", group],
        capture_output=True, text=True, timeout=120, check=True).stdout
    lines = [line.split() for line in described.splitlines() if line.strip()]
    header = lines[0]
    rows = [dict(zip(header, line, strict=False)) for line in lines[1:] if line[0] == group]
    return {int(row["PARTITION"]): int(row["LAG"]) for row in rows if row["TOPIC"] == topic}


def _metric_by_partition(samples, name: str, topic: str) -> dict[int, float]:
    return {int(labels["partition"]): found for labels, found in samples.get(name, [])
            if labels["topic"] == topic}


@pytest.mark.command
def test_the_lag_is_read_from_the_broker_while_the_stream_waits_and_agrees_with_kafkas_group_command(
        tmp_path, kafka_broker, capsys):
    """Records written while a micro-batch waits for its trigger count in the lag at once (within the
    broker's read every few seconds): /metrics, the status and Kafka's own group command agree."""
    from tests.ports import free_ports

    topic, group = "accounts-lag", "segack-lag"
    bootstrap = kafka_broker.bootstrap
    make_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, account_events(600, users=30, seed=11))
    [port] = free_ports(1)
    # Spark fires an interval's micro-batches at multiples of it since 1970 (10min: at :00, :10, ...;
    # CI once saw a second micro-batch at 13:30 commit the group mid-test); 100000 min: next on
    # 2027-01-15, then every 69 days.
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", "--trigger",
                           "100000min", "--commit-offsets-to", group, "--metrics-port", str(port))
    try:
        _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 180,
                  "the first micro-batch committed", process)
        produce(bootstrap, topic, account_events(450, users=30, seed=12))
        ends, committed = end_offsets(bootstrap, topic), committed_offsets(bootstrap, topic, group)
        behind = {partition: ends[partition] - committed[partition] for partition in ends}
        assert sum(behind.values()) == 450
        _wait_for(lambda: _metric_by_partition(scrape(port), "segack_kafka_lag_records", topic) == behind, 30,
                  "the lag of the records written since the micro-batch", process)
        samples = scrape(port)
        assert _metric_by_partition(samples, "segack_kafka_end_offset", topic) == ends
        assert _metric_by_partition(samples, "segack_kafka_committed_offset", topic) == committed
        assert _metric_by_partition(samples, "segack_kafka_next_offset", topic) == committed
        assert time.time() - sample_value(samples, "segack_kafka_end_offsets_timestamp_seconds") < 60
        assert _group_command_lags(kafka_broker, group, topic) == behind
        assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
        status = capsys.readouterr().out
        assert "end offsets read from Kafka at" in status, status
        for partition, lag in behind.items():
            assert f"{topic}/{partition:<5} next offset {committed[partition]:,} (committed), " \
                   f"end {ends[partition]:,}, lag {lag:,}" in status, status
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
    assert process.returncode == ExitCode.OK, err


def test_more_spark_partitions_than_kafka_partitions_keep_each_keys_order(tmp_path, kafka_broker):
    topic = "accounts-split"
    make_topic(kafka_broker.bootstrap, topic, 2)
    records = account_events(2000, users=50, seed=2)
    produce(kafka_broker.bootstrap, topic, records)
    done = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                      "--option", "minPartitions=12", "--segments", "4", "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert len(handled) == len(records)
    assert_each_key_in_offset_order(handled, records)


def _commit_group(bootstrap: str, topic: str, group: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        wanted = [TopicPartition(topic, partition, offset) for partition, offset in offsets.items()]
        consumer.commit(offsets=wanted, asynchronous=False)
    finally:
        consumer.close()


def _handled_once(handled: list[dict]) -> set[tuple[str, int]]:
    """The records handled, as (user, seq), each exactly once."""
    found = [(event["user"], event["seq"]) for event in handled]
    assert len(found) == len(set(found)), "a record was handled twice"
    return set(found)


@pytest.mark.faults
@pytest.mark.command
def test_a_new_stream_skips_nothing_the_topic_holds_unless_told_and_then_counts_what_it_passed_over(
        tmp_path, kafka_broker, capsys):
    """The README's command, with no starting option, handles every record a topic holds (the
    docs' Kafka example, run by tests/test_doc_examples.py); here, what starts elsewhere."""
    topic = "accounts-start"
    make_topic(kafka_broker.bootstrap, topic, 3)
    users: dict[str, int] = {}
    produce(kafka_broker.bootstrap, topic, account_events(300, users=20, seed=11, start=users))
    handler = "tests.spark_handlers:record_kafka"
    # startingOffsets=latest: nothing of what is there, and the run says how much that was.
    latest = tmp_path / "latest"
    skipped = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, "--option",
                         "startingOffsets=latest", checkpoint=str(latest), run="latest")
    assert skipped.returncode == ExitCode.OK, skipped.stderr
    assert "segack stream: started at a new query, from its startingOffsets, passing over 300 records the " \
           "topic held before it" in skipped.stdout, skipped.stdout
    # The query has its position now: the next run, without the option, handles what came since.
    produce(kafka_broker.bootstrap, topic, account_events(50, users=20, seed=12, start=users))
    later = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, checkpoint=str(latest), run="latest")
    assert later.returncode == ExitCode.OK, later.stderr
    assert [event["run"] for event in read_log(str(tmp_path / "log.jsonl"))].count("latest") == 50
    assert main(["status", str(latest)]) == ExitCode.OK
    assert "passing over 300 records it held before" in capsys.readouterr().out
    # A starting option that skips, given to a checkpoint with a position: refused, nothing changed.
    before = _checkpoint_files(latest)
    again = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, "--option",
                       "startingOffsets=latest", checkpoint=str(latest), run="latest")
    assert again.returncode == ExitCode.REFUSED, again.stderr
    [line] = [line for line in again.stderr.splitlines() if line.startswith("segack")]
    assert line.startswith(f"segack stream: startingOffsets applies only to a new query, and the query of "
                           f"checkpoint {latest} has a position already (micro-batch "), line
    assert line.endswith("); leave it out, or use a new checkpoint"), line
    assert _checkpoint_files(latest) == before
    # A new checkpoint committing to a group that has offsets starts at them.
    _commit_group(kafka_broker.bootstrap, topic, "segack-start", {0: 40, 1: 40, 2: 40})
    grouped = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, "--commit-offsets-to",
                         "segack-start", checkpoint=str(tmp_path / "grouped"), run="grouped")
    assert grouped.returncode == ExitCode.OK, grouped.stderr
    assert {(event["partition"], event["offset"]) for event in read_log(str(tmp_path / "log.jsonl"))
            if event["run"] == "grouped"} == {(partition, offset) for partition, end in end_offsets(
                kafka_broker.bootstrap, topic).items() for offset in range(40, end)}
    assert main(["status", str(tmp_path / "grouped")]) == ExitCode.OK
    assert "a new query, from consumer group segack-start's committed offsets" in capsys.readouterr().out


@pytest.mark.faults
@pytest.mark.command
def test_spark_checkpoint_lost_restarts_the_query_from_segacks_record_losing_and_repeating_nothing(
        tmp_path, kafka_broker, capsys):
    topic = "accounts-restart"
    make_topic(kafka_broker.bootstrap, topic, 3)
    users: dict[str, int] = {}
    records = account_events(600, users=30, seed=21, start=users)
    produce(kafka_broker.bootstrap, topic, records)
    handler = "tests.spark_handlers:record_kafka"
    checkpoint = tmp_path / "checkpoint"
    first = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, "--option",
                       "maxOffsetsPerTrigger=200")
    assert first.returncode == ExitCode.OK, first.stderr
    more = account_events(300, users=30, seed=22, start=users)
    produce(kafka_broker.bootstrap, topic, more)
    shutil.rmtree(checkpoint / "stream")
    # The restarted query's first run dies once the restart is recorded, before Spark's new query
    # wrote anything: the next run restarts from the same record, not from the earliest offsets.
    # That one dies as its first micro-batch starts, before segack saved any of it: the next run
    # must go on with the new query, not refuse it as another one.
    command = stream_command(tmp_path, kafka_broker.bootstrap, topic, handler)
    for point in ("after-state@1", "batch-start"):
        died = subprocess.run(command, cwd=ROOT, env={**environment(tmp_path, "died"), ENV: point},
                              capture_output=True, text=True, timeout=600)
        assert died.returncode == -9, (point, died.stderr[-3000:])
    restarted = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, run="restarted")
    assert restarted.returncode == ExitCode.OK, restarted.stderr
    assert "300 events handled" in restarted.stdout, restarted.stdout
    assert main(["status", str(checkpoint)]) == ExitCode.OK
    status = capsys.readouterr().out
    assert "segack's record of micro-batch" in status and "Spark's checkpoint of the query was gone" in status
    last = account_events(100, users=30, seed=23, start=users)
    produce(kafka_broker.bootstrap, topic, last)
    after = run_stream(tmp_path, kafka_broker.bootstrap, topic, handler, run="after")
    assert after.returncode == ExitCode.OK, after.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert len(_handled_once(handled)) == 1000
    assert_each_key_in_offset_order(handled, records + more + last)
    assert [event["run"] for event in handled].count("restarted") == 300


def _checkpoint_files(path: Path) -> dict[str, bytes]:
    return {str(file.relative_to(path)): file.read_bytes()
            for file in sorted(path.rglob("*")) if file.is_file()}


@pytest.mark.command
def test_what_it_cannot_read_is_refused_in_one_line_before_any_event(tmp_path, kafka_broker):
    topic = "accounts-refusals"
    make_topic(kafka_broker.bootstrap, topic, 1)
    produce(kafka_broker.bootstrap, topic, account_events(10, users=3, seed=5))
    checkpoint = tmp_path / "checkpoint"
    # A checkpoint with a history: every refusal leaves it byte for byte as it was.
    done = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka")
    assert done.returncode == 0, done.stderr
    before = _checkpoint_files(checkpoint)
    handled = len(read_log(str(tmp_path / "log.jsonl")))
    cases = [
        (["--option", "subscribe=no-such-topic"], "has no topic 'no-such-topic'", ExitCode.REFUSED),
        (["--conf", "spark.jars="], "this Spark session has no Kafka connector: add it with --conf "
                                    "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:",
         ExitCode.REFUSED),
        # A flag only Spark can read is still a flag: exit 2, as argparse's own refusals.
        (["--value-schema", "user STRING, seq"], "segack stream: --value-schema 'user STRING, seq' is not a "
                                                 "schema Spark can read", ExitCode.USAGE),
        # Spark reads option names without regard to case, and so does segack.
        (["--option", "startingoffsets=latest"], "startingOffsets applies only to a new query",
         ExitCode.REFUSED),
    ]
    for extra, reason, code in cases:
        refused = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                             *extra)
        lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
        assert refused.returncode == code, (extra, refused.stderr)
        assert len(lines) == 1 and reason in lines[0], (extra, lines)
        assert "Traceback" not in refused.stderr
    assert _checkpoint_files(checkpoint) == before
    assert len(read_log(str(tmp_path / "log.jsonl"))) == handled


@pytest.mark.parametrize(("servers", "schema", "options", "reason"), [
    ("closed", SCHEMA, {}, "cannot reach Kafka at 127.0.0.1:"),
    ("broker", "user STRING, seq", {}, "--value-schema 'user STRING, seq' is not a schema Spark can read"),
    ("broker", "offset BIGINT", {}, "--value-schema names 'offset', a column every record has already"),
    ("broker", "", {}, "--value-schema '' must name the value's fields with their types"),
    ("broker", SCHEMA, {"failondataloss": "False"}, "failOnDataLoss=false makes Spark pass over records"),
    ("broker", SCHEMA, {"failOnDataLoss": False}, "failOnDataLoss=false makes Spark pass over records"),
    # Spark reads option names without regard to case: one name twice is two values for one option.
    ("broker", SCHEMA, {"startingOffsets": "latest", "STARTINGOFFSETS": "earliest"},
     "option 'STARTINGOFFSETS' is given twice (also as 'startingOffsets')"),
], ids=["unreachable", "not-ddl", "clash", "empty", "data-loss", "data-loss-bool", "twice"])
def test_kafka_stream_refuses_servers_and_schemas_it_cannot_use(spark, kafka_broker, servers, schema, options,
                                                                reason):
    from segack.spark_adapter import InputError, OptionError, kafka_stream

    bootstrap = kafka_broker.bootstrap if servers == "broker" else f"127.0.0.1:{_closed_port()}"
    with pytest.raises(InputError if servers == "closed" else OptionError) as refused:
        given = {"kafka.bootstrap.servers": bootstrap, "subscribe": "accounts-refusals", **options}
        kafka_stream(spark, given, schema)
    assert str(refused.value).startswith(reason)
    assert "\n" not in str(refused.value)


def _closed_port() -> int:
    from tests.ports import free_port

    return free_port()  # nothing listens there once the probe has closed


@pytest.mark.handlers
def test_a_value_that_does_not_parse_is_a_dead_letter_with_its_keys_later_records_until_retried(
        tmp_path, kafka_broker, capsys):
    topic = "accounts-unparsed"
    make_topic(kafka_broker.bootstrap, topic, 2)
    good = account_events(400, users=20, seed=6)
    # user-1's record at seq 10 is not JSON; its later records wait behind it.
    bad_at = next(index for index, (key, value) in enumerate(good)
                  if key == "user-1" and json.loads(value)["seq"] == 10)
    records = [*good[:bad_at], ("user-1", b"not json at all"), *good[bad_at:]]
    produce(kafka_broker.bootstrap, topic, records)
    first = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                       "--on-error", "dead-letter")
    assert first.returncode == ExitCode.DEAD_LETTERS, first.stderr
    later = sum(1 for key, _ in good[bad_at:] if key == "user-1")
    assert f"{later + 1:,} events set aside as dead letters" in first.stdout, first.stdout
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert {event["seq"] for event in handled if event["user"] == "user-1"} == set(range(10))
    assert len(handled) == len(good) - later
    assert main(["dead-letters", str(tmp_path / "checkpoint")]) == ExitCode.OK
    listed = capsys.readouterr().out
    assert "user-1" in listed and "UnparsedValueError" in listed and "not json at all" in listed, listed
    # The fix: a handler that takes records whose value did not parse, then the dead letters retried.
    retried = run_stream(tmp_path, kafka_broker.bootstrap, topic,
                         "tests.spark_handlers:record_kafka_unparsed", "--retry-dead-letters", run="fixed")
    assert retried.returncode == ExitCode.OK, retried.stderr
    again = [event for event in read_log(str(tmp_path / "log.jsonl")) if event["run"] == "fixed"]
    assert [event["seq"] for event in again] == [None, *range(10, 10 + later)]
    # The record that did not parse has no fields (its user is null), but its key is user-1's.
    assert {event["key"] for event in again} == {"user-1"} and again[0]["user"] is None


@pytest.mark.handlers
def test_records_with_no_key_no_order_or_a_field_missing_are_dead_letters_until_a_handler_takes_them(
        tmp_path, kafka_broker, capsys):
    topic = "accounts-unorderable"
    make_topic(kafka_broker.bootstrap, topic, 1)

    def value(**fields):
        return json.dumps({"amount": 1, **fields}).encode()

    produce(kafka_broker.bootstrap, topic, [
        ("a", value(user="a", seq=0)), ("b", value(user="b", seq=0)), (None, value(user="n", seq=0)),
        ("d", value(user="d", seq=0)), ("b", value(user="b", seq=None)), ("a", value(user="a", seq=1)),
        ("d", value(user="d", Seq=1)), (None, value(user="n", seq=1)), ("b", value(user="b", seq=2)),
        ("d", value(user="d")), ("e", b""),
    ])
    first = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                       "--order", "seq", "--on-error", "dead-letter")
    assert first.returncode == ExitCode.DEAD_LETTERS, first.stderr
    # b's null order sorts first and parks b; the records without a key are one key, refused; d's
    # values that lack seq (one has Seq) did not parse, and sort first too; so did e's empty value.
    assert "9 events set aside as dead letters" in first.stdout, first.stdout
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert [(event["key"], event["seq"]) for event in handled] == [("a", 0), ("a", 1)]
    assert main(["dead-letters", str(tmp_path / "checkpoint")]) == ExitCode.OK
    listed = capsys.readouterr().out
    for said in ("UnorderableEventError", "its order ('seq') is null", "its key ('key') is null",
                 "UnparsedValueError", "(it lacks 'seq')"):
        assert said in listed, listed
    retried = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka_any",
                         "--order", "seq", "--retry-dead-letters", run="fixed")
    assert retried.returncode == ExitCode.OK, retried.stderr
    again: dict[str | None, list] = {}
    for event in read_log(str(tmp_path / "log.jsonl")):
        if event["run"] == "fixed":
            again.setdefault(event["key"], []).append(event["seq"])
    assert again == {"b": [None, 0, 2], None: [0, 1], "d": [None, None, 0], "e": [None]}


def _drained_once(tmp_path: Path, bootstrap: str, topic: str, group: str, records: int) -> None:
    """A topic of one partition holding ``records`` records, streamed to its end once, committing
    to ``group``."""
    make_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, account_events(records, users=5, seed=1))
    first = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka",
                       "--commit-offsets-to", group)
    assert first.returncode == ExitCode.OK, first.stderr


@pytest.mark.faults
def test_records_deleted_before_the_stream_read_them_stop_it_naming_them_and_nothing_is_committed(
        tmp_path, kafka_broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, group = "accounts-lost", "segack-lost"
    _drained_once(tmp_path, kafka_broker.bootstrap, topic, group, 50)
    produce(kafka_broker.bootstrap, topic, account_events(50, users=5, seed=2))
    # Retention, as Kafka applies it: the log's start moves past records no consumer has read.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 80)]).values():
        future.result(30)
    for run in ("1", "2"):  # the same answer each time: nothing is passed over by running again
        lost = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                          "--commit-offsets-to", group, run=run)
        lines = [line for line in lost.stderr.splitlines() if line.startswith("segack")]
        assert lost.returncode == ExitCode.FAILED, lost.stderr
        assert len(lines) == 1 and lines[0].startswith(
            "segack stream: Kafka no longer has records this micro-batch must read (Could not read records "
            f"in offset [50, 100) for topic partition {topic}-0)"), lines
        assert "Traceback" not in lost.stderr
    assert len(read_log(str(tmp_path / "log.jsonl"))) == 50
    assert committed_offsets(kafka_broker.bootstrap, topic, group) == {0: 50}


@pytest.mark.faults
def test_partitions_added_while_a_stream_runs_stop_it_before_a_key_spans_two(tmp_path, kafka_broker):
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic, group = "accounts-grown", "segack-grown"
    _drained_once(tmp_path, kafka_broker.bootstrap, topic, group, 40)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 3)]).values():
        future.result(30)
    # Kafka's partitioner now places each key by three partitions: a user's records may change partition.
    later = account_events(60, users=5, seed=2)
    produce(kafka_broker.bootstrap, topic, later)
    refused = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                         "--commit-offsets-to", group, run="1")
    lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    said = ("micro-batch 1 reads partitions 1, 2 of topic accounts-grown, which the stream did not have "
            "when micro-batch 0 ended")
    assert len(lines) == 1 and said in lines[0], lines
    assert len(read_log(str(tmp_path / "log.jsonl"))) == 40
    assert committed_offsets(kafka_broker.bootstrap, topic, group) == {0: 40}
    # The way on that the line gives: a new checkpoint, from the group's offsets.
    again = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                       "--commit-offsets-to", group, run="2", checkpoint=str(tmp_path / "checkpoint-2"))
    assert again.returncode == ExitCode.OK, again.stderr
    handled = [event for event in read_log(str(tmp_path / "log.jsonl")) if event["run"] == "2"]
    assert len(handled) == len(later)


class _Producer:
    """Writes account records to ``topic`` while a test runs, a batch every tenth of a second, and
    remembers where each landed: ``(user, seq) -> (partition, offset)``."""

    def __init__(self, bootstrap: str, topic: str, total: int, seed: int) -> None:
        import threading

        self.records = account_events(total, users=300, seed=seed)
        self.bootstrap, self.topic = bootstrap, topic
        self.where: dict[tuple[str, int], tuple[int, int]] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                             "enable.idempotence": True})

        def landed(error, message) -> None:
            assert error is None, error
            body = json.loads(message.value())
            self.where[(body["user"], body["seq"])] = (message.partition(), message.offset())

        for start in range(0, len(self.records), 100):
            for key, value in self.records[start:start + 100]:
                producer.produce(self.topic, key=key.encode(), value=value, on_delivery=landed)
            producer.poll(0)
            time.sleep(0.1)
        producer.flush(60)

    def below(self, committed: dict[int, int]) -> set[tuple[str, int]]:
        """The records below each partition's committed offset."""
        return {pair for pair, (partition, offset) in self.where.items()
                if offset < committed.get(partition, 0)}


def _ledger(dsn: str) -> tuple[list[tuple[str, int]], dict[str, int]]:
    import psycopg

    with psycopg.connect(dsn) as db:
        return ([tuple(row) for row in db.execute("SELECT user_id, seq FROM ledger ORDER BY id")],
                dict(db.execute("SELECT user_id, balance FROM balances").fetchall()))


def assert_each_record_applied_once_in_order(dsn: str, records: list[tuple[str, bytes]]) -> None:
    """The ledger holds each of ``records`` once, each user's in ``seq`` order, and every balance is
    the sequential fold."""
    assert_once_in_order(*_ledger(dsn), records)


def assert_once_in_order(rows: list[tuple[str, int]], balances: dict[str, int],
                         records: list[tuple[str, bytes]]) -> None:
    """``rows`` (``(user, seq)`` as applied) hold each of ``records`` once, each user's in ``seq``
    order, and ``balances`` (each user's last) are the sequential fold."""
    pairs = [(key, json.loads(value)["seq"]) for key, value in records]
    assert len(rows) == len(set(rows)) == len(pairs) and set(rows) == set(pairs)
    last: dict[str, int] = {}
    for user, seq in rows:
        assert seq == last.get(user, -1) + 1, f"{user} {seq} applied after {last.get(user)}"
        last[user] = seq
    expected: dict[str, int] = {}
    for user, seq in sorted(pairs):
        expected[user] = fold(expected.get(user, 0), seq)
    assert balances == expected


def _kill(process: subprocess.Popen[str]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait_for(condition, seconds: float, what: str, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            _, err = process.communicate()
            raise AssertionError(f"the stream ended while waiting for {what}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.faults
@pytest.mark.sinks
def test_a_stream_killed_thrice_rescaled_and_split_while_records_arrive_applies_each_once(
        tmp_path, kafka_broker, pg_database):
    topic, group = "accounts-exactly-once", "segack-exactly-once"
    make_topic(kafka_broker.bootstrap, topic, 6)
    producer = _Producer(kafka_broker.bootstrap, topic, 12_000, seed=7)
    options = ["--trigger", "1s", "--batch-size", "200", "--concurrency", "8", "--commit-offsets-to", group,
               "--option", "maxOffsetsPerTrigger=1500", "--flush-interval", "1"]
    rng = random.Random(8)
    for run, segments in enumerate([3, 5, 2]):
        applied = len(_ledger(pg_database)[0])
        process = start_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:ledger_sink",
                               *options, "--segments", str(segments), run=str(run), dsn=pg_database)
        _wait_for(lambda applied=applied: len(_ledger(pg_database)[0]) > applied + 300, 300,
                  "records applied", process)
        if run == 1:
            assert main(["split", str(tmp_path / "checkpoint"), "0"]) == ExitCode.OK
            split_at = len(_ledger(pg_database)[0])
            _wait_for(lambda split_at=split_at: len(_ledger(pg_database)[0]) > split_at + 500, 300,
                      "records after the split", process)
        time.sleep(rng.uniform(0.2, 1.5))
        assert process.poll() is None, "the stream ended before its kill: the test proves nothing"
        _kill(process)
        # Never ahead: every record below a committed offset is in the ledger.
        committed = committed_offsets(kafka_broker.bootstrap, topic, group)
        assert producer.below(committed) <= set(_ledger(pg_database)[0])
    producer.thread.join(120)
    drained = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:ledger_sink",
                         "--batch-size", "200", "--concurrency", "8", "--commit-offsets-to", group,
                         "--segments", "4", run="drain", dsn=pg_database)
    assert drained.returncode == 0, drained.stderr
    assert_each_record_applied_once_in_order(pg_database, producer.records)
    assert committed_offsets(kafka_broker.bootstrap, topic, group) == end_offsets(kafka_broker.bootstrap,
                                                                                   topic)


@pytest.mark.faults
@pytest.mark.command
def test_sigterm_stops_at_the_end_of_a_micro_batch_and_the_next_run_repeats_nothing(tmp_path,
                                                                                     kafka_broker):
    topic = "accounts-sigterm"
    make_topic(kafka_broker.bootstrap, topic, 3)
    records = account_events(6000, users=100, seed=9)
    produce(kafka_broker.bootstrap, topic, records)
    process = start_stream(tmp_path, kafka_broker.bootstrap, topic,
                           "tests.spark_handlers:record_kafka_slowly", "--trigger", "1s",
                           "--option", "maxOffsetsPerTrigger=500", "--commit-offsets-to", "segack-sigterm")
    log = str(tmp_path / "log.jsonl")
    _wait_for(lambda: len(read_log(log)) > 600, 300, "a micro-batch or two", process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == ExitCode.OK, err
    assert "segack stream: stopping at the end of the micro-batch under way" in err
    assert "stopped as asked" in out
    stopped_at = len(read_log(log))
    assert stopped_at < len(records), "the stream had read everything: the stop proves nothing"
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["stream"]["batch"] is None  # stopped at a commit: no batch in progress
    # The last complete micro-batch's offsets reached the group before the command exited.
    [done] = state.settings["stream"]["completed_end"]
    assert committed_offsets(kafka_broker.bootstrap, topic, "segack-sigterm") == {
        int(partition): offset for partition, offset in done[topic].items()}
    # Each batch's line counts its records once.
    counted = sum(int(line.split()[4].replace(",", "")) for line in out.splitlines()
                  if line.startswith("segack stream: batch "))
    assert counted == stopped_at, out
    finished = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                          run="1")
    assert finished.returncode == 0, finished.stderr
    handled = read_log(log)
    assert len(handled) == len(records)  # nothing repeated, nothing lost
    assert_each_key_in_offset_order(handled, records)



@pytest.mark.streams
def test_a_stop_past_the_stop_timeout_ends_the_micro_batch_at_a_flush_and_the_next_run_finishes_it(
        tmp_path, kafka_broker):
    """SIGTERM in the middle of a micro-batch that would take a minute more: --stop-timeout 2 later
    its tasks finish the calls in flight, save, and the command exits 0, the micro-batch in
    progress and the group untouched; the next run handles the rest. A plain handler called one
    event at a time sees each record once: no call was cut off, none repeated."""
    bootstrap, topic, group = kafka_broker.bootstrap, "accounts-stop-timeout", "segack-stop-timeout"
    make_topic(bootstrap, topic, 2)
    records = account_events(3000, users=60, seed=12)
    produce(bootstrap, topic, records)
    log = str(tmp_path / "log.jsonl")
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka_in_flight",
                           "--segments", "2", "--stop-timeout", "2",
                           "--commit-offsets-to", group)
    _wait_for(lambda: len(read_log(log)) > 200, 300, "the micro-batch under way", process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == ExitCode.OK, err[-3000:]
    stopped_at = len(read_log(log))
    assert stopped_at < len(records) - 1000, "the micro-batch was nearly done: the stop proves nothing"
    assert ("segack stream: micro-batch 0 still ran 2 s after the stop (--stop-timeout): its tasks finished "
            "their calls in flight and saved its progress; the next run finishes it") in out, out
    assert f"stopped as asked: 0 micro-batches, {stopped_at:,} events handled, no micro-batch complete" in out
    # Every call started was finished and recorded: none was cut off.
    started = read_log(log + ".started")
    assert sorted(map(json.dumps, started)) == sorted(
        json.dumps({"user": event["user"], "seq": event["seq"]}) for event in read_log(log))
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["stream"]["batch"]["id"] == 0 and state.settings["status"] == "stopped"
    assert state.tokens.done == stopped_at  # every call finished is saved
    assert committed_offsets(bootstrap, topic, group) == {}  # no micro-batch complete: nothing committed
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    finished = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka",
                          "--commit-offsets-to", group, run="1")
    assert finished.returncode == ExitCode.OK, finished.stderr
    handled = read_log(log)
    assert len(handled) == len(records), len(handled)  # nothing repeated, nothing lost
    assert_each_key_in_offset_order(handled, records)
    assert committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic)


@pytest.mark.faults
@pytest.mark.command
def test_a_micro_batch_run_again_after_a_crash_is_reported_once_at_its_size(tmp_path, kafka_broker):
    """The driver dies in the middle of micro-batch 0; the next run goes on with it (Spark delivers
    it again, and segack reads it twice: to check what was done, then to handle the rest) and
    reports it at its size, not at what Spark read."""
    topic = "accounts-counted"
    make_topic(kafka_broker.bootstrap, topic, 2)
    records = account_events(2000, users=40, seed=31)
    produce(kafka_broker.bootstrap, topic, records)
    options = ("--option", "maxOffsetsPerTrigger=1000", "--flush-interval", "0.1")
    crashed = subprocess.run(stream_command(tmp_path, kafka_broker.bootstrap, topic,
                                            "tests.spark_handlers:record_kafka_slowly", *options),
                             cwd=ROOT, env={**environment(tmp_path, "0"), ENV: "after-state@3"},
                             capture_output=True, text=True, timeout=600)
    assert crashed.returncode == -9, crashed.stderr
    recorded = CheckpointStore(str(tmp_path / "checkpoint")).load().settings["stream"]
    assert recorded["batch"]["id"] == 0 and recorded["completed_batch"] == -1, recorded
    resumed = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                         *options, run="1")
    assert resumed.returncode == ExitCode.OK, resumed.stderr
    batches = [line.split() for line in resumed.stdout.splitlines()
               if line.startswith("segack stream: batch ")]
    assert [words[3] for words in batches] == ["0:", "1:", "2:"], batches
    assert sum(int(words[4].replace(",", "")) for words in batches) == len(records), batches



@pytest.mark.faults
@pytest.mark.command
def test_a_group_commit_that_fails_is_said_and_made_by_the_next_run_without_a_new_batch(
        tmp_path, kafka_broker, capsys):
    """A consumer of the group is active, so Kafka refuses segack's commits to it: the run says so
    and status does not call the offsets committed; the next run, with nothing new to read, commits
    them once the group is free."""
    import threading

    from confluent_kafka import Consumer

    topic, group = "accounts-busy-group", "segack-busy"
    make_topic(kafka_broker.bootstrap, topic, 1)
    produce(kafka_broker.bootstrap, topic, account_events(200, users=10, seed=41))
    member = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group,
                       "enable.auto.commit": False, "auto.offset.reset": "latest"})
    member.subscribe([topic])
    joined, leave = threading.Event(), threading.Event()

    def poll() -> None:
        while not leave.is_set():
            member.poll(0.2)
            if member.assignment():
                joined.set()
        member.close()

    polling = threading.Thread(target=poll, daemon=True)
    polling.start()
    assert joined.wait(60), "the group's member never joined"
    busy = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                      "--commit-offsets-to", group)
    leave.set()
    polling.join(30)
    assert busy.returncode == ExitCode.OK, busy.stderr
    assert (f"segack stream: the offsets of micro-batch 0 are not committed to consumer group {group}: the "
            f"commit failed") in busy.stderr, busy.stderr
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    assert f"{topic}/0     next offset 200 (done, not committed yet)" in capsys.readouterr().out
    free = run_stream(tmp_path, kafka_broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                      "--commit-offsets-to", group, run="1")
    assert free.returncode == ExitCode.OK, free.stderr
    assert "not committed" not in free.stderr and "0 events handled" in free.stdout, free.stdout
    assert committed_offsets(kafka_broker.bootstrap, topic, group) == {0: 200}
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    assert f"{topic}/0     next offset 200 (committed)" in capsys.readouterr().out

@pytest.mark.faults
@pytest.mark.claims
def test_a_broker_gone_in_the_middle_of_a_stream_loses_and_repeats_nothing(tmp_path):
    from tests.kafka import kafka_broker

    with kafka_broker(tmp_path / "broker") as broker:
        topic = "accounts-broker-gone"
        make_topic(broker.bootstrap, topic, 2)
        first, second = account_events(1500, users=40, seed=10), []
        produce(broker.bootstrap, topic, first)
        process = start_stream(tmp_path, broker.bootstrap, topic, "tests.spark_handlers:record_kafka",
                               "--trigger", "1s", "--option", "maxOffsetsPerTrigger=300")
        log = str(tmp_path / "log.jsonl")
        _wait_for(lambda: len(read_log(log)) >= len(first), 300, "the first records", process)
        broker.stop()
        time.sleep(5)
        broker.start()
        seqs = {}
        for key, value in first:
            seqs[key] = json.loads(value)["seq"] + 1
        second = account_events(500, users=40, seed=11, start=seqs)
        produce(broker.bootstrap, topic, second)
        deadline = time.monotonic() + 120
        while process.poll() is None and len(read_log(log)) < len(first) + len(second):
            assert time.monotonic() < deadline, "the stream neither went on nor stopped"
            time.sleep(0.2)
        if process.poll() is None:  # it waited for the broker and went on
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
        lines = [line for line in err.splitlines()
                 if line.startswith("segack stream:") and "stopping" not in line]
        # It waited for the broker and went on (stopped by SIGTERM), or stopped with one line.
        assert process.returncode == ExitCode.OK or (
            process.returncode == ExitCode.FAILED and len(lines) == 1), err
        finished = run_stream(tmp_path, broker.bootstrap, topic, "tests.spark_handlers:record_kafka", run="1")
        assert finished.returncode == 0, finished.stderr
    handled = read_log(log)
    assert len(handled) == len(first) + len(second)
    assert_each_key_in_offset_order(handled, first + second)
