"""segack's record of a query it runs (:func:`~segack.spark_adapter.stream`): where the query starts,
and each micro-batch held against Spark's checkpoint of it.

Where the query starts is decided before the claim is taken and before anything is written:

1. **Spark's checkpoint of the query has micro-batches**: the query goes on from it. It must be the
   query whose batches segack's checkpoint records (the same id); a Kafka starting option
   (:data:`~segack.spark_adapter.sources.kafka.STARTING_OPTIONS`) is refused, since Spark would
   ignore it.
2. **Neither checkpoint has a micro-batch of the stream**: a new query. Kafka starts where nothing
   is skipped (rule 5 of :mod:`~segack.spark_adapter.sources.kafka`): the consumer group's committed
   offsets when the run commits to a group that has them, else the earliest offsets; a starting
   option given starts it there instead, and the records it passes over are counted and recorded.
3. **Spark's checkpoint has none, but segack's has micro-batches** (Spark's was lost or removed): a
   Kafka query restarts from segack's record of the last complete batch's end offsets (partitions
   added since, from their earliest), a Delta change feed from the commit after the batch's last
   (rule 4 of :mod:`~segack.spark_adapter.sources.delta`), so losing Spark's checkpoint loses and
   repeats nothing. Any other source, or a batch that was under way, is refused: its position
   cannot be handed back to Spark exactly. Until the restarted query completes a micro-batch, the
   record keeps where it restarted from (:data:`RESTART_PENDING`), and a run that finds Spark's new
   checkpoint without a planned micro-batch restarts from there again; a Delta change feed's query
   is given the restart's reader options even once it has one, since Delta reads the start of a
   query's first micro-batch from them.

Then each micro-batch Spark delivers is held against the record (:func:`check_batch`), which names
the query's id and each batch's end offsets as Spark's checkpoint gave them: the batch must be the
one in progress, the last one complete (delivered again: skipped), or the next, of the same query
and, where recorded, with the same offsets. Anything else means that Spark's checkpoint was lost,
replaced or restored from an older copy (or segack's was), and is refused before any event is
handled or any offset committed. A batch that reads partitions added to a topic since the last
complete one is refused too: a key's records may now be in two partitions, in no order Kafka keeps.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from segack.spark_adapter.coordinator.kafka_starts import group_starts
from segack.spark_adapter.errors import CheckpointError, OptionError
from segack.spark_adapter.sources.delta import STARTING_OPTIONS as DELTA_STARTING_OPTIONS
from segack.spark_adapter.sources.delta import DeltaChangeFeed
from segack.spark_adapter.sources.kafka import (
    STARTING_OPTIONS,
    KafkaStream,
    group_offsets,
    list_offsets,
    offsets_json,
    parse_offsets,
    passed_over,
    starting_offsets,
    subscribed_partitions,
)
from segack.spark_adapter.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper
    from segack.spark_adapter.store.query_log import QueryLog

__all__ = ["RESTART_PENDING", "QueryStart", "check_batch", "check_query", "plan_start", "record_start"]

log = logging.getLogger(__name__)

#: In the stream's record, from a restart (rule 3) until the restarted query completes a micro-batch:
#: the end offsets it restarted from, to restart from again should that run end before.
RESTART_PENDING = "restart_pending"
#: What a refusal of a restart says to do.
_BACK = "put Spark's checkpoint back, or use a new checkpoint"


@dataclass(frozen=True)
class QueryStart:
    """Where the query starts, and what segack's record of the stream says of it."""

    #: The events to start the query over: the caller's, or Kafka's or a Delta change feed's from
    #: where the query starts.
    events: DataFrame | KafkaStream | DeltaChangeFeed
    #: Where it starts, in words (for the log and ``segack status``).
    where: str
    #: Records a new query passes over because a starting option said so.
    passed_over: int = 0
    #: Rule 3: the record of the query the new one goes on from (its id and last complete batch).
    restarted_from: dict[str, Any] | None = None
    #: Whether the query is new (rules 2 and 3): the start is then recorded.
    new: bool = False

    def record(self, stream: dict[str, Any]) -> dict[str, Any]:
        """The stream's record once the query starts: a new query's start noted, and for rule 3 the
        batches numbered from 0 again, as the new query numbers them."""
        if not self.new:
            return stream
        started = {"start": {"where": self.where, "passed_over": self.passed_over, "at": time.time()}}
        if self.restarted_from is None:
            return {**stream, **started}
        restarts = [*stream.get("restarts", []), {**self.restarted_from, "at": time.time()}]
        return {**stream, **started, "restarts": restarts, "query_id": None, "completed_batch": -1,
                "batch": None, "completed_end": None, RESTART_PENDING: stream.get("completed_end")}


