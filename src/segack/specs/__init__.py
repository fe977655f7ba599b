"""The executable specification: plain Python, written to be read.

Every public name of :mod:`segack.kernel` has a twin here with the same
signature and behaviour, errors included. The tests run against both.
"""

from __future__ import annotations

from segack import errors as _errors
from segack.errors import *  # noqa: F403  (the errors are the same objects in both twins)
from segack.specs.acker import OffsetAcker
from segack.specs.commits import commit_points, commit_points_async
from segack.specs.hashes import (
    SPARK_DTYPES,
    SPARK_HASH_SEED,
    java_hash,
    java_hash_many,
    spark_hash,
    spark_hash_many,
)
from segack.specs.partitioner import SegmentPartitioner
from segack.specs.planner import plan_segments
from segack.specs.policies import (
    ConcurrentPolicy,
    PerKeyPolicy,
    SequencingPolicy,
    SequentialPolicy,
)
from segack.specs.segments import MAX_KEY_GROUP_BITS, MAX_MASK_BITS, ROOT, Segment, SegmentSet

__all__ = [
    *_errors.__all__,
    "OffsetAcker",
    "commit_points",
    "commit_points_async",
    "MAX_KEY_GROUP_BITS",
    "MAX_MASK_BITS",
    "ROOT",
    "SPARK_DTYPES",
    "SPARK_HASH_SEED",
    "ConcurrentPolicy",
    "PerKeyPolicy",
    "Segment",
    "SegmentPartitioner",
    "SegmentSet",
    "SequencingPolicy",
    "SequentialPolicy",
    "java_hash",
    "java_hash_many",
    "plan_segments",
    "spark_hash",
    "spark_hash_many",
]
