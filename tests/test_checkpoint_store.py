"""The checkpoint's files without Spark: the state file's format, and every file a run reads or
writes, on a local path and through :mod:`pyarrow.fs` (a ``local://`` URI: the same files, reached
the way an object store is)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segack._version import __version__
from segack.spark_adapter import CheckpointLocationError
from segack.spark_adapter.store.checkpoint import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_KEY_GROUP,
    DEAD_POSITION,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    TaskLoad,
)
from segack.spark_adapter.store.driver_watch import DriverProcess
from segack.spark_adapter.store.storage import resolve_location
from segack.spark_adapter.store.stream_view import stream_now, write_stream_view
from segack.spark_adapter.store.tokens import KeyGroupTokens, update_schema
from tests.outcomes import exactly, starting


@pytest.fixture(params=["path", "pyarrow.fs"])
def where(request, tmp_path):
    """``(location, directory)``: the checkpoint's location as given, and where its files are."""
    directory = tmp_path / "checkpoint"
    return (str(directory) if request.param == "path" else f"local://{directory}"), directory


@pytest.fixture
def store(where):
    return CheckpointStore(where[0])


def _files(directory):
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def _tokens():
    tokens = KeyGroupTokens.empty(2, pa.int64(), pa.string())
    tokens.set_counts(np.array([3, 0, 0, 1]))
    tokens.apply(_updates([(0, 2, 1, 9, "k", 5)]))
    return tokens


def _updates(rows):
    """An update table from ``(kg, committed, run_start, order, key, tie)`` tuples."""
    schema = update_schema(pa.int64(), pa.string())
    columns = [[row[i] for row in rows] for i in range(6)]
    columns += [[None] * len(rows), [row[1] * 3 for row in rows], [row[1] * 5 for row in rows]]
    return pa.table([pa.array(values, field.type) for values, field in zip(columns, schema, strict=True)],
                    schema=schema)


# ------------------------------------------------------------------ the state file's format

def test_the_state_file_is_sorted_indented_json_with_a_checksum_of_its_canonical_form():
    state = Checkpoint({"key": "user", "b": [1, 2]}, _tokens())
    data = state.to_bytes()
    assert data.endswith(b"}\n") and data.startswith(b'{\n "crc32": ')
    body = json.loads(data)
    assert list(body) == sorted(body) == ["crc32", "format", "segack", "settings", "tokens", "version"]
    assert (body["format"], body["version"], body["segack"]) == ("segack-checkpoint", 2, __version__)
    assert data.decode() == json.dumps(body, indent=1, sort_keys=True) + "\n"
    crc = body.pop("crc32")
    assert crc == zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    assert base64.b64decode(body["tokens"]) == state.tokens.to_bytes()
    assert json.loads(Checkpoint({"x": 1}).to_bytes())["tokens"] is None


def test_a_state_file_round_trips_with_and_without_tokens():
    back = Checkpoint.from_bytes(Checkpoint({"key_group_bits": 2, "x": "ü"}, _tokens()).to_bytes())
    assert back.settings == {"key_group_bits": 2, "x": "ü"} and back.tokens.committed.tolist() == [2, 0, 0, 0]
    assert Checkpoint.from_bytes(Checkpoint({"x": 1}).to_bytes()).tokens is None


def _sealed(body):
    """``body`` as a state file with a checksum that matches it."""
    body = dict(body)
    body["crc32"] = zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    return json.dumps(body).encode()


