"""Trace readers (prototype/traces/): each format from a file the test writes, and the error for each bad trace."""

from __future__ import annotations

import csv
import json
import locale
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

import attrs
import pytest

from prototype import traces
from prototype import workload as wl
from prototype.traces import codex, engine_calls, native, tracelab, tracelab_csv
from prototype.traces.base import Round, build, content_seed_of_task, parse_timestamp
from prototype.workload import HostedCall, TurnSpec, Workload

FIXTURE = Path(__file__).parent / "fixtures" / "codex-rollout-serve.jsonl"
T0 = 1_780_000_000.0  # an arbitrary epoch second


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# --- TraceLab round JSONL ----------------------------------------------------------------------------------------


def tracelab_row(session: str, index: int, prefix: int, append: int, output: int, tools=(), *, reasoning=None,
                 start: float | None = None, end: float | None = None, user: bool = False) -> dict:
    """One normalized TraceLab round; tools are (name, wall ms); events at start (input) and end (output)."""
    events = []
    if start is not None:
        events.append({"event_type": "user_message" if user else "tool_result", "timestamp": iso(start), "source": "x"})
        events.append({"event_type": "text", "timestamp": iso(end), "source": "x"})
    return {
        "provider": "codex", "session_id": session, "round_index": index, "input_tokens_total": prefix + append,
        "prefix_tokens": prefix, "newly_append_tokens": append, "output_tokens": output,
        "reasoning_output_tokens": reasoning, "timing_events": events,
        "tools": [{"tool_index": i, "tool_name": name, "tool_wall_latency_ms": ms, "tool_internal_latency_ms": None,
                   "result_chars": 4000} for i, (name, ms) in enumerate(tools)],
        "first_input_event_type": "user_message" if user else "tool_result"}


def replayed(name: str, turns, arrival: float, prefix: str, prefix_tokens: int = 0) -> Workload:
    """A task as a trace replays it: its own content seed, the common prefix of its provider and model."""
    return Workload(name, 0, turns, arrival_s=arrival, content_seed=content_seed_of_task(name), prefix=prefix,
                    prefix_tokens=prefix_tokens)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def refusal(read, path) -> tuple[str, str, int, str | None]:
    """The TraceError `read(path)` raises: its text, path, line and field."""
    with pytest.raises(traces.TraceError) as refused:
        read(path)
    return str(refused.value), refused.value.path, refused.value.line, refused.value.field


def test_tracelab_jsonl_makes_tasks_turns_and_timed_rounds(tmp_path):
    rows = [
        tracelab_row("s1", 0, 0, 1000, 100, [("exec_command", 250)], reasoning=40, start=0.0, end=2.0, user=True),
        tracelab_row("s2", 0, 0, 500, 50, [], start=5.0, end=6.0, user=True),  # another session interleaves
        tracelab_row("s1", 1, 1024, 300, 80, [("exec_command", 1500), ("apply_patch", 500)], start=2.25, end=3.0),
        tracelab_row("s1", 2, 1408, 200, 60, [("web_search", 4000)], start=4.5, end=5.0),  # hosted only: same turn
        tracelab_row("s1", 3, 1600, 900, 70, [], start=9.0, end=10.0),
        tracelab_row("s1", 4, 2500, 50, 20, [], start=30.0, end=31.0, user=True),  # a second request
    ]
    trace = traces.load(write_jsonl(tmp_path / "round_trace.jsonl", rows))
    assert trace.format == "tracelab-jsonl"
    # The second request of s1 starts with s1's context, which the trace found cached: replayed as its own content.
    assert trace.notes == ("1 request(s) continue a session whose earlier context the trace found cached (2500 tokens "
                           "in all): replayed with their own content, sharing only the session's common prefix, so "
                           "those tokens are prefilled",)
    assert [(t.name, t.arrival_s) for t in trace.tasks] == [("s1", 0.0), ("s2", 5.0), ("s1/1", 30.0)]
    s1 = trace.tasks[0]
    # turn 1 appends what the prompt grew by (1324 - 1000) less turn 0's 100 output tokens; the hosted-only round
    # (1608 - 1324 - 80 = 204 new tokens) merges with the next: its result is what that round appended (2500 - 1608 - 60)
    assert s1.turns == (
        TurnSpec(1000, 100, (0.25,), (), 40),  # the round's 40 reasoning tokens are replayed
        TurnSpec(224, 80, (1.5, 0.5)),
        TurnSpec(204, 130, (), (HostedCall(4.0, 832),)))
    assert trace.tasks[2] == Workload("s1/1", 0, (TurnSpec(2550, 20, ()),), arrival_s=30.0,
                                      content_seed=content_seed_of_task("s1/1"), prefix="trace:codex", prefix_tokens=0)
    assert len({t.text_seed for t in trace.tasks}) == 3  # every task its own content
    first = trace.rounds[0]
    assert (first.cached_tokens, first.uncached_tokens, first.reasoning_tokens, first.model_seconds) == (0, 1000, 40, 2.0)
    assert [r.turn for r in trace.rounds if r.task == "s1"] == [0, 1, 2, 3]


def test_tracelab_duplicate_rows_are_skipped_and_said(tmp_path):
    row = tracelab_row("s", 0, 0, 10, 5, [])
    trace = traces.load(write_jsonl(tmp_path / "t.jsonl", [row, row]))
    assert len(trace.rounds) == 1
    assert trace.notes == ("1 exact duplicate row(s) (same session_id, round_index and token counts) skipped",)
    # Each repeat is counted, and the rows after a repeat are read.
    trace = traces.load(write_jsonl(tmp_path / "t.jsonl", [row, row, row, tracelab_row("s", 1, 15, 5, 5, [])]))
    assert [(r.line, r.cached_tokens) for r in trace.rounds] == [(1, 0), (4, 15)]
    assert trace.notes[0] == "2 exact duplicate row(s) (same session_id, round_index and token counts) skipped"
    assert not tracelab.looks_like({"round_index": 0}) and not tracelab.looks_like({"session_id": "s"})
    assert not tracelab.looks_like([{"session_id": "s", "round_index": 0}]) and tracelab.looks_like(row)


