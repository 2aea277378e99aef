"""The real engine (prototype/engine/vllm_engine.py) against test_vllm_client's FakeWorker on a virtual clock: call
records, held requests, salts, aborts, the context window, pacing, and forced decoding (vLLM's KV holds the transcript's ids)."""

from __future__ import annotations

import contextlib
import enum
import math
import sys
from types import ModuleType, SimpleNamespace

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from support import TERMINALS, create_event, make_server, send, until, ws
from test_vllm_client import READY, FakeWorker, engine_on_fake

from prototype import benchmark
from prototype import workload as wl
from prototype.api import render
from prototype.api.costs import ZERO_COSTS
from prototype.engine import memory, vllm_engine, vllm_forced
from prototype.engine.engine import ModelCall, PlannedOutput
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel
from prototype.engine.streaming import ContextWindowExceeded
from prototype.engine.vllm_client import VllmClient, encode
from prototype.engine.vllm_engine import RealCall, RealEngineError, VllmEngine, _Held, conversation_of, open_vllm_engine
from prototype.engine.vllm_forced import FORCED_IDS, ForcedPlans, check_plan
from prototype.engine.vllm_models import TINY_CPU
from prototype.protocol import codec

LATENCY = LatencyModel()
# A record of a call vLLM said nothing of; each test's records are this with what they hold.
NOTHING = RealCall(key="s", held=False, resumed=False, isolated=False, prompt_tokens=0, sent_tokens=0, output_tokens=0,
                   sampled_tokens=0, forced=False, off_plan_tokens=0, prefill_tokens=0, prefix_hits=0, vllm_cached_tokens=0,
                   predicted_prefill_tokens=0, ttft_s=0.0, decode_s=0.0, kv_usage=0.0, kv_blocks_used=0)


async def begin_and_prefill(engine, key, prompt: Prompt, tokens: int, *, held: bool = False, pinned: bool = False, planned=None):
    """A model call begun and prefilled, as the sampling loop does: the engine's call."""
    call = await engine.begin_call(key, prompt, pinned=pinned)
    await engine.prefill_call(LATENCY, ModelCall(key, prompt, held=held, output_tokens=tokens, planned=planned), engine_call=call)
    return call


async def model_call(engine, key, prompt: Prompt, tokens: int, *, held: bool = False, pinned: bool = False, planned=None,
                     retain: bool = False):
    """One model call as the sampling loop makes it: admitted, prefilled, `tokens` decoded unstreamed, ended (the KV
    retained first when asked, as a design keeps it). Returns the prefill's answer."""
    call = await engine.begin_call(key, prompt, pinned=pinned)
    prefilled = await engine.prefill_call(LATENCY, ModelCall(key, prompt, held=held, output_tokens=tokens, planned=planned),
                                          engine_call=call)
    await engine.decode_unstreamed(LATENCY, tokens, start=0.0, engine_call=call)
    if retain:  # unpinned as a design retains it: by the default
        engine.retain(key, prompt, trio.current_time(), **({"pinned": True} if pinned else {}))
    engine.end_call(call)
    return prefilled


@contextlib.asynccontextmanager
async def engine_on_streams(nursery, **engine_options):
    """The engine on a worker whose side of the pipe the test writes by hand (`worker_end`), READY already sent."""
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(encode(READY))
    async with VllmClient.over_streams(client_end, client_end) as client, open_vllm_engine(TINY_CPU, client=client, **engine_options) as engine:
        yield engine, worker_end


# --- each call's record ------------------------------------------------------------------------------------------------


