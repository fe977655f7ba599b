"""Ordered, resumable replay of a DataFrame of events through a per-event handler.

How a run goes (:ref:`replay-at-scale` explains key groups and tokens):

1. **Verify** (resuming only). One JVM pass joins each key group's boundary
   and checks that the events at or below it are the ones that were done:
   their count and the digest of their ties (every column of every row). A
   checkpoint of other input is refused before anything runs. A fresh run has
   nothing to verify and skips the pass; so does a run whose input has the
   fingerprint the checkpoint recorded (:mod:`~segack.spark_adapter.sources.fingerprint`:
   the same query over the same unchanged files), unless ``verify="always"``.
2. **Resume filter.** Where the checkpoint has a boundary for a key group, a
   broadcast join against those boundaries keeps only the events whose sort
   key ``(order, key, tie)`` is at or past it: one comparison per event, in the
   JVM, whatever the number of done events.
3. **One shuffle.** Each event goes to the partition of the segment owning its
   key group (``repartitionById``) and is sorted there by its sort key. No
   stage gathers events into one partition.
4. **Tasks** (:mod:`segack.spark_adapter.worker.task`) number each key group's events,
   call the handler in order, and write their per-key-group updates to the
   checkpoint's ``progress/`` as they go; each returns its final updates in the
   job's result too.
5. **The driver** merges progress files into the checkpoint on a timer (an
   atomic rewrite of its state file), and the job's results at the end. A
   crash loses at most what tasks did since their last flush: those events run
   again (at least once), never out of order. A run that ends without a
   failure has seen every event, so its committed points count the input.

State on both sides is one entry per key group: it does not grow with events.

Who does what: :mod:`~segack.spark_adapter.spark.events` builds the queries (steps 1-3), a
:class:`~segack.spark_adapter.coordinator.run.Run` coordinates the run on the driver (step 5) and starts its
:mod:`~segack.spark_adapter.coordinator.job` (one per segment set), whose tasks do step 4.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.planning import plan
from segack.spark_adapter.coordinator.run import (
    Run,
    check_location,
    check_metrics_address,
    check_session,
    claimed,
    metrics_served,
    new_run_id,
    resolution,
)
from segack.spark_adapter.errors import HandlerFailedError, OptionError, ReplayError, one_line, worker_error
from segack.spark_adapter.options import RunOptions, takes_options
from segack.spark_adapter.results import STARTUP, Progress, ReplayResult
from segack.spark_adapter.sources.fingerprint import input_fingerprint
from segack.spark_adapter.sources.footers import footer_facts
from segack.spark_adapter.spark.events import EventInput, check_same_setup
from segack.spark_adapter.spark.executors import check_executors
from segack.spark_adapter.spark.session import default_segment_count
from segack.spark_adapter.store.checkpoint import FOOTER_TOTAL, Checkpoint, CheckpointStore
from segack.spark_adapter.store.partitions import refuse_real_time
from segack.spark_adapter.store.rescale import pending_change, record_segments
from segack.spark_adapter.store.tokens import KeyGroupTokens

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "HandlerFailedError",
    "Progress",
    "ReplayError",
    "ReplayResult",
    "check_location",
    "load_handler",
    "replay",
    "worker_error",
]


def load_handler(spec: str) -> Callable[[dict[str, Any]], Any]:
    """The function named by ``MODULE:FUNCTION``; a one-line :class:`~segack.spark_adapter.OptionError`
    if it cannot be found, or if importing its module raises anything (a module that connects at
    import to a server that is down, an invalid sink built at import)."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise OptionError(f"handler must be MODULE:FUNCTION, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise OptionError(f"cannot import handler module {module_name!r}: {error}") from None
    except Exception as error:  # the module's own code failed: its error, not a traceback
        raise OptionError(f"handler module {module_name!r} raised while being imported: "
                          f"{one_line(error)}") from None
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise OptionError(f"{module_name!r} has no function {function_name!r}")
    return handler  # type: ignore[no-any-return]


