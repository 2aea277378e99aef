"""The `generate: false` warm-up prefills instructions and tools, so the next turn's prefix is cached (docs/codex.md);
on a lane it prefills only what that lane's KV does not hold."""

from __future__ import annotations

import pytest
import trio
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, send, until, ws

from prototype.api import render
from prototype.client.harness import CHAINED
from prototype.engine.engine import Engine
from prototype.engine.kv import BLOCK_SIZE
from prototype.engine.latency import LatencyModel
from prototype.engine.memory import SWAP_POLICY
from prototype.protocol import codec

TOOLS = [{"type": "function", "name": "exec_command",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}]
INSTRUCTIONS = {"type": "message", "role": "developer", "content": "You are a coding agent. " * 40}
TASK = {"type": "message", "role": "user", "content": "List the files."}


def create(input: list, **fields) -> dict:
    return {"type": "response.create", "model": "sim-1000", "input": input, "tools": TOOLS, "store": False,
            "metadata": {"testbed_workload": "fixed:2"}, **fields}


def prompt_tokens(*items: dict) -> int:
    """The rendered prompt's length, computed from the items as the server parses them."""
    request = codec.decode_client_event(codec.encode(create(list(items)))).request
    return len(render.render_full(render.preamble_key(request.instructions, request.tools), request.input))


async def test_the_warm_up_prefills_instructions_and_tools_and_the_next_turn_finds_them_cached(autojump_clock):
    cold_server, server = make_server(), make_server()
    async with ws(cold_server, CHAINED) as conn:  # without a warm-up: every token prefilled
        await conn.send_message(codec.encode(create([INSTRUCTIONS, TASK])))
        cold = (await until(conn, "response.completed"))[-1]["response"]
    async with ws(server, CHAINED, include_timing=True) as conn:
        await conn.send_message(codec.encode(create([INSTRUCTIONS], generate=False)))
        previous = (await until(conn, "response.completed"))[-1]["response"]["id"]
        await conn.send_message(codec.encode(create([TASK], previous_response_id=previous)))
        response = (await until(conn, "response.completed"))[-1]["response"]
    assert cold["usage"]["input_tokens"] == prompt_tokens(INSTRUCTIONS, TASK)
    assert cold["usage"]["input_tokens_details"]["cached_tokens"] == 0 and "warmup_prefill_tokens" not in cold_server.records[0]
    warm, first = list(server.records)
    prefix = prompt_tokens(INSTRUCTIONS)
    assert warm["warmup"] is True and warm["warmup_prefill_tokens"] == prefix
    assert warm["usage"]["input_tokens"] == 0 and warm["usage"]["output_tokens"] == 0  # nothing sampled
    latency = LatencyModel(decode_tokens_per_s=1000.0)
    assert warm["phases_ms"]["prefill"] == pytest.approx(1000 * latency.prefill_seconds(prefix, 0), abs=5e-4)  # records round to µs
    # The first real turn prefills only its own items: the instructions and tools are cached, in
    # whole blocks as the engine's prefix cache counts them.
    assert response["usage"]["input_tokens"] == prompt_tokens(INSTRUCTIONS, TASK)
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == prefix - prefix % BLOCK_SIZE > 0
    assert first["context"] == "chained" and first["input_items"] == 1


MORE = {"type": "message", "role": "user", "content": "Then read the README."}


