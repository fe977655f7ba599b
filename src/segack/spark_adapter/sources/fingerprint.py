"""The identity of a replay's input, so that a resumed run can skip checking it.

Before a resumed run handles anything, it checks that the events its checkpoint
counts as done are still in the input: a pass over every event (see
:func:`~segack.spark_adapter.replay`). When the input is a query over files only, there is a
cheaper way to know it has not changed since that check: the same query over the
same files, each with the same length and modification time.

:func:`input_fingerprint` digests exactly that:

- the query's canonical plan (Spark's own normal form, in which expression ids
  are renumbered, so the same query gives the same plan in any session), in
  full: filters, projections and literals, whatever their length;
- for each file source it reads: its format, options and schemas, and every
  file Spark listed for it with its length and modification time.

A run records the fingerprint of the input it checked (or started from); the
next run with the same fingerprint skips the check. There is no fingerprint
(``None``, so the check always runs) when the plan's rows could change while
all of that stays the same:

- a leaf of the plan is anything but files (a table in memory, a JDBC source,
  a cached DataFrame);
- the plan is not deterministic, or runs user code (Python or Scala UDFs,
  ``mapInPandas``, ``mapInArrow``, ...): the code may have changed;
- the plan has a subquery (whose own files the plan's leaves do not list);
- the session is a Spark Connect one, whose client cannot see the plan.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["input_fingerprint"]

log = logging.getLogger(__name__)

_LOGICAL_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
_FILE_RELATION = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"
_CATALYST = "org.apache.spark.sql.catalyst."
#: Plan nodes and expressions that call code the plan does not contain.
_USER_CODE = re.compile(r"UDF|UDAF|UDTF|Python|Pandas|Arrow|InR$")
#: Subqueries: their plans are in the plan's text, but their leaves are not among its leaves.
_SUBQUERY = re.compile(r"Subquery|Exists|ListQuery")
_CLASS = re.compile(r'"class":"([^"]+)"')
#: Each JVM stamps its expression ids with a random id of its own.
_JVM_ID = re.compile(r',"jvmId":"[^"]*"')


def input_fingerprint(df: DataFrame) -> str | None:
    """A digest of ``df``'s query and of every file it reads; ``None`` when its rows could change
    without either changing (see the module's docs)."""
    if is_connect(df.sparkSession):
        return None
    from py4j.protocol import Py4JError

    try:
        return _digest(df)
    except Py4JError as error:
        # A plan Spark cannot describe in full vouches for nothing: the run checks.
        log.info("no input fingerprint: Spark did not describe the plan (%s)", type(error).__name__)
        return None


def _digest(df: DataFrame) -> str | None:
    # A new query: a DataFrame's own plan may predate a cache() that now serves its rows.
    plan = df.select("*")._jdf.queryExecution().optimizedPlan().canonicalized()
    if not plan.deterministic():
        return None
    shape = _JVM_ID.sub("", plan.toJSON())
    for name in _CLASS.findall(shape):
        if name != _LOGICAL_RELATION and (not name.startswith(_CATALYST) or _USER_CODE.search(name)
                                           or _SUBQUERY.search(name)):
            return None
    digest = hashlib.sha256(shape.encode())
    leaves = plan.collectLeaves()
    for number in range(leaves.size()):
        source = _file_source(leaves.apply(number))
        if source is None:
            return None
        digest.update(source.encode())
    return digest.hexdigest()


def _file_source(leaf: Any) -> str | None:
    """What a plan's leaf reads, as text: its format, options, schemas and files with their
    lengths and modification times, as Spark listed them; ``None`` if it reads anything but files."""
    if leaf.getClass().getName() != _LOGICAL_RELATION:
        return None
    relation = leaf.relation()
    if relation.getClass().getName() != _FILE_RELATION:
        return None
    statuses = relation.location().allFiles()
    files = []
    for number in range(statuses.size()):
        status = statuses.apply(number)
        files.append(f"{status.getPath().toString()}\t{status.getLen()}\t{status.getModificationTime()}\n")
    return "".join([
        f"{relation.fileFormat().getClass().getName()}\n{relation.options().toString()}\n",
        f"{relation.dataSchema().json()}\n{relation.partitionSchema().json()}\n", *sorted(files),
    ])
