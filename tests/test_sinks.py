"""SqlSink and event identities without Spark: SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import json
import logging
import pickle
import sqlite3
import threading
import time

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segack.errors import SegackTypeError, SegackValueError
from segack.sinks import SqlSink
from segack.sinks.key_text import key_text as _key_text
from segack.spark_adapter import EventIdentity, RunContext, Sink, SinkError, with_identity
from segack.spark_adapter.handlers import identified_events, with_identities_passed
from segack.spark_adapter.options import Policy
from tests.spark_handlers import (
    SQLITE_LEDGER,
    LedgerApply,
    PostgresConnect,
    SqliteConnect,
    fold,
)

CHECKPOINT_ID = "0123456789abcdef"


def _run(policy=Policy.PER_KEY, claim_timeout=30.0, claim=1):
    return RunContext("/tmp/checkpoint", CHECKPOINT_ID, "user", "seq", policy, claim_timeout, None, claim)


def _events(pairs):
    """``(user, seq)`` events with identities: ``seq`` is the position (one key per key group)."""
    events = [{"user": user, "seq": seq} for user, seq in pairs]
    identities = [EventIdentity(user, 7, seq, CHECKPOINT_ID) for user, seq in pairs]
    return events, identities


@pytest.fixture
def sqlite_sink(tmp_path):
    path = str(tmp_path / "effects.db")
    with sqlite3.connect(path) as db:
        for statement in SQLITE_LEDGER:
            db.execute(statement)
    sink = SqlSink(SqliteConnect(path), LedgerApply("?"))
    sink.prepare(_run())
    yield sink, path
    sink.close()


def _ledger(path):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall()


def _balances(path):
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT user_id, balance FROM balances").fetchall())


def _expected_balances(pairs):
    balances: dict[str, int] = {}
    for user, seq in pairs:
        balances[user] = fold(balances.get(user, 0), seq)
    return balances


def test_a_sink_applies_each_event_once_when_calls_repeat_and_overlap(sqlite_sink):
    sink, path = sqlite_sink
    sink(*_events([("a", 0), ("b", 0), ("a", 1)]))
    # Handed again from the start (a resumed run), with one event more for each key.
    sink(*_events([("a", 0), ("a", 1), ("b", 0), ("a", 2), ("b", 1)]))
    sink(*_events([("b", 1)]))
    assert _ledger(path) == [("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1)]
    assert _balances(path) == _expected_balances([("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)])
    with sqlite3.connect(path) as db:
        recorded = dict(db.execute(f"SELECT key_json, last_position FROM {sink.table_for(CHECKPOINT_ID)}"))
    assert recorded == {'"a"': 2, '"b"': 1}


def test_a_call_that_raises_leaves_no_effect_and_no_position(tmp_path):
    path = str(tmp_path / "effects.db")
    with sqlite3.connect(path) as db:
        for statement in SQLITE_LEDGER:
            db.execute(statement)
    sink = SqlSink(SqliteConnect(path), LedgerApply("?", fail_on=("b", 0)))
    sink.prepare(_run())
    sink(*_events([("a", 0)]))
    with pytest.raises(ValueError, match="refuses"):
        sink(*_events([("a", 1), ("b", 0)]))
    assert _ledger(path) == [("a", 0)]
    # The connection is still good: the next call applies ("a", 1) once.
    sink(*_events([("a", 1)]))
    assert _ledger(path) == [("a", 0), ("a", 1)]
    sink.close()


def test_keys_of_other_types_and_null_keep_their_own_positions(tmp_path):
    path = str(tmp_path / "effects.db")
    applied = []
    sink = SqlSink(SqliteConnect(path), lambda cursor, event: applied.append(event["k"]))
    sink.prepare(_run())
    keys = [None, "null", 1, "1", ""]
    sink([{"k": key} for key in keys], [EventIdentity(key, 0, 5, CHECKPOINT_ID) for key in keys])
    sink([{"k": key} for key in keys], [EventIdentity(key, 0, 5, CHECKPOINT_ID) for key in keys])
    assert applied == keys
    sink.close()


def _json(key):
    """A key's text as the sink's table documents it."""
    return json.dumps(key, default=str, ensure_ascii=False, separators=(",", ":"))


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.dates(),
                 st.decimals(), st.binary(), st.lists(st.text(max_size=3), max_size=3)))
def test_a_keys_text_is_its_json(key):
    assert _key_text(key) == _json(key)


def test_apply_many_gets_the_fresh_events_in_one_call(sqlite_sink, tmp_path):
    _, path = sqlite_sink
    calls = []
    sink = SqlSink(SqliteConnect(path), apply_many=lambda cursor, events: calls.append(list(events)))
    sink.prepare(_run())
    sink(*_events([("a", 0), ("a", 1)]))
    sink(*_events([("a", 1), ("a", 2), ("c", 0)]))
    sink(*_events([("a", 2)]))
    assert calls == [[{"user": "a", "seq": 0}, {"user": "a", "seq": 1}],
                     [{"user": "a", "seq": 2}, {"user": "c", "seq": 0}]]
    sink.close()


def test_each_thread_has_its_connection_and_close_closes_them_all(sqlite_sink):
    sink, _ = sqlite_sink
    opened = []
    connect = sink.connect
    sink.connect = lambda: opened.append(connect()) or opened[-1]
    threads = [threading.Thread(target=sink, args=_events([(f"t{number}", 0), (f"t{number}", 1)]))
               for number in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink(*_events([("main", 0)]))
    sink(*_events([("main", 1)]))
    assert len(opened) == 4
    sink.close()
    for connection in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            connection.execute("SELECT 1")


def test_a_pickled_sink_carries_no_connection_and_opens_its_own(sqlite_sink):
    sink, path = sqlite_sink
    sink(*_events([("a", 0)]))
    copy = pickle.loads(pickle.dumps(sink))
    assert copy._connections == [] and copy.idle_timeout == 30.0
    copy(*_events([("a", 0), ("a", 1)]))
    assert _ledger(path) == [("a", 0), ("a", 1)]
    copy.close()


def test_a_lost_connection_is_dropped_and_the_next_call_opens_another(sqlite_sink):
    sink, path = sqlite_sink
    sink(*_events([("a", 0)]))
    connection, _ = sink._connection()
    connection.close()  # as a server that went away: every use of it now fails
    with pytest.raises(sqlite3.ProgrammingError):
        sink(*_events([("a", 1)]))
    sink(*_events([("a", 1)]))
    assert _ledger(path) == [("a", 0), ("a", 1)]


@pytest.mark.parametrize(("arguments", "error", "match"), [
    (("not callable", print), SegackTypeError, "connect must be callable"),
    ((sqlite3.connect,), SegackValueError, "not both or neither"),
    ((sqlite3.connect, print, ), SegackValueError, "not both or neither"),
    ((sqlite3.connect, "no"), SegackTypeError, "must be callable"),
])
def test_a_sink_made_wrong_is_refused(arguments, error, match):
    keywords = {"apply_many": print} if len(arguments) == 2 and arguments[1] is print else {}
    with pytest.raises(error, match=match):
        SqlSink(*arguments, **keywords)


@pytest.mark.parametrize("pipeline", ["yes", 1, 0.0])
def test_pipeline_is_true_false_or_none(pipeline):
    with pytest.raises(SegackTypeError, match=f"pipeline must be True, False or None, not {pipeline!r}"):
        SqlSink(sqlite3.connect, print, pipeline=pipeline)


@pytest.mark.parametrize("table", ["", "1st", "a-b", "x" * 31, "t; DROP TABLE ledger", 5])
def test_a_table_name_that_is_not_a_plain_name_is_refused(table):
    with pytest.raises(SegackValueError, match="plain name"):
        SqlSink(sqlite3.connect, print, table=table)


def test_prepare_refuses_the_concurrent_policy_before_connecting():
    connected = []
    sink = SqlSink(lambda: connected.append(1), print)
    with pytest.raises(SinkError, match="'concurrent'"):
        sink.prepare(_run(Policy.CONCURRENT))
    assert connected == []


def test_prepare_says_why_it_cannot_connect_or_make_its_table(tmp_path):
    def fails():
        raise OSError("no route to the database")

    with pytest.raises(SinkError, match="cannot connect: OSError: no route to the database"):
        SqlSink(fails, print).prepare(_run())

    def refused():  # as psycopg words a server that is not there: two lines
        raise OSError('connection failed: connection to server at "127.0.0.1", port 1 failed: Connection '
                      'refused\n\tIs the server running on that host and accepting TCP/IP connections?')

    with pytest.raises(SinkError) as caught:
        SqlSink(refused, print).prepare(_run())
    assert str(caught.value) == (
        'SqlSink cannot connect: OSError: connection failed: connection to server at "127.0.0.1", port 1 '
        'failed: Connection refused Is the server running on that host and accepting TCP/IP connections?')
    path = tmp_path / "read-only.db"
    sqlite3.connect(path).close()
    sink = SqlSink(lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True), print)
    with pytest.raises(SinkError, match=f"cannot make its table segack_applied_{CHECKPOINT_ID}: Operational"):
        sink.prepare(_run())
    assert sqlite3.connect(path).execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_identity_is_stable_and_names_its_event_alone():
    first = EventIdentity("acct-1", 12, 40, CHECKPOINT_ID)
    assert first.idempotency_key == EventIdentity("acct-1", 12, 40, CHECKPOINT_ID).idempotency_key
    others = {EventIdentity("acct-1", 12, 41, CHECKPOINT_ID), EventIdentity("acct-1", 13, 40, CHECKPOINT_ID),
              EventIdentity("acct-1", 12, 40, "fedcba9876543210"),
              EventIdentity("acct-1", 1, 240, CHECKPOINT_ID)}
    keys = {identity.idempotency_key for identity in others}
    assert len(keys) == 4 and first.idempotency_key not in keys
    assert len(first.idempotency_key) == 32 and int(first.idempotency_key, 16) >= 0


def test_handlers_that_ask_get_identities_beside_their_events():
    import numpy as np

    events = identified_events([{"user": "a"}, {"user": "b"}], "user", np.array([3, 4]), np.array([0, 9]),
                               "c1")
    def plain(event):
        return event

    assert with_identities_passed(plain) is plain
    seen = []
    marked = with_identity(lambda event, identity: seen.append((event, identity)))
    with_identities_passed(marked)(events[0])
    with_identities_passed(marked)(events)
    assert seen[0] == ({"user": "a"}, EventIdentity("a", 3, 0, "c1"))
    assert seen[1][0] == [{"user": "a"}, {"user": "b"}]
    assert seen[1][1] == [EventIdentity("a", 3, 0, "c1"), EventIdentity("b", 4, 9, "c1")]

    class Lists(Sink):
        def __call__(self, events, identities):
            seen.append((len(events), identities))

    with_identities_passed(Lists())(events[1])
    assert seen[2] == (1, [EventIdentity("b", 4, 9, "c1")])
    assert pickle.loads(pickle.dumps(events[1])).identity == EventIdentity("b", 4, 9, "c1")


# ---------------------------------------------------------------------------- PostgreSQL


def test_postgres_sink_applies_once_and_sets_the_idle_transaction_timeout(pg_database):
    sink = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
    sink.prepare(_run(claim_timeout=4.5))
    sink(*_events([("a", 0), ("b", 0), ("a", 1)]))
    sink(*_events([("a", 1), ("a", 2), ("b", 0)]))
    connection, _ = sink._connection()
    assert connection.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("4500ms",)
    assert connection.execute("SHOW application_name").fetchone() == (f"segack:{CHECKPOINT_ID}:1",)
    sink.close()
    with psycopg.connect(pg_database) as db:
        assert db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall() == [
            ("a", 0), ("b", 0), ("a", 1), ("a", 2)]


def test_postgres_fresh_calls_read_no_positions_and_a_call_with_applied_events_does(pg_database, caplog):
    """A call none of whose events was applied records their positions in the pipeline that
    applies them, and commits; only one with some applied already rolls back and reads them."""
    sink = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
    sink.prepare(_run())
    with caplog.at_level(logging.DEBUG, logger="segack.sinks"):
        sink(*_events([("a", 0), ("b", 0), ("a", 1)]))
        sink(*_events([("a", 2), ("c", 0)]))
        assert "reads positions" not in caplog.text
        # A new key beside one whose event 2 was applied; then an applied key alone.
        sink(*_events([("d", 0), ("a", 2), ("a", 3)]))
        assert caplog.text.count("SqlSink reads positions: some of a call's events were applied") == 1
        sink(*_events([("c", 0)]))
        assert caplog.text.count("SqlSink reads positions: some of a call's events were applied") == 2
    sink.close()
    with psycopg.connect(pg_database) as db:
        assert db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall() == [
            ("a", 0), ("b", 0), ("a", 1), ("a", 2), ("c", 0), ("d", 0), ("a", 3)]


def test_postgres_records_keys_whatever_their_text_in_the_fresh_path(pg_database, caplog):
    """The fresh path sends a call's keys as one text: separators, quotes and control characters
    in keys take nothing apart."""
    keys = ["a,b", 'q"uote', "back\\slash", "unit\x1fseparator", "new\nline", "", "ünï", "{}", None, 1,
            "1", "null", 2.5]
    with psycopg.connect(pg_database) as db:
        db.execute("CREATE TABLE effects (id SERIAL PRIMARY KEY, key_json TEXT NOT NULL)")
    sink = SqlSink(PostgresConnect(pg_database), lambda cursor, event: cursor.execute(
        "INSERT INTO effects (key_json) VALUES (%s)", (_json(event["k"]),)))
    sink.prepare(_run())
    events = [{"k": key} for key in keys for _ in range(2)]
    identities = [EventIdentity(key, 0, position, CHECKPOINT_ID) for key in keys for position in (4, 5)]
    with caplog.at_level(logging.DEBUG, logger="segack.sinks"):
        sink(events, identities)
        assert "reads positions" not in caplog.text
        sink(events, identities)
        assert "reads positions" in caplog.text
    sink.close()
    with psycopg.connect(pg_database) as db:
        applied = [key for (key,) in db.execute("SELECT key_json FROM effects ORDER BY id")]
        recorded = dict(db.execute(f"SELECT key_json, last_position FROM {sink.table_for(CHECKPOINT_ID)}"))
    assert applied == [_json(key) for key in keys for _ in range(2)]
    assert recorded == {_json(key): 5 for key in keys}


def test_postgres_pipeline_mode_applies_once_too(pg_database, tmp_path):
    sink = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"), pipeline=True)
    sink.prepare(_run())
    sink(*_events([("a", 0), ("a", 1)]))
    sink(*_events([("a", 1), ("a", 2), ("b", 0)]))
    sink.close()
    with psycopg.connect(pg_database) as db:
        assert db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall() == [
            ("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    with pytest.raises(SinkError, match="pipeline=True needs a psycopg 3 connection, not sqlite3's"):
        SqlSink(SqliteConnect(str(tmp_path / "x.db")), print, pipeline=True).prepare(_run())


def test_postgres_two_runs_racing_on_a_key_apply_it_once(pg_database):
    """A fenced run woken late and the run that took over call the sink with the same events at
    once: the row lock (or the primary key, for a key's first events) lets one apply them."""
    sinks = [SqlSink(PostgresConnect(pg_database), LedgerApply("%s")) for _ in range(2)]
    for sink in sinks:
        sink.prepare(_run())
    errors = []

    def call(sink, pairs):
        for _ in range(5):  # as the run's retries would
            try:
                sink(*_events(pairs))
                return
            except psycopg.Error as error:
                errors.append(error)

    for round_ in range(10):
        pairs = [(f"k{round_}", seq) for seq in range(3)]
        threads = [threading.Thread(target=call, args=(sink, pairs)) for sink in sinks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for sink in sinks:
        sink.close()
    with psycopg.connect(pg_database) as db:
        rows = db.execute("SELECT user_id, seq FROM ledger ORDER BY id").fetchall()
    assert sorted(rows) == [(f"k{round_}", seq) for round_ in range(10) for seq in range(3)]
    assert all(isinstance(error, psycopg.errors.UniqueViolation) for error in errors)


def test_postgres_a_paused_unpipelined_transaction_does_not_block_the_next_run_past_the_timeout(pg_database):
    sink = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
    sink.prepare(_run(claim_timeout=1.0))
    sink(*_events([("a", 0)]))
    paused = threading.Event()
    carry_on = threading.Event()

    def pausing_apply(cursor, event):
        LedgerApply("%s")(cursor, event)
        paused.set()
        carry_on.wait(10)  # the process was stopped mid-transaction, holding the row of "a"

    stuck = SqlSink(PostgresConnect(pg_database), pausing_apply, pipeline=False)
    stuck.prepare(_run(claim_timeout=1.0))
    outcome = []

    def stuck_call():
        try:
            stuck(*_events([("a", 1)]))
        except psycopg.Error as error:
            outcome.append(error)

    thread = threading.Thread(target=stuck_call)
    thread.start()
    assert paused.wait(10)
    sink(*_events([("a", 1), ("a", 2)]))  # waits for the row of "a" until the server ends the other
    carry_on.set()
    thread.join()
    # The server ended the paused transaction before it woke: nothing of it was committed.
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.Error)
    stuck.close()
    sink.close()
    with psycopg.connect(pg_database) as db:
        assert db.execute("SELECT seq FROM ledger ORDER BY id").fetchall() == [(0,), (1,), (2,)]


def _pausing_sink(pg_database, claim, pipeline=None):
    """A sink of run ``claim`` whose apply stops, as a SIGSTOPped process would, after the first
    event's statements reached the server (its balance row locked), until ``carry_on`` is set; its
    call's error, if any, goes to ``outcome``."""
    paused, carry_on, outcome = threading.Event(), threading.Event(), []

    def pausing_apply(cursor, event):
        LedgerApply("%s")(cursor, event)
        if event["seq"] == 1:
            paused.set()
            carry_on.wait(30)

    sink = SqlSink(PostgresConnect(pg_database), pausing_apply, pipeline=pipeline)
    sink.prepare(_run(claim_timeout=600.0, claim=claim))  # no timeout ends its transaction

    def call():
        try:
            sink(*_events([("a", 1), ("a", 2)]))
        except psycopg.Error as error:
            outcome.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    assert paused.wait(10)
    return sink, thread, carry_on, outcome


def _sessions(pg_database, claim):
    with psycopg.connect(pg_database, autocommit=True) as db:
        return db.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s",
                          (f"segack:{CHECKPOINT_ID}:{claim}",)).fetchall()


