"""Helpers to compare what two implementations did, errors included."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from segack.errors import SegackError


def plain(value: Any) -> Any:
    """A comparable form of a result: segments become ``(id, mask)`` tuples."""
    if hasattr(value, "segment_id") and hasattr(value, "mask"):
        return (value.segment_id, value.mask)
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "members"):
        return ("set", [plain(member) for member in value.members])
    return value


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``(error type name, message)``.

    Only segack's own errors count as outcomes: anything else (a bare
    ``ValueError``, an ``OverflowError`` from a conversion) fails the test.
    """
    try:
        return ("ok", plain(call()))
    except SegackError as error:
        return (type(error).__name__, str(error))


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``message``."""
    return f"^{re.escape(message)}$"


def starting(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for a message that starts with ``message``."""
    return f"^{re.escape(message)}"
