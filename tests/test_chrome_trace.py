"""A rollout's Chrome trace (prototype/trace.py): one process per rollout, one track per client span and server phase
in a turn's order, every span in microseconds from the rollout's start."""

from __future__ import annotations

import json

from prototype import trace
from prototype.client.harness import RolloutRecord, TurnRecord

TRACKS = ("turn", "time_to_first_token", "tool", "validate", "safety", "render", "route", "store_read", "queue", "prefill",
          "decode", "hosted_tool", "post", "post_overlapped")


def a_rollout() -> RolloutRecord:
    """Three turns: one with every client span and server spans on the server's clock, one with none,
    and one whose timing names no clock origin."""
    return RolloutRecord(design="suspended", workload="fixed", started_at=8.0, turns=[
        TurnRecord(turn=0, sent_at=10.0, first_token_at=10.25, ended_at=11.0, tool_seconds=0.5, bytes_sent=100, bytes_received=200,
                   server_timing={"origin_s": 10.125, "spans": [["validate", 0.0, 2.5], ["prefill", 2.5, 40.0], ["not_a_phase", 0.0, 1.0]]}),
        TurnRecord(turn=1, sent_at=11.5, ended_at=12.0),
        TurnRecord(turn=2, sent_at=12.5, ended_at=13.0, server_timing={"spans": [["decode", 1.0, 3.0], ["post", 5.0, 4.0]]})])


def span(name: str, ts: float, dur: float, pid: int = 1, **args) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": TRACKS.index(name), "ts": ts, "dur": dur, "args": args}


def test_a_rollouts_trace_places_every_span_in_microseconds_from_its_start() -> None:
    events = trace.trace_events(a_rollout(), pid=3)
    assert events == [{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "suspended / fixed"}}] + [
        {"name": "thread_name", "ph": "M", "pid": 3, "tid": i, "args": {"name": track}} for i, track in enumerate(TRACKS)
    ] + [
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
        span("post", 4_505_000.0, 0.0, pid=3, turn=2)]


def test_a_trace_without_a_shared_clock_aligns_the_server_spans_to_each_turns_send_and_rounds_to_the_nanosecond() -> None:
    events = trace.trace_events(a_rollout(), shared_clock=False)
    server = [e for e in events if e["ph"] == "X" and e["tid"] >= TRACKS.index("validate")]
    assert [(e["name"], e["pid"], e["ts"], e["dur"]) for e in server] == [
        ("validate", 1, 2_000_000.0, 2_500.0), ("prefill", 1, 2_002_500.0, 37_500.0),
        ("decode", 1, 4_501_000.0, 2_000.0), ("post", 1, 4_505_000.0, 0.0)]
    # Times rounded to the nanosecond.
    record = RolloutRecord(design="http", workload="w", started_at=0.0, turns=[TurnRecord(turn=0, sent_at=1 / 3, ended_at=2 / 3)])
    (turn,) = [e for e in trace.trace_events(record) if e["ph"] == "X"]
    assert (turn["ts"], turn["dur"]) == (333_333.333, 333_333.333)


def test_a_chrome_trace_file_holds_one_process_per_rollout(tmp_path) -> None:
    second = RolloutRecord(design="http", workload="other", started_at=0.0, turns=[TurnRecord(turn=0, sent_at=1.0, ended_at=1.5)])
    path = trace.write_chrome_trace([a_rollout(), second], str(tmp_path / "trace.json"), shared_clock=False)
    assert path == tmp_path / "trace.json"
    assert json.loads(path.read_text()) == {
        "traceEvents": trace.trace_events(a_rollout(), pid=1, shared_clock=False) + trace.trace_events(second, pid=2),
        "displayTimeUnit": "ms"}
    trace.write_chrome_trace([a_rollout()], path)  # on the server's clock unless told otherwise
    assert json.loads(path.read_text())["traceEvents"] == trace.trace_events(a_rollout())