def test_a_tracelab_rounds_times_tools_and_group_come_from_its_own_fields_tool_time_the_wall_time(tmp_path):
    # TraceLab (README "Data format", DB_SCHEMA.md): tool_wall_latency_ms is result_at - emitted_at, the
    # time the agent waited; the reader takes tool_internal_latency_ms only where the wall time is null.
    row = tracelab_row("s", 0, 0, 100, 10, [("exec_command", 2500), ("exec_command", None), ("exec_command", None)])
    row["tools"][0]["tool_internal_latency_ms"] = 400
    row["tools"][1]["tool_internal_latency_ms"] = 700
    trace = traces.load(write_jsonl(tmp_path / "t.jsonl", [row, tracelab_row("s", 1, 110, 50, 10, [])]))
    assert trace.tasks[0].turns[0] == TurnSpec(100, 10, (2.5, 0.7, 0.0))
    assert trace.notes == ("1 tool call(s) with null wall and internal latency: replayed as 0 s",)
    row = tracelab_row("s", 0, 0, 100, 10, [("exec", 1234.5678901), ("web_search", 250), ("exec", 0)])
    row.update(provider=" claude ", model="claude-sonnet-4")
    row["tools"][1]["result_chars"] = 41  # 10 tokens of 4 characters
    row["timing_events"] = [
        {"event_type": "user_message", "timestamp": iso(1.0)},
        {"event_type": "tool_result", "timestamp": iso(2.0)},  # the last input before the first output
        {"event_type": "reasoning", "timestamp": iso(3.0)},
        {"event_type": "tool_result", "timestamp": iso(3.0)},  # at the first output: the model starts here
        {"event_type": "tool_result", "timestamp": iso(3.5)},  # after the first output: not where it started
        {"event_type": "user_message", "timestamp": iso(3.6)},  # nor where the request began
        {"event_type": "tool_call", "timestamp": iso(4.5)},
        {"event_type": "other", "timestamp": iso(9.0)}]
    second = tracelab_row("s", 1, 110, 5, 10, [("web_search", 100)])
    second.pop("reasoning_output_tokens")
    second["tools"][0]["result_chars"] = "many"
    second.update(first_input_event_type="user_message", provider="codex")
    second["timing_events"] = [{"event_type": "tool_result", "timestamp": iso(7.0)}]  # no output: untimed
    second["tools"] += [{"tool_name": "exec", "tool_wall_latency_ms": None}] * 2  # no latency at all: 0 s, counted
    third = tracelab_row("s", 2, 140, 5, 10, [], reasoning=3)
    third.update(provider=None, model=" ")
    third["tools"] = [{"tool_name": "web_search", "tool_wall_latency_ms": 100, "result_chars": 0}]
    third["timing_events"] = [{"event_type": "text", "timestamp": iso(12.0)}]  # output with no input before it
    trace = traces.load(write_jsonl(tmp_path / "t.jsonl", [row, second, third]))
    first, then, last = trace.rounds
    assert first.tool_seconds == (1.234568, 0.0) and first.hosted == ((0.25, 10),)
    assert (first.request_at, first.started_at, first.ended_at) == (0.0, 2.0, 3.5)  # from the first request
    assert first.model_seconds == 1.5 and first.starts_request and first.group == "claude/claude-sonnet-4"
    assert (then.request_at, then.started_at, then.ended_at, then.model_seconds) == (None, None, None, None)
    assert then.starts_request and then.reasoning_tokens == 0 and then.hosted == ((0.1, 0),) and then.group == "codex"
    assert then.tool_seconds == (0.0, 0.0)
    assert "2 tool call(s) with null wall and internal latency: replayed as 0 s" in trace.notes
    assert (last.request_at, last.started_at, last.ended_at, last.model_seconds) == (None, None, 11.0, None)
    assert not last.starts_request and last.reasoning_tokens == 3 and last.hosted == ((0.1, 0),) and last.group == ""


def tool(**fields) -> dict:
    return {"tool_name": "exec", "tool_wall_latency_ms": 5, **fields}


BAD_TRACELAB = [  # (label, spoil the second row, line, field, the whole message after the field)
    ("missing field", lambda r: r.pop("prefix_tokens"), 2, "prefix_tokens", "missing"),
    ("negative", lambda r: r.update(output_tokens=-3), 2, "output_tokens", "must be >= 0, got -3"),
    ("no session", lambda r: r.pop("session_id"), 2, "session_id", "missing"),
    ("empty session", lambda r: r.update(session_id=""), 2, "session_id", "expected a string, got ''"),
    ("session not a string", lambda r: r.update(session_id=7), 2, "session_id", "expected a string, got 7"),
    ("negative tool time", lambda r: r["tools"].append(tool(tool_wall_latency_ms=-1)), 2,
     "tools[0].tool_wall_latency_ms", "must be >= 0, got -1"),
    ("negative internal time", lambda r: r["tools"].append(tool(tool_wall_latency_ms=None, tool_internal_latency_ms=-2.5)), 2,
     "tools[0].tool_internal_latency_ms", "must be >= 0, got -2.5"),
    ("tool time a bool", lambda r: r["tools"].append(tool(tool_wall_latency_ms=True)), 2,
     "tools[0].tool_wall_latency_ms", "expected a number, got True"),
    ("tool time a string", lambda r: r["tools"].append(tool(tool_wall_latency_ms="5")), 2,
     "tools[0].tool_wall_latency_ms", "expected a number, got '5'"),
    ("tool time not finite", lambda r: r["tools"].append(tool(tool_wall_latency_ms=math.inf)), 2,
     "tools[0].tool_wall_latency_ms", "expected a number, got inf"),
    ("internal time not a number", lambda r: r["tools"].append(tool(tool_wall_latency_ms=None, tool_internal_latency_ms=[])), 2,
     "tools[0].tool_internal_latency_ms", "expected a number, got []"),
    ("no wall time", lambda r: r["tools"].extend([tool(), {"tool_name": "exec", "tool_internal_latency_ms": 5}]), 2,
     "tools[1].tool_wall_latency_ms", "missing"),
    ("tool without name", lambda r: r["tools"].append({"tool_wall_latency_ms": 5}), 2, "tools[0].tool_name", "missing"),
    ("tool name not a string", lambda r: r["tools"].append(tool(tool_name=3)), 2, "tools[0].tool_name", "expected a string, got 3"),
    ("tool not an object", lambda r: r["tools"].append("exec"), 2, "tools[0]", "expected an object"),
    ("no tools", lambda r: r.pop("tools"), 2, "tools", "missing"),
    ("tools not a list", lambda r: r.update(tools={}), 2, "tools", "expected a list, got dict"),
    ("turns out of order", lambda r: r.update(round_index=0, prefix_tokens=7, input_tokens_total=17), 2, "round_index",
     "0 after 0 (line 1) in session 's': rounds out of order"),
    ("inconsistent total", lambda r: r.update(input_tokens_total=1), 2, "input_tokens_total",
     "1 is not prefix_tokens + newly_append_tokens = 20"),
    ("bad timestamp", lambda r: r["timing_events"].append({"event_type": "text", "timestamp": "yesterday"}), 2,
     "timing_events[0].timestamp", "not an ISO 8601 timestamp: 'yesterday'"),
    ("events not a list", lambda r: r.update(timing_events="text"), 2, "timing_events", "expected a list, got str"),
    ("event not an object", lambda r: r["timing_events"].append(["text"]), 2, "timing_events[0]", "expected an object"),
    ("event without type", lambda r: r["timing_events"].append({"timestamp": iso(1)}), 2, "timing_events[0].event_type", "missing"),
    ("event without time", lambda r: r["timing_events"].append({"event_type": "text"}), 2, "timing_events[0].timestamp", "missing"),
    ("negative total", lambda r: r.update(input_tokens_total=-1), 2, "input_tokens_total", "must be >= 0, got -1"),
    ("index not a number", lambda r: r.update(round_index="1"), 2, "round_index", "expected a whole number, got '1'"),
    ("negative append", lambda r: r.update(newly_append_tokens=-1), 2, "newly_append_tokens", "must be >= 0, got -1"),
    ("fractional reasoning", lambda r: r.update(reasoning_output_tokens=1.5), 2, "reasoning_output_tokens",
     "expected a whole number, got 1.5")]


