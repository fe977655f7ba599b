"""SQL databases: :class:`SqlSink`, which records each key's last applied position in a table of
the database its effects go to, in the same transaction."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from segack.errors import SegackTypeError, SegackValueError
from segack.sinks.arguments import check_apply, check_preferred_batch_size, refuse_unordered
from segack.sinks.key_text import key_text
from segack.spark_adapter.errors import SinkError, one_line
from segack.spark_adapter.handlers import EventIdentity, RunContext, Sink
from segack.spark_adapter.store.crash_points import durable_write

__all__ = ["SESSION_PREFIX", "SqlSink"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,29}")
# Keys per SELECT: well below every database's limit on parameters in one statement.
_KEYS_PER_QUERY = 500
#: How a sink's PostgreSQL sessions are named: this, the checkpoint's id, ``:`` and the run's claim
#: number (``application_name``, 63 bytes at most: 7 + 32 + 1 + up to 12 digits).
SESSION_PREFIX = "segack:"
#: How long ending a fenced run's session waits for it to be gone (PostgreSQL 14 and later).
TERMINATE_WAIT_MS = 5000


def _placeholders(paramstyle: str, count: int) -> list[str]:
    """The markers for ``count`` positional parameters in ``paramstyle`` (PEP 249)."""
    if paramstyle == "qmark":
        return ["?"] * count
    if paramstyle in ("format", "pyformat"):
        return ["%s"] * count
    if paramstyle == "numeric":
        return [f":{number}" for number in range(1, count + 1)]
    raise SinkError(f"SqlSink cannot write parameters in paramstyle {paramstyle!r}; "
                    f"it knows qmark, format, pyformat and numeric")


#: Between the keys' texts of a call's record (ASCII's unit separator, which no key's text holds).
_SEPARATOR = "\x1f"


class _Dialect:
    """What differs between the databases a connection may belong to: how a call reads (and
    locks) its keys' positions and records the new ones. This generic form uses only what every
    DB-API 2 driver has: ``IN`` lists and ``executemany``."""

    def __init__(self, connection: Any) -> None:
        self.driver = type(connection).__module__.split(".")[0]
        module = sys.modules.get(self.driver)
        self.paramstyle: str = getattr(module, "paramstyle", "qmark")
        _placeholders(self.paramstyle, 1)
        self.sqlite = self.driver == "sqlite3"
        self.postgres = self.driver in ("psycopg", "psycopg2")

    @staticmethod
    def of(connection: Any) -> _Dialect:
        """The dialect of ``connection``'s driver."""
        dialect = _Dialect(connection)
        return _Postgres(connection) if dialect.postgres else dialect

    def begin(self, cursor: Any) -> None:
        """Start the call's transaction; SQLite takes the database's write lock at once, so that two
        runs never both read a position and then both write."""
        if self.sqlite:
            cursor.execute("BEGIN IMMEDIATE")

    def positions(self, cursor: Any, table: str, keys: Sequence[str]) -> dict[str, int]:
        """The recorded position of each of ``keys`` that has one, its row locked till the commit."""
        lock = "" if self.sqlite else " FOR UPDATE"
        found: dict[str, int] = {}
        for start in range(0, len(keys), _KEYS_PER_QUERY):
            chunk = keys[start:start + _KEYS_PER_QUERY]
            marks = ", ".join(_placeholders(self.paramstyle, len(chunk)))
            cursor.execute(f"SELECT key_json, last_position FROM {table} WHERE key_json IN ({marks})"
                           f" ORDER BY key_json{lock}", chunk)
            found.update((key, int(position)) for key, position in cursor.fetchall())
        return found

    def record(self, cursor: Any, table: str, moved: dict[str, int], added: dict[str, int]) -> None:
        """Record new positions: ``moved`` keys have a row, ``added`` ones get one (a run racing to
        add the same key fails on the primary key, and its transaction rolls back)."""
        first, second = _placeholders(self.paramstyle, 2)
        if moved:
            cursor.executemany(f"UPDATE {table} SET last_position = {first} WHERE key_json = {second}",
                               [(position, key) for key, position in moved.items()])
        if added:
            cursor.executemany(f"INSERT INTO {table} (key_json, last_position) VALUES ({first}, {second})",
                               list(added.items()))


