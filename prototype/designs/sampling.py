"""The sampling loop every design runs inside a response, and its one suspension point.

The model samples a turn; when the turn ends in tool calls the loop reaches `tool_call_point` and
blocks there until a backend answers. Which backend depends on who runs the tool:

* a hosted tool (web_search): the server's hosted tool service, after its own latency;
* a client function tool: the client, over the socket. In the suspended design (v1) the loop sends
  `response.done` and waits for `response.append`; a chained response created with
  `multi_agent.enabled` waits for `response.inject` (designs/inject.py); otherwise, in the chained
  and http designs, the response ends at this point, and the next request starts a new loop on the
  cached or rebuilt state.

This is the hosted-tool analogy of OpenAI's post, in code: one suspension point, resumed three ways
(the hosted tool service, v1's `response.append`, `response.inject`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import attrs
import trio

from .. import metrics
from ..api import render
from ..api.service import ApiService, Context, StageModes
from ..engine import tokenizer
from ..engine.admission import EngineCall
from ..engine.engine import ModelCall, PlannedOutput
from ..engine.policy import PlannedSearch, TurnPlan
from ..protocol.items import FunctionCall, FunctionCallOutput, Item, Message, Reasoning, WebSearchCall
from .compaction import compact_if_due
from .emitter import Emitter

COMPLETED = "completed"
INCOMPLETE = "incomplete"
ENDED_AT_CLIENT_CALLS = "ended_at_client_calls"
STEERED = "steered"  # stopped at a safe output boundary for queued steering input (steering guide)

# A resumed turn pays only per-token work on what is new: the fixed part was paid once, up front.
RESUME = StageModes(incremental_checks=True, append_render=True, reuse_route=True, fixed_share=0.0)


@attrs.frozen
class ToolCall:
    """A call the loop is blocked on; `search` is the plan of a hosted call."""

    item: FunctionCall | WebSearchCall
    search: PlannedSearch | None = None


class ToolBackend(Protocol):
    async def answer(self, calls: Sequence[ToolCall]) -> Sequence[Item] | None:
        """The items that answer `calls`, or None when the response ends here instead."""


@attrs.define(eq=False)
class HostedTools:
    """Backend 1: the server's hosted tool service answers inside the response."""

    api: ApiService
    log: metrics.PhaseLog
    seed: int

    async def answer(self, calls: Sequence[ToolCall]) -> Sequence[Item]:
        start = trio.current_time()
        answered = []
        for call in calls:
            assert isinstance(call.item, WebSearchCall) and call.search is not None
            result = await self.api.hosted.search(call.item.id, call.search, self.seed)
            answered.append(attrs.evolve(call.item, status="completed", result=result))
        self.log.record(metrics.HOSTED_TOOL, start, trio.current_time())
        return answered


@attrs.define(eq=False)
class EndResponseAtClientCalls:
    """Backend 2 in the chained and http designs: the client answers in its next request."""

    async def answer(self, calls: Sequence[ToolCall]) -> None:
        return None


# Word ids looked up after each chunk of a streamed message: more than a chunk carries at 4000
# tokens/s and the 50 ms default flush (200), so the lookups keep up with the stream and the end
# of the message finds them done; ~20 µs of dict lookups a chunk [ours].
WORD_IDS_PER_CHUNK = 256


@attrs.define(eq=False)
class WordIds:
    """The token ids of a sampled message's one-token words, looked up a slice at a time."""

    words: Sequence[str]
    ids: list[int] = attrs.Factory(list)
    one_token_words: bool = True
    """False once a word turned out not to be one token (then the item is tokenized as usual)."""

    def advance(self, count: int) -> None:
        """Look up the next `count` words' ids."""
        done = len(self.ids)
        if self.one_token_words and done < len(self.words):
            try:
                self.ids.extend(tokenizer.word_ids(self.words[done : done + count]))
            except KeyError:
                self.one_token_words = False

    def all(self) -> list[int] | None:
        """Every word's id; None if not every word is one token."""
        self.advance(len(self.words))
        return self.ids if self.one_token_words else None


