"""The compiled kernel: the same API as :mod:`segack.specs`, at C speed.

Importing it never falls back to the pure-Python specification: a missing
extension is an ``ImportError`` that says how to build it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

from segack import errors as _errors
from segack.errors import *  # noqa: F403  (the errors are the same objects in both twins)
from segack.specs import commits as _commits

try:
    from segack.pyx.acker import OffsetAcker
    from segack.pyx.hashes import (
        SPARK_DTYPES,
        SPARK_HASH_SEED,
        java_hash,
        java_hash_many,
        spark_hash,
        spark_hash_many,
    )
    from segack.pyx.partitioner import SegmentPartitioner
    from segack.pyx.segments import MAX_KEY_GROUP_BITS, MAX_MASK_BITS, ROOT, Segment, SegmentSet
except ImportError as error:  # pragma: no cover - only without a build
    raise ImportError(
        "segack's compiled kernel is missing; install the package so setup.py builds it "
        "(`python -m pip install .`), or for a checkout `python setup.py build_ext --inplace`"
    ) from error

from segack.specs.planner import plan_segments
from segack.specs.policies import (
    ConcurrentPolicy,
    PerKeyPolicy,
    SequencingPolicy,
    SequentialPolicy,
)


def commit_points(
    completions: Iterable[tuple[int, Any]],
    *,
    every: int | None = None,
    interval: float | None = None,
    acker: OffsetAcker | None = None,
) -> Iterator[Any]:
    """Yield committable offsets as ``(index, offset)`` completions arrive.

    ``every``: yield only every N-th advance; ``interval``: at most once per that
    many seconds (both: both must hold). Whatever is throttled is still yielded
    when the input ends or raises. ``acker``: the acker to feed (default: a new
    one starting at index 0); the acker's errors (duplicates, bad indexes) stop
    the stream after the pending point is yielded, like an input error.
    """
    return _commits.commit_points(
        completions, every=every, interval=interval,
        acker=OffsetAcker() if acker is None else acker,
    )


def commit_points_async(
    completions: AsyncIterable[tuple[int, Any]],
    *,
    every: int | None = None,
    interval: float | None = None,
    acker: OffsetAcker | None = None,
) -> AsyncIterator[Any]:
    """:func:`commit_points` for an async iterable of completions."""
    return _commits.commit_points_async(
        completions, every=every, interval=interval,
        acker=OffsetAcker() if acker is None else acker,
    )


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
