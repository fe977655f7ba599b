"""The crash points (``store/crash_points.py``) and segack's record of a query it runs
(``coordinator/query_record.py``, ``store/query_log.py``), without Spark: every durable write has
its points, a point kills exactly when named, and each micro-batch Spark could deliver is held
against the record by the rules."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from segack.spark_adapter.coordinator.query_record import check_batch
from segack.spark_adapter.errors import CheckpointError
from segack.spark_adapter.store import crash_points
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.crash_points import ENV, POINTS, WRITES
from segack.spark_adapter.store.stream_view import write_stream_view
from tests.test_checkpoint_store import _updates

SOURCE = Path(__file__).resolve().parents[1] / "src" / "segack"
#: The calls that write durably: the checkpoint's files, Kafka's group offsets, a sink's commit.
FILE_WRITES = {"write", "create", "delete", "remove_empty_directory"}


def _durable_calls(tree: ast.AST, path: Path) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, name = node.func.value, node.func.attr
        files = ((isinstance(owner, ast.Attribute) and owner.attr == "files")
                 or (isinstance(owner, ast.Name) and owner.id == "files"))
        on_files = files and name in FILE_WRITES
        commits = path.parent.name == "sinks" and name in ("commit", "commit_transaction")
        if on_files or name == "alterConsumerGroupOffsets" or commits:
            found.append(node)
    return found


def _without_mutants(tree: ast.Module) -> ast.Module:
    """``tree`` without mutmut's copies of its functions, one per mutant (``NAME__mutmut_N``):
    under ``nox -s mutation`` the source this test reads is mutmut's, where those copies hold the
    mutated names; the original (``NAME__mutmut_orig``) is kept."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [child for child in body if not (
                isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                and re.search(r"__mutmut_\d+$", child.name))]
    return tree


def _wrapped(tree: ast.AST) -> dict[int, str]:
    """The line of every call inside a ``with durable_write(NAME)`` block, and the NAME."""
    inside = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "durable_write":
                [name] = call.args
                assert isinstance(name, ast.Constant)
                for inner in node.body:
                    for sub in ast.walk(inner):
                        if isinstance(sub, ast.Call):
                            inside[id(sub)] = name.value
                # A write in the with statement itself (``with admin(...), durable_write(...):``)
                # is the block's body, as above; the names are what the test checks.
    return inside


def test_every_durable_write_sits_inside_its_crash_points_and_every_point_is_in_the_code():
    unwrapped, used = [], set()
    for path in sorted(SOURCE.rglob("*.py")):
        tree = _without_mutants(ast.parse(path.read_text()))
        inside = _wrapped(tree)
        used.update(inside.values())
        unwrapped += [f"{path.relative_to(SOURCE)}:{call.lineno}" for call in _durable_calls(tree, path)
                      if id(call) not in inside]
        used.update(node.args[0].value for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crash_point"
                    and isinstance(node.args[0], ast.Constant) and path.name != "crash_points.py")
    assert unwrapped == []
    named = {name for name in used if name in WRITES} | {name for name in used if name in POINTS}
    assert used == named, f"points the code names that crash_points does not: {used - named}"
    missing = {name for name in WRITES if name != "spark-batch"} - used
    assert missing == set(), f"writes no code makes: {missing}"
    assert {"batch-start", "batch-end"} <= used
    print(f"crash points in the code: {len(POINTS)} ({len(WRITES)} durable writes)")


def _passes(point: str, wanted: str, times: int) -> subprocess.CompletedProcess[str]:
    code = ("from segack.spark_adapter.store.crash_points import crash_point\n"
            f"for _ in range({times}):\n    crash_point({point!r})\nprint('alive')")
    return subprocess.run([sys.executable, "-c", code], env={ENV: wanted, "PATH": ""}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("wanted", "times", "killed"), [
    ("before-state", 1, True), ("before-state@2", 1, False), ("before-state@2", 2, True),
    ("after-state", 3, False), ("", 3, False)])
def test_a_point_kills_its_process_at_its_nth_passage_and_no_other(wanted, times, killed):
    done = _passes("before-state", wanted, times)
    assert (done.returncode == -9) is killed, done
    assert ("alive" in done.stdout) is not killed


