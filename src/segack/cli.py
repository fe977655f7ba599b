"""The ``segack`` command."""

from __future__ import annotations

import argparse
import io
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from segack._shared import HASHES
from segack.kernel import SegmentSet, java_hash, spark_hash
from segack.spark_adapter.options import OnError, Policy, Verify, option_fields

if TYPE_CHECKING:
    from segack.spark_adapter.store.checkpoint import CheckpointStore
    from segack.spark_adapter.store.claims import Claim
    from segack.spark_adapter.store.tokens import KeyGroupTokens


class ExitCode(IntEnum):
    """The ``segack`` command's exit status, for schedulers and scripts.

    Every command uses the same codes; ``segack replay`` uses each of them.
    """

    #: Done: every event of the input handled (``replay``), or the command did what it says.
    OK = 0
    #: The run stopped before its end: a Spark task failed, or another run took the checkpoint
    #: over. Its progress was saved: run it again to resume.
    FAILED = 1
    #: The command line is wrong: a flag out of its range, a handler that cannot be imported, a
    #: missing argument. Nothing ran; the message names the flag.
    USAGE = 2
    #: The run reached the end of its input, but events set aside as dead letters remain (``segack
    #: dead-letters`` lists them; ``--retry-dead-letters`` handles them again).
    DEAD_LETTERS = 3
    #: The input, the checkpoint or the session cannot be used as given: unreadable or empty input,
    #: nulls in the order column, a path that is not a checkpoint, a checkpoint of other input or
    #: held by another run. Nothing was written.
    REFUSED = 4
    #: The handler raised on the same event through all its retries, under ``--on-error stop``. The
    #: progress before that event was saved, but running again fails the same way until its cause
    #: (the handler, the event, a service it calls) is fixed; ``--on-error dead-letter`` sets such
    #: events aside instead.
    HANDLER_FAILED = 5


def _replay_segments(text: str) -> SegmentSet | str:
    """What ``segack replay --segments`` takes: as :func:`_segment_set`, or ``auto``."""
    return text if text == "auto" else _segment_set(text)


