"""What runs inside a real-time stream's Spark task: Kafka partitions read as their records arrive,
each record handed to its partition's dispatcher, each partition's safe offset recorded and
committed as the calls finish.

The job of a real-time stream (:mod:`~segack.spark_adapter.coordinator.realtime`) runs one task per
slot for as long as the stream runs; each task owns a fixed set of the stream's partitions (of one
topic or several, each with its number: :mod:`~segack.spark_adapter.coordinator.stream_partitions`).
A task goes like this:

1. **Take over** each partition in the checkpoint (``partitions/``,
   :meth:`~segack.spark_adapter.store.partitions.PartitionStates.take_over`): a new epoch of its
   own, holding the progress it starts from: ``next``, the offset below which every record is done,
   and ``done``, the intervals of offsets done above it, as the partition's last holder saved them
   (a retried attempt, an earlier run) or as the driver recorded its start. From then on, nothing an
   earlier holder writes counts.
2. **Read** the partitions with a Kafka consumer of the task's own: partitions assigned, never a
   group's member (no rebalancing), no offset auto-committed, a position out of range an error
   (records gone are never passed over in silence). A partition whose reading is ahead of its
   calls by ``max_pending`` records is paused until calls finish.
3. **Hand** each record to its partition's :class:`~segack.spark_adapter.worker.dispatch.Dispatcher`:
   many calls in flight, never two of one key, lists cut by ``batch_size`` or as soon as the
   consumer has nothing more for now. A record inside a done interval is skipped: an earlier run
   handled it. Its identity is its key, its partition's number (as the key group) and its offset
   (as the position): the same in every run, so a sink's positions work as in micro-batches.
4. **Save**, every ``commit_interval`` seconds, in this order: the dead letters set aside since the
   last save, then each partition's progress into its epoch (its dispatcher's committed point as
   ``next``, its acker's intervals as ``done``). The checkpoint never calls done a record that is
   not. The consumer group is the driver's to commit, from what the checkpoint holds
   (:mod:`~segack.spark_adapter.coordinator.group_commits`): a task paused anywhere cannot move it
   ahead of the checkpoint.
5. **Stop** when the checkpoint asks (the driver, on SIGTERM or Ctrl-C, or another task's end: the
   calls read finish, then a last save), when a call fails for good under ``on_error="stop"`` or
   records a partition needs are gone (the calls in flight finish, no other starts, the last save
   stops before the failing record, the other tasks are asked to stop), or when a newer claim or a
   newer epoch of one of its partitions fences it (every save looks first, and a save that a pause
   carried past the look writes into an epoch nobody reads).

State is bounded per partition: the records read and not yet committed (at most ``max_pending``),
kept as runs of consecutive offsets, and the acker's intervals, never a map per record.
"""

from __future__ import annotations

import bisect
import logging
import pickle
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from segack.spark_adapter.errors import HandlerFailedError, InputError, record_of
from segack.spark_adapter.handlers import (
    EventIdentity,
    Sink,
    close_handler,
    identified_event,
    tell_done_below,
    tell_holds,
    wants_identity,
    with_identities_passed,
)
from segack.spark_adapter.options import Handling
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    TaskStore,
)
from segack.spark_adapter.store.dead_letter_files import real_time_letters_name
from segack.spark_adapter.store.driver_watch import watching_driver
from segack.spark_adapter.store.partitions import Lease
from segack.spark_adapter.worker.dispatch import Dispatcher
from segack.spark_adapter.worker.kafka_records import RecordEvents
from segack.spark_adapter.worker.sequencing import DeadLetter

__all__ = ["RESULT_SCHEMA", "OffsetRuns", "PartitionPlan", "PartitionReader", "PartitionsTask",
           "consumer_config", "run_partitions", "start_state"]

log = logging.getLogger(__name__)

#: One row per task: what it did, and why it ended.
RESULT_SCHEMA = pa.schema([
    ("task", pa.int32()), ("handled", pa.int64()), ("skipped", pa.int64()), ("dead_letters", pa.int64()),
    # What ended the task, pickled: a HandlerFailedError, an InputError; null when asked to stop.
    ("error", pa.binary()), ("fenced", pa.bool_()),
])
#: Records asked of the consumer at once, and how long a look for them waits (seconds).
_CONSUME_AT_ONCE = 500
_CONSUME_WAIT = 0.02


