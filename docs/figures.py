"""Figures and generated pages, built from the installed segack at every docs build."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import segack
from segack.cli.parser import build_parser

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
        axis.text(x, -depth, f"id {segment.segment_id}\nmask {segment.mask}\n{segment.share:.1%}",
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


def replay_pipeline(out: Path) -> None:
    """One replay, stage by stage: key groups, segments, tasks, progress files, checkpoint.

    The key groups each segment owns come from ``SegmentSet.key_group_owners``, so the
    picture follows the package."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    bits = 3
    segments = segack.SegmentSet.balanced(3)
    owners = segments.key_group_owners(bits)
    colors = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5"]
    figure, axis = plt.subplots(figsize=(11, 5.6))
    axis.set_xlim(0, 11)
    axis.set_ylim(0, 5.6)
    axis.set_axis_off()

    def box(x: float, y: float, w: float, h: float, text: str, color: str = "#eef", size: int = 8) -> None:
        axis.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04", fc=color, ec="#667"))
        axis.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(start: tuple[float, float], end: tuple[float, float], text: str = "") -> None:
        axis.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#556"))
        if text:
            axis.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, text, ha="center",
                      fontsize=7, color="#334")

    # 1. Events, each tagged with its key group (a JVM expression over the key's hash).
    axis.text(0.9, 5.35, "1. events, in any layout", ha="center", fontsize=9, weight="bold")
    rng = np.random.default_rng(3)
    for row, group in enumerate(rng.integers(0, 1 << bits, 12)):
        box(0.2, 4.85 - row * 0.38, 1.4, 0.3, f"key group {group}", colors[group], 7)
    axis.text(0.9, 0.05, "kg = hash(key) & (2**K - 1)\ntie = xxhash64(row)", ha="center", fontsize=7)

    # 2. One shuffle: each key group to the partition of the segment that owns it, sorted there.
    axis.text(3.6, 5.35, "2. one shuffle, sorted", ha="center", fontsize=9, weight="bold")
    lanes = []
    for index, member in enumerate(segments):
        y = 3.9 - index * 1.6
        groups = [g for g in range(1 << bits) if owners[g] == index]
        box(2.5, y, 2.2, 1.1, "", "#f6f6fb")
        axis.text(3.6, y + 0.88, f"segment {member.segment_id}, mask {member.mask:#b}", ha="center",
                  fontsize=7.5)
        width = 1.96 / len(groups)
        for slot, group in enumerate(groups):
            box(2.62 + slot * width, y + 0.12, width - 0.1, 0.5, f"kg {group}", colors[group], 7)
        lanes.append(y + 0.55)
        arrow((1.65, 2.6), (2.45, y + 0.55))
    axis.text(3.6, 0.05, "repartitionById(segment)\nsort by (order, key, tie)", ha="center", fontsize=7)

    # 3. A task per segment: positions per key group, the handler in order, commits.
    axis.text(6.0, 5.35, "3. a task per segment", ha="center", fontsize=9, weight="bold")
    for y in lanes:
        box(5.2, y - 0.4, 1.6, 0.8, "position += 1 per kg\nhandler(event)\ncommit per kg", "#e7f1e7", 7)
        arrow((4.75, y), (5.15, y))
    axis.text(6.0, 0.05, "skips what the tokens\ncall done", ha="center", fontsize=7)

    # 4. Progress files, flushed by count and time, and the tasks' results.
    axis.text(8.0, 5.35, "4. progress/", ha="center", fontsize=9, weight="bold")
    for index, y in enumerate(lanes):
        box(7.35, y - 0.3, 1.3, 0.6, f"task {index}: one row\nper key group moved", "#fff4dd", 7)
        arrow((6.85, y), (7.3, y), "flush")

    # 5. The driver folds them into the checkpoint's tokens: one entry per key group.
    axis.text(10.0, 5.35, "5. checkpoint state", ha="center", fontsize=9, weight="bold")
    rows = "\n".join(f"kg {group}: committed point, boundary" for group in range(1 << bits))
    box(9.05, 1.6, 1.9, 2.8, rows, "#fde", 7)
    for y in lanes:
        arrow((8.7, y), (9.0, 3.0))
    axis.text(10.0, 0.05, "merged by the driver on a timer,\nsaved atomically", ha="center", fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "replay-pipeline.png", dpi=110)
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
    tables = [_list_table(name) for name in (
        "hashes", "acker", "acker-state", "spark-columns", "spark-replay", "spark-checkpoint",
        "spark-resume", "spark-concurrency", "spark-planning", "spark-rescale", "spark-claims",
        "sinks-postgres", "sinks-lists", "console", "kafka", "kafka-steady", "kafka-sink")]
    (out / "perf-tables.rst").write_text("\n".join(tables) + "\n")
    (out / "crashes-table.rst").write_text(_list_table("crashes") + "\n")


