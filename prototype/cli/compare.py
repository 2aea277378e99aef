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

This module is the command: its options, the workload they choose, the grid's run (or the real engine's) and the
order of what it prints and writes. The printed table, headline and parameters are compare_table.py's, the files a
run writes compare_results.py's, and what differs on the real engine (`--engine vllm`) compare_vllm.py's; their
names are importable from here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from .. import analysis, benchmark, figures, netem, profiles, sweep, traces
from .. import workload as wl
from ..client.harness import CHAINED, SUSPENDED, RolloutRecord
from ..client.reconnect import CODEX, POLICIES
from ..engine.vllm_client import VllmUnavailable, WorkerFailed
from ..engine.vllm_engine import RealCall, call_records
from ..protocol.errors import CONNECTION_LIMIT_REACHED
from ..trace import write_chrome_trace
from .common import INTERRUPTED, RunFolder, add_list, at_least, interrupted, non_negative, plural, positive
from .compare_results import DOCS_TABLE, FORMATS, headline_estimates, write_results
from .compare_table import TABLE, WIDE, Column, print_compare_table, print_headline, print_parameters
from .compare_table import _number as _number
from .compare_vllm import VLLM_CALLS, VLLM_DEFAULTS, ContextTooLong, apply_engine_defaults, vllm_parameters, vllm_report
from .engine_options import VLLM, add_engine_arguments, model_spec

TRACE_SPEED = 1000.0


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
                kept = (f"; the results cache keeps the {plural(runner.executed, 'point')} it finished, and the same "
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


__all__ = [
    "CHAINED", "DOCS_TABLE", "FORMATS", "SUSPENDED", "TABLE", "WIDE", "Column", "ContextTooLong", "add_arguments",
    "apply_engine_defaults", "figures", "headline_estimates", "netem", "print_compare_table", "print_headline", "print_parameters", "run",
    "vllm_parameters", "vllm_report", "write_results",
]
