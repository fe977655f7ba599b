"""Segments of the 32-bit hash space: the compiled kernel.

Mirrors :mod:`segack.specs.segments` name for name, errors included.
"""

from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

import operator

import numpy as np

from segack.errors import SegackTypeError, SegackValueError

__all__ = ["ROOT", "Segment", "SegmentSet", "MAX_KEY_GROUP_BITS", "MAX_MASK_BITS"]

MAX_MASK_BITS = 31
MAX_KEY_GROUP_BITS = 16
cdef uint64_t _HASH_SPACE = 2147483648
# A lookup table indexed by a hash's low bits answers most assignments in one
# load; it covers masks up to this many bits and deeper members are scanned.
cdef int _TABLE_BITS_MAX = 20

ctypedef fused hash_t:
    int32_t
    int64_t


cdef object _as_int(object value, str what):
    try:
        return operator.index(value)
    except TypeError:
        raise SegackTypeError(f"{what} must be an integer, not {type(value).__name__}") from None


cdef int _key_group_bits(object bits) except -1:
    bits = _as_int(bits, "bits")
    if bits < 0 or bits > MAX_KEY_GROUP_BITS:
        raise SegackValueError(f"key-group bits must be in 0..{MAX_KEY_GROUP_BITS}, got {bits}")
    return bits


cdef inline int _mask_bits(uint32_t mask) noexcept nogil:
    cdef int bits = 0
    while mask:
        bits += 1
        mask >>= 1
    return bits


cdef inline uint32_t _reverse31(uint32_t value) noexcept nogil:
    cdef uint32_t result = 0
    cdef int _
    for _ in range(31):
        result = (result << 1) | (value & 1)
        value >>= 1
    return result


cdef Segment _make(uint32_t segment_id, uint32_t mask):
    cdef Segment segment = Segment.__new__(Segment)
    segment._segment_id = segment_id
    segment._mask = mask
    return segment


cdef Segment _as_segment(object value, str what):
    if not isinstance(value, Segment):
        raise SegackTypeError(f"{what} must be a Segment, not {type(value).__name__}")
    return <Segment>value


cdef list _id_list(object segment_ids):
    cdef list ids = [_as_int(segment_id, "segment id") for segment_id in segment_ids]
    cdef set seen = set()
    for segment_id in ids:
        if segment_id < 0 or segment_id >= _HASH_SPACE:
            raise SegackValueError(f"segment id {segment_id} is outside 0..2**31-1")
        if segment_id in seen:
            raise SegackValueError(f"segment id {segment_id} is given twice")
        seen.add(segment_id)
    return ids


