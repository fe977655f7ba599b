"""The planner against brute force: every cut of small split trees."""

from __future__ import annotations

import doctest
import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import segack.specs.planner
from segack.errors import SegackTypeError, SegackValueError
from segack.kernel import SegmentSet, plan_segments


@functools.cache
def _cuts(segment_id, depth, bits):
    """Every set of segments made by splitting ``Segment(segment_id, 2**depth - 1)`` down to
    ``bits`` mask bits, as tuples of (id, depth)."""
    whole = ((segment_id, depth),)
    if depth == bits:
        return (whole,)
    lefts = _cuts(segment_id, depth + 1, bits)
    rights = _cuts(segment_id + (1 << depth), depth + 1, bits)
    return (whole, *(left + right for left in lefts for right in rights))


def _load(segment_id, depth, counts):
    return sum(counts[segment_id::1 << depth])


def _largest_load(ids, counts):
    bits = len(counts).bit_length() - 1
    owners = SegmentSet.from_ids(ids).key_group_owners(bits)
    return int(np.bincount(owners, weights=counts, minlength=len(ids)).max())


@given(bits=st.integers(0, 4), data=st.data(), workers=st.integers(1, 20))
def test_the_plan_is_a_complete_set_with_the_smallest_largest_load_of_any_cut(bits, data, workers):
    counts = data.draw(st.lists(st.integers(0, 50), min_size=1 << bits, max_size=1 << bits))
    ids = plan_segments(counts, workers)
    planned = SegmentSet.from_ids(ids)  # a complete set, or a ValueError
    assert len(planned) <= workers and list(ids) == sorted(ids)
    assert all(member.depth <= bits for member in planned)
    best = min(max(_load(segment_id, depth, counts) for segment_id, depth in cut)
               for cut in _cuts(0, 0, bits) if len(cut) <= workers)
    assert _largest_load(ids, counts) == best


def test_a_hot_key_group_sets_the_floor_and_the_rest_is_spread_over_the_other_workers():
    counts = [1] * 64
    counts[5] = 100
    ids = plan_segments(counts, 8)
    assert len(ids) == 8 and _largest_load(ids, counts) == 100
    # balanced(8) puts the hot key group with seven others.
    balanced = SegmentSet.balanced(8).ids
    assert _largest_load(balanced, counts) == 107


@pytest.mark.parametrize(("counts", "workers", "ids"), [
    ([4, 0, 4, 0], 4, (0, 1, 2)),      # the empty half (1, 1) stays whole
    ([10, 1, 0, 0], 4, (0, 1)),        # splitting (0, 1) would only add an empty (2, 3)
    ([10, 1, 1, 1], 4, (0, 1, 2, 3)),  # every split lowers a largest load
    ([0, 0, 0, 0], 4, (0,)),
])
def test_a_node_splits_only_when_that_lowers_its_largest_load(counts, workers, ids):
    assert plan_segments(counts, workers) == ids


def test_the_finest_resolution_is_accepted():
    counts = np.zeros(1 << 16, dtype=np.int64)
    counts[[3, 70_000 % (1 << 16)]] = 5
    assert _largest_load(plan_segments(counts, 4), counts) == 5


def test_workers_beyond_the_key_groups_leave_each_key_group_alone():
    assert plan_segments([3, 1, 4, 1], 64) == (0, 1, 2, 3)
    assert plan_segments([7], 5) == (0,)


@pytest.mark.parametrize(("counts", "workers", "error", "match"), [
    ([1, 2, 3], 2, SegackValueError, "2\\*\\*bits of them"),
    ([], 2, SegackValueError, "not 0"),
    ([0] * (1 << 17), 2, SegackValueError, "not 131072"),
    ([1, -1], 2, SegackValueError, "key group 1 has -1"),
    ([1, 2], 0, SegackValueError, "workers must be at least 1"),
    ([1.5, 2], 1, SegackTypeError, "a count must be an integer"),
    ([1, 2], "2", SegackTypeError, "workers must be an integer"),
    ("ab", 1, SegackTypeError, "counts must be a sequence of integers, not str"),
    (7, 1, SegackTypeError, "counts must be a sequence of integers, not int"),
])
def test_bad_input_is_refused(counts, workers, error, match):
    with pytest.raises(error, match=match):
        plan_segments(counts, workers)


def test_numpy_counts_are_taken_as_they_are():
    counts = np.array([9, 1, 1, 1, 1, 1, 1, 1], dtype=np.int64)
    assert plan_segments(counts, 3) == plan_segments(counts.tolist(), 3)


def test_the_planners_examples_hold():
    runner = doctest.DocTestRunner()
    tests = doctest.DocTestFinder().find(segack.specs.planner)
    assert sum(len(test.examples) for test in tests) >= 2
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
