# cython: language_level=3
"""C-level declarations of the offset acker, for other Cython code to cimport."""

from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint64_t


cdef struct Run:
    int64_t first
    int64_t last
    int64_t offset      # the offset of ``last`` when ``obj`` is NULL
    PyObject *obj       # an owned reference to a non-native offset, or NULL


cdef struct Block:
    Run *runs
    Py_ssize_t count


cdef class OffsetAcker:
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
    # index of each group of set bits, an owned offset object (see acker.pyx).
    cdef uint64_t *_window_bits
    cdef int64_t *_window_offsets
    cdef PyObject **_window_objs
    cdef bint _window_active
    cdef int64_t _window_limit
    cdef Py_ssize_t _window_runs

    cdef bint is_done_c(self, int64_t index) noexcept nogil
    cdef void _clear(self) noexcept
    cdef void _clear_window(self) noexcept
    cdef bint _window_has(self, int64_t index) noexcept nogil
    cdef int64_t _first_run_start(self) noexcept nogil
    cdef void _raise_window_limit(self) noexcept nogil
    cdef int _open_window(self) except -1
    cdef bint _joined_to_first_run(self) noexcept nogil
    cdef Py_ssize_t _total_runs(self) noexcept nogil
    cdef void _window_add(self, int64_t index, int64_t offset, PyObject *obj) noexcept nogil
    cdef void _take_window_run(self) noexcept nogil
    cdef int _flush_window(self) except -1 nogil
    cdef bint _locate(self, int64_t index, Py_ssize_t *block, Py_ssize_t *position) noexcept nogil
    cdef int _insert_block(self, Py_ssize_t at) except -1 nogil
    cdef int _insert_run(self, Py_ssize_t b, Py_ssize_t r, Run run) except -1 nogil
    cdef void _remove_run(self, Py_ssize_t b, Py_ssize_t r) noexcept nogil
    cdef void _set_committed(self, int64_t offset, PyObject *obj) noexcept nogil
    cdef int _add(self, int64_t index, int64_t offset, PyObject *obj) except -1 nogil
    cdef int _add_range(self, int64_t first, int64_t last, int64_t offset, PyObject *obj) except -1 nogil
    cdef void _advance(self, int64_t last, int64_t offset, PyObject *obj) noexcept nogil
    cdef int _add_located(
        self, int64_t first, int64_t last, int64_t offset, PyObject *obj,
        bint has_left, Py_ssize_t b, Py_ssize_t r,
    ) except -1 nogil
    cdef _duplicate(self, int64_t index)
    cdef bint _ack_dense(self, const int64_t[::1] indexes, const int64_t[::1] offsets) except -1
    cdef bint _batch_overlaps_done(self, const Run *batch, Py_ssize_t count) noexcept nogil
    cdef bint _overlaps_done(self, int64_t first, int64_t last) noexcept nogil
    cdef int _rebuild_with(self, Run *batch, Py_ssize_t count) except -1 nogil
    cdef int _install_runs(self, const Run *runs, Py_ssize_t count) except -1 nogil
    cdef Run *_done_runs(self, Py_ssize_t *count) except NULL
    cdef int64_t _check_index(self, object index) except? -1
    cdef object _committed(self)
    cdef int _run_change(self, int64_t index) noexcept nogil
    cdef int _check_room(self, Py_ssize_t runs_after) except -1
    cdef _validate_batch(self, const int64_t[::1] indexes)
    cdef int _has_duplicate(self, const int64_t[::1] indexes, int64_t low, int64_t high) except -1
    cdef _raise_first_error(self, const int64_t[::1] indexes)
    cdef Py_ssize_t _runs_after_batch(self, const int64_t[::1] indexes) except -1
    cdef _apply_native(self, const int64_t[::1] indexes, const int64_t[::1] offsets)
    cdef _apply_objects(self, const int64_t[::1] indexes, list offsets)
    cdef _load(self, state)
    cdef int add_object_c(self, int64_t index, object offset) except -1