GOOD = {"format": "segack-checkpoint", "version": 2, "segack": "x", "settings": {"key_group_bits": 2},
        "tokens": None}


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff", "the file is damaged: not JSON"),
    (b"{", "the file is damaged: not JSON"),
    (b"[1]", "the file is not a segack checkpoint"),
    (b'{"format": "other"}', "the file is not a segack checkpoint"),
    (_sealed({**GOOD, "version": 1}), "the file was written by segack 0.1.0 (format 1); segack "
     f"{__version__} reads format 2 only. Replay into a new checkpoint location; this one is left as it is"),
    (_sealed({**GOOD, "version": 7}), "the file has format version 7; segack"),
    (_sealed({**GOOD, "version": "1"}), "the file has format version '1'; segack"),
    (_sealed({**GOOD, "version": [1]}), "the file has format version [1]; segack"),
    (_sealed({**GOOD, "settings": {"key_group_bits": 3}})[:-2] + b"0}", "the file is damaged: its checksum "
     "does not match"),
    (json.dumps(GOOD).encode(), "the file is damaged: its checksum does not match"),
    (_sealed({**GOOD, "settings": []}), "the file is damaged: settings or tokens missing"),
    (_sealed({**GOOD, "tokens": 5}), "the file is damaged: settings or tokens missing"),
    (_sealed({**GOOD, "settings": {}, "tokens": "AAAA"}), "the file is damaged: its key-group resolution is "
     "missing"),
    (_sealed({**GOOD, "settings": {"key_group_bits": True}, "tokens": "AAAA"}), "the file is damaged: its "
     "key-group resolution is missing"),
    (_sealed({**GOOD, "tokens": "!!!!"}), "the file is damaged: "),
    (_sealed({**GOOD, "tokens": "AAAA"}), "the tokens of the file is not segack key-group progress"),
])
def test_a_damaged_or_foreign_state_file_is_refused_naming_it(data, message):
    with pytest.raises(CheckpointError) as refused:
        Checkpoint.from_bytes(data, where="the file")
    assert str(refused.value).startswith(message)


def test_a_state_file_is_named_checkpoint_when_no_name_is_given():
    with pytest.raises(CheckpointError, match=exactly("checkpoint is not a segack checkpoint")):
        Checkpoint.from_bytes(b"{}")


# ------------------------------------------------------------------ locations

def test_locations_are_resolved_once_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_location("ck") == str(tmp_path / "ck")
    assert resolve_location("file:///a/b") == "/a/b"
    assert resolve_location("s3://bucket/x") == "s3://bucket/x"
    assert resolve_location("~/ck") == os.path.expanduser("~/ck")
    for bad in ("", None, 3):
        with pytest.raises(CheckpointLocationError, match=exactly("a checkpoint location is required")):
            resolve_location(bad)


def test_a_store_pickles_as_its_location_and_means_the_same_files(store, where):
    store.save(Checkpoint({"x": 1}))
    assert store.__getstate__() == {"location": store.location}
    back = pickle.loads(pickle.dumps(store))
    assert back.location == store.location and back.is_local == store.is_local
    assert back.load().settings == {"x": 1}
    assert store.is_local is (where[0] == str(where[1]))


def test_an_entry_for_another_writer_is_named_inside_the_checkpoint(store, where):
    # Spark's own checkpoint of a query segack runs goes there: under the location, whatever its kind.
    assert store.child_location("stream") == f"{store.location}/stream"
    assert CheckpointStore("s3://bucket/ck/").child_location("stream") == "s3://bucket/ck/stream"
    # Only the slashes go: a name's own last letters stay.
    assert CheckpointStore("s3://bucket/BOX/").child_location("stream") == "s3://bucket/BOX/stream"


# ------------------------------------------------------------------ state files

def test_states_are_named_after_their_claim_and_the_newest_is_the_checkpoint(store, where):
    assert store.load() is None and not store.exists() and store.state_file() is None
    store.save(Checkpoint({"n": 0}))
    assert _files(where[1]) == ["checkpoint-000000000000.json"]
    store.save(Checkpoint({"n": 3}), 3)
    store.save(Checkpoint({"n": 2}), 2)  # a fenced run saving late: the checkpoint ignores it
    assert store.load().settings == {"n": 3} and store.exists()
    assert _files(where[1]) == ["checkpoint-000000000002.json", "checkpoint-000000000003.json"]
    store.save(Checkpoint({"n": 4}))  # no claim: in place of the newest
    assert store.load().settings == {"n": 4}
    assert _files(where[1]) == ["checkpoint-000000000003.json"]
    assert store.state_file().endswith("/checkpoint-000000000003.json")
    store.save(Checkpoint({"n": 5}), 5)
    assert _files(where[1]) == ["checkpoint-000000000005.json"]
    store.save(Checkpoint({"n": 6}))  # the only state file: its number is kept
    assert _files(where[1]) == ["checkpoint-000000000005.json"] and store.load().settings == {"n": 6}


