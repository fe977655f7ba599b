"""The fault campaign: a Kafka stream into PostgreSQL through a sink, killed (SIGKILL) at each named
crash point of the protocol (``segack.spark_adapter.store.crash_points``), then resumed; after it,
nothing lost, nothing applied twice, each key in order, and no consumer group offset ever ahead of
what is done.

A case kills runs at several points, one after the other (:func:`_cases`): a driver's start-up is
most of a case's time, and four points in one case take five runs, not eight. For each of its points,
:data:`PER_RUN` more records are written to the case's topic and a run streams it with
``SEGACK_CRASH_AT=POINT@N`` in its environment (the driver or an executor's Python worker that passes
the point dies there), so that every run has at least a case of one point's work to pass it in; a
``segack scale`` on the checkpoint, with the same environment, asks for another segment set. After
each, no group offset is ahead. Then a run resumes with no fault, the ledger's refusal fixed and the
dead letters retried, and drains the topic. A key's event is refused until it is fixed: under
``--on-error dead-letter`` it and its key's later events become dead letters (the dead-letter
points), under ``--on-error stop`` the task asks the others to stop (the stop-request points).

The dead letters' removal is passed only by their retry: for its points, a retry run dies there
before the resume.

``nox -s faults`` runs every point (and prints covered / total); ``nox -s connectors`` runs
:data:`SAMPLE`, as the README's test command.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
#: The case the README's test command runs too (``nox -s connectors``): a task's Python worker killed
#: just after its sink committed, then the driver at the end of a micro-batch, before Spark's commit
#: log.
SAMPLE = ("after-sink-commit", "batch-end")
#: Points a task passes when it stops the others: run A then refuses with --on-error stop.
STOPPING = ("before-stop-request", "after-stop-request")
#: Points only the dead letters' retry passes: run A sets them aside, and a retry dies there.
IN_RETRY = ("before-dead-letters-delete", "after-dead-letters-delete")
#: The points a :class:`~segack.sinks.KafkaSink` stream is killed at too: its positions topic made
#: and recorded (the driver), a transaction about to commit and just committed (a task).
KAFKA_SINK_POINTS = ("after-sink-setup", "before-sink-commit", "after-sink-commit")
#: The passage to die at: the second, so that some work is done first, but the first where a point
#: is passed once in a run, or as often as the watcher's looks fall (the stream view: written when it
#: changes, which two micro-batches done in one look make once).
ONCE = ("before-claim", "after-claim", "before-sink-setup", "after-sink-setup", "before-stop-request",
        "after-stop-request", "before-segments-request", "after-segments-request",
        "before-dead-letters-delete", "after-dead-letters-delete", "before-claim-delete",
        "after-claim-delete", "before-stream-view", "after-stream-view")
#: Plain points to a case: a case of ``n`` points takes ``n + 1`` stream runs (each point's, then
#: the resume), so longer chains take fewer runs in all.
CHAIN = 4
#: Records written to a case's topic before each of its killed runs (three micro-batches of
#: ``maxOffsetsPerTrigger=300``).
PER_RUN = 900


class FaultTopic:
    """A case's topic of account records over 3 partitions: those written so far, and where each one
    is (partition, offset)."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.bootstrap, self.name = bootstrap, name
        self.records: list[tuple[str, bytes]] = []
        self.where: dict[tuple[str, int], tuple[int, int]] = {}
        self._seqs: dict[str, int] = {}
        make_topic(bootstrap, name, 3)

    def write(self, count: int) -> None:
        """``count`` more records, each user's ``seq`` going on from the last written, and read back."""
        from confluent_kafka import Consumer, TopicPartition

        records = account_events(count, users=40, seed=42 + len(self.records), start=self._seqs)
        produce(self.bootstrap, self.name, records)
        self.records += records
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "faults-reader",
                             "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(self.name, partition, 0) for partition in range(3)])
            while len(self.where) < len(self.records):
                message = consumer.poll(10)
                assert message is not None, "the campaign's topic could not be read back"
                pair = (message.key().decode(), json.loads(message.value())["seq"])
                self.where[pair] = (message.partition(), message.offset())
        finally:
            consumer.close()

    def below(self, committed: dict[int, int]) -> set[tuple[str, int]]:
        """The records below each partition's committed offset."""
        return {pair for pair, (partition, offset) in self.where.items()
                if offset < committed.get(partition, 0)}


def _cases() -> list[pytest.param]:
    """Every point of :data:`POINTS` in one case: :data:`SAMPLE`'s two, the other plain points
    :data:`CHAIN` to a case, the stopping points in one and the retry points in another (a case's
    runs are one kind's: a stopping point's refuse under ``--on-error stop``, a retry point's die in
    the retry); a case's id is its points, joined by ``+``."""
    plain = [point for point in POINTS if point not in (*SAMPLE, *STOPPING, *IN_RETRY)]
    chains = [SAMPLE, *(tuple(plain[index:index + CHAIN]) for index in range(0, len(plain), CHAIN)),
              STOPPING, IN_RETRY]
    assert sorted(point for chain in chains for point in chain) == sorted(POINTS)
    return [pytest.param(chain, id="+".join(chain),
                         marks=[pytest.mark.fault_sample if chain == SAMPLE else pytest.mark.faults])
            for chain in chains]


