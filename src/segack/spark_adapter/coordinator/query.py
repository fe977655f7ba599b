"""A Structured Streaming query that segack runs itself: :func:`~segack.spark_adapter.stream`.

Where :func:`~segack.spark_adapter.foreach_batch` gives a function for the user's own query, here
segack starts the query, holds the checkpoint for the query's whole life and keeps Spark's own
checkpoint of the query inside it (``CHECKPOINT/stream``), so one location is all a user gives.
The query goes like this:

1. **Check** everything that can be refused before anything is written: the options, the trigger,
   the session, the checkpoint's location, where the query starts (Spark's checkpoint of it held
   against segack's record: :mod:`~segack.spark_adapter.coordinator.query_record`), the executors'
   Python.
2. **Claim** the checkpoint, for as long as the query runs (:mod:`~segack.spark_adapter.store.claims`),
   and serve its metrics (``metrics_port``: :mod:`~segack.spark_adapter.console.metrics`).
3. **Retry the dead letters** first, with ``retry_dead_letters`` (a query with nothing new to read
   runs no micro-batch to retry them in). Then **start** the query: each micro-batch is a run of its
   own under that claim (:class:`~segack.spark_adapter.coordinator.streaming.BatchReplay`), its
   events numbered after those of earlier batches in each key group.
4. **Watch** it: after each micro-batch Spark reports (its end offsets, the source's latest), tell
   the caller, record the report in the checkpoint with the next batch, and, for Kafka, commit the
   end offsets to the consumer group (:mod:`~segack.spark_adapter.sources.kafka`, rule 4). For
   Kafka, every few seconds, read each partition's end offset from the broker and keep the view
   (the ends, the offsets done and committed) in the checkpoint, so that the lag that status, the
   page and the metrics show moves while a micro-batch waits for its trigger.
5. **Stop** when the input is drained (``trigger="available-now"``), when a batch fails, or when
   ``stop`` is set: then no micro-batch starts any more, the one under way finishes, and the query
   ends at that commit; or, still running ``stop_timeout`` seconds later, it ends at its tasks'
   next flush, their calls in flight finished and its progress saved, for the next run to finish.
   Set ``stop`` twice (``StopRequest.now``) to interrupt the batch at once instead.
   Once another run has taken the checkpoint over, the query stops at once, idle or not, and the
   stream raises :class:`~segack.spark_adapter.ClaimLostError`.
6. **End**: record the last report, commit the last offsets, release the claim (none of it under a
   claim lost).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.coordinator.connect_batches import ConnectWatch, ServerBatches
from segack.spark_adapter.coordinator.dead_letters import RetryOutcome
from segack.spark_adapter.coordinator.query_record import plan_start, record_start
from segack.spark_adapter.coordinator.query_watch import (
    DEFAULT_STOP_TIMEOUT,
    QueryBatches,
    StopRequest,
    Watch,
)
from segack.spark_adapter.coordinator.run import (
    check_location,
    check_metrics_address,
    check_session,
    claimed,
    metrics_served,
    new_run_id,
)
from segack.spark_adapter.coordinator.state import StoppedError
from segack.spark_adapter.coordinator.streaming import BatchReplay
from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.handlers import orderable_refusal, refusing
from segack.spark_adapter.options import RunOptions, takes_options
from segack.spark_adapter.results import BatchReport, StreamResult
from segack.spark_adapter.sources.delta import DeltaChangeFeed
from segack.spark_adapter.sources.kafka import UNPARSED, commit_offsets
from segack.spark_adapter.sources.kafka_settings import librdkafka_client
from segack.spark_adapter.spark.executors import check_executors
from segack.spark_adapter.spark.session import is_connect
from segack.spark_adapter.store.checkpoint import STREAM_DIR, Checkpoint, CheckpointStore
from segack.spark_adapter.store.partitions import refuse_real_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from segack.spark_adapter.sources.kafka import KafkaStream

__all__ = ["StopRequest", "check_stop_timeout", "parse_trigger", "stream"]

log = logging.getLogger(__name__)


def check_stop_timeout(stop_timeout: Any) -> None:
    """Refuse (:class:`~segack.spark_adapter.OptionError`) a ``stop_timeout`` that is neither ``None``
    nor a positive number of seconds."""
    if stop_timeout is None:
        return
    if isinstance(stop_timeout, bool) or not isinstance(stop_timeout, (int, float)) or not stop_timeout > 0:
        raise OptionError(f"stop_timeout must be a positive number of seconds or None, not {stop_timeout!r}")


def _cut_short(error: BaseException | None) -> int | None:
    """The micro-batch a stop ended early, from the error that ended the query."""
    return error.batch_id if isinstance(error, StoppedError) else None


def parse_trigger(trigger: str | float) -> dict[str, Any]:
    """``writeStream.trigger``'s keywords for ``"available-now"`` (handle what is there, then end)
    or an interval: seconds, or text such as ``"5s"``, ``"500ms"``, ``"1min"``."""
    if trigger == "available-now":
        return {"availableNow": True}
    if isinstance(trigger, (int, float)) and not isinstance(trigger, bool):
        seconds = float(trigger)
    elif isinstance(trigger, str):
        text = trigger.strip().lower()
        units = (("ms", 0.001), ("min", 60.0), ("s", 1.0))
        unit = next(((suffix, scale) for suffix, scale in units if text.endswith(suffix)), ("", 1.0))
        try:
            seconds = float(text.removesuffix(unit[0])) * unit[1]
        except ValueError:
            seconds = -1.0
    else:
        seconds = -1.0
    if not seconds > 0:
        raise OptionError(f"trigger must be 'available-now' or an interval such as '5s', not {trigger!r}")
    return {"processingTime": f"{round(seconds * 1000)} milliseconds"}


def _frame(events: DataFrame | KafkaStream | DeltaChangeFeed) -> DataFrame:
    """The streaming DataFrame of ``events``."""
    from segack.spark_adapter.sources.kafka import KafkaStream

    return events.events if isinstance(events, (KafkaStream, DeltaChangeFeed)) else events


@takes_options(streams=True)
def stream(
    events: DataFrame | KafkaStream | DeltaChangeFeed,
    *,
    key: str,
    order: str,
    handler: Callable[[dict[str, Any]], Any],
    checkpoint: str | CheckpointStore,
    trigger: str | float = "available-now",
    commit_offsets_to: str | None = None,
    stop: StopRequest | None = None,
    stop_timeout: float | None = DEFAULT_STOP_TIMEOUT,
    progress: Callable[[BatchReport], None] | None = None,
    metrics_port: int | str | None = None,
    **options: Any,
) -> StreamResult:
    """Run a Structured Streaming query that hands each event of ``events`` to ``handler``, in order
    per key, until its input is drained or it is asked to stop.

    Each micro-batch is replayed as :func:`~segack.spark_adapter.foreach_batch` replays it, all
    under one claim of ``checkpoint`` held while the query runs; Spark's own checkpoint of the
    query is kept in ``CHECKPOINT/stream``. Running it again resumes where the checkpoint stands.

    Parameters
    ----------
    events : DataFrame, KafkaStream or DeltaChangeFeed
        A streaming DataFrame (``spark.readStream``...), a Kafka topic's records as
        :func:`~segack.spark_adapter.kafka_stream` reads them, or a Delta table's changes as
        :func:`~segack.spark_adapter.delta_change_feed` reads them. A query over either of the last
        two restarts from segack's record when Spark's checkpoint of it is gone.
    key : str
        The column whose equal values are handled one after another.
    order : str
        The column that orders each key's events (for Kafka records of one key, ``offset``).
    handler : callable
        Called with each event as a dict of its columns, in the key's order. An event whose key is
        null, or whose order is null or NaN, fails its call with
        :class:`~segack.spark_adapter.UnorderableEventError` (a dead letter, or the run stopped),
        unless the handler :func:`~segack.spark_adapter.takes_unorderable`.
    checkpoint : str or CheckpointStore
        Where progress is kept, as for :func:`~segack.spark_adapter.replay`.
    trigger : str or float, default ``'available-now'``
        ``'available-now'``: handle what the source holds, then end. An interval (``'5s'``,
        ``'500ms'``, or seconds): a micro-batch that often, until ``stop``.
    commit_offsets_to : str, optional
        Kafka only: the consumer group to commit each partition's offsets to after every
        micro-batch complete in the checkpoint, never ahead of it, so that Kafka's tools see the
        stream's progress and lag (over Spark Connect, through librdkafka from the server's Python:
        :mod:`~segack.spark_adapter.coordinator.connect_batches`).
    stop : StopRequest, optional
        Set it to stop at the end of the micro-batch under way.
    stop_timeout : float or None, default ``20.0``
        Seconds a stop waits for the micro-batch under way; past them its tasks end where they next
        look for a stop (each finishes its calls in flight and saves), and the next run finishes
        the micro-batch: nothing is lost, nor applied twice through a sink. ``None`` waits for its
        end.
    progress : callable, optional
        Receives a :class:`~segack.spark_adapter.BatchReport` after each micro-batch.
    metrics_port : int or str, optional
        Serve the checkpoint's Prometheus metrics on ``http://HOST:PORT/metrics`` while the query
        runs, as :func:`~segack.spark_adapter.replay` does.

    {options}

    Returns
    -------
    StreamResult
        What the query did, and why it ended.

    Raises
    ------
    OptionError, InputError, SessionError, CheckpointLocationError, CheckpointError
        Before anything is written, as :func:`~segack.spark_adapter.replay` raises them; also a
        trigger that is not one, a ``stop_timeout`` that is not a positive number of seconds,
        ``events`` that are not a stream, or ``commit_offsets_to`` without Kafka records.
    HandlerFailedError, ReplayError
        A micro-batch stopped, as a replay does; its progress was saved first.
        :class:`~segack.spark_adapter.ClaimLostError` once another run took the checkpoint over,
        whether or not a micro-batch was running.
    """
    from segack.spark_adapter.sources.kafka import KafkaStream

    began = time.monotonic()
    run_options = RunOptions.from_keywords(options, handler=handler, streams=True, caller="stream")  # 1
    kafka = events if isinstance(events, KafkaStream) else None
    frame = _frame(events)
    how = parse_trigger(trigger)
    check_stop_timeout(stop_timeout)
    check_metrics_address(metrics_port)
    if not frame.isStreaming:
        raise OptionError("events must be a streaming DataFrame (spark.readStream...); replay a static one")
    if commit_offsets_to is not None and kafka is None:
        raise OptionError("commit_offsets_to needs Kafka records (kafka_stream)")
    spark = frame.sparkSession
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    state = store.load()  # refuses a location that is not a checkpoint, or a damaged one
    refuse_real_time(state.settings if state else {}, store.location)
    check_location(spark, store, run_options.shared_local_checkpoint)
    connect = is_connect(spark)
    if commit_offsets_to is not None and connect:
        import confluent_kafka  # noqa: F401  (over Connect the group is committed through librdkafka)
    elif commit_offsets_to is not None:
        commit_offsets(spark, kafka.options if kafka else {}, commit_offsets_to, [])
    start = plan_start(spark, store, state, events, commit_offsets_to)
    log.info("%s: the query starts at %s", store.location, start.where)
    frame = _frame(start.events)
    if isinstance(start.events, KafkaStream):
        kafka = start.events
    check_executors(spark)  # the last refusal: the only one that asks the executors
    refusals = [kafka.refusal, orderable_refusal(key, order, UNPARSED, frozenset(kafka.schema.fieldNames()))
                ] if kafka else [orderable_refusal(key, order)]
    replay = BatchReplay(refusing(handler, refusals), key, order, store, run_options, start)
    stop = stop or StopRequest()
    waits = math.inf if stop_timeout is None else float(stop_timeout)
    with metrics_served(store, metrics_port), \
            claimed(spark, store, new_run_id(), run_options) as keeper:  # 2
        replay.start = record_start(start, keeper)
        retried = RetryOutcome()
        if run_options.retry_dead_letters:  # 3
            retried = replay.retry_dead_letters(spark, frame.schema, keeper)
        batches: QueryBatches | ServerBatches
        if connect:
            batches = ServerBatches(replay, keeper, commit_offsets_to,
                                    librdkafka_client(kafka.options) if kafka else None, waits)
            batches.clear()
            # The server's micro-batches save under this claim, unseen here: it is never withdrawn.
            keeper.saved = True
        else:
            batches = QueryBatches(replay, keeper, waits)
        query = (frame.writeStream.foreachBatch(batches).queryName(f"segack {store.location}")
                 .option("checkpointLocation", store.child_location(STREAM_DIR)).trigger(**how).start())
        watching = ConnectWatch if connect else Watch
        watch = watching(spark, query, batches, kafka, commit_offsets_to, progress)
        watch.resume((keeper.store.load() or Checkpoint()).settings.get("stream") or {})
        try:
            watch.until_ended(stop)  # 4, 5
        except BaseException:
            try:
                # No micro-batch may save after the last report is recorded, nor run once the claim is.
                query.stop()
                if keeper.lost is None:
                    watch.end(keeper)
            except Exception as error:  # the error that ended the query is the one to raise
                log.warning("%s: could not record the stream's last report: %s", store.location, error)
            raise
        watch.end(keeper)  # 6
        if isinstance(batches, ServerBatches):
            batches.clear()
    # Over Connect the micro-batches counted in the server's process, and told the watcher.
    handled, dead_letters = ((watch.handled, watch.dead_letters) if isinstance(watch, ConnectWatch)
                             else (replay.handled, replay.dead_letters))
    return StreamResult(batches=watch.count, handled=handled, dead_letters=dead_letters,
                        dead_letters_left=store.count_dead_letters(), stopped=stop.asked.is_set(),
                        seconds=time.monotonic() - began, last_batch=watch.last_batch, lag=watch.lag,
                        retried=retried.handled, retry_failed=retried.kept, started=start.where,
                        passed_over=start.passed_over, group_behind=watch.behind,
                        interrupted=batches.interrupted, cut_short_batch=_cut_short(batches.error))
