"""What a running `python -m prototype serve` prints besides its announcement: one access-log line per client
record (text or JSON), and with `--stats-interval` a `stats {json}` line of what the server holds."""

from __future__ import annotations

import gc
import json
import time
from typing import TYPE_CHECKING, Any, TextIO

import trio

from .. import metrics

if TYPE_CHECKING:
    from ..server.app import ResponsesServer


class AccessLog(metrics.ClientRecords):
    """The server's client records (`ResponsesServer.records`, also written to `--records` if
    given), printing one line to `out` per record: a finished response (a v1 rollout, a v2 turn, an
    HTTP request) or a refused request or frame."""

    def __init__(self, path: str | None, out: TextIO | None, fmt: str = "text", maxlen: int = metrics.MAX_CLIENT_RECORDS) -> None:
        super().__init__(path, maxlen=maxlen)
        self.out = out
        self.fmt = fmt

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        if self.out is None:
            return
        try:
            self.out.write(access_line(record, self.fmt) + "\n")
            self.out.flush()
        except (OSError, ValueError):  # a closed or broken stdout must not fail a response
            pass


def access_line(record: dict[str, Any], fmt: str = "text") -> str:
    """`<time> <transport> <design> <response id> turns=<n> <status> <ms>` (or the same as JSON)."""
    started = record.get("started_at_s")
    elapsed_ms = round(1000 * (record["at_s"] - started), 1) if started is not None else None
    entry = {
        "time": time.strftime("%H:%M:%S"),
        "transport": record.get("transport"),
        "design": record.get("design"),
        "response_id": record.get("response_id"),
        # A v1 rollout is one response over many turns: one per response.append, plus the first.
        "turns": record.get("appends", 0) + 1 if record.get("response_id") else 0,
        "status": record.get("outcome"),
        "ms": elapsed_ms,
        "model": record.get("model"),
    }
    if fmt == "json":
        return json.dumps(entry)
    ms = f"{elapsed_ms:.1f} ms" if elapsed_ms is not None else "-"
    return (f"{entry['time']} {entry['transport']} {entry['design']} {entry['response_id'] or '-'} "
            f"turns={entry['turns']} {entry['status']} {ms} model={entry['model'] or '-'}")


def count_tasks() -> int:
    """Live trio tasks of this run, the root included."""
    count, pending = 0, [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        count += 1
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return count


def stats(server: ResponsesServer) -> dict[str, int]:
    """What a long-running server holds, for experiments/soak.py."""
    engine = server.api.engine
    return {
        "tasks": count_tasks(), "connections": server.connections, "sessions": len(server.sessions),
        "kv_entries": len(engine.kv), "engine_sessions": len(engine.remembered_sessions), "render_cache_tokens": server.api.render_cache.tokens,
        "gc_frozen_objects": gc.get_freeze_count(),  # kept out of full collections (server/collector.py)
    }


async def print_stats(server: ResponsesServer, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        print("stats " + json.dumps(stats(server)), flush=True)
