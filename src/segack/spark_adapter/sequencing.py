"""The rules a segment's task keeps, however it calls the handler: order, retries, dead letters.

Written once, for both ways a task calls the handler: in its own thread, one event after the
other (concurrency 1, the fastest way), and through the
:class:`~segack.spark_adapter.dispatch.Dispatcher` (many calls in flight, a timeout, or an
``async def`` handler).

1. **Sequencing values.** An event's *sequencing value* is what orders it: its key under the
   ``per-key`` policy, one value for all under ``sequential``, the event's own row under
   ``concurrent`` (no order at all). Two events of one value never run at once, and a later one
   never before an earlier one has finished.
2. **Retries.** A call that raises is made again up to ``retries`` times, the n-th retry after
   ``retry_delay * 2**(n - 1)`` seconds.
3. **Failures.** A call that still fails either stops the run (``on_error="stop"``: the
   :class:`Failure`) or, with ``on_error="dead-letter"``, *poisons* its sequencing value: the
   event, and every later event of that value in the task, becomes a :class:`DeadLetter`,
   never handled in this run and done for now; other values go on.
4. **Parked keys.** Keys with dead letters from earlier runs are *parked*: each of their events
   is a dead letter at once, whatever ``on_error`` says, so none runs before the ones that failed.
   The ``concurrent`` policy keeps no order, so it parks nothing.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any

from segack.spark_adapter.options import Handling, OnError, Policy

__all__ = ["PARKED", "DeadLetter", "Failure", "Rules", "retry_after_failure", "sequencing_value"]

#: The error a dead letter records when its key was parked by dead letters of an earlier run.
PARKED = "waits behind its key's dead letters from an earlier run"


@dataclass(frozen=True)
class DeadLetter:
    """An event not handled in this run: it failed, or an earlier event of its key did."""

    row: int
    event: dict[str, Any]
    #: The failure's ``"Type: message"``; for the events behind it, that of the event that failed.
    error: str
    #: Calls made for this event (0 for one held behind a failed event of its key).
    attempts: int


@dataclass(frozen=True)
class Failure:
    """The first handler call that raised, once its retries were spent (rule 3, ``stop``)."""

    row: int
    event: dict[str, Any]
    error: BaseException
    traceback: str
    #: How many times the call was made (1 + the retries it used).
    attempts: int = 1


def sequencing_value(policy: str, row: int, key: Hashable) -> Hashable:
    """What orders an event under ``policy`` (rule 1): its key, one value for all, or its own row."""
    if policy == Policy.PER_KEY:
        return ("key", key)
    if policy == Policy.SEQUENTIAL:
        return ("all",)
    return ("row", row)


def retry_after_failure(
    handler: Callable[[dict[str, Any]], Any], row: int, event: dict[str, Any], error: BaseException,
    retry_delay: float, gives_up: Callable[[int], bool],
) -> Failure | None:
    """Call ``handler(event)`` again after its first call raised ``error`` (being handled now),
    the n-th retry after ``retry_delay * 2**(n - 1)`` seconds (rule 2), until a call succeeds
    (``None``) or ``gives_up(attempts made)``: then the last attempt's :class:`Failure`."""
    text, attempt = traceback.format_exc(), 1
    while not gives_up(attempt):
        time.sleep(retry_delay * 2 ** (attempt - 1))
        attempt += 1
        try:
            handler(event)
        except Exception as again:
            error, text = again, traceback.format_exc()
        else:
            return None
    return Failure(row, event, error, text, attempt)


class Rules:
    """One task's sequencing rules (the module's rules 1, 3 and 4) as its caller applies them.

    ``key_of(event)`` is an event's key; ``parked`` are the keys with dead letters from earlier
    runs. The caller asks :meth:`set_aside` before it starts an event and tells :meth:`failed`
    when a call still fails after its retries.
    """

    def __init__(self, handling: Handling, key_of: Callable[[dict[str, Any]], Hashable],
                 parked: Collection[Hashable] = frozenset()) -> None:
        self.handling = handling
        self.key_of = key_of
        self.parked = frozenset(parked) if handling.policy != Policy.CONCURRENT else frozenset()
        #: Sequencing values whose event failed (dead-letter mode), with that failure's text.
        self.poisoned: dict[Hashable, str] = {}

    def value(self, row: int, event: dict[str, Any]) -> Hashable:
        """The event's sequencing value (rule 1)."""
        return sequencing_value(self.handling.policy, row, self.key_of(event))

    @property
    def may_set_aside(self) -> bool:
        """Whether any event could be set aside now: some key is parked or poisoned."""
        return bool(self.parked) or bool(self.poisoned)

    def set_aside(self, row: int, event: dict[str, Any], value: Hashable | None = None) -> DeadLetter | None:
        """The dead letter ``event`` is before it runs (its key is parked, or its sequencing value
        poisoned), or ``None``: it may run (rules 3 and 4). ``value`` is its sequencing value, if
        the caller has it already."""
        if self.parked and self.key_of(event) in self.parked:
            return DeadLetter(row, event, PARKED, 0)
        if not self.poisoned:
            return None
        reason = self.poisoned.get(self.value(row, event) if value is None else value)
        return None if reason is None else DeadLetter(row, event, reason, 0)

    def failed(self, failure: Failure, value: Hashable) -> DeadLetter | Failure:
        """A call that still fails after its retries, of sequencing value ``value``: with
        ``on_error="dead-letter"`` it poisons ``value`` and is a dead letter; else it is the run's
        ``failure`` (rule 3)."""
        if self.handling.on_error == OnError.DEAD_LETTER:
            reason = f"{type(failure.error).__name__}: {failure.error}"
            self.poisoned[value] = reason
            return DeadLetter(failure.row, failure.event, reason, failure.attempts)
        return failure
