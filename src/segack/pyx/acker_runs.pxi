# The run store's helpers: searches over padded blocks, offsets, and comparing two run lists.
# Part of acker.pyx (one compilation unit, so these still inline into the hot paths).

cdef inline Py_ssize_t _last_at_or_below(
    const int64_t *values, Py_ssize_t stride, Py_ssize_t slots, int64_t index
) noexcept nogil:
    """The position of the last of ``slots`` ascending values, ``stride`` int64s apart, that
    is <= ``index``, or -1. ``slots`` is a power of two, padded with ``_EMPTY``.

    Branch-free halving: the comparison feeds a conditional move, so an unpredictable
    order of acks costs no mispredicted branches, and a constant ``slots`` unrolls."""
    cdef Py_ssize_t base = 0, step = slots >> 1, i, found
    if values[0] > index:
        return -1
    while step >= 8:
        base = base + step if values[(base + step) * stride] <= index else base
        step >>= 1
    found = base
    for i in range(1, min(slots, 8)):
        found += values[(base + i) * stride] <= index
    return found


cdef inline void _release(PyObject *obj) noexcept nogil:
    if obj != NULL:
        with gil:
            Py_XDECREF(obj)


cdef inline uint64_t _word(const uint8_t *bytes) noexcept nogil:
    """Eight bytes of the batch's byte map as one word (an unaligned load)."""
    cdef uint64_t word
    memcpy(&word, bytes, 8)
    return word


cdef inline void _min_max(const int64_t *values, Py_ssize_t n, int64_t *low, int64_t *high) noexcept nogil:
    """The least and greatest of ``n`` > 0 values. Four independent lanes, so each comparison
    does not wait for the one before."""
    cdef int64_t low0 = values[0], low1 = values[0], low2 = values[0], low3 = values[0]
    cdef int64_t high0 = values[0], high1 = values[0], high2 = values[0], high3 = values[0]
    cdef Py_ssize_t i = 0
    while i + 4 <= n:
        low0 = min(low0, values[i])
        high0 = max(high0, values[i])
        low1 = min(low1, values[i + 1])
        high1 = max(high1, values[i + 1])
        low2 = min(low2, values[i + 2])
        high2 = max(high2, values[i + 2])
        low3 = min(low3, values[i + 3])
        high3 = max(high3, values[i + 3])
        i += 4
    while i < n:
        low0 = min(low0, values[i])
        high0 = max(high0, values[i])
        i += 1
    low[0] = min(min(low0, low1), min(low2, low3))
    high[0] = max(max(high0, high1), max(high2, high3))


cdef inline bint _native_offset(object offset, int64_t *native) noexcept:
    """Whether ``offset`` is an exact int that fits 64 bits; if so it is stored in ``native``."""
    cdef int overflow = 0
    cdef long long value
    if not PyLong_CheckExact(offset):
        return False
    value = PyLong_AsLongLongAndOverflow(offset, &overflow)
    if overflow:
        return False
    native[0] = value
    return True


cdef inline object _offset_object(const Run *run):
    """The offset of a run's last index, as a Python object."""
    return run.offset if run.obj == NULL else <object>run.obj


cdef Py_ssize_t _first_disagreement(
    const Run *mine, Py_ssize_t mine_count, const Run *theirs, Py_ssize_t their_count,
    Py_ssize_t *mine_at
) except -2:
    """Where two ascending run lists first end a run at one index with offsets that differ (the
    only indexes whose offsets both know): the position in ``theirs`` (and in ``mine`` through
    ``mine_at``), or -1."""
    cdef Py_ssize_t i = 0, j = 0
    while i < mine_count and j < their_count:
        if mine[i].last < theirs[j].last:
            i += 1
        elif mine[i].last > theirs[j].last:
            j += 1
        else:
            if mine[i].obj == NULL and theirs[j].obj == NULL:
                if mine[i].offset != theirs[j].offset:
                    mine_at[0] = i
                    return j
            elif PyObject_RichCompareBool(_offset_object(&mine[i]), _offset_object(&theirs[j]), Py_NE):
                mine_at[0] = i
                return j
            i += 1
            j += 1
    return -1
