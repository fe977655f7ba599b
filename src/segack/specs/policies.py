"""Sequencing policies: which value of an event decides its segment.

Events with equal sequencing values are handled in order, one after another;
events with different values may run in parallel. The value's hash (see
:mod:`segack.specs.hashes`) picks the segment. The policies hold no native
work, so the kernel exports these same classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from segack.errors import SegackKeyError

__all__ = ["SequencingPolicy", "PerKeyPolicy", "SequentialPolicy", "ConcurrentPolicy"]


class SequencingPolicy:
    """Base class: :meth:`sequencing_value` maps an event (a mapping) to a value."""

    def sequencing_value(self, event: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _field(event: Mapping[str, Any], name: str) -> Any:
    try:
        return event[name]
    except KeyError:
        raise SegackKeyError(f"the event has no field {name!r}") from None


class PerKeyPolicy(SequencingPolicy):
    """Events with the same key run in order (the default; Axon's aggregate id)."""

    def __init__(self, key: str = "key") -> None:
        self.key = key

    def sequencing_value(self, event: Mapping[str, Any]) -> Any:
        """The event's ``key`` field; a missing field is a ``KeyError`` naming it."""
        return _field(event, self.key)


class SequentialPolicy(SequencingPolicy):
    """Every event runs in order: one constant value, so one segment does all the work."""

    def __init__(self, value: str = "sequential") -> None:
        self.value = value

    def sequencing_value(self, event: Mapping[str, Any]) -> Any:
        """The same constant for every event."""
        return self.value


class ConcurrentPolicy(SequencingPolicy):
    """No ordering: each event is its own key (Axon does this when its policy returns null)."""

    def __init__(self, id_field: str = "id") -> None:
        self.id_field = id_field

    def sequencing_value(self, event: Mapping[str, Any]) -> Any:
        """The event's own id field; a missing field is a ``KeyError`` naming it."""
        return _field(event, self.id_field)