@pytest.mark.parametrize(("label", "spoil", "line", "field", "message"), BAD_TRACELAB, ids=[b[0] for b in BAD_TRACELAB])
def test_bad_tracelab_rows_name_file_line_and_field(tmp_path, label, spoil, line, field, message):
    second = tracelab_row("s", 1, 10, 10, 5, [])
    spoil(second)
    path = write_jsonl(tmp_path / "bad.jsonl", [tracelab_row("s", 0, 0, 10, 5, [("exec", 1)]), second])
    assert refusal(traces.load, path) == (f"{path}:{line}: {field}: {message}", str(path), line, field)


# --- TraceLab CSV ------------------------------------------------------------------------------------------------

CSV_HEADER = ["id", "input_len", "output_len", "arrival_time", "round_idx", "tool_wait_after_ms", "prefix_len"]


def write_csv(path: Path, rows, header=CSV_HEADER) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_tracelab_csv_sessions_are_open_loop_tasks_and_a_csv_is_told_by_its_columns(tmp_path):
    path = write_csv(tmp_path / "coding_trace.csv", [
        [0, 3000, 100, "0.000000", 0, "1500.000000", 0],
        [0, 200, 50, "0.000000", 1, "0.000000", 3072],
        [1, 800, 40, "2500.500000", 0, "0.000000", 0]])
    trace = traces.load(path)
    assert trace.format == "tracelab-csv" and trace.notes == () and not trace.timed
    assert trace.tasks == (
        replayed("0", (TurnSpec(3000, 100, (1.5,)), TurnSpec(172, 50, ())), 0.0, "trace"),
        replayed("1", (TurnSpec(800, 40, ()),), 2.5005, "trace"))
    assert tracelab_csv.looks_like(["round_idx", "prefix_len"]) and tracelab_csv.looks_like(["round_idx", "input_len"])
    assert tracelab_csv.looks_like(["output_len", "round_idx"])
    assert not tracelab_csv.looks_like(["round_idx", "arrival_time"]) and not tracelab_csv.looks_like(["prefix_len", "input_len"])
    # A quoted session id may hold a line break, kept as written (the csv module's files are opened
    # with newline="").
    path = write_csv(tmp_path / "named.csv", [["s\r\n1", 10, 2, "0", 0, "250.5", 0], ["s\r\n1", 4, 2, "0", 1, "0", 12]],
                     ["session_id", *CSV_HEADER[1:]])
    assert traces.detect(path) == "tracelab-csv"
    trace = traces.load(path)
    assert (trace.path, trace.format) == (str(path), "tracelab-csv")
    assert trace.tasks == (replayed("s\r\n1", (TurnSpec(10, 2, (0.2505,)), TurnSpec(4, 2, ())), 0.0, "trace"),)
    assert [(r.session, r.line, r.input_tokens, r.cached_tokens, r.starts_request) for r in trace.rounds] == [
        ("s\r\n1", 3, 10, 0, True), ("s\r\n1", 5, 16, 12, False)]


BAD_CSV = [  # (label, header, rows, line, field, the whole message after the field)
    ("missing column", CSV_HEADER[:-1], [[0, 1, 1, 0, 0, 0]], 1, "prefix_len", "missing column"),
    ("missing session column", CSV_HEADER[1:], [[1, 1, 0, 0, 0, 0]], 1, "session_id", "missing column"),
    ("negative", CSV_HEADER, [[0, 1, 1, 0, 0, 0, 0], [0, -5, 1, 0, 1, 0, 0]], 3, "input_len", "must be >= 0, got '-5'"),
    ("not a number", CSV_HEADER, [[0, 1, "x", 0, 0, 0, 0]], 2, "output_len", "expected a number, got 'x'"),
    ("not whole", CSV_HEADER, [[0, 1, 1, 0, 0.5, 0, 0]], 2, "round_idx", "expected a whole number, got '0.5'"),
    ("prefix not whole", CSV_HEADER, [[0, 1, 1, 0, 0, 0, 2.5]], 2, "prefix_len", "expected a whole number, got '2.5'"),
    ("input not whole", CSV_HEADER, [[0, 1.5, 1, 0, 0, 0, 0]], 2, "input_len", "expected a whole number, got '1.5'"),
    ("output not whole", CSV_HEADER, [[0, 1, 1.5, 0, 0, 0, 0]], 2, "output_len", "expected a whole number, got '1.5'"),
    ("prefix not a number", CSV_HEADER, [[0, 1, 1, 0, 0, 0, "a"]], 2, "prefix_len", "expected a number, got 'a'"),
    ("negative wait", CSV_HEADER, [[0, 1, 1, 0, 0, -1, 0]], 2, "tool_wait_after_ms", "must be >= 0, got '-1'"),
    ("not finite", CSV_HEADER, [[0, 1, 1, "inf", 0, 0, 0]], 2, "arrival_time", "expected a number, got 'inf'"),
    ("turns out of order", CSV_HEADER, [[0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 2, 0, 0]], 3, "round_idx",
     "2 in session '0', expected 1: rounds out of order"),
    ("session starts late", CSV_HEADER, [[0, 1, 1, 0, 1, 0, 0]], 2, "round_idx", "session '0' starts at 1, expected 0"),
    ("session resumes", CSV_HEADER, [[0, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0, 0]], 4, "id",
     "session '0' resumes after other sessions: rows out of order"),
    ("arrival differs", CSV_HEADER, [[0, 1, 1, "5.0", 0, 0, 0], [0, 1, 1, "6.0", 1, 0, 0]], 3, "arrival_time",
     "6.0 differs from the session's first row"),
    ("missing value", CSV_HEADER, [[0, 1, 1, "", 0, 0, 0]], 2, "arrival_time", "missing"),
    ("blank session", CSV_HEADER, [[" ", 1, 1, 0, 0, 0, 0]], 2, "id", "missing"),
    ("short row", CSV_HEADER, [[0, 1, 1, 0, 0, 0]], 2, None, "expected 7 columns"),
    ("long row", CSV_HEADER, [[0, 1, 1, 0, 0, 0, 0, 9]], 2, None, "expected 7 columns"),
    ("no rows", CSV_HEADER, [], 1, None, "the trace holds no model calls")]


@pytest.mark.parametrize(("label", "header", "rows", "line", "field", "message"), BAD_CSV, ids=[b[0] for b in BAD_CSV])
def test_bad_csv_names_file_line_and_field(tmp_path, label, header, rows, line, field, message):
    path = write_csv(tmp_path / "bad.csv", rows, header)
    text = f"{path}:{line}: {field}: {message}" if field else f"{path}:{line}: {message}"
    assert refusal(tracelab_csv.read, path) == (text, str(path), line, field)


# --- Codex rollouts ----------------------------------------------------------------------------------------------


def rollout_line(at: float, kind: str, **payload) -> dict:
    return {"timestamp": iso(at), "type": kind, "payload": payload}


def token_count(at: float, input_tokens: int, cached: int, output: int, reasoning: int = 0, total: int = 0) -> dict:
    usage = {"input_tokens": input_tokens, "cached_input_tokens": cached, "output_tokens": output,
             "reasoning_output_tokens": reasoning, "total_tokens": input_tokens + output}
    return rollout_line(at, "event_msg", type="token_count",
                        info={"total_token_usage": {**usage, "total_tokens": total}, "last_token_usage": usage})


