"""Behaviour of the designs that mutation testing found unguarded (docs/mutation.md): the exact
errors a v1 append or suspension ends with, the timings a pause carries, lanes and their forks,
reasoning on the engine's schedule, and warm-ups. Times are exact under the autojump clock."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from support import create_event, function_calls, make_server, outputs_for, receive, send, timed_until, until, ws
from test_endpoints import connect, error_of

from prototype import metrics
from prototype.api.checks import CallLedger, SafetyState
from prototype.api.costs import ALL_SWITCHES_OFF, ZERO_COSTS, ApiCosts
from prototype.api.service import ApiService, Context, owner_of
from prototype.designs import chained
from prototype.designs.chained import ConnectionCache
from prototype.designs.emitter import Emitter, failing_on_error
from prototype.designs.suspended import RolloutEnded, Suspension, SuspensionSlot
from prototype.engine import tokenizer
from prototype.engine.engine import Engine
from prototype.engine.kv import Prompt
from prototype.engine.memory import KV_BYTES_PER_TOKEN_8B, SWAP_POLICY
from prototype.engine.streaming import EngineFailure
from prototype.protocol import codec
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import CreateRequest
from prototype.protocol.items import FunctionCallOutput, Message, decode_reasoning
from prototype.protocol.response import Response
from prototype.server.config import ServerConfig
from prototype.workload import HostedCall, TurnSpec, Workload

TERMINAL = ("response.completed", "response.failed", "response.incomplete")
# One turn that makes two parallel client calls, then a final answer.
TWO_CALLS = Workload("two-calls", 3, (TurnSpec(400, 20, (0.3, 0.3)), TurnSpec(50, 20, ())))
LIMIT_MESSAGE = "Responses websocket connection limit reached (0.5 minutes). Create a new websocket connection to continue."


def invalid(code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}


def slow_to_take(event_type: str, seconds: float) -> tuple[Any, list[tuple[float, Any]]]:
    """A sink that records each event with its time and takes `seconds` to accept `event_type`."""
    sent: list[tuple[float, Any]] = []

    async def sink(event: Any) -> None:
        sent.append((trio.current_time(), event))
        if event.type == event_type:
            await trio.sleep(seconds)

    return sink, sent


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


# --- v1: what an append is refused with ------------------------------------------------------------


async def test_an_append_that_does_not_answer_exactly_the_pending_calls_is_refused_with_its_reason(autojump_clock) -> None:
    server = make_server()
    key = server.api.workloads.register(TWO_CALLS)
    async with ws(server, "suspended") as conn:
        await send(conn, {"type": "response.append", "input": [output("call_1")]})
        assert await receive(conn) == invalid(
            "no_suspended_response", "response.append: no response is waiting for tool output on this connection.", None
        )
        await send(conn, create_event(metadata={"testbed_workload": key}))
        done = (await until(conn, "response.done"))[-1]["response"]
        first, second = (call["call_id"] for call in function_calls(done))
        assert (first, second) == ("call_2", "call_3")  # named by their place in the conversation (input, message, calls)
        refusals = [
            ([output(first), output(first)], "a call_id is answered twice"),
            ([output(first), output(second), output("call_zz"), output("call_aa")], "call_id 'call_aa' is not pending"),
            ([output(second)], f"no function_call_output for pending call_id '{first}'"),
            ([output(first)], f"no function_call_output for pending call_id '{second}'"),
            ([], f"no function_call_output for pending call_id '{first}'"),
        ]
        for items, problem in refusals:
            await send(conn, {"type": "response.append", "input": items})
            assert await receive(conn) == invalid("invalid_function_call_output", f"response.append: {problem}.", "input")
        # Every refusal left the rollout paused: the exact answer resumes it.
        await send(conn, {"type": "response.append", "input": [output(second), output(first)]})
        resumed = await receive(conn)
        assert (resumed["type"], resumed["response"]["id"]) == ("response.in_progress", done["id"])
        assert (await until(conn, "response.completed"))[-1]["response"]["status"] == "completed"


async def test_an_expired_suspension_fails_with_its_code_and_message(autojump_clock) -> None:
    server = make_server(config=ServerConfig(suspension_ttl=7.5))
    async with ws(server, "suspended", include_timing=True) as conn:
        await send(conn, create_event())
        done = (await until(conn, "response.done"))[-1]
        paused_at = trio.current_time()
        failed = await receive(conn)
    assert trio.current_time() - paused_at == 7.5
    assert (failed["type"], failed["sequence_number"]) == ("response.failed", done["sequence_number"] + 1)
    assert (failed["response"]["id"], failed["response"]["status"]) == (done["response"]["id"], "failed")
    assert failed["response"]["error"] == {"code": "suspension_timeout", "message": "No response.append within 7.5 s; the rollout was released."}
    assert failed["response"]["testbed_timing"]["phases_ms"]["prefill"] > 0  # the timings of the segment it ends


# --- v1: the connection's lifetime ends a rollout ---------------------------------------------------


async def test_a_paused_rollout_fails_at_once_when_the_connection_reaches_its_lifetime(autojump_clock) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=30.0))
    async with ws(server, "suspended") as conn:
        opened = trio.current_time()
        await send(conn, create_event())
        done = (await until(conn, "response.done"))[-1]
        assert trio.current_time() - opened < 30.0
        failed, error = await receive(conn), await receive(conn)
        assert trio.current_time() - opened == 30.0
        with pytest.raises(Exception) as closed:
            await receive(conn)
    assert closed.value.reason.code == 1000
    assert (failed["type"], failed["sequence_number"]) == ("response.failed", done["sequence_number"] + 1)
    assert (failed["response"]["id"], failed["response"]["status"]) == (done["response"]["id"], "failed")
    assert failed["response"]["error"] == {"code": "websocket_connection_limit_reached", "message": LIMIT_MESSAGE}
    assert error["error"]["code"] == "websocket_connection_limit_reached"
    assert server.api.engine.kv == {}


async def first_segment(config: ServerConfig) -> tuple[float, list[dict[str, Any]], dict[str, Any] | None]:
    """A v1 rollout whose first segment streams 300 tokens at 10 tokens/s (30 s): (seconds from the
    create to the event ending the segment, the events up to it, the error after it if any)."""
    server = make_server(config=config)
    async with ws(server, "suspended") as conn:
        opened = trio.current_time()
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}))
        events = await until(conn, "response.failed", "response.done")
        ended = trio.current_time() - opened
        error = await receive(conn) if events[-1]["type"] == "response.failed" else None
    assert server.api.engine.kv == {}
    return ended, events, error


async def test_a_streaming_rollout_fails_where_it_would_pause_once_the_lifetime_is_reached(autojump_clock) -> None:
    paused_at, paused, _ = await first_segment(ServerConfig())
    failed_at, events, error = await first_segment(ServerConfig(connection_lifetime=20.0))
    # The segment streams to its end, past the 20 s lifetime, then fails where it would have paused.
    assert failed_at == pytest.approx(paused_at, abs=1e-9) and paused_at > 20.0
    assert [e["type"] for e in events] == [e["type"] for e in paused[:-1]] + ["response.failed"]
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["type"] == "function_call"
    failed = events[-1]["response"]
    message = "Responses websocket connection limit reached (0.333333 minutes). Create a new websocket connection to continue."
    assert (failed["status"], failed["error"]) == ("failed", {"code": "websocket_connection_limit_reached", "message": message})
    assert error["error"] == {"type": "invalid_request_error", "code": "websocket_connection_limit_reached", "message": message, "param": None}



async def test_once_the_connection_closes_a_paused_rollout_wakes_to_fail_and_no_append_is_taken() -> None:
    limit = ProtocolError("websocket_connection_limit_reached", LIMIT_MESSAGE)
    slot = SuspensionSlot()
    paused = slot.current = Suspension(("call_1",))
    slot.end(limit)
    assert (slot.current, slot.ended, paused.answered) == (None, limit, True)
    with pytest.raises(ProtocolError) as refused:
        slot.deliver([FunctionCallOutput("call_1", "ok")], 0.0)
    assert refused.value.code == "no_suspended_response"
    with pytest.raises(RolloutEnded) as ended:
        await paused.wait()
    assert (ended.value.reason, str(ended.value)) == (limit, LIMIT_MESSAGE)
    # An append taken before the end is still applied: the rollout resumes with it.
    answered = Suspension(("call_2",))
    items = [FunctionCallOutput("call_2", "ok")]
    answered.deliver(items, 0.0)
    answered.end(limit)
    assert await answered.wait() == items


# --- v1: the timings a pause and the end carry -------------------------------------------------------


async def test_v1_timings_carry_the_queue_and_client_and_each_pause_only_its_segment(autojump_clock) -> None:
    server = make_server()
    async with ws(server, "suspended", include_timing=True) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3"}))
        first = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(first))})
        resumed = await receive(conn)
        resumed_at = trio.current_time()
        second = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(second))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    assert resumed["type"] == "response.in_progress"
    # Every event carries what the connection logged of the create (its client record); the first
    # pause carries the rollout from its arrival, the queue included.
    for response in (first, second, final):
        assert response["testbed_timing"]["client"]["design"] == "suspended"
    assert "queue" in first["testbed_timing"]["phases_ms"]
    # A later pause carries its own segment only: from the resume on.
    timing = second["testbed_timing"]
    assert "queue" not in timing["phases_ms"]
    assert timing["origin_s"] == resumed_at
    assert timing["spans"][0][1] == 0.0



# --- v1: the stored record and the terminal event ----------------------------------------------------


@pytest.mark.parametrize(("budget", "status", "details"), [(None, "completed", None), (25, "incomplete", {"reason": "max_output_tokens"})])
async def test_a_v1_rollout_is_stored_and_ends_with_its_final_status(autojump_clock, budget, status, details) -> None:
    # fixed:3 samples 100 tokens a turn: a budget of 25 runs out in the first turn's message.
    server = make_server()
    async with ws(server, "suspended", include_timing=True) as conn:
        await send(conn, create_event(store=True, max_output_tokens=budget))
        while (last := (await until(conn, "response.done", *TERMINAL))[-1])["type"] == "response.done":
            await send(conn, {"type": "response.append", "input": outputs_for(function_calls(last["response"]))})
    response = last["response"]
    assert (last["type"], response["status"], response["incomplete_details"]) == (f"response.{status}", status, details)
    assert response["testbed_timing"]["phases_ms"]["prefill"] > 0
    stored = server.api.store.get(response["id"]).response
    assert (stored["status"], stored["incomplete_details"]) == (status, None)  # stored before the terminal event


@pytest.mark.parametrize("design", ["suspended", "chained"])
async def test_only_the_key_that_created_a_response_cancels_it(autojump_clock, nursery, design) -> None:
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, design, api_key="alice") as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}))  # 30 s of decode
        created = (await until(conn, "response.created"))[-1]
        rid = created["response"]["id"]
        await trio.sleep(2.0)
        error_of(await http.request("POST", f"/v1/responses/{rid}/cancel", key="bob"), 404, "response_not_found", "response_id")
        reply = await http.request("POST", f"/v1/responses/{rid}/cancel", key="alice")
        cancelled_at = trio.current_time()
        cancelled = (await until(conn, "response.cancelled"))[-1]
        assert trio.current_time() == cancelled_at 
    assert (cancelled["response"]["id"], cancelled["response"]["status"]) == (rid, "cancelled")
    assert reply.status == 200 and reply.json() == cancelled["response"]
    (record,) = [r for r in server.records if r["response_id"] == rid]
    assert record["outcome"] == "cancelled"


# --- v2 lanes: each lane's slot, and forks across lanes ---------------------------------------------


def not_found(response_id: str, stream_id: str) -> dict[str, Any]:
    return {**invalid("previous_response_not_found", f"Previous response with id '{response_id}' not found.", "previous_response_id"),
            "stream_id": stream_id}


async def test_a_lane_continuing_its_own_response_empties_its_slot_while_the_turn_runs(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(stream_id="main"))
        first = (await until(conn, *TERMINAL))[-1]["response"]
        outputs = outputs_for(function_calls(first))
        slow = {"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}  # 30 s of decode
        await send(conn, create_event(outputs, stream_id="main", previous_response_id=first["id"], metadata=slow))
        created = (await until(conn, "response.created"))[-1]
        # While lane main's turn runs, the response it continues is in no slot: a fork finds nothing.
        await send(conn, create_event(outputs, stream_id="side", previous_response_id=first["id"]))
        refused = (await until(conn, "error"))[-1]
        assert refused == not_found(first["id"], "side")
        second = (await until(conn, *TERMINAL))[-1]
        assert (second["type"], second["stream_id"], second["response"]["id"]) == ("response.completed", "main", created["response"]["id"])
        # Once it succeeded, lane main holds its new response, and a fork from that one runs.
        await send(conn, create_event(outputs_for(function_calls(second["response"])), stream_id="side", previous_response_id=second["response"]["id"]))
        fork = (await until(conn, *TERMINAL))[-1]
        assert (fork["type"], fork["stream_id"]) == ("response.completed", "side")


async def test_a_lane_continuing_its_own_response_leaves_the_default_lanes_slot(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event())
        default = (await until(conn, *TERMINAL))[-1]["response"]
        await send(conn, create_event(stream_id="a"))
        lane_a = (await until(conn, *TERMINAL))[-1]["response"]
        await send(conn, create_event(outputs_for(function_calls(lane_a)), stream_id="a", previous_response_id=lane_a["id"]))
        continued_a = (await until(conn, *TERMINAL))[-1]
        await send(conn, create_event(outputs_for(function_calls(default)), previous_response_id=default["id"]))
        continued_default = (await until(conn, *TERMINAL))[-1]
    assert (continued_a["type"], continued_a["stream_id"]) == ("response.completed", "a")
    assert continued_default["type"] == "response.completed" and "stream_id" not in continued_default
    assert continued_default["response"]["previous_response_id"] == default["id"]


async def test_a_failed_turn_empties_its_own_lanes_slot_only(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        held = {}
        for lane in (None, "a", "b"):
            await send(conn, create_event(**({} if lane is None else {"stream_id": lane})))
            held[lane] = (await until(conn, *TERMINAL))[-1]["response"]
        # A new conversation on lane a fails (an output for a call it never made): lane a's slot empties.
        await send(conn, create_event(outputs_for([{"call_id": "call_nope"}]), stream_id="a"))
        assert (await until(conn, *TERMINAL))[-1]["error"]["code"] == "invalid_function_call_output"
        answers = {}
        for lane in ("a", None, "b"):
            response = held[lane]
            await send(conn, create_event(outputs_for(function_calls(response)), previous_response_id=response["id"],
                                          **({} if lane is None else {"stream_id": lane})))
            answers[lane] = (await until(conn, *TERMINAL))[-1]
    assert answers["a"] == not_found(held["a"]["id"], "a")
    assert answers[None]["type"] == answers["b"]["type"] == "response.completed"


async def test_a_fork_onto_a_busy_lane_copies_the_conversation_and_leaves_the_original_intact(autojump_clock) -> None:
    server = make_server(costs=ApiCosts())
    async with ws(server, include_timing=True) as conn:
        await send(conn, create_event(stream_id="a"))
        a1 = (await until(conn, *TERMINAL))[-1]["response"]
        await send(conn, create_event(stream_id="b", metadata={"testbed_workload": "fixed:3:300:10:30"}))
        b1 = (await until(conn, *TERMINAL))[-1]["response"]
        outputs = outputs_for(function_calls(a1))
        # Lane b, which holds a response of its own, forks from lane a's; then lane a continues it.
        await send(conn, create_event(outputs, stream_id="b", previous_response_id=a1["id"]))
        fork = (await until(conn, *TERMINAL))[-1]
        await send(conn, create_event(outputs, stream_id="a", previous_response_id=a1["id"]))
        main = (await until(conn, *TERMINAL))[-1]
        # Lane b moved on from its own response b1: it left the cache.
        await send(conn, create_event(outputs_for(function_calls(b1)), stream_id="c", previous_response_id=b1["id"]))
        assert (await until(conn, *TERMINAL))[-1] == not_found(b1["id"], "c")
    assert (fork["type"], fork["stream_id"], main["type"], main["stream_id"]) == ("response.completed", "b", "response.completed", "a")
    # Both extended the same conversation by the same input: neither saw the other's turn.
    assert fork["response"]["usage"] == main["response"]["usage"]
    assert fork["response"]["output"][0]["content"] == main["response"]["output"][0]["content"]
    # The fork appends its input to the copied rendering, as the continuation does to the original.
    fork_phases, main_phases = fork["response"]["testbed_timing"]["phases_ms"], main["response"]["testbed_timing"]["phases_ms"]
    for stage in ("validate", "render", "safety", "route"):
        assert fork_phases[stage] == pytest.approx(main_phases[stage], abs=0.002), stage  # ms, rounded on the wire
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
    assert cache.take("resp_9") is None
    assert cache.slots == {}
    # Another lane's response is copied for the default lane, under the connection's own engine key.
    other = conversation("two", ("conn", "a"))
    cache.view("a").put(second, other)
    assert cache.engine_keys == ["conn", ("conn", "a")]
    fork = cache.take("resp_2")
    assert fork is not other and fork.items == other.items and list(fork.prompt.ids) == [1, 2, 3]
    assert fork.engine_key == "conn"
    assert cache.slots["a"].context is other


# --- v2: the stored record, steering, and the overlapped post-inference work --------------------------


@pytest.mark.parametrize(("budget", "status", "details"), [(None, "completed", None), (25, "incomplete", {"reason": "max_output_tokens"})])
async def test_a_chained_turn_is_stored_with_its_final_status_when_post_inference_runs_first(autojump_clock, budget, status, details) -> None:
    # Switch 4 off: post-inference runs before the terminal event, as in v1.
    server = make_server(config=ServerConfig(switches=ALL_SWITCHES_OFF))
    async with ws(server) as conn:
        await send(conn, create_event(store=True, max_output_tokens=budget))
        last = (await until(conn, *TERMINAL))[-1]
    assert (last["type"], last["response"]["status"], last["response"]["incomplete_details"]) == (f"response.{status}", status, details)
    stored = server.api.store.get(last["response"]["id"])
    assert (stored.response["status"], stored.owner) == (status, owner_of("testbed"))
    assert [item.to_dict() for item in stored.output] == last["response"]["output"]


async def test_steering_input_stops_a_chained_turn_at_the_end_of_its_message(autojump_clock) -> None:
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3:100:10:300:0.5"}))  # 300-token messages
        target = (await until(conn, "response.output_text.delta"))[0]["response"]["id"]
        await send(conn, {"type": "response.steer", "previous_response_id": target, "input": "keep it small"})
        events = await until(conn, *TERMINAL)
        successor = await until(conn, *TERMINAL)
    types = [e["type"] for e in events]
    assert types[0] == "response.steer.accepted" and types[-2:] == ["response.output_item.done", "response.incomplete"]
    ended = events[-1]["response"]
    assert (ended["status"], ended["incomplete_details"]) == ("incomplete", {"reason": "steered"})
    assert [(i["type"], i["status"]) for i in ended["output"]] == [("message", "completed")]
    assert successor[0]["response"]["previous_response_id"] == target and successor[-1]["type"] == "response.completed"


async def test_a_closed_connection_ends_only_after_its_overlapped_post_inference_work(autojump_clock) -> None:
    # The overlapped post work is shielded: a client that leaves right after the terminal event
    # does not cut it short; the server ends the connection (and completes the close) once it has finished.
    server = make_server(costs=ApiCosts(post=2.0))
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        await until(conn, "response.completed")
        completed_at = trio.current_time()
        assert server.connections == 1
    assert trio.current_time() - completed_at == pytest.approx(2.0, abs=1e-9)
    assert (server.connections, server.sessions) == (0, set())


# --- reasoning, sampled on the engine's schedule ------------------------------------------------------

# A first turn that reasons for 15 tokens before its message and call, then a final answer that reasons for 10.
REASONING = Workload("reasoning", 2, (TurnSpec(300, 40, (0.3,), (), 15), TurnSpec(50, 30, (), (), 10)))


def reasoning_item(item_id: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], **extra, "status": status}


async def test_a_reasoning_item_is_announced_sampled_at_the_decode_rate_and_exported(autojump_clock) -> None:
    server = make_server()
    key = server.api.workloads.register(REASONING)
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "100"}, include=["reasoning.encrypted_content"]))
        events = await timed_until(conn, *TERMINAL)
    # Usage is reported once the response has ended, not while it runs.
    assert [(e["type"], e["response"]["usage"]) for _, e in events[:2]] == [("response.created", None), ("response.in_progress", None)]
    (added_at, added), (done_at, done) = ((t, e) for t, e in events if e["type"].startswith("response.output_item.") and e["output_index"] == 0)
    item_id = added["item"]["id"]
    assert item_id.startswith("rs_")
    assert added == {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": reasoning_item(item_id, "in_progress")}
    blob = done["item"]["encrypted_content"]
    assert done == {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0,
                    "item": reasoning_item(item_id, "completed", encrypted_content=blob)}
    assert done_at - added_at == pytest.approx(15 / 100, abs=1e-12)  # 15 tokens at 100 tokens/s
    assert len(tokenizer.encode(decode_reasoning(blob))) == 15  # the text is the sampled tokens, nothing between them
    final = events[-1][1]["response"]
    assert final["output"][0] == reasoning_item(item_id, "completed", encrypted_content=blob)
    # The message: one output_text part, announced empty, streamed, then done with the whole text.
    message = final["output"][1]
    text = message["content"][0]["text"]
    part_events = [e for _, e in events if e.get("output_index") == 1 and e["type"].startswith(("response.content_part.", "response.output_text."))]
    msg_id = message["id"]
    assert part_events[0] == {"type": "response.content_part.added", "sequence_number": part_events[0]["sequence_number"], "item_id": msg_id,
                              "output_index": 1, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}
    assert {(e["type"], e["content_index"]) for e in part_events[1:-2]} == {("response.output_text.delta", 0)}
    assert "".join(e["delta"] for e in part_events[1:-2]) == text
    assert [{k: v for k, v in e.items() if k != "sequence_number"} for e in part_events[-2:]] == [
        {"type": "response.output_text.done", "item_id": msg_id, "output_index": 1, "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "part": {"type": "output_text", "text": text, "annotations": []}},
    ]
    # The call after the message: announced empty, done with its streamed arguments.
    (_, call_added), (_, call_done) = ((t, e) for t, e in events if e["type"].startswith("response.output_item.") and e["output_index"] == 2)
    call = final["output"][2]
    assert call == {"type": "function_call", "id": call["id"], "call_id": call["call_id"], "name": call["name"],
                    "arguments": call["arguments"], "status": "completed"}
    assert call_added["item"] == {**call, "arguments": "", "status": "in_progress"}
    assert call_done["item"] == call
    deltas = "".join(e["delta"] for _, e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == call["arguments"] and json.loads(call["arguments"])
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 15}


async def test_a_v1_rollout_counts_every_turns_reasoning(autojump_clock) -> None:
    server = make_server()
    key = server.api.workloads.register(REASONING)
    async with ws(server, "suspended") as conn:
        await send(conn, create_event(metadata={"testbed_workload": key}))
        done = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(done))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    (call,) = function_calls(done)
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "reasoning", "message"]
    usage = final["usage"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 15 + 10}
    assert usage["output_tokens"] == 40 + 30 + len(tokenizer.encode(call["arguments"]))
    assert server.api.engine.stats.decoded_tokens == usage["output_tokens"]  # the engine decoded each token once


async def test_a_slow_write_is_not_added_to_the_sampling_time(autojump_clock, nursery) -> None:
    # The engine samples on its own schedule from the end of the prefill; a client slow to take the
    # announcement of each item (0.5 s) delays only when the item's end can be sent.
    api = ApiService(costs=ZERO_COSTS)
    key = api.workloads.register(REASONING)
    frame = create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "100"})
    request = codec.decode_client_event(json.dumps(frame)).request
    for write in (0.0, 0.5):
        sink, sent = slow_to_take("response.output_item.added", write)
        response = await chained.run_turn(api, request, sink, ConnectionCache(("slow", write)).view(None), nursery)
        reasoning, message, call = response.output
        tokens = [15, 25, len(tokenizer.encode(call.arguments))]  # sampled at 100 tokens/s
        for index, count in enumerate(tokens):
            (added_at, _), (done_at, _) = ((t, e) for t, e in sent if e.type.startswith("response.output_item.") and e.output_index == index)
            assert done_at - added_at == pytest.approx(max(write, count / 100), abs=1e-12), index
        assert response.usage.reasoning_tokens == 15


async def test_a_cancel_during_reasoning_leaves_no_unfinished_item(autojump_clock, nursery) -> None:
    server = make_server()
    key = server.api.workloads.register(Workload("long-reasoning", 4, (TurnSpec(300, 400, (0.3,), (), 300), TurnSpec(50, 30, ()))))
    http = connect(nursery, server)
    async with ws(server, api_key="alice") as conn:
        await send(conn, create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "100"}))  # 3 s of reasoning
        events = await until(conn, "response.output_item.added")
        assert events[-1]["item"]["type"] == "reasoning"
        rid = events[0]["response"]["id"]
        await trio.sleep(1.0)
        reply = await http.request("POST", f"/v1/responses/{rid}/cancel", key="alice")
        (cancelled,) = await until(conn, "response.cancelled")
    assert cancelled["sequence_number"] == events[-1]["sequence_number"] + 1
    assert (cancelled["response"]["status"], cancelled["response"]["output"]) == ("cancelled", [])
    assert reply.json() == cancelled["response"]


# --- warm-ups ---------------------------------------------------------------------------------------


async def warm_up_after_idle(fork_first: bool, generate: bool = False) -> tuple[int, float, int]:
    """Lane a answers a turn at 0 s (lane b forking from it at once when `fork_first`, then idle past
    the KV's 300 s idle TTL), continues it at 200 s, and warms up its next turn at 350 s (or, without
    `generate`, runs it). Returns (tokens that turn prefilled, its duration, the continuation's input tokens)."""
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(stream_id="a"))
        first = (await until(conn, *TERMINAL))[-1]["response"]
        outputs = outputs_for(function_calls(first))
        if fork_first:
            await send(conn, create_event(outputs, stream_id="b", previous_response_id=first["id"]))
            assert (await until(conn, *TERMINAL))[-1]["type"] == "response.completed"
        await trio.sleep(200)
        await send(conn, create_event(outputs, stream_id="a", previous_response_id=first["id"]))
        second = (await until(conn, *TERMINAL))[-1]["response"]
        await trio.sleep(150)
        start = trio.current_time()
        await send(conn, create_event(outputs_for(function_calls(second)), stream_id="a", previous_response_id=second["id"], generate=generate))
        warm = (await until(conn, *TERMINAL))[-1]
        took = trio.current_time() - start
    assert warm["type"] == "response.completed"
    if generate:
        usage = warm["response"]["usage"]
        return usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"], took, second["usage"]["input_tokens"]
    assert warm["response"]["usage"]["input_tokens"] == 0
    (record,) = [r for r in server.records if r["response_id"] == warm["response"]["id"]]
    return record["warmup_prefill_tokens"], took, second["usage"]["input_tokens"]


