"""`python -m prototype calibrate PATH`: what a trace implies, beside what the testbed assumes.

Prints, for the trace and for the testbed's generated tasks (`--baseline`, default the `coding` preset):

* distributions per task and per round: turns per task, prefix (cached) tokens, appended (uncached) tokens after a
  task's first round, output and reasoning tokens, seconds per client tool call, model seconds per round;
* the tool-time tail: the share of calls over a minute and the share of tool time they hold;
* the token-weighted prefix hit rate (cached / input tokens; for generated tasks, the rate a perfect cache gives);
* where the trace has timestamps, the least-squares fit of a round's model time to
  `fixed + uncached / prefill rate + output / decode rate` (prototype/engine/fit.py) and its residuals, for each
  provider and model the trace names on its own (a trace that mixes Claude and Codex rounds gets one fit each), and
  the fit's error on rounds it was not fitted to: fitted on the first rounds of the group (in time order), scored on
  the last `--holdout` share of them (median and p90 absolute percentage error per round). The fit printed with its
  (in-sample) residuals and written with `--latency-out` is the one on all the group's rounds; the held-out score
  is that of the same model refitted without the held-out rounds, the estimate of how the written fit does on
  rounds it has not seen. A group too small for a fit with a residual left (4 rounds for 3 coefficients) gets no
  fit, and one too small to hold rounds out besides (5) gets no score, each saying so.

Given the per-call file of a real engine the testbed ran (`experiments.real_engine`'s `real_engine_calls.csv`,
prototype/traces/engine_calls.py), it fits the latency model's engine terms to that engine's own timings instead: time
to the first token on the prefill the engine computed (request overhead, prefill rate) and the decode rate, scored on
the last `--holdout` share of the calls, and `--latency-out` writes that profile.

`--preset-out FILE` writes the fitted workload preset and `--latency-out FILE` the fitted latency profile (small JSON
files, prototype/profiles.py) that `compare --preset FILE --latency FILE` reads; a trace with several groups gets one
profile each, `FILE` with the group in its name (`profile.codex-gpt-5.4.json`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .. import profiles, traces
from .. import workload as wl
from ..api.costs import ApiCosts
from ..engine import fit, latency
from ..traces import engine_calls
from .common import at_least, non_negative, plural

TOOL_TAIL_S = 60.0  # TraceLab: 4% of tool calls take over a minute and hold ~85% of tool time
HOLDOUT_SHARE = 0.3  # [ours] the last 30% of a group's timed rounds score a fit on the first 70%
UNNAMED_GROUP = "all rounds"  # rounds whose trace names no provider or model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # A help text is wording, not behaviour: its lines are left out of mutation testing; the defaults it states
    # are held by a test to the ones a run uses.
    parser.add_argument("trace",
                        help="a trace file (testbed JSONL, TraceLab JSONL or CSV, Codex rollout), a folder of Codex rollouts, "  # pragma: no mutate
                             "or a real engine's calls (experiments.real_engine's real_engine_calls.csv)",  # pragma: no mutate
                        )
    parser.add_argument("--baseline",
                        help="preset (name or JSON file) to print beside the trace (default coding)",  # pragma: no mutate
                        default=wl.DEFAULT_PRESET)
    parser.add_argument("--baseline-tasks",
                        help="generated tasks for the baseline's figures (default 300)",  # pragma: no mutate
                        type=at_least(1), default=300)
    parser.add_argument("--seed",
                        help="seed of the baseline's generated tasks (default 0)",  # pragma: no mutate
                        type=non_negative(int), default=0)
    parser.add_argument("--preset-out",
                        help="write the fitted workload preset (JSON) here",  # pragma: no mutate
                        )
    parser.add_argument("--latency-out",
                        help="write the fitted latency profile (JSON) here; one per provider and model",  # pragma: no mutate
                        )
    parser.add_argument("--holdout",
                        help=f"share of each group's timed rounds, the last in time, held out to score the fit (default {HOLDOUT_SHARE:g})",
                        type=_holdout_share, default=HOLDOUT_SHARE)


def _holdout_share(text: str) -> float:
    try:
        return fit.holdout_share(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def figures(tasks: Sequence[wl.Workload], rounds: Sequence[traces.Round]) -> dict[str, Any]:
    """Every figure `calibrate` prints for one set of tasks and its rounds."""
    tool_seconds = [s for r in rounds for s in r.tool_seconds]
    timed = [r for r in rounds if r.model_seconds is not None]
    calls_over, time_over = fit.tool_tail(tool_seconds, TOOL_TAIL_S)
    total_input = sum(r.input_tokens for r in rounds)
    rates = [r.output_tokens / r.model_seconds for r in timed if r.model_seconds > 0]
    return {
        "turns per task": fit.distribution([len(t.turns) for t in tasks]),
        "prefix (cached) tokens per round": fit.distribution([r.cached_tokens for r in rounds]),
        "appended (uncached) tokens per round": fit.distribution([r.uncached_tokens for r in rounds if r.turn > 0]),
        "output tokens per round": fit.distribution([r.output_tokens for r in rounds]),
        "reasoning tokens per round": fit.distribution([r.reasoning_tokens for r in rounds]),
        "seconds per client tool call": fit.distribution(tool_seconds),
        "model seconds per round": fit.distribution([r.model_seconds for r in timed]),
        "output tokens/s per round": fit.distribution(rates),
        "calls_over_share": calls_over,
        "time_over_share": time_over,
        "prefix_hit_rate": sum(r.cached_tokens for r in rounds) / total_input if total_input else math.nan,
        "first_prompt_tokens": fit.distribution([t.turns[0].appended_tokens for t in tasks]),
    }


def fitted_preset(tasks: Sequence[wl.Workload], rounds: Sequence[traces.Round]) -> wl.WorkloadParams:
    """Generator parameters that reproduce a trace's distributions (lognormal fits; tool times by a mixture)."""
    turns = [len(t.turns) for t in tasks]
    turns_median, turns_sigma = fit.lognormal(turns)
    appended = [r.uncached_tokens for r in rounds if r.turn > 0 and r.uncached_tokens > 0] or [1]
    appended_median, appended_sigma = fit.lognormal(appended)
    output_median, output_sigma = fit.lognormal([max(1, r.output_tokens) for r in rounds])
    tools = [s for r in rounds for s in r.tool_seconds if s > 0]
    non_final = [t for task in tasks for t in task.turns[:-1]]
    params: dict[str, Any] = {
        "turns_median": turns_median, "turns_sigma": turns_sigma, "turns_max": max(300, max(turns)),
        "initial_prompt_tokens": int(np.median([t.turns[0].appended_tokens for t in tasks])),
        "appended_median": appended_median, "appended_sigma": appended_sigma,
        "appended_max": max(32000, max(appended)), "appended_min": min(50, min(appended)),
        "output_median": output_median, "output_sigma": output_sigma,
        "output_max": max(10000, max(r.output_tokens for r in rounds)),
        "parallel_calls_p": sum(len(t.tool_seconds) > 1 for t in non_final) / len(non_final) if non_final else 0.0,
        "hosted_call_p": sum(bool(t.hosted_calls) for t in non_final) / len(non_final) if non_final else 0.0,
    }
    if tools:
        params["tool_mixture"] = fit.lognormal_mixture(tools)
        params["tool_cap_seconds"] = max(600.0, max(tools))
    params["reasoning_share"] = reasoning_share(rounds)
    params["shared_prefix_tokens"] = min(params["initial_prompt_tokens"], int(np.median([t.prefix_tokens for t in tasks])))
    return wl.WorkloadParams(**params)


