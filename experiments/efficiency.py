"""Implementation efficiency: how close the testbed's real-time runs come to the physical limit, and how
far they stay from what their stack allows.

Each design runs the default (coding) workload in real time over loopback sockets with every modeled
cost that is not inference or tool time set to zero: no RTT (netem.LOOPBACK), no modeled API stage
(ZERO_COSTS); the real CPU work of validating, rendering, tokenizing, framing and parsing is still
done. The limit of a task is the sum, over its turns, of the engine's modeled inference time
(request overhead + prefill + decode, and hosted tool time if any) and the client's tool time: what
a testbed with infinitely fast code would take. It is measured by running the same tasks on the
virtual clock, where code costs no time (the sum of the server's modeled phases is printed next to
it as a check). Both sides are charged exactly the same modeled costs; nothing is subtracted from
the real run to make room for the testbed's own CPU work (the scripted policy included).

A turn's span runs from the previous turn's end (the task's start, for the first) to its own end,
so the spans add up to the task's time on either clock. Per design and speed:

* `efficiency` = limit / real time, with a paired bootstrap interval over the turns (a turn's real
  and virtual spans resampled together);
* `overhead_ms` = (real - limit) / turns, the real time a turn beyond the model, with a bootstrap
  interval over the turns; the first turn's span holds the connection's opening, which the
  virtual clock does at no cost;
* `floor_ms`: the stack's floor (experiments/stack_floor.py), played in this process right before
  the design's real run: a client and a server with none of the testbed's logic exchange one
  message each way a turn on the same stack, the request the size of the design's median request on
  this task (a chained create ~50 KB, a v1 append ~6 KB) and the terminal event the size of a
  response object (~47 KB); its mean turn, with a bootstrap interval over `--floor-turns` turns;
* `efficiency_bound` = limit / (limit + turns x floor): the highest efficiency the floor leaves
  this task (its interval from the floor's);
* `beyond_floor_ms` = overhead - floor: the testbed's own cost a turn on this machine, with an
  interval from resampling the task's turns and the floor's turns each on its own;
* `met`: whether `beyond_floor_ms` is within `TARGET_BEYOND_FLOOR_MS`, decided on the interval:
  `yes` when its upper end is within the target, `no` when its lower end is beyond it, `not
  separated` otherwise; `loaded` when the machine's 1-minute load average (`load_avg`, the higher
  of the row's start and end) was above its number of cores: other jobs then took the cores at
  moments the floor and the run do not share, and the target is not judged.

The floor and the target are the WebSocket designs': an http turn is a POST and an SSE stream over
h11, which the floor (a WebSocket message each way) does not time, so its floor columns are empty.

The compact preset's tool calls average ~10 s, so a real-time run of its tasks takes minutes: tool
times are multiplied by `--tool-scale` (default 0.01), which the output states.

    python -m experiments.efficiency [--tasks 1] [--trace PATH] [--tool-scale 0.01] [--speeds 65 1000 4000] [--floor-turns 20]
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from prototype import benchmark, metrics, netem, sweep, traces, uncertainty
from prototype import workload as wl
from prototype.api.costs import ZERO_COSTS
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.harness import RolloutRecord

from . import stack_floor
from .common import add_list, experiment_parser, report

# The testbed's own cost a turn beyond the stack's floor, for the WebSocket designs: at most 1 ms
# (docs/speed.md, "Targets"). What the testbed must add to a turn's critical path is the work between
# the last token and the terminal event, a fraction of the 1.6-2.1 ms of server logic a turn costs in
# all (profile_turn), most of which runs while the model decodes. The floor itself is several
# milliseconds a turn on the 2-core machine, so a target stated as an efficiency would measure the stack.
TARGET_BEYOND_FLOOR_MS = 1.0
WEBSOCKET_DESIGNS = (benchmark.CHAINED, benchmark.SUSPENDED)
LIMIT_PHASES = (metrics.QUEUE, metrics.PREFILL, metrics.DECODE, metrics.HOSTED_TOOL)
FLOOR_WAIT_S = 0.2  # the floor's modeled wait at each end: the task's tools (x 0.01) and prefills are 0.03-0.55 s
COLUMNS = (
    "design", "decode_tps", "tasks", "turns", "limit_s", "phase_sum_s", "real_s",
    "efficiency", "efficiency_low", "efficiency_high",
    "overhead_ms", "overhead_low_ms", "overhead_high_ms",
    "floor_ms", "floor_low_ms", "floor_high_ms", "floor_turns",
    "efficiency_bound", "bound_low", "bound_high",
    "beyond_floor_ms", "beyond_floor_low_ms", "beyond_floor_high_ms", "target_ms", "met", "load_avg",
)


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


def turn_spans(records: Sequence[RolloutRecord]) -> list[float]:
    """Each turn's seconds from the previous turn's end (the task's start, for the first) to its own
    end, the last turn's to the task's end: a task's spans add up to its time."""
    spans = []
    for record in records:
        ends = [turn.ended_at for turn in record.turns[:-1]] + [record.ended_at]
        starts = [record.started_at, *ends[:-1]]
        spans += [end - start for start, end in zip(starts, ends)]
    return spans


def request_bytes(records: Sequence[RolloutRecord]) -> int:
    """The median request a turn of these records sent, in bytes: the size the floor plays."""
    return int(statistics.median(turn.bytes_sent for record in records for turn in record.turns))


def machine_loaded(load_avg: float, cores: int | None = None) -> bool:
    """Whether other jobs shared the machine during a run: a 1-minute load average above its number of
    cores (the experiment itself counts for about one)."""
    return load_avg > (cores if cores is not None else os.cpu_count() or 1)


def verdict(estimate: uncertainty.Estimate, target: float) -> str:
    """Whether `estimate` is at most `target`, on its interval."""
    if not estimate.has_interval:
        return "not separated"
    if estimate.high <= target:
        return "yes"
    return "no" if estimate.low > target else "not separated"


def figures(virtual_spans: Sequence[float], real_spans: Sequence[float], floor_s: Sequence[float] | None) -> dict[str, Any]:
    """The row's figures from the turns' spans on both clocks and the floor's turns (None: no floor)."""
    if len(virtual_spans) != len(real_spans):
        raise ValueError(f"the real run has {len(real_spans)} turns and the virtual one {len(virtual_spans)}")
    virtual, real = np.asarray(virtual_spans, dtype=float), np.asarray(real_spans, dtype=float)
    limit, turns = float(virtual.sum()), len(virtual)
    efficiency = uncertainty.paired_bootstrap(virtual, real, lambda v, r: v.sum() / r.sum(), of="turns")
    overhead = uncertainty.bootstrap(real - virtual, np.mean, of="turns").scaled(1000)
    row: dict[str, Any] = {
        "turns": turns, "limit_s": limit, "real_s": float(real.sum()),
        "efficiency": efficiency.value, "efficiency_low": efficiency.low, "efficiency_high": efficiency.high,
        "overhead_ms": overhead.value, "overhead_low_ms": overhead.low, "overhead_high_ms": overhead.high,
    }
    if floor_s is None:
        return row | dict.fromkeys(COLUMNS[COLUMNS.index("floor_ms"):COLUMNS.index("load_avg")], "")
    floor = uncertainty.bootstrap(floor_s, np.mean, of="turns")
    beyond = uncertainty.unpaired_bootstrap(real - virtual, floor_s, lambda a, b: np.mean(a) - np.mean(b), of="turns").scaled(1000)
    return row | {
        "floor_ms": 1000 * floor.value, "floor_low_ms": 1000 * floor.low, "floor_high_ms": 1000 * floor.high, "floor_turns": floor.n,
        "efficiency_bound": stack_floor.efficiency_bound(floor.value, turns, limit),
        "bound_low": stack_floor.efficiency_bound(floor.high, turns, limit),
        "bound_high": stack_floor.efficiency_bound(floor.low, turns, limit),
        "beyond_floor_ms": beyond.value, "beyond_floor_low_ms": beyond.low, "beyond_floor_high_ms": beyond.high,
        "target_ms": TARGET_BEYOND_FLOOR_MS, "met": verdict(beyond, TARGET_BEYOND_FLOOR_MS),
    }


def measure(design: str, tps: float, config: benchmark.BenchConfig, floor_turns: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    virtual = benchmark.run_design_virtual(design, tps, config)
    floor = None
    if design in WEBSOCKET_DESIGNS:  # right before the real run: the same process, the same machine state
        floor = stack_floor.floor_seconds(stack_floor.played_turns(floor_turns, FLOOR_WAIT_S, request_bytes(virtual)))
    real = benchmark.run_design_real(design, tps, config)
    row = {"design": design, "decode_tps": tps, "tasks": len(real), "phase_sum_s": modeled_seconds(virtual)}
    row |= figures(turn_spans(virtual), turn_spans(real), floor)
    row["load_avg"] = max(load, os.getloadavg()[0])
    if floor is not None and machine_loaded(row["load_avg"]):
        row["met"] = "loaded"
    return {column: row[column] for column in COLUMNS}


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
    parser.add_argument("--floor-turns", type=at_least(2), default=20,
                        help=f"turns of the stack's floor played before each WebSocket design's run, {FLOOR_WAIT_S:g} s of wait at each end (default 20)")
    parser.add_argument("--csv", default="efficiency.csv", help="CSV file name in results/efficiency/<timestamp>/ (default efficiency.csv)")
    args = parser.parse_args(argv)
    tasks = scaled_tasks(args.tasks, args.seed, args.tool_scale, args.max_turns, args.trace)
    config = bench_config(tasks, args.flush_interval)
    print(
        f"{f'trace {args.trace}' if args.trace else f'compact workload, seed {args.seed}'}: {len(tasks)} task(s) ({sum(len(t.turns) for t in tasks)} turns"
        f"{'' if args.max_turns is None else f', cut to {args.max_turns}'}), tool times x {args.tool_scale:g} "
        f"(scaled: {sum(sum(s) for t in tasks for s in (x.tool_seconds for x in t.turns)):.2f} s in all); "
        f"RTT 0, API stage costs zero, deltas coalesced every {args.flush_interval * 1000:g} ms; "
        f"limit = virtual-clock e2e (inference + tool time); floor: {args.floor_turns} logic-free turns on the same stack "
        f"before each WebSocket run; target: beyond_floor_ms <= {TARGET_BEYOND_FLOOR_MS:g}; 95% intervals over turns; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    grid = [benchmark.DesignRun(design, tps, config) for tps in args.speeds for design in args.designs]
    rows = sweep.measured(lambda run: measure(run.design, run.decode_tps, run.config, args.floor_turns), grid, desc="efficiency")
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
