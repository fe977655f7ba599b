"""Ordered, resumable replay of a DataFrame of events through a per-event handler.

How a run goes (:ref:`replay-at-scale` explains key groups and tokens):

1. **Verify** (resuming only). One JVM pass joins each key group's boundary
   and checks that the events at or below it are the ones that were done:
   their count and the digest of their ties (every column of every row). A
   checkpoint of other input is refused before anything runs. A fresh run has
   nothing to verify and skips the pass; so does a run whose input has the
   fingerprint the checkpoint recorded (:mod:`~segack.spark_adapter.fingerprint`:
   the same query over the same unchanged files), unless ``verify="always"``.
2. **Resume filter.** Where the checkpoint has a boundary for a key group, a
   broadcast join against those boundaries keeps only the events whose sort
   key ``(order, key, tie)`` is at or past it: one comparison per event, in the
   JVM, whatever the number of done events.
3. **One shuffle.** Each event goes to the partition of the segment owning its
   key group (``repartitionById``) and is sorted there by its sort key. No
   stage gathers events into one partition.
4. **Tasks** (:mod:`segack.spark_adapter.task`) number each key group's events,
   call the handler in order, and write their per-key-group updates to the
   checkpoint's ``progress/`` as they go; each returns its final updates in the
   job's result too.
5. **The driver** merges progress files into the checkpoint on a timer (an
   atomic rewrite of its state file), and the job's results at the end. A
   crash loses at most what tasks did since their last flush: those events run
   again (at least once), never out of order. A run that ends without a
   failure has seen every event, so its committed points count the input.

State on both sides is one entry per key group: it does not grow with events.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from segack._shared import VERIFY_CHOICES
from segack.errors import SegackTypeError, SegackValueError
from segack.kernel import SegmentSet
from segack.spark_adapter.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.claims import (
    DEFAULT_CLAIM_TIMEOUT,
    ClaimKeeper,
    acquire,
    check_claim_timeout,
    previous_run,
)
from segack.spark_adapter.columns import hash_column, member_index_column
from segack.spark_adapter.dead_letters import RetryOutcome, retry_dead_letters
from segack.spark_adapter.dispatch import Handling
from segack.spark_adapter.errors import HandlerFailedError, ReplayError, worker_error
from segack.spark_adapter.fingerprint import input_fingerprint
from segack.spark_adapter.periodic import Periodic
from segack.spark_adapter.planning import plan
from segack.spark_adapter.rescale import RequestWatcher, SegmentChange, pending_change, record_segments
from segack.spark_adapter.session import default_segment_count, executors_share_local_disk, setting
from segack.spark_adapter.task import KG, RESULT_SCHEMA, TIE, TaskPlan, run_task
from segack.spark_adapter.tokens import DEFAULT_KEY_GROUP_BITS, KeyGroupTokens, TokenError, decode_updates

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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

SEGMENT = "__segack_segment"
_BOUND_ORDER = "__segack_bound_order"
_BOUND_KEY = "__segack_bound_key"
_BOUND_TIE = "__segack_bound_tie"
_RESERVED = (KG, TIE, SEGMENT, _BOUND_ORDER, _BOUND_KEY, _BOUND_TIE)
_ORDER_TYPES = ("boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "string", "binary",
                "date", "timestamp", "timestamp_ntz")


@dataclass(frozen=True)
class Progress:
    """What the driver knows during a run (passed to the ``progress`` callback at each merge).

    ``total`` is ``None`` during a checkpoint's first run: the events are counted as they are done.
    """

    done: int
    handled: int
    total: int | None
    segments: int
    seconds: float
    #: Handler calls running now, over all tasks (as of their last progress files).
    in_flight: int = 0
    #: Rows read but not yet committed, over all tasks (as of their last progress files).
    pending: int = 0


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of :func:`replay`."""

    total: int
    already_done: int
    handled: int
    done: int
    segments: int
    key_group_bits: int
    seconds: float
    #: The most rows any task held read but not committed (0 when the handler ran one call at a time).
    peak_pending: int = 0
    #: Events set aside as dead letters in this run: they or an earlier event of their key failed
    #: (``on_error="dead-letter"``), or their key had dead letters already; ``done`` counts them,
    #: ``handled`` does not.
    dead_letters: int = 0
    #: Dead letters of earlier runs handled this time (``retry_dead_letters=True``).
    retried: int = 0
    #: Dead letters retried that failed again, or wait behind one of their key that did: they stay.
    retry_failed: int = 0
    #: Times the segments changed while the run went on (``segments`` counts the last set).
    segment_changes: int = 0
    #: Whether the run checked the checkpoint's done events against the input: a resumed run does,
    #: unless the input has the fingerprint the checkpoint recorded (``verify="auto"``).
    input_checked: bool = False

    @property
    def complete(self) -> bool:
        """Whether every event is done."""
        return self.done == self.total


