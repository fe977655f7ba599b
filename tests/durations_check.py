"""Keep the test suite's time from creeping back: compare a run's slowest tests with their budget.

``python -m tests.durations_check JUNIT_XML SESSION`` reads the JUnit report (``pytest
--junitxml``) of a whole run of nox session ``SESSION`` (``tests``, ``connectors``) and fails when,
by a wide margin:

- the whole run took more than :data:`TOTAL_MARGIN` times its budget;
- a test with a budget took more than :data:`TEST_MARGIN` times it plus :data:`TEST_SLACK` seconds;
- a test without one took more than :data:`UNLISTED` seconds (the budget lists every test slower
  than that, as recorded).

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
TOTAL_MARGIN = 1.5
TEST_MARGIN = 2.0
TEST_SLACK = 10.0
#: Seconds: a test slower than this needs a budget of its own.
UNLISTED = 20.0


def read_report(path: Path) -> tuple[float, dict[str, float]]:
    """The run's seconds in all, and each test's (setup, call and teardown), by ``MODULE::NAME`` as
    the report names them (``tests.test_claims::test_x[local]``)."""
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


def over_budget(total: float, tests: dict[str, float], budget: dict) -> list[str]:
    """What went past its budget by a wide margin, one line each."""
    found = []
    if total > TOTAL_MARGIN * budget["total_seconds"]:
        found.append(f"the run took {total:.0f} s, over {TOTAL_MARGIN}x its budget of "
                     f"{budget['total_seconds']:.0f} s")
    for node, seconds in sorted(tests.items(), key=lambda item: -item[1]):
        allowed = budget["tests"].get(node)
        if allowed is None and seconds > UNLISTED:
            found.append(f"{node} took {seconds:.1f} s and has no budget (every test over {UNLISTED:.0f} s "
                         f"needs one)")
        elif allowed is not None and seconds > TEST_MARGIN * allowed + TEST_SLACK:
            found.append(f"{node} took {seconds:.1f} s, over {TEST_MARGIN}x its budget of {allowed:.1f} s "
                         f"plus {TEST_SLACK:.0f} s")
    return found


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
    found = over_budget(total, tests, budget)
    for line in found:
        print(f"over budget: {line}", file=sys.stderr)
    if not found:
        print(f"durations within budget: {total:.0f} s in all (budget {budget['total_seconds']:.0f} s), "
              f"{len(budget['tests'])} slow tests each within theirs")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
