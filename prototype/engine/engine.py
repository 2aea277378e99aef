"""The simulated engine (the "GPU"): KV residency, prefix-cache hits, and paced token streaming.

The engine keeps, per sampling session, which prompt its KV holds and how many tokens of it. A
model call prefills only what is not resident, then streams tokens on the trio clock at the
profile's decode rate, so under a MockClock a long rollout costs milliseconds of real time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence

import attrs
import trio

from .latency import LatencyModel

# Prefix-cache retention: the vLLM session KV hint defaults to 300 s (vLLM RFC #52113); OpenAI's
# prompt-caching guide says caches clear after 5-10 minutes idle (WORKLOAD.md §6).
KV_TTL_SECONDS = 300.0
# vLLM automatic prefix caching matches only full blocks of 16 tokens, and always recomputes at
# least the last token (vllm-project/agentic-api ADR-04).
BLOCK_SIZE = 16
# Share of http requests routed back to the engine holding their prefix [assumed], WORKLOAD.md §6.
HTTP_AFFINITY = 0.9


@attrs.define(eq=False)
class Prompt:
    """A rendered prompt: token ids, append-only, so a KV entry that points at this object and
    covers its first n ids stays valid however long the prompt grows."""

    ids: list[int] = attrs.Factory(list)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)


@attrs.define(eq=False)
class KVEntry:
    prompt: Prompt
    tokens: int
    last_used: float
    pinned: bool = False  # held by a live coroutine (v1): no idle expiry while pinned


class EngineFailure(Exception):
    """The engine failed mid-response (a fault injected by an experiment or test)."""


@attrs.define(eq=False)
class FaultPlan:
    """Fault injection, for tests and experiments: the engine raises `EngineFailure` at a flush.

    `Engine.stream` calls `on_flush` before it yields each chunk of sampled text; after
    `flushes_before_failure` flushes (counted over every stream of the engine) the next `failures`
    flushes raise. An engine without a plan (the default) pays one attribute check per flush.
    """

    flushes_before_failure: int = 0
    failures: int = 1
    flushes: int = 0  # flushes seen so far
    raised: int = 0  # failures raised so far

    def on_flush(self) -> None:
        self.flushes += 1
        if self.raised < self.failures and self.flushes > self.flushes_before_failure:
            self.raised += 1
            raise EngineFailure("injected engine failure")


@attrs.define
class EngineStats:
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decoded_tokens: int = 0
    model_calls: int = 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # binary search on slice equality: C-speed comparisons
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@attrs.define(eq=False)
class Engine:
    """One inference engine shared by every session of a server."""

    kv_ttl: float = KV_TTL_SECONDS
    block_size: int = BLOCK_SIZE
    kv: dict[Hashable, KVEntry] = attrs.Factory(dict)
    stats: EngineStats = attrs.Factory(EngineStats)
    faults: FaultPlan | None = None  # fault injection (tests, experiments); None in normal runs

    def cached_prefix(self, key: Hashable, prompt: Prompt, now: float) -> int:
        """Tokens of `prompt` whose KV the session `key` still holds on this engine.

        A pinned entry (a live v1 coroutine) covers exactly what it computed. A prefix-cache entry
        counts whole blocks only and never the last token, and expires after `kv_ttl` idle.
        """
        entry = self.kv.get(key)
        if entry is None:
            return 0
        if not entry.pinned and now - entry.last_used > self.kv_ttl:
            del self.kv[key]
            return 0
        if entry.prompt is prompt:
            common = min(entry.tokens, len(prompt))
        else:
            common = _common_prefix(entry.prompt.ids, prompt.ids)
        if entry.pinned:
            return common
        common = min(common, len(prompt) - 1)
        return max(0, common - common % self.block_size)

    def retain(self, key: Hashable, prompt: Prompt, now: float, *, pinned: bool = False) -> None:
        """Keep the KV of all of `prompt` under `key` (after a model call computed it)."""
        self.kv[key] = KVEntry(prompt, len(prompt), now, pinned)

    def release(self, key: Hashable) -> None:
        self.kv.pop(key, None)

    async def prefill(self, latency: LatencyModel, *, uncached: int, cached: int) -> None:
        self.stats.model_calls += 1
        self.stats.prefill_tokens += uncached
        self.stats.cached_tokens += cached
        await trio.sleep(latency.prefill_seconds(uncached, cached))

    async def stream(
        self, latency: LatencyModel, pieces: Sequence[str], *, flush_interval: float = 0.0
    ) -> AsyncIterator[str]:
        """Yield the text of `pieces` (one token each) as it is sampled.

        Token i is ready at start + (i+1)/rate. With `flush_interval` > 0 the first token goes out
        at once and later tokens are coalesced: each chunk carries every token ready at its flush,
        flushes at least `flush_interval` apart.
        """
        rate = latency.decode_tokens_per_s
        start = trio.current_time()
        total = len(pieces)
        sent = 0
        last_flush = -float("inf")
        while sent < total:
            due = start + (sent + 1) / rate
            if sent and flush_interval > 0:
                due = max(due, last_flush + flush_interval)
            await trio.sleep_until(due)
            now = trio.current_time()
            last_flush = now
            # 1e-6 absorbs float error at exact token boundaries under a virtual clock.
            ready = min(total, max(sent + 1, int((now - start) * rate + 1e-6)))
            self.stats.decoded_tokens += ready - sent
            if self.faults is not None:
                self.faults.on_flush()
            yield "".join(pieces[sent:ready])
            sent = ready
