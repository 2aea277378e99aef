"""experiments.fidelity: the simulated engine's held-out error against vLLM, per metric with its interval.

The scoring is pure and tested on constructed runs; one real-engine test (the session's shared worker)
runs the whole experiment at tiny size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import fidelity
from experiments.fidelity import Config
from experiments.real_engine_agents import AgentsRun, CallFigures
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord
from prototype.uncertainty import Estimate


def _run(engine: str, design: str, ttfts: dict[tuple[str, int], float], e2e: dict[str, float], *, prefill: int,
         makespan: float) -> AgentsRun:
    calls = [CallFigures(task, index, 500, 100, ttft, 0.0) for (task, index), ttft in ttfts.items()]
    records = [RolloutRecord(design=design, workload=name, started_at=0.0, ended_at=seconds, status="completed")
               for name, seconds in e2e.items()]
    return AgentsRun(engine, design, len(e2e), records, calls, makespan_s=makespan, prefill_tokens=prefill)


def test_calls_pair_by_task_and_place_and_unmatched_calls_are_left_out():
    real = _run("vllm", CHAINED, {("a", 0): 0.1, ("a", 1): 0.2, ("b", 0): 0.3}, {"t0": 1.0}, prefill=0, makespan=1.0)
    sim = _run("sim", CHAINED, {("a", 1): 0.25, ("b", 0): 0.3, ("c", 0): 9.0}, {"t0": 2.0}, prefill=0, makespan=1.0)
    assert fidelity.paired_calls(real, sim) == [(0.2, 0.25), (0.3, 0.3)] and fidelity.paired_tasks(real, sim) == [(1.0, 2.0)]


def test_absolute_errors_are_percent_of_the_measured_value_and_skip_a_zero_measurement():
    assert list(fidelity.absolute_errors([(100.0, 110.0), (200.0, 150.0), (0.0, 5.0)])) == pytest.approx([10.0, 25.0])
    assert len(fidelity.absolute_errors([])) == 0


def test_the_total_prefill_error_is_signed_and_resamples_the_runs_together():
    error = fidelity.signed_total_error([(100, 102), (200, 204), (300, 306)], of="runs")
    assert (error.value, error.low, error.high, error.n) == pytest.approx((2.0, 2.0, 2.0, 3))
    under = fidelity.signed_total_error([(100, 90), (300, 290)], of="runs")
    assert under.value == pytest.approx(-5.0) and under.low <= -5.0 <= under.high


def test_an_error_quantile_carries_a_bootstrap_interval():
    median = fidelity.error_quantile(list(np.arange(1.0, 21.0)), 0.5, of="calls")
    assert median.value == pytest.approx(10.5) and median.n == 20 and median.low < 10.5 < median.high


def _estimate(value: float, low: float, high: float) -> Estimate:
    return Estimate(value, low, high, 10, "tasks", "bootstrap")


def test_orderings_agree_only_where_the_simulation_orders_every_separated_pair_as_vllm_does():
    real = {"a": _estimate(1.0, 0.9, 1.1), "b": _estimate(2.0, 1.9, 2.1), "c": _estimate(2.05, 1.95, 2.2)}
    # a < b and a < c are separated on vLLM; b ~ c is not, so the simulation may order b and c either way.
    assert fidelity.orderings_agree(real, {"a": _estimate(1, 1, 1), "b": _estimate(3, 3, 3), "c": _estimate(2.5, 2.5, 2.5)}) == "yes"
    assert fidelity.orderings_agree(real, {"a": _estimate(2.2, 2, 2), "b": _estimate(2, 2, 2), "c": _estimate(3, 3, 3)}) == "no (a vs b)"
    overlapping = {"a": _estimate(1.0, 0.5, 2.5), "b": _estimate(2.0, 1.0, 3.0)}
    assert fidelity.orderings_agree(overlapping, {"a": _estimate(5, 5, 5), "b": _estimate(1, 1, 1)}) == "none separated"


def test_the_score_table_has_every_metric_per_variant_and_judges_the_targets():
    config, ttfts = Config("agents", 2), {("a", 0): 0.100, ("a", 1): 0.200, ("b", 0): 0.100, ("b", 1): 0.200}
    results, sims = {}, {}
    for design, factor in ((SUSPENDED, 1.0), (CHAINED, 2.0)):
        real = _run("vllm", design, {k: v * factor for k, v in ttfts.items()}, {"t0": 10.0 * factor, "t1": 12.0 * factor},
                    prefill=1000, makespan=12.0 * factor)
        results[(config, design)] = real
        # "close" is off by 5% everywhere; "far" by 50%.
        for variant, off in (("close", 1.05), ("far", 1.5)):
            sims[(config, design, variant)] = _run("sim", design, {k: v * factor * off for k, v in ttfts.items()},
                                                    {"t0": 10.0 * factor * off, "t1": 12.0 * factor * off},
                                                    prefill=round(1000 * off), makespan=12.0 * factor * off)
    rows, orders = fidelity.score(results, sims, ["close", "far"])
    table = {(row["variant"], row["metric"], row["statistic"]): row for row in rows}
    assert table[("close", "per-call TTFT", "median |error| %")]["met"] == "yes"
    assert table[("far", "per-call TTFT", "p90 |error| %")]["met"] == "no"
    assert table[("close", "prefill computed", "total error %")]["value"].startswith("5.0")
    assert table[("far", "prefill computed", "total error %")]["met"] == "no"
    assert table[("close", "tasks per hour", "median error %")]["value"].startswith("-4.8") and len(rows) == 2 * 5
    # One ordering row per configuration and metric, each variant judged.
    assert len(orders) == len(fidelity.ORDER_METRICS) and all(row["close agrees"] in ("yes", "none separated") for row in orders)


@pytest.mark.real_engine
@pytest.mark.slow
def test_fidelity_at_tiny_size(vllm_worker, monkeypatch, tmp_path, capsys):
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    result = fidelity.main(["--agents", "1", "--workloads", "agents", "--designs", SUSPENDED, CHAINED,
                            "--profile-reps", "1"], worker=vllm_worker)
    assert {(config.agents, design) for config, design in result["results"]} == {(1, SUSPENDED), (1, CHAINED)}
    for (config, design), real in result["results"].items():
        assert real.completed == 1
        for variant in fidelity.VARIANTS:
            sim = result["sims"][(config, design, variant)]
            # Every vLLM call has its simulated twin, and both saw the same prompts.
            assert len(fidelity.paired_calls(real, sim)) == len(real.calls) == len(sim.calls)
    # One agent alone: vLLM's v1 resume computes the ids it was sent, chained what its prefix cache lacks; the
    # simulated engine's prefill is scored against it (its error is what the table prints, not asserted here).
    assert {row["metric"] for row in result["rows"]} == {"per-call TTFT", "per-task end-to-end", "prefill computed",
                                                          "tasks per hour"}
    assert all(not math.isnan(float(row["value"].split()[0].replace(",", ""))) for row in result["rows"]
               if row["metric"] != "tasks per hour")
    assert "held-out error of the simulated engine against vLLM" in capsys.readouterr().out
