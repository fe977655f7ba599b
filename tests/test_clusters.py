"""``segack replay`` in Spark's real modes: separate executor JVMs, a standalone cluster, Spark Connect.

Each test starts what it needs from the installed ``pyspark`` (a ``local-cluster``
master, a standalone master and worker on loopback, a Spark Connect server) and
stops it at the end, also when the test fails. The handler lives in a module
that exists only in the test's working directory: ``segack replay`` must ship it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode
from segack.demo import generate_events
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests import expected, jvm
from tests.ports import free_port, free_ports

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                       reason="needs a JDK"),
]

EVENTS = 20_000
# Executors take their environment from the cluster, not from the driver: the log's path is in the source.
HANDLERS = '''
import json, os, sys

LOG = LOG_PATH

def record(event):
    with open(LOG, "a") as log:
        log.write(json.dumps([event["user"], event["seq"], os.getpid(), sys.executable]) + "\\n")

def refuse(event):
    if event["seq"] == 3:
        raise LookupError(f"part 3 of {event['user']} is missing")
'''


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _wait_for_port(port: int, process: subprocess.Popen[bytes] | None, log: Path, seconds: float = 120,
                   ) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited early:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    told = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"nothing listens on port {port}:\n{told}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _environment() -> dict[str, str]:
    # The cluster's own JVMs (master, worker) start with the drivers' quick options (tests/jvm.py).
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                SPARK_HOME=_spark_home(), SPARK_DAEMON_JAVA_OPTS=" ".join(jvm.QUICK))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory holding the events and the handler module, and nothing else of ours."""
    handlers = HANDLERS.replace("LOG_PATH", repr(str(tmp_path / "log.jsonl")))
    (tmp_path / "cluster_handlers.py").write_text(handlers)
    pq.write_table(generate_events(EVENTS, seed=31), tmp_path / "events.parquet")
    return tmp_path


def _replay(workdir: Path, handler: str, checkpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "segack", "replay", "events.parquet", "--key", "user", "--order", "ts",
               "--handler", f"cluster_handlers:{handler}", "--checkpoint", checkpoint, *extra]
    if "--remote" not in extra:  # the executors' JVMs start quick too (tests/jvm.py)
        command += ["--conf", f"spark.executor.extraJavaOptions={' '.join(jvm.QUICK)}"]
    # Run from the working directory with nothing of the repository on the path.
    environment = _environment()
    environment.pop("PYTHONPATH", None)
    return subprocess.run(command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=900)


def _assert_complete(workdir: Path, checkpoint: Path | str) -> None:
    table = pq.read_table(workdir / "events.parquet")
    state = CheckpointStore(str(checkpoint)).load()
    assert state.tokens.complete and state.settings["status"] == "complete"
    assert expected.done_events(table, state.tokens) == set(expected.positions(table))
    logged = (workdir / "log.jsonl").read_text().splitlines()
    assert len(logged) == EVENTS


