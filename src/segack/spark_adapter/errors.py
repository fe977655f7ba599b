"""Every error the Spark adapter raises, in one place.

Each is a class to catch, and each derives from :class:`segack.SegackError` and from the builtin it
refines, so ``except ValueError`` keeps working where it did. Refusals come before anything is
written; the errors of a run that stopped come after its progress was saved.

=================================  ========================================================
Refusals (``ValueError``)          why
=================================  ========================================================
:class:`OptionError`               a setting out of range, of the wrong type, or not one
                                   of its choices
:class:`InputError`                the events cannot be replayed as asked: a column is
                                   missing, reserved or of a type segack cannot sort or hash,
                                   or the order column is null or NaN in some events
:class:`SessionError`              the Spark session is not fit for ordered processing
:class:`ExecutorEnvironmentError`  the executors' Python lacks segack, has another version
                                   of it, or cannot be started
:class:`CheckpointLocationError`   no location, one the executors cannot reach, or
                                   one that is not a checkpoint
:class:`CheckpointError`           a checkpoint that cannot be trusted: damaged, foreign,
                                   of another version
:class:`ForeignInputError`         a checkpoint of other input, or cut otherwise
:class:`CheckpointClaimedError`    another run holds the checkpoint
:class:`SegmentChangeError`        a split, merge or scale that does not apply to the
                                   checkpoint's segments
:class:`TokenError`                key-group progress that is damaged or contradicts itself
:class:`SinkError`                 a sink that cannot start: its database out of reach,
                                   its table not made, a policy it cannot keep
:class:`UnparsedValueError`        a Kafka record whose value does not parse: raised in
                                   the run, for that record only (a dead letter)
:class:`UnorderableEventError`     a stream's event whose key is null, or its order null
                                   or NaN: raised in the run, for that event only
=================================  ========================================================

A run that stopped (``RuntimeError``): :class:`HandlerFailedError` (the handler raised, after
its retries), :class:`ReplayError` (a Spark task or the saving of progress failed) and its
subclass :class:`ClaimLostError` (another run took the checkpoint over). A Schema Registry that
stops answering in the middle of a run, asked for a schema no task has yet, is a
:class:`SchemaRegistryError` (``ConnectionError``): the task fails, and Spark's retries, then the
run, stop on it, nothing skipped. Each pickles, so that it
can travel from a Spark task to the driver.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Protocol

from segack.errors import SegackError, SegackValueError

__all__ = [
    "CheckpointClaimedError",
    "CheckpointError",
    "CheckpointLocationError",
    "ClaimLostError",
    "ExecutorEnvironmentError",
    "ForeignInputError",
    "HandlerFailedError",
    "InputError",
    "OptionError",
    "ReplayError",
    "SchemaRegistryError",
    "SegmentChangeError",
    "SessionError",
    "SinkError",
    "TokenError",
    "UnorderableEventError",
    "UnparsedValueError",
    "worker_error",
]


class _Claim(Protocol):
    """What an error says of a claim (:class:`~segack.spark_adapter.store.claims.Claim` is one)."""

    @property
    def run_id(self) -> str: ...
    @property
    def extended_at(self) -> float: ...
    @property
    def timeout(self) -> float: ...
    @property
    def released_by(self) -> str | None: ...
    def owner(self) -> str: ...


class OptionError(SegackValueError):
    """A setting is out of range, of the wrong type, or not one of its choices; nothing ran."""


class InputError(SegackValueError):
    """The events cannot be replayed as asked: a key or order column is missing, the two are one,
    a column uses a name segack reserves, or a type cannot be sorted or hashed; nothing ran."""


class SessionError(SegackValueError):
    """The Spark session is not fit for ordered processing (speculative execution is on)."""


class ExecutorEnvironmentError(SessionError):
    """The executors' Python cannot run segack's tasks: it lacks segack or one of its dependencies,
    has another version of segack, or cannot be started; nothing ran."""


class CheckpointLocationError(SegackValueError):
    """No checkpoint location was given, a local path the executors would not reach, or a location
    that holds no checkpoint (a file, a directory of other files, or nothing, where one is needed)."""


class CheckpointError(SegackValueError):
    """A checkpoint that cannot be trusted: damaged, foreign, from another input or another version."""


class ForeignInputError(CheckpointError):
    """The checkpoint belongs to other input (other columns, types or events than were done), or
    cuts the hashes into another number of key groups than asked."""


class TokenError(SegackValueError):
    """Tokens or updates that cannot be trusted: damaged, foreign or inconsistent."""


class SegmentChangeError(SegackValueError):
    """A split, merge or scale that does not apply to the checkpoint's segments: a segment that is
    not live, a sibling that is split further, a plan with no events measured yet."""


class CheckpointClaimedError(CheckpointError):
    """Another run holds the checkpoint's claim; nothing was changed."""

    def __init__(self, location: str, claim: _Claim, now: float) -> None:
        super().__init__(
            f"checkpoint {location} is claimed by {claim.owner()}, last extended "
            f"{max(0.0, now - claim.extended_at):.1f} s ago. Only one run may use a checkpoint at a time: "
            f"wait for that run to end, or, if it is gone, for its claim to expire ({claim.timeout:g} s "
            f"unextended) or for `segack release {location} --force`")
        self.claim = claim
        self._made_of = (location, claim, now)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (type(self), self._made_of)


