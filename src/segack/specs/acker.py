"""The offset acker: the executable specification.

Events carry a dense *index* (their position in the input, from a start index
on) and an opaque *offset* (by default the index itself). Workers finish them
in any order and report ``(index, offset)``. The *committed point* is the
highest index ``h`` such that every index from the start to ``h`` is done; its
offset is the one ``h`` was acked with, and it is what a consumer may safely
commit.

Done indexes beyond the committed point are kept as disjoint *runs*
``(first, last, offset)``: consecutive done indexes share one run, which
remembers only the offset of its last index (the only one that can ever become
the committed point). Two runs never touch: a gap of at least one index that
is not done separates them. Memory therefore grows with the number of gaps,
not with the number of events.

This module is the reference; the compiled kernel behaves exactly like it,
errors included.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from segack import _shared
from segack._shared import (
    DUPLICATES_MAX,
    INDEX_MAX,
    as_index,
    check_settings,
    index_array,
    start_index_argument,
)
from segack.errors import AckerFullError, DuplicateAckError, SegackTypeError, SegackValueError
from segack.specs import snapshot as snapshot_format

__all__ = [
    "OffsetAcker", "AckerFullError", "DuplicateAckError", "INDEX_MAX", "merged_state", "restorable_state",
]


def _done_intervals(state: snapshot_format.AckerState) -> list[tuple[int, int, Any]]:
    """Everything done, as ``(first, last, offset of last)``: the committed prefix and the runs."""
    prefix = []
    if state.next_index > state.start_index:
        prefix = [(state.start_index, state.next_index - 1, state.committed_offset)]
    return prefix + list(state.runs)


def restorable_state(data: Any) -> snapshot_format.AckerState:
    """The state a token holds, if an acker can hold it: every index at most ``INDEX_MAX``
    and the duplicate count within 64 bits. A damaged or foreign token is a ``ValueError``."""
    state = snapshot_format.decode(data)
    for _, last, _ in _done_intervals(state):
        if last > INDEX_MAX:
            raise SegackValueError(_shared.INDEX_PAST_MAX.format(index=last, limit=INDEX_MAX))
    if state.duplicates > DUPLICATES_MAX:
        raise SegackValueError(_shared.DUPLICATES_PAST_MAX.format(duplicates=state.duplicates,
                                                                  limit=DUPLICATES_MAX))
    return state


def merged_state(
    mine: snapshot_format.AckerState, theirs: snapshot_format.AckerState
) -> snapshot_format.AckerState:
    """The union of two ackers' done indexes, with ``mine``'s start and settings.

    ``theirs`` may start later, never earlier (``ValueError``). Where both know
    the offset of an index (a run's last index or the committed point), the
    offsets must agree (``ValueError`` naming the index). Duplicate counts add up.
    """
    if theirs.start_index < mine.start_index:
        raise SegackValueError(_shared.MERGE_EARLIER.format(theirs=theirs.start_index, mine=mine.start_index))
    my_intervals, their_intervals = _done_intervals(mine), _done_intervals(theirs)
    known = {last: offset for _, last, offset in my_intervals}
    for _, last, offset in their_intervals:
        if last in known and known[last] != offset:
            raise SegackValueError(_shared.MERGE_CONFLICT.format(index=last, mine=known[last], theirs=offset))
    merged: list[list[Any]] = []
    for first, last, offset in sorted(my_intervals + their_intervals, key=lambda run: run[0]):
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1][1], merged[-1][2] = last, offset
        else:
            merged.append([first, last, offset])
    next_index, committed = mine.start_index, None
    if merged and merged[0][0] == mine.start_index:
        prefix = merged.pop(0)
        next_index, committed = prefix[1] + 1, prefix[2]
    return snapshot_format.AckerState(
        mine.start_index, next_index, committed, mine.duplicates + theirs.duplicates,
        mine.on_duplicate, mine.max_runs, [(first, last, offset) for first, last, offset in merged],
    )


class OffsetAcker:
    """Tracks out-of-order completions and answers the safe commit point.

    ``OffsetAcker(start_index=0, *, on_duplicate="error", max_runs=None)``:
    ``start_index`` is the first index of the stream (``next_index=``, its
    0.1 name, still works with a ``DeprecationWarning``). With
    ``on_duplicate="ignore"`` a repeated ack is counted in :attr:`duplicates`
    and skipped instead of raising :class:`DuplicateAckError`. ``max_runs``
    bounds memory: an ack that would make more pending runs than that raises
    :class:`AckerFullError` and changes nothing.

    Every method that fails changes nothing.

    >>> acker = OffsetAcker()
    >>> acker.ack(1) is None, acker.ack(0)
    (True, 1)
    """

    def __init__(
        self, start_index: int = 0, *, on_duplicate: str = "error", max_runs: int | None = None,
        next_index: int | None = None,
    ) -> None:
        start = check_settings(start_index_argument(start_index, next_index), on_duplicate, max_runs)
        self._start = start
        self._next = start
        self._committed: Any = None
        self._runs: list[list[Any]] = []  # [first, last, offset of last], sorted, never touching
        self._duplicates = 0
        self._on_duplicate = on_duplicate
        self._max_runs = max_runs

    # ------------------------------------------------------------ what it knows

    @property
    def start_index(self) -> int:
        """The first index of the stream."""
        return self._start

    @property
    def next_index(self) -> int:
        """The first index that is not done: the committed point plus one."""
        return self._next

    @property
    def committed_offset(self) -> Any:
        """The offset of the committed point, or ``None`` before the first commit."""
        return self._committed

    @property
    def pending_runs(self) -> int:
        """How many runs of done indexes lie beyond the committed point."""
        return len(self._runs)

    @property
    def pending_count(self) -> int:
        """How many done indexes lie beyond the committed point."""
        return sum(int(last) - int(first) + 1 for first, last, _ in self._runs)

    @property
    def duplicates(self) -> int:
        """How many duplicate acks were counted and skipped (``on_duplicate="ignore"``)."""
        return self._duplicates

    @property
    def on_duplicate(self) -> str:
        """``"error"`` or ``"ignore"``."""
        return self._on_duplicate

    @property
    def max_runs(self) -> int | None:
        """The bound on pending runs, or ``None``."""
        return self._max_runs

    def runs(self) -> list[tuple[int, int]]:
        """The done runs beyond the committed point as ``(first, last)``, ascending.

        >>> acker = OffsetAcker()
        >>> acker.ack_many([2, 3, 5])
        >>> acker.runs()
        [(2, 3), (5, 5)]
        """
        return [(first, last) for first, last, _ in self._runs]

    def runs_with_offsets(self) -> list[tuple[int, int, Any]]:
        """The done runs as ``(first, last, offset of last)``, ascending.

        >>> acker = OffsetAcker()
        >>> acker.ack(2, "c")
        >>> acker.runs_with_offsets()
        [(2, 2, 'c')]
        """
        return [(first, last, offset) for first, last, offset in self._runs]

    def is_done(self, index: int) -> bool:
        """Whether ``index`` is done. Errors as for :meth:`ack`.

        >>> acker = OffsetAcker()
        >>> acker.ack(2)
        >>> acker.is_done(2), acker.is_done(0)
        (True, False)
        """
        return self._is_done(self._check_index(index))

    def _is_done(self, index: int) -> bool:
        if index < self._next:
            return True
        position = self._run_before(index)
        return position >= 0 and self._runs[position][1] >= index

    def _run_before(self, index: int) -> int:
        """The position of the last run whose first index is ``<= index`` (-1 if none)."""
        return bisect.bisect_right(self._runs, index, key=lambda run: run[0]) - 1

    def _check_index(self, index: Any) -> int:
        index = as_index(index, "index")
        if index < 0:
            raise SegackValueError(f"index {index} is negative")
        if index < self._start:
            raise SegackValueError(f"index {index} is below the start index {self._start}")
        if index > INDEX_MAX:
            raise SegackValueError(f"index {index} is larger than {INDEX_MAX}")
        return int(index)

    def _check(self) -> None:
        """Assert the invariants (a debugging aid, as ``SortedList._check``); changes nothing.

        The committed point lies between the start and ``INDEX_MAX + 1``; runs are
        ascending, each ``first <= last``, start past the committed point (the
        first index not done), and never touch (a gap of at least one index lies
        between two runs); the duplicate count is not negative.
        """
        assert self._start <= self._next <= INDEX_MAX + 1, (self._start, self._next)
        assert self._on_duplicate in ("error", "ignore"), self._on_duplicate
        assert self._duplicates >= 0, self._duplicates
        after = self._next  # the first index a run may start at, plus one
        for first, last, _ in self._runs:
            assert after < first <= last <= INDEX_MAX, (after, first, last)
            after = last + 1

    # ------------------------------------------------------------ acking

    def ack(self, index: int, offset: Any = None) -> Any:
        """Mark ``index`` done with ``offset`` (default: the index itself).

        Returns the new committed offset when the committed point advanced,
        else ``None``. Raises ``TypeError`` for a non-integer index,
        ``ValueError`` for a negative index or one below the start,
        :class:`DuplicateAckError` for an index already done (unless
        ``on_duplicate="ignore"``), and :class:`AckerFullError` when the ack
        would make more than ``max_runs`` pending runs.

        >>> acker = OffsetAcker()
        >>> acker.ack(1, "b") is None
        True
        >>> acker.ack(0, "a")
        'b'
        """
        index = self._check_index(index)
        if self._is_done(index):
            if self._on_duplicate == "ignore":
                self._duplicates += 1
                return None
            raise DuplicateAckError(index)
        runs_after = len(self._runs) + self._run_change(index)
        self._check_room(runs_after)
        return self._add(index, index if offset is None else offset)

    def _run_change(self, index: int) -> int:
        """How acking a not-done ``index`` changes the number of runs: +1, 0 or -1."""
        touches_left = index == self._next or self._is_done(index - 1)
        touches_right = self._is_done(index + 1)
        return 1 - int(touches_left) - int(touches_right)

    def _check_room(self, runs_after: int) -> None:
        if self._max_runs is not None and runs_after > self._max_runs and runs_after > len(self._runs):
            raise AckerFullError(runs_after, self._max_runs)

    def _add(self, index: int, offset: Any) -> Any:
        """Record a not-done index; returns the new committed offset if the point advanced."""
        if index == self._next:
            self._next = index + 1
            self._committed = offset
            if self._runs and self._runs[0][0] == self._next:
                first_run = self._runs.pop(0)
                self._next = first_run[1] + 1
                self._committed = first_run[2]
            return self._committed
        position = self._run_before(index)
        left = self._runs[position] if position >= 0 and self._runs[position][1] == index - 1 else None
        right_position = position + 1
        right = (
            self._runs[right_position]
            if right_position < len(self._runs) and self._runs[right_position][0] == index + 1
            else None
        )
        if left is not None and right is not None:
            left[1], left[2] = right[1], right[2]
            del self._runs[right_position]
        elif left is not None:
            left[1], left[2] = index, offset
        elif right is not None:
            right[0] = index
        else:
            self._runs.insert(right_position, [index, index, offset])
        return None

    def ack_many(self, indexes: Any, offsets: Sequence[Any] | np.ndarray | None = None) -> Any:
        """Ack every index of an integer array, with the matching offsets (default: the indexes).

        The result, and every error, is that of the equivalent :meth:`ack` calls
        in order, except that ``max_runs`` is checked once, against the runs
        after the whole batch. All or nothing: on any error nothing changes.
        A non-integer array is a ``TypeError``; offsets of another length a
        ``ValueError``.

        >>> acker = OffsetAcker()
        >>> acker.ack_many([3, 1, 0]), acker.runs()
        (1, [(3, 3)])
        """
        array = index_array(indexes)
        if offsets is None:
            offset_list: list[Any] = array.tolist()
        else:
            offset_list = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
            if len(offset_list) != len(array):
                raise SegackValueError(f"{len(offset_list)} offsets for {len(array)} indexes")
        trial = self.copy()
        trial._max_runs = None
        for index, offset in zip(array.tolist(), offset_list, strict=True):
            trial.ack(index, offset)
        self._check_room(len(trial._runs))
        advanced = trial._next > self._next
        self._adopt(trial)
        return self._committed if advanced else None

    # ------------------------------------------------------------ merging

    def merge(self, other: OffsetAcker) -> Any:
        """Add every index ``other`` has done (the union), as acks from many tasks combine.

        ``other``'s start may be later than this acker's, never earlier (a
        ``ValueError``). Where both know the offset of one index (a run's last
        index or the committed point), the offsets must agree, else ``ValueError``.
        Duplicate counts add up. Returns the new committed offset if the point
        advanced, else ``None``; raises :class:`AckerFullError` like :meth:`ack`.

        >>> mine, theirs = OffsetAcker(), OffsetAcker()
        >>> mine.ack_many([0, 2]), theirs.ack(1)
        (0, None)
        >>> mine.merge(theirs)
        2
        """
        if not isinstance(other, OffsetAcker):
            raise SegackTypeError(f"can only merge an OffsetAcker, not {type(other).__name__}")
        state = merged_state(self._state(), other._state())
        self._check_room(len(state.runs))
        advanced = state.next_index > self._next
        self._adopt(self._from_state(state))
        return self._committed if advanced else None

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The acker as bytes (see :mod:`segack.specs.snapshot`).

        An offset that is neither int nor str is a ``TypeError``; an int offset of
        2**128 or more in magnitude is a ``ValueError``. Nothing changes either way.

        >>> acker = OffsetAcker()
        >>> acker.ack_many([0, 1, 5])
        1
        >>> OffsetAcker.restore(acker.snapshot()).runs()
        [(5, 5)]
        """
        return snapshot_format.encode(self._state())

    @classmethod
    def restore(cls, data: bytes) -> OffsetAcker:
        """The acker a snapshot holds; a damaged, truncated or foreign token is a ``ValueError``,
        and so is one holding an index past ``INDEX_MAX``. Anything but bytes is a ``TypeError``.

        >>> token = OffsetAcker(start_index=10).snapshot()
        >>> OffsetAcker.restore(token).next_index
        10
        """
        return cls._from_state(restorable_state(data))

    def _state(self) -> snapshot_format.AckerState:
        return snapshot_format.AckerState(
            self._start, self._next, self._committed, self._duplicates,
            self._on_duplicate, self._max_runs, self.runs_with_offsets(),
        )

    @classmethod
    def _from_state(cls, state: snapshot_format.AckerState) -> OffsetAcker:
        acker = cls(state.start_index, on_duplicate=state.on_duplicate, max_runs=state.max_runs)
        acker._next = state.next_index
        acker._committed = state.committed_offset
        acker._duplicates = state.duplicates
        acker._runs = [[first, last, offset] for first, last, offset in state.runs]
        return acker

    # ------------------------------------------------------------ plumbing

    def copy(self) -> OffsetAcker:
        """An independent acker with the same state.

        >>> acker = OffsetAcker()
        >>> acker.ack(2)
        >>> twin = acker.copy()
        >>> twin.ack(0), acker.committed_offset
        (0, None)
        """
        return self._from_state(self._state())

    def _adopt(self, other: OffsetAcker) -> None:
        self._next, self._committed = other._next, other._committed
        self._runs, self._duplicates = other._runs, other._duplicates

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OffsetAcker):
            return NotImplemented
        return bool(self._state() == other._state())

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (type(self).restore, (self.snapshot(),))

    def __repr__(self) -> str:
        return (
            f"OffsetAcker(next_index={self._next}, committed_offset={self._committed!r}, "
            f"pending_runs={len(self._runs)}, pending_count={self.pending_count})"
        )
