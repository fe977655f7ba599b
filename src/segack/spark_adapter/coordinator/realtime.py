"""A real-time stream: a Kafka topic's records handled as they arrive, by long-running Spark tasks
that read Kafka themselves: :func:`~segack.spark_adapter.stream_real_time`.

Spark's own real-time mode (``trigger(realTime=...)``, Spark 4.1) runs no Python operator but
``foreach``, which hands a writer rows in batches, offers no place to keep calls in flight, and
records offsets only at the end of each batch duration. So segack runs the same shape itself: one
Spark job whose tasks never end while the stream runs, each owning some of the topic's partitions
and reading them with a consumer of its own (:mod:`~segack.spark_adapter.worker.partition_task`).
Spark places the tasks, and starts a lost one again (it resumes from its partitions' last save).

The driver goes like this:

1. **Check** everything that can be refused before anything is written: the options, the topic
   (one, which must exist), the value schema, the session, the checkpoint (new, or a real-time
   stream's of the same topic), the executors' Python.
2. **Claim** the checkpoint for as long as the stream runs, let a sink prepare, and record the
   stream's settings.
3. **Record the starts**: a partition with no progress yet starts at the consumer group's committed
   offset (``commit_offsets_to``), else at ``startingOffsets`` (``earliest`` by default: nothing the
   topic holds is passed over unless told), and that start is recorded in the checkpoint before any
   task reads it, so that every later run starts there too (``latest`` is where the topic ended when
   the first run began, not when a later one does).
4. **Retry the dead letters** (``retry_dead_letters``), each key's in offset order, as a replay
   does (:mod:`~segack.spark_adapter.coordinator.dead_letters`: the letters' key groups are
   partitions, their positions offsets); those that fail again stay, their keys parked. Then
   **start** the job: as many tasks as the session has slots, up to one per partition, each with
   its partitions.
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

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.dead_letters import RetryOutcome, RetryRun, retry_dead_letters
from segack.spark_adapter.coordinator.group_commits import GroupCommits
from segack.spark_adapter.coordinator.job import run_tag
from segack.spark_adapter.coordinator.kafka_starts import read_starts, topic_partitions
from segack.spark_adapter.coordinator.query import StopRequest
from segack.spark_adapter.coordinator.run import (
    check_location,
    check_metrics_address,
    check_session,
    claimed,
    metrics_served,
    new_run_id,
)
from segack.spark_adapter.errors import (
    CheckpointError,
    ForeignInputError,
    HandlerFailedError,
    InputError,
    OptionError,
    ReplayError,
    worker_error,
)
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
from segack.spark_adapter.spark.session import is_connect, server_parallelism, setting
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    Checkpoint,
    CheckpointStore,
)
from segack.spark_adapter.store.partitions import DRIVER, REAL_TIME_MODE, PartitionView
from segack.spark_adapter.worker.kafka_records import RecordEvents, check_fields
from segack.spark_adapter.worker.partition_task import (
    RESULT_SCHEMA,
    PartitionPlan,
    run_partitions,
    start_state,
)
from segack.spark_adapter.worker.schema_registry import PREFIX as REGISTRY_PREFIX

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from segack.spark_adapter.store.claims import ClaimKeeper

__all__ = ["BATCH_ONLY_OPTIONS", "DEFAULT_MAX_PENDING", "real_time_options", "stream_real_time"]

log = logging.getLogger(__name__)
#: The driver's Kafka clients' own log lines.
CLIENT_LOG = ClientLog(f"{__name__}.client")

#: The reader options a real-time stream takes, in Spark's spelling (the ``kafka.*`` ones too).
_OPTIONS = ("subscribe", "startingOffsets", "includeHeaders")
#: Seconds between looks at the topic's partitions while the stream runs.
PARTITIONS_LOOK_SECONDS = 10.0
#: Seconds after the job's start by which a task of the run must hold every partition.
STARTUP_SECONDS = 180.0
#: The run options of replays and micro-batch streams that a real-time stream has no use for, with
#: the value that means "not given".
BATCH_ONLY_OPTIONS = {"segments": None, "hash": "spark", "key_group_bits": None, "method": "auto",
                      "flush_every": 10_000, "flush_interval": 5.0, "verify": "auto", "source": None}
#: Records a partition's task reads ahead of its calls when ``max_pending`` is not given: enough
#: for a slow call not to hold other keys back for long.
DEFAULT_MAX_PENDING = 10_000


def _topic(options: Mapping[str, str]) -> str:
    unknown = [name for name in options
               if not name.startswith(("kafka.", REGISTRY_PREFIX)) and name not in _OPTIONS]
    if unknown:
        raise OptionError(f"a real-time stream takes the options kafka.*, schema.registry.*, subscribe, "
                          f"startingOffsets and includeHeaders; not {unknown[0]!r}")
    if "kafka.bootstrap.servers" not in options:
        raise OptionError("a real-time stream needs the option kafka.bootstrap.servers")
    topics = [topic.strip() for topic in options.get("subscribe", "").split(",") if topic.strip()]
    if len(topics) != 1:
        raise OptionError("a real-time stream reads one topic: give it as subscribe=TOPIC")
    return topics[0]


def real_time_options(options: Mapping[str, str]) -> tuple[dict[str, str], str, str, dict[str, str]]:
    """A real-time stream's reader ``options`` checked, with no Spark and no broker: themselves,
    spelled as Spark spells them; the topic; where a partition nobody has read starts; and the
    Kafka client's settings (librdkafka's). Raises :class:`~segack.spark_adapter.OptionError` for
    an option a real-time stream does not take, several topics, a ``startingOffsets`` other than
    ``earliest`` or ``latest``, an ``includeHeaders`` other than ``true`` or ``false``, and
    ``kafka.*`` settings librdkafka cannot take
    (:func:`~segack.spark_adapter.sources.kafka_settings.librdkafka_settings`)."""
    spelt = spelled(options, _OPTIONS, prefixes=("kafka.", REGISTRY_PREFIX))
    topic = _topic(spelt)
    starting = str(spelt.get("startingOffsets", "earliest")).strip().lower()
    if starting not in ("earliest", "latest"):
        raise OptionError(f"a real-time stream takes startingOffsets earliest or latest, not {starting!r}")
    includes_headers(spelt)
    kafka = {name: value for name, value in spelt.items() if not name.startswith(REGISTRY_PREFIX)}
    return spelt, topic, starting, librdkafka_client(kafka)


def _record_starts(store: CheckpointStore, topic: str, starts: Mapping[int, int], run_id: str,
                   claim: int) -> None:
    """Step 3: the start of each partition that nobody has held yet, recorded."""
    recorded = store.partitions.record_starts(
        {partition: start_state(topic, partition, offset, claim) for partition, offset in starts.items()},
        {"run": run_id, "claim": claim})
    for partition in recorded:
        log.info("%s: partition %d of %s starts at offset %d", store.location, partition, topic,
                 starts[partition])


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


def _slots(spark: SparkSession) -> int:
    """The tasks the session runs at once (a Connect server's as it sets them, else as it cuts a range)."""
    if is_connect(spark):
        return max(1, int(setting(spark, "spark.default.parallelism", "0")) or server_parallelism(spark))
    return max(1, spark.sparkContext.defaultParallelism)


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


def _check_checkpoint(state: Checkpoint | None, store: CheckpointStore, topic: str,
                      partitions: int) -> Checkpoint:
    if state is None:
        return Checkpoint()
    mode = state.settings.get("mode")
    if mode != REAL_TIME_MODE:
        raise ForeignInputError(f"checkpoint {store.location} holds a replay or a micro-batch stream; a "
                                f"real-time stream needs a checkpoint of its own (its positions are Kafka "
                                f"offsets)")
    if state.settings.get("topic") != topic:
        raise ForeignInputError(f"checkpoint {store.location} is a real-time stream of topic "
                                f"{state.settings.get('topic')!r}, not {topic!r}")
    was = state.settings.get("partitions")
    if was is not None and was != partitions:
        raise InputError(_changed(topic, was, partitions))
    return state


def _reports(store: CheckpointStore, views: Mapping[int, PartitionView], began: float, claim: int,
             partitions: list[int]) -> RealTimeReport:
    """The partitions' progress as the tasks last saved it (``views``); ``handled``: by this run
    (``claim``)."""
    handled = sum(int(view.state.get("handled", 0)) for view in views.values()
                  if view.state is not None and view.state.get("claim") == claim)
    reports = tuple(report for report in store.partitions.reports(views) if report.partition in partitions)
    return RealTimeReport(handled, time.monotonic() - began, reports)


class _Job:
    """The job of the stream's tasks, in a thread of its own, tagged so that it can be interrupted."""

    def __init__(self, spark: SparkSession, plan: PartitionPlan, tasks: int, tag: str) -> None:
        self.spark, self.plan, self.tasks, self.tag = spark, plan, tasks, tag
        self.results: pa.Table | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="segack-real-time-job", daemon=True)

    def _run(self) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        self.spark.addTag(self.tag)
        try:
            frame = self.spark.range(0, self.tasks, 1, self.tasks).mapInArrow(
                functools.partial(run_partitions, self.plan), from_arrow_schema(RESULT_SCHEMA))
            self.results = frame.toArrow()
        except BaseException as error:
            self.error = error
        finally:
            self.spark.removeTag(self.tag)


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
    """Hand each record of a Kafka topic to ``handler`` as it arrives, in offset order per key, many
    calls in flight, until asked to stop.

    Each of the topic's partitions is read by a long-running Spark task with a Kafka consumer of its
    own; a record's key is its Kafka key, its order its offset, and its identity (for a
    :class:`~segack.spark_adapter.Sink`) its key, its partition as the key group and its offset as
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
        (librdkafka's names, without the prefix), ``subscribe`` (one topic) and, for partitions the
        checkpoint and the group know nothing of, ``startingOffsets`` (``earliest``, the default, or
        ``latest``).
    value_schema_ddl : str
        The value's fields (``'account STRING, seq BIGINT'``), of the types
        :func:`~segack.spark_adapter.worker.kafka_records.field_parser` parses.
    handler : callable
        Called with each record as a dict (the columns of
        :func:`~segack.spark_adapter.kafka_stream`), each key's in offset order.
    checkpoint : str or CheckpointStore
        Where progress is kept: a new location, or a real-time stream's checkpoint of the same topic.
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
        An option a real-time stream does not take (``subscribePattern``, ``assign``, several topics,
        a reader option of Spark's Kafka source), a value field of another type, a ``commit_interval``
        that is not a positive number, a value format :func:`~segack.spark_adapter.kafka_stream` refuses.
    InputError
        Kafka does not answer, the topic does not exist, or it has other partitions than the
        checkpoint's stream read (a key's records may be in two).
    CheckpointError
        The checkpoint holds a replay, a micro-batch stream or another topic's stream.
    SessionError, CheckpointLocationError, ExecutorEnvironmentError, SinkError
        As :func:`~segack.spark_adapter.stream` raises them, before anything is written.
    HandlerFailedError, ReplayError
        The stream stopped: a handler failed for good, records a partition needs are gone, the
        topic's partitions changed, or the job failed; progress was saved first.
    """
    import confluent_kafka  # noqa: F401  (a missing client is refused here)

    began = time.monotonic()
    run_options = _run_options(options, handler, commit_interval)  # 1
    kafka_options, topic, starting, settings = real_time_options(kafka_options)
    check_metrics_address(metrics_port)
    headers = includes_headers(kafka_options)
    schema = value_schema(spark, value_schema_ddl, headers)
    fields = check_fields(schema, value_format=value_format)
    wire, _ = wire_format(kafka_options, value_format, [topic])
    partitions = topic_partitions(settings, topic)
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    state = _check_checkpoint(store.load(), store, topic, len(partitions))
    check_location(spark, store, run_options.shared_local_checkpoint)
    check_executors(spark)
    refused = refusing(handler, [unparsed_refusal(schema, wire), orderable_refusal(
        "key", "offset", UNPARSED, frozenset(schema.fieldNames()))])
    group = GroupCommits(settings, topic, commit_offsets_to) if commit_offsets_to is not None else None
    try:
        starts = read_starts(settings, topic, partitions, starting, group)
        records = RecordEvents(fields, setting(spark, "spark.sql.session.timeZone", "UTC"), wire, headers)
        dead_letter_schema = _dead_letter_schema(spark, schema, headers)
        stop = stop or StopRequest()
        run_id = new_run_id()
        with metrics_served(store, metrics_port), claimed(spark, store, run_id, run_options) as keeper:  # 2
            checkpoint_id = state.settings.setdefault("checkpoint_id", uuid.uuid4().hex)
            prepare_handler(refused, RunContext(
                store.location, checkpoint_id, "key", "offset", run_options.handling.policy,
                run_options.claim_timeout, run_options.handling.batch_size, keeper.claim.number))
            state.settings.update({"mode": REAL_TIME_MODE, "topic": topic, "partitions": len(partitions),
                                   "key": "key", "order": "offset", "commit_interval": commit_interval,
                                   "commit_offsets_to": commit_offsets_to, "updated_at": time.time(),
                                   "status": "running"})
            keeper.save(state)
            _record_starts(store, topic, starts, run_id, keeper.claim.number)  # 3
            if group is not None:  # what an earlier run could not commit, before anything else
                group.commit(store.partitions.views())
            tasks = min(len(partitions), _slots(spark))
            retried = RetryOutcome()
            if run_options.retry_dead_letters:  # 4
                retried = retry_dead_letters(RetryRun(
                    spark, store, keeper, refused, "key", run_options.handling, checkpoint_id,
                    f"{run_id}-retry"), SegmentSet.balanced(tasks))
            plan = PartitionPlan(
                store=store.for_tasks(run_id, keeper.claim.number), handler=refused,
                handling=run_options.handling, topic=topic,
                assignment=tuple(tuple(partitions[index::tasks]) for index in range(tasks)), starts=starts,
                consumer=settings, records=records, checkpoint_id=checkpoint_id,
                commit_interval=float(commit_interval), group=commit_offsets_to,
                dead_letter_schema=dead_letter_schema)
            log.info("%s: a real-time stream of %s: %d partitions in %d tasks", store.location, topic,
                     len(partitions), tasks)
            job = _Job(spark, plan, tasks, run_tag(run_id))
            job.thread.start()
            watch = _Watch(job, store, run_id, keeper, began, partitions, group)
            try:
                watch.until_ended(stop, progress, lambda: topic_partitions(settings, topic))  # 5, 6
            except BaseException:
                watch.stop_now()  # no task may go on with the claim released
                raise
            watch.end(state, keeper)  # 7
    finally:
        if group is not None:
            group.close()
    views = store.partitions.views()
    report = _reports(store, views, began, keeper.claim.number, partitions)
    results = job.results.to_pylist() if job.results is not None else []
    return RealTimeResult(
        handled=report.handled, skipped=sum(row["skipped"] for row in results),
        dead_letters=sum(row["dead_letters"] for row in results),
        dead_letters_left=store.count_dead_letters(), stopped=stop.asked.is_set(),
        seconds=time.monotonic() - began, partitions=report.partitions, retried=retried.handled,
        retry_failed=retried.kept, group_behind=bool(group and group.lags(views)))


