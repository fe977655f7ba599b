"""The Spark adapter on a real local Spark: segment columns, partitioning, replay, checkpoints."""

from __future__ import annotations

import collections
import contextlib
import datetime
import io
import itertools
import json
import os
import pickle
import threading
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import segack.kernel as kernel
from segack.demo import generate_events
from segack.spark_adapter import (
    CheckpointLocationError,
    ForeignInputError,
    HandlerFailedError,
    InputError,
    KeyGroupTokens,
    OptionError,
    replay,
)
from segack.spark_adapter.spark.columns import hash_column, member_index_column, segment_column
from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
from segack.spark_adapter.store.storage import resolve_location
from tests import expected
from tests.spark_handlers import (
    AsyncTimedRecorder,
    FailsFirstTime,
    LineRecorder,
    Recorder,
    RefusesSome,
    SlowOn,
    TimedRecorder,
    event_line,
    read_lines,
    read_log,
)

pytestmark = pytest.mark.spark

UNEVEN = kernel.SegmentSet(kernel.Segment.split_balanced(kernel.ROOT, 23))
DEEP = kernel.SegmentSet.from_ids([2**depth - 1 for depth in range(16)])


def _frame(spark, keys, ddl="k string"):
    return spark.createDataFrame([(key,) for key in keys], ddl)


@pytest.mark.parametrize(
    "segments", [UNEVEN, DEEP, kernel.SegmentSet.balanced(8), kernel.SegmentSet.balanced(1)],
    ids=["uneven", "deep", "balanced", "one"],
)
@pytest.mark.parametrize("hash_name", ["spark", "java"])
@settings(max_examples=5, deadline=None)
@given(keys=st.lists(st.text(max_size=12), min_size=1, max_size=60))
def test_segment_column_equals_the_kernel(spark, segments, hash_name, keys):
    frame = _frame(spark, keys)
    got = [row[0] for row in frame.select(segment_column(frame, "k", segments, hash_name)).collect()]
    hashes = kernel.spark_hash_many(keys) if hash_name == "spark" else kernel.java_hash_many(keys)
    assert got == segments.assign(hashes).tolist()


@pytest.mark.parametrize("method", ["reflect", "arrow"])
def test_java_hash_candidates_agree_with_the_kernel(spark, method):
    keys = ["", "a", "user-000042", "ünïcødé", "\U0001f600 beyond the BMP", "x" * 300]
    frame = _frame(spark, keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the column is built without a word to the user
        column = hash_column("k", "string", "java", method)
    got = [row[0] for row in frame.select(column).collect()]
    assert got == [kernel.java_hash(key) for key in keys]


def test_integer_keys_hash_like_the_kernel(spark):
    numbers = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 123456789012]
    frame = _frame(spark, numbers, "k bigint")
    java = [row[0] for row in frame.select(hash_column("k", "bigint", "java")).collect()]
    assert java == [kernel.java_hash(number) for number in numbers]
    sparks = [row[0] for row in frame.select(hash_column("k", "bigint", "spark")).collect()]
    assert sparks == [kernel.spark_hash(number, "bigint") for number in numbers]


def test_columns_reject_bad_settings(spark):
    frame = _frame(spark, ["a"])
    with pytest.raises(OptionError, match="hash must be"):
        hash_column("k", "string", "md5")
    with pytest.raises(OptionError, match="method must be"):
        hash_column("k", "string", "java", "guess")
    with pytest.raises(InputError, match="strings or integers"):
        hash_column("k", "double", "java")
    with pytest.raises(InputError, match="no column 'nope'"):
        segment_column(frame, "nope", UNEVEN)
    with pytest.raises(TypeError, match="SegmentSet"):
        member_index_column(frame["k"], [0, 1])


@pytest.mark.parametrize("hash_name", ["java", "spark"])
def test_segment_partitioner_puts_each_segment_in_its_partition(spark, impl, hash_name):
    segments = impl.SegmentSet.balanced(5)
    partitioner = impl.SegmentPartitioner(segments, hash=hash_name)
    keys = [f"key-{i}" for i in range(300)]
    rdd = spark.sparkContext.parallelize([(key, 1) for key in keys], 3)
    placed = rdd.partitionBy(partitioner.num_partitions, partitioner).glom().collect()
    hash_function = impl.java_hash if hash_name == "java" else impl.spark_hash
    for partition, pairs in enumerate(placed):
        assert all(segments.owner_index(hash_function(key)) == partition for key, _ in pairs)
    assert sorted(key for pairs in placed for key, _ in pairs) == sorted(keys)


# ---------------------------------------------------------------- replay


def assert_each_key_in_order(handled, events):
    """Every handled event came after every earlier event of its key (at least once each)."""
    seen: dict[str, set[int]] = {}
    for event in handled:
        done = seen.setdefault(event["user"], set())
        assert event["seq"] == 0 or event["seq"] - 1 in done, f"{event} handled before its predecessor"
        done.add(event["seq"])
    expected = {(user, seq) for user, seq in zip(events.column("user").to_pylist(),
                                                 events.column("seq").to_pylist(), strict=True)}
    assert {(e["user"], e["seq"]) for e in handled} == expected


@pytest.mark.versions
def test_replay_handles_every_event_once_in_order_and_reruns_handle_nothing(spark, tmp_path):
    table = generate_events(3000, seed=3)
    frame = spark.createDataFrame(table)
    log = str(tmp_path / "log.jsonl")
    checkpoint = str(tmp_path / "checkpoint")
    result = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=checkpoint, segments=3)
    handled = read_log(log)
    assert result.complete and result.handled == len(handled) == 3000 and result.key_group_bits == 12
    assert_each_key_in_order(handled, table)
    state = CheckpointStore(checkpoint).load()
    assert state.tokens.complete and state.settings["status"] == "complete"
    assert state.tokens.count.tolist() == np.bincount(
        [group for group, _ in expected.positions(table).values()], minlength=4096).tolist()
    assert os.listdir(tmp_path / "checkpoint" / "progress") == []

    again = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=checkpoint, segments=5)
    assert again.complete and again.handled == 0 and again.already_done == 3000
    assert len(read_log(log)) == 3000


