"""A compiled partition function for ``RDD.partitionBy``. Mirrors :mod:`segack.specs.partitioner`."""

from libc.stdint cimport uint32_t

from segack._shared import HASHES
from segack.errors import SegackTypeError, SegackValueError
from segack.pyx.segments cimport SegmentSet

from segack.pyx.hashes import java_hash, spark_hash

__all__ = ["SegmentPartitioner"]


cdef class SegmentPartitioner:
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

    cdef readonly SegmentSet segments
    cdef readonly str hash
    cdef bint _java

    def __init__(self, segments, hash="java"):
        if not isinstance(segments, SegmentSet):
            raise SegackTypeError(f"segments must be a SegmentSet, not {type(segments).__name__}")
        if hash not in HASHES:
            raise SegackValueError(f"hash must be one of {HASHES}, not {hash!r}")
        self.segments = segments
        self.hash = hash
        self._java = hash == "java"

    @property
    def num_partitions(self):
        """How many partitions the segments make: one per member.

        >>> SegmentPartitioner(SegmentSet.balanced(4), hash="spark").num_partitions
        4
        """
        return len(self.segments)

    def __call__(self, key):
        cdef int hash_value = java_hash(key) if self._java else spark_hash(key)
        return self.segments.owner_index_c(<uint32_t>hash_value)

    def __reduce__(self):
        return (SegmentPartitioner, (self.segments, self.hash))

    def __eq__(self, other):
        if not isinstance(other, SegmentPartitioner):
            return NotImplemented
        return (self.segments, self.hash) == (other.segments, other.hash)

    def __hash__(self):
        return hash((self.segments, self.hash))

    def __repr__(self):
        return f"SegmentPartitioner({self.segments!r}, hash={self.hash!r})"