async def test_each_call_is_recorded_with_vllms_figures_and_the_prediction_in_rows_numbered_by_conversation(autojump_clock, nursery):
    async with engine_on_fake(nursery, gap=0.25, per_event=2, prefill=7, prefix_hits=32, namespace="ns-") as (engine, worker):
        prompt = Prompt(range(1000, 1040))
        await trio.sleep(1)  # times are the call's own, not the clock's
        call = await engine.begin_call("s", prompt)
        start = trio.current_time()
        prefilled = await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=False, output_tokens=5), engine_call=call)
        assert (prefilled.decode_from - start, prefilled.cached) == (0.25, 0)
        assert await engine.decode_unstreamed(LATENCY, 5, start=0.0, engine_call=call) == start + 0.75
        engine.end_call(call)
        assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (1, 7, 0)
        assert await engine.counters() == {"steps": 3}
    assert engine.records == [attrs.evolve(NOTHING, prompt_tokens=40, sent_tokens=40, output_tokens=5, sampled_tokens=5, prefill_tokens=7,
                                           prefix_hits=32, predicted_prefill_tokens=40, ttft_s=0.25, decode_s=0.5, kv_usage=0.25,
                                           kv_blocks_used=16)]
    (generate,) = [m for m in worker.received if m["op"] == "generate"]
    assert (generate["rid"], generate["salt"], generate["held"], generate["max_tokens"]) == ("r0", "ns-", False, 5)
    assert not [m for m in worker.received if m["op"] == "abort"]  # every token taken: nothing to abort
    a, b = ("chained", "task-a"), ("chained", "task-b")
    first = attrs.evolve(NOTHING, key=a, prompt_tokens=40, sent_tokens=40, output_tokens=5, sampled_tokens=7, forced=True,
                         prefill_tokens=38, prefix_hits=2, vllm_cached_tokens=2, predicted_prefill_tokens=36, ttft_s=0.25,
                         decode_s=0.5, kv_blocks_used=3)
    routed = attrs.evolve(first, key=("http-elsewhere", a), isolated=True, off_plan_tokens=1)  # a's turn served elsewhere
    resumed = attrs.evolve(first, resumed=True, sent_tokens=9, decode_s=0.0)  # one token: no decode time
    rows = vllm_engine.call_records("chained", [first, attrs.evolve(first, key=b), routed, resumed])
    assert rows[0] == {"design": "chained", "task": 0, "call": 1, "resumed": False, "routed_away": False, "prompt_tokens": 40,
                       "sent_tokens": 40, "prefill_vllm": 38, "prefill_sim": 36, "prefix_hits_vllm": 2, "cached_vllm": 2,
                       "output_tokens": 5, "sampled_tokens": 7, "forced": True, "off_plan_tokens": 0, "ttft_ms": 250.0,
                       "decode_ms": 500.0, "decode_tps": 12.0, "kv_blocks": 3}  # 6 tokens after the first in 0.5 s
    assert [(r["task"], r["call"], r["routed_away"], r["resumed"], r["sent_tokens"], r["off_plan_tokens"]) for r in rows] == [
        (0, 1, False, False, 40, 0), (1, 1, False, False, 40, 0), (0, 2, True, False, 40, 1), (0, 3, False, True, 9, 0)]
    assert rows[3]["decode_ms"] == 0.0 and math.isnan(rows[3]["decode_tps"])


async def test_tokens_outside_a_call_or_past_its_end_are_errors_and_a_silent_first_event_counts_nothing(autojump_clock, nursery):
    async with engine_on_streams(nursery) as (engine, worker_end):
        with pytest.raises(RealEngineError, match="^tokens asked for outside a model call$"):
            await engine.decode_unstreamed(LATENCY, 1, start=0.0, engine_call=None)
        prompt = Prompt([1, 2, 3])
        call = await engine.begin_call("s", prompt)

        async def worker() -> None:
            await trio.testing.wait_all_tasks_blocked()
            first = {"cached_tokens": 2, "preemptions": 1, "queued_s": 0.125}
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 1, "first": first}))
            await worker_end.send_all(encode({"type": "finished", "rid": "r0"}))

        nursery.start_soon(worker)
        prefilled = await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=call)
        assert prefilled.cached == 2 and engine.stats.cached_tokens == 2
        with pytest.raises(RealEngineError, match="^request r0 ended before its 3 tokens$"):
            await engine.decode_unstreamed(LATENCY, 3, start=0.0, engine_call=call)
        engine.end_call(call)
        call = await engine.begin_call("s", prompt)

        async def failing() -> None:
            await trio.testing.wait_all_tasks_blocked()
            await worker_end.send_all(encode({"type": "error", "rid": "r1", "message": "VLLMValidationError: no"}))

        nursery.start_soon(failing)
        with pytest.raises(RealEngineError, match="^VLLMValidationError: no$"):
            await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=call)
        engine.end_call(call)
    # What a record holds when vLLM said little (its cache, preemptions and queueing) or nothing (a failed request).
    said_little, failed = engine.records
    assert said_little == attrs.evolve(NOTHING, prompt_tokens=3, sent_tokens=3, output_tokens=1, sampled_tokens=1, vllm_cached_tokens=2,
                                       predicted_prefill_tokens=3, preemptions=1, queued_s=0.125)
    assert failed == NOTHING
    assert [type(value) for value in attrs.astuple(failed)[1:]] == [bool] * 3 + [int] * 4 + [bool] + [int] * 5 + [float] * 3 + [int] * 2 + [type(None)]
    async with engine_on_streams(nursery) as (engine, worker_end):
        prompt = Prompt(range(100, 120))
        call = await engine.begin_call("s", prompt)

        async def worker() -> None:  # a worker whose tokens carry no `first` report, nor their ids, at all
            await trio.sleep(0.5)
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 2}))
            await trio.sleep(0.25)
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 1}) + encode({"type": "finished", "rid": "r0"}))

        nursery.start_soon(worker)
        plan = PlannedOutput.of([([5, 6, 7], 3)])
        prefilled = await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=False, output_tokens=3, planned=lambda: plan),
                                              engine_call=call)
        assert (prefilled.decode_from, prefilled.cached) == (0.5, 0)
        assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (1, 0, 0)
        assert await engine.decode_unstreamed(LATENCY, 3, start=0.0, engine_call=call) == 0.75
        engine.end_call(call)
    # Ids it did not report are taken for the plan's: none counted off it.
    assert engine.records == [attrs.evolve(NOTHING, prompt_tokens=20, sent_tokens=20, output_tokens=3, sampled_tokens=3, forced=True,
                                           predicted_prefill_tokens=20, ttft_s=0.5, decode_s=0.25)]


