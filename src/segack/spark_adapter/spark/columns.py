"""Hash and segment columns, computed in the JVM wherever Spark can.

``hash="spark"`` is Spark SQL's own ``hash()`` (Murmur3, seed 42): native, and
equal to :func:`segack.spark_hash` for string, int and bigint columns.
``hash="java"`` is the Axon-compatible hash (``Objects.hashCode`` of the key):
for integer keys it is plain JVM arithmetic (``Long.hashCode``); for string keys
Spark has no native ``String.hashCode``, so two candidates exist and
``nox -s bench -- spark`` measures them side by side:

* ``"reflect"``: Spark's ``reflect`` calling ``java.util.Objects.hashCode``;
* ``"arrow"``: an Arrow UDF over the compiled :func:`segack.java_hash_many`.

``method="auto"`` picks the faster one as measured (see the performance page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from segack._shared import HASHES
from segack.errors import SegackTypeError
from segack.kernel import SegmentSet
from segack.spark_adapter.errors import InputError, OptionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql._typing import UserDefinedFunctionLike

__all__ = ["HASHES", "JAVA_HASH_METHODS", "hash_column", "member_index_column", "segment_column"]

JAVA_HASH_METHODS = ("reflect", "arrow")
#: The candidate ``method="auto"`` uses for string keys under ``hash="java"``.
FASTEST_JAVA_HASH_METHOD = "reflect"
#: Above this many table entries, owners are found by a CASE chain instead of a lookup array.
_TABLE_LIMIT = 4096


def _column(key: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.col(key) if isinstance(key, str) else key


def _low_int(value: Column) -> Column:
    """The low 32 bits of a bigint column as a signed int, without ANSI overflow errors."""
    from pyspark.sql import functions as F

    low = value.bitwiseAND(F.lit(0xFFFFFFFF))
    return (low.bitwiseXOR(F.lit(0x80000000)) - F.lit(0x80000000)).cast("int")


def _java_hash_arrow() -> UserDefinedFunctionLike:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from segack.kernel import java_hash_many

    def java_hash_batch(keys):  # type: ignore[no-untyped-def]
        return pa.array(java_hash_many(keys), type=pa.int32())

    # Unannotated on purpose: Spark takes an Arrow UDF without type hints as scalar, while naming
    # the kind outright warns on every call (and hints here would be strings it cannot evaluate).
    return F.arrow_udf(java_hash_batch, "int")  # type: ignore[attr-defined,no-any-return]


def hash_column(key: Column | str, key_type: str, hash: str = "spark", method: str = "auto") -> Column:
    """The 32-bit hash of ``key``, computed in the JVM where it can be.

    Parameters
    ----------
    key : Column or str
        The key column, or its name.
    key_type : str
        Its Spark type as a simple string: ``"string"``, ``"int"``, ``"bigint"``, ``"smallint"``
        or ``"tinyint"``.
    hash : ``{'spark', 'java'}``, default ``'spark'``
        Spark SQL's ``hash()``, or Java's ``hashCode`` (as Axon Framework).
    method : ``{'auto', 'reflect', 'arrow'}``, default ``'auto'``
        How the ``java`` hash of a string is computed: ``reflect`` in the JVM, ``arrow`` in a
        Python UDF; ``auto`` takes the faster.

    Raises
    ------
    OptionError
        An unknown ``hash`` or ``method``.
    InputError
        A key type other than strings and integers.
    """
    from pyspark.sql import functions as F

    if hash not in HASHES:
        raise OptionError(f"hash must be one of {HASHES}, not {hash!r}")
    if method not in ("auto", *JAVA_HASH_METHODS):
        raise OptionError(f"method must be 'auto' or one of {JAVA_HASH_METHODS}, not {method!r}")
    if key_type not in ("string", "int", "bigint", "smallint", "tinyint"):
        raise InputError(f"key columns must be strings or integers, not {key_type}")
    column = _column(key)
    if hash == "spark":
        return F.hash(column)
    if key_type != "string":
        value = column.cast("bigint")
        return _low_int(value.bitwiseXOR(F.shiftrightunsigned(value, 32)))
    chosen = FASTEST_JAVA_HASH_METHOD if method == "auto" else method
    if chosen == "reflect":
        return F.coalesce(
            F.call_function("reflect", F.lit("java.util.Objects"), F.lit("hashCode"), column).cast("int"),
            F.lit(0),
        )
    return _java_hash_arrow()(column)


def member_index_column(hashes: Column, segments: SegmentSet) -> Column:
    """The index in ``segments`` of the member owning each hash, as a JVM expression.

    A lookup array over the deepest mask when it is small, else a CASE chain that
    tries the widest members first.

    Parameters
    ----------
    hashes : Column
        32-bit hashes (or key groups: their low bits are what the members' masks read).
    segments : SegmentSet
        A complete set.

    Raises
    ------
    SegackTypeError
        ``segments`` is not a :class:`~segack.SegmentSet`.
    """
    from pyspark.sql import functions as F

    if not isinstance(segments, SegmentSet):
        raise SegackTypeError(f"segments must be a segack.SegmentSet, not {type(segments).__name__}")
    if len(segments) == 1:
        return F.lit(0)
    deepest = max(member.mask for member in segments)
    if all(member.mask == deepest for member in segments):
        # A balanced power-of-two set: members sorted by id are 0..mask, so the index is the id.
        return hashes.bitwiseAND(F.lit(deepest))
    if deepest < _TABLE_LIMIT:
        table = [segments.owner_index(value) for value in range(deepest + 1)]
        slot = hashes.bitwiseAND(F.lit(deepest)) + F.lit(1)
        return F.element_at(F.array(*[F.lit(owner) for owner in table]), slot)
    widest_first = sorted(range(len(segments)), key=lambda i: segments[i].mask)

    def owns(position: int) -> Column:
        member = segments[position]
        return hashes.bitwiseAND(F.lit(member.mask)) == F.lit(member.segment_id)

    # Two members at least: the widest starts the chain, the narrowest is what is left.
    chain = F.when(owns(widest_first[0]), F.lit(widest_first[0]))
    for position in widest_first[1:-1]:
        chain = chain.when(owns(position), F.lit(position))
    return chain.otherwise(F.lit(widest_first[-1]))


def segment_column(
    df: DataFrame, key: str, segments: SegmentSet, hash: str = "spark", method: str = "auto"
) -> Column:
    """The index in ``segments`` of the segment that owns each row's ``key``.

    Parameters
    ----------
    df : DataFrame
        Supplies the key's type.
    key : str
        The key column.
    segments : SegmentSet
        A complete set.
    hash, method : str
        As for :func:`hash_column`.

    Raises
    ------
    InputError
        ``key`` is not a column of ``df``, or not a string or an integer.
    OptionError
        As for :func:`hash_column`.
    """
    if key not in df.columns:
        raise InputError(f"no column {key!r}; the columns are {df.columns}")
    key_type = df.schema[key].dataType.simpleString()
    return member_index_column(hash_column(key, key_type, hash, method), segments)
