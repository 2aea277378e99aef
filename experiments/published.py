"""Published results, side by side with the testbed (docs/parameters.md §7).

For each published figure this sets up the conditions behind it, runs the two designs it compares,
and prints the published and the measured gain (gain = 1 - design/baseline, over the same tasks).

* **One verdict rule** for every check row (`VERDICT_RULE`): the row *agrees* when the published gain
  lies within `TOLERANCE` (5 points of gain) of the measured gain or inside the measured gain's 95%
  interval, whichever is wider; otherwise it *disagrees*. An "up to" figure is judged like any other:
  a smaller measured gain is not counted as consistent with it.
* **Every gain with its uncertainty** (prototype/uncertainty.py): a 95% BCa bootstrap interval over the tasks,
  resampling each task's baseline and design runs together (they ran the same task); n is the tasks. One task
  (the alpha demo's) has no interval.
* **Like with like.** End-to-end rows compare mean end-to-end time per task; TTFT rows compare the
  median per-turn time to first token (docs/metrics.md). The overhead a gain implies under the
  testbed's own model (a gain g on a design time T means the baseline spent T*g/(1-g) more) is
  compared with the calibration row's only for end-to-end rows: the calibration is an end-to-end
  figure, and no published TTFT figure calibrates the model.
* **Calibration.** OpenAI publishes no per-stage API costs, so the default knobs (t_fixed_pre =
  250 ms, f_ws = 0.2, ...) were set near the ~0.3 s per turn the alpha demo implies: that row is
  **calibration**, and its residual (measured minus published gain) is reported, never a verdict.
* **By construction.** "The gain of chained over http grows with decode speed" holds for any model
  in which the designs differ by a fixed per-turn cost, as this one does: faster decoding shrinks
  the time both designs share. The speed sweep is printed, labelled as such, and is not evidence.

    python -m experiments.published [--tasks 5]
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from prototype import benchmark, headline, sweep, uncertainty
from prototype import workload as wl
from prototype.api.costs import AFTER_SPRINT, BEFORE_SPRINT
from prototype.cli.common import at_least, non_negative

from .common import add_list, experiment_parser, print_table, run_dir, write_csv

E2E = "e2e"
TTFT = "ttft"
TOLERANCE = 0.05  # [ours] 5 points of gain: below what the knobs' [assumed] values can claim to resolve
# The notebook's picture of implied overheads shades the calibration row's value times or divided by this factor; it
# is a picture, not a verdict (the verdict is VERDICT_RULE on the gains).
AGREEMENT_FACTOR = 2.0
VERDICT_RULE = (
    "agrees when the published gain is within 5 points of the measured gain or inside its 95% bootstrap "
    "interval over tasks, whichever is wider; 'up to' figures are judged the same way"
)


@attrs.frozen
class Published:
    name: str
    source: str
    metric: str
    published_gain: float  # 1 - design/baseline, as published
    baseline: str
    design: str
    decode_tps: float
    role: str  # "calibration" or "check"
    tasks: Callable[[int], tuple[wl.Workload, ...]]
    baseline_sprint: Any = AFTER_SPRINT
    note: str = ""


def alpha_demo_tasks(n: int) -> tuple[wl.Workload, ...]:
    # Alpha doc (6 Feb 2026): websocket_demo.py, gpt-5.2, store=false, "start=20" read as 20 turns,
    # ~405 output tokens in all (~20 per turn), ~8.6k input tokens in all (a small context), tool
    # time negligible. docs/parameters.md §7.
    return (wl.fixed(20, initial_prompt_tokens=300, appended_tokens=20, output_tokens=20, tool_seconds=0.0, name="alpha-demo"),)


def coding_tasks(turns: int, tool_seconds: float | None = None) -> Callable[[int], tuple[wl.Workload, ...]]:
    def make(n: int) -> tuple[wl.Workload, ...]:
        overrides: dict[str, Any] = {"fixed_turns": turns}
        if tool_seconds is not None:
            overrides["fixed_tool_seconds"] = tool_seconds
        return tuple(wl.generate("compact", seed=7, n_tasks=n, **overrides))
    return make


ROWS = (
    Published("alpha demo: HTTP 20.24 s -> WS 14.30 s", "OpenAI alpha doc, 6 Feb 2026", E2E, 1 - 14.30 / 20.24,
              benchmark.HTTP, benchmark.CHAINED, 65.0, "calibration", alpha_demo_tasks),
    Published("up to 40% faster agent loops (20+ tool calls)", "OpenAI blog (secondary); WS guide", E2E, 0.40,
              benchmark.HTTP, benchmark.CHAINED, 1000.0, "check", coding_tasks(20), note="default tool-time mixture"),
    Published("up to 40%, tools at TraceLab's median 0.3 s", "OpenAI blog (secondary); TraceLab p50", E2E, 0.40,
              benchmark.HTTP, benchmark.CHAINED, 1000.0, "check", coding_tasks(20, 0.3), note="fast tools: the 'up to' condition"),
    Published("up to ~20% lower e2e, both chain previous_response_id", "docs.x.ai WebSocket Mode", E2E, 0.20,
              benchmark.HTTP_STORED, benchmark.CHAINED, 1000.0, "check", coding_tasks(20, 0.3)),
    Published("p50 TTFT -28% at 8 turns", "smg-project/smg PR #1770", TTFT, 0.28,
              benchmark.HTTP_STORED, benchmark.CHAINED, 1000.0, "check", coding_tasks(8, 0.3)),
    Published("p50 TTFT -41% at 40 turns", "smg-project/smg PR #1770", TTFT, 0.41,
              benchmark.HTTP_STORED, benchmark.CHAINED, 1000.0, "check", coding_tasks(40, 0.3)),
    Published("TTFT -45% from the pre-WebSocket sprint (not a WS effect)", "OpenAI blog (secondary)", TTFT, 0.45,
              benchmark.HTTP, benchmark.HTTP, 1000.0, "check", coding_tasks(20, 0.3), baseline_sprint=BEFORE_SPRINT,
              note="http before vs after the sprint"),
)


def pair_runs(row: Published, n_tasks: int) -> tuple[benchmark.DesignRun, benchmark.DesignRun]:
    """The baseline's and the design's runs of one published result, on the same tasks."""
    tasks = row.tasks(n_tasks)
    return (benchmark.DesignRun(row.baseline, row.decode_tps, benchmark.BenchConfig(task_list=tasks, sprint=row.baseline_sprint)),
            benchmark.DesignRun(row.design, row.decode_tps, benchmark.BenchConfig(task_list=tasks, sprint=AFTER_SPRINT)))


def _statistic(metric: str, baseline: list[dict[str, Any]], design: list[dict[str, Any]]) -> uncertainty.Estimate:
    """1 - design/baseline over the same tasks, each task's two runs resampled together: mean end-to-end time per task,
    or the median per-turn TTFT of all the drawn tasks' turns; with its 95% interval over the tasks."""
    if metric == E2E:
        mine, theirs = uncertainty.unit_total([r["e2e_s"] for r in design]), uncertainty.unit_total([r["e2e_s"] for r in baseline])
    else:
        mine = uncertainty.unit_percentile([r["ttft_s"] for r in design], 50)
        theirs = uncertainty.unit_percentile([r["ttft_s"] for r in baseline], 50)
    return uncertainty.resample(len(design), lambda counts: 1 - mine(counts) / theirs(counts), method="paired bootstrap")


