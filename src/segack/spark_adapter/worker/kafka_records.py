"""Kafka records as events without Spark's Kafka source: what a real-time stream's tasks read with
their own consumer (:mod:`~segack.spark_adapter.worker.partition_task`).

An event has the columns of :mod:`~segack.spark_adapter.sources.kafka`'s rule 1, with the same
values a micro-batch gives: ``key`` (the record's key as UTF-8 text, null for none), ``topic``,
``partition``, ``offset``, ``timestamp`` (a ``datetime`` in the session's time zone), ``headers``
when the stream asks for them (:data:`HEADERS`), the value's declared fields, then
``unparsed_value``. The value is parsed here, in Python, by rule 2: a value
that is not a JSON object holding every declared field with a value of its type leaves every field
null and its text in ``unparsed_value``, and the run refuses to hand it over unless the handler
:func:`~segack.spark_adapter.takes_unparsed`.

The declared types are the scalar ones (:data:`FIELD_TYPES`): each takes what Spark's JSON reader
takes for it (a ``STRING`` field takes any JSON value, a non-string one as its JSON text; an
integer field an integral number within its range; a fractional one any number, or ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` quoted, a ``FLOAT`` rounded to 32 bits; ``BOOLEAN`` true or
false). A value in Confluent's wire format also fills, from its format's logical types
(:data:`LOGICAL_TYPES`, :func:`field_parser`), ``TIMESTAMP`` from a moment with its zone (Avro's
``timestamp-*``, Protobuf's ``google.protobuf.Timestamp``), ``TIMESTAMP_NTZ`` from one without
(Avro's ``local-timestamp-*``), ``DATE`` from a day and ``DECIMAL(p,s)`` from a decimal that fits
it; in real time a ``TIMESTAMP`` is given in the session's time zone, as the record's own
``timestamp``. A
schema with another type is refused on the driver, before anything runs
(:func:`~segack.spark_adapter.worker.kafka_records.check_fields`).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
import struct
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segack.errors import SegackValueError
from segack.spark_adapter.errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from segack.spark_adapter.worker.wire_format import WireFormat

__all__ = ["ARROW_TYPES", "FIELD_TYPES", "HEADERS", "LOGICAL_TYPES", "UNPARSED", "DecodedBatches",
           "RecordEvents", "ValueFields", "arrow_type", "check_fields", "field_parser", "time_zone"]

#: The column that holds a value that did not parse (:mod:`~segack.spark_adapter.sources.kafka`'s
#: rule 2), null for every record that parsed.
UNPARSED = "unparsed_value"
#: The column of a record's headers, when the stream asks for them (``includeHeaders=true``): a
#: list of ``{"key": text, "value": bytes}`` in the record's order, null for a record without any.
HEADERS = "headers"


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


def _text(value: Any) -> str:
    """A decoded value JSON has no form for, as text: a moment, a date or a time in ISO 8601, a
    decimal or a UUID (Avro's logical types) as Python writes them."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise SegackValueError(f"{type(value).__name__} has no text form")


def _string(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time, decimal.Decimal, uuid.UUID)):
        return _text(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_text)


#: The value field types a real-time stream parses, by Spark's type name, and how.
FIELD_TYPES: dict[str, Callable[[Any], Any]] = {
    "string": _string, "bigint": _integer(64), "int": _integer(32), "smallint": _integer(16),
    "tinyint": _integer(8), "double": _double, "float": _float, "boolean": _boolean,
}


