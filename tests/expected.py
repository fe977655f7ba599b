"""What a replay's tokens should mean, computed without the adapter: for the demo's event tables.

The demo's events have unique times (``ts``), so an event's position is simply
its rank by time among the events of its key group, and its key group is the
kernel's ``spark_hash`` of its user, masked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

import segack


def positions(table: pa.Table, bits: int = 12) -> dict[tuple[str, int], tuple[int, int]]:
    """``(user, seq)`` -> ``(key group, position)`` for a demo event table."""
    users = table.column("user").to_pylist()
    groups = (segack.spark_hash_many(users).astype(np.int64) & ((1 << bits) - 1)).tolist()
    rows = sorted(zip(table.column("ts").to_pylist(), users, table.column("seq").to_pylist(), groups,
                      strict=True))
    counters: dict[int, int] = {}
    placed = {}
    for _, user, seq, group in rows:
        placed[(user, seq)] = (group, counters.get(group, 0))
        counters[group] = counters.get(group, 0) + 1
    return placed


def done_events(table: pa.Table, tokens: Any) -> set[tuple[str, int]]:
    """The events of ``table`` that ``tokens`` calls done."""
    return {event for event, (group, position) in positions(table, tokens.bits).items()
            if position < tokens.committed[group] or position in tokens.extras.get(group, ())}