def _token_pieces(text: str) -> list[str]:
    """Text split at token boundaries, so arguments stream one token per piece."""
    enc = tokenizer.encoding()
    return [enc.decode([token]) for token in enc.encode_ordinary(text)]


@attrs.define(eq=False)
class SamplingLoop:
    api: ApiService
    emitter: Emitter
    context: Context
    hosted: ToolBackend
    client: ToolBackend
    pinned_kv: bool  # v1 keeps its KV resident across the pause; the others rely on the prefix cache
    # Chained only: asked at each safe output boundary (before an item starts, after a hosted call
    # finished); True stops the response there. The item being sampled always finishes, and a
    # batch of client calls, once begun, is finished too (steering guide; docs/protocol.md).
    stop_requested: Callable[[], bool] = attrs.field(default=lambda: False, kw_only=True)
    export_reasoning: bool = attrs.field(default=False, kw_only=True)  # reasoning items leave with their encrypted_content (the client asked for it)
    agent: str | None = attrs.field(default=None, kw_only=True)  # a hosted subagent's name: its call ids carry it (designs/inject.py)
    engine_call: EngineCall | None = attrs.field(default=None, init=False)  # the model call the engine has admitted
    # Where the engine's decoding stands on its own schedule: the end of the prefill, then of each
    # sampled item. Items stream from it, so a late wake-up in real time is not added per item.
    decode_from: float | None = attrs.field(default=None, init=False)

    @property
    def log(self) -> metrics.PhaseLog:
        return self.emitter.log

    async def tool_call_point(self, calls: Sequence[ToolCall]) -> Sequence[Item] | None:
        """The suspension point: the loop blocks here for every tool call, hosted or client."""
        self.end_model_call(paused=True)
        backend = self.hosted if isinstance(calls[0].item, WebSearchCall) else self.client
        # The model waited for the tool, however long it took: its schedule resumes when the answer
        # came (a backend that knows when sets it), or now.
        self.log.schedule = None
        answers = await backend.answer(calls)
        if self.log.schedule is None:
            self.log.schedule = trio.current_time()
        return answers

    async def run(self) -> str:
        try:
            return await self._sample()
        finally:
            self.end_model_call(paused=False)

    def end_model_call(self, *, paused: bool) -> None:
        """The session goes idle on the engine: its batch slot is freed and its KV is kept,
        swapped or dropped as the engine's retention policy says; `paused` at a tool call."""
        if self.engine_call is not None:
            self.api.engine.end_call(self.engine_call, paused=paused)
            self.engine_call = None

    async def _sample(self) -> str:
        ctx, request = self.context, self.emitter.response.request
        budget = request.max_output_tokens
        while True:
            await compact_if_due(self)  # `context_management`: past its threshold the context is compacted first
            plan = ctx.route.policy.plan(ctx.ledger.turn, request.tools, request.offers_hosted("web_search"))
            # What each model call of the turn will sample: a hosted call's arguments each, then the answer;
            # and, for an engine that samples exactly the transcript's ids, what each renders.
            planned = [*(len(_token_pieces(search.query)) for search in plan.searches), _answer_tokens(plan, budget)]
            outputs_planned = [*(functools.partial(_search_output, search) for search in plan.searches),
                               functools.partial(self._answer_output, plan, budget)]
            await self.model_call(planned[0], outputs_planned[0])
            for searched, search in enumerate(plan.searches, start=1):
                item = WebSearchCall(self.api.new_id("ws"), search.query, status="in_progress")
                await self.decode_hidden(search.query)
                index = await self.emitter.web_search_started(item)
                (answered,) = await self.tool_call_point([ToolCall(item, search)])
                await self.emitter.web_search_finished(index, answered)
                await self.take_new_items([answered])
                if self.stop_requested():
                    return STEERED
                await self.model_call(planned[searched], outputs_planned[searched])

            if self.stop_requested():
                return STEERED
            outputs: list[Item] = []
            rendered: list[int] = []
            start = trio.current_time()
            reasoning, words, truncated = _answer_parts(plan, budget)
            if reasoning:
                outputs.append(await self.emitter.reasoning(
                    self.api.new_id("rs"), functools.partial(self.decode_reasoning, reasoning), export=self.export_reasoning
                ))
                rendered += render.render_sampled(outputs[-1], reasoning)
            if budget is not None:
                budget -= len(reasoning) + len(words)
            word_ids = WordIds(words)
            outputs.append(
                await self.emitter.message(
                    self.api.new_id("msg"),
                    self.stream_words(words, word_ids),
                    incomplete=truncated,
                )
            )
            # The sampled text's ids are its words' own (render.render_sampled), looked up while it
            # streamed: the message is not tokenized again after its last token, where every
            # response would wait for it (docs/speed.md).
            rendered += render.render_sampled(outputs[-1], words, word_ids.all())
            calls: list[FunctionCall] = []
            # The message was the item in progress; a final answer has nothing left to stop, so it
            # completes normally (and an automatic successor follows it: steering guide).
            steered = not truncated and bool(plan.calls) and self.stop_requested()
            call_tokens = 0  # counted as streamed, not by tokenizing the arguments again after the last token
            for planned in () if truncated or steered else plan.calls:
                pieces = _token_pieces(planned.arguments)
                call_tokens += len(pieces)
                call = await self.emitter.function_call(
                    self.api.new_id("fc"),
                    self._call_id(len(outputs)),
                    planned.name,
                    self.stream(pieces),
                )
                outputs.append(call)
                calls.append(call)
            self.emitter.response.usage.output_tokens += len(words) + call_tokens
            self.log.record(metrics.DECODE, start, trio.current_time())
            self.take_outputs(outputs, [*rendered, *render.render_items(calls)])

            if truncated:
                return INCOMPLETE
            if steered:
                return STEERED
            if not calls:
                return COMPLETED
            answers = await self.tool_call_point([ToolCall(call) for call in calls])
            if answers is None:
                return ENDED_AT_CLIENT_CALLS
            await self.take_new_items(answers)

    def _call_id(self, outputs_before: int) -> str:
        """A function call's id: its place in the whole conversation, after `outputs_before` items of its turn."""
        place = self.context.ledger.offset + len(self.context.items) + outputs_before
        return f"call_{place}" if self.agent is None else f"call_{self.agent}_{place}"

    def _answer_output(self, plan: TurnPlan, budget: int | None) -> PlannedOutput:
        """The answer call's output as `_sample` renders it into the context: the reasoning, the
        message, then (unless the budget cut the message) the function calls."""
        reasoning, words, truncated = _answer_parts(plan, budget)
        rendered: list[tuple[list[int], int]] = []
        if reasoning:
            rendered.append((render.render_sampled(Reasoning("", "".join(reasoning)), reasoning), len(reasoning)))
        message = Message("assistant", (("output_text", "".join(words)),))
        rendered.append((render.render_sampled(message, words), len(words)))
        for planned in () if truncated else plan.calls:
            call = FunctionCall(self._call_id(len(rendered)), planned.name, planned.arguments)
            rendered.append((render.render_items([call]), len(_token_pieces(planned.arguments))))
        return PlannedOutput.of(rendered)

    async def model_call(self, output_tokens: int, planned: Callable[[], PlannedOutput] | None = None) -> None:
        """Prefill what the engine does not hold; usage counts each model call (docs/protocol.md).
        The engine's modeled time is charged in full, in real time as under a virtual clock: the
        testbed's own CPU work (the scripted policy included) comes on top, and efficiency
        benchmarks divide by a limit that charges exactly the same model (experiments/efficiency.py)."""
        ctx = self.context
        asked = trio.current_time()
        # A call still open here is a compaction's summary call (designs/compaction.py): the session
        # goes on at once with the compacted prompt, not after a tool call, so that call's KV is left
        # as plain prefix cache, as after a final answer, not swapped out or pinned for a return.
        self.end_model_call(paused=False)
        call = self.engine_call = await self.api.engine.begin_call(ctx.engine_key, ctx.prompt, pinned=self.pinned_kv)
        if call.queued_s > 0:
            self.log.record(metrics.QUEUE, asked, call.admitted_at)
        now = trio.current_time()
        # Admitted at once and nothing to bring back from the host: the prefill starts on the
        # response's schedule. After a wait in the engine (the queue, a swap-in) it starts now.
        waited = call.queued_s > 0 or call.swap_in_tokens > 0
        start = now if waited or self.log.schedule is None else min(now, self.log.schedule)
        ask = ModelCall(ctx.engine_key, ctx.prompt, held=self.pinned_kv, output_tokens=output_tokens, planned=planned)
        prefilled = await self.api.engine.prefill_call(ctx.route.latency, ask, start=start, engine_call=call)
        usage = self.emitter.response.usage
        usage.input_tokens += len(ctx.prompt)
        usage.cached_tokens += prefilled.cached
        self.decode_from = prefilled.decode_from
        self.log.schedule = self.decode_from
        self.api.engine.retain(ctx.engine_key, ctx.prompt, trio.current_time(), pinned=self.pinned_kv)
        self.log.record(metrics.PREFILL, min(start, call.admitted_at), trio.current_time())  # a swap-in counts as prefill

    def stream(self, pieces: Sequence[str]) -> AsyncIterator[str]:
        """The engine samples `pieces` right after what it sampled before (its own schedule)."""
        latency = self.context.route.latency
        start = self.decode_from
        if start is not None:
            self.decode_from = start + len(pieces) / latency.decode_tokens_per_s
        return self.api.engine.stream(
            latency, pieces, flush_interval=self.api.flush_interval, flush_tokens=self.api.flush_tokens, start=start,
            engine_call=self.engine_call,
        )

    async def stream_words(self, words: Sequence[str], word_ids: WordIds) -> AsyncIterator[str]:
        """`stream(words)`, looking up the next slice of the words' ids after each chunk, in the
        wait for the next one, rather than all of them after the last token."""
        async for chunk in self.stream(words):
            yield chunk
            word_ids.advance(WORD_IDS_PER_CHUNK)

    async def decode_reasoning(self, words: Sequence[str]) -> str:
        """Sample the reasoning tokens at the decode rate, on the engine's schedule, before the visible output; they
        count as output and as reasoning."""
        start = self.decode_from if self.decode_from is not None else trio.current_time()
        self.decode_from = await self.api.engine.decode_unstreamed(
            self.context.route.latency, len(words), start=start, engine_call=self.engine_call
        )
        self.api.engine.stats.decoded_tokens += len(words)
        usage = self.emitter.response.usage
        usage.output_tokens += len(words)
        usage.reasoning_tokens += len(words)
        return "".join(words)

    async def decode_hidden(self, text: str) -> None:
        """Time to sample a hosted call's arguments, which are not streamed as deltas."""
        start = trio.current_time()
        await self.api.engine.decode_unstreamed(
            self.context.route.latency, len(_token_pieces(text)), start=start, engine_call=self.engine_call
        )
        self.emitter.response.usage.output_tokens += len(_token_pieces(text))
        self.log.record(metrics.DECODE, start, trio.current_time())

    def take_outputs(self, outputs: Sequence[Item], ids: Sequence[int]) -> None:
        """Sampled items join the context with their rendered `ids`; the engine's KV now covers them."""
        ctx = self.context
        ctx.ledger.absorb(outputs)
        ctx.items.extend(outputs)
        ctx.prompt.extend(ids)
        self.api.engine.retain(ctx.engine_key, ctx.prompt, trio.current_time(), pinned=self.pinned_kv)

    async def take_new_items(self, items: Sequence[Item]) -> None:
        """Tool answers join the context: incremental checks and render over the new items only."""
        await self.api.pre_inference(self.log, self.emitter.response.request, items, base=self.context, modes=RESUME)


