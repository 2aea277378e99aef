"""`response.inject` (docs/protocol.md, "Inject"): a v2 response with `multi_agent.enabled` waits at its client calls
for injected outputs and resumes; the documented answers and codes; the beta header; a malformed frame closes the
connection. Raw frames on the virtual clock, then openai-python's beta `conn.response.inject(...)` on a real socket."""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
import trio_websocket
import wsproto
from openai import OpenAI
from openai.types.beta import BetaResponseInjectCreatedEvent, BetaResponseInjectFailedEvent
from support import SPARK, TERMINALS, create_event, make_server, outputs_for, receive, send, timed_until, until, ws
from test_sdk_websocket import CLIENT_TIMEOUT, in_thread
from test_suspended import invalid
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from prototype import metrics
from prototype.api.checks import SPARK_CONTEXT_WINDOW
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import BETA, HARNESS_TOOLS, SUSPENDED
from prototype.designs.inject import InjectedOutputs
from prototype.designs.sampling import ToolCall
from prototype.engine import tokenizer
from prototype.engine.engine import Engine
from prototype.protocol.inject import ENDED_KEPT, ROOT, InjectBook, InjectRefused, ResponseInject, parse_inject
from prototype.protocol.items import FunctionCall, FunctionCallOutput
from prototype.workload import HostedCall, TurnSpec, Workload

MULTI_AGENT = {"enabled": True, "max_concurrent_subagents": 2}
BETA_HEADER = "responses_multi_agent=v1"
# Three turns, each ending in client calls but the last (the workload's 0.5 s tools: these tests wait on their own).
THREE_TURNS = {"testbed_workload": "fixed:3:100:10:20:0.5"}
TWO_AGENTS = {"testbed_workload": "fixed:2", "testbed_subagents": "2"}  # two hosted subagents, two turns each
OUTPUT = {"type": "function_call_output", "call_id": "c", "output": "x"}


@asynccontextmanager
async def beta_ws(server, beta: str | None = BETA_HEADER, network=None):
    """A v2 WebSocket whose handshake carries `OpenAI-Beta: <beta>` (the multi-agent guide), over `network`."""
    headers = [(b"authorization", b"Bearer k")]
    if beta is not None:
        headers.append((b"openai-beta", beta.encode()))
    async with InMemoryConnector(server, network).open_stream() as stream, trio.open_nursery() as nursery:
        conn = await trio_websocket.wrap_client_stream(nursery, stream, "testbed", "/v1/responses", extra_headers=headers)
        try:
            yield conn
        finally:
            await conn.aclose()
            nursery.cancel_scope.cancel()