def load_handler(spec: str) -> Callable[[dict[str, Any]], Any]:
    """The function named by ``MODULE:FUNCTION``; a clear ``ValueError`` if it cannot be found."""
    import importlib

    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise SegackValueError(f"handler must be MODULE:FUNCTION, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SegackValueError(f"cannot import handler module {module_name!r}: {error}") from None
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise SegackValueError(f"{module_name!r} has no function {function_name!r}")
    return handler  # type: ignore[no-any-return]


def check_session(spark: SparkSession) -> None:
    """Refuse a session with speculative execution on: two attempts of a segment must not overlap."""
    if setting(spark, "spark.speculation", "false").lower() == "true":
        raise SegackValueError("spark.speculation is on; segack needs it off, so that two attempts "
                         "of one segment never run at once")


def check_location(spark: SparkSession, store: CheckpointStore, shared_local_checkpoint: bool) -> None:
    """Refuse a local checkpoint path when executors may run on other machines.

    They would write their progress to their own disks, where the driver never
    reads it. ``shared_local_checkpoint`` says the path is a shared mount (NFS,
    for example) at the same place on every machine.
    """
    if not store.is_local or shared_local_checkpoint or executors_share_local_disk(spark):
        return
    master = setting(spark, "spark.master", "?")
    raise SegackValueError(
        f"checkpoint {store.location} is a local path, but executors of master {master} may run on other "
        f"machines and would write their progress to their own disks. Use a location every machine "
        f"reaches (hdfs://, s3://, ...), or, if {store.location} is mounted at the same path on every "
        f"machine (NFS, for example), say so with shared_local_checkpoint=True (--shared-local-checkpoint)"
    )


def _segment_set(segments: Any) -> SegmentSet:
    if isinstance(segments, SegmentSet):
        return segments
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise SegackValueError(f"segments must be a positive int, a SegmentSet or 'auto', not {segments!r}")
    return SegmentSet.balanced(segments)


def _check_positive(name: str, value: Any, kind: type) -> None:
    accepted = (int, float) if kind is float else int
    if isinstance(value, bool) or not isinstance(value, accepted) or not value > 0:
        raise SegackValueError(f"{name} must be a positive {kind.__name__}, not {value!r}")


def _has_floats(type_name: str) -> bool:
    return "float" in type_name or "double" in type_name


class EventInput:
    """A DataFrame of events as a replay sees it: key groups, ties, the verification, the job.

    Checks at once (``ValueError``) that ``key`` and ``order`` exist with types
    a replay can sort and hash, and that no column uses a reserved name.
    """

    def __init__(self, df: DataFrame, key: str, order: str, hash: str, method: str, bits: int) -> None:
        for name in (key, order):
            if name not in df.columns:
                raise SegackValueError(f"no column {name!r}; the columns are {df.columns}")
        if key == order:
            raise SegackValueError("key and order must be different columns")
        clash = [name for name in df.columns if name in _RESERVED]
        if clash:
            raise SegackValueError(f"column names {clash} are reserved by segack")
        self.df, self.key, self.order, self.bits = df, key, order, bits
        self.key_type = df.schema[key].dataType
        self.order_type = df.schema[order].dataType
        order_name = self.order_type.simpleString()
        if order_name not in _ORDER_TYPES and not order_name.startswith("decimal("):
            raise SegackValueError(f"the order column must have a plain sortable type (numbers, strings, "
                                   f"dates, timestamps, binary), not {order_name}")
        from pyspark.sql import functions as F

        self.key_group: Column = hash_column(key, self.key_type.simpleString(), hash, method).bitwiseAND(
            F.lit((1 << bits) - 1))
        # The whole row's hash: it breaks ties of (order, key), and digests what was done.
        self.tie: Column = F.xxhash64(*map(self._hashable, df.columns))

    def _hashable(self, name: str) -> Column:
        """A column's value as the tie hashes it: every distinct value distinctly.

        Spark will not hash a map, so its JSON form (entries in stored order)
        stands in for it; Spark hashes -0.0 and 0.0 alike, so floating-point
        values are hashed in their text form.
        """
        from pyspark.sql import functions as F

        type_name = self.df.schema[name].dataType.simpleString()
        if type_name in ("float", "double"):
            return F.col(name).cast("string")
        if "map<" in type_name or _has_floats(type_name):
            return F.to_json(F.col(name))
        return F.col(name)

    @property
    def column_types(self) -> dict[str, str]:
        """The key's and the order's Spark types, as a checkpoint records them."""
        return {"key_type": self.key_type.simpleString(), "order_type": self.order_type.simpleString()}

    def _joined_to_bounds(self, tokens: KeyGroupTokens) -> DataFrame:
        """Events with their key group, joined to its boundary (nulls where it has none)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import IntegerType, LongType, StructField, StructType

        schema = StructType([
            StructField(KG, IntegerType(), False), StructField(_BOUND_ORDER, self.order_type),
            StructField(_BOUND_KEY, self.key_type), StructField(_BOUND_TIE, LongType()),
        ])
        table = tokens.boundary_table().rename_columns([KG, _BOUND_ORDER, _BOUND_KEY, _BOUND_TIE])
        bounds = self.df.sparkSession.createDataFrame(table, schema=schema)
        return self.df.withColumn(KG, self.key_group).join(F.broadcast(bounds), KG, "left")

    def verification_frame(self, tokens: KeyGroupTokens) -> DataFrame:
        """Per key group: its events, and the count and tie digest of those before its boundary."""
        from pyspark.sql import functions as F

        joined = self._joined_to_bounds(tokens).withColumn(TIE, self.tie)
        here = F.struct(F.col(self.order), F.col(self.key), F.col(TIE))
        there = F.struct(F.col(_BOUND_ORDER), F.col(_BOUND_KEY), F.col(_BOUND_TIE))
        bounded = F.col(_BOUND_TIE).isNotNull()
        before, equal = bounded & (here < there), bounded & here.eqNullSafe(there)
        return joined.groupBy(KG).agg(
            F.count(F.lit(1)).alias("n"),
            F.count(F.when(before, F.lit(1))).alias("n_before"),
            F.coalesce(F.bit_xor(F.when(before, F.col(TIE))), F.lit(0)).alias("x_before"),
            F.coalesce(F.sum(F.when(before, F.shiftright(F.col(TIE), 40))), F.lit(0)).alias("s_before"),
            F.count(F.when(equal, F.lit(1))).alias("n_equal"),
        )

    def verify(self, tokens: KeyGroupTokens, where: str) -> np.ndarray:
        """Check that the events behind each boundary are the ones done; returns the count per key group.

        In key group ``g`` with committed point ``c``, run start ``r`` and base
        ``b``, the done events are the ``r - b`` events before the boundary and
        ``c - r`` of those equal to it (equal sort keys, equal ties). Their count
        and digest must match the tokens'; anything else is a
        :class:`~segack.spark_adapter.checkpoint.CheckpointError`.
        """
        rows = self.verification_frame(tokens).toArrow()
        counts = np.zeros(tokens.size, dtype=np.int64)
        found = {name: rows.column(name).to_numpy(zero_copy_only=False)
                 for name in ("n", "n_before", "x_before", "s_before", "n_equal")}
        groups = rows.column(KG).to_numpy(zero_copy_only=False)
        counts[groups] = found["n"]
        at = {int(group): row for row, group in enumerate(groups)}
        for group, (_, _, tie) in tokens.boundaries.items():
            row = at.get(group)
            before = int(tokens.run_start[group] - tokens.base[group])
            equal = int(tokens.committed[group] - tokens.run_start[group])
            seen_before = 0 if row is None else int(found["n_before"][row])
            seen_equal = 0 if row is None else int(found["n_equal"][row])
            xor, total = (0, 0) if row is None else (int(found["x_before"][row]), int(found["s_before"][row]))
            expected = (_int64(xor ^ (tie if equal % 2 else 0)), _int64(total + equal * (tie >> 40)))
            if seen_before != before or seen_equal < equal or expected != (
                    int(tokens.done_xor[group]), int(tokens.done_sum[group])):
                raise CheckpointError(
                    f"{where} belongs to other input: in key group {group}, the events up to its committed "
                    f"point are not the ones that were done ({seen_before + min(seen_equal, equal)} found of "
                    f"{before + equal}, or with other contents); use a new checkpoint location"
                )
        return counts

    def remaining(self, tokens: KeyGroupTokens) -> DataFrame:
        """The events not before their key group's boundary, with their key group and tie columns.

        ``(order, key, tie)`` is compared with the boundary the way the job sorts (ascending,
        nulls first), the order first: most events differ from the boundary there, and the tie,
        a hash of the whole row, is then computed only for the events kept and those whose
        order equals the boundary's.
        """
        from pyspark.sql import functions as F

        if not tokens.boundaries:
            return self.df.withColumn(KG, self.key_group).withColumn(TIE, self.tie)
        order, bound = F.col(self.order), F.col(_BOUND_ORDER)
        after = (order.isNotNull() & bound.isNull()) | (order > bound)
        at = order.eqNullSafe(bound) & (
            F.struct(F.col(self.key), self.tie) >= F.struct(F.col(_BOUND_KEY), F.col(_BOUND_TIE)))
        kept = F.col(_BOUND_TIE).isNull() | F.coalesce(after, F.lit(False)) | at
        return (self._joined_to_bounds(tokens).where(kept).drop(_BOUND_ORDER, _BOUND_KEY, _BOUND_TIE)
                .withColumn(TIE, self.tie))

    def job(self, tokens: KeyGroupTokens, segments: SegmentSet, plan: TaskPlan) -> DataFrame:
        """The replay's one Spark job: remaining events, one segment per partition, sorted, handled."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        ordered = (
            self.remaining(tokens)
            .withColumn(SEGMENT, member_index_column(F.col(KG), segments))
            .repartitionById(len(segments), SEGMENT)
            .sortWithinPartitions(F.col(self.order).asc_nulls_first(), F.col(self.key).asc_nulls_first(),
                                  F.col(TIE).asc())
            .drop(SEGMENT)
        )
        # A StructType, not DDL text: the driver need not ask the JVM to parse it.
        return ordered.mapInArrow(functools.partial(run_task, plan), from_arrow_schema(RESULT_SCHEMA))


