"""What a run is, on the driver: its input, its checkpoint's state, its claim, its options and its
handler, shared by the coordinator (:class:`~segack.spark_adapter.coordinator.run.Run`) and the jobs
it starts (:mod:`~segack.spark_adapter.coordinator.job`, the dead-letter retry).

The run's settings are recorded in the state here, once, whichever entry point started the run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from segack.errors import SegackError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.results import Progress
    from segack.spark_adapter.spark.events import EventInput
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper
    from segack.spark_adapter.store.tokens import KeyGroupTokens

__all__ = ["EarlyStop", "Handler", "RunState", "StoppedError"]

log = logging.getLogger(__name__)

#: What a run calls for each event.
Handler = Callable[[dict[str, Any]], Any]


class StoppedError(SegackError, RuntimeError):
    """A stream's micro-batch that did not run to its end because the stream was asked to stop:
    one that starts after the stop, or one whose tasks an :class:`EarlyStop` ended. Its progress
    is saved; the query ends there, and the next run finishes the micro-batch."""

    #: The micro-batch whose tasks were ended before its end; ``None`` for one not started.
    batch_id: int | None = None
    #: Events its jobs set aside as dead letters before they were ended.
    dead_letters: int = 0


class EarlyStop:
    """Asks, from another thread, that a run's Spark jobs end at their tasks' next flush: each task
    finishes its calls in flight, saves its progress and ends, and the events left are the next
    run's (a stream's ``stop_timeout``). Asked before a job starts, the job's tasks handle nothing.
    """

    def __init__(self) -> None:
        #: Why the run was asked to stop early; ``None`` until it is.
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._job: tuple[CheckpointStore, str] | None = None
        #: Whether the job under way has its stop request written (a failed write is tried again).
        self._requested = False

    def __getstate__(self) -> dict[str, Any]:
        # Over Spark Connect the replay holding it runs in the server's Python: the reason travels,
        # the lock and the job under way do not.
        return {"reason": self.reason}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.reason = state["reason"]

    def ask(self, reason: str) -> None:
        """Stop the job running now, if any, and any later one of the run, for ``reason`` (the first
        given); asked again, write a stop request that could not be written before."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
            if self._job is not None and not self._requested:
                self._request(*self._job)

    @contextlib.contextmanager
    def job(self, store: CheckpointStore, job_id: str) -> Iterator[None]:
        """While job ``job_id`` of ``store`` runs: a stop asked reaches its tasks."""
        with self._lock:
            self._job, self._requested = (store, job_id), False
            if self.reason is not None:
                self._request(store, job_id)
        try:
            yield
        finally:
            with self._lock:
                self._job = None

    def _request(self, store: CheckpointStore, job_id: str) -> None:
        try:
            store.request_stop(job_id, self.reason or "")
            self._requested = True
        except OSError as error:  # asked again at the watcher's next look
            log.warning("%s: could not ask job %s's tasks to stop early: %s", store.location, job_id, error)


class RunState:
    """One run on a checkpoint it holds: ``keeper`` keeps its claim, ``state`` is the checkpoint's
    state (kept current and saved as the run goes), ``events`` its input; ``handler`` is called as
    ``options`` say, and ``progress`` receives a :class:`~segack.spark_adapter.Progress` at each
    merge. ``batch_id``: the stream's micro-batch the run handles; ``early_stop``: how another
    thread ends its jobs before their end.

    Records in ``state`` how the run handles its input (key, order, hash, column types, key-group
    resolution, flush settings) and that it is running.
    """

    def __init__(self, events: EventInput, state: Checkpoint, keeper: ClaimKeeper, options: RunOptions,
                 handler: Handler, progress: Callable[[Progress], None] | None = None,
                 batch_id: int | None = None, early_stop: EarlyStop | None = None) -> None:
        assert state.tokens is not None
        self.events, self.state, self.keeper, self.options = events, state, keeper, options
        self.handler, self.progress = handler, progress
        self.early_stop = early_stop or EarlyStop()
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