def _median_ttft(rows: list[dict[str, Any]]) -> float:
    return float(np.median([t for r in rows for t in r["ttft_s"]]))


def verdict(published_gain: float, measured_gain: float, interval: tuple[float, float]) -> str:
    """The one rule (VERDICT_RULE) for every check row: within TOLERANCE of the measured gain, or inside its interval."""
    low, high = interval
    close = abs(published_gain - measured_gain) <= TOLERANCE
    return "agrees" if close or low <= published_gain <= high else "disagrees"


def pair_row(row: Published, baseline: list[dict[str, Any]], design: list[dict[str, Any]]) -> dict[str, Any]:
    """One published result against the testbed, from the task rows (benchmark.task_row) of its two runs."""
    turns = statistics.fmean(r["turns"] for r in design)
    if row.metric == E2E:
        base = statistics.fmean(r["e2e_s"] for r in baseline)
        mine = statistics.fmean(r["e2e_s"] for r in design)
        per_turn_testbed = (base - mine) / turns
        implied = mine * row.published_gain / (1 - row.published_gain) / turns
    else:
        base, mine = _median_ttft(baseline), _median_ttft(design)
        per_turn_testbed = base - mine
        implied = mine * row.published_gain / (1 - row.published_gain)
    estimate = _statistic(row.metric, baseline, design)
    gain = 1 - mine / base
    low, high = (estimate.low, estimate.high) if estimate.has_interval else (gain, gain)
    return {
        "result": row.name,
        "role": row.role,
        "metric": row.metric,
        "compare": f"{row.design} vs {row.baseline}" + (" (before sprint)" if row.baseline_sprint is BEFORE_SPRINT else ""),
        "tok_s": row.decode_tps,
        "tasks": len(design),
        "turns": turns,
        "published_gain": row.published_gain,
        "measured_gain": gain,
        "gain_low": low,
        "gain_high": high,
        "verdict": "calibration" if row.role == "calibration" else verdict(row.published_gain, gain, (low, high)),
        "residual": gain - row.published_gain,
        "testbed_ms_per_turn": 1000 * per_turn_testbed,
        "implied_ms_per_turn": 1000 * implied,
        "source": row.source,
        "note": row.note,
    }


