"""Replay handlers for the Spark tests; importable by Spark's Python workers."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import threading
import time
from typing import Any

from segack.spark_adapter.handlers import Sink as _Sink
from segack.spark_adapter.handlers import takes_unorderable as _takes_unorderable
from segack.spark_adapter.sources.kafka import takes_unparsed as _takes_unparsed

LOG_ENV = "SEGACK_TEST_LOG"


class Recorder:
    """Appends each event it handles to a JSON-lines file; raises on ``fail_on`` (a key, order pair)."""

    def __init__(self, path: str, fail_on: tuple[Any, Any] | None = None) -> None:
        self.path = path
        self.fail_on = fail_on

    def __call__(self, event: dict[str, Any]) -> None:
        if self.fail_on is not None and (event["user"], event["seq"]) == self.fail_on:
            raise ValueError("the handler refuses this event")
        line = json.dumps({"user": event["user"], "seq": event["seq"], "pid": os.getpid()})
        with open(self.path, "a") as log:
            log.write(line + "\n")


def _plain(value: Any) -> str:
    # The same instant reaches Python in the session's time zone or in UTC, depending on the path.
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).isoformat()
    return str(value)


def event_line(event: dict[str, Any]) -> str:
    """An event as one comparable line: its values by column name, as JSON (NaN and all)."""
    return json.dumps([event[name] for name in sorted(event)], default=_plain)


class LineRecorder:
    """Appends :func:`event_line` of each event it handles; raises on an event whose line is ``fail_on``."""

    def __init__(self, path: str, fail_on: str | None = None) -> None:
        self.path = path
        self.fail_on = fail_on

    def __call__(self, event: dict[str, Any]) -> None:
        line = event_line(event)
        if line == self.fail_on:
            raise ValueError("the handler refuses this event")
        with open(self.path, "a") as log:
            log.write(line + "\n")


class SlowOn:
    """Does nothing, slowly for one key: ``seconds`` per event of ``key``."""

    def __init__(self, key: Any, seconds: float) -> None:
        self.key = key
        self.seconds = seconds

    def __call__(self, event: dict[str, Any]) -> None:
        if event["user"] == self.key:
            time.sleep(self.seconds)


class TimedRecorder:
    """Sleeps ``seconds`` per event, then logs it with when it started and ended, its process and
    thread; raises on ``fail_on`` (a key, seq pair) instead."""

    def __init__(self, path: str, seconds: float, fail_on: tuple[Any, Any] | None = None) -> None:
        self.path = path
        self.seconds = seconds
        self.fail_on = fail_on

    def __call__(self, event: dict[str, Any]) -> None:
        started = time.monotonic()
        time.sleep(self.seconds)
        if self.fail_on is not None and (event["user"], event["seq"]) == self.fail_on:
            raise ValueError("the handler refuses this event")
        line = json.dumps({"user": event["user"], "seq": event["seq"], "pid": os.getpid(),
                           "thread": threading.get_ident(), "start": started, "end": time.monotonic()})
        with open(self.path, "a") as log:
            log.write(line + "\n")


class AsyncTimedRecorder(TimedRecorder):
    """:class:`TimedRecorder` as an ``async def`` handler: it awaits instead of sleeping."""

    async def __call__(self, event: dict[str, Any]) -> None:  # type: ignore[override]
        started = time.monotonic()
        await asyncio.sleep(self.seconds)
        line = json.dumps({"user": event["user"], "seq": event["seq"], "pid": os.getpid(),
                           "thread": threading.get_ident(), "start": started, "end": time.monotonic()})
        with open(self.path, "a") as log:
            log.write(line + "\n")


class RefusesSome(Recorder):
    """A :class:`Recorder` that raises on each (user, seq) pair in ``refused``, every time."""

    def __init__(self, path: str, refused: frozenset[tuple[Any, Any]]) -> None:
        super().__init__(path)
        self.refused = refused

    def __call__(self, event: dict[str, Any]) -> None:
        if (event["user"], event["seq"]) in self.refused:
            raise ValueError(f"part {event['seq']} of {event['user']} is refused")
        super().__call__(event)


class FailsFirstTime(Recorder):
    """A :class:`Recorder` whose first call for ``event_key`` (a user, seq pair) raises; the marker
    file ``path + ".failed"`` remembers, across threads and attempts, that it did."""

    def __init__(self, path: str, event_key: tuple[Any, Any]) -> None:
        super().__init__(path)
        self.event_key = event_key

    def __call__(self, event: dict[str, Any]) -> None:
        marker = self.path + ".failed"
        if (event["user"], event["seq"]) == self.event_key and not os.path.exists(marker):
            with open(marker, "w"):
                pass
            raise ConnectionError("the service is not there yet")
        super().__call__(event)


class ListRecorder:
    """A batch handler: logs each list it is called with as one line (its events' user and seq,
    its process, when the call started and ended), after sleeping ``seconds``; raises, writing
    nothing, on a list that holds a (user, seq) pair of ``refused``."""

    def __init__(self, path: str, seconds: float = 0.0,
                 refused: frozenset[tuple[Any, Any]] = frozenset()) -> None:
        self.path = path
        self.seconds = seconds
        self.refused = refused

    def _line(self, events: list[dict[str, Any]], started: float) -> str:
        pairs = [(event["user"], event["seq"]) for event in events]
        bad = [pair for pair in pairs if pair in self.refused]
        if bad:
            raise ValueError(f"part {bad[0][1]} of {bad[0][0]} is refused")
        return json.dumps({"events": pairs, "pid": os.getpid(), "start": started, "end": time.monotonic()})

    def __call__(self, events: list[dict[str, Any]]) -> None:
        started = time.monotonic()
        time.sleep(self.seconds)
        line = self._line(events, started)
        with open(self.path, "a") as log:
            log.write(line + "\n")


class AsyncListRecorder(ListRecorder):
    """:class:`ListRecorder` as an ``async def`` handler: it awaits instead of sleeping."""

    async def __call__(self, events: list[dict[str, Any]]) -> None:  # type: ignore[override]
        started = time.monotonic()
        await asyncio.sleep(self.seconds)
        line = self._line(events, started)
        with open(self.path, "a") as log:
            log.write(line + "\n")


def read_lines(path: str) -> list[str]:
    """The complete lines a :class:`LineRecorder` wrote."""
    if not os.path.exists(path):
        return []
    with open(path) as log:
        return log.read().split("\n")[:-1]


def discard(event: dict[str, Any]) -> None:
    """Does nothing: for tests of what surrounds the handler."""


def record_event(event: dict[str, Any]) -> None:
    """Log the whole event, whatever its columns (path from the environment)."""
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(json.dumps(event, default=_plain) + "\n")


def record_slowly(event: dict[str, Any]) -> None:
    """The kill test's handler: log the event (path from the environment), then pause a little."""
    line = json.dumps({"user": event["user"], "seq": event["seq"], "run": os.environ.get("SEGACK_TEST_RUN")})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")
    time.sleep(0.0005)


