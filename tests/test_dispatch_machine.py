"""The in-task dispatcher alone (no Spark), driven by a state machine.

The machine offers events of random keys, finishes the running calls in a random order, makes
some of them fail, with single events or lists (``batch_size``), and checks after every step that
no key is in two calls in flight, that no event started before its key's previous one finished
(or came earlier in its list), that the committed point never passes an unfinished event, that
the bounds on calls in flight and pending rows hold, and that the dispatcher is never stuck.
"""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from segack.errors import SegackTypeError
from segack.spark_adapter import OptionError
from segack.spark_adapter.handlers import is_async
from segack.spark_adapter.options import Handling
from segack.spark_adapter.worker.dispatch import ON_ERROR, PARKED, POLICIES, Dispatcher
from tests.outcomes import exactly


class DispatcherMachine(RuleBasedStateMachine):
    @initialize(concurrency=st.integers(1, 4), extra=st.integers(0, 6), policy=st.sampled_from(POLICIES),
                on_error=st.sampled_from(ON_ERROR), parked=st.sets(st.sampled_from("abcd"), max_size=2),
                batch_size=st.sampled_from([None, 1, 2, 3]))
    def setup(self, concurrency, extra, policy, on_error, parked, batch_size):
        self.policy = policy
        self.batch_size = batch_size
        # Keys with dead letters from an earlier run: their events must never run (but with the
        # concurrent policy, which keeps no order).
        self.parked = parked if policy != "concurrent" else set()
        self.parked_rows: set[int] = set()
        self.on_error = on_error
        self.dead: dict[int, int] = {}  # row -> attempts, of the dead letters taken
        self.concurrency = concurrency
        self.max_pending = concurrency + extra
        self.started: list = []          # calls started and not yet run, as thunks
        self.running: dict[int, str] = {}  # row -> key, for calls started and not finished
        self.calls: list[list[int]] = []  # the rows of each call started and not finished
        self.finished: set[int] = set()
        self.failed: set[int] = set()
        self.skipped: set[int] = set()
        self.key_rows: dict[str, list[int]] = {}
        self.fail_next: set[int] = set()
        self.rows = 0
        self.dispatcher = Dispatcher(self._handle, lambda event: event["key"], concurrency=concurrency,
                                     max_pending=self.max_pending, policy=policy, batch_size=batch_size,
                                     start=self.started.append, on_error=on_error, parked=parked)

    def _handle(self, argument):
        events = argument if self.batch_size is not None else [argument]
        assert isinstance(argument, list) == (self.batch_size is not None)
        rows = [event["row"] for event in events]
        assert 1 <= len(rows) <= (self.batch_size or 1) and rows == sorted(rows)
        for event in events:
            row = event["row"]
            # Order per key: every earlier row of this key has finished, or is earlier in this list.
            if self.policy != "concurrent":
                earlier = [r for r in self.key_rows[self._sequence(event["key"])] if r < row]
                unfinished = [r for r in earlier if r not in self.finished and r not in self.skipped
                              and r not in self.parked_rows and r not in rows]
                # (a dead letter is never finished: no later event of its key may run; a parked key's
                # events are set aside and hold back no other key)
                assert unfinished == [], f"row {row} ran before rows {unfinished} of its key"
            assert row in self.running
            assert event["key"] not in self.parked, f"row {row} of parked key {event['key']} ran"
        if self.fail_next.intersection(rows):
            # A list that fails is narrowed: an event fails for good only alone.
            if len(rows) == 1:
                self.failed.add(rows[0])
            raise RuntimeError(f"a row of {rows} fails")
        self.finished.update(rows)

    def _sequence(self, key):
        if self.policy == "per-key":
            return key
        return "all" if self.policy == "sequential" else None

    @rule(key=st.sampled_from("abcd"), fails=st.booleans())
    def offer(self, key, fails):
        row = self.rows
        full = self.dispatcher.failure is not None or row - self.dispatcher.committed_rows >= self.max_pending
        if fails:
            self.fail_next.add(row)
        self.key_rows.setdefault(self._sequence(key), []).append(row)
        before = len(self.started)
        accepted = self.dispatcher.offer({"row": row, "key": key})
        assert accepted == (not full)
        if not accepted:
            self.fail_next.discard(row)
            self.key_rows[self._sequence(key)].remove(row)
            return
        self.rows += 1
        if key in self.parked:
            self.parked_rows.add(row)
        self._note_started(before)

    def _note_started(self, before):
        # Which calls the dispatcher started is its choice: read their rows off the thunks.
        for position in range(before, len(self.started)):
            (items,) = self.started[position].args
            self.calls.append([row for row, _, _ in items])
            for row, _, event in items:
                self.running[row] = event["key"]

    @rule()
    def skip(self):
        if self.dispatcher.failure is None and self.rows - self.dispatcher.committed_rows < self.max_pending:
            self.skipped.add(self.rows)
            before = len(self.started)
            self.dispatcher.skip()
            self.rows += 1
            self._note_started(before)

    @precondition(lambda self: self.started)
    @rule(data=st.data())
    def finish_one(self, data):
        thunk = self.started.pop(data.draw(st.integers(0, len(self.started) - 1)))
        (items,) = thunk.args
        before = len(self.started)
        thunk()
        self.calls.remove([row for row, _, _ in items])
        for row, _, _ in items:
            del self.running[row]
        self._note_started(before)

    @rule()
    def send_partial(self):
        before = len(self.started)
        self.dispatcher.send_partial()
        self._note_started(before)

    @invariant()
    def rules_hold(self):
        if not hasattr(self, "dispatcher"):
            return
        dispatcher = self.dispatcher
        for letter in dispatcher.take_dead_letters():
            assert letter.row not in self.dead and letter.row not in self.finished
            self.dead[letter.row] = letter.attempts
            assert (letter.row in self.parked_rows) == (letter.error == PARKED)
        # Every event of a parked key is a dead letter at once, never called.
        assert self.parked_rows <= set(self.dead)
        # No key is in two calls in flight (the per-key and sequential policies).
        if self.policy != "concurrent":
            keys = [key for call in self.calls for key in {self._sequence(self.running[row]) for row in call}]
            assert len(keys) == len(set(keys)), self.calls
        assert dispatcher.in_flight == len(self.calls) <= self.concurrency
        # The committed point never passes an event that is not done.
        done = self.finished | self.skipped | set(self.dead)
        committed = dispatcher.committed_rows
        assert all(row in done for row in range(committed))
        # (A run that failed commits no row of the list it failed in: its rows handled while it was
        # narrowed are handled again by the next run.)
        assert committed == self.rows or committed not in done or dispatcher.failure is not None
        assert 0 <= dispatcher.pending == self.rows - committed <= self.max_pending
        assert dispatcher.peak_pending <= self.max_pending
        if self.failed and self.on_error == "stop":
            assert dispatcher.failure is not None and committed <= min(self.failed)
        if dispatcher.failure is not None:
            # The run's failure is an event that failed alone (a list's, narrowed to it).
            assert self.on_error == "stop" and dispatcher.failure.row in self.failed
        if self.on_error == "dead-letter":
            # A failure stops only its key: the failed event and its key's later ones are dead
            # letters, and the run goes on.
            assert dispatcher.failure is None
            assert {row for row, attempts in self.dead.items() if attempts} == self.failed
            if self.policy == "concurrent":
                assert set(self.dead) == self.failed
            else:
                # Within a key, the first dead letter is a failure, and nothing after it ran.
                for rows in self.key_rows.values():
                    dead = sorted(row for row in rows if row in self.dead and row not in self.parked_rows)
                    if dead:
                        assert dead[0] in self.failed
                        assert not [row for row in rows if row > dead[0] and row in self.finished]

    @invariant()
    def never_stuck(self):
        """The pending rows at their bound with no call in flight would refuse every offer forever."""
        if hasattr(self, "dispatcher") and self.dispatcher.failure is None:
            assert self.dispatcher.in_flight or self.dispatcher.pending < self.max_pending

    @invariant()
    def runs_whatever_it_can(self):
        """A free slot is never left idle while an event whose key is free waits, but for a list
        that waits to fill (before the pending bound, with the task still offering)."""
        if not hasattr(self, "dispatcher") or self.dispatcher.failure is not None:
            return
        if self.policy == "concurrent":
            waiting = (self.rows - len(self.finished) - len(self.skipped) - len(self.running)
                       - len(self.dead))
            filling = waiting < (self.batch_size or 1) and self.dispatcher.pending < self.max_pending
            assert waiting == 0 or len(self.calls) == self.concurrency or filling