class UnparsedValueError(SegackValueError):
    """A Kafka record's value did not parse as the declared value schema: the handler was not called
    with it (:mod:`~segack.spark_adapter.sources.kafka`, rule 2). Raised inside the run, where it
    makes the record a dead letter or stops the run as ``on_error`` says."""


class UnorderableEventError(SegackValueError):
    """A stream's event has no place among its key's events: its key is null, or its order value
    null or NaN. The handler was not called with it; raised inside the run, where it makes the event
    a dead letter (its key's later events parked behind it) or stops the run as ``on_error`` says.
    A handler marked with :func:`~segack.spark_adapter.takes_unorderable` gets such events."""


class SinkError(SegackValueError):
    """A sink refused the run before it handled any event (:meth:`segack.spark_adapter.Sink.prepare`)."""


class SchemaRegistryError(SegackError, ConnectionError):
    """A Schema Registry did not answer, through its retries, for a schema a record names
    (:mod:`~segack.spark_adapter.worker.schema_registry`); raised in the run, where the task
    that needs the schema fails rather than skip the record."""


class HandlerFailedError(SegackError, RuntimeError):
    """The handler raised on an event; the progress before it was saved first.

    ``key`` and ``order`` are the event's values, ``position`` its place in its
    key group (``key_group``), ``reason`` the handler's exception as
    ``"Type: message"`` and ``traceback`` its formatted traceback from the worker.
    ``record`` is where a Kafka record came from (``topic/partition at offset N``),
    ``None`` for other events.
    """

    def __init__(self, key: Any, order: Any, position: int, key_group: int, reason: str,
                 traceback: str = "", record: str | None = None) -> None:
        source = f"record {record}, " if record else ""
        super().__init__(f"handler failed on the event with key {shown(key)} and order {shown(order)} "
                         f"({source}position {position} of key group {key_group}): {reason}")
        self.key = key
        self.order = order
        self.position = position
        self.key_group = key_group
        self.reason = reason
        self.traceback = traceback
        self.record = record

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (HandlerFailedError, (self.key, self.order, self.position, self.key_group, self.reason,
                                self.traceback, self.record))


def record_of(event: dict[str, Any]) -> str | None:
    """Where an event that is a Kafka record came from, ``topic/partition at offset N`` (an event
    with the ``topic``, ``partition`` and ``offset`` columns of
    :func:`~segack.spark_adapter.kafka_stream`); ``None`` for any other."""
    if any(event.get(name) is None for name in ("topic", "partition", "offset")):
        return None
    return f"{event['topic']}/{event['partition']} at offset {event['offset']}"


class ReplayError(SegackError, RuntimeError):
    """A replay stopped for a reason other than the handler: a Spark task or the merger failed.

    The message names the cause as the worker reported it (for example
    ``ModuleNotFoundError: No module named 'h'``); progress up to the failure was saved.
    """


