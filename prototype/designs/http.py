"""The http design (the baseline): `POST /v1/responses` per turn, answered with an SSE stream.

Read top to bottom, `run_http_turn` is the design's description (docs/protocol.md; docs/parameters.md §4):

1. the conversation comes from scratch every turn: either the client resent all of it
   (**stateless**, `store:false`), or `previous_response_id` names a stored response and the chain
   is walked back one store read per earlier turn (**stored**); an unknown or unstored id is
   `previous_response_not_found`, answered as HTTP 400 before any streaming;
2. full pre-inference work over the whole conversation: validate it, classify all of it, render
   it (only the items never rendered before when the API profile has the cross-request render
   cache), resolve the model and route, every stage paying its full fixed cost;
3. routing: OpenAI routes prompt-cache traffic by a hash of the prompt's first ~256 tokens, so a
   conversation keeps landing on the engine that holds its prefix, with probability
   `HTTP_AFFINITY` (drawn independently per conversation and turn); otherwise it lands on an
   engine that holds nothing of it. On its engine the request finds its prefix by content (the
   engine's block directory), so a first turn reuses the preset's common prefix but nothing of
   another conversation;
4. the sampling loop; a client function call ends the response (`response.completed`);
5. post-inference work (billing, storing) inline, before the terminal event, every turn.

Nothing survives the turn on the server but the engine's prefix cache and, with `store:true`, the
stored record.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Hashable, Sequence

from .. import metrics
from ..api import render
from ..api.checks import require_answered
from ..api.service import ApiService, owner_of
from ..engine.engine import HTTP_AFFINITY
from ..protocol.errors import previous_response_not_found
from ..protocol.events import CreateRequest
from ..protocol.items import Item
from ..protocol.response import Response
from ..protocol.wire import STATELESS, STORED, VARIANTS
from .cancel import cancellable
from .emitter import Emitter, Sink, failing_on_error
from .sampling import prefill_warmup, sample_until_client_calls


def variant_of(request: CreateRequest) -> str:
    """`stored` when the request chains from a stored response, `stateless` otherwise."""
    return STORED if request.previous_response_id is not None else STATELESS


def conversation_key(items: Sequence[Item]) -> str:
    """Which conversation a stateless request continues: a digest of its first item (a task's own prompt). The
    engine keeps the conversation's KV under it; what a request reuses is found by content, not by this key."""
    first = render.item_text(items[0]) if items else ""
    return hashlib.blake2b(first.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def reaches_prefix_cache(items: Sequence[Item], affinity: float = HTTP_AFFINITY) -> bool:
    """Whether this turn is routed back to the engine holding its prefix ([assumed] probability
    `affinity`, docs/parameters.md §6). The draw is a hash of the conversation's first item and its length,
    not a global generator: every run sees the same draw for the same turn, and since every task has its own
    content, the draws of different tasks and turns are independent."""
    first = render.item_text(items[0]) if items else ""
    digest = hashlib.blake2b(f"{len(items)}\x00{first}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < affinity


async def run_http_turn(
    api: ApiService,
    request: CreateRequest,
    sink: Sink,
    *,
    variant: str | None = None,
    include_timing: bool = False,
    api_key: str | None = None,
    log: metrics.PhaseLog | None = None,
) -> Response:
    """One `POST /v1/responses`, from the request to its terminal event.

    `variant` is what the client intends (`stateless` or `stored`); None takes it from the request.
    Raises ProtocolError before the first event for a request refused as a whole.
    """
    log = log if log is not None else metrics.PhaseLog()
    owner = owner_of(api_key)
    if variant is None:
        variant = variant_of(request)
    if variant not in VARIANTS or variant != variant_of(request):
        raise ValueError(f"variant {variant!r} does not match a request with previous_response_id={request.previous_response_id!r}")

    # (1) the conversation, from scratch: resent by the client, or rebuilt from the store.
    history: list[Item] = []
    if variant == STORED:
        stored = await api.load_stored_history(log, request.previous_response_id, owner)
        if stored is None:
            raise previous_response_not_found(request.previous_response_id)
        history = stored

    # (2) full pre-inference work over all of it.
    render_cache = api.render_cache if api.sprint.cross_request_render_cache else None
    context = await api.pre_inference(log, request, request.input, history=history, render_cache=render_cache)
    if request.generate:
        require_answered(context.ledger)  # a full validation sees every call without its output

    # (3) routing: the prefix's engine, or (1 - affinity) of the time one that holds nothing of it.
    home: Hashable = ("http", conversation_key(context.items))
    elsewhere = not reaches_prefix_cache(context.items, api.http_affinity)
    context.engine_key = ("http-elsewhere", home, len(context.items)) if elsewhere else home
    if elsewhere:
        api.engine.isolate(context.engine_key)

    response = Response(api.new_id("resp"), request, created_at=int(time.time()))
    emitter = Emitter(response, sink, log, include_timing)
    try:
        await emitter.created(generating=request.generate)  # a warm-up has no response.in_progress
        outcome = "completed"
        async with cancellable(api, emitter, owner), failing_on_error(emitter):
            # (4) the sampling loop, ending at the first client function call.
            if request.generate:
                outcome = await sample_until_client_calls(api, emitter, context)
            else:  # a warm-up, as on WebSocket: prefill only (docs/protocol.md)
                await prefill_warmup(api, log, context)

            # (5) post-inference work inline: the client waits for billing and the store write. The
            # stored record is the finished response, so it takes its outcome first (the terminal
            # event sets the same again).
            reason = "max_output_tokens" if outcome == "incomplete" else None
            response.status = outcome
            if reason is not None:
                response.incomplete_details = {"reason": reason}
            await api.post_inference(log, response, response.output, owner=owner)
            await emitter.finished(outcome, reason=reason)
        if render_cache is not None:
            # The sampled items were rendered when they joined the context; a client that resends
            # them next turn finds them cached. Done once the terminal event has gone out.
            render_cache.remember(response.output)
    finally:
        if elsewhere:
            # The engine that served this turn is not where the next turn is routed: its copy of the
            # prefix is never reached again, so it is dropped rather than kept in the model.
            api.engine.release(context.engine_key)
    return response


__all__ = ["conversation_key", "reaches_prefix_cache", "run_http_turn", "variant_of"]
