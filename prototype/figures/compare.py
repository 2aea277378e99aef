"""`compare_figure(table, rows, path)`: `python -m prototype compare`'s figure, around its question: per design
and decode speed, end-to-end time per task (p50, p90, every task), time to first token and bytes sent per turn,
and where a turn's API time goes, with the tool time, which dwarfs it, in a panel of its own; one colour per
design in every panel."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import benchmark, metrics
from .style import DESIGN_COLORS

# The API's own work per turn, in the order a turn passes through it (metrics.PRE_INFERENCE, then
# the post-inference work that blocks the terminal event), each drawn with its own hatch: solid, diagonal, dotted,
# horizontal, vertical, crossed, in dark lines that show on every design's colour.
API_PHASES = (*metrics.PRE_INFERENCE, metrics.POST)
PHASE_HATCHES = {metrics.VALIDATE: "", metrics.SAFETY: "///", metrics.RENDER: "..", metrics.ROUTE: "---",
                 metrics.STORE_READ: "|||", metrics.POST: "xx"}
# Where a turn's time goes, coarsely: the client's tool, the model (queue, prefill, decode, hosted
# tools), the API's work, and the rest (network and client).
TURN_PARTS = {
    "tool (client)": ("tool",),
    "model": (metrics.QUEUE, metrics.PREFILL, metrics.DECODE, metrics.HOSTED_TOOL),
    "API": API_PHASES,
    "network + client": ("network_client",),
}
PART_HATCHES = {"tool (client)": "", "model": "..", "API": "///", "network + client": "xx"}
HATCH_COLOR = "#1a1a1a"
HATCH_WIDTH = 0.8
# What every mark of compare's figure means, printed under it [ours].
COMPARE_CAPTION = (
    "Bars: the table's figures, per design and speed: end to end the mean per task (the table's 'vs http' is the ratio "
    "of these means), time to first token the median turn. Black error bars: their 95% intervals, a bootstrap over "
    "the n tasks. Dots: one task each; ▲ with a number: a task above the axis, its end-to-end time in s. Bytes sent: "
    "all the tasks' bytes over all their turns, with the value on each bar. Bottom: the API's stages per turn (each "
    "stage its hatch, the total on top) and a turn's time split into its parts (each part its hatch), in each design's "
    "colour.")


def _color(design: str) -> str:
    return DESIGN_COLORS.get(design, "#937860")


def _groups(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[float], dict[tuple[str, float], list[Mapping[str, Any]]]]:
    order = list(benchmark.ALL_DESIGNS)
    designs = sorted({r["design"] for r in rows}, key=lambda d: order.index(d) if d in order else len(order))
    speeds = sorted({r["decode_tps"] for r in rows})
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["design"], r["decode_tps"]), []).append(r)
    return designs, speeds, groups


def _per_turn(group: Sequence[Mapping[str, Any]], phases: Sequence[str]) -> float:
    """Seconds per turn spent in `phases`, over every turn of the group's tasks."""
    turns = sum(r["turns"] for r in group)
    return sum(r["phase_totals_s"].get(p, 0.0) for r in group for p in phases) / max(turns, 1)


def _estimates(table: Sequence[Mapping[str, Any]], groups: Mapping[tuple[str, float], Sequence[Mapping[str, Any]]],
               design: str, speed: float) -> tuple[Any, Any]:
    """The mean end-to-end time (s) and median TTFT (ms) of one (design, speed) with their intervals: the table's
    when it has them (`benchmark.summarize`), else computed from the task rows the same way."""
    row = next((r for r in table if r.get("design") == design and r.get("decode_tps") == speed and "e2e_mean_s_low" in r), None)
    if row is not None:
        return benchmark.interval_of(row, "e2e_mean_s"), benchmark.interval_of(row, "ttft_p50_ms")
    figures = benchmark.estimates(list(groups[(design, speed)]), None)
    return figures["e2e_mean_s"], figures["ttft_p50_ms"]


