"""The events a run refuses to hand a handler unless it is marked to take them: a stream's event
with no place in its key's order, a Kafka record whose value did not parse."""

from __future__ import annotations

import asyncio
import decimal
import pickle

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from segack.spark_adapter import (
    Sink,
    UnorderableEventError,
    UnparsedValueError,
    takes_unorderable,
    takes_unparsed,
    with_identity,
)
from segack.spark_adapter.handlers import orderable_refusal, refusing, wants_identity
from segack.spark_adapter.sources.kafka import UNPARSED, _UnparsedCheck, unparsed_refusal

handled: list = []


def record(events):
    handled.append(events)


@pytest.fixture(autouse=True)
def _no_calls():
    handled.clear()


GOOD = {"user": "a", "seq": 1, UNPARSED: None}


@pytest.mark.parametrize(("event", "said"), [
    ({"user": None, "seq": 1}, "its key ('user') is null"),
    ({"user": "a", "seq": None}, "its order ('seq') is null"),
    ({"user": "a", "seq": float("nan")}, "its order ('seq') is NaN"),
    ({"user": "a", "seq": decimal.Decimal("NaN")}, "its order ('seq') is NaN"),
    ({"user": None, "seq": None}, "its key ('user') is null"),
])
def test_an_event_with_no_key_or_no_order_fails_its_call_before_the_handler_is_called(event, said):
    guarded = refusing(record, [orderable_refusal("user", "seq")])
    with pytest.raises(UnorderableEventError, match=said.replace("(", r"\(").replace(")", r"\)")):
        guarded([GOOD, event])
    with pytest.raises(UnorderableEventError):
        guarded(event)
    assert handled == []
    guarded(GOOD)
    guarded([GOOD, {"user": "b", "seq": 0.0}])
    assert handled == [GOOD, [GOOD, {"user": "b", "seq": 0.0}]]


def test_a_marked_handler_gets_them_and_an_exempt_column_leaves_them_to_its_own_refusal():
    def taker(event):
        handled.append(event)

    assert refusing(takes_unorderable(taker), [orderable_refusal("user", "seq")]) is taker
    schema = StructType([StructField("user", StringType()), StructField("seq", LongType())])
    refusals = [unparsed_refusal(schema), orderable_refusal("user", "seq", exempt=UNPARSED)]
    unparsed = {"user": None, "seq": None, UNPARSED: "not json"}
    with pytest.raises(UnparsedValueError, match="does not parse"):
        refusing(record, refusals)(unparsed)
    # Taking unparsed records takes them whole: their null key and order are parsing's, not the data's.
    def unparsed_taker(event):
        handled.append(event)

    takes_unparsed(unparsed_taker)
    refusing(unparsed_taker, refusals)(unparsed)
    assert handled == [unparsed]
    with pytest.raises(UnorderableEventError):
        refusing(unparsed_taker, refusals)({"user": None, "seq": 1, UNPARSED: None})


def test_a_value_that_lacks_a_declared_field_is_named_in_the_refusal():
    check = _UnparsedCheck(("user", "seq"))
    with pytest.raises(UnparsedValueError, match=r"lacks 'user', 'seq'\): '\{\"User\": \"a\"\}'"):
        check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: '{"User": "a"}'})
    with pytest.raises(UnparsedValueError, match=r"offset 7 of t/0 does not parse as the value schema: 'x'"):
        check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: "x"})
    check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: None})


class _Ledger(Sink):
    preferred_batch_size = 500

    def __init__(self):
        self.prepared = self.closed = 0

    def __call__(self, events, identities):
        handled.append((events, identities))

    def prepare(self, run):
        self.prepared += 1

    def close(self):
        self.closed += 1


def test_each_kind_of_handler_keeps_what_the_run_asks_of_it_once_guarded():
    refusals = [orderable_refusal("user", "seq")]
    sink = _Ledger()
    guarded = refusing(sink, refusals)
    assert isinstance(guarded, Sink) and guarded.preferred_batch_size == 500 and wants_identity(guarded)
    guarded.prepare(None)
    guarded.close()
    assert (sink.prepared, sink.closed) == (1, 1)
    with pytest.raises(UnorderableEventError):
        guarded([GOOD, {"user": "a", "seq": None}], [1, 2])
    guarded([GOOD], [1])
    assert handled == [([GOOD], [1])]

    assert wants_identity(refusing(with_identity(lambda event, identity: None), refusals))
    assert not wants_identity(refusing(record, refusals))

    async def handle(event):
        handled.append(event)

    guarded_async = refusing(handle, refusals)
    with pytest.raises(UnorderableEventError):
        asyncio.run(guarded_async({"user": "a", "seq": None}))
    asyncio.run(guarded_async(GOOD))
    assert handled[-1] == GOOD

    # Pickled into every Spark task.
    again = pickle.loads(pickle.dumps(refusing(record, refusals)))
    with pytest.raises(UnorderableEventError):
        again({"user": None, "seq": 1})