def _moment(value: Any) -> Any:
    """A ``TIMESTAMP`` from a moment with its zone (Avro's ``timestamp-millis`` and
    ``timestamp-micros``, Protobuf's ``google.protobuf.Timestamp``), in UTC."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError
    return value.astimezone(dt.UTC)


def _local_moment(value: Any) -> Any:
    """A ``TIMESTAMP_NTZ`` from a moment without a zone (Avro's ``local-timestamp-millis`` and
    ``local-timestamp-micros``)."""
    if not isinstance(value, dt.datetime) or value.tzinfo is not None:
        raise ValueError
    return value


def _date(value: Any) -> Any:
    if not isinstance(value, dt.date) or isinstance(value, dt.datetime):
        raise ValueError
    return value


def _decimal(precision: int, scale: int) -> Callable[[Any], Any]:
    """A ``DECIMAL(precision, scale)`` from Avro's ``decimal`` (or an integer), refused where it
    would lose a digit or not fit, as Spark refuses it."""
    unit = decimal.Decimal(1).scaleb(-scale)

    def parse(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (decimal.Decimal, int)):
            raise ValueError
        try:
            exact = decimal.Decimal(value).quantize(unit, context=decimal.Context(prec=precision + 2))
        except decimal.InvalidOperation:
            raise ValueError from None
        if exact != value or len(exact.as_tuple().digits) > precision:
            raise ValueError
        return exact
    return parse


#: The further value field types a value in Confluent's wire format fills, by format, from the
#: moments, days and decimals its schemas' logical types decode to (``decimal`` is ``DECIMAL`` of
#: any precision and scale). JSON Schema's values are JSON, which has none.
LOGICAL_TYPES: dict[str, tuple[str, ...]] = {
    "avro": ("timestamp", "timestamp_ntz", "date", "decimal"), "protobuf": ("timestamp",)}
_LOGICAL_PARSERS: dict[str, Callable[[Any], Any]] = {
    "timestamp": _moment, "timestamp_ntz": _local_moment, "date": _date}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def field_parser(type_name: str, value_format: str = "json") -> Callable[[Any], Any] | None:
    """How a value field of Spark's type ``type_name`` is parsed from a value of ``value_format``:
    the scalar types of :data:`FIELD_TYPES`, and the :data:`LOGICAL_TYPES` of the format; None for a
    type it does not parse."""
    logical = LOGICAL_TYPES.get(value_format, ())
    matched = _DECIMAL.fullmatch(type_name)
    if matched is not None:
        return _decimal(int(matched[1]), int(matched[2])) if "decimal" in logical else None
    if type_name in logical:
        return _LOGICAL_PARSERS[type_name]
    return FIELD_TYPES.get(type_name)


def check_fields(schema: StructType, parser: str = "a real-time stream",
                 instead: str = ", or use micro-batches",
                 value_format: str = "json") -> tuple[tuple[str, str], ...]:
    """The declared fields as ``(name, type)``, or an :class:`~segack.spark_adapter.OptionError`
    naming the first field whose type ``parser`` (the part of segack that parses values of
    ``value_format`` in Python, :func:`field_parser`) does not parse, and saying what to do
    ``instead`` beside declaring it ``STRING``."""
    fields = tuple((field.name, field.dataType.simpleString()) for field in schema.fields)
    for name, type_name in fields:
        if field_parser(type_name, value_format) is None:
            types = ", ".join(kind.upper() for kind in (*FIELD_TYPES, *LOGICAL_TYPES.get(value_format, ())))
            raise OptionError(f"{parser} parses value fields of the types {types}; field {name!r} is "
                              f"{type_name.upper()}: declare it STRING and parse it in the handler{instead}")
    return fields


@dataclass(frozen=True)
class ValueFields:
    """The declared ``fields`` (as :func:`check_fields` gives them) of a record's value: parsed
    from JSON text, or decoded from Confluent's wire format by ``wire``
    (:class:`~segack.spark_adapter.worker.wire_format.WireFormat`)."""

    fields: tuple[tuple[str, str], ...]
    wire: WireFormat | None = None

    def __post_init__(self) -> None:
        value_format = "json" if self.wire is None else self.wire.value_format
        object.__setattr__(self, "_parsers", tuple((name, field_parser(type_name, value_format))
                                                   for name, type_name in self.fields))

    @property
    def names(self) -> tuple[str, ...]:
        """The fields' names, in their order."""
        return tuple(name for name, _ in self.fields)

    def parse(self, topic: str, value: bytes) -> tuple[list[tuple[str, Any]] | None, str | None]:
        """The fields of ``value`` (a record of ``topic``, not a tombstone) by rule 2, and None; or
        None and the value as :data:`UNPARSED` holds it: its text, or for the wire format its bytes
        in base64."""
        parsers: tuple[tuple[str, Callable[[Any], Any]], ...] = self._parsers  # type: ignore[attr-defined]
        if self.wire is None:
            text = value.decode("utf-8", errors="replace")
            try:
                parsed = json.loads(text)
            except (ValueError, RecursionError):
                return None, text
        else:
            try:
                parsed = self.wire.decode(topic, value)
            except ValueError:  # UndecodableValueError, which the refusal says again
                return None, base64.b64encode(value).decode("ascii")
        try:
            if not isinstance(parsed, dict):
                raise ValueError
            return [(name, None if parsed[name] is None else parse(parsed[name]))
                    for name, parse in parsers], None
        except (ValueError, KeyError, TypeError, OverflowError):
            return None, text if self.wire is None else base64.b64encode(value).decode("ascii")


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
    ``time_zone`` the session's (``spark.sql.session.timeZone``), with their :data:`HEADERS` when
    ``headers``."""

    fields: tuple[tuple[str, str], ...]
    time_zone: str
    wire: WireFormat | None = None
    headers: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_values", ValueFields(self.fields, self.wire))
        object.__setattr__(self, "_zone", time_zone(self.time_zone))
        moments = frozenset(name for name, kind in self.fields if kind == "timestamp")
        object.__setattr__(self, "_moments", moments)

    def event(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
              timestamp_ms: int, headers: list[tuple[str, bytes | None]] | None = None) -> dict[str, Any]:
        """The event of one record (rules 1 and 2); ``headers`` as the client gives them."""
        moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC).astimezone(self._zone)  # type: ignore[attr-defined]
        event: dict[str, Any] = {
            "key": None if key is None else key.decode("utf-8", errors="replace"),
            "topic": topic, "partition": partition, "offset": offset, "timestamp": moment,
        }
        if self.headers:
            # As Spark's source gives them: null, not an empty list, for a record without any.
            event[HEADERS] = [{"key": name, "value": data} for name, data in headers] if headers else None
        values: ValueFields = self._values  # type: ignore[attr-defined]
        if value is None:  # a tombstone: every field null, nothing to refuse
            event.update((name, None) for name in values.names)
            event[UNPARSED] = None
            return event
        fields, unparsed = values.parse(topic, value)
        if fields is None:
            event.update((name, None) for name in values.names)
        else:
            moments: frozenset[str] = self._moments  # type: ignore[attr-defined]
            event.update((name, item.astimezone(self._zone) if name in moments and item is not None  # type: ignore[attr-defined]
                          else item) for name, item in fields)
        event[UNPARSED] = unparsed
        return event


#: The Arrow type of each field type :data:`FIELD_TYPES` and ``DATE``, as Spark reads it back.
ARROW_TYPES = {"string": "string", "bigint": "int64", "int": "int32", "smallint": "int16", "tinyint": "int8",
               "double": "float64", "float": "float32", "boolean": "bool", "date": "date32"}


def arrow_type(type_name: str) -> Any:
    """The Arrow type of a value field of Spark's type ``type_name`` (one :func:`field_parser`
    parses), as Spark reads it back."""
    import pyarrow as pa

    matched = _DECIMAL.fullmatch(type_name)
    if matched is not None:
        return pa.decimal128(int(matched[1]), int(matched[2]))
    if type_name == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if type_name == "timestamp_ntz":
        return pa.timestamp("us")
    return getattr(pa, ARROW_TYPES[type_name])()


@dataclass(frozen=True)
class DecodedBatches:
    """Kafka records with their values decoded, Arrow batch by Arrow batch, for ``mapInArrow`` in a
    micro-batch: each batch's columns ``key``, ``topic``, ``partition``, ``offset``, ``timestamp``
    (and ``headers``, when the query has them) kept as they are, ``value``, the last, replaced by
    the declared fields and :data:`UNPARSED` (:class:`ValueFields` ``values``)."""

    values: ValueFields

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        names = self.values.names
        types = [arrow_type(type_name) for _, type_name in self.values.fields]
        for batch in batches:
            topics = batch.column("topic").to_pylist()
            columns: list[list[Any]] = [[] for _ in names]
            unparsed: list[str | None] = []
            for topic, value in zip(topics, batch.column("value").to_pylist(), strict=True):
                fields, text = (None, None) if value is None else self.values.parse(topic, value)
                for column, item in zip(columns, [None] * len(names) if fields is None else
                                        [item for _, item in fields], strict=True):
                    column.append(item)
                unparsed.append(text)
            own = batch.schema.names[:-1]  # the record's columns as the query selected them, then value
            yield pa.RecordBatch.from_arrays(
                [*(batch.column(name) for name in own),
                 *(pa.array(column, type=kind) for column, kind in zip(columns, types, strict=True)),
                 pa.array(unparsed, type=pa.string())],
                names=[*own, *names, UNPARSED])
