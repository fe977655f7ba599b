"""Structured Streaming: replay each micro-batch in order, with positions continuing across batches.

Each micro-batch is an input of its own to the key-group tokens: its events of
key group ``g`` get positions from where the previous batches left ``g`` (the
tokens' ``base``). The checkpoint records the last completed batch id and the
batch in progress, so a micro-batch Spark delivers again after a failure
(``foreachBatch`` is at least once) gets the same positions, is verified
against what was done of it, and only its undone events run; a batch already
completed is skipped.

For a query segack runs itself (:func:`~segack.spark_adapter.stream`), Spark's checkpoint of the
query is in sight (:class:`~segack.spark_adapter.store.query_log.QueryLog`), and each batch is held
against segack's record of the query
(:func:`~segack.spark_adapter.coordinator.query_record.check_batch`): the record names the query's id and
each batch's end offsets (``end``), and a batch Spark delivers must be the one in progress, the last
one complete (delivered again: skipped), or the next, with the same query id and, for one recorded,
the same offsets. Anything else means Spark's checkpoint was lost, replaced or restored from an
older copy, or segack's was: it is refused before any event is handled or any offset committed.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.dead_letters import RetryOutcome
from segack.spark_adapter.coordinator.query_record import RESTART_PENDING, QueryStart, check_batch
from segack.spark_adapter.coordinator.run import (
    Run,
    check_location,
    check_session,
    claimed,
    new_run_id,
    resolution,
)
from segack.spark_adapter.coordinator.state import EarlyStop, StoppedError
from segack.spark_adapter.errors import CheckpointError, ReplayError
from segack.spark_adapter.handlers import orderable_refusal, refusing
from segack.spark_adapter.options import RunOptions, takes_options
from segack.spark_adapter.spark.events import EventInput, check_same_setup
from segack.spark_adapter.spark.executors import check_executors
from segack.spark_adapter.spark.session import default_segment_count
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.claims import ClaimKeeper
from segack.spark_adapter.store.crash_points import crash_point
from segack.spark_adapter.store.rescale import (
    SegmentChange,
    auto_change,
    pending_change,
    record_segments,
    recorded_segments,
)
from segack.spark_adapter.store.tokens import KeyGroupTokens

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["BatchDone", "BatchReplay", "foreach_batch"]


@dataclass(frozen=True)
class BatchDone:
    """A micro-batch complete in the checkpoint, as :class:`BatchReplay` tells it to the query's
    watcher."""

    batch_id: int
    #: Its events, each once (a batch delivered again counts them once, not once per reading).
    events: int
    #: Seconds it took, from its start to its record saved.
    seconds: float
    #: Each source's end offset, as Spark's checkpoint of the query gave it (``None``: out of sight).
    end: Any


@takes_options(streams=True)
def foreach_batch(
    handler: Callable[[dict[str, Any]], Any],
    *,
    key: str,
    order: str,
    checkpoint: str | CheckpointStore,
    **options: Any,
) -> Callable[[DataFrame, int], None]:
    """A function for ``DataStreamWriter.foreachBatch`` that replays each micro-batch.

    Within a batch, each key's events run in ``order``; across batches, a batch starts once the
    previous one is complete. Each batch claims the checkpoint for its run, as a replay does, and
    releases it at its end. Settings are checked at once; each batch raises as
    :func:`~segack.spark_adapter.replay` does.

    Parameters
    ----------
    handler : callable
        Called with each event as a dict of its columns, in the key's order. An event whose key is
        null, or whose order is null or NaN, fails its call with
        :class:`~segack.spark_adapter.UnorderableEventError` (a dead letter, or the run stopped),
        unless the handler :func:`~segack.spark_adapter.takes_unorderable`.
    key : str
        The column whose equal values are handled one after another.
    order : str
        The column that orders each key's events.
    checkpoint : str or CheckpointStore
        A local path or a :mod:`pyarrow.fs` URI every executor reaches; not the query's own
        Structured Streaming checkpoint.

    {options}

    Returns
    -------
    callable
        ``process_batch(batch, batch_id)``, for ``writeStream.foreachBatch``.
    """
    run_options = RunOptions.from_keywords(options, handler=handler, streams=True, caller="foreach_batch")
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    return BatchReplay(refusing(handler, [orderable_refusal(key, order)]), key, order, store, run_options)


class BatchReplay:
    """``process_batch(batch, batch_id)``: one run of its own per micro-batch, each under a claim of
    its own (:func:`~segack.spark_adapter.foreach_batch`), or all under the claim of the query
    that holds ``keeper`` (:func:`~segack.spark_adapter.stream`: :meth:`process`)."""

    def __init__(self, handler: Callable[[dict[str, Any]], Any], key: str, order: str,
                 store: CheckpointStore, options: RunOptions, query: QueryStart | None = None) -> None:
        self.handler, self.key, self.order, self.store, self.options = handler, key, order, store, options
        #: Where the query segack runs started, until its first batch records it; and Spark's
        #: checkpoint of it, each batch held against (``None``: a query of the caller's own).
        self.start = query
        self.query_log = None if query is None else store.query_log()
        # The batches completed since the watcher last took them (the query's thread appends).
        self.done: collections.deque[BatchDone] = collections.deque()
        #: Recorded in the checkpoint's ``stream`` settings with each micro-batch (the query's own
        #: report of the last one, say).
        self.report: dict[str, Any] = {}
        #: Events handled and set aside as dead letters by the batches so far.
        self.handled = self.dead_letters = 0
        self.auto = options.segments == "auto"
        self.chosen = options.segments if isinstance(options.segments, SegmentSet) else None
        #: Until a batch has retried the dead letters (``retry_dead_letters``), and until the first
        #: batch has run (over ``chosen``).
        self.retry_pending = options.retry_dead_letters
        self.first_batch = True
        #: Ends the micro-batch under way at its tasks' next flush (a stream's ``stop_timeout``);
        #: once asked, every later micro-batch of the query stops at its start.
        self.early_stop = EarlyStop()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        check_session(spark)
        check_location(spark, self.store, self.options.shared_local_checkpoint)
        check_executors(spark)  # once per application
        run_id = f"b{batch_id}-{new_run_id(8)}"
        with claimed(spark, self.store, run_id, self.options) as keeper:
            self.process(batch, batch_id, keeper)

    def retry_dead_letters(self, spark: SparkSession, schema: StructType, keeper: ClaimKeeper,
                           ) -> RetryOutcome:
        """Handle the checkpoint's dead letters again now, under ``keeper``'s claim, instead of in the
        first micro-batch (``retry_dead_letters``): a query with nothing new to read runs none."""
        self.retry_pending = False
        state = self.store.load()
        if state is None or state.tokens is None or not self.store.dead_letter_files():
            return RetryOutcome()
        bits = resolution(state.settings, self.options.key_group_bits)
        options = self.options
        events = EventInput(spark.createDataFrame([], schema), self.key, self.order, options.hash,
                            options.method, bits)
        segments = recorded_segments(state) or SegmentSet.balanced(
            min(default_segment_count(spark), 1 << bits))
        return Run(events, state, keeper, options, self.handler).retry_alone(segments)

    def _segments(self, state: Checkpoint, bits: int, batch: DataFrame, batch_id: int,
                  pending: SegmentChange | None) -> tuple[SegmentSet, str]:
        """The batch's segments, and why (rule 3 of :mod:`~segack.spark_adapter.store.rescale`)."""
        if self.chosen is not None and self.first_batch:
            return self.chosen, f"start of the query, at batch {batch_id}"
        if pending is not None:
            return pending.segment_set, f"{pending.why} (by {pending.by}), at batch {batch_id}"
        workers = default_segment_count(batch.sparkSession)
        current = recorded_segments(state) or SegmentSet.balanced(min(workers, 1 << bits))
        if self.auto and state.tokens is not None:
            planned = auto_change(state.tokens, current, workers)
            if planned is not None:
                return planned[0], f"{planned[1]}, at batch {batch_id}"
        return current, f"start of the query, at batch {batch_id}"

    def process(self, batch: DataFrame, batch_id: int, keeper: ClaimKeeper) -> None:
        """Replay micro-batch ``batch_id`` under ``keeper``'s claim, unless the checkpoint has it
        complete already."""
        crash_point("batch-start")  # Spark's offset log holds the batch
        began = time.monotonic()
        store, options = self.store, self.options
        state = store.load() or Checkpoint()
        # Checked after the load: a run woken past a takeover says it lost its claim, not that the
        # taker's record disagrees with its Spark checkpoint.
        keeper.check()
        bits = resolution(state.settings, options.key_group_bits)
        pending = pending_change(store)
        segments, why = self._segments(state, bits, batch, batch_id, pending)
        segments.key_group_owners(bits)
        events = EventInput(batch, self.key, self.order, options.hash, options.method, bits)
        stream = {"completed_batch": -1, "batch": None, **state.settings.get("stream", {})}
        if self.start is not None:
            stream = self.start.record(stream)
        try:
            query_id, ends = check_batch(stream, batch_id, self.query_log)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint {store.location}: {error}") from None
        if batch_id <= stream["completed_batch"]:
            return
        current = stream["batch"]
        check_same_setup(state.settings, events, options.hash, f"checkpoint {store.location}")
        tokens = state.tokens
        if tokens is None:
            # Before the first batch, the stream is an empty input, complete.
            tokens = state.tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
            tokens.set_counts(np.zeros(tokens.size, dtype=np.int64))
        if current is None:
            tokens.start_input()
            current = {"id": batch_id, **({} if ends is None else {"end": ends})}
        state.settings["stream"] = {**stream, **self.report, "batch": current,
                                    **({} if query_id is None else {"query_id": query_id})}
        record_segments(state, segments, why)
        batch_options = dataclasses.replace(options, retry_dead_letters=self.retry_pending)
        run = Run(events, state, keeper, batch_options, self.handler, batch_id=batch_id,
                  early_stop=self.early_stop)
        try:
            counts = run.execute(segments, consumed=pending)
        except StoppedError as stopped:  # ended early, its progress saved: counted as far as it went
            stopped.batch_id = batch_id
            self.handled += tokens.done - run.already_done - stopped.dead_letters
            self.dead_letters += stopped.dead_letters
            raise
        self.retry_pending = self.first_batch = False
        self.start = None
        if not tokens.complete:
            raise ReplayError(f"batch {batch_id} ended with events not done")
        self.handled += tokens.done - counts.already_done - counts.dead_letters
        self.dead_letters += counts.dead_letters
        ended = {"completed_end": current["end"]} if "end" in current else {}
        recorded = {name: value for name, value in state.settings["stream"].items()
                    if name != RESTART_PENDING}  # the restarted query is through its first micro-batch
        state.settings["stream"] = {**recorded, "completed_batch": batch_id, "batch": None,
                                    **ended, "events": int(stream.get("events", 0)) + int(tokens.total or 0)}
        keeper.save(state)
        self.done.append(BatchDone(batch_id, int(tokens.total or 0), time.monotonic() - began,
                                   current.get("end")))
        crash_point("batch-end")  # Spark's commit log is next
