"""A running stream's view of its Kafka partitions: each one's end offset as the broker last said,
the offsets done (the last complete micro-batch's ends) and those committed to the consumer group.

The stream's watcher (:mod:`~segack.spark_adapter.coordinator.query`) writes it every few seconds,
the checkpoint's state only with each micro-batch: ``segack status``, the page and the metrics lay
the view over the recorded stream (:func:`stream_now`), so that the lag they show moves while a
micro-batch waits for its trigger. It is an observation, never progress: a resume reads nothing
from it, and one that does not parse is passed over.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from segack.spark_adapter.store.crash_points import durable_write
from segack.spark_adapter.store.storage import Files

__all__ = ["STREAM_VIEW", "read_stream_view", "stream_now", "write_stream_view"]

log = logging.getLogger(__name__)

#: The view's file in the checkpoint.
STREAM_VIEW = "stream-view.json"


def write_stream_view(files: Files, view: dict[str, Any]) -> None:
    """Record the live stream's ``view`` (JSON) in the checkpoint's ``files``, atomically."""
    with durable_write("stream-view"):
        files.write(files.path(STREAM_VIEW), json.dumps(view, sort_keys=True).encode("utf-8"))


def read_stream_view(files: Files) -> dict[str, Any] | None:
    """The view in the checkpoint's ``files``; ``None`` when there is none, or when it does not parse
    (logged)."""
    where = files.path(STREAM_VIEW)
    data = files.read(where)
    if data is None:
        return None
    try:
        view: dict[str, Any] = json.loads(data)
        _last_batch(view)
    except (ValueError, TypeError, AttributeError) as error:
        log.warning("passing over the stream view %s, which does not parse: %s", where, error)
        return None
    return view


def stream_now(files: Files, recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stream's ``recorded`` settings with the view in the checkpoint's ``files`` over them, where
    the view is of the same micro-batch or a later one; a view that does not parse is passed over
    (logged)."""
    if not recorded:
        return recorded
    view = read_stream_view(files)
    if view is None:
        return recorded
    return recorded if _last_batch(view) < _last_batch(recorded) else {**recorded, **view}


def _last_batch(stream: dict[str, Any]) -> int:
    """The id of the micro-batch a stream's settings or view report (-1: none)."""
    found = (stream.get("last_batch") or {}).get("id")
    return -1 if found is None else int(found)
