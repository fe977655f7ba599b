"""How the ``segack`` command reads its input, and refuses input it cannot read in one line.

The input is files in any format Spark's reader takes (``INPUT``, ``--format``, ``--option``), or
a table the session knows (``--table``). A local path in a format named in :data:`FORMATS` is
looked at before Spark starts (:func:`check_input_files`): missing, empty, or not in the format
asked for. Spark's own refusal of anything else (:func:`read_input`) is cut to its first line.
Each refusal is an :class:`~segack.spark_adapter.InputError` that names the path and the fix.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from segack.spark_adapter.errors import InputError
from segack.spark_adapter.store.checkpoint import resolve_location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMATS", "check_input_files", "read_input"]

#: The formats whose local files are looked at before Spark starts.
FORMATS = ("parquet", "csv", "json")
_PARQUET_MAGIC = b"PAR1"


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
    ``fmt`` (Parquet is told by its first bytes). A URI (``s3://...``) and a format not in
    :data:`FORMATS` (``delta``: a directory of its own layout) are left to Spark."""
    if ("://" in path and not path.startswith("file://")) or fmt not in FORMATS:
        return
    local = resolve_location(path)
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


def read_input(spark: SparkSession, path: str | None, fmt: str, options: dict[str, str],
               table: str | None = None) -> DataFrame:
    """Table ``table``, or the files at ``path`` in format ``fmt`` with the reader's ``options``
    (CSV: a header line and inferred types, unless ``options`` say otherwise); Spark's refusal is
    an :class:`~segack.spark_adapter.InputError` of one line."""
    try:
        if table is not None:
            return spark.read.table(table)
        assert path is not None
        defaults = {"header": "true", "inferSchema": "true"} if fmt == "csv" else {}
        reader = spark.read.format(fmt).options(**{**defaults, **options})
        # A relative path means this directory, not the one a Connect server or cluster driver runs in.
        return reader.load(resolve_location(path))
    except Exception as error:  # Spark raises its analysis and Java errors as several classes
        what = f"table {table}" if table is not None else f"{path} as {fmt}"
        raise InputError(f"cannot read {what}: {_first_line(error)}") from None


def _first_line(error: Exception) -> str:
    """The reason in Spark's error text: the first line that is not Py4J's preamble, without the
    Java exception's class name."""
    for line in str(error).splitlines():
        line = line.strip().removeprefix(": ")
        if line and not line.startswith("An error occurred while calling"):
            return line.rsplit("Exception: ", 1)[-1]
    return type(error).__name__