async def sample_until_client_calls(
    api: ApiService, emitter: Emitter, context: Context, stop_requested: Callable[[], bool] | None = None,
    client: ToolBackend | None = None,
) -> str:
    """The chained and http designs' loop: hosted tools are answered inside the response, a client
    function call ends it, unless `client` answers it (injected outputs). Returns the response's
    outcome: `completed`, `incomplete` (its output budget ran out) or `steered` (stopped at a safe
    boundary for steering input)."""
    loop = SamplingLoop(
        api,
        emitter,
        context,
        hosted=HostedTools(api, emitter.log, context.route.policy.workload.text_seed),
        client=client or EndResponseAtClientCalls(),
        pinned_kv=False,
        stop_requested=stop_requested or (lambda: False),
        export_reasoning=emitter.response.request.wants_encrypted_reasoning,
    )
    outcome = await loop.run()
    return outcome if outcome in (INCOMPLETE, STEERED) else COMPLETED


async def prefill_warmup(api: ApiService, log: metrics.PhaseLog, context: Context) -> int:
    """A warm-up (`generate: false`): the engine prefills the prompt (instructions, tools and any
    input) into its prefix cache and samples nothing, so the next turn finds that prefix cached, as
    the real API's warm-up prepares request state "to make the next turn faster" (WS guide).
    Returns the tokens prefilled; the response's usage stays zero (nothing was sampled). The
    record's `warmup_prefill_tokens` carries the count."""
    call = await api.engine.begin_call(context.engine_key, context.prompt)
    ask = ModelCall(context.engine_key, context.prompt, held=False, output_tokens=0)
    prefilled = await api.engine.prefill_call(context.route.latency, ask, engine_call=call)
    uncached = len(context.prompt) - prefilled.cached
    api.engine.retain(context.engine_key, context.prompt, trio.current_time())
    api.engine.end_call(call, paused=False)
    log.record(metrics.PREFILL, call.admitted_at, trio.current_time())
    if log.client is not None:
        log.client["warmup_prefill_tokens"] = uncached
    return uncached


