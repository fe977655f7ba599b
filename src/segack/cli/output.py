"""How the commands print: counts, percentages, times, a refusal's line, and a run's progress."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from segack.cli.exit_codes import ExitCode
from segack.spark_adapter.results import STARTUP, Progress


def counted(number: int, noun: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def percent(part: int, whole: int) -> str:
    """``part / whole`` as a percentage to a tenth, rounded down: 100.0% only when all of it."""
    tenths = part * 1000 // max(whole, 1)
    return f"{tenths // 10}.{tenths % 10}%"


def local_time(at: float) -> str:
    """A time as ``segack status`` shows it: local, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _duration(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 2 h 5 min``."""
    if seconds < 60:
        return f"about {max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    return f"about {minutes} min" if minutes < 60 else f"about {minutes // 60} h {minutes % 60} min"


def say(line: str) -> None:
    """``line`` on stderr from a signal handler: one system call, no buffer that the handler may
    have interrupted in the middle of a write."""
    os.write(sys.stderr.fileno(), (line + "\n").encode())


def refused(command: str, error: Exception) -> int:
    """Print why ``segack COMMAND`` cannot use its checkpoint; :attr:`ExitCode.REFUSED`."""
    print(f"segack {command}: {error}", file=sys.stderr)
    return ExitCode.REFUSED


#: Seconds of events flowing before the progress line gives a rate: the tasks' first calls (their
#: workers starting, the first lists filling) would make a shorter one say too little.
SHORTEST_WINDOW = 3.0


class ProgressPrinter:
    """Progress on one rewritten line on a terminal, plain log lines elsewhere: events done (with
    the total, once counted, their share and the time left), the rate over the last ``window``
    seconds, the segments, and the calls in flight."""

    def __init__(self, stream: TextIO | None = None, every: float = 5.0, window: float = 10.0) -> None:
        self.stream = sys.stderr if stream is None else stream  # stderr as it is now, not at import
        self.terminal = self.stream.isatty()
        self.every, self.window = every, window
        self._last = float("-inf")
        #: ``(seconds, handled)`` of the reports of the last ``window`` seconds, oldest first.
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def rate(self, progress: Progress) -> float | None:
        """Events handled per second since the oldest report of the window; ``None`` until the
        window holds :data:`SHORTEST_WINDOW` seconds of events flowing. Until the first events are
        handled, a report replaces the one before: that time went to Spark's start and the tasks'
        (a resume's first reports), not to events, and a rate over it would say too little."""
        if len(self._samples) == 1 and self._samples[0][1] == progress.handled:
            self._samples.clear()
        self._samples.append((progress.seconds, progress.handled))
        while len(self._samples) > 2 and progress.seconds - self._samples[1][0] >= self.window:
            self._samples.popleft()
        seconds, handled = self._samples[0]
        if progress.seconds - seconds < SHORTEST_WINDOW:
            return None
        return (progress.handled - handled) / (progress.seconds - seconds)

    def line(self, progress: Progress) -> str:
        """The progress line for ``progress`` (one more report for the rate)."""
        rate = self.rate(progress)
        if progress.total is None:
            parts = [f"{counted(progress.done, 'event')} done"]
        else:
            parts = [f"{progress.done:,} of {counted(progress.total, 'event')} done "
                     f"({percent(progress.done, progress.total)})"]
        if rate is not None:
            left = "" if progress.total is None or rate <= 0 else (
                f", {_duration((progress.total - progress.done) / rate)} left")
            parts.append(f"{rate:,.0f}/s{left}")
        parts.append(counted(progress.segments, "segment"))
        if progress.in_flight or progress.pending:
            parts.append(f"{counted(progress.in_flight, 'call')} in flight, "
                         f"{counted(progress.pending, 'row')} pending")
        return ", ".join(parts)

    def phase(self, text: str) -> None:
        """A start-up phase beginning, on a terminal's status line until the next replaces it (a log
        has them with ``--verbose``)."""
        if self.terminal:
            self.stream.write(f"\rsegack: {text}\033[K")
            self.stream.flush()

    @contextlib.contextmanager
    def phases(self, verbose: bool) -> Iterator[None]:
        """Show the run's start-up phases (:data:`~segack.spark_adapter.results.STARTUP`) while the
        block runs; with ``verbose`` they are log lines already."""
        printer = self

        class Phases(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                printer.phase(record.getMessage())

        handler = Phases()
        level = STARTUP.level
        if not verbose:
            STARTUP.addHandler(handler)
            STARTUP.setLevel(logging.INFO)
            STARTUP.propagate = False
        try:
            yield
        finally:
            STARTUP.removeHandler(handler)
            STARTUP.setLevel(level)
            STARTUP.propagate = True

    def __call__(self, progress: Progress) -> None:
        line = self.line(progress)
        if self.terminal:
            self.stream.write("\r" + line + "\033[K")
        elif progress.handled and time.monotonic() - self._last >= self.every:
            self.stream.write(f"segack: {line}\n")
            self._last = time.monotonic()
        self.stream.flush()

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()
