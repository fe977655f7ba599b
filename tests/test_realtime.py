"""``segack stream --trigger real-time`` over a real Kafka broker (``tests/kafka.py``): records
handled as they arrive, each key in offset order, the group's offsets following the calls, a stop
that finishes what was read, resumes that repeat nothing, and effects exactly once through a sink
across kills while a producer writes."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter import serve_metrics
from segack.spark_adapter.console.page import page_state
from segack.spark_adapter.errors import ForeignInputError, InputError, OptionError
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.partitions import refuse_real_time
from tests.spark_handlers import SLOW_ENV, read_log
from tests.test_kafka import (
    _kill,
    _ledger,
    _Producer,
    _wait_for,
    account_events,
    assert_each_key_in_offset_order,
    assert_each_record_applied_once_in_order,
    committed_offsets,
    end_offsets,
    make_topic,
    produce,
    run_stream,
    start_stream,
)
from tests.test_metrics import scrape

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
REAL_TIME = ("--trigger", "real-time", "--commit-interval", "0.5")


def _stopped(process: subprocess.Popen[str], code: ExitCode = ExitCode.OK) -> tuple[str, str]:
    """SIGTERM, as an operator's Ctrl-C; the output, once the stream has ended (exit ``code``: 0,
    or 3 with dead letters left)."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == code, err[-3000:]
    return out, err


@pytest.mark.versions
def test_records_are_handled_as_they_arrive_in_key_order_and_a_resume_repeats_nothing(tmp_path, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-accounts", "segack-real-time"
    make_topic(bootstrap, topic, 4)
    seqs: dict[str, int] = {}
    records = account_events(2000, users=100, seed=3, start=seqs)
    produce(bootstrap, topic, records)
    log = str(tmp_path / "log.jsonl")
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", *REAL_TIME,
                           "--concurrency", "8", "--commit-offsets-to", group)
    _wait_for(lambda: len(read_log(log)) >= 2000, 240, "the backlog handled", process)
    # Records written while it runs are handled as they arrive, and the group follows.
    later = account_events(1000, users=100, seed=4, start=seqs)
    produce(bootstrap, topic, later)
    records += later
    _wait_for(lambda: len(read_log(log)) >= 3000, 120, "the new records handled", process)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 60,
              "the group's offsets at the end", process)
    out, _ = _stopped(process)
    assert "stopped as asked: 3,000 events handled" in out, out
    handled = read_log(log)
    assert len(handled) == len({(event["partition"], event["offset"]) for event in handled}) == 3000
    assert_each_key_in_offset_order(handled, records)
    # A second run starts where the first stopped: it repeats nothing and hands over what is new.
    newest = account_events(500, users=100, seed=5, start=seqs)
    produce(bootstrap, topic, newest)
    records += newest
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", *REAL_TIME,
                           "--concurrency", "8", "--commit-offsets-to", group, run="1")
    _wait_for(lambda: len(read_log(log)) >= 3500, 240, "the newest records handled", process)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 60,
              "the group's offsets at the end", process)
    time.sleep(1.5)  # three saves: a record handled twice would be in the log by now
    _stopped(process)
    handled = read_log(log)
    assert len(handled) == 3500 and [event["run"] for event in handled[3000:]] == ["1"] * 500
    assert_each_key_in_offset_order(handled, records)
    # Its positions are Kafka offsets: a replay or a micro-batch stream refuses the checkpoint.
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    with pytest.raises(ForeignInputError, match="real-time stream"):
        refuse_real_time(store.load_existing().settings, store.location)