# --- held requests, salts, aborts, the context window ----------------------------------------------------------------


async def test_a_held_requests_calls_add_up_and_each_sends_only_what_vllm_does_not_hold(autojump_clock, nursery):
    async with engine_on_fake(nursery, gap=0.25) as (engine, worker):
        prompt = Prompt(range(1000, 1040))
        seen = []
        for turn in range(3):
            prefilled = await model_call(engine, "s", prompt, 3, held=True, retain=True)
            seen.append((prefilled.cached, engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens))
            prompt.extend(range(2000 + 10 * turn, 2010 + 10 * turn))  # the next turn's ten new ids
    # vLLM holds the prompt and every sample but the last: 40 + 3 - 1 = 42 ids, then 42 + 8 + 3 - 1 = 52. Each
    # resume sends the rest (8 ids) and counts the held ones as cached; the engine's counters add up over calls.
    assert [(m["op"], len(m["prompt"])) for m in worker.received] == [("generate", 40), ("append", 8), ("append", 8)]
    assert seen == [(0, 1, 40, 0), (42, 2, 48, 42), (52, 3, 56, 94)]
    assert [(r.held, r.resumed, r.prompt_tokens, r.sent_tokens) for r in engine.records] == [
        (True, False, 40, 40), (True, True, 50, 8), (True, True, 60, 8)]
    # The simulator's prediction for the same key: the retained prompt's whole blocks are cached, in vLLM's
    # blocks (32 tokens, from the worker's ready event).
    assert [r.predicted_prefill_tokens for r in engine.records] == [40, 50 - 32, 60 - 32]


async def test_a_held_request_streams_pieces_as_tokens_arrive_and_resumes_with_the_ids_it_lacks(autojump_clock, nursery):
    async with engine_on_fake(nursery, gap=0.01, per_event=2) as (engine, worker):
        prompt = Prompt(range(1200, 1250))
        call = await engine.begin_call("s", prompt, pinned=True)
        start = trio.current_time()
        await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=True, output_tokens=5), engine_call=call)
        assert trio.current_time() - start == pytest.approx(0.01)  # the first token's arrival
        chunks = [text async for text in engine.stream(LATENCY, list("abcde"), engine_call=call)]
        # Two tokens an event; the first chunk holds the first event's tokens, nothing is lost or repeated.
        assert "".join(chunks) == "abcde" and chunks == ["ab", "cd", "e"]
        engine.end_call(call)
        prompt.extend(range(7, 17))
        resumed = await model_call(engine, "s", prompt, 1, held=True, pinned=True)
        assert resumed.cached == 54  # usage counts what the live request held as cached: all but the 6 sent
        engine.release("s")
    generate, append, close = worker.received
    # Model ids are the testbed's modulo the vocabulary (1000 here).
    assert (generate["op"], generate["held"], generate["prompt"][:2]) == ("generate", True, [200, 201])
    # The request holds 50 + 5 - 1 = 54 tokens, so the resume sends the prompt's last 6 ids only.
    assert (append["op"], append["prompt"], append["max_tokens"]) == ("append", [11, 12, 13, 14, 15, 16], 1)
    assert close == {"op": "close", "rid": generate["rid"]}
    assert [(r.resumed, r.sent_tokens, r.output_tokens, r.kv_blocks_used) for r in engine.records] == [(False, 50, 5, 16), (True, 6, 1, 16)]


async def test_a_compacted_prompt_closes_the_held_request_and_opens_one_on_the_whole_prompt(autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, worker):
        await model_call(engine, "s", Prompt(range(100, 140)), 3, held=True, pinned=True)
        # The same ids in a new object (a context rendered anew with nothing dropped) still extend the request.
        await model_call(engine, "s", Prompt([*range(100, 140), *range(500, 510)]), 2, held=True, pinned=True)
        # A compacted context starts otherwise: the request is closed, a new one takes the whole prompt.
        compacted = Prompt(range(700, 720))
        await model_call(engine, "s", compacted, 2, held=True, pinned=True)
        compacted.extend(range(800, 805))
        await model_call(engine, "s", compacted, 1, held=True, pinned=True)
        engine.release("s")
    ops = [(m["op"], m.get("rid"), len(m.get("prompt", ()))) for m in worker.received]
    first, second = (m["rid"] for m in worker.received if m["op"] == "generate")
    # 40 + 3 - 1 = 42 held, 50-token prompt: 8 appended; the new request holds 20 + 2 - 1 = 21 of 25: 4 appended.
    assert ops == [("generate", first, 40), ("append", first, 8), ("close", first, 0), ("generate", second, 20),
                   ("append", second, 4), ("close", second, 0)]
    assert [(r.resumed, r.sent_tokens) for r in engine.records] == [(False, 40), (True, 8), (False, 20), (True, 4)]


