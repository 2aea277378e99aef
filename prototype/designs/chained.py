"""The chained design (v2, what shipped): a `response.create` per turn with `previous_response_id`.

Read top to bottom, `run_turn` is the design's description (OpenAI blog; WS guide; docs/protocol.md):

1. resolve `previous_response_id` when the request starts: a hit in the connection's one-slot
   cache takes the cached state; otherwise a stored response (store=true) is rebuilt from the
   store, paying the rebuild; otherwise `previous_response_not_found`;
2. pre-inference work over the new input only (switch 1), appending to the cached rendered tokens
   (switch 2), reusing the routing decision (switch 3), paying f_ws of the fixed cost;
3. the sampling loop; a client function call ends the response (`response.completed`); a
   warm-up (`generate: false`) only prefills the prompt into the engine's prefix cache;
4. post-inference work overlaps the next request (switch 4) instead of running before the
   terminal event;
5. the cache slot takes this response; a 4xx or 5xx turn evicts it.

The session stays pinned to its engine, so its KV is reused when the next turn arrives within the
engine's KV time-to-live.
"""

from __future__ import annotations

import time

import attrs
import trio

from .. import metrics
from ..api.costs import ALL_SWITCHES_ON, CacheSwitches
from ..api.service import ApiService, Context, StageModes, owner_of
from ..protocol.errors import previous_response_not_found
from ..protocol.events import CreateRequest
from ..protocol.items import Item
from ..protocol.response import Response
from .cancel import cancellable
from .emitter import Emitter, Sink, failing_on_error
from .sampling import prefill_warmup, sample_until_client_calls


@attrs.define(eq=False)
class ConnectionCache:
    """The connection-local cache: only the most recent response (WS guide; alpha doc)."""

    engine_key: object
    response_id: str | None = None
    context: Context | None = None
    response: Response | None = None

    def take(self, response_id: str) -> Context | None:
        """The cached context if `response_id` is the cached one; the slot is emptied either way
        until the turn succeeds, so a failed turn leaves it evicted (WS guide)."""
        hit = self.context if response_id == self.response_id else None
        self.evict()
        return hit

    def put(self, response: Response, context: Context) -> None:
        self.response_id, self.context, self.response = response.id, context, response

    def evict(self) -> None:
        self.response_id = self.context = self.response = None


async def run_turn(
    api: ApiService,
    request: CreateRequest,
    sink: Sink,
    cache: ConnectionCache,
    background: trio.Nursery,
    *,
    switches: CacheSwitches = ALL_SWITCHES_ON,
    include_timing: bool = False,
    api_key: str | None = None,
    log: metrics.PhaseLog | None = None,
) -> Response:
    log = log if log is not None else metrics.PhaseLog()
    owner = owner_of(api_key)
    base: Context | None = None
    history: list[Item] = []
    previous_id = request.previous_response_id
    if previous_id is not None:
        base = cache.take(previous_id)
        if base is None:
            stored = await api.load_stored_history(log, previous_id, owner)
            if stored is None:
                raise previous_response_not_found(previous_id)
            history = stored

    modes = StageModes(
        incremental_checks=switches.incremental_checks,
        append_render=switches.append_render,
        reuse_route=switches.reuse_route,
        fixed_share=api.costs.cached_fixed_share,
    )
    context = await api.pre_inference(
        log, request, request.input, base=base, history=history, modes=modes, engine_key=cache.engine_key
    )
    response = Response(api.new_id("resp"), request, created_at=int(time.time()))
    emitter = Emitter(response, sink, log, include_timing)
    await emitter.created(generating=request.generate)

    outcome = "completed"
    async with cancellable(api, emitter, owner), failing_on_error(emitter):
        if request.generate:
            outcome = await sample_until_client_calls(api, emitter, context)
        else:  # a warm-up: the prefix is prefilled into the engine's cache, nothing sampled (WS guide)
            await prefill_warmup(api, log, context)

        added = response.output
        response.status = outcome  # the stored record is the finished response
        if switches.overlap_post:
            background.start_soon(_post, api, log, response, added, owner)
        else:
            await api.post_inference(log, response, added, owner=owner)
        await emitter.finished(outcome, reason="max_output_tokens" if outcome == "incomplete" else None)
    cache.put(response, context)
    return response


async def _post(api: ApiService, log: metrics.PhaseLog, response: Response, added: list[Item], owner: str | None) -> None:
    # Shielded: billing and persistence are not lost when the connection closes mid-way.
    with trio.CancelScope(shield=True):
        await api.post_inference(log, response, added, phase=metrics.POST_OVERLAPPED, owner=owner)
