"""Every Python example of the README and the docs, run: each block as a user copies it, in a
sandbox that gives it what its page says it has around it (a few events in ``events/``, the
``bank`` database of the README's tables on the PostgreSQL server the tests start, a handler named
``handle``, a payments service at ``URL``, a Kafka broker for the Kafka guide's), with its paths
(``/data/``, ``hdfs:///``) moved under a temporary directory. A block nobody runs fails
:func:`test_every_example_is_run`, so an example cannot rot unseen."""

from __future__ import annotations

import http.server
import json
import re
import shlex
import sqlite3
import textwrap
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
EVENTS = 60
ACCOUNTS = 7


def code_blocks(languages: str) -> list[tuple[str, str]]:
    """``(where, text)`` of every code block in one of ``languages`` (``"sh|console"``): the README's
    fenced ones, then the docs' code-blocks, dedented."""
    found = []
    readme = (ROOT / "README.md").read_text()
    for match in re.finditer(rf"^```(?:{languages})\n(.*?)^```$", readme, re.M | re.S):
        found.append((f"README.md:{readme[:match.start()].count(chr(10)) + 1}", match.group(1)))
    directive = rf"^( *)\.\. code-block:: (?:{languages})\n((?:\1   .*\n|[ \t]*\n)+)"
    for page in sorted((ROOT / "docs").glob("*.rst")):
        text = page.read_text()
        for match in re.finditer(directive, text, re.M):
            found.append((f"docs/{page.name}:{text[:match.start()].count(chr(10)) + 1}",
                          textwrap.dedent(match.group(2))))
    return found


def examples() -> list[tuple[str, str]]:
    """``(where, code)`` of every Python block, as a user copies it."""
    return [(where, code.strip() + "\n") for where, code in code_blocks("python")]


def _nothing(*_: Any) -> None:
    """A handler with nothing to do."""


class Sandbox:
    """What an example's page says it has around it, under ``root``."""

    def __init__(self, root: Path, spark: Any) -> None:
        self.root, self.spark = root, spark
        #: The ``bank`` database's connection string, once an example needs it.
        self.bank: str | None = None
        accounts = [f"acct-{number % ACCOUNTS}" for number in range(EVENTS)]
        amounts = [(number * 37) % 100 - 30 for number in range(EVENTS)]
        (root / "events").mkdir()
        pq.write_table(pa.table({"account_id": accounts, "account": accounts, "amount": amounts,
                                 "event_time": list(range(EVENTS)), "ts": list(range(EVENTS))}),
                       root / "events" / "part-0.parquet")
        self.accounts, self.amounts = accounts, amounts

    def code(self, code: str) -> str:
        """The example with its paths under the sandbox (Spark's JVM reads a relative path from the
        directory it started in, not from the sandbox)."""
        code = (code.replace("/data/", f"{self.root}/data/").replace("hdfs:///", f"file://{self.root}/")
                .replace('"events/"', f'"{self.root}/events/"'))
        # The executors' Python started before the test set libpq's variables: the server in full.
        return code if self.bank is None else code.replace('"dbname=bank"', f'"{self.bank}"')

    def run(self, code: str, **names: Any) -> dict[str, Any]:
        """Run the example as a module would, with ``names`` around it; its names after."""
        from segack.spark_adapter import replay

        # A guide's later blocks go on from its first, which imported replay and read the events.
        scope = {"__name__": "example", "handle": _nothing, "replay": replay,
                 "events": self.spark.read.parquet(str(self.root / "events")), **names}
        exec(compile(self.code(code), "example", "exec"), scope)
        return scope


