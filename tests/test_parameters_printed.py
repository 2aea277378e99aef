"""The parameter tables printed with results (api/costs.py `describe`): each row shows the value the run used, from its
field, and its source. The costs differ from the defaults and from one another, each just below a rounding step of its
printed precision: a default, another field's value, a wrong unit or a value scaled by 0.1% prints differently."""

from __future__ import annotations

from prototype.api.costs import BEFORE_SPRINT, ApiCosts, SprintCosts, StageCost
from prototype.benchmark import BenchConfig, parameters

COSTS = ApiCosts(
    validate=StageCost(fixed=0.01149, per_ktok=0.0002), safety=StageCost(fixed=0.12339, per_ktok=0.0030),
    render=StageCost(fixed=0.06045, per_ktok=0.0040),
    route=StageCost(fixed=0.6001, per_ktok=0.0500),  # route's per-token cost is not in t_pre_per_ktok
    post=0.04249, store_read_per_turn=0.003549, cached_fixed_share=0.35)


def test_api_costs_rows_show_the_values_used_and_their_sources_and_the_defaults_the_documented_ones():
    assert COSTS.describe() == [
        ("t_fixed_pre (validate+safety+render+route)", "795 ms", "docs/parameters.md §4 [assumed]"),
        ("  split validate/safety/render/route", "11/123/60/600 ms", "[assumed split]"),
        ("t_pre_per_ktok", "7.20 ms/1k tok", "docs/parameters.md §4 [assumed]"),
        ("t_post (billing, persistence)", "42 ms", "docs/parameters.md §4 [assumed]"),
        ("t_store_read", "3.5 ms/earlier turn", "docs/parameters.md §4 [assumed]; smg PR #1770"),
        ("f_ws (cached turn's share of fixed)", "0.35", "Codex-Spark launch -80% [assumed]")]
    # docs/parameters.md §4: 250 ms fixed in all, 3 ms per 1k tokens, 60 ms post, 2 ms per earlier turn, f_ws 0.2.
    values = [value for _, value, _ in ApiCosts().describe()]
    assert values == ["250 ms", "40/100/30/80 ms", "3.00 ms/1k tok", "60 ms", "2.0 ms/earlier turn", "0.2"]


def test_sprint_costs_rows_show_the_values_used_and_their_sources():
    extra = SprintCosts(config_load=0.012495, intermediate_hop=0.04549, slow_safety_fixed=0.07849, slow_safety_per_ktok=0.0027449)
    assert extra.describe() == [
        ("sprint: config load without cache", "12 ms", "[assumed]; OpenAI blog names the cache, no number"),
        ("sprint: intermediate service hop", "45 ms", "[assumed]; OpenAI blog names the hop, no number"),
        ("sprint: slower safety, fixed", "78 ms", "[assumed]; OpenAI blog, no number"),
        ("sprint: slower safety, per token", "2.74 ms/1k tok", "[assumed]; OpenAI blog, no number")]
    assert [value for _, value, _ in SprintCosts().describe()] == ["20 ms", "30 ms", "50 ms", "1.50 ms/1k tok"]


def test_a_benchmark_prints_the_costs_it_ran_with_and_before_the_sprint_the_sprint_costs_it_pays():
    rows = parameters(BenchConfig(costs=COSTS))
    assert rows[-len(COSTS.describe()):] == COSTS.describe() and all(knob and value and source for knob, value, source in rows)
    assert parameters(BenchConfig(costs=COSTS, sprint=BEFORE_SPRINT)) == rows + SprintCosts().describe()
