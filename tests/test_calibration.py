"""Calibration: the fit recovers known parameters from a synthetic trace, the coding preset stays within its stated
tolerances of TraceLab's published figures (docs/parameters.md "Calibration"), and calibrate/compare read each other's
files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from prototype import benchmark, profiles, traces
from prototype import workload as wl
from prototype.__main__ import main
from prototype.cli.calibrate import figures, fitted_preset
from prototype.engine import fit, latency
from tests.test_traces import FIXTURE, iso, tracelab_row, write_jsonl

# What a synthetic trace is generated with, and what calibrate must give back.
FIXED_S, PREFILL_TPS, DECODE_TPS = 0.35, 12_000.0, 61.0
GENERATOR = wl.WorkloadParams(turns_median=12, turns_sigma=0.6, appended_median=900, appended_sigma=1.0,
                              output_median=220, output_sigma=0.8)


def synthetic_tracelab(path, n_tasks=60, seed=5, noise_s=0.05):
    """Tasks of GENERATOR written as TraceLab rounds: a perfect prefix cache, model time from the known latency model
    plus Gaussian noise, tools from the generator's mixture, tasks one after another in one session each."""
    rng = np.random.default_rng(seed)
    rows, clock = [], 0.0
    for task in wl.generate(GENERATOR, seed=seed, n_tasks=n_tasks):
        for k, turn in enumerate(task.turns):
            uncached, cached = turn.appended_tokens, task.context_before(k)
            seconds = FIXED_S + uncached / PREFILL_TPS + turn.output_tokens / DECODE_TPS + rng.normal(0, noise_s)
            start, clock = clock, clock + max(0.01, seconds)
            rows.append(tracelab_row(task.name, k, cached, uncached, turn.output_tokens,
                                     [("exec_command", round(s * 1000)) for s in turn.tool_seconds],
                                     start=start, end=clock, user=k == 0))
            clock += max(turn.tool_seconds, default=0.0) + 0.001
        clock += 30.0
    return write_jsonl(path, rows)


def test_calibrate_recovers_the_latency_model_and_distributions(tmp_path):
    trace = traces.load(synthetic_tracelab(tmp_path / "synthetic.jsonl"))
    timed = [r for r in trace.rounds if r.model_seconds is not None]
    result = fit.round_time_fit([r.uncached_tokens for r in timed], [r.output_tokens for r in timed],
                                [r.model_seconds for r in timed])
    # Stated tolerance: 5% on each rate and on the fixed time, with 50 ms noise on ~1,000 rounds.
    assert result.n == len(trace.rounds) > 500
    assert result.fixed_s == pytest.approx(FIXED_S, rel=0.05)
    assert result.prefill_tokens_per_s == pytest.approx(PREFILL_TPS, rel=0.05)
    assert result.decode_tokens_per_s == pytest.approx(DECODE_TPS, rel=0.05)
    assert result.rmse_s == pytest.approx(0.05, rel=0.15)  # the residuals are the noise
    preset = fitted_preset(trace.tasks, trace.rounds)
    # Stated tolerance: 15% on medians, 0.15 on log-sds (60 tasks, ~1,000 rounds; the clipping narrows them).
    assert preset.turns_median == pytest.approx(GENERATOR.turns_median, rel=0.15)
    assert preset.appended_median == pytest.approx(GENERATOR.appended_median, rel=0.15)
    assert preset.output_median == pytest.approx(GENERATOR.output_median, rel=0.15)
    assert preset.turns_sigma == pytest.approx(GENERATOR.turns_sigma, abs=0.15)
    assert preset.output_sigma == pytest.approx(GENERATOR.output_sigma, abs=0.15)
    assert preset.initial_prompt_tokens == GENERATOR.initial_prompt_tokens


def test_fit_keeps_coefficients_non_negative_and_checks_its_input():
    output = np.arange(1, 41) * 10.0
    result = fit.round_time_fit(np.zeros(40), output, 0.2 + output / 50)  # no uncached tokens: prefill unseen
    assert result.prefill_tokens_per_s == math.inf
    assert result.decode_tokens_per_s == pytest.approx(50) and result.fixed_s == pytest.approx(0.2)
    with pytest.raises(ValueError, match="at least 4"):
        fit.round_time_fit([1, 2, 3], [1, 2, 3], [1, 2, 3])


