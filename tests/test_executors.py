"""The check that executors can run segack's tasks (``segack.spark_adapter.spark.executors``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from segack import __version__
from segack.spark_adapter import ExecutorEnvironmentError
from segack.spark_adapter.spark import executors


def test_the_probe_reaches_a_python_without_segack_and_says_what_it_lacks(tmp_path):
    """Pickled as a task's function is, the probe unpickles and runs where segack is missing, with
    only what a Spark worker has on its path (PySpark's own zips)."""
    import pyspark
    from pyspark import cloudpickle

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    worker_path = os.pathsep.join(os.path.join(lib, name) for name in sorted(os.listdir(lib)))
    pickled = cloudpickle.dumps(executors._probe())
    run = subprocess.run(
        [str(bare / "bin" / "python"), "-c",
         "import pickle, sys; sys.stdout.write(pickle.loads(sys.stdin.buffer.read())(0))"],
        input=pickled, capture_output=True, env={"PYTHONPATH": worker_path}, check=True)
    report = json.loads(run.stdout)
    assert report["error"] == "ModuleNotFoundError: No module named 'segack'"
    assert report["python"] == str(bare / "bin" / "python") and "segack" not in report
    here = json.loads(executors.executor_report(0))
    assert here["segack"] == __version__ and "error" not in here and here["python"] == sys.executable


@pytest.mark.spark
def test_executors_with_another_segack_are_refused_and_a_checked_application_is_not_asked_again(
        spark, monkeypatch):
    # The tests' local session runs its workers on this interpreter: nothing to ask.
    assert executors._runs_this_interpreter(spark)
    monkeypatch.setattr(executors, "_checked_applications", set())
    monkeypatch.setattr(executors, "_runs_this_interpreter", lambda spark: False)
    executors.check_executors(spark)  # a real job; the workers have this segack
    monkeypatch.setattr(executors, "__version__", "0.0.1")
    executors.check_executors(spark)  # this application's executors were checked already
    monkeypatch.setattr(executors, "_checked_applications", set())
    with pytest.raises(ExecutorEnvironmentError,
                       match=rf"^the executors' Python has segack {__version__}, this driver 0\.0\.1 \("
                             rf"{sys.executable}, Python .*: tasks and driver must run one version; ship"):
        executors.check_executors(spark)


TASKS_WITHOUT_SEGACK = '''
import sys
from pyspark.sql import SparkSession
from segack.spark_adapter import ReplayError, replay
from segack.spark_adapter.spark import executors

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
# Checked already, as when an executor joins the application after the check (dynamic allocation).
executors._checked_applications.add(executors._application(spark))
events = spark.createDataFrame([("a", 1), ("a", 2), ("b", 1)], "k string, o int")
try:
    replay(events, key="k", order="o", handler=print, checkpoint=sys.argv[1], segments=1)
except ReplayError as error:
    print(f"{type(error).__name__}: {error}")
'''


@pytest.mark.spark
def test_a_task_whose_python_lacks_segack_fails_the_run_saying_what_to_pass(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    run = subprocess.run([sys.executable, "-c", TASKS_WITHOUT_SEGACK, str(tmp_path / "ck")],
                         env={**os.environ, "PYSPARK_PYTHON": str(bare / "bin" / "python")},
                         capture_output=True, text=True, timeout=300)
    failures = [line for line in run.stdout.splitlines() if line.startswith("ReplayError")]
    expected = ("ReplayError: a Spark task failed: ModuleNotFoundError: No module named 'segack' "
                f"(an executor's Python cannot import segack): {executors.SHIP_SEGACK}")
    assert failures == [expected], run.stdout + run.stderr[-3000:]