class _Setup:
    """A replay's checkpoint and input, checked against each other: its state, key-group
    resolution, events and segments (``chosen``, else the checkpoint's, else the session's default
    count). Raises as :func:`replay` does, and writes nothing."""

    def __init__(self, df: DataFrame, store: CheckpointStore, key: str, order: str, options: RunOptions,
                 chosen: SegmentSet | None) -> None:
        loaded = store.load()
        refuse_real_time(loaded.settings if loaded else {}, store.location)
        state = loaded or Checkpoint()
        previous = state.settings
        self.bits = resolution(previous, options.key_group_bits)
        self.events = EventInput(df, key, order, options.hash, options.method, self.bits)
        if chosen is None:
            chosen = (SegmentSet.from_ids(previous["segments"]) if previous.get("segments")
                      else SegmentSet.balanced(min(default_segment_count(df.sparkSession), 1 << self.bits)))
        chosen.key_group_owners(self.bits)  # a set finer than the key groups is a ValueError here
        check_same_setup(previous, self.events, options.hash, f"checkpoint {store.location}")
        if state.tokens is None:
            state.tokens = KeyGroupTokens.empty(self.bits, pa.null(), pa.null())
        self.state, self.segments = state, chosen


@takes_options(streams=False)
def replay(
    df: DataFrame,
    *,
    key: str,
    order: str,
    handler: Callable[[dict[str, Any]], Any],
    checkpoint: str | CheckpointStore,
    progress: Callable[[Progress], None] | None = None,
    metrics_port: int | str | None = None,
    **options: Any,
) -> ReplayResult:
    """Call ``handler(event)`` once per not-yet-done event of ``df``, in order per key.

    ``event`` is a dict of the row's columns. The run resumes from ``checkpoint`` if it holds one
    for the same input, claims it for itself while it runs (one run at a time), and records its
    progress there as it goes: a crash or a kill loses at most what tasks did since their last
    flush, and running it again resumes. Options may change between runs (``segments``, the
    handler's concurrency, ...), not the input or its key.

    Parameters
    ----------
    df : DataFrame
        The events. Any source Spark reads; the order need not be sorted.
    key : str
        The column whose equal values must be handled one after another (an aggregate id, an
        account): its hash picks the event's key group and segment.
    order : str
        The column that orders each key's events (numbers, strings, dates, timestamps, binary);
        ties are broken by a hash of the whole row, so the order depends only on the data.
    handler : callable
        Called with each event as a dict of its columns, in the key's order. An ``async def``
        handler runs as tasks on one event loop per task.
    checkpoint : str or CheckpointStore
        A local path, an object store's URI (``s3://``, ``gs://``, ``az://``, ``abfs://``) or
        another :mod:`pyarrow.fs` URI (``hdfs://``, ...) that every executor reaches.
    progress : callable, optional
        Receives a :class:`~segack.spark_adapter.Progress` at each merge of the tasks' progress.
    metrics_port : int or str, optional
        Serve the checkpoint's Prometheus metrics on ``http://HOST:PORT/metrics`` while the run
        holds it: ``PORT`` (on 127.0.0.1) or ``HOST:PORT``
        (:func:`~segack.spark_adapter.serve_metrics`).

    {options}

    Returns
    -------
    ReplayResult
        What the run did; ``complete`` says whether every event was handled (it is ``False`` while
        dead letters are left).

    Raises
    ------
    OptionError, InputError, SessionError, CheckpointLocationError
        Before anything is written: a bad setting (a ``metrics_port`` in use, say), a missing or
        unsortable column, an order column null or NaN in some events (checked by one Spark job,
        unless the checkpoint's last run read the same unchanged files), speculation on,
        executors whose Python cannot import this segack
        (:class:`~segack.spark_adapter.ExecutorEnvironmentError`), a checkpoint location that is a
        file or a directory of other files, or a local checkpoint path executors on other machines
        could not reach (unless ``shared_local_checkpoint``).
    CheckpointError
        A damaged checkpoint, one of another version, or (:class:`~segack.spark_adapter.ForeignInputError`)
        one written for other input; :class:`~segack.spark_adapter.CheckpointClaimedError` when
        another run holds it. Nothing is written.
    HandlerFailedError
        The handler raised (after its retries) with ``on_error="stop"``; progress was saved first.
    ReplayError
        A Spark task or the merging of progress failed; progress was saved first.
        :class:`~segack.spark_adapter.ClaimLostError` (a ``ReplayError``): another run took the
        checkpoint over, and this one saved nothing more.
    """
    run_options = RunOptions.from_keywords(options, handler=handler, caller="replay")
    check_metrics_address(metrics_port)
    spark = df.sparkSession
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    check_location(spark, store, run_options.shared_local_checkpoint)
    began = time.monotonic()
    planned = run_options.segments == "auto"
    chosen = run_options.segments if isinstance(run_options.segments, SegmentSet) else None
    setup = _Setup(df, store, key, order, run_options, chosen)  # refuses bad input
    source = run_options.source or "the events"
    STARTUP.info("reading %s", source)
    fingerprint = input_fingerprint(df)
    footers = footer_facts(df, order)
    if footers is not None:
        STARTUP.info("reading %s: %s events, as their Parquet footers count them", source,
                     f"{footers.rows:,}")
    if fingerprint is None or fingerprint != setup.state.settings.get("input_fingerprint"):
        # Else the run that recorded the fingerprint checked them.
        STARTUP.info("checking the order column %r for nulls", order)
        setup.events.check_order_values(None if footers is None else footers.order_nulls)
    if planned:
        STARTUP.info("planning the segments from each key group's load (a Spark job)")
        chosen = plan(df, key=key, hash=run_options.hash, workers=default_segment_count(spark),
                      key_group_bits=setup.bits, method=run_options.method).segments
    STARTUP.info("checking that the executors import segack")
    check_executors(spark)  # the last refusal: the only one that asks the executors
    run_id = new_run_id()
    STARTUP.info("claiming %s", store.location)
    with metrics_served(store, metrics_port), claimed(spark, store, run_id, run_options) as keeper:
        # A change of segments asked of an earlier run that ended first is this run's to apply,
        # unless it names its own segments.
        pending = pending_change(store)
        applied = pending if chosen is None else None
        # Read again under the claim: the previous owner may have saved in between.
        setup = _Setup(df, store, key, order, run_options, chosen if applied is None else applied.segment_set)
        state = setup.state
        settings = state.settings  # Run records how the run handles its input; these are the replay's
        if run_options.source is not None:
            settings["source"] = run_options.source
        settings.update(runs=int(settings.get("runs", 0)) + 1, run_id=run_id, started_at=time.time())
        if footers is None:
            settings.pop(FOOTER_TOTAL, None)  # a total from other files would mislead
        else:
            settings[FOOTER_TOTAL] = footers.rows
        record_segments(state, setup.segments, f"start of run {run_id}" if applied is None else
                        f"{applied.why} (by {applied.by}), at the start of run {run_id}")
        counts = Run(setup.events, state, keeper, run_options, handler, progress).execute(
            setup.segments, consumed=pending, fingerprint=fingerprint, watch_requests=True)
    tokens = state.tokens
    assert tokens is not None
    assert tokens.total is not None  # a run that ends without an error has counted its input
    return ReplayResult(
        total=tokens.total, already_done=counts.already_done,
        handled=tokens.done - counts.already_done - counts.dead_letters, done=tokens.done,
        segments=len(counts.segments or setup.segments), key_group_bits=setup.bits,
        seconds=time.monotonic() - began, segment_changes=counts.segment_changes,
        peak_pending=counts.peak_pending, dead_letters=counts.dead_letters,
        dead_letters_left=store.count_dead_letters(),
        retried=counts.retry.handled, retry_failed=counts.retry.kept, input_checked=counts.input_checked,
    )
