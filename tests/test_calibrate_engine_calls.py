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
    assert "refitted on the first 7 calls, scored on the last 3" in printed
    assert "wrote latency profile" in printed and "the fit on all 10 calls" in printed
    model = profiles.load_latency(out)
    assert model.request_overhead == pytest.approx(OVERHEAD_S, abs=1e-9)
    assert model.prefill_tokens_per_s == pytest.approx(PREFILL_TPS, rel=1e-9)
    assert model.decode_tokens_per_s == pytest.approx(DECODE_TPS, rel=1e-9)
    assert model.cache_attention is None


def test_the_held_out_calls_are_scored_by_a_fit_that_never_saw_them(tmp_path) -> None:
    path = tmp_path / "calls.csv"
    write_calls(path, slowdown_last=3, factor=1.25)  # the last three calls, the held-out ones, run 25% slower
    from prototype.cli import calibrate

    score = calibrate.engine_calls_score(engine_calls.read(path), 0.3)
    fitted, ttft, whole = score.fitted, score.ttft, score.whole
    assert (fitted.first_token.n, len(score.held)) == (7, 3)
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
    result = fit.engine_timing_fit([100, 200, 300, 400], [0.11, 0.16, 0.21, 0.26], [1, 11, 21, 1], [0.0, 1.0, 3.0, 0.0])
    assert result.decode_tokens_per_s == pytest.approx(30 / 4.0)  # 0 + 10 + 20 + 0 tokens over 4 s
    assert result.first_token.fixed_s == pytest.approx(0.06) and result.first_token.prefill_tokens_per_s == pytest.approx(2000)
    assert float(result.call_seconds(100, 21)) == pytest.approx(0.11 + 20 / 7.5)
    with pytest.raises(ValueError, match="decode rate"):
        fit.engine_timing_fit([100, 200, 300, 400], [0.1, 0.2, 0.3, 0.4], [1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0])


HEADER = "design,prompt_tokens,prefill_vllm,output_tokens,ttft_ms,decode_ms\r\n"
GOOD_ROW = "http,600,600,40,360,1950\r\n"


def test_the_reader_gives_each_call_as_written_in_seconds(tmp_path) -> None:
    path = tmp_path / "calls.csv"
    # One sampled token and no decode time, nothing prefilled in no time, a design name holding a quoted line break:
    # each is a call as the engine made it.
    path.write_bytes((HEADER + "http,600,600,1,360,0\r\n chained ,760,0,25,0,1200\r\n"
                      '"two\r\nlines",5,2,3,7.5,40\r\n').encode())
    assert engine_calls.read(path) == [
        engine_calls.EngineCall("http", 600, 600, 1, 0.36, 0.0),
        engine_calls.EngineCall("chained", 760, 0, 25, 0.0, 1.2),
        engine_calls.EngineCall("two\r\nlines", 5, 2, 3, 0.0075, 0.04),
    ]


@pytest.mark.parametrize(("text", "where", "message"), [
    ("design,prompt_tokens,output_tokens,ttft_ms\r\n" + GOOD_ROW, "1: prefill_vllm",
     "missing column(s) prefill_vllm, decode_ms: expected design, prompt_tokens, prefill_vllm, output_tokens, ttft_ms, decode_ms"),
    (HEADER, "1", "the file holds no calls"),
    (HEADER + GOOD_ROW + "http,600.5,600,40,360,1950\r\n", "3: prompt_tokens", "expected an integer, got '600.5'"),
    (HEADER + GOOD_ROW + "http,600,600,,360,1950\r\n", "3: output_tokens", "expected an integer, got ''"),
    (HEADER + "http,600,600,40\r\n", "2: ttft_ms", "expected a number, got ''"),
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
    assert engine_calls.looks_like(exact)
    assert not engine_calls.looks_like(empty)
    assert not engine_calls.looks_like(binary)
    assert not engine_calls.looks_like(tmp_path / "absent.csv")
    exact.write_text(HEADER.replace(",decode_ms", ""))
    assert not engine_calls.looks_like(exact)


def test_a_call_with_one_token_adds_no_decode_time() -> None:
    result = fit.engine_timing_fit([100, 200, 300, 400], [0.11, 0.16, 0.21, 0.26], [1, 11, 21, 1], [0.0, 1.0, 3.0, 0.0])
    first_token = float(result.first_token.predict(100, 0.0))
    assert first_token == pytest.approx(0.11)
    assert float(result.call_seconds(100, 1)) == first_token
    assert float(result.call_seconds(100, 0)) == first_token


def test_one_token_after_a_first_over_half_a_second_is_a_decode_rate() -> None:
    result = fit.engine_timing_fit([100, 200, 300, 400], [0.11, 0.16, 0.21, 0.26], [1, 1, 2, 1], [0.0, 0.0, 0.5, 0.0])
    assert result.decode_tokens_per_s == 2.0


@pytest.mark.parametrize(("output_tokens", "decode_s"), [([1, 1, 1], [0.5, 0.0, 0.0]), ([1, 2, 5], [0.0, 0.0, 0.0])])
def test_no_decode_rate_without_both_later_tokens_and_decode_time(output_tokens, decode_s) -> None:
    message = "a decode rate needs calls that sampled more than one token, over some time"
    with pytest.raises(ValueError, match=f"^{message}$"):
        fit.engine_timing_fit([100, 200, 300], [0.11, 0.16, 0.21], output_tokens, decode_s)


def test_the_tokens_the_engine_sampled_are_the_ones_its_decode_time_covers(tmp_path) -> None:
    # vLLM with forced decoding samples each item's framing besides the call's text: its decode time covers those.
    path = tmp_path / "calls.csv"
    path.write_bytes(b"design,prompt_tokens,prefill_vllm,output_tokens,sampled_tokens,ttft_ms,decode_ms\r\n"
                     b"chained,600,600,40,47,360,1950\r\n")
    assert engine_calls.read(path) == [engine_calls.EngineCall("chained", 600, 600, 47, 0.36, 1.95)]