def test_files_that_are_not_states_are_not_read_as_states(store, where):
    store.save(Checkpoint({"n": 1}), 1)
    for name in ("backup-000000000007.json", "checkpoint-000000000009.json.tmp", "checkpoint-x.json"):
        (where[1] / name).write_bytes(b"not a checkpoint")
    assert store.load().settings == {"n": 1}


def test_a_damaged_state_file_is_refused_with_the_checkpoints_location(store, where):
    store.save(Checkpoint({"n": 1}), 1)
    (where[1] / "checkpoint-000000000001.json").write_bytes(b"{")
    with pytest.raises(CheckpointError, match=starting(f"checkpoint {store.location} is damaged: not JSON")):
        store.load()


def test_an_empty_file_takes_no_bytes(store, where):
    (where[1] / "progress").mkdir(parents=True)
    (where[1] / "progress" / "r-s00000-a0.sgku").write_bytes(b"")
    assert store.size_bytes() == 0


def test_the_size_is_the_state_file_and_the_progress_files(store, where):
    store.for_tasks("r", 0).write_progress("run-s00000-a0", _updates([(0, 1, 0, 3, "a", 1)]))
    progress = (where[1] / "progress" / "run-s00000-a0.sgku").stat().st_size
    assert store.size_bytes() == progress
    store.save(Checkpoint({"n": 1}))
    state = (where[1] / "checkpoint-000000000000.json").stat().st_size
    assert store.size_bytes() == state + progress


# ------------------------------------------------------------------ progress files

def test_progress_files_round_trip_with_their_tasks_load(store, where):
    updates = _updates([(0, 2, 1, 9, "k", 5), (3, 1, 0, 4, "z", 7)])
    store.for_tasks("r", 0).write_progress("r1-s00000-a0", updates, TaskLoad(3, 12, retries=4))
    store.for_tasks("r", 0).write_progress("r1-s00001-a0", updates)
    store.for_tasks("r", 0).write_progress("r2-s00000-a0", updates)
    assert [path.rsplit("/", 1)[-1] for path in store.progress_files()] == [
        "r1-s00000-a0.sgku", "r1-s00001-a0.sgku", "r2-s00000-a0.sgku"]
    paths = store.progress_files("r1-")
    assert [path.rsplit("/", 1)[-1] for path in paths] == ["r1-s00000-a0.sgku", "r1-s00001-a0.sgku"]
    assert all(path.startswith(str(where[1])) or "://" in store.location for path in paths)
    read = list(store.read_progress(paths))
    assert [path for path, _ in read] == paths
    assert all(table.equals(updates) for _, table in read)
    assert [CheckpointStore.task_load(table) for _, table in read] == [TaskLoad(3, 12, 4), TaskLoad(0, 0, 0)]
    assert TaskLoad(3, 12, 4) + TaskLoad(1, 2, 3) == TaskLoad(4, 14, 7)
    store.delete_progress(paths)
    assert store.progress_files() == [path for path in store.progress_files() if "r2-" in path]
    assert list(store.read_progress(paths)) == []  # gone since: skipped


@pytest.mark.parametrize(("metadata", "load"), [
    (None, (0, 0, 0)),
    ({b"segack.in_flight": b"7"}, (7, 0, 0)),
    ({b"segack.pending": b"8"}, (0, 8, 0)),
    ({b"segack.retries": b"5"}, (0, 0, 5)),
    ({b"segack.in_flight": b"x", b"segack.pending": b"-1", b"segack.retries": b"2.5"}, (0, 0, 0)),
    ({b"segack.in_flight": b"9" * 18, b"segack.pending": b"9" * 19}, (int("9" * 18), 0, 0)),
])
def test_a_tasks_load_is_read_from_its_progress_files_metadata_and_nonsense_counts_nothing(metadata, load):
    assert CheckpointStore.task_load(_updates([]).replace_schema_metadata(metadata)) == TaskLoad(*load)


