"""The chained design (v2): previous_response_id per turn and the connection-local cache."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from support import DELAYED_LINK, create_event, function_calls, make_server, outputs_for, receive, send, until, ws
from test_suspended import workloads

from prototype.api.costs import ALL_SWITCHES_OFF, ApiCosts
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED, run_websocket_rollout
from prototype.server.config import ServerConfig

COSTS = ApiCosts()


async def turn(conn, event) -> list[dict]:
    await send(conn, event)
    return await until(conn, "response.completed", "response.failed", "response.incomplete")


@pytest.fixture(params=[None, DELAYED_LINK], ids=["pipe", "rtt-20ms"])
def link(request):
    """The link a WebSocket test runs over: a zero-latency pipe, or the 20 ms RTT link."""
    return request.param


def phases(response: dict) -> dict[str, float]:
    return response["testbed_timing"]["phases_ms"]


async def test_cache_hit_processes_only_the_new_input(autojump_clock, link):
    server = make_server(costs=COSTS)
    async with ws(server, CHAINED, network=link, include_timing=True) as conn:
        first = (await turn(conn, create_event()))[-1]["response"]
        second = (await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for(function_calls(first)))))[-1]["response"]
    assert second["previous_response_id"] == first["id"]
    timing = phases(second)
    assert "store_read" not in timing
    share = COSTS.cached_fixed_share
    # The route is reused and pays f_ws of its fixed cost; validation sees only the new tokens.
    assert timing["route"] == pytest.approx(1000 * COSTS.route.fixed * share)
    assert timing["validate"] < 1000 * (COSTS.validate.fixed * share + COSTS.validate.per_ktok * 0.1)
    assert phases(first)["validate"] > 1000 * COSTS.validate.fixed
    # The engine stayed pinned: the second turn prefilled only what was new.
    usage = second["usage"]
    assert usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"] < 40


async def test_store_true_hydrates_after_reconnect(autojump_clock, link):
    server = make_server(costs=COSTS)
    async with ws(server, CHAINED, network=link) as conn:
        first = (await turn(conn, create_event(store=True)))[-1]["response"]
    await trio.sleep(1)  # the overlapped post-inference work (the store write) has finished
    async with ws(server, CHAINED, network=link, include_timing=True) as conn:
        second = (await turn(conn, create_event(store=True, previous_response_id=first["id"], input=outputs_for(function_calls(first)))))[-1]["response"]
    assert second["status"] == "completed"
    assert phases(second)["store_read"] == pytest.approx(1000 * COSTS.store_read_per_turn * 1)
    assert phases(second)["route"] == pytest.approx(1000 * COSTS.route.fixed)  # a rebuild pays in full


async def test_store_false_is_previous_response_not_found_after_reconnect(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        first = (await turn(conn, create_event(store=False)))[-1]["response"]
    async with ws(server, CHAINED, network=link) as conn:
        events = await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for(function_calls(first))))
        assert events == [{
            "type": "error", "status": 400,
            "error": {
                "type": "invalid_request_error", "code": "previous_response_not_found",
                "message": f"Previous response with id '{first['id']}' not found.", "param": "previous_response_id",
            },
        }]
        # Pattern (b) of the WS guide: resend the full context without previous_response_id.
        assert (await turn(conn, create_event(metadata={"testbed_workload": "fixed:1"})))[-1]["type"] == "response.completed"


async def test_a_failed_turn_evicts_the_id_it_referenced(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        first = (await turn(conn, create_event()))[-1]["response"]
        bad = await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for([{"call_id": "call_unknown"}])))
        assert bad[-1]["error"]["code"] == "invalid_function_call_output"
        again = await turn(conn, create_event(previous_response_id=first["id"], input=outputs_for(function_calls(first))))
        assert again[-1]["error"]["code"] == "previous_response_not_found"
    assert server.sessions == set()


async def test_two_creates_run_fifo_one_at_a_time(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}, input="second"))
        first = await until(conn, "response.completed")
        second = await until(conn, "response.completed")
    assert first[0]["type"] == second[0]["type"] == "response.created"
    assert first[0]["response"]["id"] != second[0]["response"]["id"]
    assert all(e["sequence_number"] == i for i, e in enumerate(second))


async def test_queue_limit_is_too_many_queued_requests(autojump_clock, link):
    server = make_server(config=ServerConfig(max_queued_creates=2))
    async with ws(server, CHAINED, network=link) as conn:
        for _ in range(4):  # one starts, two wait, the fourth is refused
            await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        errors = []
        completed = 0
        while completed < 3:
            event = await receive(conn)
            completed += event["type"] == "response.completed"
            if event["type"] == "error":
                errors.append(event["error"]["code"])
    assert errors == ["too_many_queued_requests"]


async def test_warm_up_then_chained_turn(autojump_clock, link):
    server = make_server()
    async with ws(server, CHAINED, network=link) as conn:
        warm = await turn(conn, create_event(generate=False))
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == [] and warm[-1]["response"]["usage"]["output_tokens"] == 0
        first = (await turn(conn, create_event(previous_response_id=warm[-1]["response"]["id"], input=[])))[-1]["response"]
        assert first["status"] == "completed" and function_calls(first)


async def test_connection_lifetime_sends_the_limit_error_then_closes_1000(autojump_clock, link):
    server = make_server(config=ServerConfig(connection_lifetime=30.0))
    async with ws(server, CHAINED, network=link) as conn:
        opened = trio.current_time()
        await turn(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        error = await receive(conn)
        assert trio.current_time() - opened == pytest.approx(30.0, rel=1e-9)
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        assert error["error"]["message"] == "Responses websocket connection limit reached (0.5 minutes). Create a new websocket connection to continue."
        with pytest.raises(Exception) as closed:
            await receive(conn)
        assert closed.value.reason.code == 1000


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
    assert "post" in hit_off and "post" not in hit_on  # switch 4: post-inference blocks the terminal event


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=workloads())
def test_chained_and_suspended_produce_the_same_transcript(task):
    async def main():
        results = []
        for design in (SUSPENDED, CHAINED):
            server = make_server()
            key = server.api.workloads.register(task)
            results.append(await run_websocket_rollout(InMemoryConnector(server), design, task, metadata={"testbed_workload": key}))
        return results

    suspended, chained = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert suspended.transcript == chained.transcript
    assert len(suspended.transcript) == 1 + 3 * (len(task.turns) - 1) + 1
    for key in ("input_tokens", "output_tokens"):
        assert suspended.usage[key] == chained.usage[key]