def check_same_setup(previous: dict[str, Any], events: EventInput, hash: str, where: str) -> None:
    """Refuse (:class:`~segack.spark_adapter.checkpoint.CheckpointError`) a checkpoint whose runs keyed,
    ordered or hashed the events otherwise, or whose key and order columns had other types."""
    if not previous.get("key"):
        return
    names = ("key", "order", "hash", "key_type", "order_type")
    recorded = {name: previous.get(name) for name in names}
    if recorded != {"key": events.key, "order": events.order, "hash": hash, **events.column_types}:
        raise CheckpointError(
            f"{where} belongs to other input (it recorded events keyed by {previous.get('key')!r} "
            f"({previous.get('key_type')}), ordered by {previous.get('order')!r} "
            f"({previous.get('order_type')}), hashed with {previous.get('hash')!r}); "
            f"use a new checkpoint location"
        )


def _int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit int, as NumPy's sums wrap."""
    return (value + 2**63) % 2**64 - 2**63


class _Merger(Periodic):
    """The driver side of a run: merges task progress into the checkpoint on a timer.

    An error while merging stops the run: the merger records it, interrupts the
    job, and :func:`_execute` raises it once the job has ended.
    """

    def __init__(self, spark: SparkSession, store: CheckpointStore, state: Checkpoint, run_id: str, tag: str,
                 segments: int, interval: float, progress: Callable[[Progress], None] | None,
                 keeper: ClaimKeeper, already_done: int, began: float) -> None:
        assert state.tokens is not None
        super().__init__(interval, "segack-merger")
        self.spark, self.store, self.state, self.run_id, self.tag = spark, store, state, run_id, tag
        self.keeper = keeper
        self.segments = segments
        self.already_done = already_done
        self.progress = progress
        self.began = began
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def merge(self, results: Sequence[pa.Table] | None = None) -> None:
        """Fold this run's progress files (and, once the job has ended, its results) into the
        checkpoint, and save it."""
        with self._lock:
            tokens = self.state.tokens
            assert tokens is not None
            in_flight = pending = 0
            for _, updates in self.store.read_progress(self.store.progress_files(self.run_id)):
                tokens.apply(updates)
                calls, rows = CheckpointStore.task_load(updates)
                in_flight, pending = in_flight + calls, pending + rows
            if results is not None:
                in_flight = pending = 0  # the job has ended
                for updates in results:
                    tokens.apply(updates)
            self.state.settings["updated_at"] = time.time()
            self.keeper.check()
            self.store.save(self.state, self.keeper.claim.number)
            self.report(in_flight, pending)

    def report(self, in_flight: int, pending: int) -> None:
        if self.progress is not None:
            tokens = self.state.tokens
            assert tokens is not None
            done = tokens.done
            self.progress(Progress(done=done, handled=done - self.already_done, total=tokens.total,
                                   segments=self.segments, seconds=time.monotonic() - self.began,
                                   in_flight=in_flight, pending=pending))

    def tick(self) -> bool:
        try:
            self.merge()
        except BaseException as error:
            self.error = error
            self.spark.interruptTag(self.tag)
            return True
        return False


