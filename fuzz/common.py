"""What the fuzz targets share: sealing fuzzed bodies so the decoders behind the checksums are reached."""

from __future__ import annotations

import struct
import zlib

from segack import _shared


def sealed_acker_token(body: bytes) -> bytes:
    """``body`` as an acker snapshot with a valid header and checksum."""
    total = _shared.SNAPSHOT_HEADER.size + len(body) + _shared.SNAPSHOT_CHECKSUM.size
    token = _shared.SNAPSHOT_HEADER.pack(_shared.SNAPSHOT_MAGIC, _shared.SNAPSHOT_VERSION, total) + body
    return token + _shared.SNAPSHOT_CHECKSUM.pack(zlib.crc32(token))


def sealed_arrow(magic: bytes, body: bytes) -> bytes:
    """``body`` behind a progress file's or tokens' magic and checksum: the Arrow reader gets it."""
    return magic + struct.pack(">I", zlib.crc32(body)) + body
