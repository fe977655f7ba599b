"""What the servers the tests start share: loopback ports, and an end with the test process."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ends_with_its_parent() -> None:
    """In a server's process before it starts (``preexec_fn``): a SIGTERM when the test process
    ends, even one killed before its fixtures' teardown (mutmut kills a test run past its time
    limit)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
