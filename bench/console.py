"""``python -m bench console``: how fast ``segack ui`` answers on a large checkpoint, against
``segack status`` reading the same checkpoint in the same process.

The checkpoint has 65,536 key groups (16 bits, the most) and 256 segments, every key group with
events and some done, as a long replay leaves it. Timed (best of a few): the page's state
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
    return store.location


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
        with serve_page(location, port=0) as server:
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
    print_table(f"segack ui on a checkpoint of {1 << BITS:,} key groups and {SEGMENTS} segments "
                f"(best of {REPEATS}; floor: under 1 s)", rows, ["request", "seconds", "vs segack status"])
    save("console", rows)