@dataclass(frozen=True)
class _RunCounts:
    """What :func:`_execute` tells its caller."""

    #: Events done before the job started.
    already_done: int
    #: The tasks' peak of pending rows.
    peak_pending: int = 0
    #: Dead letters the tasks wrote.
    dead_letters: int = 0
    retry: RetryOutcome = field(default_factory=RetryOutcome)
    #: The segments the run ended over, when they changed while it ran.
    segments: SegmentSet | None = None
    #: How many times they changed.
    segment_changes: int = 0
    #: Whether the done events were checked against the input.
    input_checked: bool = False


def _execute(
    events: EventInput, state: Checkpoint, store: CheckpointStore, *, run_id: str,
    handler: Callable[[dict[str, Any]], Any], segments: SegmentSet, flush_every: int, flush_interval: float,
    progress: Callable[[Progress], None] | None, handling: Handling, keeper: ClaimKeeper, retry: bool = False,
    watch_requests: bool = False, consumed: SegmentChange | None = None, fingerprint: str | None = None,
    verify: str = "auto",
) -> _RunCounts:
    """Handle the events the checkpoint lacks; leaves ``state`` final and saved.

    Folds in progress a crashed run left behind, then verifies the done events
    against the input, before writing anything: another input is a
    :class:`~segack.spark_adapter.checkpoint.CheckpointError` and changes
    nothing. With ``verify="auto"``, an input whose ``fingerprint`` (see
    :mod:`~segack.spark_adapter.fingerprint`) is the one recorded is not verified again;
    the fingerprint is recorded either way. Then removes the segment request ``consumed``
    (the caller chose the set with it in view), unless a newer one replaced it. With ``retry``,
    handles the dead letters again first (:mod:`~segack.spark_adapter.dead_letters`); keys that
    still have some are parked. With ``watch_requests``, a change of segments asked while the job
    runs ends it and starts a new one over the new set (:mod:`~segack.spark_adapter.rescale`). Raises
    :class:`HandlerFailedError` (the first failure, with any later merge error
    attached as a note) or :class:`ReplayError` (:class:`ClaimLostError` once another run took
    the checkpoint over: nothing more is saved).
    """
    tokens = state.tokens
    assert tokens is not None
    leftovers = store.progress_files()
    # Only the previous owner's progress is merged; an older run's was written after it was fenced.
    previous = previous_run(store, keeper.claim)
    merged = [path for path in leftovers if previous is None or path.rsplit("/", 1)[-1].startswith(previous)]
    try:
        for _, leftover in store.read_progress(merged):
            tokens.apply(leftover)
    except TokenError as error:
        raise CheckpointError(f"checkpoint {store.location}: {error}") from None
    recorded = state.settings.get("input_fingerprint")
    unchanged = verify == "auto" and fingerprint is not None and recorded == fingerprint
    checked = tokens.has_progress and not unchanged
    if checked:
        counts = events.verify(tokens, f"checkpoint {store.location}")
        try:
            tokens.set_counts(counts)
        except ValueError:
            raise CheckpointError(f"checkpoint {store.location} belongs to other input: it has fewer "
                                  f"events than were done; use a new checkpoint location") from None
    # Every done event is the input's: checked now, or by a run that read the same files.
    state.settings["input_fingerprint"] = fingerprint
    if tokens.counted:
        state.settings["total"] = tokens.total
    keeper.check()
    store.save(state, keeper.claim.number)
    store.delete_progress(leftovers)
    if consumed is not None and pending_change(store) == consumed:
        store.delete_segments_request()  # saved as the set: applied, or overruled by the caller
    already_done = tokens.done
    spark = events.df.sparkSession
    retried = RetryOutcome()
    if retry:
        retried = retry_dead_letters(spark, store, run_id=run_id, handler=handler, key=events.key,
                                     segments=segments, handling=handling, keeper=keeper)
    job = _Job(events, state, store, run_id, handler, flush_every, flush_interval, progress, handling, keeper,
               already_done, time.monotonic())
    peak_pending = dead_letters = 0
    number = 1
    while not tokens.complete:
        outcome = job.run(run_id if number == 1 else f"{run_id}-{number}", segments, watch_requests)
        peak_pending = max(peak_pending, outcome.peak_pending)
        dead_letters += outcome.dead_letters
        if outcome.change is None:
            break
        # Every task stopped at a flush with its calls finished, and the driver merged them: the
        # events left resume in a new job over the new set, each key group where it stood.
        segments = outcome.change.segment_set
        record_segments(state, segments, f"{outcome.change.why} (by {outcome.change.by})")
        keeper.check()
        store.save(state, keeper.claim.number)
        if pending_change(store) == outcome.change:
            store.delete_segments_request()  # a newer request stays, for the next job's watcher
        number += 1
    else:
        state.settings.update(status="complete", updated_at=time.time())
        keeper.check()
        store.save(state, keeper.claim.number)
    return _RunCounts(already_done, peak_pending, dead_letters, retried, segments, number - 1, checked)


