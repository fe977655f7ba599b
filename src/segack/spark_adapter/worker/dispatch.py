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

Retries, failures, dead letters and parked keys follow the task's
:class:`~segack.spark_adapter.worker.sequencing.Rules`, as the task's own loop does at concurrency 1. The
first failure that stops the run stops the dispatcher: no further event starts, the calls in
flight finish, and :attr:`Dispatcher.failure` holds the failing row, event and error. The failing
row is never done, so the committed point stops before it. With ``on_error="dead-letter"`` a
failure stops only its key instead: the event, the events held behind it and every later event of
its sequencing value become dead letters (taken with :meth:`Dispatcher.take_dead_letters`, done
for now), so a key's order is never broken, and the other keys go on.

**Lists.** With ``batch_size`` the handler takes a list of events per call. A call's list is
taken in row order from the events whose value has no call in flight, with each value's later
events behind them (so a list may hold many events of one key, in its order), never an event of a
value another call holds. A list waits to fill up to ``batch_size``; it starts not full once the
task has nothing more to offer for now (:meth:`Dispatcher.send_partial`: the end of the batch
of input it has, a flush, the end) or when the pending bound is reached. Its retries and its
narrowing to the events that fail (to the first, under ``on_error="stop"``) follow
:func:`~segack.spark_adapter.worker.sequencing.call_plan`.

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
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Generator, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from segack._shared import SEQUENCING_POLICIES
from segack.errors import SegackTypeError
from segack.kernel import OffsetAcker
from segack.spark_adapter.handlers import is_async
from segack.spark_adapter.options import Handling, OnError
from segack.spark_adapter.worker.sequencing import (
    PARKED,
    Attempt,
    DeadLetter,
    Failure,
    Item,
    Outcome,
    Reply,
    Rules,
    call_plan,
    drive,
    retry_after_failure,
    sequencing_value,
)

__all__ = ["ON_ERROR", "PARKED", "POLICIES", "DeadLetter", "Dispatcher", "Failure", "Handling",
           "retry_after_failure", "sequencing_value"]

#: What a failure (after its retries) stops: the run, or only its key (its events become dead letters).
ON_ERROR = tuple(choice.value for choice in OnError)

#: How the sequencing value of an event is chosen: its key, one value for all (one event in
#: flight), or the row itself (no order between any two events).
POLICIES = SEQUENCING_POLICIES

#: How an async call waits out a retry's delay on the loop: a name of its own, as
#: :data:`~segack.spark_adapter.worker.sequencing.retry_sleep` is for a call in a thread.
retry_sleep_async: Callable[[float], Any] = asyncio.sleep


def _call_now(call: Callable[[], None]) -> None:
    call()


