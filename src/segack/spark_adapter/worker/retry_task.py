"""The tasks of a dead-letter retry (:mod:`~segack.spark_adapter.coordinator.dead_letters` has the
rules and the job): each reads its files' letters or handles one segment's letters in order, and
records what fails again."""

from __future__ import annotations

import dataclasses
import operator
import pickle
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from segack.spark_adapter.errors import HandlerFailedError, ReplayError, one_line, record_of
from segack.spark_adapter.handlers import (
    close_handler,
    identified_events,
    wants_identity,
    with_identities_passed,
)
from segack.spark_adapter.options import Handling, OnError
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    TaskStore,
)
from segack.spark_adapter.store.driver_watch import watching_driver
from segack.spark_adapter.worker.dispatch import Dispatcher
from segack.spark_adapter.worker.rows import as_events

__all__ = ["RETRY_FIELDS", "RETRY_RESULT_SCHEMA", "RetryPlan", "read_files", "retry_file_prefix",
           "retry_task"]

#: The columns a dead letter has beside its event's.
RETRY_FIELDS = (DEAD_ERROR, DEAD_ATTEMPTS, DEAD_KEY_GROUP, DEAD_POSITION)

#: What each retry task returns: one row.
RETRY_RESULT_SCHEMA = pa.schema([("segment", pa.int32()), ("attempt", pa.int32()), ("handled", pa.int64()),
                                 ("kept", pa.int64()), ("failure", pa.binary())])


@dataclass(frozen=True)
class RetryPlan:
    """What every task of a retry needs, pickled once for all of them."""

    #: The tasks' view of the checkpoint: the retrying run, its claim.
    store: TaskStore
    handler: Callable[[dict[str, Any]], Any]
    key: str
    columns: tuple[str, ...]
    schema: pa.Schema
    handling: Handling
    #: The checkpoint's id, part of each event's identity.
    checkpoint_id: str = ""
    #: The event's columns that, beside ``key``, tell apart two keys of the same value: a
    #: real-time stream's ``topic`` and ``partition`` (a key of two topics is two keys).
    places: tuple[str, ...] = ()


def retry_file_prefix(run_id: str) -> str:
    """How the dead-letter files a retry of ``run_id`` writes begin."""
    return f"{run_id}-retry-"


def read_files(store: TaskStore, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
               ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: file paths in, their dead letters out (in ``schema``)."""
    for batch in batches:
        for path in batch.column("path").to_pylist():
            table = store.read_dead_letter_file(path)
            if table is not None:
                yield from table.select(schema.names).cast(schema).to_batches()


class _RetryTask:
    """One segment's dead letters, in (key group, position) order, handed to a dispatcher."""

    def __init__(self, plan: RetryPlan, partition: int, attempt: int) -> None:
        self.plan = plan
        self.partition, self.attempt = partition, attempt
        # A letter that fails again stays a dead letter: the retry never stops the run for it.
        handling = dataclasses.replace(plan.handling, on_error=OnError.DEAD_LETTER)
        self.identified = wants_identity(plan.handler)
        self.dispatcher = Dispatcher(with_identities_passed(plan.handler),
                                     operator.itemgetter(*plan.places, plan.key), handling)
        self.rows = 0
        self.duplicates = 0
        self.last_place: tuple[int, int] | None = None
        # Batches some of whose rows may still become dead letters, with their first row number.
        self.open: deque[tuple[int, pa.RecordBatch]] = deque()
        self.kept: list[pa.Table] = []
        self.kept_count = 0

    def handle(self, batch: pa.RecordBatch) -> None:
        self.open.append((self.rows, batch))
        events = as_events(batch, self.plan.columns)
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
                f"{one_line(error)} (retrying a dead letter)", failure.traceback, record_of(failure.event))
        if self.kept and not self.plan.store.fenced():
            name = f"{retry_file_prefix(self.plan.store.run_id)}s{self.partition:05d}-a{self.attempt}"
            self.plan.store.write_dead_letters(name, pa.concat_tables(self.kept))
        return None

    def result(self, failure: HandlerFailedError | None) -> pa.RecordBatch:
        handled = self.rows - self.duplicates - self.kept_count
        return pa.RecordBatch.from_pydict({
            "segment": [self.partition], "attempt": [self.attempt], "handled": [handled],
            "kept": [self.kept_count], "failure": [None if failure is None else pickle.dumps(failure)],
        }, schema=RETRY_RESULT_SCHEMA)


def retry_task(plan: RetryPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of a retry: one segment's dead letters in, one result row out;
    the worker ends should the driver's process end meanwhile."""
    with watching_driver(plan.store.driver):
        yield from _retry_segment(plan, batches)


def _retry_segment(plan: RetryPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
