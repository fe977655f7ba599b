"""The fault campaign: a Kafka stream into PostgreSQL through a sink, killed (SIGKILL) at each named
crash point of the protocol (``segack.spark_adapter.store.crash_points``), then resumed; after it,
nothing lost, nothing applied twice, each key in order, and no consumer group offset ever ahead of
what is done.

Each case: run A streams a topic of 900 records with ``SEGACK_CRASH_AT=POINT@N`` in its
environment (the driver or an executor's Python worker that passes the point dies there); a
``segack scale`` on the checkpoint, with the same environment, asks for another segment set; run B
resumes with no fault, the ledger's refusal fixed and the dead letters retried, and drains the
topic. A key's event is refused until it is fixed: under ``--on-error dead-letter`` it and its
key's later events become dead letters (the dead-letter points), under ``--on-error stop`` the
task asks the others to stop (the stop-request points).

The dead letters' removal is passed only by their retry: for its points, a retry run dies there
between A and B.

``nox -s faults`` runs every point (and prints covered / total); ``nox -s connectors`` runs
:data:`SAMPLE`, as the README's test command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from segack.cli import ExitCode
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.crash_points import ENV, POINTS
from tests.spark_handlers import KAFKA_OUTPUT_ENV, fold
from tests.test_kafka import (
    ROOT,
    _ledger,
    account_events,
    committed_offsets,
    end_offsets,
    environment,
    make_topic,
    produce,
    stream_command,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
TOPIC = "faults"
#: The points the README's test command kills at too (``nox -s connectors``): a task's Python worker
#: just after its sink committed, and the driver at the end of a micro-batch, before Spark's commit
#: log.
SAMPLE = ("after-sink-commit", "batch-end")
#: Points a task passes when it stops the others: run A then refuses with --on-error stop.
STOPPING = ("before-stop-request", "after-stop-request")
#: Points only the dead letters' retry passes: run A sets them aside, and a retry dies there.
IN_RETRY = ("before-dead-letters-delete", "after-dead-letters-delete")
#: The passage to die at: the second, so that some work is done first, but the first where a point
#: is passed once in a run, or as often as the watcher's looks fall (the stream view: written when it
#: changes, which two micro-batches done in one look make once).
#: The points a :class:`~segack.sinks.KafkaSink` stream is killed at too: its positions topic made
#: and recorded (the driver), a transaction about to commit and just committed (a task).
KAFKA_SINK_POINTS = ("after-sink-setup", "before-sink-commit", "after-sink-commit")
ONCE = ("before-claim", "after-claim", "before-sink-setup", "after-sink-setup", "before-stop-request",
        "after-stop-request", "before-segments-request", "after-segments-request",
        "before-dead-letters-delete", "after-dead-letters-delete", "before-claim-delete",
        "after-claim-delete", "before-stream-view", "after-stream-view")


@dataclass(frozen=True)
class FaultTopic:
    """The campaign's topic: its records, and where each one is (partition, offset)."""

    records: list[tuple[str, bytes]]
    where: dict[tuple[str, int], tuple[int, int]]

    def below(self, committed: dict[int, int]) -> set[tuple[str, int]]:
        """The records below each partition's committed offset."""
        return {pair for pair, (partition, offset) in self.where.items()
                if offset < committed.get(partition, 0)}


@pytest.fixture(scope="session")
def fault_topic(kafka_broker) -> FaultTopic:
    """900 account records over 3 partitions, written once per broker: session-scoped, since a
    worker that runs this module's cases between others' (``--long-tests-early`` orders by length)
    would otherwise set a module fixture up again and find the topic there."""
    from confluent_kafka import Consumer, TopicPartition

    make_topic(kafka_broker.bootstrap, TOPIC, 3)
    records = account_events(900, users=40, seed=42)
    produce(kafka_broker.bootstrap, TOPIC, records)
    where: dict[tuple[str, int], tuple[int, int]] = {}
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "faults-reader",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0) for partition in range(3)])
        while len(where) < len(records):
            message = consumer.poll(10)
            assert message is not None, "the campaign's topic could not be read back"
            pair = (message.key().decode(), json.loads(message.value())["seq"])
            where[pair] = (message.partition(), message.offset())
    finally:
        consumer.close()
    return FaultTopic(records, where)


def _case(point: str) -> pytest.param:
    marks = [pytest.mark.fault_sample] if point in SAMPLE else [pytest.mark.faults]
    return pytest.param(point, marks=marks, id=point)


def _run(tmp_path: Path, bootstrap: str, dsn: str | None, group: str, *extra: str, run: str,
         crash: str | None, handler: str = "tests.spark_handlers:faults_sink", outputs: str | None = None,
         ) -> subprocess.CompletedProcess[str]:
    command = stream_command(tmp_path, bootstrap, TOPIC, handler,
                             "--commit-offsets-to", group, "--segments", "2", "--option",
                             "maxOffsetsPerTrigger=300", "--flush-every", "50", "--flush-interval", "0.2",
                             *extra)
    env = environment(tmp_path, run, dsn, bootstrap, TOPIC)
    if outputs is not None:
        env[KAFKA_OUTPUT_ENV] = outputs
    env.pop(ENV, None)
    if crash is not None:
        env[ENV] = crash
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _crashed(done: subprocess.CompletedProcess[str]) -> str | None:
    """Which process the point killed: the driver (SIGKILL), a task's Python worker (the job failed
    with it), or none (the run never passed the point)."""
    if done.returncode == -9:
        return "driver"
    if "Python worker exited unexpectedly" in done.stderr:
        return "worker"
    return None


