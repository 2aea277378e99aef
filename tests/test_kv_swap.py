"""The SWAP retention policy's bookkeeping (engine/kv.py), the engine alone under the autojump clock with exact times:
the host budget and what a full host drops, the host link one copy at a time each way, the swap counters; through the
server, a turn that pauses at a tool call swaps out and a final answer does not; the prefix comparison."""

from __future__ import annotations

from array import array
from collections.abc import Hashable

import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st
from support import TERMINALS, create_event, exactly, function_calls, make_server, outputs_for, send, until, ws
from test_kv_memory import assert_consistent, call, prompt

from prototype.engine.engine import Engine
from prototype.engine.kv import BLOCK_SIZE, GPU, HOST, SWAPPING_OUT, Prompt, common_prefix
from prototype.engine.memory import KV_BYTES_PER_TOKEN_8B, PCIE_BYTES_PER_S, SWAP_POLICY

KV = KV_BYTES_PER_TOKEN_8B


def copy_seconds(tokens: int) -> float:
    """One-way host link time of `tokens` of KV: tokens x bytes per token / link rate."""
    return tokens * KV_BYTES_PER_TOKEN_8B / PCIE_BYTES_PER_S


def on_host(engine: Engine) -> set[Hashable]:
    return {key for key, entry in engine.kv.items() if entry.where == HOST}


# --- the host budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("budget", "sessions", "kept", "dropped", "copied"), [
    (200, [("a", 100), ("b", 100)], {"a", "b"}, 0, 200),  # filled exactly to its budget: nothing dropped
    # Keys sort the other way from their age: the least recently used goes first (c, copied out before it went).
    (250, [("c", 100), ("b", 100), ("a", 100)], {"b", "a"}, 1, 300),
    (250, [("a", 100), ("b", 100), ("c", 200)], {"c"}, 2, 400),  # 200 + 200 > 250, then 100 + 200 > 250: a and b go
], ids=["exactly-full", "least-recently-used-first", "every-session-pushed-off"])
async def test_a_full_host_drops_the_least_recently_used_swapped_kv_and_counts_each(autojump_clock, budget, sessions, kept, dropped,
                                                                                    copied):
    engine = Engine(retention=SWAP_POLICY, host_budget_tokens=budget)
    for key, tokens in sessions:
        await call(engine, key, prompt(tokens))
        await trio.sleep(1)
    assert engine.kv[sessions[-1][0]].where == SWAPPING_OUT and engine.host_tokens == 200  # a copy reserves its room
    engine.advance(trio.current_time())
    assert (set(engine.kv), on_host(engine), engine.host_tokens) == (kept, kept, 200)
    assert (engine.stats.swap_dropped, engine.stats.swap_out_bytes) == (dropped, copied * KV)
    assert_consistent(engine)


async def test_kv_larger_than_the_whole_host_budget_is_dropped_after_the_others(autojump_clock):
    engine = Engine(retention=SWAP_POLICY, host_budget_tokens=150)
    await call(engine, "a", prompt(100))
    await trio.sleep(1)
    await call(engine, "b", prompt(200))  # pushes a off, and still does not fit: dropped too
    assert engine.kv == {} and engine.host_tokens == 0 and engine.resident_tokens == 0
    assert (engine.stats.swap_dropped, engine.stats.swap_out_bytes) == (2, 100 * KV)  # only a was ever copied
    handle = await engine.begin_call("b", prompt(200))  # b's next call computes its KV again
    assert handle.recomputed == 200 and handle.swap_in_tokens == 0
    engine.end_call(handle, paused=False)


async def test_session_keys_that_do_not_compare_are_fine_when_last_uses_tie(autojump_clock):
    # Session keys are any hashables (the http design uses tuples): a tie on last use must not compare keys.
    engine = Engine(retention=SWAP_POLICY, host_budget_tokens=200)
    await call(engine, ("http", 1), prompt(100))
    await call(engine, "conn-2", prompt(100))
    await trio.sleep(1)
    await call(engine, 3, prompt(100))
    assert (engine.stats.swap_dropped, engine.host_tokens, 3 in engine.kv, len(engine.kv)) == (1, 200, True, 2)
    assert_consistent(engine)


# --- the host link, one copy at a time each way -----------------------------------------------------


async def test_swap_outs_queue_on_the_link_and_free_the_gpu_one_after_the_other(autojump_clock):
    engine = Engine(retention=SWAP_POLICY)
    s = copy_seconds(1000)
    await call(engine, "a", prompt(1000))
    await call(engine, "b", prompt(1000, 5000))  # same instant: waits for a's copy
    assert engine.kv["a"].where == engine.kv["b"].where == SWAPPING_OUT
    assert engine.resident_tokens == 2000 and engine.host_tokens == 2000
    engine.advance(s)
    assert engine.kv["a"].where == HOST and engine.kv["b"].where == SWAPPING_OUT and engine.resident_tokens == 1000
    engine.advance(2 * s - 1e-9)
    assert engine.kv["b"].where == SWAPPING_OUT
    engine.advance(2 * s)
    assert on_host(engine) == {"a", "b"} and engine.resident_tokens == 0
    # 2000 tokens on the GPU for s, then 1000 for another s.
    assert (engine.stats.resident_token_seconds, engine.stats.swap_out_bytes) == (exactly(3000 * s), 2000 * KV)

    # The link is idle again: a later copy starts at once, not after the old queue.
    await trio.sleep(10)
    await call(engine, "c", prompt(500))
    engine.advance(trio.current_time() + copy_seconds(500))
    assert engine.kv["c"].where == HOST and engine.stats.swap_out_bytes == 2500 * KV
    assert_consistent(engine)


