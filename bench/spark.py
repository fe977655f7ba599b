"""Spark benchmarks: filled in with the Spark adapter."""

from __future__ import annotations


def run() -> None:
    print("\n## Spark\n\n(not yet measured)")
