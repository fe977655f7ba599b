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

import zlib
from typing import Any

from segack import _shared
from segack._shared import (
    OFFSET_LIMIT,
    SNAPSHOT_CHECKSUM,
    SNAPSHOT_HEADER,
    TAG_INT,
    TAG_NONE,
    TAG_SAME_AS_INDEX,
    TAG_STR,
    VARINT_BYTES_MAX,
    AckerState,
)
from segack.errors import SegackTypeError, SegackValueError

__all__ = ["AckerState", "decode", "encode", "MAGIC", "OFFSET_LIMIT", "VARINT_BYTES_MAX", "VERSION"]

MAGIC = _shared.SNAPSHOT_MAGIC
VERSION = _shared.SNAPSHOT_VERSION
_POLICIES = _shared.DUPLICATE_POLICIES


def _uvarint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _offset(value: Any, index: int, out: bytearray) -> None:
    if value is None:
        out.append(TAG_NONE)
    elif isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SegackTypeError(_shared.OFFSET_NOT_KEPT.format(type=type(value).__name__))
    elif isinstance(value, int) and value == index:
        out.append(TAG_SAME_AS_INDEX)
    elif isinstance(value, int):
        if not -OFFSET_LIMIT < value < OFFSET_LIMIT:
            raise SegackValueError(_shared.OFFSET_TOO_LARGE.format(offset=value))
        out.append(TAG_INT)
        _uvarint((value << 1) if value >= 0 else ((-value) << 1) - 1, out)
    else:
        data = value.encode("utf-8", "surrogatepass")
        out.append(TAG_STR)
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
    total = SNAPSHOT_HEADER.size + len(body) + SNAPSHOT_CHECKSUM.size
    token = SNAPSHOT_HEADER.pack(MAGIC, VERSION, total) + bytes(body)
    return token + SNAPSHOT_CHECKSUM.pack(zlib.crc32(token))


class _Reader:
    def __init__(self, data: bytes, position: int, end: int) -> None:
        self.data, self.position, self.end = data, position, end

    def byte(self) -> int:
        if self.position >= self.end:
            raise SegackValueError(_shared.ENDS_IN_A_FIELD)
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
        raise SegackValueError(_shared.NUMBER_TOO_LONG)

    def offset(self, index: int) -> Any:
        tag = self.byte()
        if tag == TAG_NONE:
            return None
        if tag == TAG_SAME_AS_INDEX:
            return index
        if tag == TAG_INT:
            zigzag = self.uvarint()
            return zigzag >> 1 if zigzag & 1 == 0 else -((zigzag + 1) >> 1)
        if tag == TAG_STR:
            length = self.uvarint()
            if self.position + length > self.end:
                raise SegackValueError(_shared.STRING_PAST_END)
            raw = self.data[self.position : self.position + length]
            self.position += length
            return raw.decode("utf-8", "surrogatepass")
        raise SegackValueError(_shared.UNKNOWN_TAG.format(tag=tag))


def decode(data: Any) -> AckerState:
    """The state a token holds. A damaged, truncated or foreign token is a ``ValueError``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SegackTypeError(_shared.NOT_BYTES.format(type=type(data).__name__))
    data = bytes(data)
    if len(data) < SNAPSHOT_HEADER.size + SNAPSHOT_CHECKSUM.size or data[:4] != MAGIC:
        raise SegackValueError(_shared.NOT_A_SNAPSHOT)
    _, version, total = SNAPSHOT_HEADER.unpack_from(data)
    if version != VERSION:
        raise SegackValueError(_shared.UNSUPPORTED_VERSION.format(version=version, supported=VERSION))
    if total != len(data):
        raise SegackValueError(_shared.WRONG_LENGTH.format(size=len(data), total=total))
    (checksum,) = SNAPSHOT_CHECKSUM.unpack_from(data, len(data) - SNAPSHOT_CHECKSUM.size)
    if zlib.crc32(data[: -SNAPSHOT_CHECKSUM.size]) != checksum:
        raise SegackValueError(_shared.CHECKSUM_MISMATCH)
    reader = _Reader(data, SNAPSHOT_HEADER.size, len(data) - SNAPSHOT_CHECKSUM.size)
    try:
        start = reader.uvarint()
        next_index = start + reader.uvarint()
        committed = reader.offset(next_index - 1)
        duplicates = reader.uvarint()
        policy = reader.byte()
        if policy >= len(_POLICIES):
            raise SegackValueError(_shared.UNKNOWN_POLICY.format(policy=policy))
        bound = reader.uvarint()
        runs: list[tuple[int, int, Any]] = []
        previous_end = next_index - 1
        for _ in range(reader.uvarint()):
            first = previous_end + 2 + reader.uvarint()
            last = first + reader.uvarint()
            runs.append((first, last, reader.offset(last)))
            previous_end = last
    except UnicodeDecodeError:
        raise SegackValueError(_shared.NOT_UTF8) from None
    if reader.position != reader.end:
        raise SegackValueError(_shared.BYTES_LEFT_OVER)
    if (committed is None) != (next_index == start):
        raise SegackValueError(_shared.COMMITTED_DISAGREES)
    return AckerState(
        start, next_index, committed, duplicates, _POLICIES[policy],
        None if bound == 0 else bound - 1, runs,
    )

