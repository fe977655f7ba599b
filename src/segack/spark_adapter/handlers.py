"""What a handler may ask of a run: each event's identity, and (for a sink) a start and an end.

Every event has an identity that is the same in every run, rescale and resume of a checkpoint: its
key, its key group and its position (its rank in the key group by ``(order, key, tie)``). A key's
events are handled in the order of their positions. A handler that records, with its effects, the
position of the last event of each key it applied can therefore skip what it already did, and
apply each event exactly once (:class:`~segack.sinks.SqlSink` does so).

A plain function asks for the identities with :func:`~segack.spark_adapter.with_identity`. A
:class:`~segack.spark_adapter.Sink` always gets them, with every event in a list, and two more
calls: :meth:`~segack.spark_adapter.Sink.prepare` on the driver before a run handles any event
(where it checks what it needs and may refuse), and :meth:`~segack.spark_adapter.Sink.close` at the
end of each Spark task that called it.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from segack.spark_adapter.errors import UnorderableEventError
from segack.spark_adapter.options import Policy

__all__ = ["EventIdentity", "Refusal", "RunContext", "Sink", "close_handler", "identified_event",
           "identified_events", "is_async", "orderable_refusal", "prepare_handler", "refusing",
           "takes_unorderable", "tell_done_below", "tell_holds", "wants_identity", "with_identity",
           "with_identities_passed"]

_MARK = "segack_identity"
_UNORDERABLE_MARK = "segack_takes_unorderable"


@dataclass(frozen=True, slots=True)
class EventIdentity:
    """Which event this is: the same in every run, rescale and resume of its checkpoint."""

    #: The value of the event's key column.
    key: Any
    #: Its key group (``hash(key) & (2**key_group_bits - 1)``).
    key_group: int
    #: Its rank in its key group by ``(order, key, tie)``, from 0.
    position: int
    #: The checkpoint's id (:attr:`~segack.spark_adapter.RunContext.checkpoint_id`).
    checkpoint_id: str

    @property
    def idempotency_key(self) -> str:
        """A string naming this event in this checkpoint, for services that accept one (a payment
        API's ``Idempotency-Key``): 32 hex digits, the same whenever the event is handled again."""
        name = f"{self.checkpoint_id}/{self.key_group}/{self.position}".encode()
        return hashlib.blake2b(name, digest_size=16).hexdigest()


@dataclass(frozen=True)
class RunContext:
    """What :meth:`~segack.spark_adapter.Sink.prepare` learns of the run that is about to call it."""

    #: Where the checkpoint is.
    checkpoint: str
    #: The checkpoint's id: random, made with the checkpoint, the same in all its runs.
    checkpoint_id: str
    key: str
    order: str
    #: What may run at once (``per-key``, ``sequential``, ``concurrent``).
    policy: Policy
    #: Seconds after which another run may take a silent run's checkpoint over.
    claim_timeout: float
    #: Events per call (``None``: one).
    batch_size: int | None
    #: The run's claim number: a run that takes the checkpoint over has a higher one, and every
    #: run with a lower one is fenced.
    claim: int = 0


class Sink:
    """A handler that gets every event with its identity, and hears of a run's start and its tasks'
    ends. Subclasses implement ``__call__``; :meth:`prepare` and :meth:`close` do nothing here.

    A sink is pickled into every Spark task, so each task has its own copy: what it opens in a
    task (connections, clients) it closes in :meth:`close`.
    """

    #: A sink is called with identities (see :func:`~segack.spark_adapter.with_identity`).
    segack_identity = True
    #: The events per call when the run sets no ``batch_size`` (``None``: one). A sink whose call
    #: costs about the same for one event as for many (a transaction, a request) sets it.
    preferred_batch_size: int | None = None

    def __call__(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> Any:
        """Handle ``events`` (one, or a list of up to ``batch_size``), each key's in its order;
        ``identities[i]`` is ``events[i]``'s. Raise to fail the whole call."""
        raise NotImplementedError

    def prepare(self, run: RunContext) -> None:
        """Called on the driver before ``run`` handles any event (once per micro-batch of a stream).
        Raise to refuse the run: nothing has been handled, nor saved to the checkpoint."""

    def close(self) -> None:
        """Called at the end of each Spark task that used this copy of the sink, whatever happened."""

    def hold(self, holds: Callable[[], bool]) -> None:
        """Called in a task before its first call, by a task that holds its key groups against
        newer attempts (a real-time stream's, whose partitions a retried attempt takes over while
        an older one may still run): ``holds()`` says whether this attempt holds them still. A sink
        that fences writers when they start, as :class:`~segack.sinks.KafkaSink` does, looks at it
        after each start, so that an attempt taken over never writes again."""

    def done_below(self, key_group: int, position: int, kept: Collection[Any] = frozenset()) -> None:
        """Called in a task once every event of ``key_group`` below ``position`` is done and
        recorded so, but the dead letters of the keys ``kept``: no run hands a sink any of the
        others again, and the calls in flight hold later ones (a real-time stream calls it after
        each save, its key groups being Kafka partitions and its positions their offsets). A sink
        may let go of what it keeps for them: the position of a key last applied below ``position``
        can never make it skip an event again, but a ``kept`` key's (a retry of its dead letters
        hands them again, and one whose call's outcome was unknown may have been applied)."""


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine to await (an ``async def`` function, or an
    object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None))  # noqa: B004  (the method itself, not callable())


def with_identity(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``handler`` to be called as ``handler(event, identity)`` (``handler(events,
    identities)`` with a ``batch_size``), ``identity`` an
    :class:`~segack.spark_adapter.EventIdentity`.

    For a function (plain or ``async def``); a class sets ``segack_identity = True`` instead.
    """
    setattr(handler, _MARK, True)
    return handler


def wants_identity(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` is called with identities: a :class:`~segack.spark_adapter.Sink`, or
    marked by :func:`~segack.spark_adapter.with_identity`."""
    return getattr(handler, _MARK, False) is True


class _IdentifiedEvent(dict):  # type: ignore[type-arg]
    """An event's columns, with its identity beside them for the call (:func:`identified_event`). It
    keeps ``dict``'s own constructor: an ``__init__`` in Python cost a third of a microsecond an
    event."""

    __slots__ = ("identity",)
    identity: EventIdentity

    def __reduce__(self) -> tuple[Any, ...]:
        return identified_event, (dict(self), self.identity)


def identified_event(columns: dict[str, Any], identity: EventIdentity) -> dict[str, Any]:
    """One event with its identity, for a handler that :func:`wants_identity`."""
    event = _IdentifiedEvent(columns)
    event.identity = identity
    return event


def identified_events(events: list[dict[str, Any]], key: str, groups: Any, positions: Any,
                      checkpoint_id: str) -> list[dict[str, Any]]:
    """``events`` with their identities, for a handler that :func:`wants_identity`."""
    identities = map(EventIdentity, map(operator.itemgetter(key), events), groups.tolist(),
                     positions.tolist(), itertools.repeat(checkpoint_id))
    return list(map(identified_event, events, identities))


def with_identities_passed(handler: Callable[..., Any]) -> Callable[[Any], Any]:
    """``handler`` as the run calls it: with the event (or list) alone, or, for a handler that
    :func:`wants_identity`, with the identities of :func:`identified_events` beside them. A sink
    gets a list even when events come one at a time."""
    if not wants_identity(handler):
        return handler
    always_lists = isinstance(handler, Sink)

    def arguments(events: Any) -> tuple[Any, Any]:
        if isinstance(events, list):
            return events, [event.identity for event in events]
        return ([events], [events.identity]) if always_lists else (events, events.identity)

    if is_async(handler):
        async def call_async(events: Any) -> Any:
            return await handler(*arguments(events))
        return call_async

    def call(events: Any) -> Any:
        return handler(*arguments(events))
    return call


def prepare_handler(handler: Callable[..., Any], run: RunContext) -> None:
    """Let a :class:`~segack.spark_adapter.Sink` prepare for ``run``; other handlers need nothing."""
    if isinstance(handler, Sink):
        handler.prepare(run)


def close_handler(handler: Callable[..., Any]) -> None:
    """Tell a :class:`~segack.spark_adapter.Sink` that its task is over."""
    if isinstance(handler, Sink):
        handler.close()


def tell_holds(handler: Callable[..., Any], holds: Callable[[], bool]) -> None:
    """Tell a :class:`~segack.spark_adapter.Sink` how its task tells it still holds its key groups
    (:meth:`~segack.spark_adapter.Sink.hold`)."""
    if isinstance(handler, Sink):
        handler.hold(holds)


def tell_done_below(handler: Callable[..., Any], key_group: int, position: int,
                    kept: Collection[Any] = frozenset()) -> None:
    """Tell a :class:`~segack.spark_adapter.Sink` that ``key_group``'s events below ``position``
    are done for good, but the dead letters of the keys ``kept``
    (:meth:`~segack.spark_adapter.Sink.done_below`)."""
    if isinstance(handler, Sink):
        handler.done_below(key_group, position, kept)


@dataclass(frozen=True)
class Refusal:
    """Events a run does not hand to a handler unless the handler is marked to take them: a Kafka
    record whose value did not parse, a stream's event with no place in its key's order."""

    #: The attribute (``True``) that marks a handler as taking them.
    mark: str
    #: Raises, naming the event, for an event it refuses; returns for the others.
    check: Callable[[dict[str, Any]], None]


def refusing(handler: Callable[..., Any], refusals: Sequence[Refusal]) -> Callable[..., Any]:
    """``handler`` as a run calls it: each call that holds an event one of ``refusals`` refuses
    fails (with that refusal's error, naming the event) before the handler is called, but for
    the refusals whose mark ``handler`` bears."""
    checks = tuple(refusal.check for refusal in refusals if getattr(handler, refusal.mark, False) is not True)
    if not checks:
        return handler
    if isinstance(handler, Sink):
        return (_RefusingAsyncSink if is_async(handler) else _RefusingSink)(handler, checks)
    return (_RefusingAsync if is_async(handler) else _Refusing)(handler, checks)


def _check_all(checks: _Checks, events: Any) -> None:
    for event in events if isinstance(events, list) else (events,):
        for check in checks:
            check(event)


_Checks = tuple[Callable[[dict[str, Any]], None], ...]


class _Refusing:
    def __init__(self, handler: Callable[..., Any], checks: _Checks) -> None:
        self.handler, self.checks = handler, checks
        self.segack_identity = wants_identity(handler)

    def __call__(self, events: Any, *identities: Any) -> Any:
        _check_all(self.checks, events)
        return self.handler(events, *identities)


class _RefusingAsync(_Refusing):
    async def __call__(self, events: Any, *identities: Any) -> Any:
        _check_all(self.checks, events)
        return await self.handler(events, *identities)


class _RefusingSink(Sink):
    def __init__(self, sink: Sink, checks: _Checks) -> None:
        self.sink, self.checks = sink, checks
        self.preferred_batch_size = sink.preferred_batch_size

    def __call__(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> Any:
        _check_all(self.checks, events)
        return self.sink(events, identities)

    def prepare(self, run: RunContext) -> None:
        self.sink.prepare(run)

    def close(self) -> None:
        self.sink.close()

    def hold(self, holds: Callable[[], bool]) -> None:
        self.sink.hold(holds)

    def done_below(self, key_group: int, position: int, kept: Collection[Any] = frozenset()) -> None:
        self.sink.done_below(key_group, position, kept)


class _RefusingAsyncSink(_RefusingSink):
    async def __call__(self, events: list[dict[str, Any]], identities: list[EventIdentity]) -> Any:
        _check_all(self.checks, events)
        return await self.sink(events, identities)


def takes_unorderable(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``handler`` to get a stream's events whose key is null or whose order is null or NaN
    (which a stream otherwise refuses: :class:`~segack.spark_adapter.UnorderableEventError`). Each
    comes where Spark sorts it: a null order before its key's other events of the micro-batch, NaN
    after them. A class sets ``segack_takes_unorderable = True``."""
    setattr(handler, _UNORDERABLE_MARK, True)
    return handler


@dataclass(frozen=True)
class _OrderableCheck:
    key: str
    order: str
    #: Set in an event whose value did not parse (refused on its own): its nulls in ``parsed`` are
    #: parsing's, not the data's.
    exempt: str | None
    parsed: frozenset[str]

    def __call__(self, event: dict[str, Any]) -> None:
        unparsed = self.exempt is not None and event.get(self.exempt) is not None
        key, order = event.get(self.key), event.get(self.order)
        if key is None and not (unparsed and self.key in self.parsed):
            why = f"its key ({self.key!r}) is null"
        elif (order is None or order != order) and not (unparsed and self.order in self.parsed):  # NaN != NaN
            why = f"its order ({self.order!r}) is {'null' if order is None else 'NaN'}"
        else:
            return
        raise UnorderableEventError(f"{why}: the event has no place among its key's events")


def orderable_refusal(key: str, order: str, exempt: str | None = None,
                      parsed: frozenset[str] = frozenset()) -> Refusal:
    """What a stream does not hand a handler unless it
    :func:`~segack.spark_adapter.takes_unorderable`: an event whose ``key`` is null, or whose
    ``order`` is null or NaN; but where the event's ``exempt`` column is set (a Kafka record whose
    value did not parse, refused on its own), not for the columns in ``parsed`` (the value's)."""
    return Refusal(_UNORDERABLE_MARK, _OrderableCheck(key, order, exempt, parsed))