def test_progress_files_that_are_not_progress_are_skipped_or_refused(store, where):
    store.for_tasks("r", 0).write_progress("r-s00000-a0", _updates([(0, 1, 0, 3, "a", 1)]))
    (where[1] / "progress" / "r-s00001-a0.sgku.tmp").write_bytes(b"half written")
    (where[1] / "progress" / "r.stop").write_bytes(b"why")
    assert [path.rsplit("/", 1)[-1] for path in store.progress_files()] == ["r-s00000-a0.sgku"]
    (where[1] / "progress" / "r-s00002-a0.sgku").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"^progress file .*r-s00002-a0\.sgku is not segack key-group "):
        list(store.read_progress(store.progress_files()))


def test_a_stop_request_is_one_runs_and_says_why(store, where):
    one, two = store.for_tasks("r1", 0), store.for_tasks("r2", 0)
    assert not one.stop_requested()
    store.request_stop("r1", "segments change: split 0")
    assert one.stop_requested() and not two.stop_requested()
    assert (where[1] / "progress" / "r1.stop").read_text() == "segments change: split 0"
    two.request_stop("the handler failed in segment 3")
    assert (where[1] / "progress" / "r2.stop").read_text() == "the handler failed in segment 3"
    store.clear_stop("r2")
    assert one.stop_requested() and not two.stop_requested()
    store.clear_stop("r1")
    assert not one.stop_requested() and _files(where[1]) == []
    store.clear_stop("r1")  # twice is fine


def test_a_streams_view_lies_over_its_record_when_of_the_same_micro_batch_or_a_later_one(store, where,
                                                                                         caplog):
    files = store.files
    recorded = {"last_batch": {"id": 4, "at": 1.0, "seconds": 0.5}, "completed_batch": 4,
                "partitions": [["t", 0, 10, 10]], "group_offsets": [["t", 0, 10]]}
    assert stream_now(files, recorded) == recorded  # no view yet
    assert stream_now(files, None) is None and stream_now(files, {}) == {}
    view = {"last_batch": {"id": 4, "at": 2.0, "seconds": 0.5}, "ends_at": 3.0,
            "partitions": [["t", 0, 10, 25]], "group_offsets": [["t", 0, 10]], "commit_offsets_to": "g"}
    write_stream_view(files, view)
    assert json.loads((where[1] / "stream-view.json").read_text()) == view
    assert stream_now(files, recorded) == {**recorded, **view}
    assert stream_now(files, {**recorded, "last_batch": {"id": 5}}) == {**recorded, "last_batch": {"id": 5}}
    write_stream_view(files, {**view, "last_batch": {}})  # a run that has no batch to speak of yet
    assert stream_now(files, {"last_batch": {"id": 0}}) == {"last_batch": {"id": 0}}
    assert stream_now(files, {"completed_batch": -1}) == {"completed_batch": -1, **view, "last_batch": {}}
    (where[1] / "stream-view.json").write_text('{"last_batch": {"id": "x"')  # torn: passed over, said
    with caplog.at_level("WARNING"):
        assert stream_now(files, recorded) == recorded
    assert "stream-view.json, which does not parse" in caplog.text


def test_tasks_see_their_run_fenced_only_by_a_newer_claim(store):
    tasks = store.for_tasks("r1", 2)
    assert not tasks.fenced()  # no claim at all: an in-process store, nothing to compare
    for number, fenced in ((1, False), (2, False), (3, True)):
        store.create_claim_file(number, b"{}")
        assert tasks.fenced() is fenced


def test_a_tasks_view_pickles_as_its_location_run_and_claim_and_reads_its_earlier_attempts(store):
    tasks = store.for_tasks("r1", 4)
    back = pickle.loads(pickle.dumps(tasks))
    assert back.__getstate__() == {"location": store.location, "run_id": "r1", "claim_number": 4,
                                   "driver": DriverProcess.this()}
    assert back.progress_name(3, 1) == "r1-s00003-a1" and back.cheap_looks == store.is_local
    updates = _updates([(0, 2, 1, 9, "k", 5)])
    for name in ("r1-s00003-a0", "r1-s00003-a1", "r1-s00004-a0", "r2-s00003-a0", "r1-2-s00003-a0"):
        tasks.write_progress(name, updates)
    assert len(list(back.earlier_attempts(3))) == 2
    assert list(back.earlier_attempts(5)) == []


