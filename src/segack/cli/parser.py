"""The ``segack`` command's parser: each command, its arguments and its help (also what the
docs' command reference is made from)."""

from __future__ import annotations

import argparse
from pathlib import Path

from segack._shared import HASHES
from segack.cli.exit_codes import ExitCode, exit_status_help
from segack.cli.flags import (
    CHECKPOINT_HELP,
    NON_NEGATIVE,
    POSITIVE,
    add_handling,
    add_input,
    add_run_flags,
    add_session_options,
    checked_option,
    int_at_least,
    kafka_properties,
    positive_seconds,
    replay_segments,
    segment_set,
    trigger_text,
)
from segack.kernel import SegmentSet


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
        "--segments", type=segment_set, default=SegmentSet.balanced(1), metavar="N|ID,ID,...",
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
    replay.epilog = exit_status_help()
    add_handling(replay)
    add_input(replay)
    add_session_options(replay)
    replay.add_argument("--py-files", default="", metavar="FILE,FILE,...",
                        help=".py, .zip or .egg files the handler imports, sent to the executors (the "
                        "handler's own module is sent without asking)")
    add_run_flags(replay)


def _add_stream(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stream = commands.add_parser(
        "stream", help="handle a stream (Kafka, Delta, files) in order per key, micro-batch by micro-batch",
        description="Run a Structured Streaming query that calls a handler once per event, never before "
        "every earlier event of its key has been handled. Each micro-batch is complete in the "
        "checkpoint before the next starts; Spark's own checkpoint of the query lives inside it. "
        "SIGTERM or Ctrl-C stops it at the end of the micro-batch under way, or --stop-timeout later at "
        "its tasks' next flush, exit 0 (twice: at once, exit 1, the batch's progress kept).",
    )
    stream.epilog = exit_status_help()
    add_handling(stream)
    add_input(stream, streams=True)
    stream.add_argument("--trigger", type=trigger_text, default="available-now",
                        metavar="available-now|EVERY|real-time",
                        help="available-now: handle what the source holds, then exit; an interval such as "
                        "5s or 500ms: a micro-batch that often, until stopped; real-time (Kafka): each "
                        "record as it arrives, by long-running tasks that read the topic's partitions, until "
                        "stopped (default: available-now)")
    stream.add_argument("--stop-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                        help="micro-batches: after SIGTERM or Ctrl-C, wait this long for the micro-batch "
                        "under way; then its tasks finish their calls in flight, save and end, exit 0, and "
                        "the next run finishes it (default: 20; inf waits for its end)")
    stream.add_argument("--commit-interval", type=positive_seconds, default=None, metavar="SECONDS",
                        help="--trigger real-time: save each partition's progress, and commit it to "
                        "--commit-offsets-to, this often (default: 1)")
    stream.add_argument("--value-format", choices=("json", "avro", "protobuf", "json-schema"), default="json",
                        help="Kafka: how each record's value is written: JSON text, or Avro, Protobuf or "
                        "JSON Schema in Confluent's wire format, each decoded by its writer's schema from "
                        "--schema-registry (default: json)")
    stream.add_argument("--schema-registry", default=None, metavar="URL",
                        help="Kafka: the Schema Registry of --value-format avro, protobuf or json-schema "
                        "(the option schema.registry.url; schema.registry.basic.auth.user.info, "
                        "schema.registry.bearer.auth.token and schema.registry.ssl.ca.location log in)")
    stream.add_argument("--avro-schema", default=None, metavar="FILE",
                        help="Kafka, --value-format avro: an Avro schema file (.avsc, JSON; the option "
                        "avroSchema, as Spark's from_avro takes it): with --schema-registry, every value is "
                        "resolved to it rather than to its subject's latest; without, values are plain "
                        "binary Avro written by it, with no header (as Spark's to_avro writes them)")
    stream.add_argument("--value-schema", default=None, metavar="DDL",
                        help="Kafka: the value's fields and types, as 'account STRING, seq BIGINT, amount "
                        "BIGINT'; each event has them beside key, topic, partition, offset and timestamp")
    stream.add_argument("--kafka-properties", default=None, metavar="FILE",
                        help="Kafka: a client's properties file, as Kafka's own tools take it (NAME=VALUE "
                        "lines, NAME without kafka.): each is --option kafka.NAME=VALUE, an --option "
                        "given beside it winning; keeps passwords out of the command line")
    stream.add_argument("--commit-offsets-to", default=None, metavar="GROUP",
                        help="Kafka: after each micro-batch complete in the checkpoint, commit each "
                        "partition's offset to consumer group GROUP, for Kafka's own tools to see")
    add_session_options(stream)
    stream.add_argument("--py-files", default="", metavar="FILE,FILE,...",
                        help=".py, .zip or .egg files the handler imports, sent to the executors")
    add_run_flags(stream, streams=True)


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
    add_input(plan)
    plan.add_argument("--hash", choices=HASHES, default="spark",
                      help="spark: Spark's hash(); java: Axon's hashCode (default: spark)")
    plan.add_argument("--workers", type=POSITIVE, default=None, metavar="N",
                      help="plan for N workers (default: the session's spark.sql.shuffle.partitions)")
    plan.add_argument("--key-group-bits", type=checked_option("key_group_bits", int), default=12, metavar="K",
                      help="the key-group resolution of the checkpoint you will use (default: 12)")
    plan.add_argument("--sample", type=float, default=None, metavar="FRACTION",
                      help="count this fraction of the events, for a faster estimate (default: all)")
    plan.add_argument("--top", type=POSITIVE, default=5, metavar="N",
                      help="hottest keys to show (default: 5)")
    add_session_options(plan)


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser(
        "status", help="show a checkpoint",
        description="Print a checkpoint's progress (events, done, per segment of the last run), its "
        "size, and the settings of the run that wrote it.",
    )
    status.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)


