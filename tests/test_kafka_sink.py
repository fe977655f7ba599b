"""``segack.sinks.KafkaSink`` on the real broker (``tests/kafka.py``): each event's records once
for a ``read_committed`` consumer, each key's in order, across tasks, retries, resumes and runs
that took the checkpoint over; refusals in one line that write nothing."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import subprocess
import threading
import time
import uuid
import zlib
from pathlib import Path

import pytest

from segack.cli import ExitCode, main
from segack.errors import SegackTypeError, SegackValueError
from segack.sinks import KafkaOutput, KafkaSink, kafka_positions
from segack.spark_adapter.errors import SinkError
from segack.spark_adapter.handlers import EventIdentity, RunContext
from segack.spark_adapter.options import Policy
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.kafka import committed_messages
from tests.spark_handlers import KAFKA_APPLY_SECONDS_ENV, KafkaLedgerApply, fold, kafka_ledger_topics
from tests.test_kafka import (
    _closed_port,
    _kill,
    _Producer,
    _wait_for,
    account_events,
    assert_once_in_order,
    committed_offsets,
    end_offsets,
    make_topic,
    produce,
    run_stream,
    start_stream,
)

KEY_GROUPS = 8


def _apply(_output, _event) -> None:
    pass


@pytest.mark.sinks
@pytest.mark.parametrize(("arguments", "error", "said"), [
    (dict(producer_config=[("bootstrap.servers", "x")]), SegackTypeError, "must be a mapping"),
    (dict(producer_config={}), SegackValueError, "bootstrap.servers"),
    (dict(producer_config={"bootstrap.servers": "x", "transactional.id": "mine"}), SegackValueError,
     "transactional.id"),
    (dict(producer_config={"bootstrap.servers": "x", "transaction.timeout.ms": 300_000}), SegackValueError,
     r"transaction.timeout.ms must be a number of milliseconds from 1 to 120000, not 300000: a task"),
    (dict(producer_config={"bootstrap.servers": "x", "transaction.timeout.ms": "soon"}), SegackValueError,
     "transaction.timeout.ms must be"),
    (dict(apply=None), SegackValueError, "not both or neither"),
    (dict(apply_many=_apply), SegackValueError, "not both or neither"),
    (dict(apply="print"), SegackTypeError, "callable"),
    (dict(topics=[]), SegackValueError, "topics must name"),
    (dict(topics=["bad name"]), SegackValueError, "topics must name"),
    (dict(topics=[7]), SegackValueError, "topics must name"),
    (dict(positions_topic="a/b"), SegackValueError, "positions_topic"),
    (dict(positions_partitions=0), SegackValueError, "positions_partitions"),
    (dict(positions_partitions=True), SegackValueError, "positions_partitions"),
    (dict(preferred_batch_size=0), SegackValueError, "preferred_batch_size"),
    (dict(clients=object()), SegackTypeError, "clients must make producers, consumers and admin clients"),
])
def test_arguments_it_cannot_use_are_refused_naming_them(arguments, error, said):
    given = dict(producer_config={"bootstrap.servers": "127.0.0.1:9"}, apply=_apply, topics=["out"])
    given.update(arguments)
    with pytest.raises(error, match=said):
        KafkaSink(**given)


@pytest.mark.sinks
def test_a_transaction_timeout_a_positions_reader_waits_out_is_taken():
    sink = KafkaSink({"bootstrap.servers": "x", "transaction.timeout.ms": "120000"}, _apply, topics=["out"])
    assert sink.producer_config["transaction.timeout.ms"] == "120000"


@pytest.mark.sinks
def test_an_output_takes_records_for_its_topics_only_and_str_or_bytes():
    output = KafkaOutput(frozenset({"out"}))
    output.produce("out", "value", b"key", headers=[("h", b"1")])
    with pytest.raises(SegackValueError, match="'other' is not one of the sink's topics"):
        output.produce("other", "value")
    with pytest.raises(SegackTypeError, match="str, bytes or None"):
        output.produce("out", {"a": 1})
    assert output.records == [("out", "value", b"key", -1, [("h", b"1")], 0)]
    assert len(output) == 1


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def _checkpoint_id(checkpoint: Path) -> str:
    """A checkpoint's id, made with it, as a run's is."""
    made = checkpoint / "id"
    if not made.exists():
        made.write_text(uuid.uuid4().hex)
    return made.read_text()


def _run(checkpoint: Path, claim: int, policy: Policy = Policy.PER_KEY) -> RunContext:
    return RunContext(str(checkpoint), _checkpoint_id(checkpoint), "user", "seq", policy, 30.0, None, claim)


def _claimed(checkpoint: Path, claim: int) -> None:
    """A claim file numbered ``claim``, as a run that takes the checkpoint over writes it."""
    assert CheckpointStore(str(checkpoint)).create_claim_file(claim, b"{}")


def _task(sink: KafkaSink) -> KafkaSink:
    """The copy of ``sink`` a Spark task gets."""
    return pickle.loads(pickle.dumps(sink))


def _events(records: list[tuple[str, bytes]], checkpoint: Path) -> tuple[list[dict], list[EventIdentity]]:
    """Account records as events, with identities: a key group by the user, positions in order."""
    events = [json.loads(value) for _, value in records]
    identities = [EventIdentity(event["user"], zlib.crc32(event["user"].encode()) % KEY_GROUPS, position,
                                _checkpoint_id(checkpoint)) for position, event in enumerate(events)]
    return events, identities


def _sink(bootstrap: str, topic: str, fail_on: tuple[str, int] | None = None) -> KafkaSink:
    apply = KafkaLedgerApply(topic, fail_on)
    return KafkaSink({"bootstrap.servers": bootstrap, "linger.ms": 5}, apply,
                     topics=[apply.ledger, apply.balances], positions_partitions=4)


def _outputs(bootstrap: str, topic: str) -> tuple[str, str]:
    ledger, balances = kafka_ledger_topics(topic)
    make_topic(bootstrap, ledger, 3)
    make_topic(bootstrap, balances, 3)
    return ledger, balances


def committed_records(bootstrap: str, topic: str) -> list[dict]:
    """Every record of ``topic`` a ``read_committed`` consumer sees, partition by partition, each in
    offset order, its value parsed."""
    return [json.loads(message.value()) for message in committed_messages(bootstrap, topic)]


def assert_each_event_once_in_order(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    """The ledger topic holds each of ``records`` once, each user's in ``seq`` order, and so does the
    balances topic, each record the user's balance after that event: the sequential fold."""
    ledger, balances = kafka_ledger_topics(topic)
    steps = committed_records(bootstrap, balances)
    # A user's records are in one partition, each in offset order: the last is the newest.
    last = {row["user"]: row["balance"] for row in steps}
    assert_once_in_order([(row["user"], row["seq"]) for row in steps], last, records)
    assert_once_in_order([(row["user"], row["seq"]) for row in committed_records(bootstrap, ledger)], last,
                         records)
    folded: dict[str, int] = {}
    for row in steps:
        folded[row["user"]] = fold(folded.get(row["user"], 0), row["seq"])
        assert row["balance"] == folded[row["user"]], f"{row['user']}'s balance after {row['seq']}"


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_each_event_is_sent_once_across_tasks_resumes_and_runs(tmp_path, kafka_broker):
    bootstrap, topic = kafka_broker.bootstrap, "sink-resumes"
    _outputs(bootstrap, topic)
    records = account_events(1200, users=40, seed=11)
    events, identities = _events(records, tmp_path)
    sink = _sink(bootstrap, topic)
    sink.prepare(_run(tmp_path, 1))
    first = _task(sink)
    for start in range(0, 300, 100):
        first(events[start:start + 100], identities[start:start + 100])
    first(events[:300], identities[:300])  # the same task again: nothing new
    first.close()
    # Another task (a retried attempt, a resume) from the start: it reads what the first committed.
    _task(sink)(events[:600], identities[:600])
    # A run that took over: it fences the first run's producers, and reads the positions too.
    _claimed(tmp_path, 2)
    later = _sink(bootstrap, topic)
    later.prepare(_run(tmp_path, 2))
    _task(later)(events, identities)
    assert_each_event_once_in_order(bootstrap, topic, records)
    assert os.listdir(tmp_path / "kafka-producers") == [f"segack-{_checkpoint_id(tmp_path)}-2-p{os.getpid()}"]


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_a_call_that_fails_sends_nothing_and_its_retry_sends_it_once(tmp_path, kafka_broker):
    bootstrap, topic = kafka_broker.bootstrap, "sink-failures"
    _outputs(bootstrap, topic)
    records = account_events(300, users=10, seed=12)
    events, identities = _events(records, tmp_path)
    refused = json.loads(records[150][1])
    sink = _sink(bootstrap, topic, fail_on=(refused["user"], refused["seq"]))
    sink.prepare(_run(tmp_path, 1))
    task = _task(sink)
    task(events[:100], identities[:100])
    with pytest.raises(ValueError, match="refuses this event"):
        task(events[100:200], identities[100:200])
    assert len(committed_records(bootstrap, kafka_ledger_topics(topic)[0])) == 100
    fixed = _sink(bootstrap, topic)
    fixed.prepare(_run(tmp_path, 1))
    _task(fixed)(events, identities)
    assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_a_run_taken_over_commits_nothing_more_whenever_its_producer_started(tmp_path, kafka_broker):
    from confluent_kafka import KafkaException

    bootstrap, topic = kafka_broker.bootstrap, "sink-takeover"
    _outputs(bootstrap, topic)
    records = account_events(400, users=10, seed=13)
    events, identities = _events(records, tmp_path)
    stale = _sink(bootstrap, topic)
    stale.prepare(_run(tmp_path, 1))
    started = _task(stale)
    started(events[:100], identities[:100])
    _claimed(tmp_path, 2)
    taking_over = _sink(bootstrap, topic)
    taking_over.prepare(_run(tmp_path, 2))
    # The stale run's producer was fenced: its next transaction fails, and sends nothing.
    with pytest.raises(KafkaException, match="fenced"):
        started(events[100:200], identities[100:200])
    # It starts no other; a producer the stale run starts only now sees the newer claim first.
    with pytest.raises(SinkError, match="this task's producer could not abort a transaction after"):
        started(events[100:200], identities[100:200])
    with pytest.raises(SinkError, match=r"another run took checkpoint .* over"):
        _task(stale)(events[100:200], identities[100:200])
    assert len(committed_records(bootstrap, kafka_ledger_topics(topic)[0])) == 100
    _task(taking_over)(events, identities)
    assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.parametrize(("case", "said"), [
    ("unreachable", r"^KafkaSink cannot reach the brokers at 127\.0\.0\.1:\d+: .*"),
    ("no transactions", r"^KafkaSink cannot start a transactional producer .*: Failed to create producer: "
                        r"`transactional.id` requires `enable.idempotence=true`$"),
    ("no output topic", r"^KafkaSink: output topic sink-refusals-no-output-topic-ledger does not exist "
                        r".*create it first$"),
    ("concurrent", r"^KafkaSink needs each key's events in order; policy 'concurrent' does not keep that"),
])
def test_a_run_it_cannot_serve_is_refused_in_one_line_and_nothing_is_written(tmp_path, kafka_broker, case,
                                                                               said):
    bootstrap, topic = kafka_broker.bootstrap, f"sink-refusals-{case.replace(' ', '-')}"
    apply = KafkaLedgerApply(topic)
    config = {"bootstrap.servers": bootstrap}
    policy = Policy.CONCURRENT if case == "concurrent" else Policy.PER_KEY
    if case == "unreachable":
        config["bootstrap.servers"] = f"127.0.0.1:{_closed_port()}"
    if case == "no transactions":
        config["enable.idempotence"] = False
    topics = [apply.ledger] if case == "no output topic" else [apply.balances]
    if case != "no output topic":
        make_topic(bootstrap, apply.balances, 1)
    sink = KafkaSink(config, apply, topics=topics, positions_topic=f"positions-{case.replace(' ', '-')}")
    with pytest.raises(SinkError) as refused:
        sink.prepare(_run(tmp_path, 1, policy))
    assert "\n" not in str(refused.value) and refused.match(said)
    assert sink.positions_topic not in _topics(bootstrap)
    assert not tmp_path.joinpath("kafka-producers").exists()


