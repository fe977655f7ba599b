"""Dead letters: the events a replay set aside, and handling them again.

The rules (Axon calls this a *sequenced* dead-letter queue):

1. **What becomes a dead letter.** With ``on_error="dead-letter"``, an event whose handler call
   failed (after its retries), and every later event of its key in that run. Each is recorded in
   ``CHECKPOINT/dead-letters/`` (Parquet: the event's columns, the error, the attempts made, its
   key group and position) before progress calls it done.
2. **A key with dead letters is parked.** Every later event of a parked key, in this run or a later
   one, becomes a dead letter too, whatever ``on_error`` says, so that no event of the key runs
   before the ones that failed. Only the ``concurrent`` policy, which keeps no order, is exempt.
3. **Retrying** (``replay(..., retry_dead_letters=True)``) comes before the run's own events. A
   Spark job reads the dead-letter files, sends each key group's letters to the task of the segment
   owning it, sorted by position (so each key's letters run in their order), and calls the handler
   again, with the run's concurrency, retries and timeout. A letter that fails again stays, and so
   do its key's later letters (the key stays parked); the others are removed once the job has
   ended. A crash before that handles them again in a later retry: at least once, in order.

Nothing here holds all dead letters in one place: the driver sees only the list of files and the
set of parked keys.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import pickle
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from segack.kernel import SegmentSet
from segack.spark_adapter.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    CheckpointError,
    TaskStore,
)
from segack.spark_adapter.columns import member_index_column
from segack.spark_adapter.dispatch import Dispatcher
from segack.spark_adapter.driver_watch import watching_driver
from segack.spark_adapter.errors import HandlerFailedError, ReplayError
from segack.spark_adapter.executors import task_failure
from segack.spark_adapter.handlers import (
    close_handler,
    identified_events,
    wants_identity,
    with_identities_passed,
)
from segack.spark_adapter.options import Handling, OnError

if TYPE_CHECKING:
    from segack.spark_adapter.run import Run

__all__ = ["RETRY_RESULT_SCHEMA", "RetryOutcome", "retry_dead_letters"]

_FIELDS = (DEAD_ERROR, DEAD_ATTEMPTS, DEAD_KEY_GROUP, DEAD_POSITION)
_SEGMENT = "__segack_segment"

#: What each retry task returns: one row.
RETRY_RESULT_SCHEMA = pa.schema([("segment", pa.int32()), ("attempt", pa.int32()), ("handled", pa.int64()),
                                 ("kept", pa.int64()), ("failure", pa.binary())])


@dataclass(frozen=True)
class RetryOutcome:
    """What a retry of the dead letters did."""

    #: Dead letters handled this time: they are gone from the checkpoint.
    handled: int = 0
    #: Dead letters that failed again, or wait behind one of their key that did: they stay.
    kept: int = 0


@dataclass(frozen=True)
class _RetryPlan:
    #: The tasks' view of the checkpoint: the retrying run, its claim.
    store: TaskStore
    handler: Callable[[dict[str, Any]], Any]
    key: str
    columns: tuple[str, ...]
    schema: pa.Schema
    handling: Handling
    #: The checkpoint's id, part of each event's identity.
    checkpoint_id: str = ""


def _retry_file_prefix(run_id: str) -> str:
    return f"{run_id}-retry-"


def _read_files(store: TaskStore, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
                ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: file paths in, their dead letters out (in ``schema``)."""
    for batch in batches:
        for path in batch.column("path").to_pylist():
            table = store.read_dead_letter_file(path)
            if table is not None:
                yield from table.select(schema.names).cast(schema).to_batches()


