"""The offset acker against a min-heap of done indexes (the approach of the article "Acking (Partially)
Parallelly Processed Elements"), pyroaring and portion."""

from __future__ import annotations

import heapq
import os
import sys
import time
from typing import Any

import numpy as np

import segack
from bench.common import best_of, print_table, save


class HeapAcker:
    """The priority-queue acker: push each completion, pop while the head is the next index."""

    def __init__(self, start: int = 0) -> None:
        self.next_index = start
        self.heap: list[tuple[int, Any]] = []
        self.committed: Any = None

    def ack(self, index: int, offset: Any = None) -> Any:
        heapq.heappush(self.heap, (index, index if offset is None else offset))
        advanced = False
        while self.heap and self.heap[0][0] == self.next_index:
            _, self.committed = heapq.heappop(self.heap)
            self.next_index += 1
            advanced = True
        return self.committed if advanced else None


class CallOnly:
    """Not an acker: ``ack`` is the builtin ``id``, the cheapest call a Python loop can make."""

    ack = staticmethod(id)


class RoaringAcker:
    """Done indexes in a compressed bitmap; the committed point walks forward through it."""

    def __init__(self, start: int = 0) -> None:
        from pyroaring import BitMap64

        self.done = BitMap64()
        self.next_index = start

    def ack(self, index: int, offset: Any = None) -> Any:
        self.done.add(index)
        if index != self.next_index:
            return None
        start = self.next_index
        while self.next_index in self.done:
            self.next_index += 1
        self.done.remove_range(start, self.next_index)
        return self.next_index - 1


class PortionAcker:
    """Done indexes as a ``portion`` interval union."""

    def __init__(self, start: int = 0) -> None:
        import portion

        self.portion = portion
        self.done = portion.empty()
        self.next_index = start

    def ack(self, index: int, offset: Any = None) -> Any:
        self.done |= self.portion.closed(index, index)
        first = self.done[0]
        if first.lower != self.next_index:
            return None
        self.next_index = first.upper + 1
        self.done -= first
        return first.upper


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_call(acker: Any, order: list[int]) -> float:
    ack = acker.ack
    began = time.perf_counter()
    for index in order:
        ack(index)
    return time.perf_counter() - began


def bounded_disorder(size: int, window: int, seed: int = 5) -> np.ndarray:
    """Each index delayed by up to ``window`` positions."""
    rng = np.random.default_rng(seed)
    return np.argsort(np.arange(size) + rng.integers(0, window, size=size), kind="stable").astype(np.int64)