def _segment_set(text: str) -> SegmentSet:
    """``N`` (a balanced set of N) or ``ID,ID,...`` (the live segment ids)."""
    try:
        if "," not in text:
            return SegmentSet.balanced(int(text))
        return SegmentSet.from_ids(int(part) for part in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad --segments {text!r}: {error}") from None


def _conf(text: str) -> tuple[str, str]:
    """``KEY=VALUE``, as ``spark-submit --conf`` takes it."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def _hash_key(key: str, hash_name: str) -> int:
    return java_hash(key) if hash_name == "java" else spark_hash(key)


def _int_at_least(least: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")
        return value

    return parse


_positive = _int_at_least(1, "a positive integer")
_non_negative = _int_at_least(0, "a non-negative integer")

#: How the flag of each run option parses (:mod:`segack.spark_adapter.options` gives its default,
#: help and metavar): a function of the text, the choices (a tuple or an enum), or ``bool`` for a
#: flag that takes no value. ``segack replay`` has a flag for each, in this order.
RUN_FLAGS: dict[str, Any] = {
    "segments": _replay_segments,
    "hash": HASHES,
    "key_group_bits": int,
    "shared_local_checkpoint": bool,
    "flush_every": _positive,
    "flush_interval": float,
    "concurrency": _positive,
    "batch_size": _positive,
    "max_pending": _positive,
    "policy": Policy,
    "retries": _non_negative,
    "retry_delay": float,
    "timeout": float,
    "on_error": OnError,
    "retry_dead_letters": bool,
    "claim_timeout": float,
    "verify": Verify,
}


def _checked(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, then the option's own check (:class:`~segack.spark_adapter.options.RunOptions`):
    a value out of range is refused as the command line parses, named by its flag, before Spark
    starts."""
    from segack.spark_adapter.errors import OptionError
    from segack.spark_adapter.options import RunOptions

    def checked(text: str) -> Any:
        value = parse(text)
        try:
            RunOptions.from_keywords({name: value})
        except OptionError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{name} ")) from None
        return value

    checked.__name__ = getattr(parse, "__name__", name)  # argparse names the type in its messages
    return checked


def _add_run_flags(command: argparse.ArgumentParser, streams: bool = False) -> None:
    """A flag for each run option in :data:`RUN_FLAGS` (with ``streams``, those a stream takes), with
    the option's default and help."""
    specs = {spec.name: spec for spec in option_fields(streams)}
    for name, parse in RUN_FLAGS.items():
        if name not in specs:
            continue
        spec = specs[name]
        flag = "--" + name.replace("_", "-")
        default = str(spec.default) if isinstance(spec.default, Enum) else spec.default
        if parse is bool:
            command.add_argument(flag, action="store_true", help=spec.metadata["help"])
        elif isinstance(parse, tuple) or (isinstance(parse, type) and issubclass(parse, Enum)):
            command.add_argument(flag, choices=[str(choice) for choice in parse], default=default,
                                 help=spec.metadata["help"])
        else:
            command.add_argument(flag, type=_checked(name, parse), default=default,
                                 metavar=spec.metadata["metavar"],
                                 help=spec.metadata["help"])


def run_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The run options the command line gave, as keyword arguments of
    :func:`~segack.spark_adapter.replay` (or :func:`~segack.spark_adapter.stream`)."""
    return {name: getattr(args, name) for name in RUN_FLAGS if hasattr(args, name)}


def _metrics_address(text: str) -> str:
    """What ``--metrics-port`` takes: ``PORT`` or ``HOST:PORT``."""
    from segack.spark_adapter.console.metrics import parse_address
    from segack.spark_adapter.errors import OptionError

    try:
        parse_address(text)
    except OptionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("metrics_port ")) from None
    return text


def _trigger(text: str) -> str:
    """What ``segack stream --trigger`` takes: ``available-now``, or an interval."""
    from segack.spark_adapter.coordinator.query import parse_trigger
    from segack.spark_adapter.errors import OptionError

    try:
        parse_trigger(text)
    except OptionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("trigger ")) from None
    return text


def _add_session_options(command: argparse.ArgumentParser) -> None:
    """Where a command's Spark session runs, and how it logs."""
    where = command.add_mutually_exclusive_group()
    where.add_argument("--master", default=None, metavar="URL",
                       help="the Spark master: local[N], local-cluster[...], spark://..., yarn, k8s://... "
                       "(default: local[2])")
    where.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                       help="a Spark Connect server to run on instead of a master")
    command.add_argument("--conf", action="append", type=_conf, default=[], metavar="KEY=VALUE",
                         help="a Spark setting, as spark-submit takes it (repeatable)")
    command.add_argument("--verbose", action="store_true",
                         help="let Spark's driver log as it would by default (its banner, warnings), and "
                         "say what the run decides: claims, jobs, merges, changes of segments")


_CHECKPOINT_HELP = "a local directory, an object store's prefix (s3://, gs://, az://) or a pyarrow.fs URI"


