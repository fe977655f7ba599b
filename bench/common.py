"""Timing, tables and result files shared by the benchmark suites."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def best_of(function: Callable[[], Any], repeats: int = 3) -> float:
    """The fastest of ``repeats`` runs, in seconds."""
    fastest = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        fastest = min(fastest, time.perf_counter() - began)
    return fastest


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = [max(len(column), *(len(str(row.get(column, ""))) for row in rows)) for column in columns]
    print(f"\n## {title}\n")
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [str(row.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)]
        print("| " + " | ".join(cells) + " |")


def save(name: str, rows: list[dict[str, Any]]) -> None:
    RESULTS.mkdir(exist_ok=True)
    machine = {"python": sys.version.split()[0], "machine": platform.machine(), "cpus": cpus()}
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


def cpus() -> int:
    return len(os.sched_getaffinity(0))
