"""The Spark session of a command that starts one (``replay``, ``stream``, ``plan``): where it runs,
what it is sent, how it stops, and the signals that stop a run."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

log = logging.getLogger("segack.cli")


def importable_from_here() -> None:
    """Let handler modules in the working directory import on the driver (executors get them shipped)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def _is_embedded_local(master: str) -> bool:
    """``local`` or ``local[...]``: the driver's JVM runs the tasks itself."""
    return master == "local" or master.startswith("local[")


def spark_master(args: argparse.Namespace) -> str | None:
    """The command's ``--master`` (``local[2]`` unless given), or ``None`` with ``--remote``."""
    return None if args.remote else (args.master or "local[2]")


def start_session(args: argparse.Namespace, py_files: Sequence[str] = ()) -> Any:
    """The command's Spark session (``--master`` or ``--remote``, ``--conf``, quiet unless
    ``--verbose``); with a ``--handler``, its module and ``py_files`` shipped to it."""
    from segack.spark_adapter.spark.session import ship_module, ship_py_files, spark_session

    spark = spark_session(master=spark_master(args), remote=args.remote, conf=dict(args.conf),
                          quiet=not args.verbose)
    if getattr(args, "handler", None):
        ship_module(spark, args.handler.partition(":")[0])
        ship_py_files(spark, list(py_files))
    return spark


def stop_session(spark: Any, args: argparse.Namespace) -> None:
    """Stop the command's session (``None``: none started), unless an embedded local master's."""
    # On an embedded local master the JVM stops itself (shutdown hooks included) when this
    # process exits, so the command does not wait for that. Anything else stops in order:
    # local-cluster's own master and workers would otherwise log errors racing the exit, and
    # a Connect session is released on the server.
    master = spark_master(args)
    if spark is None or (master is not None and _is_embedded_local(master)):
        return
    from py4j.protocol import Py4JError

    try:
        spark.stop()
    except (ConnectionError, Py4JError) as error:  # its JVM gone already: a signal to the process group
        log.warning("the Spark session's JVM was gone before the command stopped it (%s)", error)


@contextlib.contextmanager
def stop_signals(asked: Callable[[int, Any], None]) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGINT call ``asked`` while the block runs, as they did before it afterwards. The
    block calls what this yields once Spark has started: PySpark's session puts in its own SIGINT
    handler, which cancels every job and raises ``KeyboardInterrupt`` wherever the main thread is."""
    numbers = (signal.SIGTERM, signal.SIGINT)
    previous = {number: signal.signal(number, asked) for number in numbers}

    def again() -> None:
        for number in numbers:
            signal.signal(number, asked)

    try:
        yield again
    finally:
        for number, handling in previous.items():
            signal.signal(number, handling)


def interrupt(spark: Any) -> None:
    """Cancel the session's jobs, from a thread of its own (a signal handler runs in the main
    thread, which may be waiting on the session)."""
    def cancel() -> None:
        try:
            spark.interruptAll()
        except Exception as error:  # the session is stopping anyway
            log.info("could not cancel the session's jobs: %s", error)

    threading.Thread(target=cancel, name="segack-interrupt", daemon=True).start()
