"""The engine's KV memory: what one GPU holds, what the host holds, and what happens to idle KV.

Every number is an input with a label (docs/parameters.md's convention): [src] published, [derived] our
arithmetic on published numbers, [assumed] our modelling choice. The engine (engine.py) reads them
only when an experiment asks for a budget; with none, the engine has unlimited memory, as before.

A session's KV is, at any time, in one place:

* on the GPU, counted against `kv_budget_tokens`: during a model call (prefill and decode) and, if
  the retention policy keeps it, while the session waits for a tool or its next request;
* on the host, after a swap-out (SWAP), counted against `host_budget_tokens`;
* nowhere: discarded, evicted, expired or preempted; the next call prefills it again, and those
  tokens are counted as recomputed.

What the policy does with a session's KV when a model call ends at a tool call (the session
pauses: InferCept's "interception"; a call that ends with the final answer leaves unpinned KV as
plain cache under every policy but DISCARD):

| policy           | pinned KV (v1's live coroutine)          | unpinned KV (v2 prefix cache)                   |
| ---------------- | ---------------------------------------- | ----------------------------------------------- |
| HOLD             | stays on the GPU until released          | cache: LRU-evicted under pressure, expires after the engine's `kv_ttl` idle |
| ttl(s)           | as HOLD                                  | cache: LRU-evicted under pressure, expires after s idle |
| ttl(s, pin=True) | as HOLD                                  | held on the GPU for s idle, then freed (Continuum / CacheTTL) |
| DISCARD          | freed at once                            | freed at once                                   |
| SWAP             | copied to the host, freed on the GPU when the copy ends; copied back before the next prefill | as pinned; on the host it expires after `kv_ttl` idle |

Held KV (pinned, or pinned by a pin-TTL) is never evicted to make room for a younger session: a new
session queues. A call of an older session may preempt the held KV of younger idle sessions,
youngest first (vLLM preempts its latest request, recompute mode): without that, held sessions that
all need a little more memory to resume would wait for each other forever.
"""

from __future__ import annotations

import attrs

from ..ranges import Range

# --- KV geometry and the GPU (docs/parameters.md §3) ----------------------------------------------------

# KV bytes per token, 2 (K and V) x layers x KV heads x head dim x 2 bytes (BF16) [derived from the
# Llama-3.1 configs]: 8B has 32 layers, 8 KV heads of 128 -> 131,072 B; 70B has 80 layers -> 327,680 B.
KV_BYTES_PER_TOKEN_8B = 2 * 32 * 8 * 128 * 2  # 128 KiB
KV_BYTES_PER_TOKEN_70B = 2 * 80 * 8 * 128 * 2  # 320 KiB

