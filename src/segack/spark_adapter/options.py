"""What a run is told, in one place: :class:`RunOptions`, and :class:`Handling` inside it.

:func:`~segack.spark_adapter.replay` and :func:`~segack.spark_adapter.foreach_batch` take the
options as keyword arguments and build one :class:`RunOptions`; their signatures and the
"Other Parameters" of their docs are made from the fields here. The ``segack`` command takes its
flags' defaults and help from here too. Inside the adapter the object travels whole.

Each field is declared with :func:`option`: its default, what it means (the API docs) and its
help (the command's). A new option is a field here, a flag in ``segack.cli.flags.RUN_FLAGS`` (how it
parses), and the code that uses it.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from segack.errors import SegackTypeError
from segack.kernel import MAX_KEY_GROUP_BITS, SegmentSet
from segack.spark_adapter.errors import OptionError

__all__ = ["Handling", "OnError", "Policy", "RunOptions", "Verify", "check_claim_timeout",
           "check_key_group_bits", "option", "option_fields", "takes_options"]


class Policy(StrEnum):
    """What may run at once inside a segment's task."""

    #: Events of other keys: each key's events one after another.
    PER_KEY = "per-key"
    #: One event at a time.
    SEQUENTIAL = "sequential"
    #: Any events: for handlers that need no order.
    CONCURRENT = "concurrent"


class OnError(StrEnum):
    """What a failed call stops, once its retries are spent."""

    #: The run, after saving its progress.
    STOP = "stop"
    #: Only its key: the event and the key's later ones become dead letters.
    DEAD_LETTER = "dead-letter"


class Verify(StrEnum):
    """When a resumed replay checks the events its checkpoint counts as done."""

    #: Unless the input is the query and the unchanged files the checkpoint's last run read.
    AUTO = "auto"
    #: Every time.
    ALWAYS = "always"


def option(default: Any, doc: str, help: str | None = None, metavar: str | None = None, *,
           streams: bool = True) -> Any:
    """A field of :class:`RunOptions` or :class:`Handling`: its ``default``, what it means (``doc``,
    reStructuredText for the API docs), the command's ``help`` and ``metavar`` for its flag (``None``:
    the command has none; ``%(default)s`` stands for the default) and whether
    :func:`~segack.spark_adapter.foreach_batch` takes it too (``streams``)."""
    metadata = {"doc": textwrap.dedent(doc).strip(), "help": help, "metavar": metavar, "streams": streams}
    return field(default=default, metadata=metadata)


_Choice = TypeVar("_Choice", bound=StrEnum)


def _choice(name: str, value: Any, choices: type[_Choice]) -> _Choice:
    try:
        return choices(value)
    except ValueError:
        names = tuple(member.value for member in choices)
        raise OptionError(f"{name} must be one of {names}, not {value!r}") from None


def check_key_group_bits(bits: Any) -> int:
    """``bits`` as a key-group resolution: an :class:`~segack.spark_adapter.OptionError` unless it is
    an int in ``0..16``."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= MAX_KEY_GROUP_BITS:
        raise OptionError(f"key_group_bits must be an int in 0..{MAX_KEY_GROUP_BITS}, not {bits!r}")
    return bits


def check_claim_timeout(value: Any) -> float:
    """``value`` as a claim timeout; a ``ValueError`` unless it is a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise OptionError(f"claim_timeout must be a positive number of seconds, not {value!r}")
    return float(value)


def _check_positive(name: str, value: Any, kind: type) -> None:
    accepted = (int, float) if kind is float else int
    if isinstance(value, bool) or not isinstance(value, accepted) or not value > 0:
        raise OptionError(f"{name} must be a positive {kind.__name__}, not {value!r}")


