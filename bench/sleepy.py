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


def nothing_in_lists(events: list[dict[str, Any]]) -> None:
    """A batch handler that does nothing: what is left is segack's own cost per list."""


async def wait_async(event: dict[str, Any]) -> None:
    """The same wait, as an ``async def`` handler."""
    await asyncio.sleep(SECONDS)


def unordered_pool(rows: Iterator[Any]) -> None:
    """What a user would write by hand: ``foreachPartition`` with 64 threads and no order at all."""
    with ThreadPoolExecutor(64) as pool:
        for _ in pool.map(lambda row: wait(row.asDict()), rows):
            pass


#: The rescale bench's log: the first call each worker process makes in each Spark stage.
STAGE_LOG = "SEGACK_BENCH_STAGE_LOG"
_stages_noted: set[int] = set()


def wait_noting_stages(event: dict[str, Any]) -> None:
    """Waits 1 ms, and notes when this process first handled an event of each Spark stage (one
    stage per job, so per segment set): the rescale bench reads when the new set's first event ran."""
    import os

    from pyspark import TaskContext

    context = TaskContext.get()
    stage = context.stageId() if context is not None else -1
    if stage not in _stages_noted:
        _stages_noted.add(stage)
        with open(os.environ[STAGE_LOG], "a") as log:
            log.write(f"{stage} {time.time()}\n")
    time.sleep(SECONDS / 2)
