"""Modeled costs of the API's own work around inference, and the chained cache's four switches.

OpenAI publishes no per-stage API costs (docs/parameters.md §4), so every value here is an [assumed] knob
with a starting value from docs/parameters.md §4, printed with every result and meant to be swept. The
stages also do their work for real (tokenizing, classifying, validating, storing); under a virtual
clock the modeled cost is what moves time, so timelines stay identical run to run.
"""

from __future__ import annotations

import attrs

from ..ranges import Range


@attrs.frozen
class StageCost:
    """A stage's cost: `fixed` seconds per request plus `per_ktok` seconds per 1k tokens processed."""

    fixed: float = 0.0
    per_ktok: float = 0.0

    def seconds(self, tokens: int, fixed_share: float = 1.0) -> float:
        return self.fixed * fixed_share + self.per_ktok * tokens / 1000.0


@attrs.frozen
class ApiCosts:
    """Per-stage costs. docs/parameters.md §4 [assumed]: t_fixed_pre = 250 ms in all, split here across the
    stages [assumed split]; t_pre_per_ktok = 3 ms per 1k tokens processed; t_post = 60 ms;
    t_store_read = 2 ms per earlier turn; f_ws = 0.2 of the fixed part still paid by a cached turn
    (suggested by the Codex-Spark launch's "-80% roundtrip overhead", secondary reports)."""

    validate: StageCost = StageCost(fixed=0.040, per_ktok=0.0005)
    safety: StageCost = StageCost(fixed=0.100, per_ktok=0.0015)
    render: StageCost = StageCost(fixed=0.030, per_ktok=0.0010)
    route: StageCost = StageCost(fixed=0.080, per_ktok=0.0)
    post: float = 0.060
    store_read_per_turn: float = 0.002
    cached_fixed_share: float = 0.2  # f_ws

    @property
    def fixed_pre(self) -> float:
        return self.validate.fixed + self.safety.fixed + self.render.fixed + self.route.fixed

    def describe(self) -> list[tuple[str, str, str]]:
        """(knob, value, source) rows, printed with results."""
        return [
            ("t_fixed_pre (validate+safety+render+route)", f"{self.fixed_pre * 1000:.0f} ms", "docs/parameters.md §4 [assumed]"),
            ("  split validate/safety/render/route",
             f"{self.validate.fixed * 1000:.0f}/{self.safety.fixed * 1000:.0f}/{self.render.fixed * 1000:.0f}/{self.route.fixed * 1000:.0f} ms",
             "[assumed split]"),
            ("t_pre_per_ktok", f"{(self.validate.per_ktok + self.safety.per_ktok + self.render.per_ktok) * 1000:.2f} ms/1k tok",
             "docs/parameters.md §4 [assumed]"),
            ("t_post (billing, persistence)", f"{self.post * 1000:.0f} ms", "docs/parameters.md §4 [assumed]"),
            ("t_store_read", f"{self.store_read_per_turn * 1000:.1f} ms/earlier turn", "docs/parameters.md §4 [assumed]; smg PR #1770"),
            ("f_ws (cached turn's share of fixed)", f"{self.cached_fixed_share:g}", "Codex-Spark launch -80% [assumed]"),
        ]


# Plausible ranges of the [assumed] knobs above, by the name docs/parameters.md §4 gives them (seconds, or a share).
# `t_fixed_pre` and `t_pre_per_ktok` scale the stage split with them (assumptions.py).
API_COST_RANGES: dict[str, Range] = {
    "t_fixed_pre": Range(
        0.100, 0.400,
        "high: the alpha demo (20 turns, 20.24 s -> 14.30 s) saves ~0.3 s a turn, which bounds what a chained turn "
        "removes, (1 - f_ws) x t_fixed_pre + t_post, near 0.4 s; low: below ~0.1 s the API's work would not be the "
        "bottleneck at 1000 tokens/s that the post describes (a median 300-token turn decodes in 0.3 s)"),
    "t_pre_per_ktok": Range(
        0.0005, 0.010,
        "low: tokenizing and validating alone (a BPE tokenizer handles 1k tokens in well under 1 ms on one core); "
        "high: a safety classifier run over every token at ~100k tokens/s, 10 ms per 1k [assumed]"),
    "t_post": Range(
        0.010, 0.150,
        "low: one billing event and one intra-datacenter write, a few ms each; high: a synchronous replicated "
        "commit of the response and its usage across zones [assumed]"),
    "t_store_read": Range(
        0.0005, 0.005,
        "one key-value read per earlier turn inside a datacenter, 0.5-5 ms; smg-project/smg PR #1770 shows the "
        "O(turns) growth, not the constant"),
    "f_ws": Range(
        0.05, 0.5,
        "0.2 from the Codex-Spark launch's '-80% roundtrip overhead' (secondary reports); low: the cache leaves only "
        "authentication; high: half the fixed work (safety set-up, policy checks) still runs per request [assumed]"),
}


ZERO_COSTS = ApiCosts(
    validate=StageCost(), safety=StageCost(), render=StageCost(), route=StageCost(), post=0.0, store_read_per_turn=0.0
)


@attrs.frozen
class CacheSwitches:
    """The four optimizations the chained design's connection cache enables (OpenAI blog), each a
    switch so an experiment can turn it off alone. All off: a cache hit costs a full rebuild."""

    incremental_checks: bool = True  # (1) validation and safety run over the new input only
    append_render: bool = True  # (2) the rendered-token cache is appended to, never re-tokenized
    reuse_route: bool = True  # (3) model resolution and routing are reused
    overlap_post: bool = True  # (4) billing and storing overlap the next request


