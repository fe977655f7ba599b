"""A real Kafka broker for the tests: Apache Kafka in KRaft mode, one node acting as broker and
controller, run from Maven Central's jars (``tests/maven.py``) on free loopback ports, in its own
process group, ended with the test process. It can be stopped and started again on the same data
and ports, as a broker that goes away in the middle of a stream does."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests import maven
from tests.ports import ends_with_its_parent, free_ports

_PROPERTIES = """process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
"""


class KafkaBroker:
    """One broker over ``directory``; :attr:`bootstrap` is its ``HOST:PORT``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Two ports bound at once: one after the other, a broker was once given the same port twice.
        self.port, self.controller = free_ports(2)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.classpath = os.pathsep.join(map(str, maven.kafka_broker()))
        self.properties = directory / "server.properties"
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(_PROPERTIES.format(port=self.port, controller=self.controller,
                                                      data=directory / "data"))
        # A cluster id is 16 random bytes in URL-safe base64; one that starts with "-" reads as a flag.
        cluster = "k" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")[1:]
        self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(self.properties),
                   "--standalone")

    def _java(self, main: str, *arguments: str) -> None:
        subprocess.run(["java", "-cp", self.classpath, main, *arguments], check=True, capture_output=True,
                       timeout=120)

    def start(self) -> None:
        """Start the broker and wait until it takes connections."""
        log = open(self.directory / "broker.log", "ab")  # noqa: SIM115  (the broker's, closed by it)
        self.process = subprocess.Popen(
            ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", self.classpath,
             "kafka.Kafka", str(self.properties)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=ends_with_its_parent)
        log.close()
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Kafka broker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.2)
        self._wait_for_metadata()

    def _wait_for_metadata(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + 60
        while True:
            try:
                admin.list_topics(timeout=5)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown), its data kept."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def log(self) -> str:
        path = self.directory / "broker.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def kafka_broker(directory: Path) -> Iterator[KafkaBroker]:
    """A started broker over ``directory`` until the block ends."""
    broker = KafkaBroker(directory)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def committed_messages(bootstrap: str, topic: str, group: str = "segack-test-reader") -> Iterator[Any]:
    """Every record of ``topic`` that transactions committed, as a ``read_committed`` consumer gets
    them, partition by partition, each in offset order: each partition read up to the end a
    ``read_uncommitted`` client is told (a ``read_committed`` one is told where the oldest open
    transaction starts, which a commit just returned may still be, its markers not yet written)."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    ends = Consumer({**settings, "isolation.level": "read_uncommitted"})
    consumer = Consumer({**settings, "isolation.level": "read_committed"})
    try:
        for partition in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
            _, end = ends.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            consumer.assign([TopicPartition(topic, partition, 0)])
            deadline = time.monotonic() + 120
            while end and consumer.position([TopicPartition(topic, partition)])[0].offset < end:
                assert time.monotonic() < deadline, f"{topic}/{partition} was not read up to {end} in 120 s"
                for message in consumer.consume(10_000, 0.2):
                    assert message.error() is None, message.error()
                    yield message
    finally:
        consumer.close()
        ends.close()