cdef class Segment:
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

    def __init__(self, segment_id, mask):
        segment_id = _as_int(segment_id, "segment_id")
        mask = _as_int(mask, "mask")
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
    def segment_id(self):
        """The id: the value that a hash, masked, must equal.

        >>> Segment(1, 3).segment_id
        1
        """
        return self._segment_id

    @property
    def mask(self):
        """The mask ``2**k - 1``.

        >>> Segment(1, 3).mask
        3
        """
        return self._mask

    @property
    def depth(self):
        """How many splits of the root this segment is away from it (the ``k``).

        >>> Segment(1, 3).depth
        2
        """
        return _mask_bits(self._mask)

    @property
    def share(self):
        """The fraction of all hashes this segment owns: ``1 / (mask + 1)``.

        >>> Segment(1, 3).share
        0.25
        """
        return 1.0 / (<double>self._mask + 1.0)

    def matches(self, hash_value):
        """Whether the segment owns ``hash_value``.

        Any Python int is accepted as a 32-bit hash in two's complement: only its
        low 32 bits count. True when the mask is 0 or ``hash_value & mask == segment_id``.

        >>> Segment(1, 1).matches(7), Segment(1, 1).matches(6)
        (True, False)
        """
        hash_value = _as_int(hash_value, "hash_value")
        return segment_matches(self._segment_id, self._mask, <uint32_t>(hash_value & 0xFFFFFFFF))

    def key_groups(self, bits):
        """The key groups this segment owns when hashes are cut into ``2**bits`` of them.

        An event's key group is ``hash & (2**bits - 1)``. A segment whose mask has
        at most ``bits`` bits owns whole key groups: those ``g`` with
        ``g & mask == segment_id``, which is ``range(segment_id, 2**bits, mask + 1)``.
        A deeper segment would cut a key group in two: ``ValueError``, as is
        ``bits`` outside 0..16.

        >>> Segment(1, 1).key_groups(3)
        range(1, 8, 2)
        """
        cdef int width = _key_group_bits(bits)
        cdef int depth = _mask_bits(self._mask)
        if depth > width:
            raise SegackValueError(
                f"{self!r} is finer than {1 << width} key groups: its mask has {depth} bits, "
                f"more than {width}"
            )
        return range(self._segment_id, 1 << width, self._mask + 1)

    cdef int _check_can_split(self) except -1:
        if _mask_bits(self._mask) == MAX_MASK_BITS:
            raise SegackValueError(f"{self!r} has a 31-bit mask and cannot split further")
        return 0

    def split_segment_id(self):
        """The id of the second child of a split: ``segment_id + mask + 1``.

        A segment with a 31-bit mask cannot split: ``ValueError``.

        >>> Segment(1, 1).split_segment_id()
        3
        """
        self._check_can_split()
        return self._segment_id + self._mask + 1

    def split(self):
        """The two children: ``(segment_id, mask')`` and ``(segment_id + mask + 1, mask')``
        with ``mask' = (mask << 1) | 1``. A segment with a 31-bit mask cannot split.

        >>> Segment(1, 1).split()
        (Segment(1, 3), Segment(3, 3))
        """
        self._check_can_split()
        cdef uint32_t new_mask = (self._mask << 1) | 1
        return (_make(self._segment_id, new_mask), _make(self._segment_id + self._mask + 1, new_mask))

    def mergeable_segment_id(self):
        """The sibling's id: ``segment_id`` with the mask's highest bit flipped.

        The root has no sibling: ``ValueError`` (Axon answers 0).

        >>> Segment(3, 3).mergeable_segment_id()
        1
        """
        if self._mask == 0:
            raise SegackValueError("the root segment (0, 0) has no sibling to merge with")
        return self._segment_id ^ ((self._mask + 1) >> 1)

    def is_mergeable_with(self, other):
        """Whether ``other`` is this segment's sibling: same mask, and its id is
        :meth:`mergeable_segment_id`. False for the root (Axon answers True).

        >>> Segment(1, 3).is_mergeable_with(Segment(3, 3))
        True
        """
        cdef Segment that = _as_segment(other, "other")
        if self._mask == 0 or that._mask != self._mask:
            return False
        return that._segment_id == (self._segment_id ^ ((self._mask + 1) >> 1))

    def merged_with(self, other):
        """The parent of two siblings: ``(min(ids), mask >> 1)``.

        Segments that are not siblings: ``ValueError``.

        >>> Segment(1, 3).merged_with(Segment(3, 3))
        Segment(1, 1)
        """
        cdef Segment that = _as_segment(other, "other")
        if not self.is_mergeable_with(that):
            raise SegackValueError(f"{self!r} and {that!r} are not siblings and cannot merge")
        return _make(min(self._segment_id, that._segment_id), self._mask >> 1)

    @staticmethod
    def compute_segments(segment_ids):
        """The segments, with their masks, for ids that arose from splits of the root.

        Starting from the root, a segment is split while its split id is among the
        given ids; the leaves are the answer, sorted by id. Every given id must be
        a leaf: a duplicate, a negative id, a missing 0, or an id that cannot
        arise this way is a ``ValueError`` naming it (Axon drops such ids).

        >>> Segment.compute_segments([0, 1, 2])
        [Segment(0, 3), Segment(1, 1), Segment(2, 3)]
        """
        cdef list ids = _id_list(segment_ids)
        cdef set available = set(ids)
        if 0 not in available:
            raise SegackValueError("segment ids must include 0 (the root's first child line)")
        cdef list leaves = []
        cdef list pending = [ROOT]
        cdef Segment segment
        while pending:
            segment = pending.pop()
            if _mask_bits(segment._mask) < MAX_MASK_BITS and (
                segment._segment_id + segment._mask + 1
            ) in available:
                pending.extend(segment.split())
            else:
                leaves.append(segment)
        reached = {(<Segment>leaf)._segment_id for leaf in leaves}
        for segment_id in ids:
            if segment_id not in reached:
                raise SegackValueError(
                    f"segment id {segment_id} cannot arise from splits of the root "
                    f"together with the other ids"
                )
        return sorted(leaves)

    @staticmethod
    def compute_segment(segment_id, available_segment_ids):
        """The segment (with its mask) of ``segment_id`` among the live ids.

        Start with ``candidate = 1`` for id 0, else twice the highest set bit of
        the id; while ``segment_id | candidate`` is live, double ``candidate``; the
        mask is ``candidate - 1``. ``segment_id`` must be among the live ids.

        >>> Segment.compute_segment(2, [0, 1, 2])
        Segment(2, 3)
        """
        segment_id = _as_int(segment_id, "segment_id")
        cdef set available = set(_id_list(available_segment_ids))
        if segment_id not in available:
            raise SegackValueError(f"segment id {segment_id} is not among the available ids")
        cdef uint64_t candidate = 1 if segment_id == 0 else (<uint64_t>1) << _mask_bits(segment_id)
        cdef uint32_t sid = segment_id
        while candidate < _HASH_SPACE and (sid | candidate) in available:
            candidate <<= 1
        return _make(sid, <uint32_t>(candidate - 1))

    @staticmethod
    def split_balanced(segment, times):
        """Split ``segment`` ``times`` times, each time the widest member (smallest
        mask; ties: lowest id), and return the members sorted by id.

        >>> Segment.split_balanced(ROOT, 3)
        [Segment(0, 3), Segment(1, 3), Segment(2, 3), Segment(3, 3)]
        """
        cdef Segment start = _as_segment(segment, "segment")
        times = _as_int(times, "times")
        if times < 0:
            raise SegackValueError(f"times must be non-negative, got {times}")
        cdef list members = [start]
        cdef Segment widest
        for _ in range(times):
            widest = min(members, key=_width_key)
            members.remove(widest)
            members.extend(widest.split())
        return sorted(members)

    def __richcmp__(self, other, int op):
        if not isinstance(other, Segment):
            return NotImplemented
        cdef Segment that = <Segment>other
        left = (self._segment_id, self._mask)
        right = (that._segment_id, that._mask)
        if op == 0:
            return left < right
        if op == 1:
            return left <= right
        if op == 2:
            return left == right
        if op == 3:
            return left != right
        if op == 4:
            return left > right
        return left >= right

    def __hash__(self):
        return hash((self._segment_id, self._mask))

    def __repr__(self):
        return f"Segment({self._segment_id}, {self._mask})"

    def __reduce__(self):
        return (Segment, (self._segment_id, self._mask))


