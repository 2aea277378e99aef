"""The API stage costs: a stage's seconds, and what each sprint switch adds back on its own
(docs/parameters.md §4). Written against the survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import attrs

from prototype.api.costs import AFTER_SPRINT, BEFORE_SPRINT, ApiCosts, SprintCosts, SprintSwitches, StageCost, sprint_costs


def test_a_stage_costs_its_fixed_share_plus_its_rate_per_thousand_tokens() -> None:
    stage = StageCost(fixed=0.010, per_ktok=2.0)
    assert stage.seconds(0) == 0.010
    assert stage.seconds(500) == 0.010 + 1.0
    assert stage.seconds(500, 0.25) == 0.0025 + 1.0
    assert stage.seconds(1500, 0.0) == 3.0


EXTRA = SprintCosts(config_load=0.020, intermediate_hop=0.030, slow_safety_fixed=0.050, slow_safety_per_ktok=0.004)


def test_each_sprint_switch_adds_back_only_its_own_cost() -> None:
    costs = ApiCosts()
    route, safety = costs.route, costs.safety
    assert sprint_costs(costs, AFTER_SPRINT, EXTRA) is costs
    assert sprint_costs(costs, SprintSwitches(cross_request_render_cache=False), EXTRA) == attrs.evolve(
        costs, route=StageCost(route.fixed + 0.020, route.per_ktok)
    )
    assert sprint_costs(costs, SprintSwitches(direct_inference_hop=False), EXTRA) == attrs.evolve(
        costs, route=StageCost(route.fixed + 0.030, route.per_ktok)
    )
    assert sprint_costs(costs, SprintSwitches(fast_safety=False), EXTRA) == attrs.evolve(
        costs, safety=StageCost(safety.fixed + 0.050, safety.per_ktok + 0.004)
    )
    before = sprint_costs(costs, BEFORE_SPRINT, EXTRA)
    assert before == attrs.evolve(
        costs, route=StageCost(route.fixed + 0.020 + 0.030, route.per_ktok), safety=StageCost(safety.fixed + 0.050, safety.per_ktok + 0.004)
    )
    # Without an explicit `extra`, the documented defaults are added.
    assert sprint_costs(costs, BEFORE_SPRINT) == sprint_costs(costs, BEFORE_SPRINT, SprintCosts())
    assert sprint_costs(costs, BEFORE_SPRINT).route.fixed == route.fixed + SprintCosts().config_load + SprintCosts().intermediate_hop
