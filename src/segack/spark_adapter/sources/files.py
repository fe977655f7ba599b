"""How the ``segack`` command reads its input, and refuses input it cannot read in one line.

The input is files in any format Spark's reader takes (``INPUT``, ``--format``, ``--option``), or
a table the session knows (``--table``). A local path in a format named in :data:`FORMATS` is
looked at before Spark starts (:func:`check_input_files`): missing, empty, or not in the format
asked for. Spark's own refusal of anything else (:func:`read_input`) is cut to its first line.
Each refusal is an :class:`~segack.spark_adapter.InputError` that names the path and the fix.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, cast, overload

from segack.spark_adapter.errors import InputError, OptionError, spark_reason
from segack.spark_adapter.sources.delta import (
    ADMISSION_LIMITS,
    CHANGE_FEED_OPTIONS,
    DeltaChangeFeed,
    change_feed_stream_options,
    is_change_feed,
    with_change_order,
)
from segack.spark_adapter.sources.reader_options import spelled
from segack.spark_adapter.store.storage import resolve_location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMATS", "check_input_files", "delta_change_feed", "read_input"]

#: The formats whose local files are looked at before Spark starts.
FORMATS = ("parquet", "csv", "json")
#: What to add for a format whose connector is not part of Spark.
CONNECTORS = {
    "delta": "delta-spark's jars for this Spark version: --conf spark.jars.packages="
             "io.delta:delta-spark_2.13:RELEASE (the Delta release built for your Spark)",
    "avro": "Spark's Avro connector: --conf spark.jars.packages="
            "org.apache.spark:spark-avro_2.13:SPARK_VERSION",
}
#: The session settings Delta needs to read a change feed or a table of the catalog, as flags.
DELTA_SESSION = ("--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension --conf "
                 "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog")
_PARQUET_MAGIC = b"PAR1"
#: What delta-spark's errors say of a path that holds no Delta table.
_NOT_DELTA = ("DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE", "DELTA_SCHEMA_NOT_SET",
              "is not a Delta table")
#: The reader options that choose a version or a time of a table (Delta's time travel, and where a
#: change feed starts and ends).
_POSITIONS = ("versionAsOf", "timestampAsOf", "startingVersion", "startingTimestamp", "endingVersion",
              "endingTimestamp")
#: The reader options segack reads or sets, in Spark's spelling: given in any case, they are spelled
#: so (:func:`~segack.spark_adapter.sources.reader_options.spelled`).
_KNOWN = (*_POSITIONS, *CHANGE_FEED_OPTIONS, *ADMISSION_LIMITS, "header", "inferSchema")


def _data_files(directory: str) -> list[str]:
    """The files Spark would read under ``directory``, sorted: hidden (``.x``) and metadata
    (``_x``) files and directories skipped, as Spark skips them."""
    found = []
    for root, directories, names in os.walk(directory):
        directories[:] = sorted(name for name in directories if not name.startswith((".", "_")))
        found += [os.path.join(root, name) for name in sorted(names) if not name.startswith((".", "_"))]
    return found


def check_input_files(path: str, fmt: str) -> None:
    """Refuse a local ``path`` that is missing, holds no files, or whose first file is not in
    ``fmt`` (Parquet is told by its first bytes), or a local ``delta`` path without a Delta log. A
    URI (``s3://...``) and another format are left to Spark."""
    if "://" in path and not path.startswith("file://"):
        return
    local = resolve_location(path)
    if fmt == "delta" and not os.path.isdir(os.path.join(local, "_delta_log")):
        raise InputError(f"{path} is not a Delta table: it has no _delta_log")
    if fmt not in FORMATS:
        return
    if not os.path.exists(local):
        raise InputError(f"no input at {path}: no such file or directory")
    files = _data_files(local) if os.path.isdir(local) else [local]
    if not files:
        raise InputError(f"no input at {path}: the directory holds no files")
    first = files[0]
    try:
        with open(first, "rb") as handle:
            head = handle.read(len(_PARQUET_MAGIC))
    except OSError as error:
        raise InputError(f"cannot read {first}: {error.strerror}") from None
    if fmt == "parquet" and head != _PARQUET_MAGIC:
        raise InputError(f"{first} is not a Parquet file (Parquet is the default format); "
                         f"if it is CSV or JSON, say so with --format csv or --format json")
    if fmt != "parquet" and head == _PARQUET_MAGIC:
        raise InputError(f"{first} is a Parquet file, not {fmt}: leave out --format {fmt}")


@overload
def read_input(spark: SparkSession, path: str | None, fmt: str, options: dict[str, str],
               table: str | None = None, streaming: Literal[False] = False) -> DataFrame: ...


@overload
def read_input(spark: SparkSession, path: str | None, fmt: str, options: dict[str, str],
               table: str | None = None, *, streaming: Literal[True]) -> DataFrame | DeltaChangeFeed: ...


def read_input(spark: SparkSession, path: str | None, fmt: str, options: dict[str, str],
               table: str | None = None, streaming: bool = False) -> DataFrame | DeltaChangeFeed:
    """Table ``table``, or the files at ``path`` in format ``fmt``, with the reader's ``options``
    (CSV: a header line and inferred types, unless ``options`` say otherwise); Spark's refusal is
    an :class:`~segack.spark_adapter.InputError` of one line. A Delta change data feed
    (``readChangeFeed=true``, of a path or a table) gets its ``_change_order`` column.

    With ``streaming``, a stream of them (``spark.readStream``): of a file format, with the schema
    its files have now; a change feed as a
    :class:`~segack.spark_adapter.sources.delta.DeltaChangeFeed`, in micro-batches of whole commits
    (rule 3 of :mod:`~segack.spark_adapter.sources.delta`: its admission limits refused,
    :class:`~segack.spark_adapter.OptionError`)."""
    options = spelled(options, _KNOWN)
    streamed_feed = streaming and is_change_feed(None if table is not None else fmt, options)
    if streamed_feed:
        options = change_feed_stream_options(options)
    try:
        if table is not None:
            found = (spark.readStream if streaming else spark.read).options(**options).table(table)
            if streamed_feed:
                return DeltaChangeFeed(with_change_order(found), options, table=table)
            return with_change_order(found) if is_change_feed(None, options) else found
        assert path is not None
        defaults = {"header": "true", "inferSchema": "true"} if fmt == "csv" else {}
        # A relative path means this directory, not the one a Connect server or cluster driver runs in.
        where = resolve_location(path)
        reader = spark.read.format(fmt).options(**{**defaults, **options})
        if not streaming:
            found = reader.load(where)
        else:
            stream = spark.readStream.format(fmt).options(**{**defaults, **options})
            if fmt in FORMATS:
                stream = stream.schema(reader.load(where).schema)
            found = stream.load(where)
        if streamed_feed:
            return DeltaChangeFeed(with_change_order(found), options, path=where)
        return with_change_order(found) if is_change_feed(fmt, options) else found
    except Exception as error:  # Spark raises its analysis and Java errors as several classes
        what = f"table {table}" if table is not None else f"{path} as {fmt}"
        # A refusal of a version or a time is of that option: the line says which the user gave.
        what += "".join(f" {name}={options[name]}" for name in _POSITIONS if name in options)
        text = str(error)
        if ("Failed to find data source" in text or "DATA_SOURCE_NOT_FOUND" in text) and fmt in CONNECTORS:
            raise InputError(f"this Spark session has no {fmt} connector: add {CONNECTORS[fmt]}") from None
        if "DELTA_CONFIGURE_SPARK_SESSION_WITH_EXTENSION_AND_CATALOG" in text:
            raise InputError(f"cannot read {what}: Delta needs its session settings: {DELTA_SESSION}",
                             ) from None
        if fmt == "delta" and any(sign in text for sign in _NOT_DELTA):
            raise InputError(f"{path} is not a Delta table: it has no _delta_log") from None
        raise InputError(f"cannot read {what}: {spark_reason(error)}") from None


def delta_change_feed(spark: SparkSession, path: str | None = None, *, table: str | None = None,
                      options: dict[str, str] | None = None) -> DeltaChangeFeed:
    """The change data feed of the Delta table at ``path`` (or of the catalog's ``table``) as a
    stream of changes for :func:`~segack.spark_adapter.stream`, each with ``_change_order`` to order
    a key's changes by, in micro-batches of whole commits; with the reader's ``options``
    (``startingVersion``, ...). A query over it restarts from segack's record when Spark's checkpoint
    of it is gone (:mod:`~segack.spark_adapter.sources.delta`'s rules).

    Raises
    ------
    InputError
        Not a Delta table, a session without delta-spark or its settings, a version it lacks.
    OptionError
        ``maxFilesPerTrigger`` or ``maxBytesPerTrigger``, which would split a commit; ``path`` and
        ``table`` both given, or neither.
    """
    if (path is None) == (table is None):
        raise OptionError("give the Delta table's path or its table name, one of the two")
    given = dict(options or {})
    if not is_change_feed("delta", given):
        given["readChangeFeed"] = "true"
    return cast(DeltaChangeFeed, read_input(spark, path, "delta", given, table, streaming=True))