def fail_on_tenth(event: dict[str, Any]) -> None:
    """Refuses the tenth event of user u1, to test the failure message."""
    if event["user"] == "u1" and event["seq"] == 10:
        raise RuntimeError("cannot apply this part")


def record_when(event: dict[str, Any]) -> None:
    """The claim tests' handler: log the event with its run (from the environment) and the time,
    then pause a little."""
    line = json.dumps({"user": event["user"], "seq": event["seq"], "run": os.environ.get("SEGACK_TEST_RUN"),
                       "at": time.time()})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")
    time.sleep(0.002)


def record_with_task(event: dict[str, Any]) -> None:
    """The rescale tests' handler: log the event with the run (``SEGACK_TEST_RUN``: stage ids
    start again in each application), the Spark stage and partition that handled it, then pause a
    little."""
    from pyspark import TaskContext

    context = TaskContext.get()
    line = json.dumps({"user": event["user"], "seq": event["seq"], "at": time.time(),
                       "run": os.environ.get("SEGACK_TEST_RUN"),
                       "stage": context.stageId() if context else None,
                       "partition": context.partitionId() if context else None})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")
    time.sleep(0.002)


#: Names the users (comma-separated) whose tenth event :func:`record_with_task_refusing_tenth` refuses.
REFUSED_ENV = "SEGACK_TEST_REFUSED"


