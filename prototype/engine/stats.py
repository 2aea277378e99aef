"""The engine's counters: what a run's model calls prefilled, decoded, waited for and swapped."""

from __future__ import annotations

import attrs

# Per-call samples kept in the lists below (the most recent ones) [ours]: a long-running server's
# memory stays bounded.
MAX_STAT_SAMPLES = 100_000


def sample(samples: list[float], value: float) -> None:
    """Append, keeping the most recent MAX_STAT_SAMPLES (trimmed in batches: amortised O(1))."""
    samples.append(value)
    if len(samples) > 2 * MAX_STAT_SAMPLES:
        del samples[:-MAX_STAT_SAMPLES]


@attrs.define
class EngineStats:
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decoded_tokens: int = 0
    model_calls: int = 0
    recomputed_tokens: int = 0
    """Tokens prefilled that the session had computed before (its KV was dropped in between)."""
    queue_delays: list[float] = attrs.Factory(list)
    """Per admitted model call: seconds from asking for admission to getting it."""
    prefill_waits: list[float] = attrs.Factory(list)
    """Per prefill, with `serial_prefill`: seconds waiting for the GPU's compute."""
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    swap_in_seconds: float = 0.0
    """Time calls spent waiting for their KV to come back from the host (link queue included)."""
    peak_resident_tokens: int = 0
    peak_host_tokens: int = 0
    peak_active_calls: int = 0
    resident_token_seconds: float = 0.0
    """Integral of GPU-resident KV tokens over time: divide by a duration for the mean."""
    discarded: int = 0  # entries dropped by the DISCARD policy
    evicted: int = 0  # cache entries dropped to make room
    preempted: int = 0  # held entries dropped to make room for an older session
    expired: int = 0  # entries dropped at the end of their TTL
    swap_dropped: int = 0  # entries dropped because the host was full
