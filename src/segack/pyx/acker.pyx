# cython: embedsignature.format=clinic, binding=False
# (plain builtin methods: one call layer less on the per-call ack path; the clinic-format
# signatures keep inspect.signature working)
"""The offset acker, compiled. Mirrors :mod:`segack.specs.acker`, errors included.

Runs live in a two-level sorted structure, the list-of-lists design of
``sortedcontainers`` in C: blocks of at most ``BLOCK_SIZE`` runs, plus an array
of each block's first index. Finding a run is two binary searches
(O(log runs)); inserting or removing one moves at most a block's worth of
32-byte runs. In-order acks only touch the committed point: O(1), no memory.
Per-call acks close behind the committed point set bits in a fixed window
instead (see "the per-call window" below), which every other operation first
folds into runs.
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.object cimport Py_NE, PyObject_RichCompareBool
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF, Py_XINCREF
from libc.stdint cimport INT64_MAX, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memmove

import zlib

import numpy as np

from segack import _shared
from segack._shared import (
    DUPLICATE_POLICIES,
    DUPLICATES_MAX,
    INDEX_MAX,
    OFFSET_LIMIT,
    SNAPSHOT_CHECKSUM,
    SNAPSHOT_HEADER,
    SNAPSHOT_MAGIC,
    SNAPSHOT_VERSION,
    VARINT_BYTES_MAX,
    AckerState,
    check_settings,
    index_array,
    start_index_argument,
)
from segack.errors import AckerFullError, DuplicateAckError, SegackTypeError, SegackValueError

__all__ = ["OffsetAcker", "AckerFullError", "DuplicateAckError", "INDEX_MAX", "BLOCK_SIZE", "WINDOW_SIZE"]

cdef enum:
    # Runs per block, a power of two: a block of 32-byte runs fills half a page.
    _BLOCK = 64
    # Indexes the per-call window covers, a power of two (see OffsetAcker._window_bits).
    _WINDOW = 2048

#: Runs per block.
BLOCK_SIZE = _BLOCK
#: How far past the committed point the per-call window reaches.
WINDOW_SIZE = _WINDOW
cdef int64_t _INDEX_MAX = INDEX_MAX
# Unused slots of a block and of the block index hold this first index, which no index
# reaches (INDEX_MAX is below it), so searches run over a fixed power-of-two length.
cdef int64_t _EMPTY = INT64_MAX
cdef uint64_t _ALL_MARKED = 0x0101010101010101ULL
# The window's bits, offsets and offset objects.
cdef Py_ssize_t _WINDOW_BYTES = _WINDOW // 8 + _WINDOW * (sizeof(int64_t) + sizeof(PyObject *))


cdef struct Run:
    int64_t first
    int64_t last
    int64_t offset      # the offset of ``last`` when ``obj`` is NULL
    PyObject *obj       # an owned reference to a non-native offset, or NULL


cdef struct Block:
    Run *runs
    Py_ssize_t count


include "acker_runs.pxi"


include "acker_codec.pxi"


cdef class OffsetAcker:
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

    cdef int64_t _start
    cdef int64_t _next
    cdef int64_t _committed_native
    cdef object _committed_object
    cdef bint _committed_is_native
    cdef Block *_blocks
    cdef int64_t *_block_firsts
    cdef Py_ssize_t _block_count
    cdef Py_ssize_t _block_capacity
    cdef Py_ssize_t _run_count
    cdef int64_t _pending_count
    cdef int64_t _duplicates
    cdef bint _ignore_duplicates
    cdef object _max_runs
    # The per-call window: a ring of _WINDOW bits, the offset of each index and, for the last
    # index of each group of set bits, an owned offset object (see "the per-call window" below).
    cdef uint64_t *_window_bits
    cdef int64_t *_window_offsets
    cdef PyObject **_window_objs
    cdef bint _window_active
    cdef int64_t _window_limit
    cdef Py_ssize_t _window_runs

    def __cinit__(self, *args, **kwargs):
        self._blocks = NULL
        self._block_firsts = NULL
        self._block_count = 0
        self._block_capacity = 0
        self._committed_object = None
        self._committed_is_native = False
        self._window_bits = NULL
        self._window_offsets = NULL
        self._window_objs = NULL
        self._window_active = False

    def __dealloc__(self):
        self._clear()

    def __init__(self, start_index=0, *, on_duplicate="error", max_runs=None, next_index=None):
        start = check_settings(start_index_argument(start_index, next_index), on_duplicate, max_runs)
        self._clear()
        self._start = start
        self._next = start
        self._committed_object = None
        self._committed_is_native = False
        self._run_count = 0
        self._pending_count = 0
        self._duplicates = 0
        self._ignore_duplicates = on_duplicate == "ignore"
        self._max_runs = max_runs

    cdef void _clear(self) noexcept:
        cdef Py_ssize_t b, r
        for b in range(self._block_count):
            for r in range(self._blocks[b].count):
                Py_XDECREF(self._blocks[b].runs[r].obj)
            free(self._blocks[b].runs)
        free(self._blocks)
        free(self._block_firsts)
        self._blocks = NULL
        self._block_firsts = NULL
        self._block_count = 0
        self._block_capacity = 0
        self._run_count = 0
        self._pending_count = 0
        self._clear_window()

    cdef void _clear_window(self) noexcept:
        cdef Py_ssize_t slot
        if self._window_objs != NULL:
            for slot in range(_WINDOW):
                Py_XDECREF(self._window_objs[slot])
        free(self._window_bits)
        free(self._window_offsets)
        free(self._window_objs)
        self._window_bits = NULL
        self._window_offsets = NULL
        self._window_objs = NULL
        self._window_active = False
        self._window_runs = 0

    # ------------------------------------------------------------ the per-call window
    #
    # Per-call acks just ahead of the committed point land in a ring of bits, one per
    # index, instead of the runs: setting a bit needs no search, no shifting and no
    # unpredictable branch, which is most of what a per-call ack costs. The window holds
    # the indexes from the committed point up to ``_window_limit``, which never passes the
    # first run, so every run lies after every window index. Only the last index of each
    # maximal group of set bits keeps its offset object, as a run would. Anything but a
    # per-call ack, ``is_done`` and the counters first folds the window into runs
    # (``_flush_window``), so the rest of the acker only ever sees runs.

    cdef bint _window_has(self, int64_t index) noexcept nogil:
        cdef int64_t slot = index & (_WINDOW - 1)
        return (self._window_bits[slot >> 6] >> (slot & 63)) & 1

    cdef int64_t _first_run_start(self) noexcept nogil:
        return self._blocks[0].runs[0].first if self._run_count > 0 else INT64_MAX

    cdef void _raise_window_limit(self) noexcept nogil:
        """The window reaches ``_WINDOW`` indexes past the committed point, or up to the first run."""
        cdef int64_t reach = INT64_MAX if self._next > INT64_MAX - _WINDOW else self._next + _WINDOW
        self._window_limit = min(reach, self._first_run_start())

    cdef int _open_window(self) except -1:
        if self._window_bits == NULL:
            self._window_bits = <uint64_t *>calloc(_WINDOW // 64, sizeof(uint64_t))
            self._window_offsets = <int64_t *>malloc(_WINDOW * sizeof(int64_t))
            self._window_objs = <PyObject **>calloc(_WINDOW, sizeof(PyObject *))
            if self._window_bits == NULL or self._window_offsets == NULL or self._window_objs == NULL:
                self._clear_window()
                raise MemoryError()
        self._window_active = True
        self._raise_window_limit()
        return 0

    cdef bint _joined_to_first_run(self) noexcept nogil:
        """Whether the window's last index is done and the first run starts right after it."""
        return (
            self._window_active and self._window_limit > self._next
            and self._window_has(self._window_limit - 1)
            and self._first_run_start() == self._window_limit
        )

    cdef Py_ssize_t _total_runs(self) noexcept nogil:
        return self._run_count + self._window_runs - <Py_ssize_t>self._joined_to_first_run()

    cdef void _window_add(self, int64_t index, int64_t offset, PyObject *obj) noexcept nogil:
        """Record a not-done ``index`` strictly inside the window; takes ownership of ``obj``."""
        cdef int64_t slot = index & (_WINDOW - 1)
        cdef bint left = self._window_has(index - 1)
        cdef bint right = index + 1 < self._window_limit and self._window_has(index + 1)
        self._window_bits[slot >> 6] |= (<uint64_t>1) << (slot & 63)
        self._window_offsets[slot] = offset
        self._window_objs[slot] = obj
        if left:
            # index - 1 no longer ends a group: its offset is not needed any more.
            slot = (index - 1) & (_WINDOW - 1)
            _release(self._window_objs[slot])
            self._window_objs[slot] = NULL
        if right:
            _release(obj)
            self._window_objs[index & (_WINDOW - 1)] = NULL
        self._window_runs += 1 - <Py_ssize_t>left - <Py_ssize_t>right
        self._pending_count += 1

    cdef void _take_window_run(self) noexcept nogil:
        """Move the committed point past the window's done indexes that start at it."""
        cdef int64_t slot
        cdef int64_t first = self._next
        while self._next < self._window_limit and self._window_has(self._next):
            slot = self._next & (_WINDOW - 1)
            self._window_bits[slot >> 6] &= ~((<uint64_t>1) << (slot & 63))
            self._next += 1
        if self._next > first:
            slot = (self._next - 1) & (_WINDOW - 1)
            self._set_committed(self._window_offsets[slot], self._window_objs[slot])
            self._window_objs[slot] = NULL
            self._window_runs -= 1
            self._pending_count -= self._next - first

    cdef int _flush_window(self) except -1 nogil:
        """Fold the window's done indexes into runs and close the window."""
        cdef int64_t index, first, slot
        cdef PyObject *obj
        if not self._window_active:
            return 0
        self._window_active = False
        index = self._next
        while index < self._window_limit:
            if not self._window_has(index):
                index += 1
                continue
            first = index
            while index < self._window_limit and self._window_has(index):
                slot = index & (_WINDOW - 1)
                self._window_bits[slot >> 6] &= ~((<uint64_t>1) << (slot & 63))
                index += 1
            slot = (index - 1) & (_WINDOW - 1)
            obj = self._window_objs[slot]
            self._window_objs[slot] = NULL
            self._window_runs -= 1
            self._pending_count -= index - first
            self._add_range(first, index - 1, self._window_offsets[slot], obj)
        return 0

    # ------------------------------------------------------------ the run structure

    cdef bint _locate(self, int64_t index, Py_ssize_t *block, Py_ssize_t *position) noexcept nogil:
        """Where the last run whose first index is <= ``index`` is; False if there is none."""
        cdef Py_ssize_t b
        if self._block_count == 0:
            return False
        b = _last_at_or_below(self._block_firsts, 1, self._block_capacity, index)
        if b < 0:
            return False
        block[0] = b
        position[0] = _last_at_or_below(
            &self._blocks[b].runs[0].first, sizeof(Run) // sizeof(int64_t), _BLOCK, index
        )
        return True

    cdef bint is_done_c(self, int64_t index) noexcept nogil:
        cdef Py_ssize_t b, r
        if index < self._next:
            return True
        if self._window_active and index < self._window_limit:
            return self._window_has(index)
        if not self._locate(index, &b, &r):
            return False
        return self._blocks[b].runs[r].last >= index

    cdef int _insert_block(self, Py_ssize_t at) except -1 nogil:
        cdef Py_ssize_t capacity, slot
        cdef Block *blocks
        cdef int64_t *firsts
        if self._block_count == self._block_capacity:
            capacity = 8 if self._block_capacity == 0 else self._block_capacity * 2
            blocks = <Block *>realloc(self._blocks, capacity * sizeof(Block))
            if blocks == NULL:
                with gil:
                    raise MemoryError()
            self._blocks = blocks
            firsts = <int64_t *>realloc(self._block_firsts, capacity * sizeof(int64_t))
            if firsts == NULL:
                with gil:
                    raise MemoryError()
            self._block_firsts = firsts
            for slot in range(self._block_capacity, capacity):
                firsts[slot] = _EMPTY
            self._block_capacity = capacity
        cdef Run *runs = <Run *>malloc(_BLOCK * sizeof(Run))
        if runs == NULL:
            with gil:
                raise MemoryError()
        for slot in range(_BLOCK):
            runs[slot].first = _EMPTY
        memmove(self._blocks + at + 1, self._blocks + at, (self._block_count - at) * sizeof(Block))
        memmove(
            self._block_firsts + at + 1, self._block_firsts + at,
            (self._block_count - at) * sizeof(int64_t),
        )
        self._blocks[at].runs = runs
        self._blocks[at].count = 0
        self._block_count += 1
        return 0

    cdef int _insert_run(self, Py_ssize_t b, Py_ssize_t r, Run run) except -1 nogil:
        """Insert ``run`` before position ``r`` of block ``b``, splitting a full block."""
        cdef Block *block
        cdef Block *upper
        cdef Py_ssize_t half = _BLOCK // 2, slot
        if self._block_count == 0:
            self._insert_block(0)
            b = 0
            r = 0
        block = &self._blocks[b]
        if block.count == _BLOCK:
            self._insert_block(b + 1)
            block = &self._blocks[b]
            upper = &self._blocks[b + 1]
            memcpy(upper.runs, block.runs + half, (_BLOCK - half) * sizeof(Run))
            upper.count = _BLOCK - half
            block.count = half
            for slot in range(half, _BLOCK):
                block.runs[slot].first = _EMPTY
            self._block_firsts[b + 1] = upper.runs[0].first
            if r > half:
                b += 1
                r -= half
                block = upper
        memmove(block.runs + r + 1, block.runs + r, (block.count - r) * sizeof(Run))
        block.runs[r] = run
        block.count += 1
        if r == 0:
            self._block_firsts[b] = run.first
        self._run_count += 1
        return 0

    cdef void _remove_run(self, Py_ssize_t b, Py_ssize_t r) noexcept nogil:
        """Drop the run at (b, r); the caller has taken or released its offset."""
        cdef Block *block = &self._blocks[b]
        memmove(block.runs + r, block.runs + r + 1, (block.count - r - 1) * sizeof(Run))
        block.count -= 1
        block.runs[block.count].first = _EMPTY
        self._run_count -= 1
        if block.count == 0:
            free(block.runs)
            memmove(self._blocks + b, self._blocks + b + 1, (self._block_count - b - 1) * sizeof(Block))
            memmove(
                self._block_firsts + b, self._block_firsts + b + 1,
                (self._block_count - b - 1) * sizeof(int64_t),
            )
            self._block_count -= 1
            self._block_firsts[self._block_count] = _EMPTY
        elif r == 0:
            self._block_firsts[b] = block.runs[0].first

    cdef void _set_committed(self, int64_t offset, PyObject *obj) noexcept nogil:
        """Make (offset, obj) the committed offset; takes ownership of ``obj``."""
        if obj == NULL:
            if not self._committed_is_native:
                with gil:
                    self._committed_object = None
            self._committed_native = offset
            self._committed_is_native = True
        else:
            with gil:
                self._committed_object = <object>obj
                Py_XDECREF(obj)
            self._committed_is_native = False

    cdef int _add(self, int64_t index, int64_t offset, PyObject *obj) except -1 nogil:
        """Record a not-done, valid index; takes ownership of ``obj``. 1 if the point advanced."""
        return self._add_range(index, index, offset, obj)

    cdef int _add_range(self, int64_t first, int64_t last, int64_t offset, PyObject *obj) except -1 nogil:
        """Record ``first..last``, none of them done; ``offset``/``obj`` belong to ``last``.

        Takes ownership of ``obj``. Returns 1 if the committed point advanced.
        """
        cdef Py_ssize_t b = 0, r = -1
        cdef bint has_left
        if first == self._next:
            self._advance(last, offset, obj)
            return 1
        # Apart: C leaves the order of argument evaluation open, and b, r come from the search.
        has_left = self._locate(first, &b, &r)
        self._add_located(first, last, offset, obj, has_left, b, r)
        return 0

    cdef void _advance(self, int64_t last, int64_t offset, PyObject *obj) noexcept nogil:
        """The indexes from the committed point to ``last`` are done: move the point past them,
        and past the run that then starts there, if any. Takes ownership of ``obj``."""
        cdef Run *first_run
        self._next = last + 1
        self._set_committed(offset, obj)
        if self._window_active:
            self._take_window_run()
        if self._run_count > 0:
            first_run = &self._blocks[0].runs[0]
            if first_run.first == self._next:
                self._next = first_run.last + 1
                self._pending_count -= first_run.last - first_run.first + 1
                self._set_committed(first_run.offset, first_run.obj)
                self._remove_run(0, 0)
        if self._window_active:
            self._raise_window_limit()

    cdef int _add_located(
        self, int64_t first, int64_t last, int64_t offset, PyObject *obj,
        bint has_left, Py_ssize_t b, Py_ssize_t r,
    ) except -1 nogil:
        """Record ``first..last`` beyond the committed point, none of them done, where
        :meth:`_locate` put it: after the run at (``b``, ``r``) if ``has_left``, else first.
        Takes ownership of ``obj``."""
        cdef Py_ssize_t sb, sr
        cdef bint left, right
        cdef Run *pred = NULL
        cdef Run *succ = NULL
        cdef Run fresh
        self._pending_count += last - first + 1
        if has_left:
            pred = &self._blocks[b].runs[r]
            sb = b
            sr = r + 1
            if sr == self._blocks[sb].count:
                sb += 1
                sr = 0
        else:
            sb = 0
            sr = 0
        if sb < self._block_count:
            succ = &self._blocks[sb].runs[sr]
        left = pred != NULL and pred.last == first - 1
        right = succ != NULL and succ.first == last + 1
        if left and right:
            _release(pred.obj)
            pred.last = succ.last
            pred.offset = succ.offset
            pred.obj = succ.obj
            _release(obj)
            self._remove_run(sb, sr)
        elif left:
            _release(pred.obj)
            pred.last = last
            pred.offset = offset
            pred.obj = obj
        elif right:
            succ.first = first
            if sr == 0:
                self._block_firsts[sb] = first
            _release(obj)
        else:
            fresh.first = first
            fresh.last = last
            fresh.offset = offset
            fresh.obj = obj
            if has_left:
                self._insert_run(b, r + 1, fresh)
            else:
                self._insert_run(0, 0, fresh)
        return 0

    cdef int _add_object(self, int64_t index, object offset) except -1:
        cdef int64_t native = 0
        self._flush_window()
        if _native_offset(offset, &native):
            return self._add(index, native, NULL)
        Py_INCREF(offset)
        return self._add(index, 0, <PyObject *>offset)

    # ------------------------------------------------------------ what it knows

    @property
    def start_index(self):
        """The first index of the stream."""
        return self._start

    @property
    def next_index(self):
        """The first index that is not done: the committed point plus one."""
        return self._next

    @property
    def committed_offset(self):
        """The offset of the committed point, or ``None`` before the first commit."""
        return self._committed()

    cdef inline object _committed(self):
        return self._committed_native if self._committed_is_native else self._committed_object

    @property
    def pending_runs(self):
        """How many runs of done indexes lie beyond the committed point."""
        return self._total_runs()

    @property
    def pending_count(self):
        """How many done indexes lie beyond the committed point."""
        return self._pending_count

    @property
    def duplicates(self):
        """How many duplicate acks were counted and skipped (``on_duplicate="ignore"``)."""
        return self._duplicates

    @property
    def on_duplicate(self):
        """``"error"`` or ``"ignore"``."""
        return "ignore" if self._ignore_duplicates else "error"

    @property
    def max_runs(self):
        """The bound on pending runs, or ``None``."""
        return self._max_runs

    def runs(self):
        """The done runs beyond the committed point as ``(first, last)``, ascending.

        >>> acker = OffsetAcker()
        >>> acker.ack_many([2, 3, 5])
        >>> acker.runs()
        [(2, 3), (5, 5)]
        """
        cdef Py_ssize_t b, r
        self._flush_window()
        return [
            (self._blocks[b].runs[r].first, self._blocks[b].runs[r].last)
            for b in range(self._block_count) for r in range(self._blocks[b].count)
        ]

    def runs_with_offsets(self):
        """The done runs as ``(first, last, offset of last)``, ascending.

        >>> acker = OffsetAcker()
        >>> acker.ack(2, "c")
        >>> acker.runs_with_offsets()
        [(2, 2, 'c')]
        """
        cdef Py_ssize_t b, r
        cdef Run *run
        result = []
        self._flush_window()
        for b in range(self._block_count):
            for r in range(self._blocks[b].count):
                run = &self._blocks[b].runs[r]
                result.append(
                    (run.first, run.last, run.offset if run.obj == NULL else <object>run.obj)
                )
        return result

    cdef int64_t _check_index(self, object index) except? -1:
        cdef int overflow = 0
        cdef long long value_c
        if PyLong_CheckExact(index):
            value_c = PyLong_AsLongLongAndOverflow(index, &overflow)
            if not overflow and self._start <= value_c <= _INDEX_MAX:
                return value_c
        if isinstance(index, bool):
            raise SegackTypeError("index must be an integer, not bool")
        try:
            value = index.__index__()
        except AttributeError:
            raise SegackTypeError(f"index must be an integer, not {type(index).__name__}") from None
        if value < 0:
            raise SegackValueError(f"index {value} is negative")
        if value < self._start:
            raise SegackValueError(f"index {value} is below the start index {self._start}")
        if value > INDEX_MAX:
            raise SegackValueError(f"index {value} is larger than {INDEX_MAX}")
        return value

    def __sizeof__(self):
        """Bytes held: the object, its block index, every block's run array and the window."""
        return (
            object.__sizeof__(self)
            + self._block_capacity * (sizeof(Block) + sizeof(int64_t))
            + self._block_count * _BLOCK * sizeof(Run)
            + (0 if self._window_bits == NULL else _WINDOW_BYTES)
        )

    def is_done(self, index):
        """Whether ``index`` is done. Errors as for :meth:`ack`.

        >>> acker = OffsetAcker()
        >>> acker.ack(2)
        >>> acker.is_done(2), acker.is_done(0)
        (True, False)
        """
        return self.is_done_c(self._check_index(index))

    def _check(self):
        """Assert the invariants (a debugging aid, as ``SortedList._check``); changes nothing.

        Those of the spec's ``_check``, plus the layout's: every block holds
        1 to ``BLOCK_SIZE`` runs and unused slots hold the empty mark, the block
        index names each block's first run, the counters agree with the runs and
        the window, and the window's set bits lie between the committed point
        and its limit, which never passes the first run. Only the last index of
        a group of set bits may own an offset object.
        """
        cdef Py_ssize_t b, r, runs = 0, groups = 0
        cdef int64_t after = self._next, pending = 0, index, slot
        cdef Run *run
        assert self._start <= self._next <= _INDEX_MAX + 1, (self._start, self._next)
        assert self._duplicates >= 0, self._duplicates
        assert 0 <= self._block_count <= self._block_capacity, (self._block_count, self._block_capacity)
        for b in range(self._block_capacity):
            if b >= self._block_count:
                assert self._block_firsts[b] == _EMPTY, ("unused block index slot", b)
                continue
            assert 1 <= self._blocks[b].count <= _BLOCK, ("block size", b, self._blocks[b].count)
            assert self._block_firsts[b] == self._blocks[b].runs[0].first, ("block index", b)
            for r in range(_BLOCK):
                run = &self._blocks[b].runs[r]
                if r >= self._blocks[b].count:
                    assert run.first == _EMPTY, ("unused run slot", b, r)
                    continue
                assert after < run.first <= run.last <= _INDEX_MAX, (after, run.first, run.last)
                after = run.last + 1
                runs += 1
                pending += run.last - run.first + 1
        assert runs == self._run_count, (runs, self._run_count)
        if self._window_active:
            assert self._next <= self._window_limit <= self._first_run_start(), (
                self._next, self._window_limit, self._first_run_start())
            assert self._window_limit - self._next <= _WINDOW, (self._next, self._window_limit)
            assert not self._window_has(self._next) or self._next == self._window_limit, (
                "the committed point is done", self._next)
            for index in range(self._next, self._window_limit):
                slot = index & (_WINDOW - 1)
                if not self._window_has(index):
                    continue
                pending += 1
                if index + 1 == self._window_limit or not self._window_has(index + 1):
                    groups += 1
                else:
                    assert self._window_objs[slot] == NULL, ("an offset object inside a group", index)
            for index in range(self._window_limit, self._next + _WINDOW):
                assert not self._window_has(index), ("a set bit past the window's limit", index)
        elif self._window_bits != NULL:
            for slot in range(_WINDOW):
                assert not self._window_has(slot), ("a set bit in a closed window", slot)
                assert self._window_objs[slot] == NULL, ("an offset object in a closed window", slot)
        assert groups == self._window_runs, (groups, self._window_runs)
        assert pending == self._pending_count, (pending, self._pending_count)

    # ------------------------------------------------------------ acking

    cdef int _run_change(self, int64_t index) noexcept nogil:
        cdef bint touches_left = index == self._next or self.is_done_c(index - 1)
        cdef bint touches_right = self.is_done_c(index + 1)
        return 1 - <int>touches_left - <int>touches_right

    cdef int _check_room(self, Py_ssize_t runs_after) except -1:
        if self._max_runs is not None and runs_after > self._max_runs and runs_after > self._total_runs():
            raise AckerFullError(runs_after, self._max_runs)
        return 0

    def ack(self, index, offset=None):
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
        # One search answers both whether the index is done and where it goes: on the
        # per-call path every check the batch path amortizes is paid in full.
        cdef int64_t value, native
        cdef int overflow = 0
        cdef Py_ssize_t b = 0, r = -1
        cdef bint exact = PyLong_CheckExact(index), has_left = False
        cdef PyObject *obj = NULL
        if exact:
            value = PyLong_AsLongLongAndOverflow(index, &overflow)
            if overflow or value < self._start or value > _INDEX_MAX:
                value = self._check_index(index)
        else:
            value = self._check_index(index)
        if value > self._next:
            if not self._window_active:
                self._open_window()
            if value < self._window_limit:
                if self._window_has(value):
                    return self._duplicate(value)
            else:
                has_left = self._locate(value, &b, &r)
                if has_left and self._blocks[b].runs[r].last >= value:
                    return self._duplicate(value)
            if self._max_runs is not None:
                self._check_room(self._total_runs() + self._run_change(value))
        elif value < self._next:
            return self._duplicate(value)
        native = value
        if offset is not None and not _native_offset(offset, &native):
            Py_INCREF(offset)
            obj = <PyObject *>offset
        if value > self._next:
            if value < self._window_limit:
                self._window_add(value, native, obj)
            else:
                self._add_located(value, value, native, obj, has_left, b, r)
            return None
        self._advance(value, native, obj)
        if exact and offset is None and self._next == value + 1:
            # The committed offset is the very int the caller passed: no new object.
            return index
        return self._committed()

    cdef _duplicate(self, int64_t index):
        if self._ignore_duplicates:
            self._duplicates += 1
            return None
        raise DuplicateAckError(index)

    def ack_many(self, indexes, offsets=None):
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
        cdef Py_ssize_t n = len(array)
        native_offsets = None
        offset_list = None
        if offsets is not None:
            if isinstance(offsets, np.ndarray) and offsets.dtype.kind in "iu" and np.can_cast(
                offsets.dtype, np.int64
            ):
                native_offsets = np.ascontiguousarray(offsets, dtype=np.int64)
                if native_offsets.ndim != 1 or len(native_offsets) != n:
                    raise SegackValueError(f"{native_offsets.size} offsets for {n} indexes")
            else:
                offset_list = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
                if len(offset_list) != n:
                    raise SegackValueError(f"{len(offset_list)} offsets for {n} indexes")
        if n == 0:
            return None
        self._flush_window()
        array = np.ascontiguousarray(array)
        before = self._next
        if offset_list is None and self._ack_dense(array, native_offsets):
            return self._committed() if self._next > before else None
        self._validate_batch(array)
        if self._max_runs is not None:
            self._check_room(self._runs_after_batch(array))
        if offset_list is not None:
            self._apply_objects(array, offset_list)
        else:
            self._apply_native(array, array if native_offsets is None else native_offsets)
        return self._committed() if self._next > before else None

    cdef bint _ack_dense(self, const int64_t[::1] indexes, const int64_t[::1] offsets) except -1:
        """The batch path: mark the batch in a byte map, read its runs off the map, add them
        at once. Returns False, having changed nothing, when the batch is too sparse for a
        map, holds an index twice, or touches a done index: the general path then decides.
        ``offsets`` may be ``None``: each index is then its own offset."""
        cdef Py_ssize_t i, n = indexes.shape[0], count = 0, position
        cdef int64_t low, high, first, span
        cdef uint8_t *marks = NULL
        cdef int64_t *ends = NULL
        cdef Run *batch = NULL
        cdef bint usable = True, own_offsets = offsets is None
        cdef Py_ssize_t runs_after
        _min_max(&indexes[0], n, &low, &high)
        if low < self._start or high > _INDEX_MAX or high - low > 4 * n + 4096:
            return False
        span = high - low + 1
        # Zero padding past the end lets the run scan read whole words without a bound check.
        marks = <uint8_t *>calloc(span + 16, 1)
        if not own_offsets:
            ends = <int64_t *>malloc(span * sizeof(int64_t))
        batch = <Run *>malloc(n * sizeof(Run))
        if marks == NULL or (ends == NULL and not own_offsets) or batch == NULL:
            free(marks)
            free(ends)
            free(batch)
            raise MemoryError()
        try:
            with nogil:
                for i in range(n):
                    position = indexes[i] - low
                    if marks[position]:
                        usable = False
                        break
                    marks[position] = 1
                    if not own_offsets:
                        ends[position] = offsets[i]
                if usable:
                    position = 0
                    while position < span:
                        if _word(marks + position) == 0:
                            position += 8
                            continue
                        if not marks[position]:
                            position += 1
                            continue
                        first = position
                        while _word(marks + position + 1) == _ALL_MARKED:
                            position += 8
                        while marks[position + 1]:
                            position += 1
                        batch[count].first = low + first
                        batch[count].last = low + position
                        batch[count].offset = low + position if own_offsets else ends[position]
                        batch[count].obj = NULL
                        count += 1
                        position += 1
                    usable = not self._batch_overlaps_done(batch, count)
            if not usable:
                return False
            if self._max_runs is not None:
                runs_after = self._run_count
                for i in range(count):
                    runs_after += 1
                    if batch[i].first == self._next or self.is_done_c(batch[i].first - 1):
                        runs_after -= 1
                    if self.is_done_c(batch[i].last + 1):
                        runs_after -= 1
                self._check_room(runs_after)
            with nogil:
                if count > 64 and count * 8 > self._run_count:
                    self._rebuild_with(batch, count)
                else:
                    for i in range(count):
                        self._add_range(batch[i].first, batch[i].last, batch[i].offset, NULL)
            return True
        finally:
            free(marks)
            free(ends)
            free(batch)

    cdef bint _batch_overlaps_done(self, const Run *batch, Py_ssize_t count) noexcept nogil:
        """Whether any index of the sorted, disjoint ``batch`` runs is done.

        A batch about as large as the structure is checked in one walk through both, a
        small one by a search per run."""
        cdef Py_ssize_t b = 0, r = 0, k
        cdef const Run *run
        if count == 0:
            return False
        if batch[0].first < self._next:
            return True
        if count * 8 <= self._run_count:
            for k in range(count):
                if self._overlaps_done(batch[k].first, batch[k].last):
                    return True
            return False
        if not self._locate(batch[0].first, &b, &r):
            b = 0
            r = 0
        k = 0
        while b < self._block_count and k < count:
            run = &self._blocks[b].runs[r]
            if run.last < batch[k].first:
                r += 1
                if r == self._blocks[b].count:
                    b += 1
                    r = 0
            elif batch[k].last < run.first:
                k += 1
            else:
                return True
        return False

    cdef bint _overlaps_done(self, int64_t first, int64_t last) noexcept nogil:
        """Whether any index of ``first..last`` is done."""
        cdef Py_ssize_t b, r
        if first < self._next:
            return True
        if not self._locate(last, &b, &r):
            return False
        return self._blocks[b].runs[r].last >= first

    cdef int _rebuild_with(self, Run *batch, Py_ssize_t count) except -1 nogil:
        """Merge sorted, not-done ``batch`` runs that do not touch each other into the
        structure in one linear pass. The caller keeps ``batch``."""
        cdef Py_ssize_t produced = 0, b = 0, r = 0, k = 0, at = 0
        cdef Run *merged = batch
        cdef Run current
        cdef bint take_batch
        cdef Block *old_blocks = self._blocks
        cdef Py_ssize_t old_count = self._block_count
        if old_count == 0:
            # Nothing to merge with: the batch goes into blocks as it is, without a copy of
            # it that would be fresh memory to fault in.
            produced = count
            for k in range(count):
                self._pending_count += batch[k].last - batch[k].first + 1
        else:
            merged = <Run *>malloc((self._run_count + count + 1) * sizeof(Run))
            if merged == NULL:
                with gil:
                    raise MemoryError()
        while b < old_count or (k < count and merged != batch):
            if b >= old_count:
                take_batch = True
            elif k >= count:
                take_batch = False
            else:
                take_batch = batch[k].first < old_blocks[b].runs[r].first
            if take_batch:
                current = batch[k]
                self._pending_count += current.last - current.first + 1
                k += 1
            else:
                current = old_blocks[b].runs[r]
                r += 1
                if r == old_blocks[b].count:
                    free(old_blocks[b].runs)
                    b += 1
                    r = 0
            if produced > 0 and merged[produced - 1].last + 1 == current.first:
                _release(merged[produced - 1].obj)
                merged[produced - 1].last = current.last
                merged[produced - 1].offset = current.offset
                merged[produced - 1].obj = current.obj
            else:
                merged[produced] = current
                produced += 1
        free(old_blocks)
        free(self._block_firsts)
        self._blocks = NULL
        self._block_firsts = NULL
        self._block_count = 0
        self._block_capacity = 0
        self._run_count = 0
        if produced > 0 and merged[0].first == self._next:
            self._next = merged[0].last + 1
            self._pending_count -= merged[0].last - merged[0].first + 1
            self._set_committed(merged[0].offset, merged[0].obj)
            at = 1
        try:
            self._install_runs(merged + at, produced - at)
        finally:
            if merged != batch:
                free(merged)
        return 0

    cdef int _install_runs(self, const Run *runs, Py_ssize_t count) except -1 nogil:
        """Fill the empty structure with ``count`` sorted runs that do not touch, taking over
        their objects. Blocks start 7/8 full, so the next inserts rarely split one."""
        cdef Py_ssize_t at = 0, chunk
        while at < count:
            chunk = min(count - at, (_BLOCK * 7) // 8)
            self._insert_block(self._block_count)
            memcpy(self._blocks[self._block_count - 1].runs, runs + at, chunk * sizeof(Run))
            self._blocks[self._block_count - 1].count = chunk
            self._block_firsts[self._block_count - 1] = runs[at].first
            self._run_count += chunk
            at += chunk
        return 0

    cdef _validate_batch(self, const int64_t[::1] indexes):
        """Raise the first error the equivalent ``ack`` calls would raise, if any."""
        cdef Py_ssize_t i, n = indexes.shape[0]
        cdef int64_t low = indexes[0], high = indexes[0], value
        cdef bint problem = False
        for i in range(n):
            value = indexes[i]
            low = min(low, value)
            high = max(high, value)
        if low < self._start or high > _INDEX_MAX:
            problem = True
        elif not self._ignore_duplicates:
            problem = self._has_duplicate(indexes, low, high)
        if problem:
            self._raise_first_error(indexes)

    cdef int _has_duplicate(self, const int64_t[::1] indexes, int64_t low, int64_t high) except -1:
        cdef Py_ssize_t i, n = indexes.shape[0]
        cdef uint8_t[::1] seen
        cdef bint found = False
        if high - low <= 8 * n + 65536:
            seen = np.zeros(high - low + 1, dtype=np.uint8)
            with nogil:
                for i in range(n):
                    if seen[indexes[i] - low] or self.is_done_c(indexes[i]):
                        found = True
                        break
                    seen[indexes[i] - low] = 1
            return found
        if len(np.unique(np.asarray(indexes))) != n:
            return True
        with nogil:
            for i in range(n):
                if self.is_done_c(indexes[i]):
                    found = True
                    break
        return found

    cdef _raise_first_error(self, const int64_t[::1] indexes):
        cdef Py_ssize_t i
        seen = set()
        for i in range(indexes.shape[0]):
            value = self._check_index(indexes[i])
            if not self._ignore_duplicates and (value in seen or self.is_done_c(value)):
                raise DuplicateAckError(value)
            seen.add(value)

    cdef Py_ssize_t _runs_after_batch(self, const int64_t[::1] indexes) except -1:
        """The pending runs after acking these valid indexes: each maximal group of new,
        consecutive indexes adds a run, less one for each done neighbour it touches."""
        cdef int64_t[::1] fresh = np.unique(np.asarray(indexes))
        cdef Py_ssize_t i = 0, n = fresh.shape[0], runs = self._run_count
        cdef int64_t first, last
        with nogil:
            while i < n:
                if self.is_done_c(fresh[i]):
                    i += 1
                    continue
                first = fresh[i]
                while i + 1 < n and fresh[i + 1] == fresh[i] + 1 and not self.is_done_c(fresh[i + 1]):
                    i += 1
                last = fresh[i]
                runs += 1
                if first == self._next or self.is_done_c(first - 1):
                    runs -= 1
                if self.is_done_c(last + 1):
                    runs -= 1
                i += 1
        return runs

    cdef _apply_native(self, const int64_t[::1] indexes, const int64_t[::1] offsets):
        cdef Py_ssize_t i, n = indexes.shape[0]
        cdef int64_t skipped = 0
        with nogil:
            for i in range(n):
                if self.is_done_c(indexes[i]):
                    skipped += 1
                else:
                    self._add(indexes[i], offsets[i], NULL)
        self._duplicates += skipped

    cdef _apply_objects(self, const int64_t[::1] indexes, list offsets):
        cdef Py_ssize_t i
        for i in range(indexes.shape[0]):
            if self.is_done_c(indexes[i]):
                self._duplicates += 1
            elif offsets[i] is None:
                self._add(indexes[i], indexes[i], NULL)
            else:
                self._add_object(indexes[i], offsets[i])

    # ------------------------------------------------------------ merging

    cdef Run *_done_runs(self, Py_ssize_t *count) except NULL:
        """Every done index as runs: the committed prefix, if any, then the pending runs.
        A new array the caller frees; its objects are borrowed."""
        cdef Py_ssize_t b, at = 0
        cdef Run *runs = <Run *>malloc((self._run_count + 1) * sizeof(Run))
        if runs == NULL:
            raise MemoryError()
        if self._next > self._start:
            runs[0].first = self._start
            runs[0].last = self._next - 1
            runs[0].offset = self._committed_native
            runs[0].obj = NULL if self._committed_is_native else <PyObject *>self._committed_object
            at = 1
        for b in range(self._block_count):
            memcpy(runs + at, self._blocks[b].runs, self._blocks[b].count * sizeof(Run))
            at += self._blocks[b].count
        count[0] = at
        return runs

    def merge(self, other):
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
        cdef OffsetAcker theirs = <OffsetAcker>other
        cdef Run *mine_runs = NULL
        cdef Run *their_runs = NULL
        cdef Run *merged = NULL
        cdef Py_ssize_t mine_count = 0, their_count = 0, produced = 0, i = 0, j = 0, at = 0, k
        cdef Py_ssize_t conflict, mine_conflict = 0
        cdef int64_t before = self._next
        cdef Run current
        self._flush_window()
        theirs._flush_window()
        try:
            mine_runs = self._done_runs(&mine_count)
            their_runs = theirs._done_runs(&their_count)
            if theirs._start < self._start:
                raise SegackValueError(_shared.MERGE_EARLIER.format(theirs=theirs._start, mine=self._start))
            conflict = _first_disagreement(mine_runs, mine_count, their_runs, their_count, &mine_conflict)
            if conflict >= 0:
                raise SegackValueError(_shared.MERGE_CONFLICT.format(
                    index=their_runs[conflict].last, mine=_offset_object(&mine_runs[mine_conflict]),
                    theirs=_offset_object(&their_runs[conflict])))
            merged = <Run *>malloc((mine_count + their_count + 1) * sizeof(Run))
            if merged == NULL:
                raise MemoryError()
            # The union in one pass; on equal firsts this acker's run comes first, and a run
            # that reaches further brings the offset of its own last index.
            while i < mine_count or j < their_count:
                if j >= their_count or (i < mine_count and mine_runs[i].first <= their_runs[j].first):
                    current = mine_runs[i]
                    i += 1
                else:
                    current = their_runs[j]
                    j += 1
                if produced > 0 and current.first <= merged[produced - 1].last + 1:
                    if current.last > merged[produced - 1].last:
                        merged[produced - 1].last = current.last
                        merged[produced - 1].offset = current.offset
                        merged[produced - 1].obj = current.obj
                else:
                    merged[produced] = current
                    produced += 1
            if produced > 0 and merged[0].first == self._start:
                at = 1
            self._check_room(produced - at)
            for k in range(produced):
                Py_XINCREF(merged[k].obj)
            self._clear()
            self._duplicates += theirs._duplicates
            if at == 1:
                self._next = merged[0].last + 1
                self._set_committed(merged[0].offset, merged[0].obj)
            for k in range(at, produced):
                self._pending_count += merged[k].last - merged[k].first + 1
            self._install_runs(merged + at, produced - at)
        finally:
            free(mine_runs)
            free(their_runs)
            free(merged)
        return self._committed() if self._next > before else None

    # ------------------------------------------------------------ snapshots

    def snapshot(self):
        """The acker as bytes (see :mod:`segack.specs.snapshot`).

        An offset that is neither int nor str is a ``TypeError``; an int offset of
        2**128 or more in magnitude is a ``ValueError``. Nothing changes either way.

        >>> acker = OffsetAcker()
        >>> acker.ack_many([0, 1, 5])
        1
        >>> OffsetAcker.restore(acker.snapshot()).runs()
        [(5, 5)]
        """
        cdef _Buffer out
        cdef Py_ssize_t b, r
        cdef const Run *run
        cdef int64_t previous_end = self._next - 1
        self._flush_window()
        # Offsets are checked before anything is written: a failing snapshot changes nothing.
        head = (
            _uvarint_bytes(self._start) + _uvarint_bytes(self._next - self._start)
            + _offset_bytes(self._committed(), self._next - 1) + _uvarint_bytes(self._duplicates)
            + bytes((1 if self._ignore_duplicates else 0,))
            + _uvarint_bytes(0 if self._max_runs is None else self._max_runs + 1)
            + _uvarint_bytes(self._run_count)
        )
        out.data = NULL
        out.size = 0
        out.capacity = 0
        try:
            _reserve(&out, len(head) + 4 * self._run_count + 3 * _VARINT_MAX + 1)
            _put_bytes(&out, head)
            for b in range(self._block_count):
                for r in range(self._blocks[b].count):
                    run = &self._blocks[b].runs[r]
                    _reserve(&out, 3 * _VARINT_MAX + 1)
                    _put_uvarint(&out, <uint64_t>(run.first - previous_end - 2))
                    _put_uvarint(&out, <uint64_t>(run.last - run.first))
                    if run.obj != NULL:
                        _put_bytes(&out, _offset_bytes(<object>run.obj, run.last))
                    elif run.offset == run.last:
                        _put_byte(&out, _TAG_SAME_AS_INDEX)
                    else:
                        _put_byte(&out, _TAG_INT)
                        _put_uvarint(&out, _zigzag(run.offset))
                    previous_end = run.last
            body = out.data[:out.size]
        finally:
            free(out.data)
        token = SNAPSHOT_HEADER.pack(_MAGIC, _VERSION, _HEADER_SIZE + len(body) + _CHECKSUM_SIZE) + body
        return token + SNAPSHOT_CHECKSUM.pack(zlib.crc32(token))

    @classmethod
    def restore(cls, data):
        """The acker a snapshot holds; a damaged, truncated or foreign token is a ``ValueError``,
        and so is one holding an index past ``INDEX_MAX``. Anything but bytes is a ``TypeError``.

        >>> token = OffsetAcker(start_index=10).snapshot()
        >>> OffsetAcker.restore(token).next_index
        10
        """
        cdef _Parsed parsed
        cdef OffsetAcker acker
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        if not isinstance(data, bytes) or not _parse_token(data, &parsed):
            # What the fast reader declines (every damaged token, numbers past 64 bits) is read
            # again with Python ints, which finds the exact error or the big offsets.
            state = _careful_state(data)
            acker = cls(state.start_index, on_duplicate=state.on_duplicate, max_runs=state.max_runs)
            acker._load(state)
            return acker
        try:
            acker = cls(
                parsed.start, on_duplicate=DUPLICATE_POLICIES[parsed.policy],
                max_runs=None if parsed.bound == 0 else parsed.bound - 1,
            )
            acker._next = parsed.next_index
            acker._duplicates = parsed.duplicates
            if parsed.next_index > parsed.start:
                acker._set_committed(parsed.committed.offset, parsed.committed.obj)
                parsed.committed.obj = NULL
            acker._pending_count = parsed.pending_count
            acker._install_runs(parsed.runs, parsed.count)
            parsed.count = 0
        finally:
            _release_parsed(&parsed)
        return acker

    def _state(self):
        return AckerState(
            self._start, self._next, self.committed_offset, self._duplicates,
            self.on_duplicate, self._max_runs, self.runs_with_offsets(),
        )

    cdef _load(self, state):
        """Replace the done indexes with those of ``state`` (same start and settings)."""
        cdef Py_ssize_t k = 0, count = len(state.runs)
        cdef Run *runs = <Run *>malloc((count + 1) * sizeof(Run))
        if runs == NULL:
            raise MemoryError()
        try:
            for first, last, offset in state.runs:
                runs[k].first = first
                runs[k].last = last
                runs[k].obj = NULL
                if not _native_offset(offset, &runs[k].offset):
                    runs[k].offset = 0
                    runs[k].obj = <PyObject *>offset
                k += 1
            for k in range(count):
                Py_XINCREF(runs[k].obj)
            self._clear()
            self._next = state.next_index
            self._committed_is_native = False
            self._committed_object = None
            if state.committed_offset is not None:
                committed = state.committed_offset
                if _native_offset(committed, &self._committed_native):
                    self._committed_is_native = True
                else:
                    self._committed_object = committed
            self._duplicates = state.duplicates
            for k in range(count):
                self._pending_count += runs[k].last - runs[k].first + 1
            self._install_runs(runs, count)
        finally:
            free(runs)

    def copy(self):
        """An independent acker with the same state.

        >>> acker = OffsetAcker()
        >>> acker.ack(2)
        >>> twin = acker.copy()
        >>> twin.ack(0), acker.committed_offset
        (0, None)
        """
        cdef OffsetAcker acker = type(self)(
            self._start, on_duplicate=self.on_duplicate, max_runs=self._max_runs
        )
        acker._load(self._state())
        return acker

    def __richcmp__(self, other, int op):
        if op not in (2, 3) or not isinstance(other, OffsetAcker):
            return NotImplemented
        equal = self._state() == (<OffsetAcker>other)._state()
        return equal if op == 2 else not equal

    __hash__ = None

    def __reduce__(self):
        return (type(self).restore, (self.snapshot(),))

    def __repr__(self):
        return (
            f"OffsetAcker(next_index={self._next}, committed_offset={self.committed_offset!r}, "
            f"pending_runs={self._total_runs()}, pending_count={self._pending_count})"
        )
