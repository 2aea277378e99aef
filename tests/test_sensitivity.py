"""experiments.sensitivity: gains and TTFT with intervals over the tasks, drivers ranked only where SALib's intervals
separate, orderings decided on paired intervals, and a tiny run end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import sensitivity as s

SPEEDS = (65.0, 1000.0, 4000.0)


def samples(e2e: dict, *, ttft: dict | None = None, sent: dict | None = None, turns=(2.0, 4.0, 6.0, 8.0)) -> dict:
    """Per-task figures: e2e[(design, speed)] the tasks' end-to-end times, ttft their TTFT sums, sent their bytes."""
    out = {}
    for point, times in e2e.items():
        out[point] = {"e2e": np.asarray(times, dtype=float), "turns": np.asarray(turns, dtype=float),
                      "ttft_sum": np.asarray((ttft or {}).get(point, np.asarray(turns) * 0.5), dtype=float),
                      "ttft_n": np.asarray(turns, dtype=float),
                      "sent": np.asarray((sent or {}).get(point, np.asarray(turns) * 1000.0), dtype=float)}
    return out


HTTP_TIMES = (10.0, 20.0, 40.0, 80.0)


def every_point(times_of) -> dict:
    return {(d, tps): times_of(d, tps) for d in s.DESIGNS for tps in SPEEDS}


# --- the figures ---------------------------------------------------------------------------------------------------


def test_a_gain_is_one_minus_design_over_baseline_on_the_means_and_ttft_the_mean_turn_over_all_the_tasks_turns():
    run = samples(every_point(lambda d, tps: [t / 2 for t in HTTP_TIMES] if d != s.HTTP else HTTP_TIMES))
    gain = s.Headline("g", "g", "%", s.gain(s.CHAINED, s.HTTP, 1000.0), 100)
    assert (gain.value(run), gain.estimate(run).low, gain.estimate(run).high) == (0.5, 0.5, 0.5)  # every resample: +50%
    # On the means, not the mean of per-task gains: 10 s saved on a 20 s task and nothing on an 80 s one is 1 - 70/80.
    run = samples(every_point(lambda d, tps: [10.0, 80.0] if d != s.HTTP else [20.0, 80.0]), turns=(1.0, 1.0))
    assert s.Headline("g", "g", "%", s.gain(s.CHAINED, s.HTTP, 65.0)).value(run) == pytest.approx(1 - 90 / 100)
    # Slower is a negative gain.
    assert s.Headline("g", "g", "%", s.gain(s.HTTP, s.CHAINED, 65.0)).value(run) == pytest.approx(1 - 100 / 90)
    # Two tasks: one of 1 turn at 0.1 s, one of 3 turns at 0.5 s: the mean turn is 0.4 s, not the mean of the tasks' means.
    run = samples(every_point(lambda d, tps: (1.0, 1.0)), ttft={(s.HTTP, 1000.0): (0.1, 1.5)}, turns=(1.0, 3.0))
    assert s.Headline("t", "t", "ms", s.ttft_mean(s.HTTP, 1000.0)).value(run) == pytest.approx(400.0)
    # chained's turns at the default 0.5 s: 1 - 0.5 / 0.4.
    assert s.Headline("c", "c", "%", s.ttft_cut(1000.0), 100).value(run) == pytest.approx(1 - 0.5 / 0.4)
    # 1,000 bytes a turn: all the bytes over all the turns.
    assert s.Headline("u", "u", "kB", s.upload(s.HTTP, 1000.0)).value(run) == pytest.approx(1.0)


# --- the drivers ----------------------------------------------------------------------------------------------------

NAMES = ["t_fixed_pre", "f_ws", "rtt", "prefill_rate"]