def codex_rollout() -> list[dict]:
    return [
        rollout_line(0.0, "session_meta", id="sess-1", timestamp=iso(0.0), cli_version="0.171.0"),
        rollout_line(0.1, "event_msg", type="task_started", turn_id="t1"),
        rollout_line(0.2, "response_item", type="message", role="user", content=[]),
        rollout_line(0.3, "turn_context", cwd="/x"),
        rollout_line(1.0, "response_item", type="reasoning", summary=[]),
        rollout_line(1.5, "response_item", type="function_call", name="exec_command", arguments="{}", call_id="c1"),
        rollout_line(1.6, "response_item", type="function_call", name="apply_patch", arguments="{}", call_id="c2"),
        rollout_line(1.6, "event_msg", type="token_count", info=None),  # rate limits only
        token_count(1.7, 9000, 0, 300, 120, total=1),
        token_count(1.7, 9000, 0, 300, 120, total=1),  # the same call reported twice
        rollout_line(2.0, "response_item", type="function_call_output", call_id="c1", output="ok"),
        rollout_line(4.6, "response_item", type="function_call_output", call_id="c2", output="ok"),
        rollout_line(5.0, "response_item", type="web_search_call", status="completed", action={}),
        rollout_line(5.1, "response_item", type="function_call", name="web_search", arguments="{}", call_id="c3"),
        rollout_line(5.8, "response_item", type="message", role="assistant", content=[]),
        token_count(5.9, 9700, 9216, 150, 0, total=2),
        rollout_line(6.0, "event_msg", type="task_complete", turn_id="t1")]


def test_codex_rollout_rounds_tools_hosted_and_timing(tmp_path):
    folder = tmp_path / "sessions" / "2026" / "11" / "30"
    folder.mkdir(parents=True)
    trace = traces.load(write_jsonl(folder / "rollout-2026-11-30T00-00-00-sess-1.jsonl", codex_rollout()))
    assert trace.format == "codex" and trace.notes == ()
    # 9700 - 9000 - 300 = 400 tokens appended; the web search runs inside the second call
    assert trace.tasks == (replayed("sess-1", (TurnSpec(9000, 300, (0.5, 3.0), (), 120),
                                               TurnSpec(400, 150, (), (HostedCall(0.0, 0),) * 2)), 0.0, "trace:codex"),)
    first, second = trace.rounds  # times from the first request (task_started at 0.1 s)
    assert (first.started_at, first.ended_at, first.reasoning_tokens) == (0.1, 1.5, 120)
    assert (second.started_at, second.ended_at, second.cached_tokens) == (4.5, 5.7, 9216)
    assert traces.load(tmp_path / "sessions").tasks == trace.tasks  # a $CODEX_HOME/sessions folder
    # A rollout line is told by its type, payload and timestamp.
    line = {"timestamp": iso(0.0), "type": "event_msg", "payload": {}}
    assert codex.looks_like(line) and not codex.looks_like({k: v for k, v in line.items() if k != "timestamp"})
    assert not codex.looks_like({**line, "type": "something_else"})


def test_the_project_made_codex_rollout_fixture_loads_and_a_sweep_adjusts_its_task():
    """A rollout `codex exec` (0.171.0) wrote against `python -m prototype serve --workload compact --seed 4` with
    model `sim-500` (docs/codex.md, docs/parameters.md "Traces and calibrate"), contents removed."""
    trace = traces.load(FIXTURE)
    assert trace.format == "codex" and trace.notes == () and len(trace.tasks) == 1
    task = trace.tasks[0]
    assert len(task.turns) == 9 and task.turns[0].appended_tokens == 8039
    assert all(len(t.tool_seconds) == 1 for t in task.turns[:-1])
    # the compact preset's task 0 of seed 4 samples 252, 1584, 580, 58, 298, 161, 348, 60, 382 tokens of text; Codex
    # counts a few more per turn (the tool call's arguments)
    assert [r.output_tokens for r in trace.rounds] == [295, 1590, 587, 65, 307, 168, 354, 61, 382]
    assert all(r.model_seconds is not None and r.model_seconds > 0 for r in trace.rounds)
    swept = traces.adjusted(task, tool_seconds=2.0, initial_prompt_tokens=100, closed_loop=True)
    assert swept.arrival_s is None and swept.turns[0].appended_tokens == 100
    assert [t.tool_seconds for t in swept.turns] == [(2.0,)] * 8 + [()]
    assert [t.output_tokens for t in swept.turns] == [t.output_tokens for t in task.turns] and traces.adjusted(task) == task


# --- the testbed's own format, detection -------------------------------------------------------------------------


def test_a_testbed_trace_keeps_tasks_by_arrival_its_rounds_on_a_perfect_cache_and_refuses_no_turns(tmp_path):
    tasks = [attrs.evolve(t, arrival_s=a) for t, a in zip(wl.generate("chat", seed=2, n_tasks=3), (3.0, 0.0, 1.5))]
    path = tmp_path / "own.jsonl"
    native.write_trace(tasks, path)
    trace = traces.load(path)
    assert (trace.path, trace.format, trace.timed) == (str(path), "testbed", False)
    assert trace.tasks == (tasks[1], tasks[2], tasks[0])  # by arrival
    path = tmp_path / "own.jsonl"
    path.write_text("\n\n")
    assert refusal(native.read, path)[0] == f"{path}:1: the trace holds no turns"
    # No task with an arrival: a closed-loop trace, its tasks in file order.
    write_jsonl(path, [{**FIRST, "task": "b"}, {**LAST, "task": "b"}, FIRST, LAST])
    assert [(t.name, t.arrival_s) for t in native.read(path).tasks] == [("b", None), ("a", None)]
    path = write_jsonl(tmp_path / "own.jsonl", [{**FIRST, "hosted_calls": [{"seconds": 2.0, "result_tokens": 7}], "reasoning_tokens": 1},
                                                LAST])
    assert list(native.read(path).rounds) == [
        Round("a", 0, 10, 0, 2, 1, (1,), ((2.0, 7),), task="a", turn=0),
        # Everything before the 10 appended tokens cached: the first 10, the 2 sampled and the search's 7.
        Round("a", 0, 29, 19, 2, 0, (), (), task="a", turn=1)]


