"""The rules a segment's task keeps, however it calls the handler: order, retries, dead letters.

Written once, for both ways a task calls the handler: in its own thread, one call (an event, or
a list) after the other (concurrency 1, the fastest way), and through the
:class:`~segack.spark_adapter.worker.dispatch.Dispatcher` (many calls in flight, a timeout, or an
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
5. **Lists.** A batch handler is called with a list of events, each value's in its order. A list
   that still fails after its retries is *narrowed*: cut in two halves, the first called before
   the second, each half that fails cut again, down to single events, which get their retries;
   an event whose value failed earlier in the list is not called but set aside behind that
   failure. Under ``on_error="dead-letter"`` only the failing events and their values' later
   events become dead letters. Under ``on_error="stop"`` narrowing ends at the first event that
   fails alone, which stops the run: its failure names that event, not the list's first.

A call's retries and narrowing are its *plan* (:func:`call_plan`): a generator that says whom
to call the handler with next, after what wait, and learns how each call went. The task's own
loop and the dispatcher's threads drive it with :func:`drive`, its event loop with an ``await``
of each call: one plan, whatever runs the calls.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Collection, Generator, Hashable
from dataclasses import dataclass, replace
from typing import Any

from segack.spark_adapter.errors import one_line
from segack.spark_adapter.options import Handling, OnError, Policy

__all__ = ["PARKED", "Attempt", "DeadLetter", "Failure", "Item", "Outcome", "Reply", "Rules", "call_plan",
           "drive", "retry_after_failure", "sequencing_value"]

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
    #: Events in the call it failed in first: 1, or a batch handler's list it was narrowed from.
    size: int = 1

    @property
    def reason(self) -> str:
        """``"Type: message"``, with the attempts made and the list it was narrowed from, if any."""
        notes = [f"after {self.attempts} attempts"] if self.attempts > 1 else []
        if self.size > 1:
            notes.append(f"called alone after its list of {self.size:,} events failed")
        return one_line(self.error) + (f" ({', '.join(notes)})" if notes else "")


#: One event in a call: its row (the task's numbering), its sequencing value, the event.
Item = tuple[int, Hashable, dict[str, Any]]
#: What a plan asks for next: wait this many seconds, then call the handler with these events.
Attempt = tuple[float, list[Item]]
#: How a call went, as its driver tells the plan: ``None`` (it returned), or what it raised with
#: its traceback's text.
Reply = tuple[Exception, str] | None


@dataclass(frozen=True)
class Outcome:
    """How a call ended once its plan was done; every event not named here was handled."""

    #: Calls that still failed after their retries, with their sequencing values: single events,
    #: or (not narrowed) the whole list.
    failures: tuple[tuple[Failure, Hashable], ...] = ()
    #: Events never called because an earlier event of their value failed in the same list.
    behind: tuple[Item, ...] = ()
    #: Calls made after the call's first (its retries, and its narrowed parts): what the run
    #: reports as retries. Set by whatever drives the plan.
    repeats: int = 0


def sequencing_value(policy: str, row: int, key: Hashable) -> Hashable:
    """What orders an event under ``policy`` (rule 1): its key, one value for all, or its own row."""
    if policy == Policy.PER_KEY:
        return ("key", key)
    if policy == Policy.SEQUENTIAL:
        return ("all",)
    return ("row", row)


def _attempts(items: list[Item], retry_delay: float, gives_up: Callable[[int], bool],
              ) -> Generator[Attempt, Reply, Failure | None]:
    """Call with ``items`` until a call returns (``None``) or ``gives_up(attempts made)``: then
    the last attempt's :class:`Failure` (rule 2)."""
    reply = yield (0.0, items)
    attempt = 1
    while reply is not None and not gives_up(attempt):
        reply = yield (retry_delay * 2 ** (attempt - 1), items)
        attempt += 1
    if reply is None:
        return None
    row, _, event = items[0]
    return Failure(row, event, reply[0], reply[1], attempt, len(items))