def test_postgres_a_run_that_takes_over_ends_the_pipelined_transaction_of_the_run_it_fenced(pg_database):
    first = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
    first.prepare(_run(claim=1))
    first(*_events([("a", 0)]))
    first.close()
    stuck, thread, carry_on, outcome = _pausing_sink(pg_database, claim=2)
    try:
        # Pipelined: the transaction holds the balance row of "a" and is never idle.
        assert _sessions(pg_database, 2) == [("active",)]
        taker = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
        taker.prepare(_run(claim=3))  # ends run 2's session before any call
        assert _sessions(pg_database, 2) == []
        began = time.monotonic()
        taker(*_events([("a", 1), ("a", 2), ("a", 3)]))
        assert time.monotonic() - began < 5  # it did not wait for the fenced run's locks
        taker.close()
    finally:
        carry_on.set()
        thread.join()
    stuck.close()
    # The fenced run's transaction was rolled back: its effects are not applied.
    assert len(outcome) == 1
    with psycopg.connect(pg_database) as db:
        assert db.execute("SELECT seq FROM ledger ORDER BY id").fetchall() == [(0,), (1,), (2,), (3,)]


def test_postgres_a_run_never_ends_the_sessions_of_a_newer_run_or_another_checkpoint(pg_database):
    stuck, thread, carry_on, outcome = _pausing_sink(pg_database, claim=5)
    try:
        older = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
        older.prepare(_run(claim=4))
        other = SqlSink(PostgresConnect(pg_database), LedgerApply("%s"))
        other.prepare(RunContext("/tmp/other", "0" * 32, "user", "seq", Policy.PER_KEY, 30.0, None, 9))
        assert _sessions(pg_database, 5) == [("active",)]
    finally:
        carry_on.set()
        thread.join()
    stuck.close()
    assert outcome == []


