"""A real Schema Registry for the tests: Aiven's Karapace, from the kit in ``../shared/karapace/``
(its ``install.sh`` once into the tests' cache, ``~/.cache/segack-tests/karapace-<version>``, then its
``start.sh`` per test run against the tests' broker), or the one ``SEGACK_TEST_SCHEMA_REGISTRY``
names. Never a registry written here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.ports import free_ports

#: The kit beside this checkout, as the workplace lays it out.
KIT = Path(__file__).resolve().parents[2] / "shared" / "karapace"
#: What a run without the kit or a registry of its own is told (the only skip these tests allow).
HOW = ("no Schema Registry: these tests need the Karapace kit in ../shared/karapace (install.sh, start.sh) "
       "or SEGACK_TEST_SCHEMA_REGISTRY=URL of a registry whose Kafka is the tests' broker")


def _cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "segack-tests"
    return base / "karapace-6.2.0"


def available() -> bool:
    """Whether a registry can be had: the kit, or one named by the environment."""
    return bool(os.environ.get("SEGACK_TEST_SCHEMA_REGISTRY")) or (KIT / "start.sh").exists()


@contextlib.contextmanager
def schema_registry(bootstrap: str, log: Path) -> Iterator[str]:
    """The URL of a registry that keeps its schemas in the broker at ``bootstrap``, until the block
    ends; Karapace installed first if the cache lacks it (a minute or two, once)."""
    given = os.environ.get("SEGACK_TEST_SCHEMA_REGISTRY")
    if given:
        yield given.rstrip("/")
        return
    destination = _cache()
    subprocess.run(["bash", str(KIT / "install.sh"), str(destination)], check=True, capture_output=True,
                   timeout=900)
    (port,) = free_ports(1)
    started = subprocess.run(
        ["bash", str(KIT / "start.sh"), str(destination / "venv"), bootstrap, str(port), str(log)],
        check=True, capture_output=True, text=True, timeout=120,
        env={**os.environ, "KARAPACE_TOPIC_NAME": f"_schemas_{port}"})
    pid = int(started.stdout.strip().splitlines()[-1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def register(url: str, subject: str, schema: str, schema_type: str = "AVRO") -> int:
    """Register ``schema`` under ``subject``, as a producer's serializer does; its id."""
    body = {"schema": schema, **({"schemaType": schema_type} if schema_type != "AVRO" else {})}
    request = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(json.loads(answer.read())["id"])
