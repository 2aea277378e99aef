"""Sampled text rendered from its words' ids is exactly what tokenizing the item again gives (api/render.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.api import render
from prototype.engine import tokenizer
from prototype.protocol.codec import parse_input
from prototype.protocol.events import ToolDef
from prototype.protocol.items import FunctionCall, Message, Reasoning

WORDS = st.lists(st.sampled_from(tokenizer.single_token_words()), max_size=60)


@settings(max_examples=300, deadline=None)
@given(words=WORDS, role=st.sampled_from(["assistant", "user", "developer", "reasoning"]))
def test_a_sampled_message_or_reasoning_renders_as_tokenizing_it_again_does(words, role) -> None:
    item = Reasoning("rs_1", "".join(words)) if role == "reasoning" else Message(role, (("output_text", "".join(words)),))
    assert render.render_sampled(item, words) == render.render_items([item])


def test_the_words_ids_are_used_only_where_they_are_the_items_own_text() -> None:
    words = list(tokenizer.single_token_words()[:5])
    # Text that is not the words (another message), words that are not one token each, and an
    # item that is not sampled text are all tokenized as usual.
    other = Message("assistant", (("output_text", " something else entirely"),))
    call = FunctionCall("call_1", "shell", '{"cmd": "ls"}', id="fc_1")
    for item, pieces in ((other, words), (Message("assistant", (("output_text", " notaword1 x"),)), [" notaword1", " x"]), (call, words)):
        assert render.render_sampled(item, pieces) == render.render_items([item])
    assert tokenizer.word_ids(words) == tokenizer.encode("".join(words))


def test_a_streamed_messages_word_ids_looked_up_a_slice_at_a_time_are_the_words_ids() -> None:
    from prototype.designs.sampling import WordIds

    words = list(tokenizer.single_token_words()[:700])
    looked_up = WordIds(words)
    looked_up.advance(256)
    assert looked_up.ids == tokenizer.word_ids(words[:256])  # the first chunk's slice, before the end
    looked_up.advance(256)
    assert looked_up.all() == tokenizer.word_ids(words)
    message = Message("assistant", (("output_text", "".join(words)),))
    assert render.render_sampled(message, words, looked_up.all()) == render.render_items([message])
    # A word that is not one token: no ids, and the item is tokenized as usual.
    mixed = WordIds([*words[:3], " notaword1"])
    assert mixed.all() is None and not mixed.one_token_words


def test_drawn_words_cover_the_whole_vocabulary_and_each_is_one_token() -> None:
    vocabulary = tokenizer.single_token_words()
    drawn = tokenizer.words(np.random.default_rng(0), 100_000)  # every word, the first and last included
    assert len(drawn) == 100_000 and set(drawn) == set(vocabulary)
    words = tokenizer.words(np.random.default_rng(1), 50)
    text = tokenizer.text_of(np.random.default_rng(1), 50)
    assert (text, tokenizer.count_tokens(text), tokenizer.encode(text)) == ("".join(words), 50, tokenizer.word_ids(words))


def test_the_render_cache_drops_its_least_recently_used_entries_past_its_bound() -> None:
    # Rendered sizes: 10, 6 and 5 tokens (the separator included).
    a, b, c = (Message("user", (("input_text", text),)) for text in ("fix the bug in the parser please", "read the file", "run it"))
    assert [len(render.render_items([item])) for item in (a, b, c)] == [10, 6, 5]
    cache = render.RenderCache(max_tokens=16)
    cache.remember([a, b])
    assert (cache.tokens, len(cache)) == (16, 2)  # at the bound: both kept
    cache.remember([a])  # found: now the most recently used
    cache.remember([c])
    assert (cache.tokens, len(cache)) == (15, 2)  # b went, the least recently used
    key = render.preamble_key(None, ())
    prompt, tokenized = cache.render_full(key, [c])
    assert prompt.ids == render.render_full(key, [c]).ids and tokenized == len(render.render_preamble(key))
    # Past the bound the cache keeps its newest entry alone, however large.
    small = render.RenderCache(max_tokens=4)
    small.remember([a, b])
    assert (small.tokens, len(small)) == (6, 1)
    small.remember([a])
    assert (small.tokens, len(small)) == (10, 1)


def test_the_render_cache_keeps_text_with_a_lone_surrogate() -> None:
    # A client's JSON can carry one ("\ud800"); the digest must not fail on it.
    (item,) = parse_input([{"type": "message", "role": "user", "content": "bad \ud800 text"}])
    cache = render.RenderCache()
    prompt, tokenized = cache.render_full("k", [item])
    assert (prompt.ids, tokenized, cache.render_full("k", [item])[1]) == (render.render_full("k", [item]).ids, len(prompt), 0)


def test_the_preamble_is_compact_json_of_the_instructions_and_tools_with_keys_sorted_whatever_order_they_came_in() -> None:
    # Rendered at the head of every prompt: the same tools sent with their keys in another order render the same tokens.
    sent = [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"parameters": {"type": "object"}, "name": "shell", "type": "function"}]
    keys = {render.preamble_key("Be brief.", (ToolDef(t["type"], t["name"], t["parameters"], t),)) for t in sent}
    assert keys == {'["Be brief.",[{"name":"shell","parameters":{"type":"object"},"type":"function"}]]'}


def test_sampled_text_is_not_tokenized_again(monkeypatch) -> None:
    # The hot path of every sampled item: only its header line goes through the tokenizer.
    words = list(tokenizer.single_token_words()[:40])
    message = Message("assistant", (("output_text", "".join(words)),))
    expected = render.render_items([message])
    encoded: list[str] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: encoded.append(text) or encode(text))
    assert render.render_sampled(message, words) == expected
    assert render.render_sampled(message, words, tokenizer.word_ids(words)) == expected
    assert encoded == ["assistant\n", "assistant\n"]
