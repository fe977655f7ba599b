"""The command that installs one of segack's extras, as segack itself was installed.

segack is on no package index yet, so ``pip install 'segack[ui]'`` fails for everyone: the hint
names what pip was given (PEP 610's ``direct_url.json``), a checkout's folder or a wheel's file.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["install_hint"]


def _origin() -> dict[str, Any] | None:
    try:
        text = metadata.distribution("segack").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def install_hint(extra: str, origin: dict[str, Any] | None = None) -> str:
    """``pip install ...`` for segack with ``extra``: from the folder segack was installed from
    (``"/src/segack[ui]"``), from its wheel or archive (``"segack[ui] @ file:///...whl"``), else by
    name. ``origin`` is a ``direct_url.json`` (this installation's unless given)."""
    found = _origin() if origin is None else origin
    url = str((found or {}).get("url", ""))
    if url.startswith("file://"):
        if "dir_info" in (found or {}):
            return f"pip install '{unquote(urlparse(url).path)}[{extra}]'"
        return f"pip install 'segack[{extra}] @ {url}'"
    return f"pip install 'segack[{extra}]'"
