"""``python -m bench sinks``: effects in PostgreSQL through Spark, exactly once against what users
write by hand, and a no-op handler in lists against one event per call.

A real PostgreSQL server on loopback (Debian's ``postgresql``, started as the tests start it, but
durable: each commit reaches the disk), one Spark session, 200,000 events of 8,000 accounts; each
event inserts a ledger row and upserts its account's balance. Rates come from the database's own
clock: the ledger stamps each row with ``clock_timestamp()``, and a pipeline's rate is its rows over
the time from its first row to its last, so Spark's start and planning count for none of them. Each
pipeline runs three times, the rounds interleaved, and counts at its best (one run moves by up to
a tenth between rounds); the per-event handler runs once.
"""

from __future__ import annotations

import functools
import operator
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import print_table, save
from bench.cpu import KINDS, CpuSampler
from segack.spark_adapter import Sink

EVENTS = 200_000
ACCOUNTS = 8_000
SEGMENTS = 4
#: Rows per transaction for the batched pipelines.
BATCH = 1_000
#: Runs of each pipeline (but the per-event handler); each is reported at its best.
ROUNDS = 3
#: CPU seconds each part spent while the ledger was written (first row to last), and their sum.
CPU_COLUMN = "CPU-s in its window: " + " / ".join(KINDS)
LEDGER = ("CREATE TABLE ledger (account TEXT NOT NULL, amount BIGINT NOT NULL, "
          "at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())")
BALANCES = "CREATE TABLE balances (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)"
INSERT = "INSERT INTO ledger (account, amount) VALUES (%s, %s)"
UPSERT = ("INSERT INTO balances (account, balance) VALUES (%s, %s) "
          "ON CONFLICT (account) DO UPDATE SET balance = balances.balance + excluded.balance")


class Connect:
    """``connect()`` for the database ``dsn``: what every pipeline opens, in Spark's workers too."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def __call__(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn)


def apply(cursor: Any, event: dict[str, Any]) -> None:
    """One event's effects, as a user writes them for a sink."""
    cursor.execute(INSERT, (event["account"], event["amount"]))
    cursor.execute(UPSERT, (event["account"], event["amount"]))


def apply_many(cursor: Any, events: list[dict[str, Any]]) -> None:
    """The same for a list, with ``executemany``."""
    cursor.executemany(INSERT, [(event["account"], event["amount"]) for event in events])
    cursor.executemany(UPSERT, [(event["account"], event["amount"]) for event in events])


class ThreadConnections:
    """A connection per task thread, opened on first use: what a handler pickled into Spark's tasks
    keeps (its copy opens its own)."""

    def __init__(self, connect: Connect) -> None:
        self.connect = connect
        self._local: threading.local | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"connect": self.connect}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.connect, self._local = state["connect"], None

    def get(self) -> Any:
        if self._local is None:
            self._local = threading.local()
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self.connect()
        return connection


class OneTransactionPerEvent:
    """The per-event handler a user writes today: a connection per thread, a commit per event."""

    def __init__(self, connect: Connect) -> None:
        self.connections = ThreadConnections(connect)

    def __call__(self, event: dict[str, Any]) -> None:
        connection = self.connections.get()
        with connection.transaction():
            apply(connection.cursor(), event)


class WithoutRecord(Sink):
    """For measurement only, not exactly once: a sink's call without its record. It takes the
    sink's lists, with their identities, and applies them as :class:`~segack.sinks.SqlSink` does on
    psycopg 3 (``apply_many`` in a pipeline, one transaction), but records no position, so the
    price of the record is the difference between the two."""

    def __init__(self, connect: Connect, preferred_batch_size: int | None) -> None:
        self.connections = ThreadConnections(connect)
        self.preferred_batch_size = preferred_batch_size

    def __call__(self, events: list[dict[str, Any]], identities: list[Any]) -> None:
        connection = self.connections.get()
        with connection.pipeline():
            apply_many(connection.cursor(), events)
        connection.commit()


