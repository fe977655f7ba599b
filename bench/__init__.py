"""Benchmarks: same-run ratios against competitors (``nox -s bench``)."""
