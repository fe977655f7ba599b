"""The real-time stream, simulated (FoundationDB-style): its partition tasks
(``segack.spark_adapter.worker.partition_task``), their saves and takeovers
(``store.partitions``) and the driver's group commits (``coordinator.group_commits``), as the
stream runs them, against a model of Kafka (``tests/kafka_model.py``) and a checkpoint in memory,
under schedules hypothesis makes up: records arriving (with transactions' markers, records
aborted, transactions left open, compaction's holes), calls finishing out of order or failing,
saves, commits and store writes that fail, tasks that crash, Spark's retries of a task beside the
attempt they replace (a paused attempt wakes), new runs at ``earliest`` or ``latest``, stops.

After every step: each partition's group offset is at most its saved ``next``, which is at most
the first record not done, and every record the saved intervals call done is; a record is handled
only after its key's earlier records. At the end of each schedule a run with no faults drains the
topic: every record from where the first run started was handled (or set aside), and the group is
where the checkpoint is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from segack.spark_adapter.coordinator import kafka_starts, realtime_jobs
from segack.spark_adapter.coordinator.group_commits import GroupCommits
from segack.spark_adapter.coordinator.stream_partitions import StreamPartitions
from segack.spark_adapter.handlers import Sink
from segack.spark_adapter.options import Handling
from segack.spark_adapter.store.checkpoint import DEAD_KEY_GROUP, DEAD_POSITION, TaskStore
from segack.spark_adapter.store.dead_letter_files import dead_letter_paths
from segack.spark_adapter.store.partitions import PartitionStates
from segack.spark_adapter.worker.kafka_records import RecordEvents
from segack.spark_adapter.worker.partition_task import PartitionPlan, PartitionsTask
from tests.kafka_model import ModelBroker, ModelConsumer
from tests.memory_files import MemoryFiles

TOPIC, GROUP, KEYS = "sim", "sim-group", ("a", "b", "c", "d")
#: The second topic of a schedule that reads two: its partitions are numbered after :data:`TOPIC`'s.
OTHER_TOPIC = "sim-other"
_WORK = ("produce", "step", "finish", "tick", "look")
_EPOCH_FILE = re.compile(r"partition-(\d+)(?:\.e(\d+))?\.json")
#: Schedules per run of the README's test command, and steps each.
SCHEDULES, STEPS = 2000, 30
DEAD_LETTER_SCHEMA = pa.schema([("key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                                ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
                                ("seq", pa.int64()), ("_segack_unparsed", pa.string()),
                                ("_segack_error", pa.string()), ("_segack_attempts", pa.int32()),
                                (DEAD_KEY_GROUP, pa.int32()), (DEAD_POSITION, pa.int64())])


class _Failing(Exception):
    """The handler's failure, on purpose."""


class _Sink(Sink):
    """The simulation's handler, a sink: its calls go to the machine, and so does what the tasks
    say is done for good (:meth:`~segack.spark_adapter.Sink.done_below`)."""

    def __init__(self, machine: RealTimeSimulation) -> None:
        self.machine = machine

    def __call__(self, events: list[dict[str, Any]], identities: list[Any]) -> None:
        self.machine._handler(events)

    def done_below(self, key_group: int, position: int, kept: Any = frozenset()) -> None:
        floors = self.machine.done_below
        floors[key_group] = max(floors.get(key_group, 0), position)
        self.machine.kept[key_group] = frozenset(kept)


@dataclass
class Attempt:
    """One attempt of one task: its object, its consumer, and its calls not yet made."""

    run: Run
    task: PartitionsTask
    consumer: ModelConsumer
    calls: list[Any] = field(default_factory=list)
    #: While set, a call starts at once (the task drains: its calls in flight finish).
    draining: bool = False


@dataclass
class Run:
    """One run of the stream: its claim, its store view, its driver's group commits."""

    number: int
    store: TaskStore
    plan: PartitionPlan
    group: GroupCommits


