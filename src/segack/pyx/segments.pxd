# cython: language_level=3
"""C-level declarations of the segment kernel, for other Cython code to cimport."""

from libc.stdint cimport int32_t, uint32_t


cdef class Segment:
    cdef uint32_t _segment_id
    cdef uint32_t _mask

    cdef int _check_can_split(self) except -1


cdef class SegmentSet:
    cdef tuple _members
    cdef uint32_t *_ids
    cdef uint32_t *_masks
    cdef int32_t *_table
    cdef int32_t *_deep_order
    cdef uint32_t _table_mask
    cdef Py_ssize_t _count

    cdef _build_lookup(self)
    cdef void _free_lookup(self) noexcept
    cdef int32_t owner_index_c(self, uint32_t hash_value) noexcept nogil


cdef inline bint segment_matches(uint32_t segment_id, uint32_t mask, uint32_t hash_value) noexcept nogil:
    return mask == 0 or (hash_value & mask) == segment_id