def _overlapping(handled):
    """How many pairs of calls in one process ran at the same time (sorted by start)."""
    overlaps = 0
    for pid in {event["pid"] for event in handled}:
        calls = sorted((e["start"], e["end"]) for e in handled if e["pid"] == pid)
        overlaps += sum(1 for (_, end), (start, _) in itertools.pairwise(calls) if start < end)
    return overlaps


@pytest.mark.parametrize("recorder", [TimedRecorder, AsyncTimedRecorder], ids=["threads", "async"])
@pytest.mark.handlers
def test_concurrent_calls_keep_each_keys_order_and_record_everything(spark, tmp_path, recorder):
    table = generate_events(3000, seed=21)
    frame = spark.createDataFrame(table)
    log = str(tmp_path / "log.jsonl")
    reports = []
    result = replay(frame, key="user", order="ts", handler=recorder(log, 0.004),
                    checkpoint=str(tmp_path / "checkpoint"), segments=2, concurrency=32, max_pending=96,
                    flush_interval=0.2, progress=reports.append)
    handled = read_log(log)
    assert result.complete and result.handled == len(handled) == 3000
    assert_each_key_in_order(handled, table)
    # A key's next call starts only after its previous one ended.
    for user in {event["user"] for event in handled}:
        calls = sorted((e["seq"], e["start"], e["end"]) for e in handled if e["user"] == user)
        assert all(later[1] >= earlier[2] for earlier, later in itertools.pairwise(calls))
    assert _overlapping(handled) > 1000 and 32 < result.peak_pending <= 96
    # The progress reports count the calls in flight and the rows pending while the run goes on,
    # and none once it has ended.
    during = [report for report in reports[:-1] if report.in_flight]
    assert during and all(report.in_flight <= min(report.pending, 2 * 32) for report in during)
    assert max(report.pending for report in during) <= 2 * 96
    assert (reports[-1].in_flight, reports[-1].pending, reports[-1].done) == (0, 0, 3000)


@pytest.mark.handlers
def test_the_sequential_policy_runs_one_call_at_a_time(spark, tmp_path):
    table = generate_events(300, seed=22)
    log = str(tmp_path / "log.jsonl")
    result = replay(spark.createDataFrame(table), key="user", order="ts", handler=TimedRecorder(log, 0.001),
                    checkpoint=str(tmp_path / "checkpoint"), segments=1, concurrency=4, policy="sequential")
    handled = read_log(log)
    assert result.complete and len(handled) == 300 and _overlapping(handled) == 0
    assert_each_key_in_order(handled, table)


def _events_and_their_busiest_user(spark, tmp_path, count, seed):
    """Events as a table and a frame, the user with the most events, a log path, a checkpoint path."""
    table = generate_events(count, seed=seed)
    users = table.column("user").to_pylist()
    busiest = max(set(users), key=users.count)
    frame = spark.createDataFrame(table)
    return table, frame, busiest, str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")


@pytest.mark.handlers
def test_a_concurrent_failure_names_the_event_and_a_resume_finishes_in_order(spark, tmp_path):
    table, frame, heavy, log, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 2000, 23)
    with pytest.raises(HandlerFailedError) as failure:
        replay(frame, key="user", order="ts", handler=TimedRecorder(log, 0.001, fail_on=(heavy, 7)),
               checkpoint=checkpoint, segments=2, concurrency=6, flush_every=100)
    assert failure.value.key == heavy
    assert (failure.value.key_group, failure.value.position) == expected.positions(table)[(heavy, 7)]
    before = read_log(log)
    assert (heavy, 7) not in {(e["user"], e["seq"]) for e in before}
    result = replay(frame, key="user", order="ts", handler=TimedRecorder(log, 0.001),
                    checkpoint=checkpoint, concurrency=6)
    assert result.complete and result.already_done > 0
    # At least once, each key in order, across both runs.
    assert_each_key_in_order(read_log(log), table)


@pytest.mark.handlers
def test_a_retried_call_completes_the_run_and_without_retries_the_failure_counts_attempts(spark, tmp_path):
    table, frame, heavy, log, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 600, 24)
    result = replay(frame, key="user", order="ts", handler=FailsFirstTime(log, (heavy, 3)),
                    checkpoint=checkpoint, segments=2, retries=1, retry_delay=0.01)
    assert result.complete and len(read_log(log)) == 600
    assert_each_key_in_order(read_log(log), table)
    with pytest.raises(HandlerFailedError) as failure:
        replay(frame, key="user", order="ts", handler=Recorder(log, fail_on=(heavy, 3)),
               checkpoint=str(tmp_path / "again"), segments=2, retries=2, retry_delay=0)
    assert failure.value.reason == "ValueError: the handler refuses this event (after 3 attempts)"


@pytest.mark.handlers
def test_a_call_past_its_timeout_fails_the_run_and_names_the_event(spark, tmp_path):
    _, frame, heavy, _, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 400, 25)
    began = time.monotonic()
    with pytest.raises(HandlerFailedError) as failure:
        replay(frame, key="user", order="ts", handler=SlowOn(heavy, 20), checkpoint=checkpoint,
               segments=2, concurrency=4, timeout=0.5)
    assert time.monotonic() - began < 20, "the run waited for the call it had given up on"
    assert failure.value.key == heavy
    assert failure.value.reason == "TimeoutError: the handler took more than 0.5 s"