@dataclass(frozen=True)
class Handling:
    """How a task calls the handler; checked at once (:class:`~segack.spark_adapter.OptionError`).

    An ``async def`` call past its timeout is cancelled and counts as a failure (retried like one);
    a thread cannot be stopped, so a plain call past its timeout fails the run at once and is left
    behind.
    """

    concurrency: int = option(1, """
        Handler calls in flight at once in each segment's task: on a thread pool (an ``async def``
        handler: as tasks on one event loop per task), never two of one key under
        ``policy="per-key"``. Only events whose every predecessor in the task is done are recorded
        done, so a crash never skips one.""",
        "handler calls in flight at once in each segment's task, on a thread pool (an async def "
        "handler: as tasks on one event loop); never two of one key (default: %(default)s, one call at "
        "a time)", "N")
    batch_size: int | None = option(None, """
        Call the handler with a list of up to this many events instead of one event (``None``: one
        event per call, or as many as the handler prefers: its ``preferred_batch_size``, as
        :class:`~segack.sinks.SqlSink`'s). A list holds each key's events in its order, never an
        event whose key's earlier events are not done or earlier in the list, and no two lists in
        flight share a key.
        A list that is not full is not held back once the task has read all the input it has. The
        list is done when the call returns; retries make the whole call again; with
        ``on_error="dead-letter"`` a list that still fails is cut down until only the failing
        events (and their keys' later events) are set aside.""",
        "call the handler with a list of up to N events, each key's in its order (default: one event per "
        "call, or a sink's preferred size)", "N")
    max_pending: int | None = option(None, """
        A task reads ahead at most this many rows not yet committed (default ``4 * concurrency``,
        times ``batch_size``).""",
        "a task reads ahead at most this many events not yet committed (default: 4 x --concurrency x "
        "--batch-size)", "M")
    policy: Policy = option(Policy.PER_KEY, """
        What may run at once: ``"per-key"`` (events of other keys), ``"sequential"`` (one event at a
        time) or ``"concurrent"`` (any events, no order at all).""",
        "what may run at once: per-key (events of other keys), sequential (one event per segment), "
        "concurrent (any events; for handlers that need no order)")
    retries: int = option(0, """
        A call that raises is made again up to this many times.""",
        "make a call that raises again, up to R times, before the run fails (default: %(default)s)", "R")
    retry_delay: float = option(0.1, """
        Seconds before the first retry; the n-th retry waits ``retry_delay * 2**(n - 1)``.""",
        "wait this long before the first retry, twice as long before each next (default: %(default)s)",
        "SECONDS")
    timeout: float | None = option(None, """
        Seconds a call may take (``None``: no limit). An ``async def`` call past it is cancelled and
        counts as a failure, retried if ``retries`` allows; a thread cannot be stopped, so a plain
        call past it fails the run at once.""",
        "a call may take this long: an async def call is cancelled (and retried if --retries allows); a "
        "thread cannot be stopped, so the run fails (default: none)", "SECONDS")
    on_error: OnError = option(OnError.STOP, """
        After a call's last retry: ``"stop"`` the run (after saving its progress), or
        ``"dead-letter"``: the event and its key's later events in this run are not handled but
        written to the checkpoint's ``dead-letters/`` (Parquet, with the error, the attempts, the
        key group and position) and count as done for now; the other keys go on. A key with dead
        letters stays parked: its later events, in later runs too, are set aside behind them
        (whatever ``on_error``), until ``retry_dead_letters`` handles them again
        (:mod:`~segack.spark_adapter.coordinator.dead_letters`).""",
        "after a call's last retry: stop the run (default), or set the event and its key's later events "
        "aside in CHECKPOINT/dead-letters/ and go on with other keys")

    def __post_init__(self) -> None:
        for name in ("concurrency", "batch_size", "max_pending"):
            value = getattr(self, name)
            if value is None and name != "concurrency":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"{name} must be a positive int, not {value!r}")
        object.__setattr__(self, "policy", _choice("policy", self.policy, Policy))
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise OptionError(f"retries must be a non-negative int, not {self.retries!r}")
        if (isinstance(self.retry_delay, bool) or not isinstance(self.retry_delay, (int, float))
                or not self.retry_delay >= 0):
            raise OptionError(f"retry_delay must be a non-negative number of seconds, not "
                              f"{self.retry_delay!r}")
        object.__setattr__(self, "on_error", _choice("on_error", self.on_error, OnError))
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(
                self.timeout, (int, float)) or not self.timeout > 0):
            raise OptionError(f"timeout must be a positive number of seconds or None, not {self.timeout!r}")

    @property
    def pending_bound(self) -> int:
        """``max_pending``, or its default."""
        if self.max_pending is None:
            return 4 * self.concurrency * (self.batch_size or 1)
        return self.max_pending

    @property
    def dispatched(self) -> bool:
        """Whether calls go through a :class:`~segack.spark_adapter.worker.dispatch.Dispatcher`: more than
        one at a time, or a timeout (a watchdog thread). Otherwise the task calls the handler
        itself, one call (an event, or a list) after the other, with the same lists, retries, dead
        letters and parked keys."""
        return self.concurrency > 1 or self.timeout is not None


def _segment_set(segments: Any) -> SegmentSet | str | None:
    if segments is None or segments == "auto" or isinstance(segments, SegmentSet):
        return segments  # type: ignore[no-any-return]
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise OptionError(f"segments must be a positive int, a SegmentSet or 'auto', not {segments!r}")
    return SegmentSet.balanced(segments)


