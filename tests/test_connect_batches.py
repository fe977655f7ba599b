"""A stream over Spark Connect, without Spark: what its ``foreachBatch`` function
(:class:`~segack.spark_adapter.coordinator.connect_batches.ServerBatches`) carries to the server,
and what reaches the client through the checkpoint (a stop, one past its timeout, a failure, a claim
lost or expired).
``tests/test_clusters.py`` runs the streams against a real Connect server."""

from __future__ import annotations

import threading

import pytest

from segack.spark_adapter.store.checkpoint import CheckpointStore


def test_over_spark_connect_a_stop_and_a_failure_reach_the_client_through_the_checkpoint(tmp_path):
    """The function Spark Connect pickles to the server holds none of the client's objects; a stop the
    client asks is read by the server's next micro-batch, whose refusal the client reads back as the
    stop it is; a later run starts with neither."""
    from pyspark import cloudpickle

    from segack.spark_adapter.coordinator.connect_batches import ServerBatches
    from segack.spark_adapter.coordinator.state import StoppedError
    from segack.spark_adapter.coordinator.streaming import BatchReplay
    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    options = RunOptions.from_keywords({}, handler=print, streams=True, caller="stream")
    replay = BatchReplay(print, "key", "offset", store, options)
    with ClaimKeeper(store, acquire(store, "r1", 60)) as keeper:
        client = ServerBatches(replay, keeper, "group", {"bootstrap.servers": "127.0.0.1:9"})
        client.clear()
        server = cloudpickle.loads(cloudpickle.dumps(client))
        assert server.keeper is None and server.claim == keeper.claim and client.error is None

        class Query:
            isActive, status, stopped = True, {"isTriggerActive": False}, False

            def stop(self):
                self.stopped = True

        query = Query()
        client.stop_when_idle(query, threading.Event())
        assert query.stopped and not client.interrupted
        with pytest.raises(StoppedError, match="batch 7 not started: the stream was asked to stop"):
            server(None, 7)
        assert isinstance(client.error, StoppedError)
        ServerBatches(replay, keeper, "group", {}).clear()  # the next run's start
        assert ServerBatches(replay, keeper, "group", {}).error is None


def test_over_spark_connect_a_batch_refuses_a_claim_expired_or_lost_and_its_failure_is_its_runs(tmp_path):
    """A client killed leaves its query on the server: its next micro-batch refuses to run once the
    claim has expired, or is another run's; the failure it records (a ClaimLostError, pickled) reaches
    its own client whole, and is no other run's."""
    import time

    from pyspark import cloudpickle

    from segack.spark_adapter import ClaimLostError, ReplayError
    from segack.spark_adapter.coordinator.connect_batches import ServerBatches
    from segack.spark_adapter.coordinator.streaming import BatchReplay
    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    options = RunOptions.from_keywords({}, handler=print, streams=True, caller="stream")
    replay = BatchReplay(print, "key", "offset", store, options)
    keeper = ClaimKeeper(store, acquire(store, "r1", 0.5))  # never started: nothing extends the claim
    client = ServerBatches(replay, keeper, None, None)
    server = cloudpickle.loads(cloudpickle.dumps(client))
    time.sleep(0.6)
    with pytest.raises(ReplayError, match="expired unextended: its client is gone"):
        server(None, 3)
    assert "expired unextended" in str(client.error)
    later = ClaimKeeper(store, acquire(store, "r2", 60))
    with pytest.raises(ClaimLostError, match="run r1 lost its claim"):
        server(None, 4)
    found = ServerBatches(replay, keeper, None, None).error
    assert isinstance(found, ClaimLostError) and found.newer.run_id == "r2"
    assert ServerBatches(replay, later, None, None).error is None  # r1's failure is not r2's