TestDispatcher = DispatcherMachine.TestCase


#: Seconds a test waits for a dispatcher before it fails: a dispatcher that forgets to wake its
#: caller must fail the test, not hang it.
PATIENCE = 10


def _offer_all(dispatcher, events):
    """Offer each event in turn, waiting for room; stop at the first failure. Then wait for the
    calls in flight and close the dispatcher."""
    deadline = time.monotonic() + PATIENCE
    for event in events:
        while not dispatcher.offer(event):
            if dispatcher.failure is not None:
                break
            assert time.monotonic() < deadline, "the dispatcher never made room"
            dispatcher.wait_for_room(0.5)
        if dispatcher.failure is not None:
            break
    assert dispatcher.drain(PATIENCE), "the calls in flight never finished"
    dispatcher.close()


def _rows(count):
    return [{"row": row} for row in range(count)]


def test_calls_run_on_threads_in_key_order_and_the_committed_point_reaches_the_end():
    """With the real thread pool: many keys, every call made once, each key's calls in order."""
    seen: dict[int, list[int]] = {}
    guard = threading.Lock()
    running: set[int] = set()
    overlaps = []

    def handle(event):
        with guard:
            if event["key"] in running:
                overlaps.append(event)
            running.add(event["key"])
        time.sleep(0.0002)  # long enough for a second call of the same key to be seen
        with guard:
            seen.setdefault(event["key"], []).append(event["row"])
            running.discard(event["key"])

    dispatcher = Dispatcher(handle, lambda event: event["key"], concurrency=8, max_pending=32)
    rows = [{"row": row, "key": row % 5} for row in range(2000)]  # fewer keys than calls at once
    _offer_all(dispatcher, rows)
    assert overlaps == []
    assert dispatcher.committed_rows == len(rows)
    assert sorted(row for key_rows in seen.values() for row in key_rows) == list(range(len(rows)))
    assert all(key_rows == sorted(key_rows) for key_rows in seen.values())
    assert dispatcher.peak_pending <= 32