async def test_a_resume_with_no_new_ids_sends_the_last_one_and_a_plain_call_opens_its_own_request(autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, worker):
        prompt = Prompt(range(100, 140))
        assert (await model_call(engine, "s", prompt, 3, held=True, pinned=True)).cached == 0
        prompt.extend([140, 141])  # two of the three samples: vLLM holds 40 + 3 - 1 = 42 ids, all of them
        assert (await model_call(engine, "s", prompt, 2, held=True, pinned=True)).cached == 41  # the last id sent again
        # A call that is not held (a side request of the same session) is a request of its own on the whole prompt.
        assert (await model_call(engine, "s", prompt, 1)).cached == 0
        engine.release("s")
    assert [(m["op"], m["rid"], m.get("prompt"), m.get("held")) for m in worker.received] == [
        ("generate", "r0", list(range(100, 140)), True), ("append", "r0", [141], None),
        ("generate", "r1", list(range(100, 142)), False), ("close", "r0", None, None)]
    assert [(r.held, r.resumed, r.prompt_tokens, r.sent_tokens) for r in engine.records] == [
        (True, False, 40, 40), (True, True, 42, 1), (False, False, 42, 42)]


def test_a_held_request_is_extended_only_by_its_prompt_or_one_that_starts_with_it():
    held = _Held("r0", None)
    assert held.extended_by(Prompt([1, 2]))  # nothing sent yet
    prompt = Prompt([1, 2, 3])
    held.prompt, held.prompt_length = prompt, 3
    prompt.extend([4])
    assert held.extended_by(prompt)
    assert held.extended_by(Prompt([1, 2, 3]))  # as long as it was: the same ids
    assert not held.extended_by(Prompt([1, 2]))
    assert not held.extended_by(Prompt([1, 2, 9, 4]))
    assert held.extended_by(Prompt([1, 2, 3, 7, 8]))


@pytest.mark.parametrize("namespace", ["ns-", None])
async def test_a_salt_is_the_namespaces_and_new_for_each_isolated_session(autojump_clock, nursery, namespace):
    async with engine_on_fake(nursery, namespace=namespace) as (engine, worker):
        for key in ("a", "a", "b"):
            engine.isolate(key)
            await model_call(engine, key, Prompt([1, 2, 3]), 1)
        engine.release("a")
        engine.isolate("a")
        call = await begin_and_prefill(engine, "a", Prompt([1, 2, 3]), 0)
        await engine.decode_unstreamed(LATENCY, 1, start=0.0, engine_call=call)
        engine.end_call(call)
    generates = [m for m in worker.received if m["op"] == "generate"]
    prefix = namespace or ""
    assert [(m["rid"], m["salt"]) for m in generates] == [
        ("r0", f"{prefix}isolated-0"), ("r1", f"{prefix}isolated-0"), ("r2", f"{prefix}isolated-1"), ("r3", f"{prefix}isolated-2")]
    assert (generates[-1]["max_tokens"], [r.isolated for r in engine.records]) == (1, [True] * 4)  # vLLM samples one at least


async def test_a_call_stopped_early_is_aborted_unless_its_request_is_held_and_a_second_end_does_nothing(autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, worker):
        for key, held in (("held", True), ("plain", False)):
            prompt = Prompt(range(10, 20))
            call = await begin_and_prefill(engine, key, prompt, 4, held=held)
            await engine.decode_unstreamed(LATENCY, 2, start=0.0, engine_call=call)
            engine.end_call(call)
            engine.end_call(call)  # a second end records and aborts nothing more
        await trio.testing.wait_all_tasks_blocked()
        assert [(r.key, r.output_tokens) for r in engine.records] == [("held", 2), ("plain", 2)]
        with pytest.raises(RealEngineError, match="outside a model call"):  # tokens of a call that has ended
            await engine.decode_unstreamed(LATENCY, 1, start=0.0, engine_call=call)
        # A late second end of an earlier call, from a cleanup path, leaves the session's next call alone.
        first = await begin_and_prefill(engine, "s", prompt := Prompt(range(100, 120)), 1)
        await engine.decode_unstreamed(LATENCY, 1, start=0.0, engine_call=first)
        engine.end_call(first)
        second = await begin_and_prefill(engine, "s", prompt, 3)
        engine.end_call(first)
        assert await engine.decode_unstreamed(LATENCY, 3, start=0.0, engine_call=second) > 0
        engine.end_call(second)
    assert [(r.key, r.output_tokens) for r in engine.records][2:] == [("s", 1), ("s", 3)]
    assert [m for m in worker.received if m["op"] == "abort"] == [{"op": "abort", "rid": "r1"}]


