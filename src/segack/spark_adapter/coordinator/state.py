"""What a run is, on the driver: its input, its checkpoint's state, its claim, its options and its
handler, shared by the coordinator (:class:`~segack.spark_adapter.coordinator.run.Run`) and the jobs
it starts (:mod:`~segack.spark_adapter.coordinator.job`, the dead-letter retry).

The run's settings are recorded in the state here, once, whichever entry point started the run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.results import Progress
    from segack.spark_adapter.spark.events import EventInput
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper
    from segack.spark_adapter.store.tokens import KeyGroupTokens

__all__ = ["Handler", "RunState"]

#: What a run calls for each event.
Handler = Callable[[dict[str, Any]], Any]


class RunState:
    """One run on a checkpoint it holds: ``keeper`` keeps its claim, ``state`` is the checkpoint's
    state (kept current and saved as the run goes), ``events`` its input; ``handler`` is called as
    ``options`` say, and ``progress`` receives a :class:`~segack.spark_adapter.Progress` at each
    merge. ``batch_id``: the stream's micro-batch the run handles.

    Records in ``state`` how the run handles its input (key, order, hash, column types, key-group
    resolution, flush settings) and that it is running.
    """

    def __init__(self, events: EventInput, state: Checkpoint, keeper: ClaimKeeper, options: RunOptions,
                 handler: Handler, progress: Callable[[Progress], None] | None = None,
                 batch_id: int | None = None) -> None:
        assert state.tokens is not None
        self.events, self.state, self.keeper, self.options = events, state, keeper, options
        self.handler, self.progress = handler, progress
        self.store: CheckpointStore = keeper.store
        self.run_id = keeper.claim.run_id
        #: How the names of the files the run's jobs write begin (progress, dead letters, stop
        #: requests): the run's id, and the micro-batch's for a stream, whose batches all run under
        #: one claim and must never write over an earlier batch's dead letters.
        self.files_prefix = self.run_id if batch_id is None else f"{self.run_id}-b{batch_id}"
        #: Made with the checkpoint's first state, and kept: part of every event's identity.
        self.checkpoint_id: str = state.settings.setdefault("checkpoint_id", uuid.uuid4().hex)
        self.spark: SparkSession = events.df.sparkSession
        #: Events done before the jobs started, and when they started (for progress reports).
        self.already_done = 0
        self.began = time.monotonic()
        state.settings.update({
            "key": events.key, "order": events.order, "hash": options.hash, **events.column_types,
            "key_group_bits": events.bits, "flush_every": options.flush_every,
            "flush_interval": options.flush_interval, "batch_size": options.handling.batch_size,
            "updated_at": time.time(), "status": "running",
        })

    @property
    def tokens(self) -> KeyGroupTokens:
        """The state's tokens (a run's state always has them)."""
        tokens = self.state.tokens
        assert tokens is not None
        return tokens