def _list_table(name: str) -> str:
    """A saved benchmark table (``docs/perf/NAME.json``) as a reStructuredText list table."""
    data = json.loads((HERE / "perf" / f"{name}.json").read_text())
    columns = list(dict.fromkeys(key for row in data["rows"] for key in row))
    lines = [f".. list-table:: {name}\n   :header-rows: 1\n"]
    for row in [dict(zip(columns, columns, strict=True)), *data["rows"]]:
        cells = [_cell(str(row.get(column, ""))) for column in columns]
        lines.append("   * - " + "\n     - ".join(cells))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A table cell: an en dash for nothing (a lone "-" would start a bullet list), command-line
    flags as literal text (Sphinx would make "--" a dash)."""
    if not text:
        return "\u2013"
    return f"``{text}``" if text.startswith("--") else text


def kafka_stream(out: Path) -> None:
    """A Kafka micro-batch: each partition's committed, read and unread offsets, the shuffle to the
    segments (owners from ``SegmentSet.key_group_owners``), the checkpoint, then the commit to
    the consumer group."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

    bits = 3
    segments = segack.SegmentSet.balanced(3)
    owners = segments.key_group_owners(bits)
    figure, axis = plt.subplots(figsize=(11, 5.4))
    axis.set_xlim(0, 11)
    axis.set_ylim(0, 5.4)
    axis.set_axis_off()

    def box(x: float, y: float, w: float, h: float, text: str, color: str, size: float = 7) -> None:
        axis.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04", fc=color, ec="#667"))
        axis.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(start: tuple[float, float], end: tuple[float, float], text: str = "", style: str = "-|>",
              bend: float = 0.0) -> None:
        axis.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color="#556",
                                       connectionstyle=f"arc3,rad={bend}"))
        if text:
            axis.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, text, ha="center",
                      fontsize=7, color="#334")

    # 1. Each partition: committed to the group (handled), this micro-batch's range, not read yet.
    axis.text(1.7, 5.15, "1. the topic's partitions", ha="center", fontsize=9, weight="bold")
    spans = [(0.9, 0.5, 0.4), (1.3, 0.4, 0.2), (0.7, 0.6, 0.5), (1.1, 0.5, 0.1)]
    for partition, (done, batch, lag) in enumerate(spans):
        y = 4.3 - partition * 0.75
        axis.text(0.05, y + 0.15, f"p{partition}", fontsize=8, va="center")
        for left, width, color in ((0.35, done, "#b3de69"), (0.35 + done, batch, "#80b1d3"),
                                   (0.35 + done + batch, lag, "#eeeeee")):
            axis.add_patch(Rectangle((left, y), width, 0.3, fc=color, ec="#667"))
        axis.plot([0.35 + done] * 2, [y - 0.06, y + 0.36], color="#c33", lw=1.5)
    axis.text(1.7, 1.05, "green: below the group's committed offset (red), handled\n"
              "blue: this micro-batch (maxOffsetsPerTrigger)\ngrey: lag, not read yet", ha="center",
              fontsize=7)

    # 2. One shuffle: each record to the segment owning its key's group, sorted by offset there.
    axis.text(5.0, 5.15, "2. a task per segment", ha="center", fontsize=9, weight="bold")
    lanes = []
    for index, member in enumerate(segments):
        y = 4.05 - index * 1.2
        groups = ", ".join(str(g) for g in range(1 << bits) if owners[g] == index)
        box(4.0, y, 2.0, 0.85, f"segment {member.segment_id}, mask {member.mask:#b}\nkey groups {groups}\n"
            "each key's records by offset,\nnever two calls of one key", "#f6f6fb")
        lanes.append(y + 0.42)
        arrow((2.55, 3.1), (3.95, y + 0.42))

    # 3. The checkpoint records the micro-batch complete; only then are the offsets committed.
    axis.text(8.0, 5.15, "3. the checkpoint", ha="center", fontsize=9, weight="bold")
    box(7.1, 2.5, 1.8, 1.6, "micro-batch N complete\none entry per key group\n(its events' positions)",
        "#fde")
    for y in lanes:
        arrow((6.05, y), (7.05, 3.3))
    box(9.3, 2.5, 1.55, 1.6, "consumer group\nGROUP:\neach partition's\nend offset", "#fff4dd")
    arrow((8.95, 3.3), (9.25, 3.3), "then")
    arrow((10.05, 2.45), (3.3, 0.75), bend=-0.1)
    axis.text(5.5, 0.12, "4. the group's offsets committed: the red marks move to the end of the blue, "
              "never ahead of the checkpoint", ha="center", fontsize=8, color="#334")
    figure.tight_layout()
    figure.savefig(out / "kafka-stream.png", dpi=110)
    plt.close(figure)


def cli_page(out: Path) -> None:
    """The ``segack`` command's help, every subcommand, from its own argument parser."""
    parser = build_parser()
    lines = ["``segack``", "~~~~~~~~~~", "", ".. code-block:: text", ""]
    lines += ["   " + line for line in parser.format_help().splitlines()]
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, subparser in actions[0].choices.items():
        title = f"``segack {name}``"
        lines += ["", title, "~" * len(title), "", ".. code-block:: text", ""]
        lines += ["   " + line for line in subparser.format_help().splitlines()]
    (out / "cli.rst").write_text("\n".join(lines) + "\n")


def build_all(out: Path) -> None:
    out.mkdir(exist_ok=True)
    np.random.seed(0)
    segment_tree(out)
    acker_timeline(out)
    policies(out)
    replay_pipeline(out)
    kafka_stream(out)
    performance(out)
    cli_page(out)
