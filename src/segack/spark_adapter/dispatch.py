"""Many events in flight inside one segment's task, never two of one sequencing value at once.

A task reads its events in order and numbers them: the event's *row* (0, 1, 2, ...). The
dispatcher starts each event's handler call as soon as three rules allow it:

1. **Order per key.** An event starts only after every earlier event with the same sequencing
   value (its key, under the per-key policy) has finished. Events of other keys overtake it.
2. **Concurrency.** At most ``concurrency`` calls run at once; events whose key is free wait
   for a slot in row order.
3. **Bounded pending.** The task reads a new event only while fewer than ``max_pending`` rows
   are read but not *committed* (``offer`` says no otherwise). A slow event holds the
   committed point; the others finish behind it, up to that bound.

Completions arrive in any order. Each is acked into an :class:`~segack.OffsetAcker` over rows,
whose committed point (:attr:`Dispatcher.committed_rows`: every row below it is done) is what
the task may record as done: a crash never skips an unfinished event.

The first handler failure stops the dispatcher: no further event starts, the calls in flight
finish, and :attr:`Dispatcher.failure` holds the failing row, event and error. The failing row
is never done, so the committed point stops before it. With ``on_error="dead-letter"`` a failure
stops only its key instead: the event and every later event of the same sequencing value become
*dead letters* (taken with :meth:`Dispatcher.take_dead_letters`, never handled in this run, done
for now), so a key's order is never broken, and the other keys go on. Keys *parked* by dead
letters of earlier runs (``parked``) are stopped from the start: each of their events is a dead
letter at once, whatever ``on_error`` says, unless the policy is ``concurrent`` (no order to keep).

A dispatcher is not itself a thread: ``offer`` and the waits are called by the task's thread.
A plain ``def`` handler runs on a pool of ``concurrency`` threads (at concurrency 1 with no
timeout, in the caller's thread, inside ``offer``); an ``async def`` handler runs
as up to ``concurrency`` tasks on one event loop, in a thread of its own. Passing ``start`` (which
receives each call as a function of no arguments) lets a test run plain calls in any order.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from segack._shared import SEQUENCING_POLICIES
from segack.errors import SegackValueError
from segack.kernel import OffsetAcker

__all__ = ["ON_ERROR", "PARKED", "POLICIES", "DeadLetter", "Dispatcher", "Failure", "Handling", "is_async",
           "retry_after_failure", "sequencing_value"]

#: What a failure (after its retries) stops: the run, or only its key (its events become dead letters).
ON_ERROR = ("stop", "dead-letter")

#: The error a dead letter records when its key was parked by dead letters of an earlier run.
PARKED = "waits behind its key's dead letters from an earlier run"

#: How the sequencing value of an event is chosen: its key, one value for all (one event in
#: flight), or the row itself (no order between any two events).
POLICIES = SEQUENCING_POLICIES


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine to await (an ``async def`` function, or an
    object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None))  # noqa: B004  (the method itself, not callable())


def _call_now(call: Callable[[], None]) -> None:
    call()


def sequencing_value(policy: str, row: int, key: Hashable) -> Hashable:
    """What orders an event under ``policy``: its key, one value for all, or its own row."""
    if policy == "per-key":
        return ("key", key)
    if policy == "sequential":
        return ("all",)
    return ("row", row)


def retry_after_failure(
    handler: Callable[[dict[str, Any]], Any], event: dict[str, Any], error: BaseException, retry_delay: float,
    gives_up: Callable[[int], bool],
) -> tuple[BaseException | None, str, int]:
    """Call ``handler(event)`` again after its first call raised ``error`` (being handled now),
    the n-th retry after ``retry_delay * 2**(n - 1)`` seconds, until a call succeeds or
    ``gives_up(attempts made)``. Returns the last error (``None``: a retry succeeded), its
    traceback and the attempts made."""
    text, attempt = traceback.format_exc(), 1
    while not gives_up(attempt):
        time.sleep(retry_delay * 2 ** (attempt - 1))
        attempt += 1
        try:
            handler(event)
        except Exception as again:
            error, text = again, traceback.format_exc()
        else:
            return None, "", attempt
    return error, text, attempt


@dataclass(frozen=True)
class Handling:
    """How a task calls the handler: ``concurrency`` calls at once (1: in the task's own thread),
    at most ``max_pending`` rows read but not committed (default ``4 * concurrency``), the
    sequencing ``policy`` (one of :data:`POLICIES`), ``retries`` more attempts for a call
    that raises, the n-th after ``retry_delay * 2**(n - 1)`` seconds, and a ``timeout`` in
    seconds per event (``None``: none). An ``async def`` call past its timeout is cancelled and
    counts as a failure (retried like one); a thread cannot be stopped, so a plain call past its
    timeout fails the run at once and is left behind."""

    concurrency: int = 1
    max_pending: int | None = None
    policy: str = "per-key"
    retries: int = 0
    retry_delay: float = 0.1
    timeout: float | None = None
    on_error: str = "stop"

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_pending"):
            value = getattr(self, name)
            if value is None and name == "max_pending":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SegackValueError(f"{name} must be a positive int, not {value!r}")
        if self.policy not in POLICIES:
            raise SegackValueError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise SegackValueError(f"retries must be a non-negative int, not {self.retries!r}")
        if (isinstance(self.retry_delay, bool) or not isinstance(self.retry_delay, (int, float))
                or not self.retry_delay >= 0):
            raise SegackValueError(f"retry_delay must be a non-negative number of seconds, not "
                                   f"{self.retry_delay!r}")
        if self.on_error not in ON_ERROR:
            raise SegackValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(
                self.timeout, (int, float)) or not self.timeout > 0):
            raise SegackValueError(
                f"timeout must be a positive number of seconds or None, not {self.timeout!r}")

    @property
    def pending_bound(self) -> int:
        """``max_pending``, or its default."""
        return 4 * self.concurrency if self.max_pending is None else self.max_pending

    @property
    def dispatched(self) -> bool:
        """Whether calls go through a :class:`Dispatcher`: more than one at a time, or a timeout
        (a watchdog thread). Otherwise the task calls the handler itself, one event after the
        other, with the same retries, dead letters and parked keys."""
        return self.concurrency > 1 or self.timeout is not None


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
    """The first handler call that raised."""

    row: int
    event: dict[str, Any]
    error: BaseException
    traceback: str
    #: How many times the call was made (1 + the retries it used).
    attempts: int = 1


class Dispatcher:
    """Runs ``handler(event)`` for offered events under the rules above.

    ``key_of(event)`` is the event's key (used by the ``per-key`` policy). Rejects
    (``ValueError``) a ``concurrency`` or ``max_pending`` below 1 and an unknown ``policy``.
    """

    def __init__(
        self,
        handler: Callable[[dict[str, Any]], Any],
        key_of: Callable[[dict[str, Any]], Hashable],
        *,
        concurrency: int,
        max_pending: int,
        policy: str = "per-key",
        start: Callable[[Callable[[], None]], Any] | None = None,
        retries: int = 0,
        retry_delay: float = 0.1,
        timeout: float | None = None,
        on_error: str = "stop",
        parked: Collection[Hashable] = frozenset(),
    ) -> None:
        Handling(concurrency, max_pending, policy, retries, retry_delay, timeout, on_error)  # checks them
        self.on_error = on_error
        # Keys with dead letters from earlier runs: their events wait behind those, as dead letters.
        self.parked = frozenset(parked) if policy != "concurrent" else frozenset()
        # Keys whose event failed (dead-letter mode), with that failure's text; and the dead
        # letters not yet taken by the task.
        self._poisoned: dict[Hashable, str] = {}
        self._dead: list[DeadLetter] = []
        self.retries = retries
        self.retry_delay = retry_delay
        self.timeout = timeout
        self.handler = handler
        self.key_of = key_of
        self.concurrency = concurrency
        self.max_pending = max_pending
        self.policy = policy
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_thread: threading.Thread | None = None
        if is_async(handler):
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever, name="segack-handler-loop",
                                                 daemon=True)
            self._loop_thread.start()
        elif start is None and concurrency == 1 and timeout is None:
            # One call at a time, never abandoned: the caller's thread makes it, inside offer.
            start = _call_now
        elif start is None:
            self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="segack-handler")
            start = self._pool.submit
        self._start = start
        self._lock = threading.Condition()
        self._acker = OffsetAcker()
        self._rows_read = 0
        self._in_flight = 0
        # Keys with an event running or ready to run, and the events held behind each.
        self._held: dict[Hashable, deque[tuple[int, dict[str, Any]]]] = {}
        # Events whose key is free, waiting for a slot: a heap, so the oldest row starts first
        # (rows are unique, so the keys and events are never compared).
        self._ready: list[tuple[int, Hashable, dict[str, Any]]] = []
        #: The first call that failed for good (with ``on_error="stop"``), or ``None``.
        self.failure: Failure | None = None
        #: The most rows ever read but not committed at once.
        self.peak_pending = 0
        # Plain calls running, with when they started, for the watchdog of timeouts; once one is
        # past its timeout the run fails and the dispatcher stops waiting for the calls left.
        self._running: dict[int, tuple[float, dict[str, Any]]] = {}
        self._abandoned = False
        self._closed = False
        self._watchdog: threading.Thread | None = None
        if timeout is not None and self._loop is None:
            self._watchdog = threading.Thread(target=self._watch, name="segack-handler-watchdog", daemon=True)
            self._watchdog.start()

    # ------------------------------------------------------------ what the task asks

    @property
    def committed_rows(self) -> int:
        """The number of rows before the first one not done: all of them are done."""
        with self._lock:
            return self._acker.next_index

    @property
    def in_flight(self) -> int:
        """Handler calls running now."""
        with self._lock:
            return self._in_flight

    @property
    def pending(self) -> int:
        """Rows read but not committed."""
        with self._lock:
            return self._rows_read - self._acker.next_index

    def offer(self, event: dict[str, Any]) -> bool:
        """Take the next row's event, unless ``max_pending`` rows are pending (``False``: wait
        with :meth:`wait_for_room`, then offer it again) or a call has failed (``False`` too)."""
        with self._lock:
            if self.failure is not None or self._rows_read - self._acker.next_index >= self.max_pending:
                return False
            row = self._rows_read
            self._rows_read += 1
            self.peak_pending = max(self.peak_pending, self._rows_read - self._acker.next_index)
            key = self._sequencing_value(row, event)
            if self.parked and self.key_of(event) in self.parked:
                self._dead_letter(row, event, PARKED, 0)
            elif key in self._poisoned:
                self._dead_letter(row, event, self._poisoned[key], 0)
            elif key in self._held:
                self._held[key].append((row, event))
            else:
                self._held[key] = deque()
                heapq.heappush(self._ready, (row, key, event))
            self._start_ready()
            return True

    def take_dead_letters(self) -> list[DeadLetter]:
        """The dead letters since the last call, in row order; they are done for now."""
        with self._lock:
            taken, self._dead = sorted(self._dead, key=lambda letter: letter.row), []
            return taken

    def skip(self) -> None:
        """Take the next row as already done (an earlier run did it): it is never handled."""
        with self._lock:
            row = self._rows_read
            self._rows_read += 1
            self._acker.ack(row)
            self._lock.notify_all()

    def wait_for_room(self, timeout: float | None = None) -> None:
        """Wait until a row can be offered, a call has failed, or ``timeout`` seconds pass."""
        with self._lock:
            self._lock.wait_for(
                lambda: self.failure is not None
                or self._rows_read - self._acker.next_index < self.max_pending, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no call is running or waiting to run (after a failure: until the calls in
        flight have finished). ``False`` if ``timeout`` seconds passed first."""
        with self._lock:
            return self._lock.wait_for(self._idle, timeout)

    def close(self) -> None:
        """Wait for the calls in flight (not for one past its timeout), then release the threads
        (and the event loop)."""
        self.drain()
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._watchdog is not None:
            self._watchdog.join()
        if self._pool is not None:
            self._pool.shutdown(wait=not self._abandoned, cancel_futures=True)
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join()
            self._loop.close()
            self._loop = None

    # ------------------------------------------------------------ inside

    def _sequencing_value(self, row: int, event: dict[str, Any]) -> Hashable:
        return sequencing_value(self.policy, row, self.key_of(event))

    def _idle(self) -> bool:
        return (self._in_flight == 0 or self._abandoned) and (self.failure is not None or not self._ready)

    def _watch(self) -> None:
        """Fail the run when a plain call runs past its timeout (the lock is taken here)."""
        assert self.timeout is not None
        with self._lock:
            while not self._closed and not self._abandoned:
                now = time.monotonic()
                late = [row for row, (began, _) in self._running.items() if now - began > self.timeout]
                if late:
                    row = min(late)
                    error = TimeoutError(f"the handler took more than {self.timeout} s")
                    if self.failure is None:
                        self.failure = Failure(row, self._running[row][1], error, f"TimeoutError: {error}\n")
                    self._abandoned = True
                    self._lock.notify_all()
                    return
                self._lock.wait(self.timeout / 4)

    def _start_ready(self) -> None:
        """Start ready events while slots are free (the lock is held)."""
        while self._ready and self._in_flight < self.concurrency and self.failure is None:
            row, key, event = heapq.heappop(self._ready)
            self._in_flight += 1
            if self._loop is not None:
                # Most calls start on the loop's own thread, as earlier ones finish: no hand-over.
                if threading.current_thread() is self._loop_thread:
                    self._spawn(row, key, event)
                else:
                    self._loop.call_soon_threadsafe(self._spawn, row, key, event)
            else:
                assert self._start is not None
                if self.timeout is not None:
                    self._running[row] = (time.monotonic(), event)
                self._start(functools.partial(self._call, row, key, event))

    def _dead_letter(self, row: int, event: dict[str, Any], error: str, attempts: int) -> None:
        """Record a dead letter and count its row done for now (the lock is held)."""
        self._dead.append(DeadLetter(row, event, error, attempts))
        self._acker.ack(row)
        self._lock.notify_all()

    def _gives_up(self, attempt: int) -> bool:
        """Whether a call that raised on ``attempt`` ends there: no retry left, or the run is failing."""
        return attempt > self.retries or self.failure is not None

    def _call(self, row: int, key: Hashable, event: dict[str, Any]) -> None:
        try:
            self.handler(event)
        except Exception as error:
            self._finished(row, key, event, *retry_after_failure(
                self.handler, event, error, self.retry_delay, self._gives_up))
        else:
            self._finished(row, key, event, None, "", 1)

    def _spawn(self, row: int, key: Hashable, event: dict[str, Any]) -> None:
        """Start an async call on the loop (its thread); the loop itself keeps tasks only weakly."""
        assert self._loop is not None
        task = self._loop.create_task(self._call_async(row, key, event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call_async(self, row: int, key: Hashable, event: dict[str, Any]) -> None:
        for attempt in range(1, self.retries + 2):
            try:
                if self.timeout is None:
                    await self.handler(event)
                else:
                    try:
                        await asyncio.wait_for(self.handler(event), self.timeout)
                    except TimeoutError:
                        raise TimeoutError(f"the handler took more than {self.timeout} s") from None
            except Exception as error:
                if self._gives_up(attempt):
                    self._finished(row, key, event, error, traceback.format_exc(), attempt)
                    return
                await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
            else:
                self._finished(row, key, event, None, "", attempt)
                return

    def _finished(self, row: int, key: Hashable, event: dict[str, Any], error: BaseException | None,
                  text: str, attempts: int) -> None:
        with self._lock:
            # Waiters wake up whatever happens here, so a fault in this bookkeeping cannot leave
            # the task waiting for a call that has ended.
            try:
                self._in_flight -= 1
                self._running.pop(row, None)
                if error is not None and self.on_error == "dead-letter":
                    # The key stops here: this event and those held behind it, now and later.
                    reason = f"{type(error).__name__}: {error}"
                    self._poisoned[key] = reason
                    self._dead_letter(row, event, reason, attempts)
                    for held_row, held_event in self._held.pop(key):
                        self._dead_letter(held_row, held_event, reason, 0)
                elif error is not None:
                    if self.failure is None:
                        self.failure = Failure(row, event, error, text, attempts)
                else:
                    self._acker.ack(row)
                    held = self._held[key]
                    if held:
                        next_row, next_event = held.popleft()
                        heapq.heappush(self._ready, (next_row, key, next_event))
                    else:
                        del self._held[key]
                self._start_ready()
            finally:
                self._lock.notify_all()
