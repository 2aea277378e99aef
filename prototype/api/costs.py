"""Modeled costs of the API's own work around inference, and the chained cache's four switches.

OpenAI publishes no per-stage API costs (WORKLOAD.md §4), so every value here is an [assumed] knob
with a starting value from WORKLOAD.md §4, printed with every result and meant to be swept. The
stages also do their work for real (tokenizing, classifying, validating, storing); under a virtual
clock the modeled cost is what moves time, so timelines stay identical run to run.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class StageCost:
    """A stage's cost: `fixed` seconds per request plus `per_ktok` seconds per 1k tokens processed."""

    fixed: float = 0.0
    per_ktok: float = 0.0

    def seconds(self, tokens: int, fixed_share: float = 1.0) -> float:
        return self.fixed * fixed_share + self.per_ktok * tokens / 1000.0


@attrs.frozen
class ApiCosts:
    """Per-stage costs. WORKLOAD.md §4 [assumed]: t_fixed_pre = 250 ms in all, split here across the
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
            ("t_fixed_pre (validate+safety+render+route)", f"{self.fixed_pre * 1000:.0f} ms", "WORKLOAD.md §4 [assumed]"),
            ("  split validate/safety/render/route",
             f"{self.validate.fixed * 1000:.0f}/{self.safety.fixed * 1000:.0f}/{self.render.fixed * 1000:.0f}/{self.route.fixed * 1000:.0f} ms",
             "[assumed split]"),
            ("t_pre_per_ktok", f"{(self.validate.per_ktok + self.safety.per_ktok + self.render.per_ktok) * 1000:.2f} ms/1k tok",
             "WORKLOAD.md §4 [assumed]"),
            ("t_post (billing, persistence)", f"{self.post * 1000:.0f} ms", "WORKLOAD.md §4 [assumed]"),
            ("t_store_read", f"{self.store_read_per_turn * 1000:.1f} ms/earlier turn", "WORKLOAD.md §4 [assumed]; smg PR #1770"),
            ("f_ws (cached turn's share of fixed)", f"{self.cached_fixed_share:g}", "Codex-Spark launch -80% [assumed]"),
        ]


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


ALL_SWITCHES_OFF = CacheSwitches(False, False, False, False)
