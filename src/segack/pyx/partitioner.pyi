from typing import Any

from typing_extensions import disjoint_base

from segack.pyx.segments import SegmentSet

__all__ = ["SegmentPartitioner"]

HASHES: tuple[str, ...]

@disjoint_base
class SegmentPartitioner:
    segments: SegmentSet
    hash: str
    def __init__(self, segments: SegmentSet, hash: str = "java") -> None: ...
    @property
    def num_partitions(self) -> int: ...
    def __call__(self, key: Any) -> int: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    def __hash__(self) -> int: ...
