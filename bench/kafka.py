"""``python -m bench kafka``: ``segack stream`` over a Kafka backlog against the job a PySpark user
writes by hand, whole process each, on one real broker.

A Kafka broker (Apache Kafka 4.4, KRaft, from Maven Central's jars as the tests start it), a topic
of 8 partitions holding 1,000,000 JSON records of 20,000 accounts (a few hot). Each contender reads
the whole backlog (``availableNow``) in micro-batches of the same bound (``maxOffsetsPerTrigger``)
and calls a no-op handler once per record, each key's records in offset order:

- ``segack stream --format kafka --value-schema ... --key key --order offset`` (its checkpoint, its
  claims, its verification, a task per segment);
- the hand-written job (:mod:`bench.handwritten_kafka`): ``readStream`` kafka, ``foreachBatch``
  parsing the values with the same schema, ``repartition`` by key, ``sortWithinPartitions`` by
  offset, a no-op per row (no checkpoint of its own but Spark's, no order across batches kept
  beyond Spark's, no resume of a batch).

The runs alternate (segack, hand-written, segack, hand-written); each time is a whole process, Spark
and JVM start included; the ratio is of the best of each.

Then a steady producer: :data:`STEADY_RATE` records a second into a topic of its own for each
contender, for :data:`STEADY_SECONDS` seconds, while the contender runs with a micro-batch every
second (``--trigger 1s``; ``processingTime``) and a handler that notes, for each record, the time from
its Kafka timestamp to its call (:func:`bench.handwritten_kafka.note_latency`). Reported: the median
duration of the micro-batches and the median and 99th percentile of that latency, over the records
produced after the first :data:`WARM_UP` seconds.

Last, effects in PostgreSQL from Kafka: :data:`SINK_RECORDS` records into a durable PostgreSQL (a
ledger row and a balance upsert per record), ``segack stream`` with :class:`~segack.sinks.SqlSink`'s
``apply_many`` (``--batch-size 1000 --concurrency 4``) against the hand-written job writing each
partition with ``executemany`` in 1,000-row transactions (no order, no dedupe), by the database's
clock (:func:`bench.sinks.ledger_rate`).

Needs the PySpark Spark's Kafka connector is released for (``nox -s bench -- kafka`` installs it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import print_table, save
from bench.handwritten_kafka import LATENCY_LOG

RECORDS = 1_000_000
PARTITIONS = 8
ACCOUNTS = 20_000
#: Records per micro-batch, for both contenders.
BOUND = 100_000
SCHEMA = "account STRING, seq BIGINT, amount BIGINT"
ROUNDS = 3
#: The steady producer: records a second, for how long, and the seconds left out at its start.
STEADY_RATE = 2_000
STEADY_SECONDS = 60
WARM_UP = 15
#: Records of the sink bench.
SINK_RECORDS = 200_000


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    for future in created.values():
        future.result(30)


def _records(rng: random.Random) -> Iterator[tuple[bytes, bytes]]:
    """Accounts' records, keyed by account (a few hot ones), each account's ``seq`` counting up."""
    seqs: dict[str, int] = {}
    while True:
        account = f"acct-{rng.randrange(30)}" if rng.random() < 0.1 else f"acct-{rng.randrange(ACCOUNTS)}"
        seq = seqs.get(account, 0)
        seqs[account] = seq + 1
        value = {"account": account, "seq": seq, "amount": rng.randint(1, 100)}
        yield account.encode(), json.dumps(value).encode()


def _produce(bootstrap: str, topic: str, count: int = RECORDS, rate: float | None = None) -> None:
    """``count`` records into ``topic``, as fast as they go, or ``rate`` a second."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5 if rate else 20,
                         "batch.size": 1_000_000, "compression.type": "lz4"})
    began = time.monotonic()
    for number, (key, value) in zip(range(count), _records(random.Random(1)), strict=False):
        if rate is not None:
            time.sleep(max(0.0, began + number / rate - time.monotonic()))
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


