"""Hashing and segment assignment against pure Python and NumPy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import segack
import segack.specs as spec
from bench.common import best_of, print_table, save


def python_java_hash(text: str) -> int:
    """A tuned pure-Python ``String.hashCode`` for BMP text: the competitor."""
    result = 0
    for character in text:
        result = (31 * result + ord(character)) & 0xFFFFFFFF
    return result - (1 << 32) if result >= (1 << 31) else result


def numpy_assign(segments: segack.SegmentSet, hashes: np.ndarray) -> np.ndarray:
    """NumPy masking one segment at a time: the obvious vectorized competitor."""
    out = np.empty(len(hashes), dtype=np.int32)
    for position, member in enumerate(segments):
        out[(hashes & member.mask) == member.segment_id] = position
    return out


def run() -> None:
    rng = np.random.default_rng(1)
    keys = [f"user-{number}" for number in rng.integers(0, 10**9, size=300_000).tolist()]
    arrow_keys = pa.array(keys)
    assert segack.java_hash_many(keys[:1000]).tolist() == [python_java_hash(k) for k in keys[:1000]]
    rows = []

    loop = best_of(lambda: [python_java_hash(k) for k in keys], 1)
    spec_loop = best_of(lambda: spec.java_hash_many(keys[:30_000]), 1) * 10
    for label, values in (("list of str", keys), ("Arrow string array", arrow_keys)):
        fast = best_of(lambda values=values: segack.java_hash_many(values))
        rows.append({"what": f"java_hash_many, 300k keys, {label}", "segack ms": f"{fast * 1e3:.1f}",
                     "competitor": "tuned pure-Python loop", "competitor ms": f"{loop * 1e3:.0f}",
                     "ratio": f"{loop / fast:.0f}x"})
    rows.append({"what": "java_hash_many, 300k keys, list of str", "segack ms": rows[0]["segack ms"],
                 "competitor": "segack.specs (pure Python)", "competitor ms": f"{spec_loop * 1e3:.0f}",
                 "ratio": f"{spec_loop / float(rows[0]['segack ms']) * 1e3:.0f}x"})

    spark_loop = best_of(lambda: [spec.spark_hash(k) for k in keys[:30_000]], 1) * 10
    for label, values in (("list of str", keys), ("Arrow string array", arrow_keys)):
        fast = best_of(lambda values=values: segack.spark_hash_many(values))
        rows.append({"what": f"spark_hash_many, 300k keys, {label}", "segack ms": f"{fast * 1e3:.1f}",
                     "competitor": "pure-Python Murmur3 (segack.specs)",
                     "competitor ms": f"{spark_loop * 1e3:.0f}", "ratio": f"{spark_loop / fast:.0f}x"})

    segments = segack.SegmentSet(segack.Segment.split_balanced(segack.ROOT, 23))
    hashes = rng.integers(-(2**31), 2**31, size=5_000_000, dtype=np.int64).astype(np.int32)
    assert (segments.assign(hashes) == numpy_assign(segments, hashes)).all()
    fast = best_of(lambda: segments.assign(hashes))
    slow = best_of(lambda: numpy_assign(segments, hashes))
    rows.append({"what": "SegmentSet.assign, 5M hashes, 24 uneven segments", "segack ms": f"{fast * 1e3:.1f}",
                 "competitor": "NumPy mask per segment", "competitor ms": f"{slow * 1e3:.0f}",
                 "ratio": f"{slow / fast:.0f}x"})
    print_table("Hashes and assignment (higher ratio is better; floors: 30x, 30x, 10x)", rows,
                ["what", "segack ms", "competitor", "competitor ms", "ratio"])
    save("hashes", rows)
