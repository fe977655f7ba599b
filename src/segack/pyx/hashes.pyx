"""Sequencing hashes, compiled: Java's ``Objects.hashCode`` and Spark SQL's ``hash()``.

Mirrors :mod:`segack.specs.hashes` name for name, errors included. The ``_many``
forms read NumPy and Arrow buffers directly and loop in C without the GIL.
"""

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

import operator

import numpy as np

from segack._shared import SPARK_HASH_SEED
from segack.errors import SegackTypeError, SegackValueError

__all__ = [
    "java_hash",
    "java_hash_many",
    "spark_hash",
    "spark_hash_many",
    "SPARK_HASH_SEED",
    "SPARK_DTYPES",
]

SPARK_DTYPES = ("string", "int", "bigint")
# The seed as a C constant of this module, for the loops below.
cdef uint32_t _SEED = SPARK_HASH_SEED

cdef int64_t _INT32_MIN = -(1 << 31)
cdef int64_t _INT32_MAX = (1 << 31) - 1

ctypedef fused offset_t:
    int32_t
    int64_t


# ---------------------------------------------------------------- Java

cdef int32_t java_hash_long_c(int64_t value) noexcept nogil:
    cdef uint64_t bits = <uint64_t>value
    return <int32_t><uint32_t>(bits ^ (bits >> 32))


cdef inline uint32_t _java_step(uint32_t h, uint32_t code_point) noexcept nogil:
    """Fold one code point into a ``String.hashCode`` as its UTF-16 units."""
    if code_point < 0x10000:
        return 31 * h + code_point
    code_point -= 0x10000
    h = 31 * h + (0xD800 + (code_point >> 10))
    return 31 * h + (0xDC00 + (code_point & 0x3FF))


