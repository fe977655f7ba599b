"""Segments of the 32-bit hash space: the executable specification.

A segment is a pair ``(segment_id, mask)``. The mask is ``2**k - 1`` for some
``k`` in 0..31 and the id uses only the mask's bits. A hash ``h`` belongs to the
segment when ``h & mask == segment_id``; the root segment ``(0, 0)`` owns every
hash. Splitting a segment adds one bit to its mask and yields two children that
share the parent's hashes between them; two siblings merge back into their
parent. The arithmetic matches Axon Framework's ``Segment`` class; where this
module is stricter than Axon, the docstring says so.

This module is the reference: the compiled kernel (:mod:`segack.kernel`) must
behave exactly like it, errors included.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from segack.errors import SegackTypeError, SegackValueError

__all__ = ["ROOT", "Segment", "SegmentSet", "MAX_KEY_GROUP_BITS", "MAX_MASK_BITS"]

#: The deepest a segment can be: a mask of 31 one-bits. Hashes are 32-bit, but
#: Axon's ids are non-negative Java ints, so the sign bit is never part of a mask.
MAX_MASK_BITS = 31

#: The finest key-group resolution: hashes cut into at most ``2**16`` key groups,
#: so that a table with one entry per key group stays small.
MAX_KEY_GROUP_BITS = 16

_HASH_SPACE = 1 << MAX_MASK_BITS


def as_int(value: Any, what: str) -> int:
    """``value`` as a Python int; ``TypeError`` for anything that is not an integer."""
    try:
        return operator.index(value)
    except TypeError:
        raise SegackTypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def _mask_bits(mask: int) -> int:
    """The ``k`` of a mask ``2**k - 1``."""
    return mask.bit_length()


def _key_group_bits(bits: Any) -> int:
    """``bits`` as an int in 0..MAX_KEY_GROUP_BITS; ``ValueError`` or ``TypeError`` otherwise."""
    width = as_int(bits, "bits")
    if width < 0 or width > MAX_KEY_GROUP_BITS:
        raise SegackValueError(f"key-group bits must be in 0..{MAX_KEY_GROUP_BITS}, got {width}")
    return width


def _reverse_bits(value: int, width: int) -> int:
    """``value``'s low ``width`` bits in reverse order."""
    result = 0
    for _ in range(width):
        result = (result << 1) | (value & 1)
        value >>= 1
    return result


