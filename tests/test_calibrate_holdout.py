"""`calibrate`'s scored prediction: a fit on each provider and model's first rounds, scored on its last ones, on a
mixed TraceLab fixture made here (two groups with different latency models)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from prototype import profiles, traces
from prototype.__main__ import main as cli_main
from prototype.cli import calibrate
from prototype.engine import fit

# (provider, model, fixed s, prefill tokens/s, decode tokens/s): two groups no single model fits.
GROUPS = (("claude", "claude-sonnet-4", 1.0, 5_000.0, 50.0), ("codex", "gpt-5.4", 0.3, 20_000.0, 100.0))
APPENDED = (6000, 500, 3000, 800, 1500, 200, 2500, 900, 4000, 300)
OUTPUT = (100, 400, 50, 250, 600, 80, 300, 150, 500, 60)
HELD_OUT_SLOWDOWN = 1.10  # the last 3 rounds of each group take 10% longer than the model says


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(1_780_000_000 + seconds, UTC).isoformat().replace("+00:00", "Z")


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
            start = clock
            rows.append({
                "session_id": f"{provider}-session", "round_index": k, "provider": provider, "model": model,
                "prefix_tokens": prefix, "newly_append_tokens": appended, "output_tokens": output,
                "reasoning_output_tokens": output // 4,
                "first_input_event_type": "user_message" if k == 0 else "tool_result",
                "tools": [] if k == len(APPENDED) - 1 else [{"tool_name": "Bash", "tool_wall_latency_ms": 1000}],
                "timing_events": [{"event_type": "user_message" if k == 0 else "tool_result", "timestamp": _stamp(start)},
                                  {"event_type": "text", "timestamp": _stamp(start + seconds)}],
            })
            prefix += appended + output
            clock = start + seconds + 100.0
    rows.sort(key=lambda r: r["timing_events"][0]["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_holdout_split_fits_the_first_rounds_and_scores_the_last() -> None:
    assert fit.holdout_split(10, 0.3) == (range(0, 7), range(7, 10))
    assert fit.holdout_split(5, 0.3) == (range(0, 4), range(4, 5))
    # At least 4 fitted: one more than the fit's 3 coefficients, so the fit scored is no exact interpolation.
    assert fit.holdout_split(6, 0.9) == (range(0, 4), range(4, 6))
    with pytest.raises(ValueError, match=r"at least 5 timed rounds \(4 to fit, 1 to score\), got 4"):
        fit.holdout_split(4, 0.3)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        fit.holdout_split(10, 1.0)


def test_percentage_errors_per_round() -> None:
    errors = fit.percentage_errors([1.1, 2.0, 0.5, 3.0], [1.0, 2.5, 0.5, 0.0])
    assert errors["n"] == 3 and errors["zero"] == 1
    assert errors["median"] == pytest.approx(10.0)
    assert errors["p90"] == pytest.approx(18.0)  # 0, 10, 20: p90 interpolates to 18


def test_each_group_is_fitted_on_its_own_and_scored_on_its_last_rounds(tmp_path) -> None:
    path = tmp_path / "mixed.jsonl"
    mixed_trace(path)
    trace = traces.load(path)
    timed = [r for r in trace.rounds if r.model_seconds is not None]
    groups = calibrate.timed_groups(timed)
    assert list(groups) == ["claude/claude-sonnet-4", "codex/gpt-5.4"]
    for (provider, model, fixed, prefill, decode), (name, rounds) in zip(GROUPS, groups.items()):
        assert name == f"{provider}/{model}"
        assert len(rounds) == 10 and [r.turn for r in rounds] == list(range(10))
        score = calibrate.held_out_score(name, rounds, 0.3)
        # The first seven rounds follow the group's model exactly: the fit recovers it.
        assert score.fitted.n == 7 and score.held_out == 3
        assert score.fitted.decode_tokens_per_s == pytest.approx(decode, rel=1e-4)
        assert score.fitted.prefill_tokens_per_s == pytest.approx(prefill, rel=1e-4)
        assert score.fitted.fixed_s == pytest.approx(fixed, abs=1e-4)
        # The last three are 10% slower than the model: 1 - 1/1.1 of their observed time is the error.
        assert score.errors["median"] == pytest.approx(100 * (1 - 1 / HELD_OUT_SLOWDOWN), abs=0.01)
        assert score.errors["p90"] == pytest.approx(100 * (1 - 1 / HELD_OUT_SLOWDOWN), abs=0.01)
    # One fit over both groups reports a decode rate neither group has.
    pooled = calibrate.fit_rounds(timed)
    assert all(abs(pooled.decode_tokens_per_s - decode) > 0.1 * decode for *_, decode in GROUPS)


def test_calibrate_prints_held_out_error_per_group_and_writes_a_profile_each(tmp_path, capsys) -> None:
    path = tmp_path / "mixed.jsonl"
    mixed_trace(path)
    out = tmp_path / "profile.json"
    assert cli_main(["calibrate", str(path), "--baseline-tasks", "20", "--latency-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 providers and models in the trace" in printed
    assert "Fit of model seconds per round (claude/claude-sonnet-4, 20 timed rounds)" not in printed
    assert "Fit of model seconds per round (claude/claude-sonnet-4, 10 timed rounds)" in printed
    assert printed.count("refitted on the first 7 rounds, scored on the last 3") == 2
    assert "held-out error per round" in printed
    claude = profiles.load_latency(tmp_path / "profile.claude-claude-sonnet-4.json")
    codex = profiles.load_latency(tmp_path / "profile.codex-gpt-5.4.json")
    # Fitted on all ten rounds (the last three slower): each profile stays near its own group's decode rate.
    assert claude.decode_tokens_per_s == pytest.approx(50.0, rel=0.15)
    assert codex.decode_tokens_per_s == pytest.approx(100.0, rel=0.15)
    assert not out.exists()
    with pytest.raises(SystemExit):
        cli_main(["calibrate", str(path), "--baseline-tasks", "20", "--holdout", "1.5"])
    assert "argument --holdout: the held-out share must be in (0, 1), got 1.5" in capsys.readouterr().err


def test_a_codex_rollout_names_its_model_from_turn_context(tmp_path) -> None:
    from test_traces import codex_rollout, rollout_line

    lines = codex_rollout()
    lines.insert(4, rollout_line(0.3, "turn_context", cwd="/x", model="gpt-5.4"))
    path = tmp_path / "rollout-2026-11-30T00-00-00-sess-1.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.group for r in traces.load(path).rounds] == ["codex/gpt-5.4", "codex/gpt-5.4"]
    assert [r.group for r in traces.load(tmp_path).rounds] == ["codex/gpt-5.4"] * 2  # a sessions folder too
