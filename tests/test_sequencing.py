"""The sequencing rules a task keeps however it calls the handler (no Spark)."""

from __future__ import annotations

import operator

import pytest

from segack.spark_adapter.options import Handling
from segack.spark_adapter.sequencing import PARKED, DeadLetter, Failure, Rules, sequencing_value

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
