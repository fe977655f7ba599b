"""The coordinator of a run, on the driver: what :func:`~segack.spark_adapter.replay` and each
micro-batch of :func:`~segack.spark_adapter.foreach_batch` do once they hold the checkpoint.

As Axon's pooled processor divides its work, a :class:`Run` claims (through its
:class:`~segack.spark_adapter.store.claims.ClaimKeeper`), plans and starts the Spark jobs; each job's
tasks (:mod:`~segack.spark_adapter.worker.task`) are the work packages of their segments; the checkpoint
(:class:`~segack.spark_adapter.store.checkpoint.CheckpointStore`) is the token store. Data flows one
way: run -> tasks -> progress files -> the run's merges -> the state file.

State on the driver is one entry per key group: it does not grow with events.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from segack.kernel import SegmentSet
from segack.spark_adapter.coordinator.dead_letters import RetryOutcome, RetryRun, retry_dead_letters
from segack.spark_adapter.coordinator.job import Job, run_tag
from segack.spark_adapter.coordinator.state import RunState
from segack.spark_adapter.errors import (
    CheckpointError,
    CheckpointLocationError,
    ForeignInputError,
    SessionError,
    TokenError,
)
from segack.spark_adapter.handlers import RunContext, prepare_handler
from segack.spark_adapter.options import RunOptions, Verify, check_key_group_bits
from segack.spark_adapter.results import STARTUP
from segack.spark_adapter.spark.session import executors_share_local_disk, setting
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.claims import ClaimKeeper, acquire, previous_run
from segack.spark_adapter.store.rescale import SegmentChange, pending_change, record_segments
from segack.spark_adapter.store.tokens import DEFAULT_KEY_GROUP_BITS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = ["Run", "RunCounts", "check_location", "check_metrics_address", "check_session", "claimed",
           "metrics_served", "new_run_id", "resolution"]

log = logging.getLogger(__name__)


def check_session(spark: SparkSession) -> None:
    """Refuse a session with speculative execution on: two attempts of a segment must not overlap."""
    if setting(spark, "spark.speculation", "false").lower() == "true":
        raise SessionError("spark.speculation is on; segack needs it off, so that two attempts "
                           "of one segment never run at once")


def check_location(spark: SparkSession, store: CheckpointStore, shared_local_checkpoint: bool) -> None:
    """Refuse a local checkpoint path when executors may run on other machines.

    They would write their progress to their own disks, where the driver never
    reads it. ``shared_local_checkpoint`` says the path is a shared mount (NFS,
    for example) at the same place on every machine.
    """
    if not store.is_local or shared_local_checkpoint or executors_share_local_disk(spark):
        return
    master = setting(spark, "spark.master", "?")
    raise CheckpointLocationError(
        f"checkpoint {store.location} is a local path, but executors of master {master} may run on other "
        f"machines and would write their progress to their own disks. Use a location every machine "
        f"reaches (hdfs://, s3://, ...), or, if {store.location} is mounted at the same path on every "
        f"machine (NFS, for example), say so with shared_local_checkpoint=True (--shared-local-checkpoint)"
    )


def resolution(previous: dict[str, Any], key_group_bits: int | None) -> int:
    """The key-group resolution of a run: the checkpoint's, which ``key_group_bits`` may repeat but
    not change (:class:`~segack.spark_adapter.ForeignInputError`), else ``key_group_bits``, else the
    default."""
    recorded = previous.get("key_group_bits")
    if key_group_bits is None:
        return int(recorded) if recorded is not None else DEFAULT_KEY_GROUP_BITS
    check_key_group_bits(key_group_bits)
    if recorded is not None and recorded != key_group_bits:
        raise ForeignInputError(f"the checkpoint cuts hashes into 2**{recorded} key groups; key_group_bits="
                                f"{key_group_bits} cannot change that (use a new checkpoint location)")
    return key_group_bits


@contextlib.contextmanager
def claimed(spark: SparkSession, store: CheckpointStore, run_id: str, options: RunOptions,
            ) -> Iterator[ClaimKeeper]:
    """Claim ``store`` for ``run_id`` and keep the claim while the block runs
    (:mod:`~segack.spark_adapter.store.claims`); a lost claim interrupts the run's jobs."""
    claim = acquire(store, run_id, options.claim_timeout)
    with ClaimKeeper(store, claim, on_lost=functools.partial(spark.interruptTag, run_tag(run_id))) as keeper:
        yield keeper