def _add_input(command: argparse.ArgumentParser, streams: bool = False) -> None:
    """The events: files Spark reads (INPUT, --format, --option) or a table it knows (--table)."""
    command.add_argument("input", metavar="INPUT", nargs="?",
                         help="a file or directory Spark can read (or give --table; none for --format kafka)"
                         if streams else "a file or directory Spark can read (or give --table)")
    command.add_argument("--table", default=None, metavar="NAME",
                         help="read a table the Spark session knows (spark.read.table) instead of INPUT")
    command.add_argument("--format", default="parquet", metavar="FORMAT",
                         help="INPUT's format: any Spark's reader takes, with its connector on the session "
                         "(delta, avro, ...; default: parquet; csv reads a header line and infers types)")
    command.add_argument("--option", action="append", type=_conf, default=[], metavar="KEY=VALUE",
                         help="an option of Spark's reader for INPUT (repeatable), as DataFrameReader.option")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``segack`` command (also used to document it)."""
    parser = argparse.ArgumentParser(
        prog="segack", description="Ordered, resumable, rescalable event processing on Spark."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_locate, _add_replay, _add_stream, _add_plan, _add_status, _add_ui, _add_dead_letters,
                _add_release, _add_rescale, _add_demo):
        add(commands)
    return parser


def _add_locate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    locate = commands.add_parser(
        "locate", help="print the segment that owns each key",
        description="Print the owning segment of each key: its index, id, mask and share.",
    )
    locate.add_argument("keys", nargs="+", metavar="KEY", help="sequencing keys (strings)")
    locate.add_argument(
        "--segments", type=_segment_set, default=SegmentSet.balanced(1), metavar="N|ID,ID,...",
        help="a balanced set of N segments, or the live segment ids (default: 1)",
    )
    locate.add_argument(
        "--hash", choices=HASHES, default="java",
        help="java: Axon's String.hashCode; spark: Spark SQL's hash() (default: java)",
    )


def _add_replay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = commands.add_parser(
        "replay", help="replay events through a handler, in order per key, resumably",
        description="Call a handler once per event of INPUT, never before every earlier event of its "
        "key (by the order column) has been handled. Progress is checkpointed as it goes; running "
        "again with the same checkpoint resumes, with another --segments it rescales. SIGTERM or "
        "Ctrl-C stops it at once, keeping the progress saved so far (exit 1: run it again).",
    )
    replay.epilog = "exit status: " + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}"
                                                for code in ExitCode) + " (see the docs' exit codes)"
    _add_handling(replay)
    _add_input(replay)
    _add_session_options(replay)
    replay.add_argument("--py-files", default="", metavar="FILE,FILE,...",
                        help=".py, .zip or .egg files the handler imports, sent to the executors (the "
                        "handler's own module is sent without asking)")
    _add_run_flags(replay)


def _add_handling(command: argparse.ArgumentParser) -> None:
    """The flags ``replay`` and ``stream`` share: key, order, handler, checkpoint, what to ship."""
    command.add_argument("--key", required=True, metavar="COL", help="the sequencing key column")
    command.add_argument("--order", required=True, metavar="COL",
                         help="the column that orders each key's events (need not be sorted)")
    command.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                         help="called with each event as a dict of its columns")
    command.add_argument("--checkpoint", required=True, metavar="DIR", help=_CHECKPOINT_HELP)
    command.add_argument("--metrics-port", type=_metrics_address, default=None, metavar="[HOST:]PORT",
                         help="serve the checkpoint's Prometheus metrics on http://HOST:PORT/metrics while "
                         "the run goes on (HOST: 127.0.0.1 unless given)")


def _add_stream(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stream = commands.add_parser(
        "stream", help="handle a stream (Kafka, Delta, files) in order per key, micro-batch by micro-batch",
        description="Run a Structured Streaming query that calls a handler once per event, never before "
        "every earlier event of its key has been handled. Each micro-batch is complete in the "
        "checkpoint before the next starts; Spark's own checkpoint of the query lives inside it. "
        "SIGTERM or Ctrl-C stops it at the end of the micro-batch under way, exit 0 (twice: at once, "
        "exit 1, the batch's progress kept).",
    )
    stream.epilog = "exit status: " + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}"
                                                for code in ExitCode) + " (see the docs' exit codes)"
    _add_handling(stream)
    _add_input(stream, streams=True)
    stream.add_argument("--trigger", type=_trigger, default="available-now", metavar="available-now|EVERY",
                        help="available-now: handle what the source holds, then exit; an interval such as "
                        "5s or 500ms: a micro-batch that often, until stopped (default: available-now)")
    stream.add_argument("--value-format", choices=("json",), default="json",
                        help="Kafka: how each record's value is written (default: json)")
    stream.add_argument("--value-schema", default=None, metavar="DDL",
                        help="Kafka: the value's fields and types, as 'account STRING, seq BIGINT, amount "
                        "BIGINT'; each event has them beside key, topic, partition, offset and timestamp")
    stream.add_argument("--commit-offsets-to", default=None, metavar="GROUP",
                        help="Kafka: after each micro-batch complete in the checkpoint, commit each "
                        "partition's offset to consumer group GROUP, for Kafka's own tools to see")
    _add_session_options(stream)
    stream.add_argument("--py-files", default="", metavar="FILE,FILE,...",
                        help=".py, .zip or .egg files the handler imports, sent to the executors")
    _add_run_flags(stream, streams=True)


def _add_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = commands.add_parser(
        "plan", help="plan segments from the events' load, and show the limit the hottest key sets",
        description="Count INPUT's events per key group and its hottest keys (two Spark jobs), then "
        "print the set of at most N segments, made by splitting the root, whose largest load is "
        "smallest, beside a balanced set of N, and the speed-up the hottest key allows at most.",
    )
    plan.add_argument("--key", required=True, metavar="COL", help="the sequencing key column")
    plan.add_argument("--order", default=None, metavar="COL",
                      help="the order column, checked to exist (the plan does not depend on it)")
    _add_input(plan)
    plan.add_argument("--hash", choices=HASHES, default="spark",
                      help="spark: Spark's hash(); java: Axon's hashCode (default: spark)")
    plan.add_argument("--workers", type=_positive, default=None, metavar="N",
                      help="plan for N workers (default: the session's spark.sql.shuffle.partitions)")
    plan.add_argument("--key-group-bits", type=_checked("key_group_bits", int), default=12, metavar="K",
                      help="the key-group resolution of the checkpoint you will use (default: 12)")
    plan.add_argument("--sample", type=float, default=None, metavar="FRACTION",
                      help="count this fraction of the events, for a faster estimate (default: all)")
    plan.add_argument("--top", type=_positive, default=5, metavar="N",
                      help="hottest keys to show (default: 5)")
    _add_session_options(plan)


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser(
        "status", help="show a checkpoint",
        description="Print a checkpoint's progress (events, done, per segment of the last run), its "
        "size, and the settings of the run that wrote it.",
    )
    status.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)


def _add_ui(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = commands.add_parser(
        "ui", help="serve a page that follows a checkpoint, and its Prometheus metrics",
        description="Serve a page for one checkpoint (its run, segments, key groups, segment sets, dead "
        "letters), redrawn every few seconds while a run goes on or after it, and its Prometheus "
        "metrics on /metrics. It reads the checkpoint as segack status does; its controls split, merge "
        "or scale the segments and release a claim whose owner is gone, as the commands of those names "
        "do, each printed here as it is done. Runs until Ctrl-C or SIGTERM.",
    )
    ui.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)
    ui.add_argument("--host", default="127.0.0.1",
                    help="the address to listen on (default: %(default)s, this machine only); any other "
                    "needs a token, made and printed once unless --token gives one")
    ui.add_argument("--port", type=_int_at_least(0, "a port"), default=8642,
                    help="the port (default: %(default)s; 0: any free one)")
    ui.add_argument("--token", default=None, help="what every request must carry (?token=TOKEN once; the "
                    "page keeps it in a cookie)")
    ui.add_argument("--read-only", action="store_true",
                    help="no controls: the page and its API change nothing (their POSTs answer 403)")


def _add_dead_letters(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dead = commands.add_parser(
        "dead-letters", help="list the events a replay set aside (--on-error dead-letter)",
        description="Print how many events a checkpoint's runs set aside as dead letters, per key, "
        "with the first error of each key.",
    )
    dead.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)
    dead.add_argument("--top", type=_positive, default=20, metavar="N", help="keys to list (default: 20)")


def _add_release(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    release = commands.add_parser(
        "release", help="release a checkpoint's claim whose owner is gone",
        description="Release the claim a run holds on a checkpoint, for an operator who knows the run "
        "is gone (its machine lost, say) and will not wait for the claim to expire. Should the run come "
        "back, it is fenced: it stops without saving anything more.",
    )
    release.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)
    release.add_argument("--force", action="store_true", required=True,
                         help="required: say that the owner is gone")


def _add_rescale(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    note = ("On a checkpoint no run holds, the change is recorded at once and the next run starts over "
            "the new set. On one a live run holds, it is asked of that run, which applies it within "
            "seconds without exiting (a stream: at its next micro-batch); the command does not wait.")
    split = commands.add_parser(
        "split", help="split one segment of a checkpoint, now or in its live run",
        description=f"Split live segment SEGMENT_ID of CHECKPOINT in two. {note}",
    )
    merge = commands.add_parser(
        "merge", help="merge one segment of a checkpoint with its sibling, now or in its live run",
        description="Merge live segment SEGMENT_ID of CHECKPOINT with its sibling (as Axon's "
        f"mergeSegment), which must be live too. {note}",
    )
    for command in (split, merge):
        command.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)
        command.add_argument("segment_id", type=_non_negative, metavar="SEGMENT_ID",
                             help="a live segment's id (`segack status` lists them)")
    scale = commands.add_parser(
        "scale", help="give a checkpoint a whole new segment set, now or in its live run",
        description=f"Give CHECKPOINT a new set of segments. {note}",
    )
    scale.add_argument("checkpoint", metavar="CHECKPOINT", help=_CHECKPOINT_HELP)
    scale.add_argument("--segments", type=_replay_segments, required=True, metavar="N|ID,ID,...|auto",
                       help="a balanced set of N segments, the live segment ids, or auto: planned from the "
                       "load of each key group measured so far")
    scale.add_argument("--workers", type=_positive, default=None, metavar="N",
                       help="with --segments auto: plan for N workers (default: the current count)")
    for command in (split, merge, scale):
        command.add_argument("--claim-timeout", type=float, default=60.0, metavar="SECONDS",
                             help="the claim the change takes on a checkpoint no run holds expires after "
                             "this long unextended (default: 60)")


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="replay a generated event log into SQLite, crash it, resume it, check it",
        description="Generate a skewed event log, replay it into a SQLite database through an "
        "idempotent handler on an embedded local Spark, kill the run partway, resume it with another "
        "segment count, and check the database against sequential processing.",
    )
    demo.add_argument("--events", type=_positive, default=120_000, metavar="N",
                      help="events to generate (default: 120000)")
    demo.add_argument("--workdir", default=None, metavar="DIR",
                      help="where to put the log, checkpoint and databases, and leave them (default: a "
                      "temporary directory, removed at the end)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the temporary directory (it holds about 40 MB for the default events)")


def _locate(args: argparse.Namespace) -> int:
    segments: SegmentSet = args.segments
    width = max(len(key) for key in args.keys)
    for key in args.keys:
        hash_value = _hash_key(key, args.hash)
        index = segments.owner_index(hash_value)
        member = segments[index]
        print(
            f"{key:<{width}}  hash {hash_value:>11}  segment #{index} "
            f"(id {member.segment_id}, mask {member.mask}, share {member.share:.4%})"
        )
    return ExitCode.OK


def _refused(command: str, error: Exception) -> int:
    """Print why ``segack COMMAND`` cannot use its checkpoint; :attr:`ExitCode.REFUSED`."""
    print(f"segack {command}: {error}", file=sys.stderr)
    return ExitCode.REFUSED


def _status(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
    from segack.spark_adapter.store.claims import latest_claim, recorded_state
    from segack.spark_adapter.store.stream_view import stream_now

    try:
        store = CheckpointStore(args.checkpoint)
        state, unmerged = recorded_state(store)
        letters = store.count_dead_letters()
        claim = latest_claim(store)
    except (CheckpointError, ValueError, OSError) as error:
        return _refused("status", error)
    settings, tokens = state.settings, state.tokens
    print(f"{'checkpoint':<15} {store.location}")
    print(f"{'status':<15} {_status_line(settings.get('status', '?'), claim, letters, 'stream' in settings)}")
    _print_stream(stream_now(store.files, settings.get("stream")))
    if tokens is not None:
        if "stream" in settings:  # the tokens count the last micro-batch's events
            aside = f", {counted(letters, 'event')} of them set aside as dead letters" if letters else ""
            print(f"{'events':<15} {int(settings['stream'].get('events', 0)):,} in its complete "
                  f"micro-batches{aside}")
        else:
            print(f"{'events':<15} {_events_line(tokens.done, state.input_events, letters)}")
        if unmerged and claim is not None:
            when = "the run merges them" if claim.live(time.time()) else "the next run merges them"
            print(f"{'':<15} (counting {counted(len(unmerged), 'progress file')} of run {claim.progress_run} "
                  f"that the state does not hold yet: {when})")
        _print_key_groups(tokens, settings.get("segments"))
    history = settings.get("segment_history", [])
    if history:
        print(f"{'segment sets':<15} {counted(len(history), 'set')}, newest last")
        for entry in history[-10:]:
            print(f"  {_when(entry['at'])}  {len(entry['segments']):>4} segments  {entry['why']}")
    pending = _pending_line(store)
    if pending:
        print(f"{'requested':<15} {pending}")
    files = store.progress_files()
    print(f"{'size':<15} {store.size_bytes():,} bytes (its state and {counted(len(files), 'progress file')})")
    print(f"{'claim':<15} {_claim_line(store)}")
    if letters:
        print(f"{'dead letters':<15} {counted(letters, 'event')} set aside "
              f"(`segack dead-letters {args.checkpoint}` lists them)")
    if "input_fingerprint" in settings and "stream" not in settings:
        print(f"{'input':<15} {_input_line(settings['input_fingerprint'])}")
    for name in ("source", "key", "order", "hash", "runs", "flush_every", "flush_interval"):
        if name in settings:
            print(f"{name:<15} {settings[name]}")
    if "checkpoint_id" in settings:
        print(f"{'checkpoint id':<15} {settings['checkpoint_id']} (a SqlSink's positions table: "
              f"segack_applied_{settings['checkpoint_id']}, dropped by hand with the checkpoint)")
    return ExitCode.OK


def _print_stream(stream: dict[str, Any] | None) -> None:
    """A stream's last micro-batch, the one in progress, and (Kafka) where each partition stands."""
    if not stream:
        return
    last = stream.get("last_batch") or {}
    done = stream.get("completed_batch", -1)
    line = "no micro-batch complete yet" if done < 0 else f"micro-batch {done} the last complete"
    if last.get("at"):
        line += f" (reported {_when(last['at'])})"
    if stream.get("batch"):
        line += f"; batch {stream['batch']['id']} in progress"
    print(f"{'stream':<15} {line}")
    start = stream.get("start") or {}
    if start.get("where"):
        skipped = start.get("passed_over", 0)
        passed = f", passing over {counted(skipped, 'record')} it held before" if skipped else ""
        print(f"{'started':<15} {start['where']}{passed} ({_when(start['at'])})")
    partitions = stream.get("partitions") or []
    if not partitions:
        return
    group = stream.get("commit_offsets_to")
    told = f"committed to consumer group {group}" if group else "not committed to Kafka (--commit-offsets-to)"
    ends = ("; end offsets as Spark last reported them" if stream.get("ends_at") is None
            else f"; end offsets read from Kafka at {_when(stream['ends_at'])}")
    print(f"{'kafka':<15} offsets as of micro-batch {last.get('id')}, {told}{ends}")
    # A record from before segack kept what the group was told: every offset was committed.
    told_group = {(topic, partition): end for topic, partition, end in stream.get(
        "group_offsets", [[topic, partition, end] for topic, partition, end, _ in partitions])}
    for topic, partition, end, latest in partitions:
        lag = "" if latest is None else f", end {latest:,}, lag {max(latest - end, 0):,}"
        at = told_group.get((topic, partition))
        state = ("done" if not group else "committed" if at == end
                 else "done, not committed yet" if at is None else f"done, the group at {at:,}")
        print(f"  {topic}/{partition:<5} next offset {end:,} ({state}){lag}")


