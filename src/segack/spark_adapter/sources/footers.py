"""What the footers of a replay's Parquet files say of it, read before any Spark job: how many
events it holds, and how many of them have a null order value.

A Parquet file ends with its metadata: each row group's row count and, for each column, statistics
that count its nulls. Where a replay's input is exactly a scan of Parquet files on this machine's
file system (what ``spark.read.parquet(path)`` and ``segack replay PATH`` make: no filter, no
computed column), those footers answer both questions for the price of reading them:

- **the total**, so that the progress line, ``segack status`` and the page give a share done and a
  time left from a fresh run's first report, not only once a run has read its input to the end;
- **the order column's null check**, which a run makes before its claim: from the footers' null
  counts instead of a Spark job. They count nulls, not NaN, so a floating-point order column is
  still checked by the job.

:func:`footer_facts` answers ``None`` (and the run asks Spark, as before) for anything else: other
formats, files on another file system (HDFS, object stores: their footers are read by the executors
in the check's job instead, in parallel), a query Spark cannot describe (Spark Connect), more files
than :data:`MOST_FILES`, or an order column that is a partition column or is not read from the
files as it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from segack.spark_adapter.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["MOST_FILES", "FooterFacts", "footer_facts"]

log = logging.getLogger(__name__)

#: Files whose footers the driver reads at most; past it, Spark's job is quicker.
MOST_FILES = 2_000
_LOGICAL_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
_FILE_RELATION = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"
_PARQUET = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"


@dataclass(frozen=True)
class FooterFacts:
    """What the input's footers say."""

    #: Events in the input.
    rows: int
    #: Events whose order value is null; ``None`` where a row group's statistics do not count them.
    order_nulls: int | None


def footer_facts(df: DataFrame, order: str) -> FooterFacts | None:
    """The footers' answers for ``df`` and its order column ``order``, or ``None`` where they cannot
    be read on the driver (see the module's docs)."""
    files = _local_parquet_files(df, order)
    if files is None:
        return None
    import pyarrow.parquet as pq

    rows = 0
    nulls: int | None = 0
    try:
        for path in files:
            metadata = pq.read_metadata(path)
            rows += metadata.num_rows
            if nulls is not None:
                nulls = _add_nulls(nulls, metadata, order)
    except (OSError, ValueError) as error:  # pyarrow's errors are both: Spark's job reads them
        log.info("the input's Parquet footers were not read (%s: %s): Spark counts instead",
                 type(error).__name__, error)
        return None
    return FooterFacts(rows, nulls)


def _add_nulls(nulls: int, metadata: Any, order: str) -> int | None:
    """``nulls`` plus the order column's nulls in each row group of a file's ``metadata``; ``None``
    where one row group does not count them."""
    column = next((number for number in range(metadata.num_columns)
                   if metadata.schema.column(number).path == order), None)
    if column is None:
        return None
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(column).statistics
        if statistics is None or not statistics.has_null_count:
            return None
        nulls += statistics.null_count
    return nulls


def _local_parquet_files(df: DataFrame, order: str) -> list[str] | None:
    """The local paths of the Parquet files ``df`` scans as they are, or ``None``."""
    if is_connect(df.sparkSession):
        return None
    from py4j.protocol import Py4JError

    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        if plan.getClass().getName() != _LOGICAL_RELATION:
            return None  # a filter, a projection, a join: the files are not the events
        relation = plan.relation()
        if (relation.getClass().getName() != _FILE_RELATION
                or relation.fileFormat().getClass().getName() != _PARQUET
                or order not in list(relation.dataSchema().fieldNames())
                or order in list(relation.partitionSchema().fieldNames())):
            return None
        statuses = relation.location().allFiles()
        if statuses.size() > MOST_FILES:
            return None
        uris = [statuses.apply(number).getPath().toString() for number in range(statuses.size())]
    except Py4JError as error:
        log.info("the input's plan was not read (%s): Spark counts instead", type(error).__name__)
        return None
    paths = []
    for uri in uris:
        parts = urlsplit(uri)
        if parts.scheme != "file":
            return None
        paths.append(unquote(parts.path))
    return paths
