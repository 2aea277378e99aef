"""`calibrate`'s scored prediction: timed rounds grouped by provider and model, fitted on each group's first
rounds, scored on its last ones, printed and written per group."""

from __future__ import annotations

import attrs
import pytest

from prototype import profiles, traces
from prototype.__main__ import main as cli_main
from prototype.cli import calibrate
from tests.test_calibration import FIT, rnd, run_calibrate, tracelab
from tests.test_traces import tracelab_row, write_jsonl

# (provider, model, fixed s, prefill tokens/s, decode tokens/s): two groups no single model fits.
GROUPS = (("claude", "claude-sonnet-4", 1.0, 5_000.0, 50.0), ("codex", "gpt-5.4", 0.3, 20_000.0, 100.0))
APPENDED = (6000, 500, 3000, 800, 1500, 200, 2500, 900, 4000, 300)
OUTPUT = (100, 400, 50, 250, 600, 80, 300, 150, 500, 60)
HELD_OUT_SLOWDOWN = 1.10  # the last 3 rounds of each group take 10% longer than the model says


def mixed_trace(path) -> None:
    """One session per group, ten rounds each, interleaved in time; each round's model time follows its group's
    model exactly, except the last three of each group, 10% slower."""
    rows = []
    for g, (provider, model, fixed, prefill, decode) in enumerate(GROUPS):
        prefix, clock = 0, 50.0 * g
        for k, (appended, output) in enumerate(zip(APPENDED, OUTPUT)):
            seconds = fixed + appended / prefill + output / decode
            if k >= 7:
                seconds *= HELD_OUT_SLOWDOWN
            tools = [] if k == len(APPENDED) - 1 else [("Bash", 1000)]
            rows.append({**tracelab_row(f"{provider}-session", k, prefix, appended, output, tools, reasoning=output // 4,
                                        start=clock, end=clock + seconds, user=k == 0), "provider": provider, "model": model})
            prefix += appended + output
            clock += seconds + 100.0
    write_jsonl(path, sorted(rows, key=lambda r: r["timing_events"][0]["timestamp"]))


def test_timed_rounds_are_grouped_by_provider_and_model_in_time_order():
    late, early, other = (rnd("a", 0, 0, 1, 1, start=5.0, seconds=1.0, group="x/y"),
                          rnd("a", 1, 0, 1, 1, start=1.0, seconds=1.0, group="x/y"), rnd("b", 0, 0, 1, 1, start=3.0, seconds=1.0))
    groups = calibrate.timed_groups([late, other, early])
    assert (groups, list(groups)) == ({"x/y": [early, late], "all rounds": [other]}, ["x/y", "all rounds"])


def test_held_out_scores_print_per_group(capsys):
    score = calibrate.GroupScore("codex/gpt-5.4", FIT, 4, {"median": 1.234, "p90": 150.0, "zero": 0})
    calibrate.print_score(score)
    calibrate.print_score(attrs.evolve(score, errors={"median": 1.0, "p90": 2.0, "zero": 2}))
    calibrate.print_scores([score, attrs.evolve(score, group="all rounds", held_out=1)])
    assert capsys.readouterr().out.split("\n") == [
        "  held out       the model refitted on the first 12 rounds, scored on the last 4: absolute error per round "
        "median 1.23%, p90 150%",
        "  held out       the model refitted on the first 12 rounds, scored on the last 4: absolute error per round "
        "median 1%, p90 2% (2 round(s) of 0 s left out)",
        "",
        f"{'held-out error per round':<40} {'fitted':>7} {'scored':>7} {'median':>8} {'p90':>8}",
        f"  {'codex/gpt-5.4':<38} {12:>7} {4:>7} {'1.23':>7}% {'150':>7}%",
        f"  {'all rounds':<38} {12:>7} {1:>7} {'1.23':>7}% {'150':>7}%",
        "",
    ]


