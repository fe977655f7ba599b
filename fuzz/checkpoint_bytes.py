"""``Checkpoint.from_bytes``, progress files, key-group tokens, claims and segment requests: damage
is a clear error, never a crash.

Raw bytes go to the checkpoint, claim and segment-request parsers; the same bytes, sealed with a
valid checksum, go to the decoders of progress files and tokens, so Arrow's reader sees them.
Anything but a :class:`segack.SegackError` escaping is a crash.
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from segack.spark_adapter.store import tokens
    from segack.spark_adapter.store.checkpoint import Checkpoint
    from segack.spark_adapter.store.claims import Claim
    from segack.spark_adapter.store.rescale import SegmentChange

from fuzz.common import sealed_arrow
from segack.errors import SegackError


def test_one_input(data: bytes) -> None:
    for parse in (
        lambda: Checkpoint.from_bytes(data),
        lambda: Claim.from_bytes(data, "a claim"),
        lambda: SegmentChange.from_bytes(data, "a segment request"),
        lambda: tokens.decode_updates(sealed_arrow(tokens._UPDATES_MAGIC, data)),
        lambda: tokens.KeyGroupTokens.from_bytes(sealed_arrow(tokens._TOKENS_MAGIC, data), 12),
    ):
        with contextlib.suppress(SegackError):
            parse()


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
