"""Every public call refuses bad input alike in the kernel and the spec: the same error type and the
same words, so that a user reads one message whichever twin runs. Each case must be refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import segack.kernel as kernel
import segack.specs as spec
from segack.specs.acker import DUPLICATES_MAX, INDEX_MAX
from segack.specs.snapshot import OFFSET_LIMIT
from tests.outcomes import outcome


def _restore_with(impl: Any, mutate: Callable[[bytearray], None]) -> Any:
    data = bytearray(impl.OffsetAcker(start_index=3).snapshot())
    mutate(data)
    return impl.OffsetAcker.restore(bytes(data))


def _full(impl: Any) -> Any:
    acker = impl.OffsetAcker(max_runs=1)
    acker.ack(2)
    return acker


REFUSALS: dict[str, Callable[[Any], Any]] = {
    # Segments: each argument named when it is not an int or not a segment.
    "Segment(str id)": lambda impl: impl.Segment("1", 1),
    "Segment(str mask)": lambda impl: impl.Segment(1, "1"),
    "Segment(float id)": lambda impl: impl.Segment(1.0, 1),
    "Segment.matches(str)": lambda impl: impl.Segment(1, 1).matches("7"),
    "Segment.is_mergeable_with(tuple)": lambda impl: impl.Segment(1, 1).is_mergeable_with((0, 1)),
    "Segment.merged_with(tuple)": lambda impl: impl.Segment(1, 1).merged_with((0, 1)),
    "Segment.merged_with(not a sibling)": lambda impl: impl.Segment(1, 3).merged_with(impl.Segment(0, 1)),
    "Segment.mergeable_segment_id(root)": lambda impl: impl.ROOT.mergeable_segment_id(),
    "Segment.compute_segment(str)": lambda impl: impl.Segment.compute_segment("1", [0, 1]),
    "Segment.split_balanced(tuple)": lambda impl: impl.Segment.split_balanced((0, 0), 2),
    "Segment.split_balanced(str times)": lambda impl: impl.Segment.split_balanced(impl.ROOT, "2"),
    "Segment.split_balanced(negative)": lambda impl: impl.Segment.split_balanced(impl.ROOT, -1),
    "Segment.key_groups(str)": lambda impl: impl.ROOT.key_groups("4"),
    "SegmentSet(ints)": lambda impl: impl.SegmentSet([0, 1]),
    "SegmentSet(overlap)": lambda impl: impl.SegmentSet([impl.Segment(0, 1), impl.Segment(1, 1),
                                                         impl.Segment(1, 3)]),
    "SegmentSet(gap)": lambda impl: impl.SegmentSet([impl.Segment(0, 1), impl.Segment(1, 3)]),
    "SegmentSet.balanced(str)": lambda impl: impl.SegmentSet.balanced("3"),
    "SegmentSet.balanced(0)": lambda impl: impl.SegmentSet.balanced(0),
    "SegmentSet.from_ids(str)": lambda impl: impl.SegmentSet.from_ids(["0", "1"]),
    "SegmentSet.index(tuple)": lambda impl: impl.SegmentSet.balanced(2).index((0, 1)),
    "SegmentSet.owner_index(str)": lambda impl: impl.SegmentSet.balanced(2).owner_index("5"),
    "SegmentSet.key_group_owners(str)": lambda impl: impl.SegmentSet.balanced(2).key_group_owners("4"),
    # Hashes: the bounds of each Spark type, and what is not a sequence.
    "spark_hash(int below int32)": lambda impl: impl.spark_hash(-(2**31) - 1, "int"),
    "spark_hash(int above int32)": lambda impl: impl.spark_hash(2**31, "int"),
    "spark_hash(below int64)": lambda impl: impl.spark_hash(-(2**63) - 1, "bigint"),
    "spark_hash(above int64)": lambda impl: impl.spark_hash(2**63, "bigint"),
    "spark_hash(lone surrogate)": lambda impl: impl.spark_hash("a\ud800"),
    "spark_hash_many(int)": lambda impl: impl.spark_hash_many(5),
    "java_hash_many(int)": lambda impl: impl.java_hash_many(5),
    # The acker and its snapshots.
    "OffsetAcker.merge(int)": lambda impl: impl.OffsetAcker().merge(3),
    "OffsetAcker.ack(past INDEX_MAX)": lambda impl: _acked(impl, INDEX_MAX + 1, None, start=INDEX_MAX),
    "OffsetAcker.ack(full)": lambda impl: _full(impl).ack(4),
    "snapshot(offset -OFFSET_LIMIT)": lambda impl: _acked(impl, 5, -OFFSET_LIMIT).snapshot(),
    "snapshot(offset OFFSET_LIMIT)": lambda impl: _acked(impl, 5, OFFSET_LIMIT).snapshot(),
    "snapshot(offset float)": lambda impl: _acked(impl, 5, 1.5).snapshot(),
    "restore(str)": lambda impl: impl.OffsetAcker.restore("not bytes"),
    "restore(None)": lambda impl: impl.OffsetAcker.restore(None),
    "restore(version 99)": lambda impl: _restore_with(impl, _set_version(99)),
    "restore(wrong length)": lambda impl: impl.OffsetAcker.restore(impl.OffsetAcker().snapshot() + b"\0"),
    "restore(checksum)": lambda impl: _restore_with(impl, _flip_last_byte),
    "restore(index past INDEX_MAX)": lambda impl: _past_max(impl),
    "restore(duplicates past DUPLICATES_MAX)": lambda impl: _too_many_duplicates(impl),
    # Commit points: the throttle's settings.
    "commit_points(every=0)": lambda impl: list(impl.commit_points([(0, 0)], every=0)),
    "commit_points(every=True)": lambda impl: list(impl.commit_points([(0, 0)], every=True)),
    "commit_points(interval=-1)": lambda impl: list(impl.commit_points([(0, 0)], interval=-1)),
    "commit_points(interval=nan)": lambda impl: list(impl.commit_points([(0, 0)], interval=float("nan"))),
}


def _acked(impl: Any, index: int, offset: Any, start: int = 0, **settings: Any) -> Any:
    acker = impl.OffsetAcker(start_index=start, **settings)
    acker.ack(index, offset)
    return acker


def _set_version(version: int) -> Callable[[bytearray], None]:
    def mutate(data: bytearray) -> None:
        data[4] = version

    return mutate


def _flip_last_byte(data: bytearray) -> None:
    data[-1] ^= 0xFF


def _past_max(impl: Any) -> Any:
    """A snapshot, sealed validly, that says an index past INDEX_MAX is done."""
    from segack.specs import snapshot

    state = snapshot.AckerState(INDEX_MAX - 2, INDEX_MAX - 2, None, 0, "error", None,
                                [(INDEX_MAX, INDEX_MAX + 5, None)])
    return impl.OffsetAcker.restore(snapshot.encode(state))


def _too_many_duplicates(impl: Any) -> Any:
    from segack.specs import snapshot

    state = snapshot.AckerState(0, 0, None, DUPLICATES_MAX + 1, "ignore", None, [])
    return impl.OffsetAcker.restore(snapshot.encode(state))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_both_twins_refuse_with_the_same_error_and_words(case):
    call = REFUSALS[case]
    mine, theirs = outcome(lambda: call(kernel)), outcome(lambda: call(spec))
    assert mine[0] != "ok", f"{case} was not refused: {mine}"
    assert mine == theirs