def reasoning_share(rounds: Sequence[traces.Round]) -> tuple[float, float]:
    """The generator's uniform reasoning share (low, high) with the mean and standard deviation of the trace's per
    round share (reasoning / output tokens): mean -/+ sqrt(3) sd, clipped to [0, 0.99]; (0, 0) for a trace that reports
    no reasoning."""
    shares = np.array([r.reasoning_tokens / r.output_tokens for r in rounds if r.output_tokens > 0])
    if not len(shares) or not shares.any():
        return 0.0, 0.0
    half = math.sqrt(3) * float(shares.std())
    low, high = (float(np.clip(v, 0.0, 0.99)) for v in (shares.mean() - half, shares.mean() + half))
    return round(low, 4), round(max(low, high), 4)


def _baseline(name: str, n_tasks: int, seed: int) -> tuple[str, list[wl.Workload]]:
    params = name if name in wl.PRESETS else profiles.load_preset(name)
    tasks = wl.generate(params, seed=seed, n_tasks=n_tasks)
    return (name if name in wl.PRESETS else "custom"), tasks


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def print_figures(trace_figures: dict[str, Any], base_figures: dict[str, Any], label: str) -> None:
    header = f"{'quantity':<38} {'n':>7} {'p10':>9} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}   {label + ' p50':>12} {label + ' p90':>12}"
    print(header)
    print("-" * len(header))
    for key, stats in trace_figures.items():
        if not isinstance(stats, dict):
            continue
        base = base_figures[key]
        print(f"{key:<38} {stats['n']:>7.0f} " + " ".join(f"{_fmt(stats[q]):>9}" for q in ("p10", "p50", "p90", "p99", "mean"))
              + f"   {_fmt(base['p50']):>12} {_fmt(base['p90']):>12}")
    print(f"\n{'tool calls over 60 s':<38} {100 * trace_figures['calls_over_share']:>6.1f}% of calls, "
          f"{100 * trace_figures['time_over_share']:.1f}% of tool time   ({label}: {100 * base_figures['calls_over_share']:.1f}%, "
          f"{100 * base_figures['time_over_share']:.1f}%)")
    print(f"{'prefix hit rate, token-weighted':<38} {100 * trace_figures['prefix_hit_rate']:>6.1f}%   "
          f"({label}, perfect cache: {100 * base_figures['prefix_hit_rate']:.1f}%)")