def _given(events: KafkaStream) -> list[str]:
    """The starting options given that would start anywhere but where nothing is skipped: Spark
    ignores all of them once the query has a position (``startingOffsets=earliest``, which older
    docs put in every command, skips nothing and is let through)."""
    return [name for name in STARTING_OPTIONS if name in events.options
            and not (name == "startingOffsets" and events.options[name].strip().lower() == "earliest")]


def record_start(start: QueryStart, keeper: ClaimKeeper) -> QueryStart | None:
    """Put ``start`` on the checkpoint's record now, under ``keeper``'s claim, if the checkpoint has
    a state (a restart from the record, rule 3, must be there before Spark's new query writes
    anything: a run that died before its first micro-batch would otherwise leave the old query's id
    against the new query's checkpoint); else return it, for the first micro-batch to record."""
    state = keeper.store.load()
    if not start.new or state is None or state.tokens is None:
        return start if start.new else None
    state.settings["stream"] = start.record(state.settings.get("stream") or {})
    keeper.save(state)
    return None


def plan_start(spark: SparkSession, store: CheckpointStore, state: Checkpoint | None,
               events: DataFrame | KafkaStream | DeltaChangeFeed, group: str | None) -> QueryStart:
    """The start of the query over ``events`` on ``store`` (the module's rules), or a
    :class:`~segack.spark_adapter.CheckpointError` (or :class:`~segack.spark_adapter.OptionError`
    for a starting option) saying why it cannot start."""
    query_log = store.query_log()
    stream: dict[str, Any] = (state.settings.get("stream") if state is not None else None) or {}
    kafka = events if isinstance(events, KafkaStream) else None
    given = _given(kafka) if kafka is not None else []
    pending = stream.get(RESTART_PENDING)
    spark_batches = query_log.batches()
    if spark_batches:  # 1
        try:
            check_query(stream, query_log.query_id(), query_log)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint {store.location}: {error}") from None
        if given:
            raise OptionError(f"{given[0]} applies only to a new query, and the query of checkpoint "
                              f"{store.location} has a position already (micro-batch {spark_batches[-1]}); "
                              f"leave it out, or use a new checkpoint")
        if pending is not None and isinstance(events, DeltaChangeFeed):
            # Delta works a query's first micro-batch out from the reader's options each time it runs
            # it: they must be the restart's until that batch is complete.
            events = _restarted(spark, store, events, pending, f"checkpoint {store.location}: its query "
                                f"restarted from segack's record, but has no micro-batch complete")
        return QueryStart(events, f"Spark's checkpoint of the query, after micro-batch {spark_batches[-1]}")
    done, current = int(stream.get("completed_batch", -1)), stream.get("batch")
    if done < 0 and current is None:  # 2
        if pending is None or not isinstance(events, (KafkaStream, DeltaChangeFeed)):
            return _new_query(spark, events, group, query_log)
        # A restart (rule 3) whose run ended before Spark's new query planned a micro-batch: again.
        restarted = _restarted(spark, store, events, pending, f"checkpoint {store.location}: its query "
                               f"restarted from segack's record, but has no micro-batch yet")
        return QueryStart(restarted, str(stream.get("start", {}).get("where", "segack's record")), new=True)
    has = (f"micro-batches through {done} complete" if current is None
           else f"micro-batch {current['id']} under way")
    if given:
        raise OptionError(f"{given[0]} applies only to a new query, and checkpoint {store.location} has "
                          f"{has}; leave it out, or use a new checkpoint")
    lost = (f"checkpoint {store.location}: Spark's checkpoint of the query ({query_log.location}) is gone, "
            f"but segack's has {has}")
    if not isinstance(events, (KafkaStream, DeltaChangeFeed)):  # 3
        raise CheckpointError(f"{lost}, and only a Kafka query or a Delta change feed restarts from segack's "
                              f"record; {_BACK}")
    if current is not None:
        raise CheckpointError(f"{lost}, whose records a new query could not read again exactly; {_BACK}")
    restarted = _restarted(spark, store, events, stream.get("completed_end"), lost)
    log.warning("%s; the query restarts from segack's record of micro-batch %d", lost, done)
    where = (f"segack's record of micro-batch {done} of query {stream.get('query_id')} (Spark's checkpoint "
             f"of the query was gone)")
    return QueryStart(restarted, where, new=True,
                      restarted_from={"query_id": stream.get("query_id"), "completed_batch": done})


