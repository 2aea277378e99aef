"""The simulated model's latency: per-request overhead, prefill over uncached tokens, decode rate.

Every default is an input with a source (docs/parameters.md §3); nothing here is tuned to a published
end-to-end number. Model names that real clients send map to a profile (documented in docs/serving.md):
"""

from __future__ import annotations

import re

import attrs

from ..ranges import Range

# Decode rates (OpenAI blog, "Speeding up agentic workflows with WebSockets", Apr 2026):
# GPT-5 / GPT-5.2 class about 65 tokens/s; GPT-5.3-Codex-Spark on Cerebras above 1,000 tokens/s,
# with bursts up to 4,000.
FLAGSHIP_TOKENS_PER_S = 65.0
SPARK_TOKENS_PER_S = 1000.0
SPARK_BURST_TOKENS_PER_S = 4000.0

# Prefill: t = t0 + n/R + n*C/Q (docs/parameters.md §3 roofline, kipply "Transformer Inference
# Arithmetic"). R: the sweep 5k/15k/30k tokens/s is [assumed]; 15k is its middle. Q: Llama-3.1-8B on
# one H100 at MFU 0.5, 9.4e8 tokens^2/s [derived]. Hosted-model prefill rates are not published.
PREFILL_TOKENS_PER_S = 15_000.0
CACHE_ATTENTION_TOKENS2_PER_S = 9.4e8
# Scheduling and launch cost of one engine call [assumed]; vLLM PR #54628 measures 8-12 ms between
# client and server TTFT on a local engine, which bounds it from above.
ENGINE_REQUEST_OVERHEAD_S = 0.010
PREFILL_RANGE = Range(5_000.0, 30_000.0, "docs/parameters.md §3's sweep: hosted prefill rates are unpublished; "
                      "5k tokens/s is a busy shared GPU, 30k a large model's roofline on one H100 node [assumed]")
ENGINE_OVERHEAD_RANGE = Range(0.002, 0.012, "vLLM PR #54628 measures 8-12 ms between client and server TTFT on a "
                              "local engine, which bounds it from above; one scheduler step, ~2 ms, from below [assumed]")


@attrs.frozen
class LatencyModel:
    """How long the engine takes: `prefill_seconds` for a model call, then `1/decode_tokens_per_s`
    per sampled token."""

    decode_tokens_per_s: float = FLAGSHIP_TOKENS_PER_S
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    cache_attention: float | None = CACHE_ATTENTION_TOKENS2_PER_S
    request_overhead: float = ENGINE_REQUEST_OVERHEAD_S

    def prefill_seconds(self, uncached: int, cached: int) -> float:
        """Time for one model call to prefill `uncached` new tokens attending to `cached` ones."""
        seconds = self.request_overhead + uncached / self.prefill_tokens_per_s
        if self.cache_attention:
            seconds += uncached * cached / self.cache_attention
        return seconds

    def decode_seconds(self, tokens: int) -> float:
        return tokens / self.decode_tokens_per_s


# Names real clients send, mapped to a profile's decode rate. Unknown names get the flagship rate.
# `sim-<N>` asks for N tokens/s directly; a request's metadata `testbed_decode_tps` overrides both.
_PROFILE_RULES: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"spark.*burst|burst"), SPARK_BURST_TOKENS_PER_S),
    (re.compile(r"spark"), SPARK_TOKENS_PER_S),
)
_SIM_NAME = re.compile(r"^sim-(\d+(?:\.\d+)?)$")


def decode_rate_for_model(model: str) -> float:
    """The decode rate of the simulated profile a model name selects (the table in docs/serving.md)."""
    name = model.lower()
    match = _SIM_NAME.match(name)
    if match:
        return float(match.group(1))
    for pattern, rate in _PROFILE_RULES:
        if pattern.search(name):
            return rate
    return FLAGSHIP_TOKENS_PER_S
