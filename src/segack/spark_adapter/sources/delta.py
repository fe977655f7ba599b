"""Delta tables and their change data feeds as events.

The rules:

1. **A table, or a version of it** (``--option versionAsOf=N`` or ``timestampAsOf``), is input like
   any other: each row an event, ordered within its key by the column the user names.
2. **A change data feed** (``--option readChangeFeed=true``, or Delta's other name for it,
   ``readChangeData``; option names in any case, as Spark reads them) has a row per change, with
   ``_change_type``, ``_commit_version`` and ``_commit_timestamp``. segack adds :data:`CHANGE_ORDER`,
   the order of a key's changes: by commit version, and within one commit the row that went before
   the row that came (``delete``, then ``update_preimage``, then ``update_postimage``, then
   ``insert``). Give it as the order column (``--order _change_order``). Delta records no order
   among the changes of one key in one commit of the same type (two inserts of a key that is not
   unique): segack places them by a hash of the whole row, the same in every run.
3. **A change feed's micro-batch holds whole commits.** Delta admits a streamed change feed's files
   to a micro-batch up to ``maxFilesPerTrigger`` (1,000 unless set) or ``maxBytesPerTrigger``, and
   splits a commit whose changes are not in change-data files (an overwrite, a ``replaceWhere``, a
   whole-file delete) to do so: its inserts could come a micro-batch before their keys' deletes, and
   run first. segack sets no such limit (:func:`change_feed_stream_options`): each micro-batch reads
   whole commits, a backlog in one micro-batch.
4. **A streamed change feed restarts after the last micro-batch segack recorded**
   (:meth:`DeltaChangeFeed.after`), when Spark's checkpoint of the query is gone. The batch's end
   offset in Spark's checkpoint (the table's id, ``reservoirVersion`` and ``index``) names the next
   commit to read: that version when ``index`` is -1 (none of its files read), else the one after it
   (by rule 3 a micro-batch reads a commit whole, and the table's first snapshot whole: an end
   inside the snapshot of version ``v`` names ``v + 1``). The new query starts at that commit, or,
   while nobody has committed it yet (a query started at a version that is not there fails), at
   the one before, whose changes it drops. Until the restarted query completes a micro-batch, each
   run starts it so again: Delta works out a query's first micro-batch from the reader's options
   whenever it runs it. A record that ends before the first snapshot was read, or on a schema
   change's marker, or of another table (its id), is refused: no starting version reads on from
   it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.errors import CheckpointError, OptionError, spark_reason

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ADMISSION_LIMITS", "CHANGE_FEED_OPTIONS", "CHANGE_ORDER", "CHANGE_RANKS", "STARTING_OPTIONS",
           "DeltaChangeFeed", "change_feed_stream_options", "is_change_feed", "with_change_order"]

#: The order column segack adds to a change feed (rule 2).
CHANGE_ORDER = "_change_order"
#: Each change type's place among a key's changes in one commit (rule 2).
CHANGE_RANKS = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
#: The reader options that make a read of a Delta table its change data feed.
CHANGE_FEED_OPTIONS = ("readChangeFeed", "readChangeData")
#: The reader options by which Delta splits a streamed change feed's commits (rule 3).
ADMISSION_LIMITS = ("maxFilesPerTrigger", "maxBytesPerTrigger")
#: The reader options that say where a new query of a change feed starts (Spark ignores them once
#: the query has a position, and so does a restart by rule 4).
STARTING_OPTIONS = ("startingVersion", "startingTimestamp")
#: ``maxFilesPerTrigger`` as segack sets it for a streamed change feed: no limit (Java's largest int).
_NO_FILE_LIMIT = str(2**31 - 1)


def is_change_feed(fmt: str | None, options: Mapping[str, str]) -> bool:
    """Whether a read of ``fmt`` (``None``: a catalog table, whatever its format) with ``options``
    is a Delta change data feed (its option's name in any case, as Spark reads it)."""
    wanted = {name.lower() for name in CHANGE_FEED_OPTIONS}
    return (fmt is None or fmt.lower() == "delta") and any(
        name.lower() in wanted and str(value).strip().lower() == "true" for name, value in options.items())


def change_feed_stream_options(options: Mapping[str, str]) -> dict[str, str]:
    """The reader's ``options`` (spelled as segack reads them) for a streamed change feed, by rule 3.

    Raises :class:`~segack.spark_adapter.OptionError` for ``maxFilesPerTrigger`` or
    ``maxBytesPerTrigger``."""
    given = [name for name in ADMISSION_LIMITS if name in options]
    if given:
        raise OptionError(f"{given[0]} would let Delta split a commit of the change feed (an overwrite, a "
                          f"replaceWhere, a whole-file delete) across micro-batches, where a key's insert "
                          f"can run before its delete; segack reads whole commits: leave it out")
    return {**options, "maxFilesPerTrigger": _NO_FILE_LIMIT}


def with_change_order(changes: DataFrame) -> DataFrame:
    """``changes`` (a change data feed, static or streaming) with :data:`CHANGE_ORDER` (rule 2)."""
    from pyspark.sql import functions as F

    rank = F.lit(len(CHANGE_RANKS))
    for kind, place in reversed(CHANGE_RANKS.items()):
        rank = F.when(F.col("_change_type") == kind, F.lit(place)).otherwise(rank)
    return changes.withColumn(CHANGE_ORDER, F.col("_commit_version").cast("bigint") * (len(CHANGE_RANKS) + 1)
                              + rank)


@dataclass(frozen=True)
class DeltaChangeFeed:
    """A Delta table's change data feed streamed as events, with :data:`CHANGE_ORDER` (read by
    :func:`~segack.spark_adapter.delta_change_feed`), for :func:`~segack.spark_adapter.stream`:
    unlike a streaming DataFrame of the caller's, a query over it restarts from segack's record of
    its last micro-batch when Spark's checkpoint of the query is gone (rule 4)."""

    #: The streaming DataFrame of changes.
    events: DataFrame
    #: The reader's options (rule 3's included).
    options: dict[str, str]
    #: The table's location, or ``None`` for a table of the catalog.
    path: str | None = None
    #: The catalog table's name, or ``None`` for a table read by its location.
    table: str | None = None

    def _named(self) -> str:
        return f"table {self.table}" if self.table is not None else f"the Delta table at {self.path}"

    def _sql_name(self) -> str:
        return self.table if self.table is not None else "delta.`" + str(self.path).replace("`", "``") + "`"

    def table_id(self) -> str:
        """The id Delta gave the table when it was created (its source offsets' ``reservoirId``)."""
        [detail] = self.events.sparkSession.sql(f"DESCRIBE DETAIL {self._sql_name()}").select("id").collect()
        return str(detail[0])

    def latest_version(self) -> int:
        """The table's last commit's version."""
        spark = self.events.sparkSession
        [last] = spark.sql(f"DESCRIBE HISTORY {self._sql_name()} LIMIT 1").select("version").collect()
        return int(last[0])

    def after(self, end: Mapping[str, Any]) -> DeltaChangeFeed:
        """The same changes from the first commit after a micro-batch that ended at ``end`` (the
        Delta source's end offset, as Spark's checkpoint gives it), read by a new query (rule 4), in
        place of any starting option given.

        Raises :class:`~segack.spark_adapter.CheckpointError` for an end no version reads on from
        exactly, one of another table, or a table Spark cannot read."""
        from pyspark.sql import functions as F

        try:
            table_id = self.table_id()
            if end.get("reservoirId") != table_id:
                raise CheckpointError(f"{self._named()} is not the one the stream read (its id is "
                                      f"{table_id}, the record's {end.get('reservoirId')}): it was replaced")
            following = self._next_version(end)
            # The next commit itself where it is there (a schema change or a log cleaned up may bar
            # the one before); else the one before it, whose changes are dropped.
            start = following if following <= self.latest_version() else max(following - 1, 0)
            options = {name: value for name, value in self.options.items() if name not in STARTING_OPTIONS}
            options["startingVersion"] = str(start)
            reader = self.events.sparkSession.readStream.format("delta").options(**options)
            found = reader.table(self.table) if self.table is not None else reader.load(self.path)
        except CheckpointError:
            raise
        except Exception as error:  # Spark raises its analysis and Java errors as several classes
            raise CheckpointError(f"cannot read {self._named()}: {spark_reason(error)}") from None
        changes = with_change_order(found).where(F.col("_commit_version") >= following)
        return dataclasses.replace(self, events=changes, options=options)

    def _next_version(self, end: Mapping[str, Any]) -> int:
        """The first commit the micro-batch that ended at ``end`` did not read (rule 4)."""
        try:
            version, index = int(end["reservoirVersion"]), int(end["index"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"the record's end offset {end} is not a Delta source's") from None
        if end.get("isStartingVersion") and index < 0:
            raise CheckpointError(f"the record ends before the first snapshot of {self._named()} (version "
                                  f"{version}) was read, which no starting version reads on from")
        if index == -1:
            return version
        if index < 0:
            raise CheckpointError(f"the record ends on a schema change of {self._named()} (version "
                                  f"{version}, index {index}), which no starting version reads on from")
        return version + 1
