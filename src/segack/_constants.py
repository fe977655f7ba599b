"""What the kernel and the spec share on purpose: names and numbers fixed by the formats they match.

Each twin does its own work with these; neither imports the other's code.
"""

from __future__ import annotations

#: The hashes a key can be cut by: ``java`` (Java's ``hashCode``, as Axon Framework uses it) or
#: ``spark`` (Spark SQL's ``hash()``).
HASHES = ("java", "spark")

#: The seed of Spark SQL's ``hash()`` (Murmur3 x86_32).
SPARK_HASH_SEED = 42
