"""Every [assumed] parameter has a plausible range next to its default (prototype/assumptions.py),
docs/parameters.md prints each, and `configure` sets the swept ones on a benchmark configuration."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from prototype import assumptions, benchmark, netem
from prototype import workload as wl
from prototype.api.costs import ApiCosts, StageCost
from prototype.engine.latency import LatencyModel
from prototype.ranges import Range

DOCS = Path(__file__).resolve().parent.parent / "docs" / "parameters.md"


def test_docs_table_shows_every_range_beside_its_default() -> None:
    lines = DOCS.read_text().splitlines()
    for parameter in assumptions.ASSUMED:
        assert parameter.markdown_row() in lines, parameter.name


def test_a_range_holds_both_its_bounds_and_nothing_outside_them() -> None:
    plausible = Range(0.5, 2.0, "x")
    assert [v in plausible for v in (0.4999, 0.5, 1.0, 2.0, 2.0001)] == [False, True, True, True, False]
    assert 3.0 in Range(3.0, 3.0, "a single plausible value")  # low == high is a range
    with pytest.raises(ValueError) as refused:
        Range(2.0, 1.0, "x")
    assert str(refused.value) == "a range needs low <= high, got 2.0 > 1.0"


def test_configure_sets_each_swept_value_and_scales_the_stage_split() -> None:
    base = benchmark.BenchConfig(preset="coding")
    config = assumptions.configure(base, {
        "t_fixed_pre": 0.125, "t_pre_per_ktok": 0.006, "t_post": 0.010, "f_ws": 0.5, "http_affinity": 0.6,
        "prefill_rate": 5000.0, "engine_overhead": 0.002, "rtt": 0.150, "hosted_seconds": 4.0, "hosted_result_tokens": 600.0,
    })
    default = ApiCosts()
    assert config.costs.fixed_pre == pytest.approx(0.125)
    assert config.costs.safety.fixed == pytest.approx(default.safety.fixed / 2)  # the 40/100/30/80 split, halved
    assert config.costs.safety.per_ktok == pytest.approx(default.safety.per_ktok * 2)
    assert (config.costs.post, config.costs.cached_fixed_share, config.http_affinity) == (0.010, 0.5, 0.6)
    assert config.latency == attrs.evolve(LatencyModel(), prefill_tokens_per_s=5000.0, request_overhead=0.002)
    assert config.network.rtt == 0.150 and config.network.tls_round_trips == netem.SAME_REGION.tls_round_trips
    assert config.preset == attrs.evolve(wl.CODING, hosted_seconds=4.0, hosted_result_tokens=600)
    assert assumptions.configure(base, {}) == base


def test_http_affinity_routes_every_turn_home_or_none() -> None:
    """The swept affinity reaches the http design: at 0 no turn finds its prefix, at 1 every later turn does."""
    task = wl.fixed(4, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=50, tool_seconds=0.1, name="aff")

    def cached(affinity: float) -> int:
        config = benchmark.BenchConfig(task_list=(task,), http_affinity=affinity)
        (row,) = benchmark.design_rows(benchmark.DesignRun(benchmark.HTTP, 1000.0, config))
        return row["cached_tokens"]

    assert cached(0.0) == 0
    assert cached(1.0) > 3 * 2000 * 0.9


def test_a_parameter_prints_in_its_unit_with_six_significant_digits() -> None:
    assumed = assumptions.Assumed("t_x", 0.25, Range(0.0005, 1234.5678, "why it is plausible"), "ms", 1000, "prototype/x.py")
    assert [assumed.show(v) for v in (0.25, 0.0005, 1234.5678)] == ["250", "0.5", "1.23457e+06"]
    assert assumed.markdown_row() == "| t_x | 250 ms | 0.5-1.23457e+06 ms | why it is plausible | prototype/x.py |"
    plain = assumptions.Assumed("n", 12345.0, Range(0.0, 20000.0, "r"), "tokens")
    assert (plain.scale, plain.where, plain.show(12345.0)) == (1.0, "", "12,345")
    with pytest.raises(ValueError) as refused:
        assumptions.Assumed("t_y", 3.0, Range(0.0, 1.0, "x"), "s")
    assert str(refused.value) == "t_y: default 3.0 lies outside its range 0.0-1.0"
    assumptions.Assumed("t_edge", 1.0, Range(0.0, 1.0, "x"), "s")  # a default on a bound is inside


def test_every_assumed_default_is_the_value_its_module_uses() -> None:
    costs = ApiCosts()
    assert {a.name: (a.default, a.scale, a.unit) for a in assumptions.ASSUMED if a.name in assumptions.SWEPT} == {
        "t_fixed_pre": (costs.fixed_pre, 1000, "ms"), "t_pre_per_ktok": (0.003, 1000, "ms/1k tokens"),
        "t_post": (costs.post, 1000, "ms"), "f_ws": (costs.cached_fixed_share, 1, "of t_fixed_pre"),
        "http_affinity": (benchmark.BenchConfig().http_affinity, 1, "of http turns"),
        "prefill_rate": (LatencyModel().prefill_tokens_per_s, 1, "tokens/s"),
        "engine_overhead": (LatencyModel().request_overhead, 1000, "ms"), "rtt": (netem.SAME_REGION.rtt, 1000, "ms"),
        "hosted_seconds": (wl.PRESETS["compact"].hosted_seconds, 1, "s"),
        "hosted_result_tokens": (wl.PRESETS["compact"].hosted_result_tokens, 1, "tokens"),
    }
    assert assumptions.BY_NAME["t_pre_per_ktok"].default == pytest.approx(0.003)
    assert list(assumptions.BY_NAME) == [a.name for a in assumptions.ASSUMED] and set(assumptions.SWEPT) <= set(assumptions.BY_NAME)
    assert set(assumptions.__all__) == {"ASSUMED", "BY_NAME", "SWEPT", "Assumed", "configure"}


def test_configure_keeps_the_configurations_own_values_where_none_is_given() -> None:
    costs = ApiCosts(post=0.020, cached_fixed_share=0.3)
    model = LatencyModel(prefill_tokens_per_s=7000.0, request_overhead=0.004)
    base = benchmark.BenchConfig(preset=wl.PRESETS["chat"], costs=costs, latency=model, network=netem.CROSS_CONTINENT,
                                 http_affinity=0.4)
    config = assumptions.configure(base, {"t_fixed_pre": costs.fixed_pre})
    assert config == base  # a value equal to the configuration's own scales nothing
    config = assumptions.configure(base, {"hosted_result_tokens": 600.5, "rtt": 0.001})
    assert config.preset == attrs.evolve(wl.PRESETS["chat"], hosted_result_tokens=600)  # rounded half to even
    assert (config.costs, config.latency, config.http_affinity, config.network) == (
        costs, model, 0.4, attrs.evolve(netem.CROSS_CONTINENT, rtt=0.001))
    assert assumptions.configure(base, {"hosted_result_tokens": 601.5}).preset.hosted_result_tokens == 602
    named = assumptions.configure(benchmark.BenchConfig(preset="chat"), {"hosted_seconds": 2.5})
    assert named.preset == attrs.evolve(wl.PRESETS["chat"], hosted_seconds=2.5)
    with pytest.raises(ValueError) as refused:
        assumptions.configure(base, {"t_store_read": 0.001, "rtt": 0.01, "f_x": 1.0})
    assert str(refused.value) == ("not a swept parameter: f_x, t_store_read (swept: t_fixed_pre, t_pre_per_ktok, t_post, f_ws, "
                                  "http_affinity, prefill_rate, engine_overhead, rtt, hosted_seconds, hosted_result_tokens)")


def test_configure_leaves_a_stage_split_of_zero_as_it_is() -> None:
    # With no fixed or per-token cost to scale, a value for it scales nothing (no division by zero).
    free = StageCost(fixed=0.0, per_ktok=0.0)
    base = benchmark.BenchConfig(costs=ApiCosts(validate=free, safety=free, render=free, route=StageCost(fixed=0.0, per_ktok=0.002)))
    assert assumptions.configure(base, {"t_fixed_pre": 0.5, "t_pre_per_ktok": 0.004}).costs == base.costs
    # Each stage scales its fixed share by the first ratio and its per-token share by the second.
    costs = ApiCosts(validate=StageCost(0.010, 0.001), safety=StageCost(0.030, 0.002), render=StageCost(0.0, 0.001),
                     route=StageCost(0.060, 0.004))
    scaled = assumptions.configure(benchmark.BenchConfig(costs=costs), {"t_fixed_pre": 0.2, "t_pre_per_ktok": 0.008}).costs
    assert [v for s in (scaled.validate, scaled.safety, scaled.render, scaled.route) for v in (s.fixed, s.per_ktok)] == pytest.approx(
        [0.020, 0.002, 0.060, 0.004, 0.0, 0.002, 0.120, 0.008])
