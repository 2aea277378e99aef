"""The same tasks on the simulated engine and on a real one (vLLM, dummy weights): what the real
engine computed per design and turn, and how far the simulated engine's prediction is from it.

For every model call, from vLLM's own counters (vllm_worker.Counters; one call in flight at a
time, so each call's share is exact): the prefill tokens its scheduler computed, the prefix-cache
hits it counted, the request's num_cached_tokens; from the client side, the time to the first token
and the decode rate; the KV blocks in use at the first token. Beside each, the simulated engine's
prediction for the same call: its prefill tokens (its residency and prefix-cache model, run beside
vLLM on the same calls) and its time to first token (the latency model). The latency model is then
fitted to the real engine's timings (prototype/engine/fit.py), and the fitted model's error is
reported too; `--latency-out` saves the fit as a profile that `compare --latency` and `serve` load.
`python -m prototype calibrate <the calls CSV>` makes the same fit from the written file and scores
it on the calls it was not fitted to.

    python -m experiments.real_engine                      # tiny model on CPU, 2 chat tasks x 3 turns
    python -m experiments.real_engine --gpu                # Llama-3.1-8B-shaped model on one GPU (docs/real_engine.md)

On a CPU the timings are a tiny model's on a CPU: they say nothing of a GPU's speed. The token
counts (what was prefilled, what was found cached) are the engine's behaviour and hold anywhere.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import attrs

from experiments.common import experiment_parser, report
from prototype import benchmark, profiles
from prototype.api.costs import ZERO_COSTS
from prototype.cli import calibrate
from prototype.cli.common import add_list
from prototype.engine import fit
from prototype.engine.latency import SPARK_TOKENS_PER_S, LatencyModel
from prototype.engine.vllm_client import WorkerProcess
from prototype.engine.vllm_engine import RealCall
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, MODELS, TINY_CPU

# The decode speed whose model profile the tasks name; on the real engine it only labels the runs.
PROFILE_TPS = SPARK_TOKENS_PER_S
# The GPU run's comparison, sized for about 5 minutes on one H200 with the 8B-shaped model (an
# estimate: ~12,000 sampled tokens per design at ~100 tokens/s for one sequence, plus tools).
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


def _session(key: Hashable) -> Hashable:
    """The conversation a call belongs to: an http turn routed elsewhere keys on its home's key."""
    return key[1] if isinstance(key, tuple) and key and key[0] == "http-elsewhere" else key


def call_rows(design: str, calls: list[RealCall], model: LatencyModel, fitted: LatencyModel | None) -> list[dict[str, Any]]:
    calls_so_far: dict[Hashable, int] = defaultdict(int)
    tasks: dict[Hashable, int] = {}
    rows = []
    for call in calls:
        session = _session(call.key)
        task = tasks.setdefault(session, len(tasks))
        calls_so_far[session] += 1
        predicted_cached = call.prompt_tokens - call.predicted_prefill_tokens
        row = {
            "design": design, "task": task, "call": calls_so_far[session], "resumed": call.resumed, "routed_away": call.isolated,
            "prompt_tokens": call.prompt_tokens, "sent_tokens": call.sent_tokens,
            "prefill_vllm": call.prefill_tokens, "prefill_sim": call.predicted_prefill_tokens,
            "prefix_hits_vllm": call.prefix_hits, "cached_vllm": call.vllm_cached_tokens,
            "output_tokens": call.output_tokens, "ttft_ms": call.ttft_s * 1000, "decode_ms": call.decode_s * 1000,
            "ttft_sim_ms": model.prefill_seconds(call.predicted_prefill_tokens, predicted_cached) * 1000,
            "decode_tps": (call.output_tokens - 1) / call.decode_s if call.decode_s > 0 else float("nan"),
            "kv_blocks": call.kv_blocks_used,
        }
        if fitted is not None:
            row["ttft_fit_ms"] = fitted.prefill_seconds(call.prefill_tokens, call.prompt_tokens - call.prefill_tokens) * 1000
        rows.append(row)
    return rows


def fit_latency(calls: list[RealCall]) -> tuple[LatencyModel, fit.RoundTimeFit] | None:
    """The latency model fitted to the real engine's calls, as `calibrate` fits it to this experiment's
    real_engine_calls.csv (fit.engine_timing_fit): time to first token against the tokens vLLM prefilled
    (overhead and prefill rate), and the decode rate. None with fewer than 4 calls or no decode time."""
    if len(calls) < 4:
        return None
    try:
        result = fit.engine_timing_fit([c.prefill_tokens for c in calls], [c.ttft_s for c in calls],
                                       [c.output_tokens for c in calls], [c.decode_s for c in calls])
    except ValueError:
        return None
    return calibrate.engine_latency_model(result), result.first_token


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
            summary |= {"ttft_fit_ms": ttft_fit, "ttft_fit_error": _error(ttft_fit, ttft)}
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
    results = benchmark.run_designs_on_vllm(args.designs, config, spec, python=args.vllm_python, decode_tps=PROFILE_TPS,
                                            worker=worker)
    every_call = [call for _, calls in results.values() for call in calls]
    fitted = fit_latency(every_call)
    model = LatencyModel(decode_tokens_per_s=PROFILE_TPS)
    rows = [row for design, (_, calls) in results.items()
            for row in call_rows(design, calls, model, fitted[0] if fitted else None)]
    summary = summary_rows(rows)
    print(f"{args.tasks} {args.preset} tasks x {args.turns} turns per design on vLLM ({spec.name}, dummy weights), real time\n")
    calls_path = report(rows, "real_engine_calls.csv")
    print()
    report(summary, "real_engine.csv")
    if fitted is not None:
        model_fit, result = fitted
        print(f"\nlatency model fitted to the real engine ({result.n} calls): overhead {result.fixed_s * 1000:.1f} ms, "
              f"prefill {result.prefill_tokens_per_s:,.0f} tokens/s (time to first token: R² {result.r2:.3f}), "
              f"decode {model_fit.decode_tokens_per_s:,.1f} tokens/s")
        if args.latency_out and math.isfinite(result.prefill_tokens_per_s):
            path = profiles.save_latency(model_fit, args.latency_out, f"experiments.real_engine on {spec.name}")
            print(f"wrote {path}")
        elif args.latency_out:
            print("not saved: a rate the calls cannot determine came out infinite (more calls, or longer ones, fit it)")
        print(f"the same fit, scored on held-out calls: python -m prototype calibrate {calls_path}")
    return {"calls": rows, "summary": summary}


if __name__ == "__main__":
    main()
