"""Agent traces in, the testbed's tasks out: `load(path)` detects the format from the file's content.

Formats (one module each, all returning a `Trace` of `Workload` tasks and observed `Round`s):

* `native`: the testbed's own JSONL (`native.write_trace` writes it);
* `tracelab`: TraceLab's normalized per-round JSONL (`round_trace.jsonl`);
* `tracelab_csv`: TraceLab's multi-round replay CSV;
* `codex`: Codex CLI session rollouts (`rollout-*.jsonl`); a folder such as `$CODEX_HOME/sessions` loads every
  rollout under it.

A bad trace raises `TraceError` naming the file, the line and the field; nothing is loaded from it.
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path

from . import codex, native, tracelab, tracelab_csv
from .base import HOSTED_TOOL_NAMES, Round, Trace, TraceError, adjusted, build, is_hosted, open_utf8, rounds_from_workloads

FORMATS = (native.FORMAT, tracelab.FORMAT, tracelab_csv.FORMAT, codex.FORMAT)


def detect(path: str | PathLike[str]) -> str:
    """The format of a trace file, from its first non-blank line."""
    with open_utf8(path) as f:
        first = next(((n, t.strip()) for n, t in enumerate(f, 1) if t.strip()), None)
    if first is None:
        raise TraceError(path, 1, None, "empty file")
    line, text = first
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(path, line, None, f"invalid JSON ({e.msg})") from None
        for module in (codex, tracelab, native):
            if module.looks_like(obj):
                return module.FORMAT
        keys = ", ".join(sorted(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise TraceError(path, line, None, f"unknown trace format: a JSON object with keys {keys}; expected a "
                         "testbed trace (task, turn, ...), a TraceLab round (session_id, round_index, ...) or a Codex "
                         "rollout line (timestamp, type, payload)")
    header = [h.strip() for h in text.split(",")]
    if tracelab_csv.looks_like(header):
        return tracelab_csv.FORMAT
    raise TraceError(path, line, None, f"unknown trace format: first line {text[:60]!r}; expected JSONL or a TraceLab "
                     f"CSV header ({','.join(tracelab_csv.COLUMNS)})")


def load(path: str | PathLike[str]) -> Trace:
    """Reads a trace file, or a folder of Codex rollouts; raises TraceError (file, line, field) if it is bad."""
    path = Path(path)
    if path.is_dir():
        files = codex.find_rollouts(path)
        if not files:
            raise TraceError(path, 0, None, "folder without rollout-*.jsonl files")
        rounds, notes = [], {}
        for file in files:
            if detect(file) != codex.FORMAT:
                raise TraceError(file, 1, None, "not a Codex rollout")
            file_rounds, file_notes = codex.read_sessions(file)
            rounds.append(file_rounds)
            notes = {k: notes.get(k, 0) + v for k, v in file_notes.items()}
        return build(path, codex.FORMAT, rounds, codex.notes_text(notes))
    if not path.exists():
        raise TraceError(path, 0, None, "no such file")
    fmt = detect(path)
    if fmt == codex.FORMAT:
        rounds, notes = codex.read_sessions(path)
        return build(path, codex.FORMAT, [rounds], codex.notes_text(notes))
    return {native.FORMAT: native.read, tracelab.FORMAT: tracelab.read, tracelab_csv.FORMAT: tracelab_csv.read}[fmt](path)


__all__ = ["FORMATS", "HOSTED_TOOL_NAMES", "Round", "Trace", "TraceError", "adjusted", "detect", "is_hosted", "load",
           "rounds_from_workloads"]
