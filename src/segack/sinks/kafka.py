"""Kafka topics: :class:`KafkaSink`, which writes a call's output records and each of its keys'
last applied position in one Kafka transaction, so that a ``read_committed`` consumer sees each
event's output once, whatever runs crashed, resumed or were taken over."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from segack.errors import SegackTypeError, SegackValueError
from segack.sinks.arguments import check_apply, check_preferred_batch_size, refuse_unordered
from segack.sinks.kafka_output import KafkaClients, KafkaOutput
from segack.sinks.kafka_positions import (
    PositionsPartition,
    described_topic_id,
    keep_to_recorded,
    position_key,
    positions_partition,
    recorded_topic,
)
from segack.sinks.kafka_transactions import (
    ID_PREFIX,
    PRODUCER_ONLY,
    TRANSACTION_SECONDS,
    check_transaction_timeout,
    claim_of,
    close_producer,
    end_transaction,
    send,
    task_name,
)
from segack.sinks.key_text import key_text
from segack.sinks.registry_values import RegistryValues
from segack.spark_adapter.errors import OptionError, SinkError, one_line
from segack.spark_adapter.handlers import EventIdentity, RunContext, Sink
from segack.spark_adapter.sources.kafka_settings import librdkafka_client
from segack.spark_adapter.store.checkpoint import CheckpointStore, TaskStore
from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.kafka_sink_files import (
    forget_producers,
    register_producer,
    registered_producers,
)

__all__ = ["ID_PREFIX", "TRANSACTION_SECONDS", "KafkaClients", "KafkaOutput", "KafkaSink"]

log = logging.getLogger(__name__)

#: How long the driver waits for the brokers' metadata before it refuses a run.
METADATA_SECONDS = 15.0
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
class KafkaSink(Sink):
    """A handler that writes records to Kafka topics exactly once, each key's in order.

    Each call (one event, or a list of up to ``batch_size``) is one Kafka transaction: the sink
    skips the events at or below their key's recorded position, calls ``apply`` for the rest with
    a :class:`KafkaOutput`, and then sends, in one transaction, the records ``apply`` produced and
    each key's new position (to the positions topic). A ``read_committed`` consumer sees a
    call's records when the transaction commits, or never. A call that raises, or whose
    transaction fails, sends nothing visible, and the run retries it or sets it aside as
    ``retries`` and ``on_error`` say.

    Parameters
    ----------
    producer_config : mapping, optional
        The ``confluent_kafka.Producer`` settings (``bootstrap.servers``, security, batching), over
        those ``cluster`` gives; the sink sets ``transactional.id`` itself, one per task. Settings
        that forbid transactions (``enable.idempotence`` false, ``acks`` other than ``all``) are
        refused by the run.
    apply : callable, optional
        ``apply(output, event)`` produces one event's records with ``output.produce(...)``.
    apply_many : callable, optional
        ``apply_many(output, events)``: the same for a list of events, each key's in order. Give
        ``apply`` or ``apply_many``, not both.
    topics : list of str
        The topics ``apply`` writes to. The run refuses to start unless each exists; a record for
        another topic fails its call.
    positions_topic : str or None, default ``None``
        The compacted topic of each key's last applied position; ``None``:
        ``segack-positions-CHECKPOINT_ID``. The checkpoint's first run makes it if it is missing;
        a later run refuses it gone, or deleted and made again (see Notes).
    positions_replication : int, optional
        The copies of each partition of a positions topic the run makes, and the fewest a
        positions topic found may have (see Notes); ``None``: 3, or the brokers' number when fewer.
    positions_partitions : int, default ``32``
        The partitions of a positions topic the run makes. A task reads the partitions its key
        groups map to (``key_group % positions_partitions``); a power of two at least the number of
        segments gives each segment partitions of its own.
    preferred_batch_size : int or None, default ``5000``
        The events per call (one transaction) when the run sets no ``batch_size``.
    clients : KafkaClients, optional
        What makes the sink's producers, consumers and admin client from their settings
        (confluent-kafka's unless given).
    cluster : mapping, optional
        The cluster's settings as a stream takes them: its ``kafka.*`` options, in Kafka's Java
        client's spelling (``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``) or
        librdkafka's (:doc:`/connecting`); other options (a stream's ``subscribe``, say) are not
        read. Give a stream's options, and the sink reaches its cluster as the stream does.
    values : RegistryValues, optional
        Values in Avro, Protobuf or JSON Schema through a Schema Registry
        (:class:`~segack.sinks.registry_values.RegistryValues`): ``apply`` gives dicts or messages,
        the sink sends them in Confluent's wire format; its schemas are registered when the run
        starts.

    Raises
    ------
    SegackTypeError
        ``apply`` or ``apply_many`` not callable, ``producer_config`` not a mapping, ``clients``
        without the methods of a :class:`KafkaClients`, ``values`` not a ``RegistryValues``.
    SegackValueError
        Both or neither of ``apply`` and ``apply_many``; ``cluster`` settings librdkafka cannot
        take (a JKS store, AWS MSK's IAM login module: :doc:`/connecting`); no
        ``bootstrap.servers`` in ``producer_config`` or ``cluster``; a ``transactional.id``, or a
        ``transaction.timeout.ms``
        over 120,000 (a task waits that long at most to read positions past a transaction another
        left open); no ``topics`` or a name Kafka does not take; ``positions_partitions`` or
        ``preferred_batch_size`` not a positive int.

    Notes
    -----
    A run refuses the sink before handling any event (:class:`~segack.spark_adapter.SinkError`,
    one line) when the brokers cannot be reached, when the producer settings forbid transactions,
    when an output topic does not exist, when the positions topic is not compacted, when the
    checkpoint's positions topic is gone or was deleted and made again (its positions are lost), or
    under ``policy="concurrent"``.

    **Fencing.** A task's producer has the transactional id ``segack-CHECKPOINT_ID-CLAIM-tN``:
    the run's claim number and the task's partition in its Spark job, the same in each attempt of
    the task, so that an attempt fences the earlier ones. Before it uses an id, a task records it in
    the checkpoint (``kafka-producers/``); then it starts the producer, and then it looks for a newer
    claim. A run that takes the checkpoint over starts a producer with each id of the older claims
    recorded there before any of its tasks starts, which aborts their open transactions and fences
    them: none of their producers can commit again. A task of the older run that records its id
    later sees the newer claim once its producer started, and stops before its first transaction.
    A copy of the sink (a task attempt) starts one producer, ever: once it is fenced, or fails in a
    transaction whose end is unknown, its later calls fail (:class:`~segack.spark_adapter.SinkError`),
    unless its task says it still holds its key groups (:meth:`hold`: a real-time task, whose
    producer an older attempt's late start fenced).

    The positions topic, its partition count and its topic id are recorded in the checkpoint by its
    first run; later runs keep to them, and only a checkpoint that records no positions topic makes
    one. A sink object holds the run :meth:`prepare` was last given: give each of several runs at
    once a sink of its own.
    """

    def __init__(self, producer_config: Mapping[str, Any] | None = None,
                 apply: Callable[[KafkaOutput, dict[str, Any]], Any] | None = None, *,
                 apply_many: Callable[[KafkaOutput, list[dict[str, Any]]], Any] | None = None,
                 topics: Iterable[str], positions_topic: str | None = None, positions_partitions: int = 32,
                 preferred_batch_size: int | None = 5000, clients: KafkaClients | None = None,
                 cluster: Mapping[str, str] | None = None, positions_replication: int | None = None,
                 values: RegistryValues | None = None) -> None:
        for name, given in (("producer_config", producer_config), ("cluster", cluster)):
            if given is not None and not isinstance(given, Mapping):
                raise SegackTypeError(f"KafkaSink: {name} must be a mapping of settings, not "
                                      f"{type(given).__name__}")
        try:
            reached = librdkafka_client(cluster or {})
        except OptionError as error:
            raise SegackValueError(f"KafkaSink: cluster: {error}") from None
        producer_config = {**reached, **(producer_config or {})}
        if not isinstance(producer_config.get("bootstrap.servers"), str):
            raise SegackValueError("KafkaSink: producer_config or cluster must give bootstrap.servers")
        if "transactional.id" in producer_config:
            raise SegackValueError("KafkaSink: producer_config must not give transactional.id: the sink "
                                   "gives each task's producer its own")
        check_transaction_timeout(producer_config.get("transaction.timeout.ms"))
        check_apply("KafkaSink", apply, apply_many)
        wanted = [topics] if isinstance(topics, str) else list(topics)
        if not wanted or not all(isinstance(topic, str) and _TOPIC.fullmatch(topic) for topic in wanted):
            raise SegackValueError(f"KafkaSink: topics must name the topics apply writes to, each a Kafka "
                                   f"topic name, not {topics!r}")
        if positions_topic is not None and not (isinstance(positions_topic, str)
                                                and _TOPIC.fullmatch(positions_topic)):
            raise SegackValueError(f"KafkaSink: positions_topic must be a Kafka topic name or None, not "
                                   f"{positions_topic!r}")
        if isinstance(positions_partitions, bool) or not isinstance(positions_partitions, int) \
                or positions_partitions < 1:
            raise SegackValueError(f"KafkaSink: positions_partitions must be a positive int, not "
                                   f"{positions_partitions!r}")
        check_preferred_batch_size("KafkaSink", preferred_batch_size)
        if positions_replication is not None and (isinstance(positions_replication, bool) or not isinstance(
                positions_replication, int) or positions_replication < 1):
            raise SegackValueError(f"KafkaSink: positions_replication must be a positive int or None, not "
                                   f"{positions_replication!r}")
        if clients is not None and not all(callable(getattr(clients, name, None))
                                           for name in ("producer", "consumer", "admin")):
            raise SegackTypeError(f"KafkaSink: clients must make producers, consumers and admin clients "
                                  f"(a KafkaClients), not {type(clients).__name__}")
        self.producer_config = dict(producer_config)
        self.apply, self.apply_many = apply, apply_many
        self.topics = frozenset(wanted)
        self.positions_topic, self.positions_partitions = positions_topic, positions_partitions
        self.positions_replication = positions_replication
        self.preferred_batch_size = preferred_batch_size
        self.clients = clients or KafkaClients()
        if values is not None:
            if not isinstance(values, RegistryValues):
                raise SegackTypeError(f"KafkaSink: values must be a RegistryValues, not "
                                      f"{type(values).__name__}")
            values.check_topics(self.topics)
        self.values = values
        #: What the driver learnt in :meth:`prepare`: the run's checkpoint, its id and claim, and the
        #: positions topic's name and partitions.
        self._run: RunContext | None = None
        self._positions: tuple[str, int] | None = None
        self._opened(None)

    def _opened(self, task: str | None) -> None:
        """Nothing started yet in this copy: no producer, no positions read."""
        self._task = task
        self._lock = threading.Lock()
        self._producer: Any = None
        #: Why this copy's producer was lost, once it was, and whether for good (the claim or the
        #: key groups taken over): a copy whose task holds its key groups still starts another.
        self._lost: str | None = None
        self._lost_for_good = False
        self._read: dict[int, PositionsPartition] = {}
        #: Whether this copy's task attempt holds its key groups still (:meth:`hold`), if it says.
        self._holds: Callable[[], bool] | None = None
        #: The keys whose positions were dropped (:meth:`done_below`), by positions partition: their
        #: tombstones go with the next transaction.
        self._dropped: dict[int, set[str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A producer stays where it was started; each task's copy starts its own.
        return {name: value for name, value in self.__dict__.items()
                if name not in ("_task", "_lock", "_producer", "_lost", "_read", "_holds", "_dropped")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # Unpickled in the task's own thread, where Spark's task context is.
        self._opened(task_name())

    def _connection_config(self) -> dict[str, Any]:
        return {name: value for name, value in self.producer_config.items() if name not in PRODUCER_ONLY}

    def _producer_config(self, transactional_id: str) -> dict[str, Any]:
        return {**self.producer_config, "transactional.id": transactional_id, "logger": log}

    def positions_topic_for(self, checkpoint_id: str) -> str:
        """The name of the positions topic for the checkpoint ``checkpoint_id``."""
        return self.positions_topic or f"segack-positions-{checkpoint_id}"

    # ------------------------------------------------------------------ the driver

    def prepare(self, run: RunContext) -> None:
        """Refuse a run the sink cannot keep exactly once; make the positions topic; fence the
        producers of the runs this one took the checkpoint over from. A stream's later micro-batches
        under the same claim look again that the positions topic is the one recorded (gone, or made
        again, since the last), and fence what an older run recorded since."""
        refuse_unordered("KafkaSink", run)
        config: dict[str, Any] = {**self._connection_config(), "logger": log}
        admin = self.clients.admin(config)
        done, known = self._run, self._positions
        if done is not None and known is not None and (done.checkpoint, done.checkpoint_id, done.claim) == (
                run.checkpoint, run.checkpoint_id, run.claim):
            files, (name, partitions) = CheckpointStore(run.checkpoint).files, known
            recorded = recorded_topic(files, name, self._metadata(admin).topics.get(name))
            topic_id = described_topic_id(admin, name, METADATA_SECONDS)
            keep_to_recorded(files, recorded, name, partitions, topic_id)
            # A claim number withdrawn is taken again: an older run's task may have recorded an id since.
            self._fence_older(run)
            return
        metadata = self._metadata(admin)
        topics = metadata.topics
        missing = sorted(topic for topic in self.topics
                         if topic not in topics or topics[topic].error is not None)
        if missing:
            raise SinkError(f"KafkaSink: output topic{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            f"{'do' if len(missing) > 1 else 'does'} not exist (or cannot be described); "
                            f"create {'them' if len(missing) > 1 else 'it'} first")
        # Transactions allowed, before anything is made: a producer that never begins one.
        close_producer(self._start(f"{ID_PREFIX}{run.checkpoint_id}-{run.claim}-probe"))
        name = self.positions_topic_for(run.checkpoint_id)
        files = CheckpointStore(run.checkpoint).files
        recorded = recorded_topic(files, name, topics.get(name))  # refused before anything is made
        made = self._positions_topic(admin, name, topics.get(name), len(metadata.brokers))
        topic_id = described_topic_id(admin, name, METADATA_SECONDS)
        partitions = keep_to_recorded(files, recorded, name, made, topic_id)
        if self.values is not None:  # last: a run refused by the checks above registers nothing
            self.values.prepare()
        self._fence_older(run)
        self._run, self._positions = run, (name, partitions)
        log.info("KafkaSink records positions in topic %s (%d partitions, topic id %s)", name, partitions,
                 topic_id)

    def _metadata(self, admin: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return admin.list_topics(timeout=METADATA_SECONDS)
        except KafkaException as error:
            servers = self.producer_config["bootstrap.servers"]
            said = error.args[0].str() if error.args else one_line(error)
            raise SinkError(f"KafkaSink cannot reach the brokers at {servers}: {said}") from None

    def _positions_topic(self, admin: Any, name: str, found: Any, brokers: int) -> int:
        """The positions topic's partitions, the topic made if it is missing (each partition on
        :attr:`positions_replication` brokers, two of them in sync for a write); refused unless
        compacted, or with fewer copies than that."""
        # Exported by some releases' type stubs, not by others.
        from confluent_kafka.admin import ConfigResource, NewTopic  # type: ignore[attr-defined, unused-ignore]

        replication = self.positions_replication or min(3, max(brokers, 1))
        if found is None:
            config = {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, replication))}
            with durable_write("sink-setup"):
                future = admin.create_topics([NewTopic(name, self.positions_partitions, replication,
                                                       config=config)])[name]
                try:
                    future.result()
                except Exception as error:
                    if "TOPIC_ALREADY_EXISTS" not in str(error):
                        raise SinkError(f"KafkaSink cannot make its positions topic {name}: "
                                        f"{one_line(error)}") from None
            found = self._made(admin, name)
        resource = ConfigResource("topic", name)
        try:
            policy = admin.describe_configs([resource])[resource].result()["cleanup.policy"].value
        except Exception as error:
            raise SinkError(f"KafkaSink cannot describe its positions topic {name}: "
                            f"{one_line(error)}") from None
        if policy != "compact":
            raise SinkError(f"KafkaSink: positions topic {name} has cleanup.policy={policy}; it must be "
                            f"compact alone, or the positions of keys not seen for a while are deleted")
        copies = min(len(partition.replicas) for partition in found.partitions.values())
        if copies < replication:
            kept = f"{copies} cop{'y' if copies == 1 else 'ies'}"
            raise SinkError(f"KafkaSink: positions topic {name} keeps {kept} of a partition, fewer than "
                            f"{replication}: exactly once rests on it; raise its replication factor to "
                            f"{replication} (kafka-reassign-partitions), or give "
                            f"positions_replication={copies}")
        return len(found.partitions)

    def _made(self, admin: Any, name: str) -> Any:
        """The metadata of topic ``name``, just made: the brokers list it once their metadata has
        caught up, within :data:`METADATA_SECONDS`."""
        deadline = time.monotonic() + METADATA_SECONDS
        while True:
            found = self._metadata(admin).topics.get(name)
            if found is not None and found.error is None and found.partitions:
                return found
            if time.monotonic() > deadline:
                raise SinkError(f"KafkaSink made its positions topic {name}, but the brokers do not list "
                                f"it after {METADATA_SECONDS:.0f} s")
            time.sleep(0.2)

    def _start(self, transactional_id: str) -> Any:
        """A producer with ``transactional_id``, started: any earlier producer with that id is
        fenced, and its open transaction aborted."""
        from confluent_kafka import KafkaException

        try:
            producer = self.clients.producer(self._producer_config(transactional_id))
            producer.init_transactions(TRANSACTION_SECONDS)
        except KafkaException as error:
            said = error.args[0].str() if error.args else one_line(error)
            raise SinkError(f"KafkaSink cannot start a transactional producer ({transactional_id}) at "
                            f"{self.producer_config['bootstrap.servers']}: {said}") from None
        return producer

    def _fence_older(self, run: RunContext) -> None:
        """Fence every transactional id the tasks of older claims recorded, then forget them."""
        files = CheckpointStore(run.checkpoint).files
        older = [name for name in registered_producers(files) if claim_of(name) < run.claim]
        if not older:
            return
        with ThreadPoolExecutor(min(16, len(older))) as pool:
            for producer in pool.map(self._start, older):
                close_producer(producer)
        forget_producers(files, older)
        log.info("KafkaSink fenced %d producer(s) of the runs this one took the checkpoint over from",
                 len(older))

    # ------------------------------------------------------------------ the tasks

    def _started(self) -> Any:
        """This task's producer, started on first use (hold :attr:`_lock`):

        1. **Record** its transactional id in the checkpoint, so that a newer run fences it.
        2. **Start** it, fencing the earlier attempts of this task.
        3. **Look** for a newer claim: a run that took over before step 1 could not know the id;
           and, where the task says (:meth:`hold`), whether a newer attempt has taken the task's
           key groups over: an attempt that starts its producer late (its first call after the
           newer one's) fences the newer one's, and must then commit nothing.

        A copy starts one producer, ever, but for a task that still holds its key groups: once it
        is lost (fenced by a newer attempt of the task, or failed in a transaction whose end is
        unknown), every later call fails, since another producer with the same id would fence
        whichever attempt, or segment of a later job, holds the id now, and commit beside it. A copy
        whose task says it holds its key groups still (its producer fenced by a late starter, which
        commits nothing) starts again.
        """
        if self._restarts():
            log.warning("KafkaSink: this task's producer %s, but the task holds its key groups still: it "
                        "starts another", self._lost)
            self._lost = None
        if self._lost is not None:
            raise SinkError(f"KafkaSink: this task's producer {self._lost}; the task commits nothing more "
                            f"(a new attempt of it, or the next run, goes on from what was committed)")
        if self._producer is not None:
            return self._producer
        run = self._run
        if run is None or self._positions is None:
            raise SinkError("KafkaSink was called before a run prepared it")
        self._task = self._task or task_name()
        name = f"{ID_PREFIX}{run.checkpoint_id}-{run.claim}-{self._task}"
        store = TaskStore(run.checkpoint, "", run.claim)
        # Recorded at each start, even if this process recorded it before: a newer run that fenced
        # and forgot it may have withdrawn its claim since, and the run after it must find the id.
        register_producer(store.files, name)  # 1
        producer = self._start(name)  # 2
        if store.fenced():  # 3
            close_producer(producer)
            self._lose("found a newer claim", for_good=True)
            raise SinkError(f"KafkaSink: another run took checkpoint {run.checkpoint} over; this one "
                            f"commits nothing more")
        if self._holds is not None and not self._holds():
            close_producer(producer)
            self._lose("found its task's key groups taken over by a newer attempt", for_good=True)
            raise SinkError("KafkaSink: a newer attempt of this task took its key groups over; this one "
                            "commits nothing more")
        self._producer = producer
        return producer

    def _restarts(self) -> bool:
        """Whether this copy starts another producer at its next call (hold :attr:`_lock`): its
        producer was lost, not for good, and its task holds its key groups still."""
        return (self._lost is not None and not self._lost_for_good and self._holds is not None
                and self._holds())

    def _lose(self, reason: str, for_good: bool = False) -> None:
        """This copy's producer is lost (hold :attr:`_lock`). What the copy knows of the positions
        is forgotten: the transaction whose end it did not learn may have committed, and a
        tombstone or a skip decided from them could undo it or send it again."""
        self._lost, self._lost_for_good = reason, for_good
        self._producer = None
        self._read, self._dropped = {}, {}

    def hold(self, holds: Callable[[], bool]) -> None:
        """Look, at each start of this copy's producer, whether its task attempt holds its key
        groups still.

        An attempt that starts its producer after a newer attempt started its own fences the newer
        one's; a copy whose ``holds()`` then answers false commits nothing more, and a copy that
        still holds its key groups starts a new producer, reads the positions again (the lost
        producer's last transaction may have committed) and makes its call again from them.

        Parameters
        ----------
        holds : callable
            Called with no argument after each producer start; true while this attempt holds its
            task's key groups.
        """
        self._holds = holds

    @property
    def _key_prefix(self) -> str:
        """What starts the key of each of the run's position records: its checkpoint's id, so that
        checkpoints sharing a ``positions_topic`` never read each other's positions."""
        run = self._run
        if run is None:
            raise SinkError("KafkaSink was called before a run prepared it")
        return f"{run.checkpoint_id}/"

    def _partitions_for(self, identities: list[EventIdentity]) -> dict[int, PositionsPartition]:
        """The positions partitions of ``identities``' key groups, each read up to its end once
        since the producer started (hold :attr:`_lock`)."""
        topic, count = self._positions  # type: ignore[misc]
        servers = self.producer_config["bootstrap.servers"]
        for number in {identity.key_group % count for identity in identities} - self._read.keys():
            partition = positions_partition(servers, topic, number, self._key_prefix)
            with partition.lock:
                partition.catch_up(self._connection_config(), self.clients)
            self._read[number] = partition
        return self._read

    def __call__(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> None:
        """Apply the events not yet applied; send their records and their keys' new positions in one
        transaction."""
        if not events:
            return
        try:
            self._call(events, identities)
        except Exception:
            with self._lock:
                again = self._producer is None and self._restarts()
            if not again:
                raise
            # The producer was lost in the call (fenced by an older attempt's late start, or its
            # commit's end unknown) while this attempt holds its key groups: the call goes again,
            # from the positions as Kafka holds them now, which say whether its transaction landed.
            self._call(events, identities)

    def _call(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> None:
        with self._lock:
            self._started()
            read = self._partitions_for(identities)
        count = self._positions[1]  # type: ignore[index]
        fresh: list[dict[str, Any]] = []
        newest: dict[int, dict[str, int]] = {}
        for event, identity in zip(events, identities, strict=True):
            partition, key = identity.key_group % count, position_key(identity)
            if identity.position > read[partition].positions.get(key, -1):
                fresh.append(event)
                newest.setdefault(partition, {})[key] = identity.position
        if not fresh:
            return
        output = KafkaOutput(self.topics, self.values)
        self._apply(output, fresh)
        with self._lock:
            self._commit(output, newest)
            # Under the lock: a drop (done_below) between the commit and this would send a
            # tombstone for a key just applied.
            for partition, positions in newest.items():
                read[partition].record(positions)
                self._dropped.get(partition, set()).difference_update(positions)

    def done_below(self, key_group: int, position: int, kept: Collection[Any] = frozenset()) -> None:
        """Drop the positions of ``key_group``'s keys last applied below ``position`` but ``kept``
        (see :meth:`~segack.spark_adapter.Sink.done_below`), and send their tombstones with the next
        transaction: a real-time stream's memory, and what a task reads of the positions topic when
        it starts, follow the keys of the events in flight, not every key ever seen."""
        if self._positions is None:
            return
        number = key_group % self._positions[1]
        with self._lock:
            partition = self._read.get(number)
            if partition is None:
                return
            dropped = partition.forget_below(key_group, position,
                                             {f"{key_group}/{key_text(key)}" for key in kept})
            if dropped:
                self._dropped.setdefault(number, set()).update(dropped)

    def _apply(self, output: KafkaOutput, events: list[dict[str, Any]]) -> None:
        if self.apply_many is not None:
            self.apply_many(output, events)
        else:
            apply = self.apply
            assert apply is not None
            for event in events:
                apply(output, event)

    def _commit(self, output: KafkaOutput, newest: dict[int, dict[str, int]]) -> None:
        """One transaction (hold :attr:`_lock`): the call's records, the tombstones of the positions
        dropped since the last one (but of the call's keys), then the call's keys' positions."""
        producer = self._started()
        topic = self._positions[0]  # type: ignore[index]
        prefix = self._key_prefix
        dropped = {partition: keys - newest.get(partition, {}).keys()
                   for partition, keys in self._dropped.items()}
        try:
            producer.begin_transaction()
            for record_topic, value, key, partition, headers, timestamp in output.records:
                send(producer, record_topic, value, key, partition, headers, timestamp)
            for partition, keys in dropped.items():
                for key in keys:
                    send(producer, topic, None, prefix + key, partition, None, 0)
            for partition, positions in newest.items():
                for key, position in positions.items():
                    send(producer, topic, str(position), prefix + key, partition, None, 0)
            end_transaction(producer)
        except BaseException as error:
            self._abort(producer, error)
            raise
        for partition, keys in dropped.items():
            self._dropped[partition] -= keys

    def _abort(self, producer: Any, error: BaseException) -> None:
        """Abort the failed transaction. A producer that cannot (fenced, or its commit's end
        unknown) is lost: this copy commits nothing more (see :meth:`_started`)."""
        try:
            producer.abort_transaction(TRANSACTION_SECONDS)
            log.debug("KafkaSink aborted a transaction: %s", one_line(error))
        except Exception as failure:
            # Not closed: closing aborts again, and waits to send what was queued.
            self._lose(f"could not abort a transaction after {one_line(error)} ({one_line(failure)})")
            log.warning("KafkaSink: this task's producer %s", self._lost)

    def close(self) -> None:
        """Let go of this copy's producer (it has no open transaction between calls)."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            close_producer(producer)
