"""`python -m prototype compare`: the three designs side by side, at 65, 1000 and 4000 tokens/s.

The tasks are a preset's seeded tasks (`--preset coding`, or a preset file that `calibrate` wrote) or a trace's
(`--trace PATH`: a testbed JSONL, TraceLab JSONL or CSV, or Codex rollout file, or a folder of Codex rollouts;
prototype/traces/). A trace with arrival times replays open-loop: each task starts when it started.
`--latency FILE` replaces the engine's prefill rate and overhead with a fitted profile and, unless `--speeds` is
given, runs at its decode rate only.

Runs every (design, decode speed) pair on the same tasks under virtual time through the sweep
runner (prototype/sweep.py: worker processes or a Dask cluster, a results cache, a progress bar that
counts tasks); a run of many tasks first says roughly how long it will take, from the CPU time one
task of the workload's mean length takes at each point on this machine. Prints the table and every
modeled parameter with its source; writes compare.csv, compare.json, compare_tasks.json, compare.png
and one Chrome trace per design (trace_<design>.json, first task at 1000 tokens/s) into a new folder
results/compare/<timestamp>/, with results/compare/latest pointing at the newest. The folder appears
only when the run completes: a run that fails or is interrupted (Ctrl-C) leaves none, and the points it
finished stay in the results cache, so running the same command again computes only the rest.
`python -m prototype plot` draws the table and figure again from one or more such folders. Columns
(compare.csv):

  design, decode_tps         the design and the simulated decode speed (tokens/s)
  tasks                      tasks run (the same seeded tasks for every design)
  e2e_mean_s, e2e_p50_s      end-to-end time per task (first request to final answer), mean and median, seconds
  e2e_p90_s                  the same, 90th percentile
  speedup_vs_http            total http time / total time of this design, same tasks (a ratio of means)
  gain_vs_http               1 - total time of this design / total http time: the end-to-end gain
  ttft_p50_ms                per-turn time to first token (request sent to first delta), median
  ttft_p50_ratio_vs_http     this design's median TTFT / http's
  api_overhead_share         API work (validate, safety, render, route, store reads, blocking post)
                             as a share of end-to-end wall time
  bytes_sent_per_turn        client-to-server payload bytes per turn (request bodies / frames), all
                             the tasks' bytes over all their turns (the figure's statistic)
  bytes_received_per_turn    server-to-client payload bytes per turn (SSE blocks / frames), the same way
  cached_share               share of input tokens found in the engine's prefix cache
  reasoning_share            reasoning tokens as a share of output tokens
  web_searches_per_task      hosted web_search calls per task
  calls_per_tool_turn        client function calls per turn that ended in calls
  reconnects                 new connections the clients opened because one ended before the task did
                             (the 60-minute connection limit, or a fault); --reconnect picks the policy
Each of e2e_mean_s, e2e_p50_s, speedup_vs_http, gain_vs_http, ttft_p50_ms and ttft_p50_ratio_vs_http has its 95%
interval over the tasks beside it (`<column>_low`, `<column>_high`; n is `tasks`): a bootstrap over the tasks, the
ratios to http resampling the tasks of both designs together since they ran the same tasks (prototype/uncertainty.py).
The per-turn figures follow one definition for every design (docs/metrics.md). The printed table shows
the columns of TABLE (units in the headers, an interval under each estimate, a legend under it); `--wide` prints
every column; the headline under it gives each design's TTFT ratio and end-to-end gain against http with their
intervals, and compare.json's "headline" section holds them for the docs (prototype/headline.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from .. import analysis, benchmark, figures, headline, metrics, netem, profiles, sweep, traces, uncertainty
from .. import workload as wl
from ..client.harness import CHAINED, SUSPENDED, RolloutRecord
from ..client.reconnect import CODEX, POLICIES
from ..engine.vllm_client import VllmUnavailable, WorkerFailed
from ..engine.vllm_engine import RealCall, call_records
from ..engine.vllm_models import ModelSpec
from ..protocol.errors import CONNECTION_LIMIT_REACHED
from ..trace import write_chrome_trace
from .common import INTERRUPTED, RunFolder, add_list, at_least, interrupted, non_negative, plural, positive
from .engine_options import VLLM, add_engine_arguments, model_spec

TRACE_SPEED = 1000.0


@attrs.frozen
class Column:
    """A column of the printed table: the CSV field, its header with the unit, how a cell prints, and what the
    legend under the table says of it (empty: the header says enough). A column with a `template` is an estimate:
    its cell prints the value and its 95% interval (`<field>_low`, `<field>_high`) in that format, times `scale`."""

    field: str
    header: str
    cell: Callable[[Any], str]
    legend: str = ""
    template: str = ""
    scale: float = 1.0

    def show(self, row: dict[str, Any]) -> str:
        value = row.get(self.field)
        if not self.template or f"{self.field}_low" not in row or value is None or value != value:
            return self.cell(value)
        if row[f"{self.field}_low"] == row[f"{self.field}_high"] == value:
            return self.cell(value)  # an exact figure (http against itself): no interval to print
        return benchmark.interval_of(row, self.field).scaled(self.scale).format(self.template)


def _number(template: str, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda value: "-" if value is None or value != value else template.format(value * scale)


# The table a reader needs first: what ran, how long a task took, the gain over http, time to first
# token, the API's share of the time and the upload per turn; `--wide` adds the rest.
TABLE = (
    Column("design", "design", str),
    Column("decode_tps", "tok/s", _number("{:,.0f}")),
    Column("e2e_mean_s", "e2e mean (s)", _number("{:,.0f}"), "end-to-end time per task, first request to final answer, "
           "mean over the tasks (as in compare.png)", "{:,.0f}"),
    Column("speedup_vs_http", "vs http (x)", _number("{:.2f}"), "total http time / total time of this design, same tasks: "
           "the ratio of the means", "{:.2f}"),
    Column("ttft_p50_ms", "TTFT p50 (ms)", _number("{:,.0f}"), "per turn, request sent to first output delta", "{:,.0f}"),
    Column("api_overhead_share", "API (%)", _number("{:.1f}", 100),
           "api_overhead_share, the API's own work (validate, safety, render, route, store reads, blocking "
           "post-inference) as a share of end-to-end time"),
    Column("bytes_sent_per_turn", "sent/turn (kB)", _number("{:,.1f}", 1e-3),
           "client-to-server payload per turn, all the tasks' bytes over all their turns (as in compare.png)"),
)
WIDE = (
    *TABLE[:2],
    Column("tasks", "tasks", str),
    *TABLE[2:3],
    Column("e2e_p50_s", "e2e p50 (s)", _number("{:,.1f}"), "the same, the median task", "{:,.1f}"),
    Column("e2e_p90_s", "e2e p90 (s)", _number("{:,.1f}")),
    *TABLE[3:4],
    Column("gain_vs_http", "gain (%)", _number("{:.1f}", 100), "1 - total time of this design / total http time", "{:.1f}", 100),
    *TABLE[4:5],
    Column("ttft_p50_ratio_vs_http", "TTFT/http (x)", _number("{:.2f}"), "this design's TTFT p50 / http's", "{:.2f}"),
    *TABLE[5:],
    Column("bytes_received_per_turn", "recv/turn (kB)", _number("{:,.1f}", 1e-3), "server-to-client payload per turn, the same way"),
    Column("cached_share", "cached (%)", _number("{:.1f}", 100),
           "cached_share, the share of input tokens found in the engine's prefix cache (not prefilled again)"),
    Column("reasoning_share", "reasoning (%)", _number("{:.1f}", 100), "reasoning tokens as a share of output tokens"),
    Column("web_searches_per_task", "searches/task", _number("{:.2f}"), "hosted web_search calls per task"),
    Column("calls_per_tool_turn", "calls/tool turn", _number("{:.2f}"), "client function calls per turn that ended in calls"),
    Column("reconnects", "reconnects", str, "new connections the clients opened because one ended before the task did "
           "(the 60-minute connection limit, or a fault); --reconnect picks the policy"),
)


INTERVALS_LEGEND = ("[low, high]: the 95% interval over the tasks (bootstrap; a ratio to http resamples the tasks of "
                    "both designs together, as they ran the same tasks)")


def print_compare_table(table: list[dict[str, Any]], wide: bool = False) -> None:
    """The table with units in the headers and one number format per column, an estimate's cell with its interval,
    then its legend. `wide`: every column of compare.csv (one this module does not know prints under its CSV name,
    an interval's ends in their estimate's cell)."""
    columns = list(WIDE if wide else TABLE)
    if wide:
        known = {c.field for c in columns} | {f"{c.field}{end}" for c in columns if c.template for end in ("_low", "_high")}
        columns += [Column(field, field, analysis.format_value) for field in table[0] if field not in known]
    cells = [{c.field: c.show(row) for c in columns} for row in table]
    analysis.print_table(cells, [c.field for c in columns], formats={c.field: str for c in columns},
                         headers={c.field: c.header for c in columns})
    for column in columns:
        if column.legend:
            print(textwrap.fill(f"{column.header}: {column.legend}", 100, initial_indent="  ", subsequent_indent="      "))
    if any(c.template and f"{c.field}_low" in table[0] for c in columns):
        print(textwrap.fill(INTERVALS_LEGEND, 100, initial_indent="  ", subsequent_indent="      "))


def headline_estimates(table: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> dict[str, uncertainty.Estimate]:
    """compare's headline figures by key (prototype/headline.py): per design other than http and per speed, the
    median TTFT's ratio to http's and the end-to-end gain over http; per design and speed, the mean end-to-end time
    and the median TTFT; from the task rows, when given, the bytes sent per turn (kB), http's upload over each
    design's and the share of the time spent in the client's tools, each with its 95% interval over the tasks."""
    figures: dict[str, uncertainty.Estimate] = {}
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows or []:
        groups.setdefault((r["design"], r["decode_tps"]), []).append(r)
    for row in (r for r in table if "e2e_mean_s_low" in r):
        at = f"{row['design']}.{row['decode_tps']:g}"
        figures[f"e2e_mean_s.{at}"] = benchmark.interval_of(row, "e2e_mean_s")
        figures[f"ttft_p50_ms.{at}"] = benchmark.interval_of(row, "ttft_p50_ms")
        if row["design"] != benchmark.HTTP and row["speedup_vs_http"] == row["speedup_vs_http"]:
            figures[f"ttft_ratio.{at}"] = benchmark.interval_of(row, "ttft_p50_ratio_vs_http")
            figures[f"gain.{at}"] = benchmark.interval_of(row, "gain_vs_http")
            figures[f"speedup.{at}"] = benchmark.interval_of(row, "speedup_vs_http")
        group = groups.get((row["design"], row["decode_tps"]))
        if group:
            figures |= _task_figures(at, group, groups.get((benchmark.HTTP, row["decode_tps"])))
    return figures


def _task_figures(at: str, group: list[dict[str, Any]], http: list[dict[str, Any]] | None) -> dict[str, uncertainty.Estimate]:
    """The upload per turn (kB, all the drawn tasks' bytes over all their turns), http's over this design's on the same
    tasks, and the client tools' share of the end-to-end time."""
    n = len(group)
    sent = uncertainty.unit_total([r["bytes_sent_per_turn"] * r["turns"] for r in group])
    turns = uncertainty.unit_total([r["turns"] for r in group])
    tools = uncertainty.unit_total([r["phase_totals_s"].get(analysis.TOOL, 0.0) for r in group])
    e2e = uncertainty.unit_total([r["e2e_s"] for r in group])
    figures = {f"sent_kb.{at}": uncertainty.resample(n, lambda c: sent(c) / turns(c) / 1000),
               f"tool_share.{at}": uncertainty.resample(n, lambda c: tools(c) / e2e(c))}
    if http is not None and http is not group and [r["task"] for r in http] == [r["task"] for r in group]:
        their_sent = uncertainty.unit_total([r["bytes_sent_per_turn"] * r["turns"] for r in http])
        their_turns = uncertainty.unit_total([r["turns"] for r in http])
        figures[f"upload_ratio.{at}"] = uncertainty.resample(
            n, lambda c: (their_sent(c) / their_turns(c)) / (sent(c) / turns(c)), method="paired bootstrap")
    return figures


def print_headline(table: list[dict[str, Any]]) -> None:
    """Each design against http at each speed: the TTFT ratio and the end-to-end gain with their intervals, and
    whether the gain's interval excludes 0 (a claim of faster or slower holds only then)."""
    rows = [r for r in table if r["design"] != benchmark.HTTP and r.get("gain_vs_http_low", math.nan) == r.get("gain_vs_http_low")]
    if not rows:
        return
    print(f"\nAgainst http on the same {rows[0]['tasks']} tasks, with 95% intervals (paired bootstrap over the tasks):")
    zero = uncertainty.Estimate(0.0, 0.0, 0.0, rows[0]["tasks"], "tasks", "exact")
    for row in rows:
        ratio = benchmark.interval_of(row, "ttft_p50_ratio_vs_http")
        gain = benchmark.interval_of(row, "gain_vs_http")
        verdict = {"yes": "slower", "no": "faster", "not separated": "not separated from 0"}[uncertainty.holds(gain, zero)]
        print(f"  {row['design']:<11} at {row['decode_tps']:>5,.0f} tok/s: TTFT p50 {ratio.format('{:.2f}')} of http's; "
              f"end-to-end gain {gain.scaled(100).format('{:+.1f}%')} ({verdict})")


# How each headline figure prints in the docs (prototype/headline.py): template, scale.
# Units other than % are the sentence's, after the span: "742 [533, 835] ms".
FORMATS = {"e2e_mean_s": ("{:,.1f}", 1.0), "ttft_p50_ms": ("{:,.0f}", 1.0), "ttft_ratio": ("{:.2f}", 1.0),
           "gain": ("{:.1f}%", 100.0), "speedup": ("{:.3f}", 1.0), "sent_kb": ("{:,.1f}", 1.0),
           "upload_ratio": ("{:.1f}", 1.0), "tool_share": ("{:.0f}%", 100.0)}
# The table docs/results.md quotes: the printed table's columns with the download and the prefix cache's share.
DOCS_TABLE = (*TABLE, *(c for c in WIDE if c.field in ("bytes_received_per_turn", "cached_share")))
PARAMETER_COLUMN = 44


def print_parameters(parameters: list[tuple[str, str, str]]) -> None:
    """Name, value and source in three columns; a value wider than its column wraps within it, so the sources stay
    in theirs."""
    for name, value, source in parameters:
        lines = textwrap.wrap(value, PARAMETER_COLUMN, break_on_hyphens=False) or [""]
        print(f"  {name:<{PARAMETER_COLUMN}} {lines[0]:<{PARAMETER_COLUMN}} {source}")
        for line in lines[1:]:
            print(f"  {'':<{PARAMETER_COLUMN}} {line}")


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The options of a run that differ from compare's defaults, as a command line would give them (for the
    headline's command)."""
    given = []
    for option, default in (("tasks", None), ("seed", 0), ("preset", "coding"), ("trace", None), ("turns", None)):
        value = getattr(args, option)
        if value not in (default, None):
            given += [f"--{option}", str(value)]
    return given


# The results folder: $TESTBED_RESULTS, else <repo>/results (git-ignored).
RESULTS = Path(os.environ.get("TESTBED_RESULTS", Path(__file__).resolve().parents[2] / "results"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=at_least(1), default=None, help="tasks per design and speed (default 10; with --trace, all; "
                        f"with --engine vllm, {VLLM_DEFAULTS['tasks']})")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed: the same seed gives the same tasks (default 0)")
    parser.add_argument("--preset", default=None, help=f"workload preset: {', '.join(wl.PRESETS)} (default {wl.DEFAULT_PRESET}), "
                        "or a preset JSON file (calibrate --preset-out); with --engine vllm the default is "
                        f"{VLLM_DEFAULTS['preset']} with {VLLM_DEFAULTS['turns']} turns a task (minutes on a CPU), --preset coding on request")
    parser.add_argument("--trace", help="replay a trace's tasks instead of a preset (file or folder of Codex rollouts)")
    parser.add_argument("--latency", help="latency profile JSON (calibrate --latency-out): prefill rate, overhead, decode rate")
    add_list(parser, "--speeds", positive(float), None, "decode speeds in tokens/s (default 65 1000 4000; with --latency, the profile's)")
    add_list(parser, "--designs", str, benchmark.DESIGNS, "designs to run (http-stored: http that chains previous_response_id through the store)",
             choices=list(benchmark.ALL_DESIGNS))
    parser.add_argument("--rtt-ms", type=non_negative(float), default=benchmark.DEFAULT_NETWORK.rtt * 1000,
                        help=f"network round-trip time between client and server in ms (default {benchmark.DEFAULT_NETWORK.rtt * 1000:g})")
    parser.add_argument("--turns", type=at_least(1), default=None, help="fix the number of turns per task (default: drawn from the preset)")
    parser.add_argument("--out", default=None, help="write into this folder (default: a new results/compare/<timestamp>/, "
                        "with results/compare/latest pointing at it)")
    parser.add_argument("--real", action="store_true", help="real time over loopback sockets instead of virtual time "
                        "(use a small configuration: e.g. --tasks 1 --turns 3 --speeds 1000)")
    add_engine_arguments(parser)
    parser.add_argument("--vllm-parallel", action="store_true",
                        help="with --engine vllm: run the designs at once, each on a vLLM worker of its own "
                        "(a third of the wall time; the engine's counters stay exact per design, but the designs share "
                        "the CPU, so their times are not each design's alone)")
    parser.add_argument("--reconnect", default=CODEX.name, choices=list(POLICIES),
                        help="how the clients recover from a lost connection (prototype/client/reconnect.py; default codex, "
                             "the agent client, which continues a task past the 60-minute limit on a new connection)")
    parser.add_argument("--wide", action="store_true", help="print every column of compare.csv (default: the first seven)")
    sweep.add_arguments(parser)


class ContextTooLong(ValueError):
    """A task whose context cannot fit the real engine's model."""


# `--engine vllm`'s default workload: 3 chat tasks of 3 turns (a ~500-token first prompt, ~200 tokens out a turn,
# tools of 0.5 s), sized to finish in minutes on a 2-core CPU (docs/real_engine.md gives the time measured);
# `--preset coding` runs the coding tasks instead (a 30,000-token first prompt, tools of up to minutes).
VLLM_DEFAULTS = {"preset": "chat", "tasks": 3, "turns": 3}
VLLM_CALLS = "vllm_calls"  # the per-call records: vllm_calls.csv and vllm_calls.json
# The simulated engine's own parameters: on vLLM none of them applies (the engine's are printed instead).
SIMULATED_ENGINE_PARAMETERS = ("decode speeds", "prefill rate", "engine request overhead", "prefix cache")
ENGINE_PHASES = (metrics.QUEUE, metrics.PREFILL, metrics.DECODE)
TOOL_PHASES = ("tool", metrics.HOSTED_TOOL)


def apply_engine_defaults(args: argparse.Namespace) -> None:
    """On vLLM, the workload options left unset (no --trace) take VLLM_DEFAULTS."""
    if args.engine != VLLM or args.trace is not None:
        return
    if args.preset is None:
        args.preset = VLLM_DEFAULTS["preset"]
        args.turns = VLLM_DEFAULTS["turns"] if args.turns is None else args.turns
    if args.tasks is None:
        args.tasks = VLLM_DEFAULTS["tasks"]


def run_on_vllm(args: argparse.Namespace, config: benchmark.BenchConfig, designs: list[str], out: Path,
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """Every design once over the real engine, in real time: task rows as for the simulated engine
    (the decode speed column names the model profile only), one trace per design, the per-call records
    (vllm_calls.csv, .json), and the lines that say what vLLM computed and where the time went."""
    spec = model_spec(args)
    for task in config.tasks():
        # The rendered prompt is longer still (item framing): this catches what cannot fit before vLLM starts.
        if (context := task.context_before(len(task.turns))) >= spec.max_model_len:
            raise ContextTooLong(f"task {task.name} reaches {context:,} tokens of context, more than {spec.name}'s "
                                 f"context window of {spec.max_model_len:,} (fewer --turns, or another --vllm-model)")
    results = benchmark.run_designs_on_vllm(designs, config, spec, python=args.vllm_python, decode_tps=TRACE_SPEED,
                                            parallel=args.vllm_parallel)
    rows: list[dict[str, Any]] = []
    calls: dict[str, list[RealCall]] = {}
    for design, (records, design_calls) in results.items():
        rows += [benchmark.task_row(design, TRACE_SPEED, record) for record in records]
        write_chrome_trace(records[:1], out / f"trace_{design}.json")
        calls[design] = list(design_calls)
    records = [row for design, design_calls in calls.items() for row in call_records(design, design_calls)]
    if records:
        analysis.write_csv(out / f"{VLLM_CALLS}.csv", records)
        (out / f"{VLLM_CALLS}.json").write_text(json.dumps(records))
    return rows, vllm_report(calls, rows, spec.block_size)


def vllm_report(calls: dict[str, list[RealCall]], rows: list[dict[str, Any]], block: int) -> list[str]:
    """What vLLM computed per design beside the simulated engine's prediction for the same calls, and where the
    designs' time went: the engine's (measured) apart from the API's, the network's and the tools' (modeled)."""
    lines = ["vLLM's counters per design (prefill computed and prefix-cache hits: vLLM's own; predicted: the simulated "
             "engine's bookkeeping on the same calls):"]
    for design, design_calls in calls.items():
        prompt = sum(c.prompt_tokens for c in design_calls)
        computed = sum(c.prefill_tokens for c in design_calls)
        predicted = sum(c.predicted_prefill_tokens for c in design_calls)
        line = (f"  {design:<12} model calls {len(design_calls):>4}  prompt tokens {prompt:>9,}  prefill computed "
                f"{computed:>9,}  predicted {predicted:>9,}  prefix-cache hits {sum(c.prefix_hits for c in design_calls):>9,}")
        if any(c.resumed for c in design_calls):
            # A held request's KV is no cache hit to vLLM: the API's cached_tokens is worked out from what was sent.
            line += f"  cached (derived: prompt less ids sent) {sum(c.prompt_tokens - c.sent_tokens for c in design_calls if c.resumed):>9,}"
        off_plan = sum(c.off_plan_tokens for c in design_calls)
        lines.append(line + (f"  SAMPLED OFF THE PLAN {off_plan:,} tokens" if off_plan else ""))
    if CHAINED in calls:
        gaps = [abs(c.prefill_tokens - c.predicted_prefill_tokens) for c in calls[CHAINED]]
        within = sum(gap <= block for gap in gaps)
        lines.append(f"  chained per call, vLLM against the prediction: {within} of {len(gaps)} calls within one KV block "
                     f"({block} tokens); largest gap {max(gaps, default=0)} tokens")
    if CHAINED in calls and SUSPENDED in calls:
        def lead(field: str) -> int:
            return sum(getattr(c, field) for c in calls[CHAINED]) - sum(getattr(c, field) for c in calls[SUSPENDED])

        real, predicted = lead("prefill_tokens"), lead("predicted_prefill_tokens")
        share = f"{(real - predicted) / predicted:+.1%}" if predicted else "-"
        lines.append(f"  v1's lead over chained in prefill computed: vLLM {real:,} tokens, predicted {predicted:,} ({share})")
    lines += ["", "Where the time went, per design, all tasks (seconds): the engine's is measured on vLLM; the API's work, the "
              "network and the tools are modeled waits"]
    header = f"  {'design':<12} {'vLLM (measured)':>16} {'API (modeled)':>14} {'network+client':>15} {'tools (modeled)':>16} {'end to end':>11}"
    lines.append(header)
    for design in calls:
        mine = [row for row in rows if row["design"] == design]
        spent = [sum(row["phase_totals_s"].get(phase, 0.0) for row in mine for phase in phases)
                 for phases in (ENGINE_PHASES, benchmark.API_OVERHEAD_PHASES, ("network_client",), TOOL_PHASES)]
        lines.append(f"  {design:<12} {spent[0]:>16.1f} {spent[1]:>14.1f} {spent[2]:>15.1f} {spent[3]:>16.1f} "
                     f"{sum(row['e2e_s'] for row in mine):>11.1f}")
    lines.append("  network+client: the modeled round trips and the testbed's own client and server work between them")
    return lines


def compare_point(run: benchmark.DesignRun) -> tuple[list[dict[str, Any]], RolloutRecord | None]:
    """One (design, speed) point: its task rows, and its first rollout at TRACE_SPEED (for the trace)."""
    records = run.records()
    return [benchmark.task_row(run.design, run.decode_tps, r) for r in records], records[0] if run.decode_tps == TRACE_SPEED else None


def grid_of(config: benchmark.BenchConfig, designs: list[str], speeds: list[float], real: bool = False) -> list[benchmark.DesignRun]:
    return [benchmark.DesignRun(d, s, config, real) for s in speeds for d in designs]


def tasks_of(run: benchmark.DesignRun) -> int:
    """The tasks a point runs (its share of the progress bar)."""
    return len(run.config.task_list) if run.config.task_list is not None else run.config.n_tasks


def run_grid(config: benchmark.BenchConfig, designs: list[str], speeds: list[float], runner: sweep.Runner, out: Path,
             real: bool = False) -> list[dict[str, Any]]:
    grid = grid_of(config, designs, speeds, real)
    # Slowest first (low decode speed, http) so the workers finish together. Real time runs one
    # configuration at a time in this process: parallel runs would share the cores and slow each
    # other's clocks. The bar counts tasks: each point's move as its tasks end (benchmark calls sweep.advance).
    results = runner.map(compare_point, grid, desc="compare", first=lambda run: (run.decode_tps, run.design != benchmark.HTTP),
                         measured=real, units=tasks_of, unit="task")
    rows: list[dict[str, Any]] = []
    for run, (task_rows, traced) in zip(grid, results):
        rows += task_rows
        if traced is not None:
            write_chrome_trace([traced], out / f"trace_{run.design}.json")
    return rows


# Below this many task runs left to compute (the default compare has 90: 10 tasks at 9 points) a run starts
# without an estimate: it would cost a noticeable share of the run.
ESTIMATE_FROM = 300
# The tasks whose turn counts give the workload's mean (the sample task is the one nearest it).
MEAN_OF = 200


def sample_task(config: benchmark.BenchConfig) -> Any:
    """A task of the workload's mean length: of the first MEAN_OF tasks, the one whose turn count is nearest their
    mean (the first MEAN_OF of a preset's seeded tasks are the same whatever the run's task count)."""
    if config.task_list is not None:
        tasks = list(config.task_list[:MEAN_OF])
    else:
        tasks = attrs.evolve(config, n_tasks=min(config.n_tasks, MEAN_OF)).tasks()
    mean = sum(len(task.turns) for task in tasks) / len(tasks)
    return min(tasks, key=lambda task: abs(len(task.turns) - mean))


def estimate(grid: Sequence[benchmark.DesignRun], workers: int | None) -> str:
    """Roughly how long `grid` takes: one task of the workload's mean length run alone at each point, here, in
    this process, its CPU time times the point's tasks; the points spread over `workers` (None: not known)."""
    config = grid[0].config
    task = sample_task(config)
    alone = attrs.evolve(config, task_list=(task,), n_tasks=1)
    seconds = []
    for run in grid:
        before = time.process_time()
        benchmark.run_design_virtual(run.design, run.decode_tps, alone)
        seconds.append(time.process_time() - before)
    points = [cost * tasks_of(run) for cost, run in zip(seconds, grid)]
    task_runs = sum(tasks_of(run) for run in grid)
    measured = (f"one task of {len(task.turns)} turns, the workload's mean, took {min(seconds):.2f}-{max(seconds):.2f} s "
                "of CPU per point here")
    if workers is None:
        return f"compare: {plural(task_runs, 'task run')}, roughly {_duration(sum(points))} of CPU ({measured})"
    wall = max(sum(points) / workers, max(points))  # a point runs on one worker
    return (f"compare: {plural(task_runs, 'task run')}, roughly {_duration(wall)} on {plural(workers, 'worker')} "
            f"({measured})")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours < 48 else f"{seconds / 86400:.1f} days"


def workload_config(args: argparse.Namespace, network: netem.NetworkProfile) -> tuple[benchmark.BenchConfig, str, list[float]]:
    """The benchmark configuration, a description of its tasks and the decode speeds, from the command line.
    Raises TraceError or ProfileError for a bad trace or file, ValueError for options that do not go together."""
    model = profiles.load_latency(args.latency) if args.latency else benchmark.latency.LatencyModel()
    speeds = args.speeds or ([model.decode_tokens_per_s] if args.latency else list(benchmark.DECODE_SPEEDS))
    if args.trace:
        if args.turns is not None:
            raise ValueError("--turns applies to generated tasks, not to a trace")
        trace = traces.load(args.trace)
        for note in trace.notes:
            print(f"trace note: {note}", file=sys.stderr)
        tasks = trace.tasks[: args.tasks] if args.tasks else trace.tasks
        source = f"trace {trace.path} ({trace.format})"
        config = benchmark.BenchConfig(n_tasks=len(tasks), seed=args.seed, network=network, task_list=tasks,
                                       latency=model, source=source, reconnect=POLICIES[args.reconnect])
        return config, source, speeds
    name = args.preset or wl.DEFAULT_PRESET  # unset: the default (apply_engine_defaults gives vLLM its own)
    preset: str | wl.WorkloadParams = name
    if name not in wl.PRESETS:
        if not Path(name).is_file():
            raise ValueError(f"--preset {name!r} is neither a preset ({', '.join(wl.PRESETS)}) nor a file")
        preset = profiles.load_preset(name)
    config = benchmark.BenchConfig(preset=preset, n_tasks=args.tasks or 10, seed=args.seed, network=network,
                                   fixed_turns=args.turns, latency=model, reconnect=POLICIES[args.reconnect])
    return config, f"the '{name}' workload", speeds


def run_parameters(config: benchmark.BenchConfig, designs: list[str], speeds: list[float]) -> list[tuple[str, str, str]]:
    """The modeled parameters with their sources, as this run used them: its decode speeds, not the defaults, and
    a design's own settings only when it runs."""
    unused = set()
    if benchmark.SUSPENDED not in designs:
        unused.add("v1 suspension TTL")
    if not {benchmark.HTTP, benchmark.HTTP_STORED} & set(designs):
        unused.add("http connections")
    return [(name, ", ".join(f"{s:g}" for s in speeds) + " tokens/s" if name == "decode speeds" else value, source)
            for name, value, source in benchmark.parameters(config) if name not in unused]


def vllm_parameters(parameters: list[tuple[str, str, str]], spec: ModelSpec) -> list[tuple[str, str, str]]:
    """The parameters in effect on vLLM: the engine's own in place of the simulated engine's."""
    kv = f"blocks of {spec.block_size} tokens, prefix caching on" + (
        f", {spec.cpu_kv_cache_gib} GiB (VLLM_CPU_KVCACHE_SPACE)" if spec.cpu_kv_cache_gib is not None else "")
    engine = [
        ("engine", f"vLLM, {spec.name}: {spec.layers} layers, {spec.hidden_size} wide, {spec.dtype}, dummy weights; "
         "forced decoding; real time", "docs/real_engine.md"),
        ("KV cache", kv, "vLLM engine arguments (prototype/engine/vllm_models.py)"),
    ]
    return engine + [row for row in parameters if row[0] not in SIMULATED_ENGINE_PARAMETERS]


def write_results(out: Path, table: list[dict[str, Any]], rows: list[dict[str, Any]], parameters: list[tuple[str, str, str]],
                  workload: str, clock: str, *, command: str = "python -m prototype compare") -> list[str]:
    """compare.csv, compare.json (the table, the parameters, what ran and its headline section: the figures with their
    intervals over the tasks, which `python -m prototype figures` copies into docs/figures/), compare_tasks.json and
    compare.png in `out`; returns their names. `python -m prototype plot` writes the same from results folders."""
    analysis.write_csv(out / "compare.csv", table)
    tasks = max(collections.Counter((row["design"], row["decode_tps"]) for row in rows).values(), default=0)
    section = headline.section(
        "compare", command=command, workload=f"{plural(tasks, 'task')} of {workload}, {clock}",
        figures={key: headline.figure(e, FORMATS[key.split(".")[0]][0], scale=FORMATS[key.split(".")[0]][1])
                 for key, e in headline_estimates(table, rows).items()},
        tables={"table": headline.table([c.header for c in DOCS_TABLE], ([c.show(r) for c in DOCS_TABLE] for r in table))},
        data=rows)
    headline.write(out / "compare.json", {"table": table, "parameters": parameters, "workload": workload, "clock": clock,
                                          "headline": section})
    (out / "compare_tasks.json").write_text(json.dumps(rows))
    figures.compare_figure(table, rows, out / "compare.png", workload=workload, clock=clock)
    return ["compare.csv", "compare.json", "compare_tasks.json", "compare.png"]


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    apply_engine_defaults(args)
    network = attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=args.rtt_ms / 1000)
    try:
        config, described, speeds = workload_config(args, network)
    except (traces.TraceError, profiles.ProfileError, ValueError) as e:
        print(f"python -m prototype compare: error: {e} (see --help)", file=sys.stderr)
        return 2
    # The results appear only when the run completes (RunFolder): a failure or Ctrl-C leaves no folder behind.
    with RunFolder(RESULTS / "compare", args.out) as folder:
        return run_into(folder, args, config, described, speeds, started)


def run_into(folder: RunFolder, args: argparse.Namespace, config: benchmark.BenchConfig, described: str, speeds: list[float],
             started: float) -> int:
    out = folder.path
    designs = [d for d in benchmark.ALL_DESIGNS if d in args.designs]
    if args.engine == VLLM:
        failure = None
        try:
            rows, vllm_lines = run_on_vllm(args, config, designs, out)
        except* (VllmUnavailable, WorkerFailed, ContextTooLong, benchmark.TaskFailed) as group:
            failure = group.exceptions[0]
        if failure is not None:
            print(f"python -m prototype compare: error: --engine vllm: {failure}", file=sys.stderr)
            return 2
        cached, points, cache_root = 0, 0, None
    else:
        with sweep.runner_from_args(args) as runner:
            grid = grid_of(config, designs, speeds, args.real)
            todo = [] if args.real else runner.missing(compare_point, grid)
            if sum(tasks_of(run) for run in todo) >= ESTIMATE_FROM:
                print(estimate(todo, runner.executor.workers), file=sys.stderr, flush=True)
            try:
                rows = run_grid(config, designs, speeds, runner, out, args.real)
            except BaseException as error:
                if not interrupted(error):
                    raise
                kept = (f"; the {plural(runner.executed, 'point')} it finished are in the results cache, and the same "
                        "command computes only the rest" if runner.executed and runner.cache is not None else "")
                print(f"python -m prototype compare: interrupted: no results written{kept}", file=sys.stderr)
                return INTERRUPTED
            cached, points = runner.cached, runner.cached + runner.executed
            cache_root = runner.cache.root if runner.cache is not None else None
    table = benchmark.summarize(rows)
    clock = "real time over loopback sockets" if args.real else "virtual time"
    if args.engine == VLLM:
        clock = f"real time on vLLM ({args.vllm_model}, dummy weights)"
    print(f"\n{plural(len(config.tasks()), 'task')} of {described}, {clock}\n")
    print_compare_table(table, args.wide)
    print_headline(table)
    if args.engine == VLLM:
        print("  tok/s: on vLLM only the name of the model profile the tasks ask for; vLLM decides when each token is ready")
        print("\n" + "\n".join(vllm_lines))
    if cached:
        print(f"\n{cached} of {points} (design, speed) points came from the results cache ({cache_root}): "
              "computed before with the same configuration and code; --no-cache computes them again.")
    parameters = run_parameters(config, designs, speeds)
    if args.engine == VLLM:
        parameters = vllm_parameters(parameters, model_spec(args))
        print("\nParameters in effect (value, source): the engine is vLLM; everything else is modeled")
    else:
        print("\nModeled parameters (value, source):")
    print_parameters(parameters)
    if benchmark.SUSPENDED in designs:
        expiries = sum(1 for task in config.tasks() if any(s > 300 for t in task.turns for s in t.tool_seconds))
        print(f"\n  tasks with a tool call longer than v1's default 300 s suspension TTL: {expiries} of {len(config.tasks())}. "
              f"compare runs v1 with a {benchmark.BENCH_SUSPENSION_TTL:g} s TTL so that every task finishes and the designs "
              "are timed on the same tasks;\n  under `serve`'s default 300 s, v1 would end those tasks with response.failed "
              "(server_error) and the client would have to start them again.")
    reconnects = {f"{row['design']} at {row['decode_tps']:g}": row["reconnects"] for row in table if row["reconnects"]}
    print(f"\n  reconnects ({config.reconnect.name} policy): "
          + (", ".join(f"{k}: {v}" for k, v in reconnects.items()) if reconnects else "none")
          + f"; WebSocket connections close after {benchmark.CONNECTION_LIFETIME_SECONDS / 60:g} minutes (WS guide): under "
          f"{config.reconnect.name} a task longer than that "
          + ("continues on a new connection" if CONNECTION_LIMIT_REACHED in config.reconnect.reconnect_errors else "ends there"))
    command = "python -m prototype compare" + (" " + " ".join(argv) if (argv := _argv_of(args)) else "")
    written = write_results(out, table, rows, parameters, described, clock, command=command)
    # A trace per design: the real engine writes one always, the grid only when it ran at TRACE_SPEED.
    traced = args.engine == VLLM or TRACE_SPEED in speeds
    written += [f"trace_{d}.json" for d in designs if traced]
    if args.engine == VLLM and (out / f"{VLLM_CALLS}.csv").exists():
        written += [f"{VLLM_CALLS}.csv", f"{VLLM_CALLS}.json"]
    out = folder.publish()
    print(f"\nwrote {out}/{', '.join(written)} in {time.perf_counter() - started:.1f} s")
    return 0


__all__ = ["CHAINED", "SUSPENDED", "add_arguments", "run", "netem"]
