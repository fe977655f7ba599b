"""The errors segack raises, shared by the kernel and the spec so that one ``except`` catches either.

Every error derives from :class:`SegackError` and from the builtin it refines
(``except ValueError`` keeps working), as PySpark's ``PySparkValueError`` does.
"""

from __future__ import annotations

__all__ = [
    "AckerFullError",
    "DuplicateAckError",
    "SegackError",
    "SegackKeyError",
    "SegackTypeError",
    "SegackValueError",
]


class SegackError(Exception):
    """The base of every error segack raises: ``except segack.SegackError`` catches them all."""


class SegackValueError(SegackError, ValueError):
    """An argument of the right type with a value segack rejects; nothing was changed."""


class SegackTypeError(SegackError, TypeError):
    """An argument of a type segack does not take; nothing was changed."""


class SegackKeyError(SegackError, KeyError):
    """A field an event lacks."""

    def __str__(self) -> str:
        # KeyError's own str() quotes its argument; the message is a sentence.
        return str(self.args[0]) if self.args else ""


class DuplicateAckError(SegackValueError):
    """An index was acked twice (and the acker was told to treat that as an error)."""

    def __init__(self, index: int) -> None:
        super().__init__(f"index {index} was already acked")
        self.index = index

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (DuplicateAckError, (self.index,))


class AckerFullError(SegackError, RuntimeError):
    """Acking would make more pending runs than ``max_runs``; nothing was changed.

    The caller can back off (let the gaps fill) and retry.
    """

    def __init__(self, runs: int, max_runs: int) -> None:
        super().__init__(f"acking would make {runs} pending runs, more than max_runs={max_runs}")
        self.runs = runs
        self.max_runs = max_runs

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return (AckerFullError, (self.runs, self.max_runs))
