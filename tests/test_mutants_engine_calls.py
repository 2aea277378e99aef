"""The simulated engine's model-call interface at exact virtual times: prefill from a call's place on its
schedule (after a wait on a serial GPU: from the wait's end), the counters a call adds, a session's own key in
the prefix lookup, unstreamed decoding and paced streaming with its flush arguments. Written against the
survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import trio

from prototype.engine.engine import Engine, ModelCall, Prefilled
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel

# 1000 prompt tokens a second, 10 sampled tokens a second, no overheads: every time below is exact.
LATENCY = LatencyModel(decode_tokens_per_s=10.0, prefill_tokens_per_s=1000.0, cache_attention=None,
                       request_overhead=0.0)


async def test_a_prefill_counts_its_call_and_tokens_and_ends_from_its_start(autojump_clock) -> None:
    engine = Engine()
    await trio.sleep(1.0)
    # Its place on the response's schedule is 0.5 s: the prefill ends 1 s after it, not 1 s after now.
    assert await engine.prefill(LATENCY, uncached=1000, cached=30, start=0.5) == 1.5
    assert trio.current_time() == 1.5
    assert await engine.prefill(LATENCY, uncached=500, cached=70) == 2.0
    assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (2, 1500, 100)


async def test_a_serial_prefill_starts_from_its_place_unless_it_waited_for_the_gpu(autojump_clock) -> None:
    engine = Engine(serial_prefill=True)
    await trio.sleep(1.0)
    ends: list[float] = []

    async def prefill() -> None:
        ends.append(await engine.prefill(LATENCY, uncached=1000, cached=0, start=0.5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prefill)
        nursery.start_soon(prefill)
    # The first ends 1 s after its place (0.5 s); the second waited 0.5 s for the GPU and runs from then.
    assert ends == [1.5, 2.5] and trio.current_time() == 2.5
    assert engine.stats.prefill_waits == [0.0, 0.5]
    assert engine.stats.model_calls == 2


async def test_a_model_call_looks_up_its_own_session_and_ends_its_prefill_from_its_start(autojump_clock) -> None:
    engine = Engine()
    shared = Prompt(list(range(1000, 1100)))
    handle = await engine.begin_call("a", shared)
    engine.retain("a", shared, trio.current_time())
    engine.end_call(handle)
    engine.isolate("b")  # an http request routed away from the prefix: it finds nothing
    longer = Prompt(list(shared.ids) + list(range(5000, 5020)))
    await trio.sleep(1.0)
    prefilled = await engine.prefill_call(LATENCY, ModelCall("b", longer, held=False, output_tokens=1), start=0.5)
    assert prefilled == Prefilled(decode_from=0.5 + 120 / 1000, cached=0)
    prefilled = await engine.prefill_call(LATENCY, ModelCall("c", longer, held=False, output_tokens=1), start=2.0)
    assert prefilled == Prefilled(decode_from=2.0 + 24 / 1000, cached=96)


async def test_unstreamed_tokens_are_ready_their_decode_time_after_the_start(autojump_clock) -> None:
    engine = Engine()
    await trio.sleep(1.0)
    assert await engine.decode_unstreamed(LATENCY, 5, start=1.25) == 1.75
    assert trio.current_time() == 1.75


async def chunks(engine: Engine, pieces: list[str], **kwargs) -> list[tuple[float, str]]:
    return [(round(trio.current_time(), 9), text) async for text in engine.stream(LATENCY, pieces, **kwargs)]


async def test_a_stream_sends_each_token_when_sampled_by_default_and_counts_them(autojump_clock) -> None:
    engine = Engine()
    assert await chunks(engine, list("abcd")) == [(0.1, "a"), (0.2, "b"), (0.3, "c"), (0.4, "d")]
    assert engine.stats.decoded_tokens == 4
    assert await chunks(engine, list("ef")) == [(0.5, "e"), (0.6, "f")]
    assert engine.stats.decoded_tokens == 6


async def test_a_stream_takes_its_start_flush_interval_and_flush_tokens(autojump_clock) -> None:
    engine = Engine()
    await trio.sleep(1.0)
    # Sampling began at 0.5 s: six tokens are ready at once, sent two a chunk; then flushes every 0.25 s
    # (capped at two tokens), the last when the last token is ready at 1.3 s.
    got = await chunks(engine, list("abcdefgh"), start=0.5, flush_interval=0.25, flush_tokens=2)
    assert got == [(1.0, "ab"), (1.0, "cd"), (1.1, "ef"), (1.3, "gh")]
    assert engine.stats.decoded_tokens == 8