def check_metrics_address(address: int | str | None) -> None:
    """Refuse a ``metrics_port`` that is not ``PORT`` or ``HOST:PORT`` (``None``: no metrics)."""
    if address is not None:
        # prometheus_client is imported only for a run that serves metrics.
        from segack.spark_adapter.console.metrics import parse_address

        parse_address(address)


def metrics_served(store: CheckpointStore, address: int | str | None,
                   ) -> contextlib.AbstractContextManager[Any]:
    """The checkpoint's metrics served on ``address`` for the length of a ``with`` block
    (:func:`~segack.spark_adapter.serve_metrics`), or nothing when it is ``None``."""
    if address is None:
        return contextlib.nullcontext()
    from segack.spark_adapter.console.metrics import serve_metrics

    return serve_metrics(store, address)


def new_run_id(digits: int = 12) -> str:
    """A fresh run id: ``digits`` random hex digits."""
    return uuid.uuid4().hex[:digits]


@dataclass(frozen=True)
class RunCounts:
    """What :meth:`Run.execute` tells its caller."""

    #: Events done before the run's jobs started.
    already_done: int
    #: The tasks' peak of pending rows.
    peak_pending: int = 0
    #: Dead letters the tasks wrote.
    dead_letters: int = 0
    retry: RetryOutcome = field(default_factory=RetryOutcome)
    #: The segments the run ended over.
    segments: SegmentSet | None = None
    #: How many times they changed.
    segment_changes: int = 0
    #: Whether the done events were checked against the input.
    input_checked: bool = False


