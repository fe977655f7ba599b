"""Arrow rows as events (:func:`segack.spark_adapter.worker.rows.as_events`): equal to pyarrow's
``to_pylist``, value for value, ``tzinfo`` and fold included, for every column type a task meets."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segack.spark_adapter.worker.rows import as_events

ZONES = ["UTC", "Etc/UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata",
         "+00:00", "+05:30", "-08:00", None]
UNITS = ["s", "ms", "us", "ns"]
# Instants within every zone's reach of datetime's range (years 2 to 9998).
SECONDS = st.integers(-62_000_000_000, 253_300_000_000)


def _same(left: list[dict], right: list[dict]) -> bool:
    """Equal, and alike where equality is loose: the same type, ``tzinfo`` and fold."""
    if left != right:
        return False
    for first, second in zip(left, right, strict=True):
        for name, value in first.items():
            other = second[name]
            if type(value) is not type(other):
                return False
            if isinstance(value, dt.datetime) and (
                    type(value.tzinfo) is not type(other.tzinfo) or value.tzinfo != other.tzinfo
                    or value.fold != other.fold or value.replace(tzinfo=None) != other.replace(tzinfo=None)):
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ZONES), st.sampled_from(UNITS),
       st.lists(st.one_of(st.none(), SECONDS, st.sampled_from(
           # Around New York's and Berlin's 2024 changes, and Lord Howe's half hour.
           [1_710_054_000, 1_710_057_600, 1_730_613_600, 1_730_617_200, 1_711_846_800, 1_729_990_800,
            1_712_415_600, 1_696_089_600])), max_size=30),
       st.integers(0, 999_999))
def test_timestamps_convert_as_pyarrow_converts_them(zone, unit, seconds, fraction):
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    values = [None if second is None else second * per_second + fraction % per_second for second in seconds]
    if unit == "ns":  # pandas Timestamps reach 1677 to 2262 only
        reach = 9_000_000_000 * per_second
        values = [None if value is None else max(min(value, reach), -reach) for value in values]
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.timestamp(unit, tz=zone)),
                                        pa.array(range(len(values)), pa.int64())], names=["at", "n"])
    assert _same(as_events(batch, ["n", "at"]), batch.select(["n", "at"]).to_pylist())


@pytest.mark.parametrize("unit", ["s", "ms", "us"])
@pytest.mark.parametrize("zone", ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe"])
def test_the_hours_a_zone_repeats_keep_their_fold(zone, unit):
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000}[unit]
    # Each zone's 2024 autumn change, an hour (Lord Howe: half an hour) either side, by minutes.
    change = {"America/New_York": 1_730_613_600, "Europe/Berlin": 1_729_990_800,
              "Australia/Lord_Howe": 1_712_415_600}[zone]
    values = [(change + minute * 60) * per_second for minute in range(-90, 91, 5)]
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.timestamp(unit, tz=zone))], names=["at"])
    expected = batch.to_pylist()
    assert {row["at"].fold for row in expected} == {0, 1}
    assert _same(as_events(batch, ["at"]), expected)


def test_other_columns_pass_as_pyarrow_gives_them_and_only_those_asked_for():
    zone = pa.timestamp("us", tz="Europe/Berlin")
    batch = pa.RecordBatch.from_pydict({
        "key": ["a", None, "c"], "n": [1, 2, None], "when": pa.array([0, None, 1_700_000_000_000_000], zone),
        "day": pa.array([dt.date(2024, 1, 1), None, dt.date(1, 1, 1)]), "raw": [b"x", b"", None],
        "naive": pa.array([1, 2, 3], pa.timestamp("ms")), "other": [1.5, None, 2.5]})
    asked = ["when", "key", "n", "day", "raw", "naive"]
    events = as_events(batch, asked)
    assert _same(events, batch.select(asked).to_pylist())
    assert list(events[0]) == asked
    assert events[2]["when"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert str(events[2]["when"]) == "2023-11-14 23:13:20+01:00"


def test_a_timestamp_past_datetimes_range_fails_as_pyarrow_fails():
    # 9999-12-31 15:00 UTC is in year 10000 in Tokyo.
    late = pa.array([253_402_300_000 * 10**6], pa.timestamp("us", tz="Asia/Tokyo"))
    batch = pa.RecordBatch.from_arrays([late], names=["at"])
    with pytest.raises((ValueError, OverflowError)):
        batch.to_pylist()
    with pytest.raises((ValueError, OverflowError)):
        as_events(batch, ["at"])
