"""Effects exactly once through SqlSink, with real Spark and a real PostgreSQL server: runs killed,
resumed over other segments, split while running, paused past their claim and woken, streams whose
micro-batch comes twice, dead letters in lists, and sinks refused before any event."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from segack.cli import main
from segack.demo import generate_events
from segack.sinks import SqlSink
from segack.spark_adapter import EventIdentity, foreach_batch, replay, with_identity
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.claims import latest_claim
from tests.spark_handlers import (
    DSN_ENV,
    SQLITE_LEDGER,
    LedgerApply,
    SqliteConnect,
    fold,
)
from tests.test_replay_cli import _kill_group, _process_tree, _signal_tree, _wait_for

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _pairs(table):
    return list(zip(table.column("user").to_pylist(), table.column("seq").to_pylist(), strict=True))


def _assert_exactly_once(rows, balances, table):
    """``rows``: the ledger's ``(user, seq)`` in insertion order. Every event once, each key's rows in
    its order, every balance the sequential fold of its key's events."""
    pairs = _pairs(table)
    assert len(rows) == len(set(rows)) == len(pairs), f"{len(rows)} ledger rows, {len(set(rows))} distinct"
    assert set(rows) == set(pairs)
    last: dict[str, int] = {}
    for user, seq in rows:
        assert seq == last.get(user, -1) + 1, f"{user} {seq} applied after {last.get(user)}"
        last[user] = seq
    expected: dict[str, int] = {}
    for user, seq in sorted(pairs, key=lambda pair: (pair[0], pair[1])):
        expected[user] = fold(expected.get(user, 0), seq)
    assert balances == expected


def _sqlite_ledger(path):
    with sqlite3.connect(path) as db:
        for statement in SQLITE_LEDGER:
            db.execute(statement)


def _sqlite_state(path):
    with sqlite3.connect(path) as db:
        return (db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall(),
                dict(db.execute("SELECT user_id, balance FROM balances").fetchall()))


def _pg_state(dsn):
    with psycopg.connect(dsn) as db:
        return ([tuple(row) for row in db.execute("SELECT user_id, seq FROM ledger ORDER BY id")],
                dict(db.execute("SELECT user_id, balance FROM balances").fetchall()))


def test_a_run_from_a_stale_checkpoint_applies_nothing_twice(spark, tmp_path):
    """The checkpoint says less than the database has (a crash between an apply and its flush, a
    fenced run that woke up): the sink skips what it already applied."""
    table = generate_events(4000, seed=51)
    df = spark.createDataFrame(table)
    database, checkpoint = str(tmp_path / "effects.db"), str(tmp_path / "checkpoint")
    _sqlite_ledger(database)
    sink = SqlSink(SqliteConnect(database), LedgerApply("?", fail_on=_pairs(table)[2500]))
    with pytest.raises(Exception, match="refuses"):
        replay(df, key="user", order="ts", handler=sink, checkpoint=checkpoint, segments=2, batch_size=50,
               concurrency=4)
    stale = str(tmp_path / "stale")
    shutil.copytree(checkpoint, stale)
    applied_before = len(_sqlite_state(database)[0])
    assert 0 < applied_before < 4000
    sink = SqlSink(SqliteConnect(database), LedgerApply("?"))
    assert replay(df, key="user", order="ts", handler=sink, checkpoint=checkpoint, segments=3,
                  batch_size=50, concurrency=4).complete
    _assert_exactly_once(*_sqlite_state(database), table)
    # The stale copy redoes everything after its failure: every event of it was applied already.
    shutil.rmtree(checkpoint)
    shutil.copytree(stale, checkpoint)
    result = replay(df, key="user", order="ts", handler=sink, checkpoint=checkpoint, segments=2)
    assert result.complete and result.handled > 0
    _assert_exactly_once(*_sqlite_state(database), table)


