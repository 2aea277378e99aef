"""Every [assumed] parameter has a plausible range next to its default (prototype/assumptions.py),
docs/parameters.md prints each, and `configure` sets the swept ones on a benchmark configuration."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from prototype import assumptions, benchmark, netem
from prototype import workload as wl
from prototype.api.costs import ApiCosts
from prototype.engine.latency import LatencyModel
from prototype.ranges import Range

DOCS = Path(__file__).resolve().parent.parent / "docs" / "parameters.md"


def test_docs_table_shows_every_range_beside_its_default() -> None:
    lines = DOCS.read_text().splitlines()
    for parameter in assumptions.ASSUMED:
        assert parameter.markdown_row() in lines, parameter.name


def test_a_range_refuses_low_above_high_and_a_default_outside_it() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        Range(2.0, 1.0, "x")
    with pytest.raises(ValueError, match="outside its range"):
        assumptions.Assumed("x", 3.0, Range(0.0, 1.0, "x"), "s")
    assert 1.0 in Range(0.0, 1.0, "x") and 1.5 not in Range(0.0, 1.0, "x")


def test_a_range_holds_both_its_bounds_and_nothing_outside_them() -> None:
    plausible = Range(0.5, 2.0, "x")
    assert [v in plausible for v in (0.4999, 0.5, 1.0, 2.0, 2.0001)] == [False, True, True, True, False]
    assert 3.0 in Range(3.0, 3.0, "a single plausible value")  # low == high is a range
    with pytest.raises(ValueError) as refused:
        Range(2.0, 1.0, "x")
    assert str(refused.value) == "a range needs low <= high, got 2.0 > 1.0"


def test_swept_parameters_are_assumed_ones() -> None:
    assert set(assumptions.SWEPT) <= set(assumptions.BY_NAME)


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
    with pytest.raises(ValueError, match="not a swept parameter: t_store_read"):
        assumptions.configure(base, {"t_store_read": 0.001})


def test_http_affinity_routes_every_turn_home_or_none() -> None:
    """The swept affinity reaches the http design: at 0 no turn finds its prefix, at 1 every later turn does."""
    task = wl.fixed(4, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=50, tool_seconds=0.1, name="aff")

    def cached(affinity: float) -> int:
        config = benchmark.BenchConfig(task_list=(task,), http_affinity=affinity)
        (row,) = benchmark.design_rows(benchmark.DesignRun(benchmark.HTTP, 1000.0, config))
        return row["cached_tokens"]

    assert cached(0.0) == 0
    assert cached(1.0) > 3 * 2000 * 0.9
