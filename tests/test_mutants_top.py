"""The top-level modules held to exact values: the Chrome trace of a rollout (prototype/trace.py), the
timing records and client records (prototype/metrics.py), the preset and latency files
(prototype/profiles.py) and the seeded scheduler (prototype/virtual.py)."""

from __future__ import annotations

import json
import re

import attrs
import pytest
import trio

from prototype import metrics, profiles, trace, virtual
from prototype import workload as wl
from prototype.client.harness import RolloutRecord, TurnRecord
from prototype.engine.latency import LatencyModel
from prototype.protocol.codec import parse_create_body

# The track (Chrome trace "tid") of each name: the client's tracks, then the server phases in order.
TID = {name: i for i, name in enumerate(trace.TRACKS)}


def a_rollout() -> RolloutRecord:
    """Three turns: one with every client span and server spans on the server's clock, one with none,
    and one whose timing names no clock origin."""
    return RolloutRecord(
        design="suspended",
        workload="fixed",
        started_at=8.0,
        turns=[
            TurnRecord(
                turn=0, sent_at=10.0, first_token_at=10.25, ended_at=11.0, tool_seconds=0.5, bytes_sent=100, bytes_received=200,
                server_timing={"origin_s": 10.125, "spans": [["validate", 0.0, 2.5], ["prefill", 2.5, 40.0], ["not_a_phase", 0.0, 1.0]]},
            ),
            TurnRecord(turn=1, sent_at=11.5, ended_at=12.0),
            TurnRecord(turn=2, sent_at=12.5, ended_at=13.0, server_timing={"spans": [["decode", 1.0, 3.0], ["post", 5.0, 4.0]]}),
        ],
    )


def span(name: str, ts: float, dur: float, pid: int = 1, **args) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": TID[name], "ts": ts, "dur": dur, "args": args}


def metadata(pid: int, name: str) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}] + [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": i, "args": {"name": track}} for i, track in enumerate(trace.TRACKS)
    ]


def test_the_trace_tracks_are_the_client_tracks_then_the_server_phases_in_order() -> None:
    assert trace.TRACKS == (
        "turn", "time_to_first_token", "tool", "validate", "safety", "render", "route", "store_read", "queue", "prefill",
        "decode", "hosted_tool", "post", "post_overlapped",
    )


def test_a_rollouts_trace_places_every_span_in_microseconds_from_its_start() -> None:
    events = trace.trace_events(a_rollout(), pid=3)
    assert events == metadata(3, "suspended / fixed") + [
        span("turn", 2_000_000.0, 1_000_000.0, pid=3, turn=0, bytes_sent=100, bytes_received=200),
        span("time_to_first_token", 2_000_000.0, 250_000.0, pid=3, turn=0),
        span("tool", 3_000_000.0, 500_000.0, pid=3, turn=0),
        # The server's spans from its clock origin (10.125 s), the unknown phase left out.
        span("validate", 2_125_000.0, 2_500.0, pid=3, turn=0),
        span("prefill", 2_127_500.0, 37_500.0, pid=3, turn=0),
        span("turn", 3_500_000.0, 500_000.0, pid=3, turn=1, bytes_sent=0, bytes_received=0),
        span("turn", 4_500_000.0, 500_000.0, pid=3, turn=2, bytes_sent=0, bytes_received=0),
        # No origin: from the turn's send; a span that ends before it starts lasts 0.
        span("decode", 4_501_000.0, 2_000.0, pid=3, turn=2),
        span("post", 4_505_000.0, 0.0, pid=3, turn=2),
    ]


def test_a_trace_without_a_shared_clock_aligns_the_server_spans_to_each_turns_send() -> None:
    events = trace.trace_events(a_rollout(), shared_clock=False)
    server = [e for e in events if e["ph"] == "X" and e["tid"] >= TID["validate"]]
    assert [(e["name"], e["pid"], e["ts"], e["dur"]) for e in server] == [
        ("validate", 1, 2_000_000.0, 2_500.0), ("prefill", 1, 2_002_500.0, 37_500.0),
        ("decode", 1, 4_501_000.0, 2_000.0), ("post", 1, 4_505_000.0, 0.0),
    ]


