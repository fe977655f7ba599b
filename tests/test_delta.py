"""Delta tables through delta-spark's jars (``tests/maven.py``): a table version replayed, and a change
data feed streamed, each killed and resumed; a directory that is not a Delta table refused in one
line."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from segack.cli import ExitCode
from segack.spark_adapter.sources.delta import CHANGE_ORDER
from segack.spark_adapter.store.crash_points import ENV as CRASH_ENV
from tests import maven
from tests.spark_handlers import DSN_ENV, LOG_ENV, read_log

pytestmark = [pytest.mark.spark, pytest.mark.delta]
ROOT = Path(__file__).resolve().parents[1]
#: A change's rank inside its commit (the rule of segack.spark_adapter.sources.delta).
RANK = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}


def _conf() -> list[str]:
    return [item for name, value in maven.connector_conf().items() for item in ("--conf", f"{name}={value}")]


def _segack(tmp_path: Path, *arguments: str, run: str = "0", dsn: str | None = None, wait: bool = True,
            connector: bool = True, crash_at: str | None = None,
            ) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": run})
    if crash_at is not None:
        environment[CRASH_ENV] = crash_at
    if dsn is not None:
        environment[DSN_ENV] = dsn
    command = [sys.executable, "-m", "segack", *arguments, "--checkpoint", str(tmp_path / "checkpoint"),
               *(_conf() if connector else [])]
    if wait:
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when(process: subprocess.Popen[str], condition, what: str) -> None:
    deadline = time.monotonic() + 300
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _accounts_table(spark, path: Path, commits: int, seed: int) -> None:
    """A Delta table of accounts with its change data feed on, written in ``commits`` commits:
    inserts, updates of many accounts (some in every commit), deletes, inserts again."""
    where = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {where} (account STRING, balance BIGINT, version_written BIGINT) USING delta "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.createDataFrame([(f"acct-{n}", 0, 1) for n in range(300)], "account string, balance long, "
                          "version_written long").write.format("delta").mode("append").save(str(path))
    _more_commits(spark, path, range(2, commits + 1), seed)


def _more_commits(spark, path: Path, commits: range, seed: int) -> None:
    """Commits ``commits`` (numbered from 2) of :func:`_accounts_table`'s table."""
    rng = random.Random(seed)
    where = f"delta.`{path}`"
    for commit in commits:
        kind = commit % 4
        if kind == 0:
            spark.sql(f"DELETE FROM {where} WHERE account IN ({_names(rng, 10)})")
        elif kind == 1:
            spark.createDataFrame([(f"acct-new-{commit}-{n}", 0, commit) for n in range(20)],
                                  "account string, balance long, version_written long"
                                  ).write.format("delta").mode("append").save(str(path))
        else:
            # acct-0..2 change in every update commit: keys with many changes.
            spark.sql(f"UPDATE {where} SET balance = balance + {commit}, version_written = {commit} "
                      f"WHERE account IN ('acct-0', 'acct-1', 'acct-2', {_names(rng, 60)})")


def _names(rng: random.Random, count: int) -> str:
    return ", ".join(f"'acct-{rng.randrange(3, 300)}'" for _ in range(count))


def _changes_table(dsn: str) -> None:
    with psycopg.connect(dsn) as db:
        db.execute("CREATE TABLE changes (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, "
                   "version BIGINT NOT NULL, kind TEXT NOT NULL)")


