"""A real Kafka broker for the tests: Apache Kafka in KRaft mode, one node acting as broker and
controller, run from Maven Central's jars (``tests/maven.py``) on free loopback ports, in its own
process group, ended with the test process. It can be stopped and started again on the same data
and ports, as a broker that goes away in the middle of a stream does.

Beside its plaintext listener it has two secured ones, as companies run Kafka (:class:`Secured`):
SASL_SSL, with SCRAM-SHA-512 and PLAIN users added when its storage is formatted, and SSL that
requires a client certificate; the certificates are made by ``openssl`` for each broker, signed by
a CA of its own, the broker's key store and trust store PEM files."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import maven
from tests.ports import ends_with_its_parent, free_ports

_PROPERTIES = """process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{mtls}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{mtls}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\\
    org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=\\
    org.apache.kafka.common.security.plain.PlainLoginModule required user_{plain_user}="{plain_password}";
ssl.keystore.type=PEM
ssl.keystore.location={server_pem}
ssl.truststore.type=PEM
ssl.truststore.location={ca}
listener.name.ssl.ssl.client.auth=required
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


def _openssl(*arguments: str) -> None:
    subprocess.run(["openssl", *arguments], check=True, capture_output=True, timeout=60)


def certificate(directory: Path, name: str, ca: str | None, ca_key: str | None) -> tuple[Path, Path]:
    """A key and a certificate for 127.0.0.1 (``name`` as its subject), signed by ``ca`` (itself
    where None); their PEM files."""
    key, signed = directory / f"{name}.key", directory / f"{name}.crt"
    if ca is None:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                 str(signed), "-days", "7", "-subj", f"/CN={name}")
    else:
        request = directory / f"{name}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
                 "-subj", f"/CN={name}")
        extensions = directory / f"{name}.ext"
        extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("x509", "-req", "-in", str(request), "-CA", ca, "-CAkey", str(ca_key), "-CAcreateserial",
                 "-out", str(signed), "-days", "7", "-extfile", str(extensions))
    return key, signed


@dataclass(frozen=True)
class Secured:
    """A broker's secured listeners, and what a client needs to reach them."""

    #: ``HOST:PORT`` of the SASL_SSL listener (SCRAM-SHA-512 and PLAIN), and of the SSL one that
    #: requires a client certificate.
    sasl_bootstrap: str
    mtls_bootstrap: str
    #: The CA's certificate (PEM), which signed the broker's and the client's; another CA's, which
    #: signed neither.
    ca: Path
    other_ca: Path
    #: A client's key and certificate, in one PEM file (Kafka's Java client's PEM key store).
    client_pem: Path
    #: The SCRAM-SHA-512 user and the PLAIN one, with their passwords (made for each broker).
    scram_user: tuple[str, str]
    plain_user: tuple[str, str]

    def sasl_options(self, mechanism: str = "SCRAM-SHA-512", password: str | None = None,
                     ca: Path | None = None) -> dict[str, str]:
        """The stream's ``kafka.*`` options for the SASL_SSL listener, in Spark's spelling (the
        Java client's): a JAAS line and a PEM trust store."""
        user, known = self.scram_user if mechanism.startswith("SCRAM") else self.plain_user
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule" if mechanism.startswith("SCRAM")
                  else "org.apache.kafka.common.security.plain.PlainLoginModule")
        jaas = f'{module} required username="{user}" password="{password or known}";'
        return {"kafka.bootstrap.servers": self.sasl_bootstrap, "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": mechanism, "kafka.sasl.jaas.config": jaas,
                "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(ca or self.ca)}

    def mtls_options(self) -> dict[str, str]:
        """The ``kafka.*`` options for the SSL listener, in Spark's spelling: a PEM key store."""
        return {"kafka.bootstrap.servers": self.mtls_bootstrap, "kafka.security.protocol": "SSL",
                "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(self.ca),
                "kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": str(self.client_pem)}


def _secured(directory: Path, sasl: int, mtls: int) -> tuple[Secured, Path]:
    """The CAs, the broker's PEM key store and a client's (under ``directory``); the broker's file."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = certificate(directory, "segack-test-ca", None, None)
    _, other_ca = certificate(directory, "segack-other-ca", None, None)
    files = {}
    for name in ("broker", "client"):
        key, signed = certificate(directory, name, str(ca), str(ca_key))
        files[name] = directory / f"{name}.pem"
        files[name].write_text(key.read_text() + signed.read_text())
    secured = Secured(f"127.0.0.1:{sasl}", f"127.0.0.1:{mtls}", ca, other_ca, files["client"],
                      ("alice", secrets.token_hex(12)), ("bob", secrets.token_hex(12)))
    return secured, files["broker"]


class KafkaBroker:
    """One broker over ``directory``; :attr:`bootstrap` is its plaintext ``HOST:PORT``,
    :attr:`secured` its secured listeners'."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # The ports bound at once: one after the other, a broker was once given the same port twice.
        self.port, self.controller, sasl, mtls = free_ports(4)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.classpath = os.pathsep.join(map(str, maven.kafka_broker()))
        self.properties = directory / "server.properties"
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.secured, server_pem = _secured(directory / "tls", sasl, mtls)
        self.properties.write_text(_PROPERTIES.format(
            port=self.port, controller=self.controller, data=directory / "data", sasl=sasl, mtls=mtls,
            server_pem=server_pem, ca=self.secured.ca, plain_user=self.secured.plain_user[0],
            plain_password=self.secured.plain_user[1]))
        # A cluster id is 16 random bytes in URL-safe base64; one that starts with "-" reads as a flag.
        cluster = "k" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")[1:]
        user, password = self.secured.scram_user
        self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(self.properties),
                   "--standalone", "--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")

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
