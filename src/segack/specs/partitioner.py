"""A partition function for ``RDD.partitionBy``: the key's segment is its partition."""

from __future__ import annotations

from typing import Any

from segack._shared import HASHES
from segack.errors import SegackTypeError, SegackValueError
from segack.specs.hashes import java_hash, spark_hash
from segack.specs.segments import SegmentSet

__all__ = ["SegmentPartitioner"]



class SegmentPartitioner:
    """``partitioner(key)`` is the index of the member of ``segments`` that owns ``key``'s hash.

    Use it as ``rdd.partitionBy(len(segments), SegmentPartitioner(segments))``: each
    segment becomes one partition. ``hash`` is ``"java"`` (Axon's ``Objects.hashCode``)
    or ``"spark"`` (Spark SQL's ``hash()``). Rejects a ``segments`` that is not a
    ``SegmentSet`` (``TypeError``) and an unknown ``hash`` (``ValueError``); a key
    the hash cannot take raises as that hash function does.

    >>> partitioner = SegmentPartitioner(SegmentSet.balanced(4))
    >>> partitioner("order-1"), partitioner.num_partitions
    (2, 4)
    """

    def __init__(self, segments: SegmentSet, hash: str = "java") -> None:
        if not isinstance(segments, SegmentSet):
            raise SegackTypeError(f"segments must be a SegmentSet, not {type(segments).__name__}")
        if hash not in HASHES:
            raise SegackValueError(f"hash must be one of {HASHES}, not {hash!r}")
        self.segments = segments
        self.hash = hash

    @property
    def num_partitions(self) -> int:
        """How many partitions the segments make: one per member.

        >>> SegmentPartitioner(SegmentSet.balanced(4), hash="spark").num_partitions
        4
        """
        return len(self.segments)

    def __call__(self, key: Any) -> int:
        hash_value = java_hash(key) if self.hash == "java" else spark_hash(key)
        return self.segments.owner_index(hash_value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SegmentPartitioner):
            return NotImplemented
        return (self.segments, self.hash) == (other.segments, other.hash)

    def __hash__(self) -> int:
        return hash((self.segments, self.hash))

    def __repr__(self) -> str:
        return f"SegmentPartitioner({self.segments!r}, hash={self.hash!r})"
