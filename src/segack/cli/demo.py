"""``segack demo``: a generated event log replayed into SQLite, killed partway, resumed over
another segment count, and checked against sequential processing."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from segack.spark_adapter.errors import CheckpointLocationError
from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore


def run(args: argparse.Namespace) -> int:
    """``segack demo``: replay, crash, rescale and resume, check against sequential processing, in
    ``--workdir`` (else a temporary directory, removed at the end unless ``--keep``)."""
    workdir = args.workdir or tempfile.mkdtemp(prefix="segack-demo-")
    print(f"segack demo: its event log, checkpoint and databases go to {workdir}")
    try:
        return _demo(workdir, args.events)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"segack demo: removed {workdir} (--keep keeps it)")


def _demo(workdir: str, count: int) -> int:
    import pyarrow.parquet as pq

    from segack import demo

    os.makedirs(workdir, exist_ok=True)
    for name in ("users.sqlite", "users.sqlite-wal", "users.sqlite-shm", "expected.sqlite"):
        if os.path.exists(os.path.join(workdir, name)):
            os.remove(os.path.join(workdir, name))
    store = CheckpointStore(os.path.join(workdir, "checkpoint"))
    if store.exists():
        print(f"segack demo: {workdir} already holds a checkpoint; use an empty --workdir", file=sys.stderr)
        return 1
    events = demo.generate_events(count)
    pq.write_table(events, os.path.join(workdir, "events.parquet"))
    users = len(set(events.column("user").to_pylist()))
    print(f"1. wrote {events.num_rows:,} events of {users:,} users (skewed, shuffled) "
          f"to {workdir}/events.parquet")
    demo.sequential_users(events, os.path.join(workdir, "expected.sqlite"))
    print("2. built the expected database by applying every event in time order, sequentially")

    print("3. replaying into SQLite over 4 segments, in lists of up to 100 events, 4 lists in flight per "
          "segment, through a sink that applies each list in one transaction with each user's last applied "
          "position; the run will be killed partway (SIGKILL)")
    first = _replay_process(workdir, 4)
    target = events.num_rows * 0.35
    killed_at = None
    while first.poll() is None:
        time.sleep(0.1)
        try:
            # The tasks' progress files count too: the state alone moves only every merge.
            done = _recorded_done(store)
        except (CheckpointError, CheckpointLocationError):  # not made yet, or written as it was read
            continue
        if done >= target:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            killed_at = _recorded_done(store)
    if killed_at is None and first.returncode != 0:
        print(f"segack demo: the first run failed (exit {first.returncode})", file=sys.stderr)
        return 1
    if killed_at is None or killed_at == events.num_rows:
        print("   the run handled every event before it could be killed")
    else:
        applied = demo.count_events(demo.read_users(os.path.join(workdir, "users.sqlite")))
        print(f"   killed with {killed_at:,} events recorded done (in the checkpoint's state and the "
              f"progress files the next run merges, as `segack status` counts them) and {applied:,} applied "
              f"to the database: the next run is handed again those applied but not recorded, and the sink "
              f"skips them")
    print("4. resuming from the checkpoint with 7 segments instead of 4 (a rescale)")
    second = _replay_process(workdir, 7)
    if second.wait() != 0:
        print(f"segack demo: the resumed run failed (exit {second.returncode})", file=sys.stderr)
        return 1
    got = demo.read_users(os.path.join(workdir, "users.sqlite"))
    expected = demo.read_users(os.path.join(workdir, "expected.sqlite"))
    if got != expected:
        wrong = sum(1 for a, b in zip(got, expected, strict=False) if a != b) + abs(len(got) - len(expected))
        print(f"segack demo: FAILED: the database differs from sequential processing in {wrong} users",
              file=sys.stderr)
        return 1
    print(f"5. checked: all {len(got):,} users ({demo.count_events(got):,} parts) equal sequential "
          f"processing: each event applied exactly once, none before an earlier one of its user")
    return 0


def _replay_process(workdir: str, segments: int) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, SEGACK_DEMO_DB=os.path.join(workdir, "users.sqlite"))
    command = [
        sys.executable, "-m", "segack", "replay", os.path.join(workdir, "events.parquet"),
        "--key", "user", "--order", "ts", "--handler", "segack.demo:sink",
        "--checkpoint", os.path.join(workdir, "checkpoint"), "--segments", str(segments),
        "--batch-size", "100", "--concurrency", "4", "--flush-every", "2000", "--flush-interval", "0.5",
    ]
    return subprocess.Popen(command, env=environment, start_new_session=True)


def _recorded_done(store: CheckpointStore) -> int:
    """Events recorded done, as ``segack status`` counts them."""
    from segack.spark_adapter.store.claims import recorded_state

    tokens = recorded_state(store)[0].tokens
    return 0 if tokens is None else tokens.done
