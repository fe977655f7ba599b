"""A run that is gone stops its handlers: a task's Python worker ends when its driver's process does.

A driver killed outright (SIGKILL, the kernel's OOM killer) cannot tell its tasks. Spark notices
in steps (the JVM sees its Python driver gone and shuts down, then its Python workers' sockets
close), and meanwhile the workers go on calling the handler: calls no run will ever record done,
to be handed again to the next run. So each task watches the driver's process itself, when it
runs on the driver's machine (a local master, ``local-cluster``, a one-machine standalone
cluster), and ends its worker the moment the driver ends, as the driver's own SIGKILL would
have: on Linux through a pidfd (the kernel wakes the watcher), elsewhere by looking every
:data:`POLL_SECONDS`.

On another machine the driver's process cannot be watched: Spark ends the executors once they
lose the driver's connection, and the claim's fencing (:mod:`~segack.spark_adapter.store.claims`) keeps
whatever they still write out of the checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["POLL_SECONDS", "DriverProcess", "watch_driver", "watching_driver"]

log = logging.getLogger(__name__)

#: How often the watcher looks where the system has no pidfd.
POLL_SECONDS = 0.02

#: The driver processes this worker process watches already (workers are reused across tasks).
_WATCHED: set[int] = set()
_WATCHED_LOCK = threading.Lock()
#: Tasks running in this worker process now (:func:`watching_driver`).
_running_tasks = 0


def _pid_space() -> str | None:
    """This kernel's boot and this process's pid namespace: where a pid means the same process
    (``None`` where the system does not say, off Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


@dataclass(frozen=True)
class DriverProcess:
    """The process that runs a replay's driver, as its tasks find it."""

    host: str
    pid: int
    #: Where ``pid`` names this process: the kernel's boot id and the pid namespace (``None`` off
    #: Linux). A task elsewhere, in a container of its own say, does not watch it.
    pid_space: str | None

    @classmethod
    def this(cls) -> DriverProcess:
        """The calling process."""
        return cls(socket.gethostname(), os.getpid(), _pid_space())


def _end_worker(driver: DriverProcess) -> None:
    if _running_tasks:
        # A task's own stderr goes to the executor's log, where an operator looks for why it ended.
        # An idle worker (its driver simply finished) ends without a word.
        print(f"segack: the driver (pid {driver.pid} on {driver.host}) is gone; this Python worker "
              f"(pid {os.getpid()}) ends without calling the handler again", file=sys.stderr, flush=True)
    os._exit(1)


def _wait_with_pidfd(driver: DriverProcess, descriptor: int) -> None:
    select.select([descriptor], [], [])  # readable once the process has ended
    _end_worker(driver)


def _wait_by_polling(driver: DriverProcess) -> None:
    while True:
        try:
            os.kill(driver.pid, 0)
        except ProcessLookupError:
            _end_worker(driver)
        except PermissionError:
            pass  # alive, under another user
        time.sleep(POLL_SECONDS)


def watch_driver(driver: DriverProcess | None) -> None:
    """End this process as soon as ``driver`` ends, if it runs on this machine (else nothing).

    Called by each task; the first call for a driver starts a daemon thread, later ones return.
    A driver already gone ends the process at once, before the task handles anything.
    """
    if (driver is None or driver.host != socket.gethostname() or driver.pid_space != _pid_space()
            or driver.pid == os.getpid()):
        return
    with _WATCHED_LOCK:
        if driver.pid in _WATCHED:
            return
        _WATCHED.add(driver.pid)
    try:
        descriptor = os.pidfd_open(driver.pid)
    except ProcessLookupError:
        _end_worker(driver)
    except (AttributeError, OSError) as error:  # no pidfd here: not Linux, or a kernel before 5.3
        log.debug("watching driver pid %d by polling: %s", driver.pid, error)
        threading.Thread(target=_wait_by_polling, args=(driver,), name="segack-driver-watch",
                         daemon=True).start()
        return
    threading.Thread(target=_wait_with_pidfd, args=(driver, descriptor), name="segack-driver-watch",
                     daemon=True).start()


@contextlib.contextmanager
def watching_driver(driver: DriverProcess | None) -> Iterator[None]:
    """A task's body: :func:`watch_driver`, and while the block runs, a worker ended for its
    driver says so on its stderr."""
    global _running_tasks
    with _WATCHED_LOCK:
        _running_tasks += 1
    try:
        watch_driver(driver)
        yield
    finally:
        with _WATCHED_LOCK:
            _running_tasks -= 1
