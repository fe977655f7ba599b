"""What an operator's view reads of a checkpoint at one moment, as ``segack status`` does: its
state with the progress its live run has not merged yet, its claim, its dead letters. Nothing is
written. The metrics (:mod:`~segack.spark_adapter.console.metrics`) and the page
(:mod:`~segack.spark_adapter.console.page`) are both made from a :class:`Snapshot`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from segack.kernel import SegmentSet
from segack.spark_adapter.results import PartitionReport
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_POSITION,
    Checkpoint,
    CheckpointStore,
    TaskLoad,
)
from segack.spark_adapter.store.claims import Claim, latest_claim, unmerged_progress
from segack.spark_adapter.store.partitions import REAL_TIME_MODE
from segack.spark_adapter.store.stream_view import stream_now
from segack.spark_adapter.store.tokens import KeyGroupTokens

__all__ = ["DeadLetterKey", "SegmentView", "Snapshot", "dead_letter_keys", "segment_views"]


@dataclass(frozen=True)
class SegmentView:
    """One segment of the live set, as ``segack status`` lists it."""

    position: int
    segment_id: int
    mask: int
    key_groups: int
    #: Events of its key groups done (a stream: in the micro-batch under way, or the last).
    done: int
    #: Events of its key groups in the input, once counted.
    load: int | None
    #: Events of its busiest key group, once counted: no split makes the segment lighter.
    busiest: int | None = None


def segment_views(tokens: KeyGroupTokens, segment_ids: list[int]) -> list[SegmentView]:
    """Each segment of ``segment_ids`` with its key groups' progress and load in ``tokens``."""
    segments = SegmentSet.from_ids(segment_ids)
    owners = segments.key_group_owners(tokens.bits)
    per_group = tokens.done_per_key_group()
    views = []
    for position, member in enumerate(segments):
        mine = owners == position
        counted = tokens.count[mine] if tokens.counted else None
        views.append(SegmentView(position, member.segment_id, member.mask, int(mine.sum()),
                                 int(per_group[mine].sum()),
                                 None if counted is None else int(counted.sum()),
                                 None if counted is None else int(counted.max(initial=0))))
    return views


@dataclass(frozen=True)
class DeadLetterKey:
    """A key with dead letters: how many, and its first one's error, as ``segack dead-letters``
    lists them."""

    key: Any
    events: int
    error: str
    attempts: int


