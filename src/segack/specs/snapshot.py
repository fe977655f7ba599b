"""The acker snapshot format, shared by the kernel and the spec.

A token is bytes::

    magic      4 bytes   b"SGAK"
    version    1 byte    1
    length     4 bytes   the whole token's length, little-endian
    body                 unsigned LEB128 varints, as below
    checksum   4 bytes   CRC-32 of everything before it, little-endian

The body holds the start index, ``next_index - start``, the committed offset,
the duplicate count, the duplicate policy (0 error, 1 ignore), ``max_runs + 1``
(0 for no bound), the number of runs, then for each run the gap since the
previous run's end minus 2 (runs never touch), its length minus 1 and its
offset. An offset is a tag byte: 0 none, 1 "the index itself" (the default, so
a default run costs three bytes), 2 an int (zig-zag varint follows), 3 a str
(varint byte length and UTF-8 follow). An int offset must be smaller than
2**128 in magnitude (a UUID as an int fits), so no varint is longer than
``VARINT_BYTES_MAX`` bytes and a reader never builds a huge number from a
damaged token.

CRC-32 detects every change confined to 32 consecutive bits, so any single
damaged byte is caught; the length field catches every truncation.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from segack.errors import SegackTypeError, SegackValueError

__all__ = ["AckerState", "decode", "encode", "MAGIC", "OFFSET_LIMIT", "VARINT_BYTES_MAX", "VERSION"]

MAGIC = b"SGAK"
VERSION = 1
_HEADER = struct.Struct("<4sBI")
_CHECKSUM = struct.Struct("<I")
_TAG_NONE, _TAG_SAME_AS_INDEX, _TAG_INT, _TAG_STR = 0, 1, 2, 3
_POLICIES = ("error", "ignore")
#: The magnitude an int offset must stay below.
OFFSET_LIMIT = 2**128
#: The longest varint a token holds: the zig-zag form of an offset below ``OFFSET_LIMIT``.
VARINT_BYTES_MAX = 19


@dataclass
class AckerState:
    """Everything an acker is: what a snapshot holds."""

    start_index: int
    next_index: int
    committed_offset: Any
    duplicates: int
    on_duplicate: str
    max_runs: int | None
    runs: list[tuple[int, int, Any]] = field(default_factory=list)


def _uvarint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _offset(value: Any, index: int, out: bytearray) -> None:
    if value is None:
        out.append(_TAG_NONE)
    elif isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SegackTypeError(f"only int and str offsets survive a snapshot, not {type(value).__name__}")
    elif isinstance(value, int) and value == index:
        out.append(_TAG_SAME_AS_INDEX)
    elif isinstance(value, int):
        if not -OFFSET_LIMIT < value < OFFSET_LIMIT:
            raise SegackValueError(
                f"int offset {value} is too large for a snapshot (limit: 2**128 in magnitude)")
        out.append(_TAG_INT)
        _uvarint((value << 1) if value >= 0 else ((-value) << 1) - 1, out)
    else:
        data = value.encode("utf-8", "surrogatepass")
        out.append(_TAG_STR)
        _uvarint(len(data), out)
        out += data


def encode(state: AckerState) -> bytes:
    """The token for ``state``; an offset that is neither int nor str is a ``TypeError``."""
    body = _head(state, len(state.runs))
    previous_end = state.next_index - 1
    for first, last, offset in state.runs:
        _uvarint(first - previous_end - 2, body)
        _uvarint(last - first, body)
        _offset(offset, last, body)
        previous_end = last
    return _seal(body)


def _head(state: AckerState, run_count: int) -> bytearray:
    """The body up to the first run (``state.runs`` is not read: the kernel writes its own)."""
    body = bytearray()
    _uvarint(state.start_index, body)
    _uvarint(state.next_index - state.start_index, body)
    _offset(state.committed_offset, state.next_index - 1, body)
    _uvarint(state.duplicates, body)
    body.append(_POLICIES.index(state.on_duplicate))
    _uvarint(0 if state.max_runs is None else state.max_runs + 1, body)
    _uvarint(run_count, body)
    return body


def _seal(body: bytearray) -> bytes:
    """The token: header, ``body`` and checksum."""
    total = _HEADER.size + len(body) + _CHECKSUM.size
    token = _HEADER.pack(MAGIC, VERSION, total) + bytes(body)
    return token + _CHECKSUM.pack(zlib.crc32(token))


class _Reader:
    def __init__(self, data: bytes, position: int, end: int) -> None:
        self.data, self.position, self.end = data, position, end

    def byte(self) -> int:
        if self.position >= self.end:
            raise SegackValueError("damaged acker snapshot: it ends in the middle of a field")
        value = self.data[self.position]
        self.position += 1
        return value

    def uvarint(self) -> int:
        result = 0
        for length in range(VARINT_BYTES_MAX):
            byte = self.byte()
            result |= (byte & 0x7F) << (7 * length)
            if byte < 0x80:
                return result
        raise SegackValueError("damaged acker snapshot: a number is too long")

    def offset(self, index: int) -> Any:
        tag = self.byte()
        if tag == _TAG_NONE:
            return None
        if tag == _TAG_SAME_AS_INDEX:
            return index
        if tag == _TAG_INT:
            zigzag = self.uvarint()
            return zigzag >> 1 if zigzag & 1 == 0 else -((zigzag + 1) >> 1)
        if tag == _TAG_STR:
            length = self.uvarint()
            if self.position + length > self.end:
                raise SegackValueError("damaged acker snapshot: a string runs past the end")
            raw = self.data[self.position : self.position + length]
            self.position += length
            return raw.decode("utf-8", "surrogatepass")
        raise SegackValueError(f"damaged acker snapshot: unknown offset tag {tag}")


def decode(data: Any) -> AckerState:
    """The state a token holds. A damaged, truncated or foreign token is a ``ValueError``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SegackTypeError(f"a snapshot is bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size + _CHECKSUM.size or data[:4] != MAGIC:
        raise SegackValueError("not a segack acker snapshot (wrong magic bytes)")
    _, version, total = _HEADER.unpack_from(data)
    if version != VERSION:
        raise SegackValueError(f"unsupported acker snapshot version {version} (this segack reads {VERSION})")
    if total != len(data):
        raise SegackValueError(f"damaged acker snapshot: {len(data)} bytes where the header says {total}")
    (checksum,) = _CHECKSUM.unpack_from(data, len(data) - _CHECKSUM.size)
    if zlib.crc32(data[: -_CHECKSUM.size]) != checksum:
        raise SegackValueError("damaged acker snapshot: checksum mismatch")
    reader = _Reader(data, _HEADER.size, len(data) - _CHECKSUM.size)
    try:
        start = reader.uvarint()
        next_index = start + reader.uvarint()
        committed = reader.offset(next_index - 1)
        duplicates = reader.uvarint()
        policy = reader.byte()
        if policy >= len(_POLICIES):
            raise SegackValueError(f"damaged acker snapshot: unknown duplicate policy {policy}")
        bound = reader.uvarint()
        runs: list[tuple[int, int, Any]] = []
        previous_end = next_index - 1
        for _ in range(reader.uvarint()):
            first = previous_end + 2 + reader.uvarint()
            last = first + reader.uvarint()
            runs.append((first, last, reader.offset(last)))
            previous_end = last
    except UnicodeDecodeError:
        raise SegackValueError("damaged acker snapshot: an offset is not valid UTF-8") from None
    if reader.position != reader.end:
        raise SegackValueError("damaged acker snapshot: bytes left over after the last run")
    if (committed is None) != (next_index == start):
        raise SegackValueError("damaged acker snapshot: committed offset and next index disagree")
    return AckerState(
        start, next_index, committed, duplicates, _POLICIES[policy],
        None if bound == 0 else bound - 1, runs,
    )