@pytest.mark.parametrize("concurrency", [1, 6])
@pytest.mark.handlers
def test_dead_letters_hold_each_failure_and_its_keys_later_events_and_the_rest_runs(
        spark, tmp_path, concurrency, capsys):
    from segack.cli import main

    table, frame, heavy, log, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 3000, 26)
    users = table.column("user").to_pylist()
    other = sorted(set(users) - {heavy})[3]
    refused = frozenset({(heavy, 4), (other, 1)})
    result = replay(frame, key="user", order="ts", handler=RefusesSome(log, refused), checkpoint=checkpoint,
                    segments=3, concurrency=concurrency, retries=1, retry_delay=0, on_error="dead-letter",
                    flush_every=200)
    seqs = table.column("seq").to_pylist()
    expected_dead = {(user, seq) for user, seq in zip(users, seqs, strict=True)
                     if (user == heavy and seq >= 4) or (user == other and seq >= 1)}
    letters = CheckpointStore(checkpoint).read_dead_letters()
    assert {(u, s) for u, s in zip(letters.column("user").to_pylist(), letters.column("seq").to_pylist(),
                                   strict=True)} == expected_dead
    attempts = dict(zip(zip(letters.column("user").to_pylist(), letters.column("seq").to_pylist(),
                            strict=True), letters.column("__segack_attempts").to_pylist(), strict=True))
    assert attempts[(heavy, 4)] == attempts[(other, 1)] == 2
    assert all(count == 0 for event, count in attempts.items() if event not in refused)
    # Everything else ran once, in order; the run read its input to the end, but it is not complete
    # while the dead letters remain.
    handled = read_log(log)
    assert len(handled) == len({(e["user"], e["seq"]) for e in handled}) == 3000 - len(expected_dead)
    assert not {(e["user"], e["seq"]) for e in handled} & expected_dead
    assert result.done == result.total and not result.complete
    assert result.dead_letters == result.dead_letters_left == len(expected_dead)
    assert repr(result).startswith("ReplayResult(complete=False, total=3000,")
    assert result.handled == 3000 - len(expected_dead)
    assert main(["dead-letters", checkpoint]) == 0
    listing = capsys.readouterr().out
    assert f"{len(expected_dead):,} events of 2 keys" in listing
    assert f"part 4 of {heavy} is refused (2 attempts)" in listing


def _later_events(table, users, count):
    """``count`` new events for each of ``users``, after all of ``table``'s (an input that grew)."""
    rows = table.to_pylist()
    last_ts = max(row["ts"] for row in rows)
    later = []
    for user in users:
        seq = max(row["seq"] for row in rows if row["user"] == user)
        later += [{"user": user, "ts": last_ts + 1 + n, "seq": seq + 1 + n, "part": f"later#{n}"}
                  for n in range(count)]
    return pa.concat_tables([table, pa.Table.from_pylist(later, schema=table.schema)])


def _keys_and_seqs(letters):
    return {(user, seq) for user, seq in zip(letters.column("user").to_pylist(),
                                             letters.column("seq").to_pylist(), strict=True)}


@pytest.mark.parametrize("concurrency", [1, 6])
@pytest.mark.handlers
def test_a_parked_key_waits_behind_its_dead_letters_until_a_retry_handles_them_in_order(
        spark, tmp_path, concurrency):
    table, frame, heavy, log, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 2000, 27)
    users = table.column("user").to_pylist()
    other = sorted(user for user in set(users) - {heavy} if users.count(user) >= 3)[5]
    store = CheckpointStore(checkpoint)
    refused = frozenset({(heavy, 3), (other, 1)})
    first = replay(frame, key="user", order="ts", handler=RefusesSome(log, refused), checkpoint=checkpoint,
                   segments=3, concurrency=concurrency, on_error="dead-letter")
    dead = _keys_and_seqs(store.read_dead_letters())
    assert not first.complete and first.dead_letters_left == len(dead)
    assert {user for user, _ in dead} == {heavy, other}

    # The input grows; the parked keys' newer events wait behind their dead letters, even with
    # on_error="stop", and the other keys' run.
    grown = _later_events(table, [heavy, other, users[0]], 4)
    second = replay(spark.createDataFrame(grown), key="user", order="ts", handler=Recorder(log),
                    checkpoint=checkpoint, segments=2, concurrency=concurrency)
    newer_dead = _keys_and_seqs(store.read_dead_letters()) - dead
    assert second.dead_letters == len(newer_dead) == 8 and second.done == second.total
    assert not second.complete and second.dead_letters_left == len(dead | newer_dead)
    assert {user for user, _ in newer_dead} == {heavy, other}
    assert not {(e["user"], e["seq"]) for e in read_log(log)} & (dead | newer_dead)

    # A retry handles each key's dead letters in order; one that fails again stays, with its key's
    # later ones, and the key stays parked.
    third = replay(spark.createDataFrame(grown), key="user", order="ts",
                   handler=RefusesSome(log, frozenset({(other, 1)})), checkpoint=checkpoint, segments=4,
                   concurrency=concurrency, retry_dead_letters=True)
    left = _keys_and_seqs(store.read_dead_letters())
    assert {user for user, _ in left} == {other} and left == {e for e in dead | newer_dead if e[0] == other}
    assert third.retried == len(dead | newer_dead) - len(left) and third.retry_failed == len(left)
    assert third.handled == 0 and third.dead_letters == 0
    assert third.dead_letters_left == len(left) and not third.complete

    fourth = replay(spark.createDataFrame(grown), key="user", order="ts", handler=Recorder(log),
                    checkpoint=checkpoint, retry_dead_letters=True)
    assert fourth.retried == len(left) and fourth.retry_failed == 0 and store.read_dead_letters() is None
    assert fourth.complete and fourth.dead_letters_left == 0
    # Over all four runs: every event handled exactly once, each key in order.
    handled = read_log(log)
    assert len(handled) == grown.num_rows
    assert_each_key_in_order(handled, grown)


@pytest.mark.handlers
@pytest.mark.streams
def test_a_stream_parks_a_failed_key_across_batches_and_retries_it_when_restarted_with_the_option(
        spark, tmp_path):
    from segack.spark_adapter import foreach_batch

    table = generate_events(1800, seed=28).sort_by("ts")
    batches = [table.slice(start, 600) for start in (0, 600, 1200)]
    users = batches[0].column("user").to_pylist()
    failing = next(user for user in users if users.count(user) >= 3)
    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    options = {"key": "user", "order": "ts", "checkpoint": checkpoint, "segments": 2, "concurrency": 4}
    first = foreach_batch(RefusesSome(log, frozenset({(failing, 1)})), on_error="dead-letter", **options)
    first(spark.createDataFrame(batches[0]), 0)
    first(spark.createDataFrame(batches[1]), 1)
    letters = CheckpointStore(checkpoint).read_dead_letters()
    parked = {seq for user, seq in _keys_and_seqs(letters) if user == failing}
    expected_parked = {seq for user, seq in zip(table.column("user").to_pylist()[:1200],
                                                table.column("seq").to_pylist()[:1200], strict=True)
                       if user == failing and seq >= 1}
    assert parked == expected_parked and {user for user, _ in _keys_and_seqs(letters)} == {failing}
    # Restarted with the option, the stream's first batch handles them first, then its own events.
    restarted = foreach_batch(Recorder(log), retry_dead_letters=True, **options)
    restarted(spark.createDataFrame(batches[2]), 2)
    assert CheckpointStore(checkpoint).read_dead_letters() is None
    handled = read_log(log)
    assert len(handled) == 1800
    assert_each_key_in_order(handled, table)


