"""The Response object and its usage, as the wire carries them (docs/protocol.md)."""

from __future__ import annotations

from typing import Any

import attrs

from .events import CreateRequest
from .items import Item


@attrs.define
class Usage:
    """Token usage, in the shape Codex parses (`ResponseCompletedUsage`).

    `input_tokens` is the whole context the model saw; `cached_tokens` the part not prefilled again.
    A v1 rollout counts each segment as its own request and sums them, so all designs agree.
    """

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@attrs.define(eq=False)
class Response:
    """One Response; mutable while it runs. `to_dict` gives the wire object at that moment."""

    id: str
    request: CreateRequest
    created_at: int
    status: str = "in_progress"
    output: list[Item] = attrs.Factory(list)
    usage: Usage = attrs.Factory(Usage)
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None  # per-phase timings, sent only when the client asks

    def to_dict(self, *, output: list[Item] | None = None, usage_so_far: bool = False) -> dict[str, Any]:
        """The wire object. Usage is sent once the response has ended, or with `usage_so_far` (v1's
        `response.done` carries the rollout's cumulative usage, docs/protocol.md)."""
        request = self.request
        items = self.output if output is None else output
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata,
            "model": request.model,
            "output": [item.to_dict() for item in items],
            "parallel_tool_calls": request.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "reasoning": request.reasoning,
            "store": request.store,
            "temperature": request.temperature if request.temperature is not None else 1.0,
            "tool_choice": request.tool_choice,
            "tools": [tool.raw for tool in request.tools],
            "top_p": request.top_p if request.top_p is not None else 1.0,
            "usage": self.usage.to_dict() if usage_so_far or self.status != "in_progress" else None,
        }
        if request.multi_agent is not None:  # echoed only when sent, so other runs carry the same bytes
            out["multi_agent"] = request.multi_agent.to_dict()
        if request.compact_threshold is not None:
            out["context_management"] = [{"type": "compaction", "compact_threshold": request.compact_threshold}]
        if self.timing is not None:
            out["testbed_timing"] = self.timing  # name [ours]: docs/protocol.md "Timing header"
        return out