class Dispatcher:
    """Runs ``handler(event)`` (``handler(events)`` with a ``batch_size``) for offered events under
    the rules above.

    ``key_of(event)`` is the event's key (used by the ``per-key`` policy); ``handling`` says how
    calls are made (or give its settings as keywords: ``concurrency=8``, ...); ``parked`` keys
    have dead letters from earlier runs. ``start``, given each call as a function of no arguments,
    runs plain calls instead of the thread pool (a test's own order). A bad setting is an
    :class:`~segack.spark_adapter.OptionError`.
    """

    def __init__(
        self,
        handler: Callable[[dict[str, Any]], Any],
        key_of: Callable[[dict[str, Any]], Hashable],
        handling: Handling | None = None,
        *,
        parked: Collection[Hashable] = frozenset(),
        start: Callable[[Callable[[], None]], Any] | None = None,
        **settings: Any,
    ) -> None:
        if handling is None:
            handling = Handling(**settings)  # checks them
        elif settings:
            raise SegackTypeError("give a Handling or its settings as keywords, not both")
        self.handling = handling
        #: The task's sequencing rules: parked keys, poisoned keys
        #: (:mod:`~segack.spark_adapter.worker.sequencing`).
        self.rules = Rules(handling, key_of, parked)
        # The dead letters not yet taken by the task.
        self._dead: list[DeadLetter] = []
        self.retries = handling.retries
        self.retry_delay = handling.retry_delay
        self.timeout = timeout = handling.timeout
        self.handler = handler
        self.concurrency = concurrency = handling.concurrency
        self.max_pending = handling.pending_bound
        self.batched = handling.batch_size is not None
        self.batch_size = handling.batch_size or 1
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
        self._ready: list[Item] = []
        # Keys a call in flight holds, and how many events no call holds a key of (those a list
        # could take now).
        self._busy: set[Hashable] = set()
        self._available = 0
        # The task has nothing more to offer for now: lists start before they are full.
        self._partial = False
        # The task stopped: no call starts any more.
        self._stopped = False
        #: The first call that failed for good (with ``on_error="stop"``), or ``None``.
        self.failure: Failure | None = None
        #: The most rows ever read but not committed at once.
        self.peak_pending = 0
        #: Handler calls made again after a call raised (retries and narrowed parts), so far.
        self.repeats = 0
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

    def done_rows(self) -> tuple[int, int, list[tuple[int, int]], list[DeadLetter]]:
        """At one moment: the rows read, the rows committed, the runs ``(first, last)`` of rows done
        above the committed point (the acker's intervals), and the dead letters since the last take
        (taken: every dead letter's row counted done here is among them or taken before)."""
        with self._lock:
            taken, self._dead = sorted(self._dead, key=lambda letter: letter.row), []
            return self._rows_read, self._acker.next_index, self._acker.runs(), taken

    def offer(self, event: dict[str, Any]) -> bool:
        """Take the next row's event, unless ``max_pending`` rows are pending (``False``: wait
        with :meth:`wait_for_room`, then offer it again) or a call has failed (``False`` too)."""
        with self._lock:
            if self.failure is not None or self._rows_read - self._acker.next_index >= self.max_pending:
                return False
            row = self._rows_read
            self._rows_read += 1
            self._partial = False
            self.peak_pending = max(self.peak_pending, self._rows_read - self._acker.next_index)
            key = self.rules.value(row, event)
            letter = self.rules.set_aside(row, event, key) if self.rules.may_set_aside else None
            if letter is not None:
                self._dead_letter(letter)
            elif key in self._held:
                self._held[key].append((row, event))
                self._available += key not in self._busy
            else:
                self._held[key] = deque()
                heapq.heappush(self._ready, (row, key, event))
                self._available += 1
            # (a dead letter too: the pending rows may be at their bound now)
            self._start_ready()
            return True

    def send_partial(self) -> None:
        """The task has nothing more to offer for now: start the lists that wait to fill (until
        the next :meth:`offer`)."""
        with self._lock:
            self._partial = True
            self._start_ready()

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
            # A list waiting to fill may start now: the pending rows may be at their bound.
            self._start_ready()
            self._lock.notify_all()

    def wait_for_room(self, timeout: float | None = None) -> None:
        """Wait until a row can be offered, a call has failed, or ``timeout`` seconds pass."""
        with self._lock:
            self._lock.wait_for(
                lambda: self.failure is not None
                or self._rows_read - self._acker.next_index < self.max_pending, timeout)

    def stop(self) -> None:
        """Start no more calls: the task stopped (its run was fenced, or asked to stop); the events
        offered and not started stay not done. :meth:`close` then waits only for the calls in
        flight."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Start every call that can start (lists not full too), and wait until no call is running
        or waiting to run (after a failure: until the calls in flight have finished). ``False`` if
        ``timeout`` seconds passed first."""
        self.send_partial()
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

    def _idle(self) -> bool:
        return (self._in_flight == 0 or self._abandoned) and (
            self.failure is not None or self._stopped or not self._ready)

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
        """Start calls while slots are free and a call's events are ready (the lock is held)."""
        while self._may_start():
            items = self._take_list()
            self._in_flight += 1
            if self._loop is not None:
                # Most calls start on the loop's own thread, as earlier ones finish: no hand-over.
                if threading.current_thread() is self._loop_thread:
                    self._spawn(items)
                else:
                    self._loop.call_soon_threadsafe(self._spawn, items)
            else:
                assert self._start is not None
                if self.timeout is not None:
                    self._running[items[0][0]] = (time.monotonic(), items[0][2])
                self._start(functools.partial(self._call, items))

    def _may_start(self) -> bool:
        """Whether a call may start now (the lock is held): a slot is free, events are ready, the
        run goes on, and a list is full or has no reason to wait for more."""
        if self.failure is not None or self._stopped:
            return False
        if not self._ready or self._in_flight >= self.concurrency:
            return False
        return (self._available >= self.batch_size or self._partial
                or self._rows_read - self._acker.next_index >= self.max_pending)

    def _take_list(self) -> list[Item]:
        """The next call's events: up to ``batch_size`` in row order from the free keys, each key's
        later events following it; their keys become busy (the lock is held)."""
        items: list[Item] = []
        # The next event of each key taken so far, which may follow it into the list.
        followers: list[Item] = []
        while len(items) < self.batch_size and (self._ready or followers):
            if followers and (not self._ready or followers[0][0] < self._ready[0][0]):
                item = heapq.heappop(followers)
            else:
                item = heapq.heappop(self._ready)
                self._busy.add(item[1])
                self._available -= 1 + len(self._held[item[1]])
            items.append(item)
            held = self._held[item[1]]
            if held and len(items) < self.batch_size:
                row, event = held.popleft()
                heapq.heappush(followers, (row, item[1], event))
        for row, key, event in followers:
            self._held[key].appendleft((row, event))
        return items

    def _dead_letter(self, letter: DeadLetter) -> None:
        """Record a dead letter and count its row done for now (the lock is held)."""
        self._dead.append(letter)
        self._acker.ack(letter.row)
        self._lock.notify_all()

    def _gives_up(self, attempt: int) -> bool:
        """Whether a call that raised on ``attempt`` ends there: no retry left, or the run is failing."""
        return attempt > self.retries or self.failure is not None

    def _plan(self, items: list[Item]) -> Generator[Attempt, Reply, Outcome]:
        """The call's plan: its retries, and its narrowing if it is a list."""
        return call_plan(items, self.retry_delay, self._gives_up, self.handling.on_error,
                         lambda: self.failure is not None)

    def _arguments(self, items: list[Item]) -> Any:
        """What the handler is called with: the list of events, or the one event."""
        return [item[2] for item in items] if self.batched else items[0][2]

    def _call(self, items: list[Item]) -> None:
        try:
            self.handler(self._arguments(items))
        except Exception as error:
            outcome = drive(self._plan(items), lambda part: self.handler(self._arguments(part)),
                            (error, traceback.format_exc()))
        else:
            outcome = Outcome()
        self._finished(items, outcome)

    def _spawn(self, items: list[Item]) -> None:
        """Start an async call on the loop (its thread); the loop itself keeps tasks only weakly."""
        assert self._loop is not None
        task = self._loop.create_task(self._call_async(items))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call_async(self, items: list[Item]) -> None:
        """Drive the call's plan on the loop: each of its calls awaited, within the timeout."""
        plan = self._plan(items)
        calls = 0
        try:
            delay, part = next(plan)
            while True:
                if delay:
                    await retry_sleep_async(delay)
                calls += 1
                try:
                    await self._await_handler(part)
                except Exception as error:
                    reply: Reply = (error, traceback.format_exc())
                else:
                    reply = None
                delay, part = plan.send(reply)
        except StopIteration as done:
            self._finished(items, replace(done.value, repeats=calls - 1))

    async def _await_handler(self, items: list[Item]) -> None:
        if self.timeout is None:
            await self.handler(self._arguments(items))
            return
        try:
            await asyncio.wait_for(self.handler(self._arguments(items)), self.timeout)
        except TimeoutError:
            raise TimeoutError(f"the handler took more than {self.timeout} s") from None

    def _finished(self, items: list[Item], outcome: Outcome) -> None:
        """The call with ``items`` has ended as ``outcome`` says: failures that stop the run or set
        their keys aside; every other event done; its keys free again."""
        with self._lock:
            # Waiters wake up whatever happens here, so a fault in this bookkeeping cannot leave
            # the task waiting for a call that has ended.
            try:
                self._in_flight -= 1
                self.repeats += outcome.repeats
                self._running.pop(items[0][0], None)
                letters, failure = self.rules.resolve(outcome)
                if failure is not None:
                    self.failure = self.failure or failure
                else:
                    self._settle(items, letters)
                self._start_ready()
            finally:
                self._lock.notify_all()

    def _settle(self, items: list[Item], letters: list[DeadLetter]) -> None:
        """A call that did not stop the run: its events done or set aside (``letters``), its keys'
        next events ready, or (a key that failed) set aside too (the lock is held)."""
        for letter in letters:
            self._dead_letter(letter)
        unhandled = {letter.row for letter in letters}
        for row, _, _ in items:
            if row not in unhandled:
                self._acker.ack(row)
        for key in dict.fromkeys(item[1] for item in items):
            self._busy.discard(key)
            if key in self.rules.poisoned:
                # The key stops here: the events held behind it, now and later.
                for held_row, held_event in self._held.pop(key):
                    self._dead_letter(DeadLetter(held_row, held_event, self.rules.poisoned[key], 0))
                continue
            held = self._held[key]
            if held:
                self._available += len(held)
                next_row, next_event = held.popleft()
                heapq.heappush(self._ready, (next_row, key, next_event))
            else:
                del self._held[key]
