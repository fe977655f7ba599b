"""Errors shared by the kernel and the spec, so that one ``except`` catches either."""

from __future__ import annotations

__all__ = ["AckerFullError", "DuplicateAckError"]


class DuplicateAckError(ValueError):
    """An index was acked twice (and the acker was told to treat that as an error)."""

    def __init__(self, index: int) -> None:
        super().__init__(f"index {index} was already acked")
        self.index = index

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (DuplicateAckError, (self.index,))


class AckerFullError(RuntimeError):
    """Acking would make more pending runs than ``max_runs``; nothing was changed.

    The caller can back off (let the gaps fill) and retry.
    """

    def __init__(self, runs: int, max_runs: int) -> None:
        super().__init__(f"acking would make {runs} pending runs, more than max_runs={max_runs}")
        self.runs = runs
        self.max_runs = max_runs

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return (AckerFullError, (self.runs, self.max_runs))