@dataclass(frozen=True)
class PartitionPlan:
    """Everything a real-time job's tasks need, pickled once for all of them."""

    #: The tasks' view of the checkpoint: their run, its claim.
    store: TaskStore
    handler: Callable[..., Any]
    handling: Handling
    #: The stream's partitions by number: ``(topic, partition)``.
    sources: tuple[tuple[str, int], ...]
    #: The partitions (numbers) of each task, by the task's index.
    assignment: tuple[tuple[int, ...], ...]
    #: Where a partition with no progress in the checkpoint starts, by number.
    starts: dict[int, int]
    #: The consumer's settings: the servers and the ``kafka.*`` options given.
    consumer: dict[str, str]
    records: RecordEvents
    checkpoint_id: str
    commit_interval: float
    #: The consumer group, or ``None``: the consumer's ``group.id`` (the driver commits to it).
    group: str | None = None
    #: The dead letters' columns (the events' own, then the dead-letter columns).
    dead_letter_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    #: The run's job these tasks are of (a run starts another when it finds topics to read).
    job: int = 0


class OffsetRuns:
    """Which offset each row (a dispatcher's numbering of the records read) has: runs of
    consecutive offsets, from the committed row on. A gap in the offsets (a transaction's marker,
    a compacted record) starts a new run."""

    def __init__(self) -> None:
        # [first row, first offset, rows], ascending; and the first rows alone, for bisect.
        self._runs: deque[list[int]] = deque()
        self._firsts: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, row: int, offset: int) -> None:
        """Row ``row`` (the next one) is the record at ``offset``."""
        if self._runs:
            last = self._runs[-1]
            if last[0] + last[2] == row and last[1] + last[2] == offset:
                last[2] += 1
                return
        self._runs.append([row, offset, 1])
        self._firsts.append(row)

    def offset(self, row: int) -> int:
        """The offset of ``row`` (read, and not dropped)."""
        first_row, first_offset, _ = self._runs[bisect.bisect_right(self._firsts, row) - 1]
        return first_offset + row - first_row

    def drop_before(self, row: int) -> None:
        """Forget the rows before ``row``: they are committed."""
        while self._runs and self._runs[0][0] + self._runs[0][2] <= row:
            self._runs.popleft()
            self._firsts.popleft()
        if self._runs and self._runs[0][0] < row:
            first = self._runs[0]
            first[1] += row - first[0]
            first[2] -= row - first[0]
            first[0] = row
            self._firsts[0] = row


class PartitionReader:
    """One partition's records, from ``start`` on, to ``dispatcher``: which are done
    (``done_above``: the intervals done above ``start`` that an earlier run recorded), which offset
    is safe to commit, and the partition's progress to record."""

    def __init__(self, partition: int, start: int, done_above: list[list[int]], dispatcher: Dispatcher,
                 earlier: dict[str, Any] | None = None) -> None:
        #: The partition's number (its key group).
        self.partition, self.start, self.dispatcher = partition, start, dispatcher
        self._done_above = deque(sorted((first, last) for first, last in done_above if last >= start))
        self._offsets = OffsetRuns()
        self._rows = 0
        #: The offset after the last record read.
        self.read_to = start
        self.skipped = 0
        self.dead_letters = 0
        #: What earlier runs handled, for the count kept across runs.
        self.handled_before = int((earlier or {}).get("handled_total", 0))
        #: Records read and held back: the dispatcher had no room.
        self.waiting: deque[tuple[int, dict[str, Any]]] = deque()

    def take(self, offset: int, event: dict[str, Any]) -> bool:
        """Hand the record at ``offset`` (after every one read before) to the dispatcher, or skip it
        if it is done; ``False`` if the dispatcher has no room (or has failed): offer it again."""
        done_above = self._done_above
        while done_above and done_above[0][1] < offset:
            done_above.popleft()
        if done_above and done_above[0][0] <= offset:
            self.dispatcher.skip()
            self.skipped += 1
        elif not self.dispatcher.offer(event):
            return False
        self._offsets.add(self._rows, offset)
        self._rows += 1
        self.read_to = offset + 1
        return True

    def state(self, position: int | None = None) -> tuple[dict[str, Any], list[DeadLetter]]:
        """The partition's progress now, and the dead letters set aside since the last call, taken
        at one moment (each dead letter whose record the progress counts done is among them or an
        earlier call's). The progress: ``next`` (every record below it is done), ``done`` (the
        intervals done above it, those an earlier run recorded past ``read_to`` included), ``read``
        and the counts. ``position``: the consumer's, when nothing it fetched waits to be taken
        (past a transaction's marker after the last record). Forgets the rows it no longer needs."""
        rows_read, committed, runs, letters = self.dispatcher.done_rows()
        self.dead_letters += len(letters)
        offsets = self._offsets
        if committed == rows_read:
            next_offset = max(self.read_to, position if position is not None else self.read_to)
        else:
            next_offset = offsets.offset(committed)
        done = [[offsets.offset(first), offsets.offset(last)] for first, last in runs]
        done += [[max(first, self.read_to), last] for first, last in self._done_above if last >= self.read_to]
        offsets.drop_before(committed)
        rows_done = committed + sum(last - first + 1 for first, last in runs)
        return {"next": next_offset, "done": done, "read": self.read_to, "pending": rows_read - committed,
                "handled": rows_done - self.skipped - self.dead_letters, "skipped": self.skipped,
                "dead_letters": self.dead_letters}, letters