def test_handler_failure_names_the_event_saves_progress_and_resume_skips_done_work(spark, tmp_path):
    table, frame, heavy, log, checkpoint = _events_and_their_busiest_user(spark, tmp_path, 4000, 5)
    with pytest.raises(HandlerFailedError) as failure:
        replay(frame, key="user", order="ts", handler=Recorder(log, fail_on=(heavy, 5)),
               checkpoint=checkpoint, segments=2, flush_every=50)
    placed = expected.positions(table)
    assert failure.value.key == heavy
    assert (failure.value.key_group, failure.value.position) == placed[(heavy, 5)]
    order_value = table.filter(pa.compute.and_(
        pa.compute.equal(table["user"], heavy), pa.compute.equal(table["seq"], 5)))["ts"][0].as_py()
    assert failure.value.order == order_value
    assert f"key '{heavy}'" in str(failure.value) and str(order_value) in str(failure.value)
    assert failure.value.reason == "ValueError: the handler refuses this event"
    assert "Traceback" in failure.value.traceback and "spark_handlers.py" in failure.value.traceback

    state = CheckpointStore(checkpoint).load()
    assert state.settings["status"] == "failed"
    first_run = read_log(log)
    done_before = expected.done_events(table, state.tokens)
    # Everything the checkpoint calls done was really handled, and the failing event is not done.
    assert done_before and done_before <= {(e["user"], e["seq"]) for e in first_run}
    assert (heavy, 5) not in done_before and (heavy, 4) in done_before

    result = replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "second.jsonl")),
                    checkpoint=checkpoint, segments=5)
    second_run = read_log(str(tmp_path / "second.jsonl"))
    assert result.complete and result.already_done == len(done_before)
    assert not done_before & {(e["user"], e["seq"]) for e in second_run}
    assert_each_key_in_order(first_run + second_run, table)


#: Order values of each type (null and NaN are refused: an event needs a place in its key's order).
ORDER_KINDS = {
    "bigint": st.integers(-3, 3),
    "double": st.sampled_from([-1.5, -0.0, 0.0, 2.0, float("inf"), float("-inf")]),
    "string": st.sampled_from(["", "a", "ab", "b", "\u00e9"]),
    "timestamp": st.sampled_from([
        datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.UTC),
        datetime.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=datetime.UTC),
        datetime.datetime(1969, 12, 31, 23, 59, tzinfo=datetime.UTC)]),
}


def _fail_then_resume(frame, tmp_path, stop_at, **arguments):
    """Replay ``frame`` failing at the event whose line is ``stop_at``, then resume it; check that the
    two runs handled every row exactly once between them, and each key's events in order."""
    events = frame.toArrow().to_pylist()
    first, second = str(tmp_path / "first.jsonl"), str(tmp_path / "second.jsonl")
    arguments = {"key": "k", "order": "o", "checkpoint": str(tmp_path / "checkpoint"), **arguments}
    with pytest.raises(HandlerFailedError):
        replay(frame, handler=LineRecorder(first, fail_on=stop_at), **arguments)
    result = replay(frame.repartition(2), handler=LineRecorder(second), **arguments)
    assert result.complete
    # A third run verifies the prefix digests the resume wrote, and finds nothing left to do.
    again = replay(frame, handler=LineRecorder(str(tmp_path / "third.jsonl")), **arguments)
    assert again.complete and again.handled == 0 and not read_lines(str(tmp_path / "third.jsonl"))
    handled = read_lines(first) + read_lines(second)
    assert collections.Counter(handled) == collections.Counter(event_line(event) for event in events)
    key_at = sorted(events[0]).index("k")
    order_of = {event_line(event): event["o"] for event in events}
    per_key: dict[object, list[object]] = {}
    for line in handled:
        per_key.setdefault(json.loads(line)[key_at], []).append(order_of[line])
    for orders in per_key.values():
        assert orders == sorted(orders)  # -0.0 and 0.0 are equal, for Spark as for Python


@pytest.mark.faults
@settings(max_examples=6, deadline=None)  # three replays each; the suite's time (20 min) bounds it
@given(data=st.data(), order_kind=st.sampled_from(sorted(ORDER_KINDS)),
       key_kind=st.sampled_from(["string", "bigint"]))
def test_a_resume_after_a_failure_anywhere_handles_every_row_exactly_once_in_order(
        spark, tmp_path_factory, data, order_kind, key_kind):
    """Duplicate rows, equal sort keys, null keys, signed zeros and infinities: a run that fails at a
    chosen event, then its resume, handle the input's rows exactly once between them, each key in
    order."""
    keys = st.one_of(st.none(), st.sampled_from([0, 1, 2, 7]) if key_kind == "bigint"
                     else st.sampled_from(["k0", "k1", "k2", "k7"]))
    row = st.tuples(keys, ORDER_KINDS[order_kind], st.sampled_from(["p", "q"]), st.sampled_from([0.0, -0.0]))
    rows = data.draw(st.lists(row, min_size=1, max_size=60))
    frame = spark.createDataFrame(rows, f"k {key_kind}, o {order_kind}, p string, z double").repartition(3)
    stop_at = event_line(data.draw(st.sampled_from(frame.toArrow().to_pylist())))
    segments, bits = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 12))
    workdir = tmp_path_factory.mktemp("resume")
    _fail_then_resume(frame, workdir, stop_at, segments=segments, key_group_bits=bits)