def calls_done(events: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
    return [(t, e) for t, e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]


async def until_calls(conn, count: int = 1) -> list[tuple[float, dict]]:
    """Every event, timed, up to the `count`th function call done."""
    events: list[tuple[float, dict]] = []
    while len(calls_done(events)) < count:
        events += await timed_until(conn, "response.output_item.done")
    return events


def inject(response_id: str, *calls: dict) -> dict:
    """A `response.inject` answering `calls`."""
    return {"type": "response.inject", "response_id": response_id, "input": outputs_for(list(calls))}


async def refused_inject(conn, response_id: str, items: list) -> tuple[str, str, str]:
    """The `error` a refused inject gets, on the default lane: (code, message, param)."""
    await send(conn, {"type": "response.inject", "response_id": response_id, "input": items})
    (*_, error) = await until(conn, "response.inject.failed")
    assert (error["type"], error["status"], error["error"]["type"], "stream_id" in error) == (
        "error", 400, "invalid_request_error", False)
    return error["error"]["code"], error["error"]["message"], error["error"]["param"]


async def test_an_injected_output_resumes_the_waiting_response_in_place_and_an_invalid_one_commits_nothing(autojump_clock):
    server = make_server()
    async with beta_ws(server) as conn:
        await send(conn, create_event(metadata=THREE_TURNS, multi_agent=MULTI_AGENT))
        first = await until_calls(conn)
        created = first[0][1]
        response_id = created["response"]["id"]
        assert created["response"]["multi_agent"] == MULTI_AGENT
        (called_at, call), = calls_done(first)
        await trio.sleep(2.0)  # the client's tool runs; the response waits, nothing is sent meanwhile
        answer, call_id = outputs_for([call["item"]]), call["item"]["call_id"]
        # Refused whole (the good output is not committed either), the response keeps waiting.
        assert await refused_inject(conn, response_id, answer + [{"type": "message", "role": "user", "content": "x"}]) == (
            "invalid_value", "Invalid value: 'message'. Supported values are: 'function_call_output'.", "input[1].type")
        assert await refused_inject(conn, response_id, [{**OUTPUT, "call_id": "call_404"}]) == (
            "invalid_function_call_output", "No tool call found for function call output with call_id call_404.", "input")
        assert await refused_inject(conn, response_id, answer + answer) == (
            "invalid_function_call_output", f"function_call_output for call_id '{call_id}' answered twice.", "input[1]")
        await send(conn, inject(response_id, call["item"]))
        injected_at = trio.current_time()
        rest = await until_calls(conn)
        # The acknowledgement comes first, numbered in the response's own sequence.
        (ack_at, ack) = rest[0]
        assert ack == {"type": "response.inject.created", "sequence_number": call["sequence_number"] + 1, "response_id": response_id}
        assert ack_at == injected_at
        # The same response goes on sampling: its next call, which the test answers again.
        (_, second_call), = calls_done(rest)
        assert second_call["sequence_number"] > ack["sequence_number"]
        # The output was taken: it is not taken again.
        assert await refused_inject(conn, response_id, answer) == (
            "invalid_function_call_output", f"function_call_output for call_id '{call_id}' answered twice.", "input[0]")
        await send(conn, inject(response_id, second_call["item"]))
        final = await timed_until(conn, *TERMINALS)
        # The connection stays open and keeps nothing of the ended response: no emitter, no waiting agent.
        ((session,),) = [server.sessions]
        assert (session.injections.active, session.injections.waiting) == ({}, {})
    terminal = final[-1][1]
    assert terminal["type"] == "response.completed" and terminal["response"]["id"] == response_id
    # One response for the whole rollout: its three turns' items, both calls answered in place.
    kinds = [item["type"] for item in terminal["response"]["output"]]
    assert kinds.count("function_call") == 2 and kinds.count("message") == 3
    assert [e["type"] for _, e in final].count("response.created") == 0
    assert called_at < injected_at


@pytest.mark.parametrize("beta", [None, f"{BETA[SUSPENDED]}, {BETA_HEADER}"], ids=["v2 without the beta", "v1 with the beta"])
async def test_inject_needs_the_beta_on_a_v2_connection(autojump_clock, beta):
    # A create with `multi_agent` and without the beta: test_bad_input.py.
    async with beta_ws(make_server(), beta) as conn:
        await send(conn, {"type": "response.inject", "response_id": "resp_1", "input": [OUTPUT]})
        assert await receive(conn) == invalid(
            "unknown_event_type", "response.inject needs the 'OpenAI-Beta: responses_multi_agent=v1' header on a v2 connection.", "type")
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))  # the connection keeps serving
        assert (await until(conn, *TERMINALS))[-1]["type"] == "response.completed"


async def frames_until(stream: trio.abc.Stream, conn: wsproto.WSConnection, last: type) -> list:
    """The client's wsproto events up to and including the first of type `last`."""
    events: list = []
    with trio.fail_after(10):
        while not any(isinstance(event, last) for event in events):
            conn.receive_data(await stream.receive_some(65536))
            events.extend(conn.events())
    return events