async def test_a_call_past_the_model_specs_window_is_refused_before_vllm_sees_it_and_no_spec_sends_any(autojump_clock, nursery):
    async with engine_on_fake(nursery, spec=attrs.evolve(TINY_CPU, max_model_len=64)) as (engine, worker):
        prompt = Prompt(range(100, 150))
        await model_call(engine, "s", prompt, 14, held=True, pinned=True)  # 64: fits
        prompt.extend(range(200, 210))  # the request holds 63; one id more and 5 tokens out is 69 > 64
        call = await engine.begin_call("s", prompt, pinned=True)
        with pytest.raises(ContextWindowExceeded) as refused:
            await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=True, output_tokens=5), engine_call=call)
        assert (refused.value.tokens, refused.value.window) == (69, 64)
        engine.end_call(call)
        engine.release("s")
    assert [m["op"] for m in worker.received] == ["generate", "close"]
    client_end, worker_end = trio.testing.memory_stream_pair()
    worker = FakeWorker(worker_end)
    nursery.start_soon(worker.serve)
    async with VllmClient.over_streams(client_end, client_end) as client, trio.open_nursery() as engine_nursery:
        await model_call(VllmEngine(client=client, nursery=engine_nursery), "s", Prompt(range(100, 300)), 2)
        engine_nursery.cancel_scope.cancel()
    assert [(m["op"], len(m["prompt"])) for m in worker.received] == [("generate", 200)]


async def test_a_prompt_past_the_engines_window_is_refused_before_its_response_starts(autojump_clock, nursery):
    # The API refuses an input too long before a response starts (400 `context_length_exceeded`); with a real engine
    # the window is also its `max_model_len`, less the one token a request samples at least. A prompt that fits but
    # whose planned output does not is found once the response has started: it fails with the schema's `server_error`.
    event = create_event(metadata={"testbed_workload": "fixed:1"})
    request = codec.parse_create_body({key: value for key, value in event.items() if key != "type"})
    prompt = len(render.render_full(render.preamble_key(request.instructions, request.tools), request.input))
    for max_model_len in (prompt, prompt + 1):
        async with engine_on_fake(nursery, spec=attrs.evolve(TINY_CPU, max_model_len=max_model_len)) as (engine, worker):
            async with ws(make_server(engine=engine), "chained") as conn:
                await send(conn, event)
                events = await until(conn, *TERMINALS)
        if max_model_len == prompt:  # the refusal itself is test_limits' to pin
            assert [(e["type"], e["status"], e["error"]["code"]) for e in events] == [("error", 400, "context_length_exceeded")]
        else:
            failed = events[-1]["response"]["error"]
            assert (events[0]["type"], events[-1]["type"], failed["code"]) == ("response.created", "response.failed", "server_error")
            assert failed["message"].endswith(f"exceeds the context window of {max_model_len:,} tokens")
        assert [m for m in worker.received if m["op"] == "generate"] == []  # vLLM saw neither


# --- what the simulated bookkeeping predicts ---------------------------------------------------------------------------


@pytest.mark.parametrize("paused, where", [(None, "swapping_out"), (True, "swapping_out"), (False, "gpu")])
async def test_a_calls_end_tells_the_simulated_bookkeeping_whether_the_session_will_be_back(autojump_clock, nursery, paused, where):
    async with engine_on_fake(nursery, retention=memory.SWAP_POLICY) as (engine, _):
        prompt = Prompt(range(100, 140))
        call = await begin_and_prefill(engine, "s", prompt, 1)
        await engine.decode_unstreamed(LATENCY, 1, start=0.0, engine_call=call)
        engine.retain("s", prompt, trio.current_time())
        # Paused at a tool call (the default) the swap policy copies the KV out; after a final answer it stays.
        engine.end_call(call) if paused is None else engine.end_call(call, paused=paused)
        assert engine.kv["s"].where == where


async def test_the_prediction_is_the_sessions_own_a_pinned_one_exact_an_isolated_one_by_whole_blocks(autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, _):
        engine.isolate("isolated")
        for key, pinned in (("pinned", True), ("isolated", False)):
            prompt = Prompt(range(100, 140))
            for _ in range(2):
                await model_call(engine, key, prompt, 1, held=pinned, pinned=pinned, retain=True)
                prompt.extend(range(200, 210))
    # A pinned session (a live v1 coroutine) holds all 40 tokens it computed; an isolated one finds its own
    # two whole 16-token blocks only, since it shares nothing through the block directory.
    assert [(r.key, r.predicted_prefill_tokens) for r in engine.records] == [
        ("pinned", 40), ("pinned", 10), ("isolated", 40), ("isolated", 50 - 32)]


