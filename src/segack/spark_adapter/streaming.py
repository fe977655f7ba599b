"""Structured Streaming: replay each micro-batch in order, with positions continuing across batches.

Each micro-batch is an input of its own to the key-group tokens: its events of
key group ``g`` get positions from where the previous batches left ``g`` (the
tokens' ``base``). The checkpoint records the last completed batch id and the
batch in progress, so a micro-batch Spark delivers again after a failure
(``foreachBatch`` is at least once) gets the same positions, is verified
against what was done of it, and only its undone events run; a batch already
completed is skipped.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from segack.errors import SegackTypeError, SegackValueError
from segack.kernel import SegmentSet
from segack.spark_adapter.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.claims import DEFAULT_CLAIM_TIMEOUT, ClaimKeeper, acquire, check_claim_timeout
from segack.spark_adapter.dispatch import Handling
from segack.spark_adapter.replay import (
    EventInput,
    ReplayError,
    _check_positive,
    _execute,
    _resolution,
    _segment_set,
    check_location,
    check_same_setup,
    check_session,
    run_tag,
)
from segack.spark_adapter.rescale import (
    SegmentChange,
    auto_change,
    pending_change,
    record_segments,
    recorded_segments,
)
from segack.spark_adapter.session import default_segment_count
from segack.spark_adapter.tokens import KeyGroupTokens

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["foreach_batch"]


def foreach_batch(
    handler: Callable[[dict[str, Any]], Any],
    *,
    key: str,
    order: str,
    checkpoint: str | CheckpointStore,
    segments: int | SegmentSet | str | None = None,
    hash: str = "spark",
    key_group_bits: int | None = None,
    method: str = "auto",
    flush_every: int = 10_000,
    flush_interval: float = 5.0,
    shared_local_checkpoint: bool = False,
    concurrency: int = 1,
    max_pending: int | None = None,
    policy: str = "per-key",
    retries: int = 0,
    retry_delay: float = 0.1,
    timeout: float | None = None,
    on_error: str = "stop",
    claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
    retry_dead_letters: bool = False,
) -> Callable[[DataFrame, int], None]:
    """A function for ``DataStreamWriter.foreachBatch`` that replays each micro-batch.

    Within a batch, each key's events run in ``order``; across batches, a batch
    starts once the previous one is complete. ``concurrency``, ``max_pending``, ``policy``,
    ``retries``, ``retry_delay``, ``timeout`` and ``on_error`` work as in
    :func:`~segack.spark_adapter.replay`. Each batch claims the checkpoint for its run, as a
    replay does (``claim_timeout``), and releases it at its end. With ``retry_dead_letters``, the
    first batch this function processes handles the checkpoint's dead letters again before its
    own events (restart the query with it once the cause is fixed).

    ``segments`` is the set of the first batch this function processes (a count or a
    :class:`~segack.SegmentSet`; default: the checkpoint's set, else the session's default count).
    Later batches keep the checkpoint's set, which :func:`~segack.spark_adapter.split`,
    :func:`~segack.spark_adapter.merge` and :func:`~segack.spark_adapter.scale` change while the
    query runs: a change asked during a batch applies at the next one
    (:mod:`~segack.spark_adapter.rescale`). ``segments="auto"`` plans the set again before each
    batch from the key groups' load measured so far, for the session's default count of
    workers, and changes it only when the largest share drops by a clear margin (a fifth).
    Settings are checked at once
    (``ValueError``/``TypeError`` as for :func:`~segack.spark_adapter.replay`); each batch raises as
    :func:`~segack.spark_adapter.replay` does.
    """
    if not callable(handler):
        raise SegackTypeError("handler must be callable")
    _check_positive("flush_every", flush_every, int)
    _check_positive("flush_interval", flush_interval, float)
    handling = Handling(concurrency, max_pending, policy, retries, retry_delay, timeout, on_error)
    claim_timeout = check_claim_timeout(claim_timeout)
    if not isinstance(retry_dead_letters, bool):
        raise SegackValueError(f"retry_dead_letters must be True or False, not {retry_dead_letters!r}")
    retry_pending = retry_dead_letters  # until a batch has retried them
    auto = segments == "auto"
    chosen = None if segments is None or auto else _segment_set(segments)
    first_batch = True
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)

    def process_batch(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        check_session(spark)
        check_location(spark, store, shared_local_checkpoint)
        run_id = f"b{batch_id}-{uuid.uuid4().hex[:8]}"
        claim = acquire(store, run_id, claim_timeout)
        stop = functools.partial(spark.interruptTag, run_tag(run_id))
        with ClaimKeeper(store, claim, on_lost=stop) as keeper:
            _process(batch, batch_id, run_id, keeper)

    def _segments(state: Checkpoint, bits: int, batch: DataFrame, batch_id: int,
                  pending: SegmentChange | None) -> tuple[SegmentSet, str]:
        """The batch's segments, and why (rule 3 of :mod:`~segack.spark_adapter.rescale`)."""
        if chosen is not None and first_batch:
            return chosen, f"start of the query, at batch {batch_id}"
        if pending is not None:
            return pending.segment_set, f"{pending.why} (by {pending.by}), at batch {batch_id}"
        workers = default_segment_count(batch.sparkSession)
        current = recorded_segments(state) or SegmentSet.balanced(min(workers, 1 << bits))
        if auto and state.tokens is not None:
            planned = auto_change(state.tokens, current, workers)
            if planned is not None:
                return planned[0], f"{planned[1]}, at batch {batch_id}"
        return current, f"start of the query, at batch {batch_id}"

    def _process(batch: DataFrame, batch_id: int, run_id: str, keeper: ClaimKeeper) -> None:
        nonlocal retry_pending, first_batch
        state = store.load() or Checkpoint()
        bits = _resolution(state.settings, key_group_bits)
        pending = pending_change(store)
        segments, why = _segments(state, bits, batch, batch_id, pending)
        segments.key_group_owners(bits)
        events = EventInput(batch, key, order, hash, method, bits)
        stream = state.settings.get("stream", {"completed_batch": -1, "batch": None})
        if batch_id <= stream["completed_batch"]:
            return
        current = stream["batch"]
        if current is not None and current["id"] != batch_id:
            raise CheckpointError(f"checkpoint {store.location} has batch {current['id']} in progress, "
                                  f"but Spark delivered batch {batch_id}")
        check_same_setup(state.settings, events, hash, f"checkpoint {store.location}")
        if state.tokens is None:
            # Before the first batch, the stream is an empty input, complete.
            state.tokens = KeyGroupTokens.empty(bits, pa.null(), pa.null())
            state.tokens.set_counts(np.zeros(state.tokens.size, dtype=np.int64))
        if current is None:
            state.tokens.start_input()
            current = {"id": batch_id}
        state.settings.update({
            "key": key, "order": order, "hash": hash, **events.column_types, "key_group_bits": bits,
            "flush_every": flush_every, "flush_interval": flush_interval,
            "updated_at": time.time(), "status": "running",
            "stream": {"completed_batch": stream["completed_batch"], "batch": current},
        })
        record_segments(state, segments, why)
        _execute(events, state, store, run_id=run_id, handler=handler, segments=segments,
                 flush_every=flush_every, flush_interval=flush_interval, progress=None, handling=handling,
                 keeper=keeper, retry=retry_pending, consumed=pending)
        retry_pending = first_batch = False
        if not state.tokens.complete:
            raise ReplayError(f"batch {batch_id} ended with events not done")
        state.settings["stream"] = {"completed_batch": batch_id, "batch": None}
        keeper.check()
        store.save(state, keeper.claim.number)

    return process_batch
