"""Timelines and phase bars.

* `timeline(ax, records)`: per-turn phase spans of one rollout per design, from the server's
  timing events (`TurnRecord.server_timing`: "spans" [phase, start_ms, end_ms] from "origin_s"),
  with the client's tool runs, the protocol events and what the server keeps across each pause.
* `annotate_tool_call_point(ax, record)`: who answers at the loop's one suspension point.
* `phase_bars(ax, totals_by_label)`: where each design's end-to-end time goes, stacked by phase.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import metrics
from ..analysis import NETWORK_CLIENT, PAUSE, PAUSE_STATE, TOOL, design_of
from ..client.harness import SUSPENDED, RolloutRecord
from .style import PHASE_COLORS, PHASE_LABELS, PHASE_ORDER

# Protocol events worth a tick on a timeline (deltas are too many to draw).
EVENT_MARKS: dict[str, tuple[str, str]] = {
    "response.create": ("create", "v"),
    "response.append": ("append", "v"),
    "response.done": ("done", "^"),
    "response.completed": ("completed", "^"),
    "POST /v1/responses": ("POST", "v"),
}


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