class Segment:
    """One segment: the hashes ``h`` with ``h & mask == segment_id``.

    Rules (each broken rule is a ``ValueError`` that names it; a non-integer is
    a ``TypeError``):

    - ``mask`` is ``2**k - 1`` for ``k`` in 0..31;
    - ``segment_id`` is non-negative and uses only the mask's bits
      (``segment_id & ~mask == 0``). Axon checks only the mask.

    Segments are immutable and hashable; equality is by ``(segment_id, mask)``
    and ordering by id (then mask).

    >>> Segment(1, 1).matches(7)
    True
    """

    __slots__ = ("_mask", "_segment_id")

    def __init__(self, segment_id: int, mask: int) -> None:
        segment_id = as_int(segment_id, "segment_id")
        mask = as_int(mask, "mask")
        if mask < 0 or mask >= _HASH_SPACE or mask & (mask + 1) != 0:
            raise SegackValueError(f"mask must be 2**k - 1 for k in 0..31, got {mask}")
        if segment_id < 0 or segment_id & ~mask != 0:
            raise SegackValueError(
                f"segment_id {segment_id} uses bits outside mask {mask} "
                f"(segment_id & ~mask must be 0)"
            )
        self._segment_id = segment_id
        self._mask = mask

    @property
    def segment_id(self) -> int:
        """The id: the value that a hash, masked, must equal.

        >>> Segment(1, 3).segment_id
        1
        """
        return self._segment_id

    @property
    def mask(self) -> int:
        """The mask ``2**k - 1``.

        >>> Segment(1, 3).mask
        3
        """
        return self._mask

    @property
    def depth(self) -> int:
        """How many splits of the root this segment is away from it (the ``k``).

        >>> Segment(1, 3).depth
        2
        """
        return _mask_bits(self._mask)

    @property
    def share(self) -> float:
        """The fraction of all hashes this segment owns: ``1 / (mask + 1)``.

        >>> Segment(1, 3).share
        0.25
        """
        return 1.0 / (self._mask + 1)

    def matches(self, hash_value: int) -> bool:
        """Whether the segment owns ``hash_value``.

        Any Python int is accepted as a 32-bit hash in two's complement: only its
        low 32 bits count. True when the mask is 0 or ``hash_value & mask == segment_id``.

        >>> Segment(1, 1).matches(7), Segment(1, 1).matches(6)
        (True, False)
        """
        hash_value = as_int(hash_value, "hash_value")
        return self._mask == 0 or (hash_value & self._mask) == self._segment_id

    def split_segment_id(self) -> int:
        """The id of the second child of a split: ``segment_id + mask + 1``.

        A segment with a 31-bit mask cannot split: ``ValueError``.

        >>> Segment(1, 1).split_segment_id()
        3
        """
        self._check_can_split()
        return self._segment_id + self._mask + 1

    def split(self) -> tuple[Segment, Segment]:
        """The two children: ``(segment_id, mask')`` and ``(segment_id + mask + 1, mask')``
        with ``mask' = (mask << 1) | 1``. A segment with a 31-bit mask cannot split.

        >>> Segment(1, 1).split()
        (Segment(1, 3), Segment(3, 3))
        """
        self._check_can_split()
        new_mask = (self._mask << 1) | 1
        return (
            Segment(self._segment_id, new_mask),
            Segment(self._segment_id + self._mask + 1, new_mask),
        )

    def mergeable_segment_id(self) -> int:
        """The sibling's id: ``segment_id`` with the mask's highest bit flipped.

        The root has no sibling: ``ValueError`` (Axon answers 0).

        >>> Segment(3, 3).mergeable_segment_id()
        1
        """
        if self._mask == 0:
            raise SegackValueError("the root segment (0, 0) has no sibling to merge with")
        highest_bit = (self._mask + 1) >> 1
        return self._segment_id ^ highest_bit

    def is_mergeable_with(self, other: Segment) -> bool:
        """Whether ``other`` is this segment's sibling: same mask, and its id is
        :meth:`mergeable_segment_id`. False for the root (Axon answers True).

        >>> Segment(1, 3).is_mergeable_with(Segment(3, 3))
        True
        """
        other = _as_segment(other, "other")
        if self._mask == 0 or other._mask != self._mask:
            return False
        return other._segment_id == self.mergeable_segment_id()

    def merged_with(self, other: Segment) -> Segment:
        """The parent of two siblings: ``(min(ids), mask >> 1)``.

        Segments that are not siblings: ``ValueError``.

        >>> Segment(1, 3).merged_with(Segment(3, 3))
        Segment(1, 1)
        """
        other = _as_segment(other, "other")
        if not self.is_mergeable_with(other):
            raise SegackValueError(f"{self!r} and {other!r} are not siblings and cannot merge")
        return Segment(min(self._segment_id, other._segment_id), self._mask >> 1)

    def key_groups(self, bits: int) -> range:
        """The key groups this segment owns when hashes are cut into ``2**bits`` of them.

        An event's key group is ``hash & (2**bits - 1)``. A segment whose mask has
        at most ``bits`` bits owns whole key groups: those ``g`` with
        ``g & mask == segment_id``, which is ``range(segment_id, 2**bits, mask + 1)``.
        A deeper segment would cut a key group in two: ``ValueError``, as is
        ``bits`` outside 0..16.

        >>> Segment(1, 1).key_groups(3)
        range(1, 8, 2)
        """
        bits = _key_group_bits(bits)
        if self.depth > bits:
            raise SegackValueError(
                f"{self!r} is finer than {2**bits} key groups: its mask has {self.depth} bits, "
                f"more than {bits}"
            )
        return range(self._segment_id, 1 << bits, self._mask + 1)

    def _check_can_split(self) -> None:
        if _mask_bits(self._mask) == MAX_MASK_BITS:
            raise SegackValueError(f"{self!r} has a 31-bit mask and cannot split further")

    @staticmethod
    def compute_segments(segment_ids: Iterable[int]) -> list[Segment]:
        """The segments, with their masks, for ids that arose from splits of the root.

        Starting from the root, a segment is split while its split id is among the
        given ids; the leaves are the answer, sorted by id. Every given id must be
        a leaf: a duplicate, a negative id, a missing 0, or an id that cannot
        arise this way is a ``ValueError`` naming it (Axon drops such ids).

        >>> Segment.compute_segments([0, 1, 2])
        [Segment(0, 3), Segment(1, 1), Segment(2, 3)]
        """
        ids = _id_list(segment_ids)
        available = set(ids)
        if 0 not in available:
            raise SegackValueError("segment ids must include 0 (the root's first child line)")
        leaves: list[Segment] = []
        pending = [ROOT]
        while pending:
            segment = pending.pop()
            if _mask_bits(segment._mask) < MAX_MASK_BITS and segment.split_segment_id() in available:
                pending.extend(segment.split())
            else:
                leaves.append(segment)
        reached = {leaf._segment_id for leaf in leaves}
        for segment_id in ids:
            if segment_id not in reached:
                raise SegackValueError(
                    f"segment id {segment_id} cannot arise from splits of the root "
                    f"together with the other ids"
                )
        return sorted(leaves)

    @staticmethod
    def compute_segment(segment_id: int, available_segment_ids: Iterable[int]) -> Segment:
        """The segment (with its mask) of ``segment_id`` among the live ids.

        Start with ``candidate = 1`` for id 0, else twice the highest set bit of
        the id; while ``segment_id | candidate`` is live, double ``candidate``; the
        mask is ``candidate - 1``. ``segment_id`` must be among the live ids.

        >>> Segment.compute_segment(2, [0, 1, 2])
        Segment(2, 3)
        """
        segment_id = as_int(segment_id, "segment_id")
        available = set(_id_list(available_segment_ids))
        if segment_id not in available:
            raise SegackValueError(f"segment id {segment_id} is not among the available ids")
        candidate = 1 if segment_id == 0 else 1 << segment_id.bit_length()
        while candidate < _HASH_SPACE and (segment_id | candidate) in available:
            candidate <<= 1
        return Segment(segment_id, candidate - 1)

    @staticmethod
    def split_balanced(segment: Segment, times: int) -> list[Segment]:
        """Split ``segment`` ``times`` times, each time the widest member (smallest
        mask; ties: lowest id), and return the members sorted by id.

        >>> Segment.split_balanced(ROOT, 3)
        [Segment(0, 3), Segment(1, 3), Segment(2, 3), Segment(3, 3)]
        """
        segment = _as_segment(segment, "segment")
        times = as_int(times, "times")
        if times < 0:
            raise SegackValueError(f"times must be non-negative, got {times}")
        members = [segment]
        for _ in range(times):
            widest = min(members, key=lambda member: (member._mask, member._segment_id))
            members.remove(widest)
            members.extend(widest.split())
        return sorted(members)

    def _key(self) -> tuple[int, int]:
        return (self._segment_id, self._mask)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: Segment) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: Segment) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: Segment) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: Segment) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Segment({self._segment_id}, {self._mask})"

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return (Segment, self._key())