def _applied(dsn: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(dsn) as db:
        return [tuple(row) for row in db.execute("SELECT account, version, kind FROM changes ORDER BY id")]


@pytest.mark.faults
def test_a_change_feed_killed_and_resumed_applies_each_change_once_in_version_order(spark, tmp_path,
                                                                                    pg_database):
    table = tmp_path / "accounts"
    _accounts_table(spark, table, commits=5, seed=1)

    def changes():
        return [(row["account"], row["_commit_version"], row["_change_type"]) for row in
                spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
                .load(str(table)).collect()]

    first_commits = changes()
    _changes_table(pg_database)
    stream = ["stream", str(table), "--format", "delta", "--option", "readChangeFeed=true",
              "--option", "startingVersion=0", "--key", "account", "--order", CHANGE_ORDER,
              "--handler", "tests.spark_handlers:changes_sink", "--batch-size", "20"]
    first = _segack(tmp_path, *stream, "--segments", "3", dsn=pg_database, wait=False)
    _kill_when(first, lambda: len(_applied(pg_database)) > len(first_commits) // 3, "a third of the changes")
    # The resume takes the rest of the first micro-batch, then a second one of the commits since.
    _more_commits(spark, table, range(6, 10), seed=2)
    expected = changes()
    done = _segack(tmp_path, *stream, "--segments", "5", dsn=pg_database)
    assert done.returncode == 0, done.stderr
    assert "2 micro-batches" in done.stdout, done.stdout
    applied = _applied(pg_database)
    assert sorted(applied) == sorted(expected) and len(applied) == len(set(applied))
    by_account: dict[str, list[tuple[int, int]]] = {}
    for account, version, kind in applied:
        by_account.setdefault(account, []).append((version, RANK[kind]))
    assert all(changes == sorted(changes) for changes in by_account.values())
    assert max(len(changes) for changes in by_account.values()) >= 8  # keys changed in many commits


@pytest.mark.faults
def test_a_table_version_replayed_killed_and_resumed_is_exact(spark, tmp_path):
    table = tmp_path / "events"
    rows = [(f"user-{n % 50}", n // 50, n) for n in range(3200)]
    for start in range(0, len(rows), 800):
        spark.createDataFrame(rows[start:start + 800], "user string, seq long, ts long").write.format(
            "delta").mode("append").save(str(table))
    replay = ["replay", str(table), "--format", "delta", "--option", "versionAsOf=2", "--key", "user",
              "--order", "ts", "--handler", "tests.spark_handlers:record_slowly", "--segments", "3"]
    first = _segack(tmp_path, *replay, wait=False)
    log = str(tmp_path / "log.jsonl")
    _kill_when(first, lambda: len(read_log(log)) > 400, "some events")
    done = _segack(tmp_path, *replay, "--segments", "2", run="1")
    assert done.returncode == 0, done.stderr
    assert "2,400 in all" in done.stdout  # version 2: the first three commits
    handled = {(event["user"], event["seq"]) for event in read_log(log)}
    assert handled == {(user, seq) for user, seq, _ in rows[:2400]}


def _all_changes(spark, table: Path) -> list[tuple[str, int, str]]:
    return [(row["account"], row["_commit_version"], row["_change_type"]) for row in
            spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
            .load(str(table)).collect()]


@pytest.mark.faults
def test_spark_checkpoint_lost_restarts_a_change_feed_from_segacks_record_losing_and_repeating_nothing(
        spark, tmp_path, capsys):
    """Spark's checkpoint of a change feed's query removed: the next run goes on from the commit
    after segack's record of the last micro-batch; removed again before any commit came since (the
    version after the record's is not there yet), and again with commits since, its first two runs
    killed, before Spark's new query planned a micro-batch and as its first one began. A table
    replaced at the same path is refused."""
    from segack.cli import main

    table = tmp_path / "accounts"
    _accounts_table(spark, table, commits=4, seed=5)
    checkpoint = tmp_path / "checkpoint"
    stream = ["stream", str(table), "--format", "delta", "--option", "readChangeFeed=true",
              "--option", "startingVersion=0", "--key", "account", "--order", CHANGE_ORDER,
              "--handler", "tests.spark_handlers:record_event"]
    first = _segack(tmp_path, *stream)
    assert first.returncode == ExitCode.OK, first.stderr
    shutil.rmtree(checkpoint / "stream")
    nothing_new = _segack(tmp_path, *stream)
    assert nothing_new.returncode == ExitCode.OK, nothing_new.stderr
    assert " 0 events handled" in nothing_new.stdout, nothing_new.stdout
    assert main(["status", str(checkpoint)]) == ExitCode.OK
    status = capsys.readouterr().out
    assert "segack's record of micro-batch 0" in status
    assert "Spark's checkpoint of the query was gone" in status
    _more_commits(spark, table, range(5, 9), seed=6)
    shutil.rmtree(checkpoint / "stream")
    # Killed once the restart is recorded, before the new query plans; then as its first batch begins.
    for point in ("after-state@1", "batch-start"):
        died = _segack(tmp_path, *stream, crash_at=point)
        assert died.returncode == -9, (point, died.stderr[-3000:])
    assert (checkpoint / "stream" / "offsets" / "0").exists()
    restarted = _segack(tmp_path, *stream)
    assert restarted.returncode == ExitCode.OK, restarted.stderr
    changes = [(event["account"], event["_commit_version"], event["_change_type"])
               for event in read_log(str(tmp_path / "log.jsonl"))]
    expected = _all_changes(spark, table)
    assert sorted(changes) == sorted(expected) and len(changes) == len(set(changes))
    assert {version for _, version, _ in expected} == set(range(1, 9))
    ranks = _by_key([(account, (version, RANK[kind])) for account, version, kind in changes])
    assert all(order == sorted(order) for order in ranks.values())

    shutil.rmtree(checkpoint / "stream")
    shutil.rmtree(table)
    _accounts_table(spark, table, commits=2, seed=7)
    replaced = _segack(tmp_path, *stream)
    assert replaced.returncode == ExitCode.REFUSED, replaced.stderr
    [line] = [line for line in replaced.stderr.splitlines() if line.startswith("segack stream:")]
    assert f"the Delta table at {table} is not the one the stream read (its id is " in line, line
    assert len(read_log(str(tmp_path / "log.jsonl"))) == len(changes)


def _as_written(command: str, tmp_path: Path) -> list[str]:
    """docs/delta.rst's ``segack COMMAND`` word for word, its bucket a local folder and its handler
    one that logs each event."""
    from tests.test_doc_examples import commands

    [words] = [words for where, words in commands()
               if where.startswith("docs/delta.rst:") and words[1] == command]
    local = {"s3://bucket/": f"{tmp_path}/", "my_handlers:apply": "tests.spark_handlers:record_event"}
    for shown, here in local.items():
        words = [word.replace(shown, here) for word in words]
    return [sys.executable, "-m", *words, *_conf()]


@pytest.mark.command
def test_the_guides_commands_run_as_written(spark, tmp_path):
    """The guide's replay of version 3 and its change feed streamed every 30 s, each flag as the page
    gives it: each event once, each key's in the order the page says to use."""
    events = tmp_path / "tables" / "events"
    for version in range(5):  # version 3 holds the first 4 commits
        spark.createDataFrame([(f"acct-{n % 7}", version * 10 + n) for n in range(10)],
                              "account string, event_time long").write.format("delta").mode("append").save(
            str(events))
    log = tmp_path / "log.jsonl"
    environment = dict(os.environ, **{LOG_ENV: str(log)})
    replayed = subprocess.run(_as_written("replay", tmp_path), cwd=ROOT, env=environment, capture_output=True,
                              text=True, timeout=600)
    assert replayed.returncode == ExitCode.OK, replayed.stderr
    assert "40 events handled, 0 already done, 40 in all" in replayed.stdout
    handled = [(event["account"], event["event_time"]) for event in read_log(str(log))]
    assert sorted(handled) == sorted((f"acct-{n % 7}", version * 10 + n)
                                     for version in range(4) for n in range(10))
    assert all(times == sorted(times) for times in _by_key(handled).values())

    _accounts_table(spark, tmp_path / "tables" / "accounts", commits=4, seed=3)
    expected = [(row["account"], row["_commit_version"], row["_change_type"]) for row in
                spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
                .load(str(tmp_path / "tables" / "accounts")).collect()]
    log.unlink()
    streaming = subprocess.Popen(_as_written("stream", tmp_path), cwd=ROOT, env=environment, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(read_log(str(log))) < len(expected):
        assert streaming.poll() is None and time.monotonic() < deadline, streaming.communicate()[1][-3000:]
        time.sleep(0.2)
    time.sleep(1.0)  # the micro-batch ends in the checkpoint; then it waits for its next trigger
    streaming.send_signal(signal.SIGTERM)
    out, err = streaming.communicate(timeout=120)
    assert streaming.returncode == ExitCode.OK, err
    assert "segack stream: stopped as asked: 1 micro-batch" in out, out
    changes = [(event["account"], event["_commit_version"], event["_change_type"])
               for event in read_log(str(log))]
    assert sorted(changes) == sorted(expected) and len(changes) == len(set(changes))
    ranks = _by_key([(account, (version, RANK[kind])) for account, version, kind in changes])
    assert all(order == sorted(order) for order in ranks.values())


def _by_key(pairs):
    found: dict[str, list] = {}
    for key, value in pairs:
        found.setdefault(key, []).append(value)
    return found


def test_a_directory_that_is_not_a_delta_table_is_refused_in_one_line(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.txt").write_text("not a table\n")
    handler = ["--handler", "tests.spark_handlers:record_slowly"]
    for command in (["replay", str(tmp_path / "plain"), "--format", "delta", "--key", "user", "--order", "ts",
                     *handler],
                    ["stream", str(tmp_path / "plain"), "--format", "delta",
                     "--option", "readChangeFeed=true", "--key", "user", "--order", CHANGE_ORDER, *handler]):
        refused = _segack(tmp_path, *command)
        lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
        assert refused.returncode == ExitCode.REFUSED, refused.stderr
        assert len(lines) == 1 and "is not a Delta table" in lines[0], lines
        assert not (tmp_path / "checkpoint").exists()


def test_a_delta_table_read_without_the_connector_is_refused_naming_the_package(spark, tmp_path):
    spark.createDataFrame([("user-0", 0, 1)], "user string, seq long, ts long").write.format("delta").save(
        str(tmp_path / "events"))
    refused = _segack(tmp_path, "replay", str(tmp_path / "events"), "--format", "delta", "--key", "user",
                      "--order", "ts", "--handler", "tests.spark_handlers:record_slowly", connector=False)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert lines == ["segack replay: this Spark session has no delta connector: add delta-spark's jars for "
                     "this Spark version: --conf spark.jars.packages=io.delta:delta-spark_2.13:RELEASE (the "
                     "Delta release built for your Spark)"], refused.stderr
    assert not (tmp_path / "checkpoint").exists()


@pytest.mark.command
def test_a_version_it_lacks_and_a_session_without_deltas_settings_are_refused_in_one_whole_line(spark,
                                                                                                tmp_path):
    path = tmp_path / "events"
    spark.sql(f"CREATE TABLE delta.`{path}` (user STRING, seq BIGINT, ts BIGINT) USING delta "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    spark.createDataFrame([("user-0", 0, 1)], "user string, seq long, ts long").write.format("delta").mode(
        "append").save(str(path))
    handler = ["--handler", "tests.spark_handlers:record_slowly"]
    refused = _segack(tmp_path, "replay", str(path), "--format", "delta", "--option", "versionAsOf=99",
                      "--key", "user", "--order", "ts", *handler)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    said = f"segack replay: cannot read {path} as delta versionAsOf=99: "
    assert len(lines) == 1 and lines[0].startswith(said), lines
    assert "99" in lines[0].split("versionAsOf=99: ", 1)[1], lines  # Delta's own reason follows
    # The jars without the two SQL settings: a change feed needs them, and the line says which.
    jars = ["--conf", "spark.jars=" + ",".join(map(str, maven.delta()))]
    refused = _segack(tmp_path, "stream", str(path), "--format", "delta", "--option", "readChangeFeed=true",
                      "--option", "startingVersion=0", "--key", "user", "--order", CHANGE_ORDER, *handler,
                      *jars, connector=False)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert lines == [f"segack stream: cannot read {path} as delta startingVersion=0: Delta needs its session "
                     f"settings: --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension --conf "
                     f"spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"],\
        lines
    assert not (tmp_path / "checkpoint").exists()


def test_a_catalog_table_is_read_by_name_and_its_change_feed_gets_its_order(spark, tmp_path):
    from segack.spark_adapter.sources.files import read_input

    spark.sql(f"CREATE TABLE accounts_by_name (account STRING, balance BIGINT) USING delta "
              f"LOCATION '{tmp_path / 'accounts'}' TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    try:
        spark.sql("INSERT INTO accounts_by_name VALUES ('a', 1), ('b', 2)")
        spark.sql("UPDATE accounts_by_name SET balance = balance + 10 WHERE account = 'a'")
        spark.sql("DELETE FROM accounts_by_name WHERE account = 'b'")
        now = read_input(spark, None, "parquet", {}, table="accounts_by_name")
        assert [tuple(row) for row in now.collect()] == [("a", 11)]
        changes = read_input(spark, None, "parquet", {"readChangeFeed": "true", "startingVersion": "0"},
                             table="accounts_by_name")
        seen = [(row.account, row._change_type, row.balance)
                for row in changes.orderBy("account", CHANGE_ORDER).collect()]
        # Spark reads option names in any case, and Delta's other name for the feed: so does segack.
        for options in ({"readchangefeed": "TRUE", "STARTINGVERSION": "0"},
                        {"readChangeData": "true", "startingVersion": "0"}):
            again = read_input(spark, None, "parquet", options, table="accounts_by_name")
            assert [(row.account, row._change_type, row.balance)
                    for row in again.orderBy("account", CHANGE_ORDER).collect()] == seen
    finally:
        spark.sql("DROP TABLE accounts_by_name")
    assert seen == [("a", "insert", 1), ("a", "update_preimage", 1), ("a", "update_postimage", 11),
                    ("b", "insert", 2), ("b", "delete", 2)]


def test_a_commit_of_a_change_feed_is_never_split_across_micro_batches(spark, tmp_path):
    table = tmp_path / "accounts"
    spark.sql(f"CREATE TABLE delta.`{table}` (account STRING, balance BIGINT) USING delta "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    for balance in (1, 2):  # the second commit an overwrite: its changes are in no change-data file
        rows = spark.range(12).selectExpr("concat('acct-', id) AS account", f"{balance}L AS balance")
        rows.repartition(12).write.format("delta").mode("overwrite").save(str(table))
    stream = ["stream", str(table), "--format", "delta", "--option", "readChangeFeed=true",
              "--option", "startingVersion=2", "--key", "account", "--order", CHANGE_ORDER,
              "--handler", "tests.spark_handlers:record_event"]
    # Delta would admit its 24 files two by two, all the inserts before the deletes.
    for limit in ("maxFilesPerTrigger=2", "maxbytespertrigger=1k"):
        refused = _segack(tmp_path, *stream, "--option", limit)
        lines = [line for line in refused.stderr.splitlines() if line.startswith("segack")]
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert len(lines) == 1 and "would let Delta split a commit of the change feed" in lines[0], lines
        assert not (tmp_path / "checkpoint").exists()
    done = _segack(tmp_path, *stream)
    assert done.returncode == ExitCode.OK, done.stderr
    applied = _by_key((event["account"], (event["_change_type"], event["balance"]))
                      for event in read_log(str(tmp_path / "log.jsonl")))
    assert applied == {f"acct-{n}": [("delete", 1), ("insert", 2)] for n in range(12)}
