"""Checkpoints on an object store: a real S3 API server on loopback (moto's), reached through
:class:`~segack.spark_adapter.storage.ObjectStoreFiles` the standard way (``AWS_ENDPOINT_URL``)."""

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
from segack.spark_adapter.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.claims import acquire, latest_claim
from segack.spark_adapter.errors import CheckpointClaimedError
from segack.spark_adapter.storage import ObjectStoreFiles

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
