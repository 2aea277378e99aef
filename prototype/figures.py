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
* `compare_figure(table, rows, path)`: `python -m prototype compare`'s results/compare.png.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def compare_figure(table: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """End-to-end p50 per design and speed (left), and the share of end-to-end time per phase (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    designs = list(dict.fromkeys(r["design"] for r in table))
    speeds = sorted({r["decode_tps"] for r in table})
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(designs)
    for i, design in enumerate(designs):
        p50 = [next(r["e2e_p50_s"] for r in table if r["design"] == design and r["decode_tps"] == s) for s in speeds]
        left.bar([x + i * width for x in range(len(speeds))], p50, width, label=design)
    left.set_xticks([x + width * (len(designs) - 1) / 2 for x in range(len(speeds))], [f"{s:g} tok/s" for s in speeds])
    left.set_ylabel("end-to-end time per task, p50 (s)")
    left.set_title("End to end")
    left.legend()
    phases = ["prefill", "decode", "tool", "network_client", "validate", "safety", "render", "route", "store_read", "post", "hosted_tool", "queue"]
    labels, bottoms = [], None
    shares = {}
    for design in designs:
        for s in speeds:
            group = [r for r in rows if r["design"] == design and r["decode_tps"] == s]
            total = sum(r["e2e_s"] for r in group)
            shares[(design, s)] = {p: sum(r["phase_totals_s"].get(p, 0.0) for r in group) / total for p in phases}
            labels.append(f"{design}\n{s:g}")
    bottoms = np.zeros(len(labels))
    for phase in phases:
        values = np.array([shares[(d, s)][phase] for d in designs for s in speeds])
        if values.sum() > 0:
            right.bar(range(len(labels)), values, 0.7, bottom=bottoms, label=phase)
            bottoms += values
    right.set_xticks(range(len(labels)), labels, fontsize=7)
    right.set_ylabel("share of end-to-end time")
    right.set_title("Where the time goes")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = [
    "DESIGN_COLORS", "DESIGN_MARKERS", "EVENT_MARKS", "PHASE_COLORS", "PHASE_LABELS", "PHASE_ORDER",
    "annotate_tool_call_point", "compare_figure", "log_axis", "phase_bars", "published_plot", "sweep_plot", "timeline",
    "turn_spans",
]
