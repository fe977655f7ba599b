"""The offset acker, written once and run against the kernel and the spec."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segack.errors import AckerFullError, DuplicateAckError
from tests.outcomes import outcome


def state_of(acker):
    """Every observable of an acker, to prove a failed call changed nothing."""
    return (
        acker.next_index, acker.committed_offset, acker.pending_runs, acker.pending_count,
        acker.duplicates, acker.runs_with_offsets(),
    )


def test_in_order_acks_commit_each_one(impl):
    acker = impl.OffsetAcker()
    assert acker.committed_offset is None
    assert [acker.ack(i) for i in range(5)] == [0, 1, 2, 3, 4]
    assert acker.next_index == 5 and acker.pending_runs == 0


def test_out_of_order_acks_wait_for_the_gap(impl):
    acker = impl.OffsetAcker()
    assert acker.ack(2, "c") is None
    assert acker.ack(1, "b") is None
    assert acker.runs() == [(1, 2)]
    assert acker.ack(0, "a") == "c"
    assert acker.next_index == 3 and acker.runs() == []


def test_runs_keep_the_offset_of_their_last_index(impl):
    acker = impl.OffsetAcker(10)
    acker.ack(12, "x12")
    acker.ack(14, "x14")
    acker.ack(13, "x13")
    assert acker.runs_with_offsets() == [(12, 14, "x14")]
    acker.ack(11, "x11")
    assert acker.pending_count == 4 and acker.is_done(13) and not acker.is_done(15)
    assert acker.ack(10, "x10") == "x14"


def test_duplicates_are_errors_naming_the_index_and_change_nothing(impl):
    acker = impl.OffsetAcker()
    acker.ack(0)
    acker.ack(5)
    before = state_of(acker)
    for index in (0, 5):
        with pytest.raises(DuplicateAckError, match=f"index {index} was already acked") as info:
            acker.ack(index)
        assert info.value.index == index
    assert state_of(acker) == before


def test_duplicates_can_be_counted_and_skipped(impl):
    acker = impl.OffsetAcker(on_duplicate="ignore")
    acker.ack(0)
    acker.ack(3, "first")
    assert acker.ack(3, "second") is None and acker.ack(0) is None
    assert acker.duplicates == 2 and acker.runs_with_offsets() == [(3, 3, "first")]


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [(-1, ValueError, "negative"), (4, ValueError, "below the start index 5"),
     (1.0, TypeError, "integer"), ("7", TypeError, "integer"), (None, TypeError, "integer"),
     (True, TypeError, "bool"), (2**63, ValueError, "larger than")],
)
def test_bad_indexes_are_rejected_and_change_nothing(impl, index, error, message):
    acker = impl.OffsetAcker(5)
    acker.ack(7)
    before = state_of(acker)
    with pytest.raises(error, match=message):
        acker.ack(index)
    if error is ValueError and index < 2**63:
        with pytest.raises(ValueError, match=message):
            acker.ack_many([8, index])
    elif error is TypeError:
        with pytest.raises(TypeError, match="integer array"):
            acker.ack_many(np.array([8, index], dtype=object))
    assert state_of(acker) == before


@pytest.mark.parametrize(
    "kwargs", [{"start_index": -1}, {"on_duplicate": "skip"}, {"max_runs": -1}, {"start_index": "0"},
               {"start_index": 3, "next_index": 4}],
)
def test_bad_settings(impl, kwargs):
    with pytest.raises((ValueError, TypeError)):
        impl.OffsetAcker(**kwargs)


def test_start_index_names_the_start_and_next_index_still_works_with_a_warning(impl):
    acker = impl.OffsetAcker(start_index=7)
    assert acker.start_index == acker.next_index == 7
    with pytest.warns(DeprecationWarning, match="start_index"):
        old = impl.OffsetAcker(next_index=7)
    assert old.start_index == 7 and old == acker
    with pytest.raises(ValueError, match="start_index must be in"):
        impl.OffsetAcker(start_index=-1)


def test_max_runs_refuses_before_any_change(impl):
    acker = impl.OffsetAcker(max_runs=2)
    acker.ack(2)
    acker.ack(4)
    before = state_of(acker)
    with pytest.raises(AckerFullError, match="3 pending runs, more than max_runs=2"):
        acker.ack(6)
    with pytest.raises(AckerFullError):
        acker.ack_many([8, 10, 3])
    assert state_of(acker) == before
    acker.ack(3)  # joins two runs: fewer runs is always allowed
    acker.ack(6)
    assert acker.runs() == [(2, 4), (6, 6)]
    assert acker.ack_many([0, 1, 5]) == 6


def test_ack_many_equals_ack_one_by_one(impl):
    rng = np.random.default_rng(3)
    order = rng.permutation(2000)
    one_by_one = impl.OffsetAcker()
    for index in order[:1500].tolist():
        one_by_one.ack(index)
    batch = impl.OffsetAcker()
    batch.ack_many(order[:700])
    batch.ack_many(order[700:1500].astype(np.int32))
    assert state_of(batch) == state_of(one_by_one)


def test_ack_many_is_all_or_nothing(impl):
    acker = impl.OffsetAcker()
    acker.ack(3)
    before = state_of(acker)
    with pytest.raises(DuplicateAckError, match="index 3"):
        acker.ack_many([0, 1, 3, 4])
    with pytest.raises(DuplicateAckError, match="index 1"):
        acker.ack_many([0, 1, 2, 1])
    with pytest.raises(ValueError, match="negative"):
        acker.ack_many([0, -5, 3])
    with pytest.raises(TypeError, match="integer array"):
        acker.ack_many(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="2 offsets for 3 indexes"):
        acker.ack_many([0, 1, 2], offsets=["a", "b"])
    assert state_of(acker) == before


def test_ack_many_offsets(impl):
    acker = impl.OffsetAcker()
    assert acker.ack_many([1, 0], offsets=np.array([100, 99])) == 100
    assert acker.ack_many([3, 2], offsets=["d", "c"]) == "d"
    assert acker.ack_many(np.array([], dtype=np.int64)) is None


def test_snapshot_round_trip(impl):
    acker = impl.OffsetAcker(5, on_duplicate="ignore", max_runs=1000)
    acker.ack(5, "s5")
    for index in (7, 8, 20, 2**40):
        acker.ack(index, -index if index % 2 else f"o{index}")
    acker.ack(7)
    restored = impl.OffsetAcker.restore(acker.snapshot())
    assert restored == acker and state_of(restored) == state_of(acker)
    assert (restored.start_index, restored.on_duplicate, restored.max_runs) == (5, "ignore", 1000)
    assert pickle.loads(pickle.dumps(acker)) == acker


def test_snapshot_is_compact(impl):
    acker = impl.OffsetAcker()
    acker.ack_many(np.arange(1, 20_000, 2))  # 10,000 single-index runs
    token = acker.snapshot()
    assert acker.pending_runs == 10_000
    assert len(token) <= 3 * 10_000 + 32


def test_snapshot_rejects_offsets_it_cannot_keep(impl):
    acker = impl.OffsetAcker()
    acker.ack(1, 1.5)
    with pytest.raises(TypeError, match="only int and str offsets"):
        acker.snapshot()


def test_restore_rejects_foreign_and_damaged_tokens(impl):
    with pytest.raises(ValueError, match="not a segack acker snapshot"):
        impl.OffsetAcker.restore(b"PK\x03\x04 a zip file")
    with pytest.raises(TypeError):
        impl.OffsetAcker.restore("SGAK")
    token = bytearray(impl.OffsetAcker().snapshot())
    token[4] = 9
    with pytest.raises(ValueError, match="version 9"):
        impl.OffsetAcker.restore(bytes(token))


def _tokens(impl):
    plain = impl.OffsetAcker()
    busy = impl.OffsetAcker(3, on_duplicate="ignore", max_runs=50)
    for index, offset in [(3, "a"), (4, 44), (9, None), (10, "z"), (30, -7), (31, None), (2**35, "big")]:
        busy.ack(index, offset)
    return [plain.snapshot(), busy.snapshot()]


def test_every_single_byte_change_and_truncation_is_rejected(impl):
    for token in _tokens(impl):
        for position in range(len(token)):
            for value in range(256):
                if value == token[position]:
                    continue
                damaged = token[:position] + bytes([value]) + token[position + 1 :]
                with pytest.raises(ValueError):
                    impl.OffsetAcker.restore(damaged)
        for length in range(len(token)):
            with pytest.raises(ValueError):
                impl.OffsetAcker.restore(token[:length])


def test_merge_is_the_union(impl):
    driver = impl.OffsetAcker()
    task_a, task_b = impl.OffsetAcker(), impl.OffsetAcker()
    for index in (0, 2, 4, 6):
        task_a.ack(index)
    for index in (1, 3, 7, 9):
        task_b.ack(index)
    assert driver.merge(task_a) == 0
    assert driver.merge(task_b) == 4
    assert driver.runs() == [(6, 7), (9, 9)]
    assert driver.merge(task_a) is None  # merging again adds nothing


def test_merge_rejects_conflicts_and_earlier_streams(impl):
    driver = impl.OffsetAcker(10)
    driver.ack(12, "a")
    before = state_of(driver)
    other = impl.OffsetAcker(10)
    other.ack(12, "b")
    with pytest.raises(ValueError, match="index 12 has offset 'a' here and 'b'"):
        driver.merge(other)
    with pytest.raises(ValueError, match="below the start index 10"):
        driver.merge(impl.OffsetAcker(5))
    with pytest.raises(TypeError):
        driver.merge({12: "a"})
    assert state_of(driver) == before


def test_merge_respects_max_runs(impl):
    driver = impl.OffsetAcker(max_runs=1)
    driver.ack(2)
    other = impl.OffsetAcker()
    other.ack(4)
    with pytest.raises(AckerFullError):
        driver.merge(other)
    assert driver.runs() == [(2, 2)]


def test_many_runs_split_and_empty_blocks_like_the_spec():
    """Thousands of runs: the kernel's blocks split, shrink and vanish; the spec has no blocks."""
    import segack.kernel as kernel
    import segack.specs as spec

    rng = np.random.default_rng(11)
    evens = np.arange(0, 6000, 2)
    odds = rng.permutation(np.arange(1, 6000, 2))
    fast, slow = kernel.OffsetAcker(), spec.OffsetAcker()
    fast.ack_many(evens[1:])
    for index in evens[1:].tolist():
        slow.ack(index)
    assert fast.pending_runs == slow.pending_runs == 2999
    for chunk in np.array_split(odds, 40):
        fast.ack_many(chunk)
        slow.ack_many(chunk)
        assert state_of(fast) == state_of(slow)
        probe = rng.integers(0, 6000, size=50).tolist()
        assert [fast.is_done(i) for i in probe] == [slow.is_done(i) for i in probe]
    assert fast.ack(0) == slow.ack(0) == 5999
    assert fast.pending_runs == 0 and fast.next_index == 6000


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    span=st.integers(100, 20_000),
    density=st.floats(0.05, 1.0),
    batches=st.integers(1, 6),
    max_runs=st.one_of(st.none(), st.integers(1, 3000)),
)
def test_large_batches_agree_with_the_spec(seed, span, density, batches, max_runs):
    """Batches big enough for the kernel's byte-map and linear-merge paths, over runs that
    already hold Python offsets, including duplicates and overflow of ``max_runs``."""
    import segack.kernel as kernel
    import segack.specs as spec

    rng = np.random.default_rng(seed)
    fast = kernel.OffsetAcker(on_duplicate="ignore" if seed % 2 else "error", max_runs=max_runs)
    slow = spec.OffsetAcker(on_duplicate="ignore" if seed % 2 else "error", max_runs=max_runs)
    order = rng.permutation(span)
    for index in order[:40].tolist():
        offset = f"event-{index}"
        assert outcome(lambda i=index, o=offset: fast.ack(i, o)) == outcome(
            lambda i=index, o=offset: slow.ack(i, o))
    fresh = order[40:int(span * density)]
    for chosen in np.array_split(fresh, batches):
        if rng.random() < 0.2:
            chosen = np.concatenate([chosen, order[:1] if rng.random() < 0.5 else chosen[:1]])
        offsets = chosen * 3 if rng.random() < 0.5 else None
        assert outcome(lambda c=chosen, o=offsets: fast.ack_many(c, o)) == outcome(
            lambda c=chosen, o=offsets: slow.ack_many(c, o))
        assert state_of(fast) == state_of(slow)


