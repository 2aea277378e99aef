"""What the sweep runner does not absorb: the tables, series and sentences computed from rows.

* `print_table` / `markdown_table`: rows as a plain-text table (experiments, `compare`) or Markdown
  (notebooks), one cell format (`format_value`);
* `design_of`, `phase_totals`, `state_table`: per-rollout summaries, and what each design keeps
  across a pause (`PAUSE_STATE`);
* `sweep_table`, `series`, `crossover`: a parameter sweep's rows (benchmark.design_sweep) by
  (value, design), one design's curve, and where one curve overtakes another;
* `published_verdict`: the sentences of the published-results notebook, computed from the numbers.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import benchmark, metrics, uncertainty
from .client.harness import CHAINED, SUSPENDED, RolloutRecord
from .client.http import DESIGN_NAMES, STATELESS

NETWORK_CLIENT = "network_client"  # the rest of a turn's wall time: network, client, streaming

TOOL = "tool"  # client tool time after a turn

PAUSE = "pause"  # between two turns: the server holds (or not) the state of the rollout

# The API's own work (benchmark.API_OVERHEAD_PHASES), for sweeps that lump it together.
API_OVERHEAD_PHASES: tuple[str, ...] = benchmark.API_OVERHEAD_PHASES

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


# --- tables ---------------------------------------------------------------------------------------


def format_value(value: Any) -> str:
    """A cell of a table: floats to three decimals (no decimals from 1,000 on), NaN as "-"."""
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """`rows` as a CSV file, the columns of the first row."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                formats: Mapping[str, Callable[[Any], str]] | None = None, headers: Mapping[str, str] | None = None) -> None:
    """A plain-text table of `rows` on stdout, right-aligned columns; `formats` and `headers` per column
    (default: `format_value` and the column's name)."""
    columns = list(columns or rows[0])
    formats, headers = formats or {}, headers or {}
    titles = [headers.get(c, c) for c in columns]
    cells = [[formats.get(c, format_value)(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(t), *(len(r[i]) for r in cells)) for i, t in enumerate(titles)]
    print("  ".join(t.rjust(w) for t, w in zip(titles, widths)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   formats: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    """A Markdown table of `rows` (display it with IPython.display.Markdown)."""
    columns = list(columns or rows[0])
    formats = formats or {}
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [formats.get(c, format_value)(row.get(c, "")) for c in columns]
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def phase_totals(record: RolloutRecord) -> dict[str, float]:
    """Seconds per phase over the whole rollout (benchmark.turn_phases summed over turns)."""
    totals: dict[str, float] = {}
    for phases in benchmark.turn_phases(record):
        for phase, seconds in phases.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    return totals


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


# --- sweeps -----------------------------------------------------------------------------------------


def sweep_table(rows: Sequence[Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per (swept value, design): mean and p50 end-to-end time per task, speed-up over http
    at the same value (ratio of total times) and the gain (1 - total time / http's, with its 95% interval over the
    tasks where http ran the same tasks), per-turn TTFT p50, and per turn: API work, model time
    (queue, prefill, decode), prefill alone, hosted and client tool time, network + client time; the share of
    input tokens found in the prefix cache."""
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
            **_gain_interval(group, http),
            "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
            "api_s_per_turn": per_turn(API_OVERHEAD_PHASES),
            "model_s_per_turn": per_turn((metrics.QUEUE, metrics.PREFILL, metrics.DECODE)),
            "prefill_s_per_turn": per_turn((metrics.PREFILL,)),
            "cached_share": benchmark._ratio(group, "cached_tokens", "input_tokens"),
            "decode_s_per_turn": per_turn((metrics.DECODE,)),
            "tool_s_per_turn": per_turn((TOOL, metrics.HOSTED_TOOL)),
            "network_s_per_turn": per_turn((NETWORK_CLIENT,)),
            "api_share": float(sum(r["api_overhead_s"] for r in group) / e2e.sum()),
        })
    order = {d: i for i, d in enumerate(benchmark.ALL_DESIGNS)}
    table.sort(key=lambda r: (r[key], order.get(r["design"], 99)))
    return table


def _gain_interval(group: Sequence[Mapping[str, Any]], http: Sequence[Mapping[str, Any]] | None) -> dict[str, float]:
    """The gain over http's 95% interval over the tasks (`gain_vs_http_low`, `_high`), resampling each task's two runs
    together; NaN unless http ran the same tasks in the same order, or with a single task."""
    if not http or len(group) < 2 or [r.get("task") for r in http] != [r.get("task") for r in group]:
        return {"gain_vs_http_low": math.nan, "gain_vs_http_high": math.nan}
    mine, theirs = uncertainty.unit_total([r["e2e_s"] for r in group]), uncertainty.unit_total([r["e2e_s"] for r in http])
    gain = uncertainty.resample(len(group), lambda counts: 1 - mine(counts) / theirs(counts), method="paired bootstrap")
    return {"gain_vs_http_low": gain.low, "gain_vs_http_high": gain.high}


def series(table: Sequence[Mapping[str, Any]], key: str, metric: str, design: str) -> tuple[list[Any], list[float]]:
    """(values, metric) of one design in a sweep table, in the order of the swept values."""
    mine = sorted((r for r in table if r["design"] == design), key=lambda r: r[key])
    return [r[key] for r in mine], [r[metric] for r in mine]


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


def published_verdict(row: Mapping[str, Any], *, tolerance: float = GAIN_TOLERANCE, ceiling: bool = False) -> str:
    """Sentences for one row of experiments.published, computed from its numbers: how the measured
    gain compares with the published one (for an "up to" figure, `ceiling`, a smaller measured gain
    is consistent with it) and how the per-turn overhead the published gain implies compares with
    the testbed's own and with the calibration row's (its `implied_vs_calibration`). `ceiling` is false
    unless asked for: experiments.published judges "up to" figures like any other (its VERDICT_RULE)."""
    metric = "end-to-end time" if row["metric"] == "e2e" else "time to first token (p50)"
    published, measured = row["published_gain"], row["measured_gain"]
    diff = measured - published
    if abs(diff) <= tolerance:
        judgement = f"within {100 * tolerance:.0f} points: the testbed matches"
    elif diff > 0:
        judgement = f"{100 * diff:.0f} points more than published: the testbed overstates this gain"
    elif ceiling:
        judgement = (f"{100 * -diff:.0f} points less, which an 'up to' figure allows: the published value is a "
                     "ceiling, not a typical value")
    else:
        judgement = f"{100 * -diff:.0f} points less than published: the testbed understates this gain"
    sentence = (f"{row['compare']} at {row['tok_s']:g} tokens/s, {row['turns']:g} turns: the testbed cuts {metric} by "
                f"{100 * measured:.0f}% against the published {100 * published:.0f}% ({judgement}).")
    testbed, implied = row["testbed_ms_per_turn"], row["implied_ms_per_turn"]
    ratio = testbed / implied if implied else math.inf
    sentence += (f" Read through the testbed's model, the published gain implies {implied:.0f} ms of removable "
                 f"overhead per {'turn' if row['metric'] == 'e2e' else 'first token'}; the testbed removes "
                 f"{testbed:.0f} ms, {ratio:.2f}x that.")
    verdict = str(row.get("implied_vs_calibration", "-"))
    if row.get("verdict") in ("agrees", "disagrees"):
        sentence += f" Under the experiment's one verdict rule the row {row['verdict']}."
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


__all__ = [
    "API_OVERHEAD_PHASES", "GAIN_TOLERANCE", "NETWORK_CLIENT", "PAUSE", "PAUSE_STATE", "TOOL", "crossover", "design_of",
    "format_value", "markdown_table", "phase_totals", "print_table", "published_verdict", "series", "state_table",
    "sweep_table", "write_csv",
]
