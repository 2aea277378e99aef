"""Timing records: where each turn's time went, phase by phase.

Spans are recorded on the trio clock (never mixed with `time.perf_counter`, whose origin differs).
The server attaches a response's spans to its terminal event when the client asks for them with
the `x-responsesapi-include-timing-metrics: true` header (PROTOCOL.md §9), so runs that do not ask
carry the same bytes in every design.
"""

from __future__ import annotations

from collections import defaultdict
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
        }
