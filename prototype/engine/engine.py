"""The simulated engine (the "GPU"): KV residency (kv.py), admission (admission.py), prefill, and
paced token streaming (streaming.py).

The engine keeps, per sampling session, which prompt its KV holds and how many tokens of it. A
model call prefills only what is not resident, then streams tokens on the trio clock at the
profile's decode rate, so under a MockClock a long rollout costs milliseconds of real time.

By default the engine has unlimited memory and batch, so no call ever waits for admission. An
experiment may give it (memory.py has the sourced values):

* `kv_budget_tokens`: KV tokens the GPU holds, shared by all sessions; a model call is admitted
  when its whole prompt fits (vLLM admits a request when its prompt's blocks are free), and its
  decoded tokens are added as they are kept, so the budget can be overrun by in-flight output only;
* `max_batch`: model calls in flight at once (prefill and decode);
* `retention`: what happens to a session's KV between its model calls (memory.py's table);
* `serial_prefill`: prefill is compute-bound, so one engine prefills one call at a time, FIFO.

Calls that cannot be admitted wait in one queue (admission.py has its order). Decode speed per token does not
depend on how many calls are in flight: a deliberate simplification (decode reads the weights once
per step for the whole batch; the KV of the batch, which this model leaves out, slows it as the
batch grows: docs/parameters.md §3's roofline).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence

import attrs
import trio

from ..ranges import Range
from .admission import Admission, EngineCall
from .kv import Prompt
from .latency import LatencyModel
from .stats import sample
from .streaming import FaultPlan, paced_tokens

# Share of http requests routed back to the engine holding their prefix [assumed], docs/parameters.md §6.
HTTP_AFFINITY = 0.9
HTTP_AFFINITY_RANGE = Range(0.6, 1.0, "high: prefix-aware routing that always finds the holder (TraceLab's ~96% "
                            "token-weighted hit rate over real sessions sits near it); low: session-sticky load balancing "
                            "that loses the holder on scaling, failover and long idle gaps [assumed]")


@attrs.frozen
class PlannedOutput:
    """What a model call's output renders in the transcript, for an engine that samples exactly that
    (vLLM with forced decoding, vllm_engine.py): the ids in order, and per output item how many of
    its ids are framing (the separator and header the transcript renders before the item's text)
    followed by how many are its text, the tokens the policy counts as sampled."""

    ids: tuple[int, ...]
    items: tuple[tuple[int, int], ...]
    """(framing, text) per item, in the order of `ids`."""

    @classmethod
    def of(cls, rendered: Iterable[tuple[Sequence[int], int]]) -> PlannedOutput:
        """From each item's rendered ids and its text's token count. An item whose rendering is
        shorter than its text (a text that tokenizes into fewer tokens once rendered whole) is
        padded with its last id: the call still samples as many tokens as its text has."""
        ids: list[int] = []
        items = []
        for item_ids, text in rendered:
            padded = list(item_ids) + [item_ids[-1]] * (text - len(item_ids)) if item_ids else [0] * text
            ids += padded
            items.append((len(padded) - text, text))
        return cls(tuple(ids), tuple(items))

    @property
    def text_tokens(self) -> int:
        return sum(text for _, text in self.items)


@attrs.frozen
class ModelCall:
    """What a design asks of the engine for one model call. The engine interface (this class's
    methods, which vllm_engine.VllmEngine implements on a real engine) is the same for every design:

    * `held`: continue the session's held sequence (v1: one live request per rollout, its KV kept
      across the pause, so only what was appended since is prefilled);
    * not held: a new request on the whole prompt, which may find a prefix in the cache (chained,
      http); a session the design `isolate`d (http routed away from its prefix) finds nothing.
    """

    key: Hashable
    """The session (a design's engine key)."""
    prompt: Prompt
    """The whole rendered prompt so far."""
    held: bool
    output_tokens: int
    """Tokens the policy will sample in this call (the engine never stops at EOS)."""
    planned: Callable[[], PlannedOutput] | None = None
    """The call's output as the transcript will render it, built on demand: only an engine that
    samples exactly those ids (vLLM) asks; None where no plan exists (a compaction's summary)."""


@attrs.frozen
class Prefilled:
    """The end of a model call's prefill: where decoding starts, and the prompt tokens found cached."""

    decode_from: float
    cached: int


@attrs.define(eq=False)
class Engine(Admission):
    """One inference engine shared by every session of a server: the simulated one (virtual time)."""

    real = False
    """Whether time is the engine's own (a real engine) rather than a model's."""

    serial_prefill: bool = False
    """Prefill one call at a time, FIFO: the GPU's compute is shared (docs/parameters.md §3's rate R is
    the whole GPU's)."""
    faults: FaultPlan | None = None
    """Fault injection (tests, experiments); None in normal runs."""

    _prefill_lock: trio.Lock | None = attrs.field(default=None, init=False)

    @property
    def longest_prompt(self) -> int | None:
        """The longest prompt the engine itself can take, or None where only the model's window limits it."""
        return None

    async def prefill(self, latency: LatencyModel, *, uncached: int, cached: int, start: float | None = None) -> float:
        """Sleep for the call's modeled prefill, from `start` (the call's place on its response's
        schedule; default: now); returns when it ended on the engine's schedule (the deadline, not
        the possibly later wake-up), where decoding starts."""
        self.stats.model_calls += 1
        self.stats.prefill_tokens += uncached
        self.stats.cached_tokens += cached
        seconds = latency.prefill_seconds(uncached, cached)
        if not self.serial_prefill:
            return await _sleep_for(seconds, start)
        if self._prefill_lock is None:
            self._prefill_lock = trio.Lock()  # fair: FIFO
        asked = trio.current_time()
        waits = self._prefill_lock.locked()
        async with self._prefill_lock:
            sample(self.stats.prefill_waits, trio.current_time() - asked)
            return await _sleep_for(seconds, None if waits else start)  # after a wait: from its end

    async def prefill_call(self, latency: LatencyModel, call: ModelCall, *, start: float | None = None,
                           engine_call: EngineCall | None = None) -> Prefilled:
        """Prefill what the session does not hold and the prefix cache does not have (`prefill`)."""
        cached = self.cached_prefix(call.key, call.prompt, trio.current_time())
        deadline = await self.prefill(latency, uncached=len(call.prompt) - cached, cached=cached, start=start)
        return Prefilled(deadline, cached)

    async def decode_unstreamed(self, latency: LatencyModel, tokens: int, *, start: float,
                                engine_call: EngineCall | None = None) -> float:
        """Sample `tokens` that are not streamed as deltas (reasoning, a hosted call's arguments),
        from `start` on the engine's schedule; returns when the last is ready."""
        deadline = start + latency.decode_seconds(tokens)
        await trio.sleep_until(deadline)
        return deadline

    def stream(
        self,
        latency: LatencyModel,
        pieces: Sequence[str],
        *,
        flush_interval: float = 0.0,
        flush_tokens: int | None = None,
        start: float | None = None,
        engine_call: EngineCall | None = None,
    ) -> AsyncIterator[str]:
        """Yield the text of `pieces` (one token each) as it is sampled at the profile's decode rate
        from `start` (default: now; streaming.paced_tokens), counting decoded tokens and applying
        the fault plan per flush."""
        return paced_tokens(
            pieces, latency.decode_tokens_per_s, flush_interval=flush_interval, flush_tokens=flush_tokens,
            on_flush=self._flushed, start=start,
        )

    def _flushed(self, tokens: int) -> None:
        self.stats.decoded_tokens += tokens
        if self.faults is not None:
            self.faults.on_flush()


async def _sleep_for(seconds: float, start: float | None = None) -> float:
    deadline = (trio.current_time() if start is None else start) + seconds
    await trio.sleep_until(deadline)
    return deadline