FIRST = {"task": "a", "seed": 0, "turn": 0, "appended_tokens": 10, "output_tokens": 2, "tool_calls": [{"seconds": 1}]}
LAST = {**FIRST, "turn": 1, "tool_calls": []}
BAD_TESTBED = [  # (label, lines, where the refusal points: "line: field" or "line", its message)
    ("not an object", [FIRST, [1, 2]], "2", "expected a JSON object"),
    ("invalid JSON", [FIRST, "{not json"], "2", "invalid JSON (Expecting property name enclosed in double quotes)"),
    ("unknown key", [FIRST, {**LAST, "zeta": 1}], "2: zeta", "unknown key(s) ['zeta']"),
    ("missing key", [FIRST, {k: v for k, v in LAST.items() if k != "output_tokens"}], "2: output_tokens",
     "missing key 'output_tokens'"),
    ("a call not an object", [{**FIRST, "tool_calls": [5]}, LAST], "1", "expected an object, got 5"),
    ("wrong type", [FIRST, {**LAST, "output_tokens": "2"}], "2: output_tokens", "'output_tokens' has the wrong type: '2'"),
    ("negative count", [FIRST, {**LAST, "appended_tokens": -4}], "2: appended_tokens", "appended_tokens must be >= 0, got -4"),
    ("a boolean count", [FIRST, {**LAST, "output_tokens": True}], "2: output_tokens", "'output_tokens' has the wrong type: True"),
    ("negative seed", [{**FIRST, "seed": -1}, {**LAST, "seed": -1}], "1: seed", "seed must be >= 0, got -1"),
    ("negative arrival", [{**FIRST, "arrival_s": -1.0}, LAST], "1: arrival_s", "'arrival_s' must be finite and >= 0, got -1.0"),
    ("infinite arrival", [{**FIRST, "arrival_s": math.inf}, LAST], "1: arrival_s", "'arrival_s' must be finite and >= 0, got inf"),
    ("arrival after turn 0", [FIRST, {**LAST, "arrival_s": 1.0}], "2: arrival_s", "'arrival_s' belongs on a task's first line (turn 0)"),
    ("a task field after turn 0", [FIRST, {**LAST, "prefix": "p"}], "2: prefix", "['prefix'] belong on a task's first line (turn 0)"),
    # The task's name in a message is no field.
    ("no tool calls before the end", [{**FIRST, "tool_calls": []}, LAST], "1",
     "turn 0 of task 'a' has no tool calls but is not the task's last turn"),
    ("out of order", [FIRST, {**LAST, "turn": 3}], "2", "turn 3 of task 'a' out of order, expected 1"),
    ("starts late", [{**FIRST, "turn": 1}], "1", "task 'a' starts at turn 1, expected 0"),
    ("a later task starts mid-way", [FIRST, LAST, {**LAST, "task": "u"}], "3", "task 'u' starts at turn 1, expected 0"),
    ("no output", [{**FIRST, "output_tokens": 0}, LAST], "1: output_tokens", "output_tokens must be >= 1, got 0"),
    ("negative tool time", [{**FIRST, "tool_calls": [{"seconds": -0.1}]}, LAST], "1: tool_seconds",
     "tool_seconds must be finite and >= 0, got -0.1"),
    ("a call without seconds", [{**FIRST, "tool_calls": [{}]}, LAST], "1: seconds", "missing key 'seconds'"),
    ("negative search result", [{**FIRST, "hosted_calls": [{"seconds": 1.0, "result_tokens": -5}]}, LAST], "1: result_tokens",
     "result_tokens must be >= 0, got -5"),
    ("a last turn with tools, then a blank line and another task", [FIRST, {**LAST, "tool_calls": [{"seconds": 1}]}, "",
                                                                     {**LAST, "task": "u", "turn": 0}], "2",
     "last turn of task 'a' has tool calls (truncated task?)"),
    ("truncated", [FIRST], "1", "last turn of task 'a' has tool calls (truncated task?)"),
    ("a prefix longer than the prompt", [{**FIRST, "prefix_tokens": 20}, LAST], "1", "prefix_tokens (20) exceeds turn 0's 10 tokens"),
    # A task's own values are checked when the task is complete: the refusal names that task's first line.
    ("a later task's prefix longer than its prompt", [FIRST, LAST, "", {**FIRST, "task": "b", "prefix_tokens": 20}, {**LAST, "task": "b"}],
     "4", "prefix_tokens (20) exceeds turn 0's 10 tokens"),
    # A task closed by the next task's first line, not by the end of the file, names its own first line too.
    ("an earlier task's prefix longer than its prompt", ["", {**FIRST, "prefix_tokens": 20}, LAST, {**FIRST, "task": "b"},
                                                          {**LAST, "task": "b"}], "2", "prefix_tokens (20) exceeds turn 0's 10 tokens"),
    ("a later task's negative prefix", [FIRST, LAST, {**FIRST, "task": "b", "prefix_tokens": -3}, {**LAST, "task": "b"}],
     "3: prefix_tokens", "prefix_tokens must be >= 0, got -3"),
    ("arrivals of some tasks", [{**FIRST, "arrival_s": 1.0}, LAST, {**FIRST, "task": "b"}, {**LAST, "task": "b"}], "1: arrival_s",
     "task 'b' has none while others do: give all or none"),
    # The first line has exactly the keys that make a testbed trace.
    ("only the keys that tell the format", [{"task": "a", "turn": 0, "appended_tokens": 10}], "1: seed", "missing key 'seed'")]


@pytest.mark.parametrize(("label", "lines", "where", "message"), BAD_TESTBED, ids=[b[0] for b in BAD_TESTBED])
def test_each_bad_testbed_trace_is_refused_with_its_file_line_field_and_reason(tmp_path, label, lines, where, message):
    path = tmp_path / "own.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    assert refusal(traces.load, path)[0] == f"{path}:{where}: {message}"


def codex_edge_rollout() -> list[dict]:
    """A rollout at the reader's edges: the session named by `session_id`, a line whose payload is no object, an
    unknown item, two hosted searches in a round, two calls never answered, a shell call known by its `id`, answered
    twice (its time a difference of two epoch timestamps that floats do not hold exactly), a developer message, usage
    without `cached_input_tokens` or `reasoning_output_tokens` or with a null, a model named by `turn_context`, an
    input at the instant of the round's first output, two token counts after no output and an output with no count
    after it."""
    return [
        rollout_line(0.0, "session_meta", session_id="s-2"),
        {"timestamp": iso(0.05), "type": "event_msg", "payload": "not an object"},
        rollout_line(0.1, "response_item", type="message", role="user", content=[]),
        rollout_line(0.2, "response_item", type="ghost_snapshot"),
        # Usage is read from token_count events only.
        rollout_line(0.25, "event_msg", type="agent_message", info={"last_token_usage": {"input_tokens": 7, "output_tokens": 1}}),
        rollout_line(1.0, "response_item", type="web_search_call", status="completed", action={}),
        rollout_line(1.1, "response_item", type="web_search_call", status="completed", action={}),
        rollout_line(1.3, "response_item", type="function_call", name="exec", arguments="{}", call_id="c9"),
        rollout_line(1.3, "response_item", type="function_call", name="exec", arguments="{}", call_id="c8"),
        rollout_line(1.33, "response_item", type="local_shell_call", id="ls1", action={}),
        rollout_line(1.35, "response_item", type="message", role="developer", content=[]),  # neither input nor output
        rollout_line(1.4, "event_msg", type="token_count", info={"last_token_usage": {"input_tokens": 500, "output_tokens": 50}}),
        rollout_line(2.0, "response_item", type="function_call_output", call_id="ls1", output="ok"),
        rollout_line(2.5, "response_item", type="function_call_output", call_id="ls1", output="again"),
        rollout_line(3.0, "turn_context", model="gpt-5"),
        rollout_line(3.0, "response_item", type="message", role="user", content=[]),
        rollout_line(3.0, "response_item", type="reasoning", summary=[]),
        rollout_line(3.2, "event_msg", type="token_count", info={"last_token_usage": {
            "input_tokens": 800, "cached_input_tokens": None, "output_tokens": 20, "reasoning_output_tokens": 5}}),
        rollout_line(3.3, "event_msg", type="token_count", info={"last_token_usage": {"input_tokens": 1, "output_tokens": 1}}),
        rollout_line(3.4, "event_msg", type="token_count", info={"last_token_usage": {"input_tokens": 2, "output_tokens": 1}}),
        rollout_line(4.0, "response_item", type="message", role="assistant", content=[])]


