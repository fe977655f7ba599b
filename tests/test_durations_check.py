"""The check that keeps the suite's time from creeping back (``tests/durations_check.py``)."""

from __future__ import annotations

import json

from tests import durations_check

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" time="{total}">
<testcase classname="tests.test_a" name="test_slow[local]" time="{slow}"/>
<testcase classname="tests.test_a" name="test_quick" time="0.5"/>
<testcase classname="tests.test_b.TestMachine" name="runTest" time="{other}"/>
</testsuite></testsuites>
"""
BUDGET = {"total_seconds": 100, "tests": {"tests.test_a::test_slow[local]": 30.0}}


def _report(tmp_path, total=100.0, slow=30.0, other=1.0):
    path = tmp_path / "junit.xml"
    path.write_text(REPORT.format(total=total, slow=slow, other=other))
    return durations_check.read_report(path)


def test_a_run_like_its_budget_passes(tmp_path):
    total, tests = _report(tmp_path)
    assert tests == {"tests.test_a::test_slow[local]": 30.0, "tests.test_a::test_quick": 0.5,
                     "tests.test_b.TestMachine::runTest": 1.0}
    assert durations_check.over_budget(total, tests, BUDGET) == []


def test_only_a_wide_margin_fails(tmp_path):
    # Twice the budget plus ten seconds is allowed; a little more is not.
    assert durations_check.over_budget(*_report(tmp_path, slow=70.0), BUDGET) == []
    [line] = durations_check.over_budget(*_report(tmp_path, slow=70.5), BUDGET)
    assert line.startswith("tests.test_a::test_slow[local] took 70.5 s, over 2.0x its budget of 30.0 s")


def test_a_whole_run_slower_than_its_budget_is_reported_and_never_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(durations_check, "BUDGET", tmp_path / "budget.json")
    (tmp_path / "budget.json").write_text(json.dumps({"tests": BUDGET}))
    report = tmp_path / "junit.xml"
    report.write_text(REPORT.format(total=400.0, slow=30.0, other=1.0))
    assert durations_check.main([str(report), "tests"]) == 0
    shown = capsys.readouterr().out
    assert "the run took 400 s (budget 100 s, 4.00x)" in shown
    assert "     30.0 s  budget 30.0 s  tests.test_a::test_slow[local]" in shown


#: Six budgeted tests: enough to measure a machine's pace by.
PACED = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" time="{total}">
{cases}
<testcase classname="tests.test_b" name="test_unlisted" time="{unlisted}"/>
</testsuite></testsuites>
"""
PACED_BUDGET = {"total_seconds": 300, "tests": {f"tests.test_a::test_{n}": 20.0 + n for n in range(6)}}


def _paced(tmp_path, pace: float, odd_one: float | None = None, unlisted: float = 1.0):
    """A run of :data:`PACED_BUDGET`'s tests, each at ``pace`` times its budget but test 0, at
    ``odd_one`` times it if given."""
    cases = "\n".join(
        f'<testcase classname="tests.test_a" name="test_{n}" '
        f'time="{(20.0 + n) * (odd_one if n == 0 and odd_one is not None else pace)}"/>' for n in range(6))
    path = tmp_path / "junit.xml"
    path.write_text(PACED.format(total=300.0 * pace, cases=cases, unlisted=unlisted))
    return durations_check.read_report(path)


def test_a_machine_three_times_slower_fails_nothing(tmp_path):
    total, tests = _paced(tmp_path, pace=3.0, unlisted=50.0)
    assert durations_check.machine_pace(tests, PACED_BUDGET) == 3.0
    assert durations_check.over_budget(total, tests, PACED_BUDGET) == []


def test_one_test_far_over_its_budget_while_the_others_keep_theirs_fails(tmp_path):
    # At the run's pace of 1.5x, test 0 (budget 20 s) may take 2 x 20 x 1.5 + 10 = 70 s.
    assert durations_check.over_budget(*_paced(tmp_path, pace=1.5, odd_one=3.5), PACED_BUDGET) == []
    [line] = durations_check.over_budget(*_paced(tmp_path, pace=1.5, odd_one=3.6), PACED_BUDGET)
    assert line.startswith("tests.test_a::test_0 took 72.0 s, over 2.0x its budget of 20.0 s at this "
                           "run's pace (1.50x the budgets) plus 10 s")
    # An unlisted test: 20 s times the pace.
    assert durations_check.over_budget(*_paced(tmp_path, pace=1.5, unlisted=30.0), PACED_BUDGET) == []
    [line] = durations_check.over_budget(*_paced(tmp_path, pace=1.5, unlisted=30.5), PACED_BUDGET)
    assert line.startswith("tests.test_b::test_unlisted took 30.5 s and has no budget")


def test_a_faster_machine_never_tightens_a_budget(tmp_path):
    total, tests = _paced(tmp_path, pace=0.5, odd_one=2.0)
    assert durations_check.machine_pace(tests, PACED_BUDGET) == 1.0
    assert durations_check.over_budget(total, tests, PACED_BUDGET) == []


def test_too_few_budgeted_tests_measure_no_pace(tmp_path):
    _, tests = _report(tmp_path, slow=90.0)
    assert durations_check.machine_pace(tests, BUDGET) == 1.0


def test_a_slow_test_without_a_budget_fails(tmp_path):
    assert durations_check.over_budget(*_report(tmp_path, other=20.0), BUDGET) == []
    [line] = durations_check.over_budget(*_report(tmp_path, other=20.5), BUDGET)
    assert line.startswith("tests.test_b.TestMachine::runTest took 20.5 s and has no budget")


def test_a_recorded_budget_lists_every_test_over_half_the_unlisted_limit(tmp_path):
    budget = durations_check.record(*_report(tmp_path, other=10.5))
    assert budget == {"total_seconds": 100, "tests": {"tests.test_a::test_slow[local]": 30.0,
                                                      "tests.test_b.TestMachine::runTest": 10.5}}
    assert durations_check.over_budget(*_report(tmp_path, other=10.5), budget) == []


def test_each_session_has_its_budget_and_one_without_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(durations_check, "BUDGET", tmp_path / "budget.json")
    report = tmp_path / "junit.xml"
    report.write_text(REPORT.format(total=100.0, slow=30.0, other=1.0))
    assert durations_check.main([str(report), "connectors"]) == 1
    assert "no budget for session 'connectors'" in capsys.readouterr().err
    assert durations_check.main([str(report), "connectors", "--record"]) == 0
    assert durations_check.main([str(report), "connectors"]) == 0
    assert durations_check.main([str(report), "tests"]) == 1
    report.write_text(REPORT.format(total=100.0, slow=80.0, other=1.0))
    assert durations_check.main([str(report), "connectors"]) == 1
    assert "tests.test_a::test_slow[local] took 80.0 s" in capsys.readouterr().err
