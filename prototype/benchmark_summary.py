"""From rollouts to the benchmark's table: `task_row` turns a rollout into the per-task figures (where each turn's
time goes, by phase), `summarize` makes one row per (design, decode speed), each headline figure with its 95%
interval over the tasks (`estimates`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import metrics, uncertainty
from .benchmark_config import ALL_DESIGNS, API_OVERHEAD_PHASES, HTTP
from .client.harness import RolloutRecord
from .uncertainty import Estimate


def turn_phases(record: RolloutRecord) -> list[dict[str, float]]:
    """Seconds per phase for each turn: the server's phases plus `network_client` (the rest of the
    turn's wall time) and `tool` (client tool time after the turn)."""
    out = []
    for turn in record.turns:
        server = {k: v / 1000 for k, v in ((turn.server_timing or {}).get("phases_ms") or {}).items()}
        server.pop(metrics.POST_OVERLAPPED, None)  # after the terminal event: not in the turn
        wall = turn.ended_at - turn.sent_at
        phases = dict(server)
        phases["network_client"] = max(0.0, wall - sum(server.values()))
        phases["tool"] = turn.tool_seconds
        out.append(phases)
    return out


def task_row(design: str, decode_tps: float, record: RolloutRecord) -> dict[str, Any]:
    phases = turn_phases(record)
    api_overhead = sum(p.get(k, 0.0) for p in phases for k in API_OVERHEAD_PHASES)
    totals: dict[str, float] = {}
    for p in phases:
        for k, v in p.items():
            totals[k] = totals.get(k, 0.0) + v
    return {
        "design": design,
        "decode_tps": decode_tps,
        "task": record.workload,
        "turns": len(record.turns),
        "e2e_s": record.seconds,
        "ttft_s": [t.ttft for t in record.turns if t.ttft is not None],
        "api_overhead_s": api_overhead,
        "bytes_sent_per_turn": statistics.fmean(t.bytes_sent for t in record.turns),
        "bytes_received_per_turn": statistics.fmean(t.bytes_received for t in record.turns),
        "input_tokens": record.usage["input_tokens"],
        "cached_tokens": record.usage["cached_tokens"],
        "output_tokens": record.usage["output_tokens"],
        "reasoning_tokens": record.usage.get("reasoning_tokens", 0),
        "web_searches": sum(1 for item in record.transcript if item.get("type") == "web_search_call"),
        "function_calls": sum(1 for item in record.transcript if item.get("type") == "function_call"),
        "phase_totals_s": totals,
        "reconnects": record.reconnects,
        "resent_bytes": record.resent_bytes,
        "recovery_s": list(record.recovery_seconds),
        "fell_back_to_http": record.fell_back_to_http,
    }


# The figures `summarize` gives with a 95% interval over the tasks (prototype/uncertainty.py), each a column with
# `<name>_low` and `<name>_high` beside it; their n is the `tasks` column. A ratio to http (speedup, gain, TTFT
# ratio) resamples the tasks of both designs together: they ran the same tasks.
ESTIMATED = ("e2e_mean_s", "e2e_p50_s", "speedup_vs_http", "gain_vs_http", "ttft_p50_ms", "ttft_p50_ratio_vs_http")


def estimates(group: Sequence[dict[str, Any]], http: Sequence[dict[str, Any]] | None, *, intervals: bool = True) -> dict[str, Estimate]:
    """A (design, speed)'s headline figures over its tasks, each with its interval: mean and median end-to-end time
    per task (s), the speed-up over http (total http time / total time, the same tasks), the gain (1 - total time /
    total http time), the median per-turn TTFT (ms) and its ratio to http's. `http` is http's rows at the same speed;
    the ratios are NaN unless it holds the same tasks in the same order. `intervals` false: the values alone."""
    n = len(group)
    e2e = [r["e2e_s"] for r in group]
    ttft = [r["ttft_s"] for r in group]

    def estimate(statistic: Callable[[np.ndarray], np.ndarray], method: str = "bootstrap") -> Estimate:
        return uncertainty.resample(n, statistic, of="tasks", method=method, interval=intervals)

    figures = {
        "e2e_mean_s": estimate(uncertainty.unit_mean(e2e)),
        "e2e_p50_s": estimate(uncertainty.unit_percentile([[t] for t in e2e], 50)),
        "ttft_p50_ms": estimate(uncertainty.unit_percentile(ttft, 50)).scaled(1000),
    }
    if http is None or [r.get("task") for r in http] != [r.get("task") for r in group]:
        nan = Estimate(float("nan"), float("nan"), float("nan"), n, "tasks", "paired bootstrap")
        figures |= {"speedup_vs_http": nan, "gain_vs_http": nan, "ttft_p50_ratio_vs_http": nan}
    elif http is group:  # http against itself: 1x, no gain, in every resample
        figures |= {name: Estimate(value, value, value, n, "tasks", "exact") for name, value in
                    (("speedup_vs_http", 1.0), ("gain_vs_http", 0.0), ("ttft_p50_ratio_vs_http", 1.0))}
    else:
        own, theirs = uncertainty.unit_total(e2e), uncertainty.unit_total([r["e2e_s"] for r in http])
        own_ttft, their_ttft = uncertainty.unit_percentile(ttft, 50), uncertainty.unit_percentile([r["ttft_s"] for r in http], 50)
        figures |= {
            "speedup_vs_http": estimate(lambda c: theirs(c) / own(c), "paired bootstrap"),
            "gain_vs_http": estimate(lambda c: 1 - own(c) / theirs(c), "paired bootstrap"),
            "ttft_p50_ratio_vs_http": estimate(lambda c: own_ttft(c) / their_ttft(c), "paired bootstrap"),
        }
    return {name: figures[name] for name in ESTIMATED}