def print_fit(result: fit.RoundTimeFit, group: str = "") -> None:
    costs = ApiCosts()
    se_fixed, se_prefill, se_decode = result.stderr
    print(f"\nFit of model seconds per round ({f'{group}, ' if group else ''}{result.n} timed rounds): "
          "seconds = fixed + uncached / prefill + output / decode")
    print(f"  fixed          {result.fixed_s * 1000:9.1f} ms  (+/- {se_fixed * 1000:.1f})   testbed: engine "
          f"{latency.ENGINE_REQUEST_OVERHEAD_S * 1000:g} ms + API pre {costs.fixed_pre * 1000:g} ms + post {costs.post * 1000:g} ms per http turn")
    print(f"  prefill rate   {_fmt(result.prefill_tokens_per_s):>9} tokens/s (s/token +/- {se_prefill:.2g})   testbed: {latency.PREFILL_TOKENS_PER_S:g}")
    print(f"  decode rate    {_fmt(result.decode_tokens_per_s):>9} tokens/s (s/token +/- {se_decode:.2g})   testbed: "
          f"{latency.FLAGSHIP_TOKENS_PER_S:g} / {latency.SPARK_TOKENS_PER_S:g} / {latency.SPARK_BURST_TOKENS_PER_S:g}")
    p10, p50, p90 = result.residual_quantiles
    print(f"  in-sample      rmse {result.rmse_s * 1000:.1f} ms, r2 {result.r2:.3f}, residuals p10/p50/p90 "
          f"{p10 * 1000:.1f} / {p50 * 1000:.1f} / {p90 * 1000:.1f} ms (on the {result.n} rounds it was fitted to)")


