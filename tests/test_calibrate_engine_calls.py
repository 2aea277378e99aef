"""`calibrate` on a real engine's calls (`experiments.real_engine`'s `real_engine_calls.csv`): the latency model's
engine terms fitted to the engine's own timings, scored on the calls it was not fitted to, written as a profile
`compare --latency` reads. The calls here are made from a known engine, so what the fit must give back is known."""

from __future__ import annotations

import csv

import pytest

from prototype import profiles, traces
from prototype.__main__ import main as cli_main
from prototype.engine import fit
from prototype.traces import engine_calls

OVERHEAD_S, PREFILL_TPS, DECODE_TPS = 0.060, 2_000.0, 20.0
# (design, prompt, prefill computed, output): http recomputes, chained hits the cache, v1 resumes a held request.
CALLS = (("http", 600, 600, 40), ("http", 760, 760, 25), ("http", 910, 910, 60),
         ("chained", 600, 600, 40), ("chained", 760, 192, 25), ("chained", 910, 182, 60),
         ("suspended", 600, 600, 40), ("suspended", 760, 121, 25), ("suspended", 910, 111, 60), ("suspended", 1000, 50, 10))
# Columns the experiment writes beside the ones calibrate reads: the reader must take the file as it is.
EXTRA = {"task": 0, "call": 1, "resumed": False, "routed_away": False, "sent_tokens": 0, "prefill_sim": 0,
         "prefix_hits_vllm": 0, "cached_vllm": 0, "ttft_sim_ms": 0.0, "decode_tps": 0.0, "kv_blocks": 3}


def write_calls(path, calls=CALLS, slowdown_last: int = 0, factor: float = 1.0) -> None:
    """Each call timed exactly by the known engine; the last `slowdown_last` calls `factor` times slower."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["design", *EXTRA, "prompt_tokens", "prefill_vllm", "output_tokens", "ttft_ms", "decode_ms"])
        writer.writeheader()
        for i, (design, prompt, prefill, output) in enumerate(calls):
            scale = factor if i >= len(calls) - slowdown_last else 1.0
            ttft = (OVERHEAD_S + prefill / PREFILL_TPS) * scale
            decode = (output - 1) / DECODE_TPS * scale
            writer.writerow({"design": design, **EXTRA, "prompt_tokens": prompt, "prefill_vllm": prefill,
                             "output_tokens": output, "ttft_ms": ttft * 1000, "decode_ms": decode * 1000})


def test_the_fit_gives_back_the_engine_that_timed_the_calls(tmp_path, capsys) -> None:
    path, out = tmp_path / "real_engine_calls.csv", tmp_path / "vllm.json"
    write_calls(path)
    assert engine_calls.looks_like(path)
    assert cli_main(["calibrate", str(path), "--latency-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "real-engine calls, 10 calls (http: 3, chained: 3, suspended: 4)" in printed
    assert "fitted on the first 7 calls, scored on the last 3" in printed
    model = profiles.load_latency(out)
    assert model.request_overhead == pytest.approx(OVERHEAD_S, abs=1e-9)
    assert model.prefill_tokens_per_s == pytest.approx(PREFILL_TPS, rel=1e-9)
    assert model.decode_tokens_per_s == pytest.approx(DECODE_TPS, rel=1e-9)
    assert model.cache_attention is None


def test_the_held_out_calls_are_scored_by_a_fit_that_never_saw_them(tmp_path) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path, slowdown_last=3, factor=1.25)  # the last three calls, the held-out ones, run 25% slower
    from prototype.cli import calibrate

    fitted, scored, ttft, whole = calibrate.engine_calls_score(engine_calls.read(path), 0.3)
    assert (fitted.first_token.n, scored) == (7, 3)
    # Fitted on the first seven (exact), each held-out call is predicted at 1/1.25 of its time: 20% under.
    assert ttft["median"] == pytest.approx(20.0) and ttft["p90"] == pytest.approx(20.0)
    assert whole["median"] == pytest.approx(20.0)
    assert fitted.decode_tokens_per_s == pytest.approx(DECODE_TPS)


def test_a_call_that_prefilled_more_than_its_prompt_is_refused_with_its_line_and_column(tmp_path, capsys) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path, calls=(*CALLS[:2], ("chained", 100, 180, 5)))
    assert cli_main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.endswith("calls.csv:4: prefill_vllm: 180 prefilled of a 100-token prompt\n")
    with pytest.raises(traces.TraceError):
        engine_calls.read(path)


def test_a_workload_preset_is_refused_for_calls_that_hold_no_tasks(tmp_path, capsys) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path)
    assert cli_main(["calibrate", str(path), "--preset-out", str(tmp_path / "p.json")]) == 2
    assert "a real engine's calls hold no tasks" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_the_decode_rate_pools_every_token_after_a_calls_first() -> None:
    result = fit.engine_timing_fit([100, 200, 300], [0.11, 0.16, 0.21], [1, 11, 21], [0.0, 1.0, 3.0])
    assert result.decode_tokens_per_s == pytest.approx(30 / 4.0)  # 0 + 10 + 20 tokens over 4 s
    assert result.first_token.fixed_s == pytest.approx(0.06) and result.first_token.prefill_tokens_per_s == pytest.approx(2000)
    assert float(result.call_seconds(100, 21)) == pytest.approx(0.11 + 20 / 7.5)
    with pytest.raises(ValueError, match="decode rate"):
        fit.engine_timing_fit([100, 200, 300], [0.1, 0.2, 0.3], [1, 1, 1], [0.0, 0.0, 0.0])