def test_timestamp_boundaries_survive_a_session_time_zone_other_than_utc(spark, tmp_path):
    moments = [datetime.datetime(2026, 3, 8, 6, 59, 59, 999999, tzinfo=datetime.UTC) + datetime.timedelta(
        microseconds=step * 137) for step in range(40)]
    rows = [(f"k{n % 3}", moments[n % 20], f"p{n % 2}") for n in range(80)]
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        frame = spark.createDataFrame(rows, "k string, o timestamp, p string")
        stop_at = event_line(sorted(frame.toArrow().to_pylist(), key=lambda e: e["o"])[30])
        _fail_then_resume(frame, tmp_path, stop_at, segments=2, key_group_bits=4)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


@pytest.mark.parametrize(("kind", "values", "shown"), [
    ("bigint", [1, None, 2], "is null in 1 event"),
    ("double", [float("nan"), None, 2.0], "is null or NaN in 2 events"),
])
def test_events_without_a_place_in_their_keys_order_are_refused_before_anything_is_written(
        spark, tmp_path, kind, values, shown):
    frame = spark.createDataFrame([("a", value) for value in values], f"k string, o {kind}")
    with pytest.raises(InputError, match=f"the order column 'o' {shown}: each event needs a place"):
        replay(frame, key="k", order="o", handler=Recorder(str(tmp_path / "log.jsonl")),
               checkpoint=str(tmp_path / "checkpoint"))
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "log.jsonl").exists()


def test_an_empty_input_is_complete_at_once(spark, tmp_path):
    frame = spark.createDataFrame([], "k string, o bigint")
    result = replay(frame, key="k", order="o", handler=Recorder(str(tmp_path / "log.jsonl")),
                    checkpoint=str(tmp_path / "checkpoint"))
    assert result.complete and result.total == 0 and result.handled == 0
    assert CheckpointStore(str(tmp_path / "checkpoint")).load().settings["status"] == "complete"


def test_a_resume_skips_the_completions_beyond_a_committed_point(spark, tmp_path):
    """Done positions past a key group's committed point (``extras``) are never handled again."""
    table = generate_events(600, seed=11)
    frame = spark.createDataFrame(table)
    checkpoint = str(tmp_path / "checkpoint")
    tenth = table.sort_by("ts").slice(9, 1).to_pylist()[0]
    with pytest.raises(HandlerFailedError):
        replay(frame, key="user", order="ts", checkpoint=checkpoint, segments=1,
               handler=Recorder(str(tmp_path / "a.jsonl"), fail_on=(tenth["user"], tenth["seq"])))
    store = CheckpointStore(checkpoint)
    state = store.load()
    placed = expected.positions(table)
    tokens = state.tokens
    # Mark, by hand, a few events past their key groups' committed points as done.
    chosen = sorted(event for event, (group, position) in placed.items()
                    if position >= tokens.committed[group] + 1)[:5]
    for event in chosen:
        group, position = placed[event]
        tokens.extras.setdefault(group, set()).add(position)
    store.save(state)
    log = str(tmp_path / "b.jsonl")
    result = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=checkpoint)
    handled = {(e["user"], e["seq"]) for e in read_log(log)}
    assert result.complete and chosen and not handled & set(chosen)
    assert handled | set(chosen) | expected.done_events(table, KeyGroupTokens.from_bytes(
        store.load().tokens.to_bytes(), 12)) == set(placed)
    assert len(handled) == 600 - len(expected.done_events(table, tokens))


def _state_bytes(checkpoint):
    """The bytes of a checkpoint's newest state file."""
    return Path(CheckpointStore(str(checkpoint)).state_file()).read_bytes()


@pytest.mark.checkpoint
def test_a_damaged_checkpoint_is_refused_and_left_untouched(spark, tmp_path):
    frame = spark.createDataFrame(generate_events(500, seed=9))
    checkpoint = tmp_path / "checkpoint"
    replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "a.jsonl")),
           checkpoint=str(checkpoint), segments=2)
    state_file = Path(CheckpointStore(str(checkpoint)).state_file())
    damaged = bytearray(state_file.read_bytes())
    position = damaged.index(b'"tokens": "') + 14
    damaged[position] = ord("A") if damaged[position] != ord("A") else ord("B")
    state_file.write_bytes(bytes(damaged))
    log = tmp_path / "b.jsonl"
    with pytest.raises(CheckpointError, match="damaged"):
        replay(frame, key="user", order="ts", handler=Recorder(str(log)), checkpoint=str(checkpoint))
    assert state_file.read_bytes() == bytes(damaged)
    assert not log.exists()


@pytest.mark.checkpoint
def test_a_checkpoint_written_by_0_1_0_is_refused_with_its_version_and_kept(spark, tmp_path):
    old = {"format": "segack-checkpoint", "version": 1, "settings": {"key": "user"}, "acker": "AAAA"}
    old["crc32"] = zlib.crc32(json.dumps(old, sort_keys=True, separators=(",", ":")).encode())
    (tmp_path / "checkpoint").mkdir()
    state_file = tmp_path / "checkpoint" / "checkpoint-000000000000.json"
    state_file.write_bytes(json.dumps(old).encode())
    frame = spark.createDataFrame(generate_events(50, seed=9))
    refusal = r"written by segack 0\.1\.0 \(format 1\).*new checkpoint location"
    with pytest.raises(CheckpointError, match=refusal):
        replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "a.jsonl")),
               checkpoint=str(tmp_path / "checkpoint"))
    assert json.loads(state_file.read_bytes()) == old
    assert not (tmp_path / "a.jsonl").exists()


@pytest.mark.parametrize("change", ["other events", "a duplicated event", "another key column"])
def test_a_checkpoint_of_other_input_is_refused(spark, tmp_path, change):
    table = generate_events(300, seed=1)
    checkpoint = str(tmp_path / "checkpoint")
    replay(spark.createDataFrame(table), key="user", order="ts",
           handler=Recorder(str(tmp_path / "a.jsonl")), checkpoint=checkpoint, segments=2)
    before = _state_bytes(tmp_path / "checkpoint")
    other, key = table, "user"
    if change == "other events":
        other = generate_events(300, seed=2)
    elif change == "a duplicated event":
        # Two equal rows would cancel out of an XOR; the digest must still see them. The copied event
        # has a later one in its key group: it lies behind the boundary, among the events done.
        placed = expected.positions(table)
        groups = collections.Counter(group for group, _ in placed.values())
        user, seq = min(event for event, (group, position) in placed.items()
                        if position < groups[group] - 1)
        copy = table.filter(pa.compute.and_(pa.compute.equal(table["user"], user),
                                            pa.compute.equal(table["seq"], seq)))
        other = pa.concat_tables([table, copy, copy])
    else:
        other, key = table.append_column("account", table.column("user")), "account"
    with pytest.raises(ForeignInputError, match="other input"):
        replay(spark.createDataFrame(other), key=key, order="ts",
               handler=Recorder(str(tmp_path / "b.jsonl")), checkpoint=checkpoint)
    assert _state_bytes(tmp_path / "checkpoint") == before
    assert not (tmp_path / "b.jsonl").exists()


