"""The JVM options of every Spark driver the tests start: this process's session and each ``segack``
command they run (through ``SPARK_SUBMIT_OPTS``, which they inherit).

A ``segack`` command's driver lives seconds, so most of its CPU goes to starting: loading Spark's
classes and compiling them. Three options cut that by about 60% (measured on 2 cores: 16.5
CPU-seconds for a 2,000-event ``segack replay``, 6.8 with them), with the same JVM and Spark:

- the quick compiler only (``-XX:TieredStopAtLevel=1``) and the serial collector
  (:data:`QUICK`); not for this process's own session, which lives as long as the test run and
  whose long tests the optimizing compiler speeds up (one took 47 s without it, 26 s with);
- a class-data-sharing archive of the classes a run loads (``-XX:SharedArchiveFile``), dumped once
  per Spark installation by a small run and kept in the user's cache. A JVM whose classpath or
  version does not match it starts without it, silently (``-Xlog:disable``), as it would have.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The compiler and collector options.
QUICK = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: The JVM's own log lines (a mismatched archive's warning among them) would mix with the output
#: the tests read.
SILENT = ("-Xlog:disable", "-Xlog:all=off")

# A run that loads what a replay does: a session, Arrow, a shuffle, a sort, a Python task.
_LOADER = """
import sys, tempfile
from segack.spark_adapter import local_session, replay
spark = local_session("segack-class-archive")
events = spark.createDataFrame([(f"k{i % 7}", i) for i in range(300)], "user string, ts long")
with tempfile.TemporaryDirectory() as checkpoint:
    replay(events, key="user", order="ts", handler=lambda event: None, checkpoint=checkpoint, segments=2)
spark.stop()
"""


def _archive() -> tuple[Path, str]:
    """Where this Spark installation's archive goes (one per installation's path), and what it must
    have been dumped from: the JVM refuses an archive whose jars changed since (a venv made again in
    the same place), and then starts without even the JDK's own archive."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    where = hashlib.sha256(f"{jars.resolve()} {sys.version}".encode()).hexdigest()[:16]
    found = sorted((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns) for entry in os.scandir(jars))
    key = hashlib.sha256(repr([pyspark.__version__, found]).encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "segack-tests"
    return cache / f"spark-classes-{where}.jsa", key


def _dump(archive: Path, key: str) -> None:
    with tempfile.TemporaryDirectory(dir=archive.parent) as scratch:
        partial = Path(scratch) / archive.name
        options = " ".join([*QUICK, *SILENT, f"-XX:ArchiveClassesAtExit={partial}"])
        environment = dict(os.environ, SPARK_SUBMIT_OPTS=options)
        done = subprocess.run([sys.executable, "-c", _LOADER], env=environment, capture_output=True,
                              text=True, timeout=600)
        if done.returncode == 0 and partial.is_file():
            partial.replace(archive)
            archive.with_suffix(".key").write_text(key)
        else:
            print(f"tests/jvm.py: no class archive, the drivers start without one: {done.stderr[-2000:]}",
                  file=sys.stderr)


def driver_options(quick: bool = True) -> str:
    """The options (without :data:`QUICK` unless ``quick``), the archive dumped first if this
    Spark installation has none of its present jars."""
    archive, key = _archive()
    stamp = archive.with_suffix(".key")
    archive.parent.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers start together: one dumps, the others wait and use its archive.
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (archive.is_file() and stamp.is_file() and stamp.read_text() == key):
            _dump(archive, key)
    if not archive.is_file():
        return " ".join(QUICK if quick else ())
    return " ".join([*(QUICK if quick else ()), *SILENT, f"-XX:SharedArchiveFile={archive}"])
