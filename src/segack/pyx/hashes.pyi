"""Type stubs for the compiled hash kernel (see :mod:`segack.specs.hashes`)."""

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["java_hash", "java_hash_many", "spark_hash", "spark_hash_many", "SPARK_HASH_SEED", "SPARK_DTYPES"]

SPARK_HASH_SEED: int
SPARK_DTYPES: tuple[str, ...]

def java_hash(value: str | int | bool | None) -> int: ...
def java_hash_many(values: Any) -> npt.NDArray[np.int32]: ...
def spark_hash(value: str | int | None, dtype: str | None = None) -> int: ...
def spark_hash_many(values: Any, dtype: str | None = None) -> npt.NDArray[np.int32]: ...
