"""PySpark integration: segment columns, segment partitioning, ordered replay, checkpoints."""

from __future__ import annotations

from segack.spark_adapter.session import local_session

__all__ = ["local_session"]