def record_with_task_refusing_tenth(event: dict[str, Any]) -> None:
    """:func:`record_with_task`, refusing the tenth event of each user :data:`REFUSED_ENV` names (the
    page's test follows a run with dead letters)."""
    if event["seq"] == 10 and event["user"] in os.environ.get(REFUSED_ENV, "").split(","):
        raise RuntimeError(f"cannot apply the tenth event of {event['user']}")
    record_with_task(event)


class ScalesOnce(Recorder):
    """A :class:`Recorder` whose first call, in whichever worker makes it, asks for a new
    segment count on ``checkpoint`` (while the batch holds its claim: a request)."""

    def __init__(self, path: str, checkpoint: str, segments: int) -> None:
        super().__init__(path)
        self.checkpoint, self.segments = checkpoint, segments

    def __call__(self, event: dict[str, Any]) -> None:
        from segack.spark_adapter import scale

        try:
            with open(self.path + ".asked", "x"):
                pass
        except FileExistsError:
            pass
        else:
            scale(self.checkpoint, self.segments)
        super().__call__(event)


def record_kafka(event: dict[str, Any]) -> None:
    """``--handler tests.spark_handlers:record_kafka``: a Kafka record's key, user, seq, topic,
    partition and offset, and the run (``SEGACK_TEST_RUN``), appended to the file :data:`LOG_ENV`
    names."""
    line = json.dumps({"key": event["key"], "user": event["user"], "seq": event["seq"],
                       "topic": event["topic"], "partition": event["partition"], "offset": event["offset"],
                       "run": os.environ.get("SEGACK_TEST_RUN", "")})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")


def record_kafka_headers(event: dict[str, Any]) -> None:
    """:func:`record_kafka`'s fields and the record's ``headers`` (their values in hex), raising for
    the user ``bad``."""
    if event["user"] == "bad":
        raise ValueError("bad user")
    headers = event["headers"]
    line = json.dumps({"user": event["user"], "seq": event["seq"], "headers": None if headers is None else [
        [header["key"], None if header["value"] is None else header["value"].hex()] for header in headers]})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")


#: The seconds :func:`record_kafka_holding` takes for the record whose key is ``slow``.
SLOW_ENV = "SEGACK_TEST_SLOW_SECONDS"


def record_kafka_holding(event: dict[str, Any]) -> None:
    """:func:`record_kafka`, after :data:`SLOW_ENV` seconds for the record whose key is ``slow``: a
    call that holds its partition's committed offset back while later records go on."""
    if event["key"] == "slow":
        time.sleep(float(os.environ.get(SLOW_ENV, "0")))
    record_kafka(event)


def record_kafka_in_flight(event: dict[str, Any]) -> None:
    """:func:`record_kafka`, with a line when the call starts (``"started": true``) and 20 ms
    between the two: a call cut off in the middle leaves its start without its end."""
    with open(os.environ[LOG_ENV] + ".started", "a") as log:
        log.write(json.dumps({"user": event["user"], "seq": event["seq"]}) + "\n")
    time.sleep(0.02)
    record_kafka(event)


def record_kafka_slowly(event: dict[str, Any]) -> None:
    """:func:`record_kafka`, a millisecond each: a stream of a few thousand records takes seconds."""
    time.sleep(0.001)
    record_kafka(event)


def _record_kafka_unparsed(event: dict[str, Any]) -> None:
    """:func:`record_kafka`, taking records whose value did not parse (their ``seq`` null)."""
    record_kafka(event)


#: ``--handler tests.spark_handlers:record_kafka_unparsed``: the fixed handler of a dead letter.
record_kafka_unparsed = _takes_unparsed(_record_kafka_unparsed)


def _record_kafka_any(event: dict[str, Any]) -> None:
    """:func:`record_kafka`, taking records whose value did not parse and records with no key or
    no order."""
    record_kafka(event)


