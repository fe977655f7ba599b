"""``python -m bench kafka-sink``: Kafka to Kafka, each input record's output record exactly once
through :class:`~segack.sinks.KafkaSink`, against the job a PySpark user writes with Spark's own
Kafka sink (at least once, no order), whole process each, on one real broker.

A topic of 8 partitions holding 1,000,000 JSON records of 20,000 accounts (a few hot), as
``python -m bench kafka`` makes it. Each contender reads the whole backlog, parses each value with
the same schema and writes one record per input record, keyed by the account, to an output topic
of 8 partitions:

- ``segack stream --trigger real-time --handler bench.kafka_out:sink``: a :class:`KafkaSink` with
  ``apply_many`` and no flags (lists of its preferred 5,000, one transaction each, each key's
  position recorded with them), stopped once its consumer group's offsets reach the input's end;
- the same in micro-batches of :data:`~bench.kafka.BOUND` (``maxOffsetsPerTrigger``,
  ``availableNow``, 4 segments): a shuffle and a sort by key per micro-batch;
- :mod:`bench.spark_kafka_sink`: ``readStream`` kafka in micro-batches of the same bound,
  ``from_json`` and ``to_json``, and ``writeStream.format("kafka")``: no shuffle, no order kept
  beyond the input partition's, at least once.

Timed by the output consumer's clock: from the first output record's timestamp to the last one's
(``CreateTime``, set as each is produced), read back by a ``read_committed`` consumer; the whole
process's time beside it. The runs alternate; the ratio is of the best of each. Then the cost of
the positions topic: its records and bytes beside the output's.

Needs the PySpark Spark's Kafka connector is released for (``nox -s bench -- kafka-sink`` installs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import print_table, save
from segack.sinks import KafkaOutput, KafkaSink

#: The environment variables naming the broker and the output topic to the sink's tasks.
BOOTSTRAP_ENV = "SEGACK_BENCH_KAFKA"
OUTPUT_ENV = "SEGACK_BENCH_KAFKA_OUTPUT"
ROUNDS = 3
INPUT = "accounts"
REAL_TIME = "segack stream --trigger real-time, KafkaSink (exactly once, in key order)"
MICRO_BATCHES = "segack stream, micro-batches, KafkaSink (exactly once, in key order)"
SPARK = "Spark's Kafka sink, micro-batches (at least once, no order)"


def apply_many(output: KafkaOutput, events: list[dict[str, Any]]) -> None:
    """One record per event, keyed by its account, its fields as JSON."""
    topic = os.environ[OUTPUT_ENV]
    for event in events:
        output.produce(topic, json.dumps({"account": event["account"], "seq": event["seq"],
                                          "amount": event["amount"]}, separators=(",", ":")),
                       event["account"])


#: ``--handler bench.kafka_out:sink``.
sink = KafkaSink({"bootstrap.servers": os.environ.get(BOOTSTRAP_ENV, "127.0.0.1:9")}, apply_many=apply_many,
                 topics=[os.environ.get(OUTPUT_ENV, "output")])


def _span(bootstrap: str, topic: str) -> tuple[int, float, int]:
    """The committed records of ``topic``, the seconds from the first one's timestamp to the last
    one's, and their bytes (keys and values)."""
    from tests.kafka import committed_messages

    count, first, last, size = 0, float("inf"), 0.0, 0
    for message in committed_messages(bootstrap, topic, "bench-reader"):
        stamp = message.timestamp()[1] / 1000
        first, last = min(first, stamp), max(last, stamp)
        count += 1
        size += len(message.value() or b"") + len(message.key() or b"")
    return count, last - first, size


def _real_time(command: list[str], environment: dict[str, str], bootstrap: str, group: str) -> float:
    """Run a real-time stream until its group's offsets reach the input's end (every output record
    committed before them), then stop it; the whole process's seconds."""
    from confluent_kafka import Consumer, TopicPartition

    from bench.kafka import PARTITIONS

    began = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    partitions = [TopicPartition(INPUT, number) for number in range(PARTITIONS)]
    ends = [consumer.get_watermark_offsets(partition, timeout=10)[1] for partition in partitions]
    try:
        while [found.offset for found in consumer.committed(partitions, timeout=10)] != ends:
            if process.poll() is not None:
                raise RuntimeError(f"the real-time stream ended:\n{process.communicate()[1][-3000:]}")
            time.sleep(0.5)
        seconds = time.perf_counter() - began
    finally:
        consumer.close()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    return seconds


