# cython: language_level=3
"""C-level hash functions, for other Cython code to cimport."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t


cdef int32_t java_hash_long_c(int64_t value) noexcept nogil
cdef int32_t java_hash_utf8_c(const uint8_t *data, Py_ssize_t length) noexcept nogil
cdef int32_t spark_hash_bytes_c(const uint8_t *data, Py_ssize_t length, uint32_t seed) noexcept nogil
cdef int32_t spark_hash_int_c(int32_t value, uint32_t seed) noexcept nogil
cdef int32_t spark_hash_long_c(int64_t value, uint32_t seed) noexcept nogil
