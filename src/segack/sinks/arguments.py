"""What every sink checks of its arguments and of the run it is given, said the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from segack.errors import SegackTypeError, SegackValueError
from segack.spark_adapter.errors import SinkError
from segack.spark_adapter.handlers import RunContext
from segack.spark_adapter.options import Policy

__all__ = ["check_apply", "check_preferred_batch_size", "refuse_unordered"]


def check_apply(owner: str, apply: Callable[..., Any] | None, apply_many: Callable[..., Any] | None) -> None:
    """Refuse both or neither of ``apply`` and ``apply_many``, and one that is not callable."""
    if (apply is None) == (apply_many is None):
        raise SegackValueError(f"{owner}: give apply (one event) or apply_many (a list), not both or neither")
    if not callable(apply if apply is not None else apply_many):
        raise SegackTypeError(f"{owner}: apply and apply_many must be callable")


def check_preferred_batch_size(owner: str, size: Any) -> None:
    """Refuse a ``preferred_batch_size`` that is not a positive int or ``None``."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise SegackValueError(f"{owner}: preferred_batch_size must be a positive int or None, not {size!r}")


def refuse_unordered(owner: str, run: RunContext) -> None:
    """Refuse a run that may call a key's events out of order: a sink's record of a key's position
    would then skip the events below it that were not applied yet."""
    if run.policy == Policy.CONCURRENT:
        raise SinkError(f"{owner} needs each key's events in order; policy 'concurrent' does not keep "
                        f"that (use 'per-key' or 'sequential')")
