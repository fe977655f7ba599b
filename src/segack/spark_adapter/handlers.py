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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from segack.spark_adapter.options import Policy

__all__ = ["EventIdentity", "RunContext", "Sink", "close_handler", "identified_events", "is_async",
           "prepare_handler", "wants_identity", "with_identity", "with_identities_passed"]

_MARK = "segack_identity"


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
    """An event's columns, with its identity beside them for the call (:func:`_identified`). It
    keeps ``dict``'s own constructor: an ``__init__`` in Python cost a third of a microsecond an
    event."""

    __slots__ = ("identity",)
    identity: EventIdentity

    def __reduce__(self) -> tuple[Any, ...]:
        return _identified, (dict(self), self.identity)


def _identified(columns: dict[str, Any], identity: EventIdentity) -> _IdentifiedEvent:
    event = _IdentifiedEvent(columns)
    event.identity = identity
    return event


def identified_events(events: list[dict[str, Any]], key: str, groups: Any, positions: Any,
                      checkpoint_id: str) -> list[dict[str, Any]]:
    """``events`` with their identities, for a handler that :func:`wants_identity`."""
    identities = map(EventIdentity, map(operator.itemgetter(key), events), groups.tolist(),
                     positions.tolist(), itertools.repeat(checkpoint_id))
    return list(map(_identified, events, identities))


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