def by_hand(connect: Connect, rows: Iterator[Any], rows_per_transaction: int = BATCH) -> None:
    """The hand-written writer: ``foreachPartition``, ``executemany`` in 1,000-row transactions; no
    order, no dedupe, no checkpoint."""
    with connect() as connection:
        chunk: list[tuple[str, int]] = []
        for row in rows:
            chunk.append((row["account"], row["amount"]))
            if len(chunk) == rows_per_transaction:
                _write(connection, chunk)
                chunk = []
        if chunk:
            _write(connection, chunk)


def _write(connection: Any, chunk: list[tuple[str, int]]) -> None:
    # Each partition may hold any accounts: sorted, two partitions lock balances in the same order
    # and cannot deadlock. By account only: the sort is stable, so an account's rows keep their order.
    chunk.sort(key=operator.itemgetter(0))
    with connection.transaction():
        cursor = connection.cursor()
        cursor.executemany(INSERT, chunk)
        cursor.executemany(UPSERT, chunk)


def fresh_database(server: str, name: str) -> str:
    import psycopg

    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    dsn = server.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(dsn) as db:
        db.execute(LEDGER)
        db.execute(BALANCES)
    return dsn


def ledger_window(dsn: str, events: int = EVENTS) -> tuple[float, float]:
    """When the ledger's first row and its last were written, by the database's clock (seconds
    since the epoch); every one of ``events`` must be there, once."""
    import psycopg

    with psycopg.connect(dsn) as db:
        count, first, last = db.execute("SELECT count(*), extract(epoch FROM min(at)), "
                                        "extract(epoch FROM max(at)) FROM ledger").fetchone()
    if count != events:
        raise RuntimeError(f"{count} ledger rows for {events} events")
    return float(first), float(last)


def ledger_rate(dsn: str, events: int = EVENTS) -> float:
    """Ledger rows per second by the database's clock, first row to last (:func:`ledger_window`)."""
    first, last = ledger_window(dsn, events)
    return events / (last - first)


def _sinks(rows: list[dict[str, Any]], server: str) -> None:
    import numpy as np
    import pyarrow as pa

    from segack.sinks import SqlSink
    from segack.spark_adapter import local_session, replay

    spark = local_session("segack-bench-sinks")
    rng = np.random.default_rng(11)
    table = pa.table({"account": [f"acct-{key}" for key in rng.integers(0, ACCOUNTS, EVENTS).tolist()],
                      "ts": np.arange(EVENTS), "amount": rng.integers(1, 1000, EVENTS)})
    frame = spark.createDataFrame(table).repartition(SEGMENTS).cache()
    frame.count()

    def segack(handler: Any, **options: Any) -> None:
        with tempfile.TemporaryDirectory() as checkpoint:
            replay(frame, key="account", order="ts", handler=handler, checkpoint=checkpoint,
                   segments=SEGMENTS, **options)

    preferred = SqlSink(Connect(server), apply_many=apply_many).preferred_batch_size
    pipelines: list[tuple[str, Any]] = [
        ("per-event handler, one transaction per event (concurrency 1)",
         lambda connect: segack(OneTransactionPerEvent(connect))),
        (f"SqlSink as the README writes it: apply_many (executemany), no flags (lists of its "
         f"preferred {preferred:,}, pipelined, concurrency 1)",
         lambda connect: segack(SqlSink(connect, apply_many=apply_many))),
        ("SqlSink, apply per event, no flags", lambda connect: segack(SqlSink(connect, apply))),
        ("SqlSink, apply per event, pipeline=False (the default before 0.2)",
         lambda connect: segack(SqlSink(connect, apply, pipeline=False))),
        (f"SqlSink, apply per event, batch_size={BATCH}, concurrency 4",
         lambda connect: segack(SqlSink(connect, apply), batch_size=BATCH, concurrency=4)),
        (f"SqlSink, apply_many, batch_size={BATCH}, concurrency 4",
         lambda connect: segack(SqlSink(connect, apply_many=apply_many), batch_size=BATCH, concurrency=4)),
        ("the README's form without its record (measurement only: not exactly once)",
         lambda connect: segack(WithoutRecord(connect, preferred))),
        (f"by hand, as below in {preferred:,}-row transactions (the sink's lists)",
         lambda connect: frame.foreachPartition(functools.partial(by_hand, connect,
                                                                  rows_per_transaction=preferred))),
        ("by hand, in order: repartition by account, sortWithinPartitions by ts, the writer below",
         lambda connect: frame.repartition(SEGMENTS, "account").sortWithinPartitions("ts").foreachPartition(
             functools.partial(by_hand, connect))),
        (f"by hand: foreachPartition, executemany in {BATCH:,}-row transactions, no order, no dedupe, "
         f"no checkpoint", lambda connect: frame.foreachPartition(functools.partial(by_hand, connect))),
    ]
    # Each pipeline's best of ROUNDS, the rounds interleaved so that the server's state (its WAL,
    # its checkpoints) and the machine's weather fall on all of them alike; the per-event handler,
    # twelve times slower than the rest, runs once.
    rates: dict[str, float] = {}
    used: dict[str, dict[str, float]] = {}
    runs = 0
    with CpuSampler() as cpu:
        for round_number in range(ROUNDS):
            for number, (name, run) in enumerate(pipelines):
                if number == 0 and round_number > 0:
                    continue
                runs += 1
                dsn = fresh_database(server, f"bench_{runs}")
                run(Connect(dsn))
                first, last = ledger_window(dsn)
                rate = EVENTS / (last - first)
                print(f"  {name}: {rate:,.0f} events/s", flush=True)
                if rate > rates.get(name, 0.0):
                    rates[name], used[name] = rate, cpu.within(first, last)
    spark.stop()
    per_event, in_order, hand = (rates[pipelines[number][0]] for number in (0, -2, -1))
    for name, rate in rates.items():
        rows.append({"pipeline": name, "events/s": f"{rate:,.0f}",
                     "vs per-event handler": f"{rate / per_event:.1f}x", "vs by hand": f"{rate / hand:.2f}x",
                     "vs by hand in order": f"{rate / in_order:.2f}x",
                     CPU_COLUMN: " / ".join(f"{used[name][kind]:.1f}" for kind in KINDS)
                     + f" ({sum(used[name].values()):.1f})"})