async def test_a_warm_up_prefills_only_what_its_own_lanes_kv_does_not_hold(autojump_clock) -> None:
    # Lane b's fork listed the shared blocks under its own entry, which expired at 300 s; lane a's
    # entry, used at 200 s, still holds them, and the warm-up finds them there.
    alone, alone_took, before = await warm_up_after_idle(fork_first=False)
    forked, forked_took, _ = await warm_up_after_idle(fork_first=True)
    assert 0 < alone < before  # the new items and the last partial block only
    assert forked == alone and forked_took == pytest.approx(alone_took, abs=1e-9)  # clocks at different values round differently


async def test_a_turn_prefills_only_what_its_own_lanes_kv_does_not_hold(autojump_clock) -> None:
    alone, alone_took, before = await warm_up_after_idle(fork_first=False, generate=True)
    forked, forked_took, _ = await warm_up_after_idle(fork_first=True, generate=True)
    assert 0 < alone < before
    assert forked == alone and forked_took == pytest.approx(alone_took, abs=1e-9)  # clocks at different values round differently


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


# --- the engine's side of a pause, delta coalescing, one terminal event --------------------------------


async def test_under_swap_a_turn_that_ends_at_a_tool_call_swaps_its_kv_out_and_a_final_answer_does_not(autojump_clock) -> None:
    server = make_server(engine=Engine(retention=SWAP_POLICY))
    stats = server.api.engine.stats
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}))
        first = (await until(conn, *TERMINAL))[-1]["response"]
        (held,) = server.api.engine.kv.values()
        paused_tokens = held.tokens
        assert stats.swap_out_bytes == paused_tokens * KV_BYTES_PER_TOKEN_8B > 0  # paused at the call: copied to the host
        await trio.sleep(1.0)  # the client runs its tool
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"], metadata={"testbed_workload": "fixed:2"}))
        assert (await until(conn, *TERMINAL))[-1]["type"] == "response.completed"
    # The final answer is not a pause: nothing more was copied out; the first turn's KV came back once.
    assert (stats.swap_out_bytes, stats.swap_in_bytes) == (paused_tokens * KV_BYTES_PER_TOKEN_8B,) * 2