def assert_best_non_negative_fit(result, uncached, output, seconds) -> None:
    """The fit's coefficients satisfy the optimality conditions of non-negative least squares (KKT):
    the residual's gradient is zero along each positive coefficient and points up along each zero one."""
    X = np.column_stack([np.ones(len(seconds)), uncached, output])
    coef = np.array([result.fixed_s, 1 / result.prefill_tokens_per_s, 1 / result.decode_tokens_per_s])
    gradient = X.T @ (X @ coef - np.asarray(seconds))
    scale = np.abs(X).sum(axis=0) * np.abs(seconds).max()
    assert (coef >= 0).all()
    assert np.all(np.where(coef > 0, np.abs(gradient) <= 1e-9 * scale, gradient >= -1e-9 * scale)), (coef, gradient)


@pytest.mark.parametrize("truth", [(-0.3, 1 / 2000, 1 / 50), (0.5, -1 / 5000, 1 / 50), (0.5, 1 / 2000, -1 / 400)],
                         ids=["negative intercept", "negative prefill rate", "negative decode rate"])
def test_data_whose_unconstrained_fit_is_negative_still_gets_non_negative_terms(truth):
    rng = np.random.default_rng(7)
    uncached = rng.integers(100, 4000, 60).astype(float)
    output = rng.integers(20, 800, 60).astype(float)
    seconds = truth[0] + truth[1] * uncached + truth[2] * output + rng.normal(0, 0.01, 60)
    X = np.column_stack([np.ones(60), uncached, output])
    unconstrained, *_ = np.linalg.lstsq(X, seconds, rcond=None)
    assert (unconstrained < 0).sum() == 1  # the data really asks for a negative term
    result = fit.round_time_fit(uncached, output, seconds)
    assert result.fixed_s >= 0 and result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    negative = int(np.argmin(unconstrained))
    assert [result.fixed_s, 1 / result.prefill_tokens_per_s, 1 / result.decode_tokens_per_s][negative] == 0
    assert_best_non_negative_fit(result, uncached, output, seconds)


def test_tool_tail_and_mixture():
    assert fit.tool_tail([1, 1, 98, 100], 60) == (0.5, 0.99)
    rng = np.random.default_rng(0)
    values = np.concatenate([0.2 * np.exp(0.5 * rng.standard_normal(3000)), 50 * np.exp(0.5 * rng.standard_normal(1000))])
    (w1, m1, s1), (w2, m2, s2) = fit.lognormal_mixture(values, 2)
    assert (w1, w2) == (pytest.approx(0.75, abs=0.02), pytest.approx(0.25, abs=0.02))
    assert (m1, m2) == (pytest.approx(0.2, rel=0.05), pytest.approx(50, rel=0.05))


# The coding preset against TraceLab (docs/parameters.md "Calibration"): (figure, target, tolerance, measured).
CODING_SAMPLE = wl.generate("coding", seed=0, n_tasks=400)
CODING = figures(CODING_SAMPLE, traces.rounds_from_workloads(CODING_SAMPLE))
TARGETS = [
    ("median cached prefix per step", 119_000, 0.10, lambda f: f["prefix (cached) tokens per round"]["p50"]),
    ("median appended tokens per step", 875, 0.05, lambda f: f["appended (uncached) tokens per round"]["p50"]),
    ("median output tokens per step", 214, 0.05, lambda f: f["output tokens per round"]["p50"]),
    ("share of tool calls over 60 s", 0.04, 0.15, lambda f: f["calls_over_share"]),
    ("share of tool time in calls over 60 s", 0.85, 0.05, lambda f: f["time_over_share"]),
    ("median seconds per tool call", 0.3, 0.15, lambda f: f["seconds per client tool call"]["p50"]),
    ("median turns per task", 15, 0.10, lambda f: f["turns per task"]["p50"]),
]


@pytest.mark.parametrize(("figure", "target", "tolerance", "measure"), TARGETS, ids=[t[0] for t in TARGETS])
def test_coding_preset_within_tolerance_of_tracelab(figure, target, tolerance, measure):
    assert measure(CODING) == pytest.approx(target, rel=tolerance)


