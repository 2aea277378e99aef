"""The engine's KV directory walk, latency model and retention policies at their boundaries: whole
blocks only, never the last token, every holder judged (docs/parameters.md §6). Written against the
survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import trio

from prototype.engine.engine import Engine
from prototype.engine.kv import BLOCK_SIZE, Prompt


async def computed(engine: Engine, key: str, p: Prompt) -> None:
    handle = await engine.begin_call(key, p)
    engine.retain(key, p, trio.current_time())
    engine.end_call(handle)


async def test_the_directory_finds_whole_blocks_and_never_the_last_token(autojump_clock) -> None:
    engine = Engine()
    held = Prompt(list(range(1000, 1100)))  # 100 tokens: 6 full blocks listed
    await computed(engine, "a", held)
    now = trio.current_time()
    for n in range(1, 101):
        expected = min((n - 1) // BLOCK_SIZE, 6) * BLOCK_SIZE
        assert engine.cached_prefix("b", Prompt(held.ids[:n]), now) == expected, n
    # Past what the holder computed, the walk stops at the first block nobody holds.
    longer = Prompt(list(held.ids) + list(range(5000, 5100)))
    assert engine.cached_prefix("b", longer, now) == 96