class _Crashed(Exception):
    pass


@pytest.fixture
def crash_at(monkeypatch):
    """Set the point to crash at, in this process; a crash raises :class:`_Crashed` naming it."""
    def kill(pid, signal):
        raise _Crashed(crash_points.os.environ[ENV])

    monkeypatch.setattr(crash_points.os, "kill", kill)
    monkeypatch.setattr(crash_points, "_passed", crash_points.Counter())
    return lambda point: monkeypatch.setenv(ENV, point)


@pytest.mark.parametrize("when", ["before", "after"])
def test_each_write_of_the_checkpoint_passes_its_own_points(tmp_path, crash_at, when):
    import pyarrow as pa

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    tasks = store.for_tasks("run", 1)
    writes = {
        "claim": lambda: store.create_claim_file(1, b"{}"),
        "state": lambda: store.save(Checkpoint(), 1),
        "progress": lambda: tasks.write_progress("run-s00000-a0", _updates([(0, 1, 0, 3, "a", 1)])),
        "dead-letters": lambda: tasks.write_dead_letters("run-s00000-a0-00000", pa.table({"x": [1]})),
        "stop-request": lambda: tasks.request_stop("a test"),
        "segments-request": lambda: store.write_segments_request(b"{}"),
        "progress-delete": lambda: store.delete_progress(store.progress_files()),
        "dead-letters-delete": lambda: store.delete_dead_letters(store.dead_letter_files()),
        "stop-clear": lambda: store.clear_stop("run"),
        "claim-delete": lambda: store.withdraw_claim(1),
        "stream-view": lambda: write_stream_view(store.files, {"last_batch": {"id": 0}}),
    }
    for name, write in writes.items():
        crash_at(f"{when}-{name}")
        with pytest.raises(_Crashed, match=f"^{when}-{name}$"):
            write()
    # Each other write, alone; a write of two blocks passes its point twice.
    others = [("claim", lambda: store.write_claim_file(1, b"{}"), 1),
              ("segments-request", store.delete_segments_request, 1),
              ("stop-request", lambda: store.request_stop("run", "why"), 1),
              ("claim-delete", lambda: store.delete_claim_files([1]), 1),
              ("claim-delete", lambda: store.withdraw_claim(1), 2)]
    for name, write, passage in others:
        crash_points._passed.clear()
        crash_at(f"{when}-{name}@{passage}")
        with pytest.raises(_Crashed, match=f"^{when}-{name}@{passage}$"):
            write()


def test_a_stop_request_says_why(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    store.for_tasks("run", 1).request_stop("the handler failed in segment 3")
    store.request_stop("other", "segments change")
    assert store.stop_reason("run") == "the handler failed in segment 3"
    assert store.stop_reason("other") == "segments change"
    assert store.stop_reason("none") is None
    store.clear_stop("run")
    assert store.stop_reason("run") is None
    # A reason that is not UTF-8 (a file another writer left) is read, not refused.
    (tmp_path / "checkpoint" / "progress" / "torn.stop").write_bytes(b"\xffwhy")
    assert store.stop_reason("torn") == "\ufffdwhy"


# ---------------------------------------------------------------- Spark's checkpoint, read by segack


def _spark_checkpoint(root: Path, query_id: str, ends: dict[int, list]) -> None:
    """A Spark query checkpoint as Spark writes one: metadata, and an offset log entry per batch."""
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}))
    for batch, sources in ends.items():
        lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}),
                 *("-" if source is None else json.dumps(source) for source in sources)]
        (root / "offsets" / str(batch)).write_text("\n".join(lines))
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")


