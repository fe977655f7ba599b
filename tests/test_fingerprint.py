"""The input fingerprint, and the resumes that skip their check because of it, on a real local Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack.demo import generate_events
from segack.spark_adapter import ForeignInputError, HandlerFailedError, replay
from segack.spark_adapter.sources.fingerprint import input_fingerprint
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests import expected
from tests.spark_handlers import Recorder, read_log

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]


def same_in_any_session(spark, events: str) -> list:
    """Queries whose fingerprints another process must find the same."""
    from pyspark.sql import functions as F

    return [
        spark.read.parquet(events),
        spark.read.parquet(events).where("seq > 2").select("user", "ts", "seq"),
        spark.read.parquet(events).withColumn("day", F.col("ts") % 86400),
    ]


def _events(tmp_path: Path, count: int = 600, seed: int = 1) -> tuple[pa.Table, str]:
    table = generate_events(count, seed=seed)
    path = str(tmp_path / "events.parquet")
    # Plain bytes (no compression, dictionaries or statistics): a value changed for another of the
    # same length keeps the size.
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)
    return table, path


def test_another_process_finds_the_same_fingerprints(spark, tmp_path):
    _, events = _events(tmp_path)
    here = [input_fingerprint(frame) for frame in same_in_any_session(spark, events)]
    assert None not in here and len(set(here)) == len(here)
    script = (
        "import json, sys\n"
        "from segack.spark_adapter import local_session\n"
        "from segack.spark_adapter.sources.fingerprint import input_fingerprint\n"
        "from tests.test_fingerprint import same_in_any_session\n"
        "frames = same_in_any_session(local_session('fingerprints'), sys.argv[1])\n"
        "print(json.dumps([input_fingerprint(frame) for frame in frames]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, events], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == here


def test_the_fingerprint_changes_with_the_query_the_options_or_any_file(spark, tmp_path):
    from pyspark.sql import functions as F

    _, events = _events(tmp_path)
    read = spark.read.parquet
    first = input_fingerprint(read(events))
    assert input_fingerprint(read(events)) == first
    others = [
        input_fingerprint(read(events).where("seq > 2")),
        input_fingerprint(read(events).where("seq > 3")),
        input_fingerprint(read(events).select("user", "ts")),
        input_fingerprint(read(events).withColumn("x", F.lit(1))),
        input_fingerprint(read(events).unionByName(read(events))),
    ]
    assert first not in others and len(set(others)) == len(others)
    # The same bytes under another name, and the same file touched: other files.
    os.link(events, tmp_path / "copy.parquet")
    assert input_fingerprint(read(str(tmp_path / "copy.parquet"))) != first
    stat = os.stat(events)
    os.utime(events, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert input_fingerprint(read(events)) != first
    # A file added to a directory.
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(generate_events(50, seed=3), folder / "a.parquet")
    before = input_fingerprint(read(str(folder)))
    pq.write_table(generate_events(50, seed=4), folder / "b.parquet")
    assert input_fingerprint(read(str(folder))) != before
    # Reader options change the rows while the files and the plan's shape stay.
    csv = tmp_path / "events.csv"
    csv.write_text("user,ts\nu,1\nNA,2\n")
    assert (input_fingerprint(spark.read.option("header", "true").csv(str(csv)))
            != input_fingerprint(spark.read.option("header", "true").option("nullValue", "NA").csv(str(csv))))


def test_no_fingerprint_where_rows_could_change_while_the_plan_stays(spark, tmp_path):
    from pyspark.sql import functions as F

    _, events = _events(tmp_path)
    other = str(tmp_path / "other.parquet")
    pq.write_table(generate_events(5, seed=2), other)
    largest_seq = spark.read.parquet(other).select(F.max("seq")).scalar()
    plus_one = F.udf(lambda value: value + 1, "long")
    for frame in [
        spark.range(5),
        spark.createDataFrame([(1,)], "a int"),
        spark.read.parquet(events).withColumn("r", F.rand()),
        spark.read.parquet(events).withColumn("p", plus_one("ts")),
        spark.read.parquet(events).where(plus_one("ts") > 3),
        spark.read.parquet(events).mapInArrow(lambda batches: batches, "user string, ts long, seq long, "
                                                                       "part string"),
        spark.read.parquet(events).unionByName(spark.createDataFrame(generate_events(5, seed=2))),
        # Another file's contents decide which rows pass.
        spark.read.parquet(events).where(F.col("seq") > largest_seq),
    ]:
        assert input_fingerprint(frame) is None, frame
    assert input_fingerprint(spark.read.parquet(events)) is not None

    # A subquery the optimizer turns into a join: the other file is one of the plan's leaves.
    def semi_join():
        return spark.read.parquet(events).alias("e").where(spark.read.parquet(other).alias("o").where(
            F.col("o.user") == F.col("e.user").outer()).exists())

    before = input_fingerprint(semi_join())
    stat = os.stat(other)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert before is not None and input_fingerprint(semi_join()) != before
    # Last: once cached, every query over the file reads the cache instead.
    cached = spark.read.parquet(events)
    cached.cache()
    try:
        assert input_fingerprint(cached) is None
        assert input_fingerprint(spark.read.parquet(events)) is None
    finally:
        cached.unpersist()


def _fail_midway(spark, table, events, checkpoint, log, **options):
    """A replay over the file at ``events`` that fails at the busiest user's tenth event."""
    busiest = max(set(table.column("user").to_pylist()), key=table.column("user").to_pylist().count)
    with pytest.raises(HandlerFailedError):
        replay(spark.read.parquet(events), key="user", order="ts", checkpoint=checkpoint, segments=2,
               flush_every=20, handler=Recorder(log, fail_on=(busiest, 9)), **options)
    return expected.done_events(table, CheckpointStore(checkpoint).load().tokens)


