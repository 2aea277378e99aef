"""`python -m prototype compare`: the three designs side by side, at 65, 1000 and 4000 tokens/s.

The tasks are a preset's seeded tasks (`--preset coding`, or a preset file that `calibrate` wrote) or a trace's
(`--trace PATH`: a testbed JSONL, TraceLab JSONL or CSV, or Codex rollout file, or a folder of Codex rollouts;
prototype/traces/). A trace with arrival times replays open-loop: each task starts when it started.
`--latency FILE` replaces the engine's prefill rate and overhead with a fitted profile and, unless `--speeds` is
given, runs at its decode rate only.

Runs every (design, decode speed) pair on the same tasks under virtual time through the sweep
runner (prototype/sweep.py: worker processes or a Dask cluster, a results cache, a progress bar);
prints the table and every modeled parameter with its source; writes compare.csv, compare.json,
compare_tasks.json, compare.png and one Chrome trace per design (trace_<design>.json, first task at
1000 tokens/s) into a new folder results/compare/<timestamp>/, with results/compare/latest pointing
at the newest. Columns (compare.csv):

  design, decode_tps         the design and the simulated decode speed (tokens/s)
  tasks                      tasks run (the same seeded tasks for every design)
  e2e_p50_s, e2e_p90_s       end-to-end time per task (first request to final answer), seconds
  speedup_vs_http            total http time / total time of this design, same tasks
  ttft_p50_ms                per-turn time to first token (request sent to first delta), median
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
The per-turn figures follow one definition for every design (docs/metrics.md). The printed table shows
the columns of TABLE (units in the headers, a legend under it); `--wide` prints every column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .. import analysis, benchmark, figures, netem, profiles, sweep, traces
from .. import workload as wl
from ..client.harness import CHAINED, SUSPENDED, RolloutRecord
from ..client.reconnect import CODEX, POLICIES
from ..engine.vllm_client import VllmUnavailable, WorkerFailed
from ..protocol.errors import CONNECTION_LIMIT_REACHED
from ..trace import write_chrome_trace
from .common import add_list, at_least, new_run_folder, non_negative, positive
from .engine_options import VLLM, add_engine_arguments, model_spec

TRACE_SPEED = 1000.0


@attrs.frozen
class Column:
    """A column of the printed table: the CSV field, its header with the unit, how a cell prints, and what the
    legend under the table says of it (empty: the header says enough)."""

    field: str
    header: str
    cell: Callable[[Any], str]
    legend: str = ""


def _number(template: str, scale: float = 1.0) -> Callable[[Any], str]:
    return lambda value: "-" if value is None or value != value else template.format(value * scale)


# The table a reader needs first: what ran, how long a task took, the gain over http, time to first
# token, the API's share of the time and the upload per turn; `--wide` adds the rest.
TABLE = (
    Column("design", "design", str),
    Column("decode_tps", "tok/s", _number("{:,.0f}")),
    Column("e2e_p50_s", "e2e p50 (s)", _number("{:,.1f}"), "end-to-end time per task, first request to final answer"),
    Column("speedup_vs_http", "vs http (x)", _number("{:.2f}"), "total http time / total time of this design, same tasks"),
    Column("ttft_p50_ms", "TTFT p50 (ms)", _number("{:,.0f}"), "per turn, request sent to first output delta"),
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
    Column("e2e_p90_s", "e2e p90 (s)", _number("{:,.1f}")),
    *TABLE[3:],
    Column("bytes_received_per_turn", "recv/turn (kB)", _number("{:,.1f}", 1e-3), "server-to-client payload per turn, the same way"),
    Column("cached_share", "cached (%)", _number("{:.1f}", 100),
           "cached_share, the share of input tokens found in the engine's prefix cache (not prefilled again)"),
    Column("reasoning_share", "reasoning (%)", _number("{:.1f}", 100), "reasoning tokens as a share of output tokens"),
    Column("web_searches_per_task", "searches/task", _number("{:.2f}"), "hosted web_search calls per task"),
    Column("calls_per_tool_turn", "calls/tool turn", _number("{:.2f}"), "client function calls per turn that ended in calls"),
    Column("reconnects", "reconnects", str, "new connections the clients opened because one ended before the task did "
           "(the 60-minute connection limit, or a fault); --reconnect picks the policy"),
)


def print_compare_table(table: list[dict[str, Any]], wide: bool = False) -> None:
    """The table with units in the headers and one number format per column, then its legend. `wide`: every
    column of compare.csv (one this module does not know prints under its CSV name)."""
    columns = list(WIDE if wide else TABLE)
    if wide:
        known = {c.field for c in columns}
        columns += [Column(field, field, analysis.format_value) for field in table[0] if field not in known]
    analysis.print_table(table, [c.field for c in columns], formats={c.field: c.cell for c in columns},
                         headers={c.field: c.header for c in columns})
    for column in columns:
        if column.legend:
            print(textwrap.fill(f"{column.header}: {column.legend}", 100, initial_indent="  ", subsequent_indent="      "))
# The results folder: $TESTBED_RESULTS, else <repo>/results (git-ignored).
RESULTS = Path(os.environ.get("TESTBED_RESULTS", Path(__file__).resolve().parents[2] / "results"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=at_least(1), default=None, help="tasks per design and speed (default 10; with --trace, all)")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed: the same seed gives the same tasks (default 0)")
    parser.add_argument("--preset", default="coding", help="workload preset: coding, chat, long, or a preset JSON file (calibrate --preset-out)")
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


def run_on_vllm(args: argparse.Namespace, config: benchmark.BenchConfig, designs: list[str], out: Path) -> list[dict[str, Any]]:
    """Every design once over the real engine, in real time: task rows as for the simulated engine
    (the decode speed column names the model profile only), and one trace per design."""
    spec = model_spec(args)
    for task in config.tasks():
        # The rendered prompt is longer still (item framing): this catches what cannot fit before vLLM starts.
        if (context := task.context_before(len(task.turns))) >= spec.max_model_len:
            raise ContextTooLong(f"task {task.name} reaches {context:,} tokens of context, more than {spec.name}'s "
                                 f"context window of {spec.max_model_len:,} (fewer --turns, or another --vllm-model)")
    results = benchmark.run_designs_on_vllm(designs, config, spec, python=args.vllm_python, decode_tps=TRACE_SPEED,
                                            parallel=args.vllm_parallel)
    rows: list[dict[str, Any]] = []
    for design, (records, calls) in results.items():
        rows += [benchmark.task_row(design, TRACE_SPEED, record) for record in records]
        write_chrome_trace(records[:1], out / f"trace_{design}.json")
        computed = sum(call.prefill_tokens for call in calls)
        prompt = sum(call.prompt_tokens for call in calls)
        print(f"vllm {design:<12} model calls {len(calls):>4}  prompt tokens {prompt:>9,}  prefill computed {computed:>9,}"
              f"  prefix-cache hits {sum(call.prefix_hits for call in calls):>9,}")
    return rows


def compare_point(run: benchmark.DesignRun) -> tuple[list[dict[str, Any]], RolloutRecord | None]:
    """One (design, speed) point: its task rows, and its first rollout at TRACE_SPEED (for the trace)."""
    records = run.records()
    return [benchmark.task_row(run.design, run.decode_tps, r) for r in records], records[0] if run.decode_tps == TRACE_SPEED else None


def run_grid(config: benchmark.BenchConfig, designs: list[str], speeds: list[float], runner: sweep.Runner, out: Path,
             real: bool = False) -> list[dict[str, Any]]:
    grid = [benchmark.DesignRun(d, s, config, real) for s in speeds for d in designs]
    # Slowest first (low decode speed, http) so the workers finish together. Real time runs one
    # configuration at a time in this process: parallel runs would share the cores and slow each
    # other's clocks.
    results = runner.map(compare_point, grid, desc="compare", first=lambda run: (run.decode_tps, run.design != benchmark.HTTP),
                         measured=real)
    rows: list[dict[str, Any]] = []
    for run, (task_rows, traced) in zip(grid, results):
        rows += task_rows
        if traced is not None:
            write_chrome_trace([traced], out / f"trace_{run.design}.json")
    return rows


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
    preset: str | wl.WorkloadParams = args.preset
    if args.preset not in wl.PRESETS:
        if not Path(args.preset).is_file():
            raise ValueError(f"--preset {args.preset!r} is neither a preset ({', '.join(wl.PRESETS)}) nor a file")
        preset = profiles.load_preset(args.preset)
    config = benchmark.BenchConfig(preset=preset, n_tasks=args.tasks or 10, seed=args.seed, network=network,
                                   fixed_turns=args.turns, latency=model, reconnect=POLICIES[args.reconnect])
    return config, f"the '{args.preset}' workload", speeds


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


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    network = attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=args.rtt_ms / 1000)
    try:
        config, described, speeds = workload_config(args, network)
    except (traces.TraceError, profiles.ProfileError, ValueError) as e:
        print(f"python -m prototype compare: error: {e} (see --help)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else new_run_folder(RESULTS / "compare")
    out.mkdir(parents=True, exist_ok=True)
    designs = [d for d in benchmark.ALL_DESIGNS if d in args.designs]
    if args.engine == VLLM:
        failure = None
        try:
            rows = run_on_vllm(args, config, designs, out)
        except* (VllmUnavailable, WorkerFailed, ContextTooLong, benchmark.TaskFailed) as group:
            failure = group.exceptions[0]
        if failure is not None:
            print(f"python -m prototype compare: error: --engine vllm: {failure}", file=sys.stderr)
            return 2
        cached, points, cache_root = 0, 0, None
    else:
        with sweep.runner_from_args(args) as runner:
            rows = run_grid(config, designs, speeds, runner, out, args.real)
            cached, points = runner.cached, runner.cached + runner.executed
            cache_root = runner.cache.root if runner.cache is not None else None
    table = benchmark.summarize(rows)
    clock = "real time over loopback sockets" if args.real else "virtual time"
    if args.engine == VLLM:
        clock = f"real time on vLLM ({args.vllm_model}, dummy weights)"
    print(f"\n{len(config.tasks())} tasks of {described}, {clock}\n")
    print_compare_table(table, args.wide)
    if cached:
        print(f"\n{cached} of {points} (design, speed) points came from the results cache ({cache_root}): "
              "computed before with the same configuration and code; --no-cache computes them again.")
    parameters = run_parameters(config, designs, speeds)
    print("\nModeled parameters (value, source):")
    for name, value, source in parameters:
        print(f"  {name:<44} {value:<44} {source}")
    if benchmark.SUSPENDED in designs:
        expiries = sum(1 for task in config.tasks() if any(s > 300 for t in task.turns for s in t.tool_seconds))
        print(f"\n  tasks with a tool call longer than v1's default 300 s suspension TTL: {expiries} of {len(config.tasks())}. "
              f"compare runs v1 with a {benchmark.BENCH_SUSPENSION_TTL:g} s TTL so that every task finishes and the designs "
              "are timed on the same tasks;\n  under `serve`'s default 300 s, v1 would end those tasks with response.failed "
              "(suspension_timeout) and the client would have to start them again.")
    reconnects = {f"{row['design']} at {row['decode_tps']:g}": row["reconnects"] for row in table if row["reconnects"]}
    print(f"\n  reconnects ({config.reconnect.name} policy): "
          + (", ".join(f"{k}: {v}" for k, v in reconnects.items()) if reconnects else "none")
          + f"; WebSocket connections close after {benchmark.CONNECTION_LIFETIME_SECONDS / 60:g} minutes (WS guide): under "
          f"{config.reconnect.name} a task longer than that "
          + ("continues on a new connection" if CONNECTION_LIMIT_REACHED in config.reconnect.reconnect_errors else "ends there"))
    analysis.write_csv(out / "compare.csv", table)
    (out / "compare.json").write_text(json.dumps({"table": table, "parameters": parameters}, indent=1))
    (out / "compare_tasks.json").write_text(json.dumps(rows))
    figures.compare_figure(table, rows, out / "compare.png", workload=described, clock=clock)
    # A trace per design: the real engine writes one always, the grid only when it ran at TRACE_SPEED.
    traced = args.engine == VLLM or TRACE_SPEED in speeds
    written = ["compare.csv", "compare.json", "compare_tasks.json", "compare.png", *(f"trace_{d}.json" for d in designs if traced)]
    print(f"\nwrote {out}/{', '.join(written)} in {time.perf_counter() - started:.1f} s")
    return 0


__all__ = ["CHAINED", "SUSPENDED", "add_arguments", "run", "netem"]
