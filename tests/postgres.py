"""A real PostgreSQL server for the tests: Debian's ``postgresql`` binaries, a temporary data
directory, a free loopback port; started once for the test run and stopped after."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port

#: Where Debian's ``postgresql`` package puts initdb and pg_ctl.
BINARIES = "/usr/lib/postgresql/*/bin"


def _binaries() -> Path:
    found = sorted(glob.glob(f"{BINARIES}/initdb"))
    if not found:
        raise RuntimeError(f"no PostgreSQL server: no initdb under {BINARIES} (apt-get install postgresql)")
    return Path(found[-1]).parent


@contextmanager
def postgres_server(directory: Path, durable: bool = False) -> Iterator[str]:
    """Run a server with its data in ``directory`` (made here) until the block ends; yields its
    connection string. As root, the server runs as the ``postgres`` user (it refuses root).
    It listens on loopback TCP only: a Unix socket's path may hold at most 107 bytes, which a
    checkout under a long path would pass.
    Tests need no durability (``fsync=off``); a benchmark does (``durable``): each commit waits for
    its write to reach the disk, as on a real database."""
    bin_dir = _binaries()
    as_server: list[str] = []
    if os.geteuid() == 0:
        as_server = ["runuser", "-u", "postgres", "--"]
    directory.mkdir(parents=True)
    data = directory / "data"
    if as_server:
        shutil.chown(directory, "postgres")
    port = free_port()
    subprocess.run([*as_server, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
    options = f"-p {port} -c unix_socket_directories='' -c listen_addresses=127.0.0.1 -c max_connections=200"
    if not durable:
        options += " -c fsync=off"
    subprocess.run([*as_server, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                    str(directory / "server.log"), "-w", "start"], check=True, capture_output=True)
    try:
        yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    finally:
        stop = [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
        subprocess.run([*as_server, *stop], check=False, capture_output=True)
