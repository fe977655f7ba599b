"""The Prometheus metrics of a checkpoint: served by a run's driver (``--metrics-port``) while it
goes on, and by :func:`~segack.spark_adapter.serve_metrics` for any checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from segack.cli import ExitCode, main
from segack.spark_adapter import OptionError, replay, serve_metrics
from segack.spark_adapter.console.metrics import parse_address
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
USERS, PER_USER = 20, 100


def scrape(port: int, token: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Each sample of ``/metrics`` on ``port``, by name, parsed by Prometheus' own parser; with
    ``token``, asked as Prometheus asks with a bearer token."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def sample_value(samples, name):
    [(_, found)] = samples[name]
    return found


def _events():
    """USERS users with PER_USER events each, seq 0.. in ts order, the rows shuffled."""
    rows = [(f"u{user}", seq, seq * USERS + user) for seq in range(PER_USER) for user in range(USERS)]
    rows = rows[::-1]
    return pa.table({"user": [r[0] for r in rows], "seq": [r[1] for r in rows], "ts": [r[2] for r in rows]})


@pytest.mark.spark
def test_a_run_serves_its_metrics_while_it_goes_on_and_they_add_up_to_its_input(tmp_path):
    pq.write_table(_events(), tmp_path / "events.parquet")
    total = USERS * PER_USER
    set_aside = PER_USER - 10  # u1's tenth event is refused; its later ones wait behind it
    port = free_port()
    checkpoint = tmp_path / "checkpoint"
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--handler", "tests.spark_handlers:slow_refusing_tenth", "--checkpoint",
               str(checkpoint), "--segments", "3", "--key-group-bits", "8", "--concurrency", "2",
               "--on-error", "dead-letter", "--retries", "2", "--flush-interval", "0.2",
               "--claim-timeout", "45", "--metrics-port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    scrapes = []
    while process.poll() is None:
        with contextlib.suppress(urllib.error.URLError, ConnectionError):  # not serving yet, or no more
            scrapes.append(scrape(port))
        time.sleep(0.1)
    _, err = process.communicate()
    assert process.returncode == ExitCode.DEAD_LETTERS, err
    running = [samples for samples in scrapes
               if [labels["state"] for labels, _ in samples.get("segack_run_info", [])] == ["running"]]
    assert running, f"no scrape saw the run under way ({len(scrapes)} scrapes)"
    done = [sample_value(samples, "segack_events_done_total") for samples in running]
    assert done == sorted(done) and done[0] >= 0 and done[-1] <= total
    assert any(0 < count < total for count in done), done
    assert max(sample_value(samples, "segack_handler_calls_in_flight") for samples in running) >= 1
    for samples in running:
        assert sample_value(samples, "segack_handler_calls_in_flight") <= 3 * 2  # segments x concurrency
        assert sample_value(samples, "segack_segments") == 3
        assert sample_value(samples, "segack_claim_timeout_seconds") == 45
        assert 0 <= sample_value(samples, "segack_claim_extension_age_seconds") < 45
        assert sum(found for _, found in samples["segack_segment_key_groups"]) == 2 ** 8
    # The run's server ended with it.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port)

    with serve_metrics(str(checkpoint), 0) as server:
        after = scrape(server.port)
    [(labels, _)] = after["segack_run_info"]
    assert labels["state"] == "dead_letters_left" and labels["kind"] == "replay"
    assert labels["checkpoint"] == str(checkpoint)
    assert sample_value(after, "segack_events_done_total") == total
    assert sample_value(after, "segack_input_events") == total
    assert sample_value(after, "segack_dead_letters") == set_aside
    assert sample_value(after, "segack_events_handled_total") == total - set_aside
    assert sample_value(after, "segack_handler_retries_total") == 2  # u1's tenth event, twice more
    retries = [sample_value(samples, "segack_handler_retries_total") for samples in running]
    assert retries == sorted(retries) and retries[-1] <= 2
    assert sample_value(after, "segack_handler_calls_in_flight") == 0
    assert sample_value(after, "segack_events_pending") == 0
    assert "segack_claim_age_seconds" not in after  # no run holds it
    per_segment = after["segack_segment_events_done_total"]
    assert sorted(labels["segment"] for labels, _ in per_segment) == ["0", "1", "2"]
    assert sum(found for _, found in per_segment) == total
    assert sum(found for _, found in after["segack_segment_events"]) == total
    assert sample_value(after, "segack_checkpoint_read_errors_total") == 0


def test_a_metrics_port_in_use_refuses_the_run_before_it_claims_anything(spark, tmp_path):
    events = spark.createDataFrame(_events().to_pandas())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OptionError, match=f"metrics_port: cannot serve metrics on 127.0.0.1:{port}: "):
            replay(events, key="user", order="ts", handler=print, checkpoint=str(tmp_path / "ck"),
                   metrics_port=port, segments=2)
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("address", ["70000", "host:", "nine", "-1", "[::1]:99999"])
def test_a_metrics_address_that_is_not_one_is_refused_naming_the_flag(address, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(tmp_path / "in.parquet"), "--key", "k", "--order", "o", "--handler", "m:f",
              "--checkpoint", str(tmp_path / "ck"), "--metrics-port", address])
    assert exited.value.code == ExitCode.USAGE
    refusal = "argument --metrics-port: must be PORT or HOST:PORT with a port in 0..65535"
    assert refusal in capsys.readouterr().err
    assert not (tmp_path / "ck").exists()


def test_addresses_name_a_port_on_loopback_unless_a_host_is_given():
    assert parse_address(9464) == ("127.0.0.1", 9464)
    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:80") == ("::1", 80)
    for wrong in (True, 9.5, None, 65536):
        with pytest.raises(OptionError):
            parse_address(wrong)


def test_a_place_with_no_checkpoint_serves_only_its_read_errors(tmp_path):
    with serve_metrics(str(tmp_path / "nothing"), 0) as server:
        samples = scrape(server.port)
    assert set(samples) == {"segack_checkpoint_read_errors_total"}


def _real_time_checkpoint(path):
    """A real-time stream's checkpoint: its settings, and two partitions' progress as tasks save it."""
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore

    store = CheckpointStore(str(path))
    store.save(Checkpoint({"mode": "real-time", "topic": "accounts", "key": "key", "order": "offset",
                           "updated_at": time.time(), "status": "stopped"}), 1)
    for partition, (next_offset, end, pending) in enumerate([(120, 130, 10), (80, 80, 0)]):
        lease, _ = store.partitions.take_over(partition, {"run": "r", "claim": 1, "attempt": "a"}, {})
        store.partitions.save(lease, {"next": next_offset, "read": next_offset + pending, "end": end,
                                      "pending": pending, "done": [], "handled_total": next_offset,
                                      "claim": 1})
    return store


def test_a_real_time_streams_partitions_are_served_with_the_records_each_holds_pending(tmp_path):
    with serve_metrics(_real_time_checkpoint(tmp_path / "real-time"), 0) as server:
        samples = scrape(server.port)
    by_partition = {name: {labels["partition"]: value for labels, value in samples[name]}
                    for name in ("segack_kafka_next_offset", "segack_kafka_lag_records",
                                 "segack_kafka_pending_records")}
    assert by_partition == {"segack_kafka_next_offset": {"0": 120, "1": 80},
                            "segack_kafka_lag_records": {"0": 10, "1": 0},
                            "segack_kafka_pending_records": {"0": 0, "1": 0}}  # no live run: none pending
    assert sample_value(samples, "segack_events_done_total") == 200
    [(labels, _)] = samples["segack_run_info"]
    assert labels["kind"] == "real-time" and labels["state"] == "stopped"


def test_every_family_served_is_documented_and_has_a_grafana_panel(tmp_path):
    """The families a replay's checkpoint and a live Kafka stream's serve, the operations guide's
    table and the sample Grafana dashboard's queries name the same metrics."""
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire
    from tests.test_rescale import _checkpoint

    replay = _checkpoint(tmp_path / "replay", bits=4, counts=[5] * 16)
    stream = _checkpoint(tmp_path / "stream", bits=4, counts=[5] * 16)
    claim = acquire(stream, "r2", 60)
    served = set()
    with ClaimKeeper(stream, claim) as keeper:
        state = stream.load()
        state.settings.update(updated_at=time.time(), handler_retries=3, stream={
            "completed_batch": 4, "last_batch": {"id": 4, "seconds": 1.5, "at": time.time()},
            "partitions": [["accounts", 0, 120, 130], ["accounts", 1, 80, 80]], "ends_at": time.time(),
            "commit_offsets_to": "accounts-group",
            "group_offsets": [["accounts", 0, 120], ["accounts", 1, 70]]})
        keeper.save(state)
        for store in (replay, stream, _real_time_checkpoint(tmp_path / "real-time")):
            with serve_metrics(store, 0) as server:
                served |= {name.removesuffix("_created") for name in scrape(server.port)}
    rows = re.findall(r"^   \* - (``segack_.*)$", (ROOT / "docs" / "operations.rst").read_text(), re.M)
    documented = {name for row in rows for name in re.findall(r"``(segack_\w+)", row)}
    dashboard = json.loads((ROOT / "docs" / "grafana" / "segack.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"segack_\w+", target["expr"])}
    assert served == documented == queried
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