def _run(tmp_path: Path, bootstrap: str, topic: str, dsn: str | None, group: str, *extra: str, run: str,
         crash: str | None, handler: str = "tests.spark_handlers:faults_sink", outputs: str | None = None,
         ) -> subprocess.CompletedProcess[str]:
    command = stream_command(tmp_path, bootstrap, topic, handler,
                             "--commit-offsets-to", group, "--segments", "2", "--option",
                             "maxOffsetsPerTrigger=300", "--flush-every", "50", "--flush-interval", "0.2",
                             *extra)
    env = environment(tmp_path, run, dsn, bootstrap, topic)
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


def _crash(point: str) -> str:
    return f"{point}@1" if point in ONCE else f"{point}@2"


def _scale(tmp_path: Path, segments: int, crash: str) -> bool:
    """``segack scale`` to ``segments``, with ``crash`` in its environment; whether it was killed."""
    scale = subprocess.run([sys.executable, "-m", "segack", "scale", str(tmp_path / "checkpoint"),
                            "--segments", str(segments)], cwd=ROOT,
                           env={**environment(tmp_path, "S"), ENV: crash}, capture_output=True, text=True,
                           timeout=120)
    assert scale.returncode in (ExitCode.OK, ExitCode.REFUSED, -9), scale.stderr
    return scale.returncode == -9


@pytest.mark.parametrize("points", _cases())
def test_a_stream_killed_at_crash_points_and_resumed_loses_and_repeats_nothing(
        tmp_path, kafka_broker, pg_database, points):
    bootstrap, group = kafka_broker.bootstrap, f"faults-{'+'.join(points)}"
    topic = FaultTopic(bootstrap, f"faults-{'-'.join(points)}")
    killed: dict[str, str | None] = {}
    for step, point in enumerate(points):
        topic.write(PER_RUN)
        on_error = "stop" if point in STOPPING else "dead-letter"
        first = _run(tmp_path, bootstrap, topic.name, pg_database, group, "--on-error", on_error, run="A",
                     crash=None if point in IN_RETRY else _crash(point))
        killed[point] = _crashed(first)
        # Never ahead: every record below a committed offset is in the ledger or set aside.
        below = topic.below(committed_offsets(bootstrap, topic.name, group))
        assert below <= set(_ledger(pg_database)[0]) | _set_aside(tmp_path / "checkpoint"), point
        # Another set each time: a request of the set the run has is no request.
        if _scale(tmp_path, 3 + step, _crash(point)):
            killed[point] = killed[point] or "segack scale"
        if point in IN_RETRY:
            retried = _run(tmp_path, bootstrap, topic.name, pg_database, group, "--retry-dead-letters",
                           run="fixed", crash=_crash(point))
            killed[point] = killed[point] or _crashed(retried)
    resumed = _run(tmp_path, bootstrap, topic.name, pg_database, group, "--retry-dead-letters", run="fixed",
                   crash=None)
    assert resumed.returncode == ExitCode.OK, (points, killed, first.stderr[-2000:], resumed.stderr[-3000:])
    rows, balances = _ledger(pg_database)
    pairs = list(topic.where)
    assert len(rows) == len(set(rows)), f"{points}: an event applied twice"
    assert set(rows) == set(pairs), f"{points}: events lost: {sorted(set(pairs) - set(rows))[:5]}"
    last: dict[str, int] = {}
    for user, seq in rows:
        assert seq == last.get(user, -1) + 1, f"{points}: {user} {seq} applied after {last.get(user)}"
        last[user] = seq
    expected: dict[str, int] = {}
    for user, seq in sorted(pairs):
        expected[user] = fold(expected.get(user, 0), seq)
    assert balances == expected
    assert committed_offsets(bootstrap, topic.name, group) == end_offsets(bootstrap, topic.name)
    unpassed = [point for point in points if killed[point] is None]
    assert not unpassed, f"no process passed {unpassed}: the case proves nothing of them"


@pytest.mark.faults
@pytest.mark.sinks
def test_a_kafka_sink_stream_killed_at_its_sink_points_and_resumed_sends_each_output_once(
        tmp_path, kafka_broker):
    from tests.test_kafka_sink import _outputs, assert_each_event_once_in_order, committed_records

    bootstrap, group, outputs = kafka_broker.bootstrap, "kafka-faults", "kafka-faults"
    topic = FaultTopic(bootstrap, "kafka-sink-faults")
    _outputs(bootstrap, outputs)
    killed: dict[str, str | None] = {}
    for point in KAFKA_SINK_POINTS:
        topic.write(PER_RUN)
        first = _run(tmp_path, bootstrap, topic.name, None, group, "--on-error", "dead-letter", run="A",
                     crash=_crash(point), handler="tests.spark_handlers:kafka_faults_sink", outputs=outputs)
        killed[point] = _crashed(first)
        # Never ahead: every record below a committed offset has its output, or is set aside.
        sent = {(row["user"], row["seq"]) for row in committed_records(bootstrap, f"{outputs}-ledger")}
        assert topic.below(committed_offsets(bootstrap, topic.name, group)) <= sent | _set_aside(
            tmp_path / "checkpoint"), point
    resumed = _run(tmp_path, bootstrap, topic.name, None, group, "--retry-dead-letters", run="fixed",
                   crash=None, handler="tests.spark_handlers:kafka_faults_sink", outputs=outputs)
    assert resumed.returncode == ExitCode.OK, (killed, first.stderr[-2000:], resumed.stderr[-3000:])
    assert_each_event_once_in_order(bootstrap, outputs, topic.records)
    assert committed_offsets(bootstrap, topic.name, group) == end_offsets(bootstrap, topic.name)
    unpassed = [point for point in KAFKA_SINK_POINTS if killed[point] is None]
    assert not unpassed, f"no process passed {unpassed}: the case proves nothing of them"