def _dead_letter_table(letters: list[tuple[int, DeadLetter]], schema: pa.Schema) -> pa.Table:
    """Dead letters ``(partition, letter)`` as rows of ``schema``: the event's columns, then the
    error, the calls made, the partition's number (the key group) and the offset (the position)."""
    rows = []
    for partition, letter in letters:
        row = dict(letter.event)
        row.update({DEAD_ERROR: letter.error, DEAD_ATTEMPTS: letter.attempts, DEAD_KEY_GROUP: partition,
                    DEAD_POSITION: letter.event["offset"]})
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def start_state(topic: str, partition: int, offset: int, claim: int) -> dict[str, Any]:
    """The progress of a partition (``topic``'s ``partition``) nothing of which is done yet,
    starting at ``offset``."""
    return {"next": offset, "done": [], "read": offset, "pending": 0, "handled": 0, "skipped": 0,
            "dead_letters": 0, "handled_total": 0, "topic": topic, "partition": partition, "claim": claim,
            "end": None, "at": time.time()}


def consumer_config(plan: PartitionPlan) -> dict[str, Any]:
    """A task's consumer settings: the run's, with what the task needs whatever they say. Partitions
    are assigned, never a group's (no rebalancing) and nothing is committed by the client; a
    position out of range is an error (records gone are never passed over in silence); no
    partition-EOF events (librdkafka from 2.2 to 2.13.0 reports a position one too far after one)."""
    return {**plan.consumer, "group.id": plan.group or f"segack-{plan.checkpoint_id}",
            "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": "error",
            "enable.partition.eof": False}