# ------------------------------------------------------------------ dead letters

def _letters(keys, groups, positions, error="ValueError: no"):
    return pa.table({"user": keys, "amount": list(range(len(keys))), DEAD_ERROR: [error] * len(keys),
                     DEAD_ATTEMPTS: pa.array([1] * len(keys), pa.int32()),
                     DEAD_KEY_GROUP: pa.array(groups, pa.int32()),
                     DEAD_POSITION: pa.array(positions, pa.int64())})


def test_dead_letters_are_parquet_files_read_back_once_per_event(store, where):
    assert store.read_dead_letters() is None and store.dead_letter_keys("user") == frozenset()
    tasks = store.for_tasks("r1", 0)
    tasks.write_dead_letters("r1-s00000-a0-00000", _letters(["a", "b"], [1, 2], [4, 7]))
    # A retried attempt wrote one of them again, with other columns' values.
    tasks.write_dead_letters("r1-s00000-a1-00000", _letters(["b", "c"], [2, 3], [7, 0], "Again: x"))
    (where[1] / "dead-letters" / "r1-s00000-a2-00000.parquet.tmp").write_bytes(b"half written")
    assert _files(where[1] / "dead-letters") == ["r1-s00000-a0-00000.parquet", "r1-s00000-a1-00000.parquet",
                                                 "r1-s00000-a2-00000.parquet.tmp"]
    assert len(store.dead_letter_files()) == 2 and len(store.dead_letter_files("r1-s00000-a1")) == 1
    assert store.dead_letter_files("r2") == []
    letters = store.read_dead_letters()
    assert letters.column("user").to_pylist() == ["a", "b", "c"] and store.count_dead_letters() == 3
    assert letters.column(DEAD_ERROR).to_pylist() == ["ValueError: no", "ValueError: no", "Again: x"]
    assert store.dead_letter_keys("user") == frozenset({"a", "b", "c"})
    # Some columns only: the events' others are not read; an event written again still counts once.
    some = store.read_dead_letters([DEAD_ERROR])
    assert some.column_names == [DEAD_ERROR, DEAD_KEY_GROUP, DEAD_POSITION]
    assert some.to_pylist() == letters.select(some.column_names).to_pylist()
    # The same position in another key group is another event.
    tasks.write_dead_letters("r1-s00001-a0-00000", _letters(["d"], [3], [4]))
    assert store.read_dead_letters().column("user").to_pylist() == ["a", "b", "c", "d"]
    assert store.count_dead_letters() == 4
    store.delete_dead_letters(store.dead_letter_files("r1-s00001"))
    [path] = store.dead_letter_files("r1-s00000-a1")
    assert store.read_dead_letter_file(path, columns=["user"]).column_names == ["user"]
    assert store.read_dead_letter_file(path).num_rows == 2
    assert store.dead_letter_schema(path).names == _letters([], [], []).column_names
    assert pq.read_table(where[1] / "dead-letters" / "r1-s00000-a1-00000.parquet").num_rows == 2
    store.delete_dead_letters([path])
    assert store.read_dead_letter_file(path) is None and store.dead_letter_schema(path) is None
    assert store.dead_letter_keys("user") == frozenset({"a", "b"}) and store.count_dead_letters() == 2
    store.delete_dead_letters(store.dead_letter_files())
    assert store.count_dead_letters() == 0