def call_plan(items: list[Item], retry_delay: float, gives_up: Callable[[int], bool], on_error: str,
              failing: Callable[[], bool] | None = None) -> Generator[Attempt, Reply, Outcome]:
    """The plan of one call with ``items`` (rules 2, 3 and 5): its attempts until one returns or
    ``gives_up(attempts made)``; then, for a list, its narrowing, to every event that fails
    (``on_error`` ``"dead-letter"``) or to the first (``"stop"``), unless ``failing()`` says the
    run is failing already (another call's failure named its event): then the list fails whole.
    Once the driver has sent the last reply, the generator returns the :class:`Outcome`."""
    failure = yield from _attempts(items, retry_delay, gives_up)
    if failure is None:
        return Outcome()
    if len(items) == 1:
        return Outcome(((failure, items[0][1]),))
    failures: dict[Hashable, Failure] = {}
    behind: list[Item] = []
    to_first = on_error != OnError.DEAD_LETTER
    cut_short = False

    def narrowed(part: list[Item]) -> Generator[Attempt, Reply, None]:
        """The halves of ``part`` (a list that failed), the first before the second: a half of
        one event with its retries, a longer one called once and narrowed again if it fails."""
        nonlocal cut_short
        middle = len(part) // 2
        for half in (part[:middle], part[middle:]):
            if to_first and failures:
                return
            if to_first and failing is not None and failing():
                cut_short = True
                return
            runnable: list[Item] = []
            for item in half:
                (behind if item[1] in failures else runnable).append(item)
            if len(runnable) == 1:
                single = yield from _attempts(runnable, retry_delay, gives_up)
                if single is not None:
                    failures[runnable[0][1]] = replace(single, size=len(items))
            elif runnable and (yield (0.0, runnable)) is not None:
                yield from narrowed(runnable)

    yield from narrowed(items)
    if cut_short and not failures:
        # Not every event of the list was handled: it fails whole (the run fails anyway).
        return Outcome(((failure, items[0][1]),), tuple(items[1:]))
    return Outcome(tuple((failure, value) for value, failure in failures.items()), tuple(behind))


#: How :func:`drive` waits out a retry's delay: a name of its own, so that a test can record the
#: waits without taking ``time.sleep`` from every other thread of its process.
retry_sleep: Callable[[float], None] = time.sleep


def drive(plan: Generator[Attempt, Reply, Outcome], call: Callable[[list[Item]], Any],
          raised: tuple[Exception, str] | None = None) -> Outcome:
    """Run ``plan`` in this thread: wait, ``call(items)``, tell the plan how it went, until it is
    done; the outcome counts the calls after the first. ``raised``: the plan's first call was made
    already and raised this."""
    calls = 0 if raised is None else 1
    try:
        delay, items = next(plan)
        if raised is not None:
            delay, items = plan.send(raised)
        while True:
            if delay:
                retry_sleep(delay)
            calls += 1
            try:
                call(items)
            except Exception as error:
                reply: Reply = (error, traceback.format_exc())
            else:
                reply = None
            delay, items = plan.send(reply)
    except StopIteration as done:
        outcome: Outcome = done.value
        return replace(outcome, repeats=calls - 1)


def retry_after_failure(
    handler: Callable[[dict[str, Any]], Any], row: int, event: dict[str, Any], error: Exception,
    retry_delay: float, gives_up: Callable[[int], bool],
) -> tuple[Failure | None, int]:
    """Call ``handler(event)`` again after its first call raised ``error`` (being handled now),
    the n-th retry after ``retry_delay * 2**(n - 1)`` seconds (rule 2), until a call succeeds
    (``None``) or ``gives_up(attempts made)``: then the last attempt's :class:`Failure`. With it,
    the retries made."""
    plan = call_plan([(row, None, event)], retry_delay, gives_up, OnError.STOP)
    outcome = drive(plan, lambda items: handler(items[0][2]), (error, traceback.format_exc()))
    return (outcome.failures[0][0] if outcome.failures else None), outcome.repeats


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

    def resolve(self, outcome: Outcome) -> tuple[list[DeadLetter], Failure | None]:
        """What a call's ``outcome`` makes of its events (rules 3 and 5): the dead letters (its
        failures under ``on_error="dead-letter"``, then the events behind them), or the run's
        failure; every other event of the call was handled."""
        letters: list[DeadLetter] = []
        for failure, value in outcome.failures:
            result = self.failed(failure, value)
            if not isinstance(result, DeadLetter):
                return [], result
            letters.append(result)
        letters.extend(DeadLetter(row, event, self.poisoned[value], 0)
                       for row, value, event in outcome.behind)
        return letters, None