def with_intervals(figures: dict[str, Estimate]) -> dict[str, float]:
    """Estimates as table columns: `name`, `name_low`, `name_high`."""
    return {f"{name}{part}": value for name, e in figures.items()
            for part, value in (("", e.value), ("_low", e.low), ("_high", e.high))}


def interval_of(row: dict[str, Any], name: str) -> Estimate:
    """A summary row's figure back as an estimate (n: its `tasks`)."""
    return Estimate(row[name], row[f"{name}_low"], row[f"{name}_high"], row["tasks"], "tasks",
                    "paired bootstrap" if name in ("speedup_vs_http", "gain_vs_http", "ttft_p50_ratio_vs_http") else "bootstrap")


def summarize(rows: Sequence[dict[str, Any]], *, intervals: bool = True) -> list[dict[str, Any]]:
    """One row per (design, speed): end-to-end time per task (mean, p50 with their intervals, p90), speed-up vs
    http (ratio of total e2e over the same tasks, so of their means) and the gain (1 - design/http on the means),
    per-turn TTFT p50 and its ratio to http's, each with its 95% interval over the tasks (`estimates`; `intervals`
    false leaves the intervals NaN, for a caller that makes its own), API overhead share of wall time, bytes sent
    and received per turn over all the tasks' turns (docs/metrics.md), the share of input tokens found in the
    prefix cache, and what the tasks did: reasoning's share of output tokens, hosted web searches per task, client
    calls per turn that ended in calls (parallel calls push it above 1)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["decode_tps"]), []).append(row)
    table = []
    for (design, tps), group in groups.items():
        e2e = np.array([r["e2e_s"] for r in group])
        figures = estimates(group, groups.get((HTTP, tps)), intervals=intervals)
        columns = with_intervals(figures)
        table.append({
            "design": design,
            "decode_tps": tps,
            "tasks": len(group),
            **{k: columns[k] for k in columns if k.startswith(("e2e_mean_s", "e2e_p50_s"))},
            "e2e_p90_s": float(np.percentile(e2e, 90)),
            **{k: columns[k] for k in columns if k.startswith(("speedup_vs_http", "gain_vs_http", "ttft_p50_ms", "ttft_p50_ratio"))},
            "api_overhead_share": float(sum(r["api_overhead_s"] for r in group) / e2e.sum()),
            # Every turn weighs the same (all the tasks' bytes over all their turns), as in the compare figure.
            "bytes_sent_per_turn": _per_turn(group, "bytes_sent_per_turn"),
            "bytes_received_per_turn": _per_turn(group, "bytes_received_per_turn"),
            "cached_share": _ratio(group, "cached_tokens", "input_tokens"),
            "reasoning_share": _ratio(group, "reasoning_tokens", "output_tokens"),
            "web_searches_per_task": float(np.mean([r.get("web_searches", 0) for r in group])),
            "calls_per_tool_turn": float(sum(r.get("function_calls", 0) for r in group) / max(1, sum(r["turns"] - 1 for r in group))),
            "reconnects": int(sum(r.get("reconnects", 0) for r in group)),
        })
    order = {d: i for i, d in enumerate(ALL_DESIGNS)}
    table.sort(key=lambda r: (r["decode_tps"], order.get(r["design"], 99)))
    return table


def _per_turn(group: Sequence[dict[str, Any]], key: str) -> float:
    """A per-task per-turn mean, over all the group's turns: sum(mean * turns) / sum(turns)."""
    turns = sum(r["turns"] for r in group)
    return float(sum(r[key] * r["turns"] for r in group) / turns) if turns else float("nan")


def _ratio(group: Sequence[dict[str, Any]], part: str, whole: str) -> float:
    total = sum(r.get(whole, 0) for r in group)
    return float(sum(r.get(part, 0) for r in group) / total) if total else float("nan")