#: ``--handler tests.spark_handlers:record_kafka_any``.
record_kafka_any = _takes_unorderable(_takes_unparsed(_record_kafka_any))


def record_refusing_tenth_until_fixed(event: dict[str, Any]) -> None:
    """Refuses the tenth event of user u1 unless the run is called "fixed"; logs every other event."""
    if event["user"] == "u1" and event["seq"] == 10 and os.environ.get("SEGACK_TEST_RUN") != "fixed":
        raise RuntimeError("cannot apply this part yet")
    line = json.dumps({"user": event["user"], "seq": event["seq"], "run": os.environ.get("SEGACK_TEST_RUN")})
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(line + "\n")


def refusing_tenth_dying_once(event: dict[str, Any]) -> None:
    """:func:`record_refusing_tenth_until_fixed`; and on u2's 40th event, the first time (a marker
    beside the log), 1.5 s (the task saves meanwhile), then its Python worker's own SIGKILL: Spark
    runs the task again."""
    if event["user"] == "u2" and event["seq"] == 40:
        marker = os.environ[LOG_ENV] + ".died"
        if not os.path.exists(marker):
            with open(marker, "w"):
                pass
            time.sleep(1.5)
            os.kill(os.getpid(), signal.SIGKILL)
    record_refusing_tenth_until_fixed(event)


def slow_refusing_tenth(event: dict[str, Any]) -> None:
    """Refuses the tenth event of user u1; pauses a few milliseconds on every other (the metrics
    test scrapes a run under way)."""
    if event["user"] == "u1" and event["seq"] == 10:
        raise RuntimeError("cannot apply this part")
    time.sleep(0.004)


def read_log(path: str) -> list[dict[str, Any]]:
    """The complete lines of a handler log (a line cut by a kill is not an event handled)."""
    if not os.path.exists(path):
        return []
    with open(path) as log:
        text = log.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


