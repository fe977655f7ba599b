"""A stream's micro-batches over Spark Connect: :func:`~segack.spark_adapter.stream` with a ``sc://``
session.

Over Spark Connect the ``foreachBatch`` function is pickled and runs in a Python process of the
server's, not beside the client's watcher: it can hold no thread, lock or object of the client's,
and the driver's JVM (through which a classic session commits the consumer group) is the server's.
So the function is self-contained (:class:`ServerBatches`) and everything between the two sides
goes through the checkpoint:

1. **The claim** is the client's: its keeper extends it; each micro-batch saves under it through a
   keeper of its own that is never started (no thread), which refuses a save once another run holds
   the checkpoint, as a classic batch's does.
2. **Each micro-batch** runs as a classic one does
   (:class:`~segack.spark_adapter.coordinator.streaming.BatchReplay`), then commits its end offsets
   to the consumer group through librdkafka (never ahead: the batch is saved complete first; a
   commit that fails is made by the next batch, or by the client at the end), then writes the
   stream's view (``stream-view.json``, which ``segack status`` reads too) with this run's counts: the
   client's watcher follows the run by it (:class:`ConnectWatch`).
3. **A failure** is written to the checkpoint (:data:`FAILURE_FILE`, pickled) before the batch
   raises, for the client to raise as the classic stream would: the server's error reaches a
   Connect client only as text.
4. **A stop** is a stop request in the checkpoint that a micro-batch reads before it starts; the
   client stops the query once no trigger is active, or at once when the stop is asked twice.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import math
import pickle
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.coordinator.query_watch import DEFAULT_STOP_TIMEOUT, POLL_SECONDS, Watch, timed_out
from segack.spark_adapter.coordinator.state import EarlyStop, StoppedError
from segack.spark_adapter.errors import ClaimLostError, ReplayError, one_line
from segack.spark_adapter.sources.kafka import parse_offsets
from segack.spark_adapter.store.claims import ClaimKeeper, latest_claim
from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.periodic import Periodic
from segack.spark_adapter.store.stream_view import read_stream_view, write_stream_view

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

    from segack.spark_adapter.coordinator.streaming import BatchReplay
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.claims import Claim

__all__ = ["FAILURE_FILE", "ConnectWatch", "ServerBatches", "commit_ends"]

log = logging.getLogger(__name__)

#: Micro-batches the stream's view lists, for the client's progress lines.
RECENT_BATCHES = 32
#: The failure of the micro-batch that stopped a stream over Spark Connect, pickled, in the checkpoint.
FAILURE_FILE = "stream-failure.pickle"


def commit_ends(settings: Mapping[str, Any], group: str, ends: list[tuple[str, int, int]]) -> None:
    """Commit each ``(topic, partition, end)`` to consumer group ``group`` through a librdkafka
    consumer of its own, made from ``settings`` (librdkafka's names); raises Kafka's error."""
    from confluent_kafka import Consumer, TopicPartition

    from segack.spark_adapter.sources.kafka_settings import ClientLog

    consumer = Consumer({**settings, "group.id": group, "enable.auto.commit": False,
                         "logger": ClientLog(f"{__name__}.client")})
    try:
        with durable_write("group-commit"):
            consumer.commit(offsets=[TopicPartition(topic, partition, end) for topic, partition, end in ends],
                            asynchronous=False)
    finally:
        consumer.close()


class _EarlyStopLook(Periodic):
    """In the server's process, while a micro-batch runs: the client's request to end it early
    (``stop_timeout``), looked for in the checkpoint every :data:`POLL_SECONDS`, passed on to the
    replay's :class:`~segack.spark_adapter.coordinator.state.EarlyStop`."""

    def __init__(self, store: CheckpointStore, request: str, early_stop: EarlyStop) -> None:
        super().__init__(POLL_SECONDS, "segack-early-stop")
        self.store, self.request, self.early_stop = store, request, early_stop

    def tick(self) -> bool:
        try:
            reason = self.store.stop_reason(self.request)
        except OSError as error:  # looked for again at the next tick
            log.warning("%s: could not look for a request to stop early: %s", self.store.location, error)
            return False
        if reason is not None:
            self.early_stop.ask(reason)
        return reason is not None


class ServerBatches:
    """``process_batch(batch, batch_id)`` of a stream over Spark Connect, pickled to the server with
    what it needs: each micro-batch under the client's claim (``claim``), its end offsets committed to
    ``group`` through librdkafka (``kafka``: the client's settings), its counts in the stream's view.
    On the client's side it is also what the watcher asks of the micro-batches: the claim's keeper,
    their failure, a stop."""

    def __init__(self, replay: BatchReplay, keeper: ClaimKeeper, group: str | None,
                 kafka: Mapping[str, Any] | None, stop_timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        self.replay, self.keeper, self.group, self.kafka = replay, keeper, group, dict(kafka or {})
        self.stop_timeout = stop_timeout
        self.claim: Claim = keeper.claim
        self.store = replay.store
        #: The stop request's name in the checkpoint (not a job's: their tasks would stop mid-batch),
        #: and that of the request to end the micro-batch under way early (``stop_timeout``).
        self.stop_id = f"{self.claim.run_id}-stream"
        self.early_id = f"{self.stop_id}-early"
        #: This run's counts, kept by the server's process (one Python worker runs all of a query's
        #: micro-batches).
        self.batches = self.events = 0
        #: The last micro-batches with events, ``[id, events, seconds]``: the client reports each,
        #: though several complete between two of its looks.
        self.recent: collections.deque[list[Any]] = collections.deque(maxlen=RECENT_BATCHES)
        self.committed: list[tuple[str, int, int]] = []
        #: Whether stopping cut a micro-batch short (a stop asked twice), as the client saw it.
        self.interrupted = False
        self._error: BaseException | None = None
        #: The server's keeper of the claim, never started (no thread): each save checks the claim.
        self._fence: ClaimKeeper | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What goes to the server: no keeper (a thread and a lock), no events (a DataFrame)."""
        replay = copy.copy(self.replay)
        if replay.start is not None:
            replay.start = dataclasses.replace(replay.start, events=None)  # type: ignore[arg-type]
        return dict(self.__dict__, keeper=None, replay=replay, _error=None, _fence=None)

    # ------------------------------------------------------------ the server's side

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            reason = self.store.stop_reason(self.stop_id)
            if reason is not None:
                raise StoppedError(f"batch {batch_id} not started: {reason}")
            self._check_client()
            if self._fence is None:
                self._fence = ClaimKeeper(self.store, self.claim)
            with _EarlyStopLook(self.store, self.early_id, self.replay.early_stop):
                self.replay.process(batch, batch_id, self._fence)
            self._after(batch_id)
        except BaseException as error:
            if isinstance(error, StoppedError) and error.batch_id is not None:
                self._write_view(self.replay.report, batch_id)  # its events counted as far as it went
            self._record_failure(error)
            raise

    def _check_client(self) -> None:
        """Refuse a micro-batch once the client's claim is another run's or has expired: a client
        killed leaves its query on the server, which must not go on saving and committing."""
        latest = latest_claim(self.store)
        if latest is None or latest.number != self.claim.number or latest.released:
            raise ClaimLostError(self.store.location, self.claim, latest)
        if not latest.live(time.time()):
            raise ReplayError(f"run {self.claim.run_id}'s claim on checkpoint {self.store.location} expired "
                              f"unextended: its client is gone, and its query on the server stops here")

    def _after(self, batch_id: int) -> None:
        """Steps 2's commit and view, for the micro-batches the replay completed."""
        done = [self.replay.done.popleft() for _ in range(len(self.replay.done))]
        if not done:
            return  # delivered again, complete already
        last = done[-1]
        self.batches += sum(1 for batch in done if batch.events)
        self.events += sum(batch.events for batch in done)
        self.recent.extend([batch.batch_id, batch.events, batch.seconds] for batch in done if batch.events)
        ends = ([] if last.end is None else
                [(where.topic, where.partition, where.end)
                 for where in parse_offsets({"sources": [{"endOffset": end} for end in last.end]})])
        if self.group is not None and ends and ends != self.committed:
            try:
                commit_ends(self.kafka, self.group, ends)
                self.committed = ends
            except Exception as error:  # the next micro-batch, or the client at the end, commits
                log.warning("could not commit the offsets of batch %s to consumer group %s: %s", batch_id,
                            self.group, one_line(error))
        report = {"last_batch": {"id": last.batch_id, "at": time.time(), "seconds": last.seconds},
                  "commit_offsets_to": self.group,
                  "partitions": [[topic, partition, end, None] for topic, partition, end in ends],
                  "group_offsets": [list(where) for where in self.committed]}
        self.replay.report = report  # recorded with the next micro-batch, as a classic watcher's is
        self._write_view(report, batch_id)

    def _write_view(self, report: dict[str, Any], batch_id: int) -> None:
        """The stream's view: the last micro-batch's ``report``, and this run's counts so far."""
        try:
            write_stream_view(self.store.files, {**report, "ends_at": None, "run": self.claim.run_id,
                                                 "run_batches": self.batches, "run_events": self.events,
                                                 "run_recent": list(self.recent),
                                                 "run_handled": self.replay.handled,
                                                 "run_dead_letters": self.replay.dead_letters})
        except Exception as error:
            log.warning("could not write the stream's view after batch %s: %s", batch_id, error)

    def _record_failure(self, error: BaseException) -> None:
        try:
            blob = pickle.dumps((self.claim.run_id, error))
        except Exception:
            blob = pickle.dumps((self.claim.run_id, ReplayError(f"{type(error).__name__}: {error}")))
        try:
            with durable_write("stream-view"):  # an observation, as the view is: no progress
                self.store.files.write(self.store.files.path(FAILURE_FILE), blob)
        except Exception as written:
            log.warning("could not record the failure of a micro-batch in the checkpoint: %s", written)

    # ------------------------------------------------------------ the client's side

    def clear(self) -> None:
        """Remove an earlier run's failure and this run's stop request (under the claim, before the
        query starts)."""
        with durable_write("stream-view"):
            self.store.files.delete(self.store.files.path(FAILURE_FILE))
        self.store.clear_stop(self.stop_id)
        self.store.clear_stop(self.early_id)

    @property
    def error(self) -> BaseException | None:
        """The failure a micro-batch of this run recorded, read from the checkpoint once the query has
        ended (one another run's query recorded is not this run's)."""
        if self._error is None:
            blob = self.store.files.read(self.store.files.path(FAILURE_FILE))
            if blob is not None:
                try:
                    run_id, failure = pickle.loads(blob)
                except Exception as error:
                    run_id, failure = self.claim.run_id, ReplayError(
                        f"a micro-batch failed, and its failure cannot be read: {error}")
                if run_id == self.claim.run_id:
                    self._error = failure
        return self._error

    def stop_when_idle(self, query: StreamingQuery, now: threading.Event) -> None:
        """No micro-batch starts once asked; the one under way finishes unless ``now`` is set, or
        ends at its tasks' next flush once ``stop_timeout`` has passed (told through the checkpoint)."""
        deadline = time.monotonic() + self.stop_timeout
        self.store.request_stop(self.stop_id, "the stream was asked to stop")
        while query.isActive and query.status.get("isTriggerActive") and not now.is_set():
            if time.monotonic() >= deadline:
                deadline = math.inf
                self.store.request_stop(self.early_id, timed_out(self.stop_timeout))
            time.sleep(POLL_SECONDS)
        self.interrupted = bool(query.isActive and query.status.get("isTriggerActive"))
        query.stop()


class ConnectWatch(Watch):
    """Steps 4 to 6 of :func:`~segack.spark_adapter.stream` over Spark Connect: the micro-batches
    followed through the view they write (:class:`ServerBatches`); the group committed by them, and
    at the end by the client for one they could not commit."""

    batches: ServerBatches

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads_ends = False
        self.handled = self.dead_letters = 0
        self._said_behind = False

    def look(self) -> None:
        view = read_stream_view(self.batches.store.files)
        last = (view or {}).get("last_batch") or {}
        if view is None or view.get("run") != self.batches.claim.run_id:
            return
        # Counted as far as the micro-batches went, one a stop cut short too.
        self.handled = int(view.get("run_handled", 0))
        self.dead_letters = int(view.get("run_dead_letters", 0))
        if last.get("id") is None or (self.last_batch is not None and int(last["id"]) <= self.last_batch):
            return
        seen = -1 if self.last_batch is None else self.last_batch
        reported = self.events
        self.last_batch, self.last_seconds = int(last["id"]), last.get("seconds")
        self.last_at = last.get("at")
        self.count, self.events = int(view.get("run_batches", 0)), int(view.get("run_events", 0))
        latest = self._latest()  # Spark's last report: the lag, as far as a Connect client can know it
        self.partitions = [self._with_latest(where, latest.get((where.topic, where.partition)))
                           for where in _offsets(view.get("partitions") or [])]
        self.committed = [(str(topic), int(partition), int(end))
                          for topic, partition, end in view.get("group_offsets") or []]
        if self.behind != self._said_behind:
            self._said_behind = self.behind
            if self.behind:  # the server's log says why; the client's end commits again
                log.warning("the micro-batches on the Spark Connect server could not commit batch %s's "
                            "offsets to consumer group %s (its log says why)", self.last_batch, self.group)
        if self.progress is None:
            return
        from segack.spark_adapter.results import BatchReport

        for batch_id, events, seconds in view.get("run_recent") or []:
            if int(batch_id) > seen:
                reported += int(events)
                self.progress(BatchReport(int(batch_id), int(events), float(seconds), reported, self.lag))

    def _commit(self) -> None:
        """At the end, a commit the micro-batches could not make, from the client (librdkafka)."""

    def _write_view(self) -> None:
        """The micro-batches write it."""

    def end(self, keeper: ClaimKeeper) -> None:
        super().end(keeper)
        if keeper.lost is None and self.behind and self.group is not None:
            ends = [(where.topic, where.partition, where.end) for where in self.partitions]
            try:
                commit_ends(self.batches.kafka, self.group, ends)
            except Exception as error:
                log.warning("could not commit the offsets of batch %s to consumer group %s (the next run "
                            "commits them): %s", self.last_batch, self.group, one_line(error))
                return
            self.committed = ends
            state = keeper.store.load()
            if state is not None:
                stream = state.settings.get("stream") or {}
                state.settings["stream"] = {**stream, "group_offsets": [list(where) for where in ends]}
                keeper.save(state)


def _offsets(rows: list[list[Any]]) -> list[Any]:
    from segack.spark_adapter.sources.kafka import PartitionOffsets

    return [PartitionOffsets(str(topic), int(partition), int(end), None if latest is None else int(latest))
            for topic, partition, end, latest in rows]