def test_async_calls_run_as_tasks_on_one_loop_in_key_order():
    """An ``async def`` handler: calls overlap on one event loop, each key's in row order."""
    import asyncio

    seen: dict[int, list[int]] = {}
    running: set[int] = set()
    overlaps = []
    most = 0

    async def handle(event):
        nonlocal most
        if event["key"] in running:
            overlaps.append(event)
        running.add(event["key"])
        most = max(most, len(running))
        await asyncio.sleep(0.001)
        seen.setdefault(event["key"], []).append(event["row"])
        running.discard(event["key"])

    dispatcher = Dispatcher(handle, lambda event: event["key"], concurrency=16, max_pending=64)
    rows = [{"row": row, "key": row % 7} for row in range(1000)]  # fewer keys than calls at once
    _offer_all(dispatcher, rows)
    assert overlaps == [] and most > 1
    assert dispatcher.committed_rows == len(rows)
    assert all(key_rows == sorted(key_rows) for key_rows in seen.values())
    assert sum(len(key_rows) for key_rows in seen.values()) == len(rows)


def test_an_async_failure_stops_new_calls_and_holds_the_committed_point():
    async def handle(event):
        if event["row"] == 40:
            raise ValueError("no")

    dispatcher = Dispatcher(handle, lambda event: event["row"] % 7, concurrency=4, max_pending=8)
    _offer_all(dispatcher, _rows(100))
    assert dispatcher.failure is not None and dispatcher.failure.row == 40
    assert "ValueError: no" in dispatcher.failure.traceback
    assert dispatcher.committed_rows <= 40


def _flaky(failures_per_row):
    """A handler whose call for row r raises its first ``failures_per_row[r]`` times."""
    calls: dict[int, int] = {}

    def handle(event):
        calls[event["row"]] = calls.get(event["row"], 0) + 1
        if calls[event["row"]] <= failures_per_row.get(event["row"], 0):
            raise ConnectionError(f"row {event['row']} not yet")

    return handle, calls


def test_a_call_that_raises_is_retried_with_growing_delays_and_then_succeeds():
    handle, calls = _flaky({3: 2, 5: 1})
    dispatcher = Dispatcher(handle, lambda event: event["row"] % 4, concurrency=3, max_pending=8,
                            retries=2, retry_delay=0.01)
    began = time.monotonic()
    _offer_all(dispatcher, _rows(10))
    assert dispatcher.failure is None and dispatcher.committed_rows == 10
    assert (calls[3], calls[5], calls[4]) == (3, 2, 1)
    assert dispatcher.repeats == 3
    assert time.monotonic() - began >= 0.01 + 0.02  # row 3 waited 0.01 s, then 0.02 s


def test_a_call_that_keeps_raising_fails_after_its_retries_with_the_attempt_count():
    handle, calls = _flaky({3: 5})
    dispatcher = Dispatcher(handle, lambda event: event["row"], concurrency=2, max_pending=4,
                            retries=2, retry_delay=0)
    _offer_all(dispatcher, _rows(10))
    assert dispatcher.failure is not None and dispatcher.failure.row == 3
    assert dispatcher.failure.attempts == calls[3] == 3
    assert dispatcher.committed_rows <= 3


