"""Hashes: the kernel against the spec, input forms, and bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import segack.kernel as kernel
import segack.specs as spec
from tests.outcomes import outcome

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
# Lone surrogates: what Java hashes as UTF-16 units and UTF-8 cannot hold. Hypothesis leaves them
# out of text() whatever its alphabet, so the strings are joined from single characters.
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
ANY_TEXT = st.lists(st.characters() | SURROGATES, max_size=40).map("".join)
LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INTS = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def java_string_hash_by_definition(text: str) -> int:
    """``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 units, as Java's documentation states it."""
    units = text.encode("utf-16-be", "surrogatepass")
    total = sum(
        int.from_bytes(units[i : i + 2], "big") * 31 ** (len(units) // 2 - 1 - i // 2)
        for i in range(0, len(units), 2)
    )
    total &= 0xFFFFFFFF
    return total - 2**32 if total >= 2**31 else total


@given(ANY_TEXT)
def test_java_hash_of_strings_follows_the_documented_formula(text):
    expected = java_string_hash_by_definition(text)
    assert kernel.java_hash(text) == expected
    assert spec.java_hash(text) == expected


@given(LONGS)
def test_java_hash_of_longs_folds_the_halves(number):
    unsigned = number & (2**64 - 1)
    folded = (unsigned ^ (unsigned >> 32)) & 0xFFFFFFFF
    expected = folded - 2**32 if folded >= 2**31 else folded
    assert kernel.java_hash(number) == spec.java_hash(number) == expected


def test_java_hash_of_none_and_booleans(impl):
    assert impl.java_hash(None) == 0
    assert impl.java_hash(True) == 1231
    assert impl.java_hash(False) == 1237


def test_java_hash_rejects_what_java_cannot_hash_the_same_way(impl):
    with pytest.raises(TypeError, match="java_hash takes"):
        impl.java_hash(1.5)
    with pytest.raises(TypeError, match="java_hash takes"):
        impl.java_hash(b"bytes")
    with pytest.raises(ValueError, match="Java long"):
        impl.java_hash(2**63)


@given(st.one_of(TEXT, LONGS, INTS), st.sampled_from([None, "string", "int", "bigint"]))
def test_kernel_and_spec_agree_on_spark_hash(value, dtype):
    assert outcome(lambda: kernel.spark_hash(value, dtype)) == outcome(
        lambda: spec.spark_hash(value, dtype)
    )


def test_spark_hash_null_is_the_seed(impl):
    assert impl.spark_hash(None) == 42
    assert impl.spark_hash(None, "int") == 42


def test_spark_hash_bad_input(impl):
    with pytest.raises(ValueError, match="dtype must be one of"):
        impl.spark_hash("a", "varchar")
    with pytest.raises(ValueError, match="Spark int"):
        impl.spark_hash(2**31, "int")
    with pytest.raises(ValueError, match="Spark bigint"):
        impl.spark_hash(2**63)
    with pytest.raises(TypeError, match="string column holds str"):
        impl.spark_hash(5, "string")
    with pytest.raises(TypeError, match="column holds int"):
        impl.spark_hash("5", "int")
    with pytest.raises(TypeError, match="spark_hash takes"):
        impl.spark_hash(1.5)
    with pytest.raises(ValueError, match="lone surrogate"):
        impl.spark_hash("a\ud800b")


@given(st.lists(st.one_of(st.none(), TEXT), max_size=30))
def test_many_forms_equal_one_at_a_time_for_text(items):
    for impl in (kernel, spec):
        java_each = [impl.java_hash(item) for item in items]
        spark_each = [impl.spark_hash(item, "string") for item in items]
        assert impl.java_hash_many(items).tolist() == java_each
        assert impl.spark_hash_many(items, "string").tolist() == spark_each
        arrow = pa.array(items, type=pa.string())
        assert impl.java_hash_many(arrow).tolist() == java_each
        assert impl.spark_hash_many(arrow).tolist() == spark_each
        large = pa.array(items, type=pa.large_string())
        assert impl.spark_hash_many(large).tolist() == spark_each
        if len(items) > 2:
            sliced = arrow.slice(1, len(items) - 2)
            assert impl.java_hash_many(sliced).tolist() == java_each[1:-1]
            assert impl.spark_hash_many(sliced).tolist() == spark_each[1:-1]
        texts = [item for item in items if item is not None and not item.endswith("\0")]
        unicode_array = np.array(texts, dtype=str)
        if unicode_array.dtype.kind == "U":
            assert impl.java_hash_many(unicode_array).tolist() == [impl.java_hash(t) for t in texts]
            assert impl.spark_hash_many(unicode_array).tolist() == [
                impl.spark_hash(t) for t in texts
            ]


@given(st.lists(st.one_of(st.none(), LONGS), max_size=30))
def test_many_forms_equal_one_at_a_time_for_longs(items):
    for impl in (kernel, spec):
        java_each = [impl.java_hash(item) for item in items]
        spark_each = [impl.spark_hash(item, "bigint") for item in items]
        assert impl.java_hash_many(items).tolist() == java_each
        arrow = pa.array(items, type=pa.int64())
        assert impl.java_hash_many(arrow).tolist() == java_each
        assert impl.spark_hash_many(arrow).tolist() == spark_each
        present = [item for item in items if item is not None]
        array = np.array(present, dtype=np.int64)
        assert impl.java_hash_many(array).tolist() == [impl.java_hash(i) for i in present]
        assert impl.spark_hash_many(array).tolist() == [impl.spark_hash(i) for i in present]


@given(st.lists(INTS, max_size=30))
def test_int32_arrays_hash_as_spark_int(items):
    for impl in (kernel, spec):
        expected = [impl.spark_hash(item, "int") for item in items]
        assert impl.spark_hash_many(np.array(items, dtype=np.int32)).tolist() == expected
        assert impl.spark_hash_many(pa.array(items, type=pa.int32())).tolist() == expected


def test_chunked_arrow_arrays(impl):
    chunked = pa.chunked_array([["a", "bb"], [], ["ccc", None]])
    assert impl.spark_hash_many(chunked).tolist() == [
        impl.spark_hash(v) for v in ["a", "bb", "ccc", None]
    ]


@given(
    st.lists(st.one_of(st.none(), TEXT, LONGS, st.floats(), st.booleans()), max_size=8),
    st.sampled_from([None, "string", "int", "bigint", "text"]),
)
def test_kernel_and_spec_agree_on_mixed_lists_errors_included(items, dtype):
    assert outcome(lambda: kernel.java_hash_many(items)) == outcome(
        lambda: spec.java_hash_many(items)
    )
    assert outcome(lambda: kernel.spark_hash_many(items, dtype)) == outcome(
        lambda: spec.spark_hash_many(items, dtype)
    )


def test_many_rejects_non_sequences(impl):
    with pytest.raises(TypeError, match="sequence or an array"):
        impl.java_hash_many("abc")
    with pytest.raises(TypeError, match="sequence or an array"):
        impl.spark_hash_many(5)
    with pytest.raises(TypeError, match="Arrow string, int32 or int64"):
        impl.spark_hash_many(pa.array([1.5]))
    with pytest.raises(TypeError, match="int32, int64 or str arrays"):
        impl.spark_hash_many(np.array([1.5]))
    with pytest.raises(ValueError, match="one-dimensional"):
        impl.java_hash_many(np.zeros((2, 2), dtype=np.int64))


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
def test_java_hash_takes_every_int64(impl, value):
    assert impl.java_hash(value) == ((value ^ (value >> 32)) & 0xFFFFFFFF ^ 0x80000000) - 0x80000000


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_java_hash_refuses_an_int_past_int64(impl, value):
    with pytest.raises(ValueError, match="64-bit"):
        impl.java_hash(value)
