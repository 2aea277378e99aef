"""`calibrate` on a real engine's `real_engine_calls.csv`: each bad call refused with its line and column, the
engine terms fitted to calls of a known engine, scored on held-out calls, printed, written as a profile."""

from __future__ import annotations

import csv
import json

import pytest

from prototype import profiles, traces
from prototype.__main__ import main as cli_main
from prototype.cli import calibrate
from prototype.traces import engine_calls
from tests.test_calibration import run_calibrate

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


def test_a_fit_on_the_first_calls_gives_back_the_engine_that_timed_them_and_scores_held_out_ones_it_never_saw(tmp_path) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path, slowdown_last=3, factor=1.25)  # the last three calls, the held-out ones, run 25% slower
    score = calibrate.engine_calls_score(engine_calls.read(path), 0.3)
    fitted, ttft, whole = score.fitted, score.ttft, score.whole
    assert (fitted.first_token.n, len(score.held)) == (7, 3)
    # Fitted on the first seven (exact), each held-out call is predicted at 1/1.25 of its time: 20% under.
    assert (ttft["median"], ttft["p90"], whole["median"]) == pytest.approx((20.0, 20.0, 20.0))
    assert (fitted.first_token.fixed_s, fitted.first_token.prefill_tokens_per_s, fitted.decode_tokens_per_s) == (
        pytest.approx(OVERHEAD_S), pytest.approx(PREFILL_TPS), pytest.approx(DECODE_TPS))


def test_a_call_that_prefilled_more_than_its_prompt_is_refused_with_its_line_and_column(tmp_path, capsys) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path, calls=(*CALLS[:2], ("chained", 100, 180, 5)))
    assert cli_main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.endswith("calls.csv:4: prefill_vllm: 180 prefilled of a 100-token prompt\n")
    with pytest.raises(traces.TraceError):
        engine_calls.read(path)


HEADER = "design,prompt_tokens,prefill_vllm,output_tokens,ttft_ms,decode_ms\r\n"
GOOD_ROW = "http,600,600,40,360,1950\r\n"


def test_the_reader_gives_each_call_as_written_in_seconds_and_its_sampled_tokens(tmp_path) -> None:
    path = tmp_path / "calls.csv"
    # One sampled token and no decode time, nothing prefilled in no time, a design name holding a quoted line break:
    # each is a call as the engine made it.
    path.write_bytes((HEADER + "http,600,600,1,360,0\r\n chained ,760,0,25,0,1200\r\n"
                      '"two\r\nlines",5,2,3,7.5,40\r\n').encode())
    assert engine_calls.read(path) == [
        engine_calls.EngineCall("http", 600, 600, 1, 0.36, 0.0), engine_calls.EngineCall("chained", 760, 0, 25, 0.0, 1.2),
        engine_calls.EngineCall("two\r\nlines", 5, 2, 3, 0.0075, 0.04)]
    # vLLM with forced decoding samples each item's framing besides the call's text: its decode time covers those.
    path.write_bytes(b"design,prompt_tokens,prefill_vllm,output_tokens,sampled_tokens,ttft_ms,decode_ms\r\n"
                     b"chained,600,600,40,47,360,1950\r\n")
    assert engine_calls.read(path) == [engine_calls.EngineCall("chained", 600, 600, 47, 0.36, 1.95)]


@pytest.mark.parametrize(("text", "where", "message"), [
    ("design,prompt_tokens,output_tokens,ttft_ms\r\n" + GOOD_ROW, "1: prefill_vllm",
     "missing column(s) prefill_vllm, decode_ms: expected design, prompt_tokens, prefill_vllm, output_tokens, ttft_ms, decode_ms"),
    (HEADER, "1", "the file holds no calls"),
    (HEADER + GOOD_ROW + "http,600.5,600,40,360,1950\r\n", "3: prompt_tokens", "expected an integer, got '600.5'"),
    (HEADER + GOOD_ROW + "http,600,600,,360,1950\r\n", "3: output_tokens", "expected an integer, got ''"),
    (HEADER + "http,600,600,40\r\n", "2: ttft_ms", "expected a number, got ''"),
    (HEADER.replace("output_tokens", "output_tokens,sampled_tokens") + "http,600,600,40,47.5,360,1950\r\n", "2: sampled_tokens",
     "expected an integer, got '47.5'"),
    (HEADER + "http,600,600,40,fast,1950\r\n", "2: ttft_ms", "expected a number, got 'fast'"),
    (HEADER + "http,600,600,40,inf,1950\r\n", "2: ttft_ms", "must be a finite number >= 0, got 'inf'"),
    (HEADER + "http,600,600,40,360,-1\r\n", "2: decode_ms", "must be a finite number >= 0, got '-1'"),
    (HEADER + "http,600,600,0,360,0\r\n", "2: output_tokens", "a call samples at least one token"),
    # The line is the file's, not the record's: the first record spans two lines.
    (HEADER + '"two\r\nlines",600,600,40,360,1950\r\n' + "http,100,180,5,360,1950\r\n", "4: prefill_vllm",
     "180 prefilled of a 100-token prompt"),
])
def test_each_bad_call_is_refused_with_its_file_line_column_and_reason(tmp_path, text, where, message) -> None:
    path = tmp_path / "calls.csv"
    path.write_bytes(text.encode())
    with pytest.raises(traces.TraceError) as refused:
        engine_calls.read(path)
    assert str(refused.value) == f"{path}:{where}: {message}"