def test_trace_times_are_rounded_to_the_nanosecond() -> None:
    record = RolloutRecord(design="http", workload="w", started_at=0.0, turns=[TurnRecord(turn=0, sent_at=1 / 3, ended_at=2 / 3)])
    (turn,) = [e for e in trace.trace_events(record) if e["ph"] == "X"]
    assert (turn["ts"], turn["dur"]) == (333_333.333, 333_333.333)


def test_a_chrome_trace_file_holds_one_process_per_rollout(tmp_path) -> None:
    second = RolloutRecord(design="http", workload="other", started_at=0.0, turns=[TurnRecord(turn=0, sent_at=1.0, ended_at=1.5)])
    path = trace.write_chrome_trace([a_rollout(), second], str(tmp_path / "trace.json"), shared_clock=False)
    assert path == tmp_path / "trace.json"
    written = json.loads(path.read_text())
    assert written == {
        "traceEvents": trace.trace_events(a_rollout(), pid=1, shared_clock=False) + trace.trace_events(second, pid=2),
        "displayTimeUnit": "ms",
    }
    assert written["traceEvents"][0]["args"] == {"name": "suspended / fixed"}
    trace.write_chrome_trace([a_rollout()], path)  # on the server's clock unless told otherwise
    assert json.loads(path.read_text())["traceEvents"] == trace.trace_events(a_rollout())


def test_a_phase_log_totals_its_spans_by_phase_from_an_instant_on() -> None:
    log = metrics.PhaseLog()
    for phase, start, end in (("validate", 1.0, 1.25), ("prefill", 1.25, 2.0), ("validate", 3.0, 3.5), ("decode", 3.5, 4.0)):
        log.record(phase, start, end)
    assert log.spans == [("validate", 1.0, 1.25), ("prefill", 1.25, 2.0), ("validate", 3.0, 3.5), ("decode", 3.5, 4.0)]
    assert log.totals() == {"validate": 0.75, "prefill": 0.75, "decode": 0.5}
    assert log.totals(since=3.0) == {"validate": 0.5, "decode": 0.5}  # a span starting at the instant counts
    assert log.totals(since=3.25) == {"decode": 0.5}
    assert (log.schedule, log.client) == (None, None)


def test_a_phase_logs_wire_form_is_in_milliseconds_from_its_first_span() -> None:
    log = metrics.PhaseLog()
    log.record("validate", 1.0, 1.0003333)
    log.record("prefill", 2.0, 2.5)
    log.record("decode", 3.0, 3.125)
    assert log.to_dict() == {
        "origin_s": 1.0,
        "phases_ms": {"validate": 0.333, "prefill": 500.0, "decode": 125.0},
        "spans": [["validate", 0.0, 0.333], ["prefill", 1000.0, 1500.0], ["decode", 2000.0, 2125.0]],
    }
    log.client = {"transport": "websocket"}
    assert log.to_dict(since=2.0) == {
        "origin_s": 2.0,
        "phases_ms": {"prefill": 500.0, "decode": 125.0},
        "spans": [["prefill", 0.0, 500.0], ["decode", 1000.0, 1125.0]],
        "client": {"transport": "websocket"},
    }
    # A span belongs to the part it starts in: one that starts before the instant is left out.
    assert log.to_dict(since=2.25)["spans"] == [["decode", 0.0, 125.0]]
    log.record("post", 3.0001234567, 3.5)
    assert log.to_dict(since=2.25)["spans"] == [["decode", 0.0, 125.0], ["post", 0.123, 500.0]]  # each instant to the microsecond
    log.spans.pop()
    assert log.to_dict(since=5.0) == {"origin_s": 0.0, "phases_ms": {}, "spans": [], "client": {"transport": "websocket"}}
    assert metrics.PhaseLog().to_dict() == {"origin_s": 0.0, "phases_ms": {}, "spans": []}