class _Job:
    """One Spark job of a run over one segment set; a run has more than one when its segments
    change while it goes on (:mod:`~segack.spark_adapter.rescale`)."""

    def __init__(self, events: EventInput, state: Checkpoint, store: CheckpointStore, run_id: str,
                 handler: Callable[[dict[str, Any]], Any], flush_every: int, flush_interval: float,
                 progress: Callable[[Progress], None] | None, handling: Handling, keeper: ClaimKeeper,
                 already_done: int, began: float) -> None:
        self.events, self.state, self.store, self.run_id, self.handler = events, state, store, run_id, handler
        self.flush_every, self.flush_interval, self.progress = flush_every, flush_interval, progress
        self.handling, self.keeper, self.already_done, self.began = handling, keeper, already_done, began

    def run(self, job_id: str, segments: SegmentSet, watch_requests: bool) -> _JobOutcome:
        """Handle the remaining events over ``segments``; leaves the state saved. Stops early, with
        the change, when ``watch_requests`` and a change of segments is asked for. Raises as
        :func:`_execute` says."""
        events, state, store, keeper = self.events, self.state, self.store, self.keeper
        tokens = state.tokens
        assert tokens is not None
        spark = events.df.sparkSession
        plan = TaskPlan(
            run_id=job_id, store=store, handler=self.handler, columns=tuple(events.df.columns),
            key=events.key, order=events.order, committed=tokens.committed.copy(),
            done_xor=tokens.done_xor.copy(), done_sum=tokens.done_sum.copy(),
            first_positions=tokens.first_kept_positions(),
            extras={group: frozenset(positions) for group, positions in tokens.extras.items()},
            flush_every=self.flush_every, flush_interval=self.flush_interval, handling=self.handling,
            parked=store.dead_letter_keys(events.key), claim_number=keeper.claim.number,
        )
        tag = run_tag(self.run_id)
        merger = _Merger(spark, store, state, job_id, tag, len(segments), self.flush_interval, self.progress,
                         keeper, self.already_done, self.began)
        watcher = RequestWatcher(store, segments, lambda change: store.request_stop(
            job_id, f"segments change: {change.why}")) if watch_requests else None
        results: pa.Table | None = None
        job_error: BaseException | None = None
        spark.addTag(tag)
        try:
            with merger, watcher or contextlib.nullcontext():
                try:
                    results = events.job(tokens, segments, plan).toArrow()
                except Exception as error:
                    job_error = error
        finally:
            spark.removeTag(tag)
        change = None if watcher is None else watcher.change
        failures: list[HandlerFailedError] = []
        updates: list[pa.Table] = []
        peak_pending = dead_letters = 0
        merge_error: BaseException | None = merger.error
        if results is not None:
            failures = [pickle.loads(blob) for blob in results.column("failure").to_pylist()
                        if blob is not None]
            peak_pending = max(results.column("peak_pending").to_pylist(), default=0)
            dead_letters = sum(results.column("dead_letters").to_pylist())
            try:
                updates = [decode_updates(blob, "a task's result")
                           for blob in results.column("updates").to_pylist() if blob is not None]
            except TokenError as error:
                merge_error = merge_error or error
        try:
            merger.merge(updates)
        except Exception as error:
            merge_error = merge_error or error
        finished = merge_error is None and job_error is None and not failures
        if finished and change is None and not tokens.counted:
            # Every task read all of its events: each key group's committed point is its count.
            tokens.count_from_committed()
            state.settings["total"] = tokens.total
        status = ("running" if change is not None else "complete" if tokens.complete else "incomplete"
                  ) if finished else "failed"
        state.settings.update(status=status, updated_at=time.time())
        try:
            keeper.check()
            store.save(state, keeper.claim.number)
            store.delete_progress(store.progress_files(job_id))
            store.clear_stop(job_id)
        except Exception as error:
            merge_error = merge_error or error
        if keeper.lost is not None:
            raise keeper.lost
        if failures:
            failure = failures[0]
            if merge_error is not None:
                failure.add_note(f"saving progress afterwards failed too: {merge_error!r}")
            raise failure
        if merge_error is not None:
            raise ReplayError(f"saving progress failed: {merge_error}") from merge_error
        if job_error is not None:
            raise ReplayError(f"a Spark task failed: {worker_error(job_error)}") from job_error
        return _JobOutcome(peak_pending, dead_letters, change)


