"""A real-time stream's jobs, as its driver runs and watches them (steps 4 to 7 of
:mod:`~segack.spark_adapter.coordinator.realtime`): the Spark job of long-running tasks over the
stream's partitions, the driver's look at it every ``commit_interval`` (reports, the group's commits,
stop requests), the subscription's topics looked at every :data:`PARTITIONS_LOOK_SECONDS` (a topic
whose partitions changed stops the stream; a topic made that matches it starts the tasks again with
its partitions beside the others), and how the stream ended."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.coordinator.group_commits import GroupCommits
from segack.spark_adapter.coordinator.job import run_tag
from segack.spark_adapter.coordinator.kafka_starts import read_starts, subscribed_partitions
from segack.spark_adapter.coordinator.query import StopRequest
from segack.spark_adapter.coordinator.stream_partitions import (
    STARTING_AT,
    StreamPartitions,
    Subscription,
    named,
)
from segack.spark_adapter.errors import (
    CheckpointError,
    HandlerFailedError,
    InputError,
    ReplayError,
    one_line,
    worker_error,
)
from segack.spark_adapter.results import RealTimeReport
from segack.spark_adapter.spark.session import is_connect, server_parallelism, setting
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.partitions import DRIVER, PartitionView
from segack.spark_adapter.worker.partition_task import (
    RESULT_SCHEMA,
    PartitionPlan,
    run_partitions,
    start_state,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from segack.spark_adapter.store.claims import ClaimKeeper

__all__ = ["PARTITIONS_LOOK_SECONDS", "STARTUP_SECONDS", "JobWatch", "RealTimeJob", "RealTimeJobs",
           "handled_totals", "progress_report", "record_starts", "slots", "task_errors"]

log = logging.getLogger(__name__)

#: Seconds between looks at the topics' partitions while the stream runs.
PARTITIONS_LOOK_SECONDS = 10.0
#: Seconds after the job's start by which a task of the run must hold every partition.
STARTUP_SECONDS = 180.0
def record_starts(store: CheckpointStore, pairs: tuple[tuple[str, int], ...], starts: Mapping[int, int],
                   run_id: str, claim: int) -> None:
    """Step 3: the start of each partition (by number, of ``pairs``) that nobody has held yet,
    recorded."""
    recorded = store.partitions.record_starts(
        {partition: start_state(*pairs[partition], offset, claim) for partition, offset in starts.items()},
        {"run": run_id, "claim": claim})
    for partition in recorded:
        log.info("%s: partition %s starts at offset %d", store.location, named(pairs[partition]),
                 starts[partition])


def slots(spark: SparkSession) -> int:
    """The tasks the session runs at once (a Connect server's as it sets them, else as it cuts a range)."""
    if is_connect(spark):
        return max(1, int(setting(spark, "spark.default.parallelism", "0")) or server_parallelism(spark))
    return max(1, spark.sparkContext.defaultParallelism)


def handled_totals(views: Mapping[int, PartitionView]) -> dict[int, int]:
    """Each partition's records handled over all runs, as ``views`` hold them: what a run's
    :func:`progress_report` counts from."""
    return {number: int(view.state.get("handled_total", 0)) for number, view in views.items()
            if view.state is not None}


def progress_report(store: CheckpointStore, views: Mapping[int, PartitionView], began: float,
                    before: Mapping[int, int], partitions: int) -> RealTimeReport:
    """The progress of the stream's ``partitions`` (numbers below it) as the tasks last saved it
    (``views``); ``handled``: by this run, which began with ``before`` (:func:`handled_totals`), over
    its jobs and every attempt of their tasks."""
    views = {number: view for number, view in views.items() if number < partitions}
    handled = sum(max(total - before.get(number, 0), 0) for number, total in handled_totals(views).items())
    return RealTimeReport(handled, time.monotonic() - began, store.partitions.reports(views))


class RealTimeJob:
    """The job of the stream's tasks, in a thread of its own, tagged so that it can be interrupted."""

    def __init__(self, spark: SparkSession, plan: PartitionPlan, tasks: int, tag: str) -> None:
        self.spark, self.plan, self.tasks, self.tag = spark, plan, tasks, tag
        self.results: pa.Table | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="segack-real-time-job", daemon=True)

    def _run(self) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        self.spark.addTag(self.tag)
        try:
            frame = self.spark.range(0, self.tasks, 1, self.tasks).mapInArrow(
                functools.partial(run_partitions, self.plan), from_arrow_schema(RESULT_SCHEMA))
            self.results = frame.toArrow()
        except BaseException as error:
            self.error = error
        finally:
            self.spark.removeTag(self.tag)