def test_a_codex_rollout_at_the_readers_edges(tmp_path):
    path = write_jsonl(tmp_path / "rollout-edges.jsonl", codex_edge_rollout())
    rounds, notes = codex.read_sessions(path)
    at = lambda t: None if t is None else round(t - T0, 3)  # noqa: E731
    assert [(r.session, r.line, r.input_tokens, r.cached_tokens, r.output_tokens, r.reasoning_tokens, r.hosted, r.starts_request,
             at(r.started_at), at(r.ended_at), at(r.request_at), r.group, r.tool_seconds) for r in rounds] == [
        ("s-2", 12, 500, 0, 50, 0, ((0.0, 0),) * 2, True, 0.1, 1.33, 0.1, "codex", (0.0, 0.0, 0.67)),
        ("s-2", 18, 800, 0, 20, 5, (), True, 3.0, 3.0, 3.0, "codex/gpt-5", ())]
    assert notes == {"no_output": 2, "unreported": 3}
    assert codex.notes_text(notes) == ["2 tool call(s) have no output item: timed as 0 s",
                                       "3 model output(s) have no token_count after them (interrupted): not replayed"]
    assert codex.notes_text({"no_output": 0, "unreported": 0}) == []
    # Without a session_meta line, the file names the session; one that comes late names every round of the file.
    write_jsonl(path, codex_edge_rollout()[1:])
    assert {r.session for r in codex.read_sessions(path)[0]} == {"rollout-edges"}
    write_jsonl(path, [*codex_edge_rollout()[1:], rollout_line(4.1, "session_meta", id="late")])
    assert [r.session for r in codex.read_sessions(path)[0]] == ["late", "late"]
    # A round whose output no input precedes has no start.
    write_jsonl(path, [rollout_line(1.0, "response_item", type="message", role="assistant", content=[]),
                       rollout_line(1.1, "event_msg", type="token_count", info={"last_token_usage": {"input_tokens": 5, "output_tokens": 1}})])
    ((only,), _) = codex.read_sessions(path)
    assert (only.started_at, only.starts_request, at(only.ended_at)) == (None, False, 1.0)


def test_a_codex_round_may_be_wholly_cached_and_running_totals_stand_in_for_last_usage_nulls_and_all(tmp_path):
    lines = codex_rollout()
    lines[8]["payload"]["info"]["last_token_usage"].update(cached_input_tokens=9000)
    assert traces.load(write_jsonl(tmp_path / "rollout-cached.jsonl", lines)).rounds[0].cached_tokens == 9000
    totals = [rollout_line(0.1, "response_item", type="message", role="user", content=[]),
              rollout_line(1.0, "response_item", type="message", role="assistant", content=[])]
    for at, total in ((1.1, 100), (2.1, 250)):
        totals.append(rollout_line(at, "event_msg", type="token_count", info={"total_token_usage": {
            "input_tokens": total, "output_tokens": 10, "reasoning_output_tokens": None}}))
        totals.append(rollout_line(at + 0.5, "response_item", type="message", role="assistant", content=[]))
    rounds, _ = codex.read_sessions(write_jsonl(tmp_path / "rollout-totals.jsonl", totals[:-1]))
    assert [(r.input_tokens, r.output_tokens, r.reasoning_tokens) for r in rounds] == [(100, 10, 0), (150, 0, 0)]
    lines = codex_rollout()
    for index, total in ((8, (9000, 0, 300, 120)), (15, (18700, 9216, 450, 120))):
        info = lines[index]["payload"]["info"]
        info.pop("last_token_usage")
        info["total_token_usage"] = dict(zip(("input_tokens", "cached_input_tokens", "output_tokens",
                                              "reasoning_output_tokens"), total))
    lines.pop(9)  # no repeated report
    first, second = traces.load(write_jsonl(tmp_path / "rollout-t.jsonl", lines)).rounds
    assert (first.input_tokens, first.output_tokens, second.input_tokens, second.cached_tokens, second.output_tokens) == (
        9000, 300, 9700, 9216, 150)


def spoil_usage(**fields):
    return lambda lines: lines[8]["payload"]["info"]["last_token_usage"].update(fields)


def spoil_info(value):
    return lambda lines: lines[8]["payload"].update(info=value)


USAGE = "payload.info.last_token_usage"
BAD_CODEX = [  # (label, spoil, line, field, the refusal's whole text after the field; None: the timestamp parser's own)
    ("no timestamp", lambda lines: lines[4].pop("timestamp"), 5, "timestamp", "missing"),
    ("bad timestamp", lambda lines: lines[4].update(timestamp="yesterday"), 5, "timestamp", None),
    ("non-monotonic", lambda lines: lines[5].update(timestamp=iso(0.5)), 6, "timestamp",
     f"{iso(0.5)} is earlier than the line before: lines out of order"),
    ("a call without id", lambda lines: lines[5]["payload"].pop("call_id"), 6, "payload.call_id", "missing"),
    ("info not an object", spoil_info(5), 9, "payload.info", "expected an object, got 5"),
    ("no usage", spoil_info({"total_token_usage": None}), 9, USAGE, "missing"),
    ("totals without input", spoil_info({"total_token_usage": {"output_tokens": 3}}), 9,
     "payload.info.total_token_usage.input_tokens", "missing"),
    ("missing input", lambda lines: lines[8]["payload"]["info"]["last_token_usage"].pop("input_tokens"), 9,
     f"{USAGE}.input_tokens", "missing"),
    ("null input", spoil_usage(input_tokens=None), 9, f"{USAGE}.input_tokens", "expected a whole number, got None"),
    ("negative output", spoil_usage(output_tokens=-1), 9, f"{USAGE}.output_tokens", "must be >= 0, got -1"),
    ("negative cached", spoil_usage(cached_input_tokens=-1), 9, f"{USAGE}.cached_input_tokens", "must be >= 0, got -1"),
    ("negative reasoning", spoil_usage(reasoning_output_tokens=-2), 9, f"{USAGE}.reasoning_output_tokens", "must be >= 0, got -2"),
    ("cached over input", lambda lines: lines[15]["payload"]["info"]["last_token_usage"].update(cached_input_tokens=10**6), 16,
     f"{USAGE}.cached_input_tokens", "1000000 exceeds input_tokens 9700")]


@pytest.mark.parametrize(("label", "spoil", "line", "field", "message"), BAD_CODEX, ids=[b[0] for b in BAD_CODEX])
def test_each_bad_codex_rollout_is_refused_with_its_line_field_and_whole_message(tmp_path, label, spoil, line, field, message):
    lines = codex_rollout()
    spoil(lines)
    path = write_jsonl(tmp_path / "rollout-x.jsonl", lines)
    if message is None:
        with pytest.raises(ValueError) as reason:
            parse_timestamp("yesterday")
        message = str(reason.value)
    assert refusal(traces.load, path) == (f"{path}:{line}: {field}: {message}", str(path), line, field)