@pytest.mark.handlers
def test_a_slow_call_holds_the_groups_offset_not_the_other_keys_and_status_names_its_partition(
        tmp_path, kafka_broker, monkeypatch, capsys):
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-slow", "segack-real-time-slow"
    make_topic(bootstrap, topic, 1)
    seqs: dict[str, int] = {}
    before, after = account_events(500, 50, seed=6, start=seqs), account_events(2000, 50, seed=7, start=seqs)
    slow = ("slow", json.dumps({"user": "slow", "seq": 0, "amount": 1}).encode())
    produce(bootstrap, topic, [*before, slow, *after])
    monkeypatch.setenv(SLOW_ENV, "20")
    log = str(tmp_path / "log.jsonl")
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka_holding",
                           *REAL_TIME, "--concurrency", "4", "--commit-offsets-to", group)
    # Every other key's records are handled while the slow call runs; the group waits at its offset.
    _wait_for(lambda: len(read_log(log)) >= 2500, 120, "the other keys' records", process)
    assert "slow" not in {event["key"] for event in read_log(log)}, "the slow call ended: this proves nothing"
    time.sleep(1.5)
    assert committed_offsets(bootstrap, topic, group) == {0: 500}
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    status = capsys.readouterr().out
    held = f"{topic}/0     next offset 500 (read 2,501, 2,001 pending, 1 interval done above it)"
    assert held in status, status
    assert "holds the run back" in status and f"committed to consumer group {group}" in status
    with serve_metrics(str(tmp_path / "checkpoint"), 0) as server:
        samples = scrape(server.port)
    assert samples["segack_kafka_pending_records"] == [({"topic": topic, "partition": "0"}, 2001)]
    assert samples["segack_kafka_next_offset"] == [({"topic": topic, "partition": "0"}, 500)]
    [(labels, _)] = samples["segack_run_info"]
    assert labels["kind"] == "real-time" and labels["state"] == "running"
    [shown] = page_state(CheckpointStore(str(tmp_path / "checkpoint")))["stream"]["partitions"]
    assert shown["pending"] == 2001 and shown["holds_back"] and shown["committed"] == 500
    _wait_for(lambda: len(read_log(log)) == 2501, 60, "the slow call", process)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == {0: 2501}, 30, "the group at the end",
              process)
    _stopped(process)


