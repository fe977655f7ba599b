"""One Spark job of a run over one segment set, and the driver thread that merges its progress.

A run has more than one job when its segments change while it goes on
(:mod:`~segack.spark_adapter.store.rescale`): the job's tasks stop at their next flush, the driver merges
what they did, and the run's next job starts over the new set, each key group where it stood.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.state import StoppedError
from segack.spark_adapter.errors import HandlerFailedError, ReplayError, TokenError, kafka_data_loss
from segack.spark_adapter.results import STARTUP, Progress
from segack.spark_adapter.spark.executors import task_failure
from segack.spark_adapter.store.checkpoint import CheckpointStore, TaskLoad
from segack.spark_adapter.store.periodic import Periodic
from segack.spark_adapter.store.rescale import RequestWatcher, SegmentChange
from segack.spark_adapter.store.tokens import decode_updates
from segack.spark_adapter.worker.task import TaskPlan, TaskStart

if TYPE_CHECKING:
    from segack.spark_adapter.coordinator.state import RunState

__all__ = ["Job", "JobOutcome", "ProgressMerger", "run_tag"]

log = logging.getLogger(__name__)


def run_tag(run_id: str) -> str:
    """The Spark job tag of a run's jobs (interrupting it stops them)."""
    return f"segack-{run_id}"


class ProgressMerger(Periodic):
    """The driver side of a job: merges its tasks' progress files into the checkpoint on a timer
    (an atomic rewrite of the state file), and reports :class:`~segack.spark_adapter.Progress`.

    An error while merging stops the job: the merger records it, interrupts the job, and
    :meth:`Job.execute` raises it once the job has ended.
    """

    def __init__(self, run: RunState, job_id: str, segments: int) -> None:
        super().__init__(run.options.flush_interval, "segack-merger")
        self.run, self.job_id, self.segments = run, job_id, segments
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        # The checkpoint's retries before this job; the job's own come from its tasks.
        self.retries_before = int(run.state.settings.get("handler_retries", 0))

    def merge(self, results: Sequence[pa.Table] | None = None, retries: int = 0) -> None:
        """Fold this job's progress files (and, once the job has ended, its results and its
        tasks' ``retries``) into the checkpoint, and save it."""
        run = self.run
        with self._lock:
            tokens = run.tokens
            load = TaskLoad()
            for _, updates in run.store.read_progress(run.store.progress_files(self.job_id)):
                tokens.apply(updates)
                load += CheckpointStore.task_load(updates)
            if results is not None:
                # The job has ended: nothing is in flight; a task Spark ran again reported twice.
                load = TaskLoad(retries=max(load.retries, retries))
                for updates in results:
                    tokens.apply(updates)
            run.state.settings.update(updated_at=time.time(),
                                      handler_retries=self.retries_before + load.retries)
            run.keeper.save(run.state)
            self.report(load)

    def report(self, load: TaskLoad) -> None:
        run = self.run
        if run.progress is not None:
            done = run.tokens.done
            run.progress(Progress(done=done, handled=done - run.already_done, total=run.state.input_events,
                                  segments=self.segments, seconds=time.monotonic() - run.began,
                                  in_flight=load.in_flight, pending=load.pending))

    def tick(self) -> bool:
        try:
            self.merge()
        except BaseException as error:
            # The job raises it once it has stopped.
            log.info("%s: merging the progress of job %s failed, stopping it: %s", self.run.store.location,
                     self.job_id, error)
            self.error = error
            self.run.spark.interruptTag(run_tag(self.run.run_id))
            return True
        return False


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended, when it ended without an error."""

    #: The tasks' peak of rows read but not committed.
    peak_pending: int
    #: Dead letters the tasks wrote.
    dead_letters: int
    #: The change of segments the job stopped for (``None``: it ran to its end).
    change: SegmentChange | None


@dataclass
class _Ending:
    """What a job's tasks and its driver threads reported, gathered before anything is raised."""

    failures: list[HandlerFailedError] = field(default_factory=list)
    updates: list[pa.Table] = field(default_factory=list)
    peak_pending: int = 0
    dead_letters: int = 0
    retries: int = 0
    job_error: BaseException | None = None
    merge_error: BaseException | None = None
    #: Segments whose task stopped before the end of its events.
    stopped: list[int] = field(default_factory=list)
    #: Why tasks stopped when no change of segments asked them to, and none reported a failure
    #: (its task's result lost with its executor, say): the job did not finish.
    stopped_early: str | None = None

    @property
    def finished(self) -> bool:
        return (self.merge_error is None and self.job_error is None and not self.failures
                and self.stopped_early is None)


