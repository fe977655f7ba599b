"""A checkpoint's Prometheus metrics: what a run's driver serves with ``metrics_port``
(``--metrics-port``), and :func:`~segack.spark_adapter.serve_metrics` for any checkpoint.

Each scrape reads the checkpoint as ``segack status`` does (its state, the progress files its
live run has not merged yet, its claim and its dead letters) and writes nothing: the numbers are
as of the tasks' last flush (``flush_interval``). Rates are Prometheus' to compute from the
counters (``rate(segack_events_done_total[1m])``). Names follow Prometheus' conventions: base units,
``_total`` for counters, ``_seconds`` for durations; :doc:`/operations` lists them with a query each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from segack.spark_adapter.console.snapshot import Snapshot
from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.store.checkpoint import CheckpointStore

__all__ = ["CheckpointCollector", "MetricsServer", "parse_address", "serve_metrics"]

log = logging.getLogger(__name__)

#: Where :func:`serve_metrics` listens when given a port alone: this machine only.
DEFAULT_HOST = "127.0.0.1"


def parse_address(address: int | str) -> tuple[str, int]:
    """``(host, port)`` of ``PORT`` or ``HOST:PORT`` (an int: a port on :data:`DEFAULT_HOST`); an
    :class:`~segack.spark_adapter.OptionError` for anything else, or a port outside 0..65535
    (0: any free port)."""
    if isinstance(address, bool) or not isinstance(address, (int, str)):
        raise OptionError(f"metrics_port must be PORT or HOST:PORT, not {address!r}")
    host, _, port_text = str(address).rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise OptionError(f"metrics_port must be PORT or HOST:PORT with a port in 0..65535, not {address!r}")
    return host, int(port_text)


class CheckpointCollector(Collector):
    """The metrics of the checkpoint at ``store``, read afresh on each scrape (a
    :class:`prometheus_client.registry.Collector`)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.read_errors = 0

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = Snapshot.read(self.store)
        except Exception as error:  # a scrape reports it; the run goes on
            self.read_errors += 1
            log.warning("metrics: could not read checkpoint %s: %s", self.store.location, error)
            snapshot = None
        errors = CounterMetricFamily("segack_checkpoint_read_errors", "Scrapes that could not read the "
                                     "checkpoint (the log says why).")
        errors.add_metric([], self.read_errors)
        yield errors
        if snapshot is None:
            return
        yield from self._run(snapshot)
        yield from self._segments(snapshot)
        yield from self._stream(snapshot.stream)
        yield from self._partitions(snapshot)

    def _run(self, snapshot: Snapshot) -> Iterator[Metric]:
        settings, claim = snapshot.state.settings, snapshot.claim
        info = GaugeMetricFamily("segack_run_info", "The checkpoint's run: 1, with what it is as labels.",
                                 labels=["checkpoint", "kind", "state", "run"])
        info.add_metric([self.store.location, snapshot.kind, snapshot.condition,
                         claim.run_id if claim is not None else ""], 1)
        yield info
        done = snapshot.events_done
        yield _counter("segack_events_done", "Events done: handled, or set aside as dead letters.", done)
        yield _counter("segack_events_handled", "Events the handler has handled.",
                       max(done - snapshot.dead_letters, 0))
        yield _gauge("segack_dead_letters", "Events set aside as dead letters now.", snapshot.dead_letters)
        yield _counter("segack_handler_retries", "Handler calls made again after a call raised (retries, "
                       "and the parts of a list narrowed to find its failing event), as of the last merge.",
                       snapshot.retries)
        if snapshot.input_events is not None:
            yield _gauge("segack_input_events", "Events in the replay's input, once a run has counted them.",
                         snapshot.input_events)
        yield _gauge("segack_handler_calls_in_flight", "Handler calls running in the live run's tasks.",
                     snapshot.in_flight)
        yield _gauge("segack_events_pending", "Events the live run's tasks have read and not committed "
                     "(in flight, or waiting behind an earlier event of their key).", snapshot.pending)
        now = snapshot.at
        if "updated_at" in settings:
            yield _gauge("segack_flush_age_seconds", "Seconds since the run last saved the checkpoint.",
                         max(now - float(settings["updated_at"]), 0.0))
        if claim is not None and snapshot.live:
            yield _gauge("segack_claim_age_seconds", "Seconds since the live run claimed the checkpoint.",
                         max(now - claim.claimed_at, 0.0))
            yield _gauge("segack_claim_extension_age_seconds", "Seconds since the live run last extended "
                         "its claim (another run may take over past the timeout).",
                         max(now - claim.extended_at, 0.0))
            yield _gauge("segack_claim_timeout_seconds", "The live run's claim timeout.", claim.timeout)

    @staticmethod
    def _segments(snapshot: Snapshot) -> Iterator[Metric]:
        segments = snapshot.segments()
        if not segments:
            return
        labels = ["segment", "segment_id", "mask"]
        done = CounterMetricFamily("segack_segment_events_done", "Events done in the segment's key groups "
                                   "(a stream: in its current micro-batch).", labels=labels)
        load = GaugeMetricFamily("segack_segment_events", "Events of the segment's key groups in the input "
                                 "(its load), once counted.", labels=labels)
        groups = GaugeMetricFamily("segack_segment_key_groups", "Key groups the segment owns.", labels=labels)
        for segment in segments:
            names = [str(segment.position), str(segment.segment_id), str(segment.mask)]
            done.add_metric(names, segment.done)
            groups.add_metric(names, segment.key_groups)
            if segment.load is not None:
                load.add_metric(names, segment.load)
        yield done
        yield groups
        if segments[0].load is not None:
            yield load
        yield _gauge("segack_segments", "Segments the run goes over.", len(segments))

    @staticmethod
    def _stream(stream: dict[str, Any] | None) -> Iterator[Metric]:
        if not stream:
            return
        last = stream.get("last_batch") or {}
        yield _gauge("segack_stream_completed_batch", "The id of the last micro-batch complete in the "
                     "checkpoint (-1: none yet).", int(stream.get("completed_batch", -1)))
        if last.get("seconds") is not None:
            yield _gauge("segack_stream_batch_duration_seconds", "How long the last reported micro-batch "
                         "took, as Spark measured it.", float(last["seconds"]))
        partitions = stream.get("partitions") or []
        if not partitions:
            return
        labels = ["topic", "partition"]
        offsets = GaugeMetricFamily("segack_kafka_next_offset", "The next offset to read of each "
                                    "topic-partition: every record below it is done (as of the last "
                                    "complete micro-batch).", labels=labels)
        ends = GaugeMetricFamily("segack_kafka_end_offset", "Each topic-partition's end offset (the "
                                 "offset its next record gets), as the run last read it from the broker "
                                 "(every few seconds) or Spark last reported it.", labels=labels)
        lags = GaugeMetricFamily("segack_kafka_lag_records", "Records of each topic-partition written but "
                                 "not done yet: its end offset less its next offset.", labels=labels)
        committed = GaugeMetricFamily("segack_kafka_committed_offset", "The offset of each topic-partition "
                                      "committed to the consumer group (--commit-offsets-to).", labels=labels)
        told = {(str(topic), int(partition)): int(end)
                for topic, partition, end in stream.get("group_offsets", [])}
        for topic, partition, end, latest in partitions:
            names = [topic, str(partition)]
            offsets.add_metric(names, end)
            if latest is not None:
                ends.add_metric(names, latest)
                lags.add_metric(names, max(latest - end, 0))
            if (topic, partition) in told:
                committed.add_metric(names, told[(topic, partition)])
        yield offsets
        yield ends
        yield lags
        if stream.get("commit_offsets_to"):
            yield committed
        if stream.get("ends_at") is not None:
            yield _gauge("segack_kafka_end_offsets_timestamp_seconds", "When the run last read the "
                         "topic-partitions' end offsets from the broker (Unix time).",
                         float(stream["ends_at"]))


    @staticmethod
    def _partitions(snapshot: Snapshot) -> Iterator[Metric]:
        """A real-time stream's partitions, as their tasks last saved them (every commit interval)."""
        if not snapshot.partitions:
            return
        settings, labels = snapshot.state.settings, ["topic", "partition"]
        offsets = GaugeMetricFamily("segack_kafka_next_offset", "The offset of each topic-partition below "
                                    "which every record is done.", labels=labels)
        ends = GaugeMetricFamily("segack_kafka_end_offset", "Each topic-partition's end offset, as the "
                                 "run's consumer last heard it.", labels=labels)
        lags = GaugeMetricFamily("segack_kafka_lag_records", "Records of each topic-partition written but "
                                 "not done yet: its end offset less its next offset.", labels=labels)
        pending = GaugeMetricFamily("segack_kafka_pending_records", "Records of each topic-partition read "
                                    "and not yet done by the live run (a real-time stream): one far behind "
                                    "the others holds the run back.", labels=labels)
        for partition in snapshot.partitions:
            names = [str(partition.topic or settings.get("topic")), str(partition.partition)]
            offsets.add_metric(names, partition.next_offset)
            pending.add_metric(names, partition.pending if snapshot.live else 0)  # a dead run's is not work
            if partition.end is not None and partition.lag is not None:
                ends.add_metric(names, partition.end)
                lags.add_metric(names, partition.lag)
        yield from (offsets, ends, lags, pending)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