def test_local_cluster_with_a_relative_checkpoint_records_everything(workdir):
    """``local-cluster`` runs executors in separate JVMs, with their own working directories: a relative
    checkpoint path must mean the driver's directory there too."""
    done = _replay(workdir, "record", "ck", "--master", "local-cluster[2,1,1024]", "--segments", "3",
                   "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert "20,000 events handled" in done.stdout
    # The command stops its session in order: no errors from the cluster racing its exit.
    assert " ERROR " not in done.stderr, done.stderr[-3000:]
    _assert_complete(workdir, workdir / "ck")
    pids = {json.loads(line)[2] for line in (workdir / "log.jsonl").read_text().splitlines()}
    assert len(pids) >= 2, "the events were not handled in separate executors"


@pytest.mark.checkpoint
@pytest.mark.claims
def test_local_cluster_with_a_checkpoint_on_s3_records_everything_and_says_its_claims_are_atomic(workdir, s3):
    """Executors in separate JVMs write their progress to an S3 API server (moto's, on loopback),
    reached from the environment they inherit (``AWS_ENDPOINT_URL``, credentials)."""
    checkpoint = f"{s3}/ck"
    done = _replay(workdir, "record", checkpoint, "--master", "local-cluster[2,1,1024]", "--segments", "3")
    assert done.returncode == 0, done.stderr
    assert "20,000 events handled" in done.stdout
    _assert_complete(workdir, checkpoint)
    status = subprocess.run([sys.executable, "-m", "segack", "status", checkpoint], env=_environment(),
                            capture_output=True, text=True, timeout=120)
    assert "claim           free: run " in status.stdout and "exclusively" not in status.stdout, status


@contextlib.contextmanager
def running_standalone(logs: Path, environment: dict[str, str], workers: int = 1,
                       ) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A standalone master and ``workers`` workers of 2 cores on loopback, from the installed pyspark,
    their JVMs and Python workers with ``environment``: the master's address and the workers'
    processes (each the leader of its process group, with its executors) while the block runs."""
    environment = dict(environment, SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    port, master_ui, *worker_uis = free_ports(2 + workers)
    spark_class = os.path.join(_spark_home(), "bin", "spark-class")
    started: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs / "master.log", "wb") as master_log:
            started.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(master_ui)],
                env=environment, stdout=master_log, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_port(port, started[0], logs / "master.log")
        for number, worker_ui in enumerate(worker_uis):
            with open(logs / f"worker-{number}.log", "wb") as worker_log:
                started.append(subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                     "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui),
                     "--work-dir", str(logs / f"work-{number}")],
                    env=environment, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 120
        while (logs / "master.log").read_bytes().count(b"Registering worker") < workers:
            assert time.monotonic() < deadline, (logs / "worker-0.log").read_text()[-3000:]
            for number, worker in enumerate(started[1:]):
                assert worker.poll() is None, (logs / f"worker-{number}.log").read_text()[-3000:]
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}", started[1:]
    finally:
        for process in reversed(started):
            _stop(process)


@pytest.fixture
def standalone_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and one worker (:func:`running_standalone`), stopped at the end."""
    with running_standalone(tmp_path_factory.mktemp("standalone"), _environment()) as (master, _):
        yield master


def test_standalone_cluster_ships_the_handler_and_refuses_a_local_checkpoint(workdir, standalone_master):
    refused = _replay(workdir, "record", "ck", "--master", standalone_master)
    assert refused.returncode == ExitCode.REFUSED
    assert "is a local path, but executors of master spark://" in refused.stderr
    assert "--shared-local-checkpoint" in refused.stderr
    assert not (workdir / "ck").exists() and not (workdir / "log.jsonl").exists()

    done = _replay(workdir, "record", "ck", "--master", standalone_master, "--shared-local-checkpoint",
                   "--segments", "4")
    assert done.returncode == 0, done.stderr
    _assert_complete(workdir, workdir / "ck")

    failed = _replay(workdir, "refuse", "ck-refuse", "--master", standalone_master,
                     "--shared-local-checkpoint", "--segments", "2")
    assert failed.returncode == ExitCode.HANDLER_FAILED
    reason = [line for line in failed.stderr.splitlines() if line.startswith("segack replay:")]
    assert len(reason) == 1
    assert "LookupError: part 3 of user-" in reason[0] and "is missing" in reason[0]


def _python_environment(directory: Path, *packages: str) -> Path:
    """A virtualenv of the base interpreter (same Python version as the driver) with ``packages``
    installed from their wheels; its ``bin/python``."""
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True, capture_output=True)
    if packages:
        subprocess.run([str(directory / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
                       check=True, capture_output=True, text=True, timeout=600)
    return directory / "bin" / "python"


def _install_this_segack(python: Path, scratch: Path) -> None:
    """Install the segack these tests import, and its dependencies, for ``python``: the installed
    distribution's files as they are (as ``nox -s tests`` installs it: no second compile), or,
    from an editable install, a wheel built from the checkout."""
    from importlib.metadata import distribution

    installed = distribution("segack")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True,
                                        text=True).stdout.strip())
    editable = json.loads(installed.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable")
    if editable or not installed.files:
        checkout = str(Path(__file__).resolve().parents[1])
        wheels = str(scratch / "wheels")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, checkout],
                       check=True, capture_output=True, timeout=900)
        [wheel] = (scratch / "wheels").glob("segack-*.whl")
        packages = [str(wheel)]
    else:
        for file in installed.files:
            if not str(file).startswith(".."):  # the console script, outside site-packages
                (site_packages / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(installed.locate_file(file), site_packages / file)
        packages = [requirement for requirement in installed.requires or () if "extra ==" not in requirement]
    subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True, capture_output=True,
                   timeout=600)


