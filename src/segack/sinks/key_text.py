"""A key as a sink records it: the same text for the same key in every run and process."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["key_text"]

# Made once: ``json.dumps`` with arguments builds an encoder per call, which cost more than the
# encoding of a short key.
_KEY_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False, separators=(",", ":"))
_encode_text = json.encoder.encode_basestring  # what the encoder does with a str, without its checks


def key_text(key: Any) -> str:
    """``key`` as JSON, so that ``None``, ``"null"``, ``1`` and ``"1"`` stay apart. JSON escapes
    every control character, so no key's text holds one."""
    return _encode_text(key) if type(key) is str else _KEY_ENCODER.encode(key)
