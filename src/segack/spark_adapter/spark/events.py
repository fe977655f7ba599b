"""The events of a replay as Spark queries: key groups, ties, the check of done events, the job.

:class:`EventInput` turns a DataFrame of events into the queries a run needs, all in the JVM:

- each event's key group (the key's hash, masked) and tie (a hash of the whole row);
- the *verification* of a resume: per key group, the count and digest of the events before its
  boundary, compared with the checkpoint's;
- the *remaining* events: those at or past their key group's boundary, by one comparison each
  against a broadcast table of boundaries;
- the *job*: the remaining events sent to the partition of the segment that owns their key group
  (one shuffle), sorted there by ``(order, key, tie)``, and handed to the segment's task.

No query gathers events into one partition.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from segack.kernel import SegmentSet
from segack.spark_adapter.errors import ForeignInputError, InputError
from segack.spark_adapter.spark.columns import hash_column, member_index_column
from segack.spark_adapter.store.tokens import KeyGroupTokens
from segack.spark_adapter.worker.task import KG, RESULT_SCHEMA, TIE, TaskPlan, run_task

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["SEGMENT", "EventInput", "check_same_setup"]

SEGMENT = "__segack_segment"
BOUND_ORDER = "__segack_bound_order"
BOUND_KEY = "__segack_bound_key"
BOUND_TIE = "__segack_bound_tie"
_RESERVED = (KG, TIE, SEGMENT, BOUND_ORDER, BOUND_KEY, BOUND_TIE)
_ORDER_TYPES = ("boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "string", "binary",
                "date", "timestamp", "timestamp_ntz")


def _has_floats(type_name: str) -> bool:
    return "float" in type_name or "double" in type_name


class EventInput:
    """A DataFrame of events as a replay sees it: key groups, ties, the verification, the job.

    Checks at once (``ValueError``) that ``key`` and ``order`` exist with types
    a replay can sort and hash, and that no column uses a reserved name.
    """

    def __init__(self, df: DataFrame, key: str, order: str, hash: str, method: str, bits: int) -> None:
        for name in (key, order):
            if name not in df.columns:
                raise InputError(f"no column {name!r}; the columns are {df.columns}")
        if key == order:
            raise InputError("key and order must be different columns")
        clash = [name for name in df.columns if name in _RESERVED]
        if clash:
            raise InputError(f"column names {clash} are reserved by segack")
        self.df, self.key, self.order, self.bits = df, key, order, bits
        self.key_type = df.schema[key].dataType
        self.order_type = df.schema[order].dataType
        order_name = self.order_type.simpleString()
        if order_name not in _ORDER_TYPES and not order_name.startswith("decimal("):
            raise InputError(f"the order column {order!r} must have a plain sortable type (numbers, "
                             f"strings, dates, timestamps, binary), not {order_name}")
        from pyspark.sql import functions as F

        self.key_group: Column = hash_column(key, self.key_type.simpleString(), hash, method).bitwiseAND(
            F.lit((1 << bits) - 1))
        # The whole row's hash: it breaks ties of (order, key), and digests what was done.
        self.tie: Column = F.xxhash64(*map(self._hashable, df.columns))

    def _hashable(self, name: str) -> Column:
        """A column's value as the tie hashes it: every distinct value distinctly.

        Spark will not hash a map, so its JSON form (entries in stored order)
        stands in for it; Spark hashes -0.0 and 0.0 alike, so floating-point
        values are hashed in their text form.
        """
        from pyspark.sql import functions as F

        type_name = self.df.schema[name].dataType.simpleString()
        if type_name in ("float", "double"):
            return F.col(name).cast("string")
        if "map<" in type_name or _has_floats(type_name):
            return F.to_json(F.col(name))
        return F.col(name)

    def check_order_values(self, known_nulls: int | None = None) -> None:
        """Refuse (:class:`~segack.spark_adapter.InputError`) events whose order is null, or NaN: they
        have no place among their key's events. One Spark job, unless the schema rules both out, or
        ``known_nulls`` (the input's Parquet footers' count) answers for a column that cannot be NaN;
        in the job, Parquet's statistics let Spark skip the row groups without nulls."""
        from pyspark.sql import functions as F

        nullable = self.df.schema[self.order].nullable
        floats = _has_floats(self.order_type.simpleString())
        if not nullable and not floats:
            return
        if known_nulls is not None and not floats:
            found = known_nulls
        else:
            order = F.col(self.order)
            missing = order.isNull() if nullable else F.lit(False)
            if floats:
                missing = missing | F.isnan(order)
            found = self.df.where(missing).count()
        if found:
            what = "null or NaN" if floats else "null"
            events = f"{found:,} event{'' if found == 1 else 's'}"
            raise InputError(f"the order column {self.order!r} is {what} in {events}: each event needs a "
                             f"place in its key's order; fill those values in, or filter the events out, "
                             f"before replaying")

    @property
    def column_types(self) -> dict[str, str]:
        """The key's and the order's Spark types, as a checkpoint records them."""
        return {"key_type": self.key_type.simpleString(), "order_type": self.order_type.simpleString()}

    def _joined_to_bounds(self, tokens: KeyGroupTokens) -> DataFrame:
        """Events with their key group, joined to its boundary (nulls where it has none)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import IntegerType, LongType, StructField, StructType

        schema = StructType([
            StructField(KG, IntegerType(), False), StructField(BOUND_ORDER, self.order_type),
            StructField(BOUND_KEY, self.key_type), StructField(BOUND_TIE, LongType()),
        ])
        table = tokens.boundary_table().rename_columns([KG, BOUND_ORDER, BOUND_KEY, BOUND_TIE])
        bounds = self.df.sparkSession.createDataFrame(table, schema=schema)
        return self.df.withColumn(KG, self.key_group).join(F.broadcast(bounds), KG, "left")

    def verification_frame(self, tokens: KeyGroupTokens) -> DataFrame:
        """Per key group: its events, and the count and tie digest of those before its boundary."""
        from pyspark.sql import functions as F

        joined = self._joined_to_bounds(tokens).withColumn(TIE, self.tie)
        here = F.struct(F.col(self.order), F.col(self.key), F.col(TIE))
        there = F.struct(F.col(BOUND_ORDER), F.col(BOUND_KEY), F.col(BOUND_TIE))
        bounded = F.col(BOUND_TIE).isNotNull()
        before, equal = bounded & (here < there), bounded & here.eqNullSafe(there)
        return joined.groupBy(KG).agg(
            F.count(F.lit(1)).alias("n"),
            F.count(F.when(before, F.lit(1))).alias("n_before"),
            F.coalesce(F.bit_xor(F.when(before, F.col(TIE))), F.lit(0)).alias("x_before"),
            F.coalesce(F.sum(F.when(before, F.shiftright(F.col(TIE), 40))), F.lit(0)).alias("s_before"),
            F.count(F.when(equal, F.lit(1))).alias("n_equal"),
        )

    def verify(self, tokens: KeyGroupTokens, where: str) -> np.ndarray:
        """Check that the events behind each boundary are the ones done; returns the count per key group.

        In key group ``g`` with committed point ``c``, run start ``r`` and base
        ``b``, the done events are the ``r - b`` events before the boundary and
        ``c - r`` of those equal to it (equal sort keys, equal ties). Their count
        and digest must match the tokens'; anything else is a
        :class:`~segack.spark_adapter.ForeignInputError`.
        """
        rows = self.verification_frame(tokens).toArrow()
        counts = np.zeros(tokens.size, dtype=np.int64)
        found = {name: rows.column(name).to_numpy(zero_copy_only=False)
                 for name in ("n", "n_before", "x_before", "s_before", "n_equal")}
        groups = rows.column(KG).to_numpy(zero_copy_only=False)
        counts[groups] = found["n"]
        at = {int(group): row for row, group in enumerate(groups)}
        for group, (_, _, tie) in tokens.boundaries.items():
            row = at.get(group)
            before = int(tokens.run_start[group] - tokens.base[group])
            equal = int(tokens.committed[group] - tokens.run_start[group])
            seen_before = 0 if row is None else int(found["n_before"][row])
            seen_equal = 0 if row is None else int(found["n_equal"][row])
            xor, total = (0, 0) if row is None else (int(found["x_before"][row]), int(found["s_before"][row]))
            expected = (_int64(xor ^ (tie if equal % 2 else 0)), _int64(total + equal * (tie >> 40)))
            if seen_before != before or seen_equal < equal or expected != (
                    int(tokens.done_xor[group]), int(tokens.done_sum[group])):
                raise ForeignInputError(
                    f"{where} belongs to other input: in key group {group}, the events up to its committed "
                    f"point are not the ones that were done ({seen_before + min(seen_equal, equal)} found of "
                    f"{before + equal}, or with other contents); use a new checkpoint location"
                )
        return counts

    def remaining(self, tokens: KeyGroupTokens) -> DataFrame:
        """The events not before their key group's boundary, with their key group and tie columns.

        ``(order, key, tie)`` is compared with the boundary the way the job sorts (ascending,
        nulls first), the order first: most events differ from the boundary there, and the tie,
        a hash of the whole row, is then computed only for the events kept and those whose
        order equals the boundary's.
        """
        from pyspark.sql import functions as F

        if not tokens.boundaries:
            return self.df.withColumn(KG, self.key_group).withColumn(TIE, self.tie)
        order, bound = F.col(self.order), F.col(BOUND_ORDER)
        after = (order.isNotNull() & bound.isNull()) | (order > bound)
        at = order.eqNullSafe(bound) & (
            F.struct(F.col(self.key), self.tie) >= F.struct(F.col(BOUND_KEY), F.col(BOUND_TIE)))
        kept = F.col(BOUND_TIE).isNull() | F.coalesce(after, F.lit(False)) | at
        return (self._joined_to_bounds(tokens).where(kept).drop(BOUND_ORDER, BOUND_KEY, BOUND_TIE)
                .withColumn(TIE, self.tie))

    def job(self, tokens: KeyGroupTokens, segments: SegmentSet, plan: TaskPlan) -> DataFrame:
        """The replay's one Spark job: remaining events, one segment per partition, sorted, handed to
        the tasks (``plan`` is what each needs)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        ordered = (
            self.remaining(tokens)
            .withColumn(SEGMENT, member_index_column(F.col(KG), segments))
            .repartitionById(len(segments), SEGMENT)
            .sortWithinPartitions(F.col(self.order).asc_nulls_first(), F.col(self.key).asc_nulls_first(),
                                  F.col(TIE).asc())
            .drop(SEGMENT)
        )
        # A StructType, not DDL text: the driver need not ask the JVM to parse it.
        return ordered.mapInArrow(functools.partial(run_task, plan), from_arrow_schema(RESULT_SCHEMA))


def check_same_setup(previous: dict[str, Any], events: EventInput, hash: str, where: str) -> None:
    """Refuse (:class:`~segack.spark_adapter.ForeignInputError`) a checkpoint whose runs keyed,
    ordered or hashed the events otherwise, or whose key and order columns had other types."""
    if not previous.get("key"):
        return
    names = ("key", "order", "hash", "key_type", "order_type")
    recorded = {name: previous.get(name) for name in names}
    if recorded != {"key": events.key, "order": events.order, "hash": hash, **events.column_types}:
        raise ForeignInputError(
            f"{where} belongs to other input (it recorded events keyed by {previous.get('key')!r} "
            f"({previous.get('key_type')}), ordered by {previous.get('order')!r} "
            f"({previous.get('order_type')}), hashed with {previous.get('hash')!r}); "
            f"use a new checkpoint location"
        )


def _int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit int, as NumPy's sums wrap."""
    return (value + 2**63) % 2**64 - 2**63
