"""The testbed's own JSONL trace (prototype/workload.py `read_trace`, `write_trace`): one line per turn.

It holds the tasks exactly, with optional arrival times, and no timestamps of model calls: `calibrate` can show its
distributions but has nothing to fit.
"""

from __future__ import annotations

import re
from os import PathLike

from .. import workload as wl
from .base import Trace, TraceError, rounds_from_workloads

FORMAT = "testbed"
KEYS = frozenset({"task", "turn", "appended_tokens"})
_LINE = re.compile(r"^line (\d+): (.*)$", re.S)
_FIELD = re.compile(r"'(\w+)'|^(\w+) must")


def looks_like(first: object) -> bool:
    return isinstance(first, dict) and KEYS <= first.keys()


def read(path: str | PathLike[str]) -> Trace:
    try:
        tasks = wl.read_trace(path)
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