def run() -> None:
    rows: list[dict[str, Any]] = []
    order = bounded_disorder(1_000_000, 1000)
    order_list = order.tolist()

    heap_time = min(per_call(HeapAcker(), order_list) for _ in range(3))
    # What a Python loop pays to call any one-argument builtin: no per-call acker beats it.
    call_ceiling = min(per_call(CallOnly(), order_list) for _ in range(3))
    kernel_call = min(per_call(segack.OffsetAcker(), order_list) for _ in range(3))

    def ack_many_whole() -> None:
        segack.OffsetAcker().ack_many(order)

    def ack_many_batches() -> None:
        acker = segack.OffsetAcker()
        for batch in np.array_split(order, 122):
            acker.ack_many(batch)

    whole = best_of(ack_many_whole)
    batches = best_of(ack_many_batches)
    subset = order_list[:20_000]
    roaring = per_call(RoaringAcker(), order_list)
    portion_rate = per_call(PortionAcker(), subset) / len(subset)

    def row(what: str, seconds: float, count: int = 1_000_000) -> dict[str, Any]:
        return {"workload": "1M, disorder <= 1000", "acker": what,
                "M acks/s": f"{count / seconds / 1e6:.3g}",
                "vs heap": f"{heap_time / seconds * count / 1e6:.1f}x"}

    rows.append(row("heapq (min-heap of done indexes)", heap_time))
    rows.append(row("pyroaring BitMap64, per call", roaring))
    rows.append(row("portion intervals, per call (20k sample)", portion_rate * 1_000_000))
    rows.append(row("segack ack, per call", kernel_call))
    rows.append(row("ceiling: loop calling a no-op builtin", call_ceiling))
    rows.append(row("segack ack_many, 8192-index batches", batches))
    rows.append(row("segack ack_many, one call", whole))

    # Worst case: every even index first (a run each), then the odd ones in random order.
    rng = np.random.default_rng(9)
    evens = np.arange(0, 2_000_000, 2, dtype=np.int64)
    odds = rng.permutation(np.arange(1, 2_000_000, 2, dtype=np.int64))
    best = float("inf")
    grown = 0
    for _ in range(3):
        # The first round's growth is the honest one: later rounds reuse freed pages.
        before = resident_bytes()
        acker = segack.OffsetAcker()
        began = time.perf_counter()
        acker.ack_many(evens)
        halfway = time.perf_counter()
        peak_runs = acker.pending_runs
        grown = max(grown, resident_bytes() - before)
        held = sys.getsizeof(acker)
        token_bytes = len(acker.snapshot())
        resumed = time.perf_counter()
        acker.ack_many(odds)
        best = min(best, halfway - began + time.perf_counter() - resumed)
        assert acker.next_index == 2_000_000 and acker.pending_runs == 0
    heap_worst = per_call(HeapAcker(), evens.tolist() + odds[:200_000].tolist()) / 1_200_000 * 2_000_000
    rows.append({"workload": "2M, evens then odds", "acker": "heapq (min-heap of done indexes), per call",
                 "M acks/s": f"{2 / heap_worst:.2f}", "vs heap": "1.0x"})
    rows.append({"workload": "2M, evens then odds", "acker": "segack ack_many",
                 "M acks/s": f"{2 / best:.2f}", "vs heap": f"{heap_worst / best:.1f}x",
                 "peak pending_runs": peak_runs,
                 "memory / run": f"{held / peak_runs:.1f} B (RSS {grown / peak_runs:.1f} B)",
                 "snapshot / run": f"{token_bytes / peak_runs:.2f} B"})

    # In order: nothing is ever pending, so memory must not grow.
    acker = segack.OffsetAcker()
    before = resident_bytes()
    began = time.perf_counter()
    peak = 0
    for start in range(0, 10_000_000, 1_000_000):
        acker.ack_many(np.arange(start, start + 1_000_000, dtype=np.int64))
        peak = max(peak, acker.pending_runs)
    in_order = time.perf_counter() - began
    rows.append({"workload": "10M in order", "acker": "segack ack_many, 1M batches",
                 "M acks/s": f"{10 / in_order:.1f}", "peak pending_runs": peak,
                 "memory / run": f"grew {max(0, resident_bytes() - before) // 1024} KiB"})

    print_table("Offset acker (floors: per call >= 10x heap, ack_many >= 100x, worst case >= 5M acks/s)",
                rows, ["workload", "acker", "M acks/s", "vs heap", "peak pending_runs",
                       "memory / run", "snapshot / run"])
    save("acker", rows)
    state_operations()


def state_operations() -> None:
    """Snapshot, restore and merge of fragmented ackers, the kernel against the spec.

    A replay task's acker holds the indexes of its own segments only, interleaved with every
    other task's, so it is one run per few events: it writes such a snapshot at every flush,
    and the driver reads and merges them. The spec is the same format in plain Python."""
    import segack.specs as spec

    rows: list[dict[str, Any]] = []
    for impl in (segack, spec):
        mine, theirs = impl.OffsetAcker(), impl.OffsetAcker()
        mine.ack_many(np.arange(1, 1_000_000, 4, dtype=np.int64))
        theirs.ack_many(np.arange(2, 1_000_000, 4, dtype=np.int64))
        token = mine.snapshot()

        def merge(mine: Any = mine, theirs: Any = theirs) -> None:
            mine.copy().merge(theirs)

        copy_time = best_of(mine.copy)
        rows.append({
            "snapshot": best_of(mine.snapshot),
            "restore": best_of(lambda impl=impl, token=token: impl.OffsetAcker.restore(token)),
            "merge": best_of(merge) - copy_time,
        })
    fast, slow = rows
    table = [
        {"workload": f"{what} of 250,000 runs (+250,000 merged)" if what == "merge"
         else f"{what} of 250,000 runs",
         "segack": f"{fast[what] * 1e3:.1f} ms", "pure-Python spec": f"{slow[what] * 1e3:.0f} ms",
         "speed-up": f"{slow[what] / fast[what]:.0f}x"}
        for what in ("snapshot", "restore", "merge")
    ]
    print_table("Acker snapshots and merging (kernel vs the pure-Python spec, same format)",
                table, ["workload", "segack", "pure-Python spec", "speed-up"])
    save("acker-state", table)
