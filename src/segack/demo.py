"""The demo's world: users assembled from parts, one event per part, replayed into SQLite.

Each user is built by a fixed sequence of steps (register, verify, add a payment
method, connect providers, ...); each step is one event. Applying an event
appends its part to the user's row, and only makes sense once every earlier part
is there. :func:`apply_event` is the replay handler: idempotent (an event already
applied is skipped) and strict (an event whose predecessor is missing raises),
so a replay that broke per-user order would fail loudly rather than build a
wrong user.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from segack.errors import SegackError, SegackValueError

__all__ = [
    "DB_ENV", "OrderViolationError", "apply_event", "generate_events", "read_users", "sequential_users",
]

#: The environment variable naming the SQLite database :func:`apply_event` writes.
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


_connections: dict[str, sqlite3.Connection] = {}


def _connect(path: str) -> sqlite3.Connection:
    connection = _connections.get(path)
    if connection is None:
        connection = sqlite3.connect(path, timeout=60, isolation_level=None)
        # WAL with synchronous=NORMAL survives a killed process (not a power cut), at a
        # fraction of the cost of an fsync per event.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(_SCHEMA)
        _connections[path] = connection
    return connection


def _apply(connection: sqlite3.Connection, event: dict[str, Any]) -> None:
    user, seq, part = event["user"], int(event["seq"]), event["part"]
    row = connection.execute("SELECT version, parts FROM users WHERE user = ?", (user,)).fetchone()
    version = -1 if row is None else row[0]
    if seq <= version:
        return
    if seq != version + 1:
        raise OrderViolationError(f"{user}: event {seq} arrived after event {version}")
    parts = part if row is None else f"{row[1]},{part}"
    connection.execute(
        "INSERT INTO users (user, version, parts) VALUES (?, ?, ?) "
        "ON CONFLICT(user) DO UPDATE SET version = excluded.version, parts = excluded.parts",
        (user, seq, parts),
    )


def apply_event(event: dict[str, Any]) -> None:
    """The demo's replay handler: apply one event to the database named by ``$SEGACK_DEMO_DB``."""
    connection = _connect(os.environ[DB_ENV])
    connection.execute("BEGIN IMMEDIATE")
    try:
        _apply(connection, event)
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def sequential_users(events: pa.Table, path: str) -> None:
    """Build the reference database: every event applied in time order, one process."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute(_SCHEMA)
    connection.execute("BEGIN")
    ordered = events.sort_by("ts")
    for event in ordered.to_pylist():
        _apply(connection, event)
    connection.execute("COMMIT")
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