def _add_ui(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = commands.add_parser(
        "ui", help="serve a page that follows a checkpoint, and its Prometheus metrics",
        description="Serve a page for one checkpoint (its run, segments, key groups, segment sets, dead "
        "letters), redrawn every few seconds while a run goes on or after it, and its Prometheus "
        "metrics on /metrics. It reads the checkpoint as segack status does; its controls split, merge "
        "or scale the segments and release a claim whose owner is gone, as the commands of those names "
        "do, each printed here as it is done. Runs until Ctrl-C or SIGTERM.",
    )
    ui.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    ui.add_argument("--host", default="127.0.0.1",
                    help="the address to listen on (default: %(default)s, this machine only)")
    ui.add_argument("--port", type=int_at_least(0, "a port"), default=8642,
                    help="the port (default: %(default)s; 0: any free one)")
    given = ui.add_mutually_exclusive_group()
    given.add_argument("--token-file", default=None, metavar="PATH",
                       help="read the token from the first line of this file")
    given.add_argument("--token", default=None,
                       help="the token itself (ps shows it to every user of the machine: prefer "
                       "--token-file or the SEGACK_UI_TOKEN environment variable)")
    ui.add_argument("--read-only", action="store_true",
                    help="no controls: the page and its API change nothing (their POSTs answer 403); on "
                    "loopback, such a page needs no token")
    ui.epilog = ("Every request but the page's shell carries the token as Authorization: Bearer TOKEN "
                 "(the page's script sends the one in its address, after #token=) unless the page is "
                 "read-only on loopback. Without --token-file, --token or SEGACK_UI_TOKEN, one is made and "
                 "printed once in the address.")


def _add_dead_letters(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dead = commands.add_parser(
        "dead-letters", help="list the events a replay set aside (--on-error dead-letter)",
        description="Print how many events a checkpoint's runs set aside as dead letters, per key, "
        "with the first error of each key.",
    )
    dead.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    dead.add_argument("--top", type=POSITIVE, default=20, metavar="N", help="keys to list (default: 20)")


def _add_release(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    release = commands.add_parser(
        "release", help="release a checkpoint's claim whose owner is gone",
        description="Release the claim a run holds on a checkpoint, for an operator who knows the run "
        "is gone (its machine lost, say) and will not wait for the claim to expire. Should the run come "
        "back, it is fenced: it stops without saving anything more.",
    )
    release.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
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
        command.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
        command.add_argument("segment_id", type=NON_NEGATIVE, metavar="SEGMENT_ID",
                             help="a live segment's id (`segack status` lists them)")
    scale = commands.add_parser(
        "scale", help="give a checkpoint a whole new segment set, now or in its live run",
        description=f"Give CHECKPOINT a new set of segments. {note}",
    )
    scale.add_argument("checkpoint", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    scale.add_argument("--segments", type=replay_segments, required=True, metavar="N|ID,ID,...|auto",
                       help="a balanced set of N segments, the live segment ids, or auto: planned from the "
                       "load of each key group measured so far")
    scale.add_argument("--workers", type=POSITIVE, default=None, metavar="N",
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
    demo.add_argument("--events", type=POSITIVE, default=120_000, metavar="N",
                      help="events to generate (default: 120000)")
    demo.add_argument("--workdir", default=None, metavar="DIR",
                      help="where to put the log, checkpoint and databases, and leave them (default: a "
                      "temporary directory, removed at the end)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the temporary directory (it holds about 40 MB for the default events)")


def check_input(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot say of a command's input: ``replay``, ``plan`` and ``stream`` read INPUT
    or a ``--table``, one of them, except ``stream --format kafka``, which reads the topics its
    options name and needs a value schema; the Kafka flags are for Kafka alone. A wrong command line
    exits :attr:`ExitCode.USAGE` here."""
    if args.command not in ("replay", "plan", "stream"):
        return
    if args.command == "stream" and args.kafka_properties is not None:
        if args.format != "kafka":
            parser.exit(ExitCode.USAGE, "segack stream: error: --kafka-properties is for --format kafka\n")
        try:
            args.option = [*kafka_properties(args.kafka_properties), *args.option]
        except ValueError as error:
            parser.exit(ExitCode.USAGE, f"segack stream: error: --kafka-properties: {error}\n")
    if args.command == "stream" and args.schema_registry is not None:
        if args.format != "kafka":
            parser.exit(ExitCode.USAGE, "segack stream: error: --schema-registry is for --format kafka\n")
        args.option = [*args.option, ("schema.registry.url", args.schema_registry)]
    if args.command == "stream" and args.avro_schema is not None:
        if args.format != "kafka":
            parser.exit(ExitCode.USAGE, "segack stream: error: --avro-schema is for --format kafka\n")
        try:
            args.option = [*args.option, ("avroSchema", Path(args.avro_schema).read_text(encoding="utf-8"))]
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else error
            parser.exit(ExitCode.USAGE, f"segack stream: error: --avro-schema: cannot read "
                                        f"{args.avro_schema}: {why}\n")
    if args.command == "stream" and args.format == "kafka":
        wrong = ("INPUT" if args.input is not None else "--table" if args.table is not None else
                 None if args.value_schema is not None else "")
        if wrong == "":
            parser.exit(ExitCode.USAGE, "segack stream: error: --format kafka needs --value-schema DDL\n")
        if wrong:
            parser.exit(ExitCode.USAGE, f"segack stream: error: --format kafka reads the topics its --option "
                                        f"subscribe=... names, not {wrong}\n")
        return
    if (args.input is None) == (args.table is None):
        parser.exit(ExitCode.USAGE,
                    f"segack {args.command}: error: give INPUT or --table NAME, one of them\n")
    kafka_only = [flag for flag, value in (("--value-schema", getattr(args, "value_schema", None)),
                                           ("--commit-offsets-to", getattr(args, "commit_offsets_to", None)))
                  if value]
    if kafka_only:
        parser.exit(ExitCode.USAGE, f"segack stream: error: {kafka_only[0]} is for --format kafka\n")
