"""The sequencing rules a task keeps however it calls the handler (no Spark)."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segack.spark_adapter.options import Handling
from segack.spark_adapter.worker import sequencing
from segack.spark_adapter.worker.sequencing import (
    PARKED,
    DeadLetter,
    Failure,
    Outcome,
    Rules,
    call_plan,
    drive,
    retry_after_failure,
    sequencing_value,
)

KEY = operator.itemgetter("key")


def test_the_sequencing_value_is_the_key_one_value_or_the_row():
    assert sequencing_value("per-key", 7, "a") == ("key", "a") != sequencing_value("per-key", 7, "b")
    assert sequencing_value("sequential", 7, "a") == sequencing_value("sequential", 8, "b") == ("all",)
    assert sequencing_value("concurrent", 7, "a") == ("row", 7) != sequencing_value("concurrent", 8, "a")


@pytest.mark.parametrize("policy", ["per-key", "sequential"])
def test_a_parked_keys_events_are_set_aside_before_they_run(policy):
    rules = Rules(Handling(policy=policy), KEY, parked={"a"})
    assert rules.may_set_aside
    assert rules.set_aside(3, {"key": "a"}) == DeadLetter(3, {"key": "a"}, PARKED, 0)
    assert rules.set_aside(4, {"key": "b"}) is None


def test_the_concurrent_policy_parks_nothing():
    rules = Rules(Handling(policy="concurrent"), KEY, parked={"a"})
    assert not rules.may_set_aside and rules.set_aside(3, {"key": "a"}) is None


def test_a_failure_stops_the_run_or_poisons_its_value_for_the_later_events():
    error = ValueError("no")
    stop = Rules(Handling(), KEY)
    failure = Failure(2, {"key": "a"}, error, "tb", 3)
    assert stop.failed(failure, ("key", "a")) is failure
    assert not stop.may_set_aside and stop.set_aside(5, {"key": "a"}) is None
    letters = Rules(Handling(on_error="dead-letter"), KEY)
    assert not letters.may_set_aside
    value = letters.value(2, {"key": "a"})
    outcome = letters.failed(Failure(2, {"key": "a"}, error, "tb", 3), value)
    assert outcome == DeadLetter(2, {"key": "a"}, "ValueError: no", 3)
    assert letters.may_set_aside
    assert letters.set_aside(5, {"key": "a"}) == DeadLetter(5, {"key": "a"}, "ValueError: no", 0)
    assert letters.set_aside(5, {"key": "a"}, ("key", "b")) is None  # the caller's value counts
    assert letters.set_aside(6, {"key": "b"}) is None


def test_under_the_sequential_policy_one_failure_sets_every_later_event_aside():
    rules = Rules(Handling(policy="sequential", on_error="dead-letter"), KEY)
    rules.failed(Failure(0, {"key": "a"}, KeyError("k"), "", 1), rules.value(0, {"key": "a"}))
    assert rules.set_aside(1, {"key": "z"}) == DeadLetter(1, {"key": "z"}, "KeyError: 'k'", 0)


class _Calls:
    """A handler of lists that records each call's rows and fails, every time, any list that holds
    a row of ``failing`` (and, once each, a row of ``flaky``)."""

    def __init__(self, failing=(), flaky=()):
        self.failing, self.flaky = set(failing), set(flaky)
        self.calls: list[list[int]] = []
        self.succeeded: list[int] = []

    def __call__(self, items):
        rows = [row for row, _, _ in items]
        self.calls.append(rows)
        if self.failing.intersection(rows) or self.flaky.intersection(rows):
            self.flaky.difference_update(rows)
            raise ValueError(f"{rows} fail")
        self.succeeded += rows


def _items(keys):
    return [(row, key, {"row": row, "key": key}) for row, key in enumerate(keys)]


def _gives_up_after(retries):
    return lambda attempt: attempt > retries


def test_a_list_that_returns_is_one_call_and_an_empty_outcome():
    calls = _Calls()
    assert drive(call_plan(_items("abc"), 0.0, _gives_up_after(3), "dead-letter"), calls) == Outcome()
    assert calls.calls == [[0, 1, 2]]


def test_a_list_that_fails_once_is_made_again_whole_not_narrowed(monkeypatch):
    slept = []
    monkeypatch.setattr(sequencing, "retry_sleep", slept.append)
    calls = _Calls(flaky={2})
    outcome = drive(call_plan(_items("abcd"), 0.5, _gives_up_after(2), "dead-letter"), calls)
    assert outcome == Outcome(repeats=1)
    assert calls.calls == [[0, 1, 2, 3], [0, 1, 2, 3]] and slept == [0.5]


def test_under_stop_a_list_is_narrowed_to_its_first_failing_event_and_no_further(monkeypatch):
    slept = []
    monkeypatch.setattr(sequencing, "retry_sleep", slept.append)
    calls = _Calls(failing={2, 6})
    outcome = drive(call_plan(_items("abcdefgh"), 0.5, _gives_up_after(1), "stop"), calls)
    # The list and its retry; its first half fails, [0, 1] returns, [2, 3] fails, [2] fails with its
    # retry: the run's failure. Row 3 and the second half (row 6 fails too) are never called again.
    assert calls.calls == [[0, 1, 2, 3, 4, 5, 6, 7]] * 2 + [[0, 1, 2, 3], [0, 1], [2, 3], [2], [2]]
    assert slept == [0.5, 0.5] and outcome.repeats == 6
    ((failure, value),) = outcome.failures
    assert (failure.row, failure.event, failure.attempts, failure.size, value) == (
        2, {"row": 2, "key": "c"}, 2, 8, "c")
    assert isinstance(failure.error, ValueError) and "ValueError: [2] fail" in failure.traceback
    assert outcome.behind == ()


@pytest.mark.parametrize(("attempts", "size", "reason"), [
    (1, 1, "ValueError: no"),
    (2, 1, "ValueError: no (after 2 attempts)"),
    (1, 2, "ValueError: no (called alone after its list of 2 events failed)"),
    (3, 5_000, "ValueError: no (after 3 attempts, called alone after its list of 5,000 events failed)"),
])
def test_a_failures_reason_says_its_attempts_and_the_list_it_was_narrowed_from(attempts, size, reason):
    failure = Failure(4, {"key": "a"}, ValueError("no"), "Traceback ...", attempts, size)
    assert failure.reason == reason


@pytest.mark.parametrize("failing_after", [0, 2], ids=["before-narrowing", "while-narrowing"])
def test_under_stop_a_list_that_fails_once_the_run_is_failing_is_not_narrowed_and_fails_whole(failing_after):
    calls = _Calls(failing={5})
    outcome = drive(call_plan(_items("abcdefgh"), 0.0, _gives_up_after(0), "stop",
                              lambda: len(calls.calls) > failing_after), calls)
    ((failure, value),) = outcome.failures
    assert (failure.row, failure.size, value) == (0, 8, "a") and len(outcome.behind) == 7
    assert len(calls.calls) == 1 + failing_after  # no call once the run is failing


def test_a_list_that_fails_only_whole_is_handled_in_its_parts_whatever_on_error_says():
    for on_error in ("stop", "dead-letter"):
        calls = []

        def handler(items, calls=calls):
            calls.append([row for row, _, _ in items])
            if len(items) == 8:
                raise ValueError("too many at once")

        outcome = drive(call_plan(_items("abcdefgh"), 0.0, _gives_up_after(0), on_error), handler)
        assert outcome == Outcome(repeats=2) and calls == [list(range(8)), [0, 1, 2, 3], [4, 5, 6, 7]]


@given(keys=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24),
       failing=st.sets(st.integers(0, 23), min_size=1, max_size=4), retries=st.integers(0, 2))
def test_under_stop_a_failing_list_names_its_first_failing_event_having_handled_only_those_before(
        keys, failing, retries):
    failing = {row % len(keys) for row in failing}
    calls = _Calls(failing=failing)
    outcome = drive(call_plan(_items(keys), 0.0, _gives_up_after(retries), "stop"), calls)
    first = min(failing)
    ((failure, value),) = outcome.failures
    assert (failure.row, value, failure.attempts) == (first, keys[first], retries + 1)
    assert failure.size == len(keys)
    assert sorted(calls.succeeded) == list(range(first)) and outcome.behind == ()
    assert outcome.repeats == len(calls.calls) - 1


def test_narrowing_sets_aside_only_the_failing_event_and_its_keys_later_ones(monkeypatch):
    monkeypatch.setattr(sequencing, "retry_sleep", lambda seconds: None)
    calls = _Calls(failing={1})
    #           rows: 01234567
    items = _items("abacbdef")
    outcome = drive(call_plan(items, 0.1, _gives_up_after(1), "dead-letter"), calls)
    # The list and its retry; its first half, then its quarters: [0] returns, [1] fails with its
    # retry; [2, 3] returns; the second half without row 4 (key b, behind row 1) returns.
    assert calls.calls == [[0, 1, 2, 3, 4, 5, 6, 7]] * 2 + [[0, 1, 2, 3], [0, 1], [0], [1], [1], [2, 3],
                                                            [5, 6, 7]]
    ((failure, value),) = outcome.failures
    assert (failure.row, failure.attempts, failure.size, value) == (1, 2, 8, "b")
    assert outcome.behind == (items[4],)
    assert sorted(calls.succeeded) == [0, 2, 3, 5, 6, 7]
    assert outcome.repeats == 8  # every call after the first: its retry, then the narrowed parts


@given(keys=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24),
       failing=st.sets(st.integers(0, 23), max_size=4), retries=st.integers(0, 2))
def test_a_narrowed_list_handles_each_event_before_its_keys_first_failure_once(keys, failing, retries):
    items = _items(keys)
    calls = _Calls(failing={row for row in failing if row < len(keys)})
    outcome = drive(call_plan(items, 0.0, _gives_up_after(retries), "dead-letter"), calls)
    first_failure = {}
    for row, key in enumerate(keys):
        if row in calls.failing:
            first_failure.setdefault(key, row)
    # Each key's first failing event fails; its later events are set aside; every other event is
    # in exactly one call that returned; no call holds an event behind its key's failure.
    assert sorted((failure.row, value) for failure, value in outcome.failures) == sorted(
        (row, key) for key, row in first_failure.items())
    assert all(failure.size == len(keys) and failure.attempts == retries + 1
               for failure, _ in outcome.failures)
    assert outcome.repeats == len(calls.calls) - 1
    assert sorted(row for row, _, _ in outcome.behind) == [
        row for row, key in enumerate(keys) if key in first_failure and row > first_failure[key]]
    assert sorted(calls.succeeded) == [
        row for row, key in enumerate(keys) if key not in first_failure or row < first_failure[key]]
    for rows in calls.calls[1:]:
        assert not [row for row in rows if keys[row] in first_failure and row > first_failure[keys[row]]
                    and first_failure[keys[row]] not in rows]


def test_one_event_retried_after_its_first_call_says_how_it_ended_and_the_calls_made_again(monkeypatch):
    monkeypatch.setattr(sequencing, "retry_sleep", lambda seconds: None)
    event = {"row": 4, "key": "a"}
    for handler, outcome in ((_Calls(), (None, 1)), (_Calls(flaky={4}), (None, 2))):
        assert retry_after_failure(lambda one, handler=handler: handler([(4, "a", one)]), 4, event,
                                   ValueError("first"), 0.1, _gives_up_after(2)) == outcome
    failing = _Calls(failing={4})
    failure, repeats = retry_after_failure(lambda one: failing([(4, "a", one)]), 4, event,
                                           ValueError("first"), 0.1, _gives_up_after(2))
    assert repeats == 2 and failure.attempts == 3 and failure.event == event
