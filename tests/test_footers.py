"""What the footers of a replay's Parquet files say (its total, its order column's nulls), read
before any Spark job, and what a replay does with it, on a real local Spark and real files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack.spark_adapter import InputError, replay
from segack.spark_adapter.sources.footers import footer_facts
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.spark_handlers import Recorder

pytestmark = pytest.mark.spark


def _files(directory, tables, row_group_size=3):
    directory.mkdir()
    for number, table in enumerate(tables):
        pq.write_table(table, directory / f"part-{number}.parquet", row_group_size=row_group_size)
    return str(directory)


def _table(orders):
    return pa.table({"user": [f"u{index % 3}" for index in range(len(orders))],
                     "ts": pa.array(orders, pa.int64())})


def test_the_footers_count_the_rows_and_the_order_columns_nulls(spark, tmp_path):
    # 3 files of several row groups each: 7 + 5 + 4 rows, nulls in two of them.
    path = _files(tmp_path / "events", [_table([1, None, 3, 4, None, 6, 7]), _table([1, 2, 3, 4, 5]),
                                        _table([None, 2, 3, 4])])
    facts = footer_facts(spark.read.parquet(path), "ts")
    assert (facts.rows, facts.order_nulls) == (16, 3)
    clean = _files(tmp_path / "clean", [_table([5, 6, 7, 8]), _table([1, 2])])
    assert footer_facts(spark.read.parquet(clean), "ts") == type(facts)(6, 0)


def test_the_footers_answer_nothing_where_the_files_are_not_the_events(spark, tmp_path):
    from pyspark.sql import functions as F

    path = _files(tmp_path / "events", [_table([1, 2, 3, 4])])
    frame = spark.read.parquet(path)
    for other in (frame.where("ts > 1"), frame.withColumn("ts", F.col("ts") + 1), frame.union(frame),
                  frame.limit(2), spark.createDataFrame(_table([1, 2]).to_pandas())):
        assert footer_facts(other, "ts") is None, other._jdf.queryExecution().optimizedPlan().toString()
    frame.write.csv(str(tmp_path / "csv"), header=True)
    assert footer_facts(spark.read.csv(str(tmp_path / "csv"), header=True), "ts") is None
    # An order column that is a partition column is in no footer.
    (tmp_path / "parted" / "ts=9").mkdir(parents=True)
    pq.write_table(pa.table({"user": ["a", "b"]}), tmp_path / "parted" / "ts=9" / "part-0.parquet")
    assert footer_facts(spark.read.parquet(str(tmp_path / "parted")), "ts") is None
    # A row group without null counts: the rows, and nulls unknown.
    pq.write_table(_table([1, 2, 3]), tmp_path / "plain.parquet", write_statistics=False)
    assert footer_facts(spark.read.parquet(str(tmp_path / "plain.parquet")), "ts") == type(
        footer_facts(frame, "ts"))(3, None)


def test_a_replay_refuses_null_order_values_from_the_footers_without_a_spark_job(spark, tmp_path):
    path = _files(tmp_path / "events", [_table([1, None, 3, 4]), _table([None, 2])])
    frame = spark.read.parquet(path)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup())
    with pytest.raises(InputError, match="the order column 'ts' is null in 2 events: each event needs"):
        replay(frame, key="user", order="ts", handler=Recorder(str(tmp_path / "log.jsonl")),
               checkpoint=str(tmp_path / "checkpoint"), segments=2)
    assert set(tracker.getJobIdsForGroup()) == jobs_before  # the footers answered
    assert not (tmp_path / "checkpoint").exists()


def _nothing(event):
    """A handler with nothing to do."""


def test_a_fresh_replay_reports_its_total_from_its_first_progress_and_records_it(spark, tmp_path):
    path = _files(tmp_path / "events", [_table(list(range(40))), _table(list(range(40, 64)))],
                  row_group_size=10)
    reports = []
    result = replay(spark.read.parquet(path), key="user", order="ts", handler=_nothing,
                    checkpoint=str(tmp_path / "checkpoint"), segments=2, progress=reports.append,
                    flush_interval=0.05)
    assert result.total == 64 and reports
    assert all(report.total == 64 for report in reports)  # before the input was counted too
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["footer_total"] == 64 and state.input_events == 64
    # A query the footers cannot answer for records none: no total from other files survives.
    replay(spark.read.parquet(path).where("ts >= 0"), key="user", order="ts", handler=_nothing,
           checkpoint=str(tmp_path / "other"), segments=2)
    assert "footer_total" not in CheckpointStore(str(tmp_path / "other")).load().settings
