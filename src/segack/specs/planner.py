"""Planning a segment set from measured load: the split tree over key groups.

With hashes cut into ``2**bits`` key groups (an event's key group is ``hash & (2**bits - 1)``),
every segment that can be made by splitting the root, down to ``bits`` mask bits, owns whole key
groups, and its *load* is the sum of their event counts. Those segments form a binary tree: the
root owns every key group; a node ``Segment(id, mask)`` at depth ``d`` (``mask = 2**d - 1``)
splits into ``Segment(id, 2 * mask + 1)`` and ``Segment(id + 2**d, 2 * mask + 1)``, each owning
every other key group of its parent. Any complete set of such segments is a cut through that
tree: its leaves.

With one task per segment and enough workers, a run lasts as long as its heaviest segment. The
plan for ``workers`` is the cut of at most ``workers`` leaves whose largest load is smallest. The
tree is small (at most ``2**bits`` leaves), so the best cut is found exactly by dynamic
programming, from the leaves up:

- ``best(node, 1)`` is the node's load: it stays whole;
- ``best(node, n)`` for ``n >= 2`` is the smaller of the node's load and, if the node can split,
  ``max(best(left, a), best(right, n - a))`` over ``a = 1 .. n - 1``.

A node splits only when that lowers its largest load. A split that ties the whole node leaves
one child empty (a child's load is at most its parent's, and both are non-negative), so it would
only add a segment with nothing to do. No plan can make a key group lighter: a key group's load,
and above all the hottest key's share of the events, is the floor of the largest load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from segack.errors import SegackTypeError, SegackValueError
from segack.specs.segments import MAX_KEY_GROUP_BITS, as_int

__all__ = ["plan_segments"]


def _counts(counts: Any) -> list[int]:
    """``counts`` as a list of non-negative ints whose length is ``2**bits``."""
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise SegackTypeError(f"counts must be a sequence of integers, not {type(counts).__name__}")
    values = [as_int(value, "a count") for value in counts]
    size = len(values)
    if size < 1 or size & (size - 1) or size > 1 << MAX_KEY_GROUP_BITS:
        raise SegackValueError(f"counts must hold one count per key group: 2**bits of them with bits in "
                               f"0..{MAX_KEY_GROUP_BITS}, not {size}")
    negative = [group for group, value in enumerate(values) if value < 0]
    if negative:
        raise SegackValueError(f"counts must not be negative; key group {negative[0]} has "
                               f"{values[negative[0]]}")
    return values


def plan_segments(counts: Sequence[int] | np.ndarray, workers: int) -> tuple[int, ...]:
    """The ids of the set of at most ``workers`` segments, made by splitting the root, whose
    largest load is smallest (see the module's docstring), sorted.

    ``counts[g]`` is the number of events in key group ``g``; there are ``2**bits`` of them. The
    ids are the live segment ids :meth:`SegmentSet.from_ids` takes. Rejects a ``counts`` whose
    length is not a power of two up to ``2**16`` or that holds a negative count, and ``workers``
    below 1 (``ValueError``); anything but integers (``TypeError``).

    >>> plan_segments([5, 1, 1, 1], 2)
    (0, 1)
    >>> plan_segments([6, 0, 1, 1, 1, 0, 1, 0], 3)  # key group 0 alone holds 6 of 10
    (0, 1, 2)
    """
    values = _counts(counts)
    workers = as_int(workers, "workers")
    if workers < 1:
        raise SegackValueError(f"workers must be at least 1, got {workers}")
    bits = len(values).bit_length() - 1
    # loads[d][i]: the load of Segment(i, 2**d - 1), for each depth d.
    loads: list[list[int]] = [[] for _ in range(bits + 1)]
    loads[bits] = values
    for depth in range(bits - 1, -1, -1):
        below, width = loads[depth + 1], 1 << depth
        loads[depth] = [below[i] + below[i + width] for i in range(width)]
    # best[d][i][n - 1]: the smallest largest load of Segment(i, 2**d - 1) cut into at most n
    # leaves; split[d][i][n - 1]: how many of them go left (0: the node stays whole).
    best: list[list[list[int]]] = [[] for _ in range(bits + 1)]
    split: list[list[list[int]]] = [[] for _ in range(bits + 1)]
    for depth in range(bits, -1, -1):
        width = 1 << depth
        most = min(workers, 1 << (bits - depth))  # a node has 2**(bits - depth) key groups
        for node in range(width):
            load = loads[depth][node]
            row, choice = [load], [0]
            for leaves in range(2, most + 1):
                value, left_share = load, 0
                if load:
                    left, right = best[depth + 1][node], best[depth + 1][node + width]
                    for share in range(1, leaves):
                        candidate = max(left[min(share, len(left)) - 1],
                                        right[min(leaves - share, len(right)) - 1])
                        # Only a strictly better split counts; among splits, the first best.
                        if candidate < value:
                            value, left_share = candidate, share
                row.append(value)
                choice.append(left_share)
            best[depth].append(row)
            split[depth].append(choice)
    ids: list[int] = []
    pending = [(0, 0, min(workers, 1 << bits))]
    while pending:
        depth, node, leaves = pending.pop()
        share = split[depth][node][leaves - 1]
        if share == 0:
            ids.append(node)
        else:
            most = 1 << (bits - depth - 1)
            pending.append((depth + 1, node, min(share, most)))
            pending.append((depth + 1, node + (1 << depth), min(leaves - share, most)))
    return tuple(sorted(ids))
