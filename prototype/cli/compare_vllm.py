"""`python -m prototype compare --engine vllm`: its default workload, the parameters in effect on the real
engine, and the report of what vLLM computed per design and where the designs' time went."""

from __future__ import annotations

import argparse
from typing import Any

from .. import benchmark, metrics
from ..client.harness import CHAINED, SUSPENDED
from ..engine.vllm_engine import RealCall
from ..engine.vllm_models import ModelSpec
from .engine_options import VLLM


class ContextTooLong(ValueError):
    """A task whose context cannot fit the real engine's model."""


# `--engine vllm`'s default workload: 3 chat tasks of 3 turns (a ~500-token first prompt, ~200 tokens out a turn,
# tools of 0.5 s), sized to finish in minutes on a 2-core CPU (docs/real_engine.md gives the time measured);
# `--preset coding` runs the coding tasks instead (a 30,000-token first prompt, tools of up to minutes).
VLLM_DEFAULTS = {"preset": "chat", "tasks": 3, "turns": 3}
VLLM_CALLS = "vllm_calls"  # the per-call records: vllm_calls.csv and vllm_calls.json
# The simulated engine's own parameters: on vLLM none of them applies (the engine's are printed instead).
SIMULATED_ENGINE_PARAMETERS = ("decode speeds", "prefill rate", "engine request overhead", "prefix cache")
ENGINE_PHASES = (metrics.QUEUE, metrics.PREFILL, metrics.DECODE)
TOOL_PHASES = ("tool", metrics.HOSTED_TOOL)


def apply_engine_defaults(args: argparse.Namespace) -> None:
    """On vLLM, the workload options left unset (no --trace) take VLLM_DEFAULTS."""
    if args.engine != VLLM or args.trace is not None:
        return
    if args.preset is None:
        args.preset = VLLM_DEFAULTS["preset"]
        args.turns = VLLM_DEFAULTS["turns"] if args.turns is None else args.turns
    if args.tasks is None:
        args.tasks = VLLM_DEFAULTS["tasks"]


def vllm_report(calls: dict[str, list[RealCall]], rows: list[dict[str, Any]], block: int) -> list[str]:
    """What vLLM computed per design beside the simulated engine's prediction for the same calls, and where the
    designs' time went: the engine's (measured) apart from the API's, the network's and the tools' (modeled)."""
    lines = ["vLLM's counters per design (prefill computed and prefix-cache hits: vLLM's own; predicted: the simulated "
             "engine's bookkeeping on the same calls):"]
    for design, design_calls in calls.items():
        prompt = sum(c.prompt_tokens for c in design_calls)
        computed = sum(c.prefill_tokens for c in design_calls)
        predicted = sum(c.predicted_prefill_tokens for c in design_calls)
        line = (f"  {design:<12} model calls {len(design_calls):>4}  prompt tokens {prompt:>9,}  prefill computed "
                f"{computed:>9,}  predicted {predicted:>9,}  prefix-cache hits {sum(c.prefix_hits for c in design_calls):>9,}")
        if any(c.resumed for c in design_calls):
            # A held request's KV is no cache hit to vLLM: the API's cached_tokens is worked out from what was sent.
            line += f"  cached (derived: prompt less ids sent) {sum(c.prompt_tokens - c.sent_tokens for c in design_calls if c.resumed):>9,}"
        off_plan = sum(c.off_plan_tokens for c in design_calls)
        lines.append(line + (f"  SAMPLED OFF THE PLAN {off_plan:,} tokens" if off_plan else ""))
    if CHAINED in calls:
        gaps = [abs(c.prefill_tokens - c.predicted_prefill_tokens) for c in calls[CHAINED]]
        within = sum(gap <= block for gap in gaps)
        lines.append(f"  chained per call, vLLM against the prediction: {within} of {len(gaps)} calls within one KV block "
                     f"({block} tokens); largest gap {max(gaps, default=0)} tokens")
    if CHAINED in calls and SUSPENDED in calls:
        def lead(field: str) -> int:
            return sum(getattr(c, field) for c in calls[CHAINED]) - sum(getattr(c, field) for c in calls[SUSPENDED])

        real, predicted = lead("prefill_tokens"), lead("predicted_prefill_tokens")
        share = f"{(real - predicted) / predicted:+.1%}" if predicted else "-"
        lines.append(f"  v1's lead over chained in prefill computed: vLLM {real:,} tokens, predicted {predicted:,} ({share})")
    lines += ["", "Where the time went, per design, all tasks (seconds): the engine's is measured on vLLM; the API's work, the "
              "network and the tools are modeled waits"]
    header = f"  {'design':<12} {'vLLM (measured)':>16} {'API (modeled)':>14} {'network+client':>15} {'tools (modeled)':>16} {'end to end':>11}"
    lines.append(header)
    for design in calls:
        mine = [row for row in rows if row["design"] == design]
        spent = [sum(row["phase_totals_s"].get(phase, 0.0) for row in mine for phase in phases)
                 for phases in (ENGINE_PHASES, benchmark.API_OVERHEAD_PHASES, ("network_client",), TOOL_PHASES)]
        lines.append(f"  {design:<12} {spent[0]:>16.1f} {spent[1]:>14.1f} {spent[2]:>15.1f} {spent[3]:>16.1f} "
                     f"{sum(row['e2e_s'] for row in mine):>11.1f}")
    lines.append("  network+client: the modeled round trips and the testbed's own client and server work between them")
    return lines


def vllm_parameters(parameters: list[tuple[str, str, str]], spec: ModelSpec) -> list[tuple[str, str, str]]:
    """The parameters in effect on vLLM: the engine's own in place of the simulated engine's."""
    kv = f"blocks of {spec.block_size} tokens, prefix caching on" + (
        f", {spec.cpu_kv_cache_gib} GiB (VLLM_CPU_KVCACHE_SPACE)" if spec.cpu_kv_cache_gib is not None else "")
    engine = [
        ("engine", f"vLLM, {spec.name}: {spec.layers} layers, {spec.hidden_size} wide, {spec.dtype}, dummy weights; "
         "forced decoding; real time", "docs/real_engine.md"),
        ("KV cache", kv, "vLLM engine arguments (prototype/engine/vllm_models.py)"),
    ]
    return engine + [row for row in parameters if row[0] not in SIMULATED_ENGINE_PARAMETERS]