def masked_ping(payload: bytes) -> bytes:
    """A client's ping frame by hand (RFC 6455 §5.2: FIN, opcode 9, masked with a zero key): wsproto refuses to send one
    once it has read the server's close frame."""
    return bytes([0x89, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


async def test_a_ping_after_the_servers_close_frame_is_left_unanswered_and_nothing_is_logged(autojump_clock, nursery, caplog):
    # A malformed inject makes the server close; a ping sent once its close frame has arrived cannot be answered (wsproto
    # refuses a pong after a close frame).
    server = make_server()
    client_end, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with caplog.at_level(logging.DEBUG):
        await client_end.send_all(conn.send(Request(host="testbed", target="/v1/responses", extra_headers=[(b"authorization", b"Bearer x")])))
        await frames_until(client_end, conn, AcceptConnection)
        await client_end.send_all(conn.send(TextMessage(data=json.dumps({"type": "response.inject", "response_id": "resp_1"}))))
        events = await frames_until(client_end, conn, CloseConnection)
        assert [type(event) for event in events] == [TextMessage, CloseConnection] and events[-1].code == 1008
        await client_end.send_all(masked_ping(b"late"))
        await client_end.send_all(conn.send(events[-1].response()))
        with trio.fail_after(10):
            while await client_end.receive_some(65536):  # no pong: the server closes the stream
                raise AssertionError("the server sent something after its close frame")
            while server.connections:
                await trio.sleep(0.01)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    async with ws(server) as fresh:  # the server goes on serving
        await send(fresh, create_event(metadata={"testbed_workload": "fixed:1"}))
        assert (await until(fresh, *TERMINALS))[-1]["type"] == "response.completed"


async def test_a_waiting_response_fails_after_the_suspension_ttl(autojump_clock):
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}, multi_agent=MULTI_AGENT))
        events = await timed_until(conn, *TERMINALS)
    (last_call_at, _), = calls_done(events)
    failed_at, failed = events[-1]
    assert failed["type"] == "response.failed" and failed["response"]["error"] == {
        "code": "server_error", "message": "No response.inject answered the function calls in time; the response was released."}
    assert failed_at - last_call_at == 300.0


INJECT_EVENT_MODELS = {"response.inject.created": BetaResponseInjectCreatedEvent,
                       "response.inject.failed": BetaResponseInjectFailedEvent}


