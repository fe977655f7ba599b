# The snapshot codec, part of acker.pyx (one compilation unit). The layout is documented in
# segack.specs.snapshot; its numbers and error wording come from segack._shared. The fast path
# writes and reads the runs, the bulk of a token, without a Python object per run; a token it
# declines is read again with Python ints by _careful_state, which names the first fault.

cdef uint8_t _TAG_NONE = _shared.TAG_NONE
cdef uint8_t _TAG_SAME_AS_INDEX = _shared.TAG_SAME_AS_INDEX
cdef uint8_t _TAG_INT = _shared.TAG_INT
cdef uint8_t _TAG_STR = _shared.TAG_STR
cdef bytes _MAGIC = SNAPSHOT_MAGIC
cdef uint8_t _VERSION = SNAPSHOT_VERSION
cdef Py_ssize_t _HEADER_SIZE = SNAPSHOT_HEADER.size
cdef Py_ssize_t _CHECKSUM_SIZE = SNAPSHOT_CHECKSUM.size
cdef Py_ssize_t _POLICY_COUNT = len(DUPLICATE_POLICIES)
# The longest LEB128 varint of a 64-bit number.
cdef enum:
    _VARINT_MAX = 10


cdef struct _Buffer:
    char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int _reserve(_Buffer *out, Py_ssize_t extra) except -1:
    cdef Py_ssize_t capacity
    cdef char *grown
    if out.size + extra <= out.capacity:
        return 0
    capacity = max(2 * out.capacity, out.size + extra)
    grown = <char *>realloc(out.data, capacity)
    if grown == NULL:
        raise MemoryError()
    out.data = grown
    out.capacity = capacity
    return 0


cdef inline void _put_byte(_Buffer *out, uint8_t value) noexcept nogil:
    out.data[out.size] = <char>value
    out.size += 1


cdef inline void _put_uvarint(_Buffer *out, uint64_t value) noexcept nogil:
    while value >= 0x80:
        out.data[out.size] = <char>((value & 0x7F) | 0x80)
        out.size += 1
        value >>= 7
    out.data[out.size] = <char>value
    out.size += 1


cdef bytes _uvarint_bytes(object value):
    """A varint of any non-negative Python int (offsets reach 129 bits, ``max_runs`` any size)."""
    cdef bytearray out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


cdef bytes _offset_bytes(object offset, object index):
    """An offset as a token writes it, tag first; a type or size a token cannot keep is an error."""
    if offset is None:
        return bytes((_TAG_NONE,))
    if isinstance(offset, bool) or not isinstance(offset, (int, str)):
        raise SegackTypeError(_shared.OFFSET_NOT_KEPT.format(type=type(offset).__name__))
    if isinstance(offset, str):
        encoded = (<str>offset).encode("utf-8", "surrogatepass")
        return bytes((_TAG_STR,)) + _uvarint_bytes(len(encoded)) + encoded
    if offset == index:
        return bytes((_TAG_SAME_AS_INDEX,))
    if not -OFFSET_LIMIT < offset < OFFSET_LIMIT:
        raise SegackValueError(_shared.OFFSET_TOO_LARGE.format(offset=offset))
    return bytes((_TAG_INT,)) + _uvarint_bytes(offset << 1 if offset >= 0 else ((-offset) << 1) - 1)


cdef int _put_bytes(_Buffer *out, bytes data) except -1:
    _reserve(out, len(data))
    memcpy(out.data + out.size, <const char *>data, len(data))
    out.size += len(data)
    return 0


cdef inline uint64_t _zigzag(int64_t value) noexcept nogil:
    return (<uint64_t>value << 1) ^ (0 - <uint64_t>(value < 0))


cdef inline int64_t _unzigzag(uint64_t value) noexcept nogil:
    return <int64_t>(value >> 1) ^ -<int64_t>(value & 1)


cdef inline uint64_t _le32(const unsigned char *p) noexcept nogil:
    return p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)