def test_a_crashed_first_run_then_other_input_is_refused(spark, tmp_path):
    """The first run never finished, so nothing counted the input; the done events still identify it."""
    table = generate_events(400, seed=1)
    checkpoint = str(tmp_path / "checkpoint")
    tenth = table.sort_by("ts").slice(9, 1).to_pylist()[0]
    with pytest.raises(HandlerFailedError):
        replay(spark.createDataFrame(table), key="user", order="ts", segments=1, checkpoint=checkpoint,
               handler=Recorder(str(tmp_path / "a.jsonl"), fail_on=(tenth["user"], tenth["seq"])))
    assert CheckpointStore(checkpoint).load().tokens.total is None
    before = _state_bytes(tmp_path / "checkpoint")
    # The same events but one: a done event changed its payload.
    first = table.sort_by("ts").slice(0, 1).to_pylist()[0]
    changed = pa.Table.from_pylist([dict(event, part="edited") if event == first else event
                                    for event in table.to_pylist()], schema=table.schema)
    with pytest.raises(ForeignInputError, match="other input: in key group"):
        replay(spark.createDataFrame(changed), key="user", order="ts", checkpoint=checkpoint,
               handler=Recorder(str(tmp_path / "b.jsonl")))
    assert _state_bytes(tmp_path / "checkpoint") == before
    assert not (tmp_path / "b.jsonl").exists()
    # Events added after every boundary are new work, not another input.
    later = pa.concat_tables([table, pa.table({"user": ["user-new"], "ts": [2**62], "seq": [0],
                                               "part": ["late"]}, schema=table.schema)])
    result = replay(spark.createDataFrame(later), key="user", order="ts", checkpoint=checkpoint,
                    handler=Recorder(str(tmp_path / "c.jsonl")))
    assert result.complete and result.total == 401
    assert {e["user"] for e in read_log(str(tmp_path / "c.jsonl"))} >= {"user-new"}


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"key": "nope"}, InputError, "no column 'nope'"),
    ({"order": "user"}, InputError, "different columns"),
    ({"flush_every": 0}, OptionError, "flush_every"),
    ({"flush_interval": 0}, OptionError, "flush_interval"),
    ({"segments": 0}, OptionError, "segments"),
    ({"key_group_bits": 17}, OptionError, "key_group_bits"),
    ({"key_group_bits": 2, "segments": 8}, ValueError, "finer than 4 key groups"),
    ({"handler": "not callable"}, TypeError, "callable"),
    ({"concurrency": 0}, OptionError, "concurrency"),
    ({"batch_size": 0}, OptionError, "batch_size"),
    ({"max_pending": 0}, OptionError, "max_pending"),
    ({"policy": "any"}, OptionError, "policy"),
    ({"retries": -1}, OptionError, "retries"),
    ({"retry_delay": -1}, OptionError, "retry_delay"),
    ({"timeout": 0}, OptionError, "timeout"),
    ({"on_error": "skip"}, OptionError, "on_error"),
    ({"verify": "never"}, OptionError, "verify must be one of"),
])
def test_replay_rejects_bad_settings_before_writing_anything(spark, tmp_path, kwargs, error, message):
    frame = spark.createDataFrame(generate_events(50, seed=4))
    arguments = {"key": "user", "order": "ts", "handler": Recorder(str(tmp_path / "log.jsonl")),
                 "checkpoint": str(tmp_path / "checkpoint"), **kwargs}
    with pytest.raises(error, match=message):
        replay(frame, **arguments)
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "log.jsonl").exists()


def test_an_order_column_spark_cannot_compare_simply_is_refused(spark, tmp_path):
    frame = spark.createDataFrame([("a", [1, 2])], "user string, ts array<int>")
    with pytest.raises(InputError, match="plain sortable type"):
        replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "log.jsonl")),
               checkpoint=str(tmp_path / "checkpoint"))
    assert not (tmp_path / "checkpoint").exists()


def test_the_key_group_resolution_is_fixed_by_the_first_run(spark, tmp_path):
    frame = spark.createDataFrame(generate_events(200, seed=4))
    checkpoint = str(tmp_path / "checkpoint")
    replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "a.jsonl")), checkpoint=checkpoint,
           key_group_bits=3, segments=8)
    before = _state_bytes(tmp_path / "checkpoint")
    with pytest.raises(ForeignInputError, match=r"2\*\*3 key groups; key_group_bits=4"):
        replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "b.jsonl")),
               checkpoint=checkpoint, key_group_bits=4)
    with pytest.raises(ValueError, match="finer than 8 key groups"):
        replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "b.jsonl")),
               checkpoint=checkpoint, segments=16)
    assert _state_bytes(tmp_path / "checkpoint") == before
    assert not (tmp_path / "b.jsonl").exists()


