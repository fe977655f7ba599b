"""Structured Streaming: replay each micro-batch in order, one acker across the whole stream.

Indexes continue from batch to batch: a batch's events get ``base .. base + n - 1``
by their rank in ``(order, key)``, where ``base`` is where the previous batch
ended. The checkpoint records the last completed batch id and the batch in
progress, so a micro-batch Spark delivers again after a failure (``foreachBatch``
is at least once) gets the same indexes and only its undone events run; a
batch already completed is skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from segack.kernel import SegmentSet
from segack.spark_adapter.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.replay import INDEX, _execute, _index_events, _segment_set, check_session

__all__ = ["foreach_batch"]


def foreach_batch(
    handler: Callable[[dict[str, Any]], Any],
    *,
    key: str,
    order: str,
    checkpoint: str | CheckpointStore,
    segments: int | SegmentSet = 2,
    hash: str = "spark",
    method: str = "auto",
    flush_every: int = 10_000,
    flush_interval: float = 5.0,
) -> Callable[[Any, int], None]:
    """A function for ``DataStreamWriter.foreachBatch`` that replays each micro-batch.

    Within a batch, each key's events run in ``order``; across batches, a batch
    starts once the previous one is complete. Settings are checked at once
    (``ValueError``/``TypeError`` as for :func:`~segack.spark_adapter.replay.replay`).
    """
    if not callable(handler):
        raise TypeError("handler must be callable")
    chosen = _segment_set(segments)
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)

    def process_batch(batch: Any, batch_id: int) -> None:
        for name in (key, order):
            if name not in batch.columns:
                raise ValueError(f"no column {name!r}; the columns are {batch.columns}")
        check_session(batch.sparkSession)
        state = store.load() or Checkpoint()
        stream = state.settings.get("stream", {"completed_batch": -1, "batch": None})
        if batch_id <= stream["completed_batch"]:
            return
        current = stream["batch"]
        if current is not None and current["id"] != batch_id:
            raise CheckpointError(f"checkpoint {store.location} has batch {current['id']} in progress, "
                                  f"but Spark delivered batch {batch_id}")
        if current is None:
            current = {"id": batch_id, "base": state.acker.next_index, "count": batch.count()}
        total = current["base"] + current["count"]
        state.settings.update({
            "key": key, "order": order, "hash": hash, "segments": list(chosen.ids), "total": total,
            "stream": {"completed_batch": stream["completed_batch"], "batch": current},
            "flush_every": flush_every, "flush_interval": flush_interval, "updated_at": time.time(),
        })
        indexed = _index_events(batch, key, order, base=current["base"])
        _execute(
            indexed, state, store, run_id=f"b{batch_id}-{uuid.uuid4().hex[:8]}", total=total,
            columns=[c for c in indexed.columns if c != INDEX], key=key, order=order, handler=handler,
            segments=chosen, hash=hash, method=method, flush_every=flush_every,
            flush_interval=flush_interval, progress=None,
        )
        if state.acker.next_index != total:
            raise RuntimeError(f"batch {batch_id} ended with events not done")
        state.settings["stream"] = {"completed_batch": batch_id, "batch": None}
        store.save(state)

    return process_batch