def _answer_parts(plan: TurnPlan, budget: int | None) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """What the turn's last model call samples within the output budget left: the reasoning (all of it
    or none), the message's words (cut at the budget), and whether they were cut (then no function
    call follows)."""
    reasoning = plan.reasoning if plan.reasoning and (budget is None or budget > len(plan.reasoning)) else ()
    left = None if budget is None else budget - len(reasoning)
    truncated = left is not None and len(plan.words) > left
    return reasoning, plan.words[:left] if truncated else plan.words, truncated


def _answer_tokens(plan: TurnPlan, budget: int | None) -> int:
    """Tokens the turn's last model call samples: reasoning, the message (cut at the output budget),
    and the function calls' arguments (`SamplingLoop._sample` spends them in that order)."""
    reasoning, words, truncated = _answer_parts(plan, budget)
    calls = 0 if truncated else sum(len(_token_pieces(call.arguments)) for call in plan.calls)
    return len(reasoning) + len(words) + calls


def _search_output(search: PlannedSearch) -> PlannedOutput:
    """A hosted call's model call samples its query: the item renders as far as that, its result
    comes from the hosted service after (the plan renders it empty; only the last id, which the
    engine never feeds back, can change with the result)."""
    return PlannedOutput.of([(render.render_items([WebSearchCall("", search.query)]), len(_token_pieces(search.query)))])


def unexpected_outputs(pending: Sequence[str], items: Sequence[Item]) -> str | None:
    """Why `items` do not answer exactly the `pending` calls, or None if they do (docs/protocol.md)."""
    outputs = [item.call_id for item in items if isinstance(item, FunctionCallOutput)]
    if len(outputs) != len(set(outputs)):
        return "a call_id is answered twice"
    unknown = sorted(set(outputs) - set(pending))
    if unknown:
        return f"call_id '{unknown[0]}' is not pending"
    missing = [call_id for call_id in pending if call_id not in outputs]
    if missing:
        return f"no function_call_output for pending call_id '{missing[0]}'"
    return None


__all__ = [
    "COMPLETED", "ENDED_AT_CLIENT_CALLS", "INCOMPLETE", "STEERED", "EndResponseAtClientCalls", "HostedTools", "SamplingLoop",
    "ToolBackend", "ToolCall", "prefill_warmup", "sample_until_client_calls", "unexpected_outputs",
]
