"""The real-time stream into a :class:`~segack.sinks.KafkaSink`, simulated: the schedules of
``tests/test_realtime_simulation.py`` (arrivals, calls out of order or failing, crashes, Spark's
retries beside a paused attempt, takeovers, stops), with each attempt's handler a copy of one
``KafkaSink`` over the model of Kafka (``tests/kafka_model.py``: transactional producers fenced by
``init_transactions``, transactions that fail to commit or must be asked again, the positions topic
and its reader), and the checkpoint in a directory (the sink records its producers and positions
topic there).

After every step: a ``read_committed`` reader of the output topic finds each input record's output
at most once, each key's in the input's order; the group is at most the saved offset, which is at
most the first record neither output nor set aside; no partition's holder hands a record below what
its partition was said done below. At the end a run with no faults drains the topic: every record
from where the first run started is output once, or set aside.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from segack.errors import SegackValueError
from segack.sinks import KafkaOutput, KafkaSink
from segack.spark_adapter.errors import SinkError
from segack.spark_adapter.handlers import RunContext
from segack.spark_adapter.options import Policy
from tests.kafka_model import ModelClients
from tests.memory_files import DiskFiles
from tests.test_realtime_simulation import RealTimeSimulation, Run

#: Schedules per run of the README's test command, and steps each (fewer than the stream's own:
#: each call is a transaction, each new task reads its positions).
SCHEDULES, STEPS = 300, 30
OUTPUT = "sim-out"
#: The machine whose schedule runs now (hypothesis runs one at a time): what the sink's pickled
#: copies reach it by.
_RUNNING: list[KafkaSinkSimulation] = []


def _apply_many(output: KafkaOutput, events: list[dict[str, Any]]) -> None:
    """Each event's output: its topic, partition and offset, keyed by its key (the sink gets only the
    events not applied yet)."""
    machine = _RUNNING[-1]
    if machine.failing:
        raise RuntimeError("the schedule fails this call")
    for event in events:
        output.produce(OUTPUT, value=json.dumps([event["topic"], event["partition"], event["offset"]]),
                       key=event["key"])


class _Clients(ModelClients):
    """The model's clients, pickled by reference to the running machine's broker."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _running_clients, ()


def _running_clients() -> _Clients:
    return _Clients(_RUNNING[-1].broker)


class _ObservedKafkaSink(KafkaSink):
    """A KafkaSink that also tells the machine what its task says is done for good."""

    def done_below(self, key_group: int, position: int, kept: Any = frozenset()) -> None:
        floors = _RUNNING[-1].done_below
        floors[key_group] = max(floors.get(key_group, 0), position)
        super().done_below(key_group, position, kept)


class KafkaSinkSimulation(RealTimeSimulation):
    """One schedule, through a KafkaSink."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="segack-sink-simulation-")
        self.files = DiskFiles(f"{self.directory}/checkpoint")
        self.broker.create_topic(OUTPUT, 2)
        _RUNNING.append(self)

    def _handler_of_run(self, number: int) -> Any:
        sink = _ObservedKafkaSink({"bootstrap.servers": "model:9092"}, apply_many=_apply_many,
                                  topics=[OUTPUT], positions_partitions=2, clients=_Clients(self.broker))
        sink.prepare(RunContext(self.files.root, self.checkpoint_id, "key", "offset", Policy.PER_KEY, 60.0,
                                self.handling.batch_size, number))
        return sink

    def _handler_of_attempt(self, run: Run, task: int) -> Any:
        """The run's sink as Spark hands it to a task: a pickled copy, named after the task (its
        transactional id's end, the same in each attempt)."""
        copy = pickle.loads(pickle.dumps(run.plan.handler))
        copy._task = f"t{task}"
        return copy

    def _outputs(self) -> list[tuple[int, int]]:
        """``(partition's number, offset)`` of each input record whose output a ``read_committed``
        reader sees, in the output topic's order partition by partition."""
        found = []
        for partition in range(len(self.broker.topics[OUTPUT])):
            for _, entry in sorted(self.broker.deliverable(OUTPUT, partition).items()):
                topic, source, offset = json.loads(entry.value)
                found.append((self.numbers[(topic, source)], offset))
        return found

    def _output_keys(self) -> list[bytes | None]:
        """The key of each output :meth:`_outputs` lists (its input record's)."""
        return [entry.key for partition in range(len(self.broker.topics[OUTPUT]))
                for _, entry in sorted(self.broker.deliverable(OUTPUT, partition).items())]

    def _done(self) -> set[tuple[int, int]]:
        return set(self._outputs()) | self._set_aside()

    @invariant()
    def each_output_once_in_key_order(self) -> None:
        outputs = self._outputs()
        assert len(outputs) == len(set(outputs)), f"an output twice: {sorted(outputs)}"
        last: dict[tuple[int, bytes | None], int] = {}
        for (partition, offset), key in zip(outputs, self._output_keys(), strict=True):
            assert offset > last.get((partition, key), -1), f"{key!r}@{partition}/{offset} out of order"
            last[(partition, key)] = offset

    @rule(fault=st.sampled_from(["abortable", "retriable", "landed"]))
    def a_transaction_fails(self, fault: str) -> None:
        """The next transaction's commit fails (the sink aborts it, and the call fails), times out
        (asked again, it commits), or commits with its answer lost (the sink cannot abort it, and
        does not know whether it landed)."""
        self.broker.transaction_faults.append(fault)

    @rule()
    def a_producer_fails_to_start(self) -> None:
        """The next producer start takes its epoch, fencing the earlier ones, and times out."""
        self.broker.init_faults += 1

    def _new_run(self) -> None:
        try:
            super()._new_run()
        except SinkError:
            return  # the driver could not prepare the sink: the run stops before any task

    def teardown(self) -> None:
        try:
            self.broker.transaction_faults, self.broker.init_faults = [], 0
            super().teardown()
        finally:
            _RUNNING.remove(self)
            shutil.rmtree(self.directory, ignore_errors=True)