async def test_a_warm_up_over_a_partly_cached_prefix_prefills_only_the_rest(autojump_clock):
    # SWAP moves the KV of a session paused at a tool call to the host; a warm-up is not such a
    # pause, so its KV stays on the GPU as prefix cache.
    server = make_server(engine=Engine(retention=SWAP_POLICY))
    engine = server.api.engine
    latency = LatencyModel(decode_tokens_per_s=1000.0)
    async with ws(server, CHAINED, include_timing=True) as conn:
        await conn.send_message(codec.encode(create([INSTRUCTIONS], generate=False)))
        first = (await until(conn, "response.completed"))[-1]["response"]["id"]
        # A second warm-up adds the task: the instructions' whole blocks are cached, the rest is new.
        start = trio.current_time()
        await conn.send_message(codec.encode(create([TASK], generate=False, previous_response_id=first)))
        second = (await until(conn, "response.completed"))[-1]["response"]
        took = trio.current_time() - start
        assert engine.active_calls == 0 and engine.stats.swap_out_bytes == 0
        # The warm-ups' reservations were the session's own KV: the GPU never held the prompt twice.
        assert engine.resident_tokens == engine.stats.peak_resident_tokens == prompt_tokens(INSTRUCTIONS, TASK)
        await conn.send_message(codec.encode(create([MORE], previous_response_id=second["id"])))
        turn = (await until(conn, "response.completed"))[-1]["response"]
    prefix, warmed = prompt_tokens(INSTRUCTIONS), prompt_tokens(INSTRUCTIONS, TASK)
    cached = prefix - prefix % BLOCK_SIZE
    uncached = warmed - cached
    assert took == pytest.approx(latency.prefill_seconds(uncached, cached), rel=1e-12)
    record = server.records[1]
    assert record["warmup"] is True and record["warmup_prefill_tokens"] == uncached
    for phases in (dict(record["phases_ms"]), dict(second["testbed_timing"]["phases_ms"])):
        assert phases.pop("prefill") == pytest.approx(1000 * took, abs=5e-4)  # the whole warm-up is its prefill
        assert set(phases.values()) <= {0.0}  # zero API costs
    assert second["usage"]["input_tokens"] == 0 and second["usage"]["output_tokens"] == 0
    # The real turn finds everything both warm-ups prefilled, in whole blocks.
    assert (turn["usage"]["input_tokens"], turn["usage"]["input_tokens_details"]["cached_tokens"]) == (
        prompt_tokens(INSTRUCTIONS, TASK, MORE), warmed - warmed % BLOCK_SIZE)


async def warm_up_after_idle(fork_first: bool, generate: bool = False) -> tuple[int, float, int]:
    """Lane a answers a turn at 0 s (lane b forking from it at once when `fork_first`, then idle past
    the KV's 300 s idle TTL), continues it at 200 s, and warms up its next turn at 350 s (or, without
    `generate`, runs it). Returns (tokens that turn prefilled, its duration, the continuation's input tokens)."""
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(stream_id="a"))
        first = (await until(conn, *TERMINALS))[-1]["response"]
        outputs = outputs_for(function_calls(first))
        if fork_first:
            await send(conn, create_event(outputs, stream_id="b", previous_response_id=first["id"]))
            assert (await until(conn, *TERMINALS))[-1]["type"] == "response.completed"
        await trio.sleep(200)
        await send(conn, create_event(outputs, stream_id="a", previous_response_id=first["id"]))
        second = (await until(conn, *TERMINALS))[-1]["response"]
        await trio.sleep(150)
        start = trio.current_time()
        await send(conn, create_event(outputs_for(function_calls(second)), stream_id="a", previous_response_id=second["id"], generate=generate))
        warm = (await until(conn, *TERMINALS))[-1]
        took = trio.current_time() - start
    assert warm["type"] == "response.completed"
    if generate:
        usage = warm["response"]["usage"]
        return usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"], took, second["usage"]["input_tokens"]
    assert warm["response"]["usage"]["input_tokens"] == 0
    (record,) = [r for r in server.records if r["response_id"] == warm["response"]["id"]]
    return record["warmup_prefill_tokens"], took, second["usage"]["input_tokens"]


@pytest.mark.parametrize("generate", [False, True])
async def test_a_warm_up_or_a_turn_prefills_only_what_its_own_lanes_kv_does_not_hold(autojump_clock, generate) -> None:
    # Lane b's fork listed the shared blocks under its own entry, which expired at 300 s; lane a's
    # entry, used at 200 s, still holds them, and the warm-up (or turn) finds them there.
    alone, alone_took, before = await warm_up_after_idle(fork_first=False, generate=generate)
    forked, forked_took, _ = await warm_up_after_idle(fork_first=True, generate=generate)
    assert 0 < alone < before  # the new items and the last partial block only
    assert forked == alone and forked_took == pytest.approx(alone_took, abs=1e-9)  # clocks at different values round differently
