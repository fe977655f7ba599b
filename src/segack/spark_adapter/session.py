"""Starting an embedded local Spark session with settings fit for ordered processing."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str = "segack", master: str = "local[2]", **conf: Any) -> Any:
    """A ``SparkSession`` on an embedded local master.

    The UI is off, shuffles are small, the Python workers use this interpreter,
    and speculative execution is off: two attempts of one segment must never run
    at once. ``conf`` adds or overrides Spark settings.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.speculation", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
