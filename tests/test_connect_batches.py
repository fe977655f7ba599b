"""A stream over Spark Connect, without Spark: what its ``foreachBatch`` function
(:class:`~segack.spark_adapter.coordinator.connect_batches.ServerBatches`) carries to the server,
and what reaches the client through the checkpoint (a stop, a failure, a claim lost or expired).
``tests/test_clusters.py`` runs the streams against a real Connect server."""

from __future__ import annotations

import pytest

from segack.spark_adapter.store.checkpoint import CheckpointStore


def test_over_spark_connect_a_stop_and_a_failure_reach_the_client_through_the_checkpoint(tmp_path):
    """The function Spark Connect pickles to the server holds none of the client's objects; a stop the
    client asks is read by the server's next micro-batch, whose refusal the client reads back as the
    stop it is; a later run starts with neither."""
    import threading

    from pyspark import cloudpickle

    from segack.spark_adapter.coordinator.connect_batches import ServerBatches
    from segack.spark_adapter.coordinator.query_watch import StoppedError
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
