"""Commit streams: turn ``(index, offset)`` completions into offsets that are safe to commit.

The pure-Python counterpart of a streaming "acker stage": it yields when the
committed point advances (throttled to every N advances or T seconds if asked),
yields the last committable point when the input ends, and, when the input
raises, yields the last committable point it has not yet yielded before
re-raising, so that a consumer can commit progress made before a failure.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

from segack.errors import SegackValueError

__all__ = ["commit_points", "commit_points_async", "CommitThrottle"]


class CommitThrottle:
    """Decides when an advance of the committed point is worth yielding."""

    def __init__(self, every: int | None, interval: float | None) -> None:
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise SegackValueError(f"every must be a positive int or None, got {every!r}")
        if interval is not None and not interval >= 0:
            raise SegackValueError(
                f"interval must be a non-negative number of seconds or None, got {interval!r}")
        self.every = every
        self.interval = interval
        self.advances = 0
        self.last_time = time.monotonic()
        self.unyielded: Any = None
        self.has_unyielded = False

    def advanced(self, offset: Any) -> bool:
        """Record an advance to ``offset``; True when it should be yielded now."""
        self.advances += 1
        self.unyielded, self.has_unyielded = offset, True
        if self.every is not None and self.advances % self.every != 0:
            return False
        return self.interval is None or time.monotonic() - self.last_time >= self.interval

    def take(self) -> Any:
        """The offset to yield now; it is no longer pending."""
        self.last_time = time.monotonic()
        self.has_unyielded = False
        return self.unyielded


def commit_points(
    completions: Iterable[tuple[int, Any]],
    *,
    every: int | None = None,
    interval: float | None = None,
    acker: Any = None,
) -> Iterator[Any]:
    """Yield committable offsets as ``(index, offset)`` completions arrive.

    ``every``: yield only every N-th advance; ``interval``: at most once per that
    many seconds (both: both must hold). Whatever is throttled is still yielded
    when the input ends or raises. ``acker``: the acker to feed (default: a new
    one starting at index 0); the acker's errors (duplicates, bad indexes) stop
    the stream after the pending point is yielded, like an input error.
    """
    from segack.specs.acker import OffsetAcker

    tracker = OffsetAcker() if acker is None else acker
    throttle = CommitThrottle(every, interval)
    try:
        for index, offset in completions:
            committed = tracker.ack(index, offset)
            if committed is not None and throttle.advanced(committed):
                yield throttle.take()
    except Exception:
        if throttle.has_unyielded:
            yield throttle.take()
        raise
    if throttle.has_unyielded:
        yield throttle.take()


async def commit_points_async(
    completions: AsyncIterable[tuple[int, Any]],
    *,
    every: int | None = None,
    interval: float | None = None,
    acker: Any = None,
) -> AsyncIterator[Any]:
    """:func:`commit_points` for an async iterable of completions."""
    from segack.specs.acker import OffsetAcker

    tracker = OffsetAcker() if acker is None else acker
    throttle = CommitThrottle(every, interval)
    try:
        async for index, offset in completions:
            committed = tracker.ack(index, offset)
            if committed is not None and throttle.advanced(committed):
                yield throttle.take()
    except Exception:
        if throttle.has_unyielded:
            yield throttle.take()
        raise
    if throttle.has_unyielded:
        yield throttle.take()