def compare_figure(
    table: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    workload: str = "the 'coding' workload",
    clock: str = "virtual time",
) -> Path:
    """compare's figure from its task rows (`benchmark.task_row`) and its table (`benchmark.summarize`), which gives
    the n per point and the estimates with their intervals (computed from the rows where the table lacks them); the
    bars are the table's statistics, so the figure and the table tell one story. `workload` and `clock` go into the
    title ("the 'coding' workload", "virtual time"); a caption under the panels says what every mark means. Writes
    `path` (PNG or SVG by its suffix) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    designs, speeds, groups = _groups(rows)
    n = sorted({r["tasks"] for r in table if "tasks" in r}) or [len(groups.get((designs[0], speeds[0]), []))]
    x = np.arange(len(speeds))
    width = 0.8 / len(designs)

    def offsets(i: int) -> np.ndarray:
        return x - 0.4 + width * (i + 0.5)

    def speed_axis(ax: Any) -> None:
        ax.set_xticks(x, [f"{s:g} tok/s" for s in speeds])
        ax.set_xlim(-0.5, len(speeds) - 0.5)
        ax.grid(axis="y", alpha=0.3)

    def error_bars(ax: Any, xs: np.ndarray, estimates: list[Any], scale: float = 1.0) -> np.ndarray:
        values = np.array([np.nan if e is None else e.value * scale for e in estimates])
        below = np.array([0.0 if e is None else e.error_bar()[0] * scale for e in estimates])
        above = np.array([0.0 if e is None else e.error_bar()[1] * scale for e in estimates])
        ax.errorbar(xs, values, yerr=[below, above], fmt="none", ecolor="black", capsize=3, lw=1)
        return values + above

    fig = plt.figure(figsize=(14, 9.4))
    outer = fig.add_gridspec(2, 1, hspace=0.42)
    top_row = outer[0].subgridspec(1, 3, wspace=0.28)
    bottom_row = outer[1].subgridspec(1, 2, width_ratios=(2, 1), wspace=0.3)
    e2e_ax, ttft_ax, bytes_ax = (fig.add_subplot(top_row[0, i]) for i in range(3))
    api_ax = fig.add_subplot(bottom_row[0, 0])
    turn_ax = fig.add_subplot(bottom_row[0, 1])

    e2e_points: list[tuple[np.ndarray, list[np.ndarray]]] = []
    highest = 0.0
    for i, design in enumerate(designs):
        color = _color(design)
        present = [(design, s) in groups for s in speeds]
        estimates = [_estimates(table, groups, design, s) if here else (None, None) for s, here in zip(speeds, present)]
        e2e = [np.array([r["e2e_s"] for r in groups.get((design, s), [])]) for s in speeds]
        means = [e for e, _ in estimates]
        e2e_ax.bar(offsets(i), [np.nan if e is None else e.value for e in means], width, color=color)
        tops = error_bars(e2e_ax, offsets(i), means)
        highest = max([highest, *(t for t in tops if t == t)])
        e2e_points.append((offsets(i), e2e))

        medians = [t for _, t in estimates]
        ttft_ax.bar(offsets(i), [np.nan if t is None else t.value for t in medians], width, color=color)
        error_bars(ttft_ax, offsets(i), medians)

        sent = []
        for s in speeds:
            group = groups.get((design, s), [])
            turns = sum(r["turns"] for r in group)
            sent.append(sum(r["bytes_sent_per_turn"] * r["turns"] for r in group) / max(turns, 1) / 1000)
        bars = bytes_ax.bar(offsets(i), sent, width, color=color)
        bytes_ax.bar_label(bars, [f"{v:,.0f}" for v in sent], fontsize=7, padding=1)

        bottom = np.zeros(len(speeds))
        for phase in API_PHASES:
            ms = np.array([1000 * _per_turn(groups.get((design, s), []), (phase,)) for s in speeds])
            api_ax.bar(offsets(i), ms, width, bottom=bottom, color=color, hatch=PHASE_HATCHES[phase], edgecolor="white", lw=0.5,
                       hatchcolor=HATCH_COLOR, hatch_linewidth=HATCH_WIDTH)
            bottom += ms
        api_ax.bar_label(api_ax.containers[-1], [f"{v:.0f}" for v in bottom], fontsize=7, padding=1)

    # Every task as a dot; the scale stops a little above the highest interval so the bars stay readable, and a
    # task beyond it is drawn as a triangle on the top edge with its value.
    top = (highest or max(v.max() for _, e2e in e2e_points for v in e2e if v.size)) * 1.15
    for xs, e2e in e2e_points:
        for xj, values in zip(xs, e2e):
            inside, beyond = values[values <= top], values[values > top]
            e2e_ax.scatter(np.full(inside.size, xj), inside, s=6, color="black", alpha=0.35, zorder=3, lw=0)
            if beyond.size:
                e2e_ax.scatter([xj], [top], marker="^", s=18, color="black", zorder=3, clip_on=False)
                e2e_ax.annotate(f"{beyond.max():.0f}", (xj, top), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=6)
    e2e_ax.set_ylim(0, top)
    e2e_ax.set_ylabel("seconds per task")
    e2e_ax.set_title("End to end per task: mean, 95% interval, tasks", fontsize=10, pad=14)
    ttft_ax.set_ylabel("ms per turn")
    ttft_ax.set_title("Time to first token per turn: median, 95% interval", fontsize=10)
    bytes_ax.set_ylabel("kB per turn")
    bytes_ax.set_title("Bytes sent per turn (client to server)", fontsize=10)
    api_ax.set_ylabel("ms per turn")
    api_ax.set_title("Where the API's time goes per turn (total on top); tool time is on the right", fontsize=10)
    api_ax.legend(
        handles=[Patch(facecolor="white", hatch=PHASE_HATCHES[p], edgecolor=HATCH_COLOR, label=p) for p in API_PHASES],
        fontsize=8, ncols=len(API_PHASES), loc="upper right",
    )
    for ax in (e2e_ax, ttft_ax, bytes_ax, api_ax):
        speed_axis(ax)
    api_ax.set_ylim(0, api_ax.get_ylim()[1] * 1.2)  # room for the phase legend

    # A turn's time at the middle speed, split coarsely: the client's tools dominate, which is why
    # the API panel is drawn on its own scale.
    middle = speeds[len(speeds) // 2]
    y = np.arange(len(designs))
    left = np.zeros(len(designs))
    for part, phases in TURN_PARTS.items():
        seconds = np.array([_per_turn(groups.get((d, middle), []), phases) for d in designs])
        turn_ax.barh(y, seconds, 0.6, left=left, color=[_color(d) for d in designs], hatch=PART_HATCHES[part], edgecolor="white",
                     lw=0.5, hatchcolor=HATCH_COLOR, hatch_linewidth=HATCH_WIDTH)
        left += seconds
    for yi, total in zip(y, left):
        turn_ax.text(total, yi, f" {total:.2f} s", va="center", fontsize=8)
    turn_ax.set_yticks(y, designs)
    turn_ax.invert_yaxis()
    turn_ax.set_xlim(0, left.max() * 1.3 if left.size and left.max() > 0 else 1)
    turn_ax.set_xlabel("seconds per turn")
    turn_ax.set_title(f"A turn's time at {middle:g} tok/s", fontsize=10)
    turn_ax.legend(handles=[Patch(facecolor="white", hatch=PART_HATCHES[p], edgecolor=HATCH_COLOR, label=p) for p in TURN_PARTS],
                   fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2)
    turn_ax.grid(axis="x", alpha=0.3)

    fig.legend(handles=[Patch(color=_color(d), label=d) for d in designs], loc="upper right", ncols=len(designs), fontsize=9,
               bbox_to_anchor=(0.98, 0.985))
    tasks = ", ".join(map(str, n))
    noun = "task" if n == [1] else "tasks"
    fig.suptitle(f"compare: {workload}, n = {tasks} {noun} per design and speed, {clock}", x=0.02, ha="left", fontsize=12)
    import textwrap

    fig.text(0.02, 0.015, "\n".join(textwrap.wrap(COMPARE_CAPTION, 215)), ha="left", va="top", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90 if path.suffix == ".png" else None, bbox_inches="tight")
    plt.close(fig)
    return path
