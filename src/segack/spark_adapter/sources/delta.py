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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from segack.spark_adapter.errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ADMISSION_LIMITS", "CHANGE_FEED_OPTIONS", "CHANGE_ORDER", "CHANGE_RANKS",
           "change_feed_stream_options", "is_change_feed", "with_change_order"]

#: The order column segack adds to a change feed (rule 2).
CHANGE_ORDER = "_change_order"
#: Each change type's place among a key's changes in one commit (rule 2).
CHANGE_RANKS = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
#: The reader options that make a read of a Delta table its change data feed.
CHANGE_FEED_OPTIONS = ("readChangeFeed", "readChangeData")
#: The reader options by which Delta splits a streamed change feed's commits (rule 3).
ADMISSION_LIMITS = ("maxFilesPerTrigger", "maxBytesPerTrigger")
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
