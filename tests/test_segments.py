"""Segment arithmetic, written once and run against the kernel and the spec."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import segack.kernel as kernel
import segack.specs as spec
from tests.outcomes import outcome

HASHES = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@st.composite
def segments_by_splitting(draw: st.DrawFn) -> tuple[int, int]:
    """A segment reached from the root by random splits, as ``(id, mask)``."""
    segment_id, mask = 0, 0
    for take_second in draw(st.lists(st.booleans(), max_size=31)):
        segment_id, mask = (segment_id + mask + 1 if take_second else segment_id), (mask << 1) | 1
    return segment_id, mask


def test_valid_segment_exposes_id_mask_and_depth(impl):
    segment = impl.Segment(5, 7)
    assert (segment.segment_id, segment.mask, segment.depth) == (5, 7, 3)
    assert segment.share == 1 / 8
    assert repr(segment) == "Segment(5, 7)"


@pytest.mark.parametrize("mask", [2, 5, 6, -1, 2**31, 2**32 - 1])
def test_mask_must_be_all_low_ones(impl, mask):
    with pytest.raises(ValueError, match="mask must be 2\\*\\*k - 1"):
        impl.Segment(0, mask)


@pytest.mark.parametrize(("segment_id", "mask"), [(8, 7), (-1, 7), (1, 0), (2**31 - 1, 2**30 - 1)])
def test_segment_id_must_fit_the_mask(impl, segment_id, mask):
    with pytest.raises(ValueError, match="uses bits outside mask"):
        impl.Segment(segment_id, mask)


@pytest.mark.parametrize("bad", ["1", 1.0, None])
def test_non_integers_are_type_errors(impl, bad):
    with pytest.raises(TypeError):
        impl.Segment(bad, 1)
    with pytest.raises(TypeError):
        impl.Segment(0, bad)
    with pytest.raises(TypeError):
        impl.ROOT.matches(bad)


def test_split_follows_the_rule(impl):
    # (3, 7): new mask 15; children 3 and 3 + 7 + 1.
    assert impl.Segment(3, 7).split() == (impl.Segment(3, 15), impl.Segment(11, 15))
    assert impl.Segment(3, 7).split_segment_id() == 11
    assert impl.ROOT.split() == (impl.Segment(0, 1), impl.Segment(1, 1))


def test_deepest_segment_cannot_split(impl):
    deepest = impl.Segment(2**31 - 1, 2**31 - 1)
    with pytest.raises(ValueError, match="cannot split"):
        deepest.split()
    with pytest.raises(ValueError, match="cannot split"):
        deepest.split_segment_id()


def test_root_has_no_sibling(impl):
    with pytest.raises(ValueError, match="no sibling"):
        impl.ROOT.mergeable_segment_id()
    assert impl.ROOT.is_mergeable_with(impl.ROOT) is False
    with pytest.raises(ValueError, match="not siblings"):
        impl.ROOT.merged_with(impl.ROOT)


def test_siblings_merge_into_their_parent(impl):
    left, right = impl.Segment(5, 7), impl.Segment(1, 7)
    assert left.mergeable_segment_id() == 1
    assert left.is_mergeable_with(right) and right.is_mergeable_with(left)
    assert left.merged_with(right) == impl.Segment(1, 3)
    assert not left.is_mergeable_with(impl.Segment(1, 3))
    with pytest.raises(ValueError, match="not siblings"):
        left.merged_with(impl.Segment(3, 7))
    with pytest.raises(TypeError):
        left.merged_with((1, 7))


@given(segments_by_splitting(), HASHES)
def test_children_share_the_parents_hashes_exactly(segment_tuple, hash_value):
    for impl in (kernel, spec):
        parent = impl.Segment(*segment_tuple)
        if parent.depth == 31:
            continue
        first, second = parent.split()
        assert parent.matches(hash_value) == (first.matches(hash_value) or second.matches(hash_value))
        assert not (first.matches(hash_value) and second.matches(hash_value))
        assert first.is_mergeable_with(second)
        assert first.merged_with(second) == parent == second.merged_with(first)


@given(segments_by_splitting(), HASHES)
def test_matches_uses_the_low_32_bits(segment_tuple, hash_value):
    for impl in (kernel, spec):
        segment = impl.Segment(*segment_tuple)
        wide = hash_value + (123 << 32)
        assert segment.matches(wide) == segment.matches(hash_value)
        assert segment.matches(hash_value) == ((hash_value & segment.mask) == segment.segment_id)


def test_segments_hash_compare_and_pickle(impl):
    a, b = impl.Segment(1, 3), impl.Segment(1, 3)
    assert a == b and hash(a) == hash(b) and a != impl.Segment(1, 7)
    assert sorted([impl.Segment(3, 3), impl.Segment(0, 3), impl.Segment(1, 3)])[0] == impl.Segment(0, 3)
    assert impl.Segment(0, 3) < impl.Segment(1, 3) <= impl.Segment(1, 3)
    assert pickle.loads(pickle.dumps(a)) == a
    assert len({a, b, impl.Segment(1, 7)}) == 2


@given(segments_by_splitting(), segments_by_splitting())
def test_segments_order_by_id_then_mask_in_every_comparison(first, second):
    for impl in (kernel, spec):
        a, b = impl.Segment(*first), impl.Segment(*second)
        assert (a < b, a <= b, a > b, a >= b, a == b, a != b) == (first < second, first <= second,
                                                                    first > second, first >= second,
                                                                    first == second, first != second)


def test_segments_compare_with_nothing_else(impl):
    segment = impl.Segment(1, 3)
    assert segment != (1, 3) and not segment == (1, 3)  # noqa: SIM201
    for compare in (lambda: segment < (1, 3), lambda: segment <= 1, lambda: segment > None,
                    lambda: segment >= "x"):
        with pytest.raises(TypeError):
            compare()


def test_compute_segments_recovers_masks(impl):
    ids = [0, 1, 2, 3, 5, 7]
    # Root -> 0,1 -> 0,2 / 1,3 -> 1,5 / 3,7.
    assert impl.Segment.compute_segments(ids) == [
        impl.Segment(0, 3), impl.Segment(1, 7), impl.Segment(2, 3),
        impl.Segment(3, 7), impl.Segment(5, 7), impl.Segment(7, 7),
    ]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 3], "must include 0"),
        ([0, 1, 1], "given twice"),
        ([0, 2], "segment id 2 cannot arise"),
        ([0, 1, 5], "segment id 5 cannot arise"),
        ([0, -1], "outside"),
        ([0, 2**31], "outside"),
    ],
)
def test_compute_segments_names_the_bad_id(impl, ids, message):
    with pytest.raises(ValueError, match=message):
        impl.Segment.compute_segments(ids)


def test_compute_segment_needs_a_live_id(impl):
    assert impl.Segment.compute_segment(1, [0, 1, 3]) == impl.Segment(1, 3)
    assert impl.Segment.compute_segment(0, [0]) == impl.ROOT
    with pytest.raises(ValueError, match="not among"):
        impl.Segment.compute_segment(4, [0, 1])


def test_split_balanced_splits_the_widest_first(impl):
    result = impl.Segment.split_balanced(impl.ROOT, 2)
    assert result == [impl.Segment(0, 3), impl.Segment(1, 1), impl.Segment(2, 3)]
    assert impl.Segment.split_balanced(impl.ROOT, 0) == [impl.ROOT]
    with pytest.raises(ValueError, match="non-negative"):
        impl.Segment.split_balanced(impl.ROOT, -1)


@given(segments_by_splitting(), st.integers(min_value=0, max_value=40))
def test_split_balanced_keeps_the_parents_hashes(segment_tuple, times):
    for impl in (kernel, spec):
        parent = impl.Segment(*segment_tuple)
        result = outcome(lambda parent=parent, impl=impl: impl.Segment.split_balanced(parent, times))
        if result[0] != "ok":
            assert "cannot split" in result[1]
            continue
        members = result[1]
        assert sum(2.0 ** -(mask.bit_length()) for _, mask in members) == pytest.approx(parent.share)
        assert max(m for _, m in members).bit_length() - min(m for _, m in members).bit_length() <= 1


# ---------------------------------------------------------------- SegmentSet


def test_segment_set_basics(impl):
    segments = impl.SegmentSet.balanced(3)
    assert list(segments) == [impl.Segment(0, 3), impl.Segment(1, 1), impl.Segment(2, 3)]
    assert len(segments) == 3 and segments[1] == impl.Segment(1, 1)
    assert segments.ids == (0, 1, 2)
    assert segments.shares() == (0.25, 0.5, 0.25)
    assert impl.Segment(1, 1) in segments
    assert segments.index(impl.Segment(2, 3)) == 2
    assert segments == impl.SegmentSet.from_ids([2, 0, 1])
    assert pickle.loads(pickle.dumps(segments)) == segments


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([], "at least one member"),
        ([(0, 1)], "hash 1 has no owner"),
        ([(0, 3), (1, 3), (2, 3)], "hash 3 has no owner"),
        ([(0, 0), (1, 1)], "overlap"),
        ([(0, 1), (1, 1), (1, 1)], "overlap"),
        ([(0, 1), (1, 3), (3, 3), (1, 1)], "overlap"),
    ],
)
def test_incomplete_sets_are_rejected_with_the_gap_or_overlap(impl, members, message):
    with pytest.raises(ValueError, match=message):
        impl.SegmentSet([impl.Segment(*member) for member in members])


def test_segment_set_split_and_merge_return_new_sets(impl):
    segments = impl.SegmentSet.balanced(2)
    split = segments.split(impl.Segment(1, 1))
    assert list(split) == [impl.Segment(0, 1), impl.Segment(1, 3), impl.Segment(3, 3)]
    assert list(segments) == [impl.Segment(0, 1), impl.Segment(1, 1)]
    merged = split.merge(impl.Segment(3, 3), impl.Segment(1, 3))
    assert merged == segments


def test_segment_set_errors_change_nothing(impl):
    segments = impl.SegmentSet.balanced(3)
    before = list(segments)
    with pytest.raises(ValueError, match="not a member"):
        segments.split(impl.Segment(1, 3))
    with pytest.raises(ValueError, match="not siblings"):
        segments.merge(impl.Segment(0, 3), impl.Segment(1, 1))
    with pytest.raises(TypeError):
        segments.split("(1, 1)")
    assert list(segments) == before


def test_assign_matches_each_members_rule(impl):
    segments = impl.SegmentSet(impl.Segment.split_balanced(impl.ROOT, 23))
    rng = np.random.default_rng(7)
    hashes = rng.integers(-(2**31), 2**31, size=2000, dtype=np.int64)
    assigned = segments.assign(hashes)
    assert assigned.dtype == np.int32
    for hash_value, position in zip(hashes.tolist(), assigned.tolist(), strict=True):
        assert segments[position].matches(hash_value)
        assert segments.owner(hash_value) == segments[position]
    assert segments.assign(hashes.astype(np.int32)).tolist() == assigned.tolist()


def test_assign_handles_members_deeper_than_its_table(impl):
    # One chain of splits 25 deep: the kernel's lookup table stops at 20 bits.
    members = [impl.ROOT]
    for _ in range(25):
        deepest = max(members, key=lambda m: m.mask)
        members.remove(deepest)
        members.extend(deepest.split())
    segments = impl.SegmentSet(members)
    hashes = np.array([0, 1, 2**24, 2**25, -1, 12345678, 2**25 + 2**24], dtype=np.int64)
    for hash_value, position in zip(hashes.tolist(), segments.assign(hashes).tolist(), strict=True):
        assert segments[position].matches(hash_value)


def test_assign_rejects_bad_arrays(impl):
    segments = impl.SegmentSet.balanced(4)
    with pytest.raises(TypeError, match="int32 or int64"):
        segments.assign(np.array([1.5]))
    with pytest.raises(ValueError, match="one-dimensional"):
        segments.assign(np.zeros((2, 2), dtype=np.int64))
    assert segments.assign([]).tolist() == []


@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=30))
def test_kernel_and_spec_agree_on_compute_segments(ids):
    assert outcome(lambda: kernel.Segment.compute_segments(ids)) == outcome(
        lambda: spec.Segment.compute_segments(ids)
    )


@given(
    st.integers(min_value=0, max_value=300),
    st.lists(st.integers(min_value=0, max_value=300), max_size=20, unique=True),
)
def test_kernel_and_spec_agree_on_compute_segment(segment_id, ids):
    assert outcome(lambda: kernel.Segment.compute_segment(segment_id, ids)) == outcome(
        lambda: spec.Segment.compute_segment(segment_id, ids)
    )


@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0, 1, 3, 7, 15, 31])), max_size=12))
def test_kernel_and_spec_agree_on_arbitrary_member_lists(pairs):
    def build(impl):
        return lambda: impl.SegmentSet([impl.Segment(i, m) for i, m in pairs])

    assert outcome(build(kernel)) == outcome(build(spec))


# ------------------------------------------------------------- key groups


@given(segment_tuple=segments_by_splitting(), bits=st.integers(min_value=0, max_value=10))
def test_a_segment_owns_exactly_the_key_groups_whose_hashes_it_matches(segment_tuple, bits):
    for impl in (kernel, spec):
        segment = impl.Segment(*segment_tuple)
        if segment.depth > bits:
            with pytest.raises(ValueError, match="finer than"):
                segment.key_groups(bits)
            continue
        # A key group g holds the hashes h with h & (2**bits - 1) == g, g among them.
        expected = [group for group in range(2**bits) if segment.matches(group)]
        assert list(segment.key_groups(bits)) == expected


@given(
    members=st.integers(min_value=1, max_value=40),
    bits=st.integers(min_value=0, max_value=9),
    hashes=st.lists(HASHES, max_size=30),
)
def test_key_group_owners_agree_with_assign_for_every_hash(members, bits, hashes):
    segments_spec = spec.SegmentSet.balanced(members)
    deepest = max(member.depth for member in segments_spec)
    for impl in (kernel, spec):
        segments = impl.SegmentSet.balanced(members)
        if deepest > bits:
            with pytest.raises(ValueError, match="finer than"):
                segments.key_group_owners(bits)
            continue
        owners = segments.key_group_owners(bits)
        assert owners.dtype == np.int32 and len(owners) == 2**bits
        array = np.array(hashes, dtype=np.int64)
        assert owners[array & (2**bits - 1)].tolist() == segments.assign(array).tolist()


@pytest.mark.parametrize("bits", [-1, 17, 2**40])
def test_key_group_bits_outside_the_range_are_refused(impl, bits):
    with pytest.raises(ValueError, match=r"key-group bits must be in 0\.\.16"):
        impl.ROOT.key_groups(bits)
    with pytest.raises(ValueError, match=r"key-group bits must be in 0\.\.16"):
        impl.SegmentSet.balanced(2).key_group_owners(bits)
    with pytest.raises(TypeError):
        impl.ROOT.key_groups(1.5)


def test_a_set_finer_than_its_key_groups_names_the_member(impl):
    segments = impl.SegmentSet.from_ids([0, 1, 3, 7])
    assert segments.key_group_owners(3).tolist() == [0, 1, 0, 2, 0, 1, 0, 3]
    with pytest.raises(ValueError, match=r"Segment\(3, 7\) is finer than 4 key groups: its mask has 3 bits"):
        segments.key_group_owners(2)


@given(st.integers(min_value=1, max_value=70), st.integers(min_value=-3, max_value=18))
def test_kernel_and_spec_agree_on_key_groups(members, bits):
    def owners(impl):
        return lambda: impl.SegmentSet.balanced(members).key_group_owners(bits)

    def groups(impl):
        return lambda: list(impl.SegmentSet.balanced(members)[-1].key_groups(bits))

    assert outcome(owners(kernel)) == outcome(owners(spec))
    assert outcome(groups(kernel)) == outcome(groups(spec))


def test_init_again_replaces_the_set_and_frees_the_old_tables(impl):
    import tracemalloc

    fine = impl.SegmentSet.balanced(4096)
    coarse = impl.SegmentSet.balanced(2)
    hashes = np.array([0, 1, 2, 3, 4095, -1], dtype=np.int32)
    reused = impl.SegmentSet.balanced(4096)
    reused.__init__(coarse.members)
    assert reused.members == coarse.members
    assert reused.assign(hashes).tolist() == coarse.assign(hashes).tolist()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(12):
            reused.__init__(fine.members)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # One set's tables are about 40 KB: the live one, and twelve leaked copies would be 480 KB.
    assert grown < 200_000, grown