def trend_runs(n_tasks: int, turns: int = 20) -> list[benchmark.DesignRun]:
    """http and chained at every decode speed, on the same tasks: the gain grows with speed by construction (a fixed
    per-turn cost against a shrinking shared time), so these runs show magnitudes, not evidence."""
    config = benchmark.BenchConfig(task_list=coding_tasks(turns, 0.3)(n_tasks))
    return [benchmark.DesignRun(design, tps, config) for tps in benchmark.DECODE_SPEEDS for design in (benchmark.HTTP, benchmark.CHAINED)]


def trend_rows(runs: list[benchmark.DesignRun], results: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The gain of chained over http at each decode speed (1 - mean chained / mean http over the same tasks), with its
    95% interval over the tasks."""
    by_point = {(run.design, run.decode_tps): rows for run, rows in zip(runs, results)}
    out = []
    for tps in dict.fromkeys(run.decode_tps for run in runs):
        gain = _statistic(E2E, by_point[(benchmark.HTTP, tps)], by_point[(benchmark.CHAINED, tps)])
        out.append({"tok_s": tps, "tasks": gain.n, "gain_chained_vs_http": gain.value, "gain_low": gain.low, "gain_high": gain.high})
    return out


def headline_section(rows: list[dict[str, Any]], trends: list[dict[str, Any]], *, n_tasks: int, trend_turns: int,
                     command: str, trend_tasks: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The figures docs/results.md quotes (prototype/headline.py): each row's measured gain and each speed's trend gain
    with their intervals, the side-by-side table and the trend table, the rows behind notebook_published.png, and the
    decode-speed check's end-to-end time per task ("<design>@<tokens/s>": seconds, task by task), from which its gains
    follow and against which a fresh run of one task is checked."""
    def estimate(r: dict[str, Any], value: str, low: str, high: str, n: int) -> uncertainty.Estimate:
        ends = (r[low], r[high]) if n > 1 else (float("nan"), float("nan"))
        return uncertainty.Estimate(r[value], *ends, n, "tasks", "paired bootstrap")

    index = {p.name: i for i, p in enumerate(ROWS)}
    figures = {f"gain.{index[r['result']]}": headline.figure(estimate(r, "measured_gain", "gain_low", "gain_high", r["tasks"]),
                                                              "{:.1f}%", scale=100, label=r["result"]) for r in rows}
    figures |= {f"trend.{t['tok_s']:g}": headline.figure(estimate(t, "gain_chained_vs_http", "gain_low", "gain_high", t["tasks"]),
                                                          "{:.1f}%", scale=100, label=f"chained vs http at {t['tok_s']:g} tokens/s")
                for t in trends}

    def measured(r: dict[str, Any]) -> str:
        return headline.render(figures[f"gain.{index[r['result']]}"])

    table = headline.table(
        ["#", "published result (source)", "compared", "published", "measured [95%] n", "verdict", "implied ms/turn", "vs calibration"],
        ([index[r["result"]], f"{r['result']} ({r['source']})", f"{r['compare']}, {r['tok_s']:g} tok/s, {r['turns']:g} turns, {r['metric']}",
          f"{100 * r['published_gain']:.0f}%", measured(r), r["verdict"] if r["role"] == "check" else f"calibration, residual "
          f"{100 * r['residual']:+.1f} points", f"{r['implied_ms_per_turn']:,.0f}", r["implied_vs_calibration"]] for r in rows))
    trend_table = headline.table(["tokens/s", "chained vs http, gain [95%] n"],
                                 ([f"{t['tok_s']:,.0f}", headline.render(figures[f"trend.{t['tok_s']:g}"])] for t in trends))
    return headline.section(
        "published", command=command,
        workload=f"{n_tasks} task(s) per generated condition of the compact preset (seed 7), virtual time; the decode-speed check: "
                 f"{n_tasks} tasks of {trend_turns} turns, every tool 0.3 s",
        figures=figures, tables={"table": table, "trend": trend_table},
        data={"rows": rows, "trends": trends, "trend_tasks": trend_tasks or {}})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = experiment_parser("Published results side by side with the testbed")
    parser.add_argument("--tasks", type=at_least(1), default=5, help="tasks per generated condition (default 5)")
    add_list(parser, "--rows", non_negative(int), None, "run only these rows (indices; default all)")
    parser.add_argument("--trend-turns", type=at_least(2), default=20, help="turns per task in the decode-speed direction check (default 20)")
    sweep.add_arguments(parser)
    args = parser.parse_args(argv)
    chosen = [row for i, row in enumerate(ROWS) if args.rows is None or i in args.rows]
    pairs = [run for row in chosen for run in pair_runs(row, args.tasks)]
    trends_grid = trend_runs(args.tasks, args.trend_turns)
    with sweep.runner_from_args(args) as runner:  # one grid: every pair and every direction check
        results = runner.map(benchmark.design_rows, pairs + trends_grid, desc="published")
    rows = [pair_row(row, results[2 * i], results[2 * i + 1]) for i, row in enumerate(chosen)]
    calibration = next((r for r in rows if r["role"] == "calibration"), None)
    for r in rows:
        if r is calibration:
            r["implied_vs_calibration"] = "calibration"
        elif calibration is None or r["metric"] != calibration["metric"]:
            r["implied_vs_calibration"] = "-"  # a TTFT figure against an end-to-end calibration: not like with like
        else:
            r["implied_vs_calibration"] = f"{r['implied_ms_per_turn'] / calibration['implied_ms_per_turn']:.2f}x"
    print("Published results vs the testbed (gain = 1 - design/baseline over the same tasks; 95% bootstrap interval "
          "over tasks)\n")
    print(f"Verdict rule: {VERDICT_RULE}.\n")
    print_table(rows, ["result", "role", "metric", "compare", "tok_s", "tasks", "published_gain", "measured_gain",
                       "gain_low", "gain_high", "verdict", "testbed_ms_per_turn", "implied_ms_per_turn",
                       "implied_vs_calibration"])
    if calibration is not None:
        print(f"\nCalibration residual (measured - published gain): {calibration['residual']:+.3f}; the knobs were set "
              "near this figure, so it confirms nothing.")
    checks = [r for r in rows if r["role"] == "check"]
    if checks:
        agreeing = sum(r["verdict"] == "agrees" for r in checks)
        print(f"Checks: {agreeing} of {len(checks)} agree under the rule.")
    trends = trend_rows(trends_grid, results[len(pairs):])
    print(f"\nBy construction, not evidence: chained vs http gain by decode speed ({args.trend_turns} turns, 0.3 s tools). "
          "Any model whose designs differ by a fixed per-turn cost shows a gain that grows with decode speed.")
    print_table(trends)
    folder = run_dir("published")
    write_csv(folder / "published.csv", rows)
    command = " ".join(["python -m experiments.published", *(sys.argv[1:] if argv is None else argv)])
    trend_tasks = {f"{run.design}@{run.decode_tps:g}": [r["e2e_s"] for r in task_rows]
                   for run, task_rows in zip(trends_grid, results[len(pairs):])}
    headline.write(folder / "published.json", {"headline": headline_section(
        rows, trends, n_tasks=args.tasks, trend_turns=args.trend_turns, command=command, trend_tasks=trend_tasks)})
    print(f"wrote {folder / 'published.csv'}, {folder / 'published.json'}")
    return {"rows": rows, "trends": trends, "folder": folder}


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
