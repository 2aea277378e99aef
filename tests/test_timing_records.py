"""The timing and client records a run leaves (prototype/metrics.py): a response's phase log, its totals and
its wire form (`testbed_timing`), the client records kept in memory and appended to their file, and the
protocol choices each record says a request made."""

from __future__ import annotations

import json

from prototype import metrics
from prototype.protocol.codec import parse_create_body


def test_a_phase_log_totals_its_spans_by_phase_from_an_instant_on() -> None:
    log = metrics.PhaseLog()
    for phase, start, end in (("validate", 1.0, 1.25), ("prefill", 1.25, 2.0), ("validate", 3.0, 3.5), ("decode", 3.5, 4.0)):
        log.record(phase, start, end)
    assert log.spans == [("validate", 1.0, 1.25), ("prefill", 1.25, 2.0), ("validate", 3.0, 3.5), ("decode", 3.5, 4.0)]
    assert log.totals() == {"validate": 0.75, "prefill": 0.75, "decode": 0.5}
    assert log.totals(since=3.0) == {"validate": 0.5, "decode": 0.5}  # a span starting at the instant counts
    assert log.totals(since=3.25) == {"decode": 0.5} and (log.schedule, log.client) == (None, None)


def test_a_phase_logs_wire_form_is_in_milliseconds_from_its_first_span() -> None:
    log = metrics.PhaseLog()
    log.record("validate", 1.0, 1.0003333)
    log.record("prefill", 2.0, 2.5)
    log.record("decode", 3.0, 3.125)
    assert log.to_dict() == {
        "origin_s": 1.0, "phases_ms": {"validate": 0.333, "prefill": 500.0, "decode": 125.0},
        "spans": [["validate", 0.0, 0.333], ["prefill", 1000.0, 1500.0], ["decode", 2000.0, 2125.0]]}
    log.client = {"transport": "websocket"}
    assert log.to_dict(since=2.0) == {
        "origin_s": 2.0,
        "phases_ms": {"prefill": 500.0, "decode": 125.0},
        "spans": [["prefill", 0.0, 500.0], ["decode", 1000.0, 1125.0]],
        "client": {"transport": "websocket"}}
    # A span belongs to the part it starts in: one that starts before the instant is left out.
    assert log.to_dict(since=2.25)["spans"] == [["decode", 0.0, 125.0]]
    log.record("post", 3.0001234567, 3.5)
    assert log.to_dict(since=2.25)["spans"] == [["decode", 0.0, 125.0], ["post", 0.123, 500.0]]  # each instant to the microsecond
    log.spans.pop()
    assert log.to_dict(since=5.0) == {"origin_s": 0.0, "phases_ms": {}, "spans": [], "client": {"transport": "websocket"}}
    assert metrics.PhaseLog().to_dict() == {"origin_s": 0.0, "phases_ms": {}, "spans": []}


def test_client_records_keep_the_newest_and_append_each_to_their_file(tmp_path) -> None:
    assert metrics.ClientRecords().maxlen == metrics.MAX_CLIENT_RECORDS == 10_000 and metrics.ClientRecords().file is None
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
            {"type": "function_call_output", "call_id": "c2", "output": "c"}],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "prompt_cache_key": "k", "client_metadata": {"x": "y"},
    }, websocket=True)
    assert metrics.protocol_choices(request, transport="websocket", design="chained", user_agent="codex/1", connection=7) == {
        "user_agent": "codex/1", "transport": "websocket", "design": "chained", "connection": 7, "model": "sim-1",
        "context": "chained", "previous_response_id": "resp_1", "warmup": True, "stream": False, "stream_id": True,
        "store": False, "input_items": 3, "input_types": {"function_call_output": 2, "message": 1}, "tools": 1,
        "ignored_keys": ["client_metadata", "prompt_cache_key"]}
    plain = parse_create_body({"model": "sim-1", "input": "hi", "stream": True})
    choices = metrics.protocol_choices(plain, transport="http", design="http", user_agent="", connection=0)
    assert {k: choices[k] for k in ("context", "previous_response_id", "warmup", "stream", "stream_id", "store", "tools",
                                    "ignored_keys")} == {
        "context": "full", "previous_response_id": None, "warmup": False, "stream": True, "stream_id": False, "store": True,
        "tools": 0, "ignored_keys": []}
