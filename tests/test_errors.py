"""The adapter's errors (no Spark): one module, classes to catch, what a worker's failure reads as."""

from __future__ import annotations

import datetime
import decimal
import pickle
import warnings

import pytest

import segack.spark_adapter as adapter
from segack.errors import SegackError
from segack.spark_adapter import errors
from tests.outcomes import exactly

REFUSALS = ["OptionError", "InputError", "SessionError", "CheckpointLocationError", "CheckpointError",
            "ForeignInputError", "CheckpointClaimedError", "SegmentChangeError", "TokenError"]


def test_every_error_is_importable_from_the_adapter_and_refines_its_builtin():
    for name in errors.__all__:
        assert getattr(adapter, name) is getattr(errors, name), name
    for name in REFUSALS:
        assert issubclass(getattr(errors, name), (SegackError, ValueError)), name
        assert issubclass(getattr(errors, name), ValueError), name
    assert issubclass(errors.ForeignInputError, errors.CheckpointError)
    assert issubclass(errors.CheckpointClaimedError, errors.CheckpointError)
    for name in ("HandlerFailedError", "ReplayError", "ClaimLostError"):
        error = getattr(errors, name)
        assert issubclass(error, RuntimeError) and issubclass(error, SegackError)
    assert issubclass(errors.ClaimLostError, errors.ReplayError)


def test_a_handler_failure_pickles_with_everything_it_says():
    failure = errors.HandlerFailedError("k", 3, 7, 2, "ValueError: no", "Traceback ...")
    back = pickle.loads(pickle.dumps(failure))
    assert (back.key, back.order, back.position, back.key_group, back.reason, back.traceback) == (
        "k", 3, 7, 2, "ValueError: no", "Traceback ...")
    assert str(back) == str(failure) == (
        "handler failed on the event with key 'k' and order 3 (position 7 of key group 2): ValueError: no")


def test_the_claims_errors_pickle_with_everything_they_say():
    """Over Spark Connect a micro-batch's failure is pickled on the server and raised by the client."""
    from segack.spark_adapter.store.claims import Claim

    mine = Claim(4, "r1", "host-a", 11, 100.0, 130.0, 60.0)
    newer = Claim(5, "r2", "host-b", 12, 140.0, 150.0, 60.0)
    lost = pickle.loads(pickle.dumps(errors.ClaimLostError("/data/ckpt", mine, newer)))
    assert type(lost) is errors.ClaimLostError and lost.newer == newer
    assert str(lost) == ("run r1 lost its claim on checkpoint /data/ckpt: it was taken over by run r2 "
                         "(pid 12 on host-b); this run stopped and saved nothing more")
    claimed = pickle.loads(pickle.dumps(errors.CheckpointClaimedError("/data/ckpt", newer, 152.5)))
    assert type(claimed) is errors.CheckpointClaimedError and claimed.claim == newer
    assert str(claimed).startswith("checkpoint /data/ckpt is claimed by run r2 (pid 12 on host-b), last "
                                   "extended 2.5 s ago.")


def test_a_kafka_records_failure_names_its_topic_partition_and_offset_and_pickles_with_them():
    record = errors.record_of({"key": "u1", "topic": "orders", "partition": 2, "offset": 500, "amount": 5})
    assert record == "orders/2 at offset 500"
    failure = errors.HandlerFailedError("u1", 500, 7, 2, "ValueError: no", "", record)
    back = pickle.loads(pickle.dumps(failure))
    assert back.record == record and str(back) == str(failure) == (
        "handler failed on the event with key 'u1' and order 500 (record orders/2 at offset 500, position 7 "
        "of key group 2): ValueError: no")
    # Events of other sources have none: a file's rows, or a Kafka column missing or null.
    assert errors.record_of({"user": "u1", "seq": 3}) is None
    assert errors.record_of({"topic": "orders", "partition": 2}) is None
    assert errors.record_of({"topic": "orders", "partition": None, "offset": 5}) is None


@pytest.mark.parametrize(("key", "order", "said"), [
    ("acct-7", datetime.datetime(2024, 1, 14, 9, 30, tzinfo=datetime.UTC),
     "key 'acct-7' and order 2024-01-14 09:30:00+00:00"),
    (42, decimal.Decimal("12.50"), "key 42 and order 12.50"),
    (b"k\x00", datetime.date(2024, 1, 14), "key b'k\\x00' and order 2024-01-14"),
    ("two words ", "b", "key 'two words ' and order 'b'"),
])
def test_a_handler_failure_shows_values_as_a_user_wrote_them_strings_quoted(key, order, said):
    failure = errors.HandlerFailedError(key, order, 0, 1, "ValueError: no")
    assert str(failure) == (f"handler failed on the event with {said} (position 0 of key group 1): "
                            f"ValueError: no")


@pytest.mark.parametrize(("error", "line"), [
    (ValueError("a\n\tb  c"), "ValueError: a b c"),
    (KeyError(), "KeyError"),
    (OSError(" \n "), "OSError"),
])
def test_an_error_on_one_line_joins_its_lines_and_names_its_type_alone_when_it_says_nothing(error, line):
    assert errors.one_line(error) == line


