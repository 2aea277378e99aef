"""Figures: one colour per phase and per design, timelines, phase bars, sweep curves, the
published-results panels and the `compare` figure. Matplotlib is imported by the functions that
draw, never at import time.

* `PHASE_COLORS`: one colour per phase, shared by every figure and every design, so a reader can
  compare a suspended, a chained and an http timeline at a glance.
* `timeline(ax, records)`: per-turn phase spans of one rollout per design, from the server's
  timing events (`TurnRecord.server_timing`: "spans" [phase, start_ms, end_ms] from "origin_s"),
  with the client's tool runs, the protocol events and what the server keeps across each pause.
* `phase_bars(ax, totals_by_label)`: where each design's end-to-end time goes, stacked by phase.
* `sweep_plot(ax, table, key, metric)`: one line per design over a swept parameter.
* `published_plot(axes, rows, trends)`: the published-results notebook's three panels.
* `compare_figure(table, rows, path)`: `python -m prototype compare`'s figure, around its question:
  per design and decode speed, end-to-end time per task (p50, p90, every task), time to first
  token and bytes sent per turn, and where a turn's API time goes, with the tool time, which dwarfs
  it, in a panel of its own; one colour per design in every panel.
* `tornado_figure(panels, path)`: `experiments.sensitivity`'s tornados, one per conclusion: how far
  each assumed parameter moves it from its low to its high end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from . import benchmark, metrics
from .analysis import NETWORK_CLIENT, PAUSE, PAUSE_STATE, TOOL, design_of, series
from .client.harness import CHAINED, SUSPENDED, RolloutRecord

# One colour per phase, for every design [ours]. API work before inference in warm colours, the
# model in blues, tools in greens, post-inference in grey-brown, the wire in light grey.
PHASE_COLORS: dict[str, str] = {
    metrics.VALIDATE: "#fdae61",
    metrics.SAFETY: "#f46d43",
    metrics.RENDER: "#fee08b",
    metrics.ROUTE: "#d53e4f",
    metrics.STORE_READ: "#9e0142",
    metrics.QUEUE: "#bababa",
    metrics.PREFILL: "#74add1",
    metrics.DECODE: "#313695",
    metrics.HOSTED_TOOL: "#1a9850",
    metrics.POST: "#8c510a",
    metrics.POST_OVERLAPPED: "#dfc27d",
    NETWORK_CLIENT: "#e0e0e0",
    TOOL: "#a6d96a",
}

PHASE_ORDER: tuple[str, ...] = metrics.PRE_INFERENCE + (
    metrics.QUEUE, metrics.PREFILL, metrics.DECODE, metrics.HOSTED_TOOL, metrics.POST, metrics.POST_OVERLAPPED,
    NETWORK_CLIENT, TOOL,
)

PHASE_LABELS: dict[str, str] = {
    NETWORK_CLIENT: "network + client",
    TOOL: "client tool",
    metrics.HOSTED_TOOL: "hosted tool (web_search)",
    metrics.POST_OVERLAPPED: "post (overlapped)",
}


DESIGN_COLORS: dict[str, str] = {
    benchmark.HTTP: "#d62728",
    benchmark.HTTP_STORED: "#ff7f0e",
    CHAINED: "#1f77b4",
    SUSPENDED: "#2ca02c",
}

DESIGN_MARKERS: dict[str, str] = {benchmark.HTTP: "o", benchmark.HTTP_STORED: "v", CHAINED: "s", SUSPENDED: "^"}


# Protocol events worth a tick on a timeline (deltas are too many to draw).
EVENT_MARKS: dict[str, tuple[str, str]] = {
    "response.create": ("create", "v"),
    "response.append": ("append", "v"),
    "response.done": ("done", "^"),
    "response.completed": ("completed", "^"),
    "POST /v1/responses": ("POST", "v"),
}



# --- timelines ---------------------------------------------------------------------------------


def turn_spans(record: RolloutRecord) -> list[dict[str, Any]]:
    """Every span of a rollout in seconds since its start: server phases (placed with the server's
    clock origin, which is the client's clock in a virtual-time run), client tool runs, the wait
    of each turn as the client sees it, and the pauses between turns."""
    origin = record.started_at
    spans: list[dict[str, Any]] = []
    for i, turn in enumerate(record.turns):
        end = turn.ended_at if turn.ended_at is not None else turn.sent_at
        spans.append({"lane": "client", "phase": NETWORK_CLIENT, "turn": turn.turn,
                      "start": turn.sent_at - origin, "end": end - origin})
        if turn.tool_seconds:
            spans.append({"lane": "client", "phase": TOOL, "turn": turn.turn,
                          "start": end - origin, "end": end - origin + turn.tool_seconds})
        timing = turn.server_timing or {}
        base = timing.get("origin_s", turn.sent_at)
        for phase, start_ms, end_ms in timing.get("spans", []):
            if end_ms > start_ms:
                spans.append({"lane": "server", "phase": phase, "turn": turn.turn,
                              "start": base + start_ms / 1000 - origin, "end": base + end_ms / 1000 - origin})
        if i + 1 < len(record.turns):
            spans.append({"lane": "server", "phase": PAUSE, "turn": turn.turn, "start": end - origin,
                          "end": record.turns[i + 1].sent_at - origin})
    return spans


def _label(phase: str) -> str:
    return PHASE_LABELS.get(phase, phase)


def timeline(
    ax: Any,
    records: Sequence[RolloutRecord],
    *,
    labels: Sequence[str] | None = None,
    events: bool = True,
    pauses: bool = True,
    legend: bool = True,
    xmax: float | None = None,
) -> None:
    """Draw each rollout as two lanes, server above client, on one shared time axis (seconds since
    the rollout's first request). Server lane: the phases of every turn (PHASE_COLORS) and, between
    turns, a hatched band for what the design keeps across the pause (PAUSE_STATE). Client lane:
    each turn in flight (network + client), then the client's tool run; ticks mark the protocol
    events (create, append, done, completed, POST) and a dot the first token of each turn."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    labels = list(labels or [design_of(r) for r in records])
    yticks, ylabels = [], []
    seen: set[str] = set()
    pause_handles: dict[str, Patch] = {}
    height = 0.7
    for i, record in enumerate(records):
        base = 3.0 * (len(records) - 1 - i)
        y = {"server": base + 1.0, "client": base}
        for span in turn_spans(record):
            lane_y = y[span["lane"]]
            width = span["end"] - span["start"]
            if span["phase"] == PAUSE:
                if not pauses:
                    continue
                short, _, colour = PAUSE_STATE.get(design_of(record), ("pause", "", "#cccccc"))
                ax.broken_barh([(span["start"], width)], (lane_y - height / 2, height), facecolors="white",
                               edgecolors=colour, hatch="///", linewidth=0.8)
                pause_handles.setdefault(design_of(record), Patch(facecolor="white", edgecolor=colour, hatch="///",
                                                                  label=f"{labels[i]}: {short}"))
                continue
            colour = PHASE_COLORS.get(span["phase"], "#999999")
            ax.broken_barh([(span["start"], width)], (lane_y - height / 2, height), facecolors=colour,
                           edgecolors="none")
            seen.add(span["phase"])
        if events:
            origin = record.started_at
            for t, _direction, kind in record.timeline:
                mark = EVENT_MARKS.get(kind)
                if mark is None:
                    continue
                ax.plot([t - origin], [y["client"] + height / 2 + 0.12], marker=mark[1], color="black",
                        markersize=4, linestyle="none")
            for turn in record.turns:
                if turn.first_token_at is not None:
                    ax.plot([turn.first_token_at - origin], [y["client"]], marker="o", color="black", markersize=2.5)
        yticks += [y["server"], y["client"]]
        ylabels += [f"{labels[i]}: server", f"{labels[i]}: client"]
    ax.set_yticks(yticks, ylabels)
    ax.set_xlabel("seconds since the rollout's first request (virtual time)")
    ax.set_xlim(0, xmax if xmax is not None else max(r.seconds for r in records) * 1.02)
    ax.set_ylim(-0.8, 3.0 * (len(records) - 1) + 1.8)
    ax.grid(True, axis="x", alpha=0.3)
    if legend:
        handles = [Patch(facecolor=PHASE_COLORS[p], label=_label(p)) for p in PHASE_ORDER if p in seen]
        handles += list(pause_handles.values())
        if events:
            handles += [
                Line2D([], [], marker="v", color="black", linestyle="none", markersize=4,
                       label="request sent (create, append, POST)"),
                Line2D([], [], marker="^", color="black", linestyle="none", markersize=4,
                       label="turn's last event (done, completed)"),
                Line2D([], [], marker="o", color="black", linestyle="none", markersize=2.5, label="first token"),
            ]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase",
                  title_fontsize=8)


def annotate_tool_call_point(ax: Any, record: RolloutRecord, *, row: int = 0, rows: int = 1) -> None:
    """Name who answers at the loop's one suspension point: the first hosted web_search (the
    server's hosted tool service) and the first client function call (the client, over the socket).
    `row`/`rows` place the record as `timeline` did; the y range grows to make room for the notes."""
    base = 3.0 * (rows - 1 - row)
    spans = turn_spans(record)
    hosted = next((s for s in spans if s["phase"] == metrics.HOSTED_TOOL), None)
    tool = next((s for s in spans if s["phase"] == TOOL), None)
    box = {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.5", "alpha": 0.95}
    arrow = {"arrowstyle": "->", "color": "0.3"}
    low, high = ax.get_ylim()
    xmin, xmax = ax.get_xlim()

    def side(x: float) -> str:  # text grows away from the nearer edge
        return "left" if x < (xmin + xmax) / 2 else "right"

    if hosted is not None:
        x = (hosted["start"] + hosted["end"]) / 2
        ax.annotate("tool_call_point: web_search,\nanswered by the hosted tool service",
                    xy=(x, base + 1.35), xytext=(x, base + 2.1), ha=side(x), va="center", fontsize=7, bbox=box,
                    arrowprops=arrow)
        high = max(high, base + 2.6)
    if tool is not None:
        x = (tool["start"] + tool["end"]) / 2
        who = ("response.done ... response.append" if record.design == SUSPENDED
               else "the response ends; the next request continues")
        ax.annotate(f"tool_call_point: function call,\nanswered by the client ({who})",
                    xy=(x, base - 0.35), xytext=(x, base - 1.05), ha=side(x), va="center", fontsize=7, bbox=box,
                    arrowprops=arrow)
        low = min(low, base - 1.6)
    ax.set_ylim(low, high)


def phase_bars(ax: Any, totals_by_label: Mapping[str, Mapping[str, float]], *, legend: bool = True,
               xlabel: str = "seconds") -> None:
    """Horizontal stacked bars, one per label (a design, say), of seconds per phase."""
    labels = list(totals_by_label)
    ys = np.arange(len(labels))[::-1]
    left = np.zeros(len(labels))
    for phase in PHASE_ORDER:
        values = np.array([totals_by_label[label].get(phase, 0.0) for label in labels])
        if values.sum() <= 0:
            continue
        ax.barh(ys, values, left=left, color=PHASE_COLORS[phase], label=_label(phase), height=0.6)
        left += values
    ax.set_yticks(ys, labels)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))



