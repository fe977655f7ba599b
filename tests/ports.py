"""What the servers the tests start share: loopback ports, and an end with the test process."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now: each probe stays bound until all are
    chosen (one probe after another may be given the port the last one just freed)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    return free_ports(1)[0]


def ends_with_its_parent() -> None:
    """In a server's process before it starts (``preexec_fn``): a SIGTERM when the test process
    ends, even one killed before its fixtures' teardown (mutmut kills a test run past its time
    limit)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