cdef bint _read_uvarint(
    const unsigned char *p, Py_ssize_t *position, Py_ssize_t end, uint64_t *value
) noexcept nogil:
    """A varint that fits 64 bits, else False (the spec reads longer ones too)."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char byte
    while position[0] < end:
        byte = p[position[0]]
        position[0] += 1
        if shift == 63 and byte > 1:
            return False
        result |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            value[0] = result
            return True
        shift += 7
    return False


cdef struct _Parsed:
    int64_t start
    int64_t next_index
    int64_t duplicates
    int64_t bound
    int policy
    Run committed       # offset/obj only; obj is Py_None for "no committed offset"
    Run *runs           # owned, with owned objects for the first ``count``
    Py_ssize_t count
    int64_t pending_count


cdef int _read_offset(
    const unsigned char *p, Py_ssize_t *position, Py_ssize_t end, int64_t index, Run *into
) except -1:
    """An offset as the spec reads it, into ``into`` (a new reference for objects); 0 when the
    bytes are not one the kernel holds natively or not valid."""
    cdef uint64_t value
    cdef uint8_t tag
    if position[0] >= end:
        return 0
    tag = p[position[0]]
    position[0] += 1
    into.offset = 0
    into.obj = NULL
    if tag == _TAG_SAME_AS_INDEX:
        into.offset = index
    elif tag == _TAG_INT:
        if not _read_uvarint(p, position, end, &value):
            return 0
        into.offset = _unzigzag(value)
    elif tag == _TAG_NONE:
        Py_INCREF(None)
        into.obj = <PyObject *>None
    elif tag == _TAG_STR:
        if not _read_uvarint(p, position, end, &value) or value > <uint64_t>(end - position[0]):
            return 0
        try:
            text = (<const char *>p)[position[0]:position[0] + <Py_ssize_t>value].decode(
                "utf-8", "surrogatepass"
            )
        except UnicodeDecodeError:
            return 0
        position[0] += <Py_ssize_t>value
        Py_INCREF(text)
        into.obj = <PyObject *>text
    else:
        return 0
    return 1


cdef void _release_parsed(_Parsed *parsed) noexcept:
    cdef Py_ssize_t k
    for k in range(parsed.count):
        Py_XDECREF(parsed.runs[k].obj)
    Py_XDECREF(parsed.committed.obj)
    free(parsed.runs)
    parsed.runs = NULL
    parsed.count = 0
    parsed.committed.obj = NULL


cdef bint _parse_token(bytes data, _Parsed *parsed) except -1:
    """Read a token as the spec's decoder would, into ``parsed``. False, holding nothing, for
    whatever the spec would reject or the kernel cannot hold natively: the caller then asks
    the spec, so errors are worded in one place."""
    parsed.runs = NULL
    parsed.count = 0
    parsed.committed.obj = NULL
    try:
        if _parse_body(data, parsed):
            return True
    except BaseException:
        _release_parsed(parsed)
        raise
    _release_parsed(parsed)
    return False


cdef bint _parse_body(bytes data, _Parsed *parsed) except -1:
    cdef const unsigned char *p = <const unsigned char *><const char *>data
    cdef Py_ssize_t n = len(data), position = _HEADER_SIZE, end = n - _CHECKSUM_SIZE, k
    cdef uint64_t value, count, gap, length
    cdef int64_t previous_end, first
    if n < _HEADER_SIZE + _CHECKSUM_SIZE or data[:4] != _MAGIC or p[4] != _VERSION:
        return False
    if _le32(p + 5) != <uint64_t>n:
        return False
    if zlib.crc32(memoryview(data)[:end]) != _le32(p + end):
        return False
    if not _read_uvarint(p, &position, end, &value) or value > <uint64_t>_INDEX_MAX:
        return False
    parsed.start = value
    if not _read_uvarint(p, &position, end, &value) or value > <uint64_t>(_INDEX_MAX + 1 - parsed.start):
        return False
    parsed.next_index = parsed.start + <int64_t>value
    if not _read_offset(p, &position, end, parsed.next_index - 1, &parsed.committed):
        return False
    if not _read_uvarint(p, &position, end, &value) or value > <uint64_t>INT64_MAX:
        return False
    parsed.duplicates = value
    if position >= end or p[position] >= _POLICY_COUNT:
        return False
    parsed.policy = p[position]
    position += 1
    if not _read_uvarint(p, &position, end, &value) or value > <uint64_t>INT64_MAX:
        return False
    parsed.bound = value
    # Every run takes at least three bytes, so a larger count is damage, not a size to allocate.
    if not _read_uvarint(p, &position, end, &count) or count > <uint64_t>((end - position) // 3):
        return False
    parsed.runs = <Run *>malloc((count + 1) * sizeof(Run))
    if parsed.runs == NULL:
        raise MemoryError()
    parsed.pending_count = 0
    previous_end = parsed.next_index - 1
    for k in range(<Py_ssize_t>count):
        if not _read_uvarint(p, &position, end, &gap) or gap > <uint64_t>_INDEX_MAX:
            return False
        # In 64 unsigned bits: previous_end + 2 may pass INT64_MAX by one.
        value = <uint64_t>(previous_end + 1) + 1 + gap
        if value > <uint64_t>_INDEX_MAX:
            return False
        first = <int64_t>value
        if not _read_uvarint(p, &position, end, &length) or length > <uint64_t>(_INDEX_MAX - first):
            return False
        parsed.runs[k].first = first
        parsed.runs[k].last = first + <int64_t>length
        if not _read_offset(p, &position, end, parsed.runs[k].last, &parsed.runs[k]):
            return False
        parsed.count = k + 1
        parsed.pending_count += <int64_t>length + 1
        previous_end = parsed.runs[k].last
    if position != end:
        return False
    if (parsed.committed.obj == <PyObject *>None) != (parsed.next_index == parsed.start):
        return False
    if parsed.committed.obj == <PyObject *>None:
        Py_XDECREF(parsed.committed.obj)
        parsed.committed.obj = NULL
    return True


cdef class _CarefulReader:
    """Reads a token's fields with Python ints, in the order they lie, naming the first fault."""

    cdef bytes data
    cdef Py_ssize_t position, end

    def __cinit__(self, bytes data, Py_ssize_t position, Py_ssize_t end):
        self.data = data
        self.position = position
        self.end = end

    cdef int next_byte(self) except -1:
        if self.position >= self.end:
            raise SegackValueError(_shared.ENDS_IN_A_FIELD)
        self.position += 1
        return self.data[self.position - 1]

    cdef object number(self):
        cdef int byte, shift
        result = 0
        for shift in range(0, 7 * VARINT_BYTES_MAX, 7):
            byte = self.next_byte()
            # A Python int: the shift goes past 64 bits.
            result |= <object>(byte & 0x7F) << shift
            if byte < 0x80:
                return result
        raise SegackValueError(_shared.NUMBER_TOO_LONG)

    cdef object offset(self, object index):
        cdef int tag = self.next_byte()
        if tag == _TAG_NONE:
            return None
        if tag == _TAG_SAME_AS_INDEX:
            return index
        if tag == _TAG_INT:
            zigzag = self.number()
            return -((zigzag + 1) >> 1) if zigzag & 1 else zigzag >> 1
        if tag != _TAG_STR:
            raise SegackValueError(_shared.UNKNOWN_TAG.format(tag=tag))
        length = self.number()
        if length > self.end - self.position:
            raise SegackValueError(_shared.STRING_PAST_END)
        start = self.position
        self.position += length
        return self.data[start:self.position].decode("utf-8", "surrogatepass")


