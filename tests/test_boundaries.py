"""Edges a mutation run of the spec found untested: the last index and offset each format holds,
offsets that only the int path or only the string path meets, the twins' hashes and reprs, the
commit throttle's clock, and what an acker keeps through a merge."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import segack.kernel as kernel
import segack.specs as spec
from segack.specs.acker import INDEX_MAX
from segack.specs.snapshot import OFFSET_LIMIT

TWINS = (kernel, spec)


EDGE_OFFSETS = [0, 1, -1, OFFSET_LIMIT - 1, -OFFSET_LIMIT + 1, "", "\ud800 lone", "\udfff"]


@pytest.mark.parametrize("offset", EDGE_OFFSETS)
def test_offsets_at_their_edges_survive_a_snapshot_in_both_twins(impl, offset):
    acker = impl.OffsetAcker(start_index=0)
    acker.ack(5, offset)  # pending, so the offset is written as itself, not as "the index"
    acker.ack(9, offset)
    for twin in TWINS:
        restored = twin.OffsetAcker.restore(acker.snapshot())
        assert restored.snapshot() == acker.snapshot()
        for index in range(9):
            if index != 5:
                restored.ack(index)
        assert restored.committed_offset == offset


def test_the_last_index_is_accepted_in_order_and_out_of_order(impl):
    in_order = impl.OffsetAcker(start_index=INDEX_MAX)
    assert in_order.ack(INDEX_MAX, "last") == "last"
    assert in_order.next_index == INDEX_MAX + 1
    in_order._check()  # the invariants hold at the very end of the index space
    out_of_order = impl.OffsetAcker(start_index=INDEX_MAX - 2)
    assert out_of_order.ack(INDEX_MAX, "last") is None  # a pending run that ends at the last index
    out_of_order._check()
    assert impl.OffsetAcker.restore(out_of_order.snapshot()).snapshot() == out_of_order.snapshot()
    assert out_of_order.ack(INDEX_MAX - 2) == INDEX_MAX - 2  # an offset defaults to its index
    assert out_of_order.ack(INDEX_MAX - 1) == "last"


@pytest.mark.parametrize(("value", "dtype"), [(2**31 - 1, "int"), (-(2**31), "int"),
                                              (2**63 - 1, "bigint"), (-(2**63), "bigint")])
def test_spark_hash_takes_each_types_own_bounds(value, dtype):
    assert kernel.spark_hash(value, dtype) == spec.spark_hash(value, dtype)


def test_the_twins_hash_and_show_alike():
    for make in (lambda impl: impl.Segment(5, 7), lambda impl: impl.SegmentSet.balanced(5),
                 lambda impl: impl.SegmentPartitioner(impl.SegmentSet.balanced(3), hash="java"),
                 lambda impl: impl.PerKeyPolicy(), lambda impl: impl.ConcurrentPolicy()):
        mine, theirs = make(kernel), make(spec)
        assert hash(mine) == hash(theirs)
        assert repr(mine) == repr(theirs)
    # Distinct values hash apart (a constant hash would still pass every equality test).
    assert len({hash(spec.Segment(*pair)) for pair in [(0, 1), (1, 1), (1, 3), (3, 3)]}) == 4
    assert hash(spec.SegmentSet.balanced(2)) != hash(spec.SegmentSet.balanced(3))


@given(st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=50))
def test_int32_hash_arrays_are_assigned_as_their_int64_values(hashes):
    segments = spec.SegmentSet.balanced(5)
    narrow = np.array(hashes, dtype=np.int32)
    assert spec.SegmentSet.balanced(5).assign(narrow).tolist() == segments.assign(
        np.array(hashes, dtype=np.int64)).tolist() == kernel.SegmentSet.balanced(5).assign(narrow).tolist()


@pytest.mark.parametrize("empty", [[], np.array([], dtype=np.uint8), np.array([], dtype=np.float64)])
def test_no_hashes_of_any_type_are_assigned_alike(empty):
    mine = kernel.SegmentSet.balanced(3).assign(empty)
    theirs = spec.SegmentSet.balanced(3).assign(empty)
    assert (mine.dtype, mine.tolist()) == (theirs.dtype, theirs.tolist())


def test_a_set_holding_the_finest_segment_is_recovered_from_its_ids(impl):
    ids = [2**depth - 1 for depth in range(1, 32)] + [0]  # a chain of splits down to mask 2**31 - 1
    segments = impl.SegmentSet.from_ids(ids)
    assert max(member.mask for member in segments) == 2**31 - 1
    assert sorted(member.segment_id for member in segments) == sorted(ids)


def test_a_merge_keeps_the_mergers_memory_bound(impl):
    bounded = impl.OffsetAcker(max_runs=2)
    other = impl.OffsetAcker()
    other.ack(3)
    bounded.merge(other)
    assert bounded.max_runs == 2
    bounded.ack(5)
    with pytest.raises(impl.AckerFullError):
        bounded.ack(7)


@pytest.mark.parametrize(("settings", "words"), [
    ({"every": 0}, "every must be a positive int or None, got 0"),
    ({"interval": -1}, "interval must be a non-negative number of seconds or None, got -1"),
])
def test_commit_points_name_the_setting_they_refuse(impl, settings, words):
    with pytest.raises(ValueError) as refused:
        list(impl.commit_points([(0, 0)], **settings))
    assert str(refused.value) == words


def test_commit_points_of_nothing_yield_nothing(impl):
    assert list(impl.commit_points([])) == []


def test_the_throttle_yields_once_the_interval_has_passed_not_later(monkeypatch):
    """The spec's rule, on a frozen clock: with ``interval=0`` no time needs to pass at all."""
    from segack.specs import commits

    monkeypatch.setattr(commits.time, "monotonic", lambda: 100.0)
    assert list(spec.commit_points([(0, "a"), (1, "b"), (2, "c")], interval=0)) == ["a", "b", "c"]
    assert list(spec.commit_points([(0, "a"), (1, "b"), (2, "c")], interval=1)) == ["c"]


def test_commit_points_async_uses_the_acker_and_the_interval_it_is_given(impl):
    async def completions():
        for index in (3, 4, 5):
            yield index, f"offset {index}"

    async def collect(**options):
        return [point async for point in impl.commit_points_async(completions(), **options)]

    resumed = impl.OffsetAcker(start_index=3)
    assert asyncio.run(collect(acker=resumed)) == ["offset 3", "offset 4", "offset 5"]
    assert resumed.next_index == 6
    assert asyncio.run(collect(acker=impl.OffsetAcker(start_index=3), interval=3600)) == ["offset 5"]
