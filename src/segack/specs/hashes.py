"""Sequencing hashes: Java's ``Objects.hashCode`` and Spark SQL's ``hash()``.

The executable specification. Both functions return a signed 32-bit int, the
value the JVM would produce, so that a Python job, a Spark job and an Axon
application agree on which segment owns a key.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

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

#: The seed Spark SQL's ``hash()`` uses.

#: The Spark column types :func:`spark_hash` hashes bit-exactly.
SPARK_DTYPES = ("string", "int", "bigint")

_MASK32 = 0xFFFFFFFF
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _to_int32(value: int) -> int:
    """The low 32 bits of ``value`` as a signed int."""
    value &= _MASK32
    return value - (1 << 32) if value >= (1 << 31) else value


def _java_long(value: Any) -> int:
    number = operator.index(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise SegackValueError(f"{number} does not fit in a Java long (64-bit signed)")
    return number


def java_hash(value: str | int | bool | None) -> int:
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
        result = 0
        encoded = value.encode("utf-16-le", "surrogatepass")
        for position in range(0, len(encoded), 2):
            unit = encoded[position] | (encoded[position + 1] << 8)
            result = (31 * result + unit) & _MASK32
        return _to_int32(result)
    if isinstance(value, (int, np.integer)):
        number = _java_long(value) & 0xFFFFFFFFFFFFFFFF
        return _to_int32(number ^ (number >> 32))
    raise SegackTypeError(f"java_hash takes str, int, bool or None, not {type(value).__name__}")


def java_hash_many(values: Any) -> np.ndarray:
    """:func:`java_hash` of each value, as a NumPy int32 array.

    ``values`` is a sequence (list, tuple, NumPy array of str or integers) or a
    PyArrow string or integer array (nulls hash to 0). The errors are those of
    :func:`java_hash`, raised before anything is returned.

    >>> java_hash_many(["hello", "world"])
    array([ 99162322, 113318802], dtype=int32)
    """
    items = _as_list(values)
    return np.array([java_hash(item) for item in items], dtype=np.int32)


def _rotl32(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & _MASK32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _MASK32
    k1 = _rotl32(k1, 15)
    return (k1 * 0x1B873593) & _MASK32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl32(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK32
    h1 ^= h1 >> 16
    return h1


def _murmur3_spark_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes``.

    Whole 4-byte words are read little-endian as in standard Murmur3, but each of
    the trailing 0-3 bytes is mixed on its own as a sign-extended int: Spark
    keeps this non-standard tail for compatibility, so it is what ``hash()`` on a
    string column returns.
    """
    h1 = seed & _MASK32
    aligned = len(data) - len(data) % 4
    for position in range(0, aligned, 4):
        word = int.from_bytes(data[position : position + 4], "little")
        h1 = _mix_h1(h1, _mix_k1(word))
    for byte in data[aligned:]:
        signed = byte - 256 if byte >= 128 else byte
        h1 = _mix_h1(h1, _mix_k1(signed & _MASK32))
    return _to_int32(_fmix(h1, len(data)))


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise SegackValueError("a string with a lone surrogate has no UTF-8 form to hash") from None


def _spark_dtype_of(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "bigint"
    raise SegackTypeError(f"spark_hash takes str or int, not {type(value).__name__}")


def _check_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in SPARK_DTYPES:
        raise SegackValueError(f"dtype must be one of {', '.join(SPARK_DTYPES)} or None, got {dtype!r}")


def spark_hash(value: str | int | None, dtype: str | None = None) -> int:
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
    if kind == "string":
        if not isinstance(value, str):
            raise SegackTypeError(f"a string column holds str, not {type(value).__name__}")
        return _murmur3_spark_bytes(_utf8(value), SPARK_HASH_SEED)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SegackTypeError(f"an {kind} column holds int, not {type(value).__name__}")
    number = int(value)
    if kind == "int":
        if not _INT32_MIN <= number <= _INT32_MAX:
            raise SegackValueError(f"{number} does not fit in a Spark int (32-bit signed)")
        h1 = _mix_h1(SPARK_HASH_SEED, _mix_k1(number & _MASK32))
        return _to_int32(_fmix(h1, 4))
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise SegackValueError(f"{number} does not fit in a Spark bigint (64-bit signed)")
    unsigned = number & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(SPARK_HASH_SEED, _mix_k1(unsigned & _MASK32))
    h1 = _mix_h1(h1, _mix_k1(unsigned >> 32))
    return _to_int32(_fmix(h1, 8))


def spark_hash_many(values: Any, dtype: str | None = None) -> np.ndarray:
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
    items = _as_list(values)
    return np.array([spark_hash(item, kind) for item in items], dtype=np.int32)


def _dtype_of_many(values: Any) -> str | None:
    """The Spark dtype a whole array stands for, or ``None`` when all are null."""
    array_type = getattr(values, "type", None)
    if array_type is not None:  # a PyArrow array
        import pyarrow as pa

        if pa.types.is_int32(array_type):
            return "int"
        if pa.types.is_int64(array_type):
            return "bigint"
        if pa.types.is_string(array_type) or pa.types.is_large_string(array_type):
            return "string"
        raise SegackTypeError(f"spark_hash_many takes Arrow string, int32 or int64, not {array_type}")
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


def _as_list(values: Any) -> list[Any]:
    """The items of a sequence, NumPy array or PyArrow array as Python objects."""
    if hasattr(values, "to_pylist"):
        return list(values.to_pylist())
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise SegackValueError(f"values must be one-dimensional, got {values.ndim} dimensions")
        items: list[Any] = values.tolist()
        return items
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise SegackTypeError(f"values must be a sequence or an array, not {type(values).__name__}")
    return list(values)
