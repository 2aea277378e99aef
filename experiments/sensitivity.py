"""Which conclusions survive the assumptions: every headline figure over the plausible range of each
[assumed] parameter (docs/parameters.md, "Plausible ranges"), one at a time and all at once, each with its
uncertainty.

The headline conclusions, each a figure of a benchmark run (prototype/benchmark.py) of the http, chained
and suspended designs on the same coding tasks:

* time to first token per design, the mean per turn over all the tasks' turns at the middle decode speed, and
  chained's cut of it (1 - chained / http on the means). A mean and not a median: a median over a few dozen turns is
  a step function of every parameter, and one turn crossing it (the one hosted search, say) moves it by hundreds of
  milliseconds; the mean moves with each turn by that turn's share, and its interval says how much the tasks drawn
  matter;
* bytes sent per turn per design (the upload);
* the end-to-end gain of chained over http at each decode speed (1 - mean e2e chained / mean e2e http, on the same
  tasks: a design twice as fast gains +50%);
* v1 against v2 at each decode speed (1 - mean e2e suspended / mean e2e chained).

Two designs over the swept parameters (`prototype.assumptions.SWEPT`):

* one at a time: each parameter at its low and its high end, the others at their defaults. The
  tornado figure draws, for every conclusion, how far each parameter moves it;
* a global design over all of them at once, from SALib: Morris elementary effects (default;
  `--trajectories` r gives r x (k + 1) runs) or Sobol indices (`--method sobol`, Saltelli sampling,
  `--samples` N, a power of two, gives N x (k + 2) runs). Values are sampled uniformly on each range.

Every figure carries its uncertainty (prototype/uncertainty.py):

* a value of one configuration (the defaults, each one-at-a-time end) has a 95% bootstrap interval over the tasks
  (the ratios resample the tasks of both designs together: they ran the same tasks);
* the range over the global design is its 5th to 95th percentile over the runs (the middle 90% of the plausible
  assumptions; a minimum or maximum has no interval worth the name), each end with a bootstrap interval over the
  trajectories (Morris) or base samples (Sobol), the design's independent units;
* each driver's index is SALib's, with SALib's own 95% interval (Morris `mu_star_conf`, Sobol `ST_conf`): the
  mean absolute elementary effect mu* in the conclusion's unit per full range of the parameter, or the total index
  ST. Drivers are ranked only where their intervals separate; otherwise they are printed as tied (`~`);
* each ordering the README states is decided on intervals in every run: it holds where the intervals separate the
  right way, is broken where they separate the wrong way, and is not separated otherwise. An ordering no swept
  parameter moves (the upload: what each design resends) or that the model builds in (the gain growing with
  decode speed: a per-turn cost against a shrinking shared time) is labelled "by construction" and is not evidence.

The workload: `--tasks` coding tasks (seed 0), each with its own turn count as the preset draws it (`--turns`
fixes one), with every client tool taking `--tool-seconds` (0.3 s, TraceLab's median): with TraceLab's tool tail
the API's costs are a few percent of a task (docs/results.md), so the fast-tool condition is where the
assumptions matter most. Every grid point is one design at one speed on one configuration, mapped through the
sweep runner (prototype/sweep.py: --jobs, --cluster for Dask, a results cache). A run smaller than the defaults
says so: its figures show the machinery, not conclusions.

    python -m experiments.sensitivity [--seed 0] [--tasks 8] [--method morris|sobol] [--trajectories 20]
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from prototype import assumptions, benchmark, figures, headline, sweep, uncertainty
from prototype import workload as wl
from prototype.uncertainty import Estimate

from .common import add_list, experiment_parser, print_table, run_dir, write_csv

HTTP, CHAINED, SUSPENDED = benchmark.HTTP, benchmark.CHAINED, benchmark.SUSPENDED
DESIGNS = (HTTP, CHAINED, SUSPENDED)
MORRIS, SOBOL = "morris", "sobol"
MORRIS_LEVELS = 4  # SALib's default grid: each parameter at 0, 1/3, 2/3, 1 of its range
SALIB_RESAMPLES = 1000  # SALib's bootstrap of mu* and ST for their confidence intervals (its default is 100)
# The defaults that carry the claims (docs/results.md), and what a run below them says of itself.
DEFAULT_TASKS, DEFAULT_TRAJECTORIES, DEFAULT_SAMPLES = 4, 20, 256
RANGE = (5.0, 95.0)  # the global design's range: its 5th to 95th percentile over the runs

# One configuration's figures per task: per (design, speed), arrays over the tasks of the end-to-end time (s), the
# sum and count of the turns' TTFTs (s), the bytes sent and the turns.
Samples = Mapping[tuple[str, float], Mapping[str, np.ndarray]]
Statistic = Callable[[np.ndarray], np.ndarray]


@attrs.frozen
class Headline:
    """One headline figure: `name` (as printed), `key` (its figures' keys in the headline data), its unit, and how it is
    computed from a configuration's samples: `statistic(samples)` is a function of how often each task is drawn
    (prototype/uncertainty.py's `resample`), so that the same definition gives the value (every task once) and its
    interval over the tasks."""

    name: str
    key: str
    unit: str
    statistic: Callable[[Samples], Statistic]
    scale: float = 1.0
    """Printed value = value x scale (100 prints a share as %)."""

    def value(self, samples: Samples) -> float:
        return float(self.statistic(samples)(np.ones((1, _tasks(samples))))[0])

    def estimate(self, samples: Samples) -> Estimate:
        return uncertainty.resample(_tasks(samples), self.statistic(samples))


def _tasks(samples: Samples) -> int:
    return len(next(iter(samples.values()))["e2e"])


def _total(samples: Samples, design: str, tps: float, field: str) -> Statistic:
    return uncertainty.unit_total(samples[(design, tps)][field])


def ttft_mean(design: str, tps: float) -> Callable[[Samples], Statistic]:
    """The mean TTFT per turn (ms), over all the drawn tasks' turns."""
    def statistic(samples: Samples) -> Statistic:
        total, count = _total(samples, design, tps, "ttft_sum"), _total(samples, design, tps, "ttft_n")
        return lambda counts: 1000 * total(counts) / count(counts)
    return statistic


def ttft_cut(tps: float) -> Callable[[Samples], Statistic]:
    """1 - chained's mean TTFT / http's, on the same tasks."""
    def statistic(samples: Samples) -> Statistic:
        chained, http = ttft_mean(CHAINED, tps)(samples), ttft_mean(HTTP, tps)(samples)
        return lambda counts: 1 - chained(counts) / http(counts)
    return statistic


def upload(design: str, tps: float) -> Callable[[Samples], Statistic]:
    """Bytes sent per turn (kB), all the drawn tasks' bytes over all their turns."""
    def statistic(samples: Samples) -> Statistic:
        sent, turns = _total(samples, design, tps, "sent"), _total(samples, design, tps, "turns")
        return lambda counts: sent(counts) / turns(counts) / 1000
    return statistic


def gain(design: str, baseline: str, tps: float) -> Callable[[Samples], Statistic]:
    """1 - design / baseline on the mean end-to-end time per task over the same tasks (a design twice as fast: +50%)."""
    def statistic(samples: Samples) -> Statistic:
        mine, theirs = _total(samples, design, tps, "e2e"), _total(samples, baseline, tps, "e2e")
        return lambda counts: 1 - mine(counts) / theirs(counts)
    return statistic


def headlines(speeds: Sequence[float]) -> tuple[Headline, ...]:
    """The headline figures for runs at `speeds`: TTFT and upload at the middle speed, gains at every speed."""
    middle = speeds[len(speeds) // 2]
    return (
        *(Headline(f"TTFT {d} @{middle:g}", f"ttft.{d}.{middle:g}", "ms", ttft_mean(d, middle)) for d in DESIGNS),
        Headline(f"TTFT cut chained vs http @{middle:g}", f"ttft_cut.{middle:g}", "%", ttft_cut(middle), 100),
        *(Headline(f"upload {d}", f"upload.{d}", "kB/turn", upload(d, middle)) for d in DESIGNS),
        *(Headline(f"e2e gain chained vs http @{s:g}", f"gain.chained_vs_http.{s:g}", "%", gain(CHAINED, HTTP, s), 100)
          for s in speeds),
        *(Headline(f"e2e gain v1 vs v2 @{s:g}", f"gain.v1_vs_v2.{s:g}", "%", gain(SUSPENDED, CHAINED, s), 100) for s in speeds),
    )


# --- the claims, decided on intervals ----------------------------------------------------------------------------

YES, NO, NOT_SEPARATED = "holds", "broken", "not separated"


def above_zero(estimate: Estimate, *, strict: bool = True) -> str:
    """A difference > 0 (`strict`) or >= 0: holds where the whole interval says so, broken where the whole interval
    says the opposite (<= 0, or < 0), not separated where it spans both."""
    if estimate.low > 0 or (not strict and estimate.low >= 0):
        return YES
    if estimate.high < 0 or (strict and estimate.high <= 0):
        return NO
    return NOT_SEPARATED


def every(verdicts: Sequence[str]) -> str:
    """All of several parts: broken if any is, else not separated if any is, else holds."""
    if NO in verdicts:
        return NO
    return NOT_SEPARATED if NOT_SEPARATED in verdicts else YES


def ahead(first: Callable[[Samples], Statistic], second: Callable[[Samples], Statistic]) -> Callable[[Samples], Statistic]:
    """1 - first / second, on the same tasks: above 0 where `first` is the smaller (the faster, the lighter)."""
    def statistic(samples: Samples) -> Statistic:
        a, b = first(samples), second(samples)
        return lambda counts: 1 - a(counts) / b(counts)
    return statistic


def increase(first: Callable[[Samples], Statistic], second: Callable[[Samples], Statistic]) -> Callable[[Samples], Statistic]:
    """second - first, on the same tasks: above 0 where `second` is the larger."""
    def statistic(samples: Samples) -> Statistic:
        a, b = first(samples), second(samples)
        return lambda counts: b(counts) - a(counts)
    return statistic


@attrs.frozen
class Claim:
    """An ordering the README states, as parts that must each lie above 0: (statistic of a run's samples, strict).
    Each part compares two figures on the same tasks, so its interval resamples the tasks of both together: the
    claim holds where every part's interval lies above 0 (at or above for a part that is not strict), is broken where
    one lies below, and is not separated otherwise. `built_in` says why the model builds it in (empty: it may go
    either way)."""

    name: str
    parts: tuple[tuple[Callable[[Samples], Statistic], bool], ...]
    built_in: str = ""

    def decide(self, samples: Samples) -> str:
        return every([above_zero(uncertainty.resample(_tasks(samples), part(samples)), strict=strict) for part, strict in self.parts])

    def points(self, samples: Samples) -> tuple[float, ...]:
        return tuple(float(part(samples)(np.ones((1, _tasks(samples))))[0]) for part, _ in self.parts)


def claims(speeds: Sequence[float]) -> tuple[Claim, ...]:
    """The orderings the README states."""
    middle = speeds[len(speeds) // 2]
    return (
        Claim(f"TTFT v1 <= v2 < http @{middle:g}", ((ahead(ttft_mean(SUSPENDED, middle), ttft_mean(CHAINED, middle)), False),
                                                    (ahead(ttft_mean(CHAINED, middle), ttft_mean(HTTP, middle)), True))),
        Claim("upload v1 < v2 < http", ((ahead(upload(SUSPENDED, middle), upload(CHAINED, middle)), True),
                                        (ahead(upload(CHAINED, middle), upload(HTTP, middle)), True))),
        Claim("chained faster than http at every speed", tuple((gain(CHAINED, HTTP, s), True) for s in speeds)),
        Claim("chained's gain grows with decode speed",
              tuple((increase(gain(CHAINED, HTTP, a), gain(CHAINED, HTTP, b)), False) for a, b in zip(speeds, speeds[1:])),
              "a per-turn cost against the shared decoding time, which shrinks with speed"),
        Claim("v1 at least as fast as v2 at every speed", tuple((gain(SUSPENDED, CHAINED, s), False) for s in speeds)),
    )


def by_construction(claim: Claim, runs: Sequence[Samples]) -> str:
    """Why a claim cannot fail over these runs: the model builds it in, or no swept parameter moves what it compares
    (every part the same in every run). Empty: it is evidence."""
    if claim.built_in:
        return claim.built_in
    if len(runs) > 1 and len({claim.points(samples) for samples in runs}) == 1:
        return "no swept parameter moves it"
    return ""


def check_claims(speeds: Sequence[float], labels: Sequence[str], runs: Sequence[Samples]) -> list[dict[str, Any]]:
    """Each claim over the runs: how many runs hold it, break it or leave it not separated, the one-at-a-time
    settings that break it, and whether it holds by construction (then it is not evidence)."""
    rows = []
    for claim in claims(speeds):
        verdicts = [claim.decide(samples) for samples in runs]
        built = by_construction(claim, runs)
        rows.append({
            "claim": claim.name,
            "holds in": f"{verdicts.count(YES)} of {len(verdicts)} runs",
            "not separated": verdicts.count(NOT_SEPARATED),
            "broken": verdicts.count(NO),
            "broken by (one at a time)": ", ".join(label for label, v in zip(labels, verdicts) if v == NO and label) or "none",
            "evidence": f"no: by construction ({built})" if built else "yes",
        })
    return rows


# --- the designs over the parameters -------------------------------------------------------------------------------


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


def units_of(names: Sequence[str], method: str) -> tuple[int, str]:
    """How many consecutive runs of the global design form one independent unit, and what the units are called:
    a Morris trajectory (k + 1 runs) or a Saltelli base sample (k + 2 runs)."""
    return (len(names) + 1, "trajectories") if method == MORRIS else (len(names) + 2, "base samples")


def indices(names: Sequence[str], method: str, samples: np.ndarray, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """Each parameter's importance for one output with SALib's 95% confidence half-width: Morris mu*, its
    `mu_star_conf` and sigma, or Sobol S1, ST and `ST_conf`."""
    if method == MORRIS:
        from SALib.analyze import morris

        with warnings.catch_warnings():  # one trajectory: sigma has no degrees of freedom (NaN); mu* is still defined
            warnings.filterwarnings("ignore", "Degrees of freedom", RuntimeWarning)
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
            result = morris.analyze(problem(names), samples, outputs, num_levels=MORRIS_LEVELS, num_resamples=SALIB_RESAMPLES,
                                    conf_level=uncertainty.CONFIDENCE, seed=0)
        return {"mu_star": np.asarray(result["mu_star"]), "mu_star_conf": np.nan_to_num(np.asarray(result["mu_star_conf"])),
                "sigma": np.asarray(result["sigma"])}
    from SALib.analyze import sobol

    with warnings.catch_warnings():  # an output no parameter moves has zero variance: SALib divides by it
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        warnings.filterwarnings("ignore", "divide by zero", RuntimeWarning)
        result = sobol.analyze(problem(names), outputs, calc_second_order=False, num_resamples=SALIB_RESAMPLES,
                               conf_level=uncertainty.CONFIDENCE, seed=0)
    return {"S1": np.asarray(result["S1"]), "ST": np.asarray(result["ST"]), "ST_conf": np.nan_to_num(np.asarray(result["ST_conf"]))}


def driver_estimates(names: Sequence[str], importance: Mapping[str, np.ndarray], method: str, units: int,
                     scale: float = 1.0) -> dict[str, Estimate]:
    """Each parameter that moves the output (index above 0): its index with SALib's interval, in the printed unit
    (mu* times the conclusion's `scale`; ST as it is)."""
    key, conf = ("mu_star", "mu_star_conf") if method == MORRIS else ("ST", "ST_conf")
    factor = scale if method == MORRIS else 1.0
    return {name: uncertainty.from_half_width(importance[key][i] * factor, importance[conf][i] * factor, units,
                                              of="trajectories" if method == MORRIS else "base samples")
            for i, name in enumerate(names) if importance[key][i] > 1e-9}


def drivers(estimates: Mapping[str, Estimate], top: int = 3) -> str:
    """The parameters in decreasing order of their index, `>` between ranks whose intervals separate and `~` within a
    rank (uncertainty.ranking), each with its index and interval; "tied: " when the first rank holds several."""
    if not estimates:
        return "none"
    ranks = uncertainty.ranking(estimates)
    shown, count = [], 0
    for rank in ranks:
        if count >= top:
            break
        shown.append(" ~ ".join(f"{name} {estimates[name].format(_template(estimates[name]))}" for name in rank))
        count += len(rank)
    return ("tied: " if len(ranks[0]) > 1 else "") + " > ".join(shown)


def top_driver(estimates: Mapping[str, Estimate]) -> str:
    """The first rank's parameter, or "tied (a ~ b)" when the intervals do not separate the first from the next."""
    if not estimates:
        return "none"
    first = uncertainty.ranking(estimates)[0]
    return first[0] if len(first) == 1 else f"tied ({' ~ '.join(first)})"


def _template(estimate: Estimate) -> str:
    size = max(abs(estimate.value), abs(estimate.high), abs(estimate.low))
    return "{:,.0f}" if size >= 100 else "{:.1f}" if size >= 1 else "{:.2f}"


# --- runs ----------------------------------------------------------------------------------------------------------


def samples_of(rows: Sequence[Mapping[str, Any]]) -> Samples:
    """A configuration's task rows (benchmark.task_row) as per-task arrays per (design, speed)."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["decode_tps"]), []).append(row)
    return {point: {"e2e": np.array([r["e2e_s"] for r in group]),
                    "ttft_sum": np.array([float(sum(r["ttft_s"])) for r in group]),
                    "ttft_n": np.array([float(len(r["ttft_s"])) for r in group]),
                    "sent": np.array([r["bytes_sent_per_turn"] * r["turns"] for r in group]),
                    "turns": np.array([float(r["turns"]) for r in group])}
            for point, group in groups.items()}


def run_points(runner: sweep.Runner, base: benchmark.BenchConfig, points: Sequence[Mapping[str, float]],
               speeds: Sequence[float], desc: str) -> list[Samples]:
    """Every design at every speed for each point's configuration, through the runner: the samples per point."""
    configs = [assumptions.configure(base, values) for values in points]
    runs = [benchmark.DesignRun(d, float(s), c) for c in configs for s in speeds for d in DESIGNS]
    results = runner.map(benchmark.design_rows, runs, desc=desc)
    per_point = len(speeds) * len(DESIGNS)
    return [samples_of([row for rs in results[i * per_point:(i + 1) * per_point] for row in rs]) for i in range(len(configs))]


def global_range(values: Sequence[float], unit_size: int, of: str) -> tuple[Estimate, Estimate]:
    """The RANGE percentiles of a conclusion over the global design's runs, each with a bootstrap interval over the
    design's units (consecutive blocks of `unit_size` runs)."""
    blocks = [list(values[i:i + unit_size]) for i in range(0, len(values), unit_size)]
    return tuple(uncertainty.resample(len(blocks), uncertainty.unit_percentile(blocks, q), of=of) for q in RANGE)  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=DEFAULT_TASKS,
                        help=f"coding tasks per run, seed 0, each with its own turn count (default {DEFAULT_TASKS})")
    parser.add_argument("--turns", type=int, default=None, help="fix the turns per task (default: each task's own)")
    parser.add_argument("--tool-seconds", type=float, default=0.3, help="every client tool's time (default 0.3 s)")
    parser.add_argument("--method", choices=(MORRIS, SOBOL), default=MORRIS, help="global design (default morris)")
    parser.add_argument("--trajectories", type=int, default=DEFAULT_TRAJECTORIES,
                        help=f"Morris trajectories r: r x (k+1) runs (default {DEFAULT_TRAJECTORIES})")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"Sobol base samples N, a power of two: N x (k+2) runs (default {DEFAULT_SAMPLES})")
    parser.add_argument("--seed", type=int, default=0, help="the global design's seed (default 0)")
    add_list(parser, "--params", str, assumptions.SWEPT, "parameters to sweep", choices=list(assumptions.SWEPT))
    add_list(parser, "--speeds", float, benchmark.DECODE_SPEEDS, "decode speeds in tokens/s")
    sweep.add_arguments(parser)
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(args.params))
    speeds = sorted(set(args.speeds))
    heads = headlines(speeds)
    size = args.trajectories if args.method == MORRIS else args.samples
    base = benchmark.BenchConfig(
        preset=attrs.evolve(wl.CODING, fixed_turns=args.turns, fixed_tool_seconds=args.tool_seconds), n_tasks=args.tasks,
    )
    turns = [len(t.turns) for t in base.tasks()]
    workload = (f"{args.tasks} coding task(s) (seed 0) of {', '.join(map(str, turns))} turns ({sum(turns)} in all), every tool "
                f"{args.tool_seconds:g} s; designs {', '.join(DESIGNS)} at {', '.join(f'{s:g}' for s in speeds)} tokens/s; "
                "virtual time")
    print(workload, flush=True)
    small = args.tasks < DEFAULT_TASKS or size < (DEFAULT_TRAJECTORIES if args.method == MORRIS else DEFAULT_SAMPLES)
    print_table([{"parameter": n, "default": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].default),
                  "low": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].range.low),
                  "high": assumptions.BY_NAME[n].show(assumptions.BY_NAME[n].range.high), "unit": assumptions.BY_NAME[n].unit}
                 for n in names])

    oat = one_at_a_time(names)
    design = global_design(names, args.method, size, args.seed)
    unit_size, unit_name = units_of(names, args.method)
    units = len(design) // unit_size
    with sweep.runner_from_args(args) as runner:
        oat_samples = run_points(runner, base, [v for _, v in oat], speeds, "one at a time")
        global_samples = run_points(runner, base, [dict(zip(names, map(float, x))) for x in design], speeds, f"global ({args.method})")
    everything = oat_samples + global_samples
    values = [{h.name: h.value(s) for h in heads} for s in everything]
    estimates = [{h.name: h.estimate(s) for h in heads} for s in oat_samples]  # a configuration's values over the tasks
    oat_values, global_values = values[:len(oat)], values[len(oat):]
    by_label = {label: i for i, (label, _) in enumerate(oat)}

    importance = {h.name: indices(names, args.method, design, np.array([v[h.name] for v in global_values])) for h in heads}
    key = "mu_star" if args.method == MORRIS else "ST"
    figures_out: dict[str, dict[str, Any]] = {}
    table, blocks = [], []
    for h in heads:
        template = "{:.1f}" if h.unit in ("%", "kB/turn") else "{:,.0f}"
        default = estimates[0][h.name].scaled(h.scale)
        ends = sorted(range(len(oat)), key=lambda i: oat_values[i][h.name])
        low_end, high_end = (estimates[ends[0]][h.name].scaled(h.scale), estimates[ends[-1]][h.name].scaled(h.scale))
        low_label, high_label = oat[ends[0]][0], oat[ends[-1]][0]
        p_low, p_high = (e.scaled(h.scale) for e in global_range([v[h.name] for v in global_values], unit_size, unit_name))
        driven = driver_estimates(names, importance[h.name], args.method, units, h.scale)
        still = len({v[h.name] for v in values}) == 1
        row = {
            "conclusion": h.name, "unit": h.unit, "default": default.format(template),
            "one-at-a-time": "the same in every run: no swept parameter moves it" if still else
            f"{low_end.format(template)} ({low_label}) to {high_end.format(template)} ({high_label})",
            f"all at once (p{RANGE[0]:g}-p{RANGE[1]:g})": "the same" if still else f"{p_low.format(template)} to {p_high.format(template)}",
            f"drivers ({key})": drivers(driven), "top driver": top_driver(driven),
        }
        table.append(row)
        blocks.append((h, row))
        unit = {"%": "%", "ms": " ms", "kB/turn": " kB"}[h.unit]
        for part, e in (("default", default), ("oat_low", low_end), ("oat_high", high_end), ("p5", p_low), ("p95", p_high)):
            figures_out[f"{h.key}.{part}"] = headline.figure(e, template + unit, label=f"{h.name}: {part}")
        for name, e in driven.items():
            figures_out[f"{h.key}.{key}.{name}"] = headline.figure(e, _template(e), label=f"{h.name}: {key} of {name}")
        figures_out[f"{h.key}.drivers"] = headline.text(row[f"drivers ({key})"])
        figures_out[f"{h.key}.top_driver"] = headline.text(row["top driver"])
    labels = [label if label != "default" else "" for label, _ in oat] + [""] * len(global_values)
    checks = check_claims(speeds, labels, everything)

    folder = run_dir("sensitivity")
    point_rows = [{"design": "one-at-a-time", "label": label, **{n: v.get(n, assumptions.BY_NAME[n].default) for n in names}, **val}
                  for (label, v), val in zip(oat, oat_values)]
    point_rows += [{"design": args.method, "label": f"{args.method} {i}", **dict(zip(names, map(float, x))), **val}
                   for i, (x, val) in enumerate(zip(design, global_values))]
    write_csv(folder / "sensitivity_runs.csv", point_rows)
    write_csv(folder / "sensitivity.csv", table)
    write_csv(folder / "sensitivity_claims.csv", checks)
    write_csv(folder / "sensitivity_indices.csv", [
        {"conclusion": h, "parameter": n, **{k: float(v[i]) for k, v in idx.items()}}
        for h, idx in importance.items() for i, n in enumerate(names)])
    panels = [figures.TornadoPanel(
        f"{h.name} ({h.unit})", oat_values[0][h.name] * h.scale,
        tuple((n, oat_values[by_label[f"{n} low"]][h.name] * h.scale, oat_values[by_label[f"{n} high"]][h.name] * h.scale)
              for n in names),
        default_interval=_ends(estimates[0][h.name].scaled(h.scale)),
        intervals=tuple((_ends(estimates[by_label[f"{n} low"]][h.name].scaled(h.scale)),
                         _ends(estimates[by_label[f"{n} high"]][h.name].scaled(h.scale))) for n in names))
        for h in heads]
    figure = figures.tornado_figure(panels, folder / "tornado.png",
                                    title=f"Each assumed parameter from its low to its high end, the others at their defaults "
                                          f"({args.tasks} coding task(s), {args.tool_seconds:g} s tools); whiskers: 95% "
                                          "intervals over the tasks, grey band: the default's")
    command = " ".join(["python -m experiments.sensitivity", *(sys.argv[1:] if argv is None else argv)])
    section = headline.section(
        f"sensitivity_seed{args.seed}", command=command, workload=workload + f"; {len(oat)} one-at-a-time and "
        f"{len(global_values)} {args.method} configurations ({units} {unit_name})", figures=figures_out,
        tables={"table": headline.table(["conclusion", "default", "one at a time", f"all at once (p{RANGE[0]:g} to p{RANGE[1]:g})",
                                         f"drivers ({'Morris mu*' if key == 'mu_star' else 'Sobol ST'})"],
                                        ([f"{r['conclusion']}, {r['unit']}", r["default"], r["one-at-a-time"],
                                          r[f"all at once (p{RANGE[0]:g}-p{RANGE[1]:g})"], r[f"drivers ({key})"]] for r in table)),
                "claims": headline.table(["ordering", "holds in", "not separated", "broken", "evidence"],
                                         ([c["claim"], c["holds in"], c["not separated"], c["broken"], c["evidence"]] for c in checks))},
        data={"oat": [label for label, _ in oat], "values": values})
    headline.write(folder / "sensitivity.json", {"headline": section})

    print(f"\nWhat each conclusion does over the plausible ranges ({len(oat_values)} one-at-a-time runs, {len(global_values)} "
          f"{args.method} runs in {units} {unit_name}); [low, high]: 95% intervals, over the {args.tasks} tasks for a "
          f"configuration's value, over the {units} {unit_name} for the range's ends, SALib's for the indices:")
    for h, row in blocks:
        print(f"\n  {h.name} ({h.unit})")
        print(f"    default                       {row['default']}")
        print(f"    one at a time                 {row['one-at-a-time']}")
        print(f"    all at once, p{RANGE[0]:g} to p{RANGE[1]:g}         {row[f'all at once (p{RANGE[0]:g}-p{RANGE[1]:g})']}")
        print(f"    drivers ({key:<7})             {row[f'drivers ({key})']}")
    print("\nThe orderings, decided on intervals in every run (holds: separated the right way; broken: the wrong way):")
    print_table(checks)
    if small:
        print(f"\nThis run is smaller than the defaults ({DEFAULT_TASKS} tasks, {DEFAULT_TRAJECTORIES} Morris trajectories or "
              f"{DEFAULT_SAMPLES} Sobol base samples): its figures show the machinery, not conclusions.")
    print(f"wrote {folder / 'sensitivity.csv'}, {folder / 'sensitivity.json'}, {figure}")
    return {"table": table, "claims": checks, "oat": {label: oat_values[i] for label, i in by_label.items()},
            "global": global_values, "estimates": estimates, "indices": importance, "folder": folder, "small": small}


def _ends(estimate: Estimate) -> tuple[float, float]:
    return (estimate.low, estimate.high) if estimate.has_interval else (estimate.value, estimate.value)


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