class RealTimeSimulation(RuleBasedStateMachine):
    """One schedule."""

    def __init__(self) -> None:
        super().__init__()
        self.broker = ModelBroker()
        self.files = MemoryFiles()
        #: Its own, as a new checkpoint's (a process keeps what it read of a checkpoint's positions).
        self.checkpoint_id = uuid.uuid4().hex
        self.now = 0.0
        self.runs: list[Run] = []
        self.attempts: list[Attempt] = []
        #: ``(partition, offset)`` of each call's records that finished, and the keys' handled order.
        self.handled: set[tuple[int, int]] = set()
        self.failing = False
        #: Records handled before an earlier one of their key, or handed after their partition was
        #: said done below them (none, ever).
        self.disorders: list[str] = []
        #: What the tasks said is done for good, by partition (no call may hand a record below).
        self.done_below: dict[int, int] = {}
        #: The keys each partition's last ``done_below`` said to keep (their dead letters).
        self.kept: dict[int, frozenset[Any]] = {}
        #: The highest settled ``next`` each partition has had (it never goes back).
        self.settled: dict[int, int] = {}
        #: Where the first run started each partition: every record from there on must be handled.
        self.origin: dict[int, int] = {}
        self.open_transactions: list[tuple[int, int]] = []
        self._letters: dict[str, set[tuple[int, int]]] = {}
        self.seq = 0

    # ------------------------------------------------------------------ set-up

    @initialize(partitions=st.integers(1, 3), topics=st.integers(1, 2), tasks=st.integers(1, 2),
                concurrency=st.integers(1, 3),
                pending=st.integers(1, 6), batch=st.sampled_from([None, 2]),
                on_error=st.sampled_from(["dead-letter", "stop"]), eof=st.booleans(), quirk=st.booleans(),
                starting=st.sampled_from(["earliest", "latest"]), backlog=st.integers(0, 6))
    def start(self, partitions: int, topics: int, tasks: int, concurrency: int, pending: int,
              batch: int | None, on_error: str, eof: bool, quirk: bool, starting: str, backlog: int) -> None:
        self.partitions, self.tasks = partitions, min(tasks, partitions)
        # Two topics (where there are partitions for both): the stream's partitions by number, the
        # second topic's after the first's, as a real-time stream numbers them.
        first = partitions - partitions // 2 if topics == 2 else partitions
        counts = ((TOPIC, first), (OTHER_TOPIC, partitions - first))
        self.pairs = StreamPartitions(tuple((name, count) for name, count in counts if count)).pairs
        self.numbers = {pair: number for number, pair in enumerate(self.pairs)}
        self.handling = Handling(concurrency=concurrency, max_pending=pending, batch_size=batch,
                                 on_error=on_error)
        # The user's settings may ask for EOF events; librdkafka from 2.2 to 2.13.0 has the quirk.
        self.settings = {"bootstrap.servers": "model:9092"}
        if eof:
            self.settings["enable.partition.eof"] = "true"
        self.broker.eof_quirk = quirk
        self.starting = starting
        self.broker.create_topic(TOPIC, first)
        if partitions > first:
            self.broker.create_topic(OTHER_TOPIC, partitions - first)
        for index in range(backlog):
            self._produce(index % partitions, KEYS[index % len(KEYS)])
        self._new_run()

    # ------------------------------------------------------------------ the parts

    def _produce(self, partition: int, key: str) -> None:
        self.seq += 1
        self.broker.produce(*self.pairs[partition], key.encode(), json.dumps({"seq": self.seq}).encode())

    def _handler(self, events: list[dict[str, Any]]) -> None:
        """The handler: a list of events (one, or up to ``batch_size``), each key's in order."""
        if self.failing:
            raise _Failing("the schedule fails this call")
        for event in events:
            partition, offset = self.numbers[(event["topic"], event["partition"])], event["offset"]
            # In its key's order: every earlier record of the key (from the origin on) was handled
            # (one set aside parks its key: the key's later records are set aside behind it).
            earlier = [at for at, entry in self.broker.deliverable(*self.pairs[partition]).items()
                       if self.origin.get(partition, 0) <= at < offset and entry.key == event["key"].encode()]
            missing = [at for at in earlier if (partition, at) not in self.handled]
            if missing:  # said by an invariant: raised here, it would be the handler's failure
                self.disorders.append(f"{event['key']}@{partition}/{offset} handled before {missing}")
            self.handled.add((partition, offset))

    def _handed(self, attempt: Attempt | None, call: Any) -> None:
        """A call starts: if its attempt holds the partition (an older one may not know yet that it
        does not: its sink is fenced by then, KafkaSink's by the newer holder's producer), none of
        its records may be below what the partition was said done below."""
        if attempt is None:
            return
        for _, _, event in call.args[0]:
            partition = self.numbers[(event["topic"], event["partition"])]
            floor = self.done_below.get(partition, 0)
            if event["offset"] < floor and self._top_epoch(partition) == attempt.task.leases[partition].epoch:
                self.disorders.append(f"{partition}/{event['offset']} handed by its holder after the "
                                      f"partition was said done below {floor}")

    def _new_run(self) -> None:
        """A run takes the checkpoint over (its claim the newest), records where the partitions
        nobody has held start, and starts its tasks, as the driver does; a store that fails on the
        way fails the run (the next one starts again)."""
        number = len(self.runs) + 1
        self._unfailing(self.files.write, self.files.path("claims", f"{number:012d}.json"), b"{}")
        store = TaskStore(self.files.root, f"run{number}", number)
        store.files, store.partitions = self.files, PartitionStates(self.files, self.files.root)
        pairs = self.pairs
        group = GroupCommits(self.settings, GROUP, pairs, consumer=self._consumer)
        partitions = list(range(self.partitions))
        committed = group.read(partitions, sleep=lambda seconds: None)
        starts = kafka_starts.partition_starts(self._consumer({}), pairs, partitions,
                                               {TOPIC: self.starting, OTHER_TOPIC: self.starting}, committed)
        handler = self._handler_of_run(number)
        try:
            realtime_jobs.record_starts(store, pairs, starts, store.run_id, number)
            store.dead_letter_keys("key")  # the driver reads them too, for the retry
        except OSError:
            return
        for partition, offset in starts.items():
            self.origin.setdefault(partition, offset)
        plan = PartitionPlan(
            store=store, handler=handler, handling=self.handling, sources=pairs,
            assignment=tuple(tuple(range(self.partitions))[index::self.tasks] for index in range(self.tasks)),
            starts=starts, consumer=self.settings, records=RecordEvents((("seq", "bigint"),), "UTC"),
            checkpoint_id=self.checkpoint_id, commit_interval=1.0, group=GROUP,
            dead_letter_schema=DEAD_LETTER_SCHEMA)
        run = Run(number, store, plan, group)
        self.runs.append(run)
        for task in range(self.tasks):
            self._start_attempt(run, task)

    def _handler_of_run(self, number: int) -> Sink:
        """The handler the run ``number``'s driver has prepared, before its tasks start."""
        return _Sink(self)

    def _handler_of_attempt(self, run: Run, task: int) -> Sink:
        """What an attempt of ``task`` calls: the run's handler (a real run's is a pickled copy)."""
        return run.plan.handler

    def _consumer(self, config: dict[str, Any]) -> ModelConsumer:
        return ModelConsumer(self.broker, config)

    def _start_attempt(self, run: Run, task: int) -> None:
        holder: list[Attempt] = []

        def start(call: Any) -> None:
            attempt = holder[0] if holder else None
            self._handed(attempt, call)
            if attempt is None or attempt.draining:
                call()
            else:
                attempt.calls.append(call)

        try:
            plan = dataclasses.replace(run.plan, handler=self._handler_of_attempt(run, task))
            work = PartitionsTask(plan, task, consumer=self._consumer, clock=lambda: self.now,
                                  start=start, consume_wait=0.0)
            consumer = work.open()
        except OSError:
            return  # the store failed as the attempt began: Spark fails the task
        attempt = Attempt(run, work, consumer)
        holder.append(attempt)
        for reader in work.readers.values():
            self._drains_at_once(attempt, reader.dispatcher)
        self.attempts.append(attempt)

    def _drains_at_once(self, attempt: Attempt, dispatcher: Any) -> None:
        """A drain (a stop, a failure, the end) makes the attempt's calls in flight finish, as threads
        would: here, at once."""
        drain = dispatcher.drain

        def draining(timeout: float | None = None) -> bool:
            attempt.draining = True
            while attempt.calls:
                attempt.calls.pop(0)()
            return bool(drain(timeout))

        dispatcher.drain = draining

    def _top_epoch(self, partition: int) -> int:
        """The partition's highest epoch, from its files' names."""
        listed = self._unfailing(self.files.list, self.files.path("partitions"))
        names = (_EPOCH_FILE.fullmatch(path.rsplit("/", 1)[-1]) for path, _ in listed)
        return max((int(found[2] or 0) for found in names if found and int(found[1]) == partition), default=0)

    def _unfailing(self, operation: Any, *arguments: Any) -> Any:
        """``operation(*arguments)`` on the store, as the simulation looks: no fault, no pause."""
        failing, meanwhile = self.files.failing, self.files.meanwhile
        self.files.failing, self.files.meanwhile = [], None
        try:
            return operation(*arguments)
        finally:
            self.files.failing, self.files.meanwhile = failing, meanwhile

    def _set_aside(self) -> set[tuple[int, int]]:
        """``(partition's number, offset)`` of every dead letter the checkpoint holds (its files that
        count, as every reader lists them; each read once)."""
        paths = self._unfailing(dead_letter_paths, self.files)
        for path in paths:
            if path not in self._letters:
                data = self._unfailing(self.files.read, path)
                table = pq.read_table(pa.BufferReader(data), columns=["topic", "partition", "offset"])
                self._letters[path] = {(self.numbers[(topic, partition)], offset) for topic, partition, offset
                                       in zip(*(table.column(name).to_pylist()
                                                for name in ("topic", "partition", "offset")), strict=True)}
        return set().union(*(self._letters[path] for path in paths))

    def _step(self, attempt: Attempt) -> None:
        try:
            going = attempt.task.step(attempt.consumer)
        except OSError:
            going = None  # the store failed: the task fails, as Spark sees it
        if going is None:
            self.attempts.remove(attempt)
        elif not going:
            attempt.task.close(attempt.consumer)
            self.attempts.remove(attempt)

    # ------------------------------------------------------------------ the schedule

    def _work(self, action: tuple[Any, ...]) -> None:
        """One ordinary event: records arrive, an attempt steps, a call finishes (or fails), time
        passes, the driver looks."""
        what, first, second = action
        if what == "produce":
            for _ in range(1 + second % 3):
                self._produce(first % self.partitions, KEYS[second % len(KEYS)])
        elif what == "step" and self.attempts:
            attempt = self.attempts[first % len(self.attempts)]
            for _ in range(1 + second % 3):
                if attempt in self.attempts:
                    self._step(attempt)
        elif what == "finish":
            waiting = [attempt for attempt in self.attempts if attempt.calls]
            if waiting:
                attempt = waiting[first % len(waiting)]
                made = attempt.calls.pop(second % len(attempt.calls))
                self.failing = second % 5 == 0
                try:
                    made()
                finally:
                    self.failing = False
        elif what == "tick":
            self.now += (0.3, 1.0, 2.5)[first % 3]
        elif what == "look":
            run = self.runs[-1]
            try:
                views = run.store.partitions.views()
            except OSError:
                return  # the store out of reach: the next look commits
            if run.group.commit(views):
                # A look that commits without failing leaves the group where the checkpoint is,
                # whatever failed before and however idle the partition has been since.
                for partition, view in views.items():
                    if view.settled:
                        assert self.broker.committed(GROUP, *self.pairs[partition]) == view.state["next"], (
                            f"partition {partition}: the group lags the checkpoint after a look")

    @rule(actions=st.binary(min_size=6, max_size=48))
    def work(self, actions: bytes) -> None:
        """Ordinary events, three bytes each (what, and two numbers): one draw for them all, so
        that the schedules' cost is the code's, not their making."""
        for at in range(0, len(actions) - 2, 3):
            what, first, second = actions[at:at + 3]
            self._work((_WORK[what % len(_WORK)], first % 11, second % 11))

    @rule(partition=st.integers(0, 2), key=st.sampled_from(KEYS), count=st.integers(1, 3),
          commit=st.booleans(), left_open=st.booleans())
    def transaction(self, partition: int, key: str, count: int, commit: bool, left_open: bool) -> None:
        partition %= self.partitions
        records = []
        for _ in range(count):
            self.seq += 1
            records.append((key.encode(), json.dumps({"seq": self.seq}).encode()))
        transaction = self.broker.begin(*self.pairs[partition], records)
        if left_open:
            self.open_transactions.append((partition, transaction))
        else:
            self.broker.end(*self.pairs[partition], transaction, commit)

    @precondition(lambda self: self.open_transactions)
    @rule(commit=st.booleans())
    def end_transaction(self, commit: bool) -> None:
        partition, transaction = self.open_transactions.pop(0)
        self.broker.end(*self.pairs[partition], transaction, commit)

    @rule(partition=st.integers(0, 2), offset=st.integers(0, 30))
    def compact(self, partition: int, offset: int) -> None:
        partition %= self.partitions
        if (partition, offset) not in self.handled:  # what a consumer read before compaction stays read
            self.broker.compact(*self.pairs[partition], offset)

    @rule(fault=st.sampled_from(["commit fails", "commit times out", "no coordinator", "write", "create",
                                 "delete", "list", "read", "write:landed", "create:landed",
                                 "delete:landed"]))
    def a_fault(self, fault: str) -> None:
        """The next group commit fails (before or after it is applied), the next reads of what the
        group holds find no coordinator yet, or the store's next operation of a kind."""
        if fault == "no coordinator":
            self.broker.read_faults += 2
        elif fault.startswith("commit"):
            self.broker.commit_faults.append("fail" if fault == "commit fails" else "timeout")
        else:
            self.files.failing.append(fault)

    @precondition(lambda self: self.attempts)
    @rule(which=st.integers(0, 10), task=st.integers(0, 1), steps=st.integers(0, 6),
          writes=st.integers(0, 3))
    def paused_at_a_write(self, which: int, task: int, steps: int, writes: int) -> None:
        """An attempt pauses just before one of its next writes lands (after ``writes`` of them, and
        every look it makes before); meanwhile Spark runs a task again, which steps, finishes its
        calls and saves, and the driver commits; then the paused one goes on."""
        attempt = self.attempts[which % len(self.attempts)]

        def meanwhile() -> None:
            before = list(self.attempts)
            self._start_attempt(self.runs[-1], task % self.tasks)
            for other in [other for other in self.attempts if other not in before]:
                for _ in range(steps):
                    if other in self.attempts:
                        other.draining = True
                        while other.calls:
                            other.calls.pop(0)()
                        self.now += 1.0
                        self._step(other)
            self._work(("look", 0, 0))

        self.files.meanwhile, self.files.meanwhile_after = meanwhile, writes
        self.now += 1.0
        self._step(attempt)
        self.files.meanwhile = None

    @rule(what=st.sampled_from(["crash", "retry", "new run", "new run at latest", "stop"]),
          which=st.integers(0, 10))
    def a_disruption(self, what: str, which: int) -> None:
        """An attempt's process dies (no save, its calls never finish); Spark runs a task again
        beside the attempt it replaces (which may be paused and wake); another run takes the
        checkpoint over, its older attempts not told; a stop is asked."""
        if what == "crash" and self.attempts:
            self.attempts.pop(which % len(self.attempts))
        elif what == "retry":
            self._start_attempt(self.runs[-1], which % self.tasks)
        elif what.startswith("new run") and len(self.runs) < 4:
            self.starting = "latest" if what.endswith("latest") else "earliest"
            self._new_run()
        elif what == "stop":
            with contextlib.suppress(OSError):  # not asked: the operator asks again
                self.runs[-1].store.request_stop("the simulation asks")

    # ------------------------------------------------------------------ invariants

    def _done(self) -> set[tuple[int, int]]:
        """``(partition, offset)`` of the records done: handled, or set aside."""
        return self.handled | self._set_aside()

    def _first_not_done(self, partition: int, done: set[tuple[int, int]]) -> int:
        """The first record from the partition's origin that is neither handled nor set aside (its
        end if none)."""
        origin = self.origin.get(partition, 0)
        for offset in sorted(self.broker.deliverable(*self.pairs[partition])):
            if offset >= origin and (partition, offset) not in done:
                return offset
        return self.broker.ends(*self.pairs[partition])[1]

    @invariant()
    def in_key_order(self) -> None:
        assert not self.disorders, self.disorders

    @invariant()
    def never_ahead(self) -> None:
        if not self.runs:
            return
        views = self._unfailing(PartitionStates(self.files, self.files.root).views)
        done = self._done()
        for partition in range(self.partitions):
            view = views.get(partition)
            if view is None or view.state is None:
                continue
            saved = int(view.state["next"])
            if view.settled:
                assert saved >= self.settled.get(partition, 0), (
                    f"partition {partition}: settled next {saved} back from {self.settled[partition]}")
                self.settled[partition] = saved
            group = self.broker.committed(GROUP, *self.pairs[partition])
            assert group is None or group <= saved, f"partition {partition}: group {group} ahead of {saved}"
            first = self._first_not_done(partition, done)
            assert saved <= first, (
                f"partition {partition}: saved next {saved} past record {first}, not done")
            for low, high in view.state.get("done", []):
                for offset in self.broker.deliverable(*self.pairs[partition]):
                    assert not low <= offset <= high or (partition, offset) in done, (
                        f"partition {partition}: {offset} saved done in [{low}, {high}], not done")

    def teardown(self) -> None:
        """A run with no faults drains the topic: every record from the origin is handled or set
        aside, and the group holds what the checkpoint does."""
        if not self.runs:
            return
        self.files.failing, self.broker.commit_faults, self.broker.read_faults = [], [], 0
        for partition, transaction in self.open_transactions:
            self.broker.end(*self.pairs[partition], transaction, True)
        self.attempts.clear()  # the older attempts are gone for good now
        self.starting = "earliest"
        self._new_run()
        run = self.runs[-1]
        for _ in range(200):
            for attempt in list(self.attempts):
                attempt.draining = True
                while attempt.calls:
                    attempt.calls.pop(0)()
                self._step(attempt)
            self.now += 1.0
            views = run.store.partitions.views()
            if all(view.state is not None
                   and view.state["next"] >= self.broker.ends(*self.pairs[partition])[1]
                   for partition, view in views.items()) and len(views) == self.partitions:
                break
        assert self.attempts, "the run that drains the topic stopped"
        assert run.group.commit_until(run.store.partitions.views, seconds=0, sleep=lambda seconds: None)
        done = self._done()
        for partition in range(self.partitions):
            missing = self._first_not_done(partition, done)
            assert missing >= self.broker.ends(*self.pairs[partition])[1], (
                f"partition {partition}: record {missing} never handled")
            end = self.broker.ends(*self.pairs[partition])[1]
            assert self.broker.committed(GROUP, *self.pairs[partition]) == end


