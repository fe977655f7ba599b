"""A :class:`~segack.sinks.KafkaSink` task's transactions: its producers' names, the settings that
bear on them, and the calls that send, commit and close."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from segack.errors import SegackValueError
from segack.sinks.kafka_positions import READ_SECONDS
from segack.spark_adapter.errors import one_line
from segack.spark_adapter.store.crash_points import durable_write

__all__ = ["ID_PREFIX", "PRODUCER_ONLY", "TRANSACTION_SECONDS", "check_transaction_timeout", "claim_of",
           "close_producer", "end_transaction", "send", "task_name"]

log = logging.getLogger("segack.sinks.kafka")

#: How the transactional ids of a sink's producers start: then the checkpoint's id, the run's claim
#: number and the task (``segack-CHECKPOINT_ID-CLAIM-tN``).
ID_PREFIX = "segack-"
#: How long starting a producer, or committing or aborting a transaction, may take.
TRANSACTION_SECONDS = 60.0
#: What the positions' consumer and the driver's admin client leave out of the user's settings: the
#: producer's own (the rest, how to reach and authenticate to the brokers, they share).
PRODUCER_ONLY = frozenset({
    "acks", "request.required.acks", "linger.ms", "queue.buffering.max.ms", "batch.size",
    "batch.num.messages", "compression.type", "compression.codec", "compression.level",
    "enable.idempotence", "enable.gapless.guarantee", "max.in.flight.requests.per.connection",
    "max.in.flight", "queue.buffering.max.messages", "queue.buffering.max.kbytes", "message.send.max.retries",
    "retries", "retry.backoff.ms", "retry.backoff.max.ms", "transaction.timeout.ms", "transactional.id",
    "delivery.timeout.ms", "message.timeout.ms", "partitioner", "partitioner_cb", "on_delivery",
    "delivery.report.only.error", "dr_cb", "dr_msg_cb", "sticky.partitioning.linger.ms",
    "queuing.strategy", "produce.offset.report", "message.copy.max.bytes", "request.timeout.ms",
})


def task_name() -> str:
    """The task this process runs, as a transactional id ends: its partition in the Spark job, the
    same in every attempt, so that an attempt fences the earlier ones; ``pPID`` outside Spark."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"t{context.partitionId()}" if context is not None else f"p{os.getpid()}"


def check_transaction_timeout(given: Any) -> None:
    """Refuse a ``transaction.timeout.ms`` longer than a task waits to read positions
    (:data:`~segack.sinks.kafka_positions.READ_SECONDS`): a transaction a lost task left open holds
    the readers of its positions partition back until the brokers time it out."""
    if given is None:
        return
    try:
        milliseconds = int(given)
    except (TypeError, ValueError):
        milliseconds = 0
    if isinstance(given, bool) or not 0 < milliseconds <= READ_SECONDS * 1000:
        raise SegackValueError(f"KafkaSink: producer_config's transaction.timeout.ms must be a number of "
                               f"milliseconds from 1 to {READ_SECONDS * 1000:.0f}, not {given!r}: a task "
                               f"reading positions waits that long at most for a transaction that another "
                               f"task left open to time out")


def claim_of(transactional_id: str) -> int:
    """The claim number in one of the sink's transactional ids (``-1`` for a name not its own)."""
    parts = transactional_id.split("-")
    return int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else -1


def end_transaction(producer: Any) -> None:
    """Commit the transaction. A commit that timed out is resumed, as librdkafka allows (and it
    refuses an abort while one is pending), for up to :data:`TRANSACTION_SECONDS`."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + TRANSACTION_SECONDS
    while True:
        try:
            with durable_write("sink-commit"):
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            return
        except KafkaException as error:
            if not (error.args and error.args[0].retriable()) or time.monotonic() >= deadline:
                raise
            log.warning("KafkaSink resumes a commit: %s", one_line(error))

def send(producer: Any, topic: str, value: Any, key: Any, partition: int, headers: Any,
          timestamp: int) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                             timestamp=timestamp)
            return
        except BufferError:
            producer.poll(0.1)  # the producer's queue is full: let it send some


def close_producer(producer: Any) -> None:
    """Close ``producer``; a failure is logged, not raised (it was done with)."""
    try:
        producer.close()
    except Exception as error:
        log.warning("KafkaSink could not close a producer: %s", one_line(error))
