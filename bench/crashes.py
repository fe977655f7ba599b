"""``python -m bench crashes``: what one SIGKILL and a resume cost a handler, by flush setting.

Not a speed table: a count, for the guarantee the docs state (at least once; exactly once through a
sink). A bank-account log (60,000 events of 8,000 accounts, three of them very busy, shuffled into 8
Parquet files) is replayed by ``segack replay`` into SQLite, 2 segments, each event adding its
amount to its account's balance and logging ``(account, ts)``. The run is killed with SIGKILL (its
process group, Spark's workers included) once its checkpoint records 40% done, and resumed. Counted
from the database after: applications beyond one per event (repeats) and accounts whose balance is
wrong, for

- ``add``: ``balance = balance + amount``, at the default flush settings and at tighter ones;
- ``add_once``: the same, skipping an event at or before the account's last applied ``ts``, recorded
  in the same transaction (an idempotent handler, as the docs' recipe writes it).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, save

EVENTS = 60_000
ACCOUNTS = 8_000
ROOT = Path(__file__).resolve().parents[1]
DB_ENV = "SEGACK_BENCH_CRASH_DB"
SCHEMA = ("CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL, "
          "last_ts INTEGER NOT NULL);"
          "CREATE TABLE IF NOT EXISTS applied (account TEXT NOT NULL, ts INTEGER NOT NULL)")


def _database() -> sqlite3.Connection:
    database = sqlite3.connect(os.environ[DB_ENV], timeout=60, isolation_level=None)
    database.executescript(SCHEMA)
    return database


def _apply(event: dict[str, Any], once: bool) -> None:
    database = _database()
    try:
        database.execute("BEGIN IMMEDIATE")
        row = database.execute("SELECT last_ts FROM balances WHERE account = ?",
                               (event["account"],)).fetchone()
        if once and row is not None and event["ts"] <= row[0]:
            database.execute("ROLLBACK")  # applied already, by a run that was killed before it recorded it
            return
        database.execute("INSERT INTO balances VALUES (?, ?, ?) ON CONFLICT (account) DO UPDATE SET "
                         "balance = balance + excluded.balance, last_ts = excluded.last_ts",
                         (event["account"], event["amount"], event["ts"]))
        database.execute("INSERT INTO applied VALUES (?, ?)", (event["account"], event["ts"]))
        database.execute("COMMIT")
    finally:
        database.close()


def add(event: dict[str, Any]) -> None:
    """``balance = balance + amount``: a repeat adds it twice."""
    _apply(event, once=False)


def add_once(event: dict[str, Any]) -> None:
    """The same, idempotent: an event at or before the account's last applied ``ts`` is skipped."""
    _apply(event, once=True)


def _events(directory: Path) -> dict[str, int]:
    """The log, written to ``directory``; returns each account's right balance."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(7)
    accounts = [f"hot-{rng.randrange(3)}" if rng.random() < 0.1 else f"acct-{rng.randrange(ACCOUNTS)}"
                for _ in range(EVENTS)]
    stamps = list(range(EVENTS))
    rng.shuffle(stamps)
    amounts = [rng.randint(-50, 100) for _ in range(EVENTS)]
    table = pa.table({"account": accounts, "ts": stamps, "amount": amounts})
    directory.mkdir()
    for part in range(8):
        pq.write_table(table.slice(part * EVENTS // 8, EVENTS // 8), directory / f"part-{part}.parquet")
    expected: dict[str, int] = {}
    for account, amount in zip(accounts, amounts, strict=True):
        expected[account] = expected.get(account, 0) + amount
    return expected


def _replay(work: Path, handler: str, flags: list[str]) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **{DB_ENV: str(work / "bank.sqlite")})
    command = [sys.executable, "-m", "segack", "replay", str(work / "events"), "--key", "account",
               "--order", "ts", "--handler", f"bench.crashes:{handler}", "--checkpoint", str(work / "ck"),
               "--segments", "2", *flags]
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _crash_and_resume(work: Path, handler: str, flags: list[str]) -> None:
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    store = CheckpointStore(str(work / "ck"))
    first = _replay(work, handler, flags)
    while first.poll() is None:
        time.sleep(0.2)
        state = store.load()
        if state is not None and state.tokens is not None and state.tokens.done >= 0.4 * EVENTS:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    if _replay(work, handler, flags).wait() != 0:
        raise RuntimeError(f"the resumed run of {handler} {flags} failed")


def _scenario(handler: str, flags: list[str], expected: dict[str, int], events: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="segack-crash-") as name:
        work = Path(name)
        (work / "events").symlink_to(events)
        _crash_and_resume(work, handler, flags)
        database = sqlite3.connect(work / "bank.sqlite")
        applied, distinct = database.execute(
            "SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT DISTINCT account, ts FROM applied)) FROM applied"
        ).fetchone()
        balances = dict(database.execute("SELECT account, balance FROM balances"))
        database.close()
    wrong = sum(1 for account, balance in expected.items() if balances.get(account) != balance)
    return {"handler": handler, "flush": " ".join(flags) or "default (10000 events / 5 s)",
            "events": EVENTS, "missing": EVENTS - distinct, "repeats": applied - distinct,
            "wrong accounts": f"{wrong:,} of {len(expected):,}"}


def run() -> None:
    with tempfile.TemporaryDirectory(prefix="segack-crash-log-") as name:
        expected = _events(Path(name) / "events")
        rows = [_scenario(handler, flags, expected, Path(name) / "events") for handler, flags in [
            ("add", []),
            ("add", ["--flush-every", "1000", "--flush-interval", "0.5"]),
            ("add_once", []),
        ]]
    columns = ["handler", "flush", "events", "missing", "repeats", "wrong accounts"]
    print_table("one SIGKILL at 40% and a resume, 2 segments, SQLite", rows, columns)
    save("crashes", rows)
