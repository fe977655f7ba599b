"""Figures and generated pages, built from the installed segack at every docs build."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import segack
from segack.cli import build_parser

HERE = Path(__file__).parent


def segment_tree(out: Path) -> None:
    """Every split from the root down to an uneven set of 6, with ids, masks and shares."""
    live = segack.SegmentSet.balanced(6)
    figure, axis = plt.subplots(figsize=(9, 4.2))
    positions: dict[tuple[int, int], tuple[float, float]] = {}

    def draw(segment: segack.Segment, left: float, right: float, depth: int) -> None:
        x = (left + right) / 2
        positions[(segment.segment_id, segment.mask)] = (x, -depth)
        is_live = segment in live
        axis.text(x, -depth, f"id {segment.segment_id}\nmask {segment.mask:b}\n{segment.share:.1%}",
                  ha="center", va="center", fontsize=8,
                  bbox={"boxstyle": "round", "fc": "#cde" if is_live else "#eee"})
        if not is_live:
            low, high = segment.split()
            for child, (a, b) in ((low, (left, x)), (high, (x, right))):
                axis.plot([x, (a + b) / 2], [-depth - 0.2, -depth - 0.8], color="#888", lw=1)
                draw(child, a, b, depth + 1)

    draw(segack.ROOT, 0.0, 1.0, 0)
    depth = max(-y for _, y in positions.values())
    axis.set_ylim(-depth - 0.6, 0.6)  # room above the root's box for the title
    axis.set_axis_off()
    axis.set_title("SegmentSet.balanced(6): the splits from ROOT; live segments in blue")
    figure.tight_layout()
    figure.savefig(out / "segments.png", dpi=110)
    plt.close(figure)


def acker_timeline(out: Path) -> None:
    """Completions arriving out of order: done runs beyond the committed point, step by step."""
    order = [3, 0, 5, 1, 4, 2, 8, 6, 7, 9]
    acker = segack.OffsetAcker()
    figure, axis = plt.subplots(figsize=(8, 4))
    for step, index in enumerate(order):
        acker.ack(index)
        row = len(order) - step
        committed = acker.next_index
        if committed:
            axis.barh(row, committed, left=0, color="#4a8", height=0.6)
        for first, last in acker.runs():
            axis.barh(row, last - first + 1, left=first, color="#9bd", height=0.6)
        axis.text(10.3, row, f"ack({index}): next_index {committed}, runs {acker.runs()}",
                  va="center", fontsize=8)
    axis.set_yticks([])
    axis.set_xticks(range(11))
    axis.set_xlim(0, 19)
    axis.set_xlabel("index (green: committed; blue: done runs beyond it)")
    axis.set_title("OffsetAcker as completions arrive")
    figure.tight_layout()
    figure.savefig(out / "acker.png", dpi=110)
    plt.close(figure)


def policies(out: Path) -> None:
    """Where ten events of three keys land under each sequencing policy, over 4 segments."""
    segments = segack.SegmentSet.balanced(4)
    events = [{"key": f"user-{k}", "id": f"event-{n}"} for n, k in enumerate([1, 2, 1, 3, 2, 1, 3, 3, 2, 1])]
    chosen = [("per key", segack.PerKeyPolicy()), ("sequential", segack.SequentialPolicy()),
              ("concurrent", segack.ConcurrentPolicy())]
    figure, axes = plt.subplots(1, 3, figsize=(10, 3), sharey=True)
    for axis, (name, policy) in zip(axes, chosen, strict=True):
        owners = [segments.owner_index(segack.java_hash(policy.sequencing_value(event))) for event in events]
        colors = [int(event["key"][-1]) for event in events]
        axis.scatter(range(len(events)), owners, c=colors, cmap="tab10", vmin=0, vmax=9, s=60)
        axis.set_title(name)
        axis.set_xlabel("event")
        axis.set_yticks(range(4))
    axes[0].set_ylabel("segment (colour: key)")
    figure.tight_layout()
    figure.savefig(out / "policies.png", dpi=110)
    plt.close(figure)


def performance(out: Path) -> None:
    """Bar charts of the ratios ``nox -s bench`` saved (copied into docs/perf)."""
    acker = json.loads((HERE / "perf" / "acker.json").read_text())
    rows = [row for row in acker["rows"] if row.get("vs heap", "").endswith("x")
            and row["workload"].startswith("1M")]
    figure, axis = plt.subplots(figsize=(8, 3.2))
    axis.barh([row["acker"] for row in rows], [float(row["vs heap"][:-1]) for row in rows], color="#58a")
    axis.set_xscale("log")
    axis.set_xlabel("speed vs the heapq acker (same run, log scale)")
    axis.set_title(f"1M acks, disorder <= 1000 ({acker['machine']['cpus']} cpus, "
                   f"Python {acker['machine']['python']})")
    figure.tight_layout()
    figure.savefig(out / "perf-acker.png", dpi=110)
    plt.close(figure)
    hashes = json.loads((HERE / "perf" / "hashes.json").read_text())
    figure, axis = plt.subplots(figsize=(8, 3.2))
    figure.set_size_inches(8, 4.2)
    axis.barh([f"{row['what']}\nvs {row['competitor']}" for row in hashes["rows"]],
              [float(row["ratio"].rstrip("x")) for row in hashes["rows"]], color="#a85")
    axis.set_xlabel("speed-up over the competitor (same run)")
    axis.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    # The labels are long: let the saved image grow to hold them rather than cut them.
    figure.savefig(out / "perf-hashes.png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    tables = []
    for name in ("hashes", "acker", "acker-state", "spark-columns", "spark-replay", "spark-checkpoint",
                 "spark-resume"):
        data = json.loads((HERE / "perf" / f"{name}.json").read_text())
        columns = list(dict.fromkeys(key for row in data["rows"] for key in row))
        tables.append(f".. list-table:: {name}\n   :header-rows: 1\n")
        for row in [dict(zip(columns, columns, strict=True)), *data["rows"]]:
            # An en dash: a lone "-" would start a bullet list inside the cell.
            cells = [str(row.get(column, "")) or "\u2013" for column in columns]
            tables.append("   * - " + "\n     - ".join(cells))
        tables.append("")
    (out / "perf-tables.rst").write_text("\n".join(tables) + "\n")


def cli_page(out: Path) -> None:
    """The ``segack`` command's help, every subcommand, from its own argument parser."""
    parser = build_parser()
    lines = ["``segack``", "----------", "", ".. code-block:: text", ""]
    lines += ["   " + line for line in parser.format_help().splitlines()]
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, subparser in actions[0].choices.items():
        title = f"``segack {name}``"
        lines += ["", title, "-" * len(title), "", ".. code-block:: text", ""]
        lines += ["   " + line for line in subparser.format_help().splitlines()]
    (out / "cli.rst").write_text("\n".join(lines) + "\n")


def build_all(out: Path) -> None:
    out.mkdir(exist_ok=True)
    np.random.seed(0)
    segment_tree(out)
    acker_timeline(out)
    policies(out)
    performance(out)
    cli_page(out)