RealTimeSimulation.TestCase.settings = settings(
    max_examples=SCHEDULES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestRealTimeSchedules = RealTimeSimulation.TestCase


# ---------------------------------------------------------------------- the cases, one by one


def _simulation(**start: Any) -> RealTimeSimulation:
    machine = RealTimeSimulation()
    machine.start(**{"partitions": 1, "topics": 1, "tasks": 1, "concurrency": 1, "pending": 4, "batch": None,
                     "on_error": "dead-letter", "eof": False, "quirk": False, "starting": "earliest",
                     "backlog": 0, **start})
    return machine


def _settle(machine: RealTimeSimulation, looks: int = 3) -> None:
    """Every attempt steps, its calls finish, time passes, the driver looks: ``looks`` times."""
    for _ in range(looks):
        for attempt in list(machine.attempts):
            machine._step(attempt)
            while attempt.calls:
                attempt.calls.pop(0)()
            machine.now += 1.0
            machine._step(attempt)
        machine._work(("look", 0, 0))


def test_a_stream_at_latest_killed_before_its_first_save_starts_there_again():
    """Case 1: where a partition starts is recorded before its first record is handed out; the next
    run starts there, not at a later latest."""
    machine = _simulation(starting="latest", backlog=3)
    assert machine.origin == {0: 3}
    assert machine.files.failing == [] and machine.runs[0].store.partitions.read(0)["next"] == 3
    machine.attempts.clear()  # killed at once: no save, no call
    for key in "abc":
        machine._produce(0, key)  # written while no run reads
    machine.a_disruption("new run at latest", 0)
    _settle(machine)
    assert machine.handled == {(0, 3), (0, 4), (0, 5)}
    assert machine.runs[-1].store.partitions.read(0)["next"] == 6


def test_a_partition_caught_up_with_eof_events_saves_the_next_offset_not_one_past_it():
    """Case 2: EOF events asked for in the options are turned off (librdkafka from 2.2 to 2.13.0 then
    reports the position one too far), and a position past the end the consumer knows is never
    saved."""
    machine = _simulation(eof=True, quirk=True, backlog=3)
    [attempt] = machine.attempts
    assert attempt.consumer.config["enable.partition.eof"] is False
    _settle(machine)
    assert machine.runs[0].store.partitions.read(0)["next"] == 3
    assert machine.broker.committed(GROUP, TOPIC, 0) == 3
    # A consumer that gives EOF events anyway, with the quirk, is not believed past the end it knows.
    attempt.consumer.eof = True
    machine._produce(0, "a")
    _settle(machine)
    assert attempt.consumer.position([TopicPartition(TOPIC, 0)])[0].offset == 5  # one too far
    assert machine.runs[0].store.partitions.read(0)["next"] == 4
    machine._produce(0, "b")
    _settle(machine)
    assert (0, 4) in machine.handled and machine.runs[0].store.partitions.read(0)["next"] == 5


def test_a_failed_group_commit_is_made_again_while_the_partition_is_idle_and_by_the_next_run():
    """Case 3: the driver commits what the checkpoint holds until the group has it, whether the
    partition moves or not; a stop that could not commit leaves it to the next run."""
    machine = _simulation(backlog=2)
    machine.broker.commit_faults = ["fail"]
    _settle(machine, looks=1)
    assert machine.broker.committed(GROUP, TOPIC, 0) is None  # the commit failed; nothing moves since
    _settle(machine, looks=1)
    assert machine.broker.committed(GROUP, TOPIC, 0) == 2
    machine._produce(0, "a")
    _settle(machine, looks=1)
    assert machine.broker.committed(GROUP, TOPIC, 0) == 3
    machine.broker.commit_faults = ["fail"] * 5
    machine._produce(0, "b")
    _settle(machine, looks=1)
    run = machine.runs[-1]
    assert not run.group.commit_until(run.store.partitions.views, seconds=0, sleep=lambda seconds: None)
    assert machine.broker.committed(GROUP, TOPIC, 0) == 3  # the stop gave up: the group lags
    machine.broker.commit_faults = []
    machine.attempts.clear()
    machine.a_disruption("new run", 0)
    machine._work(("look", 0, 0))
    assert machine.broker.committed(GROUP, TOPIC, 0) == 4


def test_a_run_started_while_the_groups_coordinator_is_not_ready_asks_again_and_goes_on():
    """A broker just started answers the read of what a group holds with NOT_COORDINATOR (seen on
    Python 3.13 and PySpark 4.1.1, the broker a few seconds old): a run asks again, it does not stop."""
    machine = _simulation(backlog=2)
    _settle(machine, looks=1)
    machine.attempts.clear()
    machine.broker.read_faults = 3
    machine.a_disruption("new run", 0)
    assert machine.broker.read_faults == 0 and len(machine.runs) == 2
    machine._produce(0, "a")
    _settle(machine, looks=1)
    assert machine.broker.committed(GROUP, TOPIC, 0) == 3


def test_an_attempt_paused_before_its_save_writes_nothing_that_counts_once_taken_over():
    """Case 7: the save is fenced by the write itself: an attempt paused after its looks and before
    its write, taken over meanwhile, writes into an epoch nobody reads; the checkpoint and the group
    never go back."""
    machine = _simulation(backlog=2)
    _settle(machine)
    [stale] = machine.attempts
    for key in "abc":
        machine._produce(0, key)
    machine._step(stale)
    assert len(stale.calls) == 1  # offset 2 in a call: its save will say next=2 at most
    saved: list[int] = []

    def meanwhile() -> None:
        machine.a_disruption("retry", 0)
        newer = machine.attempts[-1]
        for _ in range(4):
            newer.draining = True
            machine.now += 1.0
            machine._step(newer)
        machine._work(("look", 0, 0))
        saved.append(machine.runs[-1].store.partitions.read(0)["next"])

    machine.files.meanwhile = meanwhile
    machine.now += 1.0
    machine._step(stale)
    assert saved == [5] and machine.broker.committed(GROUP, TOPIC, 0) == 5
    assert machine.runs[-1].store.partitions.read(0)["next"] == 5  # not the stale attempt's 2
    # Its look after the writes finds the newer epoch: it stops there, and tells its sink nothing.
    assert stale.task.fenced and stale not in machine.attempts
    assert machine.done_below == {0: 5}
    machine.never_ahead()


def test_a_real_time_tasks_positions_follow_the_keys_in_flight_not_every_key_ever_seen():
    """Case 5: 3 million keys seen once each (order ids) through one partition of positions, as a
    real-time task applies them (a call every 1,000 records) and saves (every 10,000): the positions
    it holds stay those of the records in flight, and so does their memory, measured over the last
    100,000 keys (traced from the 2,900,000th on); a key seen again keeps its position as long as it
    could skip an event."""
    import tracemalloc

    from segack.sinks.kafka_positions import PositionsPartition

    keys, call, save, traced = 3_000_000, 1_000, 10_000, 100_000
    partition = PositionsPartition("positions", 0, "checkpoint/")
    held = 0
    for first in range(0, keys, call):
        if first == keys - traced:
            tracemalloc.start()
        partition.record({f"7/order-{offset}": offset for offset in range(first, first + call)})
        held = max(held, len(partition.positions))
        if (first + call) % save == 0:
            partition.forget_below(7, first)  # saved: all done below the call still in flight
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held == save + call and len(partition.positions) == call
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB at the peak"
    print(f"3,000,000 keys: at most {held:,} held, {peak / 2**20:.2f} MiB at the peak of the last 100,000")
    # Another key group's keys, and this one's at or above the point, stay.
    partition.record({"8/order-1": 1, "7/again": keys + 5})
    assert partition.forget_below(7, keys + 5) == [f"7/order-{offset}" for offset in range(keys - call, keys)]
    assert partition.positions == {"8/order-1": 1, "7/again": keys + 5}


def test_an_attempt_taken_over_before_its_write_tells_its_sink_nothing_is_done():
    """After the review: an attempt paused between its look and its write, taken over meanwhile,
    must not tell its sink that the records it saved (into an epoch nobody reads) are done for good:
    the new holder hands them again, and a KafkaSink that dropped their positions would apply them
    twice."""
    machine = _simulation(backlog=2)
    _settle(machine)
    [stale] = machine.attempts
    for key in "cd":
        machine._produce(0, key)
    machine._step(stale)
    while stale.calls:
        stale.calls.pop(0)()  # 2 and 3 handled: its next save says next=4
    machine.files.meanwhile = lambda: machine.a_disruption("retry", 0)
    machine.now += 1.0
    machine._step(stale)
    newer = machine.attempts[-1]
    assert newer.task.readers[0].start == 2 and stale.task.fenced
    assert machine.done_below.get(0, 0) <= 2
    for _ in range(3):
        newer.draining = True
        machine.now += 1.0
        machine._step(newer)
    assert machine.handled >= {(0, 2), (0, 3)} and machine.done_below == {0: 4}
    machine.in_key_order()


def test_a_dead_letter_an_attempt_writes_after_a_takeover_is_none():
    """After the review: an attempt sets a record aside, and is taken over before its dead letter
    lands; the new holder handles the record. The letter counts for nothing (no epoch's progress
    vouches for it): the next run parks nothing and hands nothing again."""
    machine = _simulation(backlog=2)  # a@0, b@1
    machine._produce(0, "a")  # a@2
    [stale] = machine.attempts
    machine._step(stale)
    machine.failing = True
    stale.calls.pop(0)()  # a@0 fails: a@0, and a@2 behind it, set aside
    machine.failing = False

    def meanwhile() -> None:
        machine.a_disruption("retry", 0)
        newer = machine.attempts[-1]
        for _ in range(4):
            newer.draining = True
            machine.now += 1.0
            machine._step(newer)

    machine.files.meanwhile = meanwhile
    machine.now += 1.0
    machine._step(stale)
    assert machine.handled == {(0, 0), (0, 1), (0, 2)}
    assert any("-rt-p00000-e0000000002-" in path for path, _ in machine.files.list(  # it landed
        machine.files.path("dead-letters")))
    assert machine._set_aside() == set() and machine.runs[-1].store.dead_letter_keys("key") == frozenset()
    machine.in_key_order()


def test_a_key_with_dead_letters_keeps_its_position_in_the_sink_whatever_the_progress():
    """After the second review: a record set aside is below the partition's next once saved, but a
    retry hands it again (and one whose call's end was unknown may have been applied): the task
    tells its sink to keep its key's position, in this attempt and in the next, which parks it."""
    machine = _simulation(backlog=2)  # a@0, b@1
    [attempt] = machine.attempts
    machine._step(attempt)
    machine.failing = True
    attempt.calls.pop(0)()  # a@0 fails: set aside
    machine.failing = False
    _settle(machine)
    assert machine.done_below == {0: 2} and machine.kept == {0: frozenset({"a"})}
    machine.a_disruption("retry", 0)
    _settle(machine)
    assert machine.kept == {0: frozenset({"a"})}


def test_a_key_set_aside_in_one_topic_is_not_parked_in_another_by_a_later_run():
    """A key with dead letters in one topic's partition parks its records there alone: the same key
    in another topic is another key, in every later attempt as in the one that set it aside."""
    machine = _simulation(partitions=2, topics=2)
    assert machine.pairs == ((TOPIC, 0), (OTHER_TOPIC, 0))
    machine.failing = True
    machine._produce(0, "a")
    _settle(machine)
    machine.failing = False
    assert machine._set_aside() == {(0, 0)}
    machine.attempts.clear()
    machine.a_disruption("new run", 0)
    machine._produce(1, "a")
    machine._produce(0, "a")
    _settle(machine)
    assert machine.handled == {(1, 0)}  # the other topic's a is handled; this topic's waits behind its letter
    assert machine._set_aside() == {(0, 0), (0, 1)}
