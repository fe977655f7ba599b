"""The demo's world: users assembled from parts, one event per part, replayed into SQLite.

Each user is built by a fixed sequence of steps (register, verify, add a payment
method, connect providers, ...); each step is one event. Applying an event
appends its part to the user's row, and only makes sense once every earlier part
is there. :func:`apply_part` is not idempotent and it is strict: an event whose
predecessor is missing, or one applied already, raises. So a replay that broke a
user's order, or applied an event twice, would fail loudly rather than build a
wrong user. The demo replays through :data:`sink`, which applies each event once.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from segack.errors import SegackError, SegackValueError
from segack.sinks import SqlSink

__all__ = [
    "DB_ENV", "OrderViolationError", "apply_part", "connect_database", "generate_events", "read_users",
    "sequential_users", "sink",
]

#: The environment variable naming the SQLite database :data:`sink` writes.
DB_ENV = "SEGACK_DEMO_DB"
STEPS = (
    "registered", "verified-email", "accepted-terms", "added-payment", "connected-car-sharing",
    "connected-scooters", "connected-bikes", "connected-taxis", "set-home", "set-work",
    "updated-profile", "rated-trip",
)
_SCHEMA = "CREATE TABLE IF NOT EXISTS users (user TEXT PRIMARY KEY, version INTEGER, parts TEXT)"


class OrderViolationError(SegackError, RuntimeError):
    """An event arrived before an earlier event of its user."""


def generate_events(count: int, seed: int = 2026) -> pa.Table:
    """About ``count`` events of users with Zipf-skewed activity, shuffled.

    Columns: ``user`` (the key), ``ts`` (a global, unique event time: the order),
    ``seq`` (the event's position among its user's events) and ``part``.
    """
    if count < 1:
        raise SegackValueError(f"count must be positive, not {count}")
    rng = np.random.default_rng(seed)
    users: list[str] = []
    seqs: list[int] = []
    made = 0
    number = 0
    while made < count:
        size = int(min(len(STEPS) * 40, rng.zipf(1.6)))
        size = min(size, count - made)
        users.extend([f"user-{number:06d}"] * size)
        seqs.extend(range(size))
        made += size
        number += 1
    user_array = np.array(users)
    seq_array = np.array(seqs, dtype=np.int64)
    # Interleave users in time while keeping each user's steps in order: each user
    # starts at a random moment and takes random gaps between steps.
    gaps = np.cumsum(rng.exponential(1.0, size=count))
    starts = np.flatnonzero(seq_array == 0)
    lengths = np.diff(np.append(starts, count))
    arrival = gaps - np.repeat(gaps[starts], lengths) + np.repeat(rng.random(len(starts)) * 50, lengths)
    by_time = np.argsort(arrival, kind="stable")
    ts = np.empty(count, dtype=np.int64)
    ts[by_time] = 1_700_000_000_000 + np.arange(count, dtype=np.int64) * 7
    parts = [f"{STEPS[s % len(STEPS)]}#{s}" for s in seq_array.tolist()]
    shuffled = rng.permutation(count)
    return pa.table({
        "user": pa.array(user_array[shuffled].tolist()),
        "ts": pa.array(ts[shuffled]),
        "seq": pa.array(seq_array[shuffled]),
        "part": pa.array([parts[i] for i in shuffled.tolist()]),
    })


def connect_database() -> sqlite3.Connection:
    """A connection to the database named by ``$SEGACK_DEMO_DB``, its users table made."""
    connection = sqlite3.connect(os.environ[DB_ENV], timeout=60, check_same_thread=False)
    # WAL with synchronous=NORMAL survives a killed process (not a power cut), at a
    # fraction of the cost of an fsync per transaction.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute(_SCHEMA)
    connection.commit()
    return connection


def apply_part(cursor: sqlite3.Cursor, event: dict[str, Any]) -> None:
    """Append the event's part to its user's row. Not idempotent, and strict: an event whose
    predecessor is missing, or that was applied already, raises ``OrderViolationError``."""
    user, seq, part = event["user"], int(event["seq"]), event["part"]
    row = cursor.execute("SELECT version, parts FROM users WHERE user = ?", (user,)).fetchone()
    version = -1 if row is None else row[0]
    if seq != version + 1:
        raise OrderViolationError(f"{user}: event {seq} arrived after event {version}")
    parts = part if row is None else f"{row[1]},{part}"
    cursor.execute(
        "INSERT INTO users (user, version, parts) VALUES (?, ?, ?) "
        "ON CONFLICT(user) DO UPDATE SET version = excluded.version, parts = excluded.parts",
        (user, seq, parts),
    )


#: The demo's handler: :func:`apply_part` through a :class:`~segack.sinks.SqlSink`, which skips the
#: events a killed run applied but had not recorded done.
sink = SqlSink(connect_database, apply_part)


def sequential_users(events: pa.Table, path: str) -> None:
    """Build the reference database: every event applied in time order, one process."""
    connection = sqlite3.connect(path)
    connection.execute(_SCHEMA)
    cursor = connection.cursor()
    for event in events.sort_by("ts").to_pylist():
        apply_part(cursor, event)
    connection.commit()
    connection.close()


def read_users(path: str) -> list[tuple[Any, ...]]:
    """Every row of the users table, sorted."""
    connection = sqlite3.connect(path)
    try:
        return sorted(connection.execute("SELECT user, version, parts FROM users").fetchall())
    finally:
        connection.close()


def count_events(rows: Iterable[tuple[Any, ...]]) -> int:
    """Events a users table reflects (each user holds ``version + 1`` parts)."""
    return sum(row[1] + 1 for row in rows)