class Job:
    """The Spark job of ``run`` over ``segments``, named ``job_id`` (its tasks' progress files
    start with it)."""

    def __init__(self, run: RunState, job_id: str, segments: SegmentSet) -> None:
        self.run, self.job_id, self.segments = run, job_id, segments

    def execute(self, watch_requests: bool) -> JobOutcome:
        """Handle the remaining events over the segments; leaves the state saved.

        1. **Plan** the tasks: what each needs, pickled once for all of them.
        2. **Run** the Spark job, while the merger saves progress on a timer and, with
           ``watch_requests``, the watcher stops the tasks at their next flush when a change of
           segments is asked for; the run's :class:`~segack.spark_adapter.coordinator.state.EarlyStop`
           stops them there too.
        3. **Gather** the tasks' results: their failures, final updates and counts, and the segments
           whose task stopped before its end: when no change of segments asked for it and no task
           reported a failure (lost with its executor, its retry stopping as asked), the job did
           not finish, and nothing may call its events done.
        4. **Save**: merge the last progress files and the results, count the input if every task
           read all of it, record the status, and clean up the job's files.
        5. **Raise** what stopped the job, if anything: :class:`~segack.spark_adapter.ClaimLostError`
           (nothing more is saved), then the first :class:`~segack.spark_adapter.HandlerFailedError`,
           then :class:`~segack.spark_adapter.ReplayError`, or
           :class:`~segack.spark_adapter.coordinator.state.StoppedError` for tasks stopped early as
           asked.
        """
        run = self.run
        plan = self._plan()  # 1
        merger = ProgressMerger(run, self.job_id, len(self.segments))
        watcher = RequestWatcher(run.store, self.segments, lambda change: run.store.request_stop(
            self.job_id, f"segments change: {change.why}")) if watch_requests else None
        log.info("%s: job %s started over %d segments", run.store.location, self.job_id, len(self.segments))
        STARTUP.info("handling the events over %d segments", len(self.segments))
        ending = _Ending()
        results: pa.Table | None = None
        run.spark.addTag(run_tag(run.run_id))
        try:
            with (merger, watcher or contextlib.nullcontext(),
                  run.early_stop.job(run.store, self.job_id)):  # 2
                try:
                    results = run.events.job(run.tokens, self.segments, plan).toArrow()
                except Exception as error:
                    ending.job_error = error
        finally:
            run.spark.removeTag(run_tag(run.run_id))
        change = None if watcher is None else watcher.change
        ending.merge_error = merger.error
        self._gather(results, ending)  # 3
        if ending.stopped and change is None and not ending.failures:
            reason = run.store.stop_reason(self.job_id) or "no reason recorded"
            ending.stopped_early = (f"the tasks of segments {', '.join(map(str, ending.stopped))} stopped "
                                    f"before the end of their events ({reason})")
        self._save(merger, ending, change)  # 4
        self._raise(ending)  # 5
        log.info("%s: job %s ended%s", run.store.location, self.job_id,
                 "" if change is None else f" for a change of segments ({change.why})")
        return JobOutcome(ending.peak_pending, ending.dead_letters, change)

    def _plan(self) -> TaskPlan:
        run = self.run
        return TaskPlan(
            store=run.store.for_tasks(self.job_id, run.keeper.claim.number), handler=run.handler,
            columns=tuple(run.events.df.columns), key=run.events.key, order=run.events.order,
            options=run.options, start=TaskStart.of(run.tokens),
            parked=run.store.dead_letter_keys(run.events.key), checkpoint_id=run.checkpoint_id,
        )

    @staticmethod
    def _gather(results: pa.Table | None, ending: _Ending) -> None:
        if results is None:
            return
        ending.failures = [pickle.loads(blob) for blob in results.column("failure").to_pylist()
                           if blob is not None]
        ending.peak_pending = max(results.column("peak_pending").to_pylist(), default=0)
        ending.dead_letters = sum(results.column("dead_letters").to_pylist())
        ending.retries = sum(results.column("retries").to_pylist())
        segments, stopped = results.column("segment").to_pylist(), results.column("stopped").to_pylist()
        ending.stopped = [segment for segment, early in zip(segments, stopped, strict=True) if early]
        try:
            ending.updates = [decode_updates(blob, "a task's result")
                              for blob in results.column("updates").to_pylist() if blob is not None]
        except TokenError as error:
            ending.merge_error = ending.merge_error or error

    def _save(self, merger: ProgressMerger, ending: _Ending, change: SegmentChange | None) -> None:
        run, tokens = self.run, self.run.tokens
        try:
            merger.merge(ending.updates, ending.retries)
        except Exception as error:
            ending.merge_error = ending.merge_error or error
        if ending.finished and change is None and not tokens.counted:
            # Every task read all of its events: each key group's committed point is its count.
            tokens.count_from_committed()
            run.state.settings["total"] = tokens.total
        if ending.finished:
            status = "running" if change is not None else "complete" if tokens.complete else "incomplete"
        else:
            status = "stopped" if self._stopped_as_asked(ending) else "failed"
        run.state.settings.update(status=status, updated_at=time.time())
        try:
            run.keeper.save(run.state)
            run.store.delete_progress(run.store.progress_files(self.job_id))
            run.store.clear_stop(self.job_id)
        except Exception as error:
            ending.merge_error = ending.merge_error or error

    def _stopped_as_asked(self, ending: _Ending) -> bool:
        """Whether the job's tasks stopped before their end only because the run's early stop asked."""
        return (self.run.early_stop.reason is not None and ending.stopped_early is not None
                and not ending.failures and ending.job_error is None and ending.merge_error is None)

    def _raise(self, ending: _Ending) -> None:
        keeper = self.run.keeper
        if keeper.lost is not None:
            raise keeper.lost
        if ending.failures:
            failure = ending.failures[0]
            if ending.merge_error is not None:
                failure.add_note(f"saving progress afterwards failed too: {ending.merge_error!r}")
            raise failure
        if ending.merge_error is not None:
            raise ReplayError(f"saving progress failed: {ending.merge_error}") from ending.merge_error
        if ending.stopped_early is not None and self._stopped_as_asked(ending):
            stopped = StoppedError(f"{ending.stopped_early}; the progress before it is saved, and the next "
                                   f"run goes on from there")
            stopped.dead_letters = ending.dead_letters
            raise stopped
        if ending.stopped_early is not None:
            raise ReplayError(f"{ending.stopped_early}; the progress before it is saved: run it again")
        if ending.job_error is not None:
            lost = kafka_data_loss(ending.job_error)
            if lost is not None:
                # Spark reads the records in the job's first stage: no handler has seen one of them.
                raise ReplayError(f"Kafka no longer has records this micro-batch must read ({lost}): they "
                                  f"were deleted (by retention, or with their topic) before the stream read "
                                  f"them. Nothing of the micro-batch is done or committed, and segack does "
                                  f"not pass over them: to go on past them, start a new checkpoint, which "
                                  f"starts where Kafka's records begin (this one keeps its dead letters)"
                                  ) from ending.job_error
            raise ReplayError(f"a Spark task failed: {task_failure(ending.job_error)}") from ending.job_error
