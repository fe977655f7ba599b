"""``python -m bench [hashes] [acker] [spark] [sinks] [console] [kafka] [latency] [kafka-sink]
[formats] [crashes]``: same-run ratios against competitors (``crashes``, not run by default, counts
what a crash costs a handler instead; ``kafka``, ``latency``, ``kafka-sink`` and ``formats``, not
run by default either, need the PySpark Spark's Kafka connector is released for).

Every table times segack and its competitor in this one process, on the same
input, and prints the ratio; absolute times on shared machines are noise, the
ratio is the result. Each timing is the best of a few repeats. Results are also
written as JSON to ``bench/results/`` for the docs' plots.
"""

from __future__ import annotations

import os
import sys

# OpenBLAS worker threads spin on the other core after NumPy calls and steal time
# from the single-threaded loops timed here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from bench.common import cpus


def main(argv: list[str]) -> int:
    from bench import acker, console, crashes, formats, hashes, kafka, kafka_out, latency, sinks, spark

    suites = {"hashes": hashes.run, "acker": acker.run, "spark": spark.run, "sinks": sinks.run,
              "console": console.run, "kafka": kafka.run, "latency": latency.run, "kafka-sink": kafka_out.run,
              "formats": formats.run, "crashes": crashes.run}
    chosen = argv or ["hashes", "acker", "spark", "sinks", "console"]
    unknown = [name for name in chosen if name not in suites]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; choose from {', '.join(suites)}")
        return 2
    print(f"# segack benchmarks (python {sys.version.split()[0]}, {cpus()} cpus)")
    for name in chosen:
        suites[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
