"""Ordered, resumable replay of a DataFrame of events through a per-event handler.

How a run goes:

1. Every event gets a dense index: its rank by ``(order, key)``. The rank depends
   only on the data, so a rerun over the same input gives every event the same
   index, whatever the files' layout or the cluster size.
2. Events the checkpoint says are done (below the committed point, or inside a
   done run beyond it) are removed in the JVM: a filter and an anti-join.
3. The rest get a segment column (the owner of their key's hash), go one segment
   per partition (``repartitionById``) and are sorted by index within it.
4. Each task feeds its partition to the handler in order from Arrow batches,
   records what it finished in an :class:`~segack.OffsetAcker`, and writes that
   acker's snapshot to the checkpoint's ``progress/`` directory every
   ``flush_every`` events or ``flush_interval`` seconds.
5. The driver merges the progress files into its own acker while the job runs and
   writes the checkpoint atomically; after the job, a last merge. A crash loses
   at most what tasks did since their last flush: those events run again (at
   least once), and never out of order, because each key lives in one segment
   during a run and each segment replays in index order.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from segack.kernel import OffsetAcker, SegmentSet
from segack.spark_adapter.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.columns import hash_column, member_index_column

__all__ = [
    "HandlerFailed",
    "Progress",
    "ReplayResult",
    "load_handler",
    "replay",
]

INDEX = "__segack_index"
SEGMENT = "__segack_segment"
_FAILURE_MARKER = "segack-handler-failed:"
_CHECK_EVERY = 64


class HandlerFailed(RuntimeError):
    """The handler raised on an event; the last committable point was saved first."""

    def __init__(self, key: Any, order: Any, index: int, reason: str) -> None:
        super().__init__(f"handler failed on the event with key {key!r} and order {order!r} "
                         f"(index {index}): {reason}")
        self.key = key
        self.order = order
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class Progress:
    """What the driver knows during a run (passed to the ``progress`` callback)."""

    done: int
    handled: int
    total: int
    committed: int
    pending_runs: int
    seconds: float


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of :func:`replay`."""

    total: int
    already_done: int
    handled: int
    committed: int
    segments: int
    seconds: float

    @property
    def complete(self) -> bool:
        """Whether every event is done."""
        return self.committed == self.total


def load_handler(spec: str) -> Callable[[dict[str, Any]], Any]:
    """The function named by ``MODULE:FUNCTION``; a clear ``ValueError`` if it cannot be found."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"handler must be MODULE:FUNCTION, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import handler module {module_name!r}: {error}") from None
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise ValueError(f"{module_name!r} has no function {function_name!r}")
    return handler  # type: ignore[no-any-return]


def _segment_set(segments: int | SegmentSet) -> SegmentSet:
    if isinstance(segments, SegmentSet):
        return segments
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be a positive int or a SegmentSet, not {segments!r}")
    return SegmentSet.balanced(segments)


def _process_partition(
    batches: Iterator[Any], *, handler: Callable[[dict[str, Any]], Any], store: CheckpointStore,
    run_id: str, columns: list[str], key: str, order: str, flush_every: int, flush_interval: float,
) -> Iterator[Any]:
    """The task: handle each event in index order, flushing progress as it goes."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    name = f"{run_id}-p{partition:05d}-a{context.attemptNumber() if context else 0}"
    acker = OffsetAcker()
    handled = since_flush = 0
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal since_flush, last_flush
        store.write_progress(name, acker)
        since_flush = 0
        last_flush = time.monotonic()

    for batch in batches:
        indexes = batch.column(INDEX).to_numpy()
        events = batch.select(columns).to_pylist()
        acked = 0
        for position, event in enumerate(events):
            try:
                handler(event)
            except Exception as error:
                acker.ack_many(indexes[acked:position])
                flush()
                detail = {"key": event.get(key), "order": event.get(order),
                          "index": int(indexes[position]), "error": f"{type(error).__name__}: {error}"}
                raise RuntimeError(_FAILURE_MARKER + json.dumps(detail, default=str)) from error
            handled += 1
            since_flush += 1
            if position % _CHECK_EVERY == _CHECK_EVERY - 1 and (
                since_flush >= flush_every or time.monotonic() - last_flush >= flush_interval
            ):
                acker.ack_many(indexes[acked:position + 1])
                acked = position + 1
                flush()
        acker.ack_many(indexes[acked:])
        if since_flush >= flush_every or time.monotonic() - last_flush >= flush_interval:
            flush()
    if since_flush:
        flush()
    yield pa.RecordBatch.from_pydict(
        {"partition": [partition], "handled": [handled]},
        schema=pa.schema([("partition", pa.int32()), ("handled", pa.int64())]),
    )


def _handler_failure(error: BaseException) -> HandlerFailed | None:
    match = re.search(re.escape(_FAILURE_MARKER) + r"(\{.*?\})(?:\n|$|')", str(error))
    if match is None:
        return None
    detail = json.loads(match.group(1))
    return HandlerFailed(detail["key"], detail["order"], detail["index"], detail["error"])