def _timed(command: list[str], environment: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
    return seconds


def _lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open() as lines:
        return sum(1 for _ in lines)


def _steady(name: str, command: list[str], environment: dict[str, str], bootstrap: str, topic: str,
            scratch: Path, produce_seconds: int = STEADY_SECONDS, noted: int | None = None) -> dict[str, str]:
    """One contender under the steady producer: its micro-batches' median duration and the
    latency from a record's timestamp to its handler call (``noted``: the records its handler
    notes, when not all)."""
    log = scratch / f"latency-{topic}.txt"
    process = subprocess.Popen(command, env=dict(environment, **{LATENCY_LOG: str(log)}), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
    reader.start()
    time.sleep(20)  # the contender's JVM and query up before the first record
    began = time.time()
    _produce(bootstrap, topic, STEADY_RATE * produce_seconds, STEADY_RATE)
    deadline = time.monotonic() + 60
    expected = STEADY_RATE * produce_seconds if noted is None else noted
    while time.monotonic() < deadline and _lines(log) < expected:
        time.sleep(1)  # every record handled
    process.send_signal(signal.SIGTERM)
    process.wait(120)
    reader.join(10)
    seconds = [float(line.split(" in ")[1].split()[0]) for line in lines
               if line.startswith(("segack stream: batch ", "batch ")) and " in " in line]
    lines_noted = (line.split() for line in log.read_text().splitlines())
    latencies = sorted(float(latency) for stamp, latency in lines_noted if float(stamp) >= began + WARM_UP)
    if not latencies:
        raise RuntimeError(f"{name} reported nothing:\n{''.join(lines)[-3000:]}")
    return {"pipeline": name, "micro-batches": f"{len(seconds)}",
            "median micro-batch (s)": f"{statistics.median(seconds):.2f}" if seconds else "-",
            "median latency (s)": f"{statistics.median(latencies):.3f}",
            "p99 latency (s)": f"{latencies[int(len(latencies) * 0.99)]:.3f}",
            "records timed": f"{len(latencies):,}"}


def run() -> None:
    from tests import maven
    from tests.kafka import kafka_broker

    jars = ",".join(map(str, maven.spark_kafka()))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="segack-bench-kafka-") as scratch, \
            kafka_broker(Path(scratch) / "broker") as broker:
        began = time.perf_counter()
        _create_topic(broker.bootstrap, "accounts")
        _produce(broker.bootstrap, "accounts")
        print(f"# produced {RECORDS:,} records into {PARTITIONS} partitions in "
              f"{time.perf_counter() - began:.0f} s")
        times: dict[str, list[float]] = {"segack stream": [], "hand-written foreachBatch": []}
        for round_ in range(ROUNDS):
            checkpoint = Path(scratch) / f"segack-{round_}"
            times["segack stream"].append(_timed([
                sys.executable, "-m", "segack", "stream", "--format", "kafka",
                "--option", f"kafka.bootstrap.servers={broker.bootstrap}", "--option", "subscribe=accounts",
                "--option", "startingOffsets=earliest", "--option", f"maxOffsetsPerTrigger={BOUND}",
                "--value-schema", SCHEMA, "--key", "key", "--order", "offset",
                "--handler", "bench.handwritten_kafka:handle", "--checkpoint", str(checkpoint),
                "--segments", "4", "--conf", f"spark.jars={jars}"], environment))
            times["hand-written foreachBatch"].append(_timed([
                sys.executable, "-m", "bench.handwritten_kafka", broker.bootstrap, "accounts", SCHEMA,
                str(BOUND), "4", jars, str(Path(scratch) / f"handwritten-{round_}")], environment))
    best = {name: min(seconds) for name, seconds in times.items()}
    rows = [{"pipeline": name, "seconds (best)": f"{best[name]:.1f}",
             "all runs": ", ".join(f"{value:.1f}" for value in times[name]),
             "records/s": f"{RECORDS / best[name]:,.0f}",
             "ratio to hand-written": f"{best[name] / best['hand-written foreachBatch']:.2f}x"}
            for name in times]
    print_table(f"Kafka backlog: {RECORDS:,} JSON records, {PARTITIONS} partitions, micro-batches of "
                f"{BOUND:,}, no-op handler, whole process", rows,
                ["pipeline", "seconds (best)", "all runs", "records/s", "ratio to hand-written"])
    save("kafka", rows)
    run_steady()


def run_steady() -> None:
    """The steady producer: ``segack stream --trigger 1s`` against the hand-written job."""
    from tests import maven
    from tests.kafka import kafka_broker

    jars = ",".join(map(str, maven.spark_kafka()))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    rows = []
    with tempfile.TemporaryDirectory(prefix="segack-bench-steady-") as scratch, \
            kafka_broker(Path(scratch) / "broker") as broker:
        for name in ("segack stream", "hand-written foreachBatch"):
            topic = "steady-segack" if name == "segack stream" else "steady-handwritten"
            _create_topic(broker.bootstrap, topic)
            checkpoint = str(Path(scratch) / topic)
            command = ([sys.executable, "-m", "segack", "stream", "--format", "kafka",
                        "--option", f"kafka.bootstrap.servers={broker.bootstrap}",
                        "--option", f"subscribe={topic}",
                        "--option", "startingOffsets=earliest", "--value-schema", SCHEMA, "--key", "key",
                        "--order", "offset", "--handler", "bench.handwritten_kafka:note_latency",
                        "--checkpoint", checkpoint, "--segments", "4", "--trigger", "1s",
                        "--conf", f"spark.jars={jars}"]
                       if name == "segack stream" else
                       [sys.executable, "-m", "bench.handwritten_kafka", broker.bootstrap, topic, SCHEMA,
                        str(BOUND), "4", jars, checkpoint, "1", "bench.handwritten_kafka:note_latency"])
            rows.append(_steady(name, command, environment, broker.bootstrap, topic, Path(scratch)))
    hand = rows[1]
    for row in rows:
        row["ratio (median micro-batch)"] = (
            f"{float(row['median micro-batch (s)']) / float(hand['median micro-batch (s)']):.2f}x")
    print_table(f"Kafka, a steady producer: {STEADY_RATE:,} records/s for {STEADY_SECONDS} s into "
                f"{PARTITIONS} partitions, a micro-batch every second, latency from a record's Kafka "
                f"timestamp to its handler call (records after the first {WARM_UP} s)", rows,
                ["pipeline", "micro-batches", "median micro-batch (s)", "ratio (median micro-batch)",
                 "median latency (s)", "p99 latency (s)", "records timed"])
    save("kafka-steady", rows)
    run_sink()


def run_sink() -> None:
    """Effects in PostgreSQL from a Kafka backlog: SqlSink against a hand-written writer."""
    from tests import maven
    from tests.kafka import kafka_broker
    from tests.postgres import postgres_server

    from bench.kafka_sink import DSN
    from bench.sinks import fresh_database, ledger_rate

    jars = ",".join(map(str, maven.spark_kafka()))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    rates: dict[str, float] = {}
    scratch = tempfile.mkdtemp(prefix="segack-bench-kafka-sink-")
    os.chmod(scratch, 0o755)  # the server runs as the postgres user
    try:
        with kafka_broker(Path(scratch) / "broker") as broker, \
                postgres_server(Path(scratch) / "postgres", durable=True) as server:
            _create_topic(broker.bootstrap, "ledger")
            _produce(broker.bootstrap, "ledger", SINK_RECORDS)
            contenders = {
                "segack stream, SqlSink apply_many, --batch-size 1000 --concurrency 4": [
                    sys.executable, "-m", "segack", "stream", "--format", "kafka",
                    "--option", f"kafka.bootstrap.servers={broker.bootstrap}", "--option", "subscribe=ledger",
                    "--option", "startingOffsets=earliest", "--option", f"maxOffsetsPerTrigger={BOUND}",
                    "--value-schema", SCHEMA, "--key", "key", "--order", "offset",
                    "--handler", "bench.kafka_sink:sink", "--batch-size", "1000", "--concurrency", "4",
                    "--checkpoint", str(Path(scratch) / "segack"), "--segments", "4",
                    "--conf", f"spark.jars={jars}"],
                "by hand: foreachBatch + foreachPartition, executemany in 1,000-row transactions, "
                "no order, no dedupe": [
                    sys.executable, "-m", "bench.handwritten_kafka", broker.bootstrap, "ledger", SCHEMA,
                    str(BOUND), "4", jars, str(Path(scratch) / "handwritten"), "available-now",
                    "bench.kafka_sink:write_partition"],
            }
            for number, (name, command) in enumerate(contenders.items()):
                dsn = fresh_database(server, f"kafka_sink_{number}")
                _timed(command, dict(environment, **{DSN: dsn}))
                rates[name] = ledger_rate(dsn, SINK_RECORDS)
                print(f"  {name}: {rates[name]:,.0f} events/s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    hand = list(rates.values())[-1]
    rows = [{"pipeline": name, "events/s": f"{rate:,.0f}", "vs by hand": f"{rate / hand:.2f}x"}
            for name, rate in rates.items()]
    print_table(f"Effects in PostgreSQL from Kafka: {SINK_RECORDS:,} records, {PARTITIONS} partitions, a "
                "ledger row and a balance upsert each, by the database's clock (floor: >= 0.7x by hand)",
                rows, ["pipeline", "events/s", "vs by hand"])
    save("kafka-sink", rows)
