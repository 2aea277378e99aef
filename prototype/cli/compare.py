"""`python -m prototype compare`: the three designs side by side, at 65, 1000 and 4000 tokens/s.

The tasks are a preset's seeded tasks (`--preset coding`, or a preset file that `calibrate` wrote) or a trace's
(`--trace PATH`: a testbed JSONL, TraceLab JSONL or CSV, or Codex rollout file, or a folder of Codex rollouts;
prototype/traces/). A trace with arrival times replays open-loop: each task starts when it started.
`--latency FILE` replaces the engine's prefill rate and overhead with a fitted profile and, unless `--speeds` is
given, runs at its decode rate only.

Runs every (design, decode speed) pair on the same tasks under virtual time, in parallel
worker processes, with a progress bar; prints the table and every modeled parameter with its
source; writes results/compare.csv, compare.json, compare_tasks.json, compare.png and one Chrome
trace per design (trace_<design>.json, first task at 1000 tokens/s). Columns (compare.csv):

  design, decode_tps         the design and the simulated decode speed (tokens/s)
  tasks                      tasks run (the same seeded tasks for every design)
  e2e_p50_s, e2e_p90_s       end-to-end time per task (first request to final answer), seconds
  speedup_vs_http            total http time / total time of this design, same tasks
  ttft_p50_ms                per-turn time to first token (request sent to first delta), median
  api_overhead_share         API work (validate, safety, render, route, store reads, blocking post)
                             as a share of end-to-end wall time
  bytes_sent_per_turn        client-to-server payload bytes per turn (request bodies / frames)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from .. import benchmark, netem, profiles, traces
from .. import workload as wl
from ..client.harness import CHAINED, SUSPENDED
from ..trace import write_trace

TRACE_SPEED = 1000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=None, help="tasks per design and speed (default 10; with --trace, all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="coding", help="workload preset: coding, chat, long, or a preset JSON file (calibrate --preset-out)")
    parser.add_argument("--trace", help="replay a trace's tasks instead of a preset (file or folder of Codex rollouts)")
    parser.add_argument("--latency", help="latency profile JSON (calibrate --latency-out): prefill rate, overhead, decode rate")
    parser.add_argument("--speeds", type=float, nargs="+", default=None,
                        help="decode speeds, tokens/s (default 65 1000 4000; with --latency, the profile's)")
    parser.add_argument("--designs", nargs="+", default=list(benchmark.DESIGNS), choices=list(benchmark.ALL_DESIGNS))
    parser.add_argument("--rtt-ms", type=float, default=benchmark.DEFAULT_NETWORK.rtt * 1000)
    parser.add_argument("--turns", type=int, default=None, help="fix the number of turns per task")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", default="results", help="results folder (default results/)")
    parser.add_argument("--real", action="store_true", help="real time over loopback sockets instead of virtual time "
                        "(use a small configuration: e.g. --tasks 1 --turns 3 --speeds 1000)")


def _run_one(job: tuple[str, float, benchmark.BenchConfig, str, bool]) -> tuple[str, float, list[dict[str, Any]], float]:
    design, tps, config, out, real = job
    start = time.perf_counter()
    records = (benchmark.run_design_real if real else benchmark.run_design_virtual)(design, tps, config)
    if tps == TRACE_SPEED:
        write_trace(records[:1], Path(out) / f"trace_{design}.json")
    return design, tps, [benchmark.task_row(design, tps, r) for r in records], time.perf_counter() - start


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs, {time.perf_counter() - started:5.1f} s")
    sys.stderr.flush()


def run_grid(config: benchmark.BenchConfig, designs: list[str], speeds: list[float], jobs: int, out: Path, real: bool = False) -> list[dict[str, Any]]:
    grid = [(d, s, config, str(out), real) for s in speeds for d in designs]
    # Slowest first (low decode speed, http) so two workers finish together.
    grid.sort(key=lambda job: (job[1], job[0] != benchmark.HTTP))
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    _progress(0, len(grid), started)
    if jobs <= 1:
        results = map(_run_one, grid)
        pool = None
    else:
        pool = multiprocessing.get_context("spawn").Pool(min(jobs, len(grid)))
        results = pool.imap_unordered(_run_one, grid)
    try:
        for done, (_, _, task_rows, _) in enumerate(results, start=1):
            rows += task_rows
            _progress(done, len(grid), started)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    sys.stderr.write("\n")
    return rows


def draw(table: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> None:
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
    import numpy as np

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


def print_table(table: list[dict[str, Any]]) -> None:
    header = f"{'design':>12} {'tok/s':>6} {'tasks':>5} {'e2e p50 s':>10} {'e2e p90 s':>10} {'vs http':>8} {'TTFT p50 ms':>12} {'API share':>10} {'B sent/turn':>12}"
    print(header)
    print("-" * len(header))
    for r in table:
        print(f"{r['design']:>12} {r['decode_tps']:>6g} {r['tasks']:>5} {r['e2e_p50_s']:>10.2f} {r['e2e_p90_s']:>10.2f} "
              f"{r['speedup_vs_http']:>7.2f}x {r['ttft_p50_ms']:>12.1f} {100 * r['api_overhead_share']:>9.1f}% {r['bytes_sent_per_turn']:>12.0f}")


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
                                       latency=model, source=source)
        return config, source, speeds
    preset: str | wl.WorkloadParams = args.preset
    if args.preset not in wl.PRESETS:
        if not Path(args.preset).is_file():
            raise ValueError(f"--preset {args.preset!r} is neither a preset ({', '.join(wl.PRESETS)}) nor a file")
        preset = profiles.load_preset(args.preset)
    config = benchmark.BenchConfig(preset=preset, n_tasks=args.tasks or 10, seed=args.seed, network=network,
                                   fixed_turns=args.turns, latency=model)
    return config, f"the '{args.preset}' workload", speeds


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    network = attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=args.rtt_ms / 1000)
    try:
        config, described, speeds = workload_config(args, network)
    except (traces.TraceError, profiles.ProfileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    designs = [d for d in benchmark.ALL_DESIGNS if d in args.designs]
    # Real time runs one configuration at a time: parallel workers would share the two cores and
    # slow each other's clocks.
    rows = run_grid(config, designs, speeds, 1 if args.real else args.jobs, out, args.real)
    table = benchmark.summarize(rows)
    clock = "real time over loopback sockets" if args.real else "virtual time"
    print(f"\n{len(config.tasks())} tasks of {described}, {clock}; speed-up = http time / design time\n")
    print_table(table)
    print("\nModeled parameters (value, source):")
    for name, value, source in benchmark.parameters(config):
        print(f"  {name:<44} {value:<44} {source}")
    expiries = sum(1 for task in config.tasks() if any(s > 300 for t in task.turns for s in t.tool_seconds))
    print(f"\n  tasks with a tool call over v1's default 300 s suspension TTL: {expiries} of {len(config.tasks())}")
    import csv

    with (out / "compare.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    (out / "compare.json").write_text(json.dumps({"table": table, "parameters": benchmark.parameters(config)}, indent=1))
    (out / "compare_tasks.json").write_text(json.dumps(rows))
    draw(table, rows, out / "compare.png")
    print(f"\nwrote {out}/compare.csv, compare.json, compare_tasks.json, compare.png, "
          f"{', '.join(f'trace_{d}.json' for d in designs if TRACE_SPEED in speeds)} in {time.perf_counter() - started:.1f} s")
    return 0


__all__ = ["CHAINED", "SUSPENDED", "add_arguments", "run", "netem"]
