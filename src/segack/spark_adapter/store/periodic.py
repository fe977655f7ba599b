"""The driver's background work during a run: something done every few seconds until the run ends.

A run's driver keeps three such threads: the claim keeper
(:class:`~segack.spark_adapter.store.claims.ClaimKeeper`), the progress merger and the
watcher for segment changes (:class:`~segack.spark_adapter.store.rescale.RequestWatcher`).
"""

from __future__ import annotations

import threading
from typing import Any, Self

__all__ = ["Periodic"]


class Periodic:
    """Calls :meth:`tick` every ``interval`` seconds on a daemon thread named ``name``, while a
    ``with`` block runs.

    The thread ends with the block, or earlier when :meth:`tick` returns ``True`` (its work is
    done, or cannot go on). Leaving the block waits for a tick under way to finish.
    """

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> bool:
        """One round of the work; ``True`` ends the thread."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.tick():
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()
