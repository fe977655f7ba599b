"""Write the seed corpus: valid tokens, progress files, checkpoints, claims and segment requests
(run once; checked in)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

import segack
from segack.spark_adapter.store import tokens
from segack.spark_adapter.store.checkpoint import Checkpoint
from segack.spark_adapter.store.claims import Claim
from segack.spark_adapter.store.rescale import SegmentChange

HERE = Path(__file__).parent


def _save(target: str, data: bytes) -> None:
    folder = HERE / "corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    for offsets in ([None, None], ["a", "bc"], [2**64, -5]):
        acker = segack.OffsetAcker(start_index=3)
        acker.ack_many(np.array([3, 4, 9, 12, 13], dtype=np.int64))
        acker.ack(20, offsets[0])
        acker.ack(22, offsets[1])
        token = acker.snapshot()
        _save("acker_restore", token)
        _save("acker_restore", token[9:-4])  # the body alone: sealed again by the target
    state = tokens.KeyGroupTokens.empty(12, pa.int64(), pa.string())
    _save("checkpoint_bytes", Checkpoint({"key_group_bits": 12, "key": "user"}, state).to_bytes())
    updates = pa.table({"kg": pa.array([1, 7], pa.int32())})
    _save("checkpoint_bytes", tokens.encode_updates(updates)[9:])
    _save("checkpoint_bytes", Claim(7, "3f2a9c81d0e4", "etl-7", 81233, 1.5e9, 1.5e9 + 4, 60.0).to_bytes())
    _save("checkpoint_bytes", SegmentChange((0, 1, 3), "split segment 1", 1.5e9, "pid 1 on etl-7").to_bytes())


if __name__ == "__main__":
    main()