def test_each_group_is_fitted_on_its_own_scored_on_its_last_rounds_printed_and_written_a_profile_each(tmp_path, capsys) -> None:
    path = tmp_path / "mixed.jsonl"
    mixed_trace(path)
    trace = traces.load(path)
    timed = [r for r in trace.rounds if r.model_seconds is not None]
    groups = calibrate.timed_groups(timed)
    assert list(groups) == ["claude/claude-sonnet-4", "codex/gpt-5.4"]
    for (provider, model, fixed, prefill, decode), (name, rounds) in zip(GROUPS, groups.items()):
        assert (name, [r.turn for r in rounds]) == (f"{provider}/{model}", list(range(10)))
        score = calibrate.held_out_score(name, rounds, 0.3)
        # The first seven rounds follow the group's model exactly: the fit recovers it.
        assert score.fitted.n == 7 and score.held_out == 3
        assert (score.fitted.decode_tokens_per_s, score.fitted.prefill_tokens_per_s) == pytest.approx((decode, prefill), rel=1e-4)
        assert score.fitted.fixed_s == pytest.approx(fixed, abs=1e-4)
        # The last three are 10% slower than the model: 1 - 1/1.1 of their observed time is the error.
        assert (score.errors["median"], score.errors["p90"]) == pytest.approx((100 * (1 - 1 / HELD_OUT_SLOWDOWN),) * 2, abs=0.01)
    # One fit over both groups reports a decode rate neither group has.
    assert all(abs(calibrate.fit_rounds(timed).decode_tokens_per_s - decode) > 0.1 * decode for *_, decode in GROUPS)
    out = tmp_path / "profile.json"
    assert cli_main(["calibrate", str(path), "--baseline-tasks", "20", "--latency-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 providers and models in the trace" in printed
    assert "Fit of model seconds per round (claude/claude-sonnet-4, 20 timed rounds)" not in printed
    assert "Fit of model seconds per round (claude/claude-sonnet-4, 10 timed rounds)" in printed
    assert printed.count("refitted on the first 7 rounds, scored on the last 3") == 2 and "held-out error per round" in printed
    claude = profiles.load_latency(tmp_path / "profile.claude-claude-sonnet-4.json")
    codex = profiles.load_latency(tmp_path / "profile.codex-gpt-5.4.json")
    # Fitted on all ten rounds (the last three slower): each profile stays near its own group's decode rate.
    assert (claude.decode_tokens_per_s, codex.decode_tokens_per_s) == pytest.approx((50.0, 100.0), rel=0.15) and not out.exists()


def test_calibrate_fits_each_group_on_its_own_and_writes_a_profile_each(tmp_path, capsys):
    # The group too small to fit comes first: the groups after it are still fitted.
    path = tracelab(tmp_path / "t.jsonl", [("codex", "mini", 3), ("claude", "sonnet", 5), ("codex", "gpt", 4)])
    status, out, err = run_calibrate(capsys, path, "--baseline-tasks", 2, "--latency-out", tmp_path / "p.json")
    assert (status, err) == (0, "")
    assert ("\n3 providers and models in the trace: each is fitted on its own rounds "
            "(codex/mini: 3, claude/sonnet: 5, codex/gpt: 4)\n") in out
    assert "Fit of model seconds per round (claude/sonnet, 5 timed rounds)" in out
    assert "Fit of model seconds per round (codex/gpt, 4 timed rounds)" in out
    # Three rounds would give the three coefficients exactly (rmse 0): no fit, saying why.
    assert ("\nno fit for codex/mini: 3 timed round(s), fewer than 4 (a fit of 3 coefficients on fewer would interpolate "
            "them, its residuals zero)\n") in out
    assert out.count("  held out       the model refitted") == 1
    # Four rounds are fitted, but too few to hold any out besides: flagged, not scored.
    assert ("  held out       not scored: 4 timed rounds, fewer than 5 (4 to fit, 1 to score): the fit's in-sample "
            "residuals say little of new rounds\n") in out
    assert "held-out error per round" not in out  # one score: no table
    assert out.endswith(f"wrote latency profile {tmp_path / 'p.claude-sonnet.json'}: the fit on all 5 rounds (claude/sonnet)\n"
                        f"wrote latency profile {tmp_path / 'p.codex-gpt.json'}: the fit on all 4 rounds (codex/gpt)\n")
    assert not (tmp_path / "p.json").exists()