@pytest.mark.faults
@pytest.mark.handlers
def test_a_failed_call_stops_the_stream_after_saving_what_is_done_or_parks_its_key_as_dead_letters(
        tmp_path, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-failing", "segack-real-time-failing"
    make_topic(bootstrap, topic, 2)
    records = [(f"u{n % 5}", json.dumps({"user": f"u{n % 5}", "seq": n // 5, "amount": 1}).encode())
               for n in range(400)]
    produce(bootstrap, topic, records)
    log = str(tmp_path / "log.jsonl")
    handler = "tests.spark_handlers:record_refusing_tenth_until_fixed"
    stopped = start_stream(tmp_path, bootstrap, topic, handler, *REAL_TIME, "--concurrency", "4",
                           "--commit-offsets-to", group)
    _, err = stopped.communicate(timeout=240)
    assert stopped.returncode == ExitCode.HANDLER_FAILED, err[-3000:]
    assert "handler failed on the event with key 'u1'" in err and "cannot apply this part yet" in err, err
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    saved = {partition: state["next"] for partition, state in store.partitions.all().items()}
    after_failure = committed_offsets(bootstrap, topic, group)
    handled = {(event["user"], event["seq"]) for event in read_log(log)}
    assert ("u1", 9) in handled and ("u1", 10) not in handled and ("u1", 11) not in handled
    # Under --on-error dead-letter the record and u1's later ones are set aside; every other key goes on.
    process = start_stream(tmp_path, bootstrap, topic, handler, *REAL_TIME, "--concurrency", "4",
                           "--commit-offsets-to", group, "--on-error", "dead-letter", run="1")
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 120,
              "the group at the end", process)
    out, err = _stopped(process, ExitCode.DEAD_LETTERS)  # as a micro-batch stream's
    assert ", 70 dead letters, 0 records behind" in out, out
    assert "70 events set aside as dead letters remain" in err, err
    handled = [(event["user"], event["seq"]) for event in read_log(log)]
    assert len(handled) == len(set(handled))
    set_aside = {("u1", seq) for seq in range(10, 80)}
    assert set(handled) == {(f"u{n % 5}", n // 5) for n in range(400)} - set_aside
    assert store.count_dead_letters() == 70 and store.dead_letter_keys("key") == {"u1"}
    # The failed run saved, and committed, u1's partition below its failing record (the calls not
    # started when it failed stay not done), never past it.
    letters = store.read_dead_letters().to_pylist()
    [first] = [letter for letter in letters if letter["seq"] == 10]
    partition, offset = first["__segack_key_group"], first["__segack_position"]
    assert first["partition"] == partition and first["offset"] == offset
    assert 0 < saved[partition] == after_failure[partition] <= offset
    # A run with the handler fixed retries them first, in order, then handles the key's new records.
    newer = [("u1", json.dumps({"user": "u1", "seq": seq, "amount": 1}).encode()) for seq in range(80, 90)]
    produce(bootstrap, topic, newer)
    fixed = start_stream(tmp_path, bootstrap, topic, handler, *REAL_TIME, "--concurrency", "4",
                         "--commit-offsets-to", group, "--retry-dead-letters", run="fixed")
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic)
              and len(read_log(log)) >= 410, 120, "the letters retried and the new records handled", fixed)
    out, _ = _stopped(fixed)
    assert "70 dead letters retried and handled, 0 kept" in out, out
    u1 = [event["seq"] for event in read_log(log) if event["user"] == "u1"]
    assert u1 == list(range(90)), u1
    assert store.count_dead_letters() == 0


@pytest.mark.faults
def test_a_task_whose_worker_dies_is_run_again_from_its_save_its_keys_set_aside_still_parked(
        tmp_path, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-retried", "segack-real-time-retried"
    make_topic(bootstrap, topic, 1)
    records = [(f"u{n % 5}", json.dumps({"user": f"u{n % 5}", "seq": n // 5, "amount": 1}).encode())
               for n in range(400)]
    produce(bootstrap, topic, records)
    log = str(tmp_path / "log.jsonl")
    # u1's tenth record is refused (a dead letter, the key parked); on u2's 40th, after a save, the
    # task's Python worker dies, and Spark (allowed 4 failures a task) runs the task again.
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:refusing_tenth_dying_once",
                           *REAL_TIME, "--concurrency", "4", "--on-error", "dead-letter",
                           "--commit-offsets-to", group, "--master", "local[2,4]")
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 180,
              "the group at the end", process)
    assert os.path.exists(log + ".died"), "the worker did not die: the test proves nothing"
    # Records written now reach the retried attempt: it keeps u1 parked, as its earlier attempt did.
    later = [(user, json.dumps({"user": user, "seq": seq, "amount": 1}).encode())
             for seq in range(80, 90) for user in ("u0", "u1")]
    produce(bootstrap, topic, later)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 60,
              "the later records", process)
    _stopped(process, ExitCode.DEAD_LETTERS)
    handled = [(event["user"], event["seq"]) for event in read_log(log)]
    set_aside = {("u1", seq) for seq in range(10, 90)}
    expected = {(f"u{n % 5}", n // 5) for n in range(400)} | {("u0", seq) for seq in range(80, 90)}
    assert set(handled) == expected - set_aside
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    assert store.count_dead_letters() == 80 and store.dead_letter_keys("key") == {"u1"}


@pytest.mark.faults
def test_records_gone_or_partitions_added_stop_the_stream_in_one_line_and_lose_nothing_unsaid(
        tmp_path, kafka_broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewPartitions

    bootstrap, admin = kafka_broker.bootstrap, AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    log = str(tmp_path / "log.jsonl")

    def run_until(topic: str, group: str, handled: int, run: str) -> subprocess.Popen[str]:
        process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", *REAL_TIME,
                               "--commit-offsets-to", group, run=run, checkpoint=str(tmp_path / topic))
        _wait_for(lambda: len(read_log(log)) >= handled, 120, f"{handled} records handled", process)
        return process

    def lines(done: subprocess.Popen[str]) -> list[str]:
        _, err = done.communicate(timeout=120)
        assert "Traceback" not in err, err[-3000:]
        return [line for line in err.splitlines() if line.startswith("segack")]

    # Records deleted (retention) before the stream read them: it stops, naming them, and goes no further.
    make_topic(bootstrap, "real-time-lost", 1)
    produce(bootstrap, "real-time-lost", account_events(50, users=5, seed=2))
    _stopped(run_until("real-time-lost", "segack-lost", 50, "0"))
    produce(bootstrap, "real-time-lost", account_events(50, users=5, seed=3))
    for future in admin.delete_records([TopicPartition("real-time-lost", 0, 80)]).values():
        future.result(30)
    lost = start_stream(tmp_path, bootstrap, "real-time-lost", "tests.spark_handlers:record_kafka",
                        *REAL_TIME, "--commit-offsets-to", "segack-lost", run="1",
                        checkpoint=str(tmp_path / "real-time-lost"))
    [line] = lines(lost)
    assert lost.returncode == ExitCode.FAILED
    said = "segack stream: Kafka partition real-time-lost/0: records the stream needs are gone"
    assert line.startswith(said), line
    assert len(read_log(log)) == 50
    assert committed_offsets(bootstrap, "real-time-lost", "segack-lost") == {0: 50}
    # Partitions added while it runs: a key's later records may land in another partition, whose
    # offsets do not order them. The stream stops, and the checkpoint refuses the new layout.
    make_topic(bootstrap, "real-time-grown", 1)
    produce(bootstrap, "real-time-grown", account_events(20, users=5, seed=4))
    grown = run_until("real-time-grown", "segack-grown", 70, "2")
    for future in admin.create_partitions([NewPartitions("real-time-grown", 2)]).values():
        future.result(30)
    [line] = lines(grown)
    assert grown.returncode == ExitCode.FAILED
    assert "topic real-time-grown has 2 partitions, not the 1 this stream reads" in line, line
    refused = start_stream(tmp_path, bootstrap, "real-time-grown", "tests.spark_handlers:record_kafka",
                           *REAL_TIME, run="3", checkpoint=str(tmp_path / "real-time-grown"))
    [line] = lines(refused)
    assert refused.returncode == ExitCode.REFUSED and "start a new checkpoint" in line, line
    assert len(read_log(log)) == 70


@pytest.mark.parametrize(("change", "error", "said"), [
    ({"segments": 3}, OptionError, "segments is not for a real-time stream"),
    ({"commit_interval": 0}, OptionError, "commit_interval must be a positive number of seconds"),
    ({"kafka_options": {"subscribePattern": "real-time-.*"}}, OptionError,
     "needs one of the options subscribe"),
    ({"kafka_options": {"assign": '{"real-time-refusals": [0]}'}}, OptionError, "assign is not for it"),
    ({"kafka_options": {"subscribe": "real-time-refusals,no-such-topic"}}, InputError,
     "'no-such-topic' does not exist"),
    ({"kafka_options": {"startingOffsets": '{"t": {"0": 5}}'}}, OptionError, "earliest or latest"),
    ({"value_schema_ddl": "user STRING, tags ARRAY<STRING>"}, OptionError, "field 'tags' is ARRAY<STRING>"),
    ({"kafka_options": {"subscribe": "no-such-topic"}}, InputError, "'no-such-topic' does not exist"),
    ({"checkpoint": "replayed"}, ForeignInputError, "holds a replay or a micro-batch stream"),
])
def test_what_a_real_time_stream_cannot_take_is_refused_before_anything_is_written(
        spark, kafka_broker, tmp_path, change, error, said):
    from segack.spark_adapter import stream_real_time
    from segack.spark_adapter.store.checkpoint import Checkpoint

    if not _topic_exists(kafka_broker.bootstrap, "real-time-refusals"):
        make_topic(kafka_broker.bootstrap, "real-time-refusals", 1)
    replayed = CheckpointStore(str(tmp_path / "replayed"))
    replayed.save(Checkpoint({"key": "user", "order": "seq"}), 1)
    before = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    arguments = {"kafka_options": {"kafka.bootstrap.servers": kafka_broker.bootstrap,
                                   "subscribe": "real-time-refusals"},
                 "value_schema_ddl": "user STRING, seq BIGINT", "checkpoint": "new"}
    for name, value in change.items():
        arguments[name] = {**arguments[name], **value} if name == "kafka_options" else value
    arguments["checkpoint"] = str(tmp_path / arguments["checkpoint"])
    with pytest.raises(error, match=re.escape(said)):
        stream_real_time(spark, arguments.pop("kafka_options"), arguments.pop("value_schema_ddl"),
                         handler=print, **arguments)
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == before


#: Each record of the headers test: its user, seq and headers as the producer writes them.
_WITH_HEADERS = [
    ("u1", 0, [("trace", b"t-0"), ("trace", b"t-0b"), ("empty", None)]),  # a key twice, a null value
    ("u1", 1, None),
    ("u2", 0, [("raw", bytes([0, 255, 10]))]),
    ("bad", 0, [("why", b"dead letter")]),
    ("u2", 1, []),  # an empty list is no headers at all, on the wire
]


def _produce_with_headers(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for user, seq, headers in _WITH_HEADERS:
        producer.produce(topic, key=user.encode(), value=json.dumps({"user": user, "seq": seq, "amount": 1}),
                         headers=headers)
    producer.flush(30)


@pytest.mark.streams
def test_each_records_headers_reach_the_handler_and_its_dead_letter_alike_in_both_modes(
        tmp_path, kafka_broker):
    """``includeHeaders=true``, Spark's option: each record's headers in their order, a repeated key
    and a null value kept, null for a record without any; the same in micro-batches (Spark's
    source) and in real time (segack's consumer), and in a real-time dead letter."""
    bootstrap, topic = kafka_broker.bootstrap, "real-time-headers"
    make_topic(bootstrap, topic, 2)
    _produce_with_headers(bootstrap, topic)
    expected = sorted((user, seq, [[name, None if data is None else data.hex()] for name, data in headers]
                       if headers else None) for user, seq, headers in _WITH_HEADERS if user != "bad")
    handler, log = "tests.spark_handlers:record_kafka_headers", tmp_path / "log.jsonl"
    batches = run_stream(tmp_path, bootstrap, topic, handler, "--option", "includeHeaders=true",
                         "--on-error", "dead-letter", checkpoint=str(tmp_path / "batches"))
    assert batches.returncode == ExitCode.DEAD_LETTERS, batches.stderr
    assert sorted((line["user"], line["seq"], line["headers"]) for line in read_log(str(log))) == expected
    log.unlink()
    process = start_stream(tmp_path, bootstrap, topic, handler, *REAL_TIME, "--option", "includeHeaders=TRUE",
                           "--on-error", "dead-letter", checkpoint=str(tmp_path / "real-time"))
    real_time = CheckpointStore(str(tmp_path / "real-time"))
    _wait_for(lambda: len(read_log(str(log))) >= 4 and bool(real_time.dead_letter_files()), 240,
              "the records handled and the dead letter set aside", process)
    out, _ = _stopped(process, ExitCode.DEAD_LETTERS)
    assert ", 1 dead letter, 0 records behind" in out, out
    assert sorted((line["user"], line["seq"], line["headers"]) for line in read_log(str(log))) == expected
    for mode in ("batches", "real-time"):
        letters = CheckpointStore(str(tmp_path / mode)).read_dead_letters(["key", "headers"])
        assert letters is not None
        assert letters.select(["key", "headers"]).to_pylist() == [
            {"key": "bad", "headers": [{"key": "why", "value": b"dead letter"}]}], mode


@pytest.mark.command
def test_an_include_headers_that_is_not_true_or_false_is_refused_before_spark_starts(tmp_path, capsys):
    for trigger in ((), ("--trigger", "real-time")):
        command = ["stream", "--format", "kafka", "--option", "kafka.bootstrap.servers=127.0.0.1:9",
                   "--option", "subscribe=t", "--value-schema", "user STRING", "--key", "key",
                   "--order", "offset", "--handler", "tests.spark_handlers:record_kafka",
                   "--checkpoint", str(tmp_path / "checkpoint"), "--option", "includeHeaders=yes", *trigger]
        assert main(command) == ExitCode.USAGE
        assert "includeHeaders takes true or false, not 'yes'" in capsys.readouterr().err
        assert not (tmp_path / "checkpoint").exists()


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics


@pytest.mark.command
@pytest.mark.parametrize(("flags", "said"), [
    (("--segments", "3"), "--segments is not for --trigger real-time: a real-time stream's tasks own Kafka"),
    (("--key", "user"), "--key is not for --trigger real-time: a real-time stream's key is the record's"),
    (("--key-group-bits", "8"), "--key-group-bits is not for --trigger real-time: a real-time stream"),
    (("--flush-interval", "2"), "--flush-interval is not for --trigger real-time"),
    (("--hash", "java"), "--hash is not for --trigger real-time"),
    (("--stop-timeout", "5"),
     "--stop-timeout is not for --trigger real-time: a real-time stream stops once the calls it read finish"),
])
def test_flags_a_real_time_stream_cannot_take_are_refused_before_spark_starts(tmp_path, capsys, flags, said):
    command = ["stream", "--format", "kafka", "--option", "kafka.bootstrap.servers=127.0.0.1:9",
               "--option", "subscribe=t", "--value-schema", "user STRING", "--key", "key",
               "--order", "offset", "--handler", "tests.spark_handlers:record_kafka",
               "--checkpoint", str(tmp_path / "checkpoint"), "--trigger", "real-time", *flags]
    assert main(command) == ExitCode.USAGE
    assert said in capsys.readouterr().err
    assert not (tmp_path / "checkpoint").exists()


@pytest.mark.faults
@pytest.mark.sinks
def test_a_real_time_stream_killed_thrice_while_records_arrive_applies_each_once(
        tmp_path, kafka_broker, pg_database):
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-exactly-once", "segack-real-time-once"
    make_topic(bootstrap, topic, 6)
    producer = _Producer(bootstrap, topic, 12_000, seed=11)
    options = [*REAL_TIME, "--batch-size", "200", "--concurrency", "8", "--commit-offsets-to", group]
    rng = random.Random(12)
    for run in range(3):
        applied = len(_ledger(pg_database)[0])
        process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:ledger_sink", *options,
                               run=str(run), dsn=pg_database)
        _wait_for(lambda applied=applied: len(_ledger(pg_database)[0]) > applied + 300, 300,
                  "records applied", process)
        time.sleep(rng.uniform(0.2, 1.5))
        assert process.poll() is None, "the stream ended before its kill: the test proves nothing"
        _kill(process)
        # Never ahead: every record below a committed offset is in the ledger.
        committed = committed_offsets(bootstrap, topic, group)
        assert producer.below(committed) <= set(_ledger(pg_database)[0])
    producer.thread.join(120)
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:ledger_sink", *options,
                           run="drain", dsn=pg_database)
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    _wait_for(lambda: {state["claim"] for state in store.partitions.all().values()} == {4}, 300,
              "the fourth run's first save", process)
    _wait_for(lambda: len(_ledger(pg_database)[0]) >= len(producer.records), 300, "every record applied",
              process)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 60,
              "the group's offsets at the end", process)
    _stopped(process)
    assert_each_record_applied_once_in_order(pg_database, producer.records)
    states = store.partitions.all()
    assert sorted(states) == list(range(6))
    assert {partition: state["next"] for partition, state in states.items()} == end_offsets(bootstrap, topic)



@pytest.mark.faults
def test_a_stream_at_latest_killed_before_its_first_save_resumes_where_it_started(tmp_path, kafka_broker):
    """Issue 54, case 1, through the command: a stream at ``startingOffsets=latest`` with a save
    every 30 s is killed right after its first call; records written meanwhile are handled by the
    next run, which starts where the first one did, not at a later latest."""
    bootstrap, topic, group = kafka_broker.bootstrap, "real-time-latest", "segack-real-time-latest"
    make_topic(bootstrap, topic, 1)
    seqs: dict[str, int] = {}
    produce(bootstrap, topic, account_events(10, users=4, seed=30, start=seqs))  # before: passed over
    log = str(tmp_path / "log.jsonl")
    latest = ("--trigger", "real-time", "--commit-interval", "30", "--option", "startingOffsets=latest",
              "--commit-offsets-to", group)
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", *latest)
    # One record at a time until the stream handles one: it reads from its start on by then.
    deadline = time.monotonic() + 240
    while not read_log(log):
        assert process.poll() is None and time.monotonic() < deadline, "the stream handled nothing"
        produce(bootstrap, topic, account_events(1, users=4, seed=31, start=seqs))
        time.sleep(0.5)
    _kill(process)
    produce(bootstrap, topic, account_events(44, users=4, seed=32, start=seqs))
    time.sleep(2)
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:record_kafka", *latest, run="1")
    end = end_offsets(bootstrap, topic)[0]
    _wait_for(lambda: {event["offset"] for event in read_log(log)} >= set(range(min(
        event["offset"] for event in read_log(log)), end)), 240, "every record from the first start", process)
    _stopped(process)
    handled = {event["offset"] for event in read_log(log)}
    first = min(handled)
    assert first >= 10 and handled == set(range(first, end)), sorted(set(range(first, end)) - handled)[:5]
    assert committed_offsets(bootstrap, topic, group) == {0: end}


@pytest.mark.handlers
def test_a_slow_start_is_not_taken_for_a_task_without_a_slot(spark, tmp_path, kafka_broker, monkeypatch):
    """Issue 54, case 6: a sink whose preparation, and then whose first call, each take longer than
    the time the stream gives its tasks to find slots: the stream runs (a task holds its partitions
    before its first call, and the time counts from the tasks' start), where it stopped, saying no
    slot was free."""
    import threading

    from segack.spark_adapter import StopRequest, stream_real_time
    from segack.spark_adapter.coordinator import realtime_jobs
    from tests.spark_handlers import SlowToStartSink

    monkeypatch.setattr(realtime_jobs, "STARTUP_SECONDS", 8.0)
    bootstrap, topic = kafka_broker.bootstrap, "real-time-slow-start"
    make_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, account_events(20, users=4, seed=33))
    log = str(tmp_path / "log.jsonl")
    stop, ended = StopRequest(), []

    def run() -> None:
        try:
            ended.append(stream_real_time(
                spark, {"kafka.bootstrap.servers": bootstrap, "subscribe": topic},
                "user STRING, seq BIGINT, amount BIGINT", handler=SlowToStartSink(9.0, log),
                checkpoint=str(tmp_path / "checkpoint"), commit_interval=0.5, stop=stop))
        except BaseException as error:
            ended.append(error)

    streaming = threading.Thread(target=run, daemon=True)
    streaming.start()
    try:
        _wait_for(lambda: len(read_log(log)) >= 20 or bool(ended), 180, "the records handled")
        time.sleep(realtime_jobs.STARTUP_SECONDS)  # a look past the deadline, with every task holding
        assert not ended, ended
    finally:
        stop.set()
        streaming.join(120)
    [result] = ended
    assert not isinstance(result, BaseException), result
    assert result.handled == 20 and result.stopped