def test_identities_are_the_same_in_every_run_and_name_each_event_once(spark, tmp_path):
    table = generate_events(1500, seed=52)
    df = spark.createDataFrame(table)
    seen: list[list[tuple[str, int, EventIdentity]]] = []
    for segments, checkpoint in ((2, "first"), (5, "first-again"), (3, "other")):
        log = tmp_path / f"{checkpoint}.log"
        replay(df, key="user", order="ts", handler=IdentityLog(str(log)),
               checkpoint=str(tmp_path / checkpoint), segments=segments, concurrency=2)
        seen.append([eval(line) for line in log.read_text().splitlines()])
    first, again, other = ({(user, seq): identity for user, seq, identity in run} for run in seen)
    assert len(first) == 1500 and set(first) == set(_pairs(table))
    assert len({identity.idempotency_key for identity in first.values()}) == 1500
    for pair, identity in first.items():
        assert identity.key == pair[0]
        # Positions are the same over other segments; the checkpoint's id tells checkpoints apart.
        assert (again[pair].key_group, again[pair].position) == (identity.key_group, identity.position)
        assert other[pair].idempotency_key != identity.idempotency_key
    # Within a key, positions follow the key's order.
    by_key: dict[str, list[tuple[int, int]]] = {}
    for (user, seq), identity in first.items():
        by_key.setdefault(user, []).append((seq, identity.position))
    assert all([position for _, position in sorted(pairs)] == sorted(position for _, position in pairs)
               for pairs in by_key.values())


class IdentityLog:
    """A plain handler that asks for identities and logs ``(user, seq, identity)`` lines."""

    segack_identity = True

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, event, identity) -> None:
        with open(self.path, "a") as log:
            log.write(repr((event["user"], event["seq"], identity)) + "\n")


def test_with_identity_marks_a_function(spark, tmp_path):
    table = generate_events(300, seed=53)
    got = tmp_path / "got.log"

    @with_identity
    def handler(events, identities):
        with open(got, "a") as log:
            for event, identity in zip(events, identities, strict=True):
                log.write(f"{event['user']} {identity.key} {identity.position}\n")

    replay(spark.createDataFrame(table), key="user", order="ts", handler=handler,
           checkpoint=str(tmp_path / "checkpoint"), segments=2, batch_size=20)
    lines = [line.split() for line in got.read_text().splitlines()]
    assert len(lines) == 300 and all(user == key for user, key, _ in lines)


@pytest.mark.handlers
def test_dead_letters_in_lists_set_aside_only_the_failing_event_and_its_keys_later_ones(spark, tmp_path):
    table = generate_events(3000, seed=54)
    pairs = _pairs(table)
    users = [user for user, _ in pairs]
    heavy = max(set(users), key=users.count)
    database, checkpoint = str(tmp_path / "effects.db"), str(tmp_path / "checkpoint")
    _sqlite_ledger(database)
    df = spark.createDataFrame(table)
    result = replay(df, key="user", order="ts", checkpoint=checkpoint, segments=2, batch_size=100,
                    concurrency=4, retries=1, retry_delay=0, on_error="dead-letter",
                    handler=SqlSink(SqliteConnect(database), LedgerApply("?", fail_on=(heavy, 5))))
    rows, _ = _sqlite_state(database)
    behind = {(heavy, seq) for user, seq in pairs if user == heavy and seq >= 5}
    assert result.dead_letters == len(behind)
    assert set(rows) == set(pairs) - behind and len(rows) == len(set(rows))
    result = replay(df, key="user", order="ts", checkpoint=checkpoint, segments=3, batch_size=100,
                    retry_dead_letters=True, handler=SqlSink(SqliteConnect(database), LedgerApply("?")))
    assert result.retried == len(behind)
    _assert_exactly_once(*_sqlite_state(database), table)