# --- building tasks from rounds (traces/base.py), as every reader does ----------------------------------------------


def test_build_cuts_requests_into_turns_and_says_each_adjustment_with_its_count(tmp_path):
    r = lambda session, input_tokens, cached, output, reasoning=0, tools=(), hosted=(), start=None, at=None, request=None: Round(  # noqa: E731
        session, 0, input_tokens, cached, output, reasoning, tools, hosted, start, at, None, request)
    sessions = [
        [r("s", 100, 0, 0, tools=(1.0,), start=True, at=0.0),  # no output: replayed as 1
         r("s", 90, 0, 5, 5, hosted=((2.0, 7), (3.0, 7)), at=1.0),  # the prompt shrank by 10; hosted only: the turn goes on
         r("s", 104, 0, 3, 3, tools=(0.5, 0.5), at=2.0),  # 9 appended: the two searches' results; then interrupted
         r("s", 300, 80, 4, start=True, at=3.0),  # a new request finding 60 tokens more than the common prefix cached
         r("s", 310, 20, 4, start=True, at=4.0),  # only the common prefix
         r("s", 320, 50, 4, start=True, at=5.0)],  # 30 more
        [r("t", 50, 20, 1, 1, tools=(0.2,), start=True, at=5.5, request=5.0),  # as much reasoning as output
         r("t", 40, 0, 0, tools=(0.3,), at=6.0)],  # shrank by 11, no output, interrupted
        [r("u", 60, 40, 2, start=True, at=7.0)],
        [r("v", 60, 0, 2, start=True, at=8.0)]]
    trace = build(tmp_path / "t.jsonl", "test", sessions)
    # The common prefix is the median (low) of what the sessions' first requests found cached, where they found any:
    # 20 and 40 give 20.
    by_name = {task.name: task for task in trace.tasks}
    assert [(t.name, t.arrival_s, t.prefix_tokens) for t in trace.tasks] == [
        ("s", 0.0, 20), ("s/1", 3.0, 20), ("s/2", 4.0, 20), ("s/3", 5.0, 20), ("t", 5.0, 20), ("u", 7.0, 20), ("v", 8.0, 20)]
    assert by_name["s"].turns == (
        TurnSpec(100, 1, (1.0,)),
        # The searches' results split the next round's 9 appended tokens, the remainder on the first.
        TurnSpec(0, 8, (), (HostedCall(2.0, 5), HostedCall(3.0, 4)), 7))
    assert by_name["t"].turns == (TurnSpec(50, 1, (0.2,), (), 0), TurnSpec(0, 1, ()))
    assert list(trace.notes) == [
        "2 request(s) ended on a round with client tool calls (interrupted): their last 3 call(s) are not replayed",
        "the prompt shrank at 2 round(s) (context compaction): replayed as appending nothing, so the replayed context "
        "exceeds the trace's by up to 11 tokens",
        "2 round(s) report 0 output tokens: replayed as 1",
        "2 request(s) continue a session whose earlier context the trace found cached (90 tokens in all): replayed with "
        "their own content, sharing only the session's common prefix, so those tokens are prefilled",
        "2 turn(s) report as many reasoning as output tokens: replayed with one visible token"]
    # A prompt that grew by exactly the previous output appended nothing: it did not shrink.
    # Two hosted-only rounds in a row: one turn, holding both rounds' searches.
    steady = build(tmp_path / "t.jsonl", "test", [[r("x", 10, 0, 2, tools=(1.0,), start=True, at=0.0), r("x", 12, 0, 2, at=1.0)],
                                                  [r("h", 10, 0, 2, hosted=((1.0, 9),), start=True, at=2.0),
                                                   r("h", 15, 0, 2, hosted=((2.0, 9),), at=3.0), r("h", 20, 0, 2, at=4.0)]])
    assert steady.tasks[0].turns == (TurnSpec(10, 2, (1.0,)), TurnSpec(0, 2, ())) and list(steady.notes) == []
    assert steady.tasks[1].turns == (TurnSpec(10, 6, (), (HostedCall(1.0, 3), HostedCall(2.0, 3))),)
    # The common prefix counts sessions' first requests that found any cached, one token included: 1 and 30 give 1.
    shared = build(tmp_path / "t.jsonl", "test", [[r("a", 100, 0, 2, start=True, at=0.0)], [r("b", 100, 1, 2, start=True, at=1.0)],
                                                  [r("c", 100, cached, 2, start=True, at=2.0 + k) for k, cached in enumerate((30, 40, 50))]])
    assert [t.prefix_tokens for t in shared.tasks] == [1] * 5
    # Some tasks without an arrival: none keeps one, and the note says why.
    mixed = build(tmp_path / "t.jsonl", "test", [[r("a", 10, 0, 1, start=True, at=1.0)], [r("b", 10, 0, 1, start=True)]])
    assert [t.arrival_s for t in mixed.tasks] == [None, None]
    assert list(mixed.notes) == ["some tasks have no arrival time: the replay runs tasks one after another"]


def test_a_jsonl_trace_skips_blank_lines_and_refuses_a_line_that_is_no_object(tmp_path):
    lines, spaced = [json.dumps(line) for line in codex_rollout()], tmp_path / "rollout-spaced.jsonl"
    spaced.write_text("\n".join([*lines[:3], "", "   ", *lines[3:]]) + "\n")
    assert traces.load(spaced).tasks == traces.load(write_jsonl(tmp_path / "rollout-plain.jsonl", codex_rollout())).tasks
    for bad, message in (("{oops", "invalid JSON (Expecting property name enclosed in double quotes)"),
                         ("[1, 2]", "expected a JSON object")):
        path = tmp_path / "rollout-bad.jsonl"
        path.write_text("\n".join([*lines[:2], bad, *lines[2:]]) + "\n")
        assert refusal(traces.load, path)[0] == f"{path}:3: {message}"


def test_timestamps_are_iso_8601_with_a_time_zone():
    assert parse_timestamp("2026-03-21T10:06:13.381z") == parse_timestamp("2026-03-21T10:06:13.381Z") == parse_timestamp(
        "2026-03-21T10:06:13.381+00:00") == 1774087573.381
    for value, message in ((5, "expected an ISO 8601 timestamp string, got 5"),
                           ("2026-03-21T10:06:13", "timestamp without a time zone: '2026-03-21T10:06:13'"),
                           ("yesterday", "not an ISO 8601 timestamp: 'yesterday'")):
        with pytest.raises(ValueError) as refused:
            parse_timestamp(value)
        assert str(refused.value) == message


def test_a_session_name_that_is_no_valid_unicode_still_names_its_own_content():
    # JSON may escape a lone surrogate into a session id; its task's content seed is made all the same.
    assert content_seed_of_task("s\udc80") != content_seed_of_task("s\udc81")


# --- detect and load: which reader, and the refusals before any reader ----------------------------------------------


