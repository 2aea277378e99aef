"""Rendering: the conversation as the token ids the model reads (real cl100k tokenization).

Rendering an item depends on the item alone, so a prompt rendered incrementally (append the new
items' ids) equals the prompt rendered from scratch: the chained cache relies on that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..engine import tokenizer
from ..engine.engine import Prompt
from ..protocol.events import ToolDef
from ..protocol.items import FunctionCall, FunctionCallOutput, Item, Message, OpaqueItem, WebSearchCall


def item_text(item: Item) -> str:
    if isinstance(item, Message):
        return f"{item.role}\n{item.text}"
    if isinstance(item, FunctionCall):
        return f"function_call {item.name} {item.call_id}\n{item.arguments}"
    if isinstance(item, FunctionCallOutput):
        return f"function_call_output {item.call_id}\n{item.output}"
    if isinstance(item, WebSearchCall):
        return f"web_search_call {item.query}\n{item.result}"
    assert isinstance(item, OpaqueItem)
    return f"{item.type}\n{item.data}"


def render_items(items: Iterable[Item]) -> list[int]:
    ids: list[int] = []
    for item in items:
        ids.append(tokenizer.ITEM_SEPARATOR_ID)
        ids.extend(tokenizer.encode(item_text(item)))
    return ids


def preamble_key(instructions: str | None, tools: tuple[ToolDef, ...]) -> str:
    """What the preamble depends on: instructions and tool definitions (sent with every request,
    not inherited through previous_response_id, openai-node `docs/responses.md`)."""
    return json.dumps([instructions, [tool.raw for tool in tools]], sort_keys=True, separators=(",", ":"))


def render_preamble(key: str) -> list[int]:
    return [tokenizer.ITEM_SEPARATOR_ID, *tokenizer.encode(key)]


def render_full(key: str, items: Iterable[Item]) -> Prompt:
    prompt = Prompt(render_preamble(key))
    prompt.extend(render_items(items))
    return prompt