@pytest.mark.parametrize("held, predicted", [(True, 80 - 63), (False, 80 - 32)])
async def test_the_simulated_prediction_counts_vllms_blocks_and_leaves_out_the_last_sample(held, predicted, autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, _):  # blocks of 32 (its ready event)
        prompt = Prompt(range(100, 156))
        plan = PlannedOutput.of([(list(range(200, 208)), 8)])
        call = await begin_and_prefill(engine, "s", prompt, 8, held=held, pinned=held, planned=lambda: plan)
        await engine.decode_unstreamed(LATENCY, 8, start=0.0, engine_call=call)
        prompt.extend(plan.ids)  # the output joins the context, and the design keeps its KV (SamplingLoop.take_outputs)
        engine.retain("s", prompt, trio.current_time(), pinned=held)
        engine.end_call(call)
        prompt.extend(range(300, 316))  # a tool's output
        await model_call(engine, "s", prompt, 1, held=held, pinned=held)
        engine.release("s")
    # vLLM holds 56 + 8 - 1 = 63 ids: a held request is sent the other 17; a new request finds one whole block
    # of 32 (the simulated engine's defaults would say 64: the whole output, in blocks of 16).
    assert engine.records[-1].predicted_prefill_tokens == predicted
    if held:
        assert engine.records[-1].sent_tokens == predicted


# --- the stream --------------------------------------------------------------------------------------------------------


async def test_a_stream_coalesces_as_the_simulated_engine_does_a_chunk_due_one_interval_after_the_last(autojump_clock, nursery):
    async def chunks(per_event: int, **flush) -> list[tuple[float, str]]:
        async with engine_on_fake(nursery, gap=0.125, per_event=per_event) as (engine, _):
            prompt = Prompt(range(100, 110))
            call = await begin_and_prefill(engine, "s", prompt, 6)
            start = trio.current_time()
            out = [(round(trio.current_time() - start, 9), text) async for text in engine.stream(LATENCY, list("abcdef"), engine_call=call, **flush)]
            engine.retain("s", prompt, trio.current_time())  # as a design keeps the call's KV
            engine.end_call(call)
            assert "s" in engine.kv
            engine.release("s")
            assert "s" not in engine.kv  # the simulated engine's bookkeeping forgets it too
            assert engine.stats.decoded_tokens == 6  # every chunk counted once
            return out

    # One token every 1/8 s, the first one already there: by default each goes out as it comes.
    assert await chunks(1) == [(0.0, "a"), (0.125, "b"), (0.25, "c"), (0.375, "d"), (0.5, "e"), (0.625, "f")]
    assert await chunks(1, flush_interval=10.0, flush_tokens=2) == [(0.0, "a"), (0.25, "bc"), (0.5, "de"), (0.625, "f")]
    # A chunk goes out when its interval ends, 0.3 s after the last, to the tick, between vLLM's events.
    assert await chunks(1, flush_interval=0.3) == [(0.0, "a"), (0.3, "bc"), (0.6, "de"), (0.625, "f")]
    # Three tokens an event, two at most a chunk: what is left of an event goes out at once, not with the next event.
    assert await chunks(3, flush_tokens=2) == [(0.0, "ab"), (0.0, "c"), (0.125, "de"), (0.125, "f")]


@pytest.mark.parametrize("per_event, chunks", [
    (7, (["abc"], ["de"])),  # the call's seven tokens in one event
    (2, (["ab", "c"], ["d", "e"])),  # an event's second token is the next item's (or the unstreamed ones')
])
async def test_each_item_of_a_call_takes_only_its_own_tokens_whatever_vllms_events_bring(autojump_clock, nursery, per_event, chunks):
    async with engine_on_fake(nursery, gap=0.1, per_event=per_event) as (engine, _):
        prompt = Prompt(range(100, 110))
        call = await begin_and_prefill(engine, "s", prompt, 7)
        first = [text async for text in engine.stream(LATENCY, list("abc"), engine_call=call)]
        await engine.decode_unstreamed(LATENCY, 2, start=0.0, engine_call=call)  # reasoning, say
        second = [text async for text in engine.stream(LATENCY, list("de"), engine_call=call)]
        engine.end_call(call)
    # Decoded: the streamed tokens alone.
    assert ((first, second), engine.records[-1].output_tokens, engine.stats.decoded_tokens) == (chunks, 7, 5)


# --- forced decoding -----------------------------------------------------------------------------------------------------


_Direction = enum.Enum("MoveDirectionality", "UNIDIRECTIONAL SWAP", start=0)  # vLLM's, by name


def _params(plan):
    return SimpleNamespace(extra_args={FORCED_IDS: plan} if plan is not None else None)


def _batch(removed=(), added=(), moved=()):
    """A vLLM BatchUpdate: rows removed, added (index, params, prompt ids, the request's live output ids), moved."""
    return SimpleNamespace(removed=list(removed), added=list(added), moved=list(moved))