cdef object _careful_state(object data):
    """The state a token holds, read field by field; every fault is the error the rules name
    (see :func:`segack.specs.acker.restorable_state`), in the order the rules check them."""
    if not isinstance(data, bytes):
        raise SegackTypeError(_shared.NOT_BYTES.format(type=type(data).__name__))
    cdef bytes token = <bytes>data
    cdef Py_ssize_t size = len(token)
    if size < _HEADER_SIZE + _CHECKSUM_SIZE or token[:4] != _MAGIC:
        raise SegackValueError(_shared.NOT_A_SNAPSHOT)
    _, version, total = SNAPSHOT_HEADER.unpack_from(token)
    if version != _VERSION:
        raise SegackValueError(_shared.UNSUPPORTED_VERSION.format(version=version, supported=_VERSION))
    if total != size:
        raise SegackValueError(_shared.WRONG_LENGTH.format(size=size, total=total))
    (checksum,) = SNAPSHOT_CHECKSUM.unpack_from(token, size - _CHECKSUM_SIZE)
    if zlib.crc32(token[:size - _CHECKSUM_SIZE]) != checksum:
        raise SegackValueError(_shared.CHECKSUM_MISMATCH)
    cdef _CarefulReader reader = _CarefulReader(token, _HEADER_SIZE, size - _CHECKSUM_SIZE)
    try:
        start = reader.number()
        next_index = start + reader.number()
        committed = reader.offset(next_index - 1)
        duplicates = reader.number()
        policy = reader.next_byte()
        if policy >= _POLICY_COUNT:
            raise SegackValueError(_shared.UNKNOWN_POLICY.format(policy=policy))
        bound = reader.number()
        runs = []
        last = next_index - 1
        for _ in range(reader.number()):
            first = last + 2 + reader.number()
            last = first + reader.number()
            runs.append((first, last, reader.offset(last)))
    except UnicodeDecodeError:
        raise SegackValueError(_shared.NOT_UTF8) from None
    if reader.position != reader.end:
        raise SegackValueError(_shared.BYTES_LEFT_OVER)
    if (committed is None) != (next_index == start):
        raise SegackValueError(_shared.COMMITTED_DISAGREES)
    # What the kernel can hold: the last done index (the committed point's, then each run's)
    # within INDEX_MAX, the duplicate count within 64 bits.
    for last in ([next_index - 1] if next_index > start else []) + [run[1] for run in runs]:
        if last > INDEX_MAX:
            raise SegackValueError(_shared.INDEX_PAST_MAX.format(index=last, limit=INDEX_MAX))
    if duplicates > DUPLICATES_MAX:
        raise SegackValueError(
            _shared.DUPLICATES_PAST_MAX.format(duplicates=duplicates, limit=DUPLICATES_MAX))
    return AckerState(start, next_index, committed, duplicates, DUPLICATE_POLICIES[policy],
                      None if bound == 0 else bound - 1, runs)