@pytest.fixture
def sandbox(tmp_path, spark, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return Sandbox(tmp_path, spark)


@pytest.fixture
def bank(postgres, monkeypatch):
    """The README's ``bank`` database, reached as the examples reach it (``dbname=bank``)."""
    import psycopg

    from tests.test_readme import _blocks

    (tables,) = _blocks("sql")
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bank WITH (FORCE)")
        admin.execute("CREATE DATABASE bank")
    dsn = postgres.replace("dbname=postgres", "dbname=bank")
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(tables)
    server = dict(part.split("=", 1) for part in postgres.split())
    for name, value in (("PGHOST", server["host"]), ("PGPORT", server["port"]), ("PGUSER", server["user"])):
        monkeypatch.setenv(name, value)
    return dsn


def _bank_state(dsn: str) -> tuple[list[tuple[str, int]], dict[str, int]]:
    import psycopg

    with psycopg.connect(dsn) as db:
        return ([tuple(row) for row in db.execute("SELECT account, amount FROM ledger")],
                dict(db.execute("SELECT account, balance FROM balances").fetchall()))


def _balances(sandbox: Sandbox) -> dict[str, int]:
    totals: dict[str, int] = {}
    for account, amount in zip(sandbox.accounts, sandbox.amounts, strict=True):
        totals[account] = totals.get(account, 0) + amount
    return totals


# ----------------------------------------------------------------------------- each example

def run_readme_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    """The README's sink: ``tests/test_readme.py`` runs it through ``segack replay``; this is the block
    it picks."""
    from tests.test_readme import _blocks

    assert [block for block in _blocks("python") if "SqlSink(" in block] == [code]


def run_handler_shape(sandbox: Sandbox, code: str, request: Any) -> None:
    scope = sandbox.run(code)
    assert scope["handle"]({"account_id": "a"}) is None


def run_first_replay(sandbox: Sandbox, code: str, request: Any) -> None:
    scope = sandbox.run(code)  # it asserts result.complete itself
    assert scope["result"].total == EVENTS


def run_concurrent_replay(sandbox: Sandbox, code: str, request: Any) -> None:
    scope = sandbox.run(code, write_to_db=_nothing)
    assert scope["result"].complete and scope["result"].peak_pending >= 1


def run_list_handler(sandbox: Sandbox, code: str, request: Any) -> None:
    dsn = sandbox.bank = request.getfixturevalue("bank")
    sandbox.run(code)
    ledger, _ = _bank_state(dsn)
    assert sorted(ledger) == sorted(zip(sandbox.accounts, sandbox.amounts, strict=True))


def run_guide_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    dsn = sandbox.bank = request.getfixturevalue("bank")
    sandbox.run(code)
    ledger, balances = _bank_state(dsn)
    assert len(ledger) == EVENTS and balances == _balances(sandbox)


class _Payments(http.server.BaseHTTPRequestHandler):
    """A payments service: ``/health``, and ``/payments`` recording each idempotency key."""

    keys: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:
        json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).keys.append(self.headers["Idempotency-Key"])
        self.send_response(201)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        """No line per request."""


def run_payments_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    from segack.spark_adapter import replay

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Payments)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Payments.keys = []
    try:
        scope = sandbox.run(code, URL=f"http://127.0.0.1:{server.server_address[1]}")
        result = replay(scope["events"], key="account_id", order="event_time", handler=scope["Payments"](),
                        checkpoint=str(sandbox.root / "ckpt"), segments=2)
    finally:
        server.shutdown()
        server.server_close()
    assert result.complete
    assert len(_Payments.keys) == len(set(_Payments.keys)) == EVENTS  # each event once, its own key


def run_foreach_batch(sandbox: Sandbox, code: str, request: Any) -> None:
    events = str(sandbox.root / "events")
    stream = sandbox.spark.readStream.schema(sandbox.spark.read.parquet(events).schema).parquet(events)
    query = sandbox.run(code, stream=stream)["query"]
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    state = CheckpointStore(str(sandbox.root / "data" / "stream-ckpt")).load()
    assert state.settings["stream"]["events"] == EVENTS


