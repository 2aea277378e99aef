"""The same tasks on the simulated engine and on a real one (vLLM, dummy weights): what the real
engine computed per design and turn, and how far the simulated engine's prediction is from it.

For every model call, from vLLM's own counters (vllm_worker.Counters; one call in flight at a
time, so each call's share is exact): the prefill tokens its scheduler computed, the prefix-cache
hits it counted, the request's num_cached_tokens; from the client side, the time to the first token
and the decode rate; the KV blocks in use at the first token. vLLM samples each call's planned ids
(forced decoding), so its KV holds the transcript's tokens. Beside each, the simulated engine's
prediction for the same call: its prefill tokens (its residency and prefix-cache model, run beside
vLLM on the same calls) and its time to first token (the latency model). The latency model is then
fitted to the real engine's timings (`calibrate`'s fit, prototype/engine/fit.py) and its error
reported twice, labelled: in-sample (the fit on every call, scored on the same calls) and held out
(the model refitted on the first calls in the order made, scored on the last 30%, with their
number). `--latency-out` saves the fit on every call as a profile that `compare --latency` and
`serve` load; `python -m prototype calibrate <the calls CSV>` makes the same fit and score from the
written file.

    python -m experiments.real_engine                      # tiny model on CPU, 2 chat tasks x 3 turns
    python -m experiments.real_engine --gpu                # Llama-3.1-8B-shaped model on one GPU (docs/real_engine.md)

On a CPU the timings are a tiny model's on a CPU: they say nothing of a GPU's speed. The token
counts (what was prefilled, what was found cached) are the engine's behaviour and hold anywhere.
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any

import attrs

from experiments.common import experiment_parser, report
from prototype import benchmark, profiles
from prototype.api.costs import ZERO_COSTS
from prototype.cli import calibrate
from prototype.cli.common import add_list
from prototype.engine.latency import SPARK_TOKENS_PER_S, LatencyModel
from prototype.engine.vllm_client import VllmUnavailable, WorkerFailed, WorkerProcess
from prototype.engine.vllm_engine import RealCall, call_records
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, MODELS, TINY_CPU
from prototype.traces.engine_calls import EngineCall

# The decode speed whose model profile the tasks name; on the real engine it only labels the runs.
PROFILE_TPS = SPARK_TOKENS_PER_S
# The GPU run's comparison with the 8B-shaped model: ~12,000 sampled tokens per design, short tools
# (its time on a GPU has not been measured: no GPU was available where it was written).
GPU_TASKS, GPU_TURNS, GPU_TOOL_SECONDS = 5, 8, 0.5


def real_config(preset: str, tasks: int, turns: int, seed: int, tool_seconds: float | None) -> benchmark.BenchConfig:
    """The tasks, with API stage costs zero (the question is the engine's: modeled API sleeps would
    only add real time) and, with `tool_seconds`, every tool call that long (real time is spent
    waiting for tools; the engine's figures do not depend on how long)."""
    config = benchmark.BenchConfig(preset=preset, n_tasks=tasks, seed=seed, fixed_turns=turns, costs=ZERO_COSTS)
    if tool_seconds is None:
        return config
    fixed = tuple(attrs.evolve(task, turns=tuple(attrs.evolve(turn, tool_seconds=tuple(tool_seconds for _ in turn.tool_seconds))
                                                 for turn in task.turns)) for task in config.tasks())
    return attrs.evolve(config, task_list=fixed)


HOLDOUT_SHARE = calibrate.HOLDOUT_SHARE  # the last 30% of the calls, in the order made, score a fit on the rest


def call_rows(design: str, calls: list[RealCall], model: LatencyModel, fitted: LatencyModel | None) -> list[dict[str, Any]]:
    """vLLM's record of each call (vllm_engine.call_records) with the time to first token the simulated engine's
    latency model predicts for it (`ttft_sim_ms`) and, given a fit, the fitted model's (`ttft_fit_ms`)."""
    rows = call_records(design, calls)
    for row, call in zip(rows, calls):
        predicted_cached = call.prompt_tokens - call.predicted_prefill_tokens
        row["ttft_sim_ms"] = model.prefill_seconds(call.predicted_prefill_tokens, predicted_cached) * 1000
        if fitted is not None:
            row["ttft_fit_ms"] = fitted.prefill_seconds(call.prefill_tokens, call.prompt_tokens - call.prefill_tokens) * 1000
    return rows


def engine_calls(rows: list[dict[str, Any]]) -> list[EngineCall]:
    """The calls as `calibrate` reads them from the written file: the tokens vLLM sampled are those its decode time covers."""
    return [EngineCall(row["design"], row["prompt_tokens"], row["prefill_vllm"], row["sampled_tokens"], row["ttft_ms"] / 1000,
                       row["decode_ms"] / 1000) for row in rows]


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def summary_rows(rows: list[dict[str, Any]], held_out: calibrate.EngineScore | None = None) -> list[dict[str, Any]]:
    """Per design: the prefill vLLM computed against the simulated prediction, the mean time to first token against
    the latency model's and (given a fit) the fitted model's, in-sample, and the held-out error of the refitted model
    on this design's calls among the held-out ones (median absolute error per call, and how many calls)."""
    out = []
    for design in dict.fromkeys(row["design"] for row in rows):
        mine = [row for row in rows if row["design"] == design]
        real_prefill = sum(row["prefill_vllm"] for row in mine)
        sim_prefill = sum(row["prefill_sim"] for row in mine)
        ttft = statistics.fmean(row["ttft_ms"] for row in mine)
        ttft_sim = statistics.fmean(row["ttft_sim_ms"] for row in mine)
        summary = {
            "design": design, "calls": len(mine), "prompt_tokens": sum(row["prompt_tokens"] for row in mine),
            "prefill_vllm": real_prefill, "prefill_sim": sim_prefill, "prefill_error": _error(sim_prefill, real_prefill),
            "prefix_hits_vllm": sum(row["prefix_hits_vllm"] for row in mine),
            "ttft_ms": ttft, "ttft_sim_ms": ttft_sim, "ttft_sim_error": _error(ttft_sim, ttft),
            "decode_tps": statistics.fmean(row["decode_tps"] for row in mine if row["decode_tps"] == row["decode_tps"]),
            "kv_blocks_max": max(row["kv_blocks"] for row in mine),
        }
        if "ttft_fit_ms" in mine[0]:
            ttft_fit = statistics.fmean(row["ttft_fit_ms"] for row in mine)
            summary |= {"ttft_fit_ms": ttft_fit, "ttft_fit_error_in_sample": _error(ttft_fit, ttft)}
        if held_out is not None:
            errors = held_out.ttft_errors([call for call in held_out.held if call.design == design])
            summary |= {"ttft_fit_held_out_median_pct": errors["median"], "held_out_calls": int(errors["n"])}
        out.append(summary)
    return out


def main(argv: list[str] | None = None, *, worker: WorkerProcess | None = None) -> dict[str, list[dict[str, Any]]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=2, help="tasks per design (default 2)")
    parser.add_argument("--turns", type=int, default=3, help="turns per task (default 3)")
    parser.add_argument("--preset", default="chat", help="workload preset (default chat: short prompts, for a CPU)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--model", choices=sorted(MODELS), default=TINY_CPU.name, help=f"model config (default {TINY_CPU.name})")
    parser.add_argument("--gpu", action="store_true", help=f"the GPU run: --model {LLAMA_8B_SHAPE.name}, the coding preset, "
                        f"{GPU_TASKS} tasks x {GPU_TURNS} turns, tools of {GPU_TOOL_SECONDS:g} s")
    parser.add_argument("--tool-seconds", type=float, default=None, help="every tool call takes this long (default: as the workload draws it)")
    parser.add_argument("--vllm-python", default=None, help="the interpreter that has vLLM (default: as `compare --engine vllm`)")
    parser.add_argument("--latency-out", default=None, help="save the latency model fitted to the real engine here (JSON)")
    add_list(parser, "--designs", str, benchmark.DESIGNS, "designs to run", choices=list(benchmark.DESIGNS))
    args = parser.parse_args(argv)
    spec = MODELS[args.model]
    if args.gpu:
        spec, args.preset, args.tasks, args.turns = LLAMA_8B_SHAPE, "coding", GPU_TASKS, GPU_TURNS
        args.tool_seconds = GPU_TOOL_SECONDS if args.tool_seconds is None else args.tool_seconds
    config = real_config(args.preset, args.tasks, args.turns, args.seed, args.tool_seconds)
    failure = None
    try:
        results = benchmark.run_designs_on_vllm(args.designs, config, spec, python=args.vllm_python, decode_tps=PROFILE_TPS,
                                                worker=worker)
    except* (VllmUnavailable, WorkerFailed) as group:
        failure = group.exceptions[0]
    if failure is not None:  # no vLLM, or an engine that would not start: one line, the reason
        print(f"python -m experiments.real_engine: error: {failure}", file=sys.stderr)
        raise SystemExit(2)
    model = LatencyModel(decode_tokens_per_s=PROFILE_TPS)
    rows = [row for design, (_, calls) in results.items() for row in call_rows(design, calls, model, None)]
    calls = engine_calls(rows)
    fitted = held_out = None
    try:
        fitted = calibrate.fit_engine_calls(calls)
        held_out = calibrate.engine_calls_score(calls, HOLDOUT_SHARE)
    except ValueError as reason:  # too few calls (or no decode time) for a fit, or to hold any out
        print(f"{'no fit' if fitted is None else 'no held-out score'}: {reason}\n")
    if fitted is not None:
        rows = [row for design, (_, design_calls) in results.items()
                for row in call_rows(design, design_calls, model, calibrate.engine_latency_model(fitted))]
    summary = summary_rows(rows, held_out)
    print(f"{args.tasks} {args.preset} tasks x {args.turns} turns per design on vLLM ({spec.name}, dummy weights), real time\n")
    calls_path = report(rows, "real_engine_calls.csv")
    print()
    report(summary, "real_engine.csv")
    if fitted is not None:
        first = fitted.first_token
        print(f"\nlatency model fitted to the real engine on all {first.n} calls: overhead {first.fixed_s * 1000:.1f} ms, "
              f"prefill {first.prefill_tokens_per_s:,.0f} tokens/s (time to first token, in-sample R² {first.r2:.3f}), "
              f"decode {fitted.decode_tokens_per_s:,.1f} tokens/s")
        print("  ttft_fit_error_in_sample: that fit's mean against the measured mean, on the calls it was fitted to")
        if held_out is not None:
            print(f"  ttft_fit_held_out_median_pct: the model refitted on the first {held_out.fitted.first_token.n} calls, "
                  f"scored on the last {len(held_out.held)} (held_out_calls of them per design): median absolute error per "
                  f"call, all held out {held_out.ttft['median']:.1f}%, p90 {held_out.ttft['p90']:.1f}%")
        if args.latency_out and math.isfinite(first.prefill_tokens_per_s):
            path = profiles.save_latency(calibrate.engine_latency_model(fitted), args.latency_out,
                                         f"experiments.real_engine on {spec.name}: fitted on all {first.n} calls")
            print(f"wrote {path}")
        elif args.latency_out:
            print("not saved: a rate the calls cannot determine came out infinite (more calls, or longer ones, fit it)")
        print(f"the same fit and score from the file: python -m prototype calibrate {calls_path}")
    return {"calls": rows, "summary": summary}


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