class _RetryTask:
    """One segment's dead letters, in (key group, position) order, handed to a dispatcher."""

    def __init__(self, plan: _RetryPlan, partition: int, attempt: int) -> None:
        self.plan = plan
        self.partition, self.attempt = partition, attempt
        # A letter that fails again stays a dead letter: the retry never stops the run for it.
        handling = dataclasses.replace(plan.handling, on_error=OnError.DEAD_LETTER)
        self.identified = wants_identity(plan.handler)
        self.dispatcher = Dispatcher(with_identities_passed(plan.handler), operator.itemgetter(plan.key),
                                     handling)
        self.rows = 0
        self.duplicates = 0
        self.last_place: tuple[int, int] | None = None
        # Batches some of whose rows may still become dead letters, with their first row number.
        self.open: deque[tuple[int, pa.RecordBatch]] = deque()
        self.kept: list[pa.Table] = []
        self.kept_count = 0

    def handle(self, batch: pa.RecordBatch) -> None:
        self.open.append((self.rows, batch))
        events = batch.select(list(self.plan.columns)).to_pylist()
        if self.identified:
            events = identified_events(events, self.plan.key, batch.column(DEAD_KEY_GROUP).to_numpy(),
                                       batch.column(DEAD_POSITION).to_numpy(), self.plan.checkpoint_id)
        places = zip(batch.column(DEAD_KEY_GROUP).to_pylist(), batch.column(DEAD_POSITION).to_pylist(),
                     strict=True)
        for event, place in zip(events, places, strict=True):
            if place == self.last_place:
                # The same event recorded twice (a retried task attempt, an interrupted retry).
                self.dispatcher.skip()
                self.duplicates += 1
            else:
                while not self.dispatcher.offer(event):
                    if self.dispatcher.failure is not None:
                        return
                    self.dispatcher.wait_for_room()
            self.last_place = place
            self.rows += 1
            self._keep()
        self.dispatcher.send_partial()

    def _keep(self) -> None:
        """Hold the dead letters so far (their rows, with their new error and attempts), and
        release the batches the committed point has passed."""
        committed = self.dispatcher.committed_rows
        # Taken after the committed point is read: every letter it covers is among them.
        letters = self.dispatcher.take_dead_letters()
        if letters:
            for base, batch in self.open:
                mine = [letter for letter in letters if base <= letter.row < base + batch.num_rows]
                if not mine:
                    continue
                table = pa.Table.from_batches([batch]).take(pa.array([letter.row - base for letter in mine]))
                table = table.set_column(table.schema.get_field_index(DEAD_ERROR), DEAD_ERROR,
                                         pa.array([letter.error for letter in mine], pa.string()))
                table = table.set_column(table.schema.get_field_index(DEAD_ATTEMPTS), DEAD_ATTEMPTS,
                                         pa.array([letter.attempts for letter in mine], pa.int32()))
                self.kept.append(table.cast(self.plan.schema))
                self.kept_count += len(mine)
        while self.open and self.open[0][0] + self.open[0][1].num_rows <= committed:
            self.open.popleft()

    def finish(self) -> HandlerFailedError | None:
        """Wait for the calls in flight; record what stays; the failure that stops the run, if any."""
        self.dispatcher.close()
        self._keep()
        failure = self.dispatcher.failure
        if failure is not None:
            base, batch = next((base, batch) for base, batch in self.open
                               if base <= failure.row < base + batch.num_rows)
            row = failure.row - base
            error = failure.error
            return HandlerFailedError(
                failure.event.get(self.plan.key), None, int(batch.column(DEAD_POSITION)[row].as_py()),
                int(batch.column(DEAD_KEY_GROUP)[row].as_py()),
                f"{type(error).__name__}: {error} (retrying a dead letter)", failure.traceback)
        if self.kept and not self.plan.store.fenced():
            name = f"{_retry_file_prefix(self.plan.store.run_id)}s{self.partition:05d}-a{self.attempt}"
            self.plan.store.write_dead_letters(name, pa.concat_tables(self.kept))
        return None

    def result(self, failure: HandlerFailedError | None) -> pa.RecordBatch:
        handled = self.rows - self.duplicates - self.kept_count
        return pa.RecordBatch.from_pydict({
            "segment": [self.partition], "attempt": [self.attempt], "handled": [handled],
            "kept": [self.kept_count], "failure": [None if failure is None else pickle.dumps(failure)],
        }, schema=RETRY_RESULT_SCHEMA)


