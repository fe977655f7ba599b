"""The watcher of a query :func:`~segack.spark_adapter.stream` runs, and what it asks of the
micro-batches: steps 4 to 6 of :mod:`~segack.spark_adapter.coordinator.query`, for a classic session
(:class:`QueryBatches`, :class:`Watch`); over Spark Connect,
:mod:`~segack.spark_adapter.coordinator.connect_batches` follows the same steps through the
checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from segack.spark_adapter.coordinator.state import StoppedError
from segack.spark_adapter.errors import ReplayError, worker_error
from segack.spark_adapter.results import BatchReport
from segack.spark_adapter.sources.kafka import PartitionOffsets, commit_offsets, list_offsets, parse_offsets
from segack.spark_adapter.spark.session import is_connect
from segack.spark_adapter.store.stream_view import write_stream_view

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from segack.spark_adapter.coordinator.streaming import BatchReplay
    from segack.spark_adapter.sources.kafka import KafkaStream
    from segack.spark_adapter.store.claims import ClaimKeeper

__all__ = ["AT_ONCE", "DEFAULT_STOP_TIMEOUT", "POLL_SECONDS", "Batches", "QueryBatches", "StopRequest",
           "Watch", "timed_out"]

log = logging.getLogger(__name__)

#: Seconds between looks at the query's progress and at a stop request.
POLL_SECONDS = 1
#: Seconds between reads of the Kafka partitions' end offsets (the lag's measure); a read that
#: takes longer is given up, so that a broker out of reach does not hold the watcher up.
ENDS_SECONDS = 2.0
#: Seconds after which the stream's view is written again though nothing in it changed.
VIEW_REFRESH_SECONDS = 30.0
#: Seconds a stop waits for the micro-batch under way before its tasks are asked to end early
#: (``stop_timeout``): within Kubernetes' 30 s grace period, with time left to save and exit.
DEFAULT_STOP_TIMEOUT = 20.0


def timed_out(stop_timeout: float) -> str:
    """Why a micro-batch is ended early: still running ``stop_timeout`` seconds after the stop."""
    return (f"the stream was asked to stop, and its micro-batch still ran {stop_timeout:g} s later (the stop "
            f"timeout)")


class StopRequest:
    """Asks a running :func:`~segack.spark_adapter.stream` to stop: ``set()`` once to stop at the end of the
    micro-batch under way (at a commit), again to interrupt it (its progress up to its last flush is
    kept). It takes a lock: a signal handler calls it from a thread of its own (as ``segack stream``
    does), or a second signal could find the lock held by the handler it interrupted."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.now = threading.Event()

    def set(self) -> None:
        (self.now if self.asked.is_set() else self.asked).set()


#: ``stop_when_idle``'s ``now`` for a stream whose claim was lost: its micro-batch under way interrupted.
AT_ONCE = threading.Event()
AT_ONCE.set()


class Batches(Protocol):
    """What the watcher asks of a query's ``process_batch``: :class:`QueryBatches`, or over Spark
    Connect :class:`~segack.spark_adapter.coordinator.connect_batches.ServerBatches`."""

    replay: BatchReplay
    keeper: ClaimKeeper
    interrupted: bool

    @property
    def error(self) -> BaseException | None: ...

    def stop_when_idle(self, query: StreamingQuery, now: threading.Event) -> None: ...


