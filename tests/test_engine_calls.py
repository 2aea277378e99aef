"""The engine's model-call interface (engine.py, streaming.py, stats.py), exact on the autojump clock: prefill and decode
timed from the call's place on the schedule, counters, the session's key in the prefix lookup, paced streaming, injected
faults; and what the sampling loop asks of an engine that reads it (vLLM's, on a scripted worker)."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from support import TERMINALS, create_event, make_server, send, until, ws
from test_vllm_client import engine_on_fake

from prototype.designs.sampling import _answer_tokens
from prototype.engine import tokenizer
from prototype.engine.engine import Engine, PlannedOutput
from prototype.engine.latency import LatencyModel
from prototype.engine.policy import PlannedCall, TurnPlan
from prototype.engine.stats import MAX_STAT_SAMPLES, sample
from prototype.engine.streaming import EngineFailure, FaultPlan, paced_tokens
from prototype.workload import HostedCall, TurnSpec, Workload

# 1000 prompt tokens a second, 10 sampled tokens a second, no overheads: every time below is exact.
LATENCY = LatencyModel(decode_tokens_per_s=10.0, prefill_tokens_per_s=1000.0, cache_attention=None, request_overhead=0.0)


async def test_a_prefill_counts_its_call_and_tokens_and_ends_from_its_start(autojump_clock) -> None:
    engine = Engine()
    await trio.sleep(1.0)
    # Its place on the response's schedule is 0.5 s: the prefill ends 1 s after it, not 1 s after now.
    assert (await engine.prefill(LATENCY, uncached=1000, cached=30, start=0.5), trio.current_time()) == (1.5, 1.5)
    assert await engine.prefill(LATENCY, uncached=500, cached=70) == 2.0
    assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (2, 1500, 100)
    # Unstreamed tokens are ready their decode time after their start.
    assert await engine.decode_unstreamed(LATENCY, 5, start=2.25) == 2.75 == trio.current_time()


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
    assert (ends, trio.current_time(), engine.stats.prefill_waits, engine.stats.model_calls) == ([1.5, 2.5], 2.5, [0.0, 0.5], 2)


async def chunks(engine: Engine, pieces: list[str], **kwargs) -> list[tuple[float, str]]:
    return [(round(trio.current_time(), 9), text) async for text in engine.stream(LATENCY, pieces, **kwargs)]


async def test_a_stream_sends_each_token_when_sampled_by_default_or_takes_its_start_and_flushes_and_counts_them(autojump_clock):
    engine = Engine()
    assert (await chunks(engine, list("abcd")), engine.stats.decoded_tokens, await chunks(engine, list("ef"))) == (
        [(0.1, "a"), (0.2, "b"), (0.3, "c"), (0.4, "d")], 4, [(0.5, "e"), (0.6, "f")])
    await trio.sleep(0.4)
    # Sampling began at 0.5 s: six tokens are ready at once, sent two a chunk; then flushes every 0.25 s
    # (capped at two tokens), the last when the last token is ready at 1.3 s.
    got = await chunks(engine, list("abcdefgh"), start=0.5, flush_interval=0.25, flush_tokens=2)
    assert (got, engine.stats.decoded_tokens) == ([(1.0, "ab"), (1.0, "cd"), (1.1, "ef"), (1.3, "gh")], 14)


def test_per_call_samples_keep_the_most_recent_ones_trimmed_in_batches() -> None:
    # A long-running server's samples stay bounded: at twice the bound, the next trims to the newest MAX_STAT_SAMPLES.
    samples: list[float] = []
    for value in range(2 * MAX_STAT_SAMPLES):
        sample(samples, float(value))
    assert len(samples) == 2 * MAX_STAT_SAMPLES and samples[0] == 0.0 and samples[-1] == 2 * MAX_STAT_SAMPLES - 1
    sample(samples, float(2 * MAX_STAT_SAMPLES))
    assert samples == [float(value) for value in range(MAX_STAT_SAMPLES + 1, 2 * MAX_STAT_SAMPLES + 1)]


# --- paced streaming and injected faults (engine/streaming.py) -------------------------------------------


def paced(pieces: list[str], rate: float, **kwargs: object) -> list[tuple[float, int, str]]:
    """Each chunk `paced_tokens` gives on a virtual clock: (time, tokens `on_flush` was told of, text)."""
    flushed: list[int] = []

    async def run() -> list[tuple[float, int, str]]:
        return [(round(trio.current_time(), 9), flushed[-1], chunk)
                async for chunk in paced_tokens(pieces, rate, on_flush=flushed.append, **kwargs)]

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def test_tokens_go_out_one_by_one_at_the_decode_rate_or_coalesced_at_the_flush_interval_and_the_last_when_ready() -> None:
    assert paced([" a", " b", " c"], 1000.0) == [(0.001, 1, " a"), (0.002, 1, " b"), (0.003, 1, " c")]
    # From a start on the engine's own schedule (here in the future), every deadline counts from it.
    assert paced([" a", " b"], 500.0, start=0.01) == [(0.012, 1, " a"), (0.014, 1, " b")]
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
            if (failure := next(flushes)) is not None:
                raise failure

        async for chunk in paced_tokens(pieces, 1000.0, on_flush=on_flush):
            sent.append(chunk)

    with pytest.raises(EngineFailure):
        trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sent == [" a"]


def failed_flushes(plan: FaultPlan, flushes: int) -> list[bool]:
    """Which of `flushes` flushes the plan failed, each failure with the message `response.failed` carries."""
    failed = []
    for _ in range(flushes):
        try:
            plan.on_flush()
        except EngineFailure as failure:
            assert failure.message == "The engine failed mid-response: injected engine failure"
            failed.append(True)
        else:
            failed.append(False)
    return failed


def test_faults_at_a_rate_are_seeded_and_unlimited_and_counted_ones_follow_their_flushes() -> None:
    plan = FaultPlan(failure_p=0.3, seed=7)
    first = failed_flushes(plan, 200)
    assert (plan.flushes, plan.raised) == (200, sum(first)) and 40 <= sum(first) <= 80
    assert failed_flushes(FaultPlan(failure_p=0.3, seed=7), 200) == first  # the same seed fails the same flushes
    assert failed_flushes(FaultPlan(failure_p=0.3, seed=8), 200) != first
    # `failures` limits only the counted faults: at a rate the plan keeps failing past it.
    assert sum(failed_flushes(FaultPlan(failure_p=0.9, failures=1), 20)) > 1
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError):
            FaultPlan(failure_p=p)
    # Counted faults start after the flushes before them.
    plan = FaultPlan(flushes_before_failure=2, failures=2)
    assert failed_flushes(plan, 6) == [False, False, True, True, False, False] and (plan.flushes, plan.raised) == (6, 2)
    default = FaultPlan()  # the first flush fails, once
    assert failed_flushes(default, 2) == [True, False] and (default.flushes, default.raised) == (2, 1)


# --- what the sampling loop asks of an engine that reads it ----------------------------------------------


REASONED = TurnPlan(
    words=tuple(tokenizer.single_token_words()[:24]), searches=(),
    calls=(PlannedCall("lookup", '{"city": "Paris", "days": 3}'),), reasoning=tuple(tokenizer.single_token_words()[:16]),
)
SHORT_ANSWER = attrs.evolve(REASONED, words=REASONED.words[:4])


@pytest.mark.parametrize(("plan", "budget", "expected"), [
    # The last model call samples reasoning (when the budget leaves room after it), the message, the calls' arguments.
    (REASONED, None, 16 + 24 + 12),
    (REASONED, 40, 16 + 24 + 12),  # exactly room for the message: it completes and its call follows
    (REASONED, 20, 16 + 4),  # the message is cut at the budget: no call follows
    (REASONED, 16, 16),  # no room after the reasoning: none is sampled, the message takes the whole budget
    (SHORT_ANSWER, 10, 4 + 12),  # no reasoning, and the short message fits: its call follows
    (attrs.evolve(REASONED, words=REASONED.words[:2]), 16, 2 + 12),  # a budget of just the reasoning leaves it out
    (attrs.evolve(REASONED, reasoning=()), None, 24 + 12),
])
def test_the_last_model_call_asks_for_the_tokens_the_loop_samples(plan, budget, expected) -> None:
    assert (len(tokenizer.encode(REASONED.calls[0].arguments)), _answer_tokens(plan, budget)) == (12, expected)


def test_a_plan_pads_a_rendering_shorter_than_its_text_with_its_last_id_and_an_empty_one_with_zeros() -> None:
    plan = PlannedOutput.of([([1, 2, 3], 2), ([4, 5, 6], 5), ([], 2)])
    assert (plan.ids, plan.items, plan.text_tokens) == ((1, 2, 3, 4, 5, 6, 6, 6, 0, 0), ((1, 2), (0, 5), (0, 2)), 9)


async def test_a_warm_up_and_a_reasoned_turn_over_a_real_engines_interface(autojump_clock, nursery) -> None:
    # The simulated engine ignores what a call asks to sample and where tokens come from; vLLM's interface reads both.
    async with engine_on_fake(nursery) as (engine, worker):
        server = make_server(engine=engine)
        # One final turn: a hosted search, then 15 tokens of reasoning and 25 of text.
        key = server.api.workloads.register(Workload("vllm", 1, (TurnSpec(300, 40, (), (HostedCall(1.0, 50),), 15),)))
        async with ws(server, "chained") as conn:
            await send(conn, create_event(generate=False))
            warm = await until(conn, *TERMINALS)
            await send(conn, create_event(metadata={"testbed_workload": key}, tools=[*create_event()["tools"], {"type": "web_search"}]))
            turn = await until(conn, *TERMINALS)
    assert (warm[-1]["type"], turn[-1]["type"]) == ("response.completed", "response.completed")
    response = turn[-1]["response"]
    assert [item["type"] for item in response["output"]] == ["web_search_call", "reasoning", "message"]
    usage = response["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 15
    generates = [(m["max_tokens"], m["forced"], m["held"]) for m in worker.received if m["op"] == "generate"]
    # The warm-up samples nothing (vLLM samples one token, free, dropped); the search's arguments, then the rest,
    # each call its plan: its items' text and framing.
    assert generates[0] == (1, None, False)
    assert all(tokens == len(forced) and not held for tokens, forced, held in generates[1:])
    # Each call is recorded under the session's own key, the warm-up's as well, with what it took.
    keys = {r.key for r in engine.records}
    assert len(keys) == 1 and None not in keys
    assert [(r.output_tokens, r.prompt_tokens > 0) for r in engine.records] == [(0, True), (usage["output_tokens"] - 40, True), (40, True)]
    assert [r.sampled_tokens for r in engine.records] == [1, *(tokens for tokens, _, _ in generates[1:])]


async def test_a_budgeted_turn_asks_a_real_engine_for_what_the_budget_leaves(autojump_clock, nursery) -> None:
    async with engine_on_fake(nursery) as (engine, worker):
        server = make_server(engine=engine)
        key = server.api.workloads.register(Workload("vllm-budget", 1, (TurnSpec(300, 40, (), (), 15),)))
        async with ws(server, "chained") as conn:
            await send(conn, create_event(metadata={"testbed_workload": key}, max_output_tokens=20))
            turn = await until(conn, *TERMINALS)
    assert turn[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    # 15 tokens of reasoning and the first 5 of the text's 25: the call takes 20, not the plan's 40, and vLLM
    # samples those with the two items' framing.
    (generate,) = [m for m in worker.received if m["op"] == "generate"]
    assert [r.output_tokens for r in engine.records] == [20] and generate["max_tokens"] == len(generate["forced"]) > 20