class RealTimeJobs:
    """The stream's jobs, one after the other (steps 4 to 6): the first over the partitions read
    when the run began, and another each time a topic that matches the subscription is found (the
    tasks save and end, and the next job reads the new topic's partitions beside the others)."""

    def __init__(self, spark: SparkSession, store: CheckpointStore, keeper: ClaimKeeper, state: Checkpoint,
                 subscription: Subscription, settings: dict[str, str], group: GroupCommits | None,
                 began: float) -> None:
        self.spark, self.store, self.keeper, self.group, self.began = spark, store, keeper, group, began
        self.state, self.subscription, self.settings = state, subscription, settings
        #: Each partition's records handled over all runs when this run's jobs began.
        self.before = handled_totals(store.partitions.views())
        #: Each ended task's result row, of every job.
        self.results: list[dict[str, Any]] = []

    def run(self, plan: PartitionPlan, partitions: StreamPartitions, stop: StopRequest,
            progress: Callable[[RealTimeReport], None] | None) -> JobWatch:
        """Run jobs over ``partitions`` (and those found later) until one ends for a reason other than
        a topic found; the watch of the last."""
        run_id = plan.store.run_id
        while True:
            tasks = min(len(plan.sources), slots(self.spark))
            numbers = tuple(range(len(plan.sources)))
            plan = dataclasses.replace(plan, assignment=tuple(numbers[index::tasks]
                                                              for index in range(tasks)))
            log.info("%s: a real-time stream of %s: %d partitions in %d tasks", self.store.location,
                     ", ".join(dict.fromkeys(topic for topic, _ in plan.sources)), len(plan.sources), tasks)
            job = RealTimeJob(self.spark, plan, tasks, run_tag(run_id))
            job.thread.start()
            watch = JobWatch(job, self.store, self.keeper, (self.began, self.before), self.group, partitions,
                             self.subscription)
            try:
                watch.until_ended(stop, progress, lambda: subscribed_partitions(self.settings,
                                                                                self.subscription))
            except BaseException:
                watch.stop_now()  # no task may go on with the claim released
                raise
            self.results += job.results.to_pylist() if job.results is not None else []
            if watch.found is None or watch.ended_otherwise(stop):
                return watch
            try:
                plan = self._grown(plan, partitions, watch.found)
            except Exception as error:  # Kafka or the store failing: the stream ends as a failure
                log.warning("%s: could not start reading %s: %s", self.store.location,
                            ", ".join(watch.found.names[len(partitions.names):]), one_line(error))
                watch.changed = (f"the stream could not start reading the topics found "
                                 f"({', '.join(watch.found.names[len(partitions.names):])}): "
                                 f"{one_line(error)}; the next run does")
                return watch
            if stop.asked.is_set():  # asked while the new topics were set up: no job starts
                return watch
            partitions = watch.found

    def _grown(self, plan: PartitionPlan, partitions: StreamPartitions, found: StreamPartitions
               ) -> PartitionPlan:
        """The plan with the topics ``found`` beside the others: recorded in the checkpoint with
        where they start (``earliest``: a topic made while the stream runs is read from its first
        record, as Spark's reader reads one), then their partitions' starts (each at the group's
        offset, else at its earliest), so that a run killed in between starts them there too."""
        added = list(range(len(plan.sources), len(found.pairs)))
        new_topics = found.names[len(partitions.names):]
        starting_at = {**self.state.settings.get(STARTING_AT, {}), **dict.fromkeys(new_topics, "earliest")}
        self.state.settings.update({**found.settings(), STARTING_AT: starting_at, "updated_at": time.time()})
        self.keeper.save(self.state)
        if self.group is not None:
            self.group.pairs = found.pairs
        starts = read_starts(self.settings, found.pairs, added, starting_at, self.group)
        record_starts(self.store, found.pairs, starts, plan.store.run_id, self.keeper.claim.number)
        self.store.clear_stop(plan.store.run_id)
        log.info("%s: %s found: the tasks start again with them", self.store.location, ", ".join(new_topics))
        return dataclasses.replace(plan, sources=found.pairs, starts={**plan.starts, **starts},
                                   job=plan.job + 1)


