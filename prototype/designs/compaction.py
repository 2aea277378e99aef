"""Server-side compaction inside a response (`context_management`), and `POST /v1/responses/compact`.

When a response's context has grown past its `compact_threshold` the model, before its next turn,
reads the context (a model call: the prefix cache holds all of it but the newest items) and samples
a summary, streamed as a `compaction` output item (`response.output_item.added`,
`response.compaction.compacting`, `response.output_item.done`: openai-python
`ResponseCompactionCompactingEvent`). The context then becomes the compacted window
(protocol/compaction.py): the user messages, the compaction item, and what follows. What the
prefix cache keeps is what the engine finds by content: the instructions, tools and first user
messages at the head of the new prompt; the summary and everything after it are prefilled anew.

The summary's length is an assumption: `summary_tokens` (docs/protocol.md, "Compaction").
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import trio

from .. import metrics
from ..api import render
from ..api.service import ApiService
from ..engine import tokenizer
from ..engine.engine import ModelCall
from ..protocol import events as ev
from ..protocol.compaction import window
from ..protocol.errors import previous_response_not_found
from ..protocol.events import CreateRequest
from ..protocol.items import Compaction, Item
from ..protocol.response import Usage

# [assumed]: the sources publish no size for a compaction summary. Codex's own compaction asks the
# model for a handoff summary, taken here to be a tenth of the context it replaces and at most two
# thousand tokens, so a compacted context lands well below the threshold that triggered it.
COMPACTION_SUMMARY_TOKENS = 2_000
COMPACTION_SUMMARY_SHARE = 0.1


def summary_tokens(context_tokens: int) -> int:
    """The length of the summary of a context of `context_tokens` tokens."""
    return min(COMPACTION_SUMMARY_TOKENS, int(context_tokens * COMPACTION_SUMMARY_SHARE))


def summary_text(n_tokens: int, seed: int) -> str:
    """The summary the simulated model writes: `n_tokens` one-token words, deterministic from `seed`."""
    return "".join(tokenizer.words(np.random.default_rng(seed), n_tokens))


async def compact_if_due(loop: Any) -> None:
    """Compact a `SamplingLoop`'s context if it has crossed the request's threshold (the loop is
    not imported here: sampling.py imports this module)."""
    threshold = loop.emitter.response.request.compact_threshold
    if threshold is None or len(loop.context.prompt) <= threshold:
        return
    ctx, emitter, api = loop.context, loop.emitter, loop.api
    n_tokens = summary_tokens(len(ctx.prompt))
    await loop.model_call(n_tokens)  # the model reads the whole context to summarize it
    start = trio.current_time()
    item_id = api.new_id("cmp")
    index = len(emitter.response.output)
    await emitter.emit(ev.OutputItemAdded, output_index=index, item={"type": "compaction", "id": item_id, "encrypted_content": ""})
    await emitter.emit(ev.CompactionCompacting, item_id=item_id, output_index=index)
    latency = ctx.route.latency
    begin = loop.decode_from if loop.decode_from is not None else trio.current_time()
    loop.decode_from = await api.engine.decode_unstreamed(latency, n_tokens, start=begin, engine_call=loop.engine_call)
    api.engine.stats.decoded_tokens += n_tokens
    emitter.response.usage.output_tokens += n_tokens
    kept = window([*ctx.items, Compaction(item_id, "")])[:-1]
    ctx.ledger.offset += len(ctx.items) - len(kept)  # the items the window drops; call ids count on past them
    item = Compaction(item_id, summary_text(n_tokens, len(ctx.prompt)), rounds=ctx.ledger.turn, offset=ctx.ledger.offset)
    emitter.response.output.append(item)
    await emitter.emit(ev.OutputItemDone, output_index=index, item=item.to_dict())
    loop.log.record(metrics.DECODE, start, trio.current_time())
    ctx.items[:] = [*kept, item]
    ctx.prompt = render.render_full(ctx.preamble, ctx.items)


async def compact_conversation(api: ApiService, request: CreateRequest, owner: str | None) -> dict[str, Any]:
    """`POST /v1/responses/compact`: the model reads the conversation (a stored chain's items, then
    `request.input`) and writes a summary; the answer is the window a new chain starts from, "all
    user messages, followed by a single compaction item" (openai-python `CompactedResponse`)."""
    log = metrics.PhaseLog(schedule=trio.current_time())
    history: list[Item] = []
    if request.previous_response_id is not None:
        stored = await api.load_stored_history(log, request.previous_response_id, owner)
        if stored is None:
            raise previous_response_not_found(request.previous_response_id)
        history = stored
    response_id = api.new_id("resp")
    engine_key = ("compact", response_id)
    context = await api.pre_inference(log, request, request.input, history=history, engine_key=engine_key)
    n_tokens = summary_tokens(len(context.prompt))
    try:
        call = await api.engine.begin_call(engine_key, context.prompt)
        latency = context.route.latency
        ask = ModelCall(engine_key, context.prompt, held=False, output_tokens=n_tokens)
        prefilled = await api.engine.prefill_call(latency, ask, engine_call=call)
        cached = prefilled.cached
        await api.engine.decode_unstreamed(latency, n_tokens, start=prefilled.decode_from, engine_call=call)
        api.engine.stats.decoded_tokens += n_tokens
        api.engine.end_call(call, paused=False)
    finally:
        api.engine.release(engine_key)
    kept = window([*context.items, Compaction("", "")])[:-1]
    offset = context.ledger.offset + len(context.items) - len(kept)
    item = Compaction(api.new_id("cmp"), summary_text(n_tokens, len(context.prompt)), rounds=context.ledger.turn, offset=offset)
    usage = Usage(input_tokens=len(context.prompt), cached_tokens=cached, output_tokens=n_tokens)
    return {
        "id": response_id,
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [item.to_dict() for item in window([*context.items, item])],
        "usage": usage.to_dict(),
    }