def run(args: argparse.Namespace) -> int:
    if engine_calls.looks_like(args.trace):
        return run_engine_calls(args)
    try:
        trace = traces.load(args.trace)
        label, base_tasks = _baseline(args.baseline, args.baseline_tasks, args.seed)
    except (traces.TraceError, profiles.ProfileError) as e:
        print(f"python -m prototype calibrate: error: {e}", file=sys.stderr)
        return 2
    timed = [r for r in trace.rounds if r.model_seconds is not None]
    print(f"{trace.path}: {trace.format}, {plural(len(trace.tasks), 'task')}, {plural(len(trace.rounds), 'round')}, {len(timed)} timed")
    for note in trace.notes:
        print(f"  note: {note}")
    print(f"beside: {args.baseline_tasks} generated '{label}' {'task' if args.baseline_tasks == 1 else 'tasks'}, seed {args.seed}\n")
    print_figures(figures(trace.tasks, trace.rounds), figures(base_tasks, traces.rounds_from_workloads(base_tasks)), label)
    fits: dict[str, fit.RoundTimeFit] = {}
    scores: list[GroupScore] = []
    groups = timed_groups(timed)
    if len(groups) > 1:
        print(f"\n{len(groups)} providers and models in the trace: each is fitted on its own rounds "
              f"({', '.join(f'{g}: {len(r)}' for g, r in groups.items())})")
    for group, rounds in groups.items():
        if len(rounds) < fit.MIN_FIT_ROUNDS:
            print(f"\nno fit for {group}: {len(rounds)} timed round(s), fewer than {fit.MIN_FIT_ROUNDS} (a fit of "
                  f"{fit.COEFFICIENTS} coefficients on fewer would interpolate them, its residuals zero)")
            continue
        fits[group] = fit_rounds(rounds)
        print_fit(fits[group], "" if len(groups) == 1 else group)
        score = held_out_score(group, rounds, args.holdout)
        if score is not None:
            scores.append(score)
            print_score(score)
        else:
            print(f"  held out       not scored: {len(rounds)} timed rounds, fewer than {fit.MIN_SCORED_ROUNDS} "
                  f"({fit.MIN_FIT_ROUNDS} to fit, 1 to score): the fit's in-sample residuals say little of new rounds")
    if not timed:
        print("\nno fit: 0 timed rounds (the trace has no model-call timestamps)")
    if len(scores) > 1:
        print_scores(scores)
    result = fits[next(iter(fits))] if len(fits) == 1 else None
    if args.preset_out:
        path = profiles.save_preset(fitted_preset(trace.tasks, trace.rounds), args.preset_out,
                                    f"python -m prototype calibrate {args.trace}")
        print(f"\nwrote workload preset {path}")
    if args.latency_out:
        if not fits:
            print("error: no latency profile without a fit", file=sys.stderr)
            return 2
        for group, group_fit in fits.items():
            target = args.latency_out if result is not None else group_path(args.latency_out, group)
            path = profiles.save_latency(latency_model(group_fit), target, f"python -m prototype calibrate {args.trace} "
                                         f"({group}: fitted on all {group_fit.n} rounds, in-sample rmse {group_fit.rmse_s * 1000:.1f} ms)")
            print(f"wrote latency profile {path}: the fit on all {group_fit.n} rounds" + ("" if result is not None else f" ({group})"))
    return 0


# --- per group fits and their held-out error ------------------------------------------------------------------------


@attrs.frozen
class GroupScore:
    """A group's fit on its first rounds, scored on the rest: `errors` is `fit.percentage_errors` on the held-out rounds."""

    group: str
    fitted: fit.RoundTimeFit
    held_out: int
    errors: dict[str, float]


def timed_groups(timed: Sequence[traces.Round]) -> dict[str, list[traces.Round]]:
    """The timed rounds of each provider and model (`Round.group`), each in time order (by `started_at`)."""
    groups: dict[str, list[traces.Round]] = {}
    for r in sorted(timed, key=lambda r: r.started_at):
        groups.setdefault(r.group or UNNAMED_GROUP, []).append(r)
    return groups