def _restarted(spark: SparkSession, store: CheckpointStore, events: KafkaStream | DeltaChangeFeed,
               ends: Any, lost: str) -> KafkaStream | DeltaChangeFeed:
    """``events`` read by a new query from where a micro-batch that ended at ``ends`` (its record)
    left off (rule 3); ``lost`` says why, for a refusal."""
    lacking = CheckpointError(f"{lost}, and its record lacks the offsets a restart needs (written by an "
                              f"earlier segack); {_BACK}")
    if isinstance(events, DeltaChangeFeed):
        if not isinstance(ends, list) or len(ends) != 1 or not isinstance(ends[0], dict):
            raise lacking
        try:
            restarted = events.after(ends[0])
        except CheckpointError as error:
            raise CheckpointError(f"{lost}, and {error}; {_BACK}") from None
        ignored = [name for name in DELTA_STARTING_OPTIONS if name in events.options]
        if ignored:  # as Spark ignores it once the query has a position
            log.warning("%s: %s is left out: the restarted query goes on from segack's record",
                        store.location, ignored[0])
        return restarted
    kept = _kafka_ends(ends)
    if kept is None:
        raise lacking
    # Partitions added since start from their earliest; Spark's reader needs each one named.
    partitions = list(kept) if is_connect(spark) else subscribed_partitions(spark, events.options)
    return events.starting_at(offsets_json({where: kept.get(where, -2) for where in partitions}))


def _kafka_ends(ends: Any) -> dict[tuple[str, int], int] | None:
    """The Kafka source's end offsets in a batch's recorded ``end`` (one entry per source)."""
    if not isinstance(ends, list) or len(ends) != 1 or not isinstance(ends[0], dict):
        return None
    found = parse_offsets({"sources": [{"endOffset": ends[0]}]})
    return {(where.topic, where.partition): where.end for where in found} or None


def _new_query(spark: SparkSession, events: DataFrame | KafkaStream | DeltaChangeFeed, group: str | None,
               query_log: QueryLog) -> QueryStart:
    """Rule 2."""
    if not isinstance(events, KafkaStream):
        return QueryStart(events, "a new query, from the source's own starting options", new=True)
    recorded = query_log.kafka_initial_offsets()
    if recorded is not None and not is_connect(spark):
        # An earlier run started this query without completing a micro-batch: Spark goes on from
        # the offsets it chose then, whatever the options say now.
        earliest = list_offsets(spark, events.options, dict.fromkeys(recorded, "earliest"))
        skipped = passed_over(earliest, recorded)
        return QueryStart(events, "a new query, from the offsets Spark recorded when an earlier run "
                          "started it", passed_over=skipped, new=True)
    if is_connect(spark):  # no JVM to ask with: the brokers are asked through librdkafka
        if _given(events):
            return QueryStart(events, "a new query, from its starting options", new=True)
        starts = group_starts(events.options, group) if group is not None else {}
        if not starts:
            return QueryStart(events.starting_at("earliest"), "a new query, from the earliest offsets",
                              new=True)
        return QueryStart(events.starting_at(offsets_json(starts)),
                          f"a new query, from consumer group {group}'s committed offsets", new=True)
    given = _given(events)
    if not given and group is None:
        return QueryStart(events.starting_at("earliest"), "a new query, from the earliest offsets", new=True)
    partitions = subscribed_partitions(spark, events.options)
    earliest = list_offsets(spark, events.options, dict.fromkeys(partitions, "earliest"))
    if given:
        starts = starting_offsets(spark, events.options, partitions)
        skipped = passed_over(earliest, starts)
        if skipped:
            log.warning("a new query starts at its %s, passing over %d records", given[0], skipped)
        return QueryStart(events, f"a new query, from its {given[0]}", passed_over=skipped, new=True)
    committed = group_offsets(spark, events.options, group) if group is not None else {}
    mine = {where: offset for where, offset in committed.items() if where in earliest}
    if not mine:
        return QueryStart(events.starting_at("earliest"), "a new query, from the earliest offsets", new=True)
    # A committed offset below the earliest (retention deleted what followed it) starts at the earliest.
    starts = {where: max(mine.get(where, earliest[where]), earliest[where]) for where in partitions}
    return QueryStart(events.starting_at(offsets_json(starts)),
                      f"a new query, from consumer group {group}'s committed offsets", new=True)


