"""``OffsetAcker.restore``, kernel against spec: the same bytes are taken or refused alike.

Each input is tried as it is and sealed with a valid header and checksum, so that the fuzzer
reaches the body's decoder. Any difference in the restored state or in the error is a crash.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    import segack.specs as spec

import segack.kernel as kernel
from fuzz.common import sealed_acker_token


def _outcome(implementation, data: bytes) -> tuple:
    try:
        acker = implementation.OffsetAcker.restore(data)
    except (ValueError, TypeError) as error:
        return ("refused", type(error).__name__, str(error))
    return ("taken", acker.start_index, acker.on_duplicate, acker.max_runs, acker.next_index,
            acker.committed_offset, acker.duplicates, acker.runs_with_offsets())


def test_one_input(data: bytes) -> None:
    for token in (data, sealed_acker_token(data)):
        kernel_reads, spec_reads = _outcome(kernel, token), _outcome(spec, token)
        if kernel_reads != spec_reads:
            raise AssertionError(f"kernel {kernel_reads!r} != spec {spec_reads!r} for {token!r}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