class MetricsServer:
    """An HTTP server of a checkpoint's metrics in Prometheus' text format, on its own thread until
    :meth:`~segack.spark_adapter.MetricsServer.close` (or the end of a ``with`` block)."""

    def __init__(self, store: CheckpointStore, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(CheckpointCollector(store))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise OptionError(f"metrics_port: cannot serve metrics on {host}:{port}: "
                              f"{error.strerror or error}") from None
        #: Where it listens: the port is the one chosen when asked for port 0.
        self.host, self.port = host, int(self._server.server_address[1])
        log.info("serving the metrics of %s on http://%s:%d/metrics", store.location, host, self.port)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve_metrics(checkpoint: str | CheckpointStore, address: int | str) -> MetricsServer:
    """Serve the metrics of ``checkpoint`` on ``http://HOST:PORT/metrics`` until the returned
    server is closed (use it as a context manager).

    Parameters
    ----------
    checkpoint : str or CheckpointStore
        Any checkpoint location segack reads, with a run under way or not.
    address : int or str
        ``PORT`` (on 127.0.0.1) or ``HOST:PORT``; port 0 picks a free one (``server.port``).

    Raises
    ------
    OptionError
        An address that is not one, or one that cannot be listened on (in use, say).
    """
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    host, port = parse_address(address)
    return MetricsServer(store, host, port)