# One H100 SXM has 80 GB of HBM3 [src: NVIDIA H100 datasheet]. vLLM takes 90% of it by default
# (`gpu_memory_utilization` = 0.9 [src: vLLM engine arguments]). Llama-3.1-8B has 8.03B parameters
# [src: model card], 2 bytes each in BF16. Activation workspace is left out [assumed], so the budget
# is an upper bound: (0.9 x 80e9 - 8.03e9 x 2) / 131,072 = 426,788 tokens [derived], ~52 GiB.
H100_HBM_BYTES = 80e9
GPU_MEMORY_UTILIZATION = 0.9
LLAMA_8B_WEIGHT_BYTES = 8.03e9 * 2
H100_8B_KV_BUDGET_TOKENS = int((GPU_MEMORY_UTILIZATION * H100_HBM_BYTES - LLAMA_8B_WEIGHT_BYTES) // KV_BYTES_PER_TOKEN_8B)

# A DGX H100 has 2 TB of system memory for its 8 GPUs [src: NVIDIA DGX H100 datasheet]: 250 GB of
# host memory per GPU, 1,907,348 tokens of 8B KV [derived].
DGX_H100_HOST_BYTES_PER_GPU = 2e12 / 8
H100_8B_HOST_BUDGET_TOKENS = int(DGX_H100_HOST_BYTES_PER_GPU // KV_BYTES_PER_TOKEN_8B)

# Host <-> GPU copy rate, each direction [assumed]: the effective rate of PCIe Gen4 x16 (32 GB/s
# raw). H100 SXM's Gen5 link doubles the raw rate; sweep it. Swap-in of 50k tokens of 8B KV:
# 50,000 x 131,072 B / 25e9 B/s = 0.26 s [derived], against 3.3 s to prefill them at 15k tok/s.
PCIE_BYTES_PER_S = 25e9
PCIE_RANGE = Range(12e9, 55e9, "pageable-memory copies over Gen4 x16 (about half its raw rate) to pinned copies over "
                   "Gen5 x16 (64 GB/s raw) [assumed]")

# Concurrent sequences one engine batches: vLLM's `max_num_seqs` default, 256 [src: vLLM engine
# arguments]. Per-token decode speed does not depend on the batch in this model (see engine.py).
VLLM_MAX_NUM_SEQS = 256


# --- retention policies --------------------------------------------------------------------------

HOLD = "hold"
TTL = "ttl"
DISCARD = "discard"
SWAP = "swap"


@attrs.frozen
class RetentionPolicy:
    """What the engine does with a session's KV while the session is idle (module docstring)."""

    kind: str = attrs.field(validator=attrs.validators.in_((HOLD, TTL, DISCARD, SWAP)))
    ttl: float | None = None
    """ttl only: idle seconds an unpinned entry is kept; None takes the engine's `kv_ttl`."""
    pin: bool = False
    """ttl only: hold unpinned entries for the whole ttl (never evicted) instead of caching them."""

    def __attrs_post_init__(self) -> None:
        if self.ttl is not None and not self.ttl >= 0:
            raise ValueError(f"ttl must be >= 0, got {self.ttl}")
        if (self.ttl is not None or self.pin) and self.kind != TTL:
            raise ValueError("ttl and pin apply to the ttl policy only")

    @property
    def label(self) -> str:
        if self.kind != TTL:
            return self.kind
        ttl = "kv_ttl" if self.ttl is None else f"{self.ttl:g}s"
        return f"{'pin' if self.pin else 'ttl'}-{ttl}"


def ttl(seconds: float, *, pin: bool = False) -> RetentionPolicy:
    """A prefix cache whose idle entries expire after `seconds` (pin: held, not evictable, for that long)."""
    return RetentionPolicy(TTL, float(seconds), pin)


HOLD_POLICY = RetentionPolicy(HOLD)
DISCARD_POLICY = RetentionPolicy(DISCARD)
SWAP_POLICY = RetentionPolicy(SWAP)


def parse_policy(text: str) -> RetentionPolicy:
    """`hold`, `discard`, `swap`, `ttl-<seconds>` or `pin-<seconds>`."""
    if text in (HOLD, DISCARD, SWAP):
        return RetentionPolicy(text)
    kind, _, seconds = text.partition("-")
    if kind in ("ttl", "pin") and seconds:
        return ttl(float(seconds.removesuffix("s")), pin=kind == "pin")
    raise ValueError(f"unknown retention policy {text!r}: use hold, discard, swap, ttl-<s> or pin-<s>")


__all__ = [
    "DISCARD",
    "DISCARD_POLICY",
    "H100_8B_HOST_BUDGET_TOKENS",
    "H100_8B_KV_BUDGET_TOKENS",
    "HOLD",
    "HOLD_POLICY",
    "KV_BYTES_PER_TOKEN_8B",
    "KV_BYTES_PER_TOKEN_70B",
    "PCIE_BYTES_PER_S",
    "SWAP",
    "SWAP_POLICY",
    "TTL",
    "VLLM_MAX_NUM_SEQS",
    "RetentionPolicy",
    "parse_policy",
    "ttl",
]