async def test_deltas_carry_at_most_the_configured_tokens(autojump_clock) -> None:
    # A 1 s flush interval coalesces the whole 30-token message; `flush_tokens` caps each delta.
    server = make_server(flush_interval=1.0, flush_tokens=5)
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:30"}))
        events = await until(conn, *TERMINAL)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert [len(tokenizer.encode(d)) for d in deltas] == [1, 5, 5, 5, 5, 5, 4]  # the first token goes out at once
    assert "".join(deltas) == events[-1]["response"]["output"][0]["content"][0]["text"]


async def test_a_response_ends_with_exactly_one_terminal_event() -> None:
    sent: list[Any] = []

    async def sink(event: Any) -> None:
        sent.append(event)

    emitter = Emitter(Response("resp_once", CreateRequest("sim-1", ()), created_at=0), sink, metrics.PhaseLog())
    await emitter.finished("completed")
    await emitter.finished("failed", error={"code": "server_error", "message": "late"})
    assert [event.type for event in sent] == ["response.completed"]
    assert (emitter.response.status, emitter.response.error) == ("completed", None)


async def test_a_cancel_while_a_call_streams_keeps_only_the_finished_items(autojump_clock, nursery) -> None:
    server = make_server()
    async with ws(server, api_key="alice", include_timing=True) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2", "testbed_decode_tps": "10"}))
        events = await until(conn, "response.function_call_arguments.delta")
        rid = events[0]["response"]["id"]
        added = [e for e in events if e["type"] == "response.output_item.added"][-1]
        assert added["item"] == {"type": "function_call", "id": added["item"]["id"], "call_id": added["item"]["call_id"],
                                 "name": added["item"]["name"], "arguments": "", "status": "in_progress"}
        reply = await connect(nursery, server).request("POST", f"/v1/responses/{rid}/cancel", key="alice")
        (cancelled,) = await until(conn, "response.cancelled")
    response = cancelled["response"]
    assert [(i["type"], i["status"]) for i in response["output"]] == [("message", "completed")]
    assert response["testbed_timing"]["phases_ms"]["prefill"] > 0  # the timings of the whole response
    assert reply.json() == response


