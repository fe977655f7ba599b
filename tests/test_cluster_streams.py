"""Streams on a standalone cluster (``tests/test_clusters.py``'s master and workers on loopback),
losing an executor JVM and then a whole worker while a producer writes: Spark runs the lost tasks
again, and through a sink nothing is lost, nothing is sent twice, and the group is never ahead."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from segack.cli import ExitCode
from segack.spark_adapter.store.checkpoint import CheckpointStore
from segack.spark_adapter.store.partitions import DRIVER
from tests import jvm
from tests.test_clusters import _environment, running_standalone
from tests.test_kafka import (
    ROOT,
    _Producer,
    _wait_for,
    committed_offsets,
    end_offsets,
    make_topic,
    start_stream,
)
from tests.test_kafka_sink import _ledger, _outputs, _sent, assert_each_event_once_in_order

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _executors(worker: int) -> list[int]:
    """The executor JVMs the worker whose process is ``worker`` runs (its children)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:  # ended meanwhile
            continue
        if parent == worker and b"CoarseGrainedExecutorBackend" in command:
            found.append(int(entry))
    return found


def _held(checkpoint: Path) -> int:
    """Partitions a task attempt holds (not the driver's recorded start)."""
    if not checkpoint.exists():
        return 0
    views = CheckpointStore(str(checkpoint)).partitions.views()
    return sum(1 for view in views.values() if view.owner.get("attempt") not in (None, DRIVER))


def _epochs(checkpoint: Path) -> dict[int, int]:
    """Each partition's highest epoch: one more for every task attempt that took it over."""
    views = CheckpointStore(str(checkpoint)).partitions.views()
    return {partition: view.epoch for partition, view in views.items()}


@pytest.mark.faults
@pytest.mark.sinks
@pytest.mark.streams
def test_a_real_time_kafka_sink_stream_loses_an_executor_then_a_worker_and_sends_each_output_once(
        tmp_path, tmp_path_factory, kafka_broker):
    bootstrap, topic, group = kafka_broker.bootstrap, "cluster-real-time", "segack-cluster-real-time"
    make_topic(bootstrap, topic, 2)
    _outputs(bootstrap, topic)
    # The executors unpickle the sink: its module is found as the driver finds it.
    cluster = dict(_environment(), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                          os.environ.get("PYTHONPATH")])))
    checkpoint = tmp_path / "checkpoint"
    with running_standalone(tmp_path_factory.mktemp("standalone"), cluster, workers=2) as (master, workers):
        # Two partitions, two tasks, four slots: a lost task has a slot to run again in.
        process = start_stream(
            tmp_path, bootstrap, topic, "tests.spark_handlers:kafka_ledger_sink", "--trigger", "real-time",
            "--commit-interval", "0.5", "--commit-offsets-to", group, "--concurrency", "4",
            "--master", master, "--shared-local-checkpoint",
            "--conf", f"spark.executor.extraJavaOptions={' '.join(jvm.QUICK)}",
            "--conf", "spark.executor.memory=768m")
        try:
            def sends(more: int) -> None:
                sent = _sent(bootstrap, topic)
                _wait_for(lambda: _sent(bootstrap, topic) >= sent + more, 300, "outputs sent", process)

            def never_ahead() -> None:
                """Every record below a committed offset has its output."""
                assert producer.below(committed_offsets(bootstrap, topic, group)) <= _ledger(bootstrap, topic)

            _wait_for(lambda: _held(checkpoint) == 2, 300, "the tasks holding the partitions", process)
            producer = _Producer(bootstrap, topic, 16_000, seed=41)  # 1,000 a second
            sends(300)
            first = _epochs(checkpoint)
            [executor] = _executors(workers[0].pid)
            os.kill(executor, signal.SIGKILL)
            sends(300)
            never_ahead()
            os.killpg(workers[1].pid, signal.SIGKILL)  # the worker and its executor
            sends(300)
            never_ahead()
            assert producer.thread.is_alive(), "the producer was done before the kills: they prove less"
            producer.thread.join(300)
            _wait_for(lambda: committed_offsets(bootstrap, topic, group) == end_offsets(bootstrap, topic),
                      300, "the group's offsets at the end", process)
            # A lost task ran again: a new attempt took its partitions over, past the first run's epochs.
            later = _epochs(checkpoint)
            assert any(later[partition] > epoch for partition, epoch in first.items()), (first, later)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=180)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(60)
    assert process.returncode == ExitCode.OK, err[-3000:]
    assert "stopped as asked: " in out, out
    assert_each_event_once_in_order(bootstrap, topic, producer.records)
