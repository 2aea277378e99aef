"""Export a rollout as a Chrome trace-event timeline (JSON) that Perfetto and chrome://tracing open.

One track per phase: the client's turns and tool runs, and every server phase the timing events
reported (validate, safety, render, route, store_read, queue, prefill, decode, hosted_tool, post).
Server spans are placed with the server's clock origin, which is the client's clock when both run
in one process (every virtual-time run); across processes the server tracks are aligned to the
start of each turn instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import metrics
from .client.harness import RolloutRecord

CLIENT_TRACKS = ("turn", "time_to_first_token", "tool")
TRACKS = CLIENT_TRACKS + metrics.SERVER_PHASES


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def trace_events(record: RolloutRecord, *, pid: int = 1, shared_clock: bool = True) -> list[dict[str, Any]]:
    origin = record.started_at
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{record.design} / {record.workload}"}}
    ]
    events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": i, "args": {"name": name}} for i, name in enumerate(TRACKS)]

    def span(track: str, start: float, end: float, **args: Any) -> None:
        events.append({"name": track, "ph": "X", "pid": pid, "tid": TRACKS.index(track), "ts": _us(start - origin), "dur": _us(max(0.0, end - start)), "args": args})

    for turn in record.turns:
        span("turn", turn.sent_at, turn.ended_at, turn=turn.turn, bytes_sent=turn.bytes_sent, bytes_received=turn.bytes_received)
        if turn.first_token_at is not None:
            span("time_to_first_token", turn.sent_at, turn.first_token_at, turn=turn.turn)
        if turn.tool_seconds:
            span("tool", turn.ended_at, turn.ended_at + turn.tool_seconds, turn=turn.turn)
        timing = turn.server_timing or {}
        base = timing.get("origin_s", turn.sent_at) if shared_clock else turn.sent_at
        for phase, start_ms, end_ms in timing.get("spans", []):
            if phase in TRACKS:
                span(phase, base + start_ms / 1000, base + end_ms / 1000, turn=turn.turn)
    return events


def write_chrome_trace(records: Iterable[RolloutRecord], path: str | Path, *, shared_clock: bool = True) -> Path:
    """One process (pid) per rollout, so designs line up one above the other in Perfetto."""
    events: list[dict[str, Any]] = []
    for pid, record in enumerate(records, start=1):
        events += trace_events(record, pid=pid, shared_clock=shared_clock)
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path