def test_a_file_is_taken_for_a_real_engines_calls_only_when_its_header_has_every_column(tmp_path) -> None:
    exact, empty, binary = tmp_path / "exact.csv", tmp_path / "empty.csv", tmp_path / "binary.csv"
    exact.write_text(HEADER)  # exactly the columns read, none more
    empty.write_text("")
    binary.write_bytes(b"\xff\xfe" + HEADER.encode())
    absent = tmp_path / "absent.csv"
    assert [engine_calls.looks_like(path) for path in (exact, empty, binary, absent)] == [True, False, False, False]
    exact.write_text(HEADER.replace(",decode_ms", ""))
    assert not engine_calls.looks_like(exact)


def test_calibrate_fits_a_real_engines_calls_and_scores_the_last(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path, slowdown_last=2, factor=30.0)  # a fit that leaves residuals
    latency_file = tmp_path / "vllm.json"
    status, out, err = run_calibrate(capsys, path, "--latency-out", latency_file)
    assert (status, err) == (0, "")
    calls = engine_calls.read(str(path))
    result = calibrate.fit_engine_calls(calls)
    first = result.first_token
    score = calibrate.engine_calls_score(calls, 0.3)
    fitted, scored, ttft, whole = score.fitted, len(score.held), score.ttft, score.whole
    f = calibrate._fmt
    assert out.split("\n") == [
        f"{path}: {engine_calls.FORMAT}, 10 calls (http: 3, chained: 3, suspended: 4)",
        "",
        f"Fit of the engine's timings ({first.n} calls): time to first token = overhead + prefill computed / prefill rate; "
        "decode rate = tokens after the first / their time",
        f"  overhead       {first.fixed_s * 1000:9.1f} ms  (+/- {first.stderr[0] * 1000:.1f})   testbed: 10 ms",
        f"  prefill rate   {f(first.prefill_tokens_per_s):>9} tokens/s (s/token +/- {first.stderr[1]:.2g})   testbed: 15000",
        f"  decode rate    {f(result.decode_tokens_per_s):>9} tokens/s   testbed: 65 / 1000 / 4000",
        f"  in-sample      time to first token: rmse {first.rmse_s * 1000:.1f} ms, r2 {first.r2:.3f} (on the {first.n} calls "
        "it was fitted to)",
        f"  held out       the model refitted on the first {fitted.first_token.n} calls, scored on the last {scored}: "
        f"absolute error per call, time to first token median {f(ttft['median'])}%, p90 {f(ttft['p90'])}%; "
        f"whole call median {f(whole['median'])}%, p90 {f(whole['p90'])}%",
        f"wrote latency profile {latency_file}: the fit on all 10 calls",
        "",
    ]
    assert (fitted.first_token.n, scored) == (7, 3) and first.rmse_s * 1000 > 100 and first.stderr[0] * 1000 > 100
    assert profiles.load_latency(latency_file) == calibrate.engine_latency_model(result)
    assert json.loads(latency_file.read_text())["source"] == (
        f"python -m prototype calibrate {path} (fitted on all {first.n} real-engine calls, time to first token in-sample "
        f"rmse {first.rmse_s * 1000:.1f} ms)")


def test_a_real_engines_calls_too_few_or_without_decode_time(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path, CALLS[:4])
    status, out, _ = run_calibrate(capsys, path)
    assert status == 0 and "  in-sample " in out
    assert "  held out       not scored: a held-out score needs at least 5 timed rounds (4 to fit, 1 to score), got 4" in out
    write_calls(path, CALLS[:5])
    assert "  held out       the model refitted on the first 4 calls, scored on the last 1: " in run_calibrate(capsys, path)[1]
    # One token a call: no decode time to fit a rate to.
    write_calls(path, [(d, p, f, 1) for d, p, f, _ in CALLS[:4]])
    status, out, _ = run_calibrate(capsys, path)
    assert status == 0 and out.endswith("\nno fit: ") is False and "\nno fit: " in out
    assert (run_calibrate(capsys, path, "--latency-out", tmp_path / "l.json")[0], (tmp_path / "l.json").exists()) == (2, False)
    # Only the held-out calls have decode time: the fit on the first ones cannot be made.
    write_calls(path, [(d, p, f, 1) for d, p, f, _ in CALLS[:5]] + [CALLS[5]])
    status, out, _ = run_calibrate(capsys, path, "--holdout", 0.2)
    assert status == 0 and "\n  held out       not scored: " in out


def test_a_real_engines_calls_refuse_a_workload_preset_and_a_bad_file(tmp_path, capsys):
    path = tmp_path / "real_engine_calls.csv"
    write_calls(path)
    status, out, err = run_calibrate(capsys, path, "--preset-out", tmp_path / "p.json")
    assert (status, out, (tmp_path / "p.json").exists()) == (2, "", False)
    assert err == ("python -m prototype calibrate: error: --preset-out: a real engine's calls hold no tasks (no tool times, "
                   "no requests) to fit a workload preset to\n")
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], text[1].replace(",600,", ",-600,", 1)]) + "\n")
    status, out, err = run_calibrate(capsys, path)
    assert (status, out) == (2, "") and err.startswith(f"python -m prototype calibrate: error: {path}")