class ClaimLostError(ReplayError):
    """This run's claim was taken over by another run: it stopped, and saved nothing more."""

    def __init__(self, location: str, mine: _Claim, newer: _Claim | None) -> None:
        by = "was released by an operator" if newer is not None and newer.released_by else (
            f"was taken over by {newer.owner()}" if newer is not None else "is gone")
        super().__init__(f"run {mine.run_id} lost its claim on checkpoint {location}: it {by}; this "
                         f"run stopped and saved nothing more")
        self.newer = newer
        self._made_of = (location, mine, newer)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        # Pickled over Spark Connect, from the server's micro-batch to the client.
        return (type(self), self._made_of)


def one_line(error: BaseException) -> str:
    """``error`` as ``"Type: message"`` on one line: a message's line breaks and runs of blanks
    (a driver's hint on a second line, a server's detail) become single spaces."""
    said = " ".join(str(error).split())
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


#: Where the reason in a Spark error's text ends: its stack trace, its cause, its SQL context.
_REASON_ENDS = ("at ", "JVM stacktrace", "Caused by", "== ", "Traceback")


def spark_reason(error: BaseException | str) -> str:
    """The reason a Spark or Py4J error gives, on one line: its first paragraph past Py4J's
    preamble (``An error occurred while calling ...``), without the Java exception's class name,
    the lines that continue it joined (Delta wraps its messages), up to the stack trace. Nothing
    found: the text itself, or an error's type name."""
    text = error if isinstance(error, str) else str(error)
    kept: list[str] = []
    for line in text.splitlines():
        line = line.strip().removeprefix(": ")
        if not kept:
            if line and not line.startswith("An error occurred while calling"):
                kept.append(line.rsplit("Exception: ", 1)[-1])
        elif not line or line.startswith(_REASON_ENDS):
            break
        else:
            kept.append(line)
    if kept:
        return " ".join(kept)
    return text if isinstance(error, str) else type(error).__name__


def shown(value: Any) -> str:
    """``value`` in a message as its user wrote it: a string or bytes quoted (its bounds and
    blanks visible), anything else as ``str`` (``2024-01-14 09:30:00+00:00``, ``12.50``, not a
    constructor call)."""
    return repr(value) if isinstance(value, (str, bytes)) else str(value)


#: Spark's line for a job's last failed task: ``... Lost task 0.3 in stage 0.0 (TID 6) (host executor 0): E``.
_TASK_FAILURE = re.compile(r"most recent failure: Lost task [^\n]*?\): ([^\n]+)")


#: The words of Spark's Kafka source for records gone before a query read them (under its default
#: ``failOnDataLoss``), and its line that says which.
_KAFKA_DATA_LOSS = "Some data may have been lost because they are not available in Kafka any more"
_KAFKA_LOSS_REASON = re.compile(r"Reason: ([^\n]+)")


def kafka_data_loss(error: BaseException) -> str | None:
    """Spark's reason (``Could not read records in offset [50, 100) for topic partition t-0``) when
    ``error`` is its Kafka source's finding that records it had to read are gone; else ``None``."""
    text = str(error)
    if _KAFKA_DATA_LOSS not in text:
        return None
    reason = _KAFKA_LOSS_REASON.search(text[text.index(_KAFKA_DATA_LOSS):])
    return reason.group(1) if reason else "records it had to read are gone"


def worker_error(error: BaseException) -> str:
    """The exception a Spark task raised, as ``"Type: message"``, read out of Spark's wrapping.

    Spark reports a Python worker's failure as text: its traceback inside one
    or more Java exceptions. The last traceback's closing line is the
    exception itself; failing that (a task that failed before its Python ran:
    a worker that cannot start, say), the exception of the job's most recent
    task failure; failing that, the first line of ``error``.
    """
    text = str(error)
    marker = "Traceback (most recent call last):"
    if marker in text:
        lines = text[text.rindex(marker) + len(marker):].splitlines()
        closing = [line.strip() for line in lines if line.strip() and not line.startswith((" ", "\t"))]
        if closing:
            return closing[0]
    task_failure = _TASK_FAILURE.search(text)
    if task_failure:
        return task_failure.group(1)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def __getattr__(name: str) -> Any:
    """``HandlerFailed``, the 0.1 name of :class:`HandlerFailedError`, with a deprecation warning."""
    if name == "HandlerFailed":
        warnings.warn("HandlerFailed is now HandlerFailedError", DeprecationWarning, stacklevel=2)
        return HandlerFailedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
