"""A real-time stream of several Kafka topics (``subscribe=a,b``, ``subscribePattern``) over a real
broker: each topic-partition numbered once for the checkpoint's life, each key's records in order
per topic, a topic made while the stream runs read from its first record, the group committed for
every topic, and a checkpoint that refuses a subscription leaving one of its topics out."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from segack.cli import ExitCode, main
from segack.spark_adapter import serve_metrics
from segack.spark_adapter.coordinator.stream_partitions import StreamPartitions, Subscription
from segack.spark_adapter.errors import ForeignInputError, InputError, OptionError
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.spark_handlers import read_log
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
from tests.test_metrics import scrape
from tests.test_realtime import REAL_TIME, _stopped

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _start(tmp_path, bootstrap: str, subscription: str, *extra: str, run: str = "0") -> subprocess.Popen[str]:
    """``segack stream --trigger real-time`` with ``subscription`` (``subscribe=...`` or
    ``subscribePattern=...``) as its topics."""
    command = stream_command(tmp_path, bootstrap, "-", "tests.spark_handlers:record_kafka", *REAL_TIME,
                             *extra)
    command[command.index("subscribe=-")] = subscription
    return subprocess.Popen(command, cwd=ROOT, env=environment(tmp_path, run), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_each_record_once_in_order_per_topic(handled: list[dict], written: dict[str, list]) -> None:
    """Each record of each topic of ``written`` handled once, each user's in ``seq`` order within its
    topic (a user's records in two topics are two keys' worth of order)."""
    where = [(event["topic"], event["partition"], event["offset"]) for event in handled]
    assert len(where) == len(set(where)), "a record handled twice"
    last: dict[tuple[str, str], int] = {}
    for event in handled:
        pair = (event["topic"], event["user"])
        assert event["seq"] == last.get(pair, -1) + 1, f"{pair}: {event['seq']} after {last.get(pair)}"
        last[pair] = event["seq"]
    expected: dict[tuple[str, str], int] = {}
    for topic, records in written.items():
        for user, value in records:
            expected[(topic, user)] = max(expected.get((topic, user), -1), json.loads(value)["seq"])
    assert last == expected


@pytest.mark.streams
def test_a_pattern_of_topics_is_read_a_topic_made_later_too_each_keys_order_kept_per_topic(
        tmp_path, kafka_broker, capsys):
    bootstrap, group = kafka_broker.bootstrap, "segack-real-time-topics"
    written = {"rt-topics-a": account_events(600, users=30, seed=61),
               "rt-topics-b": account_events(900, users=30, seed=62)}  # the same users, in both topics
    make_topic(bootstrap, "rt-topics-a", 2)
    make_topic(bootstrap, "rt-topics-b", 3)
    make_topic(bootstrap, "rt-other", 1)  # matches no pattern of the stream's: never read
    for topic, records in written.items():
        produce(bootstrap, topic, records)
    produce(bootstrap, "rt-other", account_events(10, users=2, seed=60))
    log = str(tmp_path / "log.jsonl")
    process = _start(tmp_path, bootstrap, "subscribePattern=rt-topics-.*", "--concurrency", "4",
                     "--commit-offsets-to", group)
    _wait_for(lambda: len(read_log(log)) >= 1500, 240, "both topics' backlogs handled", process)
    # A topic made while the stream runs, that the pattern matches: read from its first record, its
    # partitions numbered after the others'.
    written["rt-topics-c"] = account_events(300, users=30, seed=63)
    make_topic(bootstrap, "rt-topics-c", 2)
    produce(bootstrap, "rt-topics-c", written["rt-topics-c"])
    _wait_for(lambda: len(read_log(log)) >= 1800, 120, "the new topic's records handled", process)
    for topic in written:
        _wait_for(lambda topic=topic: committed_offsets(bootstrap, topic, group) == end_offsets(
            bootstrap, topic), 60, f"the group's offsets of {topic} at its end", process)
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    recorded = StreamPartitions.recorded(store.load_existing().settings)
    assert recorded.topics == (("rt-topics-a", 2), ("rt-topics-b", 3), ("rt-topics-c", 2))
    assert sorted(store.partitions.views()) == list(range(7))
    assert {(report.topic, report.partition): report.number
            for report in store.partitions.reports()} == recorded.numbers()
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    status = capsys.readouterr().out
    assert "topics rt-topics-a, rt-topics-b, rt-topics-c, 7 partitions with progress" in status, status
    assert "  rt-topics-c/1     next offset" in status and "  rt-topics-b/2     next offset" in status, status
    with serve_metrics(str(tmp_path / "checkpoint"), 0) as server:
        samples = scrape(server.port)
    assert {(labels["topic"], labels["partition"]) for labels, _ in samples["segack_kafka_next_offset"]} == {
        *(("rt-topics-a", str(p)) for p in range(2)), *(("rt-topics-b", str(p)) for p in range(3)),
        *(("rt-topics-c", str(p)) for p in range(2))}
    out, _ = _stopped(process)
    assert "stopped as asked: 1,800 events handled" in out, out
    _assert_each_record_once_in_order_per_topic(read_log(log), written)
    # The next run, given the topics by name: the same numbers, nothing repeated, what is new handled.
    written["rt-topics-a"] += account_events(100, users=30, seed=64, start={
        user: json.loads(value)["seq"] + 1 for user, value in written["rt-topics-a"]})
    produce(bootstrap, "rt-topics-a", written["rt-topics-a"][600:])
    again = _start(tmp_path, bootstrap, "subscribe=rt-topics-a,rt-topics-b,rt-topics-c",
                   "--commit-offsets-to", group, run="1")
    _wait_for(lambda: len(read_log(log)) >= 1900, 240, "the newest records handled", again)
    _wait_for(lambda: committed_offsets(bootstrap, "rt-topics-a", group) == end_offsets(
        bootstrap, "rt-topics-a"), 60, "the group at the end", again)
    _stopped(again)
    handled = read_log(log)
    assert [event["run"] for event in handled[1800:]] == ["1"] * 100
    _assert_each_record_once_in_order_per_topic(handled, written)
    assert StreamPartitions.recorded(store.load_existing().settings) == recorded
    # A subscription that leaves one of its topics out: refused before Spark starts (a master nobody
    # runs is never asked for), the checkpoint as it was.
    before = store.load_existing().settings
    refused = _start(tmp_path, bootstrap, "subscribe=rt-topics-a,rt-topics-c", "--master", "spark://127.0.0.1:9",
                     run="2")
    _, err = refused.communicate(timeout=180)
    assert refused.returncode == ExitCode.REFUSED, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("segack")]
    assert "is a real-time stream of topics rt-topics-a, rt-topics-b, rt-topics-c" in line, line
    assert "subscribe to rt-topics-b too" in line, line
    assert store.load_existing().settings == before and len(read_log(log)) == 1900
    # A topic the stream reads, deleted while it runs: it stops in one line naming it (exit 1), under
    # subscribe as under a pattern.
    from confluent_kafka.admin import AdminClient

    written["rt-topics-a"] += account_events(10, users=30, seed=65, start={
        user: json.loads(value)["seq"] + 1 for user, value in written["rt-topics-a"]})
    produce(bootstrap, "rt-topics-a", written["rt-topics-a"][700:])
    last = _start(tmp_path, bootstrap, "subscribe=rt-topics-a,rt-topics-b,rt-topics-c", run="3")
    _wait_for(lambda: len(read_log(log)) >= 1910, 240, "the last records handled", last)
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it alive
    for future in admin.delete_topics(["rt-topics-b"]).values():
        future.result(30)
    _, err = last.communicate(timeout=120)
    assert last.returncode == ExitCode.FAILED, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("segack")]
    assert "rt-topics-b" in line, line


def test_a_subscription_numbers_the_partitions_it_had_first_and_new_topics_after_them():
    pattern = Subscription.from_options({"subscribePattern": "orders-.*"})
    assert pattern.matches("orders-eu") and not pattern.matches("refunds-orders-eu")
    assert not Subscription.from_options({"subscribePattern": ".*"}).matches("__consumer_offsets")
    assert Subscription.from_options({"subscribe": " a, b ,a"}).topics == ("a", "b")
    old = StreamPartitions.recorded({"topic": "orders-us", "partitions": 2})  # a one-topic checkpoint's
    assert old.pairs == (("orders-us", 0), ("orders-us", 1))
    grown = old.checked({"orders-us": 2, "orders-eu": 3, "orders-ap": 1}, pattern, "ck")
    assert grown.topics == (("orders-us", 2), ("orders-ap", 1), ("orders-eu", 3))
    assert grown.numbers()[("orders-eu", 0)] == 3 and grown.pairs[2] == ("orders-ap", 0)
    assert StreamPartitions.recorded(grown.settings()) == grown
    assert grown.checked({"orders-us": 2, "orders-eu": 3, "orders-ap": 1}, pattern, "ck") == grown
    with pytest.raises(InputError, match="topic orders-eu has 4 partitions, not the 3 this stream reads"):
        grown.checked({"orders-us": 2, "orders-eu": 4, "orders-ap": 1}, pattern, "ck")
    with pytest.raises(InputError, match="'orders-ap', which this stream reads, does not exist"):
        grown.checked({"orders-us": 2, "orders-eu": 3}, pattern, "ck")
    with pytest.raises(ForeignInputError, match="subscribe to orders-ap too"):
        grown.checked({"orders-us": 2, "orders-eu": 3, "orders-ap": 1},
                      Subscription.from_options({"subscribe": "orders-us,orders-eu"}), "ck")


@pytest.mark.parametrize(("options", "said"), [
    ({}, "needs one of the options subscribe"),
    ({"subscribe": "a", "subscribePattern": "a.*"}, "needs one of the options subscribe"),
    ({"subscribe": " , "}, "subscribe names no topic"),
    ({"subscribePattern": "a("}, "is not a regular expression"),
    ({"subscribePattern": " "}, "subscribePattern is empty"),
    ({"assign": '{"a": [0]}'}, "assign is not for it"),
])
def test_a_subscription_a_real_time_stream_cannot_read_is_refused_naming_why(options, said):
    with pytest.raises(OptionError, match=said):
        Subscription.from_options(options)


def test_a_topic_new_to_a_checkpoint_starts_at_its_first_record_whatever_starting_offsets_says():
    from segack.spark_adapter.coordinator.realtime import _stream_partitions
    from segack.spark_adapter.store.checkpoint import Checkpoint

    pattern = Subscription.from_options({"subscribePattern": "orders-.*"})
    found = ({"orders-us": 2, "orders-eu": 1}, {})
    # A new checkpoint: every topic starts where startingOffsets says.
    partitions, starting = _stream_partitions(found, pattern, Checkpoint(), "ck", "latest", "b:9092")
    assert partitions.names == ("orders-eu", "orders-us") and starting == dict.fromkeys(partitions.names,
                                                                                         "latest")
    # A checkpoint of orders-us (recorded before where topics start was): orders-eu, found since, starts
    # at its earliest, not at a latest that would pass over what was written before the stream saw it.
    older = Checkpoint({"topic": "orders-us", "partitions": 2})
    partitions, starting = _stream_partitions(found, pattern, older, "ck", "latest", "b:9092")
    assert partitions.names == ("orders-us", "orders-eu")
    assert starting == {"orders-us": "latest", "orders-eu": "earliest"}
    # What the checkpoint records rules: a run killed after recording a topic, before its starts.
    recorded = Checkpoint({**partitions.settings(),
                           "starting_at": {"orders-us": "latest", "orders-eu": "earliest"}})
    assert _stream_partitions(found, pattern, recorded, "ck", "latest", "b:9092")[1] == starting


@pytest.mark.parametrize(("found", "options", "said"), [
    (({"a": 1}, {}), {"subscribe": "a,b"}, "Kafka topic 'b' does not exist at b:9092"),
    (({"a": 1}, {"b": "Broker: Topic authorization failed"}), {"subscribe": "a,b"},
     "Kafka topic 'b' at b:9092 cannot be read: Broker: Topic authorization failed"),
    (({"a": 1}, {}), {"subscribePattern": "orders-.*"}, "no Kafka topic at b:9092 matches subscribePattern"),
])
def test_topics_a_stream_cannot_read_are_refused_naming_them(found, options, said):
    from segack.spark_adapter.coordinator.realtime import _stream_partitions
    from segack.spark_adapter.store.checkpoint import Checkpoint

    with pytest.raises(InputError, match=re.escape(said)):
        _stream_partitions(found, Subscription.from_options(options), Checkpoint(), "ck", "earliest",
                           "b:9092")


def test_a_retry_hands_each_partitions_letters_of_a_key_apart_from_anothers(tmp_path):
    """A real-time stream's retry keys its letters by topic and partition too: a key's letter of one
    topic that fails again does not keep its letter of another topic back."""
    import pyarrow as pa

    from segack.spark_adapter.options import Handling
    from segack.spark_adapter.store.checkpoint import (
        DEAD_ATTEMPTS,
        DEAD_ERROR,
        DEAD_KEY_GROUP,
        DEAD_POSITION,
    )
    from segack.spark_adapter.worker.retry_task import RetryPlan, _RetryTask

    handled = []

    def handler(event):
        if event["topic"] == "orders":
            raise ValueError("still failing")
        handled.append((event["topic"], event["key"]))

    letters = pa.record_batch({
        "key": ["k", "k"], "topic": ["orders", "refunds"], "partition": pa.array([0, 0], pa.int32()),
        "offset": [5, 7], DEAD_ERROR: ["e", "e"], DEAD_ATTEMPTS: pa.array([1, 1], pa.int32()),
        DEAD_KEY_GROUP: pa.array([0, 1], pa.int32()), DEAD_POSITION: [5, 7]})
    store = CheckpointStore(str(tmp_path / "checkpoint")).for_tasks("run", 1)
    for places, expected in ((("topic", "partition"), [("refunds", "k")]), ((), [])):
        handled.clear()
        task = _RetryTask(RetryPlan(store, handler, "key", ("key", "topic", "partition", "offset"),
                                    letters.schema, Handling(), places=places), 0, 0)
        task.handle(letters)
        assert task.finish() is None
        assert handled == expected  # by key alone, the refunds letter waits behind the orders one