class _Watch:
    """The driver's side of a running job (steps 5 to 7): reports, the group's commits, stop
    requests, and the topic's partitions looked at every :data:`PARTITIONS_LOOK_SECONDS`."""

    def __init__(self, job: _Job, store: CheckpointStore, run_id: str, keeper: ClaimKeeper, began: float,
                 partitions: list[int], group: GroupCommits | None) -> None:
        self.job, self.store, self.run_id, self.keeper = job, store, run_id, keeper
        self.claim = keeper.claim.number
        self.began, self.partitions, self.group = began, partitions, group
        #: When the job started: the tasks' slots are looked for from then on.
        self.job_began = time.monotonic()
        self.asked = self.interrupted = False
        #: Why the stream stopped for its partitions (the topic's changed, or some never read), if it did.
        self.changed: str | None = None
        self.all_started = False

    def until_ended(self, stop: StopRequest, progress: Callable[[RealTimeReport], None] | None,
                    list_partitions: Callable[[], list[int]]) -> None:
        next_look = time.monotonic() + PARTITIONS_LOOK_SECONDS
        interval = self.job.plan.commit_interval
        while self.job.thread.is_alive():
            self.job.thread.join(interval)
            if stop.asked.is_set():
                self._ask("asked to stop")
            if stop.now.is_set():
                self.stop_now()
            if time.monotonic() >= next_look and self.changed is None:
                next_look = time.monotonic() + PARTITIONS_LOOK_SECONDS
                self._look(list_partitions)
            try:
                views = self.store.partitions.views()
            except (OSError, CheckpointError) as error:  # the store out of reach for a moment
                log.warning("%s: could not read the partitions' progress: %s", self.store.location, error)
                continue
            if self.group is not None and self.keeper.lost is None:  # a newer run's group now
                self.group.commit(views)
            self._check_started(views)
            if progress is not None and self.job.thread.is_alive():
                progress(_reports(self.store, views, self.began, self.claim, self.partitions))

    def end(self, state: Checkpoint, keeper: ClaimKeeper) -> None:
        """Step 7: commit the last progress to the group, record how the stream ended, then raise what
        ended it, if anything."""
        job = self.job
        if self.group is not None and keeper.lost is None:
            self.group.commit_until(self.store.partitions.views)
        errors = _errors(job.results)
        state.settings.update({"updated_at": time.time(),
                               "status": "failed" if errors or job.error or self.changed else "stopped"})
        if keeper.lost is None:
            keeper.save(state)
        self.store.clear_stop(self.run_id)
        if keeper.lost is not None:
            raise keeper.lost
        if self.changed:
            raise ReplayError(self.changed)
        if errors:  # a handler's failure; records gone, after the stream handled others: not a refusal
            raise errors[0] if isinstance(errors[0], HandlerFailedError) else ReplayError(str(errors[0]))
        if job.error is not None and not self.interrupted:
            raise ReplayError(f"the real-time stream's job failed: {worker_error(job.error)}") from job.error

    def _check_started(self, views: Mapping[int, PartitionView]) -> None:
        """Stop the stream if some partitions are not held by a task of this run
        :data:`STARTUP_SECONDS` after the job started: their tasks found no free slot (the running
        ones never end), and nothing else would tell. A task holds its partitions before its first
        call, however long that one takes."""
        if self.all_started or self.changed is not None or \
                time.monotonic() - self.job_began < STARTUP_SECONDS:
            return
        started = {partition for partition, view in views.items()
                   if view.owner.get("run") == self.run_id and view.owner.get("attempt") != DRIVER}
        missing = [partition for partition in self.partitions if partition not in started]
        self.all_started = not missing
        if missing:
            self.changed = (f"partitions {', '.join(map(str, missing))} of topic {self.job.plan.topic} were "
                            f"not read {STARTUP_SECONDS:g} s after the stream's tasks started: their tasks "
                            f"found no free slot (a real-time stream's tasks never end); give the session a "
                            f"slot per task (it runs {self.job.tasks})")
            self._ask(self.changed)

    def _ask(self, reason: str) -> None:
        if not self.asked:
            self.asked = True
            self.store.request_stop(self.run_id, reason)

    def stop_now(self) -> None:
        """Interrupt the tasks at once: each partition keeps what its last save recorded."""
        if not self.interrupted:
            self.interrupted = True
            self.job.spark.interruptTag(self.job.tag)

    def _look(self, list_partitions: Callable[[], list[int]]) -> None:
        """Stop the stream if the topic's partitions changed: a key's later records may be in another
        partition, whose offsets do not follow its earlier ones."""
        try:
            now = list_partitions()
        except InputError as error:  # Kafka out of reach for a moment: the tasks' consumers retry
            log.warning("%s: could not list the partitions of the stream's topic: %s", self.store.location,
                        error)
            return
        if now != self.partitions:
            self.changed = _changed(self.job.plan.topic, len(self.partitions), len(now))
            log.info("%s: the topic's partitions changed: the tasks are asked to stop", self.store.location)
            self._ask(self.changed)


def _changed(topic: str, was: int, now: int) -> str:
    return (f"topic {topic} has {now} partitions, not the {was} this stream reads: a key's later records "
            f"may now be in another partition, whose offsets do not order them after its earlier ones; "
            f"start a new checkpoint (with --commit-offsets-to, it starts where the group is)")


def _errors(results: pa.Table | None) -> list[HandlerFailedError | InputError]:
    """What ended the tasks that did not stop as asked: handler failures first."""
    import pickle

    if results is None:
        return []
    found = [pickle.loads(data) for data in results.column("error").to_pylist() if data is not None]
    return sorted(found, key=lambda error: not isinstance(error, HandlerFailedError))
