"""Rendering: the conversation as the token ids the model reads (real cl100k tokenization).

Rendering an item depends on the item alone, so a prompt rendered incrementally (append the new
items' ids) equals the prompt rendered from scratch: the chained cache relies on that.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ..engine import tokenizer
from ..engine.kv import Prompt
from ..protocol.events import ToolDef
from ..protocol.items import Compaction, FunctionCall, FunctionCallOutput, Item, Message, OpaqueItem, Reasoning, WebSearchCall


def item_text(item: Item) -> str:
    if isinstance(item, Message):
        return f"{item.role}\n{item.text}"
    if isinstance(item, FunctionCall):
        return f"function_call {item.name} {item.call_id}\n{item.arguments}"
    if isinstance(item, FunctionCallOutput):
        return f"function_call_output {item.call_id}\n{item.output}"
    if isinstance(item, WebSearchCall):
        return f"web_search_call {item.query}\n{item.result}"
    if isinstance(item, Reasoning):
        # The reasoning itself, whether it came from the server's own context or back from a client's
        # encrypted_content: the same tokens either way, so a resent conversation renders identically.
        return f"reasoning\n{item.text}"
    if isinstance(item, Compaction):
        return f"compaction\n{item.summary}"
    assert isinstance(item, OpaqueItem)
    return f"{item.type}\n{item.data}"


def render_items(items: Iterable[Item]) -> list[int]:
    ids: list[int] = []
    for item in items:
        ids.append(tokenizer.ITEM_SEPARATOR_ID)
        ids.extend(tokenizer.encode(item_text(item)))
    return ids


def render_sampled(item: Item, words: Sequence[str], ids: Sequence[int] | None = None) -> list[int]:
    """`render_items([item])` of an item the model sampled as one-token words (tokenizer.words) that end
    its rendered text: the words' own ids after its header line, without tokenizing the text again.
    The pre-tokenizer splits before each space-led word, so the ids are the same
    (tests/test_render.py checks it); any other item is tokenized as usual. `ids`: the words' ids
    (`tokenizer.word_ids(words)`) if the caller worked them out already."""
    text = item_text(item)
    body = "".join(words)
    if not words or not text.endswith(body) or not words[0].startswith(" "):
        return render_items([item])
    if ids is None:
        try:
            ids = tokenizer.word_ids(words)
        except KeyError:  # not all one-token words
            return render_items([item])
    return [tokenizer.ITEM_SEPARATOR_ID, *tokenizer.encode(text[: len(text) - len(body)]), *ids]


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


# Tokens the cross-request render cache holds before it drops its least recently used entries
# [ours]: a few hundred MB of ids at most, room for a few hundred long conversations.
RENDER_CACHE_MAX_TOKENS = 5_000_000


class RenderCache:
    """Rendered tokens kept in memory across requests: the HTTP path's cache from OpenAI's pre-WebSocket
    sprint ("cache rendered tokens ... to skip repeated tokenization in multi-turn responses").

    Keyed by a digest of what an item renders from, so a stateless client that resends the whole
    conversation has only its new items tokenized. Since an item's rendering depends on the item
    alone, a prompt assembled from cached pieces equals `render_full` of the same items. Unlike the
    chained design's connection cache it still walks every item of every request (one digest each).
    """

    def __init__(self, max_tokens: int = RENDER_CACHE_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _lookup(self, text: str) -> tuple[tuple[int, ...], bool]:
        """The ids of `[separator] + text`, and whether they had to be tokenized now."""
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        ids = self._entries.get(digest)
        if ids is not None:
            self._entries.move_to_end(digest)
            return ids, False
        ids = (tokenizer.ITEM_SEPARATOR_ID, *tokenizer.encode(text))
        self._entries[digest] = ids
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self.tokens -= len(dropped)
        return ids, True

    def render_full(self, key: str, items: Iterable[Item]) -> tuple[Prompt, int]:
        """The prompt `render_full(key, items)` gives, and how many of its tokens were tokenized now
        (the rest came from the cache)."""
        ids, missed = self._lookup(key)
        prompt = Prompt(list(ids))
        tokenized = len(ids) if missed else 0
        for item in items:
            ids, missed = self._lookup(item_text(item))
            prompt.extend(ids)
            tokenized += len(ids) if missed else 0
        return prompt, tokenized

    def remember(self, items: Iterable[Item]) -> None:
        """Cache the rendering of items the model produced, so the next request that resends them
        finds them (the server rendered them already, when it appended them to the context)."""
        for item in items:
            self._lookup(item_text(item))