def test_coding_prefix_hit_rate_bound_and_decode_rate():
    # A perfect cache gives the upper bound of the hit rate: it must reach TraceLab's ~96% (misses are the engine's).
    assert 0.96 <= CODING["prefix_hit_rate"] <= 0.995
    # The flagship decode rate the testbed runs, measured from a run: within 10% of TraceLab's Codex median (61 tok/s).
    config = benchmark.BenchConfig(task_list=(wl.fixed(2, initial_prompt_tokens=1000, output_tokens=610),))
    record = benchmark.run_design_virtual("chained", latency.FLAGSHIP_TOKENS_PER_S, config)[0]
    decode_s = sum(p["decode"] for p in benchmark.turn_phases(record))
    assert 2 * 610 / decode_s == pytest.approx(61, rel=0.10)


def test_calibrate_writes_files_compare_reads(tmp_path, capsys):
    preset, profile = tmp_path / "preset.json", tmp_path / "latency.json"
    argv = ["calibrate", str(FIXTURE), "--baseline-tasks", "20", "--preset-out", str(preset), "--latency-out", str(profile)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "codex, 1 tasks, 9 rounds, 9 timed" in out and "Fit of model seconds per round (9 timed rounds)" in out
    model = profiles.load_latency(profile)
    # the run used sim-500 (500 tokens/s) on the engine's 15,000 tokens/s prefill
    assert model.cache_attention is None and model.decode_tokens_per_s == pytest.approx(500, rel=0.02)
    assert model.prefill_tokens_per_s == pytest.approx(15_000, rel=0.05)
    assert profiles.load_preset(preset).initial_prompt_tokens == 8039
    assert main(["compare", "--preset", str(preset), "--latency", str(profile), "--tasks", "1", "--turns", "2",
                 "--designs", "http", "chained", "--jobs", "1", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "compare.json").read_text())["table"]
    assert [(r["design"], r["decode_tps"]) for r in table] == [("http", model.decode_tokens_per_s), ("chained", model.decode_tokens_per_s)]


def test_compare_replays_a_trace_open_loop(tmp_path, capsys):
    rows = [tracelab_row("a", 0, 0, 2000, 50, [], start=0.0, end=1.0, user=True),
            tracelab_row("b", 0, 0, 2000, 50, [], start=100.0, end=101.0, user=True)]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert main(["compare", "--trace", str(path), "--designs", "chained", "--speeds", "1000", "--jobs", "1",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"2 tasks of trace {path} (tracelab-jsonl)" in out and "open-loop" in out
    tasks = json.loads((tmp_path / "compare_tasks.json").read_text())
    assert [t["task"] for t in tasks] == ["a", "b"]


def test_open_loop_starts_tasks_at_their_arrival():
    tasks = (wl.Workload("late", 0, wl.fixed(1, output_tokens=65).turns, arrival_s=50.0),
             wl.Workload("early", 0, wl.fixed(1, output_tokens=65).turns, arrival_s=0.0))
    records = benchmark.run_design_virtual("chained", 65.0, benchmark.BenchConfig(task_list=tasks))
    assert [r.workload for r in records] == ["late", "early"]
    assert records[0].started_at - records[1].started_at == pytest.approx(50.0)


def test_bad_preset_and_latency_files_are_named(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"turns_median": 5, "nope": 1}))
    assert main(["compare", "--preset", str(bad), "--out", str(tmp_path)]) == 2
    assert f"{bad}: nope: unknown field" in capsys.readouterr().err
    bad.write_text(json.dumps({"decode_tokens_per_s": -1}))
    assert main(["compare", "--latency", str(bad), "--out", str(tmp_path)]) == 2
    assert f"{bad}: decode_tokens_per_s: expected a finite number >= 0" in capsys.readouterr().err
    assert iso(0.0).endswith("Z")


def test_compare_runs_every_design_on_the_codex_rollout(tmp_path, capsys):
    assert main(["compare", "--trace", str(FIXTURE), "--speeds", "1000", "--jobs", "1", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "compare.json").read_text())["table"]
    assert [r["design"] for r in table] == list(benchmark.DESIGNS) and all(r["tasks"] == 1 for r in table)
    assert "1 tasks of trace" in capsys.readouterr().out
