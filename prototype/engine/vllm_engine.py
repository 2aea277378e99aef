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

The scripted policy still writes the text; vLLM samples it and decides when each token is ready.
A call that comes with its plan (`ModelCall.planned`: the ids its output renders in the transcript)
is forced to sample exactly those ids (vllm_forced.py): the items' framing (separator, header) and
their text, in the transcript's order, so vLLM's KV, its prefix cache and a held request's
sequence hold the very ids the next prompt carries. The call's text tokens are those the policy
counts and streams; a framing token is sampled (it takes vLLM a decode step) but streams nothing.
A call without a plan (a compaction's summary, a warm-up) samples freely. Either way it asks for
exactly its tokens (`ignore_eos`, `min_tokens` = `max_tokens`), and every id crosses into the model's
vocabulary modulo its size (Llama 3's 128,256 holds cl100k's ids as they are).

The simulated engine's bookkeeping (residency, prefix cache, admission with unlimited memory) runs
beside it, as the prediction each real call is compared with (`RealCall`), with two of vLLM's
parameters in place of its defaults, neither a part of the model under test: vLLM's KV blocks (32
tokens on the CPU backend, where the simulated engine's default is 16), and a call's last sampled
token left out of the KV it keeps (vLLM computes a sample's KV when it feeds it back as the next
step's input, which it never does for the last one; the simulated engine's default counts the
whole output as computed).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .admission import EngineCall
from .engine import Engine, ModelCall, Prefilled
from .kv import Prompt
from .latency import LatencyModel
from .streaming import ContextWindowExceeded, EngineFailure
from .vllm_client import VllmClient, WorkerFailed, open_vllm_process
from .vllm_models import ModelSpec, to_model_ids


class RealEngineError(EngineFailure):
    """The real engine failed a request (its worker died, or vLLM refused it): the response fails as on any
    engine failure, and the connection goes on serving."""


@attrs.frozen
class RealCall:
    """One model call on the real engine: what vLLM computed, and what the simulated engine predicted."""

    key: Hashable
    held: bool  # a resumed (or first) chunk of a held request
    resumed: bool  # a held request's later chunk: only `sent` ids were new
    isolated: bool
    prompt_tokens: int  # the testbed's prompt
    sent_tokens: int  # ids sent to vLLM (the whole prompt, or the appended ones)
    output_tokens: int  # text tokens the call took (the policy's count)
    sampled_tokens: int  # tokens vLLM sampled for it: its text and its items' framing
    forced: bool  # sampled to a plan (forced decoding)
    off_plan_tokens: int  # sampled ids that were not the plan's (0 where forced decoding held)
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


def conversation_of(key: Hashable) -> Hashable:
    """The conversation a call belongs to: an http turn routed away from its prefix keys on its home's key."""
    return key[1] if isinstance(key, tuple) and key and key[0] == "http-elsewhere" else key


def call_records(design: str, calls: Sequence[RealCall]) -> list[dict[str, Any]]:
    """One row per model call, in the order made: the design, the conversation (numbered in order of first
    call) and the call's number in it, then what vLLM computed and sampled (`*_vllm`: its own counters) beside
    the simulated engine's prediction for the same call (`prefill_sim`). The CSV `calibrate` reads
    (prototype/traces/engine_calls.py) has these columns."""
    numbers: dict[Hashable, int] = {}
    so_far: dict[Hashable, int] = defaultdict(int)
    rows = []
    for call in calls:
        conversation = conversation_of(call.key)
        so_far[conversation] += 1
        rows.append({
            "design": design, "task": numbers.setdefault(conversation, len(numbers)), "call": so_far[conversation],
            "resumed": call.resumed, "routed_away": call.isolated,
            "prompt_tokens": call.prompt_tokens, "sent_tokens": call.sent_tokens,
            "prefill_vllm": call.prefill_tokens, "prefill_sim": call.predicted_prefill_tokens,
            "prefix_hits_vllm": call.prefix_hits, "cached_vllm": call.vllm_cached_tokens,
            "output_tokens": call.output_tokens, "sampled_tokens": call.sampled_tokens,
            "forced": call.forced, "off_plan_tokens": call.off_plan_tokens,
            "ttft_ms": call.ttft_s * 1000, "decode_ms": call.decode_s * 1000,
            # vLLM's own rate: every token it sampled after the first (framing included) over their time.
            "decode_tps": (call.sampled_tokens - 1) / call.decode_s if call.decode_s > 0 else float("nan"),
            "kv_blocks": call.kv_blocks_used,
        })
    return rows


@attrs.define(eq=False)
class _Live:
    """The request a model call is reading tokens from: vLLM samples `sampled` tokens, the call takes
    the `planned` text tokens among them (`items`: framing then text, per output item)."""

    rid: str
    events: trio.MemoryReceiveChannel
    planned: int
    asked_at: float
    prompt_tokens: int
    items: tuple[tuple[int, int], ...]
    forced: list[int] | None = None  # the plan in the model's ids
    first_at: float | None = None
    last_at: float | None = None
    received: int = 0  # tokens vLLM sampled so far
    off_plan: int = 0  # of them, ids that were not the plan's
    banked: int = 0  # text tokens arrived, not yet taken
    taken: int = 0
    first: dict[str, Any] | None = None

    def text_within(self, sampled: int) -> int:
        """Text tokens among the first `sampled` tokens."""
        count = 0
        for framing, text in self.items:
            if sampled <= framing:
                break
            count += min(sampled - framing, text)
            sampled -= framing + text
        return count

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
            before, self.received = self.received, self.received + event["n"]
            if self.forced is not None:
                expected = self.forced[before : self.received]
                self.off_plan += sum(got != want for got, want in zip(event.get("ids", expected), expected))
            self.banked += self.text_within(self.received) - self.text_within(before)
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

    @property
    def longest_prompt(self) -> int | None:
        # vLLM refuses a sequence past `max_model_len`, and a request samples one token at least.
        return self.spec.max_model_len - 1 if self.spec is not None else None

    async def prefill_call(self, latency: LatencyModel, call: ModelCall, *, start: float | None = None,
                           engine_call: EngineCall | None = None) -> Prefilled:
        now = trio.current_time()
        predicted = len(call.prompt) - self.cached_prefix(call.key, call.prompt, now)
        planned = call.planned() if call.planned is not None else None
        if planned is not None and planned.text_tokens != call.output_tokens:
            raise RealEngineError(f"a plan of {planned.text_tokens} text tokens for a call of {call.output_tokens}")
        forced = self._ids(planned.ids) if planned is not None and planned.ids else None
        # What vLLM samples: the plan, or as many free tokens as the call takes (at least one: a warm-up drops it).
        items = planned.items if forced is not None else ((0, max(1, call.output_tokens)),)
        max_tokens = len(forced) if forced is not None else max(1, call.output_tokens)
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
            await self.client.append(held.rid, sent, max_tokens, forced=forced)
            rid, events = held.rid, held.events
        else:
            rid = f"r{next(self._rids)}"
            sent = self._ids(call.prompt.ids)
            salt = self._salt(call.key) if isolated else self.namespace
            events = await self.client.generate(rid, sent, max_tokens, forced=forced, salt=salt, held=call.held)
            if call.held:
                held = self._held[call.key] = _Held(rid, events)
        live = self._live[call.key] = _Live(rid, events, sum(text for _, text in items), now, len(call.prompt), items, forced)
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

    def retain(self, key: Hashable, prompt: Prompt, now: float, *, pinned: bool = False, tokens: int | None = None) -> None:
        live = self._live.get(key)
        if tokens is None and live is not None and len(prompt) > live.prompt_tokens:
            # The call's output joins the context: vLLM computed the KV of all of it but the last sample,
            # which the next request (or a held request's next chunk) computes.
            tokens = len(prompt) - 1
        super().retain(key, prompt, now, pinned=pinned, tokens=tokens)

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
            sent_tokens=first.get("sent_tokens", 0), output_tokens=live.taken, sampled_tokens=live.received,
            forced=live.forced is not None, off_plan_tokens=live.off_plan,
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
            yield VllmEngine(client=client, nursery=nursery, spec=spec, block_size=client.ready.block_size, **engine_options)
        else:
            async with open_vllm_process(spec, python=python) as started:
                yield VllmEngine(client=started, nursery=nursery, spec=spec, block_size=started.ready.block_size,
                                 **engine_options)
        nursery.cancel_scope.cancel()
