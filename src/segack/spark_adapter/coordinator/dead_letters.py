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

import functools
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from segack.kernel import SegmentSet
from segack.spark_adapter.errors import ReplayError
from segack.spark_adapter.spark.columns import member_index_column
from segack.spark_adapter.spark.events import SEGMENT
from segack.spark_adapter.spark.executors import task_failure
from segack.spark_adapter.store.checkpoint import DEAD_KEY_GROUP, DEAD_POSITION, CheckpointError
from segack.spark_adapter.worker.retry_task import (
    RETRY_FIELDS,
    RETRY_RESULT_SCHEMA,
    RetryPlan,
    read_files,
    retry_file_prefix,
    retry_task,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from pyspark.sql import SparkSession

    from segack.spark_adapter.coordinator.state import RunState
    from segack.spark_adapter.options import Handling
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper

__all__ = ["RetryOutcome", "RetryRun", "retry_dead_letters"]


@dataclass(frozen=True)
class RetryRun:
    """What a retry needs of the run it is part of: a replay's or a micro-batch's
    (:meth:`of`), or a real-time stream's, whose letters' key groups are Kafka partitions and
    positions offsets."""

    spark: SparkSession
    store: CheckpointStore
    keeper: ClaimKeeper
    handler: Callable[..., Any]
    key: str
    handling: Handling
    checkpoint_id: str
    #: How the names of the files the retry writes begin.
    files_prefix: str
    #: The event's columns that, beside ``key``, tell two keys apart
    #: (:attr:`~segack.spark_adapter.worker.retry_task.RetryPlan.places`).
    places: tuple[str, ...] = ()

    @classmethod
    def of(cls, run: RunState) -> RetryRun:
        """A replay's, or a micro-batch's, retry."""
        return cls(run.spark, run.store, run.keeper, run.handler, run.events.key, run.options.handling,
                   run.checkpoint_id, run.files_prefix)

@dataclass(frozen=True)
class RetryOutcome:
    """What a retry of the dead letters did."""

    #: Dead letters handled this time: they are gone from the checkpoint.
    handled: int = 0
    #: Dead letters that failed again, or wait behind one of their key that did: they stay.
    kept: int = 0


def retry_dead_letters(run: RetryRun, segments: SegmentSet) -> RetryOutcome:
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

    spark, store, run_id, key, keeper = run.spark, run.store, run.files_prefix, run.key, run.keeper
    old = store.dead_letter_files()
    if not old:
        return RetryOutcome()
    schemas = [found.remove_metadata() for found in map(store.dead_letter_schema, old) if found is not None]
    if not schemas:
        return RetryOutcome()
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    if any(name not in schema.names for name in (*RETRY_FIELDS, key)):
        raise CheckpointError(f"checkpoint {store.location}: its dead-letter files lack segack's columns")
    columns = tuple(name for name in schema.names if name not in RETRY_FIELDS)
    tasks = store.for_tasks(run_id, keeper.claim.number)
    plan = RetryPlan(store=tasks, handler=run.handler, key=key, columns=columns, schema=schema,
                      handling=run.handling, checkpoint_id=run.checkpoint_id, places=run.places)
    files = spark.createDataFrame([(path,) for path in old], "path string")
    letters = files.repartition(max(1, min(len(old), len(segments)))).mapInArrow(
        functools.partial(read_files, tasks, schema), from_arrow_schema(schema))
    ordered = (
        letters.withColumn(SEGMENT, member_index_column(F.col(DEAD_KEY_GROUP), segments))
        .repartitionById(len(segments), SEGMENT)
        .sortWithinPartitions(DEAD_KEY_GROUP, DEAD_POSITION)
        .drop(SEGMENT)
    )
    written = functools.partial(store.dead_letter_files, retry_file_prefix(run_id))
    try:
        results = ordered.mapInArrow(functools.partial(retry_task, plan),
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
    prefix = retry_file_prefix(run_id)
    stale = [path for path in written() if path.rsplit("/", 1)[-1][len(prefix):-len(".parquet")] not in final]
    keeper.check()
    store.delete_dead_letters(stale + old)
    return RetryOutcome(handled=sum(results.column("handled").to_pylist()),
                        kept=sum(results.column("kept").to_pylist()))
