"""What a run tells its caller: :class:`Progress` while it goes on, :class:`ReplayResult` at its end;
for a stream, a :class:`BatchReport` after each micro-batch and a :class:`StreamResult` at its end;
for a real-time stream, a :class:`RealTimeReport` every few seconds and a :class:`RealTimeResult`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HOLDING_BACK_FLOOR", "STARTUP", "BatchReport", "PartitionReport", "Progress", "RealTimeReport",
           "RealTimeResult", "ReplayResult", "StreamResult", "holding_back"]

#: A run's start-up phases, one INFO record each as it begins (reading the input, checking its
#: order values, planning, claiming, checking the events done, the first job): what a run does
#: before its first :class:`Progress`. ``segack replay`` shows each on a terminal's status line.
STARTUP = logging.getLogger("segack.startup")


@dataclass(frozen=True)
class Progress:
    """What the driver knows during a run (passed to the ``progress`` callback at each merge).

    ``total`` is ``None`` during a checkpoint's first run: the events are counted as they are done.
    """

    #: Events done, over all runs.
    done: int
    #: Events done in this run.
    handled: int
    #: Events in the input, once counted.
    total: int | None
    #: Segments of the set the run uses now.
    segments: int
    #: Seconds since the run's first job started.
    seconds: float
    #: Handler calls running now, over all tasks (as of their last progress files).
    in_flight: int = 0
    #: Rows read but not yet committed, over all tasks (as of their last progress files).
    pending: int = 0


@dataclass(frozen=True, repr=False)
class ReplayResult:
    """The outcome of :func:`~segack.spark_adapter.replay`."""

    #: Events in the input.
    total: int
    #: Events done before this run started (by earlier runs).
    already_done: int
    #: Events the handler finished in this run (dead letters not counted).
    handled: int
    #: Events done now: ``already_done``, ``handled``, and this run's dead letters.
    done: int
    #: Segments of the last set the run used.
    segments: int
    #: The checkpoint's key-group resolution: ``2**key_group_bits`` key groups.
    key_group_bits: int
    #: Seconds the run took, from its checks to its last save.
    seconds: float
    #: The most rows any task held read but not committed (0 when the handler ran one call at a time).
    peak_pending: int = 0
    #: Events set aside as dead letters in this run: they or an earlier event of their key failed
    #: (``on_error="dead-letter"``), or their key had dead letters already; ``done`` counts them,
    #: ``handled`` does not.
    dead_letters: int = 0
    #: Dead letters the checkpoint holds after the run, from this run and earlier ones: events set
    #: aside and not handled, until a run with ``retry_dead_letters=True`` handles them.
    dead_letters_left: int = 0
    #: Dead letters of earlier runs handled this time (``retry_dead_letters=True``).
    retried: int = 0
    #: Dead letters retried that failed again, or wait behind one of their key that did: they stay.
    retry_failed: int = 0
    #: Times the segments changed while the run went on (``segments`` counts the last set).
    segment_changes: int = 0
    #: Whether the run checked the checkpoint's done events against the input: a resumed run does,
    #: unless the input has the fingerprint the checkpoint recorded (``verify="auto"``).
    input_checked: bool = False

    @property
    def complete(self) -> bool:
        """Whether every event was handled: each is done, and no dead letter is left
        (``dead_letters_left``)."""
        return self.done == self.total and self.dead_letters_left == 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{spec.name}={getattr(self, spec.name)!r}" for spec in dataclasses.fields(self))
        return f"ReplayResult(complete={self.complete}, {fields})"


@dataclass(frozen=True)
class BatchReport:
    """A micro-batch of :func:`~segack.spark_adapter.stream`, complete in the checkpoint, as Spark
    reported it."""

    #: The micro-batch's id in the query.
    batch_id: int
    #: Events it read.
    events: int
    #: Seconds it took, as Spark measured it.
    seconds: float
    #: Events of the micro-batches this call ran so far, this one included.
    events_so_far: int
    #: Records written to the source but not yet read, over its partitions, as of the batch (Kafka;
    #: ``None`` for a source that does not say).
    lag: int | None = None


@dataclass(frozen=True)
class StreamResult:
    """The outcome of :func:`~segack.spark_adapter.stream`."""

    #: Micro-batches this call ran to their end.
    batches: int
    #: Events the handler finished (dead letters not counted).
    handled: int
    #: Events set aside as dead letters by this call.
    dead_letters: int
    #: Dead letters the checkpoint holds at the end, from this call and earlier ones.
    dead_letters_left: int
    #: Whether the stream ended because it was asked to stop (``stop``), at the end of a micro-batch.
    stopped: bool
    #: Seconds from the checks to the end.
    seconds: float
    #: The last micro-batch complete in the checkpoint (``None``: none yet).
    last_batch: int | None = None
    #: Records not yet read, over the source's partitions, as of the last micro-batch (Kafka).
    lag: int | None = None
    #: Dead letters of earlier runs handled this time (``retry_dead_letters=True``).
    retried: int = 0
    #: Dead letters retried that failed again, or wait behind one of their key that did: they stay.
    retry_failed: int = 0
    #: Where the query started: Spark's checkpoint of it, or, for a new one, the offsets chosen.
    started: str = ""
    #: Records a new query passed over because a starting option said so (Kafka).
    passed_over: int = 0
    #: Whether the consumer group (``commit_offsets_to``) lacks the end offsets of the last complete
    #: micro-batch: its commit failed; the next run makes it.
    group_behind: bool = False
    #: Whether a stop asked twice cut a micro-batch short (its progress saved, not complete).
    interrupted: bool = False
    #: The micro-batch that a stop ended early, ``stop_timeout`` seconds after it was asked, each
    #: task's calls in flight finished and its progress saved: the next run finishes it.
    cut_short_batch: int | None = None


@dataclass(frozen=True)
class PartitionReport:
    """One Kafka partition of a real-time stream, as its task last recorded it."""

    partition: int
    #: Every record below this offset is done (what the consumer group is given).
    next_offset: int
    #: The offset after the last record read.
    read: int
    #: The partition's end as the task's consumer last heard it (``None``: not yet).
    end: int | None
    #: Records read and not yet committed: in calls, waiting for one, or done above a slower one.
    pending: int
    #: Intervals of offsets done above ``next_offset``.
    done_intervals: int
    #: Records of this partition the handler finished, over all runs.
    handled_total: int
    #: The partition's topic (``None`` where its saved progress does not name it).
    topic: str | None = None
    #: The partition's number in the stream: its key group, as its dead letters and a sink's positions
    #: hold it (:mod:`~segack.spark_adapter.coordinator.stream_partitions`; the partition itself in
    #: a stream of one topic).
    number: int | None = None

    @property
    def lag(self) -> int | None:
        """Records not yet done: from ``next_offset`` to the end."""
        return None if self.end is None else max(self.end - self.next_offset, 0)


@dataclass(frozen=True)
class RealTimeReport:
    """What the driver of a real-time stream reads of its partitions, every few seconds."""

    #: Events the handler finished in this run, as of the tasks' last saves.
    handled: int
    #: Seconds since the run's job started.
    seconds: float
    partitions: tuple[PartitionReport, ...]

    @property
    def lag(self) -> int | None:
        """Records not yet done, over the partitions (``None`` until every end is known)."""
        lags = [partition.lag for partition in self.partitions]
        return None if not lags or None in lags else sum(lag for lag in lags if lag is not None)

    @property
    def holding_back(self) -> PartitionReport | None:
        """The partition that holds the run back
        (:func:`~segack.spark_adapter.results.holding_back`), ``None`` when none does."""
        return holding_back(self.partitions)


#: Records pending under which no partition is said to hold the run back: a partition read at a
#: hundred records a second always has a few in calls.
HOLDING_BACK_FLOOR = 100


def holding_back(partitions: Sequence[PartitionReport]) -> PartitionReport | None:
    """The partition that holds a real-time stream back: the one with the most records pending (read,
    not yet committed), when it has at least :data:`HOLDING_BACK_FLOOR` of them and at least twice as
    many as any other partition; ``None`` when no partition is that far behind the others.

    ``segack status``, the page, the metrics' help and the command's progress lines all name this one.
    """
    ranked = sorted(partitions, key=lambda partition: partition.pending, reverse=True)
    if not ranked or ranked[0].pending < HOLDING_BACK_FLOOR:
        return None
    runner_up = ranked[1].pending if len(ranked) > 1 else 0
    return ranked[0] if ranked[0].pending >= 2 * runner_up else None


@dataclass(frozen=True)
class RealTimeResult:
    """The outcome of :func:`~segack.spark_adapter.stream_real_time`."""

    #: Events the handler finished in this run (dead letters and records skipped not counted).
    handled: int
    #: Records an earlier run had done above its committed offset: read again, not handled.
    skipped: int
    #: Events set aside as dead letters in this run.
    dead_letters: int
    #: Dead letters the checkpoint holds at the end.
    dead_letters_left: int
    #: Whether the stream ended because it was asked to stop.
    stopped: bool
    seconds: float
    #: The partitions at the end, as the tasks last recorded them.
    partitions: tuple[PartitionReport, ...] = ()
    #: Dead letters of earlier runs handled this time (``retry_dead_letters=True``).
    retried: int = 0
    #: Dead letters retried that failed again, or wait behind one of their key that did: they stay.
    retry_failed: int = 0
    #: Whether the consumer group lacks some partition's progress at the end (its commits failed
    #: until the stream gave up): the next run commits it.
    group_behind: bool = False