class _Postgres(_Dialect):
    """PostgreSQL: each step in one statement, the keys and positions passed as arrays; and first,
    optimistically, no positions read at all (:meth:`record_fresh`)."""

    def record_fresh(self, connection: Any, table: str, firsts: dict[str, int],
                     lasts: dict[str, int]) -> Callable[[], bool]:
        """Send the statement that records each key's ``lasts`` position if none of its events
        from ``firsts`` on was applied (its row is below, or missing), without waiting for its
        answer: in a pipeline it goes with the effects. Returns what says, once it ran, whether
        every key was fresh; if not, the caller rolls back. The update locks the rows it moves and
        checks them again once a racing run commits; the insert adds the keys the update did not
        move, and leaves one that has a row (a stale key, or one a racing run added: it waits for
        that run's commit)."""
        cursor = connection.cursor()
        # Each array as one text, split by the server: drivers turn a list into an array element by
        # element in Python, several times the cost. No key's text holds the separator (a control
        # character, which JSON escapes), nor a position's.
        cursor.execute(
            f"WITH new AS (SELECT * FROM unnest(string_to_array(%s, chr({ord(_SEPARATOR)})), "
            f"string_to_array(%s, ',')::bigint[], string_to_array(%s, ',')::bigint[]) "
            f"AS new(key, first, last)), "
            f"moved AS (UPDATE {table} SET last_position = new.last FROM new "
            f"WHERE {table}.key_json = new.key AND {table}.last_position < new.first "
            f"RETURNING {table}.key_json), "
            f"added AS (INSERT INTO {table} (key_json, last_position) SELECT new.key, new.last FROM new "
            f"WHERE NOT EXISTS (SELECT FROM moved WHERE moved.key_json = new.key) "
            f"ON CONFLICT (key_json) DO NOTHING RETURNING key_json) "
            f"SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM added)",
            (_SEPARATOR.join(lasts), ",".join([str(firsts[key]) for key in lasts]),
             ",".join(map(str, lasts.values()))))
        # A key is moved or added, or neither: some of its events were applied already.
        return lambda: cursor.fetchone()[0] == len(lasts)

    @staticmethod
    def start_session(cursor: Any, name: str | None, idle_timeout: float | None) -> None:
        """Name the session (``application_name``, so that a later run can find it) and bound
        how long it may sit idle inside a transaction."""
        if name is not None:
            cursor.execute("SELECT set_config('application_name', %s, false)", (name,))
        if idle_timeout is not None:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {max(1, int(idle_timeout * 1000))}")

    @staticmethod
    def end_older_sessions(cursor: Any, checkpoint_id: str, claim: int) -> tuple[list[int], list[str]]:
        """End the sessions of this checkpoint's runs whose claim is older than ``claim``: they
        were fenced, and one paused in a transaction would hold its row locks (a pipelined one is
        not idle, so no timeout ends it). Returns the sessions ended, and why others could not be
        (``pg_terminate_backend`` needs the same role, or ``pg_signal_backend``)."""
        prefix = f"{SESSION_PREFIX}{checkpoint_id}:"
        cursor.execute("SELECT pid, application_name FROM pg_stat_activity "
                       "WHERE starts_with(application_name, %s) AND pid <> pg_backend_pid()", (prefix,))
        # PostgreSQL 14 and later wait for the session to be gone (its locks released), not only
        # for the signal to be sent: the run's tasks start after.
        waits = getattr(cursor.connection.info, "server_version", 0) >= 140000
        wait = f", {TERMINATE_WAIT_MS}" if waits else ""
        ended, refused = [], []
        for pid, name in cursor.fetchall():
            number = name[len(prefix):]
            if not number.isdigit() or int(number) >= claim:
                continue
            try:
                cursor.execute(f"SELECT pg_terminate_backend(%s{wait})", (pid,))
                if cursor.fetchone()[0]:
                    ended.append(pid)
            except Exception as error:
                cursor.connection.rollback()
                refused.append(f"session {pid}: {one_line(error)}")
        return ended, refused

    def positions(self, cursor: Any, table: str, keys: Sequence[str]) -> dict[str, int]:
        cursor.execute(f"SELECT key_json, last_position FROM {table} WHERE key_json = ANY(%s) "
                       f"ORDER BY key_json FOR UPDATE", (list(keys),))
        return {key: int(position) for key, position in cursor.fetchall()}

    def record(self, cursor: Any, table: str, moved: dict[str, int], added: dict[str, int]) -> None:
        if moved:
            cursor.execute(f"UPDATE {table} SET last_position = new.position "
                           f"FROM unnest(%s::text[], %s::bigint[]) AS new(key, position) "
                           f"WHERE {table}.key_json = new.key", (list(moved), list(moved.values())))
        if added:
            cursor.execute(f"INSERT INTO {table} (key_json, last_position) "
                           f"SELECT * FROM unnest(%s::text[], %s::bigint[])",
                           (list(added), list(added.values())))