async def test_a_slow_write_after_a_hosted_search_is_not_added_to_the_next_model_call(autojump_clock, nursery) -> None:
    # The model waited for the search until its answer; a client slow to take the search's end
    # (0.5 s) does not push back the pre-inference work and prefill that follow it.
    api = ApiService(costs=ZERO_COSTS)
    key = api.workloads.register(Workload("hosted", 1, (TurnSpec(500, 20, (0.3,), (HostedCall(2.0, 100),)), TurnSpec(50, 20, ()))))
    frame = create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "100"}, tools=[*create_event()["tools"], {"type": "web_search"}])
    request = codec.decode_client_event(json.dumps(frame)).request
    after: dict[float, float] = {}
    for write in (0.0, 0.5):
        sink, sent = slow_to_take("response.web_search_call.completed", write)
        response = await chained.run_turn(api, request, sink, ConnectionCache(("search", write)).view(None), nursery)
        assert [item.type for item in response.output] == ["web_search_call", "message", "function_call"]
        (searched_at,) = [t for t, e in sent if e.type == "response.web_search_call.completed"]
        (message_done_at,) = [t for t, e in sent if e.type == "response.output_item.done" and e.output_index == 1]
        after[write] = message_done_at - searched_at
    assert after[0.0] > 0.2  # the prefill, then 20 tokens at 100 tokens/s
    assert after[0.5] == pytest.approx(max(0.5, after[0.0]), abs=1e-12)