# --- sweeps ------------------------------------------------------------------------------------


def sweep_plot(
    ax: Any,
    table: Sequence[Mapping[str, Any]],
    key: str,
    metric: str = "e2e_mean_s",
    *,
    designs: Sequence[str] | None = None,
    logx: bool = False,
    logy: bool = False,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    linestyle: str = "-",
    label_suffix: str = "",
) -> None:
    """One line per design of `metric` against the swept `key` (DESIGN_COLORS, DESIGN_MARKERS)."""
    designs = designs or list(dict.fromkeys(r["design"] for r in table))
    for design in designs:
        xs, ys = series(table, key, metric, design)
        if not xs:
            continue
        ax.plot(xs, ys, marker=DESIGN_MARKERS.get(design, "o"), color=DESIGN_COLORS.get(design), linestyle=linestyle,
                label=design + label_suffix, markersize=4)
    if logx:
        log_axis(ax, "x")
    if logy:
        log_axis(ax, "y")
    ax.set_xlabel(xlabel or key)
    ax.set_ylabel(ylabel or metric)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def log_axis(ax: Any, which: str = "x") -> None:
    """Put axis `which` ("x" or "y") of `ax` on a log scale labelled in plain numbers (1, 2, 5, 10,
    20, ...) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def published_plot(axes: Sequence[Any], rows: Sequence[Mapping[str, Any]], trends: Sequence[Mapping[str, Any]],
                   *, agreement_factor: float = 2.0) -> None:
    """Three panels: published vs measured gain per row; implied vs testbed ms per turn, with the
    calibration row's implied value and its agreement band; the chained-over-http gain by decode
    speed (the out-of-sample direction check). The calibration row is hatched."""
    import textwrap

    from matplotlib.patches import Patch

    left, middle, right = axes
    names = [textwrap.shorten(f"{i}: {r['result']}", 80) for i, r in enumerate(rows)]
    names = ["\n".join(textwrap.wrap(n, 36)) for n in names]
    ys = np.arange(len(rows))[::-1]
    h = 0.38
    grey, blue = "#999999", DESIGN_COLORS[CHAINED]
    calibration_patch = Patch(facecolor="white", edgecolor="black", hatch="//", label="calibration row")

    def bars(ax: Any, columns: Sequence[str], scale: float) -> None:
        for j, (column, colour) in enumerate(zip(columns, (grey, blue), strict=True)):
            drawn = ax.barh(ys + (h / 2 if j == 0 else -h / 2), [scale * r[column] for r in rows], h, color=colour,
                            zorder=2)
            for bar, r in zip(drawn, rows, strict=True):
                if r["role"] == "calibration":
                    bar.set_hatch("//")
                    bar.set_edgecolor("black")

    bars(left, ("published_gain", "measured_gain"), 100)
    left.set_yticks(ys, names, fontsize=7)
    left.set_xlabel("gain, % (1 - design / baseline)")
    left.set_title("Published vs testbed gain", fontsize=9)
    left.legend(handles=[Patch(color=grey, label="published"), Patch(color=blue, label="testbed"), calibration_patch],
                fontsize=7, loc="upper right")
    left.grid(True, axis="x", alpha=0.3, zorder=0)

    bars(middle, ("implied_ms_per_turn", "testbed_ms_per_turn"), 1)
    handles = [Patch(color=grey, label="implied by the published gain"),
               Patch(color=blue, label="removed in the testbed")]
    calibration = next((r for r in rows if r["role"] == "calibration"), None)
    if calibration is not None:
        c = calibration["implied_ms_per_turn"]
        middle.axvspan(c / agreement_factor, c * agreement_factor, color="#2ca02c", alpha=0.15, zorder=0)
        middle.axvline(c, color="#2ca02c", linewidth=1, zorder=1)
        handles.append(Patch(color="#2ca02c", alpha=0.3,
                             label=f"calibration's implied value, x/÷{agreement_factor:g}"))
    log_axis(middle, "x")
    middle.set_yticks(ys, [str(i) for i in range(len(rows))])
    middle.set_xlabel("ms per turn (per first token for TTFT rows)")
    middle.set_title("Overhead the published gain implies", fontsize=9)
    middle.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    middle.grid(True, axis="x", which="major", alpha=0.3, zorder=0)

    xs = [t["tok_s"] for t in trends]
    right.plot(xs, [100 * t["gain_chained_vs_http"] for t in trends], marker="s", color=blue)
    log_axis(right, "x")
    right.set_xlabel("decode speed (tokens/s)")
    right.set_ylabel("chained vs http gain, %")
    right.set_ylim(bottom=0)
    right.set_title("Direction check: gain by decode speed", fontsize=9)
    right.grid(True, which="major", alpha=0.3)


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


@attrs.frozen
class TornadoPanel:
    """One conclusion's tornado: its value with every parameter at its default, and each parameter's
    (name, value at the parameter's low end, value at its high end), the others at their defaults. With
    `intervals` (per bar, the low end's and the high end's (low, high)) and `default_interval`, each end carries
    its 95% interval."""

    title: str
    default: float
    bars: tuple[tuple[str, float, float], ...]
    default_interval: tuple[float, float] | None = None
    intervals: tuple[tuple[tuple[float, float], tuple[float, float]], ...] = ()


TORNADO_LOW, TORNADO_HIGH = "#4393c3", "#d6604d"  # a parameter at its low end, at its high end


def tornado(ax: Any, panel: TornadoPanel, *, top: int = 6) -> None:
    """Horizontal bars from the default to each parameter's low-end (blue) and high-end (red) value, the
    widest span on top; parameters that move nothing are left out, and at most `top` are drawn. Where the panel
    has intervals, a black whisker at each end spans its interval and a grey band the default's."""
    kept = [(b, panel.intervals[i] if panel.intervals else None) for i, b in enumerate(panel.bars)
            if b[1] != panel.default or b[2] != panel.default]
    kept = sorted(kept, key=lambda k: -abs(k[0][2] - k[0][1]))[:top]
    y = np.arange(len(kept))
    for yi, ((_, low, high), ends) in zip(y, kept):
        ax.barh(yi, low - panel.default, left=panel.default, color=TORNADO_LOW, height=0.7)
        ax.barh(yi, high - panel.default, left=panel.default, color=TORNADO_HIGH, height=0.7)
        if ends is not None:
            for value, (lo, hi) in ((low, ends[0]), (high, ends[1])):
                ax.errorbar([value], [yi], xerr=[[max(value - lo, 0.0)], [max(hi - value, 0.0)]], fmt="none", ecolor="black",
                            capsize=2, lw=0.8)
    if panel.default_interval is not None:
        ax.axvspan(*panel.default_interval, color="#999999", alpha=0.25, lw=0)
    ax.axvline(panel.default, color="black", lw=0.8)
    ax.set_yticks(y, [k[0][0] for k in kept], fontsize=7)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(panel.title, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    if not kept:
        ax.text(0.5, 0.5, "no parameter moves it", transform=ax.transAxes, ha="center", va="center", fontsize=7)


def tornado_figure(panels: Sequence[TornadoPanel], path: str | Path, *, title: str = "", columns: int = 3) -> Path:
    """One tornado per conclusion (`experiments.sensitivity`), `columns` to a row. Writes `path` (PNG
    or SVG by its suffix) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 2.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        tornado(ax, panel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.legend(handles=[Patch(color=TORNADO_LOW, label="parameter at its low end"),
                        Patch(color=TORNADO_HIGH, label="parameter at its high end")],
               loc="upper right", ncols=2, fontsize=8)
    fig.suptitle(title, x=0.02, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90 if path.suffix == ".png" else None)
    plt.close(fig)
    return path


__all__ = [
    "DESIGN_COLORS", "DESIGN_MARKERS", "EVENT_MARKS", "PHASE_COLORS", "PHASE_LABELS", "PHASE_ORDER",
    "TornadoPanel", "annotate_tool_call_point", "compare_figure", "log_axis", "phase_bars", "published_plot", "sweep_plot",
    "timeline", "tornado", "tornado_figure", "turn_spans",
]