def test_forced_plans_give_each_row_its_next_planned_id_through_batch_changes():
    plans = ForcedPlans()
    out_a, out_b = [], []
    plans.update(_batch(added=[(0, _params([5, 6, 7]), [1, 2], out_a), (1, _params([8, 9]), None, out_b), (2, _params(None), [3], [])]))
    assert plans.next_ids() == ([0, 1], [5, 8])  # the row without a plan samples freely
    out_a.append(5)  # vLLM extends each request's own list as it samples: the position follows it
    out_b.append(8)
    assert plans.next_ids() == ([0, 1], [6, 9])
    plans.update(None)  # the batch did not change
    plans.update(_batch(moved=[(0, 1, _Direction.SWAP)]))
    assert sorted(zip(*plans.next_ids())) == [(0, 9), (1, 6)]
    out_b.append(9)  # b's plan is used up: from now on it samples freely
    assert plans.next_ids() == ([1], [6])
    # A request leaves row 0 and the batch is condensed: row 1 moves one way into it.
    plans.update(_batch(removed=[0], moved=[(1, 0, _Direction.UNIDIRECTIONAL)]))
    assert plans.next_ids() == ([0], [6])
    # A held request's next chunk comes back as an added row, with its own plan and its output list emptied.
    out_a.clear()
    plans.update(_batch(added=[(0, _params([4, 3]), [1, 2, 5, 6], out_a)]))
    assert plans.next_ids() == ([0], [4])
    plans.update(_batch(added=[(0, _params(None), [7], [])]))  # a request without a plan takes the row
    assert plans.next_ids() == ([], [])
    # Rows leave and swap without a plan; params without extra_args carry none.
    plans = ForcedPlans()
    plans.update(_batch(added=[(0, _params([5]), [], []), (1, _params([6]), [], [])]))
    plans.update(_batch(removed=[0, 2]))  # a planned row leaves; row 2 never had a plan
    assert plans.next_ids() == ([1], [6])
    plans.update(_batch(moved=[(3, 1, _Direction.SWAP), (4, 5, _Direction.SWAP)]))  # swaps with rows that hold no plan
    assert plans.next_ids() == ([3], [6])
    check_plan(SimpleNamespace())  # no extra_args at all: no plan


def test_the_vllm_processor_sets_every_logit_of_a_planned_row_but_its_next_id_to_minus_infinity(monkeypatch):
    """`ForcedDecoding`, built on first access on vLLM's logits-processor base, here a stand-in (and torch's
    tensors numpy's): what it does to a batch's logits."""
    made = []
    torch = ModuleType("torch")
    torch.long, torch.device, torch.Tensor = "long", object, np.ndarray
    torch.tensor = lambda data, dtype, device: made.append((dtype, device)) or np.array(data)
    interface = ModuleType("vllm.v1.sample.logits_processor")
    interface.LogitsProcessor = type("LogitsProcessor", (), {})
    for name, module in {"torch": torch, "vllm": ModuleType("vllm"), "vllm.v1": ModuleType("vllm.v1"),
                         "vllm.v1.sample": ModuleType("vllm.v1.sample"), "vllm.v1.sample.logits_processor": interface}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(vllm_forced.__dict__, "ForcedDecoding", None)  # so that the class built here is gone after the test
    del vllm_forced.ForcedDecoding
    processor_class = vllm_forced.ForcedDecoding
    assert vllm_forced.ForcedDecoding is processor_class  # built once
    assert issubclass(processor_class, interface.LogitsProcessor)
    assert (processor_class.__module__, processor_class.__qualname__) == (vllm_forced.__name__, "ForcedDecoding")
    with pytest.raises(ValueError, match="non-negative token ids"):
        processor_class.validate_params(_params([-1]))
    processor = processor_class(None, "cpu", False)
    assert processor.is_argmax_invariant() is False
    output = []
    processor.update_state(_batch(added=[(0, _params([2, 3]), [], output), (1, _params(None), [], [])]))
    logits = np.zeros((2, 4))
    assert processor.apply(logits) is logits
    assert (logits.tolist(), made) == ([[-math.inf, -math.inf, 0.0, -math.inf], [0.0] * 4], [("long", "cpu"), ("long", "cpu")])
    output += [2, 3]  # the plan is used up: the row samples freely
    assert processor.apply(np.ones((2, 4))).tolist() == [[1.0] * 4] * 2
    with pytest.raises(AttributeError, match=f"^module {vllm_forced.__name__!r} has no attribute 'Other'$"):
        vllm_forced.Other  # noqa: B018


@pytest.mark.parametrize("plan", ["1 2", [1, -2], [1, 2.0], [True]])
def test_a_plan_that_is_not_a_list_of_token_ids_is_refused(plan):
    with pytest.raises(ValueError, match="must be a list of non-negative token ids"):
        check_plan(_params(plan))
    check_plan(_params([0, 7]))
    check_plan(_params(None))


