"""Compaction: which part of a conversation survives a compaction item, sans-IO.

A compacted window is "all user messages, followed by a single compaction item" (openai-python
`CompactedResponse.output`); the items that follow the compaction item come after it. Server-side
compaction (`context_management` on `response.create`) leaves the compaction item in the response's
output and the chain continues through `previous_response_id` (WS guide, "Compaction and creating
new responses"); a client that resends its whole history keeps only the latest window, and a
conversation rebuilt from the store is cut the same way. `POST /v1/responses/compact` returns a
window and starts a new chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .items import Compaction, Item, Message


def window(items: Sequence[Item]) -> list[Item]:
    """The context from the latest compaction item on: the user messages before it, the item, and
    everything after it; `items` unchanged when there is none."""
    last = max((i for i, item in enumerate(items) if isinstance(item, Compaction)), default=None)
    if last is None:
        return list(items)
    users = [item for item in items[:last] if isinstance(item, Message) and item.role == "user"]
    return [*users, *items[last:]]


def window_of_dicts(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`window` over wire items, as a client that resends its history holds them."""
    last = max((i for i, item in enumerate(items) if item.get("type") == "compaction"), default=None)
    if last is None:
        return items
    users = [item for item in items[:last] if item.get("role") == "user" and item.get("type", "message") == "message"]
    return [*users, *items[last:]]
