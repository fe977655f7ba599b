"""Shared fixtures: every test that takes ``impl`` runs against the kernel and the spec."""

from __future__ import annotations

import os
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import segack.kernel
import segack.specs
from tests.durations_check import recorded_seconds, report_name
from tests.jvm import driver_options

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

IMPLEMENTATIONS = {"kernel": segack.kernel, "spec": segack.specs}
#: ``SPARK_SUBMIT_OPTS`` as the test run found it.
_USERS_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS")
#: What this process's Spark session needs for the connectors' tests the run selected.
_CONNECTORS: dict[str, str] = {}



#: The area each test module is about, as markers (``pytest.ini_options`` in pyproject.toml says what
#: each means): ``nox -s tests -- -m claims`` runs what touches one. A test elsewhere that is about an
#: area too says so with its own marker (``@pytest.mark.claims``).
AREAS = {
    "test_acker.py": ("kernel", "smoke"),
    "test_acker_machine.py": ("kernel",),
    "test_api.py": ("kernel", "smoke"),
    "test_batches.py": ("handlers",),
    "test_boundaries.py": ("kernel",),
    "test_c_api.py": ("kernel", "smoke"),
    "test_checkpoint_store.py": ("checkpoint",),
    "test_crash_points.py": ("checkpoint",),
    "test_claims.py": ("claims",),
    "test_clusters.py": ("clusters",),
    "test_cluster_streams.py": ("clusters", "streams"),
    "test_command_refusals.py": ("command",),
    "test_commits.py": ("kernel",),
    "test_conformance_and_cli.py": ("kernel", "smoke"),
    "test_connect_batches.py": ("streams",),
    "test_delta.py": ("streams",),
    "test_dispatch_machine.py": ("handlers",),
    "test_kafka_records.py": ("streams",),
    "test_kafka_settings.py": ("streams",),
    "test_kafka_secured.py": ("streams", "sinks"),
    "test_partition_task.py": ("handlers", "streams"),
    "test_plain_avro.py": ("streams",),
    "test_doc_examples.py": ("command",),
    "test_durations_check.py": (),
    "test_driver_watch.py": ("claims",),
    "test_errors.py": ("command",),
    "test_exactly_once.py": ("sinks",),
    "test_faults.py": ("streams",),
    "test_executors.py": ("clusters",),
    "test_fingerprint.py": ("checkpoint",),
    "test_footers.py": ("checkpoint",),
    "test_handler_refusals.py": ("handlers",),
    "test_hashes.py": ("kernel",),
    "test_hashes_jvm.py": ("kernel",),
    "test_kafka.py": ("streams",),
    "test_schema_registry.py": ("streams",),
    "test_schema_registry_faults.py": ("streams",),
    "test_registry_values.py": ("sinks",),
    "test_kafka_sink.py": ("sinks",),
    "test_realtime.py": ("streams",),
    "test_realtime_topics.py": ("streams",),
    "test_realtime_simulation.py": ("streams", "simulation"),
    "test_kafka_sink_simulation.py": ("sinks", "simulation"),
    "test_kafka_model.py": ("streams",),
    "test_layout.py": (),
    "test_logging.py": ("command",),
    "test_metrics.py": ("console",),
    "test_mutation_check.py": (),
    "test_object_store.py": ("checkpoint",),
    "test_options.py": ("command",),
    "test_partitioner_and_policies.py": ("kernel",),
    "test_planner.py": ("kernel",),
    "test_refusals_alike.py": ("kernel",),
    "test_readme.py": ("sinks",),
    "test_replay_cli.py": ("command",),
    "test_rescale.py": ("rescale",),
    "test_rows.py": ("handlers",),
    "test_rescale_spark.py": ("rescale",),
    "test_segment_machine.py": ("kernel",),
    "test_segments.py": ("kernel",),
    "test_sequencing.py": ("handlers",),
    "test_sinks.py": ("sinks",),
    "test_spark_adapter.py": ("replay",),
    "test_storage_faults.py": ("checkpoint",),
    "test_stream_faults.py": ("streams",),
    "test_tokens.py": ("checkpoint",),
    "test_ui.py": ("console",),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long-tests-early", action="store_true",
                     help="start the tests with a recorded budget (tests/durations-budget.json) in the "
                     "first half of the run, longest first, spread among the others: pytest-xdist's "
                     "workers then end together rather than one of them alone on a long test at the end")


