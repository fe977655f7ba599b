"""``segack locate`` and ``segack plan``: where keys go, and how to cut the hash space for the
load of the events."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from segack.cli.exit_codes import ExitCode
from segack.cli.session import start_session, stop_session
from segack.kernel import SegmentSet, java_hash, spark_hash
from segack.spark_adapter.coordinator.replay import worker_error
from segack.spark_adapter.errors import InputError, OptionError
from segack.spark_adapter.sources.files import check_input_files, read_input

if TYPE_CHECKING:
    from segack.spark_adapter.coordinator.planning import Plan


def run(args: argparse.Namespace) -> int:
    """``segack locate`` or ``segack plan``: an :class:`~segack.cli.ExitCode`."""
    return _locate(args) if args.command == "locate" else _plan(args)


def _locate(args: argparse.Namespace) -> int:
    """Each key's hash and owning segment."""
    segments: SegmentSet = args.segments
    width = max(len(key) for key in args.keys)
    for key in args.keys:
        hash_value = java_hash(key) if args.hash == "java" else spark_hash(key)
        index = segments.owner_index(hash_value)
        member = segments[index]
        print(
            f"{key:<{width}}  hash {hash_value:>11}  segment #{index} "
            f"(id {member.segment_id}, mask {member.mask}, share {member.share:.4%})"
        )
    return ExitCode.OK


def _share(fraction: float) -> str:
    """A share as a percentage, with a second decimal where one would show nothing."""
    return f"{fraction:.2%}" if 0 < fraction < 0.01 else f"{fraction:.1%}"


def _plan(args: argparse.Namespace) -> int:
    """``segack plan``: count the load, print the planned set beside a balanced one, and the floor."""
    from segack.spark_adapter.coordinator.planning import plan

    try:
        if args.input is not None:
            check_input_files(args.input, args.format)
    except InputError as error:
        print(f"segack plan: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    spark = None
    try:
        spark = start_session(args)
        try:
            events = read_input(spark, args.input, args.format, dict(args.option), args.table)
        except OptionError as error:  # of --option, read with Spark: a flag's error, as in stream
            print(f"segack plan: {error}", file=sys.stderr)
            return ExitCode.USAGE
        if args.order is not None and args.order not in events.columns:
            raise InputError(f"no column {args.order!r}; the columns are {events.columns}")
        result = plan(events, key=args.key, hash=args.hash, workers=args.workers,
                      key_group_bits=args.key_group_bits, sample=args.sample, top=args.top)
    except (ValueError, OSError) as error:
        print(f"segack plan: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    except Exception as error:
        print(f"segack plan: {worker_error(error)}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        stop_session(spark, args)
    _print_plan(result, args)
    return ExitCode.OK


def _print_plan(result: Plan, args: argparse.Namespace) -> None:
    """The load counted, the hottest keys and the speed-up they allow, the planned set beside a
    balanced one, and its ``--segments``."""
    sampled = f" (estimated from a {result.sample:.0%} sample)" if result.sample else ""
    print(f"{result.total:,} events{sampled}, {2**result.key_group_bits:,} key groups "
          f"({result.key_group_bits} bits), planned for {result.workers} workers")
    if result.hottest:
        width = max(len(str(value)) for value, _ in result.hottest)
        print(f"hottest keys ({args.key}):")
        for value, count in result.hottest:
            print(f"  {value!s:<{width}}  {count:>12,}  {_share(count / max(result.total, 1)):>7}")
        print(f"the hottest key holds {_share(result.hottest_share)} of the events: with per-key order, no "
              f"set of segments makes a run more than {result.floor:.1f}x faster than one worker")
    balanced: SegmentSet = result.balanced
    print(f"{'':<26}{'segments':>9}{'largest':>10}{'speed-up':>10}")
    for name, segments in ((f"planned for {result.workers}", result.segments),
                           (f"balanced({len(balanced)})", balanced)):
        print(f"{name:<26}{len(segments):>9}{result.largest_share(segments):>10.1%}"
              f"{result.speedup(segments):>9.1f}x")
    loads = result.loads(result.segments)
    print("the planned segments:")
    for position, member in enumerate(result.segments):
        print(f"  #{position:<3} id {member.segment_id:<6} mask {member.mask:<6} "
              f"{int(loads[position]):>12,} events  {loads[position] / max(result.total, 1):6.1%}")
    print(f"--segments {result.segments_option}")