def _width_key(Segment member):
    return (member._mask, member._segment_id)


ROOT = _make(0, 0)


cdef class SegmentSet:
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

    def __cinit__(self, *args, **kwargs):
        self._ids = NULL
        self._masks = NULL
        self._table = NULL
        self._deep_order = NULL
        self._count = 0

    def __dealloc__(self):
        self._free_lookup()

    def __init__(self, segments):
        cdef list members = [_as_segment(segment, "member") for segment in segments]
        _check_complete(members)
        # A second __init__ replaces the tables: free the old ones first.
        self._free_lookup()
        self._members = tuple(sorted(members))
        self._build_lookup()

    cdef void _free_lookup(self) noexcept:
        PyMem_Free(self._ids)
        PyMem_Free(self._masks)
        PyMem_Free(self._table)
        PyMem_Free(self._deep_order)
        self._ids = NULL
        self._masks = NULL
        self._table = NULL
        self._deep_order = NULL
        self._count = 0

    cdef _build_lookup(self):
        cdef Py_ssize_t count = len(self._members)
        cdef Py_ssize_t position, slot, deep_count = 0
        cdef Segment member
        cdef int depth, max_depth = 0, table_bits
        self._ids = <uint32_t *>PyMem_Malloc(count * sizeof(uint32_t))
        self._masks = <uint32_t *>PyMem_Malloc(count * sizeof(uint32_t))
        self._deep_order = <int32_t *>PyMem_Malloc(count * sizeof(int32_t))
        if self._ids == NULL or self._masks == NULL or self._deep_order == NULL:
            raise MemoryError()
        self._count = count
        for position in range(count):
            member = self._members[position]
            self._ids[position] = member._segment_id
            self._masks[position] = member._mask
            max_depth = max(max_depth, _mask_bits(member._mask))
        table_bits = min(max_depth, _TABLE_BITS_MAX)
        self._table_mask = ((<uint32_t>1) << table_bits) - 1
        self._table = <int32_t *>PyMem_Malloc((self._table_mask + 1) * sizeof(int32_t))
        if self._table == NULL:
            raise MemoryError()
        # Deep members, grouped by their low table bits; each group's table slot
        # holds -(start + 1), the group's start in _deep_order.
        deep = sorted(
            (position for position in range(count) if _mask_bits(self._masks[position]) > table_bits),
            key=lambda p: (self._ids[p] & self._table_mask, p),
        )
        for position in range(count):
            depth = _mask_bits(self._masks[position])
            if depth <= table_bits:
                slot = self._ids[position]
                while slot <= self._table_mask:
                    self._table[slot] = <int32_t>position
                    slot += self._masks[position] + 1
        for deep_count, position in enumerate(deep):
            self._deep_order[deep_count] = <int32_t>position
            slot = self._ids[position] & self._table_mask
            if deep_count == 0 or (self._ids[self._deep_order[deep_count - 1]] & self._table_mask) != slot:
                self._table[slot] = -(<int32_t>deep_count + 1)

    cdef int32_t owner_index_c(self, uint32_t hash_value) noexcept nogil:
        cdef int32_t entry = self._table[hash_value & self._table_mask]
        cdef int32_t position
        if entry >= 0:
            return entry
        entry = -entry - 1
        while True:
            position = self._deep_order[entry]
            if (hash_value & self._masks[position]) == self._ids[position]:
                return position
            entry += 1

    @classmethod
    def balanced(cls, count):
        """``count`` segments made by :meth:`Segment.split_balanced` from the root.

        >>> SegmentSet.balanced(3)
        SegmentSet([(0, 3), (1, 1), (2, 3)])
        """
        count = _as_int(count, "count")
        if count < 1:
            raise SegackValueError(f"count must be at least 1, got {count}")
        return cls(Segment.split_balanced(ROOT, count - 1))

    @classmethod
    def from_ids(cls, segment_ids):
        """The set whose members have these ids (see :meth:`Segment.compute_segments`).

        >>> SegmentSet.from_ids([0, 1, 2])
        SegmentSet([(0, 3), (1, 1), (2, 3)])
        """
        return cls(Segment.compute_segments(segment_ids))

    @property
    def members(self):
        """The members, sorted by id.

        >>> SegmentSet.balanced(3).members
        (Segment(0, 3), Segment(1, 1), Segment(2, 3))
        """
        return self._members

    @property
    def ids(self):
        """The members' ids, sorted.

        >>> SegmentSet.balanced(3).ids
        (0, 1, 2)
        """
        return tuple((<Segment>member)._segment_id for member in self._members)

    def shares(self):
        """Each member's fraction of the hash space, in member order.

        >>> SegmentSet.balanced(3).shares()
        (0.25, 0.5, 0.25)
        """
        return tuple(member.share for member in self._members)

    def index(self, segment):
        """The member index of ``segment``; ``ValueError`` if it is not a member.

        >>> SegmentSet.balanced(3).index(Segment(1, 1))
        1
        """
        cdef Segment wanted = _as_segment(segment, "segment")
        cdef Py_ssize_t position
        for position in range(self._count):
            if self._ids[position] == wanted._segment_id and self._masks[position] == wanted._mask:
                return position
        raise SegackValueError(f"{wanted!r} is not a member of this set")

    def owner_index(self, hash_value):
        """The index of the member that owns ``hash_value`` (low 32 bits count).

        >>> SegmentSet.balanced(3).owner_index(6)
        2
        """
        hash_value = _as_int(hash_value, "hash_value")
        return self.owner_index_c(<uint32_t>(hash_value & 0xFFFFFFFF))

    def owner(self, hash_value):
        """The member that owns ``hash_value``.

        >>> SegmentSet.balanced(3).owner(6)
        Segment(2, 3)
        """
        return self._members[self.owner_index(hash_value)]

    def assign(self, hashes):
        """Each hash's member index, as a NumPy int32 array of the same length.

        ``hashes`` is a one-dimensional NumPy array of int32 or int64 (or anything
        ``numpy.asarray`` turns into one); other dtypes are a ``TypeError``.

        >>> SegmentSet.balanced(3).assign([0, 1, 2, 3, 6])
        array([0, 1, 2, 1, 2], dtype=int32)
        """
        array = np.asarray(hashes)
        if array.ndim != 1:
            raise SegackValueError(f"hashes must be one-dimensional, got {array.ndim} dimensions")
        if array.dtype != np.int32 and array.dtype != np.int64:
            if array.size == 0:
                return np.empty(0, dtype=np.int32)
            raise SegackTypeError(f"hashes must be int32 or int64, not {array.dtype}")
        array = np.ascontiguousarray(array)
        result = np.empty(len(array), dtype=np.int32)
        if array.dtype == np.int32:
            _assign_into[int32_t](self, array, result)
        else:
            _assign_into[int64_t](self, array, result)
        return result

    def key_group_owners(self, bits):
        """The member index owning each of the ``2**bits`` key groups, as a NumPy int32 array.

        Entry ``g`` is the index of the member whose :meth:`Segment.key_groups`
        holds ``g``. A member deeper than ``bits`` is a ``ValueError`` naming it
        (the set is finer than the key groups), as is ``bits`` outside 0..16.

        >>> SegmentSet.balanced(3).key_group_owners(2)
        array([0, 1, 2, 1], dtype=int32)
        """
        cdef int width = _key_group_bits(bits)
        cdef Py_ssize_t position
        cdef uint32_t group, step
        for position in range(self._count):
            # Raises for a member deeper than the key groups, before anything is filled.
            (<Segment>self._members[position]).key_groups(width)
        owners = np.empty(1 << width, dtype=np.int32)
        cdef int32_t[::1] out = owners
        for position in range(self._count):
            step = self._masks[position] + 1
            group = self._ids[position]
            while group < (<uint32_t>1 << width):
                out[group] = <int32_t>position
                group += step
        return owners

    def split(self, member):
        """A new set with ``member`` replaced by its two children.

        >>> SegmentSet.balanced(3).split(Segment(1, 1))
        SegmentSet([(0, 3), (1, 3), (2, 3), (3, 3)])
        """
        position = self.index(member)
        members = list(self._members)
        del members[position]
        members.extend(member.split())
        return SegmentSet(members)

    def merge(self, first, second):
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

    def __iter__(self):
        return iter(self._members)

    def __len__(self):
        return self._count

    def __getitem__(self, position):
        return self._members[position]

    def __contains__(self, segment):
        return segment in self._members

    def __richcmp__(self, other, int op):
        if op not in (2, 3) or not isinstance(other, SegmentSet):
            return NotImplemented
        equal = self._members == (<SegmentSet>other)._members
        return equal if op == 2 else not equal

    def __hash__(self):
        return hash(self._members)

    def __repr__(self):
        inner = ", ".join(f"({m.segment_id}, {m.mask})" for m in self._members)
        return f"SegmentSet([{inner}])"

    def __reduce__(self):
        return (SegmentSet, (list(self._members),))


