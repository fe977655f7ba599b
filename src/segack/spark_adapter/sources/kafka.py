"""Kafka topics as events, and a stream's progress told back to Kafka.

The rules:

1. **Columns.** An event read from a record has the columns ``key`` (the record's key as text,
   null for none), ``topic``, ``partition``, ``offset`` and ``timestamp``; with Spark's
   ``includeHeaders=true``, ``headers``
   (:data:`~segack.spark_adapter.worker.kafka_records.HEADERS`: the record's headers in their
   order, each ``{"key": text, "value": bytes}``, a key possibly repeated; null for a record
   without any);
   then the fields the declared value schema names, parsed from the record's value (JSON), then
   ``unparsed_value``. A record with no value (a tombstone) has every field null.
2. **A value that does not parse** (not JSON, not of the declared types, or an object that lacks a
   declared field: names match exactly, case included; a field may be present as ``null``) leaves
   every field null and its text in ``unparsed_value`` (null for every record that parsed). Such a
   record never reaches the handler as if it were empty: its call fails with
   :class:`~segack.spark_adapter.UnparsedValueError`, naming the fields it lacks, so it
   becomes a dead letter under ``on_error="dead-letter"`` (with its key's later records parked
   behind it) or stops the run. A handler marked with :func:`~segack.spark_adapter.takes_unparsed`
   gets it instead, its fields null: deploy one and retry the dead letters to handle what was set
   aside. (A stream also refuses an event whose key or order is null:
   :class:`~segack.spark_adapter.UnorderableEventError`; a record with no Kafka key is one.)
3. **Micro-batches are bounded**: :data:`DEFAULT_MAX_OFFSETS_PER_TRIGGER` records each unless the
   reader's options say otherwise, so that a backlog moves the committed offsets batch by batch
   instead of once at its end.
4. **Offsets told back to Kafka.** After a micro-batch is complete in segack's checkpoint, Spark
   reports its end offsets (the next offset to read in each partition); they are committed to the
   consumer group the run names (:func:`commit_offsets`), so Kafka's own tools see the stream's
   progress and lag. A committed offset is never ahead of the checkpoint: every record below it
   has been handled or set aside as a dead letter.
5. **Where a new query starts.** A stream never skips what the topics hold unless told to: a query
   with no position yet starts at the consumer group's committed offsets when the run commits to a
   group that has them (the earliest offsets for partitions it lacks), else at the earliest
   offsets. ``startingOffsets``, ``startingTimestamp`` or ``startingOffsetsByTimestamp`` start it
   elsewhere, and the records they pass over are counted (:func:`passed_over`). Spark applies them
   only to a new query: given to a checkpoint that has a position, they are refused
   (:mod:`~segack.spark_adapter.coordinator.query_record`).
6. **Records gone are never passed over in silence.** ``failOnDataLoss=false`` (Spark reading on
   past records deleted before it read them) is refused; with Spark's default, a micro-batch that
   finds records gone fails, and the stream stops before anything of it is done or committed.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segack.extras import install_hint
from segack.spark_adapter.errors import (
    InputError,
    OptionError,
    SchemaRegistryError,
    UnparsedValueError,
    spark_reason,
)
from segack.spark_adapter.handlers import Refusal
from segack.spark_adapter.sources.kafka_settings import java_options, security_failure
from segack.spark_adapter.sources.reader_options import spelled
from segack.spark_adapter.sources.value_formats import known_topics, wire_format
from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.worker.kafka_records import (
    HEADERS,
    UNPARSED,
    DecodedBatches,
    ValueFields,
    check_fields,
    field_parser,
)
from segack.spark_adapter.worker.wire_format import (
    AVRO_SCHEMA,
    REGISTRY_FORMATS,
    UndecodableValueError,
    WireFormat,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["CONNECTORS_SPARK", "DEFAULT_MAX_OFFSETS_PER_TRIGGER", "HEADERS", "RECORD_COLUMNS",
           "STARTING_OPTIONS", "UNPARSED", "KafkaStream", "PartitionOffsets", "commit_offsets",
           "connector_package", "group_offsets", "includes_headers", "kafka_events", "kafka_stream",
           "list_offsets", "missing_connector", "offsets_json", "parse_offsets", "passed_over",
           "starting_offsets", "subscribed_partitions", "takes_unparsed", "unparsed_refusal", "value_schema"]

#: The record's own columns, before the value's fields.
RECORD_COLUMNS = ("key", "topic", "partition", "offset", "timestamp")
#: Records per micro-batch unless ``maxOffsetsPerTrigger`` says otherwise (rule 3).
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
#: The reader's options that start a new query somewhere other than rule 5's default.
STARTING_OPTIONS = ("startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp")
#: The reader's options segack reads, in Spark's spelling: given in any case, they are spelled so
#: (:func:`~segack.spark_adapter.sources.reader_options.spelled`).
KNOWN_OPTIONS = ("subscribe", "subscribePattern", "assign", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                 "failOnDataLoss", "endingOffsets", "minPartitions", "includeHeaders", AVRO_SCHEMA,
                 *STARTING_OPTIONS)
_MARK = "segack_takes_unparsed"


def includes_headers(options: Mapping[str, str]) -> bool:
    """Whether the reader's ``options`` (spelled as Spark spells them) ask for the records' headers
    (``includeHeaders``, rule 1); an :class:`~segack.spark_adapter.OptionError` for a value other
    than ``true`` or ``false``."""
    given = str(options.get("includeHeaders", "false")).strip().lower()
    if given not in ("true", "false"):
        raise OptionError(f"includeHeaders takes true or false, not {options['includeHeaders']!r}")
    return given == "true"


def value_schema(spark: SparkSession, ddl: str, headers: bool = False) -> StructType:
    """The value schema ``ddl`` declares (``'account STRING, seq BIGINT'``), parsed by Spark.

    Raises :class:`~segack.spark_adapter.OptionError` for text that is not a struct's DDL, and for
    a field named as one of the record's own columns (:data:`RECORD_COLUMNS`,
    :data:`~segack.spark_adapter.worker.kafka_records.UNPARSED`, and :data:`HEADERS` when the records
    come with their ``headers``).
    """
    from pyspark.sql.types import DataType, StructType

    try:
        parsed = DataType.fromDDL(ddl) if ddl.strip() else None
    except Exception as error:  # Spark's ParseException, through Py4J or Connect
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise OptionError(f"--value-schema {ddl!r} is not a schema Spark can read: {first}") from None
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise OptionError(f"--value-schema {ddl!r} must name the value's fields with their types, as "
                          f"'account STRING, seq BIGINT'")
    own = (*RECORD_COLUMNS, *((HEADERS,) if headers else ()), UNPARSED)
    clash = [field.name for field in parsed.fields if field.name in own]
    if clash:
        raise OptionError(f"--value-schema names {clash[0]!r}, a column every record has already "
                          f"({', '.join(own)}); rename the field")
    return parsed


def kafka_events(records: DataFrame, schema: StructType, value_format: str = "json",
                 wire: WireFormat | None = None) -> DataFrame:
    """The events of Kafka ``records`` (the Kafka source's rows, static or streaming), by rules 1
    and 2, with their :data:`HEADERS` when the records have them (``includeHeaders=true``);
    ``value_format`` is one of :data:`~segack.spark_adapter.sources.value_formats.VALUE_FORMATS`,
    decoded by ``wire`` for the wire format (in the executors' Python, Arrow batch by batch)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    own = [*RECORD_COLUMNS, *((HEADERS,) if HEADERS in records.columns else ())]
    if wire is not None:
        values = ValueFields(check_fields(schema, f"a value in {value_format}", "", value_format), wire)
        kept = records.select(F.col("key").cast("string").alias("key"), *own[1:], "value")
        decoded = StructType([*kept.schema.fields[:len(own)], *schema.fields,
                              StructField(UNPARSED, StringType())])
        return kept.mapInArrow(DecodedBatches(values), decoded)
    with_text = StructType([*schema.fields, StructField(UNPARSED, StringType())])
    parsed = records.select(
        F.col("key").cast("string").alias("key"), *own[1:],
        F.col("value").cast("string").alias("__segack_text"),
    ).withColumn("__segack_value", F.from_json("__segack_text", with_text,
                                               {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": UNPARSED}))
    value, text = F.col("__segack_value"), F.col("__segack_text")
    # A field is null both where the object lacks it and where it holds null: the object's keys
    # tell them apart, read only for the values with a null field (Spark evaluates a branch of
    # CASE WHEN only where its condition holds).
    some_null = functools.reduce(operator.or_, (value[field.name].isNull() for field in schema.fields))
    # The keys as the same parser reads them (NaN and all); a text that is no object (empty, say)
    # has none, and lacks every field.
    declared = F.array(*(F.lit(field.name) for field in schema.fields))
    keys = F.map_keys(F.from_json(text, "map<string,string>"))
    lacks = F.size(F.array_except(declared, keys)) > 0
    incomplete = F.when(text.isNotNull() & value[UNPARSED].isNull() & some_null,
                        F.coalesce(lacks, F.lit(True))).otherwise(F.lit(False))
    unparsed = F.struct(*(F.lit(None).cast(field.dataType).alias(field.name) for field in schema.fields),
                        text.alias(UNPARSED))
    checked = F.when(incomplete, unparsed).otherwise(value).alias("__segack_value")
    fields = (f"__segack_value.{field.name}" for field in with_text.fields)
    return parsed.select(*own, checked).select(*own, *fields)


def takes_unparsed(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``handler`` to get records whose value did not parse (rule 2): their fields null,
    :data:`~segack.spark_adapter.worker.kafka_records.UNPARSED` holding the value's text. A class sets
    ``segack_takes_unparsed = True``."""
    setattr(handler, _MARK, True)
    return handler


@dataclass(frozen=True)
class _UnparsedCheck:
    """Raises :class:`~segack.spark_adapter.UnparsedValueError` for a record whose value did not
    parse as a schema of ``fields``, naming the fields a JSON object lacks."""

    fields: tuple[str, ...]

    def __call__(self, event: dict[str, Any]) -> None:
        text = event.get(UNPARSED)
        if text is None:
            return
        shown = text if len(text) <= 80 else text[:77] + "..."
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):  # Spark reads deeper values than Python's json does
            value = None
        lacking = [name for name in self.fields if isinstance(value, dict) and name not in value]
        why = f" (it lacks {', '.join(map(repr, lacking))})" if lacking else ""
        raise UnparsedValueError(f"the value of the record at offset {event.get('offset')} of "
                                 f"{event.get('topic')}/{event.get('partition')} does not parse as the "
                                 f"value schema{why}: {shown!r}")


@dataclass(frozen=True)
class _UndecodedCheck:
    """Raises :class:`~segack.spark_adapter.UnparsedValueError` for a record whose value (its bytes
    in base64) ``wire`` did not decode, or whose decoded value lacks or mistypes one of ``fields``
    (``(name, type)``), saying which."""

    fields: tuple[tuple[str, str], ...]
    wire: WireFormat

    def __call__(self, event: dict[str, Any]) -> None:
        text = event.get(UNPARSED)
        if text is None:
            return
        try:
            why = self._why(self.wire.decode(str(event.get("topic")), base64.b64decode(text)))
        except UndecodableValueError as error:
            why = str(error)
        except SchemaRegistryError as error:
            why = f"did not decode, and the registry does not answer to say why ({error})"
        raise UnparsedValueError(f"the value of the record at offset {event.get('offset')} of "
                                 f"{event.get('topic')}/{event.get('partition')} {why}")

    def _why(self, decoded: dict[str, Any]) -> str:
        lacking = [name for name, _ in self.fields if name not in decoded]
        if lacking:
            return f"lacks {', '.join(map(repr, lacking))}"
        for name, type_name in self.fields:
            parse = field_parser(type_name, self.wire.value_format)
            try:
                if decoded[name] is not None and parse is not None:
                    parse(decoded[name])
            except (ValueError, TypeError, OverflowError):
                return (f"holds field {name!r} as {type(decoded[name]).__name__}, which its declared type "
                        f"{type_name.upper()} does not take (declare it STRING to have it as text)")
        return "holds a field that is not of its declared type"


def unparsed_refusal(schema: StructType, wire: WireFormat | None = None) -> Refusal:
    """What a run over Kafka records of ``schema`` (in the wire format ``wire`` decodes, if given)
    does not hand a handler (rule 2), unless it :func:`~segack.spark_adapter.takes_unparsed`."""
    if wire is None:
        return Refusal(_MARK, _UnparsedCheck(tuple(field.name for field in schema.fields)))
    return Refusal(_MARK, _UndecodedCheck(tuple((field.name, field.dataType.simpleString())
                                                for field in schema.fields), wire))


#: The newest Spark whose Kafka connector (and delta-spark) this release of segack has seen on Maven
#: Central and tested with (``nox -s connectors``); the ``kafka`` and ``delta`` extras install it.
CONNECTORS_SPARK = "4.2.0"


def connector_package(spark_version: str) -> str:
    """The Maven coordinates of Spark's Kafka connector for a Spark version."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("-")[0].split(".")[:3] if part.isdigit())


def missing_connector(spark_version: str) -> str:
    """What to do for a session without Spark's Kafka connector: the package to add, or, for a Spark
    newer than :data:`CONNECTORS_SPARK` (whose connector may not be published yet), the PySpark
    to install first."""
    add = f"add it with --conf spark.jars.packages={connector_package(spark_version)}"
    if _version(spark_version) <= _version(CONNECTORS_SPARK):
        return f"this Spark session has no Kafka connector: {add} (or its jars with --conf spark.jars=...)"
    return (f"this Spark session has no Kafka connector, and Spark {spark_version} is newer than the newest "
            f"whose connector segack was tested with ({CONNECTORS_SPARK}), which Maven Central may not have "
            f"yet: install PySpark {CONNECTORS_SPARK} ({install_hint('kafka')}) and add "
            f"{connector_package(CONNECTORS_SPARK)}, or {add} if it is published")


@dataclass(frozen=True)
class KafkaStream:
    """A Kafka topic's records as a stream of events (:func:`~segack.spark_adapter.kafka_stream`), for
    :func:`~segack.spark_adapter.stream`."""

    #: The streaming DataFrame of events (rules 1 and 2).
    events: DataFrame
    #: The reader's options, rule 3's bound included; its ``kafka.*`` ones configure the admin
    #: client that commits offsets.
    options: dict[str, str]
    #: The value's declared fields, and the format they are parsed from.
    schema: StructType
    value_format: str = "json"
    #: The decoder of values in Confluent's wire format (None for JSON).
    wire: WireFormat | None = None

    @property
    def refusal(self) -> Refusal:
        """The records a run does not hand a handler (rule 2)."""
        return unparsed_refusal(self.schema, self.wire)

    def starting_at(self, starting_offsets: str) -> KafkaStream:
        """The same records, read by a new query from ``starting_offsets`` (Spark's
        ``startingOffsets``: ``earliest`` or JSON), in place of any starting option given."""
        options = {name: value for name, value in self.options.items() if name not in STARTING_OPTIONS}
        options["startingOffsets"] = starting_offsets
        records = self.events.sparkSession.readStream.format("kafka").options(**options).load()
        return dataclasses.replace(self, events=kafka_events(records, self.schema, self.value_format,
                                                             self.wire), options=options)


def kafka_stream(spark: SparkSession, options: Mapping[str, str], value_schema_ddl: str,
                 value_format: str = "json") -> KafkaStream:
    """The records of the Kafka topics ``options`` name (``kafka.bootstrap.servers`` and
    ``subscribe``, ``subscribePattern`` or ``assign``, as Spark's Kafka source takes them: their
    names in any case), as events whose value fields ``value_schema_ddl`` declares.

    Values in Confluent's wire format (``value_format`` ``avro``, ``protobuf`` or ``json-schema``)
    are decoded through the Schema Registry the options' ``schema.registry.*`` settings name
    (:mod:`~segack.spark_adapter.worker.schema_registry`), each by its writer's schema, into the
    declared fields (of the types :data:`~segack.spark_adapter.worker.kafka_records.FIELD_TYPES`
    names), in the executors' Python.

    Checks, before anything runs, that the session has Spark's Kafka connector, that the schema is
    one, that the registry answers, and (on a classic session) that the servers answer and the
    subscribed topics exist.

    Raises
    ------
    InputError
        The connector is missing (the message names the package to add), the servers or the
        registry do not answer, a topic does not exist.
    OptionError
        A value schema that is not a struct's DDL or names a column every record has, an option
        given twice in two cases (``startingOffsets`` and ``startingoffsets``),
        ``failOnDataLoss=false`` (rule 6), a value format that is not one of
        :data:`~segack.spark_adapter.sources.value_formats.VALUE_FORMATS`, registry settings that do not
        go with it, a field type the wire format's decoder does not give.
    """
    options = spelled(options, KNOWN_OPTIONS, prefixes=("kafka.", "schema.registry."))
    schema = value_schema(spark, value_schema_ddl, includes_headers(options))
    if str(options.get("failOnDataLoss", "true")).strip().lower() == "false":
        raise OptionError("failOnDataLoss=false makes Spark pass over records gone from Kafka (deleted by "
                          "retention, or with their topic) without a word, and segack skips nothing unless "
                          "told: leave it out, and a stream that finds records gone stops, saying which; to "
                          "go on past them, start a new checkpoint")
    if value_format in REGISTRY_FORMATS:
        check_fields(schema, f"a value in {value_format}", "", value_format)
    wire, options = wire_format(options, value_format, known_topics(options))
    options = java_options(options)
    bounded = {"maxOffsetsPerTrigger": str(DEFAULT_MAX_OFFSETS_PER_TRIGGER), **options}
    try:
        records = spark.readStream.format("kafka").options(**bounded).load()
    except Exception as error:
        text = str(error)
        missing = "Failed to find data source" in text or "DATA_SOURCE_NOT_FOUND" in text
        if missing and "kafka" in text.lower():
            raise InputError(missing_connector(spark.version)) from None
        raise InputError(f"cannot read Kafka: {spark_reason(text)}") from None
    _check_reachable(spark, bounded)
    return KafkaStream(kafka_events(records, schema, value_format, wire), bounded, schema, value_format, wire)


def _check_reachable(spark: SparkSession, options: Mapping[str, str], seconds: float = 10) -> None:
    """Refuse servers that do not answer and ``subscribe`` topics that do not exist, asking Kafka's
    admin client in the driver's JVM (a classic session; Spark Connect is left to the query)."""
    from segack.spark_adapter.spark.session import is_connect

    if is_connect(spark):
        return
    servers = options.get("kafka.bootstrap.servers", "")
    topics = [topic.strip() for topic in options.get("subscribe", "").split(",") if topic.strip()]
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    unit = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    with _admin(spark, options) as admin:
        try:
            admin.describeCluster().clusterId().get(int(seconds * 1000), unit)
            known = set(admin.listTopics().names().get(int(seconds * 1000), unit))
        except Exception as error:
            reason = security_failure(str(error)) or spark_reason(error)
            raise InputError(f"cannot reach Kafka at {servers}: {reason}") from None
    missing = [topic for topic in topics if topic not in known]
    if missing:
        raise InputError(f"Kafka at {servers} has no topic {missing[0]!r}")


@contextlib.contextmanager
def _admin(spark: SparkSession, options: Mapping[str, str], seconds: float = 15) -> Iterator[Any]:
    """Kafka's admin client in the driver's JVM, configured as the source's consumers are (a classic
    session), its calls given up after ``seconds``; closed at the block's end."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        admin = jvm.org.apache.kafka.clients.admin.Admin.create(_admin_settings(spark, options, seconds))
    except Exception as error:  # Py4J's: the client refused its settings (a file it cannot read, say)
        raise InputError(f"cannot reach Kafka at {options.get('kafka.bootstrap.servers', '')}: "
                         f"{spark_reason(error)}") from None
    try:
        yield admin
    finally:
        admin.close()


def _admin_settings(spark: SparkSession, options: Mapping[str, str], seconds: float) -> Any:
    """Kafka admin client settings (a ``java.util.Properties``) from the reader's ``kafka.*``
    options, as the source configures its consumers, calls given up after ``seconds``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    settings = jvm.java.util.Properties()
    for name, value in options.items():
        if name.startswith("kafka."):
            settings.put(name.removeprefix("kafka."), value)
    settings.put("request.timeout.ms", str(round(min(seconds, 10) * 1000)))
    settings.put("default.api.timeout.ms", str(round(seconds * 1000)))
    return settings


@dataclass(frozen=True)
class PartitionOffsets:
    """Where a stream stands in one topic-partition, as of a micro-batch Spark reported."""

    topic: str
    partition: int
    #: The next offset to read: every record below it is done (rule 4).
    end: int
    #: The partition's end when Spark last looked (``None`` if it did not say).
    latest: int | None

    @property
    def lag(self) -> int | None:
        """Records written but not yet done, as of that look."""
        return None if self.latest is None else max(self.latest - self.end, 0)


def _offsets(text: Any) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": 12, ...}}`` (Spark's Kafka offsets, JSON or parsed) as ``(topic, partition)
    -> offset``; anything else (another source's offsets) is empty."""
    try:
        parsed = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    found = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            return {}
        for partition, offset in partitions.items():
            if not (isinstance(offset, int) and str(partition).lstrip("-").isdigit()):
                return {}
            found[(str(topic), int(partition))] = offset
    return found


def parse_offsets(progress: Mapping[str, Any]) -> list[PartitionOffsets]:
    """Each Kafka source's partitions in a query's progress (``StreamingQuery.lastProgress``)."""
    found = []
    for source in progress.get("sources") or ():
        ends, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        found += [PartitionOffsets(topic, partition, end, latest.get((topic, partition)))
                  for (topic, partition), end in sorted(ends.items())]
    return found


def commit_offsets(spark: SparkSession, options: Mapping[str, str], group: str,
                   offsets: list[PartitionOffsets]) -> None:
    """Commit ``offsets`` to consumer group ``group`` (rule 4), through Kafka's own admin client in
    the driver's JVM, configured as the source is: its ``kafka.*`` reader options.

    Raises :class:`~segack.spark_adapter.OptionError` over Spark Connect (the driver's JVM is
    the server's), and Kafka's error when the commit fails.
    """
    from segack.spark_adapter.spark.session import is_connect

    if is_connect(spark):
        raise OptionError("--commit-offsets-to needs a classic session (a master), not Spark Connect")
    if not offsets:
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    kafka = jvm.org.apache.kafka
    committed = jvm.java.util.HashMap()
    for where in offsets:
        committed.put(kafka.common.TopicPartition(where.topic, where.partition),
                      kafka.clients.consumer.OffsetAndMetadata(where.end))
    with _admin(spark, options) as admin, durable_write("group-commit"):
        admin.alterConsumerGroupOffsets(group, committed).all().get()


def subscribed_partitions(spark: SparkSession, options: Mapping[str, str]) -> list[tuple[str, int]]:
    """The partitions the reader's ``subscribe``, ``subscribePattern`` or ``assign`` option names
    now, in order (a classic session)."""
    if "assign" in options:
        assigned = json.loads(options["assign"])
        return sorted((str(topic), int(partition)) for topic, partitions in assigned.items()
                      for partition in partitions)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    with _admin(spark, options) as admin:
        names = sorted(admin.listTopics().names().get())
        if "subscribePattern" in options:
            pattern = jvm.java.util.regex.Pattern.compile(options["subscribePattern"])
            topics = [name for name in names if pattern.matcher(name).matches()]
        else:
            wanted = {topic.strip() for topic in options.get("subscribe", "").split(",") if topic.strip()}
            topics = [name for name in names if name in wanted]
        if not topics:
            return []
        described = admin.describeTopics(jvm.java.util.ArrayList(topics)).allTopicNames().get()
        return sorted((topic, int(info.partition())) for topic in topics
                      for info in described.get(topic).partitions())


def list_offsets(spark: SparkSession, options: Mapping[str, str],
                 specs: Mapping[tuple[str, int], str | int], seconds: float = 15,
                 ) -> dict[tuple[str, int], int]:
    """Each partition's offset for its spec: ``"earliest"``, ``"latest"``, or a timestamp in
    milliseconds (the first offset at or after it; the partition's end if none is); Kafka's
    error past ``seconds``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    kafka = jvm.org.apache.kafka
    offset_spec = kafka.clients.admin.OffsetSpec
    asked = jvm.java.util.HashMap()
    for (topic, partition), spec in specs.items():
        chosen = (offset_spec.earliest() if spec == "earliest" else offset_spec.latest() if spec == "latest"
                  else offset_spec.forTimestamp(int(spec)))
        asked.put(kafka.common.TopicPartition(topic, partition), chosen)
    if not specs:
        return {}
    with _admin(spark, options, seconds) as admin:
        found = admin.listOffsets(asked).all().get()
        offsets = {(str(where.topic()), int(where.partition())): int(info.offset())
                   for where, info in found.items()}
    missing = [where for where, offset in offsets.items() if offset < 0]
    if missing:  # a timestamp after every record: the partition's end
        offsets.update(list_offsets(spark, options, dict.fromkeys(missing, "latest"), seconds))
    return offsets


def group_offsets(spark: SparkSession, options: Mapping[str, str], group: str) -> dict[tuple[str, int], int]:
    """Consumer group ``group``'s committed offsets (none for a group that has none)."""
    with _admin(spark, options) as admin:
        found = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
        return {(str(where.topic()), int(where.partition())): int(committed.offset())
                for where, committed in found.items() if committed is not None}


def offsets_json(offsets: Mapping[tuple[str, int], int]) -> str:
    """``offsets`` as Spark's ``startingOffsets`` JSON (``-2``: a partition's earliest)."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(nested, separators=(",", ":"))


def starting_offsets(spark: SparkSession, options: Mapping[str, str],
                     partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Where the reader's starting option (:data:`STARTING_OPTIONS`, in Spark's order of precedence)
    starts a new query in each of ``partitions``: the earliest offsets when none is given."""
    lookups: dict[tuple[str, int], str | int] = dict.fromkeys(partitions, "earliest")
    fixed: dict[tuple[str, int], int] = {}
    text = options.get("startingOffsets", "earliest").strip()
    if "startingTimestamp" in options:
        lookups = dict.fromkeys(partitions, int(options["startingTimestamp"]))
    elif "startingOffsetsByTimestamp" in options:
        stamps = _offsets(options["startingOffsetsByTimestamp"])
        lookups.update({where: stamp for where, stamp in stamps.items() if where in lookups})
    elif text.lower() == "latest":
        lookups = dict.fromkeys(partitions, "latest")
    elif text.lower() != "earliest":
        for where, offset in _offsets(text).items():
            if where in lookups and offset >= 0:
                fixed[where] = offset
                del lookups[where]
            elif where in lookups and offset == -1:
                lookups[where] = "latest"
    return {**list_offsets(spark, options, lookups), **fixed}


def passed_over(earliest: Mapping[tuple[str, int], int], starts: Mapping[tuple[str, int], int]) -> int:
    """The records a query starting at ``starts`` passes over: those between each partition's
    ``earliest`` offset and its start."""
    return sum(max(0, start - earliest.get(where, start)) for where, start in starts.items())