#: The segment that owns every hash.
ROOT = Segment(0, 0)


def _as_segment(value: Any, what: str) -> Segment:
    if not isinstance(value, Segment):
        raise SegackTypeError(f"{what} must be a Segment, not {type(value).__name__}")
    return value


def _id_list(segment_ids: Iterable[int]) -> list[int]:
    """The ids as ints, each in 0..2**31-1 and none repeated."""
    ids = [as_int(segment_id, "segment id") for segment_id in segment_ids]
    seen: set[int] = set()
    for segment_id in ids:
        if segment_id < 0 or segment_id >= _HASH_SPACE:
            raise SegackValueError(f"segment id {segment_id} is outside 0..2**31-1")
        if segment_id in seen:
            raise SegackValueError(f"segment id {segment_id} is given twice")
        seen.add(segment_id)
    return ids


class SegmentSet:
    """A complete set of segments: every 32-bit hash is owned by exactly one member.

    Members are kept sorted by id; a member's *index* is its position in that
    order. A gap (a hash no member owns) or an overlap (a hash two members own)
    is a ``ValueError`` naming it. Sets are immutable: :meth:`split` and
    :meth:`merge` return new sets.

    Why the check works: reversing the low 31 bits of a hash turns the hashes of
    a segment with a ``k``-bit mask into one interval of length ``2**(31-k)``
    starting at the reversed id. The set is complete when those intervals,
    sorted, tile ``0..2**31-1`` with no hole and no overlap.

    >>> SegmentSet([Segment(0, 1), Segment(1, 1)])
    SegmentSet([(0, 1), (1, 1)])
    """

    __slots__ = ("_members",)

    def __init__(self, segments: Iterable[Segment]) -> None:
        members = [_as_segment(segment, "member") for segment in segments]
        _check_complete(members)
        self._members: tuple[Segment, ...] = tuple(sorted(members))

    @classmethod
    def balanced(cls, count: int) -> SegmentSet:
        """``count`` segments made by :meth:`Segment.split_balanced` from the root.

        >>> SegmentSet.balanced(3)
        SegmentSet([(0, 3), (1, 1), (2, 3)])
        """
        count = as_int(count, "count")
        if count < 1:
            raise SegackValueError(f"count must be at least 1, got {count}")
        return cls(Segment.split_balanced(ROOT, count - 1))

    @classmethod
    def from_ids(cls, segment_ids: Iterable[int]) -> SegmentSet:
        """The set whose members have these ids (see :meth:`Segment.compute_segments`).

        >>> SegmentSet.from_ids([0, 1, 2])
        SegmentSet([(0, 3), (1, 1), (2, 3)])
        """
        return cls(Segment.compute_segments(segment_ids))

    @property
    def members(self) -> tuple[Segment, ...]:
        """The members, sorted by id.

        >>> SegmentSet.balanced(3).members
        (Segment(0, 3), Segment(1, 1), Segment(2, 3))
        """
        return self._members

    @property
    def ids(self) -> tuple[int, ...]:
        """The members' ids, sorted.

        >>> SegmentSet.balanced(3).ids
        (0, 1, 2)
        """
        return tuple(member.segment_id for member in self._members)

    def shares(self) -> tuple[float, ...]:
        """Each member's fraction of the hash space, in member order.

        >>> SegmentSet.balanced(3).shares()
        (0.25, 0.5, 0.25)
        """
        return tuple(member.share for member in self._members)

    def index(self, segment: Segment) -> int:
        """The member index of ``segment``; ``ValueError`` if it is not a member.

        >>> SegmentSet.balanced(3).index(Segment(1, 1))
        1
        """
        segment = _as_segment(segment, "segment")
        for position, member in enumerate(self._members):
            if member == segment:
                return position
        raise SegackValueError(f"{segment!r} is not a member of this set")

    def owner_index(self, hash_value: int) -> int:
        """The index of the member that owns ``hash_value`` (low 32 bits count).

        >>> SegmentSet.balanced(3).owner_index(6)
        2
        """
        hash_value = as_int(hash_value, "hash_value")
        for position, member in enumerate(self._members):
            if member.matches(hash_value):
                return position
        raise AssertionError("a complete set owns every hash")  # pragma: no cover

    def owner(self, hash_value: int) -> Segment:
        """The member that owns ``hash_value``.

        >>> SegmentSet.balanced(3).owner(6)
        Segment(2, 3)
        """
        return self._members[self.owner_index(hash_value)]

    def assign(self, hashes: Any) -> np.ndarray:
        """Each hash's member index, as a NumPy int32 array of the same length.

        ``hashes`` is a one-dimensional NumPy array of int32 or int64 (or anything
        ``numpy.asarray`` turns into one); other dtypes are a ``TypeError``.

        >>> SegmentSet.balanced(3).assign([0, 1, 2, 3, 6])
        array([0, 1, 2, 1, 2], dtype=int32)
        """
        array = _hash_array(hashes)
        result = np.empty(len(array), dtype=np.int32)
        for position, hash_value in enumerate(array.tolist()):
            result[position] = self.owner_index(hash_value)
        return result

    def key_group_owners(self, bits: int) -> np.ndarray:
        """The member index owning each of the ``2**bits`` key groups, as a NumPy int32 array.

        Entry ``g`` is the index of the member whose :meth:`Segment.key_groups`
        holds ``g``. A member deeper than ``bits`` is a ``ValueError`` naming it
        (the set is finer than the key groups), as is ``bits`` outside 0..16.

        >>> SegmentSet.balanced(3).key_group_owners(2)
        array([0, 1, 2, 1], dtype=int32)
        """
        bits = _key_group_bits(bits)
        owners = np.empty(1 << bits, dtype=np.int32)
        for position, member in enumerate(self._members):
            for key_group in member.key_groups(bits):
                owners[key_group] = position
        return owners

    def split(self, member: Segment) -> SegmentSet:
        """A new set with ``member`` replaced by its two children.

        >>> SegmentSet.balanced(3).split(Segment(1, 1))
        SegmentSet([(0, 3), (1, 3), (2, 3), (3, 3)])
        """
        position = self.index(member)
        members = list(self._members)
        del members[position]
        members.extend(member.split())
        return SegmentSet(members)

    def merge(self, first: Segment, second: Segment) -> SegmentSet:
        """A new set with two sibling members replaced by their parent.

        >>> SegmentSet.balanced(3).merge(Segment(0, 3), Segment(2, 3))
        SegmentSet([(0, 1), (1, 1)])
        """
        first_position = self.index(first)
        second_position = self.index(second)
        parent = first.merged_with(second)
        members = [
            member
            for position, member in enumerate(self._members)
            if position not in (first_position, second_position)
        ]
        members.append(parent)
        return SegmentSet(members)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, position: int) -> Segment:
        return self._members[position]

    def __contains__(self, segment: object) -> bool:
        return segment in self._members

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SegmentSet):
            return NotImplemented
        return self._members == other._members

    def __hash__(self) -> int:
        return hash(self._members)

    def __repr__(self) -> str:
        inner = ", ".join(f"({m.segment_id}, {m.mask})" for m in self._members)
        return f"SegmentSet([{inner}])"