cdef void _assign_into(SegmentSet self, const hash_t[::1] hashes, int32_t[::1] out) noexcept:
    cdef Py_ssize_t i, n = hashes.shape[0]
    cdef int32_t entry
    with nogil:
        for i in range(n):
            entry = self._table[<uint32_t>hashes[i] & self._table_mask]
            if entry < 0:
                entry = self.owner_index_c(<uint32_t>hashes[i])
            out[i] = entry


def _reversed_key(Segment member):
    return (_reverse31(member._segment_id), member._mask)


cdef _check_complete(list members):
    if not members:
        raise SegackValueError("a segment set needs at least one member (the empty set owns no hash)")
    cdef list ordered = sorted(members, key=_reversed_key)
    cdef uint64_t covered_up_to = 0, start
    cdef Segment member
    cdef object previous = None
    for member in ordered:
        start = _reverse31(member._segment_id)
        if start > covered_up_to:
            raise SegackValueError(f"hash {_reverse31(<uint32_t>covered_up_to)} has no owner")
        if start < covered_up_to:
            raise SegackValueError(
                f"{previous!r} and {member!r} overlap: hash {member._segment_id} matches both"
            )
        covered_up_to = start + (<uint64_t>_HASH_SPACE >> _mask_bits(member._mask))
        previous = member
    if covered_up_to < _HASH_SPACE:
        raise SegackValueError(f"hash {_reverse31(<uint32_t>covered_up_to)} has no owner")
