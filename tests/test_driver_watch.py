"""A task's Python worker ends when its driver's process does
(:mod:`segack.spark_adapter.store.driver_watch`), on this machine; a driver elsewhere is not
watched. Real processes: a driver to kill, a worker that watches it."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from segack.spark_adapter.store.driver_watch import DriverProcess, watch_driver

WORKER = """
import sys, time
from segack.spark_adapter.store.driver_watch import DriverProcess, watch_driver, watching_driver
driver = DriverProcess(sys.argv[1], int(sys.argv[2]), sys.argv[3] or None)
if sys.argv[4] == "task":
    with watching_driver(driver):
        watch_driver(driver)  # as another task of the same worker would: still one watcher
        print("watching", flush=True)
        time.sleep(30)
watch_driver(driver)
print("watching", flush=True)
time.sleep(30)
"""


def _worker(driver: DriverProcess, task: bool = True) -> subprocess.Popen[str]:
    """A process that watches ``driver``, in a task (else idle, as a worker between tasks)."""
    arguments = [driver.host, str(driver.pid), driver.pid_space or "", "task" if task else "idle"]
    return subprocess.Popen([sys.executable, "-c", WORKER, *arguments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _driver() -> tuple[subprocess.Popen[bytes], DriverProcess]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return process, dataclasses.replace(DriverProcess.this(), pid=process.pid)


def test_a_worker_ends_at_once_when_its_driver_is_killed():
    driver, identity = _driver()
    worker = _worker(identity)
    try:
        assert worker.stdout.readline() == "watching\n"
        driver.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        driver.wait()
        assert worker.wait(timeout=10) == 1
        waited = time.monotonic() - killed
        assert waited < 5, f"the worker took {waited:.1f} s to end"  # a watcher that never fires hangs here
        assert f"the driver (pid {identity.pid} on {identity.host}) is gone" in worker.stderr.read()
    finally:
        driver.kill()
        worker.kill()


def test_an_idle_worker_ends_without_a_word_when_its_driver_finishes():
    driver, identity = _driver()
    worker = _worker(identity, task=False)
    try:
        assert worker.stdout.readline() == "watching\n"
        driver.kill()
        driver.wait()
        assert worker.wait(timeout=10) == 1
        assert worker.stderr.read() == ""
    finally:
        driver.kill()
        worker.kill()


def test_a_worker_whose_driver_is_gone_already_ends_before_its_task_does_anything():
    driver, identity = _driver()
    driver.kill()
    driver.wait()
    worker = _worker(identity)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 1 and out == "" and "is gone" in err


@pytest.mark.parametrize("elsewhere", [{"host": "another-machine"}, {"pid_space": "another boot pid:[1]"}],
                         ids=["another host", "another pid namespace"])
def test_a_driver_elsewhere_is_not_watched(elsewhere):
    driver, identity = _driver()
    worker = _worker(dataclasses.replace(identity, **elsewhere))
    try:
        assert worker.stdout.readline() == "watching\n"
        driver.kill()
        driver.wait()
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=1)
    finally:
        worker.kill()
        worker.wait()


def test_the_driver_itself_and_no_driver_are_not_watched():
    watch_driver(None)
    watch_driver(DriverProcess.this())  # returns: a process does not watch itself
    assert os.getpid() == DriverProcess.this().pid
