"""Kafka records as events without Spark's Kafka source: what a real-time stream's tasks read with
their own consumer (:mod:`~segack.spark_adapter.worker.partition_task`).

An event has the columns of :mod:`~segack.spark_adapter.sources.kafka`'s rule 1, with the same
values a micro-batch gives: ``key`` (the record's key as UTF-8 text, null for none), ``topic``,
``partition``, ``offset``, ``timestamp`` (a ``datetime`` in the session's time zone), the value's
declared fields, then ``unparsed_value``. The value is parsed here, in Python, by rule 2: a value
that is not a JSON object holding every declared field with a value of its type leaves every field
null and its text in ``unparsed_value``, and the run refuses to hand it over unless the handler
:func:`~segack.spark_adapter.takes_unparsed`.

The declared types are the scalar ones (:data:`FIELD_TYPES`): each takes what Spark's JSON reader
takes for it (a ``STRING`` field takes any JSON value, a non-string one as its JSON text; an
integer field an integral number within its range; a fractional one any number, or ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` quoted, a ``FLOAT`` rounded to 32 bits; ``BOOLEAN`` true or
false). A schema with another type is refused on the driver, before anything runs
(:func:`~segack.spark_adapter.worker.kafka_records.check_fields`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import struct
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["FIELD_TYPES", "UNPARSED", "RecordEvents", "check_fields", "time_zone"]

#: The column that holds a value that did not parse (:mod:`~segack.spark_adapter.sources.kafka`'s
#: rule 2), null for every record that parsed.
UNPARSED = "unparsed_value"


def _integer(bits: int) -> Callable[[Any], Any]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def parse(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError
        return value
    return parse


#: The quoted words Spark's JSON reader takes for a fractional field (``allowNonNumericNumbers``).
_NON_NUMERIC = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf,
                "INF": math.inf, "+INF": math.inf, "-INF": -math.inf}


def _double(value: Any) -> Any:
    if isinstance(value, str) and value in _NON_NUMERIC:
        return _NON_NUMERIC[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError
    try:
        return float(value)
    except OverflowError:  # an integer past a double's range: Spark's reader gives infinity
        return math.inf if value > 0 else -math.inf


def _float(value: Any) -> Any:
    """A ``FLOAT``: the nearest 32-bit value, as Spark keeps it (and gives Python as a double)."""
    number = _double(value)
    try:
        return struct.unpack("<f", struct.pack("<f", number))[0]
    except OverflowError:  # past a float's range: Spark's reader gives infinity
        return math.copysign(math.inf, number)


def _boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _string(value: Any) -> Any:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


#: The value field types a real-time stream parses, by Spark's type name, and how.
FIELD_TYPES: dict[str, Callable[[Any], Any]] = {
    "string": _string, "bigint": _integer(64), "int": _integer(32), "smallint": _integer(16),
    "tinyint": _integer(8), "double": _double, "float": _float, "boolean": _boolean,
}


def check_fields(schema: StructType) -> tuple[tuple[str, str], ...]:
    """The declared fields as ``(name, type)``, or an :class:`~segack.spark_adapter.OptionError`
    naming the first field whose type a real-time stream does not parse."""
    fields = tuple((field.name, field.dataType.simpleString()) for field in schema.fields)
    for name, type_name in fields:
        if type_name not in FIELD_TYPES:
            raise OptionError(f"a real-time stream parses value fields of the types "
                              f"{', '.join(name.upper() for name in FIELD_TYPES)}; field {name!r} is "
                              f"{type_name.upper()}: declare it STRING and parse it in the handler, or use "
                              f"micro-batches")
    return fields


#: A zone given as an offset from UTC, as Spark takes it: ``+08:00``, ``-5``, ``UTC+8``, ``GMT-03:30``.
_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")


def time_zone(name: str) -> dt.tzinfo:
    """The ``tzinfo`` of Spark's session time zone ``name`` (a region, ``UTC``, or an offset); an
    :class:`~segack.spark_adapter.OptionError` for a name Python cannot place."""
    found = _OFFSET.fullmatch(name.strip())
    if found:
        sign, hours, minutes, seconds = found.groups()
        delta = dt.timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
        return dt.timezone(-delta if sign == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(name.strip())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise OptionError(f"the session's time zone {name!r} (spark.sql.session.timeZone) is not one "
                          f"Python knows; give a region such as 'Europe/Paris', or an offset such as "
                          f"'+02:00'") from None


@dataclass(frozen=True)
class RecordEvents:
    """Turns a topic's records into events: ``fields`` as :func:`check_fields` gives them,
    ``time_zone`` the session's (``spark.sql.session.timeZone``)."""

    fields: tuple[tuple[str, str], ...]
    time_zone: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "_parsers", tuple((name, FIELD_TYPES[type_name])
                                                   for name, type_name in self.fields))
        object.__setattr__(self, "_zone", time_zone(self.time_zone))

    def event(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
              timestamp_ms: int) -> dict[str, Any]:
        """The event of one record (rules 1 and 2)."""
        moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC).astimezone(self._zone)  # type: ignore[attr-defined]
        event: dict[str, Any] = {
            "key": None if key is None else key.decode("utf-8", errors="replace"),
            "topic": topic, "partition": partition, "offset": offset, "timestamp": moment,
        }
        parsers: tuple[tuple[str, Callable[[Any], Any]], ...] = self._parsers  # type: ignore[attr-defined]
        if value is None:  # a tombstone: every field null, nothing to refuse
            event.update((name, None) for name, _ in parsers)
            event[UNPARSED] = None
            return event
        text = value.decode("utf-8", errors="replace")
        try:
            parsed = json.loads(text)
            if not isinstance(parsed, dict):
                raise ValueError
            fields = [(name, None if parsed[name] is None else parse(parsed[name]))
                      for name, parse in parsers]
        except (ValueError, KeyError, RecursionError, OverflowError):
            event.update((name, None) for name, _ in parsers)
            event[UNPARSED] = text
            return event
        event.update(fields)
        event[UNPARSED] = None
        return event