def _sent(bootstrap: str, topic: str) -> int:
    """Records written to ``topic``'s ledger so far, committed or not (cheap: the end offsets)."""
    return sum(end_offsets(bootstrap, kafka_ledger_topics(topic)[0]).values())


def _ledger(bootstrap: str, topic: str, run: str | None = None) -> set[tuple[str, int]]:
    """The ``(user, seq)`` of the ledger's committed records (those of ``run`` alone if given)."""
    return {(row["user"], row["seq"]) for row in committed_records(bootstrap, kafka_ledger_topics(topic)[0])
            if run is None or row["run"] == run}


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.sinks
def test_a_kafka_to_kafka_stream_killed_split_and_taken_over_sends_each_output_once(tmp_path, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "sink-exactly-once", "segack-sink-exactly-once"
    make_topic(bootstrap, topic, 6)
    _outputs(bootstrap, topic)
    producer = _Producer(bootstrap, topic, 12_000, seed=21)
    options = ["--trigger", "1s", "--batch-size", "200", "--concurrency", "8", "--commit-offsets-to", group,
               "--option", "maxOffsetsPerTrigger=1500", "--flush-interval", "1", "--claim-timeout", "4"]
    rng = random.Random(22)

    def start(run: str, segments: int, **variables: str) -> subprocess.Popen[str]:
        return start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink", *options,
                            "--segments", str(segments), run=run, variables=variables)

    def sends(more: int, process: subprocess.Popen[str]) -> None:
        sent = _sent(bootstrap, topic)
        _wait_for(lambda: _sent(bootstrap, topic) > sent + more, 300, "records sent", process)

    for run, segments in enumerate([3, 5, 2]):
        process = start(str(run), segments)
        sends(300, process)
        if run == 1:
            assert main(["split", str(tmp_path / "checkpoint"), "0"]) == ExitCode.OK
            sends(500, process)
        time.sleep(rng.uniform(0.2, 1.5))
        assert process.poll() is None, "the stream ended before its kill: the test proves nothing"
        _kill(process)
        # Never ahead: every record below a committed offset has its output.
        committed = committed_offsets(bootstrap, topic, group)
        assert producer.below(committed) <= _ledger(bootstrap, topic)
    # Paused past its claim's timeout, taken over, then woken: nothing it sends after is visible. Each
    # of its calls takes 0.4 s, so that the pause lands in the middle of some.
    stale = start("stale", 4, **{KAFKA_APPLY_SECONDS_ENV: "0.002"})
    sends(300, stale)
    os.killpg(stale.pid, signal.SIGSTOP)
    try:
        time.sleep(6)
        taker = start("taker", 3)
        sends(600, taker)
        # What the paused run committed before the taker fenced it (a commit it had sent may have
        # completed after the pause): nothing more may appear once it wakes.
        before = _ledger(bootstrap, topic, "stale")
    finally:
        os.killpg(stale.pid, signal.SIGCONT)
    _, err = stale.communicate(timeout=300)
    assert stale.returncode != 0 and "lost its claim" in err, err[-3000:]
    producer.thread.join(120)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 300,
              "the taker's group offsets at the end", taker)
    taker.send_signal(signal.SIGTERM)
    _, err = taker.communicate(timeout=120)
    assert taker.returncode == ExitCode.OK, err[-3000:]
    assert _ledger(bootstrap, topic, "stale") == before
    assert_each_event_once_in_order(bootstrap, topic, producer.records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_positions_stay_where_the_first_run_put_them_and_elsewhere_is_refused(tmp_path, kafka_broker):
    from confluent_kafka.admin import AdminClient, NewPartitions

    bootstrap, topic = kafka_broker.bootstrap, "sink-positions-moved"
    _outputs(bootstrap, topic)
    records = account_events(400, users=30, seed=17)
    events, identities = _events(records, tmp_path)
    first = _sink(bootstrap, topic)
    first.prepare(_run(tmp_path, 1))
    _task(first)(events[:200], identities[:200])
    name = first.positions_topic_for(_checkpoint_id(tmp_path))
    elsewhere = KafkaSink({"bootstrap.servers": bootstrap}, _apply, topics=[kafka_ledger_topics(topic)[0]],
                          positions_topic="sink-positions-elsewhere")
    with pytest.raises(SinkError, match=rf"positions are in topic {name}, not in sink-positions-elsewhere"):
        elsewhere.prepare(_run(tmp_path, 2))
    assert "sink-positions-elsewhere" not in _topics(bootstrap)  # refused before it was made
    # Partitions added to the positions topic stay unused: each key's position is where it was.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(name, 6)])[name].result(30)
    _wait_for(lambda: len(admin.list_topics(name, timeout=10).topics[name].partitions) == 6, 30,
              "the brokers to list the partitions added")
    later = _sink(bootstrap, topic)
    later.prepare(_run(tmp_path, 3))
    _task(later)(events, identities)
    assert_each_event_once_in_order(bootstrap, topic, records)


def _delete_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until its future is done
    admin.delete_topics([name])[name].result(30)
    _wait_for(lambda: name not in _topics(bootstrap), 30, f"the brokers to forget topic {name}")


@pytest.mark.faults
@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.command
def test_the_command_refuses_a_stream_whose_positions_topic_was_deleted_in_one_line(tmp_path, kafka_broker):
    """Positions lost with their topic (an operator, a failover that did not mirror it): a topic made
    again would be empty, and the resume would send again what it hands again."""
    bootstrap, topic = kafka_broker.bootstrap, "sink-positions-deleted"
    make_topic(bootstrap, topic, 2)
    _outputs(bootstrap, topic)
    seqs: dict[str, int] = {}
    produce(bootstrap, topic, account_events(50, users=5, seed=23, start=seqs))
    first = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                       "--trigger", "available-now")
    assert first.returncode == ExitCode.OK, first.stderr
    recorded = (tmp_path / "checkpoint" / "kafka-positions.json").read_bytes()
    name = json.loads(recorded)["topic"]
    _delete_topic(bootstrap, name)
    produce(bootstrap, topic, account_events(20, users=5, seed=24, start=seqs))  # a micro-batch to run
    done = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                      "--trigger", "available-now", run="1")
    assert done.returncode == ExitCode.REFUSED, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: ")]
    assert len(said) == 1 and re.search(rf"KafkaSink: this checkpoint's positions topic {name} does not "
                                        rf"exist: the positions .* are lost.* restore it.* or start a new "
                                        rf"checkpoint", said[0]), done.stderr
    assert name not in _topics(bootstrap)
    assert (tmp_path / "checkpoint" / "kafka-positions.json").read_bytes() == recorded


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_a_positions_topic_deleted_and_made_again_is_refused_and_an_older_record_learns_its_id(tmp_path,
                                                                                               kafka_broker):
    from confluent_kafka.admin import AdminClient, NewTopic

    from segack.spark_adapter.store.kafka_sink_files import positions_topic

    bootstrap, topic = kafka_broker.bootstrap, "sink-positions-made-again"
    _outputs(bootstrap, topic)
    first = _sink(bootstrap, topic)
    first.prepare(_run(tmp_path, 1))
    files = CheckpointStore(str(tmp_path)).files
    name, made = first.positions_topic_for(_checkpoint_id(tmp_path)), positions_topic(files)
    # What the older code recorded (no topic id): a run records the id now, and goes on.
    (tmp_path / "kafka-positions.json").write_text(json.dumps({"topic": name, "partitions": 4}))
    going = _sink(bootstrap, topic)
    going.prepare(_run(tmp_path, 2))
    assert positions_topic(files) == made and made["topic_id"]
    _delete_topic(bootstrap, name)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 4, config={"cleanup.policy": "compact"})])[name].result(30)
    _wait_for(lambda: name in _topics(bootstrap), 30, "the brokers to list the topic made again")
    refused = rf"^KafkaSink: positions topic {name} was deleted and made again \(topic id \S+, not " \
              rf"{made['topic_id']}\): the positions"
    with pytest.raises(SinkError, match=refused):
        _sink(bootstrap, topic).prepare(_run(tmp_path, 3))
    # A stream's next micro-batch under the same claim (the sink prepared before) looks again.
    with pytest.raises(SinkError, match=refused):
        going.prepare(_run(tmp_path, 2))
    assert positions_topic(files) == made


