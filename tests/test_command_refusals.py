"""What ``segack`` does with input it cannot use: one line that names the flag, file or column and
the fix, an exit code a scheduler can act on (:class:`segack.cli.ExitCode`), and the checkpoint
left byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode, main
from segack.demo import generate_events

ROOT = Path(__file__).resolve().parents[1]
HANDLER = "tests.spark_handlers:record_slowly"


def _fingerprint(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` and its contents' hash."""
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def _saved_checkpoint(path: Path) -> None:
    """A checkpoint with a state, as a run leaves one (made without Spark)."""
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore

    CheckpointStore(str(path)).save(Checkpoint({"key": "user", "order": "ts", "status": "complete"}))


def _command(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``segack ARGS`` where Spark cannot start (no Java): a refusal that comes after Spark's start
    would fail otherwise, and say so."""
    environment = dict(os.environ, JAVA_HOME="/nonexistent", PATH=os.path.dirname(sys.executable))
    return subprocess.run([sys.executable, "-m", "segack", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


def _inputs(tmp_path: Path) -> dict[str, Path]:
    pq.write_table(generate_events(50), tmp_path / "events.parquet")
    generate_events(50).to_pandas().to_csv(tmp_path / "events.csv", index=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("not a checkpoint\n")
    (tmp_path / "other").mkdir()
    pq.write_table(generate_events(5), tmp_path / "other" / "part-0.parquet")
    _saved_checkpoint(tmp_path / "checkpoint")
    return {"events": tmp_path / "events.parquet", "csv": tmp_path / "events.csv",
            "empty": tmp_path / "empty",
            "missing": tmp_path / "missing", "file": tmp_path / "a-file", "other": tmp_path / "other",
            "checkpoint": tmp_path / "checkpoint"}


#: (case, input, checkpoint, extra flags, exit code, the last line printed, after ``{tmp}`` is filled in).
BEFORE_SPARK = [
    ("key-group bits out of range", "events", "checkpoint", ["--key-group-bits", "30"], ExitCode.USAGE,
     "segack replay: error: argument --key-group-bits: must be an int in 0..16, not 30"),
    ("flush interval not positive", "events", "checkpoint", ["--flush-interval", "0"], ExitCode.USAGE,
     "segack replay: error: argument --flush-interval: must be a positive float, not 0.0"),
    ("claim timeout not positive", "events", "checkpoint", ["--claim-timeout", "-1"], ExitCode.USAGE,
     "segack replay: error: argument --claim-timeout: must be a positive number of seconds, not -1.0"),
    ("a handler that cannot be imported", "events", "checkpoint", ["--handler", "no_such_module:handle"],
     ExitCode.USAGE, "segack replay: argument --handler: cannot import handler module 'no_such_module': "
     "No module named 'no_such_module'"),
    ("a handler module that raises at import", "events", "checkpoint",
     ["--handler", "tests.sink_broken_at_import:sink"], ExitCode.USAGE,
     "segack replay: argument --handler: handler module 'tests.sink_broken_at_import' raised while being "
     "imported: SegackValueError: SqlSink: table must be a plain name of at most 30 letters, digits and "
     "underscores, starting with a letter or an underscore, not 'ledger positions'"),
    ("neither INPUT nor --table", None, "checkpoint", [], ExitCode.USAGE,
     "segack replay: error: give INPUT or --table NAME, one of them"),
    ("both INPUT and --table", "events", "checkpoint", ["--table", "events"], ExitCode.USAGE,
     "segack replay: error: give INPUT or --table NAME, one of them"),
    ("a --py-files file that is missing", "events", "checkpoint", ["--py-files", "nope.py"], ExitCode.USAGE,
     "segack replay: argument --py-files: no such file 'nope.py'"),
    ("CSV read as Parquet", "csv", "checkpoint", [], ExitCode.REFUSED,
     "segack replay: {tmp}/events.csv is not a Parquet file (Parquet is the default format); if it is CSV "
     "or JSON, say so with --format csv or --format json"),
    ("Parquet read as CSV", "events", "checkpoint", ["--format", "csv"], ExitCode.REFUSED,
     "segack replay: {tmp}/events.parquet is a Parquet file, not csv: leave out --format csv"),
    ("an empty directory", "empty", "checkpoint", [], ExitCode.REFUSED,
     "segack replay: no input at {tmp}/empty: the directory holds no files"),
    ("missing input", "missing", "checkpoint", [], ExitCode.REFUSED,
     "segack replay: no input at {tmp}/missing: no such file or directory"),
    ("a checkpoint path that is a file", "events", "file", [], ExitCode.REFUSED,
     "segack replay: {tmp}/a-file is a file, not a checkpoint's directory"),
    ("a checkpoint path of other files", "events", "other", [], ExitCode.REFUSED,
     "segack replay: {tmp}/other is not a checkpoint: it holds 'part-0.parquet', which no checkpoint holds "
     "(a new checkpoint needs a new or empty directory)"),
]


@pytest.mark.parametrize(("given", "checkpoint", "extra", "code", "line"),
                         [case[1:] for case in BEFORE_SPARK], ids=[case[0] for case in BEFORE_SPARK])
def test_replay_refuses_what_it_can_check_before_spark_starts_in_one_line(
        tmp_path, given, checkpoint, extra, code, line):
    paths = _inputs(tmp_path)
    before = {name: _fingerprint(path) for name, path in paths.items() if path.is_dir()}
    handler = [] if "--handler" in extra else ["--handler", HANDLER]
    given_input = [str(paths[given])] if given else []
    done = _command(["replay", *given_input, "--key", "user", "--order", "ts", *handler,
                     "--checkpoint", str(paths[checkpoint]), *extra])
    assert done.returncode == code, done.stderr
    assert done.stderr.splitlines()[-1] == line.format(tmp=tmp_path)
    if not line.startswith("segack replay: error:"):  # one line, no traceback (argparse adds its usage)
        assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == ""
    assert {name: _fingerprint(path) for name, path in paths.items() if path.is_dir()} == before
    assert paths["file"].read_text() == "not a checkpoint\n"


@pytest.mark.parametrize("command", [["status"], ["dead-letters"], ["release", "--force"], ["split", "0"],
                                     ["merge", "1"], ["scale", "--segments", "2"]],
                         ids=lambda command: command[0])
def test_every_command_treats_a_path_that_is_not_a_checkpoint_the_same_way(tmp_path, capsys, command):
    paths = _inputs(tmp_path)
    name = command[0]
    for given, reason in [("missing", f"no checkpoint at {paths['missing']}"),
                          ("file", f"{paths['file']} is a file, not a checkpoint's directory"),
                          ("other", f"{paths['other']} is not a checkpoint: it holds 'part-0.parquet'")]:
        before = _fingerprint(tmp_path)
        assert main([name, str(paths[given]), *command[1:]]) == ExitCode.REFUSED
        captured = capsys.readouterr()
        assert captured.err.startswith(f"segack {name}: {reason}") and captured.err.count("\n") == 1
        assert captured.out == ""
        assert _fingerprint(tmp_path) == before


@pytest.mark.spark
@pytest.mark.parametrize(("order", "shown"), [
    (pa.array([3, None, 1, 2], pa.int64()), "the order column 'ts' is null in 1 event"),
    (pa.array([3.0, float("nan"), None, 2.0]), "the order column 'ts' is null or NaN in 2 events"),
    (pa.array([{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]), "the order column 'ts' must have a plain sortable "
     "type (numbers, strings, dates, timestamps, binary), not struct<x:bigint>"),
], ids=["null", "NaN", "struct"])
def test_replay_refuses_events_without_a_place_in_their_keys_order(spark, tmp_path, capsys, order, shown):
    pq.write_table(pa.table({"user": ["a", "a", "b", "b"], "ts": order}), tmp_path / "events.parquet")
    (tmp_path / "checkpoint").mkdir()
    code = main(["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                 "--handler", HANDLER, "--checkpoint", str(tmp_path / "checkpoint")])
    assert code == ExitCode.REFUSED
    err = capsys.readouterr().err
    assert err.startswith(f"segack replay: {shown}") and err.count("\n") == 1, err
    assert list((tmp_path / "checkpoint").iterdir()) == []


@pytest.mark.spark
@pytest.mark.checkpoint
def test_a_checkpoint_of_other_input_is_refused_and_left_byte_for_byte(spark, tmp_path, capsys):
    from segack.spark_adapter import replay

    pq.write_table(generate_events(300, seed=5), tmp_path / "events.parquet")
    checkpoint = tmp_path / "checkpoint"
    replay(spark.read.parquet(str(tmp_path / "events.parquet")), key="user", order="ts",
           handler=lambda event: None, checkpoint=str(checkpoint), segments=2)
    before = _fingerprint(checkpoint)
    pq.write_table(generate_events(300, seed=6), tmp_path / "other.parquet")
    code = main(["replay", str(tmp_path / "other.parquet"), "--key", "user", "--order", "ts",
                 "--handler", HANDLER, "--checkpoint", str(checkpoint)])
    assert code == ExitCode.REFUSED
    err = capsys.readouterr().err
    assert err.startswith(f"segack replay: checkpoint {checkpoint} belongs to other input") and (
        err.count("\n") == 1), err
    assert _fingerprint(checkpoint) == before


@pytest.mark.spark
def test_a_spark_that_cannot_start_for_a_package_it_cannot_resolve_is_refused_in_one_line(tmp_path):
    pq.write_table(generate_events(50), tmp_path / "events.parquet")
    command = ["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts", "--handler",
               HANDLER, "--checkpoint", str(tmp_path / "ck"), "--conf",
               "spark.jars.packages=not-maven-coordinates"]
    done = subprocess.run([sys.executable, "-m", "segack", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == ExitCode.REFUSED, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("segack")]
    assert lines == ["segack replay: Spark's JVM exited as it started: a --conf spark.jars.packages it could "
                     "not resolve (not-maven-coordinates)?"], done.stderr
    assert not (tmp_path / "ck").exists()


@pytest.mark.spark
@pytest.mark.parametrize("command", ["replay", "plan"])
def test_an_option_given_twice_in_two_cases_is_a_flag_error_in_every_command(spark, tmp_path, capsys,
                                                                            command):
    """Spark reads ``--option`` names in any case: one name twice is a flag's error (exit 2), in
    replay and plan as in stream, and nothing is written."""
    inputs = _inputs(tmp_path)
    (tmp_path / "fresh").mkdir()
    flags = ["--option", "header=true", "--option", "HEADER=false", "--key", "user"]
    if command == "replay":
        flags += ["--order", "ts", "--handler", HANDLER, "--checkpoint", str(tmp_path / "fresh")]
    code = main([command, str(inputs["csv"]), "--format", "csv", *flags])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert err == (f"segack {command}: option 'HEADER' is given twice (also as 'header'); Spark reads option "
                   f"names without regard to case: give it once\n"), err
    assert list((tmp_path / "fresh").iterdir()) == []
