"""What the kernel and the spec share on purpose: names and numbers fixed by the formats they
match, the input rules both enforce the same way, and the wording of their errors.

Each twin does its own work with these; neither imports the other's code.
"""

from __future__ import annotations

import operator
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from segack.errors import SegackTypeError, SegackValueError

# ------------------------------------------------------------------ hashes

#: The hashes a key can be cut by: ``java`` (Java's ``hashCode``, as Axon Framework uses it) or
#: ``spark`` (Spark SQL's ``hash()``).
HASHES = ("java", "spark")

#: The seed of Spark SQL's ``hash()`` (Murmur3 x86_32).
SPARK_HASH_SEED = 42

#: What may run at once inside a segment's task (see segack.spark_adapter.worker.dispatch): events of
#: other keys, one event at a time, or any events.
SEQUENCING_POLICIES = ("per-key", "sequential", "concurrent")

#: When a resumed replay checks its done events against the input (see
#: segack.spark_adapter.sources.fingerprint): unless the input is unchanged, or always.
VERIFY_CHOICES = ("auto", "always")

# ------------------------------------------------------------------ the acker's input rules

#: The largest index an acker takes (the kernel keeps indexes as signed 64-bit ints).
INDEX_MAX = 2**63 - 2
#: The largest duplicate count (the kernel counts in a signed 64-bit int).
DUPLICATES_MAX = 2**63 - 1
#: The duplicate policies, numbered in a snapshot by their place here.
DUPLICATE_POLICIES = ("error", "ignore")


def start_index_argument(start_index: Any, next_index: Any) -> Any:
    """``OffsetAcker``'s start from its arguments: ``start_index``, or the 0.1 keyword ``next_index``
    (with a ``DeprecationWarning``). Both at once is a ``SegackTypeError``."""
    if next_index is None:
        return start_index
    if start_index != 0:
        raise SegackTypeError("give start_index or its old name next_index, not both")
    warnings.warn("OffsetAcker(next_index=...) is now OffsetAcker(start_index=...)", DeprecationWarning,
                  stacklevel=3)
    return next_index


def as_index(value: Any, what: str) -> int:
    """``value`` as an int index: a ``TypeError`` for a bool or anything without ``__index__``."""
    if isinstance(value, bool):
        raise SegackTypeError(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise SegackTypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def check_settings(start_index: Any, on_duplicate: Any, max_runs: Any) -> int:
    """The start index, once ``OffsetAcker``'s settings are checked (``TypeError``, ``ValueError``)."""
    start = as_index(start_index, "start_index")
    if start < 0 or start > INDEX_MAX:
        raise SegackValueError(f"start_index must be in 0..{INDEX_MAX}, got {start}")
    if on_duplicate not in DUPLICATE_POLICIES:
        raise SegackValueError(f"on_duplicate must be 'error' or 'ignore', got {on_duplicate!r}")
    if max_runs is not None:
        bound = as_index(max_runs, "max_runs")
        if bound < 0:
            raise SegackValueError(f"max_runs must be non-negative or None, got {bound}")
    return start


def index_array(indexes: Any) -> np.ndarray:
    """``ack_many``'s indexes as an int64 array: one-dimensional, of an integer type that fits."""
    array = np.asarray(indexes)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1:
        raise SegackValueError(f"indexes must be one-dimensional, got {array.ndim} dimensions")
    if array.dtype.kind not in "iu" or not np.can_cast(array.dtype, np.int64):
        raise SegackTypeError(f"indexes must be an integer array (int64 or narrower), not {array.dtype}")
    return array.astype(np.int64, copy=False)


# ------------------------------------------------------------------ the snapshot format
# (segack.specs.snapshot documents the layout)

SNAPSHOT_MAGIC = b"SGAK"
SNAPSHOT_VERSION = 1
#: Magic, version and the whole token's length.
SNAPSHOT_HEADER = struct.Struct("<4sBI")
#: CRC-32 of everything before it.
SNAPSHOT_CHECKSUM = struct.Struct("<I")
TAG_NONE, TAG_SAME_AS_INDEX, TAG_INT, TAG_STR = 0, 1, 2, 3
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


# ------------------------------------------------------------------ the wording of errors

NOT_BYTES = "a snapshot is bytes, not {type}"
NOT_A_SNAPSHOT = "not a segack acker snapshot (wrong magic bytes)"
UNSUPPORTED_VERSION = "unsupported acker snapshot version {version} (this segack reads {supported})"
_DAMAGED = "damaged acker snapshot: "
WRONG_LENGTH = _DAMAGED + "{size} bytes where the header says {total}"
CHECKSUM_MISMATCH = _DAMAGED + "checksum mismatch"
ENDS_IN_A_FIELD = _DAMAGED + "it ends in the middle of a field"
NUMBER_TOO_LONG = _DAMAGED + "a number is too long"
STRING_PAST_END = _DAMAGED + "a string runs past the end"
UNKNOWN_TAG = _DAMAGED + "unknown offset tag {tag}"
UNKNOWN_POLICY = _DAMAGED + "unknown duplicate policy {policy}"
NOT_UTF8 = _DAMAGED + "an offset is not valid UTF-8"
BYTES_LEFT_OVER = _DAMAGED + "bytes left over after the last run"
COMMITTED_DISAGREES = _DAMAGED + "committed offset and next index disagree"
INDEX_PAST_MAX = _DAMAGED + "index {index} is larger than {limit}"
DUPLICATES_PAST_MAX = _DAMAGED + "{duplicates} duplicates is past {limit}"
OFFSET_NOT_KEPT = "only int and str offsets survive a snapshot, not {type}"
OFFSET_TOO_LARGE = "int offset {offset} is too large for a snapshot (limit: 2**128 in magnitude)"
MERGE_EARLIER = ("index {theirs} is below the start index {mine}: the other acker covers an earlier "
                 "part of the stream")
MERGE_CONFLICT = "index {index} has offset {mine!r} here and {theirs!r} in the other acker"