cdef int32_t java_hash_utf8_c(const uint8_t *data, Py_ssize_t length) noexcept nogil:
    """``String.hashCode`` of UTF-8 bytes (Arrow's string encoding)."""
    cdef uint32_t h = 0, code_point
    cdef Py_ssize_t i = 0
    cdef uint8_t lead
    while i < length:
        lead = data[i]
        if lead < 0x80:
            code_point = lead
            i += 1
        elif lead < 0xE0:
            code_point = ((lead & 0x1F) << 6) | (data[i + 1] & 0x3F)
            i += 2
        elif lead < 0xF0:
            code_point = ((lead & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
            i += 3
        else:
            code_point = (((lead & 0x07) << 18) | ((data[i + 1] & 0x3F) << 12)
                          | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F))
            i += 4
        h = _java_step(h, code_point)
    return <int32_t>h


cdef int32_t _java_hash_str(str text):
    cdef uint32_t h = 0
    cdef Py_UCS4 character
    for character in text:
        h = _java_step(h, character)
    return <int32_t>h


cdef int64_t _java_long(object value) except? -1:
    number = operator.index(value)
    if not -(1 << 63) <= number <= (1 << 63) - 1:
        raise SegackValueError(f"{number} does not fit in a Java long (64-bit signed)")
    return number


def java_hash(value):
    """Java's ``Objects.hashCode(value)`` as a signed 32-bit int.

    - ``str``: ``String.hashCode``, ``h = 31 * h + unit`` over the UTF-16 code
      units (a character beyond the BMP counts as its two surrogates);
    - ``int``: ``Long.hashCode``, ``(int) (v ^ (v >>> 32))``; an int outside the
      64-bit signed range is a ``ValueError``;
    - ``bool``: ``Boolean.hashCode``, 1231 for true and 1237 for false;
    - ``None``: 0.

    Any other type is a ``TypeError``.

    >>> java_hash("hello")
    99162322
    >>> java_hash(2**40 + 5)
    261
    >>> java_hash(True), java_hash(None)
    (1231, 0)
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, str):
        return _java_hash_str(value)
    if isinstance(value, (int, np.integer)):
        return java_hash_long_c(_java_long(value))
    raise SegackTypeError(f"java_hash takes str, int, bool or None, not {type(value).__name__}")


def java_hash_many(values):
    """:func:`java_hash` of each value, as a NumPy int32 array.

    ``values`` is a sequence (list, tuple, NumPy array of str or integers) or a
    PyArrow string or integer array (nulls hash to 0). The errors are those of
    :func:`java_hash`, raised before anything is returned.

    >>> java_hash_many(["hello", "world"])
    array([ 99162322, 113318802], dtype=int32)
    """
    if _is_arrow(values):
        return _arrow_many(values, _JAVA)
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise SegackValueError(f"values must be one-dimensional, got {values.ndim} dimensions")
        if values.dtype.kind == "U":
            return _unicode_array_many(values, _JAVA)
        if values.dtype.kind in "iu" and values.dtype.itemsize <= 8 and values.dtype != np.uint64:
            longs = np.ascontiguousarray(values, dtype=np.int64)
            result = np.empty(len(longs), dtype=np.int32)
            _java_longs(longs, result)
            return result
        return _object_many(values.tolist(), _JAVA, None)
    return _object_many(_as_list(values), _JAVA, None)


cdef void _java_longs(const int64_t[::1] values, int32_t[::1] out) noexcept:
    cdef Py_ssize_t i
    with nogil:
        for i in range(values.shape[0]):
            out[i] = java_hash_long_c(values[i])


# ---------------------------------------------------------------- Spark (Murmur3 x86_32)

cdef inline uint32_t _rotl32(uint32_t value, int shift) noexcept nogil:
    return (value << shift) | (value >> (32 - shift))


cdef inline uint32_t _mix_k1(uint32_t k1) noexcept nogil:
    k1 *= 0xCC9E2D51u
    k1 = _rotl32(k1, 15)
    return k1 * 0x1B873593u


cdef inline uint32_t _mix_h1(uint32_t h1, uint32_t k1) noexcept nogil:
    h1 ^= k1
    h1 = _rotl32(h1, 13)
    return h1 * 5 + 0xE6546B64u


cdef inline uint32_t _fmix(uint32_t h1, uint32_t length) noexcept nogil:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 *= 0x85EBCA6Bu
    h1 ^= h1 >> 13
    h1 *= 0xC2B2AE35u
    h1 ^= h1 >> 16
    return h1


cdef int32_t spark_hash_bytes_c(const uint8_t *data, Py_ssize_t length, uint32_t seed) noexcept nogil:
    """Spark's ``hashUnsafeBytes``: little-endian words, then each tail byte sign-extended."""
    cdef uint32_t h1 = seed, word
    cdef Py_ssize_t i, aligned = length - length % 4
    for i in range(0, aligned, 4):
        word = (<uint32_t>data[i] | (<uint32_t>data[i + 1] << 8)
                | (<uint32_t>data[i + 2] << 16) | (<uint32_t>data[i + 3] << 24))
        h1 = _mix_h1(h1, _mix_k1(word))
    for i in range(aligned, length):
        h1 = _mix_h1(h1, _mix_k1(<uint32_t><int32_t>(<signed char>data[i])))
    return <int32_t>_fmix(h1, <uint32_t>length)


cdef int32_t spark_hash_int_c(int32_t value, uint32_t seed) noexcept nogil:
    return <int32_t>_fmix(_mix_h1(seed, _mix_k1(<uint32_t>value)), 4)


cdef int32_t spark_hash_long_c(int64_t value, uint32_t seed) noexcept nogil:
    cdef uint64_t bits = <uint64_t>value
    cdef uint32_t h1 = _mix_h1(seed, _mix_k1(<uint32_t>bits))
    h1 = _mix_h1(h1, _mix_k1(<uint32_t>(bits >> 32)))
    return <int32_t>_fmix(h1, 8)


cdef int32_t _spark_hash_str(str text) except? -1:
    cdef Py_ssize_t length
    cdef const char *data
    try:
        data = PyUnicode_AsUTF8AndSize(text, &length)
    except UnicodeEncodeError:
        raise SegackValueError("a string with a lone surrogate has no UTF-8 form to hash") from None
    return spark_hash_bytes_c(<const uint8_t *>data, length, _SEED)


cdef str _spark_dtype_of(object value):
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "bigint"
    raise SegackTypeError(f"spark_hash takes str or int, not {type(value).__name__}")


cdef _check_dtype(object dtype):
    if dtype is not None and dtype not in SPARK_DTYPES:
        raise SegackValueError(f"dtype must be one of {', '.join(SPARK_DTYPES)} or None, got {dtype!r}")


cdef int32_t _spark_hash_typed(object value, str kind) except? -1:
    if value is None:
        return _SEED
    if kind == "string":
        if not isinstance(value, str):
            raise SegackTypeError(f"a string column holds str, not {type(value).__name__}")
        return _spark_hash_str(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SegackTypeError(f"an {kind} column holds int, not {type(value).__name__}")
    number = int(value)
    if kind == "int":
        if not _INT32_MIN <= number <= _INT32_MAX:
            raise SegackValueError(f"{number} does not fit in a Spark int (32-bit signed)")
        return spark_hash_int_c(number, _SEED)
    if not -(1 << 63) <= number <= (1 << 63) - 1:
        raise SegackValueError(f"{number} does not fit in a Spark bigint (64-bit signed)")
    return spark_hash_long_c(number, _SEED)


def spark_hash(value, dtype=None):
    """Spark SQL's ``hash(col)`` (Murmur3 x86_32, seed 42) of one value.

    ``dtype`` is the Spark column type: ``"string"`` (UTF-8 bytes), ``"int"``
    (32-bit) or ``"bigint"`` (64-bit); by default ``str`` is a string and ``int``
    a bigint. ``None`` (SQL null) hashes to the seed, 42. A value that does not
    fit its dtype is a ``ValueError``; a value of the wrong type a ``TypeError``.

    >>> spark_hash("hello")
    -1008564952
    >>> spark_hash(42), spark_hash(42, "int")
    (1316951768, 29417773)
    """
    _check_dtype(dtype)
    if value is None:
        return SPARK_HASH_SEED
    kind = dtype if dtype is not None else _spark_dtype_of(value)
    return _spark_hash_typed(value, kind)


def spark_hash_many(values, dtype=None):
    """:func:`spark_hash` of each value, as a NumPy int32 array.

    ``values`` is a sequence or a PyArrow array. Without ``dtype``, it is taken
    from the array's type (NumPy or Arrow: int32 is ``"int"``, int64
    ``"bigint"``, text ``"string"``) or, for a plain sequence, from its first
    non-null item; every item must then be of that type.

    >>> spark_hash_many(["hello", "world"])
    array([-1008564952,  -623458850], dtype=int32)
    """
    _check_dtype(dtype)
    kind = dtype if dtype is not None else _dtype_of_many(values)
    if _is_arrow(values) and kind == _arrow_kind(values.type):
        return _arrow_many(values, _SPARK)
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise SegackValueError(f"values must be one-dimensional, got {values.ndim} dimensions")
        if values.dtype.kind == "U" and kind == "string":
            return _unicode_array_many(values, _SPARK)
        if (values.dtype == np.int64 and kind == "bigint") or (values.dtype == np.int32 and kind == "int"):
            result = np.empty(len(values), dtype=np.int32)
            if kind == "int":
                _spark_ints(np.ascontiguousarray(values), result)
            else:
                _spark_longs(np.ascontiguousarray(values), result)
            return result
    return _object_many(_as_list(values), _SPARK, kind)


cdef void _spark_ints(const int32_t[::1] values, int32_t[::1] out) noexcept:
    cdef Py_ssize_t i
    with nogil:
        for i in range(values.shape[0]):
            out[i] = spark_hash_int_c(values[i], _SEED)


cdef void _spark_longs(const int64_t[::1] values, int32_t[::1] out) noexcept:
    cdef Py_ssize_t i
    with nogil:
        for i in range(values.shape[0]):
            out[i] = spark_hash_long_c(values[i], _SEED)


cdef object _arrow_kind(object arrow_type):
    import pyarrow as pa

    if pa.types.is_int32(arrow_type):
        return "int"
    if pa.types.is_int64(arrow_type):
        return "bigint"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    return None


cdef object _dtype_of_many(object values):
    if _is_arrow(values):
        kind = _arrow_kind(values.type)
        if kind is None:
            raise SegackTypeError(f"spark_hash_many takes Arrow string, int32 or int64, not {values.type}")
        return kind
    if isinstance(values, np.ndarray):
        if values.dtype == np.int32:
            return "int"
        if values.dtype == np.int64:
            return "bigint"
        if values.dtype.kind == "U":
            return "string"
        if values.dtype != object:
            raise SegackTypeError(f"spark_hash_many takes int32, int64 or str arrays, not {values.dtype}")
    for item in _as_list(values):
        if item is not None:
            return _spark_dtype_of(item)
    return None


# ---------------------------------------------------------------- shared loops

cdef enum _Which:
    _JAVA
    _SPARK


cdef bint _is_arrow(object values):
    return hasattr(values, "to_pylist") and hasattr(values, "type")


cdef list _as_list(object values):
    if hasattr(values, "to_pylist"):
        return list(values.to_pylist())
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise SegackValueError(f"values must be one-dimensional, got {values.ndim} dimensions")
        return values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise SegackTypeError(f"values must be a sequence or an array, not {type(values).__name__}")
    return list(values)


cdef object _object_many(list items, _Which which, object kind):
    """One hash per Python object; every error is raised before a result exists."""
    cdef Py_ssize_t i, n = len(items)
    result = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] out = result
    for i in range(n):
        item = items[i]
        if which == _JAVA:
            if type(item) is str:
                out[i] = _java_hash_str(<str>item)
            else:
                out[i] = java_hash(item)
        else:
            out[i] = _spark_hash_typed(item, kind)
    return result


cdef object _arrow_many(object values, _Which which):
    """Hash an Arrow array (or chunked array) from its buffers, one C loop per chunk."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        parts = [_arrow_many(chunk, which) for chunk in values.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
    kind = _arrow_kind(values.type)
    if kind is None:
        return _object_many(_as_list(values), which, None)
    cdef Py_ssize_t n = len(values), start = values.offset
    result = np.empty(n, dtype=np.int32)
    if n == 0:
        return result
    buffers = values.buffers()
    cdef const uint8_t[::1] validity = (
        np.frombuffer(buffers[0], dtype=np.uint8) if buffers[0] is not None else None
    )
    cdef int32_t null_hash = 0 if which == _JAVA else _SEED
    if kind == "string":
        offsets = np.frombuffer(
            buffers[1], dtype=np.int64 if pa.types.is_large_string(values.type) else np.int32
        )[start:start + n + 1]
        data = (
            np.frombuffer(buffers[2], dtype=np.uint8)
            if buffers[2] is not None and buffers[2].size > 0
            else np.zeros(1, dtype=np.uint8)
        )
        if offsets.dtype == np.int32:
            _arrow_strings[int32_t](offsets, data, validity, start, which, null_hash, result)
        else:
            _arrow_strings[int64_t](offsets, data, validity, start, which, null_hash, result)
    else:
        numbers = np.frombuffer(
            buffers[1], dtype=np.int32 if kind == "int" else np.int64
        )[start:start + n].astype(np.int64)
        _arrow_numbers(numbers, validity, start, which, kind == "int", null_hash, result)
    return result


cdef void _arrow_strings(
    const offset_t[::1] offsets,
    const uint8_t[::1] data,
    const uint8_t[::1] validity,
    Py_ssize_t start,
    _Which which,
    int32_t null_hash,
    int32_t[::1] out,
) noexcept:
    cdef Py_ssize_t i, bit, n = out.shape[0]
    cdef bint has_validity = validity is not None
    with nogil:
        for i in range(n):
            bit = start + i
            if has_validity and not (validity[bit >> 3] >> (bit & 7)) & 1:
                out[i] = null_hash
            elif which == _JAVA:
                out[i] = java_hash_utf8_c(&data[0] + offsets[i], offsets[i + 1] - offsets[i])
            else:
                out[i] = spark_hash_bytes_c(&data[0] + offsets[i], offsets[i + 1] - offsets[i], _SEED)


cdef void _arrow_numbers(
    const int64_t[::1] numbers,
    const uint8_t[::1] validity,
    Py_ssize_t start,
    _Which which,
    bint is_int32,
    int32_t null_hash,
    int32_t[::1] out,
) noexcept:
    cdef Py_ssize_t i, bit, n = out.shape[0]
    cdef bint has_validity = validity is not None
    with nogil:
        for i in range(n):
            bit = start + i
            if has_validity and not (validity[bit >> 3] >> (bit & 7)) & 1:
                out[i] = null_hash
            elif which == _JAVA:
                out[i] = java_hash_long_c(numbers[i])
            elif is_int32:
                out[i] = spark_hash_int_c(<int32_t>numbers[i], _SEED)
            else:
                out[i] = spark_hash_long_c(numbers[i], _SEED)


cdef object _unicode_array_many(object values, _Which which):
    """Hash a NumPy ``U`` array from its UCS4 buffer (trailing NULs are padding)."""
    cdef Py_ssize_t n = len(values)
    cdef Py_ssize_t width = values.dtype.itemsize // 4
    result = np.empty(n, dtype=np.int32)
    if n == 0 or width == 0:
        result[:] = 0 if which == _JAVA else spark_hash_bytes_c(NULL, 0, _SEED)
        return result
    codes = np.ascontiguousarray(values).view(np.uint32).reshape(n, width)
    if which == _SPARK and ((codes >= 0xD800) & (codes <= 0xDFFF)).any():
        raise SegackValueError("a string with a lone surrogate has no UTF-8 form to hash")
    _ucs4_rows(codes, which, result)
    return result


cdef void _ucs4_rows(const uint32_t[:, ::1] codes, _Which which, int32_t[::1] out) noexcept:
    cdef Py_ssize_t row, column, length
    cdef Py_ssize_t width = codes.shape[1]
    cdef uint32_t h
    with nogil:
        for row in range(codes.shape[0]):
            length = width
            while length > 0 and codes[row, length - 1] == 0:
                length -= 1
            if which == _JAVA:
                h = 0
                for column in range(length):
                    h = _java_step(h, codes[row, column])
                out[row] = <int32_t>h
            else:
                out[row] = _spark_ucs4(&codes[row, 0], length)


cdef int32_t _spark_ucs4(const uint32_t *code_points, Py_ssize_t length) noexcept nogil:
    """Spark's string hash of UCS4 text, encoding UTF-8 on the fly into whole words."""
    cdef uint32_t h1 = _SEED, word = 0, code_point
    cdef int pending = 0, count, k
    cdef uint8_t bytes_out[4]
    cdef Py_ssize_t total = 0, i
    for i in range(length):
        code_point = code_points[i]
        if code_point < 0x80:
            bytes_out[0] = code_point
            count = 1
        elif code_point < 0x800:
            bytes_out[0] = 0xC0 | (code_point >> 6)
            bytes_out[1] = 0x80 | (code_point & 0x3F)
            count = 2
        elif code_point < 0x10000:
            bytes_out[0] = 0xE0 | (code_point >> 12)
            bytes_out[1] = 0x80 | ((code_point >> 6) & 0x3F)
            bytes_out[2] = 0x80 | (code_point & 0x3F)
            count = 3
        else:
            bytes_out[0] = 0xF0 | (code_point >> 18)
            bytes_out[1] = 0x80 | ((code_point >> 12) & 0x3F)
            bytes_out[2] = 0x80 | ((code_point >> 6) & 0x3F)
            bytes_out[3] = 0x80 | (code_point & 0x3F)
            count = 4
        for k in range(count):
            word |= (<uint32_t>bytes_out[k]) << (8 * pending)
            pending += 1
            total += 1
            if pending == 4:
                h1 = _mix_h1(h1, _mix_k1(word))
                word = 0
                pending = 0
    for k in range(pending):
        h1 = _mix_h1(h1, _mix_k1(<uint32_t><int32_t>(<signed char>((word >> (8 * k)) & 0xFF))))
    return <int32_t>_fmix(h1, <uint32_t>total)