def sdk_inject_rollout(port: int) -> list[dict[str, Any]]:
    """The multi-agent guide's loop: every call's output injected with the SDK's `conn.response.inject`, then a late one."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT)
    seen: list[dict[str, Any]] = []
    try:
        with client.beta.responses.connect(extra_headers={"OpenAI-Beta": BETA_HEADER}) as conn:

            def read() -> dict[str, Any]:
                data = conn.recv_bytes()
                raw = json.loads(data)
                typed, model = conn.parse_event(data), INJECT_EVENT_MODELS.get(raw["type"])
                assert typed.type == raw["type"] and (model is None or isinstance(typed, model) and model.model_validate(raw))
                seen.append(raw)
                return raw

            conn.response.create(model="sim-100000", input="go", tools=HARNESS_TOOLS, store=False,
                                 metadata={"testbed_workload": "fixed:3"}, multi_agent=MULTI_AGENT)
            response_id = None
            while True:
                event = read()
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                elif event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call":
                    conn.response.inject(response_id=response_id, input=outputs_for([event["item"]]))
                elif event["type"] in TERMINALS:
                    break
            conn.response.inject(response_id=response_id, input=[{"type": "function_call_output", "call_id": "call_1", "output": "late"}])
            while read()["type"] != "response.inject.failed":
                pass
    finally:
        client.close()
    return seen


async def test_openai_python_injects_into_a_waiting_response_and_it_resumes(live_server):
    _, port = live_server
    events = await in_thread(sdk_inject_rollout, port)
    kinds = [e["type"] for e in events]  # one inject.created per call of the three-turn rollout
    assert [kinds.count(k) for k in ("response.created", "response.completed", "response.inject.created")] == [1, 1, 2]
    completed = events[kinds.index("response.completed")]
    assert [i["type"] for i in completed["response"]["output"]].count("function_call") == 2
    failed = events[-1]
    assert failed["error"]["code"] == "response_already_completed" and failed["response_id"] == completed["response"]["id"]


async def test_hosted_subagents_each_wait_for_their_own_injected_outputs(autojump_clock):
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata=TWO_AGENTS, multi_agent=MULTI_AGENT))
        events = await until_calls(conn, 2)
        response_id = events[0][1]["response"]["id"]
        calls = {e["item"]["call_id"]: e["item"] for _, e in calls_done(events)}
        assert sorted(calls) == ["call_agent0_2", "call_agent1_2"]  # one call each, named after its agent
        await trio.sleep(1.0)
        await send(conn, inject(response_id, calls["call_agent0_2"]))
        # Only agent0 resumes: its final message streams while agent1 still waits.
        resumed = await timed_until(conn, "response.output_item.done")
        while not [e for _, e in resumed if e["type"] == "response.output_item.done" and e["item"]["type"] == "message"]:
            resumed += await timed_until(conn, "response.output_item.done")
        with trio.move_on_after(100):  # nothing more until agent1's output comes
            raise AssertionError(await receive(conn))
        await send(conn, inject(response_id, calls["call_agent1_2"]))
        rest = await timed_until(conn, *TERMINALS)
    assert resumed[0][1]["type"] == "response.inject.created"
    final = rest[-1][1]
    assert rest[0][1]["type"] == "response.inject.created" and final["type"] == "response.completed"
    kinds = [item["type"] for item in final["response"]["output"]]
    assert kinds.count("function_call") == 2 and kinds.count("message") == 4  # two agents, two turns each


# Each agent searches (hosted), reasons, calls the client, then answers: every tool of an agent's own loop.
SEARCHING_AGENT = Workload("searching agent", 1, (
    TurnSpec(200, 30, (0.5,), (HostedCall(2.0, 40),), reasoning_tokens=10), TurnSpec(50, 20, ()),
))


async def subagents_run(server, subagents: int, **fields) -> tuple[float, dict]:
    """`subagents` hosted agents, every call injected once all are made: how long it took and its terminal event."""
    started_at = trio.current_time()
    async with beta_ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": server.api.workloads.register(SEARCHING_AGENT),
                                                "testbed_subagents": str(subagents)},
                                      multi_agent={"enabled": True, "max_concurrent_subagents": subagents},
                                      tools=[*HARNESS_TOOLS, {"type": "web_search"}], **fields))
        events = await until_calls(conn, subagents)
        calls = [e["item"] for _, e in calls_done(events)]
        await send(conn, inject(events[0][1]["response"]["id"], *calls))
        ended_at, terminal = (await timed_until(conn, *TERMINALS))[-1]
    return ended_at - started_at, terminal


async def test_each_hosted_subagent_runs_as_one_agent_alone_with_its_own_tools_and_engine_key(autojump_clock):
    alone_took, alone = await subagents_run(make_server(), 1, include=["reasoning.encrypted_content"])
    three_took, three = await subagents_run(make_server(), 3, include=["reasoning.encrypted_content"])
    # Each of the three agents searches, reasons (the encrypted reasoning the request asked for), calls and answers
    # on its own engine key: side by side they end when one alone does, and each is billed as one alone is.
    assert three_took == pytest.approx(alone_took, abs=1e-9)
    kinds = [(item["type"], item["status"], "encrypted_content" in item) for item in alone["response"]["output"]]
    assert kinds == [("web_search_call", "completed", False), ("reasoning", "completed", True), ("message", "completed", False),
                     ("function_call", "completed", False), ("message", "completed", False)]
    assert sorted((item["type"], item["status"], "encrypted_content" in item) for item in three["response"]["output"]) == sorted(
        kinds * 3)
    usage, usage_alone = three["response"]["usage"], alone["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 3 * usage_alone["input_tokens_details"]["cached_tokens"] > 0
    assert [usage[k] for k in ("input_tokens", "output_tokens", "total_tokens")] == [
        3 * usage_alone[k] for k in ("input_tokens", "output_tokens", "total_tokens")]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 3 * 10


async def test_the_first_subagent_continues_the_conversation_and_the_response_is_not_continued_from_the_cache(autojump_clock):
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        first = (await until(conn, *TERMINALS))[-1]["response"]
        await send(conn, create_event(metadata=TWO_AGENTS, multi_agent=MULTI_AGENT, previous_response_id=first["id"]))
        events = await until_calls(conn, 2)
        await send(conn, inject(events[0][1]["response"]["id"], *[e["item"] for _, e in calls_done(events)]))
        hosted = (await until(conn, *TERMINALS))[-1]
        # Hosted subagents are not continued through previous_response_id: a turn naming one, not stored, is not found.
        await send(conn, create_event("go on", previous_response_id=hosted["response"]["id"]))
        answer = (await until(conn, "error", *TERMINALS))[-1]
    # Calls are named after their agent and the turn of its conversation: agent0's is the conversation's fourth item's
    # turn (after the first response's input and message), agent1's the second of a conversation of its own.
    assert sorted(e["item"]["call_id"] for _, e in calls_done(events)) == ["call_agent0_4", "call_agent1_2"]
    assert hosted["type"] == "response.completed"
    assert (answer["type"], answer["error"]["code"]) == ("error", "previous_response_not_found")


async def test_a_subagent_that_runs_out_of_output_budget_makes_the_response_incomplete(autojump_clock):
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata=TWO_AGENTS, multi_agent=MULTI_AGENT, max_output_tokens=16))
        terminal = (await until(conn, *TERMINALS))[-1]
    assert terminal["type"] == "response.incomplete"
    assert terminal["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def capped_subagents(subagents: int, cap: int) -> tuple[dict[str, float], float]:
    """`subagents` hosted agents, at most `cap` at once, each call answered 1 s after it came: when each call came and
    when the response ended, from the create."""
    started_at, calls, ended = trio.current_time(), {}, None

    async def answer(conn, response_id: str, call: dict) -> None:
        await trio.sleep(1.0)
        await send(conn, inject(response_id, call))

    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2", "testbed_subagents": str(subagents)},
                                      multi_agent={"enabled": True, "max_concurrent_subagents": cap}))
        async with trio.open_nursery() as tools:
            while ended is None:
                with trio.fail_after(600):
                    event = json.loads(await conn.get_message())
                now = trio.current_time() - started_at
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                elif event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call":
                    calls[event["item"]["call_id"]] = now
                    tools.start_soon(answer, conn, response_id, event["item"])
                elif event["type"] in TERMINALS or event["type"] == "error":
                    assert event["type"] == "response.completed", event
                    ended = now
    return calls, ended


async def test_max_concurrent_subagents_caps_how_many_run_at_once_not_how_many_run(autojump_clock):
    first, first_took = await capped_subagents(1, 1)
    (first_call,) = first.values()
    # With a cap of one, agent1 starts when agent0 has ended: when its call came and when it ended, from then.
    queued_calls, queued_took = await capped_subagents(2, 1)
    assert queued_calls["call_agent0_2"] == pytest.approx(first_call, abs=1e-9) and queued_calls["call_agent1_2"] > first_took
    call_after_start, runs = queued_calls["call_agent1_2"] - first_took, queued_took - first_took
    calls, took = await capped_subagents(5, 2)
    # All five run (more than the cap), two at a time: 0 and 1 together, 2 and 3 when those end, 4 after them.
    assert sorted(calls) == [f"call_agent{i}_2" for i in range(5)]
    assert [calls[f"call_agent{i}_2"] for i in range(5)] == pytest.approx(
        [first_call, first_call, first_took + call_after_start, first_took + call_after_start, first_took + runs + call_after_start],
        abs=1e-9)
    assert took == pytest.approx(first_took + 2 * runs, abs=1e-9)


async def test_an_injected_output_past_the_models_window_fails_the_response_with_a_server_error(autojump_clock):
    # Input joining a response already streaming: the API's schema has no `context_length_exceeded` inside a Response.
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(model=SPARK, metadata={"testbed_workload": "fixed:2"}, multi_agent=MULTI_AGENT))
        events = await until_calls(conn)
        (call,) = [e["item"] for _, e in calls_done(events)]
        too_long = tokenizer.text_of(np.random.default_rng(3), SPARK_CONTEXT_WINDOW)
        await send(conn, {"type": "response.inject", "response_id": events[0][1]["response"]["id"],
                          "input": [{**OUTPUT, "call_id": call["call_id"], "output": too_long}]})
        rest = await until(conn, "error", *TERMINALS)
    assert [e["type"] for e in rest[-2:]] == ["response.inject.created", "response.failed"]
    error = rest[-1]["response"]["error"]
    assert error["code"] == "server_error" and "exceeds the context window of 128,000 tokens" in error["message"]  # says why


@pytest.mark.parametrize("wait", [0.0, 1.0])
async def test_a_waiting_subagents_kv_is_plain_cache_that_expires_past_the_engines_ttl(autojump_clock, wait):
    # Unlike v1's held rollout (test_suspended), a hosted agent waiting for its injected output keeps its KV as plain
    # prefix cache: resumed within the engine's 50 ms idle TTL it reuses its blocks, resumed a second later it recomputes.
    async with beta_ws(make_server(engine=Engine(kv_ttl=0.05))) as conn:
        await send(conn, create_event(metadata=TWO_AGENTS, multi_agent=MULTI_AGENT))
        events = await until_calls(conn, 2)
        await trio.sleep(wait)
        await send(conn, inject(events[0][1]["response"]["id"], *[e["item"] for _, e in calls_done(events)]))
        usage = (await until(conn, *TERMINALS))[-1]["response"]["usage"]
    assert (usage["input_tokens_details"]["cached_tokens"] > 0) is (wait == 0.0)


MALFORMED = [  # (label, frame without its type, code, message, param); no response_id or no input: test_codec.py
    ("empty input", {"response_id": "resp_1", "input": []}, "missing_required_parameter",
     "response.inject needs 'input', a non-empty array of items.", "input"),
    ("unknown keys", {"response_id": "r", "input": [OUTPUT], "zeta": 1, "k" * 70: 2}, "unknown_parameter",
     f"Unknown parameter: '{'k' * 64}'.", "k" * 64),
    ("empty response_id", {"response_id": "", "input": [OUTPUT]}, "missing_required_parameter",
     "response.inject needs 'response_id', a string.", "response_id"),
    ("response_id not a string", {"response_id": 7, "input": [OUTPUT]}, "missing_required_parameter",
     "response.inject needs 'response_id', a string.", "response_id"),
    ("an item without output", {"response_id": "r", "input": [{"type": "function_call_output", "call_id": "c"}]},
     "missing_required_parameter", "Missing required field 'output' in input[0].", "input[0].output"),
    ("an item not an object", {"response_id": "r", "input": ["x"]}, "invalid_type", "Invalid type for 'input[0]': expected an object.", "input[0]"),
]


@pytest.mark.parametrize(("label", "frame", "code", "message", "param"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_each_malformed_inject_gets_its_exact_error_and_closes_the_connection(autojump_clock, label, frame, code, message, param):
    server = make_server()
    async with beta_ws(server) as conn:
        await send(conn, {"type": "response.inject", **frame})
        (error,) = await until(conn, *TERMINALS)
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await conn.get_message()
    assert (error, closed.value.reason.code, closed.value.reason.reason) == (
        invalid(code, message, param), 1008, "malformed response.inject")
    assert list(server.records) == [{"user_agent": "", "transport": "websocket", "design": "chained", "connection": 1, "at_s": 0.0,
                                     "response_id": None, "outcome": f"error:{code}", "param": param,
                                     "stream_id": False}]


async def test_each_refused_inject_names_its_reason(autojump_clock):
    async def refused(conn, response_id: str, items: list) -> tuple[int, dict]:
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": items})
        (failed,) = [e for e in await until(conn, "response.inject.failed") if e["type"] == "response.inject.failed"]
        assert failed["response_id"] == response_id and failed["input"] == items
        assert failed["error"]["code"] in ("response_already_completed", "response_not_found")  # openai-python's type allows no other
        return failed["sequence_number"], failed["error"]

    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}, multi_agent={"enabled": True}, stream_id="sub"))
        done = (await until(conn, *TERMINALS))[-1]["response"]
        assert done["multi_agent"] == {"enabled": True, "max_concurrent_subagents": 3}  # the SDK's default cap
        # The guide's answer: nothing committed, the raw input back for a new response.create.
        late = [{"type": "function_call_output", "call_id": "call_9", "output": "late"}]
        await send(conn, {"type": "response.inject", "response_id": done["id"], "input": late})
        assert await until(conn, "response.inject.failed") == [{
            "type": "response.inject.failed", "sequence_number": 0, "response_id": done["id"], "input": late,
            "error": {"code": "response_already_completed", "message": f"Response '{done['id']}' has already completed."}}]
        assert await refused(conn, "resp_nope", [OUTPUT]) == (
            0, {"code": "response_not_found", "message": "Response 'resp_nope' not found."})
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2:100:10:400:0"}))  # a response without multi_agent
        plain = (await until(conn, "response.created"))[-1]["response"]["id"]
        number, error = await refused(conn, plain, [OUTPUT])  # numbered in that response's own sequence
        assert number > 0 and error == {
            "code": "response_not_found",
            "message": f"Response '{plain}' does not take injected input: create it with multi_agent enabled."}
        assert (await until(conn, *TERMINALS))[-1]["type"] == "response.completed"


async def test_an_inject_the_target_cannot_take_is_an_error_on_the_targets_lane(autojump_clock):
    server = make_server()
    async with beta_ws(server) as conn:
        await send(conn, create_event(metadata=THREE_TURNS, multi_agent=MULTI_AGENT, stream_id="sub"))
        events = await until_calls(conn)
        response_id = events[0][1]["response"]["id"]
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": [{**OUTPUT, "call_id": "call_404"}]})
        (*_, error) = await until(conn, "response.inject.failed")
        assert error == {"type": "error", "status": 400, "stream_id": "sub", "error": {
            "type": "invalid_request_error", "code": "invalid_function_call_output", "param": "input",
            "message": "No tool call found for function call output with call_id call_404."}}
    assert [r["outcome"] for r in server.records if r["response_id"] is None] == ["error:invalid_function_call_output"]


async def test_an_output_injected_before_the_response_waits_is_held_and_not_taken_twice(autojump_clock):
    async with beta_ws(make_server()) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2:100:10:400:0"}, multi_agent=MULTI_AGENT))
        events = await until(conn, "response.function_call_arguments.delta")  # the call is still streaming
        response_id = events[0]["response"]["id"]
        events += await until(conn, "response.output_item.done")
        call = [e["item"] for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"][0]
        answer = outputs_for([{**call, "status": "completed"}])
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": answer})
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": answer})  # held, not yet taken
        rest = await until(conn, *TERMINALS)  # to the second inject's error
        rest += await until(conn, *TERMINALS)  # then on to the response's end
    (refused,) = [e for e in rest if e["type"] == "error"]
    assert refused["error"] == {"type": "invalid_request_error", "code": "invalid_function_call_output", "param": "input[0]",
                                "message": f"function_call_output for call_id '{call['call_id']}' answered twice."}
    assert [e["type"] for e in rest].count("response.inject.created") == 1 and "response.inject.failed" not in [e["type"] for e in rest]
    assert rest[-1]["type"] == "response.completed"


def test_the_book_remembers_the_last_256_ended_responses_and_forgets_the_oldest():
    book = InjectBook()
    for n in range(ENDED_KEPT + 1):  # more than 256 responses end on one connection
        book.opened(f"resp_{n}", takes_input=True)
        book.closed(f"resp_{n}")

    def late(response_id: str):
        return book.submit(parse_inject({"type": "response.inject", "response_id": response_id, "input": [OUTPUT]}), [])

    assert ENDED_KEPT == 256
    assert late(f"resp_{ENDED_KEPT}") == InjectRefused("response_already_completed", f"Response 'resp_{ENDED_KEPT}' has already completed.")
    assert late("resp_1") == InjectRefused("response_already_completed", "Response 'resp_1' has already completed.")  # the oldest kept
    assert late("resp_0") == InjectRefused("response_not_found", "Response 'resp_0' not found.")  # the oldest, forgotten


def waiting_agent(book: InjectBook, agent: str = ROOT) -> tuple[InjectedOutputs, list[ToolCall]]:
    book.opened("resp_1", takes_input=True)
    backend = InjectedOutputs(book, "resp_1", ttl=300.0, log=metrics.PhaseLog(schedule=0.0), agent=agent)
    return backend, [ToolCall(FunctionCall("call_1", "shell", "{}")), ToolCall(FunctionCall("call_2", "shell", "{}"))]


def outputs(*call_ids: str) -> ResponseInject:
    return parse_inject({"type": "response.inject", "response_id": "resp_1",
                         "input": [{"type": "function_call_output", "call_id": c, "output": c.upper()} for c in call_ids]})


@pytest.mark.parametrize("agent", [ROOT, "agent1"])
async def test_outputs_committed_before_the_agent_waits_resume_it_at_once(autojump_clock, agent):
    book = InjectBook()
    backend, calls = waiting_agent(book, agent)
    assert book.submit(outputs("call_2", "call_1"), ["call_1", "call_2"]).resumes == ()  # nobody waits yet: held
    answers = await backend.answer(calls)
    # No wake-up comes (the outputs arrived before the agent waited): it resumes at once, in its calls' order.
    assert trio.current_time() == 0.0
    assert answers == [FunctionCallOutput("call_1", "CALL_1"), FunctionCallOutput("call_2", "CALL_2")]
