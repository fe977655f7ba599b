"""``nox -s mutation``: mutate ``segack.specs`` and the Spark adapter's protocol modules (tokens,
claims, checkpoint files, rescale requests, the dispatcher) with mutmut, run the tests that need
no Spark against each mutant, and check the outcome.

Every mutant must be killed (a test fails, or the tests hang: a timeout), or be listed in
``tests/mutation-equivalents.txt`` with the reason it cannot be killed (it behaves exactly as
the original), or in ``tests/mutation-survivors.txt`` with the reason no fast test kills it (it
does differ: a race's log line, a branch only another file system takes). The session fails
when a mutant survives unlisted, or when the score of an area (killed over mutants not listed as
equivalent: the listed survivors count against it) is below its floor in :data:`FLOORS`. mutmut
keeps its results in ``mutants/``, so a second run only tests what changed.

``python -m tests.mutation_check [--sample] [--children N]``: ``--sample`` tests a fixed twentieth
of the mutants (those whose number ends in 13, 33, 53, 73 or 93), for CI; by default, all of them.

mutmut's main process runs the suite once, then forks a child per mutant from itself; in CI it
once died of a SIGSEGV after 76 mutants (mutmut's own process, not a child testing a mutant).
Should it die of a signal, its Python traceback is in the log (``PYTHONFAULTHANDLER``) and it
runs again: it keeps every result it had, so it goes on with the rest.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "tests" / "mutation-equivalents.txt"
SURVIVORS = ROOT / "tests" / "mutation-survivors.txt"
#: The least share of each area's non-equivalent mutants the tests must kill, by module prefix.
FLOORS = {"segack.specs.": 0.95, "segack.spark_adapter.": 0.90}
#: A fixed twentieth of the mutants: those whose number ends in 13, 33, 53, 73 or 93 (a glob, as
#: mutmut takes it, and the same as a pattern).
SAMPLE = "*__mutmut_*[13579]3"
_SAMPLED = re.compile(r"__mutmut_\d*[13579]3$")
_RESULT = re.compile(r"^\s+(\S+): (.+)$")
_KILLED = {"killed", "timeout"}
_SURVIVED = {"survived", "no tests", "suspicious"}
#: How many times ``mutmut run`` is started, when its main process dies of a signal.
RUNS = 3


def equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """The mutants listed in ``path`` (the equivalents, or the known survivors): name -> why. A
    line is ``NAME  REASON``; ``#`` starts a comment. A line without a reason is an error."""
    listed = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, _, reason = text.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}:{number}: {name} has no reason")
        listed[name] = reason.strip()
    return listed


def run_again_if_signalled(command: list[str], runs: int = RUNS) -> None:
    """Run ``command`` in the project's directory, again (up to ``runs`` times in all) while it dies
    of a signal; an exit code other than 0 ends the session."""
    name = " ".join(command[:2])
    for run in range(1, runs + 1):
        ended = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        if ended.returncode >= 0:
            if ended.returncode:
                raise SystemExit(f"{name} failed (exit code {ended.returncode})")
            return
        print(f"\n{name} died of {signal.Signals(-ended.returncode).name} (run {run} of {runs}); "
              "its results so far are kept", file=sys.stderr, flush=True)
    raise SystemExit(f"{name} died {runs} times")


def results() -> dict[str, str]:
    """mutmut's status of every mutant it has generated."""
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    return {match[1]: match[2].strip() for match in map(_RESULT.match, out.splitlines()) if match}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", action="store_true", help="test a fixed twentieth of the mutants")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once (default: 2)")
    args = parser.parse_args(argv)
    patterns = [SAMPLE] if args.sample else []
    run_again_if_signalled(["mutmut", "run", "--max-children", str(args.children), *patterns])
    statuses = results()
    if args.sample:
        statuses = {name: status for name, status in statuses.items() if _SAMPLED.search(name)}
    listed = equivalents()
    accepted = equivalents(SURVIVORS)
    untested = sorted(name for name, status in statuses.items() if status not in _KILLED | _SURVIVED)
    killed = [name for name, status in statuses.items() if status in _KILLED]
    survived = sorted(name for name, status in statuses.items() if status in _SURVIVED)
    unlisted = [name for name in survived if name not in listed and name not in accepted]
    stale = sorted(name for name in killed if name in listed or name in accepted)
    low = False
    for area, floor in FLOORS.items():
        mine = {name: status for name, status in statuses.items() if name.startswith(area)}
        area_killed = sum(status in _KILLED for status in mine.values())
        area_listed = sum(status in _SURVIVED and name in listed for name, status in mine.items())
        area_accepted = sum(status in _SURVIVED and name in accepted for name, status in mine.items())
        scored = len(mine) - area_listed
        score = area_killed / scored if scored else 1.0
        low = low or score < floor
        print(f"{area.rstrip('.')}: mutants {len(mine)}; killed {area_killed} (timeouts included); "
              f"equivalent {area_listed}; survived {scored - area_killed} ({area_accepted} listed); "
              f"score {score:.1%} of {scored} (floor {floor:.0%})")
    for name in stale:
        print(f"listed but killed now (remove it from {EQUIVALENTS.name} or {SURVIVORS.name}): {name}")
    for name in untested:
        print(f"not tested ({statuses[name]}): {name}")
    for name in unlisted:
        print(f"\nsurvived, not listed: {name} ({statuses[name]})")
        diff = subprocess.run(["mutmut", "show", name], cwd=ROOT, capture_output=True, text=True).stdout
        print(diff.rstrip())
    return 1 if unlisted or untested or low else 0


if __name__ == "__main__":
    sys.exit(main())
