"""A stateful model test: random splits and merges, kernel and spec in lockstep."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import segack.kernel as kernel
import segack.specs as spec
from tests.outcomes import outcome, plain

HASHES = st.integers(min_value=-(2**31), max_value=2**31 - 1)


class SplitAndMerge(RuleBasedStateMachine):
    """Both implementations hold the same segment set; every step must keep them equal."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel_set = kernel.SegmentSet([kernel.ROOT])
        self.spec_set = spec.SegmentSet([spec.ROOT])

    def _pair(self, position: int) -> tuple[object, object]:
        position %= len(self.spec_set)
        return self.kernel_set[position], self.spec_set[position]

    @precondition(lambda self: len(self.spec_set) < 64)
    @rule(position=st.integers(min_value=0))
    def split(self, position):
        kernel_member, spec_member = self._pair(position)
        kernel_result = outcome(lambda: self.kernel_set.split(kernel_member))
        spec_result = outcome(lambda: self.spec_set.split(spec_member))
        assert kernel_result == spec_result
        if spec_result[0] == "ok":
            self.kernel_set = self.kernel_set.split(kernel_member)
            self.spec_set = self.spec_set.split(spec_member)

    @rule(first=st.integers(min_value=0), second=st.integers(min_value=0))
    def merge(self, first, second):
        kernel_a, spec_a = self._pair(first)
        kernel_b, spec_b = self._pair(second)
        siblings = spec_a.is_mergeable_with(spec_b)
        assert kernel_a.is_mergeable_with(kernel_b) == siblings
        kernel_result = outcome(lambda: self.kernel_set.merge(kernel_a, kernel_b))
        assert kernel_result == outcome(lambda: self.spec_set.merge(spec_a, spec_b))
        assert (kernel_result[0] == "ok") == siblings
        if siblings:
            self.kernel_set = self.kernel_set.merge(kernel_a, kernel_b)
            self.spec_set = self.spec_set.merge(spec_a, spec_b)

    @rule(position=st.integers(min_value=0))
    def merge_with_own_sibling_when_it_exists(self, position):
        _, member = self._pair(position)
        if member.mask == 0:
            return
        sibling = spec.Segment(member.mergeable_segment_id(), member.mask)
        sibling_is_live = sibling in self.spec_set
        found = [other for other in self.spec_set if member.is_mergeable_with(other)]
        assert found == ([sibling] if sibling_is_live else [])
        if sibling_is_live:
            self.spec_set = self.spec_set.merge(member, sibling)
            self.kernel_set = self.kernel_set.merge(
                kernel.Segment(member.segment_id, member.mask),
                kernel.Segment(sibling.segment_id, sibling.mask),
            )

    @rule(hashes=st.lists(HASHES, min_size=1, max_size=20))
    def each_hash_has_exactly_one_owner(self, hashes):
        import numpy as np

        array = np.array(hashes, dtype=np.int64)
        assigned = self.kernel_set.assign(array).tolist()
        assert assigned == self.spec_set.assign(array).tolist()
        for hash_value, position in zip(hashes, assigned, strict=True):
            owners = [i for i, member in enumerate(self.spec_set) if member.matches(hash_value)]
            assert owners == [position]

    @rule(bits=st.integers(min_value=0, max_value=8))
    def key_groups_stay_whole(self, bits):
        """Each key group has one owner, the one that owns its hashes; finer sets are refused alike."""
        kernel_owners = outcome(lambda: self.kernel_set.key_group_owners(bits))
        assert kernel_owners == outcome(lambda: self.spec_set.key_group_owners(bits))
        if kernel_owners[0] != "ok":
            assert max(member.depth for member in self.spec_set) > bits
            return
        owners = kernel_owners[1][2]
        for group, position in enumerate(owners):
            assert self.spec_set[position].matches(group)
            assert group in self.spec_set[position].key_groups(bits)

    @invariant()
    def kernel_equals_spec(self):
        assert plain(self.kernel_set) == plain(self.spec_set)

    @invariant()
    def shares_cover_the_hash_space_once(self):
        assert sum(self.spec_set.shares()) == 1.0

    @invariant()
    def ids_give_back_the_masks(self):
        ids = list(self.spec_set.ids)
        assert spec.SegmentSet.from_ids(ids) == self.spec_set
        assert kernel.SegmentSet.from_ids(ids) == self.kernel_set
        for member in self.spec_set:
            assert spec.Segment.compute_segment(member.segment_id, ids) == member


SplitAndMerge.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestSplitAndMerge = SplitAndMerge.TestCase