@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.parametrize(("code", "waited_out"), [
    # What a broker starting again answers until its partitions have leaders again (seen in CI:
    # NOT_LEADER_FOR_PARTITION, for the ends of a positions partition, stopped a stream).
    ("NOT_LEADER_FOR_PARTITION", True), ("LEADER_NOT_AVAILABLE", True), ("FENCED_LEADER_EPOCH", True),
    ("_UNKNOWN_PARTITION", True), ("_TRANSPORT", True),
    ("TOPIC_AUTHORIZATION_FAILED", False), ("OFFSET_OUT_OF_RANGE", False), ("_INVALID_ARG", False),
])
def test_positions_are_read_again_after_the_errors_a_restarting_broker_gives_and_no_other(code, waited_out):
    from confluent_kafka import KafkaError

    assert kafka_positions._passes(KafkaError(getattr(KafkaError, code))) is waited_out


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_positions_wait_for_a_partition_the_brokers_do_not_list_yet_and_refuse_a_missing_topic(kafka_broker,
                                                                                              monkeypatch):
    """A broker starting again lists a partition late: a task reading positions waits for it, and
    for a topic that is gone (a client cannot tell them apart) until its time is up."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    from segack.sinks.kafka_positions import PositionsPartition

    config = {"bootstrap.servers": kafka_broker.bootstrap}
    topic = "sink-positions-listed-late"
    make_topic(kafka_broker.bootstrap, topic, 1)
    later = PositionsPartition(topic, 1, "checkpoint/")
    read: list[int] = []
    reader = threading.Thread(target=lambda: read.append(later.catch_up(config)))
    reader.start()
    time.sleep(3)
    assert reader.is_alive() and not read, "the read did not wait for the partition"
    admin = AdminClient(config)  # referenced until its future is done
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    reader.join(60)
    assert read == [0] and later.next_offset == 0
    monkeypatch.setattr(kafka_positions, "READ_SECONDS", 5.0)
    began = time.monotonic()
    with pytest.raises(SinkError, match="cannot read partition 0 of positions topic sink-positions-missing"):
        PositionsPartition("sink-positions-missing", 0, "checkpoint/").catch_up(config)
    assert 5 <= time.monotonic() - began < 30


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_positions_are_read_past_a_transaction_still_open_below_one_committed(kafka_broker):
    """A ``read_committed`` client is told where the oldest open transaction starts: a task that read
    only that far would miss the positions committed above it (another task's, or a commit whose
    markers Kafka had not written yet), and apply their events again."""
    from confluent_kafka import Producer

    from segack.sinks.kafka_positions import PositionsPartition

    bootstrap, topic = kafka_broker.bootstrap, "sink-positions-open-below"
    make_topic(bootstrap, topic, 1)
    producers = [Producer({"bootstrap.servers": bootstrap, "transactional.id": f"test-{topic}-{name}"})
                 for name in ("open", "committed")]
    for producer, (key, position) in zip(producers, ((b"checkpoint/0/open", b"3"),
                                                     (b"checkpoint/1/user-1", b"7")), strict=True):
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, value=position, key=key, partition=0)
        producer.flush(30)
    producers[1].commit_transaction(30)
    ending = threading.Timer(2.0, producers[0].commit_transaction, args=(30,))
    began = time.monotonic()
    ending.start()
    partition = PositionsPartition(topic, 0, "checkpoint/")
    partition.catch_up({"bootstrap.servers": bootstrap})
    ending.join()
    # It waited for the open transaction, and read up to the end, that one's record too.
    assert time.monotonic() - began >= 1.5
    assert partition.positions == {"1/user-1": 7, "0/open": 3}


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.parametrize(("key", "value"), [(b"checkpoint/0/\xff", b"1"), (b"checkpoint/0/user-1", b"one")])
def test_a_record_under_the_checkpoints_prefix_that_is_no_position_is_refused_naming_it(kafka_broker, key,
                                                                                       value):
    from confluent_kafka import Producer

    from segack.sinks.kafka_positions import PositionsPartition

    bootstrap, topic = kafka_broker.bootstrap, f"sink-positions-foreign-{zlib.crc32(key + value)}"
    make_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=b"5", key=b"other/0/user-1", partition=0)  # another checkpoint's
    producer.produce(topic, value=value, key=key, partition=0)
    producer.flush(30)
    partition = PositionsPartition(topic, 0, "checkpoint/")
    with pytest.raises(SinkError, match=rf"^KafkaSink: the record at offset 1 of partition 0 of positions "
                                        rf"topic {topic} is no position of this checkpoint's"):
        partition.catch_up({"bootstrap.servers": bootstrap})
    assert partition.positions == {} and partition.next_offset == 0


@pytest.mark.kafka
@pytest.mark.sinks
def test_a_tombstone_drops_its_keys_position_and_a_later_record_gives_it_again(kafka_broker):
    """Issue 54, case 5: a real-time task's tombstones (a position's key with no value) drop the
    key's position for whoever reads the partition; a later position of it counts again."""
    from confluent_kafka import Producer

    from segack.sinks.kafka_positions import PositionsPartition

    bootstrap, topic = kafka_broker.bootstrap, "sink-positions-tombstones"
    make_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in [("gone", b"5"), ("back", b"7"), ("kept", b"2"), ("gone", None), ("back", None),
                       ("back", b"9")]:
        producer.produce(topic, value=value, key=f"checkpoint/0/{key}".encode(), partition=0)
    producer.flush(30)
    partition = PositionsPartition(topic, 0, "checkpoint/")
    assert partition.catch_up({"bootstrap.servers": bootstrap}) == 6
    assert partition.positions == {"0/back": 9, "0/kept": 2}


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_a_key_in_two_key_groups_has_a_position_in_each(tmp_path, kafka_broker):
    """A real-time stream's key group is the input's partition and its position an offset: a key a
    producer sent to two partitions (by a partitioner of its own, against the real-time guide's
    advice) is two sequences, and a high offset in one never skips an event of the other."""
    bootstrap, topic = kafka_broker.bootstrap, "sink-key-two-groups"
    _outputs(bootstrap, topic)
    records = account_events(2, users=1, seed=19)
    sink = _sink(bootstrap, topic)  # 4 positions partitions: key groups 1 and 5 share one
    sink.prepare(_run(tmp_path, 1))
    task, user = _task(sink), json.loads(records[0][1])["user"]
    for (_, value), (key_group, offset) in zip(records, ((1, 1000), (5, 10)), strict=True):
        task([json.loads(value)], [EventIdentity(user, key_group, offset, _checkpoint_id(tmp_path))])
    assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_an_id_a_withdrawn_claim_forgot_is_recorded_again_and_the_next_run_fences_it(tmp_path, kafka_broker):
    """A run that fenced and forgot the ids of an older claim, then gave its own claim up (it failed
    before saving anything), lets the older run go on: the id that run's task starts again (a new
    attempt, in the same process) is recorded again, so the run after fences it."""
    from confluent_kafka import KafkaException

    from segack.spark_adapter.store.kafka_sink_files import registered_producers

    bootstrap, topic = kafka_broker.bootstrap, "sink-withdrawn-claim"
    _outputs(bootstrap, topic)
    records = account_events(150, users=5, seed=20)
    events, identities = _events(records, tmp_path)
    store = CheckpointStore(str(tmp_path))
    _claimed(tmp_path, 4)
    older = _sink(bootstrap, topic)
    older.prepare(_run(tmp_path, 4))
    _task(older)(events[:50], identities[:50])
    _claimed(tmp_path, 5)
    _sink(bootstrap, topic).prepare(_run(tmp_path, 5))
    assert registered_producers(store.files) == []  # fenced, then forgotten
    store.delete_claim_files([5])
    again = _task(older)
    again(events[50:100], identities[50:100])
    assert registered_producers(store.files) == [f"segack-{_checkpoint_id(tmp_path)}-4-p{os.getpid()}"]
    _claimed(tmp_path, 6)
    newest = _sink(bootstrap, topic)
    newest.prepare(_run(tmp_path, 6))
    with pytest.raises(KafkaException, match="fenced"):
        again(events[100:], identities[100:])
    _task(newest)(events, identities)
    assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_checkpoints_sharing_a_positions_topic_never_skip_each_others_events(tmp_path, kafka_broker):
    bootstrap = kafka_broker.bootstrap
    records = account_events(200, users=10, seed=18)
    for name in ("sink-shared-a", "sink-shared-b"):  # a backfill and a stream of the same input, say
        _outputs(bootstrap, name)
        checkpoint = tmp_path / name
        checkpoint.mkdir()
        apply = KafkaLedgerApply(name)
        sink = KafkaSink({"bootstrap.servers": bootstrap}, apply, topics=[apply.ledger, apply.balances],
                         positions_topic="sink-shared-positions", positions_partitions=2)
        sink.prepare(_run(checkpoint, 1))
        _task(sink)(*_events(records, checkpoint))
        assert_each_event_once_in_order(bootstrap, name, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
def test_a_task_attempt_whose_producer_was_fenced_never_starts_another(tmp_path, kafka_broker):
    """Another producer with its id would fence the newer attempt (or the task of a later job that
    holds the id), and commit beside it."""
    from confluent_kafka import KafkaException

    bootstrap, topic = kafka_broker.bootstrap, "sink-attempts"
    _outputs(bootstrap, topic)
    records = account_events(300, users=10, seed=19)
    events, identities = _events(records, tmp_path)
    sink = _sink(bootstrap, topic)
    sink.prepare(_run(tmp_path, 1))
    earlier, newer = _task(sink), _task(sink)  # two attempts of one task: the same transactional id
    earlier(events[:100], identities[:100])
    newer(events[:150], identities[:150])  # its start fenced the earlier attempt
    with pytest.raises(KafkaException, match="fenced"):
        earlier(events[150:200], identities[150:200])
    with pytest.raises(SinkError, match="commits nothing more"):
        earlier(events[150:200], identities[150:200])
    newer(events, identities)  # still the id's holder
    assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.command
def test_the_command_refuses_a_sink_whose_output_topic_is_missing_in_one_line(tmp_path, kafka_broker):
    bootstrap, topic = kafka_broker.bootstrap, "sink-command-refusal"
    make_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, account_events(50, users=5, seed=14))
    topics = _topics(bootstrap)
    done = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                      "--trigger", "available-now")
    assert done.returncode == ExitCode.REFUSED, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: ")]
    assert len(said) == 1 and re.search(rf"KafkaSink: output topics {topic}-balances, {topic}-ledger do not "
                                        rf"exist", said[0]), done.stderr
    # Spark's offset log of the micro-batch it was about to run is all there is: no state, no claim,
    # no producer, no topic.
    assert os.listdir(tmp_path / "checkpoint") == ["stream"]
    assert _topics(bootstrap) == topics


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.sinks
def test_a_broker_restarted_in_the_middle_loses_and_repeats_no_output(tmp_path):
    from tests.kafka import kafka_broker

    with kafka_broker(tmp_path / "broker") as broker:
        bootstrap, topic = broker.bootstrap, "sink-broker-restart"
        make_topic(bootstrap, topic, 3)
        _outputs(bootstrap, topic)
        seqs: dict[str, int] = {}
        records = account_events(3000, users=40, seed=15, start=seqs)
        produce(bootstrap, topic, records)
        process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                               "--trigger", "1s", "--option", "maxOffsetsPerTrigger=300", "--batch-size",
                               "50", "--concurrency", "4", "--commit-offsets-to", "segack-sink-restart")
        _wait_for(lambda: _sent(bootstrap, topic) > 600, 300, "records sent", process)
        broker.stop()
        time.sleep(5)
        broker.start()
        later = account_events(500, users=40, seed=16, start=seqs)
        produce(bootstrap, topic, later)
        records += later
        deadline = time.monotonic() + 180
        while process.poll() is None and len(_ledger(bootstrap, topic)) < len(records):
            assert time.monotonic() < deadline, "the stream neither went on nor stopped"
            time.sleep(1)
        if process.poll() is None:  # it waited for the broker and went on
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
        said = [line for line in err.splitlines()
                if line.startswith("segack stream:") and "stopping" not in line]
        # It waited for the broker and went on (stopped by SIGTERM), or stopped with one line.
        assert process.returncode == ExitCode.OK or (
            process.returncode == ExitCode.FAILED and len(said) == 1), err
        finished = run_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                              "--commit-offsets-to", "segack-sink-restart", run="1")
        assert finished.returncode == ExitCode.OK, finished.stderr
        assert_each_event_once_in_order(bootstrap, topic, records)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.sinks
