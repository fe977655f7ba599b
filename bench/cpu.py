"""CPU time by kind of process, sampled from ``/proc`` while pipelines run: what each part of a
pipeline costs (Spark's Python workers, its JVM, the database), inside the window its rate is
measured over.

On 2 cores every part competes for the same CPU, so a pipeline's rate follows the CPU all its
parts spend per event: these columns say where a gap between two pipelines comes from.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

#: The kinds of process counted, and how each is known.
KINDS = ("python workers", "JVM", "database")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _kind(command: str, name: str) -> str | None:
    """The kind of a process from its command line and its name, or ``None`` (not counted)."""
    if "pyspark.daemon" in command or "pyspark/daemon" in command:
        return "python workers"
    if name == "java":
        return "JVM"
    if name == "postgres":
        return "database"
    return None


def _processes() -> Iterator[tuple[int, str, float]]:
    """Every process now: its id, its kind, and the CPU seconds it has used (user and system)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        kind = _kind(command, name)
        if kind is not None:
            fields = stat[stat.rindex(")") + 2:].split()
            yield int(entry.name), kind, (int(fields[11]) + int(fields[12])) / _TICKS


class CpuSampler:
    """Samples the CPU time of every process of :data:`KINDS` every ``interval`` seconds in a thread
    while the block runs; :meth:`within` sums what each kind used in a window. A process that
    starts later counts from its start. Where there is no ``/proc`` it samples nothing."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        # (middle of the interval, kind, CPU seconds used in the interval)
        self._samples: list[tuple[float, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        if Path("/proc/self/stat").exists():
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        used = {pid: seconds for pid, _, seconds in _processes()}
        before = time.time()
        while not self._stop.wait(self.interval):
            now = time.time()
            spent: dict[str, float] = {}
            for pid, kind, seconds in _processes():
                spent[kind] = spent.get(kind, 0.0) + seconds - used.get(pid, 0.0)
                used[pid] = seconds
            self._samples.extend(((before + now) / 2, kind, seconds) for kind, seconds in spent.items())
            before = now

    def within(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each kind used from ``start`` to ``end`` (``time.time()`` values), to about
        one sampling interval at each end."""
        totals = dict.fromkeys(KINDS, 0.0)
        for at, kind, seconds in self._samples:
            if start <= at <= end:
                totals[kind] += seconds
        return totals