def _status_line(status: str, claim: Claim | None, letters: int, streams: bool = False) -> str:
    """What a checkpoint's recorded status and claim mean, and what to do next."""
    if claim is not None and claim.live(time.time()):
        return f"running: {claim.owner()} holds it"
    if status in ("running", "incomplete"):
        return "stopped before its end (killed, or its machine lost); the next run resumes it"
    if status == "failed":
        return "stopped: its last run failed (the handler, or a Spark task); the next run resumes it"
    if status == "complete" and letters:
        return (f"not complete: {counted(letters, 'dead letter')} left (read to the end; "
                f"--retry-dead-letters handles them)")
    if status == "complete":
        return "up to date: every event of its micro-batches handled" if streams else (
            "complete: every event handled")
    return status


def _events_line(done: int, total: int | None, letters: int) -> str:
    """Events handled, set aside and left, never rounded up to all of them."""
    handled = max(done - letters, 0)
    aside = f", {counted(letters, 'event')} set aside as dead letters" if letters else ""
    if total is None:
        return (f"{handled:,} handled{aside}; the total is counted once a run reads its input to the end "
                f"without a failure")
    return (f"{total:,} in all: {handled:,} handled ({percent(handled, total)}), {letters:,} set aside, "
            f"{total - done:,} not reached yet")


