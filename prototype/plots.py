"""Figures for the notebooks (notebooks/*.py), and the small runners and sentences that go with them.

The notebooks stay thin: they pick parameters, call these functions and `prototype.benchmark`, and
show the result. Everything here runs under virtual time through `benchmark.run_design_virtual`.

* `PHASE_COLORS`: one colour per phase, shared by every figure and every design, so a reader can
  compare a suspended, a chained and an http timeline at a glance.
* `timeline(ax, records)`: per-turn phase spans of one rollout per design, from the server's
  timing events (`TurnRecord.server_timing`: "spans" [phase, start_ms, end_ms] from "origin_s"),
  with the client's tool runs, the protocol events and what the server keeps across each pause.
* `phase_bars(ax, records_by_label)`: where each design's end-to-end time goes, stacked by phase.
* `run_sweep` / `sweep_table` / `sweep_plot`: a parameter sweep over designs, its summary by
  (value, design) and a line plot; `crossover` finds where one curve overtakes another.
* `published_verdict`: the sentences of the published-results notebook, computed from the numbers.
* `markdown_table`, `results_path`, `notebook_test_mode`, `add_repo_to_path`: notebook plumbing;
  `execute_notebook` and `python -m prototype.plots notebooks/*.py` run notebooks headless.

Matplotlib is imported by the functions that draw, never at import time.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import benchmark, metrics
from .client.harness import CHAINED, SUSPENDED, RolloutRecord
from .client.http import DESIGN_NAMES, STATELESS

REPO = Path(__file__).resolve().parent.parent
TEST_MODE_ENV = "TESTBED_NOTEBOOK_TEST"
RESULTS_ENV = "TESTBED_RESULTS"

# --- colours ---------------------------------------------------------------------------------

NETWORK_CLIENT = "network_client"  # the rest of a turn's wall time: network, client, streaming
TOOL = "tool"  # client tool time after a turn
PAUSE = "pause"  # between two turns: the server holds (or not) the state of the rollout

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
# The API's own work (benchmark.API_OVERHEAD_PHASES), for sweeps that lump it together.
API_OVERHEAD_PHASES: tuple[str, ...] = benchmark.API_OVERHEAD_PHASES

DESIGN_COLORS: dict[str, str] = {
    benchmark.HTTP: "#d62728",
    benchmark.HTTP_STORED: "#ff7f0e",
    CHAINED: "#1f77b4",
    SUSPENDED: "#2ca02c",
}
DESIGN_MARKERS: dict[str, str] = {benchmark.HTTP: "o", benchmark.HTTP_STORED: "v", CHAINED: "s", SUSPENDED: "^"}

# What the server keeps while the client runs a tool (README table; docs/parameters.md §4):
# (short label for the figure, longer sentence, colour of the pause band).
PAUSE_STATE: dict[str, tuple[str, str, str]] = {
    SUSPENDED: (
        "Response suspended: coroutine + context + KV held",
        ("the Response itself stays alive, blocked in SamplingLoop.tool_call_point: its context, rendered "
         "tokens and pinned KV wait for response.append; one response id for the whole rollout"),
        "#7b3294",
    ),
    CHAINED: (
        "response ended; connection cache holds it",
        ("the response ended at the client calls; the connection-local cache keeps the previous response, "
         "its items, tools and rendered tokens for the next response.create with previous_response_id"),
        "#5e9fd6",
    ),
    benchmark.HTTP: (
        "response ended; nothing kept",
        ("the response ended at the client calls and the server keeps nothing: the next POST resends the "
         "whole conversation, which is validated, classified and rendered again"),
        "#cccccc",
    ),
    benchmark.HTTP_STORED: (
        "response ended; store record",
        ("the response ended and was written to the response store; the next POST names it with "
         "previous_response_id and the server rebuilds the chain from the store"),
        "#f4a582",
    ),
}



def design_of(record: RolloutRecord) -> str:
    """The benchmark's name of a record's design ("http-stateless" records are benchmark.HTTP)."""
    return benchmark.HTTP if record.design == DESIGN_NAMES[STATELESS] else record.design


# Protocol events worth a tick on a timeline (deltas are too many to draw).
EVENT_MARKS: dict[str, tuple[str, str]] = {
    "response.create": ("create", "v"),
    "response.append": ("append", "v"),
    "response.done": ("done", "^"),
    "response.completed": ("completed", "^"),
    "POST /v1/responses": ("POST", "v"),
}


# --- notebook plumbing -------------------------------------------------------------------------


def notebook_test_mode() -> bool:
    """True when TESTBED_NOTEBOOK_TEST is set to a true value: notebooks shrink to a smoke test."""
    return os.environ.get(TEST_MODE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def add_repo_to_path() -> Path:
    """Put the repository on sys.path so `experiments` imports from any working directory (a
    notebook server started in notebooks/, say); returns the repository root."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return REPO