@dataclass(frozen=True)
class _JobOutcome:
    peak_pending: int
    dead_letters: int
    #: The change of segments the job stopped for (``None``: it ran to its end).
    change: SegmentChange | None


def run_tag(run_id: str) -> str:
    """The Spark job tag of a run's jobs (interrupting it stops them)."""
    return f"segack-{run_id}"


def _resolution(previous: dict[str, Any], key_group_bits: int | None) -> int:
    recorded = previous.get("key_group_bits")
    if key_group_bits is None:
        return int(recorded) if recorded is not None else DEFAULT_KEY_GROUP_BITS
    KeyGroupTokens.empty(key_group_bits, pa.null(), pa.null())  # validates
    if recorded is not None and recorded != key_group_bits:
        raise SegackValueError(f"the checkpoint cuts hashes into 2**{recorded} key groups; key_group_bits="
                         f"{key_group_bits} cannot change that (use a new checkpoint location)")
    return key_group_bits


class _Setup:
    """A replay's checkpoint and input, checked against each other: its state, key-group
    resolution, events and segments. Raises as :func:`replay` does, and writes nothing."""

    def __init__(self, df: DataFrame, store: CheckpointStore, key: str, order: str, hash: str, method: str,
                 key_group_bits: int | None, chosen: SegmentSet | None) -> None:
        state = store.load() or Checkpoint()
        previous = state.settings
        self.bits = _resolution(previous, key_group_bits)
        self.events = EventInput(df, key, order, hash, method, self.bits)
        if chosen is None:
            chosen = (SegmentSet.from_ids(previous["segments"]) if previous.get("segments")
                      else SegmentSet.balanced(min(default_segment_count(df.sparkSession), 1 << self.bits)))
        chosen.key_group_owners(self.bits)  # a set finer than the key groups is a ValueError here
        check_same_setup(previous, self.events, hash, f"checkpoint {store.location}")
        if state.tokens is None:
            state.tokens = KeyGroupTokens.empty(self.bits, pa.null(), pa.null())
        self.state, self.segments = state, chosen