class JobWatch:
    """The driver's side of a running job (steps 5 to 7): reports, the group's commits, stop
    requests, and the subscription's topics looked at every :data:`PARTITIONS_LOOK_SECONDS`."""

    def __init__(self, job: RealTimeJob, store: CheckpointStore, keeper: ClaimKeeper,
                 began: tuple[float, Mapping[int, int]], group: GroupCommits | None,
                 partitions: StreamPartitions, subscription: Subscription) -> None:
        """``began``: when the run began, and each partition's records handled then
        (:func:`handled_totals`)."""
        self.job, self.store, self.run_id, self.keeper = job, store, job.plan.store.run_id, keeper
        (self.began, self.before), self.group = began, group
        self.partitions, self.subscription = partitions, subscription
        #: When the job started: the tasks' slots are looked for from then on.
        self.job_began = time.monotonic()
        self.asked = self.interrupted = False
        #: Why the stream stopped for its partitions (a topic's changed, or some never read), if it did.
        self.changed: str | None = None
        #: The stream's partitions with the topics found since the job started, if any were.
        self.found: StreamPartitions | None = None
        self.all_started = False

    def until_ended(self, stop: StopRequest, progress: Callable[[RealTimeReport], None] | None,
                    list_partitions: Callable[[], tuple[dict[str, int], dict[str, str]]]) -> None:
        next_look = time.monotonic() + PARTITIONS_LOOK_SECONDS
        interval = self.job.plan.commit_interval
        while self.job.thread.is_alive():
            self.job.thread.join(interval)
            if stop.asked.is_set():
                self._ask("asked to stop")
            if stop.now.is_set():
                self.stop_now()
            if time.monotonic() >= next_look and self.changed is None and self.found is None:
                next_look = time.monotonic() + PARTITIONS_LOOK_SECONDS
                self._look(list_partitions)
            try:
                views = self.store.partitions.views()
            except (OSError, CheckpointError) as error:  # the store out of reach for a moment
                log.warning("%s: could not read the partitions' progress: %s", self.store.location, error)
                continue
            if self.group is not None and self.keeper.lost is None:  # a newer run's group now
                self.group.commit(views)
            self._check_started(views)
            if progress is not None and self.job.thread.is_alive():
                progress(progress_report(self.store, views, self.began, self.before,
                                         len(self.job.plan.sources)))

    def ended_otherwise(self, stop: StopRequest) -> bool:
        """Whether the job ended for a reason besides the topics :attr:`found`: a stop asked, the
        claim lost, a task's failure, the job's."""
        return (stop.asked.is_set() or self.changed is not None or self.keeper.lost is not None
                or self.job.error is not None or bool(task_errors(self.job.results)))

    def end(self, state: Checkpoint, keeper: ClaimKeeper) -> None:
        """Step 7: commit the last progress to the group, record how the stream ended, then raise what
        ended it, if anything."""
        job = self.job
        if self.group is not None and keeper.lost is None:
            self.group.commit_until(self.store.partitions.views)
        errors = task_errors(job.results)
        state.settings.update({"updated_at": time.time(),
                               "status": "failed" if errors or job.error or self.changed else "stopped"})
        if keeper.lost is None:
            keeper.save(state)
        self.store.clear_stop(self.run_id)
        if keeper.lost is not None:
            raise keeper.lost
        if self.changed:
            raise ReplayError(self.changed)
        if errors:  # a handler's failure; records gone, after the stream handled others: not a refusal
            raise errors[0] if isinstance(errors[0], HandlerFailedError) else ReplayError(str(errors[0]))
        if job.error is not None and not self.interrupted:
            raise ReplayError(f"the real-time stream's job failed: {worker_error(job.error)}") from job.error

    def _check_started(self, views: Mapping[int, PartitionView]) -> None:
        """Stop the stream if some partitions are not held by a task of this run
        :data:`STARTUP_SECONDS` after the job started: their tasks found no free slot (the running
        ones never end), and nothing else would tell. A task holds its partitions before its first
        call, however long that one takes."""
        if self.all_started or self.changed is not None or \
                time.monotonic() - self.job_began < STARTUP_SECONDS:
            return
        started = {partition for partition, view in views.items()
                   if view.owner.get("run") == self.run_id and view.owner.get("attempt") != DRIVER
                   and view.owner.get("job", 0) == self.job.plan.job}
        sources = self.job.plan.sources
        missing = [partition for partition in range(len(sources)) if partition not in started]
        self.all_started = not missing
        if missing:
            self.changed = (f"partitions {', '.join(named(sources[partition]) for partition in missing)} "
                            f"were not read {STARTUP_SECONDS:g} s after the stream's tasks started: their "
                            f"tasks found no free slot (a real-time stream's tasks never end); give the "
                            f"session a slot per task (it runs {self.job.tasks})")
            self._ask(self.changed)

    def _ask(self, reason: str) -> None:
        if not self.asked:
            self.asked = True
            self.store.request_stop(self.run_id, reason)

    def stop_now(self) -> None:
        """Interrupt the tasks at once: each partition keeps what its last save recorded."""
        if not self.interrupted:
            self.interrupted = True
            self.job.spark.interruptTag(self.job.tag)

    def _look(self, list_partitions: Callable[[], tuple[dict[str, int], dict[str, str]]]) -> None:
        """Stop the stream if a topic's partitions changed (a key's later records may be in another
        partition, whose offsets do not follow its earlier ones) or a topic it reads is gone; ask the
        tasks to end, to start again with them, if topics that match the subscription were made."""
        try:
            now = list_partitions()
        except InputError as error:  # Kafka out of reach for a moment: the tasks' consumers retry
            log.warning("%s: could not list the partitions of the stream's topics: %s", self.store.location,
                        error)
            return
        counts, unreadable = now
        undescribed = [topic for topic in self.partitions.names if topic in unreadable]
        if undescribed:  # not authorized, no leader for a moment: looked at again next time
            log.warning("%s: Kafka cannot describe topic %s now: %s", self.store.location, undescribed[0],
                        unreadable[undescribed[0]])
            return
        try:
            found = self.partitions.checked(counts, self.subscription, self.store.location)
        except (InputError, CheckpointError) as error:
            self.changed = str(error)
            log.info("%s: the topics' partitions changed: the tasks are asked to stop", self.store.location)
            self._ask(self.changed)
            return
        if found != self.partitions:
            self.found = found
            self._ask(f"{', '.join(found.names[len(self.partitions.names):])} found: the tasks start again "
                      f"with them")


def task_errors(results: pa.Table | None) -> list[HandlerFailedError | InputError]:
    """What ended the tasks that did not stop as asked: handler failures first."""
    import pickle

    if results is None:
        return []
    found = [pickle.loads(data) for data in results.column("error").to_pylist() if data is not None]
    return sorted(found, key=lambda error: not isinstance(error, HandlerFailedError))
