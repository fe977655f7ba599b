"""Claims on real checkpoint directories (no Spark, but for a stream taken over): one owner at a time,
take-over, fencing."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
import time

import pytest

from segack.cli import main
from segack.spark_adapter import OptionError
from segack.spark_adapter.options import check_claim_timeout
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.store.claims import (
    CheckpointClaimedError,
    Claim,
    ClaimKeeper,
    ClaimLostError,
    acquire,
    force_release,
    latest_claim,
    previous_run,
)
from tests.outcomes import exactly, starting


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(str(tmp_path / "checkpoint"))


def _files(path):
    return sorted((entry.relative_to(path), entry.read_bytes())
                  for entry in path.rglob("*") if entry.is_file())


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_live_claim_refuses_another_run_naming_its_owner_and_changes_nothing(store, tmp_path):
    first = acquire(store, "first", 60)
    before = _files(tmp_path)
    with pytest.raises(CheckpointClaimedError) as refused:
        acquire(store, "second", 60)
    assert f"claimed by run first (pid {first.pid} on {first.host}), last extended" in str(refused.value)
    assert refused.value.claim == first
    assert _files(tmp_path) == before


def test_claim_numbers_grow_and_a_released_claim_lets_the_next_run_in(store):
    first = acquire(store, "first", 60)
    with ClaimKeeper(store, first):
        pass
    assert latest_claim(store).released
    second = acquire(store, "second", 60)
    assert (first.number, second.number) == (1, 2)
    assert previous_run(store, second) == "first" and previous_run(store, first) is None
    third_keeper = ClaimKeeper(store, second)
    with third_keeper:
        third_keeper.save(Checkpoint())
    third = acquire(store, "third", 60)
    assert store.claim_numbers() == [1, 2, 3]
    with ClaimKeeper(store, third) as keeper:
        keeper.save(Checkpoint())
        # At a run's first save, claims older than the one before its own are history, and go.
        assert store.claim_numbers() == [2, 3]
    assert previous_run(store, third) == "second"


@pytest.mark.parametrize("saved", [False, True], ids=["before its first save", "after it"])
def test_a_run_that_stops_before_its_first_save_withdraws_its_claim_and_leaves_no_trace(
        store, tmp_path, saved, caplog):
    caplog.set_level(logging.INFO, logger="segack")
    for run in ("first", "second"):
        with ClaimKeeper(store, acquire(store, run, 60)) as keeper:
            keeper.save(Checkpoint({"run": run}))
    before = _files(tmp_path)
    claim = acquire(store, "refused", 60)
    with pytest.raises(CheckpointError, match="other input"), ClaimKeeper(store, claim) as keeper:
        if saved:
            keeper.save(Checkpoint({"run": "refused"}))
        raise CheckpointError("the input is other input")
    if saved:  # its save counts: the claim stays, released, and older claims went
        assert latest_claim(store).run_id == "refused" and latest_claim(store).released
        assert store.claim_numbers() == [2, 3]
    else:  # as it found it, byte for byte: the next run's previous run is the one before
        assert _files(tmp_path) == before
        assert f"run refused withdrew claim {claim.number}: it stopped before it saved" in caplog.text
        assert previous_run(store, acquire(store, "next", 60)) == "second"


@pytest.mark.parametrize("existed", [False, True], ids=["a new location", "an empty directory"])
def test_a_run_refused_before_its_first_save_leaves_the_location_as_it_was(tmp_path, existed):
    location = tmp_path / "checkpoint"
    if existed:
        location.mkdir()
    store = CheckpointStore(str(location))
    with pytest.raises(CheckpointError), ClaimKeeper(store, acquire(store, "refused", 60)):
        assert (location / "claims").is_dir()
        raise CheckpointError("refused")
    # Nothing made is left: not the claims' directory, nor the location unless it was there.
    assert [path.name for path in tmp_path.iterdir()] == (["checkpoint"] if existed else [])
    assert not existed or list(location.iterdir()) == []


def test_an_expired_claim_is_taken_over_and_the_old_owner_is_fenced(store):
    old = acquire(store, "old", 0.2)
    keeper = ClaimKeeper(store, old)
    keeper.extend()  # extending a claim one holds is fine
    with pytest.raises(CheckpointClaimedError):
        acquire(store, "new", 0.2)
    time.sleep(0.3)
    new = acquire(store, "new", 60)
    assert new.number == old.number + 1
    with pytest.raises(ClaimLostError) as lost:
        keeper.extend()
    assert f"run old lost its claim on checkpoint {store.location}: it was taken over by run new" in str(
        lost.value)
    with pytest.raises(ClaimLostError):
        keeper.check()  # and it stays lost
    # The fenced owner's end does not release the new owner's claim.
    with keeper:
        pass
    assert latest_claim(store) == new


def test_a_claim_whose_owner_died_on_this_machine_is_taken_over_at_once(store):
    crashed = acquire(store, "crashed", 3600)
    store.write_claim_file(crashed.number, dataclasses.replace(crashed, pid=_dead_pid()).to_bytes())
    assert latest_claim(store).owner_gone()
    assert acquire(store, "next", 60).number == 2
    # Another machine's process cannot be looked at: its claim holds until it expires.
    elsewhere = dataclasses.replace(latest_claim(store), host="elsewhere", pid=_dead_pid())
    store.write_claim_file(elsewhere.number, elsewhere.to_bytes())
    with pytest.raises(CheckpointClaimedError):
        acquire(store, "third", 60)


def test_a_keeper_extends_its_claim_while_the_run_lives(store):
    claim = acquire(store, "run", 0.4)
    with ClaimKeeper(store, claim):
        time.sleep(1.0)  # more than twice the timeout
        with pytest.raises(CheckpointClaimedError):
            acquire(store, "other", 60)
    assert latest_claim(store).released and latest_claim(store).extended_at > claim.extended_at + 0.5


def test_a_keeper_that_finds_its_claim_lost_stops_the_run(store):
    claim = acquire(store, "run", 0.4)
    stopped = threading.Event()
    with ClaimKeeper(store, claim, on_lost=stopped.set) as keeper:
        force_release(store, "an operator")
        assert stopped.wait(5)
        assert isinstance(keeper.lost, ClaimLostError) and "released by an operator" in str(keeper.lost)


def test_force_release_fences_the_owner_and_keeps_its_progress_mergeable(store, tmp_path, capsys):
    assert main(["release", str(tmp_path / "nothing"), "--force"]) == 4  # ExitCode.REFUSED
    assert "no checkpoint at" in capsys.readouterr().err
    store.save(Checkpoint())
    owner = acquire(store, "owner", 3600)
    assert main(["release", store.location, "--force"]) == 0
    assert f"released the claim of run owner (pid {owner.pid}" in capsys.readouterr().out
    released = latest_claim(store)
    assert released.released and released.released_by.startswith("segack release --force")
    assert released.number == owner.number + 1 and released.run_id == "owner"
    with pytest.raises(ClaimLostError):
        ClaimKeeper(store, owner).check()
    after = acquire(store, "after", 60)
    assert previous_run(store, after) == "owner"
    with ClaimKeeper(store, after):
        pass
    assert main(["release", store.location, "--force"]) == 0
    assert "is not claimed; nothing to do" in capsys.readouterr().out


def test_of_many_runs_claiming_at_once_exactly_one_wins(store):
    winners, refused = [], []
    barrier = threading.Barrier(16)

    def claim(name):
        barrier.wait()
        try:
            winners.append(acquire(store, name, 60))
        except CheckpointClaimedError as error:
            refused.append(error)

    threads = [threading.Thread(target=claim, args=(f"run{n}",)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and len(refused) == 15
    assert all(error.claim.run_id == winners[0].run_id for error in refused)
    assert store.claim_numbers() == [1]


@pytest.mark.parametrize("data", [b"", b"\xff", b"[]", b'{"number": 1}', b'{"number": "1", "run_id": "r", '
                                  b'"host": "h", "pid": 1, "claimed_at": 0, "extended_at": 0, "timeout": 1}'])
def test_a_damaged_claim_is_a_checkpoint_error(store, data):
    store.write_claim_file(1, data)
    damaged = starting(f"claim 1 of checkpoint {store.location} is not a segack claim: ")
    with pytest.raises(CheckpointError, match=damaged):
        acquire(store, "run", 60)
    with pytest.raises(CheckpointError, match=damaged):
        latest_claim(store)


def test_a_claim_file_under_another_number_is_refused(store):
    claim = acquire(store, "run", 60)
    store.write_claim_file(7, claim.to_bytes())
    with pytest.raises(CheckpointError, match="says it is claim 1"):
        latest_claim(store)


@pytest.mark.parametrize("value", [0, -1, True, "60", None, float("nan")])
def test_the_claim_timeout_must_be_a_positive_number(value):
    with pytest.raises(OptionError, match="claim_timeout must be a positive number"):
        check_claim_timeout(value)


def test_a_claim_round_trips_through_its_file():
    claim = Claim(3, "run", "host", 12, 1.5, 2.5, 60.0)
    assert Claim.from_bytes(claim.to_bytes(), "here") == claim


def _task_input(rows):
    import numpy as np
    import pyarrow as pa

    from segack.spark_adapter.worker.task import KG, TIE

    return pa.RecordBatch.from_pydict({"user": [f"u{n % 3}" for n in range(rows)], "ts": list(range(rows)),
                                       KG: np.zeros(rows, np.int32), TIE: np.arange(rows, dtype=np.int64)})


@pytest.mark.parametrize("newer", [False, True], ids=["holding", "fenced"])
def test_a_task_whose_run_was_fenced_stops_at_its_next_flush_and_writes_nothing(store, newer):
    import pyarrow as pa

    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.tokens import KeyGroupTokens
    from segack.spark_adapter.worker.task import TaskPlan, TaskStart, run_task

    claim = acquire(store, "run", 60)
    if newer:
        force_release(store, "an operator")
    calls = []
    plan = TaskPlan(store=store.for_tasks("run", claim.number), handler=calls.append, columns=("user", "ts"),
                    key="user", order="ts", options=RunOptions(flush_every=1, flush_interval=60.0),
                    start=TaskStart.of(KeyGroupTokens.empty(0, pa.null(), pa.null())))
    batches = [_task_input(100), _task_input(100)]
    [result] = run_task(plan, iter(batches))
    if newer:
        # The first flush (after 64 rows) sees the newer claim: no progress file, no more calls.
        assert store.progress_files() == [] and len(calls) == 64
    else:
        assert len(store.progress_files()) == 1 and len(calls) == 200
    assert result.column("handled")[0].as_py() == len(calls)


def test_a_lost_claim_says_how_it_was_lost(store):
    mine = acquire(store, "mine", 60)
    gone = ClaimLostError(store.location, mine, None)
    assert str(gone) == (f"run mine lost its claim on checkpoint {store.location}: it is gone; this run "
                         f"stopped and saved nothing more") and gone.newer is None
    taken = dataclasses.replace(mine, number=2, run_id="other")
    lost = ClaimLostError(store.location, mine, taken)
    assert f"it was taken over by {taken.owner()};" in str(lost) and lost.newer == taken
    released = dataclasses.replace(taken, released=True, released_by="an operator")
    assert ": it was released by an operator; " in str(ClaimLostError(store.location, mine, released))


def test_the_first_claim_has_no_previous_run_and_the_previous_claim_must_be_readable(store):
    first = acquire(store, "first", 60)
    assert previous_run(store, first) is None
    assert previous_run(store, dataclasses.replace(first, number=0)) is None
    with ClaimKeeper(store, first):
        pass
    second = acquire(store, "second", 60)
    store.write_claim_file(1, b"junk")
    with pytest.raises(CheckpointError, match=starting("the previous claim is not a segack claim")):
        previous_run(store, second)
    store.delete_claim_files([1])
    assert previous_run(store, second) is None


def test_a_forced_release_is_dated_now_and_refused_if_someone_claimed_meanwhile(store, monkeypatch):
    owner = acquire(store, "owner", 3600)
    time.sleep(0.01)
    force_release(store, "an operator")
    assert latest_claim(store).extended_at > owner.extended_at
    owner = acquire(store, "again", 3600)
    monkeypatch.setattr(store, "create_claim_file", lambda number, data: False)
    with pytest.raises(CheckpointError, match=exactly(
            f"checkpoint {store.location} was claimed again while it was being released")):
        force_release(store, "an operator")


def test_a_forced_release_of_a_named_claim_releases_only_that_one(store):
    with pytest.raises(CheckpointError, match=exactly(
            f"claim 1 is no longer the newest of checkpoint {store.location} (it is no claim): nothing "
            f"released")):
        force_release(store, "the page", 1)
    assert store.claim_numbers() == []
    owner = acquire(store, "owner", 3600)
    with pytest.raises(CheckpointError, match=exactly(
            f"claim 2 is no longer the newest of checkpoint {store.location} (it is claim 1, "
            f"{owner.owner()}'s): nothing released")):
        force_release(store, "the page", 2)
    assert latest_claim(store) == owner
    assert force_release(store, "the page", 1) == owner
    assert latest_claim(store).released and latest_claim(store).released_by == "the page"
    assert force_release(store, "the page", 2) is None  # released already: nothing to do


@pytest.mark.parametrize("value", [0.5, 1, 1e-3])
def test_a_claim_timeout_below_a_second_is_fine(value):
    assert check_claim_timeout(value) == value


def test_a_keeper_stops_extending_once_its_claim_is_lost(store):
    claim = acquire(store, "run", 60)
    lost = threading.Event()
    keeper = ClaimKeeper(store, claim, on_lost=lost.set)
    force_release(store, "an operator")
    assert keeper.tick() is True and lost.is_set()
    # An unreachable store is no reason to stop: the claim holds until it expires.
    other = acquire(store, "other", 60)
    keeper = ClaimKeeper(store, other)

    def unreachable(*args):
        raise OSError("the store is unreachable")

    store.write_claim_file = unreachable
    assert keeper.tick() is False


def test_a_keeper_whose_claim_file_cannot_be_read_stops_as_if_lost_and_says_why(store, caplog):
    claim = acquire(store, "run", 60)
    lost = threading.Event()
    keeper = ClaimKeeper(store, claim, on_lost=lost.set)
    store.write_claim_file(claim.number, b"{\"torn")
    assert keeper.tick() is True and lost.is_set()
    [record] = [record for record in caplog.records if record.levelname == "ERROR"]
    assert record.getMessage().startswith(f"{store.location}: cannot tell whether run run still holds its "
                                          f"claim: claim {claim.number} of checkpoint")


@pytest.mark.parametrize(("timeout", "interval"), [(8.0, 2.0), (20.0, 5.0), (60.0, 5.0)])
def test_a_keeper_extends_four_times_per_timeout_at_most_every_five_seconds_on_a_named_daemon_thread(
        store, timeout, interval):
    claim = acquire(store, "run-a", timeout)
    keeper = ClaimKeeper(store, claim)
    assert keeper.interval == interval
    with keeper:
        (thread,) = [thread for thread in threading.enumerate() if thread.name == "segack-claim"]
        assert thread.daemon


def test_periodic_work_runs_on_a_named_daemon_thread_until_its_block_ends():
    from segack.spark_adapter.store.periodic import Periodic

    ticks = threading.Semaphore(0)

    class Ticks(Periodic):
        def tick(self):
            ticks.release()
            return False

    with Ticks(0.01, "segack-test-ticks"):
        (thread,) = [thread for thread in threading.enumerate() if thread.name == "segack-test-ticks"]
        assert thread.daemon and ticks.acquire(timeout=10) and ticks.acquire(timeout=10)
    assert not thread.is_alive()


def test_a_claim_is_live_until_exactly_its_timeout_and_a_refusal_names_the_checkpoint(store):
    elsewhere = Claim(1, "r", "another-host", 1, 100.0, 100.0, 30.0)
    assert elsewhere.live(129.9) and not elsewhere.live(130.0)
    acquire(store, "first", 60)
    with pytest.raises(CheckpointClaimedError, match=f"^checkpoint {store.location} is claimed by run first"):
        acquire(store, "second", 60)


def test_an_owner_on_this_machine_is_gone_once_its_process_has_ended_and_is_left_alone_meanwhile():
    import socket

    # (a hang-up would end it, even where the test runs under nohup)
    process = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                "signal.signal(signal.SIGHUP, signal.SIG_DFL); time.sleep(60)"])
    time.sleep(0.5)
    try:
        claim = Claim(1, "r", socket.gethostname(), process.pid, 0.0, 0.0, 30.0)
        assert not claim.owner_gone()
        time.sleep(0.2)
        assert process.poll() is None  # looked at, not signalled
    finally:
        process.kill()
        process.wait()
    assert claim.owner_gone()


def test_a_file_in_the_claims_folder_without_the_json_suffix_is_no_claim(store):
    acquire(store, "first", 60)
    with open(store.files.path("claims", "7"), "wb") as stray:
        stray.write(b"{}")
    assert store.claim_numbers() == [1]


def test_a_released_claim_records_when_it_was_released(store):
    claim = acquire(store, "first", 60)
    with ClaimKeeper(store, claim):
        before = time.time()
    released = latest_claim(store)
    assert released.released and released.extended_at >= before


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_task_whose_run_is_taken_over_stops_calling_the_handler_within_a_tenth_of_a_second(
        store, concurrency):
    import pyarrow as pa

    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.tokens import KeyGroupTokens
    from segack.spark_adapter.worker.task import TaskPlan, TaskStart, run_task

    claim = acquire(store, "run", 60)
    calls = []
    fenced_at = []

    def handle(event):
        calls.append(event["ts"])
        if len(calls) == 100:
            force_release(store, "an operator")  # a newer claim: the run is fenced
            fenced_at.append(time.monotonic())
        time.sleep(0.002)

    # No flush would come for a minute or a million events: only the looks at the fence stop it.
    options = RunOptions.from_keywords({"flush_every": 1_000_000, "flush_interval": 60.0,
                                        "concurrency": concurrency})
    plan = TaskPlan(store=store.for_tasks("run", claim.number), handler=handle, columns=("user", "ts"),
                    key="user", order="ts", options=options,
                    start=TaskStart.of(KeyGroupTokens.empty(0, pa.null(), pa.null())))
    [result] = run_task(plan, iter([_task_input(1000)]))
    # 0.1 s of 2 ms calls is 50, looked at every 64 events, with the calls in flight.
    assert 100 <= len(calls) < 100 + 64 * 3 + concurrency and fenced_at
    assert store.progress_files() == [] and result.column("handled")[0].as_py() <= len(calls)


def test_a_stopped_dispatcher_starts_no_more_calls_and_closes_once_those_in_flight_end():
    from segack.spark_adapter.worker.dispatch import Dispatcher

    release = threading.Event()
    calls = []

    def handle(event):
        calls.append(event["row"])
        release.wait(10)

    dispatcher = Dispatcher(handle, lambda event: event["row"], concurrency=2, max_pending=10)
    for row in range(5):
        assert dispatcher.offer({"row": row})
    dispatcher.stop()
    release.set()
    assert dispatcher.drain(10)
    dispatcher.close()
    assert sorted(calls) == [0, 1] and dispatcher.committed_rows == 2


@pytest.mark.streams
def test_a_stream_taken_over_while_its_query_waits_stops_at_once_and_records_nothing_more(
        spark, tmp_path, caplog):
    """Issue 54, case 8: a paused run's claim lapses and another run takes the checkpoint over while
    the query waits for input (no micro-batch runs for on_lost to interrupt): the query stops and
    the stream raises ClaimLostError, with no new file arriving."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from segack.spark_adapter import StopRequest, stream
    from tests.spark_handlers import discard

    caplog.set_level(logging.INFO, logger="segack")
    source = tmp_path / "source"
    source.mkdir()
    table = pa.table({"user": ["a", "b", "a"], "ts": [1, 2, 3]})
    pq.write_table(table, source / "part-0.parquet")
    events = spark.readStream.schema(spark.createDataFrame(table.slice(0, 1)).schema).parquet(str(source))
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    stop, batches, ended = StopRequest(), threading.Event(), []

    def run():
        try:
            ended.append(stream(events, key="user", order="ts", handler=discard, checkpoint=store.location,
                                trigger="1s", stop=stop, progress=lambda report: batches.set(),
                                segments=2, claim_timeout=3))
        except BaseException as error:
            ended.append(error)

    streaming = threading.Thread(target=run, daemon=True)
    streaming.start()
    try:
        assert batches.wait(120), ended
        # The owner paused past its timeout, as another run sees it: its claim lapsed, and is taken.
        deadline = time.monotonic() + 30
        while True:
            owner = latest_claim(store)
            store.write_claim_file(owner.number, dataclasses.replace(owner, extended_at=0.0).to_bytes())
            try:
                taker = acquire(store, "taker", 60)
                break
            except CheckpointClaimedError:  # the owner extended it in between
                assert time.monotonic() < deadline
        states = sorted(path.name for path in (tmp_path / "checkpoint").iterdir() if path.is_file())
        streaming.join(30)
        assert not streaming.is_alive(), "the stream still runs 30 s after it lost its claim"
        [error] = ended
        assert isinstance(error, ClaimLostError), error
        assert (f"run {owner.run_id} lost its claim on checkpoint {store.location}: it was taken over by "
                f"run taker") in str(error)
        assert f"segack {store.location}" not in [query.name for query in spark.streams.active]
        # Nothing recorded after the take-over, and the new owner's claim stands.
        assert sorted(path.name for path in (tmp_path / "checkpoint").iterdir() if path.is_file()) == states
        assert latest_claim(store) == taker
        assert "the claim was lost: the stream ends at once" in caplog.messages
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    finally:
        stop.set()
        stop.set()
        streaming.join(60)
        for query in spark.streams.active:
            if query.name == f"segack {store.location}":
                query.stop()
