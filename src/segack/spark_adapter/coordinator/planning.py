"""``segack plan``: a segment set from the measured load of each key group, and the hot-key floor.

Two JVM aggregations over the events (or a sample of them): the count of each key group, and the
hottest keys. The planner (:func:`segack.plan_segments`) then picks, for ``workers`` workers,
the set of segments made by splitting the root whose largest load is smallest. With per-key
order, no set can make a key lighter, so the hottest key's share of the events bounds the
speed-up of any plan: a key with 31 % of the events leaves at most 1 / 0.31 = 3.2x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from segack.kernel import SegmentSet, plan_segments
from segack.spark_adapter.errors import InputError, OptionError
from segack.spark_adapter.spark.columns import hash_column
from segack.spark_adapter.spark.session import default_segment_count
from segack.spark_adapter.store.tokens import DEFAULT_KEY_GROUP_BITS, KeyGroupTokens

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Plan", "plan"]

_KG = "__segack_kg"


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` measured, and the segment set it proposes."""

    #: Events per key group (estimated from the sample, when there is one).
    key_group_counts: np.ndarray
    key_group_bits: int
    #: The hottest keys and their events, hottest first.
    hottest: tuple[tuple[Any, int], ...]
    workers: int
    #: The planned set: at most ``workers`` segments, the largest load as small as it can be.
    segments: SegmentSet
    #: The fraction of events counted (``None``: all of them).
    sample: float | None = None

    @property
    def total(self) -> int:
        """Events in all (estimated from the sample, when there is one)."""
        return int(self.key_group_counts.sum())

    def loads(self, segments: SegmentSet) -> np.ndarray:
        """The events each member of ``segments`` would handle, in member order."""
        owners = segments.key_group_owners(self.key_group_bits)
        return np.bincount(owners, weights=self.key_group_counts, minlength=len(segments)).astype(np.int64)

    def largest_share(self, segments: SegmentSet) -> float:
        """The heaviest member's share of the events (1.0 when there are none)."""
        return float(self.loads(segments).max()) / self.total if self.total else 1.0

    def speedup(self, segments: SegmentSet) -> float:
        """How many times faster than one worker a run over ``segments`` would be, at best (one
        task per segment, as many workers as segments, events of equal cost)."""
        return 1.0 / self.largest_share(segments)

    @property
    def balanced(self) -> SegmentSet:
        """:meth:`segack.SegmentSet.balanced` for as many segments as the plan has workers (what Axon
        would use), for comparison."""
        return SegmentSet.balanced(min(self.workers, 1 << self.key_group_bits))

    @property
    def hottest_share(self) -> float:
        """The hottest key's share of the events (0.0 when there are none)."""
        return self.hottest[0][1] / self.total if self.hottest and self.total else 0.0

    @property
    def floor(self) -> float:
        """The speed-up no plan can pass with per-key order: 1 / the hottest key's share."""
        return 1.0 / self.hottest_share if self.hottest_share else float("inf")

    @property
    def segments_option(self) -> str:
        """The plan as ``segack replay --segments`` takes it: the live segment ids."""
        return ",".join(map(str, self.segments.ids))


def plan(
    df: DataFrame,
    *,
    key: str,
    hash: str = "spark",
    workers: int | None = None,
    key_group_bits: int = DEFAULT_KEY_GROUP_BITS,
    sample: float | None = None,
    top: int = 5,
    method: str = "auto",
) -> Plan:
    """Count ``df``'s events per key group and its hottest keys, and plan segments for ``workers``.

    Runs two Spark jobs and nothing else.

    Parameters
    ----------
    df : DataFrame
        The events.
    key : str
        The sequencing key column.
    hash : ``{'spark', 'java'}``, default ``'spark'``
        How keys are hashed, as the replay will.
    workers : int, optional
        Plan for this many workers (default: the session's default segment count, as
        :func:`~segack.spark_adapter.replay` uses).
    key_group_bits : int, default ``12``
        The key-group resolution of the checkpoint the plan is for (0 to 16).
    sample : float, optional
        Count this fraction of the events, in (0, 1], and scale the counts up.
    top : int, default ``5``
        How many of the hottest keys to report.
    method : str, default ``'auto'``
        How the ``java`` hash is computed (``'reflect'`` or ``'arrow'``).

    Returns
    -------
    Plan
        The load, the planned set and what limits any set.

    Raises
    ------
    InputError
        ``key`` is not a column.
    OptionError
        ``workers`` or ``top`` below 1, a ``sample`` outside (0, 1], ``key_group_bits`` outside
        0..16.
    """
    from pyspark.sql import functions as F

    if key not in df.columns:
        raise InputError(f"no column {key!r}; the columns are {df.columns}")
    KeyGroupTokens.empty(key_group_bits, pa.null(), pa.null())  # validates the bits
    for name, value in (("workers", workers), ("top", top)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise OptionError(f"{name} must be a positive int, not {value!r}")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, (int, float))
                               or not 0 < sample <= 1):
        raise OptionError(f"sample must be a fraction in (0, 1], not {sample!r}")
    chosen = default_segment_count(df.sparkSession) if workers is None else workers
    counted = df if sample is None or sample == 1 else df.sample(fraction=float(sample), seed=1)
    scale = 1.0 if sample is None else 1.0 / sample
    key_type = df.schema[key].dataType.simpleString()
    groups = hash_column(key, key_type, hash, method).bitwiseAND(F.lit((1 << key_group_bits) - 1))
    table = counted.select(groups.alias(_KG)).groupBy(_KG).count().toArrow()
    counts = np.zeros(1 << key_group_bits, dtype=np.int64)
    counts[table.column(_KG).to_numpy(zero_copy_only=False)] = np.round(
        table.column("count").to_numpy(zero_copy_only=False) * scale).astype(np.int64)
    rows = counted.groupBy(key).count().orderBy(F.col("count").desc(), F.col(key).asc()).limit(top).collect()
    hottest = tuple((row[0], round(row[1] * scale)) for row in rows)
    ids = plan_segments(counts, chosen)
    return Plan(key_group_counts=counts, key_group_bits=key_group_bits, hottest=hottest, workers=chosen,
                segments=SegmentSet.from_ids(ids), sample=None if sample in (None, 1) else float(sample))
