"""The options of a run (no Spark): one object, and every place that shows it made from it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from segack._shared import SEQUENCING_POLICIES, VERIFY_CHOICES
from segack.cli.flags import RUN_FLAGS, run_keywords
from segack.cli.parser import build_parser
from segack.errors import SegackTypeError
from segack.kernel import SegmentSet
from segack.spark_adapter import OptionError, foreach_batch, replay
from segack.spark_adapter.options import (
    Handling,
    OnError,
    Policy,
    RunOptions,
    Verify,
    option,
    option_fields,
    takes_options,
)
from segack.spark_adapter.worker.dispatch import ON_ERROR, POLICIES
from tests.outcomes import exactly


def _replay_flags():
    parser = build_parser()
    commands = next(action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction")
    return {action.dest: action for action in commands.choices["replay"]._actions}


def test_the_choices_are_the_ones_the_kernel_and_the_dispatcher_name():
    assert tuple(map(str, Policy)) == SEQUENCING_POLICIES == POLICIES
    assert tuple(map(str, Verify)) == VERIFY_CHOICES
    assert tuple(map(str, OnError)) == ON_ERROR == ("stop", "dead-letter")


@pytest.mark.parametrize(("function", "streams"), [(replay, False), (foreach_batch, True)])
def test_every_option_is_a_keyword_of_the_entry_points_at_its_default_and_documented(function, streams):
    parameters = inspect.signature(function).parameters
    names = [spec.name for spec in option_fields(streams)]
    assert names and all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in names)
    defaults = {name: parameters[name].default for name in names}
    built = RunOptions()
    for name in names:
        holder = built.handling if name in {spec.name for spec in dataclasses.fields(Handling)} else built
        assert defaults[name] == getattr(holder, name), name
    assert ("verify" in parameters) is not streams and ("source" in parameters) is not streams
    doc = function.__doc__
    assert "{options}" not in doc and "Other Parameters\n----------------" in doc
    for spec in option_fields(streams):
        assert f"\n{spec.name} : " in doc, spec.name
        assert spec.metadata["doc"].split()[0] in doc


def test_every_option_with_a_help_text_is_a_flag_of_the_command_with_the_options_default():
    helped = [spec for spec in option_fields() if spec.metadata["help"] is not None]
    assert {spec.name for spec in helped} == set(RUN_FLAGS)
    flags = _replay_flags()
    for spec in helped:
        flag = flags[spec.name]
        assert flag.option_strings == ["--" + spec.name.replace("_", "-")]
        assert flag.help == spec.metadata["help"]
        default = spec.default
        assert flag.default == (str(default) if isinstance(default, (Policy, OnError, Verify)) else default)
    args = build_parser().parse_args(["replay", "in", "--key", "k", "--order", "o", "--handler", "m:f",
                                      "--checkpoint", "c", "--policy", "sequential", "--retries", "2",
                                      "--retry-dead-letters", "--segments", "3"])
    built = RunOptions.from_keywords(run_keywords(args))
    assert built.handling.policy is Policy.SEQUENTIAL and built.handling.retries == 2
    assert built.retry_dead_letters is True and built.segments == SegmentSet.balanced(3)
    bare = ["replay", "in", "--key", "k", "--order", "o", "--handler", "m:f", "--checkpoint", "c"]
    assert RunOptions.from_keywords(run_keywords(build_parser().parse_args(bare))) == RunOptions()


def test_keywords_go_to_their_place_and_choices_become_enums():
    built = RunOptions.from_keywords({"concurrency": 4, "policy": "concurrent", "on_error": "dead-letter",
                                      "verify": "always", "segments": 5, "claim_timeout": 2,
                                      "key_group_bits": 16})
    assert built.handling == Handling(concurrency=4, policy=Policy.CONCURRENT, on_error=OnError.DEAD_LETTER)
    assert built.handling.policy is Policy.CONCURRENT and built.handling.on_error is OnError.DEAD_LETTER
    assert built.handling.pending_bound == 16 and built.handling.dispatched
    assert built.verify is Verify.ALWAYS and built.segments == SegmentSet.balanced(5)
    assert built.claim_timeout == 2.0 and isinstance(built.claim_timeout, float)
    assert RunOptions.from_keywords({"segments": "auto"}).segments == "auto"
    assert RunOptions(segments=1).segments == SegmentSet.balanced(1)
    assert not Handling().dispatched and Handling(timeout=1).dispatched and Handling().pending_bound == 4
    # Lists one call at a time are the task's own loop; with calls in flight, the dispatcher's, whose
    # read-ahead holds four lists per call in flight.
    lists = Handling(batch_size=100, concurrency=2)
    assert not Handling(batch_size=100).dispatched
    assert lists.dispatched and lists.pending_bound == 800
    assert Handling(batch_size=7, max_pending=9).pending_bound == 9


def test_a_name_that_is_no_option_is_refused_as_python_would():
    with pytest.raises(SegackTypeError, match=exactly(
            "replay() got an unexpected keyword argument 'concurency'")):
        RunOptions.from_keywords({"concurency": 4})
    with pytest.raises(SegackTypeError, match=exactly("foreach_batch() got an unexpected keyword argument "
                                                      "'verify'")):
        RunOptions.from_keywords({"verify": "auto"}, streams=True, caller="foreach_batch")
    with pytest.raises(TypeError, match="unexpected keyword argument 'flush'"):
        replay(None, key="k", order="o", handler=print, checkpoint="c", flush=3)


@pytest.mark.parametrize(("keywords", "message"), [
    ({"segments": 0}, "segments must be a positive int, a SegmentSet or 'auto', not 0"),
    ({"segments": "all"}, "segments must be a positive int, a SegmentSet or 'auto', not 'all'"),
    ({"key_group_bits": 17}, "key_group_bits must be an int in 0..16, not 17"),
    ({"flush_every": 0}, "flush_every must be a positive int, not 0"),
    ({"flush_every": 2.0}, "flush_every must be a positive int, not 2.0"),
    ({"flush_interval": 0}, "flush_interval must be a positive float, not 0"),
    ({"flush_interval": True}, "flush_interval must be a positive float, not True"),
    ({"concurrency": 0}, "concurrency must be a positive int, not 0"),
    ({"batch_size": 0}, "batch_size must be a positive int, not 0"),
    ({"batch_size": 2.5}, "batch_size must be a positive int, not 2.5"),
    ({"max_pending": True}, "max_pending must be a positive int, not True"),
    ({"policy": "any"}, "policy must be one of ('per-key', 'sequential', 'concurrent'), not 'any'"),
    ({"retries": -1}, "retries must be a non-negative int, not -1"),
    ({"retries": True}, "retries must be a non-negative int, not True"),
    ({"retries": 1.5}, "retries must be a non-negative int, not 1.5"),
    ({"retry_delay": True}, "retry_delay must be a non-negative number of seconds, not True"),
    ({"retry_delay": "1"}, "retry_delay must be a non-negative number of seconds, not '1'"),
    ({"timeout": True}, "timeout must be a positive number of seconds or None, not True"),
    ({"timeout": "1"}, "timeout must be a positive number of seconds or None, not '1'"),
    ({"max_pending": 0}, "max_pending must be a positive int, not 0"),
    ({"retry_delay": -0.5}, "retry_delay must be a non-negative number of seconds, not -0.5"),
    ({"timeout": 0}, "timeout must be a positive number of seconds or None, not 0"),
    ({"on_error": "skip"}, "on_error must be one of ('stop', 'dead-letter'), not 'skip'"),
    ({"retry_dead_letters": 1}, "retry_dead_letters must be True or False, not 1"),
    ({"shared_local_checkpoint": "yes"}, "shared_local_checkpoint must be True or False, not 'yes'"),
    ({"claim_timeout": 0}, "claim_timeout must be a positive number of seconds, not 0"),
    ({"verify": "never"}, "verify must be one of ('auto', 'always'), not 'never'"),
])
def test_a_bad_value_is_an_option_error_naming_it(keywords, message):
    with pytest.raises(OptionError, match=exactly(message)):
        RunOptions.from_keywords(keywords)


def test_options_are_frozen_and_a_handling_that_is_not_one_is_refused():
    built = RunOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.flush_every = 3  # type: ignore[misc]
    with pytest.raises(OptionError, match=exactly("handling must be a Handling, not 4")):
        RunOptions(handling=4)  # type: ignore[arg-type]
    assert dataclasses.replace(built, retry_dead_letters=True).retry_dead_letters


def _documented(streams):
    """A function given the options' docs and signature now (replay's were given at import)."""

    def run(df, key, **options) -> str:
        """Run it.

        {options}

        Returns
        -------
        str
        """
        return "ran"

    return takes_options(streams=streams)(run)


def test_the_docs_of_an_option_are_its_type_default_and_meaning_wrapped_under_its_name():
    doc = _documented(False).__doc__
    assert doc.startswith("Run it.\n\nOther Parameters\n----------------\nsegments : ")
    assert ("\nretries : int, default ``0``\n    A call that raises is made again up to this many times.\n"
            in doc)
    choices = "{'per-key', 'sequential', 'concurrent'}"
    assert f"\npolicy : {choices}, default ``'per-key'``\n    What may run" in doc
    section = doc[doc.index("Other Parameters\n----------------\n"):doc.index("\nReturns\n")]
    lines = section.splitlines()[2:]
    assert all(len(line) <= 92 for line in lines) and max(map(len, lines)) > 85
    assert all(line.startswith("    ") for line in lines if " : " not in line and line)
    assert "dead-letter" in section and "dead-\n" not in section  # no break inside a word
    assert [line.split(" : ")[0] for line in lines if " : " in line] == [
        spec.name for spec in option_fields()]
    assert "\nverify : " in doc and "\nverify : " not in _documented(True).__doc__
    assert replay.__doc__.count("\nretries : int, default ``0``\n") == 1


def test_the_signature_shows_choices_as_strings_and_keeps_the_other_parameters():
    documented = _documented(False)
    parameters = inspect.signature(documented).parameters
    assert parameters["policy"].annotation == "str" and parameters["policy"].default == "per-key"
    assert type(parameters["policy"].default) is str
    assert parameters["concurrency"].annotation == "int"
    assert parameters["timeout"].annotation == "float | None"
    assert list(parameters)[:3] == ["df", "key", "segments"]
    assert parameters["df"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert parameters["segments"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "options" not in parameters and documented(1, 2, segments=3) == "ran"
    assert inspect.signature(documented).return_annotation == "str"
    assert list(inspect.signature(replay).parameters)[:6] == ["df", "key", "order", "handler", "checkpoint",
                                                              "progress"]
    assert "verify" not in inspect.signature(_documented(True)).parameters

    def undocumented(**options):
        return options

    assert takes_options(streams=True)(undocumented).__doc__ == ""


def test_an_option_field_holds_its_default_dedented_meaning_help_and_metavar():
    spec = option(7, """
        Line one,
          indented.  """, "help %(default)s", "N", streams=False)
    assert spec.default == 7
    assert dict(spec.metadata) == {"doc": "Line one,\n  indented.", "help": "help %(default)s",
                                   "metavar": "N", "streams": False}
    assert dict(option(None, "d").metadata) == {"doc": "d", "help": None, "metavar": None, "streams": True}


def test_an_option_keeps_its_meaning_its_help_and_where_it_applies():
    spec = {field.name: field for field in option_fields()}
    assert spec["verify"].metadata["streams"] is False and spec["retries"].metadata["streams"] is True
    assert spec["retries"].metadata["metavar"] == "R" and spec["method"].metadata["help"] is None
    assert spec["retries"].metadata["doc"] == "A call that raises is made again up to this many times."
    assert spec["retries"].default == 0 and spec["policy"].default is Policy.PER_KEY


class _Batched:
    """A handler that prefers lists, as a sink may."""

    preferred_batch_size = 250

    def __call__(self, events):
        return None


def test_a_handler_without_a_batch_size_gets_the_size_it_prefers_and_an_explicit_one_wins():
    import sqlite3

    from segack.sinks import SqlSink

    assert RunOptions.from_keywords({}, handler=_Batched()).handling.batch_size == 250
    assert RunOptions.from_keywords({"batch_size": 3}, handler=_Batched()).handling.batch_size == 3
    assert RunOptions.from_keywords({}, handler=lambda event: None).handling.batch_size is None
    sink = SqlSink(connect=lambda: sqlite3.connect(":memory:"), apply=lambda cursor, event: None)
    assert RunOptions.from_keywords({}, handler=sink).handling.batch_size == 5000
    one = SqlSink(connect=lambda: sqlite3.connect(":memory:"), apply=lambda cursor, event: None,
                  preferred_batch_size=None)
    assert RunOptions.from_keywords({}, handler=one).handling.batch_size is None


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "10"])
def test_a_sink_refuses_a_preferred_batch_size_that_is_not_a_positive_int(size):
    import sqlite3

    from segack.errors import SegackValueError
    from segack.sinks import SqlSink

    with pytest.raises(SegackValueError, match="preferred_batch_size must be a positive int or None"):
        SqlSink(connect=lambda: sqlite3.connect(":memory:"), apply=lambda cursor, event: None,
                preferred_batch_size=size)


def test_a_handler_that_is_not_callable_is_refused_before_the_options_are_read():
    with pytest.raises(SegackTypeError, match=exactly("handler must be callable")):
        RunOptions.from_keywords({"batch_size": 0}, handler="not a function")
