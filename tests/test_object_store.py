"""Checkpoints on an object store: a real S3 API server on loopback (moto's), reached through
:class:`~segack.spark_adapter.store.storage.ObjectStoreFiles` the standard way (``AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode, main
from segack.demo import generate_events
from segack.spark_adapter.errors import CheckpointClaimedError
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.claims import acquire, latest_claim
from segack.spark_adapter.store.storage import ObjectStoreFiles

ROOT = Path(__file__).resolve().parents[1]


def test_an_object_store_keeps_the_files_promises(s3):
    files = ObjectStoreFiles(f"{s3}/ck")
    assert files.read(files.path("a.json")) is None and not files.exists(files.path("a.json"))
    files.write(files.path("a.json"), b"1")
    files.write(files.path("a.json"), b"2")
    assert files.read(files.path("a.json")) == b"2" and files.exists(files.path("a.json"))
    assert files.create(files.path("claims", "1.json"), b"x")
    assert not files.create(files.path("claims", "1.json"), b"y")
    assert files.read(files.path("claims", "1.json")) == b"x"
    assert files.list(files.path("claims")) == [("claims/1.json", 1)]
    assert sorted(files.entries(files.path())) == ["a.json", "claims"]
    assert files.list(files.path("progress")) == [] and files.entries(files.path("progress")) == []
    files.delete(files.path("a.json"))
    files.delete(files.path("a.json"))  # gone already: fine
    assert files.read(files.path("a.json")) is None
    with pytest.raises(FileNotFoundError):
        files.parquet_source(files.path("dead-letters", "x.parquet"))


@pytest.mark.claims
def test_of_many_runs_claiming_an_s3_checkpoint_at_once_exactly_one_wins(s3):
    """The create is the store's conditional PUT (``If-None-Match: *``): were it a plain PUT, every
    claimant would believe it had won."""
    store = CheckpointStore(f"{s3}/ck")
    assert store.claims_are_atomic
    for attempt in range(5):
        winners, refused = [], []
        barrier = threading.Barrier(8)

        def claim(name, barrier=barrier, winners=winners, refused=refused):
            barrier.wait()
            try:
                winners.append(acquire(store, name, 60))
            except CheckpointClaimedError as error:
                refused.append(error)

        threads = [threading.Thread(target=claim, args=(f"run-{attempt}-{n}",)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1 and len(refused) == 7, (winners, refused)
        assert latest_claim(store) == winners[0]
        # Released, as a run does at its end: the next attempt claims the next number.
        store.files.write(store.files.path("claims", f"{winners[0].number:012d}.json"),
                          winners[0].__class__(**{**winners[0].__dict__, "released": True}).to_bytes())


@pytest.mark.claims
@pytest.mark.command
def test_status_of_an_s3_checkpoint_says_its_claims_are_atomic(s3, capsys):
    store = CheckpointStore(f"{s3}/ck")
    store.save(Checkpoint({"key": "user", "status": "complete"}))
    acquire(store, "run", 60)
    assert main(["status", f"{s3}/ck"]) == 0
    out = capsys.readouterr().out
    assert "claim           held: run run" in out
    assert "cannot create a file exclusively" not in out


@pytest.mark.parametrize(("case", "reason"), [
    ("no credentials", "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the store's own "
     "variables)"),
    ("an unreachable endpoint", "cannot reach the store: Generic S3 error: Error performing list request"),
    ("a bucket that does not exist", "the store answered 404 Not Found (NoSuchBucket)"),
    ("a server that is not a store", "the store answered 404 Not Found\n"),
])
def test_a_store_it_cannot_use_is_one_line_naming_the_cause(s3, monkeypatch, tmp_path, request, case, reason):
    location = f"{s3}/ck"
    if case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif case == "an unreachable endpoint":
        from tests.ports import free_port

        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    elif case == "a bucket that does not exist":
        location = "s3://no-such-bucket/ck"
    else:  # a plain web server: its 404 has no S3 error code
        from tests.ports import free_port

        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", str(port)],
                                  cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        request.addfinalizer(server.kill)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        _wait_for_port(port)
    with pytest.raises(OSError) as refused:
        ObjectStoreFiles(location).list("")
    assert f"{refused.value}\n".startswith(f"checkpoint store {location}: {reason}")
    assert "\n" not in str(refused.value)


def _wait_for_port(port):
    import socket
    import time

    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.05)


def _refused(arguments, environment):
    """``segack ARGS`` where Spark cannot start (no Java): a refusal must come before it."""
    environment = {**environment, "JAVA_HOME": "/nonexistent", "PATH": os.path.dirname(sys.executable)}
    return subprocess.run([sys.executable, "-m", "segack", *arguments], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("case", "reason"), [
    ("no credentials", "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ("an unreachable endpoint", "cannot reach the store"),
    ("a bucket that does not exist", "the store answered 404 Not Found (NoSuchBucket)"),
])
@pytest.mark.command
def test_an_s3_checkpoint_it_cannot_use_is_refused_in_one_line_before_spark_starts(
        s3, s3_endpoint, tmp_path, case, reason):
    pq.write_table(generate_events(20), tmp_path / "events.parquet")
    environment = dict(os.environ)
    checkpoint = f"{s3}/ck"
    if case == "no credentials":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            environment.pop(name)
        environment["AWS_EC2_METADATA_DISABLED"] = "true"
    elif case == "an unreachable endpoint":
        from tests.ports import free_port

        environment["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    else:
        checkpoint = "s3://no-such-bucket/ck"
    for command in (["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                     "--handler", "tests.spark_handlers:record_slowly", "--checkpoint", checkpoint],
                    ["status", checkpoint]):
        done = _refused(command, environment)
        assert done.returncode == ExitCode.REFUSED, done.stderr
        line = f"segack {command[0]}: checkpoint store {checkpoint}: {reason}"
        assert done.stderr.startswith(line), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert ObjectStoreFiles(f"{s3}/ck").entries("") == []  # nothing written


def _replay(tmp_path, checkpoint, segments, run, extra=(), handler="record_slowly"):
    environment = dict(os.environ, SEGACK_TEST_LOG=str(tmp_path / "log.jsonl"), SEGACK_TEST_RUN=str(run))
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--handler", f"tests.spark_handlers:{handler}", "--checkpoint", checkpoint,
               "--segments", str(segments), *extra]
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.rescale
@pytest.mark.command
def test_a_replay_on_s3_killed_and_resumed_with_other_segments_does_every_event(s3, tmp_path):
    import signal
    import time

    from tests.spark_handlers import read_log
    from tests.test_spark_adapter import assert_each_key_in_order

    table = generate_events(6000, seed=31)
    pq.write_table(table, tmp_path / "events.parquet")
    checkpoint = f"{s3}/ck"
    first = _replay(tmp_path, checkpoint, 2, "first", ["--flush-every", "300", "--flush-interval", "0.3"])
    deadline = time.monotonic() + 300
    while len(read_log(str(tmp_path / "log.jsonl"))) < 1500 and first.poll() is None:
        assert time.monotonic() < deadline, "the first run handled nothing"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    recorded = CheckpointStore(checkpoint).load()
    assert recorded is not None and recorded.tokens is not None
    second = _replay(tmp_path, checkpoint, 3, "second")
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert {(event["user"], event["seq"]) for event in handled} == set(
        zip(table.column("user").to_pylist(), table.column("seq").to_pylist(), strict=True))
    assert_each_key_in_order(handled, table)
    assert any(event["run"] == "first" for event in handled) and "already done" in out
    state = CheckpointStore(checkpoint).load()
    assert state.tokens.complete and len(state.settings["segments"]) == 3


@pytest.mark.spark
@pytest.mark.claims
@pytest.mark.command
def test_two_replays_started_at_once_on_s3_one_runs_and_the_other_is_refused_naming_it(s3, tmp_path):
    from tests.spark_handlers import read_log

    # Long enough (2 ms an event) that the winner still holds the claim when the other asks.
    pq.write_table(generate_events(6000, seed=32), tmp_path / "events.parquet")
    for attempt in range(2):
        checkpoint = f"{s3}/ck-{attempt}"
        runs = [_replay(tmp_path, checkpoint, 2, f"{attempt}-{n}", handler="record_when") for n in range(2)]
        outcomes = [(run.returncode, out, err) for run in runs for out, err in [run.communicate(timeout=600)]]
        codes = sorted(code for code, _, _ in outcomes)
        assert codes == [ExitCode.OK, ExitCode.REFUSED], outcomes
        [(_, _, refusal)] = [outcome for outcome in outcomes if outcome[0] == ExitCode.REFUSED]
        winner = runs[[code for code, _, _ in outcomes].index(ExitCode.OK)]
        assert "is claimed by run " in refusal and f"(pid {winner.pid} on " in refusal, refusal
        loser = f"{attempt}-{[code for code, _, _ in outcomes].index(ExitCode.REFUSED)}"
        assert not [event for event in read_log(str(tmp_path / "log.jsonl")) if event["run"] == loser]
