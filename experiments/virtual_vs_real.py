"""The same small configuration under the virtual clock and in real time over loopback sockets.

Virtual-time runs are what the benchmark reports; this checks that they hold in real time: same
tasks, same modeled costs and network profile, real sockets and real sleeps. The ratio of
end-to-end times (real / virtual) is above 1 by the testbed's own CPU work that the virtual clock
does not charge.

    python -m experiments.virtual_vs_real [--tasks 2] [--turns 3]
"""

from __future__ import annotations

import statistics

from prototype import benchmark, sweep
from prototype import workload as wl
from prototype.cli.common import at_least, plural, positive

from .common import add_list, experiment_parser, report

RATIO_BAND = (0.95, 1.05)


def small_config(tasks: int, turns: int) -> benchmark.BenchConfig:
    task_list = tuple(
        wl.fixed(turns, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=60, tool_seconds=0.5, name=f"small-{i}")
        for i in range(tasks)
    )
    return benchmark.BenchConfig(task_list=task_list)


def both_clocks(run: benchmark.DesignRun) -> dict:
    virtual = statistics.fmean(r.seconds for r in benchmark.run_design_virtual(run.design, run.decode_tps, run.config))
    real = statistics.fmean(r.seconds for r in benchmark.run_design_real(run.design, run.decode_tps, run.config))
    return {"design": run.design, "virtual_e2e_s": virtual, "real_e2e_s": real, "ratio_real_over_virtual": real / virtual,
            "within_band": RATIO_BAND[0] <= real / virtual <= RATIO_BAND[1]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = experiment_parser("virtual vs real time on a small configuration")
    parser.add_argument("--tasks", type=at_least(1), default=2, help="tasks per design (default 2)")
    parser.add_argument("--turns", type=at_least(1), default=3, help="turns per task (default 3)")
    parser.add_argument("--tps", type=positive(float), default=1000.0, help="decode tokens/s (default 1000)")
    add_list(parser, "--designs", str, benchmark.DESIGNS, "designs to run", choices=list(benchmark.ALL_DESIGNS))
    args = parser.parse_args(argv)
    config = small_config(args.tasks, args.turns)
    grid = [benchmark.DesignRun(design, args.tps, config) for design in args.designs]
    rows = sweep.measured(both_clocks, grid, desc="virtual_vs_real")
    print(f"{plural(args.tasks, 'task')} x {args.turns} turns at {args.tps:g} tokens/s, RTT {config.network.rtt * 1000:g} ms, default API costs\n")
    report(rows, "virtual_vs_real.csv")
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