def long_tests_early(items: list[pytest.Item], recorded: dict[str, float]) -> list[pytest.Item]:
    """``items`` with those that have a recorded time placed, longest first, at even steps over the
    first half of the run, the others in their order around them. Spread, not all first: xdist
    hands each worker a long run of consecutive tests at the start, and one worker with every long
    test would end last."""
    timed = sorted((item for item in items if report_name(item.nodeid) in recorded),
                   key=lambda item: -recorded[report_name(item.nodeid)])
    step = len(items) / 2 / max(len(timed), 1)
    # (where it starts, whether it is one of the others): a timed test goes before an other at its place
    place = {id(item): (rank * step, False) for rank, item in enumerate(timed)}
    others = [item for item in items if id(item) not in place]
    place.update({id(item): (float(index), True) for index, item in enumerate(others)})
    return sorted(items, key=lambda item: place[id(item)])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After a run of the fault campaign (``tests/test_faults.py``): the crash points it covered (a
    case passes only where a process died at each of its points and the resume lost and repeated
    nothing; a failed case covers none of its points)."""
    from segack.spark_adapter.store.crash_points import POINTS

    def points(outcome: str) -> set[str]:
        reports = terminalreporter.stats.get(outcome, [])
        return {point for report in reports
                if "test_faults.py::test_a_stream_killed_at_crash_points" in getattr(report, "nodeid", "")
                and report.when == "call"
                for point in report.nodeid.rsplit("[", 1)[-1].rstrip("]").split("+")}

    covered, failed = points("passed"), points("failed")
    if not covered and not failed:
        return
    if len(covered | failed) < len(POINTS):  # -k, or the sample nox -s connectors runs
        terminalreporter.write_line(f"crash points covered: {len(covered)} of the {len(covered | failed)} "
                                    f"run (of {len(POINTS)}: nox -s faults runs them all)")
        return
    missing = [point for point in POINTS if point not in covered]
    terminalreporter.write_line(f"crash points covered: {len(covered)} / {len(POINTS)}"
                                + (f"; not covered: {', '.join(missing)}" if missing else ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its module's areas (:data:`AREAS`; a new module must be listed there), and
    every test that needs a Spark session (directly or through ``jvm``) as ``spark``, so
    ``pytest -m "not spark"`` (``nox -s quick``) runs the rest without a JVM. With
    ``--long-tests-early``: :func:`long_tests_early`."""
    if config.getoption("--long-tests-early"):
        items[:] = long_tests_early(items, recorded_seconds())
    for item in items:
        module = item.path.name
        if module not in AREAS:
            raise pytest.UsageError(f"tests/conftest.py: {module} is in no area; add it to AREAS")
        for area in AREAS[module]:
            item.add_marker(area)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before any test starts Spark, give every Spark driver the tests start (this process's, and
    each ``segack`` command's, which inherits ``SPARK_SUBMIT_OPTS``) the options that make it start
    with less CPU (tests/jvm.py)."""
    if any(item.get_closest_marker("spark") for item in session.items):
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [_USERS_SUBMIT_OPTS, driver_options()]))
    kafka = any(item.get_closest_marker("kafka") for item in session.items)
    delta = any(item.get_closest_marker("delta") for item in session.items)
    if kafka or delta:
        from tests import maven

        _CONNECTORS.update(maven.connector_conf(kafka, delta))


@pytest.fixture(params=sorted(IMPLEMENTATIONS), ids=lambda name: name)
def impl(request: pytest.FixtureRequest) -> types.ModuleType:
    """The implementation under test: the compiled kernel or the pure-Python spec."""
    return IMPLEMENTATIONS[request.param]


@pytest.fixture(scope="session")
def spark():
    """A real local Spark session (needs a JDK); shared by the whole test run."""
    from segack.spark_adapter.spark.session import local_session

    # The Python workers import the tests' handlers (tests/spark_handlers.py) by name.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    # This session lives as long as the run: the optimizing compiler pays off (tests/jvm.py).
    for_commands = os.environ.get("SPARK_SUBMIT_OPTS")
    own = driver_options(quick=False)
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [_USERS_SUBMIT_OPTS, own]))
    try:
        session = local_session("segack-tests", **_CONNECTORS)
    finally:
        if for_commands is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = for_commands
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL server's connection string (``tests/postgres.py``); never skipped."""
    from tests.postgres import postgres_server

    # Under a directory the postgres user can enter, whoever runs the tests.
    base = tmp_path_factory.mktemp("postgres")
    os.chmod(base, 0o755)
    for parent in base.parents:
        if str(parent).startswith(tempfile.gettempdir()) and parent != Path(tempfile.gettempdir()):
            os.chmod(parent, 0o755)
    with postgres_server(base / "server") as dsn:
        yield dsn


@pytest.fixture
def pg_database(postgres, request):
    """A fresh database on the test server, with the tests' ledger tables; its connection string."""
    import psycopg

    from tests.spark_handlers import POSTGRES_LEDGER

    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    dsn = postgres.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(dsn) as db:
        for statement in POSTGRES_LEDGER:
            db.execute(statement)
    return dsn


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Kafka broker (``tests/kafka.py``), for the whole test run; never skipped."""
    from tests.kafka import kafka_broker

    with kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def jvm(spark):
    """The session's JVM, through its Py4J gateway."""
    return spark.sparkContext._jvm


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 API server's endpoint (moto's standalone server, ``tests/s3.py``); never skipped."""
    from tests.s3 import s3_server

    with s3_server() as endpoint:
        yield endpoint


def _fresh_bucket(endpoint, monkeypatch, request):
    from tests.s3 import CREDENTIALS, make_bucket

    for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    bucket = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    make_bucket(endpoint, bucket)
    return f"s3://{bucket}"


@pytest.fixture
def s3(s3_endpoint, monkeypatch, request):
    """A fresh bucket on the test server, and this process's environment pointing at the server
    the standard way (``AWS_ENDPOINT_URL`` and credentials); yields ``s3://BUCKET``."""
    return _fresh_bucket(s3_endpoint, monkeypatch, request)



@pytest.fixture
def quick_registry_retries(monkeypatch):
    """The registry client's pauses between its four asks cut to a tenth: for the tests that need a
    registry away, not the length of its wait (which one test keeps whole)."""
    from segack.spark_adapter.worker import schema_registry

    monkeypatch.setattr(schema_registry, "_RETRIES", tuple(pause / 10 for pause in schema_registry._RETRIES))


@pytest.fixture(scope="session")
def schema_registry(kafka_broker, tmp_path_factory):
    """A real Schema Registry (Karapace, ``tests/schema_registry.py``) over the tests' broker, for
    the whole run; skipped, in one line saying how to get one, only where neither the kit nor
    ``SEGACK_TEST_SCHEMA_REGISTRY`` is there."""
    from tests import schema_registry

    if not schema_registry.available():
        pytest.skip(schema_registry.HOW)
    with schema_registry.schema_registry(kafka_broker.bootstrap,
                                         tmp_path_factory.mktemp("registry") / "karapace.log") as url:
        yield url