async def test_swap_ins_queue_on_the_link_and_each_waits_for_its_own_copy(autojump_clock):
    engine = Engine(retention=SWAP_POLICY)
    a, b = prompt(1000), prompt(500, 5000)
    await call(engine, "a", a)
    await call(engine, "b", b)
    await trio.sleep(100)  # both copies long done
    a.extend([1] * 10)
    b.extend([2] * 10)
    back: dict[str, float] = {}

    async def resume(key: str, p: Prompt) -> None:
        handle = await engine.begin_call(key, p)
        back[key] = trio.current_time()
        # Prefix-cache KV counts in whole blocks: the partial last block is computed again.
        assert handle.swap_in_tokens == len(p) - 10 and handle.recomputed == (len(p) - 10) % BLOCK_SIZE
        engine.end_call(handle, paused=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(resume, "a", a)
        await trio.lowlevel.checkpoint()  # a asks first: b starts in a later batch
        nursery.start_soon(resume, "b", b)
    sa, sb = copy_seconds(1000), copy_seconds(500)
    assert back == {"a": exactly(100 + sa), "b": exactly(100 + sa + sb)}
    # Waiting time, link queue included: a waited sa, b waited sa + sb.
    assert (engine.stats.swap_in_bytes, engine.stats.swap_in_seconds) == (1500 * KV, exactly(sa + (sa + sb)))
    assert engine.kv["a"].where == engine.kv["b"].where == GPU and engine.host_tokens == 0
    assert_consistent(engine)  # the copies back left nothing counted on the host


async def test_a_session_back_before_its_copy_ended_keeps_its_gpu_kv_and_waits_for_nothing(autojump_clock):
    engine = Engine(retention=SWAP_POLICY)
    p = prompt(1000)
    await call(engine, "a", p)
    p.extend([1] * 10)
    handle = await engine.begin_call("a", p)  # at t = 0, while the copy is under way
    assert trio.current_time() == 0 and handle.swap_in_tokens == 0 and handle.recomputed == 1000 % BLOCK_SIZE
    assert engine.host_tokens == 0 and engine.stats.swap_in_bytes == 0 and engine.stats.swap_in_seconds == 0
    engine.end_call(handle, paused=False)
    engine.advance(10)
    assert engine.kv["a"].where == GPU and engine.resident_tokens == 1000  # the stale copy timer did nothing
    assert_consistent(engine)


async def test_a_call_queued_for_gpu_room_is_admitted_the_moment_a_swap_out_frees_it(autojump_clock):
    # The head of the queue sleeps until the engine's next timer, here the end of a's copy to the host.
    engine = Engine(retention=SWAP_POLICY, kv_budget_tokens=100)
    with trio.fail_after(60):
        await call(engine, "a", prompt(80))
        handle = await engine.begin_call("b", prompt(50, 5000))
    assert trio.current_time() == exactly(copy_seconds(80)) and handle.queued_s == exactly(copy_seconds(80))
    assert engine.kv["a"].where == HOST and engine.resident_tokens == 50
    engine.end_call(handle, paused=False)
    assert_consistent(engine)


# --- through the server: a pause swaps out, a final answer does not -----------------------------------------


async def test_under_swap_a_turn_that_ends_at_a_tool_call_swaps_its_kv_out_and_a_final_answer_does_not(autojump_clock) -> None:
    server = make_server(engine=Engine(retention=SWAP_POLICY))
    stats = server.api.engine.stats
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}))
        first = (await until(conn, *TERMINALS))[-1]["response"]
        (held,) = server.api.engine.kv.values()
        paused_tokens = held.tokens
        assert stats.swap_out_bytes == paused_tokens * KV_BYTES_PER_TOKEN_8B > 0  # paused at the call: copied to the host
        await trio.sleep(1.0)  # the client runs its tool
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"], metadata={"testbed_workload": "fixed:2"}))
        assert (await until(conn, *TERMINALS))[-1]["type"] == "response.completed"
    # The final answer is not a pause: nothing more was copied out; the first turn's KV came back once.
    assert (stats.swap_out_bytes, stats.swap_in_bytes) == (paused_tokens * KV_BYTES_PER_TOKEN_8B,) * 2


# --- the prefix comparison ----------------------------------------------------------------------------


def naive_common_prefix(a, b) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


# A two-letter alphabet makes long shared prefixes common, so every split point is exercised.
ids = st.lists(st.integers(0, 1), max_size=40)


@given(ids, ids)
@example([], [])
@example([0], [0])
@example([0] * 33, [0] * 32 + [1])
@example([1, 2, 3, 4], [1, 2, 9, 4])
@example([9, 2, 3, 4], [1, 2, 3, 4])
@example([1, 2, 3, 4], [1, 2, 3, 9])
def test_common_prefix_equals_the_naive_scan(a, b):
    assert common_prefix(a, b) == naive_common_prefix(a, b)
    assert common_prefix(array("q", a), array("q", b)) == naive_common_prefix(a, b)  # what the engine passes


@given(ids, ids, ids)
def test_common_prefix_of_a_shared_start_is_at_least_that_start(start, x, y):
    assert common_prefix(start + x, start + y) == len(start) + naive_common_prefix(x, y)
