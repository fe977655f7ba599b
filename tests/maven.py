"""Java artifacts from Maven Central for the tests, resolved once with the machine's ``mvn`` into a
cache folder the test runs reuse (``~/.cache/segack-tests/maven``).

``python -m tests.maven`` resolves every set ahead of a run (``.ci/run`` does); a test that needs
a set it lacks resolves it then.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The Kafka broker the tests start (KRaft mode, one node).
KAFKA_VERSION = "4.4.0"
#: delta-spark's jars, built for Spark 4.2 (``nox -s connectors`` installs that PySpark).
DELTA_VERSION = "4.4.0"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>segack.tests</groupId><artifactId>jars</artifactId><version>0</version>
  <dependencies>{dependencies}</dependencies>
</project>
"""
_DEPENDENCY = "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>"


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "segack-tests" / "maven"


def resolve(*coordinates: str) -> list[Path]:
    """The jars of ``GROUP:ARTIFACT:VERSION`` coordinates and of what they need at run time."""
    folder = _cache() / hashlib.sha256(" ".join(coordinates).encode()).hexdigest()[:16]
    if not (folder / "complete").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
            dependencies = "".join(_DEPENDENCY.format(*coordinate.split(":")) for coordinate in coordinates)
            (Path(scratch) / "pom.xml").write_text(_POM.format(dependencies=dependencies))
            command = ["mvn", "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                       f"-DoutputDirectory={scratch}/jars"]
            done = subprocess.run(command, cwd=scratch, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"mvn could not resolve {', '.join(coordinates)}:\n{done.stdout[-3000:]}")
            (Path(scratch) / "jars" / "complete").touch()
            shutil.rmtree(folder, ignore_errors=True)
            (Path(scratch) / "jars").rename(folder)
    return sorted(folder.glob("*.jar"))


def kafka_broker() -> list[Path]:
    """The broker's classpath: ``org.apache.kafka:kafka_2.13``, Kafka's command-line tools
    (``kafka-tools``: the consumer group command) and their dependencies."""
    return resolve(f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
                   f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}")


def _beside_spark(jars: list[Path]) -> list[Path]:
    """``jars`` without those Spark has its own version of: a second copy of a library on the
    classpath (Hadoop's, Scala's) would fight the first."""
    import pyspark

    def artifact(name: str) -> str:
        return name.rsplit("-", 1)[0]

    own = {artifact(name) for name in os.listdir(Path(pyspark.__file__).parent / "jars")}
    return [jar for jar in jars if artifact(jar.name) not in own]


def spark_kafka() -> list[Path]:
    """Spark's Kafka connector of the installed Spark's version, for ``spark.jars``."""
    import pyspark

    return _beside_spark(resolve(f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"))


def delta() -> list[Path]:
    """delta-spark's jars, for ``spark.jars``."""
    return _beside_spark(resolve(f"io.delta:delta-spark_2.13:{DELTA_VERSION}"))


def connector_conf(kafka: bool = True, with_delta: bool = True) -> dict[str, str]:
    """A session's settings for Kafka and for Delta: the connectors' jars, and with Delta its SQL
    (``UPDATE``, ``MERGE``, tables in the session's catalog). Delta's only where asked: delta-spark is
    built for one Spark (:data:`DELTA_VERSION`), and its extension fails a session of another."""
    jars = [*(spark_kafka() if kafka else []), *(delta() if with_delta else [])]
    conf = {"spark.jars": ",".join(map(str, jars))} if jars else {}
    if with_delta:
        conf.update({"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                     "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
                     # The tests' tables are small: a snapshot of their log in 50 tasks costs more than
                     # it reads.
                     "spark.databricks.delta.snapshotPartitions": "2"})
    return conf


#: What ``python -m tests.maven [NAME...]`` resolves: every set, or those named.
SETS = {"broker": kafka_broker, "kafka": spark_kafka, "delta": delta}

if __name__ == "__main__":
    for name in sys.argv[1:] or SETS:
        if name not in SETS:
            sys.exit(f"tests.maven: no set {name!r} (of {', '.join(SETS)})")
        print(f"{name}: {len(SETS[name]())} jars", file=sys.stderr)
