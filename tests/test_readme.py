"""The README's examples, run as a user copies them: the exactly-once sink's tables and module
against the real PostgreSQL server the tests start, through ``segack replay``, and through the
README's own ``segack stream`` command against a real Kafka broker."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.spark


def _blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``."""
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)


def _bank(postgres: str, tmp_path: Path) -> dict[str, str]:
    """The README's tables in a fresh ``bank`` database and its handler module in ``tmp_path``; the
    environment a command finds both in: ``psycopg.connect("dbname=bank")``, as the README writes it,
    finds the server through libpq's environment, as a user's would."""
    import psycopg

    (tables,) = [block for block in _blocks("sql") if "CREATE TABLE balances" in block]
    (module,) = [block for block in _blocks("python") if "SqlSink(" in block]
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bank WITH (FORCE)")
        admin.execute("CREATE DATABASE bank")
    with psycopg.connect(postgres.replace("dbname=postgres", "dbname=bank"), autocommit=True) as bank:
        bank.execute(tables)
    (tmp_path / "my_handlers.py").write_text(module)
    server = dict(part.split("=", 1) for part in postgres.split())
    path = os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PGHOST=server["host"], PGPORT=server["port"], PGUSER=server["user"],
                PYTHONPATH=path)


def _ledger_and_balances(postgres: str) -> tuple[tuple[int, int], dict[str, int]]:
    import psycopg

    with psycopg.connect(postgres.replace("dbname=postgres", "dbname=bank")) as bank:
        ledger = bank.execute("SELECT count(*), sum(amount) FROM ledger").fetchone()
        balances = dict(bank.execute("SELECT account, balance FROM balances").fetchall())
    return ledger, balances


def _expected(accounts: list[str], amounts: list[int]) -> dict[str, int]:
    expected: dict[str, int] = {}
    for account, amount in zip(accounts, amounts, strict=True):
        expected[account] = expected.get(account, 0) + amount
    return expected


@pytest.mark.versions
def test_the_readme_sink_and_its_tables_apply_each_event_once_with_no_batch_size(postgres, tmp_path):
    import psycopg

    environment = _bank(postgres, tmp_path)
    accounts = [f"acct-{n % 37}" for n in range(3_000)]
    amounts = [(n * 7919) % 1000 - 300 for n in range(3_000)]
    pq.write_table(pa.table({"account": accounts, "amount": amounts, "event_time": list(range(3_000))}),
                   tmp_path / "events.parquet")
    done = subprocess.run([sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"),
                           "--key", "account", "--order", "event_time", "--handler", "my_handlers:sink",
                           "--checkpoint", str(tmp_path / "ckpt"), "--segments", "2"],
                          env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ledger, balances = _ledger_and_balances(postgres)
    with psycopg.connect(postgres.replace("dbname=postgres", "dbname=bank")) as bank:
        positions = bank.execute("SELECT table_name FROM information_schema.tables "
                                 "WHERE table_name LIKE 'segack_applied_%'").fetchall()
    assert ledger == (3_000, sum(amounts))
    assert balances == _expected(accounts, amounts)
    assert len(positions) == 1
    # The sink's preferred lists were used: the status shows calls of up to 5,000 events.
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    assert CheckpointStore(str(tmp_path / "ckpt")).load().settings["batch_size"] == 5000


@pytest.mark.kafka
@pytest.mark.streams
def test_the_readme_stream_command_applies_each_record_once_and_commits_the_group(postgres, tmp_path,
                                                                                   kafka_broker):
    """The README's ``pip install`` and ``segack stream`` lines as written, but for the broker's
    address, the checkpoint's folder and the connector's jars from the tests' cache (the README names
    them by Maven coordinates, which Spark would fetch)."""
    from segack.spark_adapter.sources.kafka import CONNECTORS_SPARK, connector_package
    from tests import maven
    from tests.test_kafka import committed_offsets, end_offsets, make_topic, produce

    [block] = [block for block in _blocks("sh") if "segack stream" in block]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    assert lines[0] == 'python3 -m pip install ".[kafka,postgres]"'
    [stream] = [shlex.split(line) for line in lines if line.startswith("segack stream")]
    [status] = [shlex.split(line) for line in lines if line.startswith("segack status")]
    words = " ".join(stream)
    address, checkpoint = "broker:9092", "/data/ckpt-accounts"
    written_topic = words.split("subscribe=", 1)[1].split()[0]
    # The broker is shared by the session's tests; the docs' examples create the same topic.
    topic = f"{written_topic}-readme"
    group = words.split("--commit-offsets-to ", 1)[1].split()[0]
    packages = words.split("spark.jars.packages=", 1)[1].split()[0]
    assert packages == connector_package(CONNECTORS_SPARK) and address in words and checkpoint in words
    jars = "spark.jars=" + ",".join(map(str, maven.spark_kafka()))
    given = [word.replace(address, kafka_broker.bootstrap).replace(checkpoint, str(tmp_path / "ckpt"))
             .replace(f"spark.jars.packages={packages}", jars)
             .replace(f"subscribe={written_topic}", f"subscribe={topic}") for word in stream]
    environment = _bank(postgres, tmp_path)
    make_topic(kafka_broker.bootstrap, topic, 3)
    accounts = [f"acct-{n % 23}" for n in range(1_200)]
    amounts = [(n * 7919) % 1000 - 300 for n in range(1_200)]
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topic, [(account, json.dumps({"account": account, "amount": amount}).encode())
                               for account, amount in zip(accounts, amounts, strict=True)])
    done = subprocess.run([sys.executable, "-m", "segack", *given[1:]], env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert _ledger_and_balances(postgres) == ((1_200, sum(amounts)), _expected(accounts, amounts))
    assert committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic)
    shown = subprocess.run([sys.executable, "-m", "segack",
                            *[word.replace(checkpoint, str(tmp_path / "ckpt")) for word in status[1:]]],
                           env=environment, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
