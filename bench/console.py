"""``python -m bench console``: how fast ``segack ui`` answers on a large checkpoint, against
``segack status`` reading the same checkpoint in the same process.

The checkpoint has 65,536 key groups (16 bits, the most) and 256 segments, every key group with
events and some done, as a long replay leaves it, and 51,200 dead letters whose events carry a
1 KB payload each (a file per segment), which the page lists by key. Timed (best of a few): the page's state
(``/api/state``, what the page asks every two seconds), its metrics (``/metrics``) and the page
itself (``/``), each over a real HTTP request to a server on loopback; and ``segack status`` (its
output thrown away), which reads the same files.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import best_of, print_table, save

BITS = 16
SEGMENTS = 256
REPEATS = 5
LETTERS_PER_SEGMENT = 200
PAYLOAD_BYTES = 1_000


def _checkpoint(directory: Path) -> str:
    """A released checkpoint of a replay part way through: counts and committed points per key group."""
    from segack.kernel import SegmentSet
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
    from segack.spark_adapter.store.claims import ClaimKeeper, acquire
    from segack.spark_adapter.store.rescale import record_segments
    from segack.spark_adapter.store.tokens import KeyGroupTokens

    store = CheckpointStore(str(directory / "checkpoint"))
    tokens = KeyGroupTokens.empty(BITS, pa.int64(), pa.string())
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 400, 1 << BITS).astype(np.int64)
    tokens.set_counts(counts)
    state = Checkpoint(settings={"key": "account", "order": "ts", "key_group_bits": BITS}, tokens=tokens)
    record_segments(state, SegmentSet.balanced(SEGMENTS), "start of run r1")
    claim = acquire(store, "r1", 60)
    with ClaimKeeper(store, claim):
        store.save(state, claim.number)
        tasks = store.for_tasks("r1", claim.number)
        for segment in range(SEGMENTS):
            tasks.write_dead_letters(f"r1-s{segment:05d}-a0-00000", _dead_letters(rng, segment))
    return store.location


def _dead_letters(rng: np.random.Generator, segment: int) -> pa.Table:
    """A segment's dead letters: events of a few hundred accounts, each with a payload."""
    from segack.spark_adapter.store.checkpoint import DEAD_ATTEMPTS, DEAD_ERROR, DEAD_KEY_GROUP, DEAD_POSITION

    return pa.table({
        "account": [f"acct-{account}" for account in rng.integers(0, 5_000, LETTERS_PER_SEGMENT).tolist()],
        "ts": np.arange(LETTERS_PER_SEGMENT, dtype=np.int64),
        "payload": [rng.bytes(PAYLOAD_BYTES // 2).hex() for _ in range(LETTERS_PER_SEGMENT)],
        DEAD_ERROR: ["ValueError: account closed"] * LETTERS_PER_SEGMENT,
        DEAD_ATTEMPTS: pa.array([1] * LETTERS_PER_SEGMENT, pa.int32()),
        DEAD_KEY_GROUP: pa.array([segment] * LETTERS_PER_SEGMENT, pa.int32()),
        DEAD_POSITION: pa.array(np.arange(LETTERS_PER_SEGMENT), pa.int64()),
    })


def run() -> None:
    from segack.cli import main
    from segack.spark_adapter.console.page import serve_page

    rows = []
    with tempfile.TemporaryDirectory(prefix="segack-bench-console-") as scratch:
        location = _checkpoint(Path(scratch))

        def status() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                main(["status", location])

        status_seconds = best_of(status, REPEATS)
        with serve_page(location, port=0, read_only=True) as server:
            for path in ("api/state", "metrics", ""):
                url = f"http://127.0.0.1:{server.port}/{path}"

                def get(url: str = url) -> None:
                    with urllib.request.urlopen(url, timeout=60) as response:
                        response.read()

                seconds = best_of(get, REPEATS)
                rows.append({"request": f"GET /{path}", "seconds": f"{seconds:.3f}",
                             "vs segack status": f"{seconds / status_seconds:.2f}x"})
        rows.append({"request": "segack status (in process)", "seconds": f"{status_seconds:.3f}",
                     "vs segack status": "1.00x"})
    print_table(f"segack ui on a checkpoint of {1 << BITS:,} key groups, {SEGMENTS} segments and "
                f"{SEGMENTS * LETTERS_PER_SEGMENT:,} dead letters (best of {REPEATS}; floor: under 1 s)",
                rows, ["request", "seconds", "vs segack status"])
    save("console", rows)
