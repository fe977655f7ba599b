"""Handlers for the concurrency bench: each call waits 2 ms, as a call to a database might, or
does nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: How long each call waits.
SECONDS = 0.002


def wait(event: dict[str, Any]) -> None:
    """The handler both pipelines call."""
    time.sleep(SECONDS)


def nothing(event: dict[str, Any]) -> None:
    """A no-op handler: what is left is segack's own cost per event."""


async def wait_async(event: dict[str, Any]) -> None:
    """The same wait, as an ``async def`` handler."""
    await asyncio.sleep(SECONDS)


def unordered_pool(rows: Iterator[Any]) -> None:
    """What a user would write by hand: ``foreachPartition`` with 64 threads and no order at all."""
    with ThreadPoolExecutor(64) as pool:
        for _ in pool.map(lambda row: wait(row.asDict()), rows):
            pass
