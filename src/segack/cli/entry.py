"""The ``segack`` command's entry point: parse the command line, send the package's log to stderr,
and run the command."""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from segack.cli.exit_codes import ExitCode
from segack.cli.parser import build_parser, check_input


class _LogLines(logging.Formatter):
    """``segack: message``, with the level for warnings and errors."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"segack: {level}{record.getMessage()}"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record to ``sys.stderr`` as it is when the record comes."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def log_to_stderr(verbose: bool) -> None:
    """Show the package's warnings on stderr, and with ``verbose`` what its runs decide."""
    logger = logging.getLogger("segack")
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_LogLines())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``segack`` command; returns the exit status (:class:`ExitCode`)."""
    # Whole lines, in the order they were printed, when stdout and stderr go to one file.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_input(parser, args)
        log_to_stderr(getattr(args, "verbose", False))
        return _run(args)
    except BrokenPipeError:
        # The reader went away (``segack status CK | head``): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK


def _run(args: argparse.Namespace) -> int:
    """The command's module runs it, imported only now: ``segack status`` and the other commands
    without Spark never import what starts it."""
    if args.command in ("status", "dead-letters"):
        from segack.cli import status

        return status.run(args)
    if args.command in ("split", "merge", "scale", "release"):
        from segack.cli import control

        return control.run(args)
    if args.command == "ui":
        from segack.cli import ui

        return ui.run(args)
    if args.command in ("locate", "plan"):
        from segack.cli import plan

        return plan.run(args)
    if args.command == "demo":
        from segack.cli import demo

        return demo.run(args)
    from segack.cli import runs

    return runs.run(args)
