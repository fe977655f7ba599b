"""Hashes against the real peers: the JVM's Objects.hashCode and Spark's own hash()."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import segack.kernel as kernel
import segack.specs as spec

pytestmark = pytest.mark.spark

# Py4J carries text as UTF-8, so lone surrogates cannot reach the JVM.
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
EDGE_TEXT = ["", "a", "ab", "abc", "abcd", "é", "日本", "\U0001f600", "x\U00010000y", "\u00ff" * 5]
LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
EDGE_LONGS = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32, 2**63 - 1, -(2**63)]


@settings(max_examples=150)
@given(st.lists(TEXT, min_size=1, max_size=20))
def test_java_hash_equals_objects_hash_code(jvm, texts):
    for text in texts + EDGE_TEXT:
        expected = jvm.java.util.Objects.hashCode(text)
        assert kernel.java_hash(text) == expected
        assert spec.java_hash(text) == expected


@settings(max_examples=25)
@given(st.lists(LONGS, min_size=1, max_size=40))
def test_java_hash_of_ints_equals_long_hash_code(spark, numbers):
    # Py4J would hand small ints to Java as Integer, so Long.hashCode runs in SQL.
    numbers = numbers + EDGE_LONGS
    frame = spark.createDataFrame([(number,) for number in numbers], "v bigint")
    rows = frame.selectExpr("cast(reflect('java.lang.Long', 'hashCode', v) as int)").collect()
    expected = [row[0] for row in rows]
    assert kernel.java_hash_many(numbers).tolist() == expected
    assert [spec.java_hash(number) for number in numbers] == expected


def _spark_hashes(spark, rows, ddl):
    frame = spark.createDataFrame([(value,) for value in rows], ddl)
    return [row[0] for row in frame.selectExpr("hash(v)").collect()]


@settings(max_examples=25)
@given(st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=40))
def test_spark_hash_of_strings_equals_spark(spark, texts):
    texts = texts + EDGE_TEXT
    expected = _spark_hashes(spark, texts, "v string")
    assert kernel.spark_hash_many(texts, "string").tolist() == expected
    assert [spec.spark_hash(text, "string") for text in texts] == expected


@settings(max_examples=25)
@given(st.lists(LONGS, min_size=1, max_size=40))
def test_spark_hash_of_bigints_equals_spark(spark, numbers):
    numbers = numbers + EDGE_LONGS
    expected = _spark_hashes(spark, numbers, "v bigint")
    assert kernel.spark_hash_many(numbers, "bigint").tolist() == expected
    assert [spec.spark_hash(number) for number in numbers] == expected


@settings(max_examples=25)
@given(st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), min_size=1, max_size=40))
def test_spark_hash_of_ints_equals_spark(spark, numbers):
    numbers = numbers + [0, -1, 2**31 - 1, -(2**31)]
    expected = _spark_hashes(spark, numbers, "v int")
    assert kernel.spark_hash_many(numbers, "int").tolist() == expected
    assert [spec.spark_hash(number, "int") for number in numbers] == expected


# Every code point 0..255 alone and inside text: its UTF-8 form holds every lead byte below 0xC4
# and every continuation byte, 0x80 included ("À" is C3 80); Java hashes its UTF-16 unit.
EVERY_LATIN1 = [chr(code) for code in range(256)] + [f"a{chr(code)}z" for code in range(256)]


def test_java_hash_of_every_latin1_character_equals_the_jvm(jvm):
    for text in EVERY_LATIN1:
        expected = jvm.java.util.Objects.hashCode(text)
        assert (kernel.java_hash(text), spec.java_hash(text)) == (expected, expected), repr(text)


def test_spark_hash_of_every_latin1_character_equals_spark(spark):
    expected = _spark_hashes(spark, EVERY_LATIN1, "v string")
    assert kernel.spark_hash_many(EVERY_LATIN1, "string").tolist() == expected
    assert [spec.spark_hash(text, "string") for text in EVERY_LATIN1] == expected
