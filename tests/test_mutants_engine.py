"""The engine's KV directory walk, latency model and retention policies at their boundaries: whole
blocks only, never the last token, every holder judged (docs/parameters.md §6). Written against the
survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from prototype.engine.engine import Engine
from prototype.engine.kv import BLOCK_SIZE, Prompt
from prototype.engine.stats import MAX_STAT_SAMPLES, sample
from prototype.engine.streaming import EngineFailure, FaultPlan, paced_tokens


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


def test_per_call_samples_keep_the_most_recent_ones_trimmed_in_batches() -> None:
    # A long-running server's queue delays and prefill waits stay bounded: the list grows to twice
    # the bound, then the next sample trims it to the most recent MAX_STAT_SAMPLES.
    samples: list[float] = []
    for value in range(2 * MAX_STAT_SAMPLES):
        sample(samples, float(value))
    assert len(samples) == 2 * MAX_STAT_SAMPLES and samples[0] == 0.0 and samples[-1] == 2 * MAX_STAT_SAMPLES - 1
    sample(samples, float(2 * MAX_STAT_SAMPLES))
    assert samples == [float(value) for value in range(MAX_STAT_SAMPLES + 1, 2 * MAX_STAT_SAMPLES + 1)]


def paced(pieces: list[str], rate: float, **kwargs: object) -> list[tuple[float, int, str]]:
    """Each chunk `paced_tokens` gives on a virtual clock: (time, tokens `on_flush` was told of, text)."""
    flushed: list[int] = []

    async def run() -> list[tuple[float, int, str]]:
        out = []
        async for chunk in paced_tokens(pieces, rate, on_flush=flushed.append, **kwargs):
            out.append((round(trio.current_time(), 9), flushed[-1], chunk))
        return out

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def test_uncoalesced_tokens_go_out_one_by_one_at_the_decode_rate() -> None:
    pieces = [" a", " b", " c", " d"]
    assert paced(pieces, 1000.0) == [(0.001, 1, " a"), (0.002, 1, " b"), (0.003, 1, " c"), (0.004, 1, " d")]
    # From a start on the engine's own schedule (here in the future), every deadline counts from it.
    assert paced(pieces[:2], 500.0, start=0.01) == [(0.012, 1, " a"), (0.014, 1, " b")]


def test_coalesced_tokens_go_out_at_the_flush_interval_and_the_last_when_it_is_ready() -> None:
    pieces = [f" t{i}" for i in range(10)]
    # 1000 tokens/s, flushes 3.5 ms apart: the first token at once (1 ms), the tokens ready at
    # 4.5 ms and 8 ms, then the last two at 10 ms, when the last is ready, not at 11.5 ms.
    assert [(t, n) for t, n, _ in paced(pieces, 1000.0, flush_interval=0.0035)] == [(0.001, 1), (0.0045, 3), (0.008, 4), (0.01, 2)]
    # With at most 2 tokens a chunk, each chunk goes out as soon as its 2 tokens are ready.
    chunks = paced(pieces, 1000.0, flush_interval=0.0035, flush_tokens=2)
    assert [(t, n) for t, n, _ in chunks] == [(0.001, 1), (0.003, 2), (0.005, 2), (0.007, 2), (0.009, 2), (0.01, 1)]
    assert [text for *_, text in chunks] == ["".join(pieces[a:b]) for a, b in ((0, 1), (1, 3), (3, 5), (5, 7), (7, 9), (9, 10))]
    # A start 5 ms late: the 5 tokens already due go out together, at once; none in the future goes early.
    late = paced(pieces, 1000.0, flush_interval=0.0035, start=-0.005)
    assert [(t, n) for t, n, _ in late] == [(0.0, 5), (0.0035, 3), (0.005, 2)]


def test_a_flush_that_fails_sends_nothing_of_its_chunk() -> None:
    pieces = [" a", " b", " c"]
    sent: list[str] = []

    async def run() -> None:
        flushes = iter([None, EngineFailure("injected engine failure")])

        def on_flush(n: int) -> None:
            failure = next(flushes)
            if failure is not None:
                raise failure

        async for chunk in paced_tokens(pieces, 1000.0, on_flush=on_flush):
            sent.append(chunk)

    with pytest.raises(EngineFailure):
        trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sent == [" a"]


def test_faults_at_a_rate_are_seeded_and_unlimited() -> None:
    def outcomes(plan: FaultPlan, flushes: int) -> list[bool]:
        failed = []
        for _ in range(flushes):
            try:
                plan.on_flush()
            except EngineFailure as failure:
                assert (str(failure), failure.code) == ("injected engine failure", "engine_failure")
                failed.append(True)
            else:
                failed.append(False)
        return failed

    plan = FaultPlan(failure_p=0.3, seed=7)
    first = outcomes(plan, 200)
    assert (plan.flushes, plan.raised) == (200, sum(first)) and 40 <= sum(first) <= 80
    assert outcomes(FaultPlan(failure_p=0.3, seed=7), 200) == first  # the same seed fails the same flushes
    assert outcomes(FaultPlan(failure_p=0.3, seed=8), 200) != first
    # `failures` limits only the counted faults: at a rate the plan keeps failing past it.
    assert sum(outcomes(FaultPlan(failure_p=0.9, failures=1), 20)) > 1
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError):
            FaultPlan(failure_p=p)


def test_counted_faults_start_after_the_flushes_before_them() -> None:
    plan = FaultPlan(flushes_before_failure=2, failures=2)
    raised = []
    for _ in range(6):
        try:
            plan.on_flush()
            raised.append(False)
        except EngineFailure as failure:  # its message is the one `response.failed` carries
            assert (str(failure), failure.code) == ("injected engine failure", "engine_failure")
            raised.append(True)
    assert raised == [False, False, True, True, False, False] and (plan.flushes, plan.raised) == (6, 2)
    default = FaultPlan()  # the first flush fails, once
    with pytest.raises(EngineFailure):
        default.on_flush()
    default.on_flush()
    assert (default.flushes, default.raised) == (2, 1)
