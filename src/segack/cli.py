"""The ``segack`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from segack.kernel import SegmentSet, java_hash, spark_hash


def _segment_set(text: str) -> SegmentSet:
    """``N`` (a balanced set of N) or ``ID,ID,...`` (the live segment ids)."""
    try:
        if "," not in text:
            return SegmentSet.balanced(int(text))
        return SegmentSet.from_ids(int(part) for part in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad --segments {text!r}: {error}") from None


def _hash_key(key: str, hash_name: str) -> int:
    return java_hash(key) if hash_name == "java" else spark_hash(key)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``segack`` command (also used to document it)."""
    parser = argparse.ArgumentParser(
        prog="segack", description="Ordered, resumable, rescalable event processing on Spark."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
        "--hash", choices=["java", "spark"], default="java",
        help="java: Axon's String.hashCode; spark: Spark SQL's hash() (default: java)",
    )
    return parser


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
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``segack`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "locate":
        return _locate(args)
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
