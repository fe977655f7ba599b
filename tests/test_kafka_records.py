"""A real-time stream's records as events (``segack.spark_adapter.worker.kafka_records``): the
values the micro-batch path's ``from_json`` gives (rules 1 and 2), without Spark."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.worker.kafka_records import UNPARSED, RecordEvents, time_zone

FIELDS = (("name", "string"), ("count", "int"), ("ratio", "float"), ("score", "double"), ("ok", "boolean"))


def _event(value: object, zone: str = "UTC") -> dict:
    data = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return RecordEvents(FIELDS, zone).event("t", 3, 17, b"k\xc3\xa9", data, 1_700_000_000_123)


def test_a_value_that_parses_gives_its_fields_and_the_records_own_columns():
    event = _event({"name": {"city": "Zürich"}, "count": 2**31 - 1, "ratio": 0.1, "score": "NaN", "ok": None})
    assert event["key"] == "ké" and (event["topic"], event["partition"], event["offset"]) == ("t", 3, 17)
    assert event["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    assert event["name"] == '{"city":"Zürich"}'  # a non-string value as its JSON text, as written
    assert event["count"] == 2**31 - 1 and event["ok"] is None and event[UNPARSED] is None
    assert event["ratio"] == pytest.approx(0.1) and event["ratio"] != 0.1  # rounded to 32 bits
    assert math.isnan(event["score"])
    # An integer past a double's range is infinity, as Spark's reader gives it, not a failure.
    digits = b"0" * 400
    value = b'{"name": "a", "count": 1, "ratio": -1' + digits + b', "score": 1' + digits + b', "ok": true}'
    huge = RecordEvents(FIELDS, "UTC").event("t", 0, 0, None, value, 0)
    assert huge["score"] == math.inf and huge["ratio"] == -math.inf and huge[UNPARSED] is None


@pytest.mark.parametrize("value", [
    {"name": "a", "count": 2**31, "ratio": 1, "score": 1, "ok": True},  # past an INT
    {"name": "a", "count": 1.5, "ratio": 1, "score": 1, "ok": True},
    {"name": "a", "count": True, "ratio": 1, "score": 1, "ok": True},
    {"name": "a", "count": 1, "ratio": "1", "score": 1, "ok": True},
    {"name": "a", "count": 1, "ratio": 1, "score": 1, "ok": "true"},
    {"name": "a", "count": 1, "ratio": 1, "score": 1},  # a field missing
    {"Name": "a", "count": 1, "ratio": 1, "score": 1, "ok": True},  # names match exactly
    [1, 2],
    b"not json",
])
def test_a_value_that_does_not_parse_leaves_every_field_null_and_its_text(value):
    event = _event(value)
    assert all(event[name] is None for name, _ in FIELDS)
    assert event[UNPARSED] == (value.decode() if isinstance(value, bytes) else json.dumps(value))


def test_a_tombstone_has_every_field_null_and_nothing_to_refuse():
    event = _event(None)
    assert all(event[name] is None for name, _ in FIELDS) and event[UNPARSED] is None


@pytest.mark.parametrize(("name", "offset"), [("+08:00", 8 * 3600), ("UTC-5", -5 * 3600),
                                              ("GMT+05:30", 5 * 3600 + 1800), ("Europe/Paris", None)])
def test_the_sessions_time_zone_is_placed_as_spark_names_it(name, offset):
    zone = time_zone(name)
    moment = dt.datetime(2026, 1, 15, tzinfo=dt.UTC).astimezone(zone)
    assert moment.utcoffset() == dt.timedelta(seconds=3600 if offset is None else offset)


def test_a_time_zone_python_cannot_place_is_refused_by_name():
    with pytest.raises(OptionError, match="'Mars/Olympus'"):
        time_zone("Mars/Olympus")