class PartitionsTask:
    """One task's partitions, read until the task stops (steps 1 to 5): :meth:`run` as a Spark task
    does, or :meth:`open`, :meth:`step` and :meth:`close` one at a time.

    ``consumer`` makes the Kafka consumer from its settings (``confluent_kafka.Consumer`` unless
    given), ``clock`` tells the time of the saves (``time.monotonic``), ``start`` runs the handler's
    calls as :class:`~segack.spark_adapter.worker.dispatch.Dispatcher` does with it, and
    ``consume_wait`` is how long a look at the consumer, and a wait for room, may take: a
    simulation gives its own.
    """

    def __init__(self, plan: PartitionPlan, task: int, *,
                 consumer: Callable[[dict[str, Any]], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 start: Callable[[Callable[[], None]], Any] | None = None,
                 consume_wait: float = _CONSUME_WAIT) -> None:
        self.plan, self.task = plan, task
        self.partitions = plan.assignment[task]
        #: Each of the stream's partitions' number, by ``(topic, partition)``.
        self.numbers = {pair: number for number, pair in enumerate(plan.sources)}
        self.handler = plan.handler
        called = with_identities_passed(plan.handler)
        self.identify = wants_identity(plan.handler)
        self.readers: dict[int, PartitionReader] = {}
        self._make_consumer, self.clock, self.consume_wait = consumer, clock, consume_wait
        #: This attempt: a later attempt of the task (Spark's retry) takes the partitions over.
        self.token = uuid.uuid4().hex
        owner = {"run": plan.store.run_id, "claim": plan.store.claim_number, "attempt": self.token,
                 "task": task, "job": plan.job}
        #: Each partition's epoch (step 1).
        self.leases: dict[int, Lease] = {}
        earlier: dict[int, dict[str, Any]] = {}
        for partition in self.partitions:  # 1
            self.leases[partition], earlier[partition] = plan.store.partitions.take_over(
                partition, owner, start_state(*plan.sources[partition], plan.starts[partition],
                                              plan.store.claim_number))
        # Parked: the keys with dead letters once the partitions are held, read after the takeover:
        # an attempt before this one (a retried task's, an older run's still going somewhere) set
        # keys aside up to its last save, which this one starts from. A key parks its own partition
        # alone: a key of two topics is two keys.
        parked = plan.store.dead_letter_places("key")
        #: Each partition's keys with dead letters, of earlier attempts and of this one: their
        #: positions stay in the sink (a retry hands the letters again), whatever its progress.
        self.set_aside_keys: dict[int, set[Any]] = {
            partition: {key for group, key in parked if group == partition} for partition in self.partitions}
        tell_holds(self.handler, self.holds)
        for partition in self.partitions:
            state = earlier[partition]
            dispatcher = Dispatcher(called, _record_key, plan.handling,
                                    parked=frozenset(self.set_aside_keys[partition]), start=start)
            self.readers[partition] = PartitionReader(
                partition, int(state["next"]), list(state.get("done", [])), dispatcher, state)
        # Whether the last look at the consumer took every record it gave (then its position is
        # past nothing not taken).
        self._whole = True
        self._paused: set[int] = set()
        self._next_save = 0.0
        #: Each partition's dead-letter files of each epoch that its progress vouches for (those
        #: its holders wrote before a save that counts them): ``{epoch: files}``, taken over with it.
        self.letter_files = {partition: {str(epoch): int(files) for epoch, files in
                                         earlier[partition].get("letters", {}).items()}
                             for partition in self.partitions}
        #: What ended the task, if not a stop request: a handler's failure, records gone.
        self.error: HandlerFailedError | InputError | None = None
        self.fenced = False
        #: Whether the task has ended (:meth:`step` returns ``False`` from then on).
        self.ended = False
        self.saved_states: dict[int, dict[str, Any]] = {}

    def holds(self) -> bool:
        """Whether this attempt holds its partitions still: no newer claim, no newer epoch of any."""
        store = self.plan.store
        return not store.fenced() and not store.partitions.superseded(self.leases.values())

    def run(self) -> None:
        consumer = self.open()
        try:
            while self.step(consumer):
                pass
        finally:
            self.close(consumer)

    def open(self) -> Any:
        """Step 2: the task's consumer, assigned its partitions where their readers start."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = (self._make_consumer or Consumer)(consumer_config(self.plan))
        consumer.assign([TopicPartition(*self.plan.sources[partition], reader.start)
                         for partition, reader in self.readers.items()])
        self._next_save = self.clock() + self.plan.commit_interval
        return consumer

    def step(self, consumer: Any) -> bool:
        """One look at the consumer and what it has (steps 2 and 3), then a save if one is due
        (step 4) and a stop if one was asked (step 5); ``False`` once the task has ended."""
        from confluent_kafka import KafkaError, TopicPartition

        if self.ended:
            return False
        try:
            caught_up = self._read(consumer, KafkaError, TopicPartition)  # 2, 3
        except InputError as error:
            self._end(consumer, error)
            return False
        if caught_up:
            for reader in self.readers.values():
                reader.dispatcher.send_partial()
        if self._failed() is not None:
            self._end(consumer)
            return False
        if self.clock() >= self._next_save:
            self._next_save = self.clock() + self.plan.commit_interval
            if not self._save(consumer):  # 4
                self.ended = True
                return False
            if self.plan.store.stop_requested():
                self._stop(consumer)  # 5
                return False
        return True

    def close(self, consumer: Any) -> None:
        """Let go of the dispatchers (their calls in flight finish), the consumer and the handler."""
        self.ended = True
        for reader in self.readers.values():
            reader.dispatcher.close()
        consumer.close()
        close_handler(self.handler)

    def _read(self, consumer: Any, kafka_error: Any, topic_partition: Any) -> bool:
        """Offer what waits, then what the consumer has; pause the partitions with no room and resume
        those that have some again. Whether the consumer had nothing more for now. Records gone, a
        topic gone or not readable, or a client that failed for good: an
        :class:`~segack.spark_adapter.InputError`."""
        plan, paused = self.plan, self._paused
        for partition, reader in self.readers.items():
            while reader.waiting and reader.take(*reader.waiting[0]):
                reader.waiting.popleft()
            if partition in paused and not reader.waiting:
                consumer.resume([topic_partition(*plan.sources[partition])])
                paused.discard(partition)
        self._whole = False
        messages = consumer.consume(_CONSUME_AT_ONCE, self.consume_wait)
        for message in messages:
            error = message.error()
            if error is not None:
                _check(error, kafka_error, f"{message.topic()}/{message.partition()}")
                continue
            topic, offset = message.topic(), message.offset()
            partition = self.numbers.get((topic, message.partition()), -1)
            if partition not in self.readers:
                log.warning("Kafka gave a record of %s/%s, a partition this task does not read: left alone",
                            topic, message.partition())
                continue
            reader = self.readers[partition]
            event = plan.records.event(topic, message.partition(), offset, message.key(), message.value(),
                                       message.timestamp()[1], message.headers())
            if self.identify:
                identity = EventIdentity(event["key"], partition, offset, plan.checkpoint_id)
                event = identified_event(event, identity)
            if reader.waiting or not reader.take(offset, event):
                reader.waiting.append((offset, event))
                if partition not in paused:
                    consumer.pause([topic_partition(*plan.sources[partition])])
                    paused.add(partition)
        self._whole = True
        for reader in self.readers.values():
            if reader.waiting:
                reader.dispatcher.wait_for_room(self.consume_wait)
                break
        return len(messages) < _CONSUME_AT_ONCE

    def _position(self, consumer: Any, partition: int, topic_partition: Any) -> int | None:
        """Where the consumer would read ``partition`` next, when that may be saved as ``next``: it
        took every record it fetched, and the position is within the partition as the consumer last
        heard its end (past a transaction's marker, not past the end: librdkafka from 2.2 to 2.13.0
        reports one too far after a partition-EOF event)."""
        reader = self.readers[partition]
        if not self._whole or reader.waiting:
            return None
        [where] = consumer.position([topic_partition(*self.plan.sources[partition])])
        end = _end_offset(consumer, self.plan.sources[partition], topic_partition)
        if where.offset < 0 or end is None or where.offset > end:
            return None
        return int(where.offset)

    def _save(self, consumer: Any) -> bool:
        """Step 4: the dead letters, then each partition's progress into its epoch; ``False``,
        writing nothing, once a newer claim or a newer epoch of one of its partitions fences the
        task."""
        from confluent_kafka import TopicPartition

        plan = self.plan
        if plan.store.fenced() or plan.store.partitions.superseded(self.leases.values()):
            self._fenced()
            return False
        states = {}
        for partition, reader in self.readers.items():
            states[partition], taken = reader.state(self._position(consumer, partition, TopicPartition))
            if taken:
                self.set_aside_keys[partition].update(letter.event["key"] for letter in taken)
                # A file of the partition's own, named after its epoch: it counts once a save of
                # this epoch vouches for it (a paused attempt's, landing after a takeover, never).
                epoch, vouched = self.leases[partition].epoch, self.letter_files[partition]
                written = vouched.get(str(epoch), 0)
                plan.store.write_dead_letters(
                    real_time_letters_name(plan.store.run_id, partition, epoch, self.token, written),
                    _dead_letter_table([(partition, letter) for letter in taken], plan.dead_letter_schema))
                vouched[str(epoch)] = written + 1
        for partition, state in states.items():
            state.update(letters=dict(self.letter_files[partition]))
            topic, kafka_partition = plan.sources[partition]
            state.update(topic=topic, partition=kafka_partition, claim=plan.store.claim_number,
                         handled_total=self.readers[partition].handled_before + state["handled"],
                         end=_end_offset(consumer, plan.sources[partition], TopicPartition))
            if state != self.saved_states.get(partition):
                plan.store.partitions.save(self.leases[partition], {**state, "at": time.time()})
                self.saved_states[partition] = state
        if isinstance(self.handler, Sink):
            # Only a save that is the partitions' progress may tell the sink what no run hands it
            # again: one a pause carried past the look above went to an epoch nobody reads. Looked
            # at after the writes, a newer epoch that is not seen here was made after them, and
            # started from them.
            if plan.store.partitions.superseded(self.leases.values()):
                self._fenced()
                return False
            for partition, state in states.items():
                tell_done_below(self.handler, partition, int(state["next"]),
                                frozenset(self.set_aside_keys[partition]))
        return True

    def _failed(self) -> PartitionReader | None:
        """The first partition whose dispatcher has a call that failed for good."""
        return next((reader for reader in self.readers.values() if reader.dispatcher.failure), None)

    def _stop(self, consumer: Any) -> None:
        """Step 5, asked: the calls read finish, then the last save (or, if one of them failed for
        good, :meth:`_end`)."""
        self.ended = True
        for reader in self.readers.values():
            reader.dispatcher.drain()
        if self._failed() is not None:
            self._end(consumer)
        else:
            self._save(consumer)

    def _fenced(self) -> None:
        """Step 5, fenced (a newer claim, or a newer attempt of this task): no call starts, nothing
        is written."""
        self.fenced = self.ended = True
        for reader in self.readers.values():
            reader.dispatcher.stop()

    def _end(self, consumer: Any, error: InputError | None = None) -> None:
        """Step 5, a call failed for good (or ``error``: records gone): no call starts, those in
        flight finish, the progress before it is saved, and the run's other tasks are asked to stop."""
        self.ended = True
        for reader in self.readers.values():
            reader.dispatcher.stop()
            reader.dispatcher.drain()
        failed = self._failed()
        if error is None and failed is not None:
            failure = failed.dispatcher.failure
            assert failure is not None
            event = failure.event
            offset = int(event["offset"])
            self.error = HandlerFailedError(event.get("key"), offset, offset, failed.partition,
                                            failure.reason, failure.traceback, record_of(event))
        else:
            self.error = error
        if self._save(consumer):
            self.plan.store.request_stop(f"a task ended: {self.error}")

    def result(self) -> pa.RecordBatch:
        readers = self.readers.values()
        return pa.RecordBatch.from_pylist([{
            "task": self.task,
            "handled": sum(state.get("handled", 0) for state in self.saved_states.values()),
            "skipped": sum(reader.skipped for reader in readers),
            "dead_letters": sum(reader.dead_letters for reader in readers),
            "error": None if self.error is None else pickle.dumps(self.error), "fenced": self.fenced,
        }], schema=RESULT_SCHEMA)


def _check(error: Any, kafka_error: Any, where: str) -> None:
    """Raise :class:`~segack.spark_adapter.InputError` for a consumer's error the stream cannot
    read past; log the others (the client retries them)."""
    code = error.code()
    if code == kafka_error._PARTITION_EOF:
        return
    if code in (kafka_error.OFFSET_OUT_OF_RANGE, kafka_error._AUTO_OFFSET_RESET):
        raise InputError(f"Kafka partition {where}: records the stream needs are gone ({error.str()}); "
                         f"nothing past them was handled: to go on past them, start a new checkpoint")
    if code in (kafka_error.UNKNOWN_TOPIC_OR_PART, kafka_error.TOPIC_AUTHORIZATION_FAILED):
        raise InputError(f"Kafka partition {where} cannot be read: {error.str()}")
    if code in (kafka_error._BAD_MSG, kafka_error._BAD_COMPRESSION):  # the client would pass over them
        raise InputError(f"Kafka partition {where} holds records the client cannot read ({error.str()}); "
                         f"nothing past them was handled")
    if error.fatal():
        raise InputError(f"the Kafka client reading {where} failed: {error.str()}")
    log.warning("Kafka consumer of %s: %s", where, error.str())


def _record_key(event: dict[str, Any]) -> Any:
    return event["key"]


def _end_offset(consumer: Any, pair: tuple[str, int], topic_partition: Any) -> int | None:
    """The partition's (``(topic, partition)``) end as the consumer last heard it (no request),
    ``None`` before it has."""
    high = consumer.get_watermark_offsets(topic_partition(*pair), cached=True)[1]
    return None if high < 0 else int(high)


def run_partitions(plan: PartitionPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of a real-time job: the task's index in, one result row out."""
    for batch in batches:
        for task in batch.column(0).to_pylist():
            with watching_driver(plan.store.driver):
                work = PartitionsTask(plan, int(task))
                work.run()
            yield work.result()