def _contenders(bootstrap: str, jars: str, checkpoint: Path, output: str) -> dict[str, list[str]]:
    from bench.kafka import BOUND, SCHEMA

    segack = [sys.executable, "-m", "segack", "stream", "--format", "kafka",
              "--option", f"kafka.bootstrap.servers={bootstrap}", "--option", f"subscribe={INPUT}",
              "--value-schema", SCHEMA, "--key", "key", "--order", "offset",
              "--handler", "bench.kafka_out:sink", "--checkpoint", str(checkpoint),
              "--conf", f"spark.jars={jars}"]
    return {
        REAL_TIME: [*segack, "--trigger", "real-time", "--commit-offsets-to", f"bench-{checkpoint.name}"],
        MICRO_BATCHES: [*segack, "--option", f"maxOffsetsPerTrigger={BOUND}", "--segments", "4"],
        SPARK: [sys.executable, "-m", "bench.spark_kafka_sink", bootstrap, INPUT, output, SCHEMA, str(BOUND),
                jars, str(checkpoint)],
    }


def run() -> None:
    from tests import maven
    from tests.kafka import kafka_broker

    from bench.kafka import BOUND, PARTITIONS, RECORDS, _create_topic, _produce, _timed
    from segack.spark_adapter.store.checkpoint import CheckpointStore

    jars = ",".join(map(str, maven.spark_kafka()))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    names = (REAL_TIME, MICRO_BATCHES, SPARK)
    spans: dict[str, list[float]] = {name: [] for name in names}
    wholes: dict[str, list[float]] = {name: [] for name in names}
    positions: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(prefix="segack-bench-kafka-sink-") as scratch, \
            kafka_broker(Path(scratch) / "broker") as broker:
        _create_topic(broker.bootstrap, INPUT)
        _produce(broker.bootstrap, INPUT)
        for round_ in range(ROUNDS):
            for number, name in enumerate(names):
                output = f"output-{round_}-{number}"
                _create_topic(broker.bootstrap, output)
                checkpoint = Path(scratch) / output
                command = _contenders(broker.bootstrap, jars, checkpoint, output)[name]
                variables = dict(environment, **{BOOTSTRAP_ENV: broker.bootstrap, OUTPUT_ENV: output})
                wholes[name].append(_real_time(command, variables, broker.bootstrap, f"bench-{output}")
                                    if name == REAL_TIME else _timed(command, variables))
                count, seconds, _ = _span(broker.bootstrap, output)
                if count < RECORDS or (name != SPARK and count != RECORDS):
                    raise RuntimeError(f"{name} wrote {count:,} records of {RECORDS:,}")
                spans[name].append(seconds)
                print(f"  {name}: {count:,} records in {seconds:.1f} s by their timestamps, "
                      f"{wholes[name][-1]:.1f} s whole", flush=True)
                if name == REAL_TIME and round_ == 0:
                    checkpoint_id = CheckpointStore(str(checkpoint)).load_existing().settings["checkpoint_id"]
                    written, _, size = _span(broker.bootstrap, sink.positions_topic_for(checkpoint_id))
                    positions.append((written, size))
    best = {name: min(values) for name, values in spans.items()}
    rows = [{"pipeline": name, "seconds (best, by the output's timestamps)": f"{best[name]:.1f}",
             "all runs": ", ".join(f"{value:.1f}" for value in spans[name]),
             "whole process (best)": f"{min(wholes[name]):.1f}",
             "records/s": f"{RECORDS / best[name]:,.0f}",
             "throughput vs Spark's sink": f"{best[SPARK] / best[name]:.2f}x"} for name in names]
    print_table(f"Kafka to Kafka: {RECORDS:,} records, {PARTITIONS} partitions, one output record each, "
                f"micro-batches of {BOUND:,} (floor: real-time >= 0.8x Spark's sink)", rows, list(rows[0]))
    written, size = positions[0]
    print(f"positions topic (real-time run): {written:,} records ({size:,} bytes) beside {RECORDS:,} output "
          f"records: {written / RECORDS:.3f} per output record; compacted, it keeps one per key")
    save("kafka-to-kafka", rows)
