"""A stateful model test: the kernel acker, the spec acker and a plain set, in lockstep."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import segack.kernel as kernel
import segack.specs as spec
from segack.pyx.acker import WINDOW_SIZE
from tests.outcomes import outcome
from tests.test_acker import state_of


def counters_of(acker):
    return (
        acker.next_index, acker.committed_offset, acker.pending_runs, acker.pending_count,
        acker.duplicates,
    )


OFFSETS = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.text(max_size=3))


class AckerMachine(RuleBasedStateMachine):
    """The set model knows only which indexes are done and each one's offset."""

    @initialize(
        start=st.integers(0, 4),
        ignore=st.booleans(),
        max_runs=st.sampled_from([None, None, 2, 5, 12]),
    )
    def start(self, start, ignore, max_runs):
        policy = "ignore" if ignore else "error"
        self.kernel = kernel.OffsetAcker(start, on_duplicate=policy, max_runs=max_runs)
        self.spec = spec.OffsetAcker(start, on_duplicate=policy, max_runs=max_runs)
        self.start_index = start
        self.done: dict[int, object] = {}

    def _near(self, data):
        """Just ahead of the committed point, or where the kernel's per-call window ends."""
        next_index = self.kernel.next_index
        return data.draw(
            st.one_of(
                st.integers(next_index - 2, next_index + 30),
                st.integers(next_index + WINDOW_SIZE - 3, next_index + WINDOW_SIZE + 3),
            )
        )

    def _record(self, pairs):
        for index, offset in pairs:
            self.done.setdefault(index, index if offset is None else offset)

    @rule(data=st.data(), offset=OFFSETS)
    def ack(self, data, offset):
        index = self._near(data)
        result = outcome(lambda: self.kernel.ack(index, offset))
        assert result == outcome(lambda: self.spec.ack(index, offset))
        if result[0] == "ok":
            self._record([(index, offset)])

    @rule(data=st.data(), with_offsets=st.sampled_from(["none", "array", "list"]))
    def ack_many(self, data, with_offsets):
        size = data.draw(st.integers(0, 12))
        indexes = [self._near(data) for _ in range(size)]
        offsets = None
        if with_offsets == "array":
            numbers = st.lists(st.integers(-(2**40), 2**40), min_size=size, max_size=size)
            offsets = np.array(data.draw(numbers), dtype=np.int64)
        elif with_offsets == "list":
            offsets = data.draw(st.lists(OFFSETS, min_size=size, max_size=size))
        array = np.array(indexes, dtype=np.int64)
        result = outcome(lambda: self.kernel.ack_many(array, offsets))
        assert result == outcome(lambda: self.spec.ack_many(array, offsets))
        if result[0] == "ok":
            given = offsets.tolist() if isinstance(offsets, np.ndarray) else offsets
            self._record(zip(indexes, given if given is not None else [None] * size, strict=True))

    @rule(bad=st.sampled_from([-1, -(2**40), 1.5, "3", None, 2**64]))
    def bad_input(self, bad):
        result = outcome(lambda: self.kernel.ack(bad))
        assert result[0] in ("SegackTypeError", "SegackValueError")
        assert result == outcome(lambda: self.spec.ack(bad))

    @rule()
    def snapshot_and_restore(self):
        kernel_token = outcome(self.kernel.snapshot)
        spec_token = outcome(self.spec.snapshot)
        assert kernel_token == spec_token
        if kernel_token[0] == "ok":
            self.kernel = kernel.OffsetAcker.restore(spec_token[1])
            self.spec = spec.OffsetAcker.restore(kernel_token[1])

    @rule(data=st.data())
    def merge_a_task(self, data):
        task_start = data.draw(st.integers(self.start_index, self.start_index + 20))
        chosen = data.draw(st.lists(st.integers(task_start, task_start + 40), unique=True, max_size=15))
        kernel_task = kernel.OffsetAcker(task_start)
        spec_task = spec.OffsetAcker(task_start)
        for index in chosen:
            offset = self.done.get(index, index)
            kernel_task.ack(index, offset)
            spec_task.ack(index, offset)
        result = outcome(lambda: self.kernel.merge(kernel_task))
        assert result == outcome(lambda: self.spec.merge(spec_task))
        if result[0] == "ok":
            self._record((index, self.done.get(index, index)) for index in chosen)

    @invariant()
    def kernel_equals_spec(self):
        # Each structure first checks its own invariants (before anything reads the runs).
        self.kernel._check()
        self.spec._check()
        # Reading the runs folds the kernel's per-call window into runs, so the invariant
        # reads only what leaves the window alone, and a rule compares the runs now and then.
        assert counters_of(self.kernel) == counters_of(self.spec)
        next_index = self.kernel.next_index
        probes = [*range(max(self.start_index, next_index - 1), next_index + 40),
                  *range(next_index + WINDOW_SIZE - 3, next_index + WINDOW_SIZE + 3)]
        assert [self.kernel.is_done(i) for i in probes] == [self.spec.is_done(i) for i in probes]

    @rule()
    def runs_agree(self):
        assert state_of(self.kernel) == state_of(self.spec)

    @invariant()
    def committed_point_matches_the_set(self):
        expected_next = self.start_index
        while expected_next in self.done:
            expected_next += 1
        assert self.spec.next_index == expected_next
        if expected_next > self.start_index:
            assert self.spec.committed_offset == self.done[expected_next - 1]
        else:
            assert self.spec.committed_offset is None
        beyond = sorted(index for index in self.done if index > expected_next)
        assert self.spec.pending_count == len(beyond)
        covered = [i for first, last in self.spec.runs() for i in range(first, last + 1)]
        assert covered == beyond
        for first, last, offset in self.spec.runs_with_offsets():
            assert offset == self.done[last]
            assert first - 1 not in self.done and last + 1 not in self.done


AckerMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestAckerMachine = AckerMachine.TestCase