class _Merger:
    """The driver side: merges task progress into the checkpoint, on a timer and at the end."""

    def __init__(self, store: CheckpointStore, checkpoint: Checkpoint, total: int,
                 interval: float, progress: Callable[[Progress], None] | None) -> None:
        self.already_done = checkpoint.acker.next_index + checkpoint.acker.pending_count
        self.store = store
        self.checkpoint = checkpoint
        self.total = total
        self.interval = interval
        self.progress = progress
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="segack-merger", daemon=True)
        self.error: BaseException | None = None

    def merge_and_save(self) -> list[str]:
        """Merge every progress file, save the checkpoint; returns the files merged."""
        with self._lock:
            paths = self.store.progress_files()
            for _, acker in self.store.read_progress(paths):
                self.checkpoint.acker.merge(acker)
            self.checkpoint.settings["updated_at"] = time.time()
            self.store.save(self.checkpoint)
            self.report()
            return paths

    def report(self) -> None:
        if self.progress is not None:
            acker = self.checkpoint.acker
            done = acker.next_index + acker.pending_count
            self.progress(Progress(
                done=done, handled=done - self.already_done, total=self.total,
                committed=acker.next_index, pending_runs=acker.pending_runs,
                seconds=time.monotonic() - self.began,
            ))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.merge_and_save()
            except Exception as error:  # pragma: no cover - surfaced by finish()
                self.error = error
                return

    def __enter__(self) -> _Merger:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()


def _index_events(df: Any, key: str, order: str, base: int = 0) -> Any:
    """``df`` with a dense index column: the rank by ``(order, key)``, from ``base``.

    Events with equal ``(order, key)`` are ranked by a hash of the rest of the row, so each
    event's index depends only on the input, never on how Spark laid it out: a resumed run
    must skip exactly the events an earlier run did. Events equal in every column are
    interchangeable, so it does not matter which of them gets which index.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rest = [
        # Spark will not hash a map; its JSON form (entries in stored order) stands in for it.
        F.to_json(df[field.name]) if "map<" in field.dataType.simpleString() else df[field.name]
        for field in df.schema.fields
        if field.name not in (key, order)
    ]
    tie = F.xxhash64(*rest) if rest else F.lit(0)
    rank = F.row_number().over(
        Window.orderBy(F.col(order).asc_nulls_first(), F.col(key).asc_nulls_first(), tie)
    )
    return df.withColumn(INDEX, rank + F.lit(base - 1).cast("bigint"))


def _not_done(indexed: Any, acker: OffsetAcker) -> Any:
    """Rows of ``indexed`` the acker does not count as done, filtered in the JVM."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    remaining = indexed.where(F.col(INDEX) >= F.lit(acker.next_index))
    runs = acker.runs()
    if not runs:
        return remaining
    firsts, lasts = zip(*runs, strict=True)
    table = pa.table({"first": pa.array(firsts, pa.int64()), "last": pa.array(lasts, pa.int64())})
    spark = indexed.sparkSession
    done = spark.createDataFrame(table).select(F.explode(F.sequence("first", "last")).alias(INDEX))
    if acker.pending_count <= 5_000_000:
        done = F.broadcast(done)
    return remaining.join(done, INDEX, "left_anti")


