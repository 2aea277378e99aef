"""TraceLab's multi-round replay CSV (artifacts/trace_facts/csv_export in uw-syfi/TraceLab): one row per model call.

Header `id,input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len` (the session column may also be
called `session_id`). `prefix_len` is the cached prefix, `input_len` the newly appended prompt, `output_len` the
decode length, `arrival_time` the session's arrival in milliseconds (synthetic in TraceLab's export: a seeded Poisson
process), `tool_wait_after_ms` the summed tool latency after the round (0 on a session's last round). Rows of a
session are consecutive with `round_idx` 0, 1, 2, ...

The CSV keeps one number for a round's tools, so each non-final round ends with one client call of that length,
and a session is one task. It has no timestamps of model calls: nothing to fit.
"""

from __future__ import annotations

import csv
import math
from os import PathLike

import attrs

from .base import Round, Trace, TraceError, build, open_utf8

FORMAT = "tracelab-csv"
COLUMNS = ("input_len", "output_len", "arrival_time", "round_idx", "tool_wait_after_ms", "prefix_len")
SESSION_COLUMNS = ("session_id", "id")


def looks_like(header: list[str]) -> bool:
    return "round_idx" in header and bool({"prefix_len", "input_len", "output_len"} & set(header))


def _number(row: dict[str, str], key: str, path: str | PathLike[str], line: int, *, whole: bool) -> float:
    raw = row.get(key)
    if raw is None or raw.strip() == "":
        raise TraceError(path, line, key, "missing")
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(path, line, key, f"expected a number, got {raw!r}") from None
    if not math.isfinite(value) or (whole and value != int(value)):
        raise TraceError(path, line, key, f"expected a {'whole ' if whole else ''}number, got {raw!r}")
    if value < 0:
        raise TraceError(path, line, key, f"must be >= 0, got {raw!r}")
    return value


def read(path: str | PathLike[str]) -> Trace:
    sessions: list[list[Round]] = []
    arrivals: dict[str, float] = {}
    with open_utf8(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        session_key = next((k for k in SESSION_COLUMNS if k in header), None)
        missing = [c for c in ((session_key or "session_id"),) + COLUMNS if c not in header]
        if missing:
            raise TraceError(path, 1, missing[0], "missing column")
        current: str | None = None
        for row in reader:
            line = reader.line_num
            if None in row or any(v is None for v in row.values()):
                raise TraceError(path, line, None, f"expected {len(header)} columns")
            session = row[session_key].strip()
            if not session:
                raise TraceError(path, line, session_key, "missing")
            index = int(_number(row, "round_idx", path, line, whole=True))
            arrival = _number(row, "arrival_time", path, line, whole=False) / 1000.0
            prefix = int(_number(row, "prefix_len", path, line, whole=True))
            appended = int(_number(row, "input_len", path, line, whole=True))
            output = int(_number(row, "output_len", path, line, whole=True))
            wait = _number(row, "tool_wait_after_ms", path, line, whole=False) / 1000.0
            if session != current:
                if session in arrivals:
                    raise TraceError(path, line, session_key, f"session {session!r} resumes after other sessions: rows out of order")
                if index != 0:
                    raise TraceError(path, line, "round_idx", f"session {session!r} starts at {index}, expected 0")
                current, arrivals[session] = session, arrival
                sessions.append([])
            else:
                expected = len(sessions[-1])
                if index != expected:
                    raise TraceError(path, line, "round_idx", f"{index} in session {session!r}, expected {expected}: rounds out of order")
                if arrival != arrivals[session]:
                    raise TraceError(path, line, "arrival_time", f"{row['arrival_time']} differs from the session's first row")
            sessions[-1].append(Round(
                session=session, line=line, input_tokens=prefix + appended, cached_tokens=prefix, output_tokens=output,
                tool_seconds=(wait,), starts_request=index == 0, request_at=arrival,
            ))
    # A session's last round ends it: its tool wait is 0 by the export's definition and is not a call.
    sessions = [s[:-1] + [attrs.evolve(s[-1], tool_seconds=())] for s in sessions]
    return build(path, FORMAT, sessions)
