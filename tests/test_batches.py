"""Batch handlers on real Spark: ``batch_size`` lists, each key's events in order, every event once."""

from __future__ import annotations

import itertools

import pytest

from segack.demo import generate_events
from segack.spark_adapter import HandlerFailedError, replay
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.spark_handlers import AsyncListRecorder, ListRecorder, read_log

pytestmark = pytest.mark.spark


def _pairs(table):
    return list(zip(table.column("user").to_pylist(), table.column("seq").to_pylist(), strict=True))


def _assert_in_key_order(calls):
    """Every event of every list came after every earlier event of its key, in the lists' log order
    (a key's lists never run at once, so the log's order is theirs) and within its list."""
    last: dict[str, int] = {}
    for call in calls:
        for user, seq in call["events"]:
            assert seq == last.get(user, -1) + 1, f"{user} {seq} handled after {last.get(user)}"
            last[user] = seq


@pytest.mark.parametrize(("recorder", "concurrency"),
                         [(ListRecorder, 1), (ListRecorder, 4), (AsyncListRecorder, 4)],
                         ids=["inline", "threads", "async"])
def test_a_batch_handler_gets_full_lists_in_key_order_and_every_event_once(spark, tmp_path, recorder,
                                                                          concurrency):
    table = generate_events(3000, seed=41)
    log = str(tmp_path / "log.jsonl")
    result = replay(spark.createDataFrame(table), key="user", order="ts", handler=recorder(log, 0.002),
                    checkpoint=str(tmp_path / "checkpoint"), segments=2, concurrency=concurrency,
                    batch_size=100)
    calls = read_log(log)
    handled = [tuple(pair) for call in calls for pair in call["events"]]
    assert result.complete and result.handled == len(handled) == len(set(handled)) == 3000
    assert set(handled) == set(_pairs(table))
    assert all(1 <= len(call["events"]) <= 100 for call in calls)
    # Lists fill: a list short of 100 ends an input batch, a segment, or a wait for a busy key.
    assert len(calls) <= 3000 // 25
    _assert_in_key_order(calls)
    # Lists in flight at once in one task never share a key.
    for pid in {call["pid"] for call in calls}:
        mine = sorted((call for call in calls if call["pid"] == pid), key=lambda call: call["start"])
        for first, second in itertools.combinations(mine, 2):
            if second["start"] < first["end"] and first["start"] < second["end"]:
                assert not {user for user, _ in first["events"]} & {user for user, _ in second["events"]}


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_failing_list_is_narrowed_so_only_the_failures_and_their_keys_later_events_are_set_aside(
        spark, tmp_path, concurrency):
    table = generate_events(2000, seed=42)
    pairs = _pairs(table)
    users = [user for user, _ in pairs]
    heavy = max(set(users), key=users.count)
    other = sorted(set(users) - {heavy})[2]
    refused = frozenset({(heavy, 4), (other, 0)})
    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    result = replay(spark.createDataFrame(table), key="user", order="ts",
                    handler=ListRecorder(log, refused=refused), checkpoint=checkpoint, segments=3,
                    concurrency=concurrency, batch_size=64, retries=1, retry_delay=0, on_error="dead-letter")
    expected_dead = {(user, seq) for user, seq in pairs
                     if (user == heavy and seq >= 4) or (user == other and seq >= 0)}
    letters = CheckpointStore(checkpoint).read_dead_letters()
    dead = dict(zip(zip(letters.column("user").to_pylist(), letters.column("seq").to_pylist(), strict=True),
                    letters.column("__segack_attempts").to_pylist(), strict=True))
    assert set(dead) == expected_dead
    # The failing events, alone at last, with their retry; the events behind them never called.
    assert {pair: count for pair, count in dead.items() if count} == {(heavy, 4): 2, (other, 0): 2}
    handled = [tuple(pair) for call in read_log(log) for pair in call["events"]]
    assert len(handled) == len(set(handled)) == 2000 - len(expected_dead)
    assert set(handled) == set(pairs) - expected_dead
    assert not result.complete and result.dead_letters == result.dead_letters_left == len(expected_dead)


def test_a_list_that_fails_stops_the_run_naming_the_event_that_failed_not_the_lists_first(spark, tmp_path):
    table = generate_events(500, seed=43)
    user, seq = _pairs(table)[300]
    log = str(tmp_path / "log.jsonl")
    with pytest.raises(HandlerFailedError) as failure:
        replay(spark.createDataFrame(table), key="user", order="ts",
               handler=ListRecorder(log, refused=frozenset({(user, seq)})),
               checkpoint=str(tmp_path / "checkpoint"), segments=1, batch_size=50)
    ts = table.column("ts")[300].as_py()
    assert (failure.value.key, failure.value.order) == (user, ts)
    assert failure.value.reason == (f"ValueError: part {seq} of {user} is refused (called alone after its "
                                    f"list of 50 events failed)")
    # Narrowed to it: no event of its user after it was handled.
    handled = [tuple(pair) for call in read_log(log) for pair in call["events"]]
    assert not [pair for pair in handled if pair[0] == user and pair[1] >= seq]
