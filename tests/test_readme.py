"""The README's examples, run as a user copies them: the exactly-once sink's tables and module
against the real PostgreSQL server the tests start, through the ``segack replay`` command."""

from __future__ import annotations

import os
import re
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


def test_the_readme_sink_and_its_tables_apply_each_event_once_with_no_batch_size(postgres, tmp_path):
    import psycopg

    (tables,) = [block for block in _blocks("sql") if "CREATE TABLE balances" in block]
    (module,) = [block for block in _blocks("python") if "SqlSink(" in block]
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bank WITH (FORCE)")
        admin.execute("CREATE DATABASE bank")
    # psycopg.connect("dbname=bank"), as the README writes it, finds the server through libpq's
    # environment, as a user's would.
    server = dict(part.split("=", 1) for part in postgres.split())
    libpq = {"PGHOST": server["host"], "PGPORT": server["port"], "PGUSER": server["user"]}
    with psycopg.connect(postgres.replace("dbname=postgres", "dbname=bank"), autocommit=True) as bank:
        bank.execute(tables)
    (tmp_path / "my_handlers.py").write_text(module)
    accounts = [f"acct-{n % 37}" for n in range(3_000)]
    amounts = [(n * 7919) % 1000 - 300 for n in range(3_000)]
    pq.write_table(pa.table({"account_id": accounts, "amount": amounts, "event_time": list(range(3_000))}),
                   tmp_path / "events.parquet")
    environment = dict(os.environ, **libpq, PYTHONPATH=os.pathsep.join(
        filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"),
                           "--key", "account_id", "--order", "event_time", "--handler", "my_handlers:sink",
                           "--checkpoint", str(tmp_path / "ckpt"), "--segments", "2"],
                          env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(postgres.replace("dbname=postgres", "dbname=bank")) as bank:
        ledger = bank.execute("SELECT count(*), sum(amount) FROM ledger").fetchone()
        balances = dict(bank.execute("SELECT account, balance FROM balances").fetchall())
        positions = bank.execute("SELECT table_name FROM information_schema.tables "
                                 "WHERE table_name LIKE 'segack_applied_%'").fetchall()
    expected: dict[str, int] = {}
    for account, amount in zip(accounts, amounts, strict=True):
        expected[account] = expected.get(account, 0) + amount
    assert ledger == (3_000, sum(amounts))
    assert balances == expected
    assert len(positions) == 1
    # The sink's preferred lists were used: the status shows calls of up to 5,000 events.
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    assert CheckpointStore(str(tmp_path / "ckpt")).load().settings["batch_size"] == 5000
