"""Changing a checkpoint's segments: split, merge or a whole new set, now or while a run goes on.

Progress is kept per key group, and every segment a checkpoint accepts is a union of whole key
groups, so a change of segments never cuts through a key group's progress: the next job over the
new set resumes each key group where it stood. The rules:

1. **A change is checked against the set it changes**: the change still pending, if there is
   one, else the set the checkpoint records. A split names a live segment; a merge names a live
   segment whose sibling is live too (as Axon's ``mergeSegment``); a whole set must be complete
   and no finer than the checkpoint's key groups. Anything else is a ``ValueError`` and nothing is
   written.
2. **On a checkpoint no run holds**, the change takes a short claim of its own
   (:mod:`~segack.spark_adapter.store.claims`), records the new set and releases the claim; the next run
   starts over the new set. The claim passes the progress of a crashed run on to the next run.
3. **On a checkpoint a live run holds**, the change is recorded as a request
   (``CHECKPOINT/segments-request.json``) and the command returns at once: it never waits for the
   run nor takes its claim. A replay notices the request within a fraction of a second, asks its tasks to stop
   at their next flush (they finish the calls in flight and write their progress), merges, records
   the new set and goes on with the remaining events in a new Spark job over it. A stream
   (:func:`~segack.spark_adapter.foreach_batch`) applies it at its next micro-batch. A request
   still pending when its run ends is applied by the next run, unless that run names its own
   segments (then the run's choice wins and the request is dropped).
4. **The checkpoint keeps a history** of its segment sets, with when and why (the start of a
   run, a request, ``auto``); the last :data:`HISTORY_LENGTH` entries, so it stays small.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from segack.errors import SegackValueError
from segack.kernel import Segment, SegmentSet, plan_segments
from segack.spark_adapter.errors import OptionError, SegmentChangeError
from segack.spark_adapter.options import check_claim_timeout
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.store.claims import (
    DEFAULT_CLAIM_TIMEOUT,
    CheckpointClaimedError,
    ClaimKeeper,
    acquire,
)
from segack.spark_adapter.store.periodic import Periodic

if TYPE_CHECKING:
    from segack.spark_adapter.store.tokens import KeyGroupTokens

__all__ = ["HISTORY_LENGTH", "Rescale", "SegmentChange", "merge", "scale", "split"]

#: Segment sets a checkpoint remembers (rule 4).
HISTORY_LENGTH = 100
#: How often a running replay looks for a request, in seconds.
REQUEST_POLL_SECONDS = 0.2
#: ``auto`` changes a stream's set only when the planned set's largest share is at most this
#: fraction of the current set's: a smaller gain is not worth a new set, and the set must not flap.
AUTO_MARGIN = 0.8

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentChange:
    """A change of segments asked of the run that holds a checkpoint (rule 3)."""

    #: The live segment ids of the new set.
    segments: tuple[int, ...]
    #: Why, as the history shows it (``split segment 3``, ...).
    why: str
    requested_at: float
    #: Who asked: the host and process.
    by: str

    def to_bytes(self) -> bytes:
        body = {"segments": list(self.segments), "why": self.why, "requested_at": self.requested_at,
                "by": self.by}
        return json.dumps(body, sort_keys=True).encode("utf-8") + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> SegmentChange:
        """The change a request file holds; anything else is a
        :class:`~segack.spark_adapter.CheckpointError`."""
        try:
            body = json.loads(data.decode("utf-8"))
            change = cls(tuple(body["segments"]), str(body["why"]), float(body["requested_at"]),
                         str(body["by"]))
            SegmentSet.from_ids(change.segments)
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as error:
            raise CheckpointError(f"{where} is not a segack segment request: {error}") from None
        return change

    @property
    def segment_set(self) -> SegmentSet:
        return SegmentSet.from_ids(self.segments)


@dataclass(frozen=True)
class Rescale:
    """What :func:`split`, :func:`merge` or :func:`scale` did."""

    #: The set before the change (the pending request's, if there was one).
    before: SegmentSet
    #: The new set.
    segments: SegmentSet
    #: ``True``: recorded in the checkpoint, the next run starts over it. ``False``: asked of
    #: the live run named by ``run`` (or nothing to change, when ``segments == before``).
    applied: bool
    #: The live run that will apply the change (``None`` when it was applied at once).
    run: str | None = None

    def describe(self) -> str:
        """What happened, in the words ``segack split``, ``merge`` and ``scale`` and the page use."""
        ids = ",".join(map(str, self.segments.ids))
        if self.segments == self.before:
            return f"the segments are {ids} already; nothing to do"
        change = f"{len(self.before)} -> {len(self.segments)} segments ({ids})"
        if self.applied:
            return f"{change}; the next run starts over them"
        return (f"asked {self.run} to change {change}; it applies them within seconds (a stream: at its next "
                f"micro-batch)")


def pending_change(store: CheckpointStore) -> SegmentChange | None:
    """The change of segments waiting for a run, or ``None``."""
    data = store.read_segments_request()
    where = f"the segment request of {store.location}"
    return None if data is None else SegmentChange.from_bytes(data, where)


def recorded_segments(state: Checkpoint) -> SegmentSet | None:
    """The segment set the checkpoint records, or ``None`` before any run."""
    ids = state.settings.get("segments")
    return SegmentSet.from_ids(ids) if ids else None


def record_segments(state: Checkpoint, segments: SegmentSet, why: str) -> None:
    """Make ``segments`` the checkpoint's set and add it to the history (rule 4), unless it is
    the set recorded already."""
    history = list(state.settings.get("segment_history", []))
    if history and tuple(history[-1]["segments"]) == segments.ids:
        state.settings["segments"] = list(segments.ids)
        return
    history.append({"at": time.time(), "segments": list(segments.ids), "why": why})
    state.settings["segment_history"] = history[-HISTORY_LENGTH:]
    state.settings["segments"] = list(segments.ids)


def _live_member(segments: SegmentSet, segment_id: Any, what: str) -> Segment:
    if isinstance(segment_id, bool) or not isinstance(segment_id, int):
        raise OptionError(f"{what} needs a segment id (an int), not {segment_id!r}")
    for member in segments:
        if member.segment_id == segment_id:
            return member
    raise SegmentChangeError(f"segment {segment_id} is not live; the live segments are {list(segments.ids)}")


def split_of(segments: SegmentSet, segment_id: int) -> SegmentSet:
    """``segments`` with live segment ``segment_id`` split in two (rule 1)."""
    return segments.split(_live_member(segments, segment_id, "split"))


def merge_of(segments: SegmentSet, segment_id: int) -> SegmentSet:
    """``segments`` with live segment ``segment_id`` merged with its sibling, which must be live
    (rule 1)."""
    member = _live_member(segments, segment_id, "merge")
    if member.mask == 0:
        raise SegmentChangeError(f"segment {segment_id} is the whole hash space: it has no sibling to "
                                 f"merge with")
    sibling_id = member.mergeable_segment_id()
    sibling = next((other for other in segments if other.segment_id == sibling_id), None)
    if sibling is None or not member.is_mergeable_with(sibling):
        raise SegmentChangeError(f"segment {segment_id} cannot be merged: its sibling (id {sibling_id} at "
                                 f"mask {member.mask}) is not live, it is split further; merge its parts "
                                 f"first")
    return segments.merge(member, sibling)


def key_group_load(tokens: KeyGroupTokens) -> np.ndarray:
    """The events of each key group measured so far: its count once the input is counted, else
    the events done (a stream's events since its first batch)."""
    return (tokens.count if tokens.counted else tokens.committed).astype(np.int64)


def largest_share(load: np.ndarray, segments: SegmentSet, bits: int) -> float:
    """The heaviest member's share of ``load`` (1.0 when there is none)."""
    total = int(load.sum())
    if not total:
        return 1.0
    owners = segments.key_group_owners(bits)
    return float(np.bincount(owners, weights=load, minlength=len(segments)).max()) / total


def auto_change(tokens: KeyGroupTokens, current: SegmentSet, workers: int) -> tuple[SegmentSet, str] | None:
    """The planned set for ``workers`` from the load measured so far, with why, when it beats
    ``current``'s largest share by :data:`AUTO_MARGIN`; ``None`` otherwise."""
    load = key_group_load(tokens)
    if not load.any():
        return None
    planned = SegmentSet.from_ids(plan_segments(load, workers))
    now, then = largest_share(load, current, tokens.bits), largest_share(load, planned, tokens.bits)
    if planned == current or then > now * AUTO_MARGIN:
        return None
    return planned, (f"auto: largest share {now:.1%} -> {then:.1%} ({len(planned)} segments for "
                     f"{workers} workers)")


def _whole_set(segments: Any) -> SegmentSet:
    if isinstance(segments, SegmentSet):
        return segments
    if isinstance(segments, int) and not isinstance(segments, bool):
        if segments < 1:
            raise OptionError(f"segments must be a positive int, not {segments}")
        return SegmentSet.balanced(segments)
    if isinstance(segments, Sequence) and not isinstance(segments, str):
        try:
            return SegmentSet.from_ids(segments)
        except SegackValueError as error:  # ids that cannot arise from splits of the root
            raise SegmentChangeError(str(error)) from None
    raise OptionError(f"segments must be a count, a SegmentSet, a list of segment ids or 'auto', "
                           f"not {segments!r}")


def _change(store: CheckpointStore, make: Callable[[SegmentSet, Checkpoint], tuple[SegmentSet, str]],
            claim_timeout: float) -> Rescale:
    """Rules 1-3 for one change: ``make`` turns the current set (and the state) into the new set
    and why, or raises."""
    state = store.load_existing()
    current = recorded_segments(state)
    if current is None or state.tokens is None:
        raise CheckpointError(f"no segments recorded at {store.location}: a run records them first")
    pending = pending_change(store)
    if pending is not None:
        current = pending.segment_set
    segments, why = make(current, state)
    try:
        segments.key_group_owners(state.tokens.bits)
    except SegackValueError as error:  # finer than the key groups
        raise SegmentChangeError(str(error)) from None
    if segments == current:
        return Rescale(current, segments, applied=False)
    by = f"pid {os.getpid()} on {socket.gethostname()}"
    try:
        claim = acquire(store, f"rescale-{uuid.uuid4().hex[:8]}", claim_timeout, handles_events=False)
    except CheckpointClaimedError as claimed:
        store.write_segments_request(SegmentChange(segments.ids, why, time.time(), by).to_bytes())
        log.info("%s: %s (%d -> %d segments) asked of %s", store.location, why, len(current), len(segments),
                 claimed.claim.owner())
        return Rescale(current, segments, applied=False, run=claimed.claim.owner())
    with ClaimKeeper(store, claim) as keeper:
        state = store.load_existing()  # a run that held it saved a state; nothing deletes one
        record_segments(state, segments, f"{why} (by {by})")
        keeper.save(state)
        store.delete_segments_request()
    log.info("%s: %s (%d -> %d segments) recorded for the next run", store.location, why, len(current),
             len(segments))
    return Rescale(current, segments, applied=True)


def _store(checkpoint: str | CheckpointStore) -> CheckpointStore:
    return checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)


