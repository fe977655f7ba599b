"""PySpark integration: segment columns, key groups, ordered replay and streams (files, tables,
Kafka), planning, checkpoints, claims, segments changed while a run goes on, sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segack.spark_adapter import errors as _errors
from segack.spark_adapter.coordinator.planning import Plan, plan
from segack.spark_adapter.coordinator.query import StopRequest, stream
from segack.spark_adapter.coordinator.realtime import stream_real_time
from segack.spark_adapter.coordinator.replay import (
    Progress,
    ReplayResult,
    load_handler,
    replay,
    worker_error,
)
from segack.spark_adapter.coordinator.streaming import foreach_batch
from segack.spark_adapter.errors import (
    CheckpointClaimedError,
    CheckpointError,
    CheckpointLocationError,
    ClaimLostError,
    ExecutorEnvironmentError,
    ForeignInputError,
    HandlerFailedError,
    InputError,
    OptionError,
    ReplayError,
    SchemaRegistryError,
    SegmentChangeError,
    SessionError,
    SinkError,
    TokenError,
    UnorderableEventError,
    UnparsedValueError,
)
from segack.spark_adapter.handlers import EventIdentity, RunContext, Sink, takes_unorderable, with_identity
from segack.spark_adapter.results import (
    BatchReport,
    PartitionReport,
    RealTimeReport,
    RealTimeResult,
    StreamResult,
)
from segack.spark_adapter.sources.delta import DeltaChangeFeed
from segack.spark_adapter.sources.files import delta_change_feed
from segack.spark_adapter.sources.kafka import KafkaStream, kafka_stream, takes_unparsed
from segack.spark_adapter.spark.columns import hash_column, member_index_column, segment_column
from segack.spark_adapter.spark.session import (
    local_session,
    ship_module,
    ship_py_files,
    spark_session,
)
from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore
from segack.spark_adapter.store.rescale import Rescale, merge, scale, split
from segack.spark_adapter.store.storage import resolve_location
from segack.spark_adapter.store.tokens import DEFAULT_KEY_GROUP_BITS, KeyGroupTokens

__all__ = [
    "DEFAULT_KEY_GROUP_BITS",
    "BatchReport",
    "Checkpoint",
    "CheckpointClaimedError",
    "CheckpointError",
    "CheckpointLocationError",
    "CheckpointStore",
    "ClaimLostError",
    "DeltaChangeFeed",
    "EventIdentity",
    "ExecutorEnvironmentError",
    "ForeignInputError",
    "HandlerFailedError",
    "InputError",
    "KafkaStream",
    "KeyGroupTokens",
    "MetricsServer",
    "OptionError",
    "PartitionReport",
    "Plan",
    "Progress",
    "RealTimeReport",
    "RealTimeResult",
    "ReplayError",
    "SchemaRegistryError",
    "ReplayResult",
    "Rescale",
    "RunContext",
    "SegmentChangeError",
    "SessionError",
    "Sink",
    "SinkError",
    "StopRequest",
    "StreamResult",
    "TokenError",
    "UnorderableEventError",
    "UnparsedValueError",
    "delta_change_feed",
    "foreach_batch",
    "hash_column",
    "kafka_stream",
    "load_handler",
    "local_session",
    "member_index_column",
    "merge",
    "plan",
    "replay",
    "resolve_location",
    "scale",
    "segment_column",
    "serve_metrics",
    "ship_module",
    "ship_py_files",
    "spark_session",
    "split",
    "stream",
    "stream_real_time",
    "takes_unorderable",
    "takes_unparsed",
    "with_identity",
    "worker_error",
]


if TYPE_CHECKING:
    from segack.spark_adapter.console.metrics import MetricsServer, serve_metrics

#: Imported when first asked for: they need prometheus_client, which a run without metrics never
#: imports.
_METRICS = ("MetricsServer", "serve_metrics")


def __getattr__(name: str) -> object:
    if name in _METRICS:
        from segack.spark_adapter.console import metrics

        return getattr(metrics, name)
    # The 0.1 names, kept working with a deprecation warning.
    return _errors.__getattr__(name)
