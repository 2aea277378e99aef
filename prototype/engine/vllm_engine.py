"""The engine interface (engine.ModelCall, Engine's methods) on a real engine: vLLM, in its own
process (vllm_worker.py), through the trio client (vllm_client.py).

What a design asks becomes an engine request:

* a held call (v1) is one resumable request per session, vLLM's session-based streaming input: the
  first call opens it on the whole prompt; each later call appends only the prompt's ids past what
  the request already holds (its prompts plus the tokens it sampled, less the last, which vLLM
  never feeds back), so vLLM prefills only those; `release` closes it. A prompt that no longer
  extends the one the request was last given (a compacted context, rendered anew) cannot be
  appended: the request is closed and a new one opened on the whole prompt, as a real deployment
  would have to;
* any other call is a new request on the whole prompt, which finds what vLLM's automatic prefix
  cache holds; a session the design isolated (http routed away from its prefix) gets a `cache_salt`
  of its own, so it finds nothing.

The scripted policy still writes the text; vLLM decides when each token is ready: the request
asks for exactly the tokens the policy planned (`ignore_eos`, `min_tokens` = `max_tokens`), with
the testbed's token ids mapped into the model's vocabulary. Its own sampled ids are not used.

The simulated engine's bookkeeping (residency, prefix cache, admission with unlimited memory) runs
beside it unchanged, as the prediction each real call is compared with (`RealCall`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .admission import EngineCall
from .engine import Engine, ModelCall, Prefilled
from .kv import Prompt
from .latency import LatencyModel
from .streaming import ContextWindowExceeded
from .vllm_client import VllmClient, WorkerFailed, open_vllm_process
from .vllm_models import ModelSpec, to_model_ids


class RealEngineError(Exception):
    """The real engine failed a request."""


@attrs.frozen
class RealCall:
    """One model call on the real engine: what vLLM computed, and what the simulated engine predicted."""

    key: Hashable
    held: bool  # a resumed (or first) chunk of a held request
    resumed: bool  # a held request's later chunk: only `sent` ids were new
    isolated: bool
    prompt_tokens: int  # the testbed's prompt
    sent_tokens: int  # ids sent to vLLM (the whole prompt, or the appended ones)
    output_tokens: int
    prefill_tokens: int  # context tokens vLLM's scheduler computed between the request and its first token
    prefix_hits: int  # prefix-cache hits vLLM counted for it, in tokens
    vllm_cached_tokens: int  # the request's num_cached_tokens (on a resumed chunk: still its first chunk's)
    predicted_prefill_tokens: int  # what the simulated engine would have prefilled
    ttft_s: float  # from the request to its first token
    decode_s: float  # from the first token to the last one taken
    kv_usage: float  # share of vLLM's KV blocks in use at the first token
    kv_blocks_used: int
    preemptions: int = 0  # vLLM's preemptions of the request before this call's first token (all its calls so far)
    queued_s: float | None = None  # a new request's wait from queued to scheduled, vLLM's clock; None on a resumed chunk


@attrs.define(eq=False)
class _Live:
    """The request a model call is reading tokens from."""

    rid: str
    events: trio.MemoryReceiveChannel
    planned: int
    asked_at: float
    first_at: float | None = None
    last_at: float | None = None
    banked: int = 0  # arrived, not yet taken
    taken: int = 0
    first: dict[str, Any] | None = None

    async def next_event(self) -> None:
        try:
            event = await self.events.receive()
        except trio.EndOfChannel:
            raise RealEngineError(f"request {self.rid} ended before its {self.planned} tokens") from None
        kind = event["type"]
        if kind == "tokens":
            now = trio.current_time()
            if self.first is None:
                self.first = event.get("first", {})
                self.first_at = now
            self.banked += event["n"]
            self.last_at = now
        elif kind == "error":
            raise RealEngineError(event["message"])
        # A "finished" event needs nothing: a call takes the tokens it planned, and a request that ends
        # short of them ends its channel (the EndOfChannel above).

    async def first_token(self) -> None:
        while self.first is None:
            await self.next_event()

    def take_banked(self, limit: int) -> int:
        """Take what has arrived, `limit` tokens at most; how many were taken."""
        n = min(self.banked, limit)
        self.banked -= n
        self.taken += n
        return n

    async def take(self, tokens: int) -> AsyncIterator[int]:
        """Yield counts of newly arrived tokens until `tokens` are taken."""
        wanted = self.taken + tokens
        while self.taken < wanted:
            while self.banked == 0:
                await self.next_event()
            yield self.take_banked(wanted - self.taken)


@attrs.define(eq=False)
class _Held:
    rid: str
    events: trio.MemoryReceiveChannel
    length: int = 0  # tokens in vLLM's sequence: its prompts and its kept samples
    prompt: Prompt | None = None  # the testbed's prompt at the last call, and how long it was then
    prompt_length: int = 0

    def extended_by(self, prompt: Prompt) -> bool:
        """Whether `prompt` continues the prompt of the request's last call. Prompts grow in place
        (kv.Prompt is append-only), so the same object always does; a context rendered anew (compaction)
        is another object, which does only if it starts with the same ids."""
        if self.prompt is None or prompt is self.prompt:
            return True
        n = self.prompt_length
        return len(prompt) >= n and prompt.ids[:n] == self.prompt.ids[:n]


@attrs.define(eq=False)
class VllmEngine(Engine):
    """The engine interface on vLLM. Build it with `open_vllm_engine`."""

    client: VllmClient = attrs.field(kw_only=True)
    nursery: trio.Nursery = attrs.field(kw_only=True)
    spec: ModelSpec | None = attrs.field(default=None, kw_only=True)
    namespace: str | None = attrs.field(default=None, kw_only=True)
    """A cache_salt for every request: engines sharing one worker (one per design in a comparison, one
    per test) find nothing of each other's in vLLM's prefix cache."""
    records: list[RealCall] = attrs.field(factory=list, init=False)

    real = True

    _live: dict[Hashable, _Live] = attrs.field(factory=dict, init=False)
    _held: dict[Hashable, _Held] = attrs.field(factory=dict, init=False)
    _salts: dict[Hashable, str] = attrs.field(factory=dict, init=False)
    _rids: itertools.count = attrs.field(factory=itertools.count, init=False)
    _salt_numbers: itertools.count = attrs.field(factory=itertools.count, init=False)

    def _ids(self, ids: Sequence[int]) -> list[int]:
        return to_model_ids(ids, self.client.ready.vocab_size)

    async def prefill_call(self, latency: LatencyModel, call: ModelCall, *, start: float | None = None,
                           engine_call: EngineCall | None = None) -> Prefilled:
        now = trio.current_time()
        predicted = len(call.prompt) - self.cached_prefix(call.key, call.prompt, now)
        max_tokens = max(1, call.output_tokens)  # vLLM samples at least one token; a warm-up drops it
        held = self._held.get(call.key) if call.held else None
        if held is not None and not held.extended_by(call.prompt):
            del self._held[call.key]  # its sequence is not this prompt's start: a new request takes over,
            await self._quietly(self.client.close(held.rid))  # once the old one's KV is given back
            held = None
        resumed = held is not None
        isolated = call.key in self._isolated
        window = self.spec.max_model_len if self.spec is not None else None
        # vLLM's sequence once this call is sent: the prompt, or what a held request holds and at least one id more.
        sequence = (max(len(call.prompt), held.length + 1) if held is not None else len(call.prompt)) + max_tokens
        if window is not None and sequence > window:
            # vLLM would refuse it (VLLMValidationError) after the request was sent; the API refuses it as its own.
            raise ContextWindowExceeded(sequence, window)
        if held is not None:
            sent = self._ids(call.prompt.ids[held.length:]) or self._ids(call.prompt.ids[-1:])
            await self.client.append(held.rid, sent, max_tokens)
            rid, events = held.rid, held.events
        else:
            rid = f"r{next(self._rids)}"
            sent = self._ids(call.prompt.ids)
            salt = self._salt(call.key) if isolated else self.namespace
            events = await self.client.generate(rid, sent, max_tokens, salt=salt, held=call.held)
            if call.held:
                held = self._held[call.key] = _Held(rid, events)
        live = self._live[call.key] = _Live(rid, events, max_tokens, now)
        if held is not None:
            held.length += len(sent) + max_tokens - 1  # vLLM keeps every sample but the last
            held.prompt, held.prompt_length = call.prompt, len(call.prompt)
        await live.first_token()
        first = live.first or {}
        self.stats.model_calls += 1
        self.stats.prefill_tokens += first.get("prefill_tokens", 0)
        # What the engine did not compute, as the API's cached_tokens counts it: a new request's own
        # num_cached_tokens; for a resume, everything but what was sent (its KV is the live request's,
        # which vLLM does not count as a cache hit, and it computed exactly the sent ids).
        cached = len(call.prompt) - len(sent) if resumed else first.get("cached_tokens", 0)
        self.stats.cached_tokens += cached
        live.first = {**first, "predicted": predicted, "resumed": resumed,
                      "isolated": isolated, "prompt_tokens": len(call.prompt), "sent_tokens": len(sent), "held": call.held}
        return Prefilled(trio.current_time(), cached)

    def _salt(self, key: Hashable) -> str:
        if key not in self._salts:
            # Unique for the engine's life (never reused after a release): one routed-away request
            # must not find another's blocks.
            self._salts[key] = f"{self.namespace or ''}isolated-{next(self._salt_numbers)}"
        return self._salts[key]

    def _live_for(self, engine_call: EngineCall | None) -> _Live:
        if engine_call is None or engine_call.key not in self._live:
            raise RealEngineError("tokens asked for outside a model call")
        return self._live[engine_call.key]

    async def decode_unstreamed(self, latency: LatencyModel, tokens: int, *, start: float,
                                engine_call: EngineCall | None = None) -> float:
        async for _ in self._live_for(engine_call).take(tokens):
            pass
        return trio.current_time()

    def stream(self, latency: LatencyModel, pieces: Sequence[str], *, flush_interval: float = 0.0,
               flush_tokens: int | None = None, start: float | None = None,
               engine_call: EngineCall | None = None) -> AsyncIterator[str]:
        return self._stream(self._live_for(engine_call), pieces, flush_interval, flush_tokens)

    async def _stream(self, live: _Live, pieces: Sequence[str], flush_interval: float,
                      flush_tokens: int | None) -> AsyncIterator[str]:
        """The pieces as vLLM samples their tokens; with `flush_interval`, coalesced as the
        simulated engine coalesces them (the first at once, then at most one chunk per interval,
        the last when it is ready); with `flush_tokens`, at most that many a chunk, the next
        chunk going out as soon as that many are ready, whether or not vLLM sends more."""
        sent = ready = 0
        last_flush = -float("inf")
        total = len(pieces)
        while sent < total:
            while True:
                ready += live.take_banked(total - ready)
                # The same sum as the deadline below, so that a wait ended by the deadline finds the chunk due.
                next_flush = last_flush + flush_interval
                if ready > sent and (ready == total or not sent or trio.current_time() >= next_flush
                                     or (flush_tokens and ready - sent >= flush_tokens)):
                    break
                if ready > sent:
                    # Tokens wait for the interval: they go out at its end unless vLLM's next tokens come first.
                    # A receive cancelled by the deadline loses nothing (trio's channels are cancel-safe).
                    with trio.move_on_at(next_flush):
                        await live.next_event()
                else:
                    await live.next_event()
            upto = ready if not flush_tokens else min(ready, sent + flush_tokens)
            last_flush = trio.current_time()
            self._flushed(upto - sent)
            yield "".join(pieces[sent:upto])
            sent = upto

    def end_call(self, call: EngineCall, *, paused: bool = True) -> None:
        was_open = not call.ended and call.admitted_at is not None
        super().end_call(call, paused=paused)
        if not was_open:
            return  # ended before (end_call is idempotent): the session's live request may be a later call's
        live = self._live.pop(call.key, None)
        if live is None:
            return
        self._record(call.key, live)
        if live.taken < live.planned and call.key not in self._held:
            # Stopped early (steering, a failure, a warm-up's one token): the rest is not wanted.
            self.nursery.start_soon(self._quietly, self.client.abort(live.rid))

    def release(self, key: Hashable) -> None:
        super().release(key)
        held = self._held.pop(key, None)
        if held is not None:
            self.nursery.start_soon(self._quietly, self.client.close(held.rid))
        self._salts.pop(key, None)

    @staticmethod
    async def _quietly(send: Any) -> None:
        try:
            await send
        except (WorkerFailed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _record(self, key: Hashable, live: _Live) -> None:
        first = live.first or {}
        blocks = self.client.ready.kv_blocks
        usage = first.get("kv_usage", 0.0)
        self.records.append(RealCall(
            key=key, held=first.get("held", False), resumed=first.get("resumed", False),
            isolated=first.get("isolated", False), prompt_tokens=first.get("prompt_tokens", 0),
            sent_tokens=first.get("sent_tokens", 0), output_tokens=live.taken,
            prefill_tokens=first.get("prefill_tokens", 0), prefix_hits=first.get("prefix_hits", 0),
            vllm_cached_tokens=first.get("cached_tokens", 0), predicted_prefill_tokens=first.get("predicted", 0),
            ttft_s=(live.first_at or live.asked_at) - live.asked_at,
            # The first tokens set both times: a request with no tokens has neither.
            decode_s=live.last_at - live.first_at if live.first_at is not None else 0.0,
            kv_usage=usage, kv_blocks_used=round(usage * blocks),
            preemptions=first.get("preemptions", 0), queued_s=first.get("queued_s"),
        ))

    async def counters(self) -> dict[str, Any]:
        """vLLM's cumulative counters now (vllm_worker.Counters)."""
        return await self.client.counters()


@asynccontextmanager
async def open_vllm_engine(spec: ModelSpec, *, python: str | None = None,
                           client: VllmClient | None = None, **engine_options: Any) -> AsyncIterator[VllmEngine]:
    """A VllmEngine on a worker started here (or on `client`, a worker already running)."""
    async with trio.open_nursery() as nursery:
        if client is not None:
            yield VllmEngine(client=client, nursery=nursery, spec=spec, **engine_options)
        else:
            async with open_vllm_process(spec, python=python) as started:
                yield VllmEngine(client=started, nursery=nursery, spec=spec, **engine_options)
        nursery.cancel_scope.cancel()
