"""TraceLab's normalized round trace (`round_trace.jsonl`, uw-syfi/TraceLab): one JSON object per model call.

Fields used (README "Data format" and artifacts/utils/DB_SCHEMA.md of that repository): `session_id`, `round_index`,
`prefix_tokens` (the cached prefix), `newly_append_tokens` (the rest of the prompt; `input_tokens_total` is their
sum), `output_tokens` (reasoning included), `reasoning_output_tokens` (int or null), `tools[]` with `tool_name` and
`tool_wall_latency_ms` (`result_at - emitted_at`; null falls back to `tool_internal_latency_ms`), and
`timing_events[]` with `event_type` and `timestamp`. The round's model time runs from the last `user_message` or
`tool_result` event before the model's first output event (`reasoning`, `text`, `tool_call`) to its last one, as
TraceLab's README suggests for LLM-side latency. A round whose first input event is a `user_message` begins a request.

Rows of different sessions may interleave; within a session `round_index` must increase. TraceLab's own data has
exact duplicate rows (DB_SCHEMA.md: 514 repeated (session_id, round_index)); a repeat with the same token counts
is skipped and counted in the notes, a repeat that differs is an error.

`provider` (claude, codex) and `model`, where a row has them, name who served the round (`Round.group`): `calibrate`
fits each on its own.
"""

from __future__ import annotations

import math
from os import PathLike

from .base import CHARS_PER_TOKEN, Round, Trace, TraceError, build, count, is_hosted, json_objects, parse_timestamp

FORMAT = "tracelab-jsonl"
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
OUTPUT_EVENTS = frozenset({"reasoning", "text", "tool_call"})


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and "session_id" in first and "round_index" in first


def _tool_seconds(tool: dict, path: str | PathLike[str], line: int, index: int, notes: dict[str, int]) -> float:
    field = f"tools[{index}].tool_wall_latency_ms"
    if "tool_wall_latency_ms" not in tool:
        raise TraceError(path, line, field, "missing")
    for key in ("tool_wall_latency_ms", "tool_internal_latency_ms"):
        value = tool.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TraceError(path, line, f"tools[{index}].{key}", f"expected a number, got {value!r}")
        if value < 0:
            raise TraceError(path, line, f"tools[{index}].{key}", f"must be >= 0, got {value!r}")
        return round(value / 1000.0, 6)
    notes["no_latency"] += 1
    return 0.0


def group_of(row: dict) -> str:
    """"provider/model" from a round's `provider` (claude, codex) and `model` fields; what is missing is left out."""
    parts = [str(row[key]).strip() for key in ("provider", "model") if isinstance(row.get(key), str) and row[key].strip()]
    return "/".join(parts)


def _times(row: dict, path: str | PathLike[str], line: int) -> tuple[float | None, float | None, float | None]:
    """(request_at, started_at, ended_at) from timing_events; Nones if the round has no usable events."""
    events = row.get("timing_events")
    if events is None:
        return None, None, None
    if not isinstance(events, list):
        raise TraceError(path, line, "timing_events", f"expected a list, got {type(events).__name__}")
    stamped = []
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(path, line, f"timing_events[{i}]", "expected an object")
        for key in ("event_type", "timestamp"):
            if key not in event:
                raise TraceError(path, line, f"timing_events[{i}].{key}", "missing")
        try:
            stamped.append((event["event_type"], parse_timestamp(event["timestamp"])))
        except ValueError as e:
            raise TraceError(path, line, f"timing_events[{i}].timestamp", str(e)) from None
    outputs = [t for kind, t in stamped if kind in OUTPUT_EVENTS]
    if not outputs:
        return None, None, None
    first_output = min(outputs)
    inputs = [(kind, t) for kind, t in stamped if kind in INPUT_EVENTS and t <= first_output]
    started = max((t for _, t in inputs), default=None)
    requests = [t for kind, t in inputs if kind == "user_message"]
    return (min(requests) if requests else None), started, max(outputs)


def read(path: str | PathLike[str]) -> Trace:
    sessions: dict[str, list[Round]] = {}
    last_index: dict[str, tuple[int, tuple[int, ...], int]] = {}
    notes = {"duplicates": 0, "no_latency": 0}
    for line, row in json_objects(path):
        session = row.get("session_id")
        if not isinstance(session, str) or not session:
            raise TraceError(path, line, "session_id", "missing" if session is None else f"expected a string, got {session!r}")
        index = count(row, "round_index", path, line)
        prefix = count(row, "prefix_tokens", path, line)
        appended = count(row, "newly_append_tokens", path, line)
        output = count(row, "output_tokens", path, line)
        reasoning = count(row, "reasoning_output_tokens", path, line, nullable=True) if "reasoning_output_tokens" in row else 0
        total = prefix + appended
        if row.get("input_tokens_total") is not None and count(row, "input_tokens_total", path, line) != total:
            raise TraceError(path, line, "input_tokens_total",
                             f"{row['input_tokens_total']} is not prefix_tokens + newly_append_tokens = {total}")
        if "tools" not in row:
            raise TraceError(path, line, "tools", "missing")
        if not isinstance(row["tools"], list):
            raise TraceError(path, line, "tools", f"expected a list, got {type(row['tools']).__name__}")
        client, hosted = [], []
        for i, tool in enumerate(row["tools"]):
            if not isinstance(tool, dict):
                raise TraceError(path, line, f"tools[{i}]", "expected an object")
            name = tool.get("tool_name")
            if not isinstance(name, str):
                raise TraceError(path, line, f"tools[{i}].tool_name", "missing" if name is None else f"expected a string, got {name!r}")
            seconds = _tool_seconds(tool, path, line, i, notes)
            if is_hosted(name):
                result_chars = tool.get("result_chars")
                tokens = int(result_chars) // CHARS_PER_TOKEN if isinstance(result_chars, int) and result_chars > 0 else 0
                hosted.append((seconds, tokens))
            else:
                client.append(seconds)
        request_at, started, ended = _times(row, path, line)
        fingerprint = (prefix, appended, output)
        if session in last_index:
            previous, previous_print, previous_line = last_index[session]
            if index == previous and fingerprint == previous_print:
                notes["duplicates"] += 1
                continue
            if index <= previous:
                raise TraceError(path, line, "round_index",
                                 f"{index} after {previous} (line {previous_line}) in session {session!r}: rounds out of order")
        last_index[session] = (index, fingerprint, line)
        first_input = row.get("first_input_event_type")
        starts_request = first_input == "user_message" or request_at is not None
        sessions.setdefault(session, []).append(Round(
            session=session, line=line, input_tokens=total, cached_tokens=prefix, output_tokens=output,
            reasoning_tokens=reasoning, tool_seconds=client, hosted=hosted, starts_request=starts_request,
            started_at=started, ended_at=ended, request_at=request_at, group=group_of(row),
        ))
    extra = []
    if notes["duplicates"]:
        extra.append(f"{notes['duplicates']} exact duplicate row(s) (same session_id, round_index and token counts) skipped")
    if notes["no_latency"]:
        extra.append(f"{notes['no_latency']} tool call(s) with null wall and internal latency: replayed as 0 s")
    return build(path, FORMAT, sessions.values(), extra)
