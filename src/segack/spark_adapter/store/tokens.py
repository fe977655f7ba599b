"""Per-key-group progress: the tokens of a replay.

An event's *key group* is ``hash & (2**bits - 1)`` (``bits`` is the checkpoint's
resolution, 12 by default). A segment with at most ``bits`` mask bits owns whole
key groups, so any rescale made of splits and merges keeps every key group in
one segment, and progress kept per key group survives it unchanged.

Every event has a *tie*: the 64-bit hash of its whole row. Within its key group
it has a *position*: its rank by the *sort key* ``(order, key, tie)``, plus the
key group's *base* (0 for a replay; for a stream, the number of the key group's
events in earlier micro-batches). Positions depend only on the data.

For each key group ``g`` the tokens hold:

``base[g]``
    the position of the first event of the current input;
``committed[g]``
    every event at a position below it is done;
the *boundary* (only where ``committed > base``)
    the sort key of the event at position ``committed - 1``, and ``run_start``:
    the position of the first event whose sort key equals it (events equal in
    every column share a sort key; they are interchangeable);
the *prefix digest*, ``done_xor[g]`` and ``done_sum[g]``
    the XOR of the ties of the events from ``base`` to ``committed - 1``, and
    the sum of their top 24 bits (XOR alone would let two equal rows cancel);
``extras[g]``
    positions at or past ``committed`` that are done too: the few completions
    beyond the committed point when events finish out of order;
``count[g]``
    how many events of the current input fall in ``g``, once it is known
    (``counted``): a run that ends without a failure has seen them all.

The boundary is what lets a resumed run drop done events in the JVM with one
comparison, ``(order, key, tie) >= boundary``, instead of computing every
event's position there (a window over all events). The events kept are those
from ``run_start`` on; the task counts positions from there and skips those
below ``committed`` or among the extras. The prefix digest is what lets the
resumed run check first that the events behind each boundary are still the
ones that were done: another input would otherwise lose events silently.

Progress from tasks arrives as *updates*: rows ``(kg, committed, run_start,
order, key, tie, extras, done_xor, done_sum)``. Applying an update keeps, per
key group, the larger committed point with its boundary and digest, and the
union of the extras that lie past it. Applying the same update twice, or an
older one after a newer one, changes nothing, so progress files can be merged
in any order.

Tokens and updates travel as Arrow IPC streams behind a magic string and a
CRC-32, so that a damaged or foreign file is refused rather than misread.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from segack.errors import SegackValueError
from segack.spark_adapter.errors import TokenError
from segack.spark_adapter.options import check_key_group_bits

__all__ = [
    "DEFAULT_KEY_GROUP_BITS",
    "KeyGroupTokens",
    "TokenError",
    "decode_updates",
    "encode_updates",
    "update_schema",
]

#: The default resolution: 4096 key groups.
DEFAULT_KEY_GROUP_BITS = 12

_TOKENS_MAGIC = b"SGKT\x02"
_UPDATES_MAGIC = b"SGKU\x02"


def update_schema(order_type: pa.DataType, key_type: pa.DataType) -> pa.Schema:
    """The schema of an update table: one row per key group whose progress moved."""
    return pa.schema([
        ("kg", pa.int32()),
        ("committed", pa.int64()),
        ("run_start", pa.int64()),
        ("order", order_type),
        ("key", key_type),
        ("tie", pa.int64()),
        ("extras", pa.list_(pa.int64())),
        ("done_xor", pa.int64()),
        ("done_sum", pa.int64()),
    ])


def _token_schema(order_type: pa.DataType, key_type: pa.DataType) -> pa.Schema:
    return (update_schema(order_type, key_type)
            .insert(1, pa.field("base", pa.int64()))
            .insert(2, pa.field("count", pa.int64())))


def _seal(magic: bytes, table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    body = bytes(sink.getvalue())
    return magic + struct.pack(">I", zlib.crc32(body)) + body


def _unseal(magic: bytes, data: bytes, what: str) -> pa.Table:
    data = bytes(data)
    if not data.startswith(magic[:4]):
        raise TokenError(f"{what} is not segack key-group progress")
    if data[: len(magic)] != magic:
        raise TokenError(f"{what} has an unknown format version {data[4:5].hex() or 'none'}")
    header = len(magic) + 4
    if len(data) <= header:  # an Arrow stream is never empty
        raise TokenError(f"{what} is damaged: it is cut short")
    (crc,) = struct.unpack(">I", data[len(magic):header])
    body = data[header:]
    if zlib.crc32(body) != crc:
        raise TokenError(f"{what} is damaged: its checksum does not match")
    try:
        table = pa.ipc.open_stream(body).read_all()
        # A well-sealed stream may still name its columns in bytes that are not UTF-8 (found by
        # fuzzing): read the names here, where that is damage, not a crash.
        table.schema.names  # noqa: B018
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
        raise TokenError(f"{what} is damaged: {error}") from None
    return table


def _check_schema(table: pa.Table, expected: pa.Schema, what: str) -> None:
    got = {name: table.schema.field(name).type for name in table.schema.names}
    for name in expected.names:
        if name in ("order", "key"):
            if name not in got:
                raise TokenError(f"{what} is damaged: the boundary columns are missing")
        elif got.get(name) != expected.field(name).type:
            raise TokenError(f"{what} is damaged: column {name!r} is missing or has the wrong type")


def encode_updates(updates: pa.Table) -> bytes:
    """An update table as sealed bytes (a progress file's content)."""
    return _seal(_UPDATES_MAGIC, updates)


def decode_updates(data: bytes, what: str = "progress") -> pa.Table:
    """The update table in ``data``; anything damaged or foreign is a
    :class:`~segack.spark_adapter.TokenError`."""
    table = _unseal(_UPDATES_MAGIC, data, what)
    _check_schema(table, update_schema(pa.null(), pa.null()), what)
    return table


def _column(table: pa.Table, name: str) -> np.ndarray:
    values: np.ndarray = table.column(name).to_numpy(zero_copy_only=False)
    return values


@dataclass
class KeyGroupTokens:
    """The progress of the current input, per key group (see the module's docstring).

    ``order_type`` and ``key_type`` are the Arrow types of the order and key
    columns (null until the first update brings them): boundaries are kept
    with them, so that a resumed run compares like with like.
    """

    bits: int
    order_type: pa.DataType
    key_type: pa.DataType
    base: np.ndarray = field(repr=False)
    committed: np.ndarray = field(repr=False)
    run_start: np.ndarray = field(repr=False)
    done_xor: np.ndarray = field(repr=False)
    done_sum: np.ndarray = field(repr=False)
    count: np.ndarray = field(repr=False)
    counted: bool = False
    boundaries: dict[int, tuple[Any, Any, int]] = field(default_factory=dict, repr=False)
    extras: dict[int, set[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def empty(cls, bits: int, order_type: pa.DataType, key_type: pa.DataType) -> KeyGroupTokens:
        """Tokens with nothing done and the events not yet counted."""
        size = 1 << check_key_group_bits(bits)

        def zeros() -> np.ndarray:
            return np.zeros(size, dtype=np.int64)

        return cls(bits, order_type, key_type, base=zeros(), committed=zeros(), run_start=zeros(),
                   done_xor=zeros(), done_sum=zeros(), count=zeros())

    @property
    def size(self) -> int:
        """The number of key groups, ``2**bits``."""
        return 1 << self.bits

    # --------------------------------------------------------------- totals

    @property
    def total(self) -> int | None:
        """Events in the current input, or ``None`` while they are not counted."""
        return int(self.count.sum()) if self.counted else None

    def done_per_key_group(self) -> np.ndarray:
        """Events of the current input done, per key group (committed prefix plus extras)."""
        done: np.ndarray = self.committed - self.base
        for group, positions in self.extras.items():
            done[group] += len(positions)
        return done

    @property
    def done(self) -> int:
        """Events of the current input done."""
        return int(self.done_per_key_group().sum())

    @property
    def has_progress(self) -> bool:
        """Whether any event of the current input is done (a resume has something to verify)."""
        return bool(self.boundaries) or bool(self.extras)

    @property
    def complete(self) -> bool:
        """Whether every event of the current input is done (known only once counted)."""
        return self.counted and bool(np.array_equal(self.committed, self.base + self.count))

    # ------------------------------------------------------------- changes

    def set_counts(self, counts: np.ndarray) -> None:
        """Record how many events each key group has; ``ValueError`` (nothing changed) if fewer
        than are already done."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.size,) or (counts < 0).any():
            raise SegackValueError(f"counts must be {self.size} non-negative integers")
        limit = self.base + counts
        if (self.committed > limit).any() or any(max(p) >= limit[g] for g, p in self.extras.items()):
            raise SegackValueError("counts smaller than the events already done")
        self.count = counts.copy()
        self.counted = True

    def count_from_committed(self) -> None:
        """Count each key group's events as its committed prefix: right once a run has seen them all."""
        self.set_counts(self.committed - self.base)

    def start_input(self) -> None:
        """Begin a new input (a stream's next micro-batch) after a complete one.

        Positions continue: each key group's base moves to its committed point.
        Refuses (``ValueError``, nothing changed) while the current input is not done.
        """
        if not self.complete:
            raise SegackValueError("the current input is not complete; a new one cannot start")
        self.base = self.committed.copy()
        self.run_start = self.committed.copy()
        self.done_xor = np.zeros(self.size, dtype=np.int64)
        self.done_sum = np.zeros(self.size, dtype=np.int64)
        self.count = np.zeros(self.size, dtype=np.int64)
        self.counted = False
        self.boundaries = {}
        self.extras = {}

    def apply(self, updates: pa.Table) -> int:
        """Fold an update table in; returns how many key groups moved.

        An update whose committed point is not past the current one changes only
        the extras. Updates that contradict the tokens (a key group out of range,
        a committed point past the input, a boundary missing) are a
        :class:`~segack.spark_adapter.TokenError`, and nothing is changed.
        """
        groups = _column(updates, "kg")
        committed = _column(updates, "committed")
        run_start = _column(updates, "run_start")
        ties = updates.column("tie").to_pylist()
        extras = updates.column("extras").to_pylist()
        if len(groups) and (groups.min() < 0 or groups.max() >= self.size):
            raise TokenError(f"an update names a key group outside 0..{self.size - 1}")
        limit = self.base + self.count if self.counted else np.full(self.size, np.iinfo(np.int64).max)
        for row in range(len(groups)):
            group = int(groups[row])
            if not self.base[group] <= committed[row] <= limit[group]:
                raise TokenError(
                    f"an update puts key group {group} at {committed[row]}, outside "
                    f"{self.base[group]}..{limit[group]} (is it from another input?)"
                )
            if committed[row] > self.base[group] and (
                ties[row] is None or not self.base[group] <= run_start[row] < committed[row]
            ):
                raise TokenError(f"an update of key group {group} has no valid boundary")
            for position in extras[row] or ():
                if not self.base[group] <= position < limit[group]:
                    raise TokenError(f"an update marks position {position} of key group {group}, "
                                     f"outside the input")
        # Fresh tokens learn the columns' types from the first update; values convert between
        # equivalent types (a timestamp in another session time zone is the same instant).
        if pa.types.is_null(self.order_type):
            self.order_type = updates.schema.field("order").type
        if pa.types.is_null(self.key_type):
            self.key_type = updates.schema.field("key").type
        orders = updates.column("order").to_pylist()
        keys = updates.column("key").to_pylist()
        done_xor, done_sum = _column(updates, "done_xor"), _column(updates, "done_sum")
        moved = 0
        for row in range(len(groups)):
            group = int(groups[row])
            if committed[row] > self.committed[group]:
                self.committed[group] = committed[row]
                self.run_start[group] = run_start[row]
                self.done_xor[group] = done_xor[row]
                self.done_sum[group] = done_sum[row]
                self.boundaries[group] = (orders[row], keys[row], int(ties[row]))
                moved += 1
            beyond = set(self.extras.get(group, ())) | set(extras[row] or ())
            beyond = {position for position in beyond if position >= self.committed[group]}
            if beyond:
                self.extras[group] = beyond
            else:
                self.extras.pop(group, None)
        return moved

    # ------------------------------------------------------- what tasks see

    def boundary_table(self) -> pa.Table:
        """One row per key group with a boundary: ``kg``, ``order``, ``key``, ``tie``."""
        groups = sorted(self.boundaries)
        schema = pa.schema([("kg", pa.int32()), ("order", self.order_type), ("key", self.key_type),
                            ("tie", pa.int64())])
        return pa.table({
            "kg": groups,
            "order": [self.boundaries[g][0] for g in groups],
            "key": [self.boundaries[g][1] for g in groups],
            "tie": [self.boundaries[g][2] for g in groups],
        }, schema=schema)

    def first_kept_positions(self) -> np.ndarray:
        """Per key group, the position of the first event ``(order, key, tie) >= boundary`` keeps."""
        positions: np.ndarray = np.where(self.committed > self.base, self.run_start, self.base)
        return positions

    # ----------------------------------------------------------- bytes

    def to_bytes(self) -> bytes:
        """The tokens as sealed bytes: rows only for key groups with events or progress (a key group
        with a base has a committed point at least as far)."""
        used = np.flatnonzero((self.count > 0) | (self.committed > 0)
                              | np.isin(np.arange(self.size), list(self.extras)))
        groups = used.tolist()
        bounds = [self.boundaries.get(group) for group in groups]

        def bound(part: int) -> list[Any]:
            return [None if entry is None else entry[part] for entry in bounds]

        # The schema gives every column its type.
        table = pa.table({
            "kg": groups,
            "base": self.base[used],
            "count": self.count[used] if self.counted else [None] * len(groups),
            "committed": self.committed[used],
            "run_start": [None if group not in self.boundaries else int(self.run_start[group])
                          for group in groups],
            "order": bound(0),
            "key": bound(1),
            "tie": bound(2),
            "extras": [sorted(self.extras.get(group, ())) or None for group in groups],
            "done_xor": self.done_xor[used],
            "done_sum": self.done_sum[used],
        }, schema=_token_schema(self.order_type, self.key_type).with_metadata(
            {b"counted": b"1" if self.counted else b"0"}))
        return _seal(_TOKENS_MAGIC, table)

    @classmethod
    def from_bytes(cls, data: bytes, bits: int, what: str = "tokens") -> KeyGroupTokens:
        """Tokens from :meth:`to_bytes`; anything damaged or inconsistent is a
        :class:`~segack.spark_adapter.TokenError`."""
        table = _unseal(_TOKENS_MAGIC, data, what)
        _check_schema(table, _token_schema(pa.null(), pa.null()), what)
        tokens = cls.empty(bits, table.schema.field("order").type, table.schema.field("key").type)
        groups = _column(table, "kg")
        if len(groups) and (groups.min() < 0 or groups.max() >= tokens.size
                            or len(np.unique(groups)) != len(groups)):
            raise TokenError(f"{what} is damaged: its key groups are not distinct values "
                             f"in 0..{tokens.size - 1}")
        for name in ("base", "committed", "done_xor", "done_sum"):
            if table.column(name).null_count:
                raise TokenError(f"{what} is damaged: {name} has gaps")
            getattr(tokens, name)[groups] = _column(table, name)
        counted = (table.schema.metadata or {}).get(b"counted")
        if counted not in (b"0", b"1"):
            raise TokenError(f"{what} is damaged: it does not say whether the events are counted")
        tokens.counted = counted == b"1"
        if table.column("count").null_count != (0 if tokens.counted else len(table)):
            raise TokenError(f"{what} is damaged: its counts contradict its counted flag")
        if tokens.counted:
            tokens.count[groups] = _column(table, "count")
        limit = tokens.base + tokens.count if tokens.counted else np.full(tokens.size, np.iinfo(np.int64).max)
        # A negative count puts the limit below the base, so the last comparison covers it.
        if (tokens.base < 0).any() or (tokens.committed < tokens.base).any() or (
                tokens.committed > limit).any():
            raise TokenError(f"{what} is damaged: a committed point lies outside its key group")
        tokens.run_start = tokens.base.copy()
        for row in table.select(["kg", "run_start", "order", "key", "tie", "extras"]).to_pylist():
            group = row["kg"]
            if tokens.committed[group] > tokens.base[group]:
                if row["tie"] is None or row["run_start"] is None or not (
                        tokens.base[group] <= row["run_start"] < tokens.committed[group]):
                    raise TokenError(f"{what} is damaged: key group {group} has no valid boundary")
                tokens.run_start[group] = row["run_start"]
                tokens.boundaries[group] = (row["order"], row["key"], row["tie"])
            if row["extras"]:
                beyond = set(row["extras"])
                if len(beyond) != len(row["extras"]) or min(beyond) < tokens.committed[group] or (
                        max(beyond) >= limit[group]):
                    raise TokenError(f"{what} is damaged: key group {group} has extras outside its events")
                tokens.extras[group] = beyond
        return tokens

    def copy(self) -> KeyGroupTokens:
        """An independent copy."""
        return KeyGroupTokens(
            self.bits, self.order_type, self.key_type, self.base.copy(), self.committed.copy(),
            self.run_start.copy(), self.done_xor.copy(), self.done_sum.copy(), self.count.copy(),
            self.counted, dict(self.boundaries),
            {group: set(positions) for group, positions in self.extras.items()},
        )
