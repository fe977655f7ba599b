"""Keep the test suite's time from creeping back: compare a run's slowest tests with their budget,
measured against the run itself, so that a slower or busier machine never fails it.

``python -m tests.durations_check JUNIT_XML SESSION`` reads the JUnit report (``pytest
--junitxml``) of a whole run of nox session ``SESSION`` (``tests``, ``connectors``) and prints the
slowest tests beside their budgets. The machine's pace is the run's own: the median, over the tests
that have a budget, of each one's time over its budget (:func:`machine_pace`; at least 1: a faster
machine never tightens a budget). A run fails only for what that pace cannot explain:

- a test with a budget took more than :data:`TEST_MARGIN` times it, times the pace, plus
  :data:`TEST_SLACK` seconds (the other budgeted tests ran at their usual pace, this one did not);
- a test without one took more than :data:`UNLISTED` seconds times the pace (the budget lists every
  test slower than that, as recorded).

The whole run's time is reported against its budget, and never fails it: a machine with fewer or
slower cores takes longer in all, and that is the machine.

``--record`` writes the session's budget from the report instead: after a change that makes tests
slower on purpose, and said so in its commit. ``nox -s tests`` and ``nox -s connectors`` run the
check after a whole run.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

BUDGET = Path(__file__).with_name("durations-budget.json")
TEST_MARGIN = 2.0
TEST_SLACK = 10.0
#: Seconds: a test slower than this needs a budget of its own.
UNLISTED = 20.0
#: Budgeted tests a run needs to measure the machine's pace by; with fewer, the pace is 1.
PACE_SAMPLE = 5
#: The slowest tests the report prints.
SHOWN = 10


def read_report(path: Path) -> tuple[float, dict[str, float]]:
    """The run's seconds in all, and each test's, by ``MODULE::NAME`` as the report names them
    (``tests.test_claims::test_x[local]``): the call's alone where the report was written with
    ``-o junit_duration_report=call``, as :func:`run_pytest` in the noxfile writes it."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(float(suite.get("time", 0)) for suite in suites)
    tests = {}
    for case in root.iter("testcase"):
        node = f"{case.get('classname', '')}::{case.get('name', '')}"
        tests[node] = tests.get(node, 0.0) + float(case.get("time", 0))
    return total, tests


def report_name(nodeid: str) -> str:
    """A pytest node id (``tests/test_x.py::test_y[a]``) as the report names it
    (``tests.test_x::test_y[a]``)."""
    path, _, name = nodeid.partition("::")
    return f"{path.removesuffix('.py').replace('/', '.')}::{name}"


def recorded_seconds() -> dict[str, float]:
    """The recorded seconds of every test with a budget, over all sessions, by report name."""
    budgets = json.loads(BUDGET.read_text()) if BUDGET.is_file() else {}
    return {node: seconds for budget in budgets.values() for node, seconds in budget["tests"].items()}


def machine_pace(tests: dict[str, float], budget: dict) -> float:
    """How much slower than its budget this run's machine went: the median, over the tests with a
    budget, of seconds over budget; 1 when fewer than :data:`PACE_SAMPLE` of them ran, and never
    under 1."""
    ratios = sorted(seconds / allowed for node, seconds in tests.items()
                    if (allowed := budget["tests"].get(node)))
    if len(ratios) < PACE_SAMPLE:
        return 1.0
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    return max(1.0, median)


def over_budget(total: float, tests: dict[str, float], budget: dict) -> list[str]:
    """What went past its budget by more than the machine's pace explains, one line each (the
    run's total is never among them: :func:`summary` reports it)."""
    pace = machine_pace(tests, budget)
    at_pace = "" if pace == 1.0 else f" at this run's pace ({pace:.2f}x the budgets)"
    found = []
    for node, seconds in sorted(tests.items(), key=lambda item: -item[1]):
        allowed = budget["tests"].get(node)
        if allowed is None and seconds > UNLISTED * pace:
            found.append(f"{node} took {seconds:.1f} s and has no budget (every test over {UNLISTED:.0f} s"
                         f"{at_pace} needs one)")
        elif allowed is not None and seconds > TEST_MARGIN * allowed * pace + TEST_SLACK:
            found.append(f"{node} took {seconds:.1f} s, over {TEST_MARGIN}x its budget of {allowed:.1f} s"
                         f"{at_pace} plus {TEST_SLACK:.0f} s")
    return found


def summary(total: float, tests: dict[str, float], budget: dict) -> list[str]:
    """The report of a run: its time against its budget, the machine's pace, and the
    :data:`SHOWN` slowest tests beside their budgets."""
    lines = [f"the run took {total:.0f} s (budget {budget['total_seconds']:.0f} s, "
             f"{total / budget['total_seconds']:.2f}x); this machine ran the budgeted tests at "
             f"{machine_pace(tests, budget):.2f}x their budgets (the median)"]
    for node, seconds in sorted(tests.items(), key=lambda item: -item[1])[:SHOWN]:
        allowed = budget["tests"].get(node)
        lines.append(f"  {seconds:7.1f} s  " + ("no budget" if allowed is None else f"budget {allowed:.1f} s")
                     + f"  {node}")
    return lines


def record(total: float, tests: dict[str, float]) -> dict:
    """A budget: the run's total, and every test slower than half :data:`UNLISTED`."""
    slow = {node: round(seconds, 1) for node, seconds in sorted(tests.items(), key=lambda item: -item[1])
            if seconds > UNLISTED / 2}
    return {"total_seconds": round(total), "tests": slow}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.durations_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="the run's JUnit XML report")
    parser.add_argument("session", help="the nox session that ran it")
    parser.add_argument("--record", action="store_true", help="write the session's budget from the report")
    args = parser.parse_args(argv)
    total, tests = read_report(args.report)
    budgets = json.loads(BUDGET.read_text()) if BUDGET.is_file() else {}
    if args.record:
        budgets[args.session] = budget = record(total, tests)
        BUDGET.write_text(json.dumps(budgets, indent=1, sort_keys=True) + "\n")
        print(f"recorded a budget of {total:.0f} s and {len(budget['tests'])} slow tests for {args.session}")
        return 0
    if args.session not in budgets:
        print(f"no budget for session {args.session!r} in {BUDGET} (--record writes one)", file=sys.stderr)
        return 1
    budget = budgets[args.session]
    print("\n".join(summary(total, tests, budget)))
    found = over_budget(total, tests, budget)
    for line in found:
        print(f"over budget: {line}", file=sys.stderr)
    if not found:
        print(f"durations within budget: {len(budget['tests'])} slow tests each within theirs at this "
              f"machine's pace")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
