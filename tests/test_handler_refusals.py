"""The events a run refuses to hand a handler unless it is marked to take them: a stream's event
with no place in its key's order, a Kafka record whose value did not parse."""

from __future__ import annotations

import asyncio
import decimal
import pickle

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from segack.spark_adapter import (
    OptionError,
    Sink,
    UnorderableEventError,
    UnparsedValueError,
    takes_unorderable,
    takes_unparsed,
    with_identity,
)
from segack.spark_adapter.handlers import is_async, orderable_refusal, refusing, wants_identity
from segack.spark_adapter.sources.delta import change_feed_stream_options, is_change_feed
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
    fields = frozenset({"user", "seq"})
    refusals = [unparsed_refusal(schema), orderable_refusal("user", "seq", UNPARSED, fields)]
    unparsed = {"user": None, "seq": None, UNPARSED: "not json"}
    with pytest.raises(UnparsedValueError, match="does not parse"):
        refusing(record, refusals)(unparsed)
    # Taking unparsed records takes their value's nulls too: they are parsing's, not the data's.
    def unparsed_taker(event):
        handled.append(event)

    takes_unparsed(unparsed_taker)
    refusing(unparsed_taker, refusals)(unparsed)
    assert handled == [unparsed]
    with pytest.raises(UnorderableEventError):
        refusing(unparsed_taker, refusals)({"user": None, "seq": 1, UNPARSED: None})
    # A record's own columns are not the value's: a Kafka record without a key is refused, parsed or not.
    by_record = [unparsed_refusal(schema), orderable_refusal("key", "offset", UNPARSED, fields)]
    keyless = {"key": None, "offset": 3, "user": None, "seq": None, UNPARSED: "x"}
    with pytest.raises(UnorderableEventError, match="its key"):
        refusing(unparsed_taker, by_record)(keyless)
    refusing(unparsed_taker, by_record)({**keyless, "key": "k"})


def test_a_value_that_lacks_a_declared_field_is_named_in_the_refusal():
    check = _UnparsedCheck(("user", "seq"))
    with pytest.raises(UnparsedValueError, match=r"lacks 'user', 'seq'\): '\{\"User\": \"a\"\}'"):
        check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: '{"User": "a"}'})
    with pytest.raises(UnparsedValueError, match=r"offset 7 of t/0 does not parse as the value schema: 'x'"):
        check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: "x"})
    check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: None})
    # Deeper than Python's json reads: still the record's refusal, naming it.
    with pytest.raises(UnparsedValueError, match="offset 7 of t/0"):
        check({"offset": 7, "topic": "t", "partition": 0, UNPARSED: "[" * 100_000})


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

    class _AsyncLedger(_Ledger):
        async def __call__(self, events, identities):
            handled.append((events, identities))

    # An async sink stays one: the run awaits what it returns.
    guarded_sink = refusing(_AsyncLedger(), refusals)
    assert is_async(guarded_sink) and isinstance(guarded_sink, Sink)
    assert guarded_sink.preferred_batch_size == 500
    asyncio.run(guarded_sink([GOOD], [2]))
    assert handled[-1] == ([GOOD], [2])
    with pytest.raises(UnorderableEventError):
        asyncio.run(guarded_sink([{"user": None, "seq": 1}], [3]))

    guarded_async = refusing(handle, refusals)
    assert is_async(guarded_async)
    with pytest.raises(UnorderableEventError):
        asyncio.run(guarded_async({"user": "a", "seq": None}))
    asyncio.run(guarded_async(GOOD))
    assert handled[-1] == GOOD

    # Pickled into every Spark task.
    again = pickle.loads(pickle.dumps(refusing(record, refusals)))
    with pytest.raises(UnorderableEventError):
        again({"user": None, "seq": 1})


def test_a_streamed_change_feed_gets_no_admission_limit_and_refuses_one():
    assert is_change_feed("Delta", {"ReadChangeFeed": "TRUE"})
    assert is_change_feed(None, {"readChangeData": "true"})
    assert not is_change_feed("parquet", {"readChangeFeed": "true"})
    assert not is_change_feed("delta", {"readChangeFeed": "false"})
    options = {"readChangeFeed": "true", "startingVersion": "3"}
    # Java's largest int: Delta admits any commit whole (a test of more than 1,000 files is too slow here).
    assert change_feed_stream_options(options) == {**options, "maxFilesPerTrigger": "2147483647"}
    for limit in ("maxFilesPerTrigger", "maxBytesPerTrigger"):
        with pytest.raises(OptionError, match=f"{limit} would let Delta split a commit"):
            change_feed_stream_options({**options, limit: "10"})
