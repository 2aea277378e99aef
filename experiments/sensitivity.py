"""Which conclusions survive the assumptions: every headline figure over the plausible range of each
[assumed] parameter (docs/parameters.md, "Plausible ranges"), one at a time and all at once.

The headline conclusions, each a figure of a benchmark run (prototype/benchmark.py) of the http, chained
and suspended designs on the same coding tasks:

* time to first token per design (median per turn, at the middle decode speed), and chained's cut of it;
* bytes sent per turn per design (the upload);
* the end-to-end gain of chained over http at each decode speed (1 - mean e2e chained / mean e2e http);
* v1 against v2 at each decode speed (1 - mean e2e suspended / mean e2e chained).

Two designs over the swept parameters (`prototype.assumptions.SWEPT`):

* one at a time: each parameter at its low and its high end, the others at their defaults. The
  tornado figure draws, for every conclusion, how far each parameter moves it;
* a global design over all of them at once, from SALib: Morris elementary effects (default;
  `--trajectories` r gives r x (k + 1) runs) or Sobol indices (`--method sobol`, Saltelli sampling,
  `--samples` N, a power of two, gives N x (k + 2) runs). The range each conclusion takes over the
  global design's runs, and the parameters that drive it: Morris mu* (the mean absolute elementary
  effect, in the conclusion's unit per full range of the parameter) or Sobol's total index ST. Values are sampled
  uniformly on each range (a linear scale).

What holds in every run is checked for each ordering the README states (TTFT and upload ordered
v1 <= v2 <= http, chained ahead of http and its gain growing with decode speed, v1 ahead of v2).

The workload: `--tasks` coding tasks (seed 0) of `--turns` turns each, with every client tool taking
`--tool-seconds` (0.3 s, TraceLab's median): with TraceLab's tool tail the API's costs are a few percent
of a task (docs/results.md), so the fast-tool condition is where the assumptions matter most. Every
grid point is one design at one speed on one configuration, mapped through the sweep runner
(prototype/sweep.py: --jobs, --cluster for Dask, a results cache).

    python -m experiments.sensitivity [--tasks 1] [--turns 8] [--method morris|sobol] [--trajectories 3]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from prototype import assumptions, benchmark, figures, sweep
from prototype import workload as wl

from .common import add_list, experiment_parser, print_table, run_dir, write_csv

HTTP, CHAINED, SUSPENDED = benchmark.HTTP, benchmark.CHAINED, benchmark.SUSPENDED
DESIGNS = (HTTP, CHAINED, SUSPENDED)
MORRIS, SOBOL = "morris", "sobol"
MORRIS_LEVELS = 4  # SALib's default grid: each parameter at 0, 1/3, 2/3, 1 of its range


@attrs.frozen
class Headline:
    """One headline figure: `name`, its unit, and how it is computed from a run's summary table
    (`benchmark.summarize`, keyed by (design, decode speed))."""

    name: str
    unit: str
    compute: Callable[[Mapping[tuple[str, float], Mapping[str, Any]]], float]
    scale: float = 1.0
    """Printed value = value x scale (100 prints a share as %)."""


def _ttft(design: str, tps: float) -> Callable[[Mapping[tuple[str, float], Mapping[str, Any]]], float]:
    return lambda table: table[(design, tps)]["ttft_p50_ms"]


def _ttft_cut(tps: float) -> Callable[[Mapping[tuple[str, float], Mapping[str, Any]]], float]:
    return lambda table: 1 - table[(CHAINED, tps)]["ttft_p50_ms"] / table[(HTTP, tps)]["ttft_p50_ms"]


def _upload(design: str, tps: float) -> Callable[[Mapping[tuple[str, float], Mapping[str, Any]]], float]:
    return lambda table: table[(design, tps)]["bytes_sent_per_turn"] / 1000


def _gain(design: str, baseline: str, tps: float) -> Callable[[Mapping[tuple[str, float], Mapping[str, Any]]], float]:
    # speedup_vs_http is total http time over the design's: 1 - design/baseline from it.
    return lambda table: 1 - table[(baseline, tps)]["speedup_vs_http"] / table[(design, tps)]["speedup_vs_http"]


def headlines(speeds: Sequence[float]) -> tuple[Headline, ...]:
    """The headline figures for runs at `speeds`: TTFT and upload at the middle speed, gains at every speed."""
    middle = speeds[len(speeds) // 2]
    return (
        *(Headline(f"TTFT {d} @{middle:g}", "ms", _ttft(d, middle)) for d in DESIGNS),
        Headline(f"TTFT cut chained vs http @{middle:g}", "%", _ttft_cut(middle), 100),
        *(Headline(f"upload {d}", "kB/turn", _upload(d, middle)) for d in DESIGNS),
        *(Headline(f"e2e gain chained vs http @{s:g}", "%", _gain(CHAINED, HTTP, s), 100) for s in speeds),
        *(Headline(f"e2e gain v1 vs v2 @{s:g}", "%", _gain(SUSPENDED, CHAINED, s), 100) for s in speeds),
    )


def claims(speeds: Sequence[float]) -> dict[str, Callable[[Mapping[str, float]], bool]]:
    """The orderings the README states, each a test of one run's headline values (by name)."""
    middle = speeds[len(speeds) // 2]
    gains = [f"e2e gain chained vs http @{s:g}" for s in speeds]
    return {
        f"TTFT v1 <= v2 < http @{middle:g}": lambda v: v[f"TTFT {SUSPENDED} @{middle:g}"] <= v[f"TTFT {CHAINED} @{middle:g}"]
        < v[f"TTFT {HTTP} @{middle:g}"],
        "upload v1 < v2 < http": lambda v: v[f"upload {SUSPENDED}"] < v[f"upload {CHAINED}"] < v[f"upload {HTTP}"],
        "chained faster than http at every speed": lambda v: all(v[g] > 0 for g in gains),
        "chained's gain grows with decode speed": lambda v: all(a <= b for a, b in zip([v[g] for g in gains], [v[g] for g in gains][1:])),
        "v1 at least as fast as v2 at every speed": lambda v: all(v[f"e2e gain v1 vs v2 @{s:g}"] >= 0 for s in speeds),
    }


# --- the designs over the parameters -------------------------------------------------------------------


def problem(names: Sequence[str]) -> dict[str, Any]:
    """SALib's problem definition: each parameter over its plausible range."""
    ranges = [assumptions.BY_NAME[n].range for n in names]
    return {"num_vars": len(names), "names": list(names), "bounds": [[r.low, r.high] for r in ranges]}


def one_at_a_time(names: Sequence[str]) -> list[tuple[str, dict[str, float]]]:
    """(label, values): the defaults, then each parameter at its low and its high end."""
    points: list[tuple[str, dict[str, float]]] = [("default", {})]
    for name in names:
        parameter = assumptions.BY_NAME[name]
        points += [(f"{name} low", {name: parameter.range.low}), (f"{name} high", {name: parameter.range.high})]
    return points


def global_design(names: Sequence[str], method: str, size: int, seed: int) -> np.ndarray:
    """SALib's sample: Morris trajectories (`size` of them) or Saltelli's Sobol sample (`size` base points)."""
    if method == MORRIS:
        from SALib.sample import morris

        return morris.sample(problem(names), N=size, num_levels=MORRIS_LEVELS, seed=seed)
    from SALib.sample import sobol

    return sobol.sample(problem(names), N=size, calc_second_order=False, seed=seed)


def indices(names: Sequence[str], method: str, samples: np.ndarray, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """Each parameter's importance for one output: Morris mu* and sigma, or Sobol S1 and ST."""
    if method == MORRIS:
        from SALib.analyze import morris

        with warnings.catch_warnings():  # one trajectory: sigma has no degrees of freedom (NaN); mu* is still defined
            warnings.filterwarnings("ignore", "Degrees of freedom", RuntimeWarning)
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
            result = morris.analyze(problem(names), samples, outputs, num_levels=MORRIS_LEVELS, num_resamples=100, seed=0)
        return {"mu_star": np.asarray(result["mu_star"]), "sigma": np.asarray(result["sigma"])}
    from SALib.analyze import sobol

    result = sobol.analyze(problem(names), outputs, calc_second_order=False, num_resamples=100, seed=0)
    return {"S1": np.asarray(result["S1"]), "ST": np.asarray(result["ST"])}


def run_points(runner: sweep.Runner, base: benchmark.BenchConfig, points: Sequence[Mapping[str, float]],
               speeds: Sequence[float], heads: Sequence[Headline], desc: str) -> list[dict[str, float]]:
    """Every design at every speed for each point's configuration, through the runner: the headline values per point."""
    configs = [assumptions.configure(base, values) for values in points]
    runs = [benchmark.DesignRun(d, float(s), c) for c in configs for s in speeds for d in DESIGNS]
    results = runner.map(benchmark.design_rows, runs, desc=desc)
    per_point = len(speeds) * len(DESIGNS)
    values = []
    for i in range(len(configs)):
        rows = [row for rs in results[i * per_point:(i + 1) * per_point] for row in rs]
        table = {(r["design"], r["decode_tps"]): r for r in benchmark.summarize(rows)}
        values.append({h.name: float(h.compute(table)) for h in heads})
    return values


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=1, help="coding tasks per run, seed 0 (default 1)")
    parser.add_argument("--turns", type=int, default=8, help="turns per task (default 8)")
    parser.add_argument("--tool-seconds", type=float, default=0.3, help="every client tool's time (default 0.3 s)")
    parser.add_argument("--method", choices=(MORRIS, SOBOL), default=MORRIS, help="global design (default morris)")
    parser.add_argument("--trajectories", type=int, default=3, help="Morris trajectories r: r x (k+1) runs (default 3)")
    parser.add_argument("--samples", type=int, default=8, help="Sobol base samples N, a power of two: N x (k+2) runs (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="the global design's seed (default 0)")
    add_list(parser, "--params", str, assumptions.SWEPT, "parameters to sweep", choices=list(assumptions.SWEPT))
    add_list(parser, "--speeds", float, benchmark.DECODE_SPEEDS, "decode speeds in tokens/s")
    sweep.add_arguments(parser)
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(args.params))
    speeds = sorted(set(args.speeds))
    heads = headlines(speeds)
    base = benchmark.BenchConfig(
        preset=attrs.evolve(wl.CODING, fixed_turns=args.turns, fixed_tool_seconds=args.tool_seconds), n_tasks=args.tasks,
    )
    print(f"coding preset, {args.tasks} task(s) (seed 0) of {args.turns} turns, every tool {args.tool_seconds:g} s; "
          f"designs {', '.join(DESIGNS)} at {', '.join(f'{s:g}' for s in speeds)} tokens/s; virtual time", flush=True)
    print_table([{"parameter": n, "default": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].default),
                  "low": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].range.low),
                  "high": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].range.high), "unit": assumptions.BY_NAME[n].unit}
                 for n in names])

    oat = one_at_a_time(names)
    samples = global_design(names, args.method, args.trajectories if args.method == MORRIS else args.samples, args.seed)
    with sweep.runner_from_args(args) as runner:
        oat_values = run_points(runner, base, [v for _, v in oat], speeds, heads, "one at a time")
        global_values = run_points(runner, base, [dict(zip(names, map(float, x))) for x in samples], speeds, heads,
                                   f"global ({args.method})")
    default = oat_values[0]
    by_label = dict(zip((label for label, _ in oat), oat_values))

    importance = {h.name: indices(names, args.method, samples, np.array([v[h.name] for v in global_values])) for h in heads}
    key = "mu_star" if args.method == MORRIS else "ST"
    table = []
    for h in heads:
        everything = [v[h.name] for v in oat_values + global_values]
        spans = {n: (by_label[f"{n} low"][h.name], by_label[f"{n} high"][h.name]) for n in names}
        oat_all = [x for pair in spans.values() for x in pair] + [default[h.name]]
        rank = np.argsort(-importance[h.name][key])
        drivers = [f"{names[i]} ({importance[h.name][key][i] * (h.scale if key == 'mu_star' else 1):.3g})"
                   for i in rank[:3] if importance[h.name][key][i] > 1e-9]
        table.append({
            "conclusion": h.name, "unit": h.unit, "default": round(default[h.name] * h.scale, 2),
            "one-at-a-time": f"{min(oat_all) * h.scale:.1f} to {max(oat_all) * h.scale:.1f}",
            "all at once": f"{min(everything) * h.scale:.1f} to {max(everything) * h.scale:.1f}",
            f"drivers ({key})": ", ".join(drivers) or "none",
        })
    checks = []
    for claim, holds in claims(speeds).items():
        results = [holds(v) for v in oat_values + global_values]
        broken_by = [label for (label, _), ok in zip(oat, results) if not ok]
        checks.append({"claim": claim, "holds in": f"{sum(results)} of {len(results)} runs",
                       "one-at-a-time settings that break it": ", ".join(broken_by) or "none"})

    folder = run_dir("sensitivity")
    point_rows = [{"design": "one-at-a-time", "label": label, **{n: values.get(n, assumptions.BY_NAME[n].default) for n in names}, **v}
                  for (label, values), v in zip(oat, oat_values)]
    point_rows += [{"design": args.method, "label": f"{args.method} {i}", **dict(zip(names, map(float, x))), **v}
                   for i, (x, v) in enumerate(zip(samples, global_values))]
    write_csv(folder / "sensitivity_runs.csv", point_rows)
    write_csv(folder / "sensitivity.csv", table)
    write_csv(folder / "sensitivity_claims.csv", checks)
    write_csv(folder / "sensitivity_indices.csv", [
        {"conclusion": h, "parameter": n, **{k: float(v[i]) for k, v in idx.items()}}
        for h, idx in importance.items() for i, n in enumerate(names)])
    panels = [figures.TornadoPanel(f"{h.name} ({h.unit})", default[h.name] * h.scale,
                                   tuple((n, lo * h.scale, hi * h.scale) for n, (lo, hi) in
                                         ((n, (by_label[f"{n} low"][h.name], by_label[f"{n} high"][h.name])) for n in names)))
              for h in heads]
    figure = figures.tornado_figure(panels, folder / "tornado.png",
                                    title=f"Each assumed parameter from its low to its high end, the others at their defaults "
                                          f"({args.tasks} coding task(s) of {args.turns} turns, {args.tool_seconds:g} s tools)")
    print(f"\nWhat each conclusion does over the plausible ranges ({len(oat_values)} one-at-a-time runs, "
          f"{len(global_values)} {args.method} runs):")
    print_table(table)
    print("\nWhat holds in every run:")
    print_table(checks)
    print(f"wrote {folder / 'sensitivity.csv'}, {figure}")
    return {"table": table, "claims": checks, "oat": dict(zip((label for label, _ in oat), oat_values)), "global": global_values,
            "indices": importance, "folder": folder}


if __name__ == "__main__":
    main()