@pytest.mark.streams
def test_a_micro_batch_delivered_twice_applies_nothing_twice(spark, tmp_path):
    """Spark's foreachBatch is at least once: the query may run a batch again after it crashed. Here
    the segack checkpoint is also behind (restored), so only the sink stands between the batch and a
    second application."""
    table = generate_events(2000, seed=55)
    source = tmp_path / "source"
    source.mkdir()
    # Each key's later events in the later file: a stream orders events within a batch, and batches in turn.
    by_time = table.sort_by("ts")
    halves = [by_time.slice(0, 1000), by_time.slice(1000)]
    database, checkpoint = str(tmp_path / "effects.db"), str(tmp_path / "checkpoint")
    _sqlite_ledger(database)
    process = foreach_batch(SqlSink(SqliteConnect(database), LedgerApply("?")), key="user", order="ts",
                            checkpoint=checkpoint, segments=2, batch_size=64, concurrency=2)
    pq.write_table(halves[0], source / "0.parquet")
    schema = spark.read.parquet(str(source)).schema
    query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
             .writeStream.foreachBatch(process).option("checkpointLocation", str(tmp_path / "stream"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    shutil.copytree(checkpoint, tmp_path / "after-first")
    pq.write_table(halves[1], source / "1.parquet")
    for _ in range(2):
        # The second time, as if the query had crashed: its own and segack's checkpoints are behind.
        shutil.rmtree(tmp_path / "stream", ignore_errors=True)
        shutil.rmtree(checkpoint)
        shutil.copytree(tmp_path / "after-first", checkpoint)
        batch = spark.read.parquet(str(source / "1.parquet"))
        process(batch, 1)
    _assert_exactly_once(*_sqlite_state(database), table)


# ---------------------------------------------------------------------- the command, on PostgreSQL


#: Calls as a run with many in flight makes them: lists through the dispatcher.
DISPATCHED = ("--batch-size", "200", "--concurrency", "8")


def _start(tmp_path, dsn, segments, extra=(), calls=DISPATCHED):
    """``segack replay`` of the ledger sink; ``calls=()``: the defaults (one call at a time, in the
    task's own loop, lists of the sink's preferred size)."""
    environment = dict(os.environ, **{DSN_ENV: dsn})
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"),
               "--key", "user", "--order", "ts", "--handler", "tests.spark_handlers:ledger_sink",
               "--checkpoint", str(tmp_path / "checkpoint"), "--segments", str(segments),
               *calls, *extra]
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ledger_size(dsn):
    with psycopg.connect(dsn) as db:
        return db.execute("SELECT count(*) FROM ledger").fetchone()[0]


def _recorded_done(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    state = store.load()
    if state is None or state.tokens is None:
        return 0
    tokens = state.tokens.copy()
    for _, updates in store.read_progress(store.progress_files()):
        tokens.apply(updates)
    return tokens.done


@pytest.mark.faults
@pytest.mark.rescale
@pytest.mark.command
def test_runs_killed_resumed_over_other_segments_and_split_apply_each_event_once(tmp_path, pg_database):
    total = 16_000
    table = generate_events(total, seed=56)
    pq.write_table(table, tmp_path / "events.parquet")
    rng = random.Random(2027)
    repeats = []
    for run, segments in enumerate([2, 5, 3]):
        # What this run will be handed again: applied, but not recorded done.
        repeats.append(_ledger_size(pg_database) - _recorded_done(tmp_path))
        process = _start(tmp_path, pg_database, segments, ["--flush-interval", "1"])
        applied_at = _ledger_size(pg_database)
        _wait_for(lambda process=process, applied_at=applied_at: process.poll() is not None
                  or _ledger_size(pg_database) > applied_at, 300, "the run to apply events")
        if run == 1:
            assert main(["split", str(tmp_path / "checkpoint"), "0"]) == 0
            split_at = _ledger_size(pg_database)
            _wait_for(lambda process=process, split_at=split_at: process.poll() is not None
                      or _ledger_size(pg_database) > split_at + 1000, 120, "events after the split")
        time.sleep(rng.uniform(0.3, 2.0))
        assert process.poll() is None, "the run ended before its kill: the test proves nothing"
        _kill_group(process)
    repeats.append(_ledger_size(pg_database) - _recorded_done(tmp_path))
    final = _start(tmp_path, pg_database, 4)
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err
    assert sum(repeats) > 0, "every kill landed just after a flush: no event came twice"
    print(f"\nevents handed again after each kill, skipped by the sink: {repeats}")
    _assert_exactly_once(*_pg_state(pg_database), table)


@pytest.mark.faults
@pytest.mark.claims
@pytest.mark.command
def test_a_paused_run_taken_over_then_woken_applies_nothing_twice(tmp_path, pg_database):
    # With the defaults: one call at a time, lists of the sink's preferred 5,000 (each a few
    # seconds' transaction at the sink's half a millisecond an event), so a pause lands in one.
    total = 24_000
    table = generate_events(total, seed=57)
    pq.write_table(table, tmp_path / "events.parquet")
    options = ["--claim-timeout", "3", "--flush-interval", "1"]
    stale = _start(tmp_path, pg_database, 2, options, calls=())
    _wait_for(lambda: _ledger_size(pg_database) > 2000, 300, "the first run to apply events")
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    stale_sessions = f"segack:{store.load().settings['checkpoint_id']}:{latest_claim(store).number}"
    paused = _process_tree(stale.pid)
    # Paused in the middle of a list: a pipelined transaction holding rows, which no timeout ends.
    for _ in range(20):
        _signal_tree(paused, signal.SIGSTOP)
        if _sessions_in_a_transaction(pg_database, stale_sessions):
            break
        _signal_tree(paused, signal.SIGCONT)
        time.sleep(0.1)
    else:
        raise AssertionError("the run was never paused in a transaction: the test proves nothing")
    try:
        time.sleep(4)  # past the claim's timeout
        assert _sessions_in_a_transaction(pg_database, stale_sessions)  # still holding its locks
        taker = _start(tmp_path, pg_database, 3, options, calls=())
        # It ends the paused run's sessions, so it never waits for their locks.
        _, err = taker.communicate(timeout=240)
        assert taker.returncode == 0, err
        assert _sessions_in_a_transaction(pg_database, stale_sessions) == 0
    finally:
        _signal_tree(paused, signal.SIGCONT)
    _, err = stale.communicate(timeout=300)
    assert stale.returncode == 1 and "lost its claim" in err, err
    _assert_exactly_once(*_pg_state(pg_database), table)


def _sessions_in_a_transaction(dsn, name):
    with psycopg.connect(dsn, autocommit=True) as db:
        return db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND "
                          "xact_start IS NOT NULL", (name,)).fetchone()[0]


@pytest.mark.command
def test_a_sink_that_cannot_start_is_refused_before_any_event(tmp_path, postgres, capsys):
    table = generate_events(500, seed=58)
    pq.write_table(table, tmp_path / "events.parquet")
    checkpoint = str(tmp_path / "checkpoint")
    bad = postgres.replace("dbname=postgres", "dbname=no_such_database")
    process = _start(tmp_path, bad, 2)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 4  # ExitCode.REFUSED: nothing was handled
    assert "SqlSink cannot connect: OperationalError" in err, err
    assert 'database "no_such_database" does not exist' in err, err
    # One line of segack's (the JVM adds its own "Using incubator modules" warning, which segack
    # cannot turn off): the driver's message on several lines is joined.
    assert len([line for line in err.splitlines() if not line.startswith("WARNING: ")]) == 1, err
    assert not os.path.exists(checkpoint)  # a new location: nothing left behind


def test_a_sink_on_a_table_it_cannot_make_is_refused_before_any_event(spark, tmp_path):
    from segack.spark_adapter import SinkError

    table = generate_events(300, seed=59)
    database = tmp_path / "read-only.db"
    sqlite3.connect(database).close()
    sink = SqlSink(lambda: sqlite3.connect(f"file:{database}?mode=ro", uri=True, check_same_thread=False),
                   LedgerApply("?"))
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(SinkError, match=r"cannot make its table segack_applied_[0-9a-f]{32}: Operational"):
        replay(spark.createDataFrame(table), key="user", order="ts", handler=sink, checkpoint=checkpoint)
    # No task ran: none wrote progress, and the run saved no state.
    store = CheckpointStore(checkpoint)
    assert store.load() is None and store.progress_files() == []
