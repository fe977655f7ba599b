"""What runs inside a segment's Spark task: positions, the handler, commits, progress files.

A task receives its segment's events sorted by the sort key ``(order, key,
tie)`` in Arrow batches, each row carrying its key group (computed in the JVM).
It numbers each key group's events as they come (the first one at the
position the tokens say the JVM filter keeps first), calls the handler on
every event not already done, and *commits* what it finished: for each key
group, the committed point moves past its last finished event, whose sort key
becomes the boundary. Every ``flush_every`` events or ``flush_interval``
seconds it writes its updates (one row per key group it moved, cumulative) to
its progress file, and checks whether the run was asked to stop. Committing
also folds each newly done event's tie into its key group's prefix digest.

It looks at the checkpoint's newest claim before each flush and, on a local (or mounted)
checkpoint, every tenth of a second: once it is not its run's, another run has taken the
checkpoint over, and the task starts no more calls and writes nothing more.

When the handler raises, the task commits everything before the failing
event, writes its progress, asks the run's other tasks to stop, and returns
the failure as a :class:`~segack.spark_adapter.HandlerFailedError` in its
result: a handler failure is not a task failure, so Spark does not retry it.
A retried attempt (after a lost executor, say) starts from what earlier
attempts of its segment in this run recorded, not from the run's start.

State is one array entry per key group plus the current batch: it never grows
with the number of events.
"""

from __future__ import annotations

import operator
import pickle
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from segack.spark_adapter.errors import HandlerFailedError, record_of
from segack.spark_adapter.handlers import (
    close_handler,
    identified_events,
    is_async,
    wants_identity,
    with_identities_passed,
)
from segack.spark_adapter.options import RunOptions
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    TaskLoad,
    TaskStore,
)
from segack.spark_adapter.store.driver_watch import watching_driver
from segack.spark_adapter.store.tokens import KeyGroupTokens, encode_updates, update_schema
from segack.spark_adapter.worker.dispatch import Dispatcher
from segack.spark_adapter.worker.numbering import RowNumbering
from segack.spark_adapter.worker.rows import as_events
from segack.spark_adapter.worker.sequencing import (
    DeadLetter,
    Failure,
    Item,
    Rules,
    call_plan,
    drive,
    retry_after_failure,
)

__all__ = ["KG", "RESULT_SCHEMA", "TIE", "TaskPlan", "TaskStart", "run_task"]

#: The key group column the JVM adds.
KG = "__segack_kg"
#: The tie column: the hash of the whole row, the last part of the sort key.
TIE = "__segack_tie"
# How often (in events) the handler loop looks at the clock and the flush counter.
_CHECK_EVERY = 64
#: Seconds between looks for a stop request between flushes, on a local (or mounted) checkpoint.
_STOP_LOOK_SECONDS = 0.1


@dataclass(frozen=True)
class TaskStart:
    """Where each key group stands when a job starts: what its tasks continue from."""

    committed: np.ndarray
    done_xor: np.ndarray
    done_sum: np.ndarray
    #: The position of the first event the JVM keeps in each key group.
    first_positions: np.ndarray
    #: Positions past the committed point that are done.
    extras: dict[int, frozenset[int]]

    @classmethod
    def of(cls, tokens: KeyGroupTokens) -> TaskStart:
        return cls(tokens.committed.copy(), tokens.done_xor.copy(), tokens.done_sum.copy(),
                   tokens.first_kept_positions(),
                   {group: frozenset(positions) for group, positions in tokens.extras.items()})


@dataclass(frozen=True)
class TaskPlan:
    """Everything a job's tasks need, pickled once for all of them."""

    #: The tasks' view of the checkpoint: their job, its claim.
    store: TaskStore
    handler: Callable[[dict[str, Any]], Any]
    columns: tuple[str, ...]
    key: str
    order: str
    #: The run's options: the flush policy and how the handler is called.
    options: RunOptions
    start: TaskStart
    #: Keys with dead letters from earlier runs: their events are set aside behind them.
    parked: frozenset[Any] = frozenset()
    #: The checkpoint's id, part of each event's identity.
    checkpoint_id: str = ""