def test_a_location_that_is_a_file_or_holds_other_files_is_not_a_checkpoint(where):
    root = where[1]
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_bytes(b"x")
    with pytest.raises(CheckpointLocationError, match="is a file, not a checkpoint's directory"):
        CheckpointStore(where[0]).load()
    root.unlink()
    root.mkdir()
    store = CheckpointStore(where[0])
    with pytest.raises(CheckpointLocationError, match="no checkpoint at"):
        store.load_existing()
    # A checkpoint's own entries, a write that did not finish, hidden files: still a new checkpoint.
    for name in ("claims", "progress", "dead-letters", "stream"):
        (root / name).mkdir()
    for name in ("segments-request.json", "checkpoint-000000000003.json.0a1b.tmp", ".nfs0001"):
        (root / name).write_bytes(b"")
    assert store.load() is None
    (root / "part-0.parquet").write_bytes(b"PAR1")
    (root / "notes.txt").write_bytes(b"")
    with pytest.raises(CheckpointLocationError, match=r"holds 'notes\.txt' and 1 more, which no"):
        store.load()
    store.save(Checkpoint())  # a state file makes it a checkpoint, whatever else it holds
    assert store.load_existing() == Checkpoint()


def test_dead_letters_of_two_files_with_other_column_types_read_together(store):
    store.for_tasks("r", 0).write_dead_letters("a", _letters(["a"], [1], [4]))
    wider = _letters(["b"], [2], [5]).set_column(1, "amount", pa.array([2.5]))
    store.for_tasks("r", 0).write_dead_letters("b", wider)
    assert store.read_dead_letters().column("amount").to_pylist() == [0, 2.5]


def test_a_dead_letter_file_that_is_not_parquet_is_refused_naming_it(store, where):
    store.for_tasks("r", 0).write_dead_letters("a", _letters(["a"], [1], [4]))
    (where[1] / "dead-letters" / "b.parquet").write_bytes(b"junk")
    [_, path] = store.dead_letter_files()
    with pytest.raises(CheckpointError, match=starting(f"dead-letter file {path} cannot be read: ")):
        store.read_dead_letters()
    with pytest.raises(CheckpointError, match=starting(f"dead-letter file {path} cannot be read: ")):
        store.dead_letter_schema(path)


def test_claims_are_atomic_on_local_disks_and_made_by_looking_first_elsewhere(store, where):
    assert store.claims_are_atomic is store.is_local
    assert store.create_claim_file(1, b"first") is True
    assert store.create_claim_file(1, b"second") is False
    assert store.read_claim_file(1) == b"first"
    assert store.claim_numbers() == [1]
    assert _files(where[1]) == ["claims/000000000001.json"]  # no temporary file left behind


def test_a_tasks_view_reads_a_dead_letter_file_to_handle_it_again(store):
    tasks = store.for_tasks("r1", 0)
    tasks.write_dead_letters("a", _letters(["a", "b"], [1, 2], [4, 7]))
    [path] = store.dead_letter_files()
    assert tasks.read_dead_letter_file(path).column("user").to_pylist() == ["a", "b"]
    store.delete_dead_letters([path])
    assert tasks.read_dead_letter_file(path) is None


@pytest.mark.parametrize("kind", ["local", "arrow"])
def test_only_an_empty_directory_is_removed(tmp_path, kind):
    from segack.spark_adapter.store.storage import ArrowFiles, LocalFiles

    files = LocalFiles(str(tmp_path)) if kind == "local" else ArrowFiles(f"file://{tmp_path}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept").write_bytes(b"x")
    (tmp_path / "a-file").write_bytes(b"y")
    for name in ("empty", "full", "a-file", "missing"):
        files.remove_empty_directory(files.path(name))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file", "full"]
    assert (tmp_path / "full" / "kept").read_bytes() == b"x" and (tmp_path / "a-file").read_bytes() == b"y"


@pytest.mark.parametrize(("footers", "counts", "expected"), [
    (None, None, None),  # a first run, no footers read: not known yet
    (64, None, 64),  # the Parquet footers counted it
    (64, [3, 4, 5, 6], 18),  # a run has counted it: its count wins
    (True, None, None), ("64", None, None), (6.5, None, None),  # a setting that is not a count
])
def test_the_input_events_are_the_count_else_what_the_footers_said(footers, counts, expected):
    tokens = KeyGroupTokens.empty(2, pa.int64(), pa.string())
    if counts is not None:
        tokens.set_counts(np.asarray(counts, dtype=np.int64))
    settings = {} if footers is None else {"footer_total": footers}
    assert Checkpoint(settings, tokens).input_events == expected
    assert Checkpoint(settings).input_events == (expected if counts is None else footers)