def fit_rounds(rounds: Sequence[traces.Round]) -> fit.RoundTimeFit:
    return fit.round_time_fit([r.uncached_tokens for r in rounds], [r.output_tokens for r in rounds],
                              [r.model_seconds for r in rounds])


def held_out_score(group: str, rounds: Sequence[traces.Round], share: float) -> GroupScore | None:
    """Fit on the first rounds, predict the last `share` of them: None when the group has too few to hold any out."""
    if len(rounds) < fit.MIN_SCORED_ROUNDS:
        return None
    fitted_part, held_part = fit.holdout_split(len(rounds), share)
    fitted = fit_rounds([rounds[i] for i in fitted_part])
    held = [rounds[i] for i in held_part]
    predicted = [float(fitted.predict(r.uncached_tokens, r.output_tokens)) for r in held]
    return GroupScore(group, fitted, len(held), fit.percentage_errors(predicted, [r.model_seconds for r in held]))


def print_score(score: GroupScore) -> None:
    e = score.errors
    print(f"  held out       the model refitted on the first {score.fitted.n} rounds, scored on the last {score.held_out}: "
          f"absolute error per round median {_fmt(e['median'])}%, p90 {_fmt(e['p90'])}%"
          + (f" ({e['zero']:.0f} round(s) of 0 s left out)" if e["zero"] else ""))


def print_scores(scores: Sequence[GroupScore]) -> None:
    print(f"\n{'held-out error per round':<40} {'fitted':>7} {'scored':>7} {'median':>8} {'p90':>8}")
    for s in scores:
        print(f"  {s.group:<38} {s.fitted.n:>7} {s.held_out:>7} {_fmt(s.errors['median']):>7}% {_fmt(s.errors['p90']):>7}%")


def latency_model(result: fit.RoundTimeFit) -> latency.LatencyModel:
    return latency.LatencyModel(
        decode_tokens_per_s=result.decode_tokens_per_s if math.isfinite(result.decode_tokens_per_s) else 1e6,
        prefill_tokens_per_s=result.prefill_tokens_per_s if math.isfinite(result.prefill_tokens_per_s) else 1e9,
        cache_attention=None, request_overhead=result.fixed_s,
    )


def group_path(path: str, group: str) -> Path:
    """`profile.json` for group "codex/gpt-5.4": `profile.codex-gpt-5.4.json`."""
    target = Path(path)
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", group).strip("-") or "group"
    return target.with_name(f"{target.stem}.{slug}{target.suffix}")


# --- a real engine's calls -----------------------------------------------------------------------------------------


def engine_latency_model(result: fit.EngineTimingFit) -> latency.LatencyModel:
    first = result.first_token
    return latency.LatencyModel(
        decode_tokens_per_s=result.decode_tokens_per_s,
        prefill_tokens_per_s=first.prefill_tokens_per_s if math.isfinite(first.prefill_tokens_per_s) else 1e9,
        cache_attention=None, request_overhead=first.fixed_s,
    )


def fit_engine_calls(calls: Sequence[engine_calls.EngineCall]) -> fit.EngineTimingFit:
    """The latency model's engine terms fitted to a real engine's calls (fit.engine_timing_fit): `calibrate` on a
    calls file and `experiments.real_engine` on the calls it just made both fit here."""
    return fit.engine_timing_fit([c.prefill_tokens for c in calls], [c.ttft_s for c in calls],
                                 [c.output_tokens for c in calls], [c.decode_s for c in calls])


@attrs.frozen
class EngineScore:
    """The engine fit refitted on the first calls and scored on the rest: `held` are the calls scored, `ttft` and
    `whole` the `fit.percentage_errors` of their time to first token and of the whole call."""

    fitted: fit.EngineTimingFit
    held: tuple[engine_calls.EngineCall, ...]
    ttft: dict[str, float]
    whole: dict[str, float]

    def ttft_errors(self, calls: Sequence[engine_calls.EngineCall]) -> dict[str, float]:
        """`fit.percentage_errors` of the time to first token on `calls` (some of `held`)."""
        return fit.percentage_errors([float(self.fitted.first_token.predict(c.prefill_tokens, 0.0)) for c in calls],
                                     [c.ttft_s for c in calls])


