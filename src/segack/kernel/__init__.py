"""The compiled kernel: the same API as :mod:`segack.specs`, at C speed.

Importing it never falls back to the pure-Python specification: a missing
extension is an ``ImportError`` that says how to build it.
"""

from __future__ import annotations

try:
    from segack.pyx.hashes import (
        SPARK_DTYPES,
        SPARK_HASH_SEED,
        java_hash,
        java_hash_many,
        spark_hash,
        spark_hash_many,
    )
    from segack.pyx.segments import MAX_MASK_BITS, ROOT, Segment, SegmentSet
except ImportError as error:  # pragma: no cover - only without a build
    raise ImportError(
        "segack's compiled kernel is missing; install the package so setup.py builds it "
        "(`python -m pip install .`), or for a checkout `python setup.py build_ext --inplace`"
    ) from error

from segack.specs.policies import (
    ConcurrentPolicy,
    PerKeyPolicy,
    SequencingPolicy,
    SequentialPolicy,
)

__all__ = [
    "MAX_MASK_BITS",
    "ROOT",
    "SPARK_DTYPES",
    "SPARK_HASH_SEED",
    "ConcurrentPolicy",
    "PerKeyPolicy",
    "Segment",
    "SegmentSet",
    "SequencingPolicy",
    "SequentialPolicy",
    "java_hash",
    "java_hash_many",
    "spark_hash",
    "spark_hash_many",
]
