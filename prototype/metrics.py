"""Timing records: where each turn's time went, phase by phase.

Spans are recorded on the trio clock (never mixed with `time.perf_counter`, whose origin differs).
The server attaches a response's spans to its terminal event when the client asks for them with
the `x-responsesapi-include-timing-metrics: true` header (docs/protocol.md), so runs that do not ask
carry the same bytes in every design.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from typing import Any

import attrs

# Phase names, in the order a turn passes through them.
VALIDATE = "validate"
SAFETY = "safety"
RENDER = "render"
ROUTE = "route"
STORE_READ = "store_read"
QUEUE = "queue"
PREFILL = "prefill"
DECODE = "decode"
HOSTED_TOOL = "hosted_tool"
POST = "post"
POST_OVERLAPPED = "post_overlapped"
PRE_INFERENCE = (VALIDATE, SAFETY, RENDER, ROUTE, STORE_READ)
SERVER_PHASES = PRE_INFERENCE + (QUEUE, PREFILL, DECODE, HOSTED_TOOL, POST, POST_OVERLAPPED)


@attrs.define
class PhaseLog:
    """The spans of one response (one rollout in v1), in the order they happened."""

    spans: list[tuple[str, float, float]] = attrs.Factory(list)
    schedule: float | None = None
    """Where the response's modeled work has got to on the trio clock (None: nowhere yet). The next
    modeled wait (API stages, prefill) runs from here, not from whenever the task reached it, so the
    testbed's own CPU work in between (parsing, rendering, planning, sending events) is absorbed by
    the modeled time instead of added to it, as decoding follows the engine's schedule. Under a
    virtual clock CPU work takes no time and this is always now. Set again after every wait on
    something outside the model: to when the frame that ended it arrived (the request, a v1
    append), or to now (a hosted tool, a queue, a swap-in)."""
    # Who sent the request and how it used the protocol (`protocol_choices`); sent with the timings.
    client: dict[str, Any] | None = None

    def record(self, phase: str, start: float, end: float) -> None:
        self.spans.append((phase, start, end))

    def totals(self, since: float = -float("inf")) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for phase, start, end in self.spans:
            if start >= since:
                out[phase] += end - start
        return dict(out)

    def to_dict(self, since: float = -float("inf")) -> dict[str, Any]:
        """The wire form [ours]: per-phase totals in ms, and the spans (ms, relative to the first)."""
        spans = [s for s in self.spans if s[1] >= since]
        origin = spans[0][1] if spans else 0.0
        return {
            "origin_s": origin,  # the server's trio clock at the first span: places spans on a shared timeline
            "phases_ms": {k: round(v * 1000, 3) for k, v in self.totals(since).items()},
            "spans": [[p, round((s - origin) * 1000, 3), round((e - origin) * 1000, 3)] for p, s, e in spans],
            **({"client": dict(self.client)} if self.client is not None else {}),
        }


# --- client records: which client spoke and how it used the protocol -------------------

# Records a server keeps (`ResponsesServer.records`), oldest dropped first.
MAX_CLIENT_RECORDS = 10_000


class ClientRecords(deque):
    """The server's client records, oldest dropped first; with `path` (`serve --records`), also
    appended to that file as one JSON line per record when it is made, so an outside process (a
    test, an experiment driving a real client) reads them while the server runs. One small
    line-buffered write per response, not per token."""

    def __init__(self, path: str | None = None, maxlen: int = MAX_CLIENT_RECORDS) -> None:
        super().__init__(maxlen=maxlen)
        self.file = open(path, "a", buffering=1, encoding="utf-8") if path else None  # closed by close()

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def protocol_choices(request: Any, *, transport: str, design: str, user_agent: str, connection: int) -> dict[str, Any]:
    """What a request tells about its client, known when it starts: chained (`previous_response_id`)
    or full context, warm-up (`generate: false`), `stream`, `store`, the input it resent, and the
    keys the server ignores (Codex's `client_metadata`, `prompt_cache_key`, ...), and whether it named
    a `stream_id` lane."""
    kinds: dict[str, int] = defaultdict(int)
    for item in request.input:
        kinds[item.type] += 1
    return {
        "user_agent": user_agent,
        "transport": transport,
        "design": design,
        "connection": connection,
        "model": request.model,
        "context": "chained" if request.previous_response_id is not None else "full",
        "previous_response_id": request.previous_response_id,
        "warmup": not request.generate,
        "stream": request.stream,
        "stream_id": request.stream_id is not None,
        "store": request.store,
        "input_items": len(request.input),
        "input_types": dict(kinds),
        "tools": len(request.tools),
        "ignored_keys": list(request.extra_keys),
    }
