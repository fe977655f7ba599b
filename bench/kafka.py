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
and JVM start included; the ratio is of the best of each. Needs the PySpark Spark's Kafka connector is
released for (``nox -s bench -- kafka`` installs it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import print_table, save

RECORDS = 1_000_000
PARTITIONS = 8
ACCOUNTS = 20_000
#: Records per micro-batch, for both contenders.
BOUND = 100_000
SCHEMA = "account STRING, seq BIGINT, amount BIGINT"
ROUNDS = 2


def _produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    for future in created.values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "lz4"})
    rng = random.Random(1)
    seqs: dict[str, int] = {}
    for _ in range(RECORDS):
        account = f"acct-{rng.randrange(30)}" if rng.random() < 0.1 else f"acct-{rng.randrange(ACCOUNTS)}"
        seq = seqs.get(account, 0)
        seqs[account] = seq + 1
        value = json.dumps({"account": account, "seq": seq, "amount": rng.randint(1, 100)}).encode()
        while True:
            try:
                producer.produce(topic, key=account.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def _timed(command: list[str], environment: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed:\n{done.stderr[-3000:]}")
    return seconds


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