def engine_calls_score(calls: Sequence[engine_calls.EngineCall], share: float) -> EngineScore:
    """Fit on the first calls (in the order made), score on the last `share` of them."""
    fitted_part, held_part = fit.holdout_split(len(calls), share)
    fitted = fit_engine_calls([calls[i] for i in fitted_part])
    held = tuple(calls[i] for i in held_part)
    whole = fit.percentage_errors([float(fitted.call_seconds(c.prefill_tokens, c.output_tokens)) for c in held],
                                  [c.ttft_s + c.decode_s for c in held])
    score = EngineScore(fitted, held, {}, whole)
    return attrs.evolve(score, ttft=score.ttft_errors(held))


def run_engine_calls(args: argparse.Namespace) -> int:
    try:
        calls = engine_calls.read(args.trace)
    except traces.TraceError as e:
        print(f"python -m prototype calibrate: error: {e}", file=sys.stderr)
        return 2
    if args.preset_out:
        print("python -m prototype calibrate: error: --preset-out: a real engine's calls hold no tasks (no tool times, "
              "no requests) to fit a workload preset to", file=sys.stderr)
        return 2
    designs = {d: sum(c.design == d for c in calls) for d in dict.fromkeys(c.design for c in calls)}
    print(f"{args.trace}: {engine_calls.FORMAT}, {len(calls)} calls ({', '.join(f'{d}: {n}' for d, n in designs.items())})")
    try:
        result = fit_engine_calls(calls)
    except ValueError as e:
        print(f"\nno fit: {e}")
        return 2 if args.latency_out else 0
    first = result.first_token
    print(f"\nFit of the engine's timings ({first.n} calls): time to first token = overhead + prefill computed / prefill rate; "
          "decode rate = tokens after the first / their time")
    print(f"  overhead       {first.fixed_s * 1000:9.1f} ms  (+/- {first.stderr[0] * 1000:.1f})   testbed: "
          f"{latency.ENGINE_REQUEST_OVERHEAD_S * 1000:g} ms")
    print(f"  prefill rate   {_fmt(first.prefill_tokens_per_s):>9} tokens/s (s/token +/- {first.stderr[1]:.2g})   testbed: "
          f"{latency.PREFILL_TOKENS_PER_S:g}")
    print(f"  decode rate    {_fmt(result.decode_tokens_per_s):>9} tokens/s   testbed: {latency.FLAGSHIP_TOKENS_PER_S:g} / "
          f"{latency.SPARK_TOKENS_PER_S:g} / {latency.SPARK_BURST_TOKENS_PER_S:g}")
    print(f"  in-sample      time to first token: rmse {first.rmse_s * 1000:.1f} ms, r2 {first.r2:.3f} (on the {first.n} "
          "calls it was fitted to)")
    try:
        score = engine_calls_score(calls, args.holdout)
    except ValueError as e:  # too few calls to hold any out, or the fitted part alone has no decode time
        print(f"  held out       not scored: {e}")
    else:
        ttft, whole = score.ttft, score.whole
        print(f"  held out       the model refitted on the first {score.fitted.first_token.n} calls, scored on the last "
              f"{len(score.held)}: absolute error per call, time to first token median {_fmt(ttft['median'])}%, "
              f"p90 {_fmt(ttft['p90'])}%; whole call median {_fmt(whole['median'])}%, p90 {_fmt(whole['p90'])}%")
    if args.latency_out:
        path = profiles.save_latency(engine_latency_model(result), args.latency_out,
                                     f"python -m prototype calibrate {args.trace} (fitted on all {first.n} real-engine calls, "
                                     f"time to first token in-sample rmse {first.rmse_s * 1000:.1f} ms)")
        print(f"wrote latency profile {path}: the fit on all {first.n} calls")
    return 0