class QueryBatches:
    """``process_batch`` of the query :func:`stream` runs: each micro-batch under the stream's claim,
    none started once a stop was asked, the one under way ended early ``stop_timeout`` seconds
    after the stop (infinity: never), and the error of one that failed kept for the caller."""

    def __init__(self, replay: BatchReplay, keeper: ClaimKeeper,
                 stop_timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        self.replay, self.keeper, self.stop_timeout = replay, keeper, stop_timeout
        self.lock = threading.Condition()
        self.running = self.stopping = False
        #: Whether stopping cut a micro-batch short (a stop asked twice).
        self.interrupted = False
        self.error: BaseException | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self.lock:
            if self.stopping:
                # Kept, so that the query ending on it reads as the stop it is, not as a failure.
                self.error = StoppedError(f"batch {batch_id} not started: the stream was asked to stop")
                raise self.error
            self.running = True
        try:
            self.replay.process(batch, batch_id, self.keeper)
        except BaseException as error:
            self.error = error
            raise
        finally:
            with self.lock:
                self.running = False
                self.lock.notify_all()

    def stop_when_idle(self, query: StreamingQuery, now: threading.Event) -> None:
        """Refuse new micro-batches, let the one under way finish (unless ``now`` is set; past
        ``stop_timeout``, its tasks end at their next flush, their calls in flight finished), stop."""
        deadline = time.monotonic() + self.stop_timeout
        with self.lock:
            self.stopping = True
            while self.running and not now.is_set():
                if time.monotonic() >= deadline:
                    self.replay.early_stop.ask(timed_out(self.stop_timeout))
                self.lock.wait(POLL_SECONDS)
            self.interrupted = self.running
        query.stop()


class Watch:
    """Steps 4 to 6 for a started ``query``: each micro-batch complete in the checkpoint told to
    the caller, recorded, and (``group``) its end offsets committed to Kafka."""

    def __init__(self, spark: SparkSession, query: StreamingQuery, batches: Batches,
                 kafka: KafkaStream | None, group: str | None,
                 progress: Callable[[BatchReport], None] | None) -> None:
        self.spark, self.query, self.batches, self.kafka, self.group = spark, query, batches, kafka, group
        self.progress = progress
        self.last_batch: int | None = None
        #: How long the last micro-batch took, and when it was seen complete.
        self.last_seconds: float | None = None
        self.last_at: float | None = None
        #: The last micro-batch as the checkpoint recorded it when this run began.
        self.resumed_last: dict[str, Any] = {}
        #: Micro-batches complete that had events, and their events (each once).
        self.count = self.events = 0
        #: Each partition's end as of the last complete micro-batch, and its latest offset as
        #: Spark last saw it.
        self.partitions: list[PartitionOffsets] = []
        #: What the group was last told, as ``(topic, partition, end)``.
        self.committed: list[tuple[str, int, int]] = []
        #: Each partition's end offset as the broker last said, and when (``time.time()``).
        self.broker_ends: dict[tuple[str, int], int] = {}
        self.ends_at: float | None = None
        self.reads_ends = kafka is not None and not is_connect(spark)
        self._next_read = 0.0
        self._ends_failing = False
        #: The view last written, and when (``time.monotonic()``).
        self._view: dict[str, Any] | None = None
        self._view_written = 0.0

    def resume(self, stream: dict[str, Any]) -> None:
        """Start from the checkpoint's record of the stream (``stream``): a group commit that an
        earlier run could not make is made at the first look, with no new micro-batch needed."""
        self.resumed_last = dict(stream.get("last_batch") or {})
        if self.kafka is None or not stream.get("completed_end"):
            return
        latest = {(topic, partition): high for topic, partition, _, high in stream.get("partitions") or []}
        ends = parse_offsets({"sources": [{"endOffset": end} for end in stream["completed_end"]]})
        self.partitions = [PartitionOffsets(where.topic, where.partition, where.end,
                                            latest.get((where.topic, where.partition))) for where in ends]
        if stream.get("commit_offsets_to") == self.group:
            self.committed = [(str(topic), int(partition), int(end))
                              for topic, partition, end in stream.get("group_offsets", [])]

    @property
    def behind(self) -> bool:
        """Whether the group lacks the end offsets of the last complete micro-batch."""
        ends = [(where.topic, where.partition, where.end) for where in self.partitions]
        return self.group is not None and self.kafka is not None and ends != self.committed

    @property
    def lag(self) -> int | None:
        """Records not read yet, over the partitions, as of the last report."""
        lags = [where.lag for where in self.partitions]
        return sum(lag for lag in lags if lag is not None) if lags and None not in lags else None

    def until_ended(self, stop: StopRequest) -> None:
        """Steps 4 and 5: look at the completed micro-batches until the query ends; raise what
        ended it, unless it ended because it was asked to."""
        from pyspark.errors import StreamingQueryException

        try:
            while not self.query.awaitTermination(POLL_SECONDS):
                lost = self.batches.keeper.lost
                if lost is not None:
                    # Another run holds the checkpoint: nothing this query does counts any more.
                    log.info("the claim was lost: the stream ends at once")
                    self.batches.stop_when_idle(self.query, AT_ONCE)
                    raise lost
                self.look()
                if stop.asked.is_set():
                    log.info("a stop was asked: the stream ends at its next commit")
                    self.batches.stop_when_idle(self.query, stop.now)
        except StreamingQueryException as error:
            failure = self.batches.error
            if isinstance(failure, StoppedError):
                return
            if failure is not None:
                raise failure from None
            raise ReplayError(f"the stream's query failed: {worker_error(error)}") from None

    def _latest(self) -> dict[tuple[str, int], int]:
        """Each partition's latest offset in Spark's last report of the query (Kafka)."""
        report: dict[str, Any] = self.query.lastProgress or {}
        return {(where.topic, where.partition): where.latest for where in parse_offsets(report)
                if where.latest is not None}

    def look(self) -> None:
        """Step 4 for each micro-batch completed since the last look; then the group's commit, tried
        again at every look until it succeeds."""
        replay = self.batches.replay
        done = [replay.done.popleft() for _ in range(len(replay.done))]
        latest = self._latest() if done and self.kafka is not None else {}
        for batch in done:
            self.last_batch, self.last_seconds, self.last_at = batch.batch_id, batch.seconds, time.time()
            if self.kafka is not None and batch.end is not None:
                ends = parse_offsets({"sources": [{"endOffset": end} for end in batch.end]})
                self.partitions = [self._with_latest(where, latest.get((where.topic, where.partition)))
                                   for where in ends]
            if batch.events:
                self.count += 1
                self.events += batch.events
                if self.progress is not None:
                    self.progress(BatchReport(batch.batch_id, batch.events, batch.seconds, self.events,
                                              self.lag))
        self._commit()
        if done:
            replay.report = self.record()
        self._read_ends()
        self._write_view()

    def _with_latest(self, where: PartitionOffsets, latest: int | None) -> PartitionOffsets:
        """``where`` with its partition's latest offset: the later of Spark's and the broker's
        (a partition's end only grows)."""
        known = [offset for offset in (latest, self.broker_ends.get((where.topic, where.partition)))
                 if offset is not None]
        return PartitionOffsets(where.topic, where.partition, where.end, max(known) if known else None)

    def _read_ends(self) -> None:
        """Read each partition's end offset from the broker, every :data:`ENDS_SECONDS`; a read
        that fails leaves the lag as last measured, said once per outage."""
        if not self.reads_ends or not self.partitions or time.monotonic() < self._next_read:
            return
        assert self.kafka is not None
        self._next_read = time.monotonic() + ENDS_SECONDS
        wanted = dict.fromkeys(((where.topic, where.partition) for where in self.partitions), "latest")
        try:
            self.broker_ends = list_offsets(self.spark, self.kafka.options, wanted, seconds=ENDS_SECONDS)
        except Exception as error:
            if not self._ends_failing:
                log.warning("cannot read the partitions' end offsets from Kafka (the lag shown is as of "
                            "%s): %s", "the last read" if self.ends_at else "Spark's last report",
                            worker_error(error))
            self._ends_failing = True
            return
        self._ends_failing = False
        self.ends_at = time.time()
        self.partitions = [self._with_latest(where, None) for where in self.partitions]

    def view(self) -> dict[str, Any]:
        """What the checkpoint's stream view keeps (:mod:`~segack.spark_adapter.store.stream_view`)."""
        last = (self.resumed_last if self.last_batch is None else
                {"id": self.last_batch, "at": self.last_at, "seconds": self.last_seconds})
        return {"last_batch": last, "commit_offsets_to": self.group, "ends_at": self.ends_at,
                "partitions": [[where.topic, where.partition, where.end, where.latest]
                               for where in self.partitions],
                "group_offsets": [list(where) for where in self.committed]}

    def _write_view(self) -> None:
        """Write the view when it changed, or :data:`VIEW_REFRESH_SECONDS` after it was last
        written; a failed write is said and tried again at the next look."""
        if self.kafka is None or not self.partitions:
            return
        view = self.view()
        unchanged = self._view is not None and {**view, "ends_at": None} == {**self._view, "ends_at": None}
        if unchanged and time.monotonic() < self._view_written + VIEW_REFRESH_SECONDS:
            return
        try:
            write_stream_view(self.batches.replay.store.files, view)
        except Exception as error:
            log.warning("could not write the stream's view of its Kafka partitions: %s", error)
            return
        self._view, self._view_written = view, time.monotonic()

    def _commit(self) -> None:
        if not self.behind or self.kafka is None or self.group is None:
            return
        ends = [(where.topic, where.partition, where.end) for where in self.partitions]
        try:
            commit_offsets(self.spark, self.kafka.options, self.group, self.partitions)
        except Exception as error:
            # The next look commits again; the group stays behind meanwhile, never ahead.
            log.warning("could not commit the offsets of batch %s to consumer group %s: %s", self.last_batch,
                        self.group, worker_error(error))
            return
        self.committed = ends

    def record(self) -> dict[str, Any]:
        """The report as the checkpoint's ``stream`` settings keep it."""
        return {"last_batch": {"id": self.last_batch, "at": time.time(), "seconds": self.last_seconds},
                "commit_offsets_to": self.group,
                "partitions": [[where.topic, where.partition, where.end, where.latest]
                               for where in self.partitions],
                "group_offsets": [list(where) for where in self.committed]}

    def end(self, keeper: ClaimKeeper) -> None:
        """Step 6: the last micro-batch recorded and committed (no micro-batch runs any more);
        nothing is, under a claim lost (its :class:`~segack.spark_adapter.ClaimLostError` raised)."""
        if keeper.lost is not None:  # no record, no commit to the group, no view: another run's now
            raise keeper.lost
        self.look()
        # With no micro-batch this time, only what the group was told can be news.
        if self.last_batch is None and (self.group is None or not self.partitions):
            return
        state = keeper.store.load()
        if state is not None:
            record = self.record()
            news = record if self.last_batch is not None else {"group_offsets": record["group_offsets"]}
            state.settings["stream"] = {**state.settings.get("stream", {}), **news}
            keeper.save(state)
