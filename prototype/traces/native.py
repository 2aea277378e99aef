"""The testbed's own JSONL trace: one line per turn, written by `write_trace`, read by `read_trace` (and `read`,
which names the file and field of an error).

Trace format (JSONL): one JSON object per line, one line per turn::

    {"task": "coding-0", "seed": 7, "turn": 0, "appended_tokens": 8000, "output_tokens": 312,
     "tool_calls": [{"seconds": 0.21}], "hosted_calls": [{"seconds": 1.0, "result_tokens": 1500}],
     "reasoning_tokens": 80, "content_seed": 12345, "prefix": "coding", "prefix_tokens": 7400}

The lines of one task are consecutive with turn = 0, 1, 2, ...; a new task starts when "task" or "seed" changes or
"turn" resets to 0. "hosted_calls" (default []) and "reasoning_tokens" (default 0) are optional on every line;
"content_seed" (default: the task's seed), "prefix" (default ""), "prefix_tokens" (default 0) and "arrival_s" are
optional and read from a task's turn-0 line only; "arrival_s" is when the task started, in seconds from the start of the
trace (an open-loop replay starts it then). Blank lines are ignored. Tool output sizes are not
stored: they are the next turn's appended_tokens split evenly between the calls (`Workload.tool_output_tokens`).


It holds the tasks exactly, with optional arrival times, and no timestamps of model calls: `calibrate` can show its
distributions but has nothing to fit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from contextlib import nullcontext
from os import PathLike
from typing import IO, Any

from ..workload import HostedCall, TurnSpec, Workload
from .base import Trace, TraceError, open_utf8, rounds_from_workloads

FORMAT = "testbed"
KEYS = frozenset({"task", "turn", "appended_tokens"})
_LINE = re.compile(r"^line (\d+): (.*)$", re.S)
_FIELD = re.compile(r"(?<!task )'(\w+)'|^(\w+) must")  # a quoted key, or the key a range check names; not a task's name


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and KEYS <= first.keys()


def read(path: str | PathLike[str]) -> Trace:
    try:
        with open_utf8(path) as f:
            tasks = read_trace(f)
    except TraceError:
        raise
    except (ValueError, TypeError) as e:  # read_trace names the line; add the file and the field
        match = _LINE.match(str(e))
        line, message = (int(match.group(1)), match.group(2)) if match else (1, str(e))
        field = _FIELD.search(message)
        raise TraceError(path, line, (field.group(1) or field.group(2)) if field else None, message) from None
    if not tasks:
        raise TraceError(path, 1, None, "the trace holds no turns")
    if any(t.arrival_s is None for t in tasks) and any(t.arrival_s is not None for t in tasks):
        first = next(t for t in tasks if t.arrival_s is None)
        raise TraceError(path, 1, "arrival_s", f"task {first.name!r} has none while others do: give all or none")
    if tasks[0].arrival_s is not None:
        tasks = sorted(tasks, key=lambda t: t.arrival_s)
    return Trace(str(path), FORMAT, tasks, rounds_from_workloads(tasks))


def _open(path_or_file: str | PathLike[str] | IO[str], mode: str):
    if isinstance(path_or_file, (str, PathLike)):
        return open(path_or_file, mode, encoding="utf-8")
    return nullcontext(path_or_file)


def write_trace(workloads: Iterable[Workload], path_or_file: str | PathLike[str] | IO[str]) -> None:
    """Writes workloads as a JSONL trace (format in the module docstring) to a path or an open text file."""
    with _open(path_or_file, "w") as f:
        for w in workloads:
            for k, t in enumerate(w.turns):
                record = {
                    "task": w.name, "seed": w.seed, "turn": k,
                    "appended_tokens": t.appended_tokens, "output_tokens": t.output_tokens,
                    "tool_calls": [{"seconds": s} for s in t.tool_seconds],
                    "hosted_calls": [{"seconds": h.seconds, "result_tokens": h.result_tokens} for h in t.hosted_calls],
                }
                if t.reasoning_tokens:
                    record["reasoning_tokens"] = t.reasoning_tokens
                if k == 0:
                    if w.arrival_s is not None:
                        record["arrival_s"] = w.arrival_s
                    if w.content_seed is not None:
                        record["content_seed"] = w.content_seed
                    if w.prefix:
                        record["prefix"] = w.prefix
                    if w.prefix_tokens:
                        record["prefix_tokens"] = w.prefix_tokens
                f.write(json.dumps(record) + "\n")


_TRACE_KEYS = {
    "task": str, "seed": int, "turn": int, "appended_tokens": int, "output_tokens": int,
    "tool_calls": list, "hosted_calls": list, "reasoning_tokens": int,
}
# Optional keys of a task's turn-0 line: when it started, what it shares with others, where its own content comes from.
_TASK_KEYS = {"arrival_s": (int, float), "content_seed": int, "prefix": str, "prefix_tokens": int}


def _typed(obj: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"missing key {key!r}" if isinstance(obj, dict) else f"expected an object, got {obj!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{key!r} has the wrong type: {value!r}")
    return value


def _parse_line(line: str) -> tuple[str, int, int, TurnSpec, dict[str, Any]]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    unknown = obj.keys() - _TRACE_KEYS.keys() - _TASK_KEYS.keys()
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}")
    obj.setdefault("hosted_calls", [])
    obj.setdefault("reasoning_tokens", 0)
    task, seed, turn, appended, output, tool_calls, hosted_calls, reasoning = (
        _typed(obj, k, t) for k, t in _TRACE_KEYS.items()
    )
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    tool_seconds = [_typed(c, "seconds", (int, float)) for c in tool_calls]
    hosted = [HostedCall(_typed(h, "seconds", (int, float)), _typed(h, "result_tokens", int)) for h in hosted_calls]
    task_fields = {key: _typed(obj, key, kind) for key, kind in _TASK_KEYS.items() if key in obj}
    arrival = task_fields.get("arrival_s")
    if arrival is not None and not (math.isfinite(arrival) and arrival >= 0):
        raise ValueError(f"'arrival_s' must be finite and >= 0, got {arrival}")
    if "arrival_s" in task_fields and turn != 0:
        raise ValueError("'arrival_s' belongs on a task's first line (turn 0)")
    if task_fields and turn != 0:
        raise ValueError(f"{sorted(task_fields)} belong on a task's first line (turn 0)")
    return task, seed, turn, TurnSpec(appended, output, tool_seconds, hosted, reasoning), task_fields


def _close_task(name: str, seed: int, turns: list[TurnSpec], first_line: int, last_line: int,
                task_fields: dict[str, Any]) -> Workload:
    if turns[-1].tool_seconds:
        raise ValueError(f"line {last_line}: last turn of task {name!r} has tool calls (truncated task?)")
    try:
        return Workload(name, seed, turns, **task_fields)
    except ValueError as e:  # a task-level value (they are all on its turn-0 line)
        raise ValueError(f"line {first_line}: {e}") from None


def read_trace(path_or_file: str | PathLike[str] | IO[str]) -> list[Workload]:
    """Reads a JSONL trace (format in the module docstring) from a path or an open text file.

    Raises:
        ValueError: naming the line, for invalid JSON, missing, unknown or mistyped keys, negative values, turns out
            of order, a non-final turn without tool calls or a final turn with tool calls.
    """
    workloads: list[Workload] = []
    key: tuple[str, int] | None = None
    turns: list[TurnSpec] = []
    task_fields: dict[str, Any] = {}
    first_line = last_line = 0
    with _open(path_or_file, "r") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                name, seed, turn, spec, fields = _parse_line(line)
            except ValueError as e:
                raise ValueError(f"line {lineno}: {e}") from None
            if key == (name, seed) and turn != 0:
                if turn != len(turns):
                    raise ValueError(f"line {lineno}: turn {turn} of task {name!r} out of order, expected {len(turns)}")
                if not turns[-1].tool_seconds:
                    raise ValueError(f"line {last_line}: turn {turn - 1} of task {name!r} has no tool calls but is "
                                     "not the task's last turn")
            else:
                if key is not None:
                    workloads.append(_close_task(*key, turns, first_line, last_line, task_fields))
                if turn != 0:
                    raise ValueError(f"line {lineno}: task {name!r} starts at turn {turn}, expected 0")
                key, turns, task_fields, first_line = (name, seed), [], fields, lineno
            turns.append(spec)
            last_line = lineno
    if key is not None:
        workloads.append(_close_task(*key, turns, first_line, last_line, task_fields))
    return workloads