def test_client_records_keep_the_newest_and_append_each_to_their_file(tmp_path) -> None:
    assert metrics.ClientRecords().maxlen == metrics.MAX_CLIENT_RECORDS == 10_000
    assert metrics.ClientRecords().file is None
    path = tmp_path / "records.jsonl"
    path.write_text('{"kept": true}\n')  # appended to, never truncated
    records = metrics.ClientRecords(str(path), maxlen=2)
    for i in range(3):
        records.append({"response_id": f"resp_{i}", "note": "é"})
        # Line-buffered: each record is in the file as soon as it is made, for a reader outside the process.
        assert path.read_text(encoding="utf-8").count("\n") == 2 + i
    assert list(records) == [{"response_id": "resp_1", "note": "é"}, {"response_id": "resp_2", "note": "é"}]
    records.close()
    assert records.file is None
    records.close()  # closing twice is harmless
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"kept": True}] + [{"response_id": f"resp_{i}", "note": "é"} for i in range(3)]


def test_protocol_choices_say_how_a_request_used_the_protocol() -> None:
    request = parse_create_body({
        "model": "sim-1", "previous_response_id": "resp_1", "generate": False, "store": False, "stream_id": "lane-a",
        "input": [
            {"type": "function_call_output", "call_id": "c1", "output": "a"},
            {"type": "message", "role": "user", "content": "b"},
            {"type": "function_call_output", "call_id": "c2", "output": "c"},
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "prompt_cache_key": "k", "client_metadata": {"x": "y"},
    }, websocket=True)
    assert metrics.protocol_choices(request, transport="websocket", design="chained", user_agent="codex/1", connection=7) == {
        "user_agent": "codex/1", "transport": "websocket", "design": "chained", "connection": 7, "model": "sim-1",
        "context": "chained", "previous_response_id": "resp_1", "warmup": True, "stream": False, "stream_id": True,
        "store": False, "input_items": 3, "input_types": {"function_call_output": 2, "message": 1}, "tools": 1,
        "ignored_keys": ["client_metadata", "prompt_cache_key"],
    }
    plain = parse_create_body({"model": "sim-1", "input": "hi", "stream": True})
    choices = metrics.protocol_choices(plain, transport="http", design="http", user_agent="", connection=0)
    assert {k: choices[k] for k in ("context", "previous_response_id", "warmup", "stream", "stream_id", "store", "tools",
                                    "ignored_keys")} == {
        "context": "full", "previous_response_id": None, "warmup": False, "stream": True, "stream_id": False, "store": True,
        "tools": 0, "ignored_keys": [],
    }


def test_phase_names_are_in_the_order_a_turn_passes_through_them() -> None:
    assert metrics.PRE_INFERENCE == ("validate", "safety", "render", "route", "store_read")
    assert metrics.SERVER_PHASES == metrics.PRE_INFERENCE + ("queue", "prefill", "decode", "hosted_tool", "post", "post_overlapped")



# --- preset and latency files (prototype/profiles.py) ---------------------------------------------


def test_a_saved_preset_and_profile_read_back_and_say_their_source(tmp_path) -> None:
    params = attrs.evolve(wl.PRESETS["chat"], turns_max=4, tool_mixture=((1.0, 0.5, 0.0),))
    path = profiles.save_preset(params, str(tmp_path / "preset.json"), "a test")
    assert path == tmp_path / "preset.json"
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n "source": "a test",\n "turns_median": 2,') and text.endswith("}\n")
    assert profiles.load_preset(path) == params
    model = LatencyModel(decode_tokens_per_s=80.0, prefill_tokens_per_s=9000.0, cache_attention=None, request_overhead=0.0)
    path = profiles.save_latency(model, tmp_path / "latency.json", "fit, 12 rounds")
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "source": "fit, 12 rounds", "decode_tokens_per_s": 80.0, "prefill_tokens_per_s": 9000.0, "cache_attention": None,
        "request_overhead": 0.0,
    }
    assert profiles.load_latency(path) == model
    (tmp_path / "partial.json").write_text('{"prefill_tokens_per_s": 5000}')
    assert profiles.load_latency(tmp_path / "partial.json") == LatencyModel(prefill_tokens_per_s=5000)
    (tmp_path / "partial.json").write_text('{"initial_prompt_tokens": 123}')
    assert profiles.load_preset(tmp_path / "partial.json") == attrs.evolve(wl.WorkloadParams(), initial_prompt_tokens=123)