def morris_drivers(output, units: int = 12, method=s.MORRIS, names=NAMES, seed=3):
    """The drivers of `output(u)`, u each parameter's place in its range (0 to 1), over a global design (Morris's)."""
    design = s.global_design(names, method, units, seed=seed)
    bounds = np.array(s.problem(names)["bounds"])
    u = (design - bounds[:, 0]) / (bounds[:, 1] - bounds[:, 0])
    importance = s.indices(names, method, design, np.array([output(row) for row in u]))
    return s.driver_estimates(names, importance, method, units)


def test_drivers_list_the_parameters_in_decreasing_order_of_their_index_and_tie_those_whose_intervals_overlap():
    # A linear output: every elementary effect of a parameter is its coefficient, so mu* is exactly it and SALib's
    # interval has no width: f_ws (3) > rtt (2) > t_fixed_pre (1); prefill_rate moves nothing and is left out.
    estimates = morris_drivers(lambda u: 1 * u[0] + 3 * u[1] + 2 * u[2])
    assert {n: round(e.value, 9) for n, e in estimates.items()} == {"f_ws": 3.0, "rtt": 2.0, "t_fixed_pre": 1.0}
    assert s.drivers(estimates) == "f_ws 3.0 [3.0, 3.0] > rtt 2.0 [2.0, 2.0] > t_fixed_pre 1.0 [1.0, 1.0]"
    assert (s.top_driver(estimates), s.drivers(estimates, top=1)) == ("f_ws", "f_ws 3.0 [3.0, 3.0]")
    assert s.drivers({}) == "none" and s.top_driver({}) == "none"
    # Equal coefficients: the same mu*, so neither is ranked above the other.
    estimates = morris_drivers(lambda u: 2 * u[0] + 2 * u[1] + 0.5 * u[2])
    assert s.drivers(estimates) == "tied: t_fixed_pre 2.0 [2.0, 2.0] ~ f_ws 2.0 [2.0, 2.0] > rtt 0.50 [0.50, 0.50]"
    assert s.top_driver(estimates) == "tied (t_fixed_pre ~ f_ws)"
    # An interaction spreads each parameter's effects: its mu* gets an interval, and one that overlaps the next
    # parameter's ties them even though their mu* differ.
    estimates = morris_drivers(lambda u: 4 * u[0] * u[1] + 1.2 * u[2])
    assert estimates["t_fixed_pre"].low < estimates["t_fixed_pre"].value < estimates["t_fixed_pre"].high
    ranks = s.uncertainty.ranking(estimates)
    assert ranks[0] == sorted(ranks[0], key=lambda n: -estimates[n].value)
    assert all(s.uncertainty.separated(estimates[a], estimates[b]) for first, later in zip(ranks, ranks[1:])
               for a in first for b in later)


def test_sobol_drivers_rank_by_the_total_index_with_its_interval():
    names = NAMES[:3]
    estimates = morris_drivers(lambda u: 4 * u[1] + 1 * u[0], 256, s.SOBOL, names, seed=0)
    assert list(estimates) == ["t_fixed_pre", "f_ws"]  # rtt moves nothing
    assert estimates["f_ws"].value == pytest.approx(16 / 17, abs=0.05) and estimates["f_ws"].n == 256
    assert s.top_driver(estimates) == "f_ws"
    assert s.units_of(names, s.SOBOL) == (5, "base samples") and s.units_of(names, s.MORRIS) == (4, "trajectories")


# --- the orderings, decided on intervals ----------------------------------------------------------------------------


def decide(name: str, run: dict) -> str:
    (claim,) = [c for c in s.claims(SPEEDS) if c.name == name]
    return claim.decide(run)


FASTER = "chained faster than http at every speed"
V1 = "v1 at least as fast as v2 at every speed"