@pytest.mark.parametrize(("text", "read"), [
    ("py4j error\nTraceback (most recent call last):\n  File \"x\", line 1\n    f()\nValueError: bad row\n"
     "\tat org.apache.Something", "ValueError: bad row"),
    ("Traceback (most recent call last):\n  one\nKeyError: 'a'\nTraceback (most recent call last):\n  two\n"
     "ModuleNotFoundError: No module named 'h'\n", "ModuleNotFoundError: No module named 'h'"),
    ("Traceback (most recent call last):\n  only indented lines\n",
     "RuntimeError: Traceback (most recent call last):"),
    ("\n\n  the first line that says something\nmore", "RuntimeError: the first line that says something"),
    ("", "RuntimeError"),
    ("Traceback (most recent call last):\n\tat a frame indented by a tab\nKeyError: 'k'\n", "KeyError: 'k'"),
    # A task that failed before its Python ran (as Spark words it when the Python does not exist).
    ("An error occurred while calling o63.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
     "due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent failure: Lost task 0.3 in stage "
     "0.0 (TID 6) (192.0.2.2 executor 0): java.io.IOException: Cannot run program \"/nowhere/python\": "
     "error=2, No such file or directory\n\tat java.lang.ProcessBuilder.start\n",
     'java.io.IOException: Cannot run program "/nowhere/python": error=2, No such file or directory'),
])
def test_a_workers_failure_is_read_out_of_sparks_wrapping(text, read):
    assert errors.worker_error(RuntimeError(text)) == read


@pytest.mark.parametrize(("said", "reason"), [
    # Delta wraps its messages: the sentence is kept whole, the stack trace left out.
    ("An error occurred while calling o52.load.\n: org.apache.spark.sql.delta.DeltaAnalysisException: "
     "[DELTA_X] This operation requires the session to be configured with the\nextension and the catalog.\n"
     "\tat org.apache.spark.sql.delta.DeltaErrors.x(DeltaErrors.scala:1)\n",
     "[DELTA_X] This operation requires the session to be configured with the extension and the catalog."),
    ("[PATH_NOT_FOUND] Path does not exist: /x.\n\nJVM stacktrace:\norg.apache.spark.sql.AnalysisException",
     "[PATH_NOT_FOUND] Path does not exist: /x."),
    ("first reason\nCaused by: java.io.IOException: deeper", "first reason"),
    ("a reason\nJVM stacktrace:\norg.apache.spark.sql.AnalysisException", "a reason"),
    ("a reason\nTraceback (most recent call last):\n  File x", "a reason"),
    ("SQL says no\n== SQL (line 1, position 1) ==\nSELECT", "SQL says no"),
    ("An error occurred while calling o1.load.\n", "An error occurred while calling o1.load.\n"),
    ("", ""),
])
def test_the_reason_in_sparks_error_text_is_its_first_paragraph_on_one_line(said, reason):
    assert errors.spark_reason(said) == reason
    assert errors.spark_reason(RuntimeError(said)) == (reason if reason.strip() and "\n" not in reason
                                                      else "RuntimeError")


def test_the_old_name_of_a_handler_failure_still_works_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert adapter.HandlerFailed is errors.HandlerFailedError
        assert errors.HandlerFailed is errors.HandlerFailedError
    assert [str(warning.message) for warning in caught] == ["HandlerFailed is now HandlerFailedError"] * 2
    assert caught[0].category is DeprecationWarning
    with pytest.raises(AttributeError, match=exactly("module 'segack.spark_adapter.errors' has no attribute "
                                                     "'Nope'")):
        errors.__getattr__("Nope")


def test_a_claimed_checkpoint_says_who_holds_it_since_when_and_what_to_do():
    from segack.spark_adapter.store.claims import Claim

    claim = Claim(3, "run-a", "host-1", 42, 100.0, 110.0, 30.0)
    assert str(errors.CheckpointClaimedError("/ck", claim, 112.5)) == (
        f"checkpoint /ck is claimed by {claim.owner()}, last extended 2.5 s ago. Only one run may use a "
        "checkpoint at a time: wait for that run to end, or, if it is gone, for its claim to expire (30 s "
        "unextended) or for `segack release /ck --force`")
    # A claim extended "after" now (another machine's clock) is not shown as extended in the future.
    assert "last extended 0.0 s ago" in str(errors.CheckpointClaimedError("/ck", claim, 100.0))


def test_a_handler_failure_without_a_traceback_has_an_empty_one():
    assert errors.HandlerFailedError("k", 1, 2, 3, "ValueError: no").traceback == ""


#: Spark 4.2's words for records its Kafka source had to read and Kafka no longer had (a static read
#: of a partition whose records before 80 were deleted, starting at 50), inside Py4J's wrapping.
KAFKA_DATA_LOSS = (
    "An error occurred while calling o36.collectToPython.\n"
    ": org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been lost because they "
    "are not available in Kafka any more;\n"
    "either the data was aged out by Kafka or the topic may have been deleted before all the data in the\n"
    "topic was processed.\n"
    "If you don't want your streaming query to fail on such cases, set the source option failOnDataLoss to "
    "false.\n"
    "Reason: Could not read records in offset [50, 100) for topic partition accounts-lost-0\n"
    "with consumer group spark-kafka-relation-3a0e8846-executor.\n"
    "\tat org.apache.spark.sql.kafka010.KafkaExceptions$.couldNotReadOffsetRange(KafkaExceptions.scala:94)\n"
)


def test_records_gone_from_kafka_are_told_from_other_failures():
    assert errors.kafka_data_loss(RuntimeError(KAFKA_DATA_LOSS)) == (
        "Could not read records in offset [50, 100) for topic partition accounts-lost-0")
    # Another release's wording of the reason, or none: still a loss, said plainly.
    bare = KAFKA_DATA_LOSS.replace("Reason: ", "Cause: ")
    assert errors.kafka_data_loss(RuntimeError(bare)) == "records it had to read are gone"
    assert errors.kafka_data_loss(RuntimeError("Job aborted due to stage failure: Reason: disk full")) is None
    # The reason is the one after Spark's words for the loss, not an earlier one.
    wrapped = "Job aborted due to stage failure. Reason: task lost\n" + KAFKA_DATA_LOSS
    assert errors.kafka_data_loss(RuntimeError(wrapped)).startswith("Could not read records in offset")