def test_the_query_log_reads_the_query_id_and_each_batchs_end_offsets(tmp_path):
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    log = store.query_log()
    assert log.location == f"{tmp_path}/checkpoint/stream"
    assert (log.query_id(), log.batches(), log.end_offsets(0)) == (None, [], None)
    _spark_checkpoint(tmp_path / "checkpoint" / "stream", "q-1",
                      {0: [{"t": {"0": 5}}], 1: [{"t": {"0": 9}}, None], 10: [{"logOffset": 10}]})
    (tmp_path / "checkpoint" / "stream" / "commits").mkdir()
    (tmp_path / "checkpoint" / "stream" / "commits" / "0").write_text("v1\n{}")
    assert log.query_id() == "q-1"
    assert log.batches() == [0, 1, 10] and log.committed() == [0]
    assert log.end_offsets(1) == [{"t": {"0": 9}}, None]
    assert log.end_offsets(10) == [{"logOffset": 10}]
    (tmp_path / "checkpoint" / "stream" / "offsets" / "2").write_text("not an offset log")
    with pytest.raises(CheckpointError, match=r"/stream/offsets/2 is not a Spark offset log entry"):
        log.end_offsets(2)
    (tmp_path / "checkpoint" / "stream" / "offsets" / "3").write_text("v1\n{}\n{not json")
    with pytest.raises(CheckpointError, match=r"/offsets/3 is not a Spark offset log entry"):
        log.end_offsets(3)
    (tmp_path / "checkpoint" / "stream" / "metadata").write_text("[]")
    with pytest.raises(CheckpointError, match=r"/stream/metadata is not the metadata of a Spark query"):
        log.query_id()


#: A record with micro-batches 0..4 complete (batch 4 ended at offset 40) of query q-1.
RECORD = {"query_id": "q-1", "completed_batch": 4, "batch": None, "completed_end": [{"t": {"0": 40}}]}


@pytest.mark.parametrize(("record", "batch", "spark_id", "spark_ends", "outcome"), [
    # The next batch, the last one complete delivered again, the one in progress: taken.
    (RECORD, 5, "q-1", [{"t": {"0": 50}}], "taken"),
    (RECORD, 4, "q-1", [{"t": {"0": 40}}], "taken"),
    ({**RECORD, "batch": {"id": 5, "end": [{"t": {"0": 50}}]}}, 5, "q-1", [{"t": {"0": 50}}], "taken"),
    # A fresh record, or one from before segack kept the query's id and ends: taken.
    ({"completed_batch": -1, "batch": None}, 0, "q-2", [{"t": {"0": 9}}], "taken"),
    ({"completed_batch": 4, "batch": None}, 4, "q-2", [{"t": {"0": 9}}], "taken"),
    # Another query, batches out of sequence, other offsets: refused.
    (RECORD, 5, "q-2", [{"t": {"0": 50}}],
     "is of query q-2, but segack's records the micro-batches of query q-1"),
    (RECORD, 3, "q-1", [{"t": {"0": 30}}], "Spark delivered micro-batch 3, but segack's checkpoint has "
                                           "micro-batches through 4 complete"),
    (RECORD, 7, "q-1", [{"t": {"0": 70}}], "has micro-batches only through 4 complete: it is behind"),
    (RECORD, 4, "q-1", [{"t": {"0": 41}}], 'micro-batch 4 ends at [{"t":{"0":41}}] in Spark'),
    ({**RECORD, "batch": {"id": 5, "end": [{"t": {"0": 50}}]}}, 6, "q-1", [{"t": {"0": 60}}],
     "Spark delivered micro-batch 6, but micro-batch 5 is in progress"),
    ({**RECORD, "batch": {"id": 5, "end": [{"t": {"0": 50}}]}}, 5, "q-1", [{"t": {"0": 55}}],
     "micro-batch 5 ends at"),
    (RECORD, 5, "q-1", None, "has no offsets for micro-batch 5, which Spark delivered"),
])
def test_each_batch_spark_delivers_is_held_against_the_record(tmp_path, record, batch, spark_id,
                                                               spark_ends, outcome):
    root = tmp_path / "checkpoint" / "stream"
    _spark_checkpoint(root, spark_id, {} if spark_ends is None else {batch: spark_ends})
    log = CheckpointStore(str(tmp_path / "checkpoint")).query_log()
    if outcome == "taken":
        assert check_batch(record, batch, log) == (spark_id, spark_ends)
    else:
        with pytest.raises(CheckpointError, match=outcome.replace("[", r"\[").replace("(", r"\(")):
            check_batch(record, batch, log)