#: What each task returns: one row, its updates sealed as bytes (their types are the data's), and
#: whether it stopped before the end of its events (asked to, or fenced).
RESULT_SCHEMA = pa.schema([("segment", pa.int32()), ("updates", pa.binary()), ("handled", pa.int64()),
                           ("failure", pa.binary()), ("peak_pending", pa.int64()),
                           ("dead_letters", pa.int64()), ("retries", pa.int64()), ("stopped", pa.bool_())])


class _SegmentTask:
    def __init__(self, plan: TaskPlan, partition: int, attempt: int) -> None:
        self.plan = plan
        self.partition = partition
        self.name = plan.store.progress_name(partition, attempt)
        self.handling = plan.options.handling
        self.handler = with_identities_passed(plan.handler)
        self.identified = wants_identity(plan.handler)
        self.flush_every, self.flush_interval = plan.options.flush_every, plan.options.flush_interval
        start = plan.start
        self.committed = start.committed.copy()
        self.done_xor = start.done_xor.copy()
        self.done_sum = start.done_sum.copy()
        self.numbering = RowNumbering(start.first_positions, plan.order, plan.key)
        # The update table's types are the data's; the first batch tells them.
        self.schema: pa.Schema | None = None
        self.sent: pa.Table | None = None
        self.pending: list[pa.Table] = []
        self.handled = 0
        self.rows_seen = 0
        self.rows_at_flush = 0
        self.last_flush = self.last_stop_look = time.monotonic()
        self.stopped = False
        #: Another run took the checkpoint over: this task writes nothing more.
        self.fenced = False
        # With concurrency: the calls in flight, and the batches not yet wholly committed.
        self.dispatcher: Dispatcher | None = None
        self.open_batches: deque[_Batch] = deque()
        self.dead_pending: list[pa.Table] = []
        self.dead_letters = self.dead_files = 0
        # Retries made in the task's own thread (the dispatcher counts its own).
        self.repeats = 0
        # One call at a time, in the task's thread: the rules that set events aside (parked keys,
        # keys stopped by a failure here), whether any may now, and the dead letters not yet held
        # for a flush.
        self.rules = Rules(self.handling, operator.itemgetter(plan.key), plan.parked)
        self.watch_keys = self.rules.may_set_aside
        self.letters: list[DeadLetter] = []
        # With lists: the rows read and not yet committed, now and at most.
        self.rows_held = self.peak_pending = 0
        # An async handler always goes through the dispatcher: its calls must be awaited on a loop.
        if self.handling.dispatched or is_async(self.handler):
            self.dispatcher = Dispatcher(self.handler, operator.itemgetter(plan.key), self.handling,
                                         parked=plan.parked)
        if attempt > 0:
            self._adopt_earlier_attempts(partition, attempt)
        # Events below these points are in the prefix digests already; those above are added once.
        self.digested = self.committed.copy()

    def _adopt_earlier_attempts(self, partition: int, attempt: int) -> None:
        """Start from what earlier attempts of this segment in this run committed."""
        for updates in self.plan.store.earlier_attempts(partition):
            columns = {name: updates.column(name).to_numpy(zero_copy_only=False)
                       for name in ("kg", "committed", "done_xor", "done_sum")}
            further = columns["committed"] > self.committed[columns["kg"]]
            groups = columns["kg"][further]
            self.committed[groups] = columns["committed"][further]
            self.done_xor[groups] = columns["done_xor"][further]
            self.done_sum[groups] = columns["done_sum"][further]

    # ------------------------------------------------------------ batches

    def _done(self, groups: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        """Rows already done (by an earlier run or attempt); ``None`` when there are none."""
        done = positions < self.committed[groups]
        extras = self.plan.start.extras
        if extras:
            for row in np.flatnonzero(np.isin(groups, list(extras))).tolist():
                if int(positions[row]) in extras[int(groups[row])]:
                    done[row] = True
        return done if done.any() else None

    def handle(self, batch: pa.RecordBatch) -> HandlerFailedError | None:
        """Handle one batch; returns the failure if the handler raised."""
        if self.schema is None:
            self.schema = update_schema(batch.schema.field(self.plan.order).type,
                                        batch.schema.field(self.plan.key).type)
        groups = batch.column(KG).to_numpy(zero_copy_only=False)
        positions = self.numbering.positions(groups)
        ties = batch.column(TIE).to_numpy(zero_copy_only=False)
        run_starts = self.numbering.run_starts(batch, ties, positions)
        skip = self._done(groups, positions)
        events = as_events(batch, self.plan.columns)
        if self.identified:
            events = identified_events(events, self.plan.key, groups, positions, self.plan.checkpoint_id)
        current = _Batch(batch, groups, positions, ties, run_starts, skip, self.rows_seen)
        if self.dispatcher is not None:
            return self._dispatch(current, events)
        if self.handling.batch_size is not None:
            return self._handle_in_lists(current, events)
        handler = self.handler
        for row, event in enumerate(events):
            if skip is not None and skip[row]:
                continue
            if not (self.watch_keys and self._set_aside(row, event)):
                try:
                    handler(event)
                except Exception as error:
                    failure = self._failed(current, row, event, error)
                    if failure is not None:
                        self._commit_in_order(current, row)
                        self.rows_seen += row
                        return failure
            if row % _CHECK_EVERY == _CHECK_EVERY - 1 and self._due(self.rows_seen + row + 1):
                self._commit_in_order(current, row + 1)
                self._flush(self.rows_seen + row + 1)
                if self.stopped:
                    return None
        self._commit_in_order(current, len(events))
        self.rows_seen += len(events)
        if self._due(self.rows_seen):
            self._flush(self.rows_seen)
        return None

    # ------------------------------------------- one call at a time, in order

    def _set_aside(self, row: int, event: dict[str, Any]) -> bool:
        """Whether ``event`` waits behind dead letters (its key is parked, or an earlier event
        of its sequencing value failed in this task); if so, it is one too."""
        letter = self.rules.set_aside(self.rows_seen + row, event)
        if letter is None:
            return False
        self.letters.append(letter)
        return True

    def _failed(self, current: _Batch, row: int, event: dict[str, Any], error: Exception,
                ) -> HandlerFailedError | None:
        """The call for ``row`` raised ``error``: retry it as the handling says, then either
        set the event aside and stop its key (``None``), or return the run's failure."""
        handling = self.handling
        number = self.rows_seen + row
        failure, repeats = retry_after_failure(self.handler, number, event, error, handling.retry_delay,
                                               lambda attempt: attempt > handling.retries)
        self.repeats += repeats
        if failure is None:
            return None
        outcome = self.rules.failed(failure, self.rules.value(number, event))
        if isinstance(outcome, DeadLetter):
            self.watch_keys = True
            self.letters.append(outcome)
            return None
        return self._handler_failed(outcome, current, row)

    def _handle_in_lists(self, current: _Batch, events: list[dict[str, Any]]) -> HandlerFailedError | None:
        """The task's own loop with lists. One call at a time leaves every key free between calls,
        so a list is the next events in row order; it starts as the dispatcher would start it at
        concurrency 1: once it holds ``batch_size`` events, once the rows it holds back (skipped
        and set-aside ones among them) reach the pending bound, and at the end of the batch."""
        size, bound = self.handling.batch_size, self.handling.pending_bound
        assert size is not None
        base = self.rows_seen
        items: list[Item] = []
        for row, event in enumerate(events):
            number = base + row
            if current.skip is None or not current.skip[row]:
                # Read, and held until it is handled or set aside (an event a run did already is not).
                self.peak_pending = max(self.peak_pending, number + 1 - (items[0][0] if items else number))
                if not (self.watch_keys and self._set_aside(row, event)):
                    items.append((number, self.rules.value(number, event), event))
            self.rows_held = number + 1 - items[0][0] if items else 0
            if items and (len(items) == size or self.rows_held >= bound):
                failure = self._call_list(current, items)
                if failure is not None:
                    return failure
                items, self.rows_held = [], 0
            if row % _CHECK_EVERY == _CHECK_EVERY - 1 and self._due(number + 1):
                done = row + 1 - self.rows_held
                self._commit_in_order(current, done)
                self._flush(base + done)
                if self.stopped:
                    return None
        if items:
            failure = self._call_list(current, items)
            if failure is not None:
                return failure
            self.rows_held = 0
        self._commit_in_order(current, len(events))
        self.rows_seen += len(events)
        if self._due(self.rows_seen):
            self._flush(self.rows_seen)
        return None

    def _call_list(self, current: _Batch, items: list[Item]) -> HandlerFailedError | None:
        """Call the handler with ``items``' events; if it raises, the retries and narrowing of
        their plan (:func:`~segack.spark_adapter.worker.sequencing.call_plan`), after which the
        events that still fail are dead letters with their keys' later ones, or the run's failure
        (its rows before the list committed)."""
        handler = self.handler
        try:
            handler([event for _, _, event in items])
            return None
        except Exception as error:
            handling = self.handling
            plan = call_plan(items, handling.retry_delay, lambda attempt: attempt > handling.retries,
                             handling.on_error)
            outcome = drive(plan, lambda part: handler([event for _, _, event in part]),
                            (error, traceback.format_exc()))
        self.repeats += outcome.repeats
        letters, failure = self.rules.resolve(outcome)
        if failure is not None:
            stopped = self._handler_failed(failure, current, failure.row - self.rows_seen)
            first = items[0][0] - self.rows_seen
            self._commit_in_order(current, first)
            self.rows_seen += first
            return stopped
        self.letters = sorted([*self.letters, *letters], key=operator.attrgetter("row"))
        self.watch_keys = self.rules.may_set_aside
        return None

    def _handler_failed(self, failure: Failure, batch: _Batch, row: int) -> HandlerFailedError:
        """The run's error for ``failure``, the call for ``row`` of ``batch``."""
        return HandlerFailedError(
            failure.event.get(self.plan.key), failure.event.get(self.plan.order), int(batch.positions[row]),
            int(batch.groups[row]), failure.reason, failure.traceback, record_of(failure.event))

    def _commit_in_order(self, current: _Batch, upto: int) -> None:
        """:meth:`_commit`, after holding the dead letters set aside so far for the next flush."""
        if self.letters:
            self._keep_dead_letters(self.letters, [current])
            self.letters = []
        self._commit(current, upto)

    def _dispatch(self, current: _Batch, events: list[dict[str, Any]]) -> HandlerFailedError | None:
        """Hand one batch to the dispatcher: many calls in flight, each key's in order. Commits
        what the dispatcher's committed point covers, as it moves."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        self.open_batches.append(current)
        for row, event in enumerate(events):
            if current.skip is not None and current.skip[row]:
                dispatcher.skip()
            else:
                while not dispatcher.offer(event):
                    if dispatcher.failure is not None:
                        return self._dispatch_failure()
                    # Slow calls hold the read-ahead full: the flush and the looks go on meanwhile.
                    dispatcher.wait_for_room(_STOP_LOOK_SECONDS)
                    self._commit_dispatched()
                    if self._due(self.rows_seen + row):
                        self._flush(self.rows_seen + row)
                        if self.stopped:
                            return self.finish_dispatch()
            if row % _CHECK_EVERY == _CHECK_EVERY - 1:
                self._commit_dispatched()
                if self._due(self.rows_seen + row + 1):
                    self._flush(self.rows_seen + row + 1)
                    if self.stopped:
                        return self.finish_dispatch()
        self.rows_seen += len(events)
        dispatcher.send_partial()
        self._commit_dispatched()
        if self._due(self.rows_seen):
            self._flush(self.rows_seen)
        return self._dispatch_failure() if dispatcher.failure is not None else None

    def finish_dispatch(self) -> HandlerFailedError | None:
        """Wait for the calls in flight (a task that stopped starts no more), commit what they
        finished; the first failure, if any."""
        if self.dispatcher is None:
            return None
        if self.stopped:
            self.dispatcher.stop()
        self.dispatcher.close()
        self._commit_dispatched()
        return self._dispatch_failure() if self.dispatcher.failure is not None else None

    def _dispatch_failure(self) -> HandlerFailedError:
        dispatcher = self.dispatcher
        assert dispatcher is not None
        dispatcher.close()
        self._commit_dispatched()
        failure = dispatcher.failure
        assert failure is not None
        batch = next(b for b in self.open_batches if b.base <= failure.row < b.base + len(b.groups))
        return self._handler_failed(failure, batch, failure.row - batch.base)

    def _commit_dispatched(self) -> None:
        """Commit the rows below the dispatcher's committed point, batch by batch."""
        assert self.dispatcher is not None
        committed = self.dispatcher.committed_rows
        # Taken after the committed point is read: every dead letter it covers is among them.
        self._keep_dead_letters(self.dispatcher.take_dead_letters(), self.open_batches)
        while self.open_batches:
            batch = self.open_batches[0]
            self._commit(batch, min(committed - batch.base, len(batch.groups)))
            if batch.committed_rows < len(batch.groups):
                break
            self.open_batches.popleft()

    def _keep_dead_letters(self, letters: list[DeadLetter], batches: Iterable[_Batch]) -> None:
        """Hold dead letters (as rows of their ``batches``, with why) until the next flush writes them."""
        for batch in batches:
            mine = [letter for letter in letters if batch.base <= letter.row < batch.base + len(batch.groups)]
            if not mine:
                continue
            rows = pa.array([letter.row - batch.base for letter in mine], pa.int64())
            table = pa.Table.from_batches([batch.batch.select(list(self.plan.columns))]).take(rows)
            local = rows.to_numpy()
            for name, values in (
                (DEAD_ERROR, pa.array([letter.error for letter in mine], pa.string())),
                (DEAD_ATTEMPTS, pa.array([letter.attempts for letter in mine], pa.int32())),
                (DEAD_KEY_GROUP, pa.array(batch.groups[local], pa.int32())),
                (DEAD_POSITION, pa.array(batch.positions[local], pa.int64())),
            ):
                table = table.append_column(name, values)
            self.dead_pending.append(table)
            self.dead_letters += len(mine)

    def write_dead_letters(self) -> None:
        """Write the dead letters held so far to a new file of the checkpoint's dead letters."""
        if self.dead_pending:
            self.plan.store.write_dead_letters(f"{self.name}-{self.dead_files:05d}",
                                               pa.concat_tables(self.dead_pending))
            self.dead_files += 1
            self.dead_pending = []

    def _due(self, rows_seen: int) -> bool:
        """Whether to flush now: the flush policy says so, the run was asked to stop (a change of
        segments waits for it), or another run took the checkpoint over (this one must stop calling
        the handler at once). Those two are looked for more often than a flush where a look is a
        local file's metadata; on an object store each look is a request, so only at a flush."""
        now = time.monotonic()
        if (rows_seen - self.rows_at_flush >= self.flush_every
                or now - self.last_flush >= self.flush_interval):
            return True
        if self.plan.store.cheap_looks and now - self.last_stop_look >= _STOP_LOOK_SECONDS:
            self.last_stop_look = now
            return self.plan.store.stop_requested() or self.plan.store.fenced()
        return False

    # ---------------------------------------------------- commits, flushes

    def _commit(self, current: _Batch, upto: int) -> None:
        """Rows of ``current`` below ``upto`` are done: move their key groups' committed points."""
        first = current.committed_rows
        if upto <= first:
            return
        groups = current.groups[first:upto]
        distinct, from_end = np.unique(groups[::-1], return_index=True)
        last = first + (upto - first - 1) - from_end
        committed = current.positions[last] + 1
        self.committed[distinct] = committed
        fresh = current.positions[first:upto] >= self.digested[groups]
        np.bitwise_xor.at(self.done_xor, groups[fresh], current.ties[first:upto][fresh])
        np.add.at(self.done_sum, groups[fresh], current.ties[first:upto][fresh] >> 40)
        boundary = current.batch.select([self.plan.order, self.plan.key, TIE]).take(pa.array(last))
        self.pending.append(pa.table([
            pa.array(distinct, pa.int32()), pa.array(committed, pa.int64()),
            pa.array(current.run_starts[last], pa.int64()), boundary.column(0), boundary.column(1),
            boundary.column(2), pa.nulls(len(distinct), pa.list_(pa.int64())),
            pa.array(self.done_xor[distinct], pa.int64()), pa.array(self.done_sum[distinct], pa.int64()),
        ], schema=self.schema))
        skipped = 0 if current.skip is None else int(current.skip[first:upto].sum())
        self.handled += upto - first - skipped
        current.committed_rows = upto

    def _updates(self) -> pa.Table | None:
        """Every key group this task moved, at its latest committed point; ``None`` before any."""
        if self.pending:
            merged = pa.concat_tables([*([self.sent] if self.sent is not None else []), *self.pending])
            groups = merged.column("kg").to_numpy(zero_copy_only=False)
            _, from_end = np.unique(groups[::-1], return_index=True)
            self.sent = merged.take(pa.array(len(groups) - 1 - from_end))
            self.pending = []
        return self.sent

    def _flush(self, rows_seen: int) -> None:
        """Make what the task committed durable, the task's side of a commit.

        1. **Fence**: if a newer claim exists, the run was taken over; the task stops and writes
           nothing more.
        2. **Dead letters** held so far go to their file first: once progress calls their rows
           done, they must be on record.
        3. **Progress**: the task's updates (every key group it moved, cumulative) replace its
           progress file, with its calls in flight and rows pending.
        4. **Stop request**: if the run asked its tasks to stop (a change of segments, a failure
           elsewhere), the task stops here, at a flush.
        """
        if self.fenced or self.plan.store.fenced():  # 1
            self.fenced = self.stopped = True
            return
        self.write_dead_letters()  # 2
        updates = self._updates()  # 3
        if updates is not None:
            self.plan.store.write_progress(self.name, updates, self._load())
        self.rows_at_flush = rows_seen
        self.last_flush = time.monotonic()
        if self.plan.store.stop_requested():  # 4
            self.stopped = True

    def _load(self) -> TaskLoad:
        """The task's calls in flight, rows pending and retries made, as its progress reports them."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return TaskLoad(pending=self.rows_held, retries=self.repeats)
        return TaskLoad(dispatcher.in_flight, dispatcher.pending, self.repeats + dispatcher.repeats)

    def result(self, failure: HandlerFailedError | None) -> pa.RecordBatch:
        """The task's one result row, in :data:`RESULT_SCHEMA`."""
        updates = self._updates()
        return pa.RecordBatch.from_pydict({
            "segment": [self.partition],
            "updates": [None if updates is None else encode_updates(updates)],
            "handled": [self.handled],
            "failure": [None if failure is None else pickle.dumps(failure)],
            "peak_pending": [self.peak_pending if self.dispatcher is None else self.dispatcher.peak_pending],
            "dead_letters": [self.dead_letters],
            "retries": [self._load().retries], "stopped": [self.stopped],
        }, schema=RESULT_SCHEMA)


class _Batch:
    """One batch in the handler's hands, and how many of its rows are committed."""

    __slots__ = ("base", "batch", "committed_rows", "groups", "positions", "run_starts", "skip", "ties")

    def __init__(self, batch: pa.RecordBatch, groups: np.ndarray, positions: np.ndarray, ties: np.ndarray,
                 run_starts: np.ndarray, skip: np.ndarray | None, base: int) -> None:
        #: The task's row number of the batch's first row.
        self.base = base
        self.batch = batch
        self.groups = groups
        self.positions = positions
        self.ties = ties
        self.run_starts = run_starts
        self.skip = skip
        self.committed_rows = 0


def run_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of a replay: one segment's events in, its progress out; the
    worker ends should the driver's process end meanwhile."""
    with watching_driver(plan.store.driver):
        yield from _segment_task(plan, batches)


def _segment_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    task = _SegmentTask(plan, partition, attempt)
    failure = None
    # A task that starts after its run was asked to stop (a change of segments, a failure
    # elsewhere) handles nothing: the next job, or run, has its events.
    task.stopped = plan.store.stop_requested()
    try:
        for batch in () if task.stopped else batches:
            failure = task.handle(batch)
            if failure is not None or task.stopped:
                break
        else:
            failure = task.finish_dispatch()
    finally:
        close_handler(plan.handler)
    if failure is not None:
        task._flush(task.rows_seen)
        if not task.fenced:
            plan.store.request_stop(f"the handler failed in segment {partition}")
    elif not task.stopped:
        task._flush(task.rows_seen)
    if not task.fenced:
        task.write_dead_letters()
    yield task.result(failure)