def test_a_thread_past_its_timeout_fails_the_run_without_waiting_for_it():
    release = threading.Event()

    def handle(event):
        if event["row"] == 2:
            release.wait(10)

    dispatcher = Dispatcher(handle, lambda event: event["row"], concurrency=2, max_pending=4, timeout=0.1)
    began = time.monotonic()
    _offer_all(dispatcher, _rows(50))
    release.set()
    assert time.monotonic() - began < 5
    assert dispatcher.failure is not None and dispatcher.failure.row == 2
    assert isinstance(dispatcher.failure.error, TimeoutError)
    assert dispatcher.committed_rows <= 2


def test_an_async_call_past_its_timeout_is_cancelled_and_retried():
    import asyncio

    attempts: dict[int, int] = {}

    async def handle(event):
        attempts[event["row"]] = attempts.get(event["row"], 0) + 1
        if event["row"] == 3 and attempts[3] == 1:
            await asyncio.sleep(10)

    dispatcher = Dispatcher(handle, lambda event: event["row"], concurrency=4, max_pending=8, timeout=0.1,
                            retries=1, retry_delay=0)
    began = time.monotonic()
    _offer_all(dispatcher, _rows(20))
    assert time.monotonic() - began < 5
    assert dispatcher.failure is None and dispatcher.committed_rows == 20 and attempts[3] == 2


def test_an_async_call_past_its_timeout_without_retries_fails_with_a_timeout():
    import asyncio

    async def handle(event):
        if event["row"] == 3:
            await asyncio.sleep(10)

    dispatcher = Dispatcher(handle, lambda event: event["row"], concurrency=4, max_pending=8, timeout=0.1)
    _offer_all(dispatcher, _rows(20))
    assert dispatcher.failure is not None and dispatcher.failure.row == 3
    assert isinstance(dispatcher.failure.error, TimeoutError)
    assert "more than 0.1 s" in str(dispatcher.failure.error)


@pytest.mark.parametrize("arguments", [
    {"concurrency": 0, "max_pending": 1}, {"concurrency": 1, "max_pending": 0},
    {"concurrency": True, "max_pending": 1}, {"concurrency": 1, "max_pending": 1, "policy": "any"},
    {"concurrency": 1, "max_pending": 1, "retries": -1},
    {"concurrency": 1, "max_pending": 1, "retry_delay": -1},
    {"concurrency": 1, "max_pending": 1, "timeout": 0},
])
def test_bad_settings_are_refused(arguments):
    with pytest.raises(OptionError):
        Dispatcher(lambda event: None, lambda event: None, start=lambda thunk: None, **arguments)


class _Scripted:
    """A handler that records each call (its events' rows) and raises on chosen rows: always
    (``failing``) or on their first call only (``flaky``); a list raises for its first such row."""

    def __init__(self, failing, flaky):
        self.failing, self.flaky = failing, flaky
        self.calls = []
        self.times: dict[int, int] = {}

    def __call__(self, argument):
        events = argument if isinstance(argument, list) else [argument]
        self.calls.append(tuple(event["ts"] for event in events))
        failed = None
        for event in events:
            row = event["ts"]
            self.times[row] = self.times.get(row, 0) + 1
            if failed is None and (row in self.failing or (row in self.flaky and self.times[row] == 1)):
                failed = row
        if failed is not None:
            raise RuntimeError(f"row {failed} fails")


