"""Conformance vectors: check an implementation against JSON-lines files, or write new ones.

One JSON object a line, ``{"op": ..., "in": ..., "out": ...}``, segments as
``[id, mask]`` (the docs' conformance page lists the ops); a line starting
with ``#`` is a comment, for a file's provenance. ``python -m
segack.conformance FILE...`` checks the kernel and the spec against every line
and exits non-zero on the first disagreement; ``python -m segack.conformance
--generate FILE`` writes the project's own vectors, computed by the spec.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import segack.kernel
import segack.specs
from segack.errors import SegackValueError

IMPLEMENTATIONS: dict[str, types.ModuleType] = {"kernel": segack.kernel, "spec": segack.specs}


def _segment_out(segment: Any) -> list[int]:
    return [segment.segment_id, segment.mask]


def evaluate(impl: types.ModuleType, op: str, given: Any) -> Any:
    """What ``impl`` answers for one vector's ``op`` and ``in``, in the vector format."""
    segment = impl.Segment
    if op == "split":
        return [_segment_out(child) for child in segment(*given).split()]
    if op == "split_segment_id":
        return segment(*given).split_segment_id()
    if op == "mergeable_segment_id":
        return segment(*given).mergeable_segment_id()
    if op == "is_mergeable_with":
        return segment(*given[0]).is_mergeable_with(segment(*given[1]))
    if op == "merged_with":
        return _segment_out(segment(*given[0]).merged_with(segment(*given[1])))
    if op == "matches":
        return segment(*given[0]).matches(given[1])
    if op == "compute_segments":
        return [_segment_out(s) for s in segment.compute_segments(given)]
    if op == "compute_segment":
        return _segment_out(segment.compute_segment(given[0], given[1]))
    if op == "split_balanced":
        return [_segment_out(s) for s in segment.split_balanced(segment(*given[0]), given[1])]
    if op == "java_hash":
        return impl.java_hash(given)
    if op == "java_hash_long":
        return impl.java_hash(given)
    raise SegackValueError(f"unknown op {op!r}")


def read_vectors(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, vector)`` for each line of a vector file but blank and ``#`` comment lines."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip() and not line.startswith("#"):
                yield number, json.loads(line)


def check_file(path: Path, impl: types.ModuleType) -> tuple[int, list[str]]:
    """How many vectors ``path`` holds and a description of each one ``impl`` gets wrong."""
    failures = []
    count = 0
    for number, vector in read_vectors(path):
        count += 1
        try:
            answer = evaluate(impl, vector["op"], vector["in"])
        except (ValueError, TypeError) as error:
            answer = f"{type(error).__name__}: {error}"
        if answer != vector["out"]:
            failures.append(f"{path}:{number}: {vector['op']}({vector['in']!r}) -> {answer!r}, "
                            f"expected {vector['out']!r}")
    return count, failures


def _random_split_ids(rng: random.Random, splits: int) -> list[int]:
    members = [segack.specs.ROOT]
    for _ in range(splits):
        chosen = rng.choice(members)
        if chosen.depth < 31:
            members.remove(chosen)
            members.extend(chosen.split())
    return sorted(member.segment_id for member in members)


def generate(seed: int = 2026) -> list[dict[str, Any]]:
    """The project's own vectors: edge cases and random cases, answered by the spec."""
    rng = random.Random(seed)
    spec = segack.specs
    vectors: list[dict[str, Any]] = []

    def add(op: str, given: Any) -> None:
        vectors.append({"op": op, "in": given, "out": evaluate(spec, op, given)})

    deep = [[0, 0], [0, 1], [1, 1], [2**30 - 1, 2**30 - 1], [2**30, 2**31 - 1], [5, 7]]
    for _ in range(20):
        ids = _random_split_ids(rng, rng.randint(1, 40))
        add("compute_segments", ids)
        members = spec.Segment.compute_segments(ids)
        member = rng.choice(members)
        add("compute_segment", [member.segment_id, ids])
        deep.append([member.segment_id, member.mask])
    for pair in deep:
        if pair[1].bit_length() < 31:
            add("split", pair)
            add("split_segment_id", pair)
        if pair[1] != 0:
            add("mergeable_segment_id", pair)
            sibling = [spec.Segment(*pair).mergeable_segment_id(), pair[1]]
            add("is_mergeable_with", [pair, sibling])
            add("merged_with", [pair, sibling])
        add("is_mergeable_with", [pair, [0, 0]])
        for value in (0, -1, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)):
            add("matches", [pair, value])
    balanced_cases: list[tuple[list[int], int]] = [
        ([0, 0], 0), ([0, 0], 23), ([3, 3], 5), ([0, 0], 100), ([1, 1], 7)
    ]
    for pair, times in balanced_cases:
        add("split_balanced", [pair, times])
    for text in ["", "a", "segack", "aggregate-42", "é日本", "\U0001f600x", "\u00ff" * 9]:
        add("java_hash", text)
    for number in [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 4242424242]:
        add("java_hash_long", number)
    return vectors


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m segack.conformance", description=__doc__.splitlines()[0]
    )
    parser.add_argument("files", nargs="*", type=Path, help="vector files to check")
    parser.add_argument("--generate", type=Path, help="write the spec's own vectors to this file")
    parser.add_argument(
        "--impl", choices=["kernel", "spec", "both"], default="both", help="what to check"
    )
    args = parser.parse_args(argv)
    if args.generate:
        vectors = generate()
        with args.generate.open("w", encoding="utf-8") as out:
            for vector in vectors:
                out.write(json.dumps(vector, separators=(",", ":")) + "\n")
        print(f"wrote {len(vectors)} vectors to {args.generate}")
    names = ["kernel", "spec"] if args.impl == "both" else [args.impl]
    failed = False
    for path in args.files:
        if not path.is_file():
            print(f"{path}: no such vector file", file=sys.stderr)
            failed = True
            continue
        for name in names:
            count, failures = check_file(path, IMPLEMENTATIONS[name])
            for failure in failures:
                print(f"[{name}] {failure}", file=sys.stderr)
            print(f"{path}: {name}: {count - len(failures)} of {count} vectors agree")
            failed = failed or bool(failures) or count == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
