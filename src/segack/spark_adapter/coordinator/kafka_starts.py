"""Where a Kafka stream starts, asked of the brokers through librdkafka: a topic's partitions, each
one's start (the consumer group's committed offset, else the earliest or the latest), for a
real-time stream (:mod:`~segack.spark_adapter.coordinator.realtime`) and for a new micro-batch query
over Spark Connect, whose client has no JVM to ask with
(:mod:`~segack.spark_adapter.coordinator.query_record`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from segack.spark_adapter.coordinator.group_commits import GroupCommits
from segack.spark_adapter.coordinator.stream_partitions import Subscription
from segack.spark_adapter.errors import InputError, OptionError
from segack.spark_adapter.sources.kafka_settings import ClientLog, security_failure

__all__ = ["group_starts", "partition_starts", "read_starts", "subscribed_partitions", "topic_partitions"]

#: The metadata clients' own log lines.
CLIENT_LOG = ClientLog(f"{__name__}.client")


def topic_partitions(settings: dict[str, str], topic: str, seconds: float = 15) -> list[int]:
    """The topic's partitions, asked of the brokers; :class:`~segack.spark_adapter.InputError` if
    they do not answer in ``seconds``, refuse the client's certificate check or its login (at once),
    or the topic does not exist."""
    found = _metadata(settings, topic, seconds).get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise InputError(f"Kafka topic {topic!r} does not exist at {settings.get('bootstrap.servers')}")
    return sorted(found.partitions)


def subscribed_partitions(settings: dict[str, str], subscription: Subscription,
                          seconds: float = 15) -> tuple[dict[str, int], dict[str, str]]:
    """Each topic of ``subscription`` that exists, and its count of partitions; and each whose
    metadata the brokers answer with an error (not authorized, no leader yet), and that error: one
    metadata request for every topic (asking for a topic by name could make a broker that creates
    topics on request create it). An :class:`~segack.spark_adapter.InputError` as
    :func:`topic_partitions` says."""
    found, unreadable = {}, {}
    for topic, metadata in _metadata(settings, None, seconds).items():
        if not subscription.matches(topic):
            continue
        if metadata.error is not None:
            unreadable[topic] = metadata.error.str()
        elif metadata.partitions:
            found[topic] = len(metadata.partitions)
    return found, unreadable


def _metadata(settings: dict[str, str], topic: str | None, seconds: float) -> dict[str, Any]:
    """The brokers' metadata of ``topic`` (of every topic: ``None``), by topic; an
    :class:`~segack.spark_adapter.InputError` if they do not answer in ``seconds`` or refuse the
    client's certificate check or its login (at once)."""
    from confluent_kafka import Consumer, KafkaException

    said: list[Any] = []  # the client's errors, as its error callback hears them
    try:
        consumer = Consumer({**settings, "group.id": "segack-metadata", "logger": CLIENT_LOG,
                             "error_cb": said.append})
    except (KafkaException, ValueError, TypeError) as error:
        raise OptionError(f"the Kafka options are not ones the client takes: {error}") from None
    servers = settings.get("bootstrap.servers")
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                return dict(consumer.list_topics(topic, timeout=0.5).topics)
            except KafkaException as error:
                consumer.poll(0)  # hears the client's errors
                refused = next(filter(None, (security_failure(heard.str()) for heard in said)), None)
                if refused is not None:
                    raise InputError(f"cannot reach Kafka at {servers}: {refused}") from None
                if time.monotonic() > deadline:
                    raise InputError(f"cannot reach Kafka at {servers}: {error.args[0].str()}") from None
    finally:
        consumer.close()


def partition_starts(consumer: Any, pairs: Sequence[tuple[str, int]], partitions: list[int],
                     starting: Mapping[str, str], committed: Mapping[int, int]) -> dict[int, int]:
    """Where each of ``partitions`` (numbers of ``pairs``, the ``(topic, partition)`` they number)
    starts when it has no progress yet: the group's ``committed`` offset, else the earliest or the
    latest, as ``starting`` says for its topic and ``consumer`` reads the partitions' ends."""
    from confluent_kafka import TopicPartition

    starts = {}
    for partition in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(*pairs[partition]), timeout=30)
        at = starting[pairs[partition][0]]
        starts[partition] = committed.get(partition, high if at == "latest" else low)
    return starts


def read_starts(settings: dict[str, str], pairs: Sequence[tuple[str, int]], partitions: list[int],
                starting: Mapping[str, str], group: GroupCommits | None) -> dict[int, int]:
    """:func:`partition_starts`, through a consumer of the driver's own, from what ``group`` holds."""
    from confluent_kafka import Consumer

    ends = Consumer({**settings, "group.id": "segack-metadata", "enable.auto.commit": False,
                     "logger": CLIENT_LOG})
    try:
        return partition_starts(ends, pairs, partitions, starting, group.read(partitions) if group else {})
    finally:
        ends.close()


def group_starts(options: Mapping[str, str], group: str) -> dict[tuple[str, int], int]:
    """Where a new query over reader ``options``' topics (``subscribe`` or ``assign``) starts in each
    partition when consumer group ``group`` has offsets for some of them: the group's offset (never
    below the partition's earliest, which retention may have moved past it), else the earliest;
    ``{}`` when the group has none. :class:`~segack.spark_adapter.OptionError` for
    ``subscribePattern``, whose topics Spark's reader alone resolves."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    from segack.spark_adapter.sources.kafka_settings import librdkafka_client

    if "subscribePattern" in options:
        raise OptionError(f"over Spark Connect, a new query committing to consumer group {group} cannot "
                          f"start from its offsets under subscribePattern: name the topics with subscribe, "
                          f"or give startingOffsets")
    settings = librdkafka_client(options)
    if "assign" in options:
        by_topic = {str(topic): sorted(int(p) for p in partitions)
                    for topic, partitions in json.loads(options["assign"]).items()}
    else:
        by_topic = {topic.strip(): topic_partitions(settings, topic.strip())
                    for topic in options.get("subscribe", "").split(",") if topic.strip()}
    pairs = [(topic, partition) for topic, partitions in by_topic.items() for partition in partitions]
    if not pairs:
        return {}
    starts: dict[tuple[str, int], int] = {}
    ends = Consumer({**settings, "group.id": "segack-metadata", "enable.auto.commit": False,
                     "logger": CLIENT_LOG})
    try:
        commits = GroupCommits(settings, group, pairs)
        try:
            committed = commits.read(list(range(len(pairs))))
        finally:
            commits.close()
        for number, (topic, partition) in enumerate(pairs):
            low, _ = ends.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            starts[(topic, partition)] = max(committed.get(number, low), low)
    finally:
        ends.close()
    return starts if committed else {}