@pytest.mark.checkpoint
def test_checkpoint_round_trip_and_every_damage_is_refused(tmp_path):
    from segack.spark_adapter.store.checkpoint import Checkpoint

    tokens = KeyGroupTokens.empty(2, pa.int64(), pa.string())
    tokens.set_counts(np.array([3, 0, 2, 1]))
    tokens.committed[:] = [2, 0, 0, 1]
    tokens.run_start[:] = [1, 0, 0, 0]
    tokens.boundaries = {0: (17, "a", 5), 3: (4, "b", -2)}
    original = Checkpoint({"key": "user", "total": 6, "key_group_bits": 2}, tokens)
    data = original.to_bytes()
    back = Checkpoint.from_bytes(data)
    assert back.settings == original.settings and back.tokens.boundaries == tokens.boundaries
    for position in range(len(data)):
        changed = bytearray(data)
        changed[position] ^= 0x01
        try:
            restored = Checkpoint.from_bytes(bytes(changed))
        except CheckpointError:
            continue
        # A flip that JSON reads the same (whitespace, or a case in an escape) must mean the same.
        assert restored.settings == original.settings
        assert restored.tokens.to_bytes() == tokens.to_bytes()
    with pytest.raises(CheckpointError, match="not a segack checkpoint"):
        Checkpoint.from_bytes(b'{"format": "other"}')
    store = CheckpointStore(str(tmp_path / "c"))
    assert store.load() is None
    store.save(original)
    assert store.load().tokens.committed.tolist() == [2, 0, 0, 1]
    assert [name for name in os.listdir(tmp_path / "c") if name.endswith(".tmp")] == []


def test_a_relative_checkpoint_path_is_made_absolute_before_it_travels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore("ck")
    assert store.location == str(tmp_path / "ck")
    monkeypatch.chdir("/")
    travelled = pickle.loads(pickle.dumps(store))
    assert travelled.location == str(tmp_path / "ck") and travelled.is_local
    assert CheckpointStore("file:///x/y").location == "/x/y"
    assert resolve_location("s3://bucket/ck") == "s3://bucket/ck"
    with pytest.raises(CheckpointLocationError, match="location is required"):
        resolve_location("")


def test_a_finished_run_is_recorded_from_the_job_results_when_progress_files_go_astray(spark, tmp_path):
    """``mock://`` is an in-memory filesystem of each process: what the tasks write there, the driver
    never sees. The tasks' results carry their final progress, so the run still ends complete."""
    table = generate_events(800, seed=23)
    store = CheckpointStore("mock:///checkpoint")
    assert not store.is_local
    log = str(tmp_path / "log.jsonl")
    result = replay(spark.createDataFrame(table), key="user", order="ts", handler=Recorder(log),
                    checkpoint=store, segments=3, flush_every=1)
    assert result.complete and len(read_log(log)) == 800
    state = store.load()
    assert state.settings["status"] == "complete"
    assert expected.done_events(table, state.tokens) == set(expected.positions(table))
    assert store.progress_files() == []


