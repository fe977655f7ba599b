"""Errors of a replay. Each pickles, so that it can travel from a Spark task to the driver."""

from __future__ import annotations

import warnings
from typing import Any

from segack.errors import SegackError

__all__ = ["HandlerFailedError", "ReplayError", "worker_error"]


class HandlerFailedError(SegackError, RuntimeError):
    """The handler raised on an event; the progress before it was saved first.

    ``key`` and ``order`` are the event's values, ``position`` its place in its
    key group (``key_group``), ``reason`` the handler's exception as
    ``"Type: message"`` and ``traceback`` its formatted traceback from the worker.
    """

    def __init__(self, key: Any, order: Any, position: int, key_group: int, reason: str,
                 traceback: str = "") -> None:
        super().__init__(f"handler failed on the event with key {key!r} and order {order!r} "
                         f"(position {position} of key group {key_group}): {reason}")
        self.key = key
        self.order = order
        self.position = position
        self.key_group = key_group
        self.reason = reason
        self.traceback = traceback

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (HandlerFailedError, (self.key, self.order, self.position, self.key_group, self.reason,
                                self.traceback))


class ReplayError(SegackError, RuntimeError):
    """A replay stopped for a reason other than the handler: a Spark task or the merger failed.

    The message names the cause as the worker reported it (for example
    ``ModuleNotFoundError: No module named 'h'``); progress up to the failure was saved.
    """


def worker_error(error: BaseException) -> str:
    """The exception a Spark task raised, as ``"Type: message"``, read out of Spark's wrapping.

    Spark reports a Python worker's failure as text: its traceback inside one
    or more Java exceptions. The last traceback's closing line is the
    exception itself; failing that, the first line of ``error``.
    """
    text = str(error)
    marker = "Traceback (most recent call last):"
    if marker in text:
        lines = text[text.rindex(marker) + len(marker):].splitlines()
        closing = [line.strip() for line in lines if line.strip() and not line.startswith((" ", "\t"))]
        if closing:
            return closing[0]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def __getattr__(name: str) -> Any:
    """``HandlerFailed``, the 0.1 name of :class:`HandlerFailedError`, with a deprecation warning."""
    if name == "HandlerFailed":
        warnings.warn("HandlerFailed is now HandlerFailedError", DeprecationWarning, stacklevel=2)
        return HandlerFailedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