def test_each_ordering_holds_is_broken_or_is_not_separated_as_the_tasks_say_paired_on_the_same_tasks():
    faster = samples(every_point(lambda d, tps: [t * (0.8 if d != s.HTTP else 1.0) for t in HTTP_TIMES]))
    assert decide(FASTER, faster) == s.YES
    # Slower on every task at one speed: broken, whatever the other speeds say.
    slower = samples(every_point(lambda d, tps: [t * (1.1 if d == s.CHAINED and tps == 65.0 else 0.8 if d != s.HTTP else 1.0)
                                                 for t in HTTP_TIMES]))
    assert decide(FASTER, slower) == s.NO
    # Faster on the long tasks, slower on the short ones: the gain's interval spans 0.
    mixed = samples(every_point(lambda d, tps: [t * f for t, f in zip(HTTP_TIMES, (1.5, 1.2, 1.0, 0.9))] if d == s.CHAINED else HTTP_TIMES))
    assert decide(FASTER, mixed) == s.NOT_SEPARATED
    # v1 at least as fast as v2 holds when equal and is broken when slower.
    equal = samples(every_point(lambda d, tps: HTTP_TIMES))
    assert decide(V1, equal) == s.YES  # the same time: at least as fast
    assert decide(FASTER, equal) == s.NO  # and not faster
    slower = samples(every_point(lambda d, tps: [t * 1.05 for t in HTTP_TIMES] if d == s.SUSPENDED else HTTP_TIMES))
    assert decide(V1, slower) == s.NO
    mixed = samples(every_point(lambda d, tps: [t * f for t, f in zip(HTTP_TIMES, (0.9, 0.95, 1.02, 1.05))] if d == s.SUSPENDED
                                else HTTP_TIMES))
    assert decide(V1, mixed) == s.NOT_SEPARATED
    # TTFT and upload compare the designs on the same tasks. Each task's TTFT differs a lot from the next, but every
    # design keeps the order on every task: paired, it holds.
    spread = np.array([1.0, 5.0, 20.0, 60.0])
    ttft = {(s.HTTP, 1000.0): spread * 1.2, (s.CHAINED, 1000.0): spread * 1.0, (s.SUSPENDED, 1000.0): spread * 0.9}
    assert decide("TTFT v1 <= v2 < http @1000", samples(every_point(lambda d, tps: HTTP_TIMES), ttft=ttft)) == s.YES
    ttft[(s.SUSPENDED, 1000.0)] = spread * 1.1
    assert decide("TTFT v1 <= v2 < http @1000", samples(every_point(lambda d, tps: HTTP_TIMES), ttft=ttft)) == s.NO
    sent = {(d, 1000.0): np.array([2.0, 4.0, 6.0, 8.0]) * k for d, k in ((s.HTTP, 3000), (s.CHAINED, 1000), (s.SUSPENDED, 400))}
    assert decide("upload v1 < v2 < http", samples(every_point(lambda d, tps: HTTP_TIMES), sent=sent)) == s.YES


def test_an_ordering_nothing_moves_or_the_model_builds_in_is_labelled_by_construction():
    runs = [samples(every_point(lambda d, tps, k=k: [t * (0.8 + 0.01 * k if d != s.HTTP else 1.0) for t in HTTP_TIMES]))
            for k in range(3)]
    by_name = {c.name: c for c in s.claims(SPEEDS)}
    assert s.by_construction(by_name["upload v1 < v2 < http"], runs) == "no swept parameter moves it"
    assert s.by_construction(by_name[FASTER], runs) == ""  # its gains move from run to run: evidence
    assert s.by_construction(by_name["chained's gain grows with decode speed"], runs).startswith("a per-turn cost")
    rows = {r["claim"]: r for r in s.check_claims(SPEEDS, ["", "x low", "x high"], runs)}
    assert rows["upload v1 < v2 < http"]["evidence"] == "no: by construction (no swept parameter moves it)"
    assert (rows[FASTER]["holds in"], rows[FASTER]["evidence"]) == ("3 of 3 runs", "yes")
    broken = runs + [samples(every_point(lambda d, tps: [t * 1.1 if d == s.CHAINED else t for t in HTTP_TIMES]))]
    row = {r["claim"]: r for r in s.check_claims(SPEEDS, ["", "x low", "x high", "y low"], broken)}[FASTER]
    assert (row["holds in"], row["broken"], row["broken by (one at a time)"]) == ("3 of 4 runs", 1, "y low")