class SqliteConnect:
    """``connect`` for a SqlSink on the SQLite file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> Any:
        import sqlite3

        return sqlite3.connect(self.path, timeout=60, check_same_thread=False)


#: The environment variable that names the tests' PostgreSQL database to commands they start.
DSN_ENV = "SEGACK_TEST_DSN"


class PostgresConnect:
    """``connect`` for a SqlSink on the PostgreSQL server ``dsn`` (else the one :data:`DSN_ENV` names)."""

    def __init__(self, dsn: str | None = None) -> None:
        self.dsn = dsn

    def __call__(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn or os.environ[DSN_ENV])


#: The ledger and the balances: a row per event, and a fold of each key's amounts that depends on
#: their order. Neither is idempotent.
_BALANCES = "CREATE TABLE balances (user_id TEXT PRIMARY KEY, balance BIGINT NOT NULL)"
SQLITE_LEDGER = ("CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL, "
                 "seq BIGINT NOT NULL)", _BALANCES)
POSTGRES_LEDGER = ("CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, user_id TEXT NOT NULL, "
                   "seq BIGINT NOT NULL)", _BALANCES)


def fold(balance: int, seq: int) -> int:
    """One step of a balance: what :class:`LedgerApply` adds for event ``seq`` of a key."""
    return (balance * 31 + seq + 1) % 1_000_003


class LedgerApply:
    """``apply`` for a SqlSink: the event's ledger row, and its step of its key's balance. ``mark``
    is the driver's parameter marker (``?`` for SQLite, ``%s`` for psycopg); ``fail_on`` a
    ``(user, seq)`` whose apply raises."""

    def __init__(self, mark: str, fail_on: tuple[str, int] | None = None) -> None:
        self.mark = mark
        self.fail_on = fail_on

    def __call__(self, cursor: Any, event: dict[str, Any]) -> None:
        if self.fail_on is not None and (event["user"], event["seq"]) == self.fail_on:
            raise ValueError("the sink's apply refuses this event")
        m = self.mark
        modulo = "%%" if m == "%s" else "%"
        cursor.execute(f"INSERT INTO ledger (user_id, seq) VALUES ({m}, {m})", (event["user"], event["seq"]))
        cursor.execute(f"INSERT INTO balances (user_id, balance) VALUES ({m}, {m}) "
                       f"ON CONFLICT (user_id) DO UPDATE "
                       f"SET balance = (balances.balance * 31 + excluded.balance) {modulo} 1000003",
                       (event["user"], event["seq"] + 1))


class SlowLedgerApply(LedgerApply):
    """:class:`LedgerApply`, taking ``seconds`` more per event (a kill lands in the middle of a run)."""

    def __init__(self, mark: str, seconds: float) -> None:
        super().__init__(mark)
        self.seconds = seconds

    def __call__(self, cursor: Any, event: dict[str, Any]) -> None:
        time.sleep(self.seconds)
        super().__call__(cursor, event)


class ChangeApply:
    """``apply`` for a SqlSink over a Delta change feed: a row per change, in table ``changes``."""

    def __call__(self, cursor: Any, event: dict[str, Any]) -> None:
        cursor.execute("INSERT INTO changes (account, version, kind) VALUES (%s, %s, %s)",
                       (event["account"], event["_commit_version"], event["_change_type"]))


def _changes_sink() -> Any:
    from segack.sinks import SqlSink

    return SqlSink(PostgresConnect(), ChangeApply())


#: ``--handler tests.spark_handlers:changes_sink``: each change once, on the database :data:`DSN_ENV` names.
changes_sink = _changes_sink()


def _ledger_sink() -> Any:
    from segack.sinks import SqlSink

    return SqlSink(PostgresConnect(), SlowLedgerApply("%s", 0.0005))


#: ``--handler tests.spark_handlers:ledger_sink``: the ledger on the database :data:`DSN_ENV` names.
ledger_sink = _ledger_sink()


class RefusingLedgerApply(LedgerApply):
    """:class:`LedgerApply` refusing ``refused`` (a ``(user, seq)``) unless the run (``SEGACK_TEST_RUN``)
    is called "fixed": a key's event that fails, then its cause fixed."""

    def __init__(self, mark: str, refused: tuple[str, int]) -> None:
        super().__init__(mark)
        self.refused = refused

    def __call__(self, cursor: Any, event: dict[str, Any]) -> None:
        if (event["user"], event["seq"]) == self.refused and os.environ.get("SEGACK_TEST_RUN") != "fixed":
            raise ValueError("the ledger refuses this event until it is fixed")
        super().__call__(cursor, event)


def _faults_sink() -> Any:
    from segack.sinks import SqlSink

    return SqlSink(PostgresConnect(), RefusingLedgerApply("%s", ("user-3", 5)))


#: ``--handler tests.spark_handlers:faults_sink``: the ledger, refusing user-3's event 5 until fixed.
faults_sink = _faults_sink()


#: The environment variables that name the tests' Kafka broker (``HOST:PORT``) and the input topic
#: to commands they start: a :class:`KafkaLedgerApply` sink writes to topics named after it.
KAFKA_ENV = "SEGACK_TEST_KAFKA"
KAFKA_TOPIC_ENV = "SEGACK_TEST_KAFKA_TOPIC"
#: The seconds a :class:`KafkaLedgerApply` takes per event, if set: a pause then lands in a call.
KAFKA_APPLY_SECONDS_ENV = "SEGACK_TEST_KAFKA_APPLY_SECONDS"
#: The start of the names of the topics a :class:`KafkaLedgerApply` writes, if not the input topic's.
KAFKA_OUTPUT_ENV = "SEGACK_TEST_KAFKA_OUTPUT"
#: A file of the stream's ``kafka.*`` options (JSON), if set: the ledger sink reaches its cluster as
#: the stream does (``KafkaSink(cluster=...)``), in place of :data:`KAFKA_ENV`'s plaintext broker.
KAFKA_CLUSTER_ENV = "SEGACK_TEST_KAFKA_CLUSTER"


def kafka_ledger_topics(topic: str) -> tuple[str, str]:
    """The ledger and balances topics a :class:`KafkaLedgerApply` of input ``topic`` writes."""
    return f"{topic}-ledger", f"{topic}-balances"