def test_executors_without_segack_are_refused_at_once_then_run_from_a_packed_environment(
        workdir, standalone_master, tmp_path_factory):
    """The worker's Python has no segack: the run is refused before it claims anything, in one line
    that says what to pass; then the documented command line ships a venv-pack'ed environment
    through ``spark.archives`` and the same replay completes."""
    here = tmp_path_factory.mktemp("environments")
    bare = _python_environment(here / "bare")
    cluster = ["--master", standalone_master, "--shared-local-checkpoint"]
    refused = _replay(workdir, "record", "ck", *cluster, "--conf", f"spark.pyspark.python={bare}")
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
    assert line.startswith("segack replay: the executors' Python cannot import segack (ModuleNotFoundError: "
                           f"No module named 'segack'; {bare}, Python "), line
    assert line.endswith("pass --conf spark.archives=segack-env.tar.gz#environment "
                         "--conf spark.pyspark.python=./environment/bin/python"), line
    assert "Traceback" not in refused.stderr
    assert not (workdir / "ck").exists() and not (workdir / "log.jsonl").exists()

    unstartable = _replay(workdir, "record", "ck", *cluster, "--conf", "spark.pyspark.python=/nowhere/python")
    assert unstartable.returncode == 4, unstartable.stderr
    [line] = [line for line in unstartable.stderr.splitlines() if line.startswith("segack")]
    assert line.startswith("segack replay: the executors could not run a Python task with its Python "
                           "(/nowhere/python): "), line
    assert "/nowhere/python" in line.partition("): ")[2] and "spark.archives=" in line, line
    assert not (workdir / "ck").exists()

    # The docs' recipe: a virtualenv with segack installed, packed by venv-pack.
    _install_this_segack(_python_environment(here / "env"), here)
    archive = workdir / "segack-env.tar.gz"
    subprocess.run([shutil.which("venv-pack") or "venv-pack", "-p", str(here / "env"), "-o", str(archive),
                    "--compress-level", "1", "-q"], check=True, capture_output=True, timeout=600)
    done = _replay(workdir, "record", "ck", *cluster, "--segments", "3",
                   "--conf", "spark.archives=segack-env.tar.gz#environment",
                   "--conf", "spark.pyspark.python=./environment/bin/python")
    assert done.returncode == 0, done.stderr
    _assert_complete(workdir, workdir / "ck")
    # Each event was handled by the environment's Python, unpacked in the executor's directory.
    pythons = {json.loads(line)[3] for line in (workdir / "log.jsonl").read_text().splitlines()}
    assert {os.path.relpath(python, os.path.dirname(os.path.dirname(os.path.dirname(python))))
            for python in pythons} == {"environment/bin/python"}, pythons


_CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


@contextlib.contextmanager
def running_connect_server(logs: Path, environment: dict[str, str], *conf: str) -> Iterator[str]:
    """A Spark Connect server on ``local[2]`` with ``environment`` (its Python workers' too) and the
    ``--conf`` pairs ``conf``, its address while the block runs: pyspark's ``sbin/spark-daemon.sh``
    submits its class, as ``start-connect-server.sh`` does (which PySpark 4.1's package lacks)."""
    environment = dict(environment, SPARK_LOG_DIR=str(logs), SPARK_PID_DIR=str(logs),
                       SPARK_IDENT_STRING="segack-test", SPARK_CONNECT_MODE="0")
    port = free_port()
    daemon = [os.path.join(_spark_home(), "sbin", "spark-daemon.sh")]
    subprocess.run([*daemon, "submit", _CONNECT_SERVER, "1", "--name", "Spark Connect server",
                    "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
                    "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=3", *conf],
                   env=environment, check=True, capture_output=True, timeout=120)
    try:
        log = next(iter(logs.glob("*.out")), logs / "missing.out")
        _wait_for_port(port, None, log)
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run([*daemon, "stop", _CONNECT_SERVER, "1"], env=environment, capture_output=True,
                       timeout=120)
        for pid_file in logs.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