def _fingerprint(df: Any, key: str, order: str) -> tuple[int, int]:
    """The event count and an order-free digest of the ``(key, order)`` pairs, in one JVM pass."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count(F.lit(1)).alias("total"),
        F.coalesce(F.bit_xor(F.xxhash64(F.col(key), F.col(order))), F.lit(0)).alias("digest"),
    ).first()
    return int(row["total"]), int(row["digest"])


def check_session(spark: Any) -> None:
    """Refuse a session with speculative execution on: two attempts of a segment must not overlap."""
    if spark.conf.get("spark.speculation", "false").lower() == "true":
        raise ValueError("spark.speculation is on; segack needs it off, so that two attempts "
                         "of one segment never run at once")


def replay(
    df: Any,
    *,
    key: str,
    order: str,
    handler: Callable[[dict[str, Any]], Any],
    checkpoint: str | CheckpointStore,
    segments: int | SegmentSet | None = None,
    hash: str = "spark",
    method: str = "auto",
    flush_every: int = 10_000,
    flush_interval: float = 5.0,
    progress: Callable[[Progress], None] | None = None,
    source: str | None = None,
) -> ReplayResult:
    """Call ``handler(event)`` once per not-yet-done event of ``df``, in order per key.

    ``event`` is a dict of the row's columns. Resumes from ``checkpoint`` if it
    holds one for the same input; ``segments`` (a count or a :class:`SegmentSet`;
    default: the last run's, else the session's default parallelism) may differ
    from the last run's. ``progress`` receives a :class:`Progress` at each merge.

    Raises ``ValueError`` for a missing column, a bad setting or speculation on;
    :class:`~segack.spark_adapter.checkpoint.CheckpointError` for a damaged
    checkpoint or one written for other input (nothing is written then);
    :class:`HandlerFailed` when the handler raises, after saving the checkpoint.
    """
    for name in (key, order):
        if name not in df.columns:
            raise ValueError(f"no column {name!r}; the columns are {df.columns}")
    if INDEX in df.columns or SEGMENT in df.columns:
        raise ValueError(f"column names {INDEX!r} and {SEGMENT!r} are reserved")
    if not callable(handler):
        raise TypeError("handler must be callable")
    if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
        raise ValueError(f"flush_every must be a positive int, not {flush_every!r}")
    if not flush_interval > 0:
        raise ValueError(f"flush_interval must be positive, not {flush_interval!r}")
    spark = df.sparkSession
    check_session(spark)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    began = time.monotonic()

    state = store.load() or Checkpoint(OffsetAcker(), {})
    total, digest = _fingerprint(df, key, order)
    previous = state.settings
    if previous and (previous.get("total"), previous.get("digest"), previous.get("key"),
                     previous.get("order")) != (total, digest, key, order):
        raise CheckpointError(
            f"checkpoint {store.location} belongs to other input (it recorded "
            f"{previous.get('total')} events keyed by {previous.get('key')!r}, ordered by "
            f"{previous.get('order')!r}); use a new checkpoint location"
        )
    if segments is None:
        segments = SegmentSet.from_ids(previous["segments"]) if previous.get("segments") else (
            spark.sparkContext.defaultParallelism)
    chosen = _segment_set(segments)
    run_id = uuid.uuid4().hex[:12]
    state.settings = {
        **previous, "source": source if source is not None else previous.get("source"),
        "key": key, "order": order, "hash": hash, "segments": list(chosen.ids),
        "total": total, "digest": digest, "runs": int(previous.get("runs", 0)) + 1,
        "run_id": run_id, "flush_every": flush_every, "flush_interval": flush_interval,
        "started_at": time.time(), "updated_at": time.time(), "status": "running",
    }
    already_done = _execute(
        _index_events(df, key, order), state, store, run_id=run_id, total=total, columns=list(df.columns),
        key=key, order=order, handler=handler, segments=chosen, hash=hash, method=method,
        flush_every=flush_every, flush_interval=flush_interval, progress=progress,
    )
    acker = state.acker
    done_now = acker.next_index + acker.pending_count
    return ReplayResult(
        total=total, already_done=already_done, handled=done_now - already_done,
        committed=acker.next_index, segments=len(chosen), seconds=time.monotonic() - began,
    )


def _execute(
    indexed: Any, state: Checkpoint, store: CheckpointStore, *, run_id: str, total: int,
    columns: list[str], key: str, order: str, handler: Callable[[dict[str, Any]], Any],
    segments: SegmentSet, hash: str, method: str, flush_every: int, flush_interval: float,
    progress: Callable[[Progress], None] | None,
) -> int:
    """Handle the events of ``indexed`` (indexes below ``total``) the checkpoint lacks.

    Merges progress a crashed run left behind first, saves the checkpoint at every
    merge, and leaves ``state`` holding the final acker. Returns how many events
    were done before the job started.
    """
    key_type = indexed.schema[key].dataType.simpleString()
    segment = member_index_column(hash_column(key, key_type, hash, method), segments)
    leftovers = store.progress_files()
    for _, leftover in store.read_progress(leftovers):
        state.acker.merge(leftover)
    store.save(state)
    store.delete_progress(leftovers)
    acker = state.acker
    already_done = acker.next_index + acker.pending_count
    if already_done < total:
        ordered = (
            _not_done(indexed, acker)
            .withColumn(SEGMENT, segment)
            .repartitionById(len(segments), SEGMENT)
            .sortWithinPartitions(INDEX)
            .drop(SEGMENT)
        )
        task = functools.partial(
            _process_partition, handler=handler, store=store, run_id=run_id, columns=columns,
            key=key, order=order, flush_every=flush_every, flush_interval=flush_interval,
        )
        merger = _Merger(store, state, total, flush_interval, progress)
        failure: BaseException | None = None
        with merger:
            try:
                ordered.mapInArrow(task, "partition int, handled long").collect()
            except BaseException as error:
                failure = error
        merged = merger.merge_and_save()
        if merger.error is not None:
            raise merger.error
        if failure is not None:
            state.settings["status"] = "failed"
            store.save(state)
            store.delete_progress(merged)
            raise _handler_failure(failure) or failure
        store.delete_progress(merged)
    state.settings["status"] = "complete" if acker.next_index == total else "incomplete"
    state.settings["updated_at"] = time.time()
    store.save(state)
    return already_done
