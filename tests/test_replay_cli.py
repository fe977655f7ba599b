"""``segack replay`` and ``segack status`` as processes: crashes, rescales, failures, damage."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode, main
from segack.demo import generate_events
from segack.spark_adapter.store.checkpoint import CheckpointStore
from tests import expected
from tests.spark_handlers import LOG_ENV, read_log
from tests.test_spark_adapter import assert_each_key_in_order

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _start(tmp_path, handler, segments, run, extra=(), checkpoint=None):
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl"), "SEGACK_TEST_RUN": str(run)})
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"),
               "--key", "user", "--order", "ts", "--handler", handler,
               "--checkpoint", checkpoint or str(tmp_path / "checkpoint"), "--segments", str(segments),
               *extra]
    return subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_group(process):
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed replay left processes behind")


def _done_events(tmp_path, table):
    """The events the checkpoint calls done, counting progress files a killed run left behind
    (the next run merges them)."""
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    state = store.load()
    if state is None or state.tokens is None:
        return set()
    tokens = state.tokens.copy()
    for _, updates in store.read_progress(store.progress_files()):
        tokens.apply(updates)
    return expected.done_events(table, tokens)


@pytest.mark.faults
@pytest.mark.rescale
def test_sigkilled_replays_resume_rescale_and_finish(tmp_path, capsys):
    total = 12_000
    table = generate_events(total, seed=21)
    pq.write_table(table, tmp_path / "events.parquet")
    rng = random.Random(2026)
    done_before = []
    handled_per_run = []
    counted_files = 0
    for run, segments in enumerate([2, 5, 3]):
        done_before.append(_done_events(tmp_path, table))
        # The second run keeps several calls in flight when it is killed.
        concurrent = ["--concurrency", "4"] if run == 1 else []
        process = _start(tmp_path, "tests.spark_handlers:record_slowly", segments, run,
                         ["--flush-every", "300", "--flush-interval", "0.3", *concurrent])
        # Kill at a random moment once this run has started handling events.
        handled_so_far = len(read_log(str(tmp_path / "log.jsonl")))
        deadline = time.monotonic() + 180
        while (process.poll() is None and time.monotonic() < deadline
               and len(read_log(str(tmp_path / "log.jsonl"))) == handled_so_far):
            time.sleep(0.1)
        time.sleep(rng.uniform(0.2, 2.5))
        if process.poll() is None:
            _kill_group(process)
            # `segack status` counts what the next run resumes from: the progress files included.
            assert main(["status", str(tmp_path / "checkpoint")]) == 0
            status = capsys.readouterr().out
            shown = re.search(r"events +(?:[\d,]+ in all: )?([\d,]+) handled", status)
            assert int(shown[1].replace(",", "")) == len(_done_events(tmp_path, table)), status
            counted_files += "progress file" in status and "the next run merges them" in status
    assert counted_files, "no kill left progress files behind; the status check proved nothing"
    done_before.append(_done_events(tmp_path, table))
    final = _start(tmp_path, "tests.spark_handlers:record_slowly", 4, 3, ["--concurrency", "8", "--verbose"])
    out, err = final.communicate(timeout=600)
    assert final.returncode == 0, err

    handled = read_log(str(tmp_path / "log.jsonl"))
    assert_each_key_in_order(handled, table)
    for run in range(4):
        events = {(e["user"], e["seq"]) for e in handled if e["run"] == str(run)}
        handled_per_run.append(len(events))
        assert not events & done_before[run], f"run {run} redid work the checkpoint had recorded"
    assert len(done_before[3]) > 0, "no kill landed after the first flush; the test proved nothing"
    assert handled_per_run[3] == total - len(done_before[3])
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.tokens.complete and state.settings["segments"] == list(range(4))
    assert "already done" in out
    # The killed runs recorded the file they read; it has not changed, so nothing was checked again
    # (good news, said only with --verbose).
    assert "were not read again" in err


@pytest.mark.claims
@pytest.mark.faults
def test_a_killed_driver_stops_its_handlers_at_once(tmp_path):
    """SIGKILL to the command's process alone: Spark's JVM and its Python workers live on; the
    workers must not call the handler after it (they watch the driver's process). The JVM is
    stopped first, so that only the workers' own watch can end them: without it they would go on
    through the rows they hold for seconds."""
    pq.write_table(generate_events(20_000, seed=4), tmp_path / "events.parquet")
    process = _start(tmp_path, "tests.spark_handlers:record_when", 2, 0, ["--concurrency", "4"])
    log = str(tmp_path / "log.jsonl")
    _wait_for(lambda: len(read_log(log)) > 200 or process.poll() is not None, 300, "the run to handle events")
    assert process.poll() is None, process.communicate()
    tree = _process_tree(process.pid)
    jvm = [pid for pid in tree if _command_name(pid) == "java"]
    assert jvm, "the command's JVM was not found"
    _signal_tree(jvm, signal.SIGSTOP)
    try:
        process.send_signal(signal.SIGKILL)
        killed = time.time()
        process.wait()
        time.sleep(3)
        late = sorted(event["at"] - killed for event in read_log(log) if event["at"] > killed)
        # Calls begun as the kill landed may finish; none may start once the workers' watch threads
        # have run, within a moment even on a busy machine (without the watch, calls went on until
        # the workers' rows ran out, seconds later).
        assert [delay for delay in late if delay > 0.5] == [], (
            f"{len(late)} calls after the kill, the last {late[-1]:.2f} s after it")
    finally:
        _signal_tree(tree, signal.SIGKILL)
        _signal_tree(jvm, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            _kill_group(process)


def _command_name(pid):
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def test_a_handler_failure_exits_with_its_own_code_and_one_line_naming_the_event(tmp_path):
    import pyarrow as pa

    users = [f"u{n % 5}" for n in range(100)]
    seqs = [n // 5 for n in range(100)]
    table = pa.table({"user": users, "seq": seqs, "ts": [1000 + n for n in range(100)]})
    pq.write_table(table, tmp_path / "events.parquet")
    process = _start(tmp_path, "tests.spark_handlers:fail_on_tenth", 2, 0)
    _, err = process.communicate(timeout=600)
    reason = [line for line in err.splitlines() if line.startswith("segack replay:")]
    assert process.returncode == ExitCode.HANDLER_FAILED
    assert len(reason) == 1
    assert "key 'u1'" in reason[0] and "order 1051" in reason[0] and "cannot apply this part" in reason[0]
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["status"] == "failed"
    done = expected.done_events(table, state.tokens)
    assert ("u1", 10) not in done and ("u1", 9) in done


@pytest.mark.handlers
def test_dead_letters_are_set_aside_then_retried_in_order_by_the_command(tmp_path, s3, capsys):
    # On the S3 server: a local checkpoint's dead letters are retried in test_spark_adapter and
    # (by the command) in test_kafka.
    import pyarrow as pa

    checkpoint_location = f"{s3}/checkpoint"
    table = pa.table({"user": [f"u{n % 5}" for n in range(100)], "seq": [n // 5 for n in range(100)],
                      "ts": [1000 + n for n in range(100)]})
    pq.write_table(table, tmp_path / "events.parquet")
    handler = "tests.spark_handlers:record_refusing_tenth_until_fixed"
    first = _start(tmp_path, handler, 2, 0, ["--on-error", "dead-letter", "--concurrency", "4"],
                   checkpoint_location)
    out, err = first.communicate(timeout=600)
    assert "segack replay: 10 events set aside as dead letters in this run" in out, err
    # Not complete, in a way a scheduler sees: an exit code of its own, and the last line says why.
    assert first.returncode == ExitCode.DEAD_LETTERS == 3
    assert err.splitlines()[-1].startswith("segack replay: not complete: 10 events set aside as dead letters "
                                           "remain")
    assert main(["status", checkpoint_location]) == 0
    status = capsys.readouterr().out
    assert "status          not complete: 10 dead letters left (read to the end; --retry" in status
    assert "events          100 in all: 90 handled (90.0%), 10 set aside, 0 not reached yet" in status
    assert {event["seq"] for event in read_log(str(tmp_path / "log.jsonl")) if event["user"] == "u1"} == set(
        range(10))
    process = _start(tmp_path, handler, 3, "fixed", ["--retry-dead-letters"], checkpoint_location)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    assert "segack replay: 10 dead letters handled again\n" in out
    assert "set aside" not in out
    assert CheckpointStore(checkpoint_location).read_dead_letters() is None
    assert main(["status", checkpoint_location]) == 0
    status = capsys.readouterr().out
    assert "status          complete: every event handled" in status
    assert "events          100 in all: 100 handled (100.0%), 0 set aside, 0 not reached yet" in status
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert len(handled) == 100
    assert_each_key_in_order(handled, table)


def _wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _claimed(tmp_path):
    from segack.spark_adapter.store.claims import latest_claim

    claim = latest_claim(CheckpointStore(str(tmp_path / "checkpoint")))
    return claim is not None and not claim.released


@pytest.mark.claims
def test_a_second_replay_on_a_claimed_checkpoint_is_refused_naming_the_owner(tmp_path):
    table = generate_events(20_000, seed=41)
    pq.write_table(table, tmp_path / "events.parquet")
    first = _start(tmp_path, "tests.spark_handlers:record_when", 2, "first", ["--flush-interval", "0.5"])
    _wait_for(lambda: _claimed(tmp_path) and read_log(str(tmp_path / "log.jsonl")), 300, "the first run")
    second = _start(tmp_path, "tests.spark_handlers:record_when", 3, "second")
    _, err = second.communicate(timeout=300)
    assert second.returncode == ExitCode.REFUSED
    assert "is claimed by run " in err and f"(pid {first.pid} on " in err, err
    assert first.poll() is None, "the first run had ended: the refusal proves nothing"
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert {event["run"] for event in handled} == {"first"}
    assert len(handled) == 20_000
    assert_each_key_in_order(handled, table)


def _process_tree(pid):
    """``pid`` and every process under it, parents first (Spark's Python daemon leaves the
    process group, so signalling the group would not reach it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        tree.append(current)
        queue += children.get(current, [])
    return tree


def _signal_tree(pids, number):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


@pytest.mark.faults
@pytest.mark.claims
def test_a_paused_replay_is_taken_over_and_stops_with_a_lost_claim_when_it_wakes(tmp_path):
    table = generate_events(20_000, seed=42)
    pq.write_table(table, tmp_path / "events.parquet")
    log = str(tmp_path / "log.jsonl")
    options = ["--claim-timeout", "3", "--flush-interval", "0.5", "--concurrency", "2"]
    stale = _start(tmp_path, "tests.spark_handlers:record_when", 2, "stale", options)
    _wait_for(lambda: len(read_log(log)) > 2000, 300, "the first run to handle events")
    paused = _process_tree(stale.pid)
    _signal_tree(paused, signal.SIGSTOP)
    try:
        time.sleep(4)  # past the claim's timeout
        taker = _start(tmp_path, "tests.spark_handlers:record_when", 3, "taker", options)
        _, err = taker.communicate(timeout=600)
        assert taker.returncode == 0, err
    finally:
        woke_at = time.time()
        _signal_tree(paused, signal.SIGCONT)
    _, err = stale.communicate(timeout=300)
    assert stale.returncode == 1
    assert "lost its claim on checkpoint" in err and "was taken over by run" in err, err
    state = CheckpointStore(str(tmp_path / "checkpoint")).load()
    assert state.settings["status"] == "complete" and state.tokens.complete
    assert state.tokens.done == state.tokens.total == 20_000
    handled = read_log(log)
    before = [event for event in handled if event["run"] == "stale" and event["at"] < woke_at]
    taker_calls = [event for event in handled if event["run"] == "taker"]
    assert before and taker_calls
    # The taker handled every event the paused run had not recorded done, from where the checkpoint
    # stood: each key in order, at least once.
    assert_each_key_in_order(before + taker_calls, table)
    after_waking = [event for event in handled if event["run"] == "stale" and event["at"] >= woke_at]
    print(f"\nthe stale run made {len(after_waking)} calls after it woke")
    # Each of its two tasks looks at the fence within 64 events of waking, with 2 calls in flight.
    assert len(after_waking) <= 2 * (64 + 2)


BANNER = ("Using Spark's default log4j profile", "Setting default log level", "To adjust logging level")


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_spark_banner_lines_only_with_verbose(tmp_path, verbose):
    import pyarrow as pa

    table = pa.table({"user": ["u1", "u2"], "seq": [0, 0], "ts": [1, 2]})
    pq.write_table(table, tmp_path / "events.parquet")
    process = _start(tmp_path, "tests.spark_handlers:record_slowly", 1, 0, ["--verbose"] if verbose else [])
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    banner = [line for line in err.splitlines() if line.startswith(BANNER)]
    if verbose:
        assert len(banner) >= 2, err
    else:
        assert banner == []
        assert "segack replay: 2 events handled" in out


@pytest.mark.parametrize("quiet", [True, False], ids=["default", "quiet=False"])
def test_local_session_is_as_quiet_as_the_command_unless_asked(quiet):
    script = ("from segack.spark_adapter import local_session\n"
              f"spark = local_session(quiet={quiet})\n"
              "print(spark.range(3).count())\n"
              "spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout == "3\n", done.stderr
    banner = [line for line in done.stderr.splitlines() if line.startswith(BANNER)]
    assert (banner == []) is quiet, done.stderr


@pytest.mark.checkpoint
def test_a_damaged_checkpoint_fails_the_command_and_is_kept(tmp_path, capsys):
    (tmp_path / "checkpoint").mkdir()
    state = tmp_path / "checkpoint" / "checkpoint-000000000007.json"
    state.write_bytes(b'{"format": "segack-checkpoint", "version": 1, "crc32": 1}')
    pq.write_table(generate_events(10), tmp_path / "events.parquet")
    code = main(["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                 "--handler", "tests.spark_handlers:record_slowly",
                 "--checkpoint", str(tmp_path / "checkpoint")])
    assert code == ExitCode.REFUSED
    assert "damaged" in capsys.readouterr().err
    assert state.read_bytes() == b'{"format": "segack-checkpoint", "version": 1, "crc32": 1}'
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.REFUSED


def test_status_shows_progress_per_segment_and_the_size(tmp_path, capsys):
    import numpy as np
    import pyarrow as pa

    from segack.spark_adapter.store.checkpoint import Checkpoint
    from segack.spark_adapter.store.tokens import KeyGroupTokens

    tokens = KeyGroupTokens.empty(2, pa.int64(), pa.string())
    tokens.set_counts(np.array([5, 0, 3, 2]))
    tokens.committed[:] = [5, 0, 1, 0]
    tokens.run_start[:] = [4, 0, 0, 0]
    tokens.boundaries = {0: (9, "a", 1), 2: (3, "b", 2)}
    tokens.extras = {3: {1}}
    settings = {"total": 10, "key": "user", "segments": [0, 1], "key_group_bits": 2, "status": "failed"}
    store = CheckpointStore(str(tmp_path / "c"))
    store.save(Checkpoint(settings, tokens))
    assert main(["status", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "events          10 in all: 7 handled (70.0%), 0 set aside, 3 not reached yet" in out
    assert "key groups      4 (2 bits): 3 with events, 1 of them done" in out
    # Segment 0 (id 0, mask 1) owns key groups 0 and 2; segment 1 owns 1 and 3.
    assert re.search(r"#0 +id 0 +mask 1 +8 events +80\.0% +6 done +2 key groups", out)
    assert re.search(r"#1 +id 1 +mask 1 +2 events +20\.0% +1 done +2 key groups", out)
    assert f"size            {store.size_bytes():,} bytes (its state and 0 progress files)" in out
    assert "status          stopped: its last run failed" in out and "key             user" in out
    assert "input " not in out  # a checkpoint from before fingerprints says nothing of its input
    assert main(["status", str(tmp_path / "missing")]) == ExitCode.REFUSED

    tokens.counted = False
    store.save(Checkpoint(settings, tokens))
    assert main(["status", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "events          7 handled; the total is counted once a run reads its input to the end" in out
    assert re.search(r"#0 +id 0 +mask 1 +\? events +6 done", out)

    for fingerprint, shown in [("0123456789abcdef" * 4, "fingerprint 0123456789ab: a resume over these"),
                               (None, "no fingerprint (not a query over files alone")]:
        store.save(Checkpoint({**settings, "input_fingerprint": fingerprint}, tokens))
        assert main(["status", str(tmp_path / "c")]) == 0
        assert f"input           {shown}" in capsys.readouterr().out


def test_replay_rejects_a_handler_it_cannot_import(tmp_path, capsys):
    pq.write_table(generate_events(10), tmp_path / "events.parquet")
    code = main(["replay", str(tmp_path / "events.parquet"), "--key", "user", "--order", "ts",
                 "--handler", "no_such_module:handle", "--checkpoint", str(tmp_path / "checkpoint")])
    assert code == ExitCode.USAGE
    assert "argument --handler: cannot import handler module 'no_such_module'" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint").exists()


def test_the_progress_line_gives_the_recent_rate_the_share_the_time_left_and_plurals():
    import io

    from segack.cli.output import ProgressPrinter
    from segack.spark_adapter import Progress

    printer = ProgressPrinter(io.StringIO(), window=10.0)
    # The first report has no rate: the time before it went to Spark's start, not to events.
    assert printer.line(Progress(done=1500, handled=1000, total=3000, segments=4, seconds=30.0)) == (
        "1,500 of 3,000 events done (50.0%), 4 segments")
    assert printer.line(Progress(done=2500, handled=2000, total=3000, segments=1, seconds=35.0, in_flight=1,
                                 pending=1)) == (
        "2,500 of 3,000 events done (83.3%), 200/s, about 2 s left, 1 segment, 1 call in flight, "
        "1 row pending")
    # The rate is the last window's: the slow start falls out of it.
    printer.line(Progress(done=2900, handled=2400, total=3000, segments=1, seconds=45.0))
    line = printer.line(Progress(done=2999, handled=2499, total=3000, segments=2, seconds=46.0, in_flight=7,
                                 pending=40))
    assert line == ("2,999 of 3,000 events done (99.9%), 45/s, about 1 s left, 2 segments, "
                    "7 calls in flight, 40 rows pending")
    # Reports before any event was handled (the tasks starting) count for none of the rate, and it
    # shows once events have flowed for 3 s; then a report without progress (a stall) counts.
    starting = ProgressPrinter(io.StringIO(), window=10.0)
    for seconds in (10.0, 12.0, 14.0):
        assert "/s" not in starting.line(Progress(done=100, handled=0, total=10_100, segments=2,
                                                  seconds=seconds))
    assert starting.line(Progress(done=600, handled=500, total=10_100, segments=2, seconds=15.0)) == (
        "600 of 10,100 events done (5.9%), 2 segments")
    assert starting.line(Progress(done=2100, handled=2000, total=10_100, segments=2, seconds=18.0)) == (
        "2,100 of 10,100 events done (20.7%), 500/s, about 16 s left, 2 segments")
    assert ", 400/s," in starting.line(Progress(done=2100, handled=2000, total=10_100, segments=2,
                                                seconds=19.0))
    # Before the total is counted: no share, no time left.
    assert ProgressPrinter(io.StringIO()).line(Progress(done=1, handled=1, total=None, segments=2,
                                                        seconds=1.0)) == "1 event done, 2 segments"


def test_plan_prints_the_hottest_keys_the_floor_both_sets_and_a_line_to_paste(tmp_path):
    from segack.kernel import SegmentSet
    from tests.test_spark_adapter import _skewed

    table = _skewed(20_000, 0.25, seed=4)
    pq.write_table(table, tmp_path / "events.parquet")
    hot = table.column("user").to_pylist().count("hot")
    command = [sys.executable, "-m", "segack", "plan", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--workers", "4", "--key-group-bits", "6", "--top", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "20,000 events, 64 key groups (6 bits), planned for 4 workers"
    assert re.fullmatch(rf"  hot +{hot:,} +{hot / 20_000:.1%}", lines[2])
    assert (f"the hottest key holds {hot / 20_000:.1%} of the events: with per-key order, no set of segments "
            f"makes a run more than {20_000 / hot:.1f}x faster than one worker") in lines
    assert re.search(r"^planned for 4 +\d +\d+\.\d% +\d\.\dx$", done.stdout, re.M)
    assert re.search(r"^balanced\(4\) +4 +\d+\.\d% +\d\.\dx$", done.stdout, re.M)
    assert lines[-1].startswith("--segments ")
    planned = SegmentSet.from_ids(int(part) for part in lines[-1].removeprefix("--segments ").split(","))
    assert 1 < len(planned) <= 4
    refused = subprocess.run([*command[:5], "--key", "nope"], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert refused.returncode == ExitCode.REFUSED and "segack plan: no column 'nope'" in refused.stderr


@pytest.mark.sinks
def test_the_demo_agrees_with_its_resume_on_what_was_done_and_cleans_up_after_itself(tmp_path):
    environment = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "segack", "demo", "--events", "30000"], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    workdir = re.search(r"its event log, checkpoint and databases go to (\S+)", done.stdout)[1]
    killed = re.search(r"killed with ([\d,]+) events recorded done", done.stdout)
    # The resume's line: the first run may have printed one too, had it ended just before its kill.
    resumed = re.search(r"4\. resuming.*\n(?:.*\n)*?segack replay: [\d,]+ events handled, ([\d,]+) already "
                        r"done", done.stdout)
    assert killed and resumed, done.stdout  # the demo kills at 35%: a run of 30,000 events lasts long enough
    # What the demo says the killed run recorded is what the resume finds done.
    assert killed[1] == resumed[1]
    assert "5. checked: all" in done.stdout
    assert f"segack demo: removed {workdir} (--keep keeps it)" in done.stdout
    assert Path(workdir).parent == tmp_path and not Path(workdir).exists()


def test_replay_reads_a_table_the_session_knows_or_any_format_with_reader_options(spark, tmp_path, capsys):
    import json

    events = generate_events(200, seed=9)
    spark.createDataFrame(events).createOrReplaceTempView("segack_cli_events")
    common = ["--key", "user", "--order", "ts", "--handler", "tests.spark_handlers:discard"]
    assert main(["replay", "--table", "segack_cli_events", *common,
                 "--checkpoint", str(tmp_path / "from-table")]) == ExitCode.OK
    assert "segack replay: 200 events handled" in capsys.readouterr().out
    state = CheckpointStore(str(tmp_path / "from-table")).load()
    assert state.settings["source"] == "table segack_cli_events"
    # One JSON array over many lines: Spark's JSON reader needs its multiLine option for it.
    (tmp_path / "events.json").write_text(json.dumps(events.to_pylist(), indent=2))
    assert main(["replay", str(tmp_path / "events.json"), "--format", "json", *common,
                 "--checkpoint", str(tmp_path / "from-json")]) == ExitCode.REFUSED
    assert "segack replay: no column 'user'" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "events.json"), "--format", "json", "--option", "multiLine=true",
                 *common, "--checkpoint", str(tmp_path / "from-json")]) == ExitCode.OK
    assert "segack replay: 200 events handled" in capsys.readouterr().out
    assert main(["replay", "--table", "no_such_table", *common,
                 "--checkpoint", str(tmp_path / "none")]) == ExitCode.REFUSED
    assert capsys.readouterr().err.startswith("segack replay: cannot read table no_such_table: ")


@pytest.mark.streams
def test_stream_reads_new_files_each_time_and_status_says_what_it_did(tmp_path, capsys):
    """``segack stream DIR``: the files there now, in key order; run again, only the files added."""
    table = generate_events(3000, seed=44).sort_by("ts")
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(table.slice(0, 2000), source / "part-0.parquet")
    stream = [sys.executable, "-m", "segack", "stream", str(source), "--key", "user", "--order", "ts",
              "--handler", "tests.spark_handlers:record_slowly", "--checkpoint", str(tmp_path / "checkpoint"),
              "--segments", "2"]
    environment = dict(os.environ, **{LOG_ENV: str(tmp_path / "log.jsonl")})
    first = subprocess.run(stream, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert first.returncode == ExitCode.OK, first.stderr
    assert "the input is drained: 1 micro-batch, 2,000 events handled" in first.stdout, first.stdout
    pq.write_table(table.slice(2000), source / "part-1.parquet")
    second = subprocess.run(stream, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert second.returncode == ExitCode.OK, second.stderr
    assert "1,000 events handled" in second.stdout, second.stdout
    handled = read_log(str(tmp_path / "log.jsonl"))
    assert len(handled) == 3000
    assert_each_key_in_order(handled, table)
    assert main(["status", str(tmp_path / "checkpoint")]) == ExitCode.OK
    status = capsys.readouterr().out
    assert "stopped between micro-batches: every event of its micro-batches handled" in status
    assert "3,000 in its complete micro-batches" in status and "micro-batch 1 the last complete" in status


def _on_a_terminal(command, cwd, environment):
    """What ``command`` writes to a terminal (a pseudo-terminal it has for stdout and stderr)."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=follower, stderr=follower)
    os.close(follower)
    written = b""
    with contextlib.suppress(OSError):  # the terminal closes once the process has ended
        while chunk := os.read(leader, 65536):
            written += chunk
    os.close(leader)
    return process.wait(120), written.decode()


def test_on_a_terminal_each_start_up_phase_shows_as_it_begins_then_the_progress(tmp_path):
    pq.write_table(generate_events(4_000, seed=21), tmp_path / "events.parquet")
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--handler", "tests.spark_handlers:discard", "--checkpoint",
               str(tmp_path / "checkpoint"), "--segments", "2", "--master", "local[2]"]
    code, written = _on_a_terminal(command, ROOT, dict(os.environ, PYTHONPATH=str(ROOT)))
    assert code == ExitCode.OK, written
    shown = [part for part in re.split(r"\x1b\[K|[\r\n]+", written) if part.strip()]  # each line drawn
    phases = [line for line in shown if line.startswith("segack: ")]
    assert phases == [
        "segack: starting Spark (local[2])", f"segack: reading {tmp_path / 'events.parquet'}",
        f"segack: reading {tmp_path / 'events.parquet'}: 4,000 events, as their Parquet footers count them",
        "segack: checking the order column 'ts' for nulls",
        "segack: checking that the executors import segack", f"segack: claiming {tmp_path / 'checkpoint'}",
        "segack: handling the events over 2 segments"], shown
    # Then the progress on the same line, with the total from the start, and the result.
    after = shown[shown.index(phases[-1]) + 1:]
    assert re.match(r"[\d,]+ of 4,000 events done", after[0]), after
    assert after[-1].startswith("segack replay: 4,000 events handled"), after