def _fed_twins(rng, start, count, span, policy="error"):
    """A kernel and a spec acker given the same ``count`` acks at random indexes from ``start``,
    with every kind of offset: the index itself, 64-bit ints, bigger ints, strs and a bool."""
    import segack.kernel as kernel
    import segack.specs as spec

    fast, slow = kernel.OffsetAcker(start, on_duplicate=policy), spec.OffsetAcker(start, on_duplicate=policy)
    indexes = rng.choice(span, size=min(count, span), replace=False) + start
    kinds = rng.integers(0, 20, size=len(indexes))
    for index, kind in zip(indexes.tolist(), kinds.tolist(), strict=True):
        offset = [None, -index, 2**64 + index, f"o{index}", True][min(kind // 3, 4)] if kind else None
        fast.ack(index, offset)
        slow.ack(index, offset)
    if policy == "ignore":
        again = indexes[: len(indexes) // 10].tolist()
        fast.ack_many(again)
        slow.ack_many(again)
    return fast, slow


def _restored(impl, token):
    acker = impl.OffsetAcker.restore(token)
    return (acker.start_index, acker.on_duplicate, acker.max_runs, state_of(acker))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    start=st.integers(0, 3),
    count=st.integers(0, 3000),
    span=st.integers(1, 6000),
    their_start=st.integers(0, 6),
    conflict=st.sampled_from([None, ("conflict", "other"), (7, 8)]),
)
def test_snapshots_and_merges_of_many_runs_agree_with_the_spec(
    seed, start, count, span, their_start, conflict
):
    """Thousands of runs with mixed offsets and counted duplicates: the kernel writes the same
    token bytes, reads either implementation's token back to the same acker, and merges another
    acker's runs (sometimes with a conflicting offset, sometimes from an earlier start) to the
    same result."""
    import segack.kernel as kernel
    import segack.specs as spec

    rng = np.random.default_rng(seed)
    fast, slow = _fed_twins(rng, start, count, span, policy="ignore")
    fast_token, slow_token = outcome(fast.snapshot), outcome(slow.snapshot)
    assert fast_token == slow_token
    if fast_token[0] == "ok":
        token = slow_token[1]
        assert outcome(lambda: _restored(kernel, token)) == outcome(lambda: _restored(spec, token))
        assert _restored(kernel, fast_token[1])[3] == state_of(slow)
    fast_task, slow_task = _fed_twins(rng, their_start, count // 2, span, policy="ignore")
    if conflict and slow_task.pending_runs:
        last = slow_task.runs_with_offsets()[-1][1]
        if last + 1 >= start and not slow.is_done(last + 1) and not slow_task.is_done(last + 1):
            fast_task.ack(last + 1, conflict[0])
            slow_task.ack(last + 1, conflict[0])
            fast.ack(last + 1, conflict[1])
            slow.ack(last + 1, conflict[1])
    before = state_of(fast)
    result = outcome(lambda: fast.merge(fast_task))
    assert result == outcome(lambda: slow.merge(slow_task))
    assert state_of(fast) == state_of(slow)
    if result[0] != "ok":
        assert state_of(fast) == before


def _uvarint(value, padding=0):
    out = bytearray()
    while value >= 0x80 or padding:
        if value < 0x80:
            padding -= 1
        out.append((value & 0x7F) | 0x80 if value >= 0x80 or padding >= 0 else value)
        value >>= 7
    out.append(value)
    return bytes(out)


_FIELDS = st.one_of(
    st.builds(_uvarint, st.one_of(st.integers(0, 300), st.integers(2**62, 2**65), st.integers(0, 2**140))),
    st.builds(_uvarint, st.integers(0, 300), st.integers(1, 25)),  # longer than it needs to be
    st.integers(0, 5).map(lambda byte: bytes([byte])),  # a tag or a policy
    st.sampled_from([b"\x03\x02\xc3\xa9", b"\x03\x02\xed\xa0", b"\x03\x01\xff", b"\x03\x05ab"]),
    st.just(b"\x03" + _uvarint(2**40)),  # a str far longer than the token
)


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(_FIELDS, max_size=14), noise=st.binary(max_size=4))
def test_any_well_sealed_body_is_read_as_the_spec_reads_it(fields, noise):
    """A body with a valid header and checksum but arbitrary fields: the kernel's own reader
    must take exactly what the spec takes, and refuse the rest with the spec's words."""
    import segack.kernel as kernel
    import segack.specs as spec
    from segack.specs import snapshot

    token = snapshot._seal(bytearray(b"".join(fields) + noise))
    assert outcome(lambda: _restored(kernel, token)) == outcome(lambda: _restored(spec, token))


def test_every_resealed_change_of_a_body_is_read_as_the_spec_reads_it():
    """Each byte of a valid body replaced by every value, each byte dropped, and every value
    inserted at each place, then given a fresh checksum: the kernel's reader and the spec's
    decoder take and refuse the same tokens, with the same words."""
    import segack.kernel as kernel
    import segack.specs as spec
    from segack import _shared
    from segack.specs import snapshot

    header, checksum = _shared.SNAPSHOT_HEADER.size, _shared.SNAPSHOT_CHECKSUM.size
    for token in _tokens(spec):
        body = token[header:-checksum]
        places, values = range(len(body) + 1), range(256)
        changed = [body[:at] + bytes([value]) + body[at + 1:] for at in places[:-1] for value in values]
        changed += [body[:at] + body[at + 1:] for at in places[:-1]]
        changed += [body[:at] + bytes([value]) + body[at:] for at in places for value in values]
        for candidate in changed:
            resealed = snapshot._seal(bytearray(candidate))
            read = outcome(lambda t=resealed: _restored(kernel, t))
            assert read == outcome(lambda t=resealed: _restored(spec, t))


def test_tokens_at_the_edges_of_64_bits_are_read_as_the_spec_reads_them(impl):
    """Indexes up to ``INDEX_MAX`` and 64-bit numbers survive; an index or a duplicate count
    past what an acker holds is a ``ValueError``."""
    from segack.specs import snapshot
    from segack.specs.acker import INDEX_MAX

    def token(start, done, committed, duplicates, runs):
        state = snapshot.AckerState(start, start + done, committed, duplicates, "error", None, runs)
        return snapshot.encode(state)

    edge_run = (INDEX_MAX - 1, INDEX_MAX, 2**63 - 1)
    acker = impl.OffsetAcker.restore(token(0, 3, -(2**63), 2**63 - 1, [edge_run]))
    assert (acker.committed_offset, acker.duplicates) == (-(2**63), 2**63 - 1)
    assert acker.runs_with_offsets() == [edge_run]
    with pytest.raises(ValueError, match=f"index {INDEX_MAX + 1} is larger than"):
        impl.OffsetAcker.restore(token(0, 0, None, 0, [(INDEX_MAX, INDEX_MAX + 1, None)]))
    with pytest.raises(ValueError, match="is larger than"):
        impl.OffsetAcker.restore(token(0, INDEX_MAX + 2, 1, 0, []))
    with pytest.raises(ValueError, match="duplicates is past"):
        impl.OffsetAcker.restore(token(0, 0, None, 2**63, []))


def test_int_offsets_below_2_to_the_128_survive_and_larger_ones_are_refused(impl):
    acker = impl.OffsetAcker()
    acker.ack(0, 2**128 - 1)
    acker.ack(5, -(2**128) + 1)
    restored = impl.OffsetAcker.restore(acker.snapshot())
    assert restored.committed_offset == 2**128 - 1
    assert restored.runs_with_offsets() == [(5, 5, -(2**128) + 1)]
    acker.ack(7, 2**128)
    before = state_of(acker)
    with pytest.raises(ValueError, match="too large for a snapshot"):
        acker.snapshot()
    assert state_of(acker) == before


def test_kernel_memory_follows_the_runs_and_is_given_back():
    """``sys.getsizeof`` counts the run blocks: it grows with pending runs, not with acks."""
    import sys

    import segack.kernel as kernel

    acker = kernel.OffsetAcker()
    empty = sys.getsizeof(acker)
    acker.ack_many(np.arange(1, 200_000, 2))
    assert sys.getsizeof(acker) - empty >= 32 * acker.pending_runs
    acker.ack_many(np.arange(0, 200_000, 2))
    acker.ack_many(np.arange(200_000, 1_200_000))
    assert acker.pending_runs == 0 and sys.getsizeof(acker) - empty < 4096


class _Token:
    """An offset object whose lifetime a weak reference can watch."""


def test_only_the_last_offset_of_each_run_is_kept(impl):
    import gc
    import weakref

    tokens = {index: _Token() for index in range(1, 10)}
    alive = {index: weakref.ref(token) for index, token in tokens.items()}
    acker = impl.OffsetAcker()
    for index in (3, 1, 2, 4, 9, 7, 6, 8):
        acker.ack(index, tokens[index])
    ends = acker.runs_with_offsets()
    assert [(first, last) for first, last, _ in ends] == [(1, 4), (6, 9)]
    assert ends[0][2] is tokens[4] and ends[1][2] is tokens[9]
    del ends, tokens
    gc.collect()
    assert sorted(index for index, ref in alive.items() if ref() is not None) == [4, 9]
    acker.ack(0)
    gc.collect()
    assert sorted(index for index, ref in alive.items() if ref() is not None) == [4, 9]
    acker.ack(5)
    gc.collect()
    assert [index for index, ref in alive.items() if ref() is not None] == [9]
    assert acker.committed_offset is alive[9]()


def test_per_call_acks_near_the_committed_point_allocate_nothing():
    """Out-of-order acks within WINDOW_SIZE of the committed point stay in the kernel's
    fixed window: after the first, the acker's size does not change, however far it goes."""
    import sys

    import segack.kernel as kernel
    from segack.pyx.acker import WINDOW_SIZE

    rng = np.random.default_rng(4)
    order = np.argsort(np.arange(50_000) + rng.integers(0, WINDOW_SIZE // 2, size=50_000), kind="stable")
    acker = kernel.OffsetAcker()
    acker.ack(1)
    size = sys.getsizeof(acker)
    for index in order.tolist():
        if index != 1:
            acker.ack(index)
        assert sys.getsizeof(acker) == size
    assert acker.next_index == 50_000 and acker.pending_runs == 0


def test_an_unsigned_array_that_int64_cannot_hold_is_refused_and_changes_nothing(impl):
    """uint64 is an integer type, but not one int64 holds: refused like floats, not wrapped."""
    acker = impl.OffsetAcker()
    acker.ack(0)
    with pytest.raises(TypeError, match="uint64"):
        acker.ack_many(np.array([1, 2**63], dtype=np.uint64))
    assert (acker.next_index, acker.pending_runs) == (1, 0)
    assert acker.ack_many(np.array([1, 2], dtype=np.uint32)) == 2
