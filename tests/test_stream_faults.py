"""Streams of files under faults, through ``segack stream`` as a user meets it: dead letters over
many micro-batches. Kafka's own cases are in ``tests/test_kafka.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests.spark_handlers import LOG_ENV, read_log

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _events(spans: dict[str, range], start_ts: int) -> pa.Table:
    """Each user's events of ``spans`` (their ``seq``), interleaved, ``ts`` counting up from ``start_ts``."""
    rows = []
    longest = max(len(span) for span in spans.values())
    for step in range(longest):
        for user, span in spans.items():
            if step < len(span):
                rows.append({"user": user, "seq": span[step]})
    return pa.table({"user": [row["user"] for row in rows], "seq": [row["seq"] for row in rows],
                     "ts": list(range(start_ts, start_ts + len(rows)))})


def _write_files(source: Path, tables: list[pa.Table], first: int = 0) -> None:
    """``tables`` as ``part-N.parquet`` in ``source``, N from ``first``, each file a minute newer than
    the one before: Spark's file source takes them in that order, one per micro-batch with
    ``maxFilesPerTrigger=1``."""
    source.mkdir(exist_ok=True)
    for number, table in enumerate(tables, start=first):
        path = source / f"part-{number}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + 60 * number, 1_700_000_000 + 60 * number))


def _stream(tmp_path: Path, source: Path, handler: str, *extra: str, run: str = "0",
            checkpoint: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "segack", "stream", str(source), "--key", "user", "--order", "ts",
               "--handler", handler, "--checkpoint", str(checkpoint or tmp_path / "checkpoint"),
               "--segments", "2", *extra]
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": run})
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)


def _segack(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "segack", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.streams
def test_dead_letters_of_one_key_over_three_micro_batches_are_all_kept_and_retried_in_order(tmp_path):
    """u1's tenth event fails in the first micro-batch; its later events, in that batch and the next
    two, are parked behind it. Every one of them is a dead letter, and a retry handles them all."""
    source = tmp_path / "source"
    _write_files(source, [_events({"u1": range(0, 12), "u2": range(0, 6)}, 0),
                          _events({"u1": range(12, 14), "u2": range(6, 9)}, 100),
                          _events({"u1": range(14, 16), "u2": range(9, 12)}, 200)])
    handler = "tests.spark_handlers:record_refusing_tenth_until_fixed"
    first = _stream(tmp_path, source, handler, "--option", "maxFilesPerTrigger=1",
                    "--on-error", "dead-letter")
    assert first.returncode == ExitCode.DEAD_LETTERS, first.stderr
    assert "3 micro-batches" in first.stdout, first.stdout
    assert "6 events set aside as dead letters remain" in first.stderr, first.stderr
    letters = CheckpointStore(str(tmp_path / "checkpoint")).read_dead_letters(["user", "seq"])
    assert letters is not None
    pairs = zip(letters.column("user").to_pylist(), letters.column("seq").to_pylist(), strict=True)
    assert sorted(pairs) == [("u1", seq) for seq in range(10, 16)]
    listed = _segack("dead-letters", str(tmp_path / "checkpoint"))
    assert listed.returncode == ExitCode.OK, listed.stderr
    assert "6 events" in listed.stdout, listed.stdout
    fixed = _stream(tmp_path, source, handler, "--retry-dead-letters", run="fixed")
    assert fixed.returncode == ExitCode.OK, fixed.stderr
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert [event["seq"] for event in handled if event["user"] == "u1"] == list(range(16))
    assert [event["seq"] for event in handled if event["user"] == "u2"] == list(range(12))
    assert [event["seq"] for event in handled if event["run"] == "fixed"] == list(range(10, 16))