def _set_aside(checkpoint: Path) -> set[tuple[str, int]]:
    store = CheckpointStore(str(checkpoint))
    if not store.exists():
        return set()
    letters = store.read_dead_letters(["user", "seq"])
    return set() if letters is None else set(zip(letters.column("user").to_pylist(),
                                                 letters.column("seq").to_pylist(), strict=True))


@pytest.mark.parametrize("point", [_case(point) for point in POINTS])
def test_a_stream_killed_at_a_crash_point_and_resumed_loses_and_repeats_nothing(
        tmp_path, kafka_broker, pg_database, fault_topic, point):
    bootstrap, group = kafka_broker.bootstrap, f"faults-{point}"
    on_error = "stop" if point in STOPPING else "dead-letter"
    crash = f"{point}@1" if point in ONCE else f"{point}@2"
    first = _run(tmp_path, bootstrap, pg_database, group, "--on-error", on_error, run="A",
                 crash=None if point in IN_RETRY else crash)
    killed = _crashed(first)
    # Never ahead: every record below a committed offset is in the ledger or set aside.
    below = fault_topic.below(committed_offsets(bootstrap, TOPIC, group))
    assert below <= set(_ledger(pg_database)[0]) | _set_aside(tmp_path / "checkpoint"), point
    scale = subprocess.run([sys.executable, "-m", "segack", "scale", str(tmp_path / "checkpoint"),
                            "--segments", "3"], cwd=ROOT, env={**environment(tmp_path, "S"), ENV: crash},
                           capture_output=True, text=True, timeout=120)
    assert scale.returncode in (ExitCode.OK, ExitCode.REFUSED, -9), scale.stderr
    killed = killed or ("segack scale" if scale.returncode == -9 else None)
    if point in IN_RETRY:
        retried = _run(tmp_path, bootstrap, pg_database, group, "--retry-dead-letters", run="fixed",
                       crash=crash)
        killed = killed or _crashed(retried)
    resumed = _run(tmp_path, bootstrap, pg_database, group, "--retry-dead-letters", run="fixed", crash=None)
    assert resumed.returncode == ExitCode.OK, (point, killed, first.stderr[-2000:], resumed.stderr[-3000:])
    rows, balances = _ledger(pg_database)
    pairs = list(fault_topic.where)
    assert len(rows) == len(set(rows)), f"{point}: an event applied twice"
    assert set(rows) == set(pairs), f"{point}: events lost: {sorted(set(pairs) - set(rows))[:5]}"
    last: dict[str, int] = {}
    for user, seq in rows:
        assert seq == last.get(user, -1) + 1, f"{point}: {user} {seq} applied after {last.get(user)}"
        last[user] = seq
    expected: dict[str, int] = {}
    for user, seq in sorted(pairs):
        expected[user] = fold(expected.get(user, 0), seq)
    assert balances == expected
    assert committed_offsets(bootstrap, TOPIC, group) == end_offsets(bootstrap, TOPIC)
    assert killed is not None, f"{point}: no process passed the point: the case proves nothing"


@pytest.mark.faults
@pytest.mark.sinks
@pytest.mark.parametrize("point", KAFKA_SINK_POINTS)
def test_a_kafka_sink_stream_killed_at_a_sink_point_and_resumed_sends_each_output_once(
        tmp_path, kafka_broker, fault_topic, point):
    from tests.test_kafka_sink import _outputs, assert_each_event_once_in_order, committed_records

    bootstrap, group, outputs = kafka_broker.bootstrap, f"kafka-faults-{point}", f"kafka-faults-{point}"
    _outputs(bootstrap, outputs)
    crash = f"{point}@1" if point in ONCE else f"{point}@2"
    first = _run(tmp_path, bootstrap, None, group, "--on-error", "dead-letter", run="A", crash=crash,
                 handler="tests.spark_handlers:kafka_faults_sink", outputs=outputs)
    killed = _crashed(first)
    # Never ahead: every record below a committed offset has its output, or is set aside.
    sent = {(row["user"], row["seq"]) for row in committed_records(bootstrap, f"{outputs}-ledger")}
    assert fault_topic.below(committed_offsets(bootstrap, TOPIC, group)) <= sent | _set_aside(
        tmp_path / "checkpoint"), point
    resumed = _run(tmp_path, bootstrap, None, group, "--retry-dead-letters", run="fixed", crash=None,
                   handler="tests.spark_handlers:kafka_faults_sink", outputs=outputs)
    assert resumed.returncode == ExitCode.OK, (point, killed, first.stderr[-2000:], resumed.stderr[-3000:])
    assert_each_event_once_in_order(bootstrap, outputs, fault_topic.records)
    assert committed_offsets(bootstrap, TOPIC, group) == end_offsets(bootstrap, TOPIC)
    assert killed is not None, f"{point}: no process passed the point: the case proves nothing"
