"""Errors of a replay. Each pickles, so that it can travel from a Spark task to the driver."""

from __future__ import annotations

from typing import Any

__all__ = ["HandlerFailed", "ReplayError"]


class HandlerFailed(RuntimeError):
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
        return (HandlerFailed, (self.key, self.order, self.position, self.key_group, self.reason,
                                self.traceback))


class ReplayError(RuntimeError):
    """A replay stopped for a reason other than the handler: a Spark task or the merger failed.

    The message names the cause as the worker reported it (for example
    ``ModuleNotFoundError: No module named 'h'``); progress up to the failure was saved.
    """