def run_kafka_stream(sandbox: Sandbox, code: str, request: Any) -> None:
    """In the connectors session (``nox -s connectors``), whose Spark session has the Kafka
    connector the example's ``spark.jars.packages`` names: its ``local_session`` gets that one."""
    from tests.test_kafka import make_topic, produce

    broker = request.getfixturevalue("kafka_broker")
    make_topic(broker.bootstrap, "accounts", 2)
    produce(broker.bootstrap, "accounts", [(f"acct-{n % 3}", json.dumps(
        {"account": f"acct-{n % 3}", "seq": n // 3, "amount": n}).encode()) for n in range(30)])
    code = code.replace("broker-1:9092", broker.bootstrap)
    result = sandbox.run(code, apply=_nothing)["result"]
    assert result.handled == 30


def run_delta_change_feed(sandbox: Sandbox, code: str, request: Any) -> None:
    """In the connectors session, whose Spark session has delta-spark's jars and settings: a table
    of three commits (inserts, an update, a delete), its changes each handled once."""
    table = sandbox.root / "tables" / "accounts"
    spark = sandbox.spark
    spark.sql(f"CREATE TABLE delta.`{table}` (account STRING, balance BIGINT) USING delta "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.sql(f"INSERT INTO delta.`{table}` VALUES ('acct-0', 1), ('acct-1', 2)")
    spark.sql(f"UPDATE delta.`{table}` SET balance = 5 WHERE account = 'acct-0'")
    spark.sql(f"DELETE FROM delta.`{table}` WHERE account = 'acct-1'")
    log = str(sandbox.root / "handled.txt")

    def apply(event: dict[str, Any]) -> None:  # in the executors' Python: a file tells the driver
        with open(log, "a") as handled:
            handled.write(f"{event['account']} {event['_change_type']}\n")

    scope = sandbox.run(code.replace("s3://bucket/", f"{sandbox.root}/"), apply=apply)
    assert scope["result"].handled == 5
    by_key: dict[str, list[str]] = {}
    for line in Path(log).read_text().splitlines():  # in the order of the calls
        account, kind = line.split()
        by_key.setdefault(account, []).append(kind)
    assert by_key == {"acct-0": ["insert", "update_preimage", "update_postimage"],
                      "acct-1": ["insert", "delete"]}


def run_idempotent_handler(sandbox: Sandbox, code: str, request: Any) -> None:
    path = sandbox.root / "balances.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER, last_ts INTEGER)")
    add_once = sandbox.run(code, connect=lambda: sqlite3.connect(path))["add_once"]
    events = [{"account": account, "amount": amount, "ts": ts} for ts, (account, amount)
              in enumerate(zip(sandbox.accounts, sandbox.amounts, strict=True))]
    for event in events + events[:20]:  # a run killed after 20 events, handed them again
        add_once(event)
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT account, balance FROM balances").fetchall()) == _balances(sandbox)


def run_cluster_driver(sandbox: Sandbox, code: str, request: Any) -> None:
    (sandbox.root / "my_handlers.py").write_text("def apply(event):\n    pass\n")
    request.getfixturevalue("monkeypatch").syspath_prepend(str(sandbox.root))
    sandbox.spark.sparkContext.addPyFile(str(sandbox.root / "my_handlers.py"))  # spark-submit --py-files
    with pytest.raises(SystemExit) as exit_:
        sandbox.run(code)
    assert exit_.value.code == 0


def run_kafka_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    """In the connectors session: the guide's sink, as :func:`_sink_writes_each_once` calls it."""
    broker = request.getfixturevalue("kafka_broker")
    _sink_writes_each_once(sandbox, sandbox.run(code.replace("broker-1:9092", broker.bootstrap))["sink"],
                           broker.bootstrap, "ledger")


def run_secured_kafka_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    """In the connectors session: the connecting page's sink, given the stream's options for the
    tests' SASL_SSL listener (its SCRAM user, its CA), as :func:`run_kafka_sink` runs the guide's."""
    broker = request.getfixturevalue("kafka_broker")
    secured = broker.secured
    user, password = secured.scram_user
    code = (code.replace("broker-1:9093", secured.sasl_bootstrap)
            .replace("/etc/kafka/ca.pem", str(secured.ca))
            .replace('username="segack" password="..."', f'username="{user}" password="{password}"')
            .replace('"ledger"', '"secured-ledger"'))
    _sink_writes_each_once(sandbox, sandbox.run(code)["sink"], broker.bootstrap, "secured-ledger")


def run_avro_kafka_sink(sandbox: Sandbox, code: str, request: Any) -> None:
    """In the connectors session: the guide's sink of Avro values, through the tests' registry, its
    records read back by segack's own decoder."""
    from segack.spark_adapter.worker.schema_registry import RegistrySettings
    from segack.spark_adapter.worker.wire_format import WireFormat
    from tests.kafka import committed_messages

    broker, registry = request.getfixturevalue("kafka_broker"), request.getfixturevalue("schema_registry")
    topic = f"avro-ledger-{uuid.uuid4().hex[:8]}"
    code = (code.replace("broker-1:9092", broker.bootstrap).replace("http://registry:8081", registry)
            .replace('"ledger"', repr(topic)))
    wire = WireFormat("avro", RegistrySettings(registry), {topic: None})
    _sink_writes_each_once(sandbox, sandbox.run(code)["sink"], broker.bootstrap, topic, lambda: [
        wire.decode(topic, message.value()) for message in committed_messages(broker.bootstrap, topic)])


def _sink_writes_each_once(sandbox: Sandbox, sink: Any, plaintext: str, topic: str,
                           written: Callable[[], list[dict]] | None = None) -> None:
    """``sink``, prepared by a run and called by a task as ``segack stream`` does, its records read
    back (over the broker's ``plaintext`` listener, by ``written`` if given) once by a
    ``read_committed`` consumer, and again none when a resume hands the events over again."""
    import pickle

    from pyspark import cloudpickle

    from segack.spark_adapter.handlers import EventIdentity, RunContext
    from segack.spark_adapter.options import Policy
    from tests.test_kafka import make_topic
    from tests.test_kafka_sink import committed_records

    make_topic(plaintext, topic, 2)
    checkpoint_id = uuid.uuid4().hex  # each example's positions its own, on the one broker
    sink.prepare(RunContext(str(sandbox.root / "checkpoint"), checkpoint_id, "account", "seq", Policy.PER_KEY,
                            60.0, None, 1))
    events = [{"account": account, "seq": seq, "amount": amount} for seq, (account, amount)
              in enumerate(zip(sandbox.accounts, sandbox.amounts, strict=True))]
    identities = [EventIdentity(event["account"], 0, event["seq"], checkpoint_id) for event in events]
    for _ in range(2):  # a run, then a resume that hands every event over again
        task = pickle.loads(cloudpickle.dumps(sink))  # as Spark sends it to a task
        task(events, identities)
        task.close()
    records = committed_records(plaintext, topic) if written is None else written()
    assert sorted(record["seq"] for record in records) == list(range(EVENTS))


#: Each example by a line of its own, and what runs it.
RUNNERS: dict[str, Callable[[Sandbox, str, Any], None]] = {
    "psycopg.connect(\"dbname=bank\"), apply_many=apply_many)": run_readme_sink,
    "def handle(event: dict) -> None:": run_handler_shape,
    "spark = local_session()                       # or your own session": run_first_replay,
    "print(result.peak_pending)": run_concurrent_replay,
    "def write_to_db(events):": run_list_handler,
    "checkpoint=\"/data/ckpt\", concurrency=4)   # lists of 5,000": run_guide_sink,
    "class Payments(Sink):": run_payments_sink,
    ".foreachBatch(foreach_batch(handle,": run_foreach_batch,
    "records = kafka_stream(spark,": run_kafka_stream,
    'sink = KafkaSink({"bootstrap.servers": "broker-1:9092"}, apply, topics=["ledger"])': run_kafka_sink,
    'sink = KafkaSink({"linger.ms": 5}, apply, topics=["ledger"], cluster=CLUSTER)': run_secured_kafka_sink,
    'values=RegistryValues("avro", {"schema.registry.url": "http://registry:8081"},': run_avro_kafka_sink,
    "changes = delta_change_feed(spark,": run_delta_change_feed,
    "def add_once(event):": run_idempotent_handler,
    "sys.exit(0 if result.complete else 3 if result.dead_letters_left else 1)": run_cluster_driver,
}


def _runner(code: str) -> list[str]:
    return [line for line in RUNNERS if line in code]


def test_every_example_is_run():
    found = examples()
    assert {where: _runner(code) for where, code in found if len(_runner(code)) != 1} == {}
    assert sorted(line for _, code in found for line in _runner(code)) == sorted(RUNNERS)  # none stale


@pytest.mark.spark
@pytest.mark.parametrize(("where", "code"), [
    pytest.param(where, code, id=where,
                 marks=[pytest.mark.kafka] if re.search(r"kafka_stream\(|KafkaSink\(", code)
                 else [pytest.mark.delta] if "delta_change_feed(" in code else [])
    for where, code in examples()])
def test_the_example_runs(where, code, sandbox, request):
    [line] = _runner(code)
    RUNNERS[line](sandbox, code, request)


def commands() -> list[tuple[str, list[str]]]:
    """``(where, words)`` of every ``segack`` command in a shell block of the README or the docs:
    its lines joined where they end in ``\\``; in a block with ``$`` prompts, the prompted lines."""
    found = []
    for where, block in code_blocks("sh|console"):
        lines = [line.strip() for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
        # A block with prompts shows output too: only its prompted lines are commands.
        if any(line.startswith("$ ") for line in lines):
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        found.extend((where, shlex.split(line, comments=True))
                     for line in lines if line.startswith("segack "))
    return found


@pytest.mark.parametrize(("where", "words"), [pytest.param(where, words, id=f"{where} {words[1]}")
                                              for where, words in commands()])
def test_every_segack_command_shown_parses(where, words, capsys):
    """Each command a page shows is one the command line takes: its flags exist, its values parse."""
    from segack.cli.parser import build_parser

    try:
        build_parser().parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"{where}: {shlex.join(words)}: {capsys.readouterr().err}")


def test_the_shell_blocks_show_the_commands_a_user_runs():
    shown = {words[1] for _, words in commands()}
    assert {"replay", "stream", "status", "plan", "split", "merge", "scale"} <= shown, shown
