"""The Spark adapter on a real local Spark: segment columns, partitioning, replay, checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import segack.kernel as kernel
from segack.demo import generate_events
from segack.spark_adapter.checkpoint import CheckpointError, CheckpointStore
from segack.spark_adapter.columns import hash_column, member_index_column, segment_column
from segack.spark_adapter.replay import HandlerFailed, replay
from tests.spark_handlers import Recorder, read_log

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
    got = [row[0] for row in frame.select(hash_column("k", "string", "java", method)).collect()]
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
    with pytest.raises(ValueError, match="hash must be"):
        hash_column("k", "string", "md5")
    with pytest.raises(ValueError, match="method must be"):
        hash_column("k", "string", "java", "guess")
    with pytest.raises(ValueError, match="strings or integers"):
        hash_column("k", "double", "java")
    with pytest.raises(ValueError, match="no column 'nope'"):
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


def test_segment_partitioner_rejects_bad_settings(impl):
    with pytest.raises(TypeError, match="SegmentSet"):
        impl.SegmentPartitioner([0, 1])
    with pytest.raises(ValueError, match="hash must be"):
        impl.SegmentPartitioner(impl.SegmentSet.balanced(2), hash="md5")


# ---------------------------------------------------------------- replay


def _events(spark, count, seed=7):
    return spark.createDataFrame(generate_events(count, seed=seed))


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


def test_replay_handles_every_event_once_in_order_and_reruns_handle_nothing(spark, tmp_path):
    table = generate_events(3000, seed=3)
    frame = spark.createDataFrame(table)
    log = str(tmp_path / "log.jsonl")
    checkpoint = str(tmp_path / "checkpoint")
    result = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=checkpoint, segments=3)
    handled = read_log(log)
    assert result.complete and result.handled == len(handled) == 3000
    assert_each_key_in_order(handled, table)
    state = CheckpointStore(checkpoint).load()
    assert state.acker.next_index == 3000 and state.settings["status"] == "complete"
    assert os.listdir(tmp_path / "checkpoint" / "progress") == []

    again = replay(frame, key="user", order="ts", handler=Recorder(log), checkpoint=checkpoint, segments=5)
    assert again.complete and again.handled == 0 and again.already_done == 3000
    assert len(read_log(log)) == 3000


def test_handler_failure_names_the_event_saves_progress_and_resume_skips_done_work(spark, tmp_path):
    table = generate_events(4000, seed=5)
    frame = spark.createDataFrame(table)
    heavy = max(set(table.column("user").to_pylist()), key=table.column("user").to_pylist().count)
    log = str(tmp_path / "log.jsonl")
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(HandlerFailed) as failure:
        replay(frame, key="user", order="ts", handler=Recorder(log, fail_on=(heavy, 5)),
               checkpoint=checkpoint, segments=2, flush_every=50)
    assert failure.value.key == heavy
    order_value = table.filter(pa.compute.and_(
        pa.compute.equal(table["user"], heavy), pa.compute.equal(table["seq"], 5)))["ts"][0].as_py()
    assert failure.value.order == order_value
    assert f"key '{heavy}'" in str(failure.value) and str(order_value) in str(failure.value)
    assert "the handler refuses this event" in str(failure.value)

    state = CheckpointStore(checkpoint).load()
    assert state.settings["status"] == "failed"
    recorded = state.acker
    first_run = read_log(log)
    assert recorded.next_index + recorded.pending_count > 0
    # Everything the checkpoint calls done was really handled.
    index_of = _index_by_rank(table)
    handled_indexes = {index_of[(e["user"], e["seq"])] for e in first_run}
    assert all(recorded.is_done(i) <= (i in handled_indexes) for i in range(4000))

    done_before = {i for i in range(4000) if recorded.is_done(i)}
    result = replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "second.jsonl")),
                    checkpoint=checkpoint, segments=5)
    second_run = read_log(str(tmp_path / "second.jsonl"))
    assert result.complete and result.already_done == len(done_before)
    assert not done_before & {index_of[(e["user"], e["seq"])] for e in second_run}
    assert_each_key_in_order(first_run + second_run, table)


def _index_by_rank(table):
    """The index segack gives each event: its rank by (ts, user)."""
    ranked = table.sort_by([("ts", "ascending"), ("user", "ascending")])
    return {(u, s): i for i, (u, s) in enumerate(zip(ranked["user"].to_pylist(), ranked["seq"].to_pylist(),
                                                     strict=True))}


def test_a_damaged_checkpoint_is_refused_and_left_untouched(spark, tmp_path):
    frame = spark.createDataFrame(generate_events(500, seed=9))
    checkpoint = tmp_path / "checkpoint"
    replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "a.jsonl")),
           checkpoint=str(checkpoint), segments=2)
    state_file = checkpoint / "checkpoint.json"
    damaged = bytearray(state_file.read_bytes())
    position = damaged.index(b'"acker": "') + 14
    damaged[position] = ord("A") if damaged[position] != ord("A") else ord("B")
    state_file.write_bytes(bytes(damaged))
    log = tmp_path / "b.jsonl"
    with pytest.raises(CheckpointError, match="damaged"):
        replay(frame, key="user", order="ts", handler=Recorder(str(log)), checkpoint=str(checkpoint))
    assert state_file.read_bytes() == bytes(damaged)
    assert not log.exists()


def test_a_checkpoint_of_other_input_is_refused(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    replay(spark.createDataFrame(generate_events(300, seed=1)), key="user", order="ts",
           handler=Recorder(str(tmp_path / "a.jsonl")), checkpoint=checkpoint, segments=2)
    before = (tmp_path / "checkpoint" / "checkpoint.json").read_bytes()
    with pytest.raises(CheckpointError, match="other input"):
        replay(spark.createDataFrame(generate_events(300, seed=2)), key="user", order="ts",
               handler=Recorder(str(tmp_path / "b.jsonl")), checkpoint=checkpoint)
    assert (tmp_path / "checkpoint" / "checkpoint.json").read_bytes() == before


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"key": "nope"}, ValueError, "no column 'nope'"),
    ({"flush_every": 0}, ValueError, "flush_every"),
    ({"flush_interval": 0}, ValueError, "flush_interval"),
    ({"segments": 0}, ValueError, "segments"),
    ({"handler": "not callable"}, TypeError, "callable"),
])
def test_replay_rejects_bad_settings_before_writing_anything(spark, tmp_path, kwargs, error, message):
    frame = spark.createDataFrame(generate_events(50, seed=4))
    arguments = {"key": "user", "order": "ts", "handler": Recorder(str(tmp_path / "log.jsonl")),
                 "checkpoint": str(tmp_path / "checkpoint"), **kwargs}
    with pytest.raises(error, match=message):
        replay(frame, **arguments)
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "log.jsonl").exists()


def test_checkpoint_round_trip_and_every_damage_is_refused(tmp_path):
    from segack.spark_adapter.checkpoint import Checkpoint

    acker = kernel.OffsetAcker()
    acker.ack_many(np.array([0, 1, 2, 5, 6, 9], dtype=np.int64))
    original = Checkpoint(acker, {"key": "user", "total": 10})
    data = original.to_bytes()
    back = Checkpoint.from_bytes(data)
    assert back.settings == original.settings and back.acker.runs() == [(5, 6), (9, 9)]
    for position in range(len(data)):
        changed = bytearray(data)
        changed[position] ^= 0x01
        try:
            restored = Checkpoint.from_bytes(bytes(changed))
        except CheckpointError:
            continue
        # A flip that JSON reads the same (whitespace, or a case in an escape) must mean the same.
        assert (restored.settings, restored.acker.runs(), restored.acker.next_index) == (
            original.settings, [(5, 6), (9, 9)], 3)
    with pytest.raises(CheckpointError, match="not a segack checkpoint"):
        Checkpoint.from_bytes(b'{"format": "other"}')
    store = CheckpointStore(str(tmp_path / "c"))
    assert store.load() is None
    store.save(original)
    assert store.load().acker.runs() == [(5, 6), (9, 9)]
    assert [name for name in os.listdir(tmp_path / "c") if name.endswith(".tmp")] == []


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
    assert state.acker.next_index == 1500
    assert state.settings["stream"] == {"completed_batch": 2, "batch": None}

    process_batch(spark.createDataFrame(table.slice(1000, 500)), 2)
    assert len(read_log(log)) == 1500


def test_events_with_the_same_key_and_order_get_the_same_index_in_any_layout(spark):
    """Ties in ``(order, key)`` are broken by the rest of the row, so the index of each event,
    which resuming relies on, does not depend on how Spark happens to lay the input out."""
    from pyspark.sql import functions as F

    from segack.spark_adapter.replay import INDEX, _index_events

    rows = [(f"k{n % 3}", n % 2, f"payload-{n}", {"n": n % 5}) for n in range(60)]
    base = spark.createDataFrame(rows, "key string, ts int, payload string, attrs map<string,int>")
    layouts = [
        base.repartition(1),
        base.repartition(7, "payload"),
        base.orderBy(F.col("payload").desc()).repartition(3),
        base.orderBy(F.xxhash64("payload")).coalesce(2),
    ]
    seen = []
    for layout in layouts:
        indexed = _index_events(layout, "key", "ts").select("payload", INDEX).collect()
        seen.append(dict((row["payload"], row[INDEX]) for row in indexed))
    assert sorted(seen[0].values()) == list(range(60))
    assert all(mapping == seen[0] for mapping in seen[1:])
