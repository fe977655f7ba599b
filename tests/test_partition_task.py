"""A real-time stream's partition bookkeeping (``segack.spark_adapter.worker.partition_task``),
without Kafka or Spark: which offset is safe to commit as calls finish out of order, what a
partition's saved progress holds, what a resume skips, and that the state stays bounded while a slow
call holds a partition back."""

from __future__ import annotations

import random
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from segack.spark_adapter.worker.dispatch import Dispatcher
from segack.spark_adapter.worker.partition_task import OffsetRuns, PartitionReader


def _by_hand(calls: list) -> Dispatcher:
    """A dispatcher whose calls wait in ``calls`` until the test makes them."""
    return Dispatcher(lambda event: None, lambda event: event["key"], concurrency=1_000_000,
                      max_pending=10_000_000, start=calls.append)


def _event(key: str, offset: int) -> dict:
    return {"key": key, "offset": offset}


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60))
def test_offset_runs_give_each_rows_offset_across_gaps_and_after_dropping(gaps):
    runs, offsets, offset = OffsetRuns(), [], 10
    for row, gap in enumerate(gaps):
        offset += gap
        runs.add(row, offset)
        offsets.append(offset)
        offset += 1
    assert len(runs) == 1 + sum(1 for gap in gaps[1:] if gap)
    for row, expected in enumerate(offsets):
        assert runs.offset(row) == expected
    cut = len(offsets) // 2
    runs.drop_before(cut)
    for row in range(cut, len(offsets)):
        assert runs.offset(row) == offsets[row]


def test_the_safe_offset_waits_for_the_slowest_call_and_the_intervals_above_it_are_saved():
    calls: list = []
    reader = PartitionReader(0, 100, [], _by_hand(calls))
    # Offsets 100..109, with a gap (a transaction's marker) at 105.
    offsets = [100, 101, 102, 103, 104, 106, 107, 108, 109, 110]
    for index, offset in enumerate(offsets):
        assert reader.take(offset, _event(f"k{index}", offset))
    assert reader.state()[0]["next"] == 100  # nothing done: the first record is next
    for call in calls[1:]:
        call()
    state, _ = reader.state()
    assert state["next"] == 100 and state["done"] == [[101, 110]] and state["pending"] == 10
    calls[0]()
    state, _ = reader.state()
    assert state["next"] == 111 and state["done"] == [] and state["pending"] == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.randoms(use_true_random=False))
def test_a_resume_from_any_saved_progress_skips_exactly_what_was_done(count, rng):
    calls: list = []
    offsets = sorted(rng.sample(range(1000, 1000 + 3 * count), count))
    first = PartitionReader(0, offsets[0], [], _by_hand(calls))
    for index, offset in enumerate(offsets):
        first.take(offset, _event(f"k{index}", offset))
    finished = rng.sample(range(count), rng.randint(0, count))
    for index in finished:
        calls[index]()
    saved, _ = first.state()
    done = {offsets[index] for index in finished}
    assert all(offset in done for offset in offsets if offset < saved["next"])
    assert saved["next"] == offsets[0] or offsets[0] in done
    # The next run reads from the saved offset and hands over exactly the records not done.
    handed: list = []
    second = PartitionReader(0, saved["next"], saved["done"], Dispatcher(
        lambda event: handed.append(event["offset"]), lambda event: event["key"]))
    for index, offset in enumerate(offsets):
        if offset >= saved["next"]:
            assert second.take(offset, _event(f"k{index}", offset))
    assert handed == [offset for offset in offsets if offset not in done]
    assert second.skipped == len([offset for offset in done if offset >= saved["next"]])
    assert second.state()[0]["next"] == offsets[-1] + 1 and second.state()[0]["done"] == []


def test_a_resumed_interval_not_yet_read_is_saved_again_and_not_lost():
    reader = PartitionReader(0, 50, [[52, 54], [60, 70]],
                             Dispatcher(lambda event: None, lambda event: event["key"]))
    for offset in (50, 51, 52, 53):
        assert reader.take(offset, _event("k", offset))
    state, _ = reader.state()
    assert state["next"] == 54
    assert state["done"] == [[54, 54], [60, 70]]


def test_a_slow_key_holding_back_a_million_later_records_keeps_one_interval():
    """Issue 44: the acker's state per partition stays bounded (its intervals, not a per-record map)
    while one slow call holds the committed offset. (The mutation run leaves it out: a million
    records through a mutated dispatcher take too long; the tests above cover its paths.)"""
    later = 1_000_000
    release = threading.Event()

    def handler(event: dict) -> None:
        if event["key"] == "slow":
            release.wait(900)

    dispatcher = Dispatcher(handler, lambda event: event["key"], concurrency=2, max_pending=later + 1)
    reader = PartitionReader(3, 0, [], dispatcher)
    assert reader.take(0, _event("slow", 0))
    keys = [f"k{n}" for n in range(100)]
    rng = random.Random(1)
    for offset in range(1, later + 1):
        assert reader.take(offset, _event(rng.choice(keys), offset))
    dispatcher.send_partial()
    deadline = time.monotonic() + 600
    while dispatcher.done_rows()[2] != [(1, later)]:
        assert time.monotonic() < deadline, dispatcher.done_rows()
        time.sleep(0.05)
    state, _ = reader.state()
    assert state["next"] == 0 and state["done"] == [[1, later]] and state["pending"] == later + 1
    assert len(reader._offsets) == 1  # one run of offsets for a million rows
    release.set()
    dispatcher.close()
    assert reader.state()[0] == {**state, "next": later + 1, "done": [], "pending": 0, "handled": later + 1}


def test_a_dead_letter_is_taken_with_the_progress_that_counts_its_record_done():
    calls: list = []

    def handler(event: dict) -> None:
        if event["key"] == "bad":
            raise ValueError("cannot")

    dispatcher = Dispatcher(handler, lambda event: event["key"], concurrency=4, on_error="dead-letter",
                            start=calls.append)
    reader = PartitionReader(0, 0, [], dispatcher)
    for offset, key in enumerate(["bad", "ok", "bad"]):
        assert reader.take(offset, _event(key, offset))
    dispatcher.send_partial()
    for call in list(calls):
        call()
    state, letters = reader.state()
    # Both of bad's records are set aside (the second behind the first), and done with the record
    # between them: the same snapshot holds the letters.
    assert state["next"] == 3 and [letter.row for letter in letters] == [0, 2]
    assert state["dead_letters"] == 2 and state["handled"] == 1
    assert reader.state()[1] == []


def test_past_a_transactions_marker_the_consumers_position_is_the_next_offset():
    reader = PartitionReader(0, 0, [], Dispatcher(lambda event: None, lambda event: event["key"]))
    for offset in range(3):
        assert reader.take(offset, _event("k", offset))
    assert reader.state(position=4)[0]["next"] == 4  # offset 3 is the commit marker
    assert reader.state(position=None)[0]["next"] == 3