def test_without_spark_checkpoint_in_sight_a_batch_is_held_only_against_the_one_in_progress():
    record = {"completed_batch": 4, "batch": {"id": 5}}
    assert check_batch(record, 5, None) == (None, None)
    assert check_batch(record, 3, None) == (None, None)  # complete already: the caller skips it
    with pytest.raises(CheckpointError, match="batch 5 is in progress, but Spark delivered batch 6"):
        check_batch(record, 6, None)


def test_spark_kafka_starting_offsets_are_read_as_spark_writes_them(tmp_path):
    log = CheckpointStore(str(tmp_path / "checkpoint")).query_log()
    assert log.kafka_initial_offsets() is None
    where = tmp_path / "checkpoint" / "stream" / "sources" / "0"
    where.mkdir(parents=True)
    (where / "0").write_bytes(b'\0v1\n{"accounts":{"1":40,"0":12}}')
    assert log.kafka_initial_offsets() == {("accounts", 0): 12, ("accounts", 1): 40}
    (where / "0").write_bytes(b'\0v1\n{"logOffset": 3}')
    with pytest.raises(CheckpointError, match=r"sources/0/0 is not a Kafka source's starting offsets"):
        log.kafka_initial_offsets()


def test_a_restart_is_on_record_before_the_new_query_writes_and_a_fresh_start_waits_for_its_batch(tmp_path):
    import pyarrow as pa

    from segack.spark_adapter.coordinator.query_record import QueryStart, record_start
    from segack.spark_adapter.store.claims import acquire
    from segack.spark_adapter.store.tokens import KeyGroupTokens

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    keeper = _Keeper(store, acquire(store, "run", 60))
    fresh = QueryStart(None, "a new query, from the earliest offsets", new=True)
    assert record_start(fresh, keeper) is fresh  # no state yet: the first micro-batch records it
    going_on = QueryStart(None, "Spark's checkpoint of the query, after micro-batch 3")
    assert record_start(going_on, keeper) is None
    stream = {"query_id": "q-1", "completed_batch": 4, "batch": None, "completed_end": [{"t": {"0": 40}}]}
    tokens = KeyGroupTokens.empty(4, pa.int64(), pa.int64())
    store.save(Checkpoint({"stream": stream, "key_group_bits": 4}, tokens), 1)
    restart = QueryStart(None, "segack's record of micro-batch 4", new=True,
                         restarted_from={"query_id": "q-1", "completed_batch": 4})
    assert record_start(restart, keeper) is None
    recorded = store.load().settings["stream"]
    assert (recorded["query_id"], recorded["completed_batch"], recorded["batch"]) == (None, -1, None)
    assert recorded["restarts"][0]["query_id"] == "q-1" and recorded["start"]["where"] == restart.where
    # The new query's first batch is then the next one, whatever its id.
    assert check_batch(recorded, 0, _spark_log(tmp_path, "q-2", {0: [{"t": {"0": 50}}]})) == (
        "q-2", [{"t": {"0": 50}}])


class _Keeper:
    """What record_start needs of a ClaimKeeper: its store, and a save under its claim."""

    def __init__(self, store, claim):
        self.store, self.claim = store, claim

    def save(self, state):
        self.store.save(state, self.claim.number)


def _spark_log(tmp_path, query_id, ends):
    root = tmp_path / "checkpoint" / "stream"
    _spark_checkpoint(root, query_id, ends)
    return CheckpointStore(str(tmp_path / "checkpoint")).query_log()


@pytest.mark.parametrize(("options", "refused"), [
    ({}, []), ({"startingOffsets": "earliest"}, []), ({"startingOffsets": " Earliest "}, []),
    ({"startingOffsets": "latest"}, ["startingOffsets"]), ({"startingTimestamp": "1"}, ["startingTimestamp"]),
    ({"startingOffsets": '{"t":{"0":5}}', "startingOffsetsByTimestamp": "{}"},
     ["startingOffsets", "startingOffsetsByTimestamp"])])
def test_only_a_starting_option_that_skips_counts_as_one(options, refused):
    from segack.spark_adapter.coordinator.query_record import _given
    from segack.spark_adapter.sources.kafka import KafkaStream

    assert _given(KafkaStream(None, options, None)) == refused
