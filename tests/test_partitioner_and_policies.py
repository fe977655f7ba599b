"""The partitioner and the sequencing policies without Spark, on both twins.

A first mutation run found the spec's ``SegmentPartitioner`` and the policies reached only by
Spark and API-shape tests: these pin their behaviour where the quick tests run.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import segack.kernel as kernel
import segack.specs as spec
from segack.errors import SegackKeyError


@pytest.mark.parametrize("hash_name", ["java", "spark"])
@given(keys=st.lists(st.text(max_size=10), min_size=1, max_size=20), count=st.integers(1, 9))
def test_the_partition_of_a_key_is_the_index_of_the_segment_owning_its_hash(hash_name, keys, count):
    for impl in (kernel, spec):
        segments = impl.SegmentSet.balanced(count)
        partitioner = impl.SegmentPartitioner(segments, hash=hash_name)
        hash_function = impl.java_hash if hash_name == "java" else impl.spark_hash
        assert partitioner.num_partitions == count
        owners = [segments.owner_index(hash_function(key)) for key in keys]
        assert [partitioner(key) for key in keys] == owners


def test_partitioners_are_equal_when_their_segments_and_hash_are(impl):
    four, three = impl.SegmentSet.balanced(4), impl.SegmentSet.balanced(3)
    first = impl.SegmentPartitioner(four)
    assert first == impl.SegmentPartitioner(impl.SegmentSet.balanced(4), hash="java")
    assert hash(first) == hash(impl.SegmentPartitioner(impl.SegmentSet.balanced(4)))
    assert first != impl.SegmentPartitioner(four, hash="spark")
    assert first != impl.SegmentPartitioner(three)
    assert first != "SegmentPartitioner"
    assert len({first, impl.SegmentPartitioner(four), impl.SegmentPartitioner(three)}) == 2
    assert repr(first) == f"SegmentPartitioner({four!r}, hash='java')"


def test_segment_partitioner_rejects_bad_settings(impl):
    with pytest.raises(TypeError, match="segments must be a SegmentSet, not list"):
        impl.SegmentPartitioner([0, 1])
    with pytest.raises(ValueError, match=r"hash must be one of .*, not 'md5'"):
        impl.SegmentPartitioner(impl.SegmentSet.balanced(2), hash="md5")


def test_each_policy_picks_its_sequencing_value(impl):
    event = {"key": "order-1", "id": 7, "account": "a"}
    assert impl.PerKeyPolicy().sequencing_value(event) == "order-1"
    assert impl.PerKeyPolicy("account").sequencing_value(event) == "a"
    assert impl.SequentialPolicy().sequencing_value(event) == "sequential"
    assert impl.SequentialPolicy("all").sequencing_value({}) == "all"
    assert impl.ConcurrentPolicy().sequencing_value(event) == 7
    with pytest.raises(SegackKeyError, match="the event has no field 'key'"):
        impl.PerKeyPolicy().sequencing_value({"id": 1})
    with pytest.raises(KeyError, match="no field 'uuid'"):
        impl.ConcurrentPolicy("uuid").sequencing_value(event)
    with pytest.raises(NotImplementedError):
        impl.SequencingPolicy().sequencing_value(event)


def test_policies_are_equal_when_their_kind_and_fields_are(impl):
    assert impl.PerKeyPolicy("a") == impl.PerKeyPolicy("a")
    assert hash(impl.PerKeyPolicy("a")) == hash(impl.PerKeyPolicy("a"))
    assert impl.PerKeyPolicy("a") != impl.PerKeyPolicy("b")
    # The same field name under another kind is another policy.
    assert impl.PerKeyPolicy("id") != impl.ConcurrentPolicy("id")
    assert hash(impl.PerKeyPolicy("id")) != hash(impl.ConcurrentPolicy("id"))
    assert len({impl.SequentialPolicy(), impl.SequentialPolicy(), impl.PerKeyPolicy()}) == 2
    assert repr(impl.PerKeyPolicy("account")) == "PerKeyPolicy(key='account')"
    assert repr(impl.SequentialPolicy()) == "SequentialPolicy(value='sequential')"