def _lists(rows: list[dict[str, Any]], workdir: str) -> None:
    """A no-op handler in lists of 1,000 against one event per call: ``segack replay`` as a whole
    process, 1M events."""
    import pyarrow.parquet as pq

    from bench.spark import REPEATS, _segack, _timed
    from segack.demo import generate_events

    data = os.path.join(workdir, "events.parquet")
    pq.write_table(generate_events(1_000_000), data)
    best = {"one event per call": float("inf"), f"lists of {BATCH:,} (--batch-size {BATCH})": float("inf")}
    for attempt in range(REPEATS):
        for name, extra in zip(best, ([], ["--batch-size", str(BATCH)]), strict=True):
            checkpoint = os.path.join(workdir, f"lists-{attempt}-{len(extra)}")
            handler = "bench.sleepy:nothing_in_lists" if extra else "bench.sleepy:nothing"
            best[name] = min(best[name], _timed([*_segack(data, checkpoint, handler), *extra]))
            shutil.rmtree(checkpoint)
    single = best["one event per call"]
    for name, seconds in best.items():
        rows.append({"workload": "1,000,000 events, no-op handler, whole process", "calls": name,
                     "seconds": f"{seconds:.1f}", "vs one event per call": f"{seconds / single:.2f}x"})


def run() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.postgres import postgres_server

    sink_rows: list[dict[str, Any]] = []
    list_rows: list[dict[str, Any]] = []
    workdir = tempfile.mkdtemp(prefix="segack-bench-sinks-")
    os.chmod(workdir, 0o755)
    try:
        with postgres_server(Path(workdir) / "postgres", durable=True) as server:
            began = time.perf_counter()
            _sinks(sink_rows, server)
            print(f"(sinks: {time.perf_counter() - began:.0f} s)")
        _lists(list_rows, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(f"Effects in PostgreSQL, {EVENTS:,} events, {ACCOUNTS:,} accounts, {SEGMENTS} segments, "
                "by the database's clock (floors: the README's form >= 8x the per-event handler and "
                ">= 0.8x by hand; apply_many >= 1.0x by hand)",
                sink_rows, list(sink_rows[0]))
    save("sinks-postgres", sink_rows)
    print_table("Handler calls in lists", list_rows, list(list_rows[0]))
    save("sinks-lists", list_rows)