def test_a_resume_over_the_same_files_skips_the_check_and_handles_the_rest_once(spark, tmp_path):
    table, events = _events(tmp_path)
    checkpoint = str(tmp_path / "checkpoint")
    done_before = _fail_midway(spark, table, events, checkpoint, str(tmp_path / "a.jsonl"))
    assert done_before
    assert CheckpointStore(checkpoint).load().settings["input_fingerprint"] == input_fingerprint(
        spark.read.parquet(events))
    result = replay(spark.read.parquet(events), key="user", order="ts", checkpoint=checkpoint,
                    handler=Recorder(str(tmp_path / "b.jsonl")))
    assert not result.input_checked
    assert result.complete and result.total == table.num_rows and result.already_done == len(done_before)
    second = {(event["user"], event["seq"]) for event in read_log(str(tmp_path / "b.jsonl"))}
    assert second == expected.positions(table).keys() - done_before
    # Asked to, the run checks all the same, and finds every event done.
    again = replay(spark.read.parquet(events), key="user", order="ts", checkpoint=checkpoint,
                   handler=Recorder(str(tmp_path / "c.jsonl")), verify="always")
    assert again.input_checked and again.complete and again.handled == 0
    assert not (tmp_path / "c.jsonl").exists()


@pytest.mark.parametrize("verify", ["auto", "always"])
def test_a_file_changed_after_a_run_is_checked_again_and_refused(spark, tmp_path, verify):
    table, events = _events(tmp_path)
    checkpoint = str(tmp_path / "checkpoint")
    done_before = _fail_midway(spark, table, events, checkpoint, str(tmp_path / "a.jsonl"))
    # A done event's payload changes to another of the same length: the same size, a later time.
    user, seq = min(done_before)
    changed = pa.Table.from_pylist([
        dict(event, part=event["part"][::-1]) if (event["user"], event["seq"]) == (user, seq) else event
        for event in table.to_pylist()], schema=table.schema)
    assert changed != table
    size, modified = os.path.getsize(events), os.stat(events).st_mtime_ns
    pq.write_table(changed, events, compression="none", use_dictionary=False, write_statistics=False)
    os.utime(events, ns=(modified + 10**9, modified + 10**9))
    assert os.path.getsize(events) == size
    state_file = Path(CheckpointStore(checkpoint).state_file())
    before = state_file.read_bytes()
    with pytest.raises(ForeignInputError, match="other input: in key group"):
        replay(spark.read.parquet(events), key="user", order="ts", checkpoint=checkpoint, verify=verify,
               handler=Recorder(str(tmp_path / "b.jsonl")))
    assert state_file.read_bytes() == before
    assert not (tmp_path / "b.jsonl").exists()


def test_a_run_over_a_query_without_a_fingerprint_always_checks(spark, tmp_path):
    table, events = _events(tmp_path)
    checkpoint = str(tmp_path / "checkpoint")
    _fail_midway(spark, table, events, checkpoint, str(tmp_path / "a.jsonl"))
    # The same rows, through an in-memory table: nothing says they are the same files.
    result = replay(spark.createDataFrame(table), key="user", order="ts", checkpoint=checkpoint,
                    handler=Recorder(str(tmp_path / "b.jsonl")))
    assert result.input_checked and result.complete
    assert CheckpointStore(checkpoint).load().settings["input_fingerprint"] is None