def results_path(name: str = "") -> Path:
    """A path in the results folder: $TESTBED_RESULTS, else <repo>/results (git-ignored), as
    experiments/common.py. The folder is created."""
    folder = Path(os.environ.get(RESULTS_ENV, REPO / "results"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name if name else folder


def execute_notebook(path: str | Path, output: str | Path | None = None, *, timeout: float = 600.0) -> float:
    """Run a jupytext notebook (py:percent) top to bottom in a fresh `python3` kernel of this
    environment, with the repository as working directory, and write the executed notebook to
    `output` (default: the results folder, <name>.ipynb). Returns the wall time in seconds. Needs
    the test extra (jupytext, nbclient, ipykernel). Raises nbclient's CellExecutionError when a
    cell fails."""
    import time

    import jupytext
    import nbclient
    import nbformat

    path = Path(path)
    nb = jupytext.read(path)
    started = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    seconds = time.perf_counter() - started
    nbformat.write(nb, str(output or results_path(f"{path.stem}.ipynb")))
    return seconds


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   formats: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    """A Markdown table of `rows` (display it with IPython.display.Markdown)."""
    columns = list(columns or rows[0])
    formats = formats or {}
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [formats.get(c, _fmt)(row.get(c, "")) for c in columns]
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


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


def phase_totals(record: RolloutRecord) -> dict[str, float]:
    """Seconds per phase over the whole rollout (benchmark.turn_phases summed over turns)."""
    totals: dict[str, float] = {}
    for phases in benchmark.turn_phases(record):
        for phase, seconds in phases.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    return totals


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


def state_table(records: Sequence[RolloutRecord]) -> list[dict[str, Any]]:
    """Per design: what the server keeps across a pause, and what the run shows of it."""
    rows = []
    for record in records:
        turns = record.turns
        rows.append({
            "design": design_of(record),
            "kept across the pause": PAUSE_STATE.get(design_of(record), ("?", "", ""))[0],
            "response ids": len(record.response_ids),
            "turns": len(turns),
            "e2e s": record.seconds,
            "API work s": sum(phase_totals(record).get(p, 0.0) for p in API_OVERHEAD_PHASES),
            "bytes sent / turn": statistics.fmean(t.bytes_sent for t in turns),
            "cached input share": record.usage["cached_tokens"] / max(1, record.usage["input_tokens"]),
        })
    return rows


# --- sweeps --------------------------------------------------------------------------------------


def _run_job(job: tuple[str, float, benchmark.BenchConfig]) -> list[dict[str, Any]]:
    design, tps, config = job
    return [benchmark.task_row(design, tps, r) for r in benchmark.run_design_virtual(design, tps, config)]


def run_sweep(
    name: str,
    values: Iterable[Any],
    configure: Callable[[Any], tuple[float, benchmark.BenchConfig]],
    *,
    designs: Sequence[str] = benchmark.DESIGNS,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """Run every design at every value of a swept parameter; `configure(value)` returns the decode
    speed and the BenchConfig for that value. Returns benchmark.task_row rows with the swept value
    under `name`. With jobs > 1 the (value, design) runs go to that many spawned worker processes
    (each run is still deterministic under its own virtual clock)."""
    values = list(values)
    jobs_list = []
    for value in values:
        tps, config = configure(value)
        jobs_list += [((value, design), (design, float(tps), config)) for design in designs]
    if jobs > 1 and len(jobs_list) > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(min(jobs, len(jobs_list))) as pool:
            results = pool.map(_run_job, [job for _, job in jobs_list])
    else:
        results = [_run_job(job) for _, job in jobs_list]
    rows = []
    for ((value, _design), _job), task_rows in zip(jobs_list, results, strict=True):
        for row in task_rows:
            rows.append({name: value, **row})
    return rows


def sweep_table(rows: Sequence[Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per (swept value, design): mean and p50 end-to-end time per task, speed-up over http
    at the same value (ratio of total times), per-turn TTFT p50, and per turn: API work, model time
    (queue, prefill, decode), hosted and client tool time, network + client time."""
    groups: dict[tuple[Any, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row[key], row["design"]), []).append(row)
    table = []
    for (value, design), group in groups.items():
        e2e = np.array([r["e2e_s"] for r in group])
        turns = sum(r["turns"] for r in group)

        def per_turn(phases: Sequence[str], group=group, turns=turns) -> float:
            return sum(r["phase_totals_s"].get(p, 0.0) for r in group for p in phases) / turns

        http = groups.get((value, benchmark.HTTP))
        ttft = np.concatenate([r["ttft_s"] for r in group]) if any(r["ttft_s"] for r in group) else np.array([math.nan])
        table.append({
            key: value,
            "design": design,
            "tasks": len(group),
            "e2e_mean_s": float(e2e.mean()),
            "e2e_p50_s": float(np.percentile(e2e, 50)),
            "speedup_vs_http": float(sum(r["e2e_s"] for r in http) / e2e.sum()) if http else math.nan,
            "gain_vs_http": float(1 - e2e.sum() / sum(r["e2e_s"] for r in http)) if http else math.nan,
            "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
            "api_s_per_turn": per_turn(API_OVERHEAD_PHASES),
            "model_s_per_turn": per_turn((metrics.QUEUE, metrics.PREFILL, metrics.DECODE)),
            "decode_s_per_turn": per_turn((metrics.DECODE,)),
            "tool_s_per_turn": per_turn((TOOL, metrics.HOSTED_TOOL)),
            "network_s_per_turn": per_turn((NETWORK_CLIENT,)),
            "api_share": float(sum(r["api_overhead_s"] for r in group) / e2e.sum()),
        })
    order = {d: i for i, d in enumerate(benchmark.ALL_DESIGNS)}
    table.sort(key=lambda r: (r[key], order.get(r["design"], 99)))
    return table


def series(table: Sequence[Mapping[str, Any]], key: str, metric: str, design: str) -> tuple[list[Any], list[float]]:
    """(values, metric) of one design in a sweep table, in the order of the swept values."""
    mine = sorted((r for r in table if r["design"] == design), key=lambda r: r[key])
    return [r[key] for r in mine], [r[metric] for r in mine]


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


def crossover(xs: Sequence[float], a: Sequence[float], b: Sequence[float], *, logx: bool = True) -> float | None:
    """The first x at which curve `a` reaches curve `b` (a - b changes sign from negative to
    non-negative), interpolated linearly (in log x when `logx`); None if it never does in range,
    and xs[0] if `a` >= `b` already at the first point."""
    diff = [ai - bi for ai, bi in zip(a, b, strict=True)]
    if not diff:
        return None
    if diff[0] >= 0:
        return float(xs[0])
    for i in range(1, len(diff)):
        if diff[i] >= 0 > diff[i - 1]:
            x0, x1 = (math.log(xs[i - 1]), math.log(xs[i])) if logx else (xs[i - 1], xs[i])
            x = x0 + (x1 - x0) * (-diff[i - 1]) / (diff[i] - diff[i - 1])
            return float(math.exp(x) if logx else x)
    return None


# --- the published-results notebook --------------------------------------------------------------

GAIN_TOLERANCE = 0.05  # a measured gain within 5 points of the published one "matches" [ours]


def published_verdict(row: Mapping[str, Any], *, tolerance: float = GAIN_TOLERANCE, ceiling: bool | None = None) -> str:
    """Sentences for one row of experiments.published, computed from its numbers: how the measured
    gain compares with the published one (for an "up to" figure, `ceiling`, a smaller measured gain
    is consistent with it) and how the per-turn overhead the published gain implies compares with
    the testbed's own and with the calibration row's (its `implied_vs_calibration`). `ceiling`
    defaults to whether the result's name says "up to"."""
    if ceiling is None:
        ceiling = "up to" in str(row["result"]).lower()
    metric = "end-to-end time" if row["metric"] == "e2e" else "time to first token (p50)"
    published, measured = row["published_gain"], row["measured_gain"]
    diff = measured - published
    parts = [(f"{row['compare']} at {row['tok_s']:g} tokens/s, {row['turns']:g} turns: the testbed cuts {metric} by "
              f"{100 * measured:.0f}% against the published {100 * published:.0f}%")]
    if abs(diff) <= tolerance:
        parts.append(f"within {100 * tolerance:.0f} points: the testbed matches")
    elif diff > 0:
        parts.append(f"{100 * diff:.0f} points more than published: the testbed overstates this gain")
    elif ceiling:
        parts.append(f"{100 * -diff:.0f} points less, which an 'up to' figure allows: the published value is a "
                     "ceiling, not a typical value")
    else:
        parts.append(f"{100 * -diff:.0f} points less than published: the testbed understates this gain")
    sentence = parts[0] + " (" + "; ".join(parts[1:]) + ")."
    testbed, implied = row["testbed_ms_per_turn"], row["implied_ms_per_turn"]
    ratio = testbed / implied if implied else math.inf
    sentence += (f" Read through the testbed's model, the published gain implies {implied:.0f} ms of removable "
                 f"overhead per {'turn' if row['metric'] == 'e2e' else 'first token'}; the testbed removes "
                 f"{testbed:.0f} ms, {ratio:.2f}x that.")
    verdict = str(row.get("implied_vs_calibration", "-"))
    if verdict == "calibration":
        sentence += (" This is the calibration row: the default cost knobs were chosen near it, so agreement here "
                     "confirms nothing; it anchors the other rows.")
    elif verdict.endswith("DISAGREES"):
        sentence += (f" Against the calibration row's implied overhead it is {verdict.split()[0]}: outside the "
                     "agreement band, so this figure and the calibration figure cannot both hold under one set of "
                     "knobs of the testbed's model.")
    elif verdict.endswith("agrees"):
        sentence += (f" Against the calibration row's implied overhead it is {verdict.split()[0]}: inside the "
                     "agreement band, consistent with one set of knobs.")
    return sentence


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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m prototype.plots notebooks/*.py`: execute each notebook at the size its parameters
    cell sets (test mode if TESTBED_NOTEBOOK_TEST=1) into the results folder, with its wall time."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("notebooks", nargs="+", help="jupytext py:percent notebooks")
    args = parser.parse_args(argv)
    for notebook in args.notebooks:
        seconds = execute_notebook(notebook)
        print(f"{notebook}: executed in {seconds:.1f} s -> {results_path(Path(notebook).stem + '.ipynb')}", flush=True)
    return 0


__all__ = [
    "API_OVERHEAD_PHASES", "DESIGN_COLORS", "DESIGN_MARKERS", "EVENT_MARKS", "GAIN_TOLERANCE", "NETWORK_CLIENT",
    "PAUSE", "PAUSE_STATE", "PHASE_COLORS", "PHASE_LABELS", "PHASE_ORDER", "REPO", "TOOL", "add_repo_to_path",
    "annotate_tool_call_point", "crossover", "design_of", "execute_notebook", "log_axis", "main", "markdown_table",
    "notebook_test_mode", "phase_bars", "phase_totals", "published_plot", "published_verdict", "results_path",
    "run_sweep", "series", "state_table", "sweep_plot", "sweep_table", "timeline", "turn_spans",
]


if __name__ == "__main__":
    raise SystemExit(main())