class Run(RunState):
    """The coordinator of one run (:class:`~segack.spark_adapter.coordinator.state.RunState`): it
    takes the run from a held claim to its end."""

    def execute(self, segments: SegmentSet, *, consumed: SegmentChange | None = None,
                fingerprint: str | None = None, watch_requests: bool = False) -> RunCounts:
        """Handle the events the checkpoint lacks, over ``segments``; leaves the state final and saved.

        0. **Prepare the handler**: a :class:`~segack.spark_adapter.Sink` checks what it
           needs on the driver (its database, its table) and may refuse the run: nothing is saved.
        1. **Merge what the previous owner left**: the progress files of the run that held the
           claim before this one (a crash's work is kept; an older, fenced run's is not).
        2. **Verify** the done events against the input, unless ``options.verify`` is ``auto`` and
           the input's ``fingerprint`` (:mod:`~segack.spark_adapter.sources.fingerprint`) is the recorded
           one: another input is a :class:`~segack.spark_adapter.ForeignInputError`, and nothing
           is written.
        3. **Save** the merged state with the fingerprint, delete the merged files, and remove the
           segment request ``consumed`` (the caller chose ``segments`` with it in view) unless a
           newer one replaced it.
        4. **Retry dead letters**, with ``options.retry_dead_letters``
           (:mod:`~segack.spark_adapter.coordinator.dead_letters`); keys that still have some stay parked.
        5. **Run jobs** over the segments until the input is done. With ``watch_requests``, a change
           of segments asked while a job runs ends it; the next job starts over the new set.
        6. **Complete**: record the status and save.

        Raises :class:`~segack.spark_adapter.HandlerFailedError` (the first failure, with any later
        merge error attached as a note) or :class:`~segack.spark_adapter.ReplayError`
        (:class:`~segack.spark_adapter.ClaimLostError` once another run took the checkpoint over:
        nothing more is saved), or :class:`~segack.spark_adapter.coordinator.state.StoppedError`
        once its ``early_stop`` ended its job (progress saved; a stream's micro-batch runs one
        job, watching no request to change its segments).
        """
        self._prepare_handler()  # 0
        merged = self._merge_leftovers()  # 1
        checked = self._verify(fingerprint)  # 2
        self._save_resumed(fingerprint, merged, consumed)  # 3
        self.already_done = self.tokens.done
        retried = RetryOutcome()
        if self.options.retry_dead_letters:  # 4
            retried = retry_dead_letters(RetryRun.of(self), segments)
        self.began = time.monotonic()
        jobs = self._run_jobs(segments, watch_requests)  # 5
        if not jobs.recorded_end:  # 6
            self.state.settings.update(status="complete", updated_at=time.time())
            self.keeper.save(self.state)
        return RunCounts(self.already_done, jobs.peak_pending, jobs.dead_letters, retried, jobs.segments,
                         jobs.changes, checked)

    def retry_alone(self, segments: SegmentSet) -> RetryOutcome:
        """Steps 0 and 4 alone: the dead letters handled again over ``segments``, for a stream whose
        query may have nothing new to read (and so no micro-batch to retry them in)."""
        self._prepare_handler()
        return retry_dead_letters(RetryRun.of(self), segments)

    def _prepare_handler(self) -> None:
        """Step 0."""
        prepare_handler(self.handler, RunContext(
            self.store.location, self.checkpoint_id, self.events.key, self.events.order,
            self.options.handling.policy, self.options.claim_timeout, self.options.handling.batch_size,
            self.keeper.claim.number))

    def _merge_leftovers(self) -> list[str]:
        """Step 1; returns the progress files found (all of them go once the state is saved)."""
        leftovers = self.store.progress_files()
        previous = previous_run(self.store, self.keeper.claim)
        # Only the previous owner's progress is merged; an older run's was written after it was fenced.
        merged = [path for path in leftovers
                  if previous is None or path.rsplit("/", 1)[-1].startswith(previous)]
        try:
            for _, leftover in self.store.read_progress(merged):
                self.tokens.apply(leftover)
        except TokenError as error:
            raise CheckpointError(f"checkpoint {self.store.location}: {error}") from None
        if merged:
            log.info("%s: merged %d progress files of run %s", self.store.location, len(merged), previous)
        return leftovers

    def _verify(self, fingerprint: str | None) -> bool:
        """Step 2; returns whether the done events were checked."""
        tokens = self.tokens
        recorded = self.state.settings.get("input_fingerprint")
        unchanged = self.options.verify == Verify.AUTO and fingerprint is not None and recorded == fingerprint
        checked = tokens.has_progress and not unchanged
        if checked:
            STARTUP.info("checking the %s events done against the input (a Spark job)", f"{tokens.done:,}")
            counts = self.events.verify(tokens, f"checkpoint {self.store.location}")
            try:
                tokens.set_counts(counts)
            except ValueError:
                raise ForeignInputError(
                    f"checkpoint {self.store.location} belongs to other input: it has fewer events than "
                    f"were done; use a new checkpoint location") from None
            log.info("%s: checked the %d events done against the input", self.store.location, tokens.done)
        return checked

    def _save_resumed(self, fingerprint: str | None, leftovers: list[str], consumed: SegmentChange | None,
                      ) -> None:
        """Step 3."""
        # Every done event is the input's: checked now, or by a run that read the same files.
        self.state.settings["input_fingerprint"] = fingerprint
        if self.tokens.counted:
            self.state.settings["total"] = self.tokens.total
        self.keeper.save(self.state)
        self.store.delete_progress(leftovers)
        if consumed is not None and pending_change(self.store) == consumed:
            self.store.delete_segments_request()  # saved as the set: applied, or overruled by the caller

    def _run_jobs(self, segments: SegmentSet, watch_requests: bool) -> _Jobs:
        """Step 5."""
        jobs = _Jobs(segments)
        while not self.tokens.complete:
            job_id = self.files_prefix if jobs.changes == 0 else f"{self.files_prefix}-{jobs.changes + 1}"
            outcome = Job(self, job_id, jobs.segments).execute(watch_requests)
            jobs.peak_pending = max(jobs.peak_pending, outcome.peak_pending)
            jobs.dead_letters += outcome.dead_letters
            if outcome.change is None:
                jobs.recorded_end = True  # the job saved how the run ended
                break
            # Every task stopped at a flush with its calls finished, and the job merged them: the
            # events left resume in a new job over the new set, each key group where it stood.
            jobs.segments = outcome.change.segment_set
            record_segments(self.state, jobs.segments, f"{outcome.change.why} (by {outcome.change.by})")
            self.keeper.save(self.state)
            if pending_change(self.store) == outcome.change:
                self.store.delete_segments_request()  # a newer request stays, for the next job's watcher
            log.info("%s: run %s goes on over %d segments", self.store.location, self.run_id,
                     len(jobs.segments))
            jobs.changes += 1
        return jobs


@dataclass
class _Jobs:
    """A run's jobs so far."""

    #: The set the last job ran over.
    segments: SegmentSet
    #: Times the set changed.
    changes: int = 0
    peak_pending: int = 0
    dead_letters: int = 0
    #: Whether the last job ran to its end and saved the run's status itself.
    recorded_end: bool = False
