"""The mutation session's driver, ``tests/mutation_check.py``."""

from __future__ import annotations

import sys

import pytest

from tests.mutation_check import run_again_if_signalled

# Adds an x to the file it is given, then dies of a SIGSEGV unless the file holds three.
CRASHES_TWICE = """
import os, signal, sys
with open(sys.argv[1], "a") as runs:
    runs.write("x")
with open(sys.argv[1]) as runs:
    if len(runs.read()) < 3:
        os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_run_that_dies_of_a_signal_runs_again_and_one_that_fails_ends_the_session(tmp_path, capfd):
    runs = tmp_path / "runs"
    run_again_if_signalled([sys.executable, "-c", CRASHES_TWICE, str(runs)])
    assert runs.read_text() == "xxx"
    told = capfd.readouterr().err
    assert "died of SIGSEGV (run 1 of 3)" in told and "died of SIGSEGV (run 2 of 3)" in told
    assert "Fatal Python error: Segmentation fault" in told  # where it died, for whoever reads the log
    runs.unlink()
    with pytest.raises(SystemExit, match=r"died 2 times$"):
        run_again_if_signalled([sys.executable, "-c", CRASHES_TWICE, str(runs)], runs=2)
    assert runs.read_text() == "xx"
    with pytest.raises(SystemExit, match=r"failed \(exit code 3\)$"):
        run_again_if_signalled([sys.executable, "-c", "raise SystemExit(3)"])