def refusal(load, path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    with pytest.raises(profiles.ProfileError) as refused:
        load(path)
    return str(refused.value)


def test_a_file_that_is_no_profile_is_refused_with_its_name_and_field(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(profiles.ProfileError) as refused:
        profiles.load_preset(missing)
    assert str(refused.value) == f"{missing}: cannot read (No such file or directory)"
    path = tmp_path / "p.json"
    bad = '{\n"turns_max": 3,\n}'
    with pytest.raises(json.JSONDecodeError) as invalid:
        json.loads(bad)
    assert refusal(profiles.load_preset, path, bad) == f"{path}:3: invalid JSON ({invalid.value.msg})"  # the line, and JSON's words
    assert refusal(profiles.load_latency, path, "[1, 2]") == f"{path}: expected a JSON object"
    known = ", ".join(sorted(a.name for a in attrs.fields(LatencyModel)))
    assert refusal(profiles.load_latency, path, '{"source": "x", "zeta": 1, "alpha": 2}') == f"{path}: alpha: unknown field; known: {known}"
    assert refusal(profiles.load_preset, path, '{"turns_min": 0}') == f"{path}: invalid WorkloadParams: 1 <= turns_min <= turns_max"
    assert refusal(profiles.load_preset, path, '{"tool_mixture": 5}') == f"{path}: 'int' object is not iterable"


@pytest.mark.parametrize(("field", "value", "why"), [
    ("decode_tokens_per_s", "true", "expected a finite number >= 0, got True"),
    ("decode_tokens_per_s", '"80"', "expected a finite number >= 0, got '80'"),
    ("prefill_tokens_per_s", "null", "expected a finite number >= 0, got None"),
    ("prefill_tokens_per_s", "Infinity", "expected a finite number >= 0, got inf"),
    ("request_overhead", "-0.001", "expected a finite number >= 0, got -0.001"),
    ("decode_tokens_per_s", "0", "must be > 0"),
    ("prefill_tokens_per_s", "0.0", "must be > 0"),
    ("cache_attention", "0", "must be > 0"),
])
def test_a_latency_value_that_cannot_time_a_call_is_refused(tmp_path, field: str, value: str, why: str) -> None:
    path = tmp_path / "latency.json"
    assert refusal(profiles.load_latency, path, f'{{"{field}": {value}}}') == f"{path}: {field}: {why}"


def test_a_latency_profile_may_have_no_overhead_and_no_cache_attention_term(tmp_path) -> None:
    path = tmp_path / "latency.json"
    assert refusal(profiles.load_latency, path, '{"cache_attention": null, "decode_tokens_per_s": -1}') == (
        f"{path}: decode_tokens_per_s: expected a finite number >= 0, got -1")  # the fields after a null are checked too
    path.write_text('{"request_overhead": 0, "cache_attention": null, "decode_tokens_per_s": 1e-3}')
    assert profiles.load_latency(path) == LatencyModel(decode_tokens_per_s=1e-3, cache_attention=None, request_overhead=0)


# --- the seeded scheduler (prototype/virtual.py) --------------------------------------------------


def test_a_virtual_run_is_on_an_autojumping_clock_from_zero() -> None:
    async def clock_of_the_run() -> tuple[float, float, float]:
        start = trio.current_time()
        await trio.sleep(3600.0)
        return start, trio.current_time(), trio.lowlevel.current_clock().autojump_threshold

    assert virtual.run(clock_of_the_run) == (0.0, 3600.0, 0)

    async def echo(a: int, b: str) -> tuple[int, str]:
        return a, b

    assert virtual.run(echo, 1, "two", scheduler_seed=5) == (1, "two")


@pytest.mark.parametrize("missing", ["_r", "_ALLOW_DETERMINISTIC_SCHEDULING"])
def test_a_trio_without_the_private_scheduler_refuses_to_run_unseeded(monkeypatch, missing: str) -> None:
    run_module = trio._core._run
    monkeypatch.delattr(run_module, missing)
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(virtual.UnseededScheduler, match=re.escape(f"trio {trio.__version__} has no trio._core._run.{missing}: ")):
        virtual.run(main)
    assert ran == [] and not hasattr(run_module, missing)