class KafkaLedgerApply:
    """``apply`` for a KafkaSink: per account event, a ledger record (``{"user", "seq", "run"}``, the
    run the ``SEGACK_TEST_RUN`` variable names) and the
    user's balance after it (``{"user", "seq", "balance"}``, :func:`fold` over seqs 0 to ``seq``),
    each keyed by the user; ``fail_on`` a ``(user, seq)`` whose apply raises (``until_fixed``: unless
    the run is called "fixed")."""

    def __init__(self, topic: str, fail_on: tuple[str, int] | None = None, until_fixed: bool = False) -> None:
        self.ledger, self.balances = kafka_ledger_topics(topic)
        self.fail_on, self.until_fixed = fail_on, until_fixed
        self._last: dict[str, tuple[int, int]] = {}  # user -> (seq, balance), a cache of the fold

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_last": {}}

    def _balance(self, user: str, seq: int) -> int:
        start, balance = self._last.get(user, (-1, 0))
        if start >= seq:
            start, balance = -1, 0
        for step in range(start + 1, seq + 1):
            balance = fold(balance, step)
        self._last[user] = (seq, balance)
        return balance

    def __call__(self, output: Any, event: dict[str, Any]) -> None:
        user, seq = event["user"], event["seq"]
        fixed = self.until_fixed and os.environ.get("SEGACK_TEST_RUN") == "fixed"
        if self.fail_on is not None and (user, seq) == self.fail_on and not fixed:
            raise ValueError("the sink's apply refuses this event")
        time.sleep(float(os.environ.get(KAFKA_APPLY_SECONDS_ENV, "0")))
        run = os.environ.get("SEGACK_TEST_RUN")
        output.produce(self.ledger, json.dumps({"user": user, "seq": seq, "run": run}), user)
        output.produce(self.balances, json.dumps({"user": user, "seq": seq,
                                                  "balance": self._balance(user, seq)}), user)


def _kafka_ledger_sink(fail_on: tuple[str, int] | None = None) -> Any:
    from segack.sinks import KafkaSink

    named = os.environ.get(KAFKA_OUTPUT_ENV) or os.environ.get(KAFKA_TOPIC_ENV, "accounts")
    apply = KafkaLedgerApply(named, fail_on, until_fixed=True)
    cluster = os.environ.get(KAFKA_CLUSTER_ENV)
    if cluster is not None:
        with open(cluster) as file:
            return KafkaSink({"linger.ms": 5}, apply, topics=[apply.ledger, apply.balances],
                             cluster=json.load(file))
    return KafkaSink({"bootstrap.servers": os.environ.get(KAFKA_ENV, "127.0.0.1:9"), "linger.ms": 5},
                     apply, topics=[apply.ledger, apply.balances])


#: ``--handler tests.spark_handlers:kafka_ledger_sink``: the ledger and balances as Kafka topics on
#: the broker :data:`KAFKA_ENV` names, named after :data:`KAFKA_OUTPUT_ENV`, else after the input
#: topic :data:`KAFKA_TOPIC_ENV` names.
kafka_ledger_sink = _kafka_ledger_sink()
#: ``--handler tests.spark_handlers:kafka_faults_sink``: the same, refusing user-3's event 5 until fixed.
kafka_faults_sink = _kafka_ledger_sink(("user-3", 5))


class SlowToStartSink(_Sink):
    """A sink whose preparation on the driver takes ``seconds`` (a producer waiting on its
    transactions' start), and whose first call in each task as long again; it appends each event's
    partition and offset to ``log``."""

    def __init__(self, seconds: float, log: str) -> None:
        self.seconds, self.log = seconds, log
        self.called = False

    def prepare(self, run: Any) -> None:
        time.sleep(self.seconds)

    def __call__(self, events: list[dict[str, Any]], identities: list[Any]) -> None:
        if not self.called:
            self.called = True
            time.sleep(self.seconds)
        with open(self.log, "a") as log:
            for event in events:
                log.write(json.dumps({"partition": event["partition"], "offset": event["offset"]}) + "\n")