ALL_SWITCHES_ON = CacheSwitches()
ALL_SWITCHES_OFF = CacheSwitches(False, False, False, False)


# --- API profiles "before" and "after" the single-request sprint ----------------------------------


@attrs.frozen
class SprintSwitches:
    """The single-request speed-ups OpenAI made around November 2025, before WebSocket mode (OpenAI
    blog, "step 1"), each a switch so an experiment can show what it does to time to first
    token. The post credits the three together with "nearly 45%" better TTFT; nothing here is tuned
    to that figure. All on is the "after" profile, the default."""

    cross_request_render_cache: bool = True
    """Rendered tokens and model configuration kept in memory across requests: a multi-turn request
    re-tokenizes only the items the server has not rendered before, and loads no configuration."""
    direct_inference_hop: bool = True
    """The API calls the inference service directly; off, each request first calls an intermediate
    service (the post's example: image-processing resolution)."""
    fast_safety: bool = True
    """The faster safety stack; off, the classifiers take longer per request and per token."""


AFTER_SPRINT = SprintSwitches()
BEFORE_SPRINT = SprintSwitches(cross_request_render_cache=False, direct_inference_hop=False, fast_safety=False)
# Names a server CLI can offer (`--api-profile before|after`).
API_PROFILES = {"before": BEFORE_SPRINT, "after": AFTER_SPRINT}


@attrs.frozen
class SprintCosts:
    """What each speed-up removed: the extra cost a request pays while its switch is off.

    OpenAI publishes none of these, so each is an [assumed] knob, a round order of magnitude for the
    kind of work it stands for, to be swept. They are not derived from, and must not be tuned to, the
    post's "nearly 45%" TTFT figure: an experiment reports whatever TTFT change they give and says
    how it compares.
    """

    config_load: float = 0.020
    """[assumed] Seconds per request to load model configuration from a configuration service when
    it is not cached in memory: one intra-datacenter RPC plus its lookup. Charged to the route stage."""
    intermediate_hop: float = 0.030
    """[assumed] Seconds per request for the intermediate service call the sprint removed (the post's
    example: image-processing resolution): an intra-datacenter round trip plus that service's own
    request handling, paid even when the request has no image. Charged to the route stage, on the
    way to the inference service."""
    slow_safety_fixed: float = 0.050
    """[assumed] Extra seconds per request of the slower safety stack (classifier set-up and calls).
    Charged to the safety stage."""
    slow_safety_per_ktok: float = 0.0015
    """[assumed] Extra seconds per 1k tokens classified by the slower stack: twice the default
    `ApiCosts.safety.per_ktok`. Charged to the safety stage."""

    def describe(self) -> list[tuple[str, str, str]]:
        """(knob, value, source) rows, printed with results of a "before" profile."""
        return [
            ("sprint: config load without cache", f"{self.config_load * 1000:.0f} ms", "[assumed]; OpenAI blog names the cache, no number"),
            ("sprint: intermediate service hop", f"{self.intermediate_hop * 1000:.0f} ms", "[assumed]; OpenAI blog names the hop, no number"),
            ("sprint: slower safety, fixed", f"{self.slow_safety_fixed * 1000:.0f} ms", "[assumed]; OpenAI blog, no number"),
            ("sprint: slower safety, per token", f"{self.slow_safety_per_ktok * 1000:.2f} ms/1k tok", "[assumed]; OpenAI blog, no number"),
        ]


# Plausible ranges of SprintCosts' [assumed] extras, by field name (seconds).
SPRINT_COST_RANGES: dict[str, Range] = {
    "config_load": Range(0.005, 0.050, "one intra-datacenter RPC and lookup (a few ms) to a slow configuration "
                         "service with a cold cache [assumed]"),
    "intermediate_hop": Range(0.010, 0.080, "one intra-datacenter round trip and a light service's handling, to a "
                              "service that does real work on every request [assumed]"),
    "slow_safety_fixed": Range(0.020, 0.100, "one extra classifier call to several in sequence [assumed]"),
    "slow_safety_per_ktok": Range(0.0005, 0.003, "a third of, to twice, the default safety per-token cost [assumed]"),
}


def sprint_costs(costs: ApiCosts, switches: SprintSwitches, extra: SprintCosts = SprintCosts()) -> ApiCosts:
    """The stage costs a request pays under `switches`: `costs` is the "after" profile, and each
    switch that is off adds its `extra` cost back. `sprint_costs(c, AFTER_SPRINT) is c`.

    The render cache's effect on tokenization is not a cost here but a behaviour: with the switch
    off the HTTP design re-tokenizes the whole conversation (designs/http.py); only its model
    configuration load is charged here.
    """
    if switches == AFTER_SPRINT:
        return costs
    route, safety = costs.route, costs.safety
    if not switches.cross_request_render_cache:
        route = attrs.evolve(route, fixed=route.fixed + extra.config_load)
    if not switches.direct_inference_hop:
        route = attrs.evolve(route, fixed=route.fixed + extra.intermediate_hop)
    if not switches.fast_safety:
        safety = StageCost(fixed=safety.fixed + extra.slow_safety_fixed, per_ktok=safety.per_ktok + extra.slow_safety_per_ktok)
    return attrs.evolve(costs, route=route, safety=safety)