def test_postgres_without_the_right_to_end_a_session_the_run_warns_and_goes_on(pg_database, caplog):
    with psycopg.connect(pg_database, autocommit=True) as db:
        db.execute("DROP ROLE IF EXISTS segack_other")
        db.execute("CREATE ROLE segack_other LOGIN")
        db.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO segack_other")
        db.execute("GRANT CREATE ON SCHEMA public TO segack_other")
    stuck, thread, carry_on, outcome = _pausing_sink(pg_database, claim=1)
    try:
        taker = SqlSink(PostgresConnect(pg_database.replace("user=postgres", "user=segack_other")),
                        LedgerApply("%s"))
        with caplog.at_level(logging.WARNING, logger="segack.sinks"):
            taker.prepare(_run(claim=2))
        [warning] = [record.getMessage() for record in caplog.records]
        assert warning.startswith("SqlSink could not end the sessions of a run this one took the checkpoint "
                                  "over from (session "), warning
        assert "if that run was paused in a transaction, this one waits for its locks" in warning
        assert _sessions(pg_database, 1) == [("active",)]
    finally:
        carry_on.set()
        thread.join()
    stuck.close()
    assert outcome == []


def test_the_demos_apply_is_strict_and_its_sink_skips_what_it_applied(tmp_path, monkeypatch):
    from segack import demo

    monkeypatch.setenv(demo.DB_ENV, str(tmp_path / "users.db"))
    events = [{"user": "u", "seq": seq, "part": part} for seq, part in enumerate(["registered", "verified"])]
    connection = demo.connect_database()
    cursor = connection.cursor()
    demo.apply_part(cursor, events[0])
    with pytest.raises(demo.OrderViolationError, match="event 0 arrived after event 0"):
        demo.apply_part(cursor, events[0])
    connection.rollback()
    with pytest.raises(demo.OrderViolationError, match="event 1 arrived after event -1"):
        demo.apply_part(cursor, events[1])
    connection.close()
    sink = pickle.loads(pickle.dumps(demo.sink))
    sink.prepare(_run())
    identities = [EventIdentity("u", 0, seq, CHECKPOINT_ID) for seq in range(2)]
    sink(events[:1], identities[:1])
    sink(events, identities)  # the first again: skipped, or apply_part would raise
    sink.close()
    assert demo.read_users(str(tmp_path / "users.db")) == [("u", 1, "registered,verified")]
