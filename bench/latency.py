"""``python -m bench latency``: how soon a Kafka record reaches its handler, and how fast a backlog
goes, in a real-time stream (``segack stream --trigger real-time``) against a micro-batch stream
(``--trigger 1s``) and the floor: a plain ``confluent-kafka`` consumer calling the handler in a loop
(:mod:`bench.plain_consumer`). Spark's own real-time mode runs no Python handler but ``foreach``
(``docs/realtime.rst``), so there is no hand-written Spark contender here.

One broker (``tests/kafka.py``). For each contender, a topic of its own with
:data:`~bench.kafka.PARTITIONS` partitions and a steady producer writing
:data:`~bench.kafka.STEADY_RATE` records a second for :data:`STEADY_SECONDS` seconds; the handler
notes, for each record, the time from its Kafka timestamp to its call
(:func:`bench.handwritten_kafka.note_latency`). Reported: the median and the 99th percentile of that
latency over the records produced after the first :data:`~bench.kafka.WARM_UP` seconds.

A second real-time stream runs beside a slow key: each record of one account (``acct-0``, about one
record in 300) takes 50 ms, and the others' latency is timed, against the idle case above.

Then a backlog of :data:`BACKLOG` records, a no-op handler: the seconds from the contender's start
until every record is done (the real-time stream's partitions' progress all at the end; the
micro-batch stream's whole process, ``availableNow``), best of :data:`~bench.kafka.ROUNDS`,
alternated, and the ratio of the real-time stream's records per second to the micro-batch's.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import print_table, save
from bench.handwritten_kafka import SLOW_KEY
from bench.kafka import (
    BOUND,
    PARTITIONS,
    ROUNDS,
    SCHEMA,
    STEADY_RATE,
    WARM_UP,
    _create_topic,
    _produce,
    _records,
    _steady,
    _timed,
)

#: Seconds the steady producer writes for.
STEADY_SECONDS = 45
#: Records of the backlog.
BACKLOG = 1_000_000


def _segack(bootstrap: str, topic: str, handler: str, checkpoint: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "segack", "stream", "--format", "kafka",
            "--option", f"kafka.bootstrap.servers={bootstrap}", "--option", f"subscribe={topic}",
            "--value-schema", SCHEMA, "--key", "key", "--order", "offset", "--handler", handler,
            "--checkpoint", checkpoint, *extra]


def _not_slow(count: int) -> int:
    """How many of the first ``count`` records the producer writes are not :data:`SLOW_KEY`'s."""
    return sum(1 for _, (key, _) in zip(range(count), _records(random.Random(1)), strict=False)
               if key != SLOW_KEY.encode())


def _real_time_backlog(command: list[str], environment: dict[str, str], checkpoint: Path) -> float:
    """Seconds from the start of a real-time stream until its partitions' progress is at the end."""
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    began = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the real-time stream ended:\n{(process.stderr or ['']).read()[-3000:]}")
            states = CheckpointStore(str(checkpoint)).partitions.all() if checkpoint.exists() else {}
            if len(states) == PARTITIONS and sum(state["next"] for state in states.values()) >= BACKLOG:
                return time.perf_counter() - began
            time.sleep(0.2)
    finally:
        process.send_signal(15)
        process.wait(120)


def run() -> None:
    from tests import maven
    from tests.kafka import kafka_broker

    jars = ",".join(map(str, maven.spark_kafka()))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    latency = "bench.handwritten_kafka:note_latency"
    with tempfile.TemporaryDirectory(prefix="segack-bench-latency-") as scratch, \
            kafka_broker(Path(scratch) / "broker") as broker:
        bootstrap = broker.bootstrap
        beside_slow = "bench.handwritten_kafka:note_latency_beside_a_slow_key"
        contenders = {
            "segack real-time": lambda topic, checkpoint: _segack(
                bootstrap, topic, latency, checkpoint, "--trigger", "real-time", "--concurrency", "4"),
            f"segack real-time, {SLOW_KEY} 50 ms a record (others timed)": lambda topic, checkpoint: _segack(
                bootstrap, topic, beside_slow, checkpoint, "--trigger", "real-time", "--concurrency", "4"),
            "segack micro-batches (1 s)": lambda topic, checkpoint: _segack(
                bootstrap, topic, latency, checkpoint, "--trigger", "1s", "--segments", "4",
                "--conf", f"spark.jars={jars}"),
            "plain consumer loop (floor)": lambda topic, checkpoint: [
                sys.executable, "-m", "bench.plain_consumer", bootstrap, topic, latency],
        }
        rows = []
        for index, (name, command) in enumerate(contenders.items()):
            topic = f"latency-{index}"
            _create_topic(bootstrap, topic)
            noted = _not_slow(STEADY_RATE * STEADY_SECONDS) if SLOW_KEY in name else None
            row = _steady(name, command(topic, str(Path(scratch) / topic)), environment, bootstrap, topic,
                          Path(scratch), STEADY_SECONDS, noted)
            rows.append({key: row[key] for key in ("pipeline", "median latency (s)", "p99 latency (s)",
                                                   "records timed")})
        print_table(f"Kafka latency: {STEADY_RATE:,} records/s for {STEADY_SECONDS} s into {PARTITIONS} "
                    f"partitions, from a record's Kafka timestamp to its handler call (records after the "
                    f"first {WARM_UP} s)", rows,
                    ["pipeline", "median latency (s)", "p99 latency (s)", "records timed"])
        save("latency", rows)
        _create_topic(bootstrap, "backlog")
        _produce(bootstrap, "backlog", BACKLOG)
        times: dict[str, list[float]] = {"segack real-time": [], "segack micro-batches": []}
        for round_ in range(ROUNDS):
            checkpoint = Path(scratch) / f"real-time-{round_}"
            times["segack real-time"].append(_real_time_backlog(_segack(
                bootstrap, "backlog", "bench.handwritten_kafka:handle", str(checkpoint), "--trigger",
                "real-time"), environment, checkpoint))
            times["segack micro-batches"].append(_timed(_segack(
                bootstrap, "backlog", "bench.handwritten_kafka:handle",
                str(Path(scratch) / f"micro-{round_}"),
                "--option", f"maxOffsetsPerTrigger={BOUND}", "--segments", "4",
                "--conf", f"spark.jars={jars}"), environment))
    best = {name: min(seconds) for name, seconds in times.items()}
    backlog = [{"pipeline": name, "seconds (best)": f"{best[name]:.1f}",
                "all runs": ", ".join(f"{value:.1f}" for value in times[name]),
                "records/s": f"{BACKLOG / best[name]:,.0f}",
                "throughput ratio to micro-batches": f"{best['segack micro-batches'] / best[name]:.2f}x"}
               for name in times]
    print_table(f"Kafka backlog: {BACKLOG:,} records, {PARTITIONS} partitions, no-op handler, from the "
                f"process's start to the last record done", backlog,
                ["pipeline", "seconds (best)", "all runs", "records/s", "throughput ratio to micro-batches"])
    save("latency-backlog", backlog)
