"""The API service's work around inference: pre-inference stages, post-inference work, hydration.

Each stage has a full form (over the whole conversation) and an incremental form (over the new
items only, against state kept from before). The designs differ only in which form they call and
how often (docs/parameters.md §4's table):

| design            | fixed pre-inference  | per-token pre-inference | post-inference          |
| http              | every turn           | whole context           | inline, every turn      |
| chained (v2)      | f_ws x per turn      | new items only          | overlapped with next    |
| suspended (v1)    | once per rollout     | new items only          | once, at the end        |
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Hashable, Sequence

import attrs
import trio

from .. import metrics
from ..engine import Engine, LatencyModel, Prompt, ScriptedPolicy
from ..engine.engine import HTTP_AFFINITY
from ..protocol.compaction import window
from ..protocol.events import CreateRequest
from ..protocol.items import Item, WebSearchCall
from ..protocol.response import Response
from . import render
from .checks import CallLedger, SafetyState, context_window, fewest_tokens, require_fits
from .costs import AFTER_SPRINT, ApiCosts, SprintCosts, SprintSwitches, sprint_costs
from .hosted import HostedToolService
from .live import LiveResponses
from .store import ResponseStore
from .workloads import WorkloadCatalog, decode_rate


@attrs.frozen
class Route:
    """The outcome of model resolution and routing: which profile, which policy, which engine slot."""

    key: tuple[str, tuple[tuple[str, str], ...]]  # what it was resolved from: model and metadata
    latency: LatencyModel
    policy: ScriptedPolicy


@attrs.define(eq=False)
class Context:
    """A conversation as pre-inference work leaves it for the model: items, rendered prompt, and the
    state the incremental checks need."""

    items: list[Item]
    prompt: Prompt
    preamble: str
    ledger: CallLedger
    safety: SafetyState
    route: Route
    engine_key: Hashable


@attrs.frozen
class StageModes:
    """Which form each pre-inference stage takes on a turn that has earlier state."""

    incremental_checks: bool = True
    append_render: bool = True
    reuse_route: bool = True
    fixed_share: float = 1.0  # share of each stage's fixed cost paid (f_ws for chained, 0 for a v1 resume)


FULL = StageModes(False, False, False, 1.0)


def _route_key(request: CreateRequest) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (request.model, tuple(sorted(request.metadata.items())))


class IdFactory:
    """Response and item ids: a random per-server prefix (ids stay unique across restarts sharing a
    store) and a counter."""

    def __init__(self, prefix: str | None = None) -> None:
        self._prefix = prefix if prefix is not None else secrets.token_hex(6)
        self._counter = itertools.count(1)

    def __call__(self, kind: str) -> str:
        return f"{kind}_{self._prefix}{next(self._counter):06d}"


@attrs.define(eq=False)
class ApiService:
    """Everything a design needs from the API layer, shared by all connections of a server."""

    costs: ApiCosts = attrs.Factory(ApiCosts)
    engine: Engine = attrs.Factory(Engine)
    store: ResponseStore = attrs.Factory(ResponseStore)
    hosted: HostedToolService = attrs.Factory(HostedToolService)
    workloads: WorkloadCatalog = attrs.Factory(WorkloadCatalog)
    new_id: IdFactory = attrs.Factory(IdFactory)
    flush_interval: float = 0.0  # delta coalescing; 0 = one delta per token
    flush_tokens: int | None = None  # delta coalescing: at most this many tokens per delta (None: no bound)
    sprint: SprintSwitches = AFTER_SPRINT  # API profile: the pre-WebSocket single-request speed-ups (costs.py)
    sprint_extra: SprintCosts = attrs.Factory(SprintCosts)  # what each speed-up saves, paid while its switch is off
    render_cache: render.RenderCache = attrs.Factory(render.RenderCache)  # the sprint's cross-request render cache
    live: LiveResponses = attrs.Factory(LiveResponses)  # responses in flight, for cancel (api/live.py)
    latency: LatencyModel = attrs.Factory(LatencyModel)  # prefill and overhead of every call; decode rate per request
    http_affinity: float = HTTP_AFFINITY  # share of http turns routed back to their prefix's engine [assumed]
    # Numbers the engine keys of WebSocket connections by: one sequence per service (per engine), so a
    # run's keys do not depend on how many servers the process built before it.
    _session_serials: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    def new_session_serial(self) -> int:
        return next(self._session_serials)

    @property
    def charged_costs(self) -> ApiCosts:
        """The stage costs pre-inference work pays under the API profile: `costs` itself when every
        sprint switch is on (the default), plus the removed work for each switch that is off."""
        return sprint_costs(self.costs, self.sprint, self.sprint_extra)

    # --- stages -----------------------------------------------------------------------------

    async def _charge_stages(self, log: metrics.PhaseLog, stages: Sequence[tuple[str, float]]) -> None:
        """Record the stages back to back and wait once, until the last ends: one timer instead of
        one per stage keeps real-time runs from accumulating timer overshoot."""
        t = trio.current_time() if log.schedule is None else log.schedule
        for phase, seconds in stages:
            log.record(phase, t, t + seconds)
            t += seconds
        log.schedule = t
        await trio.sleep_until(t)

    def resolve_route(self, request: CreateRequest) -> Route:
        workload = self.workloads.resolve(request.metadata)
        rate = decode_rate(request.model, request.metadata)
        return Route(_route_key(request), attrs.evolve(self.latency, decode_tokens_per_s=rate), ScriptedPolicy(workload))

    def context_window(self, model: str) -> int:
        """The longest prompt a request for `model` may bring: the model's window, or less where the engine takes
        less (a real engine's `max_model_len`), so that a prompt too long is refused before its response starts."""
        longest = self.engine.longest_prompt
        return context_window(model) if longest is None else min(context_window(model), longest)

    def _with_hosted_results(self, items: Sequence[Item]) -> list[Item]:
        """Client-sent web_search_call items carry no result: take it from the hosted service."""
        return [
            attrs.evolve(item, result=self.hosted.result_for(item.id))
            if isinstance(item, WebSearchCall) and not item.result
            else item
            for item in items
        ]

    async def pre_inference(
        self,
        log: metrics.PhaseLog,
        request: CreateRequest,
        new_items: Sequence[Item],
        *,
        base: Context | None = None,
        history: Sequence[Item] = (),
        modes: StageModes = FULL,
        engine_key: Hashable = None,
        render_cache: render.RenderCache | None = None,
        within_response: bool = False,
    ) -> Context:
        """Validate, render, classify and route; full where there is no `base` or a mode says so.

        `base` is earlier state this turn extends (the chained cache, a suspended coroutine's
        context): it is extended in place. `history` is a conversation rebuilt from the store.
        A `render_cache` (the HTTP design's cross-request cache) makes a full render tokenize,
        and charge, only the items it has not seen before.
        Raises ProtocolError for invalid input before anything is mutated that could not be evicted.
        A prompt longer than the model's context window is refused before any stage is charged:
        `context_length_exceeded` (a ProtocolError), or, for input joining a response already under way
        (`within_response`: tool outputs, a v1 append), ContextWindowExceeded, which fails that response.
        """
        new_items = self._with_hosted_results(new_items)
        preamble = render.preamble_key(request.instructions, request.tools)
        if base is None:
            modes = FULL
            items = list(history)
            ledger = CallLedger()
            ledger.absorb(items)
            old_items_for_checks: Sequence[Item] = ()
        else:
            items = base.items
            ledger = base.ledger
            old_items_for_checks = items

        # (1) validation: the new items against the ledger, or the whole conversation from scratch.
        if base is not None and not modes.incremental_checks:
            ledger = ledger.refolded(old_items_for_checks)
        ledger.absorb(new_items)

        # The context window, by a bound first: new items that cannot fit however they tokenize are refused
        # without tokenizing them; the rendered length below decides exactly.
        appending = base is not None and modes.append_render and base.preamble == preamble
        known_tokens = len(base.prompt) if appending else 0  # a prompt these items extend, as rendered
        window = self.context_window(request.model)
        require_fits(known_tokens + fewest_tokens([render.item_text(item) for item in new_items], window - known_tokens),
                     window, within_response=within_response)

        # (2) rendering: append the new items' ids, or re-tokenize everything.
        tokenized: int | None = None
        if base is None and render_cache is not None:
            new_ids: list[int] = []  # unused on a full render: the checks below take the whole prompt
            prompt, tokenized = render_cache.render_full(preamble, [*items, *new_items])
        else:
            new_ids = render.render_items(new_items)
            if appending:
                prompt = base.prompt
                prompt.extend(new_ids)
            else:
                prompt = render.render_full(preamble, [*items, *new_items])
        items.extend(new_items)
        checked_tokens = len(new_ids) if base is not None and modes.incremental_checks else len(prompt)
        rendered_tokens = len(new_ids) if prompt is (base.prompt if base else None) else len(prompt)
        if tokenized is not None:
            rendered_tokens = tokenized
        require_fits(len(prompt), window, within_response=within_response)

        # (1) safety: classify the new tokens on top of running counts, or everything again.
        if base is not None and modes.incremental_checks:
            safety = base.safety
            safety.absorb(new_ids)
        else:
            safety = SafetyState()
            safety.absorb(prompt.ids)

        # (3) model resolution and routing: reuse the cached decision if nothing it depends on changed.
        reuse = base is not None and modes.reuse_route and base.route.key == _route_key(request)
        route = base.route if reuse else self.resolve_route(request)

        costs, share = self.charged_costs, modes.fixed_share
        checks_share = 1.0 if base is None or not modes.incremental_checks else share
        await self._charge_stages(log, (
            (metrics.VALIDATE, costs.validate.seconds(checked_tokens, checks_share)),
            (metrics.RENDER, costs.render.seconds(rendered_tokens, 1.0 if base is None or not modes.append_render else share)),
            (metrics.SAFETY, costs.safety.seconds(checked_tokens, checks_share)),
            (metrics.ROUTE, costs.route.seconds(0, share if reuse else 1.0)),
        ))

        if base is None:
            return Context(items, prompt, preamble, ledger, safety, route, engine_key)
        base.prompt, base.preamble, base.ledger, base.safety, base.route = prompt, preamble, ledger, safety, route
        return base

    async def post_inference(self, log: metrics.PhaseLog, response: Response, added: Sequence[Item], *, phase: str = metrics.POST, owner: str | None = None) -> None:
        """Billing and persistence. `added` is what this response adds to the stored conversation
        after its input (outputs, and in v1 the appended items too)."""
        start = trio.current_time()
        if response.request.store:
            self.store.put(
                response.id,
                previous_response_id=response.request.previous_response_id,
                owner=owner,
                created_at=response.created_at,
                input=response.request.input,
                output=list(added),
                response=response.to_dict(),
            )
        if self.costs.post > 0:
            await trio.sleep(self.costs.post)
        log.record(phase, start, trio.current_time())

    async def load_stored_history(self, log: metrics.PhaseLog, response_id: str, owner: str | None) -> list[Item] | None:
        """Rebuild a stored conversation, one read per earlier turn; None if it is not stored."""
        chain = self.store.chain(response_id, owner)
        if chain is None:
            return None
        await self._charge_stages(log, ((metrics.STORE_READ, self.costs.store_read_per_turn * len(chain)),))
        history: list[Item] = []
        for turn in chain:
            history.extend(turn.input)
            history.extend(turn.output)
        return window(history)  # from the latest compaction item on (protocol/compaction.py)


def owner_of(api_key: str | None) -> str | None:
    """Stored responses are tagged with a digest of the key that created them, never the key."""
    if not api_key:
        return None
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]
