"""The chained design (v2): previous_response_id over the connection-local cache, one slot per lane with forks across
lanes; the stored record and post-inference work overlapped with the next request."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from support import TERMINALS, create_event, events_by_response, function_calls, make_server, outputs_for, send, until, ws
from test_suspended import invalid

from prototype import metrics
from prototype.api.checks import CallLedger, SafetyState
from prototype.api.costs import ALL_SWITCHES_OFF, ApiCosts
from prototype.api.service import ApiService, Context, owner_of
from prototype.client.harness import CHAINED
from prototype.designs import chained
from prototype.designs.chained import ConnectionCache
from prototype.engine.kv import Prompt
from prototype.protocol import codec
from prototype.protocol.events import CreateRequest
from prototype.protocol.items import Message
from prototype.protocol.response import Response
from prototype.server.config import ServerConfig

COSTS = ApiCosts()


async def turn(conn, event) -> list[dict]:
    await send(conn, event)
    return await until(conn, *TERMINALS)


def phases(response: dict) -> dict[str, float]:
    return response["testbed_timing"]["phases_ms"]


async def test_cache_hit_processes_only_the_new_input(autojump_clock, link):
    server = make_server(costs=COSTS)
    async with ws(server, CHAINED, network=link, include_timing=True) as conn:
        first = (await turn(conn, create_event()))[-1]["response"]
        second = (await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for(function_calls(first)))))[-1]["response"]
    timing = phases(second)
    assert second["previous_response_id"] == first["id"] and "store_read" not in timing
    share = COSTS.cached_fixed_share
    # The route is reused and pays f_ws of its fixed cost; validation sees only the new tokens.
    assert timing["route"] == pytest.approx(1000 * COSTS.route.fixed * share)
    assert timing["validate"] < 1000 * (COSTS.validate.fixed * share + COSTS.validate.per_ktok * 0.1)
    assert phases(first)["validate"] > 1000 * COSTS.validate.fixed
    # The engine stayed pinned: the second turn prefilled only what was new.
    assert second["usage"]["input_tokens"] - second["usage"]["input_tokens_details"]["cached_tokens"] < 40


async def test_after_reconnect_store_true_hydrates_and_store_false_is_previous_response_not_found(autojump_clock, link):
    server = make_server(costs=COSTS)
    async with ws(server, CHAINED, network=link) as conn:
        kept, unkept = [(await turn(conn, create_event(store=store)))[-1]["response"] for store in (True, False)]
    await trio.sleep(1)  # the overlapped post-inference work (the store write) has finished
    async with ws(server, CHAINED, network=link, include_timing=True) as conn:
        second = (await turn(conn, create_event(store=True, previous_response_id=kept["id"], input=outputs_for(function_calls(kept)))))[-1]
        events = await turn(conn, create_event(previous_response_id=unkept["id"], input=outputs_for(function_calls(unkept))))
        assert events == [invalid("previous_response_not_found", f"Previous response with id '{unkept['id']}' not found.",
                                  "previous_response_id")]
        # Pattern (b) of the WS guide: resend the full context without previous_response_id.
        assert (await turn(conn, create_event(metadata={"testbed_workload": "fixed:1"})))[-1]["type"] == "response.completed"
    assert second["response"]["status"] == "completed"
    assert phases(second["response"])["store_read"] == pytest.approx(1000 * COSTS.store_read_per_turn * 1)
    assert phases(second["response"])["route"] == pytest.approx(1000 * COSTS.route.fixed)  # a rebuild pays in full


async def test_a_failed_turn_evicts_the_id_it_referenced(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        first = (await turn(conn, create_event()))[-1]["response"]
        bad = await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for([{"call_id": "call_unknown"}])))
        assert bad[-1]["error"]["code"] == "invalid_function_call_output"
        again = await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for(function_calls(first))))
        assert again[-1]["error"]["code"] == "previous_response_not_found"
    assert server.sessions == set()


async def test_creates_run_fifo_one_at_a_time_and_past_the_queue_limit_are_too_many_queued_requests(autojump_clock, link):
    server = make_server(config=ServerConfig(max_queued_creates=2))
    async with ws(server, CHAINED, network=link) as conn:
        for n in range(4):  # one starts, two wait, the fourth is refused
            await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}, input=f"task {n}"))
        events = [event for _ in range(4) for event in await until(conn, "response.completed")]
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["too_many_queued_requests"]
    turns = list(events_by_response(events).values())  # each run whole before the next: numbered from 0 without a gap
    assert len(turns) == 3 and all([e["sequence_number"] for e in turn] == list(range(len(turn))) for turn in turns)
    assert all((turn[0]["type"], turn[-1]["type"]) == ("response.created", "response.completed") for turn in turns)


async def test_warm_up_then_chained_turn(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        warm = await turn(conn, create_event(generate=False))
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == [] and warm[-1]["response"]["usage"]["output_tokens"] == 0
        first = (await turn(conn, create_event(previous_response_id=warm[-1]["response"]["id"], input=[])))[-1]["response"]
        assert first["status"] == "completed" and function_calls(first)


async def test_with_all_four_switches_off_a_cache_hit_costs_a_full_rebuild(autojump_clock):
    async def second_turn_phases(switches_off: bool, previous: bool) -> dict:
        config = ServerConfig(switches=ALL_SWITCHES_OFF) if switches_off else ServerConfig()
        server = make_server(costs=COSTS, config=config)
        async with ws(server, CHAINED, include_timing=True) as conn:
            first = (await turn(conn, create_event()))[-1]["response"]
            outputs = outputs_for(function_calls(first))
            if previous:
                event = create_event(previous_response_id=first["id"], input=outputs)
            else:  # a stateless request carrying the whole conversation again
                history = [create_event()["input"] and {"role": "user", "content": "fix the bug"}]
                history += [{k: v for k, v in item.items() if k not in ("id", "status")} for item in first["output"]]
                event = create_event(input=history + outputs)
            second = (await turn(conn, event))[-1]["response"]
        return phases(second)

    hit_off = await second_turn_phases(True, True)
    full = await second_turn_phases(False, False)
    hit_on = await second_turn_phases(False, True)
    for stage in ("validate", "render", "safety", "route"):
        assert hit_off[stage] == pytest.approx(full[stage], abs=0.002), stage  # ms, rounded on the wire
        assert hit_on[stage] < full[stage], stage
    # Switch 4: post-inference, its whole cost, blocks the terminal event (whose timing then holds it).
    assert hit_off["post"] == pytest.approx(1000 * COSTS.post) and "post" not in hit_on


# --- lanes: each lane's slot, and forks across lanes ------------------------------------------------------


def lane_of(lane: str | None) -> dict[str, str]:
    return {} if lane is None else {"stream_id": lane}


def not_found(response_id: str, stream_id: str) -> dict[str, Any]:
    return {**invalid("previous_response_not_found", f"Previous response with id '{response_id}' not found.", "previous_response_id"),
            "stream_id": stream_id}


async def test_a_lane_continuing_its_own_response_empties_its_slot_while_the_turn_runs(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        first = (await turn(conn, create_event(stream_id="main")))[-1]["response"]
        outputs = outputs_for(function_calls(first))
        slow = {"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}  # 30 s of decode
        await send(conn, create_event(outputs, stream_id="main", previous_response_id=first["id"], metadata=slow))
        created = (await until(conn, "response.created"))[-1]
        # While lane main's turn runs, the response it continues is in no slot: a fork finds nothing.
        await send(conn, create_event(outputs, stream_id="side", previous_response_id=first["id"]))
        assert (await until(conn, "error"))[-1] == not_found(first["id"], "side")
        second = (await until(conn, *TERMINALS))[-1]
        assert (second["type"], second["stream_id"], second["response"]["id"]) == ("response.completed", "main", created["response"]["id"])
        # Once it succeeded, lane main holds its new response, and a fork from that one runs.
        fork = (await turn(conn, create_event(outputs_for(function_calls(second["response"])), stream_id="side", previous_response_id=second["response"]["id"])))[-1]
        assert (fork["type"], fork["stream_id"]) == ("response.completed", "side")


async def test_a_lanes_turn_leaves_the_other_lanes_slots_and_a_failed_one_empties_its_own_only(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        held = {lane: (await turn(conn, create_event(**lane_of(lane))))[-1]["response"] for lane in (None, "a", "b", "c")}
        # Lane c continues its own response; a new conversation on lane a fails (an output for a call it never made).
        continued_c = (await turn(conn, create_event(outputs_for(function_calls(held["c"])), stream_id="c",
                                                     previous_response_id=held["c"]["id"])))[-1]
        stray = create_event(outputs_for([{"call_id": "call_nope"}]), stream_id="a")
        refused = (await turn(conn, stray))[-1]
        asked = {lane: create_event(outputs_for(function_calls(held[lane])), previous_response_id=held[lane]["id"],
                                    **lane_of(lane)) for lane in ("a", None, "b")}
        answers = {lane: (await turn(conn, event))[-1] for lane, event in asked.items()}
    assert (continued_c["type"], continued_c["stream_id"]) == ("response.completed", "c")
    assert (refused["status"], refused["stream_id"], refused["error"]["code"]) == (400, "a", "invalid_function_call_output")
    assert answers["a"] == not_found(held["a"]["id"], "a")
    # Each refusal is recorded with the bytes of the frame it refused and no usage.
    assert [(r["outcome"], r["usage"], r["request_bytes"]) for r in server.records if r["response_id"] is None] == [
        ("error:invalid_function_call_output", None, len(json.dumps(stray).encode())),
        ("error:previous_response_not_found", None, len(json.dumps(asked["a"]).encode()))]
    assert answers[None]["type"] == answers["b"]["type"] == "response.completed" and "stream_id" not in answers[None]
    assert answers[None]["response"]["previous_response_id"] == held[None]["id"]


async def test_a_fork_onto_a_busy_lane_copies_the_conversation_and_leaves_the_original_intact(autojump_clock) -> None:
    server = make_server(costs=ApiCosts())
    async with ws(server, include_timing=True) as conn:
        a1 = (await turn(conn, create_event(stream_id="a")))[-1]["response"]
        b1 = (await turn(conn, create_event(stream_id="b", metadata={"testbed_workload": "fixed:3:300:10:30"})))[-1]["response"]
        outputs = outputs_for(function_calls(a1))
        # Lane b, which holds a response of its own, forks from lane a's; then lane a continues it.
        fork = (await turn(conn, create_event(outputs, stream_id="b", previous_response_id=a1["id"])))[-1]
        main = (await turn(conn, create_event(outputs, stream_id="a", previous_response_id=a1["id"])))[-1]
        # Lane b moved on from its own response b1, and both lanes from a1 (store=false): they left the cache.
        for gone in (b1, a1):
            event = create_event(outputs_for(function_calls(gone)), stream_id="c", previous_response_id=gone["id"])
            assert (await turn(conn, event))[-1] == not_found(gone["id"], "c")
    assert (fork["type"], fork["stream_id"], main["type"], main["stream_id"]) == ("response.completed", "b", "response.completed", "a")
    assert fork["response"]["previous_response_id"] == main["response"]["previous_response_id"] == a1["id"]
    # Both extended the same conversation by the same input: neither saw the other's turn. The engine finds blocks by
    # content (docs/parameters.md §6): the fork reuses what lane a computed, as lane a does, and neither prefills it again.
    assert fork["response"]["usage"] == main["response"]["usage"]
    assert fork["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0
    assert fork["response"]["output"][0]["content"] == main["response"]["output"][0]["content"]
    # The fork appends its input to the copied rendering, as the continuation does to the original.
    fork_phases, main_phases = fork["response"]["testbed_timing"]["phases_ms"], main["response"]["testbed_timing"]["phases_ms"]
    for stage in ("validate", "render", "safety", "route"):
        assert fork_phases[stage] == pytest.approx(main_phases[stage], abs=0.002), stage  # ms, rounded on the wire
    assert "store_read" not in fork_phases and "store_read" not in main_phases  # from the cache
    # Every lane's KV, the fork's included, was released with the connection.
    assert server.api.engine.kv == {}


def test_the_default_lane_is_the_one_slot_a_connection_without_lanes_sees() -> None:
    cache = ConnectionCache("conn")

    def conversation(text: str, key: object) -> Context:
        return Context([Message("user", (("input_text", text),))], Prompt([1, 2, 3]), "", CallLedger(), SafetyState(), None, key)

    first, second = (Response(f"resp_{n}", CreateRequest("sim-1", ()), created_at=0) for n in (1, 2))
    assert (cache.response, cache.response_id, cache.context) == (None, None, None)
    context = conversation("one", "conn")
    cache.put(first, context)
    assert (cache.response, cache.response_id, cache.context) == (first, "resp_1", context)
    # Taking its own response gives the context itself and empties the slot until the turn succeeds.
    assert cache.take("resp_1") is context
    assert (cache.response, cache.context, cache.slots) == (None, None, {})
    # Whatever it continues, the default lane moves on: an unknown id also empties its slot.
    cache.put(first, context)
    assert (cache.take("resp_9"), cache.slots) == (None, {})
    # Another lane's response is copied for the default lane, under the connection's own engine key.
    other = conversation("two", ("conn", "a"))
    cache.view("a").put(second, other)
    assert cache.engine_keys == ["conn", ("conn", "a")]
    fork = cache.take("resp_2")
    assert fork is not other and fork.items == other.items and list(fork.prompt.ids) == [1, 2, 3]
    assert fork.engine_key == "conn" and cache.slots["a"].context is other


# --- the stored record and the overlapped post-inference work ----------------------------------------------


@pytest.mark.parametrize(("budget", "status", "details"), [(None, "completed", None), (25, "incomplete", {"reason": "max_output_tokens"})])
async def test_a_chained_turn_is_stored_with_its_final_status_when_post_inference_runs_first(autojump_clock, budget, status, details) -> None:
    # Switch 4 off: post-inference runs before the terminal event, as in v1.
    server = make_server(config=ServerConfig(switches=ALL_SWITCHES_OFF))
    async with ws(server) as conn:
        last = (await turn(conn, create_event(store=True, max_output_tokens=budget)))[-1]
    assert (last["type"], last["response"]["status"], last["response"]["incomplete_details"]) == (f"response.{status}", status, details)
    stored = server.api.store.get(last["response"]["id"])
    assert (stored.response["status"], stored.owner) == (status, owner_of("testbed"))
    assert [item.to_dict() for item in stored.output] == last["response"]["output"]


async def test_a_closed_connection_ends_only_after_its_overlapped_post_inference_work(autojump_clock) -> None:
    # The overlapped post work is shielded: a client that leaves at the terminal event does not cut it short.
    server = make_server(costs=ApiCosts(post=2.0))
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        await until(conn, "response.completed")
        completed_at = trio.current_time()
        assert server.connections == 1
    assert trio.current_time() - completed_at == pytest.approx(2.0, abs=1e-9)
    assert (server.connections, server.sessions) == (0, set())


async def test_overlapped_post_work_is_logged_as_its_own_phase_and_survives_a_cancel(autojump_clock) -> None:
    api = ApiService(costs=ApiCosts(post=2.0))
    request = codec.decode_client_event(json.dumps(create_event(store=True))).request
    response = Response("resp_post", request, created_at=0, status="completed")
    log = metrics.PhaseLog()
    start = trio.current_time()
    with trio.CancelScope() as scope:
        scope.cancel()  # the connection closed: the work goes on, shielded
        await chained._post(api, log, response, [], owner_of("alice"))
    assert log.spans == [("post_overlapped", start, start + 2.0)]
    stored = api.store.get("resp_post")
    assert (stored.owner, stored.response["status"]) == (owner_of("alice"), "completed")