@pytest.mark.command
def test_a_real_time_stream_sends_each_output_once_and_its_group_follows(tmp_path, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "sink-real-time", "segack-sink-real-time"
    make_topic(bootstrap, topic, 4)
    _outputs(bootstrap, topic)
    seqs: dict[str, int] = {}
    records = account_events(2000, users=50, seed=20, start=seqs)
    produce(bootstrap, topic, records)
    process = start_stream(tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink",
                           "--trigger", "real-time", "--commit-interval", "0.5", "--batch-size", "200",
                           "--concurrency", "8", "--commit-offsets-to", group)
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 240,
              "the group's offsets at the end", process)
    later = account_events(500, users=50, seed=21, start=seqs)  # written while it runs
    produce(bootstrap, topic, later)
    records += later
    _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic), 120,
              "the group's offsets at the new end", process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == ExitCode.OK, err[-3000:]
    assert_each_event_once_in_order(bootstrap, topic, records)
    # The keys' positions from before the later records were dropped once saved done, and their
    # tombstones went with the later transactions (issue 54, case 5): compaction forgets them.
    positions = json.loads((tmp_path / "checkpoint" / "kafka-positions.json").read_bytes())["topic"]
    messages = list(committed_messages(bootstrap, positions))
    tombstones = {message.key() for message in messages if message.value() is None}
    applied = {message.key() for message in messages if message.value() is not None}
    assert tombstones and tombstones <= applied, (len(tombstones), len(applied))