def _retry_task(plan: _RetryPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of a retry: one segment's dead letters in, one result row out;
    the worker ends should the driver's process end meanwhile."""
    with watching_driver(plan.store.driver):
        yield from _retry_segment(plan, batches)


def _retry_segment(plan: _RetryPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
    task = _RetryTask(plan, partition, attempt)
    try:
        for batch in batches:
            task.handle(batch)
            if task.dispatcher.failure is not None:
                break
        failure = task.finish()
    except Exception as error:
        # Not a handler failure (those are dead letters): the task itself broke. Spark retries it.
        raise ReplayError(f"retrying dead letters failed: {error}\n{traceback.format_exc()}") from error
    finally:
        close_handler(plan.handler)
    yield task.result(failure)


def retry_dead_letters(run: Run, segments: SegmentSet) -> RetryOutcome:
    """Handle the checkpoint's dead letters again, each key's in order (the module's rule 3), for
    ``run`` (its handler, as its options say), over ``segments``.

    Raises :class:`~segack.spark_adapter.HandlerFailedError` when a call fails the run (a plain
    call past its ``timeout``), :class:`~segack.spark_adapter.ReplayError` when the Spark job fails, and
    :class:`~segack.spark_adapter.CheckpointError` for a dead-letter file it cannot read;
    in each case every dead letter stays. Raises
    :class:`~segack.spark_adapter.ClaimLostError`, removing nothing, when another run took
    the checkpoint over.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    spark, store, run_id, key, keeper = run.spark, run.store, run.run_id, run.events.key, run.keeper
    old = store.dead_letter_files()
    if not old:
        return RetryOutcome()
    schemas = [found.remove_metadata() for found in map(store.dead_letter_schema, old) if found is not None]
    if not schemas:
        return RetryOutcome()
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    if any(name not in schema.names for name in (*_FIELDS, key)):
        raise CheckpointError(f"checkpoint {store.location}: its dead-letter files lack segack's columns")
    columns = tuple(name for name in schema.names if name not in _FIELDS)
    tasks = store.for_tasks(run_id, keeper.claim.number)
    plan = _RetryPlan(store=tasks, handler=run.handler, key=key, columns=columns, schema=schema,
                      handling=run.options.handling, checkpoint_id=run.checkpoint_id)
    files = spark.createDataFrame([(path,) for path in old], "path string")
    letters = files.repartition(max(1, min(len(old), len(segments)))).mapInArrow(
        functools.partial(_read_files, tasks, schema), from_arrow_schema(schema))
    ordered = (
        letters.withColumn(_SEGMENT, member_index_column(F.col(DEAD_KEY_GROUP), segments))
        .repartitionById(len(segments), _SEGMENT)
        .sortWithinPartitions(DEAD_KEY_GROUP, DEAD_POSITION)
        .drop(_SEGMENT)
    )
    written = functools.partial(store.dead_letter_files, _retry_file_prefix(run_id))
    try:
        results = ordered.mapInArrow(functools.partial(_retry_task, plan),
                                     from_arrow_schema(RETRY_RESULT_SCHEMA)).toArrow()
    except Exception as error:
        store.delete_dead_letters(written())
        raise ReplayError(f"retrying dead letters failed: {task_failure(error)}") from error
    failures = [pickle.loads(blob) for blob in results.column("failure").to_pylist() if blob is not None]
    if failures:
        store.delete_dead_letters(written())
        raise failures[0]
    # Only the attempt whose result Spark kept counts; an earlier attempt's file is stale.
    final = {f"s{segment:05d}-a{attempt}" for segment, attempt in zip(
        results.column("segment").to_pylist(), results.column("attempt").to_pylist(), strict=True)}
    prefix = _retry_file_prefix(run_id)
    stale = [path for path in written() if path.rsplit("/", 1)[-1][len(prefix):-len(".parquet")] not in final]
    keeper.check()
    store.delete_dead_letters(stale + old)
    return RetryOutcome(handled=sum(results.column("handled").to_pylist()),
                        kept=sum(results.column("kept").to_pylist()))