# --- the model call: the engine's queue, cached tokens, the response's schedule ---------------------


async def test_a_model_call_queued_behind_a_full_batch_logs_its_wait(autojump_clock) -> None:
    server = make_server(engine=Engine(max_batch=1))
    responses: dict[str, dict[str, Any]] = {}

    async def one(name: str, delay: float) -> None:
        await trio.sleep(delay)
        async with ws(server, include_timing=True) as conn:
            await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:30"}))
            responses[name] = (await until(conn, *TERMINAL))[-1]["response"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", 0.0)
        nursery.start_soon(one, "second", 0.001)
    first, second = (responses[name]["testbed_timing"]["phases_ms"] for name in ("first", "second"))
    assert first["queue"] == 0.0
    # The second asked 1 ms after the first and waited for the first's whole model call.
    assert second["queue"] == pytest.approx(first["prefill"] + first["decode"] - 1.0, abs=0.002)
    spans = responses["second"]["testbed_timing"]["spans"]
    assert [span[0] for span in spans].count("queue") == 2  # the lane's, then the engine's
    # After a wait in the engine the prefill starts at admission, not back on the response's schedule.
    engine_queue = [span for span in spans if span[0] == "queue"][-1]
    (prefill,) = [span for span in spans if span[0] == "prefill"]
    assert prefill[1] == engine_queue[2] and prefill[2] - prefill[1] == second["prefill"] > 0


async def test_a_v1_rollouts_usage_sums_every_model_calls_cached_tokens(autojump_clock) -> None:
    server = make_server()
    async with ws(server, "suspended") as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3"}))
        while (last := (await until(conn, "response.done", *TERMINAL))[-1])["type"] == "response.done":
            await send(conn, {"type": "response.append", "input": outputs_for(function_calls(last["response"]))})
    usage, stats = last["response"]["usage"], server.api.engine.stats
    assert stats.model_calls == 3 and stats.cached_tokens > 0
    assert usage["input_tokens_details"]["cached_tokens"] == stats.cached_tokens
    assert usage["input_tokens"] == stats.prefill_tokens + stats.cached_tokens


async def test_a_slow_write_of_response_created_is_not_added_to_the_prefill(autojump_clock, nursery) -> None:
    # The prefill starts on the response's schedule, when pre-inference work ended; a client slow
    # to take `response.created` (0.5 s) delays only what can be sent after it.
    api = ApiService(costs=ZERO_COSTS)
    request = codec.decode_client_event(json.dumps(create_event(metadata={"testbed_workload": "fixed:1:100:10:25", "testbed_decode_tps": "100"}))).request
    ended: dict[float, float] = {}
    for write in (0.0, 0.5):
        sink, sent = slow_to_take("response.created", write)
        await chained.run_turn(api, request, sink, ConnectionCache(("created", write)).view(None), nursery)
        ended[write] = sent[-1][0] - sent[0][0]  # from response.created to the terminal event
    assert 0.25 < ended[0.0] < 0.5  # the prefill, then 25 tokens at 100 tokens/s
    assert ended[0.5] == pytest.approx(0.5, abs=1e-12)


# --- the output budget (max_output_tokens) across a v1 rollout ----------------------------------------


# Turn 1: 16 reasoning tokens, 24 of text and a call; turn 2: 10 reasoning tokens and 20 of text.
BUDGETED = Workload("budgeted", 2, (TurnSpec(300, 40, (0.3,), (), 16), TurnSpec(50, 30, (), (), 10)))


def message_tokens(item: dict[str, Any]) -> int:
    return len(tokenizer.encode(item["content"][0]["text"]))


@pytest.mark.parametrize(("budget", "expected"), [
    # Reasoning is sampled only if the budget leaves room after it; text fills what is left.
    (16, [("message", 16, "incomplete")]),  # 16 is the API's least budget
    (20, [("reasoning", 16, "completed"), ("message", 4, "incomplete")]),
    # Exactly enough for the first turn: it completes and calls; the second turn has nothing left.
    (40, [("reasoning", 16, "completed"), ("message", 24, "completed"), ("function_call", None, "completed"), ("message", 0, "incomplete")]),
    (60, [("reasoning", 16, "completed"), ("message", 24, "completed"), ("function_call", None, "completed"),
          ("reasoning", 10, "completed"), ("message", 10, "incomplete")]),
])
async def test_a_v1_rollouts_output_budget_runs_across_its_turns(autojump_clock, budget, expected) -> None:
    server = make_server()
    key = server.api.workloads.register(BUDGETED)
    async with ws(server, "suspended") as conn:
        await send(conn, create_event(metadata={"testbed_workload": key}, max_output_tokens=budget))
        while (last := (await until(conn, "response.done", *TERMINAL))[-1])["type"] == "response.done":
            await send(conn, {"type": "response.append", "input": outputs_for(function_calls(last["response"]))})
    response = last["response"]
    assert (last["type"], response["incomplete_details"]) == ("response.incomplete", {"reason": "max_output_tokens"})
    reasoning = iter([16, 10])
    shape = [(item["type"], message_tokens(item) if item["type"] == "message" else next(reasoning) if item["type"] == "reasoning" else None,
              item["status"]) for item in response["output"]]
    assert shape == expected
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == sum(n for kind, n, _ in expected if kind == "reasoning")


@pytest.mark.parametrize(("design", "shared"), [("suspended", True), ("chained", False)])
async def test_a_v1_rollouts_kv_serves_other_sessions_through_its_decode_past_the_idle_ttl(autojump_clock, design, shared) -> None:
    # A v1 rollout's KV is held by its live coroutine from its prefill on: another session's lookup
    # during the decode finds its blocks however long ago the prefill ended. An unpinned (chained)
    # call's KV is idle-timed from its last use, so past the TTL the same lookup finds nothing.
    server = make_server(engine=Engine(kv_ttl=0.05))
    frame = create_event(metadata={"testbed_workload": "fixed:1:2000:10:30", "testbed_decode_tps": "10"})
    cached: dict[str, int] = {}
    prompt_tokens: dict[str, int] = {}

    async def one(name: str, path: str, delay: float) -> None:
        await trio.sleep(delay)
        async with ws(server, path) as conn:
            await send(conn, frame)
            response = (await until(conn, "response.done", *TERMINAL))[-1]["response"]
            usage = response["usage"]
            cached[name], prompt_tokens[name] = usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", design, 0.0)
        nursery.start_soon(one, "second", "chained", 1.0)  # 1 s into the first's 3 s decode
    assert cached["first"] == 0 and prompt_tokens["first"] == prompt_tokens["second"] > 16
    # The same prompt: its whole blocks, never its last token (`KVResidency.cached_prefix`).
    assert cached["second"] == ((prompt_tokens["second"] - 1) // 16 * 16 if shared else 0)


@pytest.mark.parametrize("design", ["suspended", "chained"])
async def test_a_response_opens_with_created_then_in_progress(autojump_clock, design) -> None:
    server = make_server()
    async with ws(server, design) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        events = await until(conn, *TERMINAL)
    assert [e["type"] for e in events[:3]] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[0]["response"]["status"] == events[1]["response"]["status"] == "in_progress"


class _CodedFailure(EngineFailure):
    code = "coded_failure"


@pytest.mark.parametrize(("raised", "error"), [
    (EngineFailure("the engine went away"), {"code": "engine_failure", "message": "the engine went away"}),
    (EngineFailure(), {"code": "engine_failure", "message": "The engine failed."}),  # no message of its own
    (_CodedFailure("no room"), {"code": "coded_failure", "message": "no room"}),  # a subclass's own code
    (RuntimeError("a bug"), {"code": "server_error", "message": "The server had an error while processing the response."}),
])
async def test_a_failure_inside_a_response_fails_it_once_and_goes_on_to_the_connection(raised, error) -> None:
    sent: list[Any] = []

    async def sink(event: Any) -> None:
        sent.append(event)

    emitter = Emitter(Response("resp_fails", CreateRequest("sim-1", ()), created_at=0), sink, metrics.PhaseLog())
    with pytest.raises(type(raised)) as caught:
        async with failing_on_error(emitter):
            raise raised
    assert caught.value is raised
    assert [event.type for event in sent] == ["response.failed"]
    assert (emitter.response.status, emitter.response.error) == ("failed", error)
    assert sent[0].response["error"] == error


async def test_a_response_that_ends_normally_is_not_failed() -> None:
    sent: list[Any] = []

    async def sink(event: Any) -> None:
        sent.append(event)

    emitter = Emitter(Response("resp_fine", CreateRequest("sim-1", ()), created_at=0), sink, metrics.PhaseLog())
    async with failing_on_error(emitter):
        await emitter.finished("completed")
    assert [event.type for event in sent] == ["response.completed"]
