"""The chained design (v2, what shipped): a `response.create` per turn with `previous_response_id`.

Read top to bottom, `run_turn` is the design's description for one turn on one lane (OpenAI blog;
WS guide; docs/protocol.md):

1. resolve `previous_response_id` when the request starts, through the lane's view of the
   connection cache: the lane's own most recent response is taken; another lane's is copied (a
   fork); otherwise a stored response (store=true) is rebuilt from the store, paying the rebuild;
   otherwise `previous_response_not_found`;
2. pre-inference work over the new input only (switch 1), appending to the cached rendered tokens
   (switch 2), reusing the routing decision (switch 3), paying f_ws of the fixed cost; a
   continuation must answer every function call still pending, or it is refused with the public
   API's 400 (`No tool output found for function call <call_id>.`, param `input`);
3. the sampling loop; a client function call ends the response (`response.completed`), unless
   the response was created with `multi_agent` (it then waits there for `response.inject`:
   designs/inject.py); queued steering input ends it too, at the next safe output boundary (`response.incomplete`, reason
   `steered`); the session then starts the automatic successor (server/websocket/); a warm-up
   (`generate: false`) only prefills the prompt into the engine's prefix cache;
4. post-inference work overlaps the next request (switch 4) instead of running before the
   terminal event;
5. the lane's cache slot takes this response; a 4xx or 5xx turn evicts it.

Lanes (`stream_id`) multiplex conversations over one connection: each lane runs its creates FIFO,
lanes run side by side, and each keeps its own slot, so a connection holds at most one response
per lane (docs/protocol.md). Each lane stays pinned to its own engine key, so its KV is reused when
the next turn arrives within the engine's KV time-to-live.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Awaitable, Callable

import attrs
import trio

from .. import metrics
from ..api.checks import require_answered
from ..api.costs import ALL_SWITCHES_ON, CacheSwitches
from ..api.service import ApiService, Context, StageModes, owner_of
from ..engine import Prompt
from ..protocol.errors import previous_response_not_found, response_error
from ..protocol.events import CreateRequest
from ..protocol.inject import ROOT
from ..protocol.items import Item
from ..protocol.response import Response
from .cancel import cancellable
from .emitter import Emitter, Sink, failing_on_error
from .inject import sample_subagents
from .sampling import COMPLETED, INCOMPLETE, STEERED, ToolBackend, prefill_warmup, sample_until_client_calls
from .suspended import SuspensionExpired


@attrs.define(eq=False)
class CacheSlot:
    response: Response
    context: Context


@attrs.define(eq=False)
class ConnectionCache:
    """The connection-local cache: the most recent response of each lane (WS guide: "the most
    recent response" per connection; one per lane is ours, the guide being silent on lanes)."""

    engine_key: object  # the connection's; a lane's engine key adds its stream_id
    slots: dict[str | None, CacheSlot] = attrs.Factory(dict)

    def lane_key(self, lane: str | None) -> object:
        return self.engine_key if lane is None else (self.engine_key, lane)

    def view(self, lane: str | None) -> LaneView:
        return LaneView(self, lane)

    def find(self, response_id: str) -> tuple[str | None, CacheSlot] | None:
        for lane, slot in self.slots.items():
            if slot.response.id == response_id:
                return lane, slot
        return None

    def evict(self, lane: str | None = None, *, everything: bool = False) -> None:
        if everything:
            self.slots.clear()
        else:
            self.slots.pop(lane, None)

    @property
    def engine_keys(self) -> list[object]:
        return [self.engine_key, *(self.lane_key(lane) for lane in self.slots if lane is not None)]

    # The default lane (no `stream_id`), as a connection without lanes sees its one slot.

    def take(self, response_id: str) -> Context | None:
        return self.view(None).take(response_id)

    def put(self, response: Response, context: Context) -> None:
        self.view(None).put(response, context)

    @property
    def response(self) -> Response | None:
        slot = self.slots.get(None)
        return slot.response if slot is not None else None

    @property
    def response_id(self) -> str | None:
        return self.response.id if self.response is not None else None

    @property
    def context(self) -> Context | None:
        slot = self.slots.get(None)
        return slot.context if slot is not None else None


def _fork(context: Context, engine_key: object) -> Context:
    """An independent copy of a cached conversation, for a turn on another lane to extend."""
    ledger = attrs.evolve(context.ledger, calls=dict(context.ledger.calls), answered=set(context.ledger.answered))
    safety = attrs.evolve(context.safety, counts=context.safety.counts.copy())
    prompt = Prompt(array("q", context.prompt.ids))
    return Context(list(context.items), prompt, context.preamble, ledger, safety, context.route, engine_key)


async def _nothing(emitter: Emitter) -> None:
    return None


@attrs.define(eq=False)
class LaneView:
    """What one turn sees of the cache: its lane's slot, and the others' responses to fork from.
    The session sets the steering hooks (server/websocket/)."""

    cache: ConnectionCache
    lane: str | None
    on_created: Callable[[Emitter], Awaitable[None]] = attrs.field(default=_nothing, kw_only=True)
    stop_requested: Callable[[str], bool] = attrs.field(default=lambda response_id: False, kw_only=True)
    # The backend that answers a response's client calls with injected outputs (designs/inject.py),
    # for a response created with `multi_agent.enabled`; None: the response ends at its client calls.
    injected_outputs: Callable[..., ToolBackend | None] = attrs.field(default=lambda emitter, agent=ROOT: None, kw_only=True)

    @property
    def engine_key(self) -> object:
        return self.cache.lane_key(self.lane)

    def take(self, response_id: str) -> Context | None:
        """The cached context of `response_id`: this lane's slot is emptied until the turn
        succeeds, so a failed turn leaves it evicted (WS guide); another lane's response is copied
        and stays where it is (a fork: `stream_id` routes, `previous_response_id` sets lineage)."""
        found = self.cache.find(response_id)
        own = self.cache.slots.pop(self.lane, None)  # this lane moves on, whatever it continues
        if found is None:
            return None
        lane, slot = found
        if lane == self.lane and own is not None:
            return slot.context
        return _fork(slot.context, self.engine_key)  # the fork's KV is its own lane's

    def put(self, response: Response, context: Context) -> None:
        self.cache.slots[self.lane] = CacheSlot(response, context)


async def run_turn(
    api: ApiService,
    request: CreateRequest,
    sink: Sink,
    lane: LaneView,
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
        base = lane.take(previous_id)
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
        log, request, request.input, base=base, history=history, modes=modes, engine_key=lane.engine_key
    )
    if request.generate:
        require_answered(context.ledger)  # as http does: no model call while a call has no output
    response = Response(api.new_id("resp"), request, created_at=int(time.time()))
    emitter = Emitter(response, sink, log, include_timing)
    await lane.on_created(emitter)  # from here on the response can be steered
    await emitter.created(generating=request.generate)

    outcome = "completed"
    async with cancellable(api, emitter, owner), failing_on_error(emitter):
        if request.generate:
            injected = lane.injected_outputs(emitter) if request.takes_injected_input else None
            try:
                if request.subagents:  # hosted subagents: not continued through previous_response_id [ours]
                    outcome = await sample_subagents(api, emitter, context, request.subagents, lane.injected_outputs)
                    context = None
                else:
                    outcome = await sample_until_client_calls(
                        api, emitter, context, lambda: lane.stop_requested(response.id), client=injected
                    )
            except SuspensionExpired:  # waited longer than the suspension time-to-live for injected outputs
                await emitter.finished("failed", error=response_error(
                    "No response.inject answered the function calls in time; the response was released."
                ))
                return response
        else:  # a warm-up: the prefix is prefilled into the engine's cache, nothing sampled (WS guide)
            await prefill_warmup(api, log, context)

        added = response.output
        status, reason = _TERMINAL[outcome]
        response.status = status  # the stored record is the finished response
        if switches.overlap_post:
            background.start_soon(_post, api, log, response, added, owner)
        else:
            await api.post_inference(log, response, added, owner=owner)
        await emitter.finished(status, reason=reason)
    if context is not None:
        lane.put(response, context)
    return response


# outcome of the sampling loop -> (status, incomplete_details.reason)
_TERMINAL = {COMPLETED: ("completed", None), INCOMPLETE: ("incomplete", "max_output_tokens"), STEERED: ("incomplete", "steered")}


async def _post(api: ApiService, log: metrics.PhaseLog, response: Response, added: list[Item], owner: str | None) -> None:
    # Shielded: billing and persistence are not lost when the connection closes mid-way.
    with trio.CancelScope(shield=True):
        await api.post_inference(log, response, added, phase=metrics.POST_OVERLAPPED, owner=owner)