KafkaSinkSimulation.TestCase.settings = settings(
    max_examples=SCHEDULES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestKafkaSinkSchedules = KafkaSinkSimulation.TestCase


def test_a_kept_key_keeps_its_position_for_a_retry_of_a_letter_whose_commit_landed(tmp_path):
    """After the second review: a call whose commit landed unseen (the answer lost, the abort
    refused) and whose producer could not start again fails for good: a dead letter, though applied.
    Its key is kept when the task says the partition is done below it, so no tombstone erases its
    position, and a retry of the letter (another process, reading the positions afresh) skips it."""
    import uuid

    from segack.sinks import kafka_positions
    from segack.spark_adapter.handlers import EventIdentity
    from tests.kafka_model import ModelBroker

    broker = ModelBroker()
    broker.create_topic(OUTPUT, 1)
    checkpoint_id = uuid.uuid4().hex

    def apply(output: KafkaOutput, event: dict[str, Any]) -> None:
        output.produce(OUTPUT, value=json.dumps(event), key=event["key"])

    def sink() -> KafkaSink:
        made = KafkaSink({"bootstrap.servers": "model:9092"}, apply, topics=[OUTPUT], positions_partitions=1,
                         clients=ModelClients(broker))
        made.prepare(RunContext(str(tmp_path), checkpoint_id, "key", "offset", Policy.PER_KEY, 60.0, None, 1))
        return made

    def call(copy: KafkaSink, key: str, offset: int) -> None:
        copy([{"key": key, "offset": offset}], [EventIdentity(key, 0, offset, checkpoint_id)])

    live = sink()
    live.hold(lambda: True)
    call(live, "k", 0)
    broker.transaction_faults, broker.init_faults = ["landed"], 1
    try:
        call(live, "k", 1)
        raise AssertionError("the call should have failed: its producer could not start again")
    except SinkError:
        pass  # k@1 is set aside as a dead letter, its commit landed
    call(live, "j", 2)  # a producer again: the positions read afresh (k at 1)
    live.done_below(0, 3, kept={"k"})
    call(live, "m", 3)  # the transaction that would carry k's tombstone
    kafka_positions._read.clear()  # the retry runs in another process
    call(sink(), "k", 1)
    outputs = [json.loads(entry.value) for entry in broker.deliverable(OUTPUT, 0).values()]
    assert outputs.count({"key": "k", "offset": 1}) == 1, outputs
    assert [output["offset"] for output in outputs] == [0, 1, 2, 3]


def _prepared_on(broker: Any, directory: Any, **given: Any) -> KafkaSink:
    import uuid

    sink = KafkaSink({"bootstrap.servers": "model:9092"}, lambda output, event: None, topics=[OUTPUT],
                     clients=ModelClients(broker), **given)
    sink.prepare(RunContext(str(directory), uuid.uuid4().hex, "key", "offset", Policy.PER_KEY, 60.0, None, 1))
    return sink


def test_a_positions_topic_is_made_with_three_copies_two_in_sync_or_as_many_as_there_are_brokers(tmp_path):
    from tests.kafka_model import ModelBroker

    made = {}
    for brokers in (1, 2, 5):
        broker = ModelBroker()
        broker.brokers = brokers
        broker.create_topic(OUTPUT, 1)
        sink = _prepared_on(broker, tmp_path / str(brokers))
        [name] = [topic for topic in broker.topics if topic.startswith("segack-positions-")]
        made[brokers] = (broker.replication[name], broker.configs[name]["min.insync.replicas"])
        assert sink._positions == (name, 32)
    assert made == {1: (1, "1"), 2: (2, "2"), 5: (3, "2")}


def test_a_positions_topic_with_fewer_copies_than_asked_is_refused_in_one_line_and_nothing_recorded(tmp_path):
    from tests.kafka_model import ModelBroker

    broker = ModelBroker()
    broker.brokers = 3
    broker.create_topic(OUTPUT, 1)
    broker.create_topic("positions", 4, {"cleanup.policy": "compact"})  # made ahead, one copy
    with pytest.raises(SinkError) as refused:
        _prepared_on(broker, tmp_path / "refused", positions_topic="positions")
    assert str(refused.value) == ("KafkaSink: positions topic positions keeps 1 copy of a partition, fewer "
                                  "than 3: exactly once rests on it; raise its replication factor to 3 "
                                  "(kafka-reassign-partitions), or give positions_replication=1")
    assert not (tmp_path / "refused" / "kafka-positions.json").exists()
    # Asked for one copy, it takes it.
    assert _prepared_on(broker, tmp_path / "taken", positions_topic="positions",
                        positions_replication=1)._positions == ("positions", 4)


@pytest.mark.parametrize("given", [0, -1, True, 2.0, "3"])
def test_a_positions_replication_that_is_no_positive_int_is_refused(given):
    with pytest.raises(SegackValueError, match="positions_replication must be a positive int or None"):
        KafkaSink({"bootstrap.servers": "model:9092"}, lambda output, event: None, topics=[OUTPUT],
                  positions_replication=given)
