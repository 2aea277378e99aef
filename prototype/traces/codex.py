"""Codex CLI session rollouts: the `rollout-*.jsonl` files Codex writes under `$CODEX_HOME/sessions/YYYY/MM/DD/`.

Each line is `{"timestamp": ISO 8601, "type": ..., "payload": {...}}` (codex-rs `RolloutLine`; types `session_meta`,
`response_item`, `event_msg`, `turn_context`, `compacted` and, in newer versions, others this reader skips). A model
call shows up as its output items (`response_item` of type `message` with role `assistant`, `reasoning`,
`function_call`, `custom_tool_call`, `local_shell_call`, `web_search_call`) followed by an `event_msg` of type
`token_count` whose `info.last_token_usage` holds that call's `input_tokens`, `cached_input_tokens`,
`output_tokens` (reasoning included) and `reasoning_output_tokens` (where `last_token_usage` is absent, the
difference of two `total_token_usage`s). A repeated token_count (same `info.total_token_usage`) is the same call
reported twice and is skipped.

* Tool time: from a call item to the `function_call_output` / `custom_tool_call_output` with its `call_id`.
  `web_search_call` is hosted: it runs inside the model call, so its time is part of the round's.
* Model time: from the last input item (user message, tool output) before the round's first output item to its
  last output item.
* Requests: an `event_msg` `task_started` or `user_message`, or a user `message` item, begins one.

Timestamps must not go backwards. The latest `turn_context`'s `model` names who served the rounds after it
(`Round.group` "codex/<model>"; "codex" before any).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import attrs

from .base import Round, TraceError, count, is_hosted, json_objects, parse_timestamp

FORMAT = "codex"
LINE_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
CALL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
HOSTED_ITEMS = frozenset({"web_search_call"})
REQUEST_EVENTS = frozenset({"task_started", "user_message"})


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and first.get("type") in LINE_TYPES and "payload" in first and "timestamp" in first


def find_rollouts(folder: Path) -> list[Path]:
    return sorted(folder.rglob("rollout-*.jsonl"))


def read_sessions(path: str | PathLike[str]) -> tuple[list[Round], dict[str, int]]:
    """The rounds of one rollout file (epoch-second timestamps), and counts of what was adjusted."""
    session = Path(path).stem
    rounds: list[Round] = []
    round_calls: list[list[str]] = []
    call_at: dict[str, float] = {}
    output_at: dict[str, float] = {}
    inputs: list[float] = []
    outputs: list[float] = []
    calls: list[str] = []
    hosted = 0
    request_at: float | None = None
    model = ""  # the latest turn_context's model: who serves the rounds after it
    previous_total: object = None
    last_ts = float("-inf")
    notes = {"no_output": 0, "unreported": 0}
    for line, obj in json_objects(path):
        for key in ("timestamp", "type", "payload"):
            if key not in obj:
                raise TraceError(path, line, key, "missing")
        try:
            ts = parse_timestamp(obj["timestamp"])
        except ValueError as e:
            raise TraceError(path, line, "timestamp", str(e)) from None
        if ts < last_ts:
            raise TraceError(path, line, "timestamp", f"{obj['timestamp']} is earlier than the line before: lines out of order")
        last_ts = ts
        kind, payload = obj["type"], obj["payload"]
        if not isinstance(payload, dict):
            continue
        item = payload.get("type")
        if kind == "session_meta":
            session = str(payload.get("id") or payload.get("session_id") or session)
        elif kind == "turn_context":
            model = payload["model"] if isinstance(payload.get("model"), str) else model
        elif kind == "event_msg" and item in REQUEST_EVENTS or kind == "response_item" and item == "message" and payload.get("role") == "user":
            inputs.append(ts)
            if request_at is None:
                request_at = ts
        elif kind == "response_item" and (item == "reasoning" or item == "message" and payload.get("role") == "assistant"):
            outputs.append(ts)
        elif kind == "response_item" and item in CALL_ITEMS:
            call_id = payload.get("call_id") or payload.get("id")
            if not isinstance(call_id, str):
                raise TraceError(path, line, "payload.call_id", "missing")
            outputs.append(ts)
            if is_hosted(str(payload.get("name", ""))):  # a hosted tool that a provider reports as a call
                hosted += 1
                continue
            calls.append(call_id)
            call_at[call_id] = ts
        elif kind == "response_item" and item in HOSTED_ITEMS:
            outputs.append(ts)
            hosted += 1
        elif kind == "response_item" and item in CALL_OUTPUTS:
            inputs.append(ts)
            call_id = payload.get("call_id")
            if isinstance(call_id, str) and call_id in call_at and call_id not in output_at:
                output_at[call_id] = ts
        elif kind == "event_msg" and item == "token_count":
            info = payload.get("info")
            if info is None:
                continue  # a rate-limit report, no usage
            if not isinstance(info, dict):
                raise TraceError(path, line, "payload.info", f"expected an object, got {info!r}")
            total = info.get("total_token_usage")
            if total is not None and total == previous_total:
                continue
            usage, prefix = info.get("last_token_usage"), "payload.info.last_token_usage."
            if usage is None and isinstance(total, dict):  # versions that report running totals only
                usage, prefix = _difference(total, previous_total), "payload.info.total_token_usage."
            if not isinstance(usage, dict):
                raise TraceError(path, line, "payload.info.last_token_usage", "missing")
            previous_total = total
            input_tokens = count(usage, "input_tokens", path, line, prefix=prefix)
            cached = count(usage, "cached_input_tokens", path, line, prefix=prefix, nullable=True) if "cached_input_tokens" in usage else 0
            output = count(usage, "output_tokens", path, line, prefix=prefix)
            reasoning = count(usage, "reasoning_output_tokens", path, line, prefix=prefix, nullable=True) if "reasoning_output_tokens" in usage else 0
            if cached > input_tokens:
                raise TraceError(path, line, prefix + "cached_input_tokens", f"{cached} exceeds input_tokens {input_tokens}")
            if not outputs:
                notes["unreported"] += 1
                continue
            first_output = min(outputs)
            started = max((t for t in inputs if t <= first_output), default=None)
            rounds.append(Round(
                session=session, line=line, input_tokens=input_tokens, cached_tokens=cached, output_tokens=output,
                reasoning_tokens=reasoning, hosted=((0.0, 0),) * hosted, starts_request=request_at is not None,
                started_at=started, ended_at=max(outputs), request_at=request_at,
                group=f"codex/{model}" if model else "codex",
            ))
            round_calls.append(calls)
            outputs, calls, hosted, request_at = [], [], 0, None
    if outputs:
        notes["unreported"] += 1  # a last model call without a token count: interrupted
    finished = []
    for r, ids in zip(rounds, round_calls):
        seconds = []
        for call_id in ids:
            if call_id in output_at:
                seconds.append(round(max(0.0, output_at[call_id] - call_at[call_id]), 6))
            else:
                notes["no_output"] += 1
                seconds.append(0.0)
        finished.append(attrs.evolve(r, session=session, tool_seconds=tuple(seconds)))
    return finished, notes


def _difference(total: dict, previous: object) -> dict:
    """One call's usage from two running totals (missing keys stay missing, for the error)."""
    before = previous if isinstance(previous, dict) else {}
    return {key: value - before.get(key, 0) if isinstance(value, int) and isinstance(before.get(key, 0), int) else value
            for key, value in total.items()}


def notes_text(notes: dict[str, int]) -> list[str]:
    out = []
    if notes.get("no_output"):
        out.append(f"{notes['no_output']} tool call(s) have no output item: timed as 0 s")
    if notes.get("unreported"):
        out.append(f"{notes['unreported']} model output(s) have no token_count after them (interrupted): not replayed")
    return out