@dataclass(frozen=True)
class RunOptions:
    """Everything a run is told besides its input, checkpoint and handler, checked at once.

    Build it with :meth:`from_keywords` (what :func:`~segack.spark_adapter.replay` does with its
    keyword arguments); a bad value is an :class:`~segack.spark_adapter.OptionError` naming it.
    """

    segments: SegmentSet | str | None = option(None, """
        The segment set: a count (a balanced set) or a :class:`~segack.SegmentSet`. Default: the last
        run's, else ``spark.sql.shuffle.partitions``. It may differ from the last run's, as long as
        no segment is finer than the checkpoint's key groups. ``"auto"`` plans the set from the
        events' load for the session's default segment count
        (:func:`~segack.spark_adapter.plan`: two more Spark jobs). A stream: the set of the first
        batch this function processes (later batches keep the checkpoint's set, which
        :func:`~segack.spark_adapter.split`, :func:`~segack.spark_adapter.merge` and
        :func:`~segack.spark_adapter.scale` change while the query runs); ``"auto"`` plans again
        before each batch from the load measured so far, and changes the set only when the largest
        share drops by a fifth.""",
        "a balanced set of N segments, the live segment ids, or auto: planned from the events' load for "
        "the session's parallelism, as `segack plan` does (default: the last run's, else "
        "spark.sql.shuffle.partitions)", "N|ID,ID,...|auto")
    hash: str = option("spark", """
        How keys are hashed: ``"spark"`` (Spark SQL's ``hash()``, in the JVM) or ``"java"`` (Java's
        ``hashCode``, as Axon Framework's default sequencing policy).""",
        "spark: Spark's hash(), in the JVM; java: Axon's hashCode (default: %(default)s)")
    key_group_bits: int | None = option(None, """
        The checkpoint's resolution: hashes are cut into ``2**key_group_bits`` key groups (default
        12 bits, at most 16), fixed by its first run; no segment may be finer.""",
        "cut hashes into 2**K key groups, fixed by a checkpoint's first run; no segment may be finer "
        "(default: 12, at most 16)", "K")
    method: str = option("auto", """
        How the ``java`` hash is computed in Spark: ``"auto"``, ``"reflect"`` (in the JVM) or
        ``"arrow"`` (a Python UDF).""")
    flush_every: int = option(10_000, """
        Tasks save their progress after this many events...""",
        "tasks save progress after this many events (default: %(default)s)", "N")
    flush_interval: float = option(5.0, """
        ... or after this many seconds. A crash loses at most what tasks did since their last save:
        those events run again (at least once), never out of order.""",
        "... or after this many seconds (default: %(default)g)", "SECONDS")
    shared_local_checkpoint: bool = option(False, """
        The checkpoint is a local path mounted at the same place on every machine (NFS, for
        example). Without it, a local path is refused when executors may run on other machines:
        they would write their progress to their own disks.""",
        "the checkpoint is a local path mounted at the same place on every machine (NFS, say); without "
        "it a local path is refused on a cluster master")
    handling: Handling = field(default_factory=Handling, metadata={"doc": "How the handler is called."})
    retry_dead_letters: bool = option(False, """
        First handle the checkpoint's dead letters again, each key's in order and before any newer
        event of it; those that fail again stay, and their keys stay parked. A stream does it in
        the first batch this function processes (restart the query with it once the cause is
        fixed).""",
        "first handle the checkpoint's dead letters again, each key's in order; those that fail again "
        "stay, and their keys' newer events are set aside behind them")
    claim_timeout: float = option(60.0, """
        One run at a time: a run claims the checkpoint before it reads or writes progress, extends
        the claim while it lives and releases it at the end. A claim unextended for this many
        seconds may be taken over by another run, which fences this one
        (:mod:`~segack.spark_adapter.store.claims`).""",
        "another run may take the checkpoint over once this run's claim has gone unextended this long "
        "(default: %(default)g)", "SECONDS")
    verify: Verify = option(Verify.AUTO, """
        A resumed run first checks that the events the checkpoint counts as done are the input's
        (one pass over the events). ``"auto"`` skips that pass when the input is the same query over
        the same unchanged files as the checkpoint's last run read
        (:mod:`~segack.spark_adapter.sources.fingerprint`); ``"always"`` checks every time.""",
        "a resume first checks that the events done are still the input's (a pass over them); auto (the "
        "default) skips that when the input is the same files, unchanged, as the checkpoint's last run "
        "read; always checks every time", streams=False)
    source: str | None = option(None, """
        A name for the input, recorded in the checkpoint for ``segack status`` (the command records
        its input path).""", streams=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", _segment_set(self.segments))
        if self.key_group_bits is not None:
            check_key_group_bits(self.key_group_bits)
        _check_positive("flush_every", self.flush_every, int)
        _check_positive("flush_interval", self.flush_interval, float)
        if not isinstance(self.handling, Handling):
            raise OptionError(f"handling must be a Handling, not {self.handling!r}")
        if not isinstance(self.retry_dead_letters, bool):
            raise OptionError(f"retry_dead_letters must be True or False, not {self.retry_dead_letters!r}")
        if not isinstance(self.shared_local_checkpoint, bool):
            raise OptionError(f"shared_local_checkpoint must be True or False, not "
                              f"{self.shared_local_checkpoint!r}")
        object.__setattr__(self, "claim_timeout", check_claim_timeout(self.claim_timeout))
        object.__setattr__(self, "verify", _choice("verify", self.verify, Verify))

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], *, handler: Callable[..., Any] | None = None,
                      streams: bool = False, caller: str = "replay") -> RunOptions:
        """The options named in ``keywords`` (each field of this class or of :class:`Handling`), the
        others at their defaults, for a run of ``handler``: without a ``batch_size``, the one the
        handler prefers (its ``preferred_batch_size``, as :class:`~segack.sinks.SqlSink`'s), if
        any. A name that is not an option (of a stream, with ``streams``), or a handler that is not
        callable, is a ``TypeError``, as Python's own for ``caller()``."""
        if handler is not None and not callable(handler):
            raise SegackTypeError("handler must be callable")
        names = {spec.name for spec in option_fields(streams)}
        unknown = [name for name in keywords if name not in names]
        if unknown:
            raise SegackTypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        handling_names = {spec.name for spec in dataclasses.fields(Handling)}
        chosen = {name: value for name, value in keywords.items() if name in handling_names}
        if chosen.get("batch_size") is None and getattr(handler, "preferred_batch_size", None) is not None:
            chosen["batch_size"] = handler.preferred_batch_size  # type: ignore[union-attr]
        handling = Handling(**chosen)
        return cls(handling=handling, **{name: value for name, value in keywords.items()
                                         if name not in handling_names})