def percent(part: int, whole: int) -> str:
    """``part / whole`` as a percentage to a tenth, rounded down: 100.0% only when all of it."""
    tenths = part * 1000 // max(whole, 1)
    return f"{tenths // 10}.{tenths % 10}%"


def _print_key_groups(tokens: KeyGroupTokens, segment_ids: list[int] | None) -> None:
    """The key groups' progress, and each segment's load and progress."""
    from segack.spark_adapter.console.snapshot import segment_views

    per_group = tokens.done_per_key_group()
    if tokens.counted:
        finished = int(((per_group == tokens.count) & (tokens.count > 0)).sum())
        print(f"{'key groups':<15} {tokens.size:,} ({tokens.bits} bits): "
              f"{int((tokens.count > 0).sum()):,} with events, {finished:,} of them done")
    else:
        print(f"{'key groups':<15} {tokens.size:,} ({tokens.bits} bits): "
              f"{int((per_group > 0).sum()):,} with events done")
    if not segment_ids:
        return
    views = segment_views(tokens, segment_ids)
    print(f"{'segments':<15} {len(views)} now (done counts events handled and set aside)")
    width = len(f"{int(max(tokens.count.max(initial=0), per_group.max(initial=0))):,}")
    for view in views:
        # A segment's share of the events is its share of the run's time: the largest
        # holds the run back (`segack plan` proposes a set that evens them out).
        events = (f"{view.load:>{width},} events {view.load / max(tokens.total or 0, 1):6.1%}"
                  if view.load is not None else f"{'?':>{width}} events {'':6}")
        print(f"  #{view.position:<3} id {view.segment_id:<6} mask {view.mask:<6} "
              f"{events}  {view.done:>{width},} done  {view.key_groups:,} key groups")


