"""Whether a session's executors can run segack's tasks: their Python must import this segack.

A replay's task function reaches an executor pickled, and unpickling it imports segack there; an
executor whose Python lacks segack would fail every task with a worker's traceback. So before a
run claims its checkpoint, one small job asks the executors' Python what it has, through a
function that arrives pickled by value (it needs nothing of segack to be unpickled), and a
missing or other segack is refused in one line that says what to pass.

The job is skipped when the executors are known to run this very interpreter (a local master
whose Python workers are ``sys.executable``), and runs once per application.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import types
from typing import TYPE_CHECKING, Any

from segack._version import __version__
from segack.spark_adapter.errors import ExecutorEnvironmentError, worker_error
from segack.spark_adapter.spark.session import (
    default_segment_count,
    executors_share_local_disk,
    is_connect,
    setting,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["SHIP_SEGACK", "check_executors", "executor_report", "task_failure"]

#: How to give executors a Python with segack: PySpark's packed-environment route.
SHIP_SEGACK = (
    "ship them an environment that has it: pack a virtualenv where segack is installed "
    "(venv-pack -o segack-env.tar.gz) and pass --conf spark.archives=segack-env.tar.gz#environment "
    "--conf spark.pyspark.python=./environment/bin/python"
)
#: At most this many probe tasks: enough to reach the executors of a usual cluster.
_MOST_PROBES = 64
_checked_applications: set[str] = set()


def executor_report(_: Any = None) -> str:
    """What this Python can run: its path, version and host, and segack's version or why it
    does not import; as JSON. Runs on the executors, where segack may be missing, so it refers
    to no global of this module."""
    import json
    import platform
    import sys

    report = {"python": sys.executable, "version": platform.python_version(), "host": platform.node()}
    try:
        import segack
        import segack.spark_adapter.worker.task  # numpy, pyarrow, the kernel: what a task needs

        report["segack"] = segack.__version__
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {error}"
    return json.dumps(report, sort_keys=True)


def _probe() -> types.FunctionType:
    """:func:`executor_report`, copied so that no module holds it: cloudpickle then pickles it by
    value, and unpickling it on an executor imports nothing of segack."""
    return types.FunctionType(executor_report.__code__, {"__builtins__": __builtins__},
                              executor_report.__name__, executor_report.__defaults__)


def _runs_this_interpreter(spark: SparkSession) -> bool:
    if is_connect(spark) or not executors_share_local_disk(spark):
        return False
    python = spark.sparkContext.pythonExec
    found = shutil.which(python) if os.sep not in python else python
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def _application(spark: SparkSession) -> str:
    return setting(spark, "spark.app.id", f"session-{id(spark)}")


def check_executors(spark: SparkSession) -> None:
    """Refuse a session whose executors' Python cannot import this version of segack.

    Parameters
    ----------
    spark : SparkSession
        A classic or Spark Connect session.

    Raises
    ------
    ExecutorEnvironmentError
        The executors' Python lacks segack (or one of its dependencies), has another version of
        it, or cannot be started; the message names the Python and says what to pass.
    """
    if _runs_this_interpreter(spark):
        return
    application = _application(spark)
    if application in _checked_applications:
        return
    reports = _ask_executors(spark)
    for report in reports:
        where = f"{report['python']}, Python {report['version']}, on {report['host']}"
        if "error" in report:
            raise ExecutorEnvironmentError(
                f"the executors' Python cannot import segack ({report['error']}; {where}): {SHIP_SEGACK}")
        if report["segack"] != __version__:
            raise ExecutorEnvironmentError(
                f"the executors' Python has segack {report['segack']}, this driver {__version__} ({where}): "
                f"tasks and driver must run one version; {SHIP_SEGACK}")
    log.debug("executors checked: %s", reports)
    _checked_applications.add(application)


def task_failure(error: BaseException) -> str:
    """A failed job's reason as :func:`~segack.spark_adapter.errors.worker_error` reads it, with
    what to pass when a task's Python could not import segack.

    :func:`check_executors` asks the executors present when a run starts; one added later (by
    dynamic allocation, say) can still lack segack, and its tasks then fail on the import.
    """
    reason = worker_error(error)
    if "No module named 'segack" in reason:
        return f"{reason} (an executor's Python cannot import segack): {SHIP_SEGACK}"
    return reason


def _ask_executors(spark: SparkSession) -> list[dict[str, str]]:
    from pyspark.sql.functions import udf

    # As many tasks as the executors have cores, where the session tells (Connect does not).
    cores = default_segment_count(spark) if is_connect(spark) else spark.sparkContext.defaultParallelism
    probes = max(1, min(_MOST_PROBES, cores))
    # A plain (pickled, not Arrow) UDF: the probe must not need pyarrow on the executors either.
    report = udf(_probe(), "string", useArrow=False)
    try:
        rows = spark.range(0, probes, 1, probes).select(report("id").alias("report")).collect()
    except Exception as error:
        python = "its Python" if is_connect(spark) else f"its Python ({spark.sparkContext.pythonExec})"
        raise ExecutorEnvironmentError(
            f"the executors could not run a Python task with {python}: {worker_error(error)}; if they "
            f"lack a Python with segack, {SHIP_SEGACK}") from error
    return [json.loads(text) for text in sorted({row["report"] for row in rows})]
