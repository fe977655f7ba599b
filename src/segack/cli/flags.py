"""The flags' types (how each flag's text parses, refused as argparse refuses) and the groups of
flags commands share: the input, the Spark session, the handling, and a flag for each run option
(:data:`RUN_FLAGS`), which :func:`run_keywords` turns into the run's options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from enum import Enum
from typing import Any

from segack._shared import HASHES
from segack.cli.properties import read_properties
from segack.errors import SegackValueError
from segack.kernel import SegmentSet
from segack.spark_adapter.options import OnError, Policy, Verify, option_fields


def replay_segments(text: str) -> SegmentSet | str:
    """What ``segack replay --segments`` takes: as :func:`segment_set`, or ``auto``."""
    return text if text == "auto" else segment_set(text)


def segment_set(text: str) -> SegmentSet:
    """``N`` (a balanced set of N) or ``ID,ID,...`` (the live segment ids)."""
    try:
        if "," not in text:
            return SegmentSet.balanced(int(text))
        return SegmentSet.from_ids(int(part) for part in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad --segments {text!r}: {error}") from None


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE``, as ``spark-submit --conf`` takes it."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def kafka_properties(path: str) -> list[tuple[str, str]]:
    """A Kafka client's properties file (:mod:`~segack.cli.properties`), each setting as the
    ``--option`` ``kafka.NAME=VALUE``, but a Schema Registry's (``schema.registry.NAME``, as
    Confluent's clients keep them in the same file) as it is. Raises
    :class:`~segack.SegackValueError` if it cannot be read or holds a bad escape, saying so of
    ``path``."""
    try:
        with open(path, encoding="latin-1") as file:  # Java's own encoding of properties files
            text = file.read()
    except OSError as error:
        raise SegackValueError(f"cannot read {path}: {error.strerror}") from None
    return [(name if name.startswith("schema.registry.") else f"kafka.{name}", value)
            for name, value in read_properties(text, path)]


def int_at_least(least: int, what: str) -> Callable[[str], int]:
    """An integer of at least ``least``; refused as not ``what`` otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")
        return value

    return parse


POSITIVE = int_at_least(1, "a positive integer")


NON_NEGATIVE = int_at_least(0, "a non-negative integer")


def positive_seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return seconds


#: How the flag of each run option parses (:mod:`segack.spark_adapter.options` gives its default,
#: help and metavar): a function of the text, the choices (a tuple or an enum), or ``bool`` for a
#: flag that takes no value. ``segack replay`` has a flag for each, in this order.
RUN_FLAGS: dict[str, Any] = {
    "segments": replay_segments,
    "hash": HASHES,
    "key_group_bits": int,
    "shared_local_checkpoint": bool,
    "flush_every": POSITIVE,
    "flush_interval": float,
    "concurrency": POSITIVE,
    "batch_size": POSITIVE,
    "max_pending": POSITIVE,
    "policy": Policy,
    "retries": NON_NEGATIVE,
    "retry_delay": float,
    "timeout": float,
    "on_error": OnError,
    "retry_dead_letters": bool,
    "claim_timeout": float,
    "verify": Verify,
}


def checked_option(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
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


def add_run_flags(command: argparse.ArgumentParser, streams: bool = False) -> None:
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
            command.add_argument(flag, type=checked_option(name, parse), default=default,
                                 metavar=spec.metadata["metavar"],
                                 help=spec.metadata["help"])


def run_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The run options the command line gave, as keyword arguments of
    :func:`~segack.spark_adapter.replay` (or :func:`~segack.spark_adapter.stream`)."""
    return {name: getattr(args, name) for name in RUN_FLAGS if hasattr(args, name)}


def metrics_address(text: str) -> str:
    """What ``--metrics-port`` takes: ``PORT`` or ``HOST:PORT``."""
    from segack.spark_adapter.console.metrics import parse_address
    from segack.spark_adapter.errors import OptionError

    try:
        parse_address(text)
    except OptionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("metrics_port ")) from None
    return text


#: ``segack stream --trigger``'s value for a real-time stream
#: (:mod:`segack.spark_adapter.coordinator.realtime`).
REAL_TIME = "real-time"


def trigger_text(text: str) -> str:
    """What ``segack stream --trigger`` takes: ``available-now``, ``real-time``, or an interval."""
    from segack.spark_adapter.coordinator.query import parse_trigger
    from segack.spark_adapter.errors import OptionError

    if text == REAL_TIME:
        return text
    try:
        parse_trigger(text)
    except OptionError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("trigger ")) from None
    return text


def add_session_options(command: argparse.ArgumentParser) -> None:
    """Where a command's Spark session runs, and how it logs."""
    where = command.add_mutually_exclusive_group()
    where.add_argument("--master", default=None, metavar="URL",
                       help="the Spark master: local[N], local-cluster[...], spark://..., yarn, k8s://... "
                       "(default: local[2])")
    where.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                       help="a Spark Connect server to run on instead of a master")
    command.add_argument("--conf", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                         help="a Spark setting, as spark-submit takes it (repeatable)")
    command.add_argument("--verbose", action="store_true",
                         help="let Spark's driver log as it would by default (its banner, warnings), and "
                         "say what the run decides: claims, jobs, merges, changes of segments")


CHECKPOINT_HELP = "a local directory, an object store's prefix (s3://, gs://, az://) or a pyarrow.fs URI"


def add_input(command: argparse.ArgumentParser, streams: bool = False) -> None:
    """The events: files Spark reads (INPUT, --format, --option) or a table it knows (--table)."""
    command.add_argument("input", metavar="INPUT", nargs="?",
                         help="a file or directory Spark can read (or give --table; none for --format kafka)"
                         if streams else "a file or directory Spark can read (or give --table)")
    command.add_argument("--table", default=None, metavar="NAME",
                         help="read a table the Spark session knows (spark.read.table) instead of INPUT")
    # Spark reads a format's name in any case; segack's own rules for kafka, delta and csv do too.
    command.add_argument("--format", default="parquet", metavar="FORMAT", type=str.lower,
                         help="INPUT's format: any Spark's reader takes, with its connector on the session "
                         "(delta, avro, ...; default: parquet; csv reads a header line and infers types)")
    command.add_argument("--option", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                         help="an option of Spark's reader for INPUT (repeatable), as DataFrameReader.option")


def add_handling(command: argparse.ArgumentParser) -> None:
    """The flags ``replay`` and ``stream`` share: key, order, handler, checkpoint, what to ship."""
    command.add_argument("--key", required=True, metavar="COL", help="the sequencing key column")
    command.add_argument("--order", required=True, metavar="COL",
                         help="the column that orders each key's events (need not be sorted)")
    command.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                         help="called with each event as a dict of its columns")
    command.add_argument("--checkpoint", required=True, metavar="DIR", help=CHECKPOINT_HELP)
    command.add_argument("--metrics-port", type=metrics_address, default=None, metavar="[HOST:]PORT",
                         help="serve the checkpoint's Prometheus metrics on http://HOST:PORT/metrics while "
                         "the run goes on (HOST: 127.0.0.1 unless given)")
