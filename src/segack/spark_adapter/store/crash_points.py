"""Named crash points: before and after every durable write of the protocol, the places where the
fault tests kill a run (as FoundationDB's simulator and Jepsen do) and check, after the resume,
that nothing was lost, applied twice or committed ahead.

A point is ``before-WRITE`` or ``after-WRITE`` for each write of :data:`WRITES`. With
``SEGACK_CRASH_AT=POINT`` (or ``POINT@N``: the Nth time this process passes it) in its environment,
a process of segack's (the driver, or an executor's Python worker, which inherits the variable on
a local master) kills itself with SIGKILL as it passes the point: no ``finally``, no flush, no
release, exactly as a crash there. Without the variable (always, outside the fault tests) a point
costs one look-up in the environment.

Each durable write in segack's code sits inside ``with durable_write(NAME):`` (a test finds them
all, and fails on a write outside one); Spark's own writes, which segack cannot wrap, have their
points where segack sees them happen (``batch-start``: Spark's offset log is written;
``batch-end``: its commit log is about to be).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Iterator

__all__ = ["ENV", "POINTS", "WRITES", "crash_point", "durable_write"]

#: The environment variable that names the point to crash at.
ENV = "SEGACK_CRASH_AT"
#: Every durable write, by name, and what it writes.
WRITES = {
    "state": "the checkpoint's state file (the driver: a merge, a batch's record, the end of a run)",
    "progress": "a task's progress file",
    "progress-delete": "the driver's removal of progress files it merged",
    "dead-letters": "a task's dead-letter file",
    "dead-letters-delete": "the driver's removal of dead letters a retry handled",
    "stop-request": "a request that a run's tasks stop (a task's failure, a change of segments)",
    "stop-clear": "the removal of a finished job's stop request",
    "claim": "a claim file: taken, extended, released",
    "claim-delete": "a claim file withdrawn",
    "segments-request": "a change of segments asked of the live run, or its removal",
    "spark-batch": "Spark's offset log (before a micro-batch) and commit log (after it): the points "
                   "batch-start and batch-end",
    "group-commit": "offsets committed to a Kafka consumer group",
    "stream-view": "a running stream's observations: its view of its Kafka partitions (for status and "
                   "metrics), over Spark Connect a micro-batch's failure (for the client)",
    "sink-setup": "a sink's own setup: its positions table, a session's name, the end of fenced sessions",
    "sink-commit": "a sink's transaction: the effects of a call and the record of its keys' positions",
}
#: Every point, in the order of :data:`WRITES`.
POINTS = tuple(f"{when}-{name}" for name in WRITES if name != "spark-batch" for when in ("before", "after")
               ) + ("batch-start", "batch-end")

_passed: Counter[str] = Counter()


def crash_point(point: str) -> None:
    """Kill this process now if :data:`ENV` names ``point`` (and this is its Nth passage)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition("@")
    if name != point:
        return
    _passed[point] += 1
    if _passed[point] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def durable_write(name: str) -> Iterator[None]:
    """The points ``before-NAME`` and ``after-NAME`` around the durable write ``name`` of
    :data:`WRITES`."""
    crash_point(f"before-{name}")
    yield
    crash_point(f"after-{name}")
