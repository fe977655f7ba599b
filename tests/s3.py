"""A real S3 API server for the tests: moto's standalone server (``moto[server]``) on a free
loopback port, started once for the test run and stopped after, reached the standard way."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.ports import ends_with_its_parent, free_port

#: What every client of the server needs in its environment (Spark's workers included).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def s3_server() -> Iterator[str]:
    """Run the server until the block ends; yields its endpoint URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # The server logs a line per request: to a file, as a pipe nobody reads would fill up and then
    # block every request (and the server's exit) on its log line.
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=log, preexec_fn=ends_with_its_parent)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"moto's server did not start: {log.read().decode()}") from None
                    time.sleep(0.1)
            yield endpoint
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def make_bucket(endpoint: str, name: str) -> None:
    """Create bucket ``name`` on the server."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"],
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=name)
