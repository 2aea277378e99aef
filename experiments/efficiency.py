"""Implementation efficiency: how close the testbed's real-time runs come to the physical limit.

Each design runs the default (coding) workload in real time over loopback sockets with every modeled
cost that is not inference or tool time set to zero: no RTT (netem.LOOPBACK), no modeled API stage
(ZERO_COSTS); the real CPU work of validating, rendering, tokenizing, framing and parsing is still
done. The limit of a task is the sum, over its turns, of the engine's modeled inference time
(request overhead + prefill + decode, and hosted tool time if any) and the client's tool time: what
a testbed with infinitely fast code would take. It is measured by running the same tasks on the
virtual clock, where code costs no time (the sum of the server's modeled phases is printed next to
it as a check). Efficiency = limit / measured real end-to-end time.

Both sides are charged exactly the same modeled costs: the engine's request overhead, prefill and
decode, the network profile and the (zero) API stage costs. Nothing is subtracted from the real
run to make room for the testbed's own CPU work (the scripted policy included), so everything the
code costs shows up as lost efficiency.

The compact preset's tool calls average ~10 s, so a real-time run of its tasks takes minutes: tool
times are multiplied by `--tool-scale` (default 0.01), which the output states.

    python -m experiments.efficiency [--tasks 1] [--trace PATH] [--tool-scale 0.01] [--speeds 65 1000 4000]
"""

from __future__ import annotations

from typing import Any

import attrs

from prototype import benchmark, metrics, netem, sweep, traces
from prototype import workload as wl
from prototype.api.costs import ZERO_COSTS
from prototype.cli.common import at_least, non_negative, positive

from .common import add_list, experiment_parser, report

# The WebSocket designs' targets, on an idle machine: 0.997 leaves the testbed's own work ~2.0 ms a
# turn at 1000 tokens/s and ~1.3 ms at 4000 on the 17-turn compact task (docs/speed.md).
TARGETS = {1000.0: 0.997, 4000.0: 0.997}
LIMIT_PHASES = (metrics.QUEUE, metrics.PREFILL, metrics.DECODE, metrics.HOSTED_TOOL)
COLUMNS = ("design", "decode_tps", "tasks", "turns", "limit_s", "phase_sum_s", "real_s", "efficiency", "target", "met")


def scaled_tasks(n_tasks: int, seed: int, tool_scale: float, max_turns: int | None,
                 trace: str | None = None) -> tuple[wl.Workload, ...]:
    tasks = []
    source = traces.load(trace).tasks[:n_tasks] if trace else wl.generate("compact", seed=seed, n_tasks=n_tasks)
    for task in source:
        turns = list(task.turns)
        if max_turns is not None and len(turns) > max_turns:
            turns = turns[: max_turns - 1] + [attrs.evolve(turns[-1], tool_seconds=())]
        turns = [attrs.evolve(t, tool_seconds=tuple(s * tool_scale for s in t.tool_seconds)) for t in turns]
        tasks.append(attrs.evolve(task, turns=tuple(turns), arrival_s=None))  # one task after another
    return tuple(tasks)


def bench_config(tasks: tuple[wl.Workload, ...], flush_interval: float = benchmark.BENCH_FLUSH_INTERVAL) -> benchmark.BenchConfig:
    """The runs' configuration: loopback with RTT 0, API stage costs zero, deltas coalesced every `flush_interval`."""
    return benchmark.BenchConfig(task_list=tasks, network=netem.LOOPBACK, costs=ZERO_COSTS, flush_interval=flush_interval)


def modeled_seconds(records: list) -> float:
    """Sum over every turn of the server's modeled inference phases plus the client's tool time."""
    total = 0.0
    for record in records:
        for turn in record.turns:
            phases = (turn.server_timing or {}).get("phases_ms") or {}
            total += sum(phases.get(k, 0.0) for k in LIMIT_PHASES) / 1000 + turn.tool_seconds
    return total


def measure(design: str, tps: float, config: benchmark.BenchConfig) -> dict[str, Any]:
    virtual = benchmark.run_design_virtual(design, tps, config)
    real = benchmark.run_design_real(design, tps, config)
    limit = sum(r.seconds for r in virtual)
    real_s = sum(r.seconds for r in real)
    target = TARGETS.get(tps) if design in (benchmark.CHAINED, benchmark.SUSPENDED) else None
    return {
        "design": design,
        "decode_tps": tps,
        "tasks": len(real),
        "turns": sum(len(r.turns) for r in real),
        "limit_s": limit,
        "phase_sum_s": modeled_seconds(virtual),
        "real_s": real_s,
        "efficiency": limit / real_s,
        "target": "" if target is None else target,
        "met": "" if target is None else limit / real_s >= target,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=at_least(1), default=1, help="compact tasks, seed 0, or a trace's first tasks (default 1)")
    parser.add_argument("--trace", help="run this trace's tasks (prototype/traces) instead of generated ones")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed (default 0)")
    parser.add_argument("--tool-scale", type=non_negative(float), default=0.01, help="multiply every tool time by this (default 0.01)")
    parser.add_argument("--max-turns", type=at_least(1), default=None, help="cut each task to this many turns (default: all)")
    add_list(parser, "--speeds", positive(float), benchmark.DECODE_SPEEDS, "decode speeds in tokens/s")
    add_list(parser, "--designs", str, benchmark.DESIGNS, "designs to run", choices=list(benchmark.ALL_DESIGNS))
    parser.add_argument("--flush-interval", type=non_negative(float), default=benchmark.BENCH_FLUSH_INTERVAL,
                        help=f"coalesce text deltas at most this often, in seconds (default {benchmark.BENCH_FLUSH_INTERVAL:g})")
    parser.add_argument("--csv", default="efficiency.csv", help="CSV file name in results/efficiency/<timestamp>/ (default efficiency.csv)")
    args = parser.parse_args(argv)
    tasks = scaled_tasks(args.tasks, args.seed, args.tool_scale, args.max_turns, args.trace)
    config = bench_config(tasks, args.flush_interval)
    print(
        f"{f'trace {args.trace}' if args.trace else f'compact workload, seed {args.seed}'}: {len(tasks)} task(s) ({sum(len(t.turns) for t in tasks)} turns"
        f"{'' if args.max_turns is None else f', cut to {args.max_turns}'}), tool times x {args.tool_scale:g} "
        f"(scaled: {sum(sum(s) for t in tasks for s in (x.tool_seconds for x in t.turns)):.2f} s in all); "
        f"RTT 0, API stage costs zero, deltas coalesced every {args.flush_interval * 1000:g} ms; "
        "limit = virtual-clock e2e (inference + tool time)",
        flush=True,
    )
    grid = [benchmark.DesignRun(design, tps, config) for tps in args.speeds for design in args.designs]
    rows = sweep.measured(lambda run: measure(run.design, run.decode_tps, run.config), grid, desc="efficiency")
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    main()
