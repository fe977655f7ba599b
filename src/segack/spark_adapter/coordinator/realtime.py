"""A real-time stream: Kafka topics' records handled as they arrive, by long-running Spark tasks
that read Kafka themselves: :func:`~segack.spark_adapter.stream_real_time`.

Spark's own real-time mode (``trigger(realTime=...)``, Spark 4.1) runs no Python operator but
``foreach``, which hands a writer rows in batches, offers no place to keep calls in flight, and
records offsets only at the end of each batch duration. So segack runs the same shape itself: one
Spark job whose tasks never end while the stream runs, each owning some of the stream's partitions
(of one topic or several, numbered as :mod:`~segack.spark_adapter.coordinator.stream_partitions`
says) and reading them with a consumer of its own (:mod:`~segack.spark_adapter.worker.partition_task`).
Spark places the tasks, and starts a lost one again (it resumes from its partitions' last save).

The driver goes like this:

1. **Check** everything that can be refused before anything is written: the options, the topics
   (``subscribe`` or ``subscribePattern``; each named must exist), the value schema, the session,
   the checkpoint (new, or a real-time stream's of the same topics, or more), the executors' Python.
2. **Claim** the checkpoint for as long as the stream runs, let a sink prepare, and record the
   stream's settings.
3. **Record the starts**: a partition with no progress yet starts at the consumer group's committed
   offset (``commit_offsets_to``), else at ``startingOffsets`` (``earliest`` by default: nothing the
   topic holds is passed over unless told), and that start is recorded in the checkpoint before any
   task reads it, so that every later run starts there too (``latest`` is where the topic ended when
   the first run began, not when a later one does).
4. **Retry the dead letters** (``retry_dead_letters``), each key's in offset order, as a replay
   does (:mod:`~segack.spark_adapter.coordinator.dead_letters`: the letters' key groups are
   partitions' numbers, their positions offsets); those that fail again stay, their keys parked.
   Then **start** the job (:mod:`~segack.spark_adapter.coordinator.realtime_jobs`): as many tasks
   as the session has slots, up to one per partition, each with its partitions; and another, with
   the new ones beside them, each time a topic that matches the subscription is made.
5. **Watch** it: every ``commit_interval`` read each partition's progress, as the tasks recorded
   it, report it (:class:`~segack.spark_adapter.RealTimeReport`), and commit it to the consumer
   group (:mod:`~segack.spark_adapter.coordinator.group_commits`), a failed commit again at the
   next look.
6. **Stop** when ``stop`` is set (the tasks finish the calls they read, save, and end), when a task
   reports a handler failure (it saved first, and asked the others to stop), or when the job fails;
   set ``stop`` twice to interrupt the tasks at once (each partition's progress up to its last save
   is kept).
7. **End**: commit the last progress to the group (tried for up to
   :data:`~segack.spark_adapter.coordinator.group_commits.STOP_SECONDS`), record the stream's end in
   the checkpoint, release the claim.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.dead_letters import RetryOutcome, RetryRun, retry_dead_letters
from segack.spark_adapter.coordinator.group_commits import GroupCommits
from segack.spark_adapter.coordinator.kafka_starts import read_starts, subscribed_partitions
from segack.spark_adapter.coordinator.query import StopRequest
from segack.spark_adapter.coordinator.realtime_jobs import RealTimeJobs, progress_report, record_starts, slots
from segack.spark_adapter.coordinator.run import (
    check_location,
    check_metrics_address,
    check_session,
    claimed,
    metrics_served,
    new_run_id,
)
from segack.spark_adapter.coordinator.stream_partitions import STARTING_AT, StreamPartitions, Subscription
from segack.spark_adapter.errors import ForeignInputError, InputError, OptionError
from segack.spark_adapter.handlers import RunContext, orderable_refusal, prepare_handler, refusing
from segack.spark_adapter.options import RunOptions, takes_options
from segack.spark_adapter.results import RealTimeReport, RealTimeResult
from segack.spark_adapter.sources.kafka import (
    HEADERS,
    UNPARSED,
    includes_headers,
    unparsed_refusal,
    value_schema,
)
from segack.spark_adapter.sources.kafka_settings import ClientLog, librdkafka_client
from segack.spark_adapter.sources.reader_options import spelled
from segack.spark_adapter.sources.value_formats import wire_format
from segack.spark_adapter.spark.executors import check_executors
from segack.spark_adapter.spark.session import setting
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    Checkpoint,
    CheckpointStore,
)
from segack.spark_adapter.store.partitions import REAL_TIME_MODE
from segack.spark_adapter.worker.kafka_records import RecordEvents, check_fields
from segack.spark_adapter.worker.partition_task import (
    PartitionPlan,
)
from segack.spark_adapter.worker.schema_registry import PREFIX as REGISTRY_PREFIX
from segack.spark_adapter.worker.wire_format import AVRO_SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


__all__ = ["BATCH_ONLY_OPTIONS", "DEFAULT_MAX_PENDING", "check_topics", "real_time_options",
           "stream_real_time"]

log = logging.getLogger(__name__)
#: The driver's Kafka clients' own log lines.
CLIENT_LOG = ClientLog(f"{__name__}.client")

#: The reader options a real-time stream takes, in Spark's spelling (the ``kafka.*`` ones too), and
#: ``assign``, refused saying why.
_OPTIONS = ("subscribe", "subscribePattern", "assign", "startingOffsets", "includeHeaders", AVRO_SCHEMA)
#: The run options of replays and micro-batch streams that a real-time stream has no use for, with
#: the value that means "not given".
BATCH_ONLY_OPTIONS = {"segments": None, "hash": "spark", "key_group_bits": None, "method": "auto",
                      "flush_every": 10_000, "flush_interval": 5.0, "verify": "auto", "source": None}
#: Records a partition's task reads ahead of its calls when ``max_pending`` is not given: enough
#: for a slow call not to hold other keys back for long.
DEFAULT_MAX_PENDING = 10_000


def _subscription(options: Mapping[str, str]) -> Subscription:
    unknown = [name for name in options
               if not name.startswith(("kafka.", REGISTRY_PREFIX)) and name not in _OPTIONS]
    if unknown:
        raise OptionError(f"a real-time stream takes the options kafka.*, schema.registry.*, subscribe or "
                          f"subscribePattern, startingOffsets, includeHeaders and {AVRO_SCHEMA}; not "
                          f"{unknown[0]!r}")
    if "kafka.bootstrap.servers" not in options:
        raise OptionError("a real-time stream needs the option kafka.bootstrap.servers")
    return Subscription.from_options(options)


def real_time_options(options: Mapping[str, str]) -> tuple[dict[str, str], Subscription, str, dict[str, str]]:
    """A real-time stream's reader ``options`` checked, with no Spark and no broker: themselves,
    spelled as Spark spells them; the topics to read; where a partition nobody has read starts; and
    the Kafka client's settings (librdkafka's). Raises :class:`~segack.spark_adapter.OptionError` for
    an option a real-time stream does not take (``assign`` among them), neither or both of
    ``subscribe`` and ``subscribePattern``, a pattern that does not compile, a ``startingOffsets`` other than
    ``earliest`` or ``latest``, an ``includeHeaders`` other than ``true`` or ``false``, and
    ``kafka.*`` settings librdkafka cannot take
    (:func:`~segack.spark_adapter.sources.kafka_settings.librdkafka_settings`)."""
    spelt = spelled(options, _OPTIONS, prefixes=("kafka.", REGISTRY_PREFIX))
    subscription = _subscription(spelt)
    starting = str(spelt.get("startingOffsets", "earliest")).strip().lower()
    if starting not in ("earliest", "latest"):
        raise OptionError(f"a real-time stream takes startingOffsets earliest or latest, not {starting!r}")
    includes_headers(spelt)
    kafka = {name: value for name, value in spelt.items() if not name.startswith(REGISTRY_PREFIX)}
    return spelt, subscription, starting, librdkafka_client(kafka)


def _run_options(options: dict[str, Any], handler: Callable[..., Any], commit_interval: Any) -> RunOptions:
    """The run's options, ``max_pending`` :data:`DEFAULT_MAX_PENDING` unless given; an
    :class:`~segack.spark_adapter.OptionError` for one of :data:`BATCH_ONLY_OPTIONS` or a
    ``commit_interval`` that is not a positive number of seconds."""
    if options.get("max_pending") is None:
        options = {**options, "max_pending": DEFAULT_MAX_PENDING}
    given = [name for name, unset in BATCH_ONLY_OPTIONS.items() if options.get(name, unset) != unset]
    if given:
        raise OptionError(f"{given[0]} is not for a real-time stream: its tasks own Kafka partitions, read "
                          f"as records arrive")
    if (isinstance(commit_interval, bool) or not isinstance(commit_interval, (int, float))
            or not commit_interval > 0):
        raise OptionError(f"commit_interval must be a positive number of seconds, not {commit_interval!r}")
    return RunOptions.from_keywords(options, handler=handler, streams=True, caller="stream_real_time")


def _dead_letter_schema(spark: SparkSession, schema: StructType, headers: bool) -> pa.Schema:
    """The dead letters' columns: the events' (rule 1, with their ``headers`` if ``headers``), then
    the dead-letter columns."""
    import pyarrow as pa

    zone = setting(spark, "spark.sql.session.timeZone", "UTC")
    types = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "smallint": pa.int16(),
             "tinyint": pa.int8(), "double": pa.float64(), "float": pa.float32(), "boolean": pa.bool_()}
    return pa.schema([
        ("key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz=zone)),
        *([(HEADERS, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))]
          if headers else []),
        *((field.name, types[field.dataType.simpleString()]) for field in schema.fields),
        (UNPARSED, pa.string()), (DEAD_ERROR, pa.string()), (DEAD_ATTEMPTS, pa.int32()),
        (DEAD_KEY_GROUP, pa.int32()), (DEAD_POSITION, pa.int64()),
    ])


def _stream_partitions(found: tuple[dict[str, int], dict[str, str]], subscription: Subscription,
                       state: Checkpoint, location: str, starting: str,
                       servers: str) -> tuple[StreamPartitions, dict[str, str]]:
    """The stream's partitions, numbered (:mod:`~segack.spark_adapter.coordinator.stream_partitions`),
    from the topics ``found`` (:func:`~segack.spark_adapter.coordinator.kafka_starts.subscribed_partitions`)
    and those the checkpoint's ``state`` records; and where each topic's partitions with no progress
    start: ``starting`` for the topics of a new checkpoint (and of one recorded before this was),
    ``earliest`` for a topic new to the checkpoint, as the checkpoint records it from its first run
    on. An :class:`~segack.spark_adapter.InputError` for a topic named that does not exist, one the
    brokers cannot describe, or a pattern that matches none."""
    counts, unreadable = found
    recorded = StreamPartitions.recorded(state.settings)
    for topic in (*subscription.topics, *recorded.names):
        if topic in unreadable:
            raise InputError(f"Kafka topic {topic!r} at {servers} cannot be read: {unreadable[topic]}")
    missing = [topic for topic in subscription.topics if topic not in counts and topic not in recorded.names]
    if missing:
        raise InputError(f"Kafka topic {missing[0]!r} does not exist at {servers}")
    partitions = recorded.checked(counts, subscription, location)
    if not partitions.pairs:
        raise InputError(f"no Kafka topic at {servers} matches subscribePattern {subscription.pattern!r}")
    known = dict(state.settings.get(STARTING_AT, {}))
    return partitions, {topic: known.get(topic, starting if topic in recorded.names or not recorded.topics
                                         else "earliest") for topic in partitions.names}


def check_topics(kafka_options: Mapping[str, str], store: CheckpointStore) -> None:
    """What :func:`stream_real_time` refuses of its topics against its checkpoint, checked with
    neither Spark nor a write, so that a command refuses it before Spark starts: an
    :class:`~segack.spark_adapter.OptionError` as :func:`real_time_options` says, an
    :class:`~segack.spark_adapter.InputError` for Kafka out of reach or a topic it cannot read
    (:func:`_stream_partitions`), a :class:`~segack.spark_adapter.CheckpointError` for a checkpoint
    of another mode or of a topic the subscription leaves out."""
    _, subscription, starting, settings = real_time_options(kafka_options)
    found = subscribed_partitions(settings, subscription)
    _stream_partitions(found, subscription, _check_checkpoint(store.load(), store), store.location, starting,
                       str(settings.get("bootstrap.servers")))


def _check_checkpoint(state: Checkpoint | None, store: CheckpointStore) -> Checkpoint:
    if state is None:
        return Checkpoint()
    if state.settings.get("mode") != REAL_TIME_MODE:
        raise ForeignInputError(f"checkpoint {store.location} holds a replay or a micro-batch stream; a "
                                f"real-time stream needs a checkpoint of its own (its positions are Kafka "
                                f"offsets)")
    return state


@takes_options(streams=True)
def stream_real_time(
    spark: SparkSession,
    kafka_options: Mapping[str, str],
    value_schema_ddl: str,
    *,
    handler: Callable[[dict[str, Any]], Any],
    checkpoint: str | CheckpointStore,
    value_format: str = "json",
    commit_interval: float = 1.0,
    commit_offsets_to: str | None = None,
    stop: StopRequest | None = None,
    progress: Callable[[RealTimeReport], None] | None = None,
    metrics_port: int | str | None = None,
    **options: Any,
) -> RealTimeResult:
    """Hand each record of Kafka topics to ``handler`` as it arrives, in offset order per key and
    partition, many calls in flight, until asked to stop.

    Each of the topics' partitions is read by a long-running Spark task with a Kafka consumer of its
    own; a record's key is its Kafka key, its order its offset, and its identity (for a
    :class:`~segack.spark_adapter.Sink`) its key, its partition's number as the key group (the
    partition itself for a stream of one topic;
    :mod:`~segack.spark_adapter.coordinator.stream_partitions` numbers several) and its offset as
    the position. Every ``commit_interval`` each partition's progress is saved to ``checkpoint``:
    the offset below which every record is done, and the intervals done above it; then that offset is
    committed to ``commit_offsets_to``. Running it again resumes there: records done above the
    offset are skipped, so a handler sees again at most what was in flight, or finished since the
    last save. Each partition's task reads ahead of its calls at most ``max_pending`` records
    (:data:`~segack.spark_adapter.coordinator.realtime.DEFAULT_MAX_PENDING` unless given).

    Parameters
    ----------
    spark : SparkSession
        The session whose executors run the tasks: it needs a slot per task (as many tasks as it has
        slots, up to one per partition) and ``spark.speculation`` off.
    kafka_options : mapping
        ``kafka.bootstrap.servers`` and the other ``kafka.*`` settings of the Kafka client
        (librdkafka's names, without the prefix), ``subscribe`` (topics, comma-separated) or
        ``subscribePattern`` (a regular expression of topic names: a topic made later that matches
        is read too, from its first record) and, for partitions the checkpoint and the group know
        nothing of when the run starts, ``startingOffsets`` (``earliest``, the default, or
        ``latest``).
    value_schema_ddl : str
        The value's fields (``'account STRING, seq BIGINT'``), of the types
        :func:`~segack.spark_adapter.worker.kafka_records.field_parser` parses.
    handler : callable
        Called with each record as a dict (the columns of
        :func:`~segack.spark_adapter.kafka_stream`), each key's in offset order.
    checkpoint : str or CheckpointStore
        Where progress is kept: a new location, or a real-time stream's checkpoint of the same
        topics (or more: a topic found since takes the next numbers).
    value_format : str, default ``"json"``
        ``json``, or ``avro``, ``protobuf``, ``json-schema`` through the registry of the
        ``schema.registry.*`` options, as :func:`~segack.spark_adapter.kafka_stream` reads them.
    commit_interval : float, default ``1.0``
        Seconds between saves of the partitions' progress (and commits to the group).
    commit_offsets_to : str, optional
        The consumer group to commit each partition's done offset to, never ahead of the checkpoint.
        A partition the checkpoint knows nothing of starts at the group's offset.
    stop : StopRequest, optional
        Set it to stop: the calls read finish, and the last progress is saved.
    progress : callable, optional
        Receives a :class:`~segack.spark_adapter.RealTimeReport` every ``commit_interval``.
    metrics_port : int or str, optional
        Serve the checkpoint's Prometheus metrics on ``http://HOST:PORT/metrics`` while the stream
        runs (each partition's offsets, lag and records pending), as
        :func:`~segack.spark_adapter.replay` does.

    {options}

    Returns
    -------
    RealTimeResult

    Raises
    ------
    OptionError
        An option a real-time stream does not take (``assign``, a reader option of Spark's Kafka
        source), neither or both of ``subscribe`` and ``subscribePattern``, a pattern that does not
        compile, a value field of another type, a ``commit_interval`` that is not a positive number,
        a value format :func:`~segack.spark_adapter.kafka_stream` refuses.
    InputError
        Kafka does not answer, a topic named does not exist, no topic matches the pattern, or a
        topic the checkpoint's stream read is gone or has other partitions than it read (a key's
        records may be in two).
    CheckpointError
        The checkpoint holds a replay or a micro-batch stream, or a stream of a topic the
        subscription leaves out.
    SessionError, CheckpointLocationError, ExecutorEnvironmentError, SinkError
        As :func:`~segack.spark_adapter.stream` raises them, before anything is written.
    HandlerFailedError, ReplayError
        The stream stopped: a handler failed for good, records a partition needs are gone, a
        topic's partitions changed or it was deleted, or the job failed; progress was saved first.
    """
    import confluent_kafka  # noqa: F401  (a missing client is refused here)

    began = time.monotonic()
    run_options = _run_options(options, handler, commit_interval)  # 1
    kafka_options, subscription, starting, settings = real_time_options(kafka_options)
    check_metrics_address(metrics_port)
    headers = includes_headers(kafka_options)
    schema = value_schema(spark, value_schema_ddl, headers)
    fields = check_fields(schema, value_format=value_format)
    found = subscribed_partitions(settings, subscription)
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    state = _check_checkpoint(store.load(), store)
    partitions, starting_at = _stream_partitions(found, subscription, state, store.location, starting,
                                                 str(settings.get("bootstrap.servers")))
    wire, _ = wire_format(kafka_options, value_format, list(partitions.names))
    check_location(spark, store, run_options.shared_local_checkpoint)
    check_executors(spark)
    refused = refusing(handler, [unparsed_refusal(schema, wire), orderable_refusal(
        "key", "offset", UNPARSED, frozenset(schema.fieldNames()))])
    group = (GroupCommits(settings, commit_offsets_to, partitions.pairs)
             if commit_offsets_to is not None else None)
    try:
        starts = read_starts(settings, partitions.pairs, list(range(len(partitions.pairs))), starting_at,
                             group)
        records = RecordEvents(fields, setting(spark, "spark.sql.session.timeZone", "UTC"), wire, headers)
        stop = stop or StopRequest()
        run_id = new_run_id()
        with metrics_served(store, metrics_port), claimed(spark, store, run_id, run_options) as keeper:  # 2
            checkpoint_id = state.settings.setdefault("checkpoint_id", uuid.uuid4().hex)
            prepare_handler(refused, RunContext(
                store.location, checkpoint_id, "key", "offset", run_options.handling.policy,
                run_options.claim_timeout, run_options.handling.batch_size, keeper.claim.number))
            state.settings.update({"mode": REAL_TIME_MODE, **partitions.settings(), STARTING_AT: starting_at,
                                   "key": "key", "order": "offset", "commit_interval": commit_interval,
                                   "commit_offsets_to": commit_offsets_to, "updated_at": time.time(),
                                   "status": "running"})
            keeper.save(state)
            record_starts(store, partitions.pairs, starts, run_id, keeper.claim.number)  # 3
            if group is not None:  # what an earlier run could not commit, before anything else
                group.commit(store.partitions.views())
            retried = RetryOutcome()
            if run_options.retry_dead_letters:  # 4
                retried = retry_dead_letters(RetryRun(
                    spark, store, keeper, refused, "key", run_options.handling, checkpoint_id,
                    f"{run_id}-retry", ("topic", "partition")),
                    SegmentSet.balanced(min(len(partitions.pairs), slots(spark))))
            plan = PartitionPlan(
                store=store.for_tasks(run_id, keeper.claim.number), handler=refused,
                handling=run_options.handling, sources=partitions.pairs, assignment=(), starts=starts,
                consumer=settings, records=records, checkpoint_id=checkpoint_id,
                commit_interval=float(commit_interval), group=commit_offsets_to,
                dead_letter_schema=_dead_letter_schema(spark, schema, headers))
            jobs = RealTimeJobs(spark, store, keeper, state, subscription, settings, group, began)
            watch = jobs.run(plan, partitions, stop, progress)  # 5, 6
            watch.end(state, keeper)  # 7
    finally:
        if group is not None:
            group.close()
    views = store.partitions.views()
    report = progress_report(store, views, began, jobs.before, len(watch.job.plan.sources))
    results = jobs.results
    return RealTimeResult(
        handled=report.handled, skipped=sum(row["skipped"] for row in results),
        dead_letters=sum(row["dead_letters"] for row in results),
        dead_letters_left=store.count_dead_letters(), stopped=stop.asked.is_set(),
        seconds=time.monotonic() - began, partitions=report.partitions, retried=retried.handled,
        retry_failed=retried.kept, group_behind=bool(group and group.lags(views)))