def test_a_stop_past_its_timeout_ends_the_micro_batch_under_way_through_the_checkpoint(tmp_path):
    """Past ``stop_timeout``, the client asks through the checkpoint that the micro-batch under way
    end early; the server's look finds the request and passes it to the replay's early stop, whose
    job's tasks then find their stop request. A later run starts with none of it."""
    import math

    from pyspark import cloudpickle

    from segack.spark_adapter.coordinator.connect_batches import ServerBatches, _EarlyStopLook
    from segack.spark_adapter.coordinator.query_watch import timed_out
    from segack.spark_adapter.coordinator.streaming import BatchReplay
    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    options = RunOptions.from_keywords({}, handler=print, streams=True, caller="stream")
    with ClaimKeeper(store, acquire(store, "r1", 60)) as keeper:
        client = ServerBatches(BatchReplay(print, "key", "offset", store, options), keeper, None, {}, 0.5)
        server = cloudpickle.loads(cloudpickle.dumps(client))
        look = _EarlyStopLook(store, server.early_id, server.replay.early_stop)
        assert not look.tick() and server.replay.early_stop.reason is None  # nothing asked yet

        class Query:
            """A micro-batch that runs until its tasks are asked to end early."""

            isActive, stopped = True, False

            @property
            def status(self):
                return {"isTriggerActive": store.stop_reason(client.early_id) is None}

            def stop(self):
                self.stopped = True

        query = Query()
        client.stop_when_idle(query, threading.Event())
        assert query.stopped and not client.interrupted
        assert look.tick() and server.replay.early_stop.reason == timed_out(0.5)
        with server.replay.early_stop.job(store, "r1-b3"):
            assert store.stop_reason("r1-b3") == timed_out(0.5)
        client.clear()
        assert store.stop_reason(client.early_id) is None
        never = ServerBatches(BatchReplay(print, "key", "offset", store, options), keeper, None, {}, math.inf)
        assert never.stop_timeout == math.inf


def test_an_early_stop_reaches_the_job_under_way_and_any_later_one_and_travels_pickled(tmp_path):
    import pickle

    from segack.spark_adapter.coordinator.state import EarlyStop

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    early = EarlyStop()
    with early.job(store, "job-1"):
        assert store.stop_reason("job-1") is None
        early.ask("asked while it ran")
        assert store.stop_reason("job-1") == "asked while it ran"
    early.ask("asked again")  # the first reason stays, and no job runs: nothing written
    assert early.reason == "asked while it ran" and store.stop_reason("job-2") is None
    with early.job(store, "job-2"):  # a job started once it was asked: its tasks stop at their start
        assert store.stop_reason("job-2") == "asked while it ran"
    travelled = pickle.loads(pickle.dumps(early))
    assert travelled.reason == "asked while it ran"
    with travelled.job(store, "job-3"):
        assert store.stop_reason("job-3") == "asked while it ran"


@pytest.mark.parametrize("given", [0, -1, float("nan"), True, "20", [20]])
def test_a_stop_timeout_that_is_not_a_positive_number_of_seconds_is_refused(given):
    import math

    from segack.spark_adapter import OptionError
    from segack.spark_adapter.coordinator.query import check_stop_timeout

    with pytest.raises(OptionError, match=r"stop_timeout must be a positive number of seconds or None, not "):
        check_stop_timeout(given)
    for allowed in (None, 0.5, 20, math.inf):
        check_stop_timeout(allowed)


def test_an_early_stop_whose_request_could_not_be_written_writes_it_when_asked_again(tmp_path):
    from segack.spark_adapter.coordinator.state import EarlyStop
    from tests.memory_files import MemoryFiles

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    store.files = MemoryFiles()
    early = EarlyStop()
    with early.job(store, "job-1"):
        store.files.failing.append("write")  # the store out of reach for a moment
        early.ask("the stop timeout")
        assert early.reason == "the stop timeout" and store.stop_reason("job-1") is None
        early.ask("the stop timeout")  # the watcher's next look
        assert store.stop_reason("job-1") == "the stop timeout"
