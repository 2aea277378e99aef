"""The suspended design (v1): one Response per rollout, paused at client calls, resumed by append."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import DELAYED_LINK, TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, until, ws

from prototype import workload as wl
from prototype.api.costs import ApiCosts
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import SUSPENDED, run_websocket_rollout
from prototype.designs.sampling import SamplingLoop
from prototype.engine.latency import ENGINE_REQUEST_OVERHEAD_S, PREFILL_TOKENS_PER_S
from prototype.server.config import ServerConfig
from prototype.workload import HostedCall, TurnSpec, Workload


async def run_twenty_turns() -> list[tuple[float, str, str]]:
    # Deltas coalesced every 50 ms keep the test fast; the first token of each item still goes out at once.
    server = make_server(costs=ApiCosts(), flush_interval=0.05)
    task = wl.generate_one("coding", seed=4, fixed_turns=20)  # no tool call past the 300 s TTL
    key = server.api.workloads.register(task)
    record = await run_websocket_rollout(InMemoryConnector(server), SUSPENDED, task, metadata={"testbed_workload": key, "testbed_decode_tps": "65"})
    assert record.status == "completed" and len(record.turns) == 20
    return [(round(t - record.started_at, 9), d, e) for t, d, e in record.timeline]


def test_twenty_turn_rollout_timeline_is_identical_run_to_run():
    first = trio.run(run_twenty_turns, clock=trio.testing.MockClock(autojump_threshold=0))
    second = trio.run(run_twenty_turns, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first == second
    assert sum(1 for _, _, e in first if e == "response.done") == 19
    assert [e for _, _, e in first if e in TERMINALS] == ["response.completed"]


@pytest.fixture(params=[None, DELAYED_LINK], ids=["pipe", "rtt-20ms"])
def link(request):
    """The link a WebSocket test runs over: a zero-latency pipe, or the 20 ms RTT link."""
    return request.param


async def test_first_token_time_is_exactly_the_modeled_cost(autojump_clock):
    # Zero API costs: the first token arrives after the engine overhead, the prefill of the whole
    # prompt and one decode step, nothing else.
    server = make_server()
    async with ws(server, SUSPENDED) as conn:
        start = trio.current_time()
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1", "testbed_decode_tps": "1000"}))
        events = await until(conn, "response.output_text.delta")
        first_token = trio.current_time() - start
        completed = (await until(conn, "response.completed"))[-1]["response"]
    prompt_tokens = completed["usage"]["input_tokens"]
    assert events[0]["type"] == "response.created"
    assert first_token == pytest.approx(ENGINE_REQUEST_OVERHEAD_S + prompt_tokens / PREFILL_TOKENS_PER_S + 1 / 1000, rel=1e-9)


def hosted_then_client_workload() -> Workload:
    return Workload("hosted", 1, (
        TurnSpec(500, 20, (0.3,), (HostedCall(2.0, 100),)),
        TurnSpec(50, 20, ()),
    ))


async def test_hosted_and_client_calls_block_at_the_same_suspension_point(autojump_clock, monkeypatch):
    seen = []
    original = SamplingLoop.tool_call_point

    async def spy(self, calls):
        seen.append(type(calls[0].item).__name__)
        return await original(self, calls)

    monkeypatch.setattr(SamplingLoop, "tool_call_point", spy)
    server = make_server()
    key = server.api.workloads.register(hosted_then_client_workload())
    tools = create_event()["tools"] + [{"type": "web_search"}]
    async with ws(server, SUSPENDED) as conn:
        await send(conn, create_event(metadata={"testbed_workload": key}, tools=tools))
        events = await until(conn, "response.done")
        types = [e["type"] for e in events]
        searching = types.index("response.web_search_call.searching")
        completed_at = types.index("response.web_search_call.completed")
        assert searching < completed_at < types.index("response.function_call_arguments.done")
        done = events[-1]["response"]
        assert done["status"] == "in_progress"
        assert [i["type"] for i in done["output"]] == ["web_search_call", "message", "function_call"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(done))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    assert seen == ["WebSearchCall", "FunctionCall"]
    assert final["id"] == done["id"]
    assert [i["type"] for i in final["output"]] == ["web_search_call", "message", "function_call", "message"]


async def test_disconnect_while_suspended_releases_state_and_leaves_no_task(autojump_clock, link):
    server = make_server()
    with trio.fail_after(5):  # the connection's tasks all end, or this nursery would never exit
        async with ws(server, SUSPENDED, network=link) as conn:
            await send(conn, create_event())
            await until(conn, "response.done")
            assert len(server.api.engine.kv) == 1 and len(server.sessions) == 1
            disconnected_at = trio.current_time()
    assert trio.current_time() - disconnected_at <= 1.0
    assert server.api.engine.kv == {} and server.sessions == set() and server.connections == 0
    # The server keeps serving.
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        assert (await until(conn, "response.completed"))[-1]["response"]["status"] == "completed"


async def test_suspension_ttl_expiry_fails_the_rollout_and_keeps_the_connection(autojump_clock, link):
    server = make_server(config=ServerConfig(suspension_ttl=7.0))
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, create_event())
        done = (await until(conn, "response.done"))[-1]
        paused_at = trio.current_time()
        failed = await receive(conn)
        assert trio.current_time() - paused_at == pytest.approx(7.0, rel=1e-9)
        assert failed["type"] == "response.failed"
        assert failed["response"]["id"] == done["response"]["id"]
        assert failed["response"]["error"]["code"] == "suspension_timeout"
        assert failed["sequence_number"] == done["sequence_number"] + 1
        assert server.api.engine.kv == {}
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(done["response"]))})
        assert (await receive(conn))["error"]["code"] == "no_suspended_response"
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        assert (await until(conn, "response.completed"))[-1]["response"]["status"] == "completed"


async def test_bad_inputs_get_their_own_codes_and_the_connection_stays_usable(autojump_clock, link):
    server = make_server()
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, {"type": "response.append", "input": []})
        assert (await receive(conn))["error"]["code"] == "no_suspended_response"
        await send(conn, "{not json")
        assert (await receive(conn))["error"]["code"] == "invalid_json"
        await send(conn, {"type": "response.fly"})
        error = await receive(conn)
        assert error == {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": "unknown_event_type", "message": "Unknown event type 'response.fly'.", "param": "type"}}
        await send(conn, create_event(previous_response_id="resp_1"))
        assert (await receive(conn))["error"]["code"] == "unsupported_parameter"
        await send(conn, create_event(generate=False))
        assert (await receive(conn))["error"]["param"] == "generate"

        await send(conn, create_event())
        done = (await until(conn, "response.done"))[-1]["response"]
        calls = function_calls(done)
        for bad_input in (
            outputs_for([{"call_id": "call_nope"}]),
            [],
            outputs_for(calls) * 2,
        ):
            await send(conn, {"type": "response.append", "input": bad_input})
            assert (await receive(conn))["error"]["code"] == "invalid_function_call_output"
        await send(conn, {"type": "response.append", "input": outputs_for(calls)})
        resumed = await receive(conn)
        assert resumed["type"] == "response.in_progress" and resumed["response"]["id"] == done["id"]


async def test_a_create_during_a_rollout_waits_fifo_behind_it(autojump_clock, link):
    server = make_server()
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}))
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        first = (await until(conn, "response.done"))
        assert [e["type"] for e in first].count("response.created") == 1
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(first[-1]["response"]))})
        rest = await until(conn, "response.completed")
        second = await until(conn, "response.completed")
    assert rest[-1]["response"]["id"] == first[0]["response"]["id"]
    assert second[0]["type"] == "response.created" and second[0]["response"]["id"] != first[0]["response"]["id"]


def workloads():
    turn = st.builds(
        lambda out, tool: (out, tool),
        st.integers(1, 30),
        st.sampled_from([0.0, 0.1, 2.0]),
    )
    return st.builds(
        lambda turns, seed: Workload(
            "random", seed,
            tuple(TurnSpec(200 if i == 0 else 30, out, (tool,) if i < len(turns) - 1 else ()) for i, (out, tool) in enumerate(turns)),
        ),
        st.lists(turn, min_size=1, max_size=5),
        st.integers(0, 2**31),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=workloads(), design=st.sampled_from(["suspended", "chained"]))
def test_every_rollout_ends_with_one_terminal_and_increasing_sequence_numbers(task, design):
    async def main():
        server = make_server()
        key = server.api.workloads.register(task)
        record = await run_websocket_rollout(InMemoryConnector(server), design, task, metadata={"testbed_workload": key})
        return record

    record = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert record.status == "completed"
    assert len(record.turns) == len(task.turns)
    terminals = [e for _, d, e in record.timeline if d == "recv" and e in TERMINALS]
    assert len(terminals) == len(record.response_ids) == (1 if design == "suspended" else len(task.turns))
    for response_id in record.response_ids:
        numbers = [n for r, n in record.sequence_numbers if r == response_id]
        assert numbers == list(range(len(numbers)))


async def test_a_second_append_right_after_the_first_gets_an_error_and_the_first_is_applied(autojump_clock, link, monkeypatch):
    # The race: the rollout answers the suspension, then sends `response.in_progress`; a second
    # append read before the rollout runs again must not replace the first one's items. A slow
    # `resumed` (the send blocked for 0.1 s) holds the window open every time.
    from prototype.designs import suspended
    from prototype.designs.emitter import Emitter

    original_resumed, original_answer = Emitter.resumed, suspended.ClientOverSocket.answer
    applied = []

    async def slow_resumed(self, at=None):
        await trio.sleep(0.1)
        await original_resumed(self, at)

    async def spy_answer(self, calls):
        items = await original_answer(self, calls)
        applied.append([item.output for item in items])
        return items

    monkeypatch.setattr(Emitter, "resumed", slow_resumed)
    monkeypatch.setattr(suspended.ClientOverSocket, "answer", spy_answer)
    server = make_server()
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}))
        done = (await until(conn, "response.done"))[-1]["response"]
        calls = function_calls(done)
        await send(conn, {"type": "response.append", "input": outputs_for(calls, "first")})
        await send(conn, {"type": "response.append", "input": outputs_for(calls, "second")})
        events = []
        while not any(e["type"] == "response.completed" for e in events) or not any(e["type"] == "error" for e in events):
            events.append(await receive(conn, timeout=5))
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["no_suspended_response"]
    assert applied == [["first"] * len(calls)]
    assert [e["type"] for e in events].count("response.in_progress") == 1