@pytest.fixture
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server (:func:`running_connect_server`), stopped at the end."""
    with running_connect_server(tmp_path_factory.mktemp("connect"), _environment()) as remote:
        yield remote


@pytest.mark.versions
def test_spark_connect_replays_through_remote(workdir, connect_server):
    done = _replay(workdir, "record", "ck", "--remote", connect_server)
    assert done.returncode == 0, done.stderr
    # No --segments: the count comes from the server's spark.sql.shuffle.partitions.
    assert "over 3 segments" in done.stdout
    _assert_complete(workdir, workdir / "ck")

    failed = _replay(workdir, "refuse", "ck-refuse", "--remote", connect_server)
    assert failed.returncode == ExitCode.HANDLER_FAILED
    assert "LookupError: part 3 of user-" in failed.stderr
    # A real-time stream's tasks: as many as the server's slots (its local[2]), which a Connect
    # client cannot read from the server's settings.
    slots = ("import sys; from pyspark.sql import SparkSession; "
             "from segack.spark_adapter.coordinator.realtime_jobs import slots; "
             "print(slots(SparkSession.builder.remote(sys.argv[1]).getOrCreate()))")
    probe = subprocess.run([sys.executable, "-c", slots, connect_server], env=_environment(),
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and probe.stdout.split()[-1] == "2", probe.stderr


@pytest.mark.kafka
@pytest.mark.streams
@pytest.mark.sinks
def test_kafka_streams_over_spark_connect_apply_each_record_once_and_commit_the_group(
        tmp_path, tmp_path_factory, kafka_broker, pg_database):
    """``segack stream --remote``: the micro-batches run in the Connect server's Python process (its
    ``foreachBatch`` function self-contained), each record once through a ``SqlSink``, the group
    committed through librdkafka, the run's counts told to the client; a second run over a topic
    with nothing new resumes and handles nothing again. Then a real-time stream over the same server
    reads the topic, each record once, and its group follows."""
    from tests import maven
    from tests.spark_handlers import read_log
    from tests.test_kafka import (
        ROOT,
        SCHEMA,
        _commit_group,
        _wait_for,
        account_events,
        assert_each_record_applied_once_in_order,
        committed_offsets,
        end_offsets,
        environment,
        make_topic,
        produce,
    )

    bootstrap, topic, group = kafka_broker.bootstrap, "accounts-over-connect", "segack-over-connect"
    make_topic(bootstrap, topic, 2)
    # Records the group is past already: a new query starts from its committed offsets, as on a master.
    produce(bootstrap, topic, [(f"old-{n}", json.dumps({"user": f"old-{n}", "seq": 0, "amount": 1}).encode())
                               for n in range(60)])
    _commit_group(bootstrap, topic, group, end_offsets(bootstrap, topic))
    records = account_events(900, 20, seed=11)
    produce(bootstrap, topic, records)
    # The handler runs in the server's Python workers: they find it, and its database, as the client does.
    server = {**_environment(), **environment(tmp_path, "0", pg_database, bootstrap, topic)}
    server["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), server.get("PYTHONPATH")]))
    log = str(tmp_path / "log.jsonl")
    def command(checkpoint: str, handler: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "segack", "stream", "--remote", remote, "--format", "kafka",
                "--option", f"kafka.bootstrap.servers={bootstrap}", "--option", f"subscribe={topic}",
                "--value-schema", SCHEMA, "--key", "key", "--order", "offset", "--handler", handler,
                "--checkpoint", str(tmp_path / checkpoint), *extra]

    micro_batches = ("--option", "maxOffsetsPerTrigger=300", "--commit-offsets-to", group)
    jars = "spark.jars=" + ",".join(map(str, maven.spark_kafka()))
    with running_connect_server(tmp_path_factory.mktemp("connect"), server, "--conf", jars) as remote:
        first = subprocess.run(command("checkpoint", "tests.spark_handlers:ledger_sink", *micro_batches),
                               cwd=ROOT, env=server, capture_output=True, text=True, timeout=600)
        assert first.returncode == ExitCode.OK, first.stderr
        again = subprocess.run(command("checkpoint", "tests.spark_handlers:ledger_sink", *micro_batches),
                               cwd=ROOT, env=server, capture_output=True, text=True, timeout=600)
        # Real time over the same server: its tasks, as many as the server's slots, read the topic.
        process = subprocess.Popen(
            command("real-time", "tests.spark_handlers:record_kafka", "--trigger", "real-time",
                    "--commit-offsets-to", f"{group}-real-time"),
            cwd=ROOT, env=server, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: len(read_log(log)) >= len(records) + 60, 240, "the records in real time",
                      process)
            _wait_for(lambda: committed_offsets(bootstrap, topic, f"{group}-real-time")
                      == end_offsets(bootstrap, topic), 60, "the real-time group at the end", process)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
    assert process.returncode == ExitCode.OK, err[-3000:]
    assert f"stopped as asked: {len(records) + 60:,} events handled" in out, out  # a group of its own: all
    handled = read_log(log)
    assert len({(event["partition"], event["offset"]) for event in handled}) == len(handled)
    assert len(handled) == len(records) + 60
    # Each micro-batch told, though the client looks once a second.
    started = CheckpointStore(str(tmp_path / "checkpoint")).load().settings["stream"]["start"]["where"]
    assert started == f"a new query, from consumer group {group}'s committed offsets"
    told = [int(line.split()[4]) for line in first.stdout.splitlines()
            if line.startswith("segack stream: batch")]
    assert len(told) >= 3 and sum(told) == 900, first.stdout
    assert f"{len(told)} micro-batches, 900 events handled" in first.stdout, first.stdout
    assert_each_record_applied_once_in_order(pg_database, records)
    assert committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic)
    assert again.returncode == ExitCode.OK, again.stderr
    assert "0 events handled" in again.stdout, again.stdout
    assert_each_record_applied_once_in_order(pg_database, records)



@pytest.mark.kafka
@pytest.mark.faults
@pytest.mark.streams
def test_a_stop_past_its_timeout_over_spark_connect_ends_the_micro_batch_and_the_next_run_finishes_it(
        tmp_path, tmp_path_factory, kafka_broker):
    """Over Spark Connect the micro-batch runs in the server's Python: SIGTERM to the client, and
    --stop-timeout 2 later the server's tasks, told through the checkpoint, finish their calls in
    flight, save and end; the client exits 0 counting what was handled, and the next run handles
    the rest, none twice."""
    from tests import maven
    from tests.spark_handlers import read_log
    from tests.test_kafka import (
        ROOT,
        SCHEMA,
        _wait_for,
        account_events,
        assert_each_key_in_offset_order,
        environment,
        make_topic,
        produce,
    )

    bootstrap, topic = kafka_broker.bootstrap, "accounts-stop-over-connect"
    make_topic(bootstrap, topic, 2)
    records = account_events(3000, users=60, seed=13)
    produce(bootstrap, topic, records)
    server = {**_environment(), **environment(tmp_path, "0", None, bootstrap, topic)}
    server["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), server.get("PYTHONPATH")]))
    log = str(tmp_path / "log.jsonl")
    jars = "spark.jars=" + ",".join(map(str, maven.spark_kafka()))
    with running_connect_server(tmp_path_factory.mktemp("connect"), server, "--conf", jars) as remote:
        def command(handler: str, *extra: str) -> list[str]:
            return [sys.executable, "-m", "segack", "stream", "--remote", remote, "--format", "kafka",
                    "--option", f"kafka.bootstrap.servers={bootstrap}", "--option", f"subscribe={topic}",
                    "--value-schema", SCHEMA, "--key", "key", "--order", "offset", "--handler", handler,
                    "--checkpoint", str(tmp_path / "checkpoint"), "--segments", "2", *extra]

        process = subprocess.Popen(
            command("tests.spark_handlers:record_kafka_in_flight", "--stop-timeout", "2"), cwd=ROOT,
            env=server, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: len(read_log(log)) > 200, 300, "the micro-batch under way", process)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
        stopped_at = len(read_log(log))
        finished = subprocess.run(command("tests.spark_handlers:record_kafka"), cwd=ROOT,
                                  env={**server, "SEGACK_TEST_RUN": "1"}, capture_output=True, text=True,
                                  timeout=600)
    assert process.returncode == ExitCode.OK, err[-3000:]
    assert stopped_at < len(records) - 1000, "the micro-batch was nearly done: the stop proves nothing"
    assert "segack stream: micro-batch 0 still ran 2 s after the stop (--stop-timeout)" in out, out
    assert f"0 micro-batches, {stopped_at:,} events handled" in out, out
    assert finished.returncode == ExitCode.OK, finished.stderr[-3000:]
    handled = read_log(log)
    assert len(handled) == len(records), len(handled)  # nothing repeated, nothing lost
    assert_each_key_in_offset_order(handled, records)
