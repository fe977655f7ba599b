"""The check that keeps the suite's time from creeping back (``tests/durations_check.py``)."""

from __future__ import annotations

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
    [line] = durations_check.over_budget(*_report(tmp_path, total=151.0), BUDGET)
    assert line.startswith("the run took 151 s, over 1.5x its budget of 100 s")


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
