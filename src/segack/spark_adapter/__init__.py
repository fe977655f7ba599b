"""PySpark integration: segment columns, segment partitioning, ordered replay, checkpoints."""

from __future__ import annotations

from segack.spark_adapter.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from segack.spark_adapter.columns import hash_column, member_index_column, segment_column
from segack.spark_adapter.replay import (
    HandlerFailed,
    Progress,
    ReplayResult,
    load_handler,
    replay,
)
from segack.spark_adapter.session import local_session
from segack.spark_adapter.streaming import foreach_batch

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "foreach_batch",
    "HandlerFailed",
    "Progress",
    "ReplayResult",
    "hash_column",
    "load_handler",
    "local_session",
    "member_index_column",
    "replay",
    "segment_column",
]
