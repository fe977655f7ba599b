"""What the kernel and the spec share on purpose: names and numbers fixed by the formats they
match, and the wording of the rules both enforce the same way.

Each twin does its own work with these; neither imports the other's code.
"""

from __future__ import annotations

import warnings
from typing import Any

from segack.errors import SegackTypeError

#: The hashes a key can be cut by: ``java`` (Java's ``hashCode``, as Axon Framework uses it) or
#: ``spark`` (Spark SQL's ``hash()``).
HASHES = ("java", "spark")

#: The seed of Spark SQL's ``hash()`` (Murmur3 x86_32).
SPARK_HASH_SEED = 42


def start_index_argument(start_index: Any, next_index: Any) -> Any:
    """``OffsetAcker``'s start from its arguments: ``start_index``, or the 0.1 keyword ``next_index``
    (with a ``DeprecationWarning``). Both at once is a ``SegackTypeError``."""
    if next_index is None:
        return start_index
    if start_index != 0:
        raise SegackTypeError("give start_index or its old name next_index, not both")
    warnings.warn("OffsetAcker(next_index=...) is now OffsetAcker(start_index=...)", DeprecationWarning,
                  stacklevel=3)
    return next_index
