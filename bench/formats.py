"""``python -m bench formats``: ``segack stream`` over Avro values in Confluent's wire format, through a
real Schema Registry, against the same stream over JSON and against the job open-source Spark allows.

One broker (as the tests start it) and Karapace (``tests/schema_registry.py``); two topics of 8
partitions hold the same :data:`RECORDS` accounts' records (those of :mod:`bench.kafka`), one as JSON
text, one as Avro written through the registry. Each contender reads its whole backlog in
micro-batches of the same bound and calls a no-op handler once per record, each key's in offset
order; whole process each, best of :data:`ROUNDS`:

- ``segack stream --value-format json``;
- ``segack stream --value-format avro --schema-registry URL``: each value by its writer's schema,
  resolved to the subject's latest;
- the hand-written job (:mod:`bench.handwritten_kafka` with ``SEGACK_BENCH_AVRO_SCHEMA``): the 5-byte
  header cut off with ``substring`` and every value read by one fixed schema with Spark's
  ``from_avro`` (spark-avro's jar). It cannot read a second writer version: a value written by
  another schema is read as if by this one, fields shifted (``from_avro``'s ``mode`` ``FAILFAST``
  stops the query only where the bytes run out).

Needs the connectors' PySpark (``nox -s bench -- formats`` installs it) and the Karapace kit.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

from bench.common import print_table, save
from bench.handwritten_kafka import AVRO_SCHEMA
from bench.kafka import BOUND, PARTITIONS, RECORDS, SCHEMA, _create_topic, _records, _timed

ROUNDS = 2
ACCOUNT = json.dumps({"type": "record", "name": "Account", "namespace": "bench", "fields": [
    {"name": "account", "type": "string"}, {"name": "seq", "type": "long"},
    {"name": "amount", "type": "long"}]})


def _produce_both(bootstrap: str, registry: str) -> None:
    """The same records as JSON into ``accounts-json`` and as Avro (the registry's id, Confluent's
    header) into ``accounts-avro``."""
    import random

    import fastavro
    from confluent_kafka import Producer
    from tests.schema_registry import register

    schema_id = register(registry, "accounts-avro-value", ACCOUNT)
    parsed = fastavro.parse_schema(json.loads(ACCOUNT))
    header = b"\x00" + struct.pack(">I", schema_id)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "lz4"})
    for _, (key, value) in zip(range(RECORDS), _records(random.Random(1)), strict=False):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, json.loads(value))
        for topic, payload in (("accounts-json", value), ("accounts-avro", header + body.getvalue())):
            while True:
                try:
                    producer.produce(topic, key=key, value=payload)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.flush(300)


def run() -> None:
    from tests import maven
    from tests.kafka import kafka_broker
    from tests.schema_registry import available, schema_registry

    if not available():
        print("# formats: skipped, no Karapace kit in ../shared/karapace")
        return
    kafka_jars = ",".join(map(str, maven.spark_kafka()))
    import pyspark

    avro_jars = ",".join(map(str, maven._beside_spark(maven.resolve(
        f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"))))
    here = Path(__file__).resolve().parents[1]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get(
        "PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="segack-bench-formats-") as scratch, \
            kafka_broker(Path(scratch) / "broker") as broker, \
            schema_registry(broker.bootstrap, Path(scratch) / "karapace.log") as registry:
        began = time.perf_counter()
        for topic in ("accounts-json", "accounts-avro"):
            _create_topic(broker.bootstrap, topic)
        _produce_both(broker.bootstrap, registry)
        seconds = time.perf_counter() - began
        print(f"# produced {RECORDS:,} records into each of two topics in {seconds:.0f} s")

        def segack(topic: str, round_: int, *flags: str) -> float:
            return _timed([
                sys.executable, "-m", "segack", "stream", "--format", "kafka",
                "--option", f"kafka.bootstrap.servers={broker.bootstrap}", "--option", f"subscribe={topic}",
                "--option", "startingOffsets=earliest", "--option", f"maxOffsetsPerTrigger={BOUND}",
                "--value-schema", SCHEMA, "--key", "key", "--order", "offset", *flags,
                "--handler", "bench.handwritten_kafka:handle", "--checkpoint", f"{scratch}/{topic}-{round_}",
                "--segments", "4", "--conf", f"spark.jars={kafka_jars}"], environment)

        times: dict[str, list[float]] = {"segack, JSON": [], "segack, Avro through the registry": [],
                                         "hand-written from_avro, one fixed schema": []}
        for round_ in range(ROUNDS):
            times["segack, JSON"].append(segack("accounts-json", round_))
            times["segack, Avro through the registry"].append(segack(
                "accounts-avro", round_, "--value-format", "avro", "--schema-registry", registry))
            times["hand-written from_avro, one fixed schema"].append(_timed([
                sys.executable, "-m", "bench.handwritten_kafka", broker.bootstrap, "accounts-avro", SCHEMA,
                str(BOUND), "4", f"{kafka_jars},{avro_jars}", f"{scratch}/handwritten-{round_}"],
                {**environment, AVRO_SCHEMA: ACCOUNT}))
    best = {name: min(seconds) for name, seconds in times.items()}
    avro = best["segack, Avro through the registry"]
    rows = [{"pipeline": name, "seconds (best)": f"{best[name]:.1f}",
             "all runs": ", ".join(f"{value:.1f}" for value in times[name]),
             "records/s": f"{RECORDS / best[name]:,.0f}",
             "time over segack Avro's": f"{best[name] / avro:.2f}x"} for name in times]
    print_table(f"Value formats: {RECORDS:,} records, {PARTITIONS} partitions, micro-batches of {BOUND:,}, "
                f"no-op handler, whole process", rows,
                ["pipeline", "seconds (best)", "all runs", "records/s", "time over segack Avro's"])
    save("formats", rows)