def dead_letter_keys(store: CheckpointStore, key: str) -> tuple[int, list[DeadLetterKey]]:
    """The events set aside in all, and each key that has some, most first (then by key)."""
    letters = store.read_dead_letters([key, DEAD_ERROR, DEAD_ATTEMPTS])
    if letters is None:
        return 0, []
    first: dict[Any, tuple[int, str, int]] = {}
    counts: dict[Any, int] = {}
    for value, position, reason, attempts in zip(letters.column(key).to_pylist(),
                                                 letters.column(DEAD_POSITION).to_pylist(),
                                                 letters.column(DEAD_ERROR).to_pylist(),
                                                 letters.column(DEAD_ATTEMPTS).to_pylist(), strict=True):
        counts[value] = counts.get(value, 0) + 1
        if value not in first or position < first[value][0]:
            first[value] = (position, reason, attempts)
    ranked = sorted(counts, key=lambda value: (-counts[value], str(value)))
    return letters.num_rows, [DeadLetterKey(value, counts[value], first[value][1], first[value][2])
                              for value in ranked]


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint at one moment (:meth:`read`)."""

    state: Checkpoint
    claim: Claim | None
    dead_letters: int
    #: Handler calls running and rows read but not committed, as the live run's tasks last reported.
    in_flight: int
    pending: int
    #: When it was read (``time.time()``).
    at: float
    #: A real-time stream's partitions, as their tasks last saved them (``()`` for other runs).
    partitions: tuple[PartitionReport, ...] = ()

    @classmethod
    def read(cls, store: CheckpointStore) -> Snapshot | None:
        """The checkpoint at ``store`` now, or ``None`` where there is none yet."""
        state = store.load()
        if state is None:
            return None
        if "stream" in state.settings:  # the live run's view of Kafka, fresher than the record
            state.settings["stream"] = stream_now(store.files, state.settings["stream"])
        claim = latest_claim(store)
        load = TaskLoad()
        now = time.time()
        live = claim is not None and claim.live(now)
        for _, updates in store.read_progress(unmerged_progress(store)):
            if state.tokens is not None:
                state.tokens.apply(updates)
            if live:  # a dead run's last report is not work under way
                load += CheckpointStore.task_load(updates)
        if state.settings.get("mode") == REAL_TIME_MODE:
            partitions = store.partitions.reports()
            pending = sum(partition.pending for partition in partitions) if live else 0
            return cls(state, claim, store.count_dead_letters(), 0, pending, now, partitions)
        return cls(state, claim, store.count_dead_letters(), load.in_flight, load.pending, now)

    @property
    def live(self) -> bool:
        """Whether a run holds the checkpoint now."""
        return self.claim is not None and self.claim.live(self.at)

    @property
    def retries(self) -> int:
        """Handler calls made again after a call raised, over the checkpoint's runs, as of the live
        run's last merge (its driver's, every flush interval)."""
        return int(self.state.settings.get("handler_retries", 0))

    @property
    def real_time(self) -> bool:
        """Whether the checkpoint is a real-time stream's."""
        return self.state.settings.get("mode") == REAL_TIME_MODE

    @property
    def kind(self) -> str:
        """``replay``, ``stream`` (micro-batches) or ``real-time``."""
        return "real-time" if self.real_time else "stream" if self.stream else "replay"

    @property
    def stream(self) -> dict[str, Any] | None:
        """A stream's settings (its micro-batches, Kafka's offsets), ``None`` for a replay."""
        return self.state.settings.get("stream") or None

    @property
    def condition(self) -> str:
        """What the checkpoint's runs came to, from its recorded status and its claim:

        - ``running``: a run holds the checkpoint now;
        - ``interrupted``: its last run ended without saying so (killed, or its machine lost);
        - ``failed``: its last run failed (the handler, or a Spark task);
        - ``stopped``: its last run stopped with its progress saved: a stream at any time (a stream
          has no end), a replay before its end (asked to, or a task's end lost with its executor);
        - ``dead_letters_left``: its last run ended as asked or at its end (a stream between
          micro-batches, a replay read to it) with dead letters left;
        - ``complete``: a replay read to its end, no dead letter left.

        Each run records ``running`` as it starts, and how it ended as it ends."""
        status = self.state.settings.get("status")
        if self.live:
            return "running"
        if status == "running":
            return "interrupted"
        if status == "failed":
            return "failed"
        if status == "complete" and self.dead_letters:
            return "dead_letters_left"
        if status == "complete" and not (self.stream or self.real_time):
            return "complete"
        return "stopped"

    @property
    def events_done(self) -> int:
        """Events done, handled or set aside (a stream: over its complete micro-batches and the one
        under way)."""
        if self.real_time:
            return sum(partition.handled_total for partition in self.partitions) + self.dead_letters
        tokens, stream = self.state.tokens, self.stream
        done = 0 if tokens is None else tokens.done
        if stream:  # the tokens count the micro-batch in progress, or the last complete one
            done = int(stream.get("events", 0)) + (done if stream.get("batch") else 0)
        return done

    @property
    def input_events(self) -> int | None:
        """A replay's input, once a run has counted it or its Parquet footers have."""
        return None if self.stream else self.state.input_events

    def segments(self) -> list[SegmentView]:
        """The live segment set (``[]`` before a run recorded one)."""
        tokens, ids = self.state.tokens, self.state.settings.get("segments")
        return [] if tokens is None or not ids else segment_views(tokens, ids)

    def segment_strips(self, most: int = 64) -> list[list[tuple[int, int | None]]]:
        """For each live segment (in :meth:`segments`' order), its key groups' progress in at most
        ``most`` cells of its groups, lowest first: each cell's events done and (once counted) in
        the input."""
        tokens, ids = self.state.tokens, self.state.settings.get("segments")
        if tokens is None or not ids:
            return []
        owners = SegmentSet.from_ids(ids).key_group_owners(tokens.bits)
        per_group = tokens.done_per_key_group()
        strips = []
        for position in range(len(ids)):
            groups = np.flatnonzero(owners == position)
            cells = np.array_split(groups, min(most, len(groups))) if len(groups) else []
            strips.append([(int(per_group[cell].sum()),
                            int(tokens.count[cell].sum()) if tokens.counted else None) for cell in cells])
        return strips