async def test_a_planned_call_samples_its_whole_plan_streams_only_its_text_and_counts_ids_off_the_plan(autojump_clock, nursery):
    async with engine_on_fake(nursery, gap=0.01) as (engine, worker):
        prompt = Prompt(range(1200, 1250))
        # Two items: two framing ids then three of text, one framing id then two of text.
        plan = PlannedOutput.of([([1500, 1501, 1007, 1008, 1009], 3), ([1502, 1010, 1011], 2)])
        call = await engine.begin_call("s", prompt, pinned=True)
        asked = trio.current_time()
        await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=True, output_tokens=5, planned=lambda: plan), engine_call=call)
        assert trio.current_time() - asked == pytest.approx(0.01)  # vLLM's first token, a framing one: prefill is over
        chunks = [(trio.current_time() - asked, text) async for text in engine.stream(LATENCY, list("abcde"), engine_call=call)]
        # One token every 10 ms; the framing ones (the 1st, 2nd and 6th) stream nothing.
        assert [text for _, text in chunks] == list("abcde")
        assert [t for t, _ in chunks] == pytest.approx([0.03, 0.04, 0.05, 0.07, 0.08])
        engine.end_call(call)
        prompt.extend([*plan.ids, *range(1300, 1304)])  # the output as the transcript renders it, then a tool's output
        resume = PlannedOutput.of([([1503, 1012], 1)])
        await model_call(engine, "s", prompt, 1, held=True, pinned=True, planned=lambda: resume)
        engine.release("s")
    generate, append, _ = worker.received
    # The plan crosses into the model's vocabulary (1000 here) as the prompt does.
    assert (generate["max_tokens"], generate["forced"]) == (8, [500, 501, 7, 8, 9, 502, 10, 11])
    # The request holds the prompt and every sample but the last (50 + 8 - 1): the resume sends the last planned
    # id, which vLLM never fed back, and the tool's output, with the resume's own plan.
    assert (append["prompt"], append["max_tokens"], append["forced"]) == ([11, 300, 301, 302, 303], 2, [503, 12])
    assert [(r.output_tokens, r.sampled_tokens, r.forced, r.off_plan_tokens) for r in engine.records] == [(5, 8, True, 0), (1, 2, True, 0)]
    async with engine_on_fake(nursery, off_plan=True, free_id=8) as (engine, _):
        plan = PlannedOutput.of([([7, 8, 9], 3)])
        await model_call(engine, "s", Prompt(range(100, 110)), 3, planned=lambda: plan)
    (record,) = engine.records
    assert (record.forced, record.sampled_tokens, record.off_plan_tokens) == (True, 3, 2)  # 8, 8, 8 against 7, 8, 9
    plan = PlannedOutput.of([([1, 2, 3], 1), ([4, 5], 4)])  # a rendering shorter than its text: padded to its tokens
    assert (plan.ids, plan.items, plan.text_tokens) == ((1, 2, 3, 4, 5, 5, 5), ((2, 1), (0, 4)), 5)


async def test_a_plan_whose_text_is_not_the_calls_tokens_is_refused_before_vllm_sees_it(autojump_clock, nursery):
    async with engine_on_fake(nursery) as (engine, worker):
        prompt = Prompt(range(100, 110))
        plan = PlannedOutput.of([([7, 8, 9], 3)])
        call = await engine.begin_call("s", prompt)
        with pytest.raises(RealEngineError, match="^a plan of 3 text tokens for a call of 5$"):
            await engine.prefill_call(LATENCY, ModelCall("s", prompt, held=False, output_tokens=5, planned=lambda: plan), engine_call=call)
        engine.end_call(call)
    assert worker.received == []


@pytest.mark.parametrize("design", benchmark.DESIGNS)
async def test_each_calls_plan_is_what_the_next_prompt_renders(design, autojump_clock, nursery, monkeypatch):
    """The invariant forced decoding rests on: what a call samples (its plan) is what the conversation's
    later prompts carry right after its own prompt, so vLLM's KV holds the transcript's ids."""
    # Reasoning, a hosted web_search every turn, function calls: every kind of output a call can render.
    preset = attrs.evolve(wl.PRESETS["chat"], hosted_call_p=1.0, parallel_calls_p=1.0)
    config = benchmark.BenchConfig(preset=preset, n_tasks=1, fixed_turns=3, costs=ZERO_COSTS)
    calls: list[tuple] = []
    prefill_call = VllmEngine.prefill_call

    async def recording(self, latency, call, **options):
        calls.append((conversation_of(call.key), list(call.prompt.ids), call.planned().ids if call.planned else None))
        return await prefill_call(self, latency, call, **options)

    monkeypatch.setattr(VllmEngine, "prefill_call", recording)
    async with engine_on_fake(nursery, gap=0.001, per_event=64) as (engine, _):
        (record,) = await benchmark.run_design(design, 1000.0, config.tasks(), config, server=benchmark.bench_server(config, engine))
    assert record.status == "completed"
    (task,) = config.tasks()
    assert len(calls) == sum(1 + len(turn.hosted_calls) for turn in task.turns) and all(plan for _, _, plan in calls)
    checked = 0
    for i, (conversation, prompt, plan) in enumerate(calls):
        if later := [p for c, p, _ in calls[i + 1 :] if c == conversation]:
            # The last sampled id is never fed back (a hosted call's, the one before its result, may render otherwise).
            assert later[0][len(prompt) : len(prompt) + len(plan) - 1] == list(plan[:-1])
            checked += 1
    assert checked == len(calls) - 1
