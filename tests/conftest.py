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

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

IMPLEMENTATIONS = {"kernel": segack.kernel, "spec": segack.specs}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs a Spark session (directly or through ``jvm``) as ``spark``,
    so ``pytest -m "not spark"`` (``nox -s quick``) runs the rest without a JVM."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


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
    session = local_session("segack-tests")
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


@pytest.fixture(params=["local", "s3"])
def checkpoint_location(request, tmp_path):
    """A new checkpoint's location: a local directory, then a fresh bucket on the S3 test server."""
    if request.param == "local":
        return str(tmp_path / "checkpoint")
    return f"{request.getfixturevalue('s3')}/checkpoint"