@pytest.mark.streams
def test_foreach_batch_replays_a_stream_in_order_and_skips_redelivered_batches(spark, tmp_path):
    from segack.spark_adapter import foreach_batch

    table = generate_events(1500, seed=13).sort_by("ts")
    source = tmp_path / "source"
    source.mkdir()
    for number, start in enumerate(range(0, 1500, 500)):
        pq.write_table(table.slice(start, 500), source / f"part-{number}.parquet")
        # The file source takes files oldest first; make "oldest" unambiguous.
        os.utime(source / f"part-{number}.parquet", (1_700_000_000 + number * 100,) * 2)
    log = str(tmp_path / "log.jsonl")
    process_batch = foreach_batch(Recorder(log), key="user", order="ts",
                                  checkpoint=str(tmp_path / "checkpoint"), segments=3)
    stream = (spark.readStream.schema(spark.createDataFrame(table.slice(0, 1)).schema)
              .option("maxFilesPerTrigger", 1).parquet(str(source)))
    query = (stream.writeStream.foreachBatch(process_batch)
             .option("checkpointLocation", str(tmp_path / "stream-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    handled = read_log(log)
    assert_each_key_in_order(handled, table)
    assert len(handled) == 1500
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    # Positions continue across batches: the key groups' committed points count all 1500 events.
    assert int(state.tokens.committed.sum()) == 1500 and state.tokens.total == 500
    assert expected.done_events(table, _as_one_input(state.tokens)) == set(expected.positions(table))
    assert state.settings["stream"] == {"completed_batch": 2, "batch": None, "events": 1500}

    process_batch(spark.createDataFrame(table.slice(1000, 500)), 2)
    assert len(read_log(log)) == 1500


def _as_one_input(tokens):
    """The stream's tokens read as if all batches were one input (base 0)."""
    whole = tokens.copy()
    whole.count = whole.committed.copy()
    whole.base[:] = 0
    return whole


def test_no_stage_of_a_replay_gathers_events_into_one_partition(spark, tmp_path):
    """Read the physical plans of the fingerprint and of the job (fresh and resuming)."""
    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.spark.events import EventInput
    from segack.spark_adapter.worker.task import TaskPlan, TaskStart

    frame = spark.createDataFrame(generate_events(2000, seed=17)).repartition(4)
    events = EventInput(frame, "user", "ts", "spark", "auto", 12)
    tokens = KeyGroupTokens.empty(12, pa.int64(), pa.string())
    plan = TaskPlan(store=CheckpointStore(str(tmp_path / "ck")).for_tasks("plan", 1), handler=print,
                    columns=tuple(frame.columns), key="user", order="ts",
                    options=RunOptions.from_keywords({"flush_every": 10, "flush_interval": 1.0,
                                                      "concurrency": 4}),
                    start=TaskStart.of(tokens))
    resuming = tokens.copy()
    resuming.committed[7] = 1
    resuming.boundaries[7] = (0, "user-x", 0)
    frames = [events.job(tokens, kernel.SegmentSet.balanced(3), plan),
              events.verification_frame(resuming), events.job(resuming, kernel.SegmentSet.balanced(5), plan)]
    for frame_to_check in frames:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            frame_to_check.explain(mode="formatted")
        plan_text = text.getvalue()
        assert "Exchange" in plan_text
        assert "SinglePartition" not in plan_text, plan_text
        assert "Window" not in plan_text, plan_text


def _skewed_events(count, seed):
    """Events where one key holds 30 % of all events; the rest spread over many keys."""
    rng = np.random.default_rng(seed)
    users = np.where(rng.random(count) < 0.3, "hot", np.char.add("user-", rng.integers(0, count // 3, count)
                                                                  .astype(str)))
    return pa.table({"user": users.tolist(), "ts": rng.permutation(count).astype(np.int64),
                     "payload": rng.integers(0, 1000, count)})


def _peak_checkpoint_bytes(spark, tmp_path, count):
    store = CheckpointStore(str(tmp_path / f"checkpoint-{count}"))
    peak, running = [0], threading.Event()
    running.set()

    def watch():
        while running.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], store.size_bytes())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = replay(spark.createDataFrame(_skewed_events(count, seed=count)), key="user", order="ts",
                        handler=SlowOn("hot", 0.0002), checkpoint=store, segments=4, key_group_bits=8,
                        flush_every=100, flush_interval=0.05)
    finally:
        running.clear()
        watcher.join()
    assert result.complete
    return max(peak[0], store.size_bytes())


@pytest.mark.checkpoint
def test_the_checkpoint_does_not_grow_with_the_number_of_events(spark, tmp_path):
    """Peak bytes of the state file and progress files during a run: 10x the events, about the same
    size. Both runs have events in all 256 key groups, so only the number of events differs."""
    small = _peak_checkpoint_bytes(spark, tmp_path, 4_000)
    large = _peak_checkpoint_bytes(spark, tmp_path, 40_000)
    assert large <= 1.5 * small, (small, large)


def _skewed(count, hot_share, seed):
    """``count`` events, ``hot_share`` of them of one key ("hot"), the rest of 500 others."""
    rng = np.random.default_rng(seed)
    hot = rng.random(count) < hot_share
    users = np.where(hot, "hot", np.char.add("user-", rng.integers(0, 500, count).astype(str)))
    table = pa.table({"user": users.tolist(), "ts": np.arange(count), "seq": np.zeros(count, np.int64)})
    # seq: each user's events numbered in ts order, as the handlers' logs expect.
    seqs, seen = [], collections.Counter()
    for user in table.column("user").to_pylist():
        seqs.append(seen[user])
        seen[user] += 1
    return table.set_column(2, "seq", pa.array(seqs, pa.int64()))


def test_plan_counts_key_groups_in_the_jvm_and_beats_a_balanced_set_on_skewed_events(spark):
    from segack.spark_adapter.coordinator.planning import plan

    table = _skewed(20_000, 0.3, seed=1)
    planned = plan(spark.createDataFrame(table), key="user", workers=8, key_group_bits=6, top=3)
    groups = [group for group, _ in expected.positions(table, bits=6).values()]
    assert planned.key_group_counts.tolist() == np.bincount(groups, minlength=64).tolist()
    users = collections.Counter(table.column("user").to_pylist())
    assert planned.hottest == tuple(sorted(users.items(), key=lambda item: (-item[1], item[0]))[:3])
    assert planned.hottest[0][0] == "hot" and planned.floor == pytest.approx(20_000 / users["hot"])
    assert len(planned.segments) <= 8 and planned.total == 20_000
    # The hot key's group is a segment of its own: the plan's largest load is that group's.
    hot_group = int(np.argmax(planned.key_group_counts))
    assert planned.loads(planned.segments).max() == planned.key_group_counts[hot_group]
    assert planned.largest_share(planned.segments) < planned.largest_share(planned.balanced)
    assert kernel.SegmentSet.from_ids(map(int, planned.segments_option.split(","))) == planned.segments
    sampled = plan(spark.createDataFrame(table), key="user", workers=8, key_group_bits=6, sample=0.5)
    assert sampled.sample == 0.5 and abs(sampled.total - 20_000) < 1_000
    assert sampled.hottest[0][0] == "hot"


@pytest.mark.parametrize(("options", "match"), [
    ({"key": "nope"}, "no column 'nope'"),
    ({"key": "user", "workers": 0}, "workers must be a positive int"),
    ({"key": "user", "top": True}, "top must be a positive int"),
    ({"key": "user", "sample": 0}, r"sample must be a fraction in \(0, 1\]"),
    ({"key": "user", "sample": 1.5}, r"sample must be a fraction in \(0, 1\]"),
    ({"key": "user", "key_group_bits": 17}, "key_group_bits must be an int in 0..16"),
])
def test_plan_refuses_bad_settings(spark, options, match):
    from segack.spark_adapter.coordinator.planning import plan

    with pytest.raises(ValueError, match=match):
        plan(spark.createDataFrame(_skewed(10, 0.5, seed=2)), **options)


@pytest.mark.rescale
def test_a_replay_over_auto_segments_plans_them_first_and_keeps_each_keys_order(spark, tmp_path):
    from segack.spark_adapter.coordinator.planning import plan

    table = _skewed(3000, 0.3, seed=3)
    frame = spark.createDataFrame(table)
    log = str(tmp_path / "log.jsonl")
    result = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=str(tmp_path / "c"),
                    segments="auto")
    workers = int(spark.conf.get("spark.sql.shuffle.partitions"))
    expected_set = plan(frame, key="user", workers=workers).segments
    assert CheckpointStore(str(tmp_path / "c")).load().settings["segments"] == list(expected_set.ids)
    assert result.complete and result.segments == len(expected_set)
    assert_each_key_in_order(read_log(log), table)
    with pytest.raises(OptionError, match="segments must be a positive int, a SegmentSet or 'auto'"):
        replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=str(tmp_path / "d"),
               segments="planned")


def test_ship_module_sends_a_local_package_once_but_never_segack_itself(spark, tmp_path, monkeypatch):
    import uuid
    import zipfile

    from segack.spark_adapter import SessionError, ship_module

    # segack is on the executors already, installed or not; a zip of it would lack its kernel.
    assert ship_module(spark, "segack.demo") is None
    assert ship_module(spark, "json") is None
    name = f"handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "apply.py").write_text("def handle(event):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    shipped = ship_module(spark, f"{name}.apply")
    assert shipped is not None and shipped.endswith(f"{name}.zip")
    assert f"{name}/apply.py" in zipfile.ZipFile(shipped).namelist()
    # A second run in the same session (Spark refuses an artifact's name twice): nothing to send.
    assert ship_module(spark, f"{name}.apply") is None
    # Changed since: the executors would keep the version sent, so it is refused, saying why.
    (tmp_path / name / "apply.py").write_text("def handle(event):\n    return 1\n")
    with pytest.raises(SessionError, match=f"another version of module '{name}'"):
        ship_module(spark, f"{name}.apply")