def _hash_array(hashes: Any) -> np.ndarray:
    array = np.asarray(hashes)
    if array.ndim != 1:
        raise SegackValueError(f"hashes must be one-dimensional, got {array.ndim} dimensions")
    if array.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        if array.size == 0:
            return array.astype(np.int64)
        raise SegackTypeError(f"hashes must be int32 or int64, not {array.dtype}")
    return array


def _check_complete(members: Sequence[Segment]) -> None:
    """``ValueError`` naming the first gap or overlap among ``members``."""
    if not members:
        raise SegackValueError("a segment set needs at least one member (the empty set owns no hash)")
    by_reversed_id = sorted(
        members, key=lambda member: (_reverse_bits(member.segment_id, MAX_MASK_BITS), member.mask)
    )
    covered_up_to = 0
    previous: Segment | None = None
    for member in by_reversed_id:
        start = _reverse_bits(member.segment_id, MAX_MASK_BITS)
        if start > covered_up_to:
            raise SegackValueError(f"hash {_reverse_bits(covered_up_to, MAX_MASK_BITS)} has no owner")
        if start < covered_up_to:
            raise SegackValueError(
                f"{previous!r} and {member!r} overlap: "
                f"hash {member.segment_id} matches both"
            )
        covered_up_to = start + (_HASH_SPACE >> member.depth)
        previous = member
    if covered_up_to < _HASH_SPACE:
        raise SegackValueError(f"hash {_reverse_bits(covered_up_to, MAX_MASK_BITS)} has no owner")
