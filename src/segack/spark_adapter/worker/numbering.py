"""How a segment's task numbers the rows it reads: each row's position in its key group, and the
position its run of equal sort keys started at, continuing from one Arrow batch to the next.

A task receives its segment's rows sorted by ``(order, key, tie)``, so a key group's rows come in
the order of their positions and rows with equal sort keys are adjacent. Both numbers are the same
in every run of a checkpoint: they are the events' identities
(:class:`~segack.spark_adapter.EventIdentity`) and what the progress records.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["RowNumbering"]


def _same(first: Any, second: Any) -> bool:
    """Equality as Spark's sort sees it: nulls equal nulls, NaN equals NaN."""
    if first is None or second is None:
        return first is None and second is None
    if isinstance(first, float) and isinstance(second, float) and math.isnan(first) and math.isnan(second):
        return True
    return bool(first == second)


class RowNumbering:
    """One task's numbering: ``first_positions`` is each key group's first position the task
    reads (the tokens say which the JVM filter keeps first); ``order`` and ``key`` name the
    columns of the sort key."""

    def __init__(self, first_positions: np.ndarray, order: str, key: str) -> None:
        self.next_position = first_positions.copy()
        self.order, self.key = order, key
        # The last row of the previous batch: its sort key and the position its run started at.
        self.last_key: tuple[Any, Any, int] | None = None
        self.last_run_start = 0

    def positions(self, groups: np.ndarray) -> np.ndarray:
        """Each row's position in its key group, continuing from earlier batches."""
        order = np.argsort(groups, kind="stable")
        ordered = groups[order]
        starts = np.empty(len(ordered), dtype=bool)
        starts[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
        index = np.arange(len(ordered))
        rank = index - np.maximum.accumulate(np.where(starts, index, 0))
        positions = np.empty(len(groups), dtype=np.int64)
        positions[order] = self.next_position[ordered] + rank
        self.next_position += np.bincount(groups, minlength=len(self.next_position))
        return positions

    def run_starts(self, batch: pa.RecordBatch, ties: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Each row's ``run_start``: the position of the first event with its sort key.

        Rows with equal sort keys are adjacent (the batch is sorted). Equal ties
        are rare, so only those rows are compared in full.
        """
        count = len(ties)
        equal = np.zeros(count, dtype=bool)
        np.equal(ties[1:], ties[:-1], out=equal[1:])
        if self.last_key is not None:
            equal[0] = ties[0] == self.last_key[2]
        candidates = np.flatnonzero(equal)
        if candidates.size:
            orders = batch.column(self.order)
            keys = batch.column(self.key)
            for row in candidates.tolist():
                before = (orders[row - 1].as_py(), keys[row - 1].as_py()) if row else self.last_key[:2]  # type: ignore[index]
                equal[row] = _same(orders[row].as_py(), before[0]) and _same(keys[row].as_py(), before[1])
        index = np.arange(count)
        start = np.maximum.accumulate(np.where(equal, -1, index))
        run_starts = np.where(start >= 0, positions[np.maximum(start, 0)], self.last_run_start)
        if count:
            self.last_key = (batch.column(self.order)[count - 1].as_py(),
                             batch.column(self.key)[count - 1].as_py(), int(ties[-1]))
            self.last_run_start = int(run_starts[-1])
        return run_starts
