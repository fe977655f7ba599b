"""``segack stream --trigger real-time`` over a real Kafka broker (``tests/kafka.py``): records
handled as they arrive, each key in offset order, the group's offsets following the calls, a stop
that finishes what was read, resumes that repeat nothing, and effects exactly once through a sink
across kills while a producer writes."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter.errors import ForeignInputError
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.partitions import refuse_real_time
from tests.spark_handlers import fold, read_log
from tests.test_kafka import (
    _kill,
    _ledger,
    _Producer,
    _wait_for,
    account_events,
    assert_each_key_in_offset_order,
    committed_offsets,
    end_offsets,
    make_topic,
    produce,
    start_stream,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
REAL_TIME = ("--trigger", "real-time", "--commit-interval", "0.5")


def _stopped(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM, as an operator's Ctrl-C; the output, once the stream has ended (exit 0)."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == ExitCode.OK, err[-3000:]
    return out, err


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


@pytest.mark.command
@pytest.mark.parametrize(("flags", "said"), [
    (("--segments", "3"), "--segments is not for --trigger real-time: a real-time stream's tasks own Kafka"),
    (("--key", "user"), "--key is not for --trigger real-time: a real-time stream's key is the record's"),
    (("--retry-dead-letters",), "--retry-dead-letters is not for --trigger real-time: a real-time stream"),
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
    rows, balances = _ledger(pg_database)
    pairs = [(key, json.loads(value)["seq"]) for key, value in producer.records]
    assert len(rows) == len(set(rows)) == len(pairs) and set(rows) == set(pairs)
    last: dict[str, int] = {}
    for user, seq in rows:
        assert seq == last.get(user, -1) + 1, f"{user} {seq} applied after {last.get(user)}"
        last[user] = seq
    expected: dict[str, int] = {}
    for user, seq in sorted(pairs):
        expected[user] = fold(expected.get(user, 0), seq)
    assert balances == expected
    states = store.partitions.all()
    assert sorted(states) == list(range(6))
    assert {partition: state["next"] for partition, state in states.items()} == end_offsets(bootstrap, topic)