def _one_task(tmp_path, name, handling, parked, keys, failing, flaky):
    """Run one segment's task over ``keys`` (one event per row, in order) outside Spark."""
    import numpy as np
    import pyarrow as pa

    from segack.spark_adapter.options import RunOptions
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.tokens import KeyGroupTokens
    from segack.spark_adapter.worker.task import KG, TIE, TaskPlan, TaskStart, run_task

    store = CheckpointStore(str(tmp_path / name))
    handler = _Scripted(failing, flaky)
    plan = TaskPlan(store=store.for_tasks("run", 0), handler=handler, columns=("user", "ts"), key="user",
                    order="ts", options=RunOptions(flush_every=7, flush_interval=60.0, handling=handling),
                    start=TaskStart.of(KeyGroupTokens.empty(0, pa.null(), pa.null())),
                    parked=frozenset(parked))
    batch = pa.RecordBatch.from_pydict({"user": keys, "ts": list(range(len(keys))),
                                        KG: np.zeros(len(keys), np.int32),
                                        TIE: np.arange(len(keys), dtype=np.int64)})
    [result] = run_task(plan, iter([batch.slice(0, len(keys) // 2), batch.slice(len(keys) // 2)]))
    letters = store.read_dead_letters()
    dead = {} if letters is None else dict(zip(letters.column("ts").to_pylist(), zip(
        letters.column("__segack_error").to_pylist(), letters.column("__segack_attempts").to_pylist(),
        strict=True), strict=True))
    failure = result.column("failure")[0].as_py()
    error = None if failure is None else pickle.loads(failure)
    return {"calls": handler.calls, "dead": dead, "handled": result.column("handled")[0].as_py(),
            "peak_pending": result.column("peak_pending")[0].as_py(),
            "dead_letters": result.column("dead_letters")[0].as_py(),
            "retries": result.column("retries")[0].as_py(),
            "failure": None if error is None else str(error),
            "failed_at": None if error is None else error.order}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_failing_list_of_kafka_records_stops_the_run_naming_the_record_that_failed(tmp_path, concurrency):
    """Under on_error="stop" a list that fails is narrowed to the record that fails alone: the
    run's error names it (topic, partition, offset), not the list's first record."""
    import numpy as np
    import pyarrow as pa

    from segack.spark_adapter.options import Handling, RunOptions
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.tokens import KeyGroupTokens
    from segack.spark_adapter.worker.task import KG, TIE, TaskPlan, TaskStart, run_task

    calls = []

    def handler(records):
        calls.append([record["offset"] for record in records])
        if any(record["offset"] == 506 for record in records):
            raise ValueError("cannot apply")

    store = CheckpointStore(str(tmp_path / "checkpoint"))
    handling = Handling(batch_size=8, concurrency=concurrency, retries=1, retry_delay=0)
    plan = TaskPlan(store=store.for_tasks("run", 0), handler=handler,
                    columns=("key", "topic", "partition", "offset"), key="key", order="offset",
                    options=RunOptions(handling=handling), start=TaskStart.of(KeyGroupTokens.empty(
                        0, pa.null(), pa.null())))
    batch = pa.RecordBatch.from_pydict({"key": ["u1", "u2"] * 4, "topic": ["orders"] * 8,
                                        "partition": [3] * 8, "offset": list(range(500, 508)),
                                        KG: np.zeros(8, np.int32), TIE: np.arange(8, dtype=np.int64)})
    [result] = run_task(plan, iter([batch]))
    error = pickle.loads(result.column("failure")[0].as_py())
    assert (error.key, error.order, error.record) == ("u1", 506, "orders/3 at offset 506")
    assert str(error).startswith("handler failed on the event with key 'u1' and order 506 (record orders/3 "
                                 "at offset 506, ")
    assert error.reason == ("ValueError: cannot apply (after 2 attempts, called alone after its list of 8 "
                            "events failed)")
    assert calls[-2:] == [[506], [506]]  # alone, with its retry; nothing after it was called
    assert result.column("handled")[0].as_py() == 0  # the list's events are handled again on resume


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.sampled_from("abcd"), min_size=2, max_size=30), data=st.data(),
       policy=st.sampled_from(POLICIES), on_error=st.sampled_from(ON_ERROR), retries=st.integers(0, 1),
       parked=st.sets(st.sampled_from("abcd"), max_size=2))
def test_one_call_at_a_time_the_tasks_own_loop_does_what_the_dispatcher_does(
        tmp_path_factory, keys, data, policy, on_error, retries, parked):
    """At concurrency 1 a task calls the handler itself; with a timeout it goes through the
    dispatcher. Same calls, in the same order, same dead letters, same failure."""
    from segack.spark_adapter.worker.dispatch import Handling

    rows = range(len(keys))
    failing = data.draw(st.sets(st.sampled_from(rows), max_size=3))
    flaky = data.draw(st.sets(st.sampled_from(rows), max_size=3))
    tmp_path = tmp_path_factory.mktemp("twins")
    loop = Handling(policy=policy, retries=retries, retry_delay=0, on_error=on_error)
    dispatched = Handling(policy=policy, retries=retries, retry_delay=0, on_error=on_error, timeout=600.0)
    assert not loop.dispatched and dispatched.dispatched
    mine = _one_task(tmp_path, "loop", loop, parked, keys, failing, flaky)
    theirs = _one_task(tmp_path, "dispatcher", dispatched, parked, keys, failing, flaky)
    if mine["failure"] is not None:
        # The run stops at the failing row. The dispatcher may have read a little further and
        # set a parked key's events aside there (a resume sets them aside again); nothing else.
        failed_at = mine["calls"][-1][0]
        for outcome in (mine, theirs):
            outcome["dead"] = {row: why for row, why in outcome.pop("dead").items() if row < failed_at}
            del outcome["dead_letters"]
    del mine["peak_pending"], theirs["peak_pending"]  # the dispatcher's thread reads on meanwhile
    assert mine == theirs
    assert mine["retries"] == len(mine["calls"]) - len(set(mine["calls"]))  # calls after each event's first


def _dispatcher_alone(handling, parked, keys, failing, flaky):
    """``keys`` (one event per row) offered to a dispatcher that calls inline, one call at a
    time, in the two halves :func:`_one_task` gives its task (each half's end a ``send_partial``);
    what it did, as :func:`_one_task` reports it."""
    handler = _Scripted(failing, flaky)
    dispatcher = Dispatcher(handler, lambda event: event["user"], handling, parked=parked)
    events = [{"user": key, "ts": row} for row, key in enumerate(keys)]
    for half in (events[:len(keys) // 2], events[len(keys) // 2:]):
        for event in half:
            assert dispatcher.offer(event) or dispatcher.failure is not None  # calls inline: room
            if dispatcher.failure is not None:
                break
        dispatcher.send_partial()
    dispatcher.close()
    failure = dispatcher.failure
    return {"calls": handler.calls, "handled": dispatcher.committed_rows,
            "dead": {letter.event["ts"]: (letter.error, letter.attempts)
                     for letter in dispatcher.take_dead_letters()},
            "retries": dispatcher.repeats, "peak_pending": dispatcher.peak_pending,
            "failed_at": None if failure is None else failure.event["ts"]}


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.sampled_from("abcd"), min_size=2, max_size=30), data=st.data(),
       policy=st.sampled_from(POLICIES), on_error=st.sampled_from(ON_ERROR), retries=st.integers(0, 1),
       parked=st.sets(st.sampled_from("abcd"), max_size=2), batch_size=st.integers(1, 5),
       max_pending=st.sampled_from([None, 1, 2, 4]))
def test_lists_one_call_at_a_time_the_tasks_own_loop_does_what_the_dispatcher_does(
        tmp_path_factory, keys, data, policy, on_error, retries, parked, batch_size, max_pending):
    """With lists at concurrency 1 the task calls the handler itself too: the same lists (cut where
    the dispatcher starts them: full, at the pending bound, at a batch's end), the same narrowing
    and retries, dead letters, failure and rows held back as a dispatcher calling inline."""
    from segack.spark_adapter.worker.dispatch import Handling

    rows = range(len(keys))
    failing = data.draw(st.sets(st.sampled_from(rows), max_size=3))
    flaky = data.draw(st.sets(st.sampled_from(rows), max_size=3))
    handling = Handling(policy=policy, retries=retries, retry_delay=0, on_error=on_error,
                        batch_size=batch_size, max_pending=max_pending)
    assert not handling.dispatched
    mine = _one_task(tmp_path_factory.mktemp("lists"), "loop", handling, parked, keys, failing, flaky)
    del mine["failure"], mine["dead_letters"]  # the error's text and the dead letters' count
    assert mine == _dispatcher_alone(handling, frozenset(parked), keys, failing, flaky)


def _sleeps(monkeypatch):
    """Record the pauses between retries instead of taking them, in a thread and on the loop; the
    process's other threads keep ``time.sleep`` and ``asyncio.sleep`` (a polling loop given one
    that never waits spun until a test worker ran out of memory)."""
    import asyncio

    from segack.spark_adapter.worker import dispatch, sequencing

    pauses = []

    async def asleep(seconds):
        pauses.append(seconds)
        await asyncio.sleep(0)  # it still lets the loop's other calls run, as a pause would

    monkeypatch.setattr(sequencing, "retry_sleep", pauses.append)
    monkeypatch.setattr(dispatch, "retry_sleep_async", asleep)
    return pauses


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_retries_wait_the_delay_then_twice_as_long_each_time_and_count_every_attempt(monkeypatch, kind):
    pauses = _sleeps(monkeypatch)
    calls = []

    def fail(event):
        calls.append(event["row"])
        raise ConnectionError("down")

    async def fail_async(event):
        fail(event)

    handler = fail if kind == "thread" else fail_async
    dispatcher = Dispatcher(handler, lambda event: event["row"], concurrency=2, max_pending=2, retries=3,
                            retry_delay=0.25)
    _offer_all(dispatcher, _rows(1))
    assert pauses == [0.25, 0.5, 1.0] and calls == [0, 0, 0, 0] and dispatcher.repeats == 3
    assert dispatcher.failure.attempts == 4 and dispatcher.failure.event == {"row": 0}
    assert "ConnectionError: down" in dispatcher.failure.traceback


def test_an_async_failure_in_dead_letter_mode_sets_its_key_aside_and_the_others_go_on():
    import asyncio

    async def handle(event):
        await asyncio.sleep(0.001)
        if event["row"] == 1:
            raise ValueError("bad row")

    dispatcher = Dispatcher(handle, lambda event: event["row"] % 2, concurrency=2, max_pending=4,
                            on_error="dead-letter", retries=1, retry_delay=0)
    _offer_all(dispatcher, _rows(8))
    assert dispatcher.failure is None and dispatcher.committed_rows == 8
    letters = dispatcher.take_dead_letters()
    assert [(letter.row, letter.attempts, letter.error) for letter in letters] == [
        (1, 2, "ValueError: bad row"), (3, 0, "ValueError: bad row"), (5, 0, "ValueError: bad row"),
        (7, 0, "ValueError: bad row")]
    assert [letter.event for letter in letters] == [{"row": row} for row in (1, 3, 5, 7)]


def test_waiting_for_room_waits_while_the_pending_rows_are_at_their_bound():
    release = threading.Event()
    dispatcher = Dispatcher(lambda event: release.wait(PATIENCE), lambda event: event["row"], concurrency=2,
                            max_pending=2)
    assert dispatcher.offer({"row": 0}) and dispatcher.offer({"row": 1})
    assert not dispatcher.offer({"row": 2})
    began = time.monotonic()
    dispatcher.wait_for_room(0.2)
    assert time.monotonic() - began >= 0.2 and dispatcher.pending == 2 and dispatcher.in_flight == 2
    assert not dispatcher.drain(0.05)
    release.set()
    dispatcher.wait_for_room(PATIENCE)
    assert dispatcher.offer({"row": 2})
    assert dispatcher.drain(PATIENCE) and dispatcher.committed_rows == 3
    dispatcher.close()


def test_a_thread_past_its_timeout_is_reported_with_its_event_and_a_traceback_line():
    release = threading.Event()
    dispatcher = Dispatcher(lambda event: release.wait(PATIENCE) if event["row"] == 1 else None,
                            lambda event: event["row"], concurrency=2, max_pending=4, timeout=1.0)
    began = time.monotonic()
    _offer_all(dispatcher, _rows(3))
    release.set()
    failure = dispatcher.failure
    assert failure.row == 1 and failure.event == {"row": 1} and failure.attempts == 1
    assert str(failure.error) == "the handler took more than 1.0 s"
    assert failure.traceback == "TimeoutError: the handler took more than 1.0 s\n"
    # The watchdog looks four times per timeout: it sees the late call well before twice the timeout.
    assert time.monotonic() - began < 3.0


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_closing_stops_the_dispatchers_threads_and_may_be_done_twice(kind):
    async def handle_async(event):
        pass

    before = set(threading.enumerate())
    dispatcher = Dispatcher(handle_async if kind == "async" else (lambda event: None),
                            lambda event: event["row"], concurrency=3, max_pending=4, timeout=5.0)
    _offer_all(dispatcher, _rows(10))
    dispatcher.close()
    assert dispatcher.committed_rows == 10
    deadline = time.monotonic() + PATIENCE
    while set(threading.enumerate()) - before:
        assert time.monotonic() < deadline, "a dispatcher thread outlived close()"
        time.sleep(0.01)


def test_a_list_waiting_to_fill_starts_when_a_dead_letter_brings_the_pending_rows_to_their_bound():
    calls = []

    def handle(events):
        calls.append([event["row"] for event in events])
        if events[0]["row"] == 0:
            raise ValueError("row 0 fails")

    dispatcher = Dispatcher(handle, lambda event: event["key"], concurrency=1, batch_size=3, max_pending=2,
                            on_error="dead-letter")
    assert dispatcher.offer({"row": 0, "key": "a"})
    dispatcher.send_partial()  # [0] runs alone and fails: key a is poisoned
    assert dispatcher.offer({"row": 1, "key": "b"}) and calls == [[0]]  # b waits for its list to fill
    assert dispatcher.offer({"row": 2, "key": "a"})  # a dead letter at once: two rows pending
    assert calls == [[0], [1]] and dispatcher.committed_rows == 3
    assert [(letter.row, letter.attempts) for letter in dispatcher.take_dead_letters()] == [(0, 1), (2, 0)]


def _threads_named(prefix):
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


def test_the_dispatchers_threads_are_named_daemons_and_one_call_at_a_time_runs_in_the_callers_thread():
    callers = []
    inline = Dispatcher(lambda event: callers.append(threading.current_thread()), lambda event: event["row"])
    assert inline.peak_pending == 0
    _offer_all(inline, _rows(3))
    assert callers == [threading.current_thread()] * 3 and not _threads_named("segack-handler")

    release = threading.Event()
    pooled = Dispatcher(lambda event: release.wait(PATIENCE), lambda event: event["row"], concurrency=2)
    assert pooled.offer({"row": 0}) and pooled.offer({"row": 1})
    names = sorted(thread.name for thread in _threads_named("segack-handler"))
    assert names == ["segack-handler_0", "segack-handler_1"]
    release.set()
    pooled.close()

    async def handle(event):
        pass

    looped = Dispatcher(handle, lambda event: event["row"], timeout=5)
    (loop,) = _threads_named("segack-handler-loop")
    assert loop.daemon and not _threads_named("segack-handler-watchdog")  # the loop times its calls
    looped.close()
    watched = Dispatcher(lambda event: None, lambda event: event["row"], timeout=5)
    (watchdog,) = _threads_named("segack-handler-watchdog")
    assert watchdog.daemon
    watched.close()


def test_a_handling_and_its_settings_together_are_refused():
    refusal = "give a Handling or its settings as keywords, not both"
    with pytest.raises(SegackTypeError, match=exactly(refusal)):
        Dispatcher(lambda event: None, lambda event: event["row"], Handling(), concurrency=2)


def test_an_object_whose_call_is_a_coroutine_function_is_an_async_handler():
    class Awaits:
        async def __call__(self, event):
            pass

    class Returns:
        def __call__(self, event):
            pass

    async def function(event):
        pass

    assert is_async(Awaits()) and is_async(function)
    assert not is_async(Returns()) and not is_async(lambda event: None)


def test_lists_fill_from_free_keys_with_their_later_events_and_a_key_frees_when_its_list_ends():
    started = []
    calls = []
    dispatcher = Dispatcher(lambda events: calls.append([event["row"] for event in events]),
                            lambda event: event["key"], batch_size=2, max_pending=10, start=started.append)

    def offer(row, key):
        assert dispatcher.offer({"row": row, "key": key})

    offer(0, "a")
    assert not started  # one event: its list waits to fill
    offer(1, "a")  # a's next event follows it into the list
    assert len(started) == 1
    offer(2, "b")
    offer(3, "a")  # behind a's list: not free
    offer(4, "c")
    assert len(started) == 1  # b and c would fill one, but the one slot is busy
    started.pop()()
    # a is free again: its next event counts, and the oldest two free events start.
    assert calls == [[0, 1]] and len(started) == 1
    started.pop()()
    assert calls == [[0, 1], [2, 3]] and not started
    offer(5, "b")  # b is free again: with c's event, a full list
    started.pop()()
    assert calls == [[0, 1], [2, 3], [4, 5]] and dispatcher.committed_rows == 6
    offer(6, "a")  # every key is free: two new events fill a list
    offer(7, "d")
    started.pop()()
    assert calls[-1] == [6, 7] and dispatcher.committed_rows == 8
    offer(8, "e")
    offer(9, "e")
    offer(10, "e")  # held behind e's list
    started.pop()()
    assert calls[-1] == [8, 9] and not started  # e is free, with one event: not a full list
    offer(11, "e")
    started.pop()()
    assert calls[-1] == [10, 11] and dispatcher.committed_rows == 12


def test_a_list_that_fails_is_narrowed_and_only_the_failure_and_its_keys_later_events_are_set_aside():
    calls = []

    def handle(events):
        rows = [event["row"] for event in events]
        calls.append(rows)
        if 0 in rows:
            raise ValueError("row 0 fails")

    dispatcher = Dispatcher(handle, lambda event: event["key"], batch_size=3, on_error="dead-letter")
    _offer_all(dispatcher, [{"row": 0, "key": "a"}, {"row": 1, "key": "b"}, {"row": 2, "key": "a"}])
    assert calls == [[0, 1, 2], [0], [1]]
    letters = dispatcher.take_dead_letters()
    assert [(letter.row, letter.event, letter.error, letter.attempts) for letter in letters] == [
        (0, {"row": 0, "key": "a"}, "ValueError: row 0 fails", 1),
        (2, {"row": 2, "key": "a"}, "ValueError: row 0 fails", 0)]
    assert dispatcher.committed_rows == 3