class SqlSink(Sink):
    """A handler that applies each event's effects to a SQL database exactly once, in order.

    Each call (one event, or a list of up to ``batch_size``) is one transaction: it reads the
    position of the last event applied of each of its keys (locking those rows), calls ``apply``
    for the events past it, records the new positions, and commits. An event at or below its key's
    recorded position was applied by some earlier run: it is skipped. A call that raises rolls
    back, and the run retries it or sets it aside as ``retries`` and ``on_error`` say. On
    PostgreSQL a call first applies every event and checks the positions as it records them,
    reading them first only when that finds some applied already.

    Parameters
    ----------
    connect : callable
        Returns a new DB-API 2 connection, not in autocommit mode: ``lambda:
        psycopg.connect(dsn)``, ``lambda: sqlite3.connect(path, check_same_thread=False)`` (the task
        closes it from its own thread). Each task thread opens one and reuses it; a connection
        that fails is dropped and the next call opens another.
    apply : callable, optional
        ``apply(cursor, event)`` performs one event's effects with ``cursor``, and must not commit.
    apply_many : callable, optional
        ``apply_many(cursor, events)``: the same for a list of events (for ``executemany``), each
        key's in order. Give ``apply`` or ``apply_many``, not both.
    table : str
        The start of the name of the table that records the positions: the sink adds the
        checkpoint's id, so that runs of several checkpoints can share a database. It makes the
        table if it is missing. At most 30 letters, digits and underscores.
    pipeline : bool or None, default ``None``
        Run ``apply`` in psycopg 3's pipeline mode: its statements go to the server without waiting
        for each one's answer, several times faster for an ``apply`` that executes per event.
        ``None``: on with psycopg 3 connections, off with others; ``True`` refuses a run whose
        connection is not psycopg 3's. A pipelined transaction is never idle, so no timeout ends
        one whose run was paused in the middle of a list; the run that takes the checkpoint over
        ends it instead (see the notes).
    preferred_batch_size : int or None, default ``5000``
        The events per call (one transaction) when the run sets no ``batch_size``: a transaction's
        commit costs as much as many events' statements, so one event per call is several times
        slower; and a key with several events in a call has its position recorded once, so larger
        calls record fewer rows per event. ``None``: one event per call unless the run says
        otherwise.

    Raises
    ------
    SegackTypeError
        ``connect`` or ``apply`` is not callable.
    SegackValueError
        Both or neither of ``apply`` and ``apply_many``, ``table`` not a plain name, or
        ``preferred_batch_size`` not a positive int or None.

    Notes
    -----
    A run can refuse a sink before handling any event (:class:`~segack.spark_adapter.SinkError`):
    when ``connect`` fails, when the table cannot be made, or under ``policy="concurrent"`` (a key's
    events could then be applied out of order, and its recorded position would skip some).

    On PostgreSQL a run's sessions are named ``segack:CHECKPOINT_ID:CLAIM`` (``application_name``,
    replacing any the connection set), and when a run takes a checkpoint over, its sink ends the
    sessions of the runs it fenced (``pg_terminate_backend``) before any of its tasks starts: a run
    paused in the middle of a transaction would otherwise hold its row locks, and the new run would
    wait for them. Their transactions roll back, so nothing a fenced run had not committed is
    applied. Ending another session needs the same database role (a run's sessions all use the
    role ``connect`` logs in as, so this holds unless runs log in as different roles), or
    membership in ``pg_signal_backend``; without it the sink logs a warning, and the sessions end
    when the paused run's process does, or (not pipelined) after ``idle_in_transaction_session_timeout``,
    which the sink sets to the run's claim timeout.
    """

    def __init__(self, connect: Callable[[], Any], apply: Callable[[Any, dict[str, Any]], Any] | None = None,
                 *, apply_many: Callable[[Any, list[dict[str, Any]]], Any] | None = None,
                 table: str = "segack_applied", pipeline: bool | None = None,
                 preferred_batch_size: int | None = 5000) -> None:
        if not callable(connect):
            raise SegackTypeError("SqlSink: connect must be callable (it returns a DB-API 2 connection)")
        check_apply("SqlSink", apply, apply_many)
        if not isinstance(table, str) or not _NAME.fullmatch(table):
            raise SegackValueError(f"SqlSink: table must be a plain name of at most 30 letters, digits and "
                                   f"underscores, starting with a letter or an underscore, not {table!r}")
        check_preferred_batch_size("SqlSink", preferred_batch_size)
        self.connect, self.apply, self.apply_many, self.table = connect, apply, apply_many, table
        self.preferred_batch_size = preferred_batch_size
        if pipeline is not None and not isinstance(pipeline, bool):
            raise SegackTypeError(f"SqlSink: pipeline must be True, False or None, not {pipeline!r}")
        self.pipeline = pipeline
        #: Seconds a PostgreSQL session may sit idle inside a transaction (the claim timeout).
        self.idle_timeout: float | None = None
        #: The ``application_name`` of the run's PostgreSQL sessions: ``segack:CHECKPOINT_ID:CLAIM``.
        self.session_name: str | None = None
        self._opened()

    def _opened(self) -> None:
        """Nothing opened yet: no connection in any thread."""
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Connections stay where they were opened; each task's copy opens its own.
        return {name: value for name, value in self.__dict__.items()
                if name not in ("_local", "_connections", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opened()

    def table_for(self, checkpoint_id: str) -> str:
        """The name of the table of positions for the checkpoint ``checkpoint_id``."""
        return f"{self.table}_{checkpoint_id}"

    # ------------------------------------------------------------------ the driver

    def prepare(self, run: RunContext) -> None:
        """Refuse a run the sink cannot keep exactly once; make its table of positions."""
        refuse_unordered("SqlSink", run)
        self.idle_timeout = run.claim_timeout
        self.session_name = f"{SESSION_PREFIX}{run.checkpoint_id}:{run.claim}"
        name = self.table_for(run.checkpoint_id)
        try:
            connection = self.connect()
        except Exception as error:
            raise SinkError(f"SqlSink cannot connect: {one_line(error)}") from error
        try:
            dialect = _Dialect.of(connection)
            if self.pipeline and not hasattr(connection, "pipeline"):
                raise SinkError(f"SqlSink: pipeline=True needs a psycopg 3 connection, "
                                f"not {dialect.driver}'s")
            cursor = connection.cursor()
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {name} "
                           f"(key_json TEXT PRIMARY KEY, last_position BIGINT NOT NULL)")
            with durable_write("sink-setup"):
                connection.commit()
            if isinstance(dialect, _Postgres):
                self._end_fenced_sessions(cursor, run)
        except SinkError:
            raise
        except Exception as error:
            raise SinkError(f"SqlSink cannot make its table {name}: {one_line(error)}") from error
        finally:
            with contextlib.suppress(Exception):
                connection.close()
        log.info("SqlSink records positions in %s (%s)", name, dialect.driver)

    def _end_fenced_sessions(self, cursor: Any, run: RunContext) -> None:
        """End the sessions of the runs ``run`` fenced (see the notes)."""
        ended, refused = _Postgres.end_older_sessions(cursor, run.checkpoint_id, run.claim)
        with durable_write("sink-setup"):
            cursor.connection.commit()
        if ended:
            log.info("SqlSink ended %d session(s) of runs this one took the checkpoint over from: %s",
                     len(ended), ", ".join(map(str, ended)))
        if refused:
            log.warning("SqlSink could not end the sessions of a run this one took the checkpoint over "
                        "from (%s): if that run was paused in a transaction, this one waits for its "
                        "locks until it ends", "; ".join(refused))

    # ------------------------------------------------------------------ the tasks

    def _connection(self) -> tuple[Any, _Dialect]:
        """This thread's connection, opened on first use."""
        opened: tuple[Any, _Dialect] | None = getattr(self._local, "opened", None)
        if opened is None:
            connection = self.connect()
            dialect = _Dialect.of(connection)
            if isinstance(dialect, _Postgres):
                dialect.start_session(connection.cursor(), self.session_name, self.idle_timeout)
                with durable_write("sink-setup"):
                    connection.commit()
            opened = self._local.opened = (connection, dialect)
            with self._lock:
                self._connections.append(connection)
        return opened

    def _drop(self, connection: Any) -> None:
        """Forget a connection that failed: the thread's next call opens another."""
        self._local.opened = None
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)
        with contextlib.suppress(Exception):
            connection.close()

    def __call__(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> None:
        """Apply the events not yet applied, in one transaction with their keys' new positions."""
        if not events:
            return
        connection, dialect = self._connection()
        try:
            if isinstance(dialect, _Postgres):
                try:
                    if self._all_fresh(connection, dialect, events, identities):
                        return
                    log.debug("SqlSink reads positions: some of a call's events were applied already")
                except Exception as error:
                    # apply raised on an event: the next step raises it again, or skips it.
                    log.debug("SqlSink reads positions after %s: %s", type(error).__name__, error)
                connection.rollback()
            self._transaction(connection, dialect, events, identities)
        except BaseException:
            try:
                connection.rollback()
            except Exception as error:
                log.warning("SqlSink drops a connection whose rollback failed: %s: %s",
                            type(error).__name__, error)
                self._drop(connection)
            raise

    def _transaction(self, connection: Any, dialect: _Dialect, events: list[dict[str, Any]],
                     identities: list[EventIdentity]) -> None:
        """The steps of one call, in one transaction:

        1. **Lock** the call's keys' rows of positions (SQLite: the whole database, at once).
        2. **Skip** the events at or below their key's position.
        3. **Apply** the rest, each key's in order.
        4. **Record** each key's new position (an insert for a new key: a run racing to apply the
           same key's first events fails on the primary key and rolls back).
        5. **Commit**.
        """
        table = self.table_for(identities[0].checkpoint_id)
        keys = [key_text(identity.key) for identity in identities]
        cursor = connection.cursor()
        dialect.begin(cursor)  # 1
        applied = dialect.positions(cursor, table, sorted(set(keys)))
        fresh: list[dict[str, Any]] = []  # 2
        newest: dict[str, int] = {}
        for event, identity, key in zip(events, identities, keys, strict=True):
            if identity.position > applied.get(key, -1):
                fresh.append(event)
                newest[key] = identity.position
        with self._pipeline(connection):
            self._apply(cursor, fresh)  # 3
        moved = {key: position for key, position in newest.items() if key in applied}  # 4
        dialect.record(cursor, table, moved, {key: position for key, position in newest.items()
                                              if key not in applied})
        with durable_write("sink-commit"):
            connection.commit()  # 5

    def _all_fresh(self, connection: Any, dialect: _Postgres, events: list[dict[str, Any]],
                   identities: list[EventIdentity]) -> bool:
        """The call when none of its events was applied, as after any crash all but a few calls
        are: :meth:`_transaction` without steps 1 and 2, step 4 checking what they would have read,
        sent in the pipeline that applies the events. Commits and returns ``True``, or returns
        ``False`` (uncommitted) if some key's events were applied already."""
        firsts: dict[str, int] = {}
        lasts: dict[str, int] = {}
        for identity in identities:
            key = key_text(identity.key)
            firsts.setdefault(key, identity.position)
            lasts[key] = identity.position
        with self._pipeline(connection):
            self._apply(connection.cursor(), events)  # 3
            fresh = dialect.record_fresh(connection, self.table_for(identities[0].checkpoint_id),
                                         firsts, lasts)  # 4
        if not fresh():
            return False
        with durable_write("sink-commit"):
            connection.commit()  # 5
        return True

    def _pipeline(self, connection: Any) -> contextlib.AbstractContextManager[Any]:
        """psycopg 3's pipeline mode if ``pipeline`` says so (see the parameter); it ends, and
        raises what its statements raised, when the block does."""
        pipelined = self.pipeline if self.pipeline is not None else hasattr(connection, "pipeline")
        return connection.pipeline() if pipelined else contextlib.nullcontext()

    def _apply(self, cursor: Any, events: list[dict[str, Any]]) -> None:
        """Step 3: ``apply_many`` once, or ``apply`` per event."""
        if not events:
            return
        if self.apply_many is not None:
            self.apply_many(cursor, events)
        else:
            apply = self.apply
            assert apply is not None
            for event in events:
                apply(cursor, event)

    def close(self) -> None:
        """Close every connection this copy of the sink opened."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.close()
            except Exception as error:
                log.warning("SqlSink could not close a connection: %s: %s", type(error).__name__, error)
        self._local = threading.local()