def test_the_range_over_the_global_design_is_its_middle_ninety_percent_with_intervals_over_its_units():
    values = [float(v) for v in range(40)]
    low, high = s.global_range(values, 4, "trajectories")
    assert (low.value, high.value) == (np.percentile(values, 5), np.percentile(values, 95))
    assert low.n == high.n == 10 and low.of == "trajectories"
    assert low.low < low.value < low.high and high.low < high.value < high.high


# --- a run ----------------------------------------------------------------------------------------------------------


def test_a_tiny_run_sweeps_each_range_names_its_drivers_and_says_it_is_not_for_conclusions(capsys, results_in_tmp):
    result = s.main(["--tasks", "2", "--turns", "2", "--speeds", "1000", "--params", "t_fixed_pre", "f_ws",
                     "--trajectories", "2", "--in-process", "--no-cache"])
    oat = result["oat"]
    assert list(oat) == ["default", "t_fixed_pre low", "t_fixed_pre high", "f_ws low", "f_ws high"]
    ttft_http = "TTFT http @1000"
    # http pays the whole fixed pre-inference cost on every turn, and none of it depends on f_ws: 100 to 400 ms moves
    # every turn's TTFT, and so their mean, by exactly 300 ms.
    assert oat["t_fixed_pre high"][ttft_http] - oat["t_fixed_pre low"][ttft_http] == pytest.approx(300.0, abs=1e-6)
    assert oat["f_ws low"][ttft_http] == oat["f_ws high"][ttft_http] == oat["default"][ttft_http]
    # A chained turn served from the connection cache pays f_ws of it: a higher f_ws, a later first token.
    assert oat["f_ws low"]["TTFT chained @1000"] < oat["default"]["TTFT chained @1000"] < oat["f_ws high"]["TTFT chained @1000"]
    assert len({v["upload http"] for v in oat.values()}) == 1  # no API cost changes what a design sends
    assert len(result["global"]) == 2 * (2 + 1)  # Morris: r (k + 1) runs
    assert result["indices"][ttft_http]["mu_star"][1] == 0
    assert result["indices"][ttft_http]["mu_star"][0] == pytest.approx(0.3 * 1000)  # ms per full range of t_fixed_pre
    default = result["estimates"][0][ttft_http]
    assert default.n == 2 and default.low <= default.value <= default.high
    rows = {r["conclusion"]: r for r in result["table"]}
    assert rows[ttft_http]["drivers (mu_star)"] == "t_fixed_pre 300 [300, 300]"
    assert (rows["upload http"]["drivers (mu_star)"], rows["upload http"]["one-at-a-time"]) == (
        "none", "the same in every run: no swept parameter moves it")
    claims = {c["claim"]: c for c in result["claims"]}
    assert (claims["upload v1 < v2 < http"]["evidence"], claims["upload v1 < v2 < http"]["holds in"]) == (
        "no: by construction (no swept parameter moves it)", "11 of 11 runs")
    folder = result["folder"]
    assert (folder / "tornado.png").stat().st_size > 10_000
    assert (folder / "sensitivity.csv").read_text().startswith("conclusion,unit,default")
    section = json.loads((folder / "sensitivity.json").read_text())["headline"]
    assert section["name"] == "sensitivity_seed0"
    assert section["figures"]["ttft.http.1000.drivers"] == {"text": "t_fixed_pre 300 [300, 300]"}
    assert section["figures"]["ttft.http.1000.default"]["value"] == pytest.approx(oat["default"][ttft_http])
    assert [r[0] for r in section["tables"]["claims"]["rows"]] == list(claims)
    printed = capsys.readouterr().out
    assert "The orderings, decided on intervals" in printed and "t_fixed_pre" in printed
    assert "its figures show the machinery, not conclusions" in printed and result["small"] is True