def _input_line(fingerprint: str | None) -> str:
    """What the last run recorded of its input, and what that means for the next resume."""
    if fingerprint is None:
        return ("no fingerprint (not a query over files alone that Spark describes in full, or Spark "
                "Connect): a resume checks the events done")
    return f"fingerprint {fingerprint[:12]}: a resume over these files, unchanged, is not checked again"


def _when(at: float) -> str:
    """A time as ``segack status`` shows it: local, to the second."""

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _pending_line(store: CheckpointStore) -> str | None:
    """The change of segments waiting for a run, as ``segack status`` shows it."""
    from segack.spark_adapter.store.checkpoint import CheckpointError
    from segack.spark_adapter.store.rescale import pending_change

    try:
        change = pending_change(store)
    except CheckpointError as error:
        return str(error)
    if change is None:
        return None
    return (f"{change.why} -> {len(change.segments)} segments, asked {_when(change.requested_at)} by "
            f"{change.by}; the run applies it within seconds")


def counted(number: int, noun: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{number:,} {noun}" + ("" if number == 1 else "s")


def _claim_line(store: CheckpointStore) -> str:
    """The checkpoint's claim, as ``segack status`` shows it."""
    from segack.spark_adapter.store.claims import latest_claim

    claim = latest_claim(store)
    atomic = "" if store.claims_are_atomic else (
        " (this store cannot create a file exclusively: two runs starting at the same moment could "
        "both claim it)")
    if claim is None:
        return f"never claimed{atomic}"
    now = time.time()
    if claim.released:
        by = f" by {claim.released_by}" if claim.released_by else ""
        return f"free: {claim.owner()} released it{by} {now - claim.extended_at:,.0f} s ago{atomic}"
    state = "held" if claim.live(now) else (
        "expired (its owner is gone)" if claim.owner_gone() else "expired")
    return (f"{state}: {claim.owner()}, claim {claim.number}, extended {now - claim.extended_at:,.1f} s ago, "
            f"timeout {claim.timeout:g} s{atomic}")


def _release(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
    from segack.spark_adapter.store.claims import force_release

    try:
        store = CheckpointStore(args.checkpoint)
        store.load_existing()
        released = force_release(store, f"segack release --force (pid {os.getpid()})")
    except (CheckpointError, ValueError, OSError) as error:
        return _refused("release", error)
    if released is None:
        print(f"segack release: {store.location} is not claimed; nothing to do")
    else:
        print(f"segack release: released the claim of {released.owner()}; should it come back, it is fenced")
    return ExitCode.OK


def _rescale(args: argparse.Namespace) -> int:
    from segack.spark_adapter.store import rescale
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    command = f"segack {args.command}"
    try:
        store = CheckpointStore(args.checkpoint)
        if args.command == "split":
            outcome = rescale.split(store, args.segment_id, claim_timeout=args.claim_timeout)
        elif args.command == "merge":
            outcome = rescale.merge(store, args.segment_id, claim_timeout=args.claim_timeout)
        else:
            outcome = rescale.scale(store, args.segments, workers=args.workers,
                                    claim_timeout=args.claim_timeout)
    except (CheckpointError, ValueError, OSError) as error:
        return _refused(args.command, error)
    print(f"{command}: {outcome.describe()}")
    return ExitCode.OK


def _dead_letters(args: argparse.Namespace) -> int:
    from segack.spark_adapter.console.snapshot import dead_letter_keys
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    try:
        store = CheckpointStore(args.checkpoint)
        state = store.load_existing()
        events, keys = dead_letter_keys(store, str(state.settings.get("key", "")))
    except (CheckpointError, ValueError, OSError) as error:
        return _refused("dead-letters", error)
    if not keys:
        print(f"{'dead letters':<15} none")
        return ExitCode.OK
    print(f"{'dead letters':<15} {counted(events, 'event')} of {counted(len(keys), 'key')}")
    shown = keys[:args.top]
    width = max(len(str(letter.key)) for letter in shown)
    print(f"{state.settings.get('key')!s:<{width}}  {'events':>8}  first error")
    for letter in shown:
        tries = f" ({letter.attempts} attempts)" if letter.attempts > 1 else ""
        print(f"{letter.key!s:<{width}}  {letter.events:>8,}  {letter.error}{tries}")
    if len(keys) > args.top:
        print(f"... and {len(keys) - args.top:,} more keys")
    return ExitCode.OK


def _ui(args: argparse.Namespace) -> int:
    """``segack ui``: serves until Ctrl-C or SIGTERM, then exits 0."""
    try:
        from segack.spark_adapter.console.page import serve_page
    except ImportError as error:
        print(f"segack ui: needs Flask ({error}): pip install 'segack[ui]'", file=sys.stderr)
        return ExitCode.USAGE
    from segack.spark_adapter.errors import OptionError
    from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

    try:
        store = CheckpointStore(args.checkpoint)
        store.load()  # a location that is not a checkpoint is refused here, not on the page
        server = serve_page(store, args.host, args.port, args.token, read_only=args.read_only)
    except OptionError as error:
        print(f"segack ui: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except (CheckpointError, ValueError, OSError) as error:
        return _refused("ui", error)
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set())
                for number in (signal.SIGTERM, signal.SIGINT)}
    controls = logging.getLogger("segack.spark_adapter.console.controls")
    controls_level = controls.level
    controls.setLevel(logging.INFO)  # each control done is printed
    mode = ", read-only" if args.read_only else ""
    print(f"segack ui: serving {store.location} on {server.url} (Ctrl-C stops{mode})", flush=True)
    try:
        stop.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        controls.setLevel(controls_level)
        server.close()
    return ExitCode.OK


class _LogLines(logging.Formatter):
    """``segack: message``, with the level for warnings and errors."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"segack: {level}{record.getMessage()}"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record to ``sys.stderr`` as it is when the record comes."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _log_to_stderr(verbose: bool) -> None:
    """Show the package's warnings on stderr, and with ``verbose`` what its runs decide."""
    logger = logging.getLogger("segack")
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_LogLines())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``segack`` command; returns the exit status."""
    # Whole lines, in the order they were printed, when stdout and stderr go to one file.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command in ("replay", "plan") and (args.input is None) == (args.table is None):
            parser.exit(ExitCode.USAGE, f"segack {args.command}: error: give INPUT or --table NAME, "
                                        f"one of them\n")
        if args.command == "stream":
            _check_stream_input(parser, args)
        _log_to_stderr(getattr(args, "verbose", False))
        return _run(args)
    except BrokenPipeError:
        # The reader went away (``segack status CK | head``): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK


def _check_stream_input(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``segack stream``: Kafka records need a value schema and no INPUT; anything else, INPUT or
    --table, and no Kafka flag."""
    if args.format == "kafka":
        wrong = ("INPUT" if args.input is not None else "--table" if args.table is not None else
                 None if args.value_schema is not None else "")
        if wrong == "":
            parser.exit(ExitCode.USAGE, "segack stream: error: --format kafka needs --value-schema DDL\n")
        if wrong:
            parser.exit(ExitCode.USAGE, f"segack stream: error: --format kafka reads the topics its --option "
                                        f"subscribe=... names, not {wrong}\n")
        return
    if (args.input is None) == (args.table is None):
        parser.exit(ExitCode.USAGE, "segack stream: error: give INPUT or --table NAME, one of them\n")
    kafka_only = [flag for flag, value in (("--value-schema", args.value_schema),
                                           ("--commit-offsets-to", args.commit_offsets_to)) if value]
    if kafka_only:
        parser.exit(ExitCode.USAGE, f"segack stream: error: {kafka_only[0]} is for --format kafka\n")


def _run(args: argparse.Namespace) -> int:
    if args.command == "locate":
        return _locate(args)
    if args.command == "status":
        return _status(args)
    if args.command == "dead-letters":
        return _dead_letters(args)
    if args.command == "ui":
        return _ui(args)
    if args.command == "release":
        return _release(args)
    if args.command in ("split", "merge", "scale"):
        return _rescale(args)
    from segack import spark_cli

    if args.command == "replay":
        return spark_cli.replay_command(args)
    if args.command == "stream":
        return spark_cli.stream_command(args)
    if args.command == "plan":
        return spark_cli.plan_command(args)
    if args.command == "demo":
        return spark_cli.demo_command(args)
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