def split(checkpoint: str | CheckpointStore, segment_id: int, *,
          claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> Rescale:
    """Split live segment ``segment_id`` of ``checkpoint`` in two: now if no run holds it, else
    by the live run within seconds (rules 2-3).

    Parameters
    ----------
    segment_id : int
        A live segment's id (``segack status`` lists them).
    checkpoint : str or CheckpointStore
        The checkpoint: its location, or a store.
    claim_timeout : float, default ``60``
        On a checkpoint no run holds, the short claim the change takes expires after this long
        unextended.

    Returns
    -------
    Rescale
        The set before and after, and whether the change was recorded or asked of a live run.

    Raises
    ------
    SegmentChangeError
        An id that is not live, or a split finer than the checkpoint's key groups; nothing is
        written.
    OptionError
        An id that is not an int, or a bad ``claim_timeout``.
    CheckpointError
        A checkpoint that records no segments yet.
    """
    claim_timeout = check_claim_timeout(claim_timeout)
    return _change(_store(checkpoint), lambda current, _: (split_of(current, segment_id),
                                                            f"split segment {segment_id}"), claim_timeout)


def merge(checkpoint: str | CheckpointStore, segment_id: int, *,
          claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> Rescale:
    """Merge live segment ``segment_id`` of ``checkpoint`` with its sibling, as Axon's
    ``mergeSegment`` does: now if no run holds it, else by the live run (rules 2-3).

    Parameters
    ----------
    segment_id : int
        A live segment whose sibling is live too.
    checkpoint : str or CheckpointStore
        The checkpoint: its location, or a store.
    claim_timeout : float, default ``60``
        On a checkpoint no run holds, the short claim the change takes expires after this long
        unextended.

    Returns
    -------
    Rescale
        The set before and after, and whether the change was recorded or asked of a live run.

    Raises
    ------
    SegmentChangeError
        An id that is not live, a segment whose sibling is not live (split further), or the root;
        nothing is written.
    OptionError
        An id that is not an int, or a bad ``claim_timeout``.
    CheckpointError
        A checkpoint that records no segments yet.
    """
    claim_timeout = check_claim_timeout(claim_timeout)
    return _change(_store(checkpoint), lambda current, _: (merge_of(current, segment_id),
                                                            f"merge segment {segment_id}"), claim_timeout)


def scale(checkpoint: str | CheckpointStore, segments: int | SegmentSet | Sequence[int] | str, *,
          workers: int | None = None, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> Rescale:
    """Give ``checkpoint`` a whole new set: now if no run holds it, else by the live run
    (rules 2-3).

    Parameters
    ----------
    segments : int, SegmentSet, list of int or ``'auto'``
        A count (:meth:`~segack.SegmentSet.balanced`), a :class:`~segack.SegmentSet`, the live
        segment ids, or ``"auto"``: planned (:func:`segack.plan_segments`) from the load of each
        key group the checkpoint has measured.
    workers : int, optional
        With ``"auto"``: plan for this many workers (default: the current count).
    checkpoint : str or CheckpointStore
        The checkpoint: its location, or a store.
    claim_timeout : float, default ``60``
        On a checkpoint no run holds, the short claim the change takes expires after this long
        unextended.

    Returns
    -------
    Rescale
        The set before and after, and whether the change was recorded or asked of a live run.

    Raises
    ------
    SegmentChangeError
        Ids that cannot arise from splits of the root, a set finer than the checkpoint's key
        groups, or ``"auto"`` before any event is done; nothing is written.
    OptionError
        ``segments`` or ``workers`` that are not what they must be, or a bad ``claim_timeout``.
    CheckpointError
        A checkpoint that records no segments yet.
    """
    claim_timeout = check_claim_timeout(claim_timeout)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise OptionError(f"workers must be a positive int, not {workers!r}")

    def make(current: SegmentSet, state: Checkpoint) -> tuple[SegmentSet, str]:
        if segments == "auto":
            tokens = state.tokens
            assert tokens is not None
            load = key_group_load(tokens)
            if not load.any():
                raise SegmentChangeError("scale to 'auto' plans from the events measured so far, and there "
                                       "are none yet")
            count = len(current) if workers is None else workers
            return SegmentSet.from_ids(plan_segments(load, count)), f"scale to auto for {count} workers"
        chosen = _whole_set(segments)
        return chosen, f"scale to {len(chosen)} segments"

    return _change(_store(checkpoint), make, claim_timeout)


class RequestWatcher(Periodic):
    """Looks for a change of segments while a replay's job runs (rule 3). On the first request for
    a set other than ``segments``, keeps it in :attr:`change` and calls ``on_change`` once (which
    asks the job's tasks to stop at their next flush)."""

    def __init__(self, store: CheckpointStore, segments: SegmentSet,
                 on_change: Callable[[SegmentChange], object], poll: float = REQUEST_POLL_SECONDS) -> None:
        super().__init__(poll, "segack-requests")
        self.store, self.segments, self.on_change = store, segments, on_change
        self.change: SegmentChange | None = None
        self._reported: str | None = None

    def tick(self) -> bool:
        try:
            change = pending_change(self.store)
        except (CheckpointError, OSError) as error:
            # A damaged or unreachable request is no reason to stop a run: say so once, go on.
            if str(error) != self._reported:
                log.warning("%s: ignoring the segment request: %s", self.store.location, error)
                self._reported = str(error)
            return False
        if change is None or change.segment_set == self.segments:
            return False
        log.info("%s: %s (by %s): the run's tasks stop at their next flush", self.store.location,
                 change.why, change.by)
        self.change = change
        self.on_change(change)
        return True