def option_fields(streams: bool = False) -> list[dataclasses.Field[Any]]:
    """Every option a caller can set, in order: :class:`RunOptions`' fields with
    :class:`Handling`'s in place of ``handling``; with ``streams``, only those a stream takes."""
    found: list[dataclasses.Field[Any]] = []
    for spec in dataclasses.fields(RunOptions):
        found.extend(dataclasses.fields(Handling) if spec.name == "handling" else [spec])
    return [spec for spec in found if spec.metadata["streams"] or not streams]


def _choices(spec: dataclasses.Field[Any]) -> type[StrEnum] | None:
    """The choices of an option whose default is one of them."""
    return type(spec.default) if isinstance(spec.default, StrEnum) else None


def _parameters_doc(streams: bool) -> str:
    """The options as a numpydoc "Other Parameters" section."""
    lines = ["Other Parameters", "----------------"]
    for spec in option_fields(streams):
        choices = _choices(spec)
        kind = spec.type if choices is None else "{" + ", ".join(repr(str(c)) for c in choices) + "}"
        lines.append(f"{spec.name} : {kind}, default ``{_plain(spec.default)!r}``")
        lines += textwrap.wrap(spec.metadata["doc"], 92, initial_indent="    ", subsequent_indent="    ",
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """An option's value as a user writes it: a choice as its string."""
    return str(value) if isinstance(value, StrEnum) else value


_Function = TypeVar("_Function", bound=Callable[..., Any])


def takes_options(*, streams: bool) -> Callable[[_Function], _Function]:
    """Give a function that takes ``**options`` (a :meth:`RunOptions.from_keywords` mapping) a
    signature and docs that list every option as a keyword-only parameter, at its default."""

    def decorate(function: _Function) -> _Function:
        signature = inspect.signature(function)
        parameters = [parameter for parameter in signature.parameters.values()
                      if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
        parameters += [inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY,
                                         default=_plain(spec.default),
                                         annotation="str" if _choices(spec) else spec.type)
                       for spec in option_fields(streams)]
        function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        doc = inspect.cleandoc(function.__doc__ or "")
        function.__doc__ = doc.replace("{options}", _parameters_doc(streams))
        return function

    return decorate