def test_detect_and_load_refuse_with_the_file_the_line_and_exactly_why(tmp_path):
    path = tmp_path / "t.txt"

    path.write_bytes(b'{"task": "\xff"}\n')
    assert refusal(traces.detect, path) == (f"{path}:1: not a UTF-8 text file", str(path), 1, None)
    assert refusal(native.read, path) == (f"{path}:1: not a UTF-8 text file", str(path), 1, None)
    path.write_text(" \n\t\n")
    assert refusal(traces.detect, path) == (f"{path}:1: empty file", str(path), 1, None)
    path.write_text("\n\n{not json\n")
    assert refusal(traces.detect, path) == (f"{path}:3: invalid JSON (Expecting property name enclosed in double quotes)", str(path), 3, None)
    path.write_text("\n" + json.dumps({k: 1 for k in "jihgfedcba"}) + "\n")
    assert refusal(traces.detect, path) == (f"{path}:2: unknown trace format: a JSON object with keys a, b, c, d, e, f, g, h; expected a "
                         "testbed trace (task, turn, ...), a TraceLab round (session_id, round_index, ...) or a Codex "
                         "rollout line (timestamp, type, payload)", str(path), 2, None)
    path.write_text("\n\n" + "x" * 70 + "\n")
    assert refusal(traces.detect, path) == (f"{path}:3: unknown trace format: first line {'x' * 60!r}; expected JSONL or a TraceLab CSV "
                         "header (input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len)",
                         str(path), 3, None)
    missing = tmp_path / "missing.jsonl"
    assert refusal(traces.load, str(missing)) == (f"{missing}:0: no such file", str(missing), 0, None)
    folder = tmp_path / "sessions"
    (folder / "sub").mkdir(parents=True)
    write_jsonl(folder / "sub" / "other.jsonl", codex_rollout())  # not named rollout-*.jsonl
    assert refusal(traces.load, folder) == (f"{folder}:0: folder without rollout-*.jsonl files", str(folder), 0, None)
    write_jsonl(folder / "rollout-a.jsonl", codex_rollout())
    bad = write_jsonl(folder / "sub" / "rollout-b.jsonl", [FIRST, LAST])  # a testbed trace under a rollout's name
    assert refusal(traces.load, folder) == (f"{bad}:1: not a Codex rollout", str(bad), 1, None)


def test_a_byte_that_is_not_utf_8_is_refused_at_its_own_line_by_every_reader(tmp_path):
    readers = (
        (native.read, [json.dumps(row) for row in (FIRST, LAST, {**FIRST, "task": "b"}, {**LAST, "task": "b"})]),
        (tracelab.read, [json.dumps(tracelab_row(f"s{i}", 0, 0, 10, 2)) for i in range(4)]),
        (codex.read_sessions, [json.dumps(line) for line in codex_rollout()]),
        (tracelab_csv.read, [",".join(CSV_HEADER)] + [f"s{i},10,2,0,0,0,0" for i in range(3)]),
        (engine_calls.read, [",".join(engine_calls.COLUMNS)] + ["http,600,600,40,360,1950"] * 3))
    path = tmp_path / "trace"
    for newline in ("\n", "\r\n", "\r"):  # the line the refusal names is counted the way the readers count lines
        for read, lines in readers:
            path.write_bytes(newline.join(lines[:2]).encode() + newline.encode() + b"\xff" + newline.join(lines[2:]).encode())
            assert refusal(read, path) == (f"{path}:3: not a UTF-8 text file", str(path), 3, None)
    # Past the first block of a long file, where detect has read the first line and passed the file to its reader.
    rows = [",".join(CSV_HEADER)] + [f"s{i},10,2,0,0,0,0" for i in range(2000)]
    path.write_bytes("\r".join(rows).encode() + b"\rs\xff,10,2,0,0,0,0\r")
    assert traces.detect(path) == "tracelab-csv" and refusal(traces.load, path) == (
        f"{path}:2002: not a UTF-8 text file", str(path), 2002, None)


@pytest.fixture
def ascii_locale():
    """ASCII as Python's default text encoding, as on a machine whose locale is not UTF-8; restored after."""
    if sys.flags.utf8_mode:
        pytest.skip("Python's UTF-8 mode reads every file as UTF-8 whatever the locale")
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert locale.getpreferredencoding(False) == "ANSI_X3.4-1968"  # what open() now takes without an encoding
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


def test_every_format_is_read_as_utf_8_whatever_the_locale(tmp_path, ascii_locale):
    name = "café-1"
    rollout = [rollout_line(0.0, "session_meta", id=name), *codex_rollout()[1:]]
    for file, rows in (("own.jsonl", [{**FIRST, "task": name}, {**LAST, "task": name}]), ("rollout-x.jsonl", rollout),
                       ("round_trace.jsonl", [tracelab_row(name, 0, 0, 10, 2)])):
        (tmp_path / file).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    (tmp_path / "trace.csv").write_text(f"{','.join(CSV_HEADER)}\n{name},10,2,0,0,0,0\n", encoding="utf-8")
    for file in ("own.jsonl", "rollout-x.jsonl", "round_trace.jsonl", "trace.csv"):
        assert [t.name for t in traces.load(tmp_path / file).tasks] == [name]
    calls = tmp_path / "calls.csv"  # a real engine's calls, the design named alike
    calls.write_text(f"{','.join(engine_calls.COLUMNS)}\n{name},600,600,40,360,1950\n", encoding="utf-8")
    assert engine_calls.looks_like(calls) and [call.design for call in engine_calls.read(calls)] == [name]


def test_load_reads_a_folder_of_rollouts_as_one_trace_with_their_notes_summed(tmp_path):
    folder = tmp_path / "sessions"
    (folder / "2026").mkdir(parents=True)
    write_jsonl(folder / "2026" / "rollout-b.jsonl", codex_edge_rollout())
    write_jsonl(folder / "rollout-a.jsonl", codex_rollout())
    write_jsonl(folder / "rollout-c.jsonl", [{**line, "payload": {**line["payload"], "id": "s-3"}}
                                             if line["type"] == "session_meta" else line for line in codex_edge_rollout()])
    trace, alone = traces.load(str(folder)), traces.load(folder / "rollout-a.jsonl")
    assert (trace.path, trace.format) == (str(folder), "codex")
    assert (alone.path, alone.format, alone.notes) == (str(folder / "rollout-a.jsonl"), "codex", ())
    # The files in sorted path order (the subfolder's first), each its own session; the two edge files' notes added up.
    assert [t.name for t in trace.tasks] == ["s-2", "sess-1", "s-3", "s-2/1", "s-3/1"]
    assert [r.session for r in trace.rounds] == ["s-2", "s-2", "sess-1", "sess-1", "s-3", "s-3"]
    assert trace.notes == ("4 tool call(s) have no output item: timed as 0 s",
                           "6 model output(s) have no token_count after them (interrupted): not replayed",
                           "2 request(s) ended on a round with client tool calls (interrupted): their last 6 call(s) "
                           "are not replayed")
    # One rollout alone says its own notes.
    assert traces.load(folder / "2026" / "rollout-b.jsonl").notes == (
        "2 tool call(s) have no output item: timed as 0 s",
        "3 model output(s) have no token_count after them (interrupted): not replayed",
        "1 request(s) ended on a round with client tool calls (interrupted): their last 3 call(s) are not replayed")