def check_query(stream: dict[str, Any], query_id: str | None, query_log: QueryLog) -> None:
    """Refuse Spark's checkpoint ``query_log`` when it is of another query than the one whose batches
    the stream's record (``stream``) holds."""
    recorded = stream.get("query_id")
    if recorded is not None and query_id != recorded:
        raise CheckpointError(
            f"Spark's checkpoint of the query ({query_log.location}) is of query {query_id}, but segack's "
            f"records the micro-batches of query {recorded}: it was replaced or restored from another copy. "
            f"Put the query's own back, or remove it: segack then restarts a Kafka query or a Delta change "
            f"feed from its record")


def check_batch(stream: dict[str, Any], batch_id: int, query_log: QueryLog | None,
                ) -> tuple[str | None, Any]:
    """Hold micro-batch ``batch_id`` against the stream's record (the module's rules); the query's id
    and the batch's end offsets in Spark's checkpoint ``query_log`` (both ``None`` without one: a
    query of the caller's own, whose checkpoint segack cannot see)."""
    done, current = stream["completed_batch"], stream["batch"]
    if query_log is None:
        if current is not None and current["id"] != batch_id and batch_id > done:
            raise CheckpointError(f"batch {current['id']} is in progress, but Spark delivered batch "
                                  f"{batch_id}")
        return None, None
    query_id, ends = query_log.query_id(), query_log.end_offsets(batch_id)
    check_query(stream, query_id, query_log)
    spark = f"Spark's checkpoint of the query ({query_log.location})"
    delivered = f"Spark delivered micro-batch {batch_id}"
    if ends is None:
        raise CheckpointError(f"{spark} has no offsets for micro-batch {batch_id}, which Spark delivered")
    if current is not None:
        if current["id"] != batch_id:
            raise CheckpointError(f"{delivered}, but micro-batch {current['id']} is in progress in segack's "
                                  f"checkpoint: {spark} was replaced or restored from an older copy")
        expected = current.get("end")
    elif batch_id == done:
        expected = stream.get("completed_end")
    elif batch_id < done:
        raise CheckpointError(f"{delivered}, but segack's checkpoint has micro-batches through {done} "
                              f"complete: {spark} is behind it (restored from an older copy?)")
    elif batch_id > done + 1:
        raise CheckpointError(f"{delivered}, but segack's checkpoint has micro-batches only through {done} "
                              f"complete: it is behind {spark} (restored from an older copy?)")
    else:
        expected = None
        _refuse_added_partitions(stream.get("completed_end"), ends, batch_id)
    if expected is not None and ends != expected:
        raise CheckpointError(f"micro-batch {batch_id} ends at {_shown(ends)} in {spark}, but at "
                              f"{_shown(expected)} in segack's record of it")
    return query_id, ends


def _refuse_added_partitions(previous: Any, ends: Any, batch_id: int) -> None:
    """Refuse micro-batch ``batch_id`` when it reads partitions of a topic that the last complete
    micro-batch (which ended at ``previous``) read without them: partitions were added to the topic
    while the stream ran."""
    before, now = _kafka_ends(previous), _kafka_ends(ends)
    if before is None or now is None:
        return
    topics = {topic for topic, _ in before}
    added = sorted(where for where in now if where not in before and where[0] in topics)
    if not added:
        return
    topic = added[0][0]
    named = ", ".join(str(partition) for name, partition in added if name == topic)
    raise CheckpointError(
        f"micro-batch {batch_id} reads partitions {named} of topic {topic}, which the stream did not have "
        f"when micro-batch {batch_id - 1} ended: they were added while it ran, so a key's later records may "
        f"be in another partition than its earlier ones, and Kafka keeps no order between partitions. "
        f"Nothing of micro-batch {batch_id} is done. If the producers do not place keys by the partition "
        f"count, or a key's order across partitions does not matter, go on with a new checkpoint: it starts "
        f"at the consumer group's committed offsets (--commit-offsets-to)")


def _shown(offsets: Any) -> str:
    return json.dumps(offsets, separators=(",", ":"))