def replay(
    df: DataFrame,
    *,
    key: str,
    order: str,
    handler: Callable[[dict[str, Any]], Any],
    checkpoint: str | CheckpointStore,
    segments: int | SegmentSet | str | None = None,
    hash: str = "spark",
    key_group_bits: int | None = None,
    method: str = "auto",
    flush_every: int = 10_000,
    flush_interval: float = 5.0,
    progress: Callable[[Progress], None] | None = None,
    source: str | None = None,
    shared_local_checkpoint: bool = False,
    concurrency: int = 1,
    max_pending: int | None = None,
    policy: str = "per-key",
    retries: int = 0,
    retry_delay: float = 0.1,
    timeout: float | None = None,
    on_error: str = "stop",
    retry_dead_letters: bool = False,
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
    verify: str = "auto",
) -> ReplayResult:
    """Call ``handler(event)`` once per not-yet-done event of ``df``, in order per key.

    ``event`` is a dict of the row's columns. Resumes from ``checkpoint`` (a
    local path or a :mod:`pyarrow.fs` URI) if it holds one for the same input;
    ``segments`` (a count or a :class:`~segack.SegmentSet`; default: the last
    run's, else ``spark.sql.shuffle.partitions``) may differ from the last run's,
    as long as no segment is finer than the checkpoint's ``2**key_group_bits``
    key groups (default 12 bits, at most 16, fixed by the first run). ``segments="auto"`` plans
    the set from the events' load for the session's default segment count first
    (:func:`~segack.spark_adapter.plan`: two more Spark jobs).
    ``progress`` receives a :class:`Progress` at each merge.

    ``concurrency`` handler calls run at once in each task (on a thread pool; an ``async def``
    handler as tasks on one event loop per task), never two of
    one key under ``policy="per-key"`` (``"sequential"``: one at a time; ``"concurrent"``: no
    order at all); a task reads ahead at most ``max_pending`` rows not yet committed (default
    ``4 * concurrency``). Only events whose every predecessor in the task is done are recorded
    done, so a crash never skips one. A call that raises is made again up to ``retries`` times,
    the n-th retry after ``retry_delay * 2**(n - 1)`` seconds. A call longer than ``timeout``
    seconds fails: an ``async def`` one is cancelled (and may be retried); a thread cannot be
    stopped, so a plain one fails the run at once. With ``on_error="dead-letter"`` a failure
    stops only its key: the event and its key's later events in this run are not handled but
    written to the checkpoint's ``dead-letters/`` (Parquet, with the error, the attempts, the key
    group and position) and count as done for now; the other keys go on. A key with dead letters
    stays parked: its later events, in later runs too, are set aside behind them (whatever
    ``on_error``), until ``retry_dead_letters=True`` handles them again, each key's in order and
    before any newer event (:mod:`~segack.spark_adapter.dead_letters`).

    One run at a time: the run claims the checkpoint before it reads or writes progress, extends
    the claim while it lives and releases it at the end. A claim unextended for
    ``claim_timeout`` seconds may be taken over by another run, which fences this one
    (:mod:`~segack.spark_adapter.claims`).

    A resumed run first checks that the events the checkpoint counts as done are the input's (one
    pass over the events). With ``verify="auto"`` it skips that pass when the input is the same
    query over the same unchanged files as the checkpoint's last run read
    (:mod:`~segack.spark_adapter.fingerprint`); ``verify="always"`` makes every resume check.

    Raises, before anything is written: ``ValueError`` for a missing or
    unsortable column, a bad setting, speculation on, or a local checkpoint
    path that executors on other machines could not reach (unless
    ``shared_local_checkpoint``); :class:`~segack.spark_adapter.checkpoint.CheckpointError`
    for a damaged checkpoint, one of another version or one written for other
    input, :class:`~segack.spark_adapter.claims.CheckpointClaimedError` when another run holds
    it. After saving progress: :class:`HandlerFailedError` when the handler
    raises, :class:`ReplayError` when a Spark task or the merging fails. Without saving:
    :class:`~segack.spark_adapter.claims.ClaimLostError` when another run took the claim over.
    """
    if not callable(handler):
        raise SegackTypeError("handler must be callable")
    _check_positive("flush_every", flush_every, int)
    _check_positive("flush_interval", flush_interval, float)
    handling = Handling(concurrency, max_pending, policy, retries, retry_delay, timeout, on_error)
    if not isinstance(retry_dead_letters, bool):
        raise SegackValueError(f"retry_dead_letters must be True or False, not {retry_dead_letters!r}")
    if verify not in VERIFY_CHOICES:
        raise SegackValueError(f"verify must be one of {VERIFY_CHOICES}, not {verify!r}")
    claim_timeout = check_claim_timeout(claim_timeout)
    planned = segments == "auto"
    chosen = None if segments is None or planned else _segment_set(segments)
    spark = df.sparkSession
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    check_location(spark, store, shared_local_checkpoint)
    began = time.monotonic()
    setup = _Setup(df, store, key, order, hash, method, key_group_bits, chosen)  # refuses bad input
    fingerprint = input_fingerprint(df)
    if planned:
        chosen = plan(df, key=key, hash=hash, workers=default_segment_count(spark), key_group_bits=setup.bits,
                      method=method).segments
    run_id = uuid.uuid4().hex[:12]
    claim = acquire(store, run_id, claim_timeout)
    with ClaimKeeper(store, claim, on_lost=functools.partial(spark.interruptTag, run_tag(run_id))) as keeper:
        # A change of segments asked of an earlier run that ended first is this run's to apply,
        # unless it names its own segments.
        pending = pending_change(store)
        applied = pending if chosen is None else None
        # Read again under the claim: the previous owner may have saved in between.
        setup = _Setup(df, store, key, order, hash, method, key_group_bits,
                       chosen if applied is None else applied.segment_set)
        state, events = setup.state, setup.events
        previous = state.settings
        state.settings = {
            **previous, "source": source if source is not None else previous.get("source"),
            "key": key, "order": order, "hash": hash, **events.column_types, "key_group_bits": setup.bits,
            "runs": int(previous.get("runs", 0)) + 1,
            "run_id": run_id, "flush_every": flush_every, "flush_interval": flush_interval,
            "started_at": time.time(), "updated_at": time.time(), "status": "running",
        }
        record_segments(state, setup.segments, f"start of run {run_id}" if applied is None else
                        f"{applied.why} (by {applied.by}), at the start of run {run_id}")
        counts = _execute(
            events, state, store, run_id=run_id, handler=handler, segments=setup.segments,
            flush_every=flush_every, flush_interval=flush_interval, progress=progress, handling=handling,
            keeper=keeper, retry=retry_dead_letters, watch_requests=True, consumed=pending,
            fingerprint=fingerprint, verify=verify)
    tokens = state.tokens
    assert tokens is not None
    assert tokens.total is not None  # a run that ends without an error has counted its input
    return ReplayResult(
        total=tokens.total, already_done=counts.already_done,
        handled=tokens.done - counts.already_done - counts.dead_letters, done=tokens.done,
        segments=len(counts.segments or setup.segments), key_group_bits=setup.bits,
        seconds=time.monotonic() - began, segment_changes=counts.segment_changes,
        peak_pending=counts.peak_pending, dead_letters=counts.dead_letters,
        retried=counts.retry.handled, retry_failed=counts.retry.kept, input_checked=counts.input_checked,
    )
