"""The WebSocket session's create, injection and steering calls held to what a client sees: the
exact events and codes of each way a response ends, the records the server keeps of it, the lane
slot a failed turn leaves empty, and the steer and inject answers with their numbering
(docs/protocol.md, "Steering", "Inject", "Records"). In-process over memory streams under the
autojump clock, every wait bounded in virtual time so that a broken server fails at once instead of
hanging (tests/support.py). Written against the survivors of the mutation runs (docs/mutation.md)."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, timed_until, until, ws
from test_endpoints import connect
from trio_websocket import ConnectionClosed

from prototype.api.costs import ALL_SWITCHES_OFF, ZERO_COSTS
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.engine.streaming import FaultPlan
from prototype.server.config import ServerConfig

WAIT = 60.0  # virtual seconds: every wait below ends far sooner, and a hang fails at once
ONE_TURN = {"testbed_workload": "fixed:1:100:10:300"}  # the final answer: 300 tokens, 0.3 s at sim-1000
TWO_TURNS = {"testbed_workload": "fixed:2:100:10:300:0"}  # a client call, then the final answer
LANE = "agent"


def frame_bytes(event: dict) -> int:
    return len(json.dumps(event).encode())


def records_of(server, response_id: str | None) -> list[dict]:
    return [r for r in server.records if r.get("response_id") == response_id]


def steer(previous_response_id: str, text: str = "keep it small") -> dict:
    return {"type": "response.steer", "previous_response_id": previous_response_id, "input": text}


async def quiet(conn, seconds: float = 5.0) -> None:
    """Nothing arrives for `seconds`."""
    with trio.move_on_after(seconds):
        raise AssertionError(await receive(conn))


# --- run_create: the record of each outcome -------------------------------------------------------------


async def test_a_turn_leaves_one_record_with_its_client_its_times_its_bytes_and_its_usage(autojump_clock):
    server = make_server()
    event = create_event(metadata=ONE_TURN, stream_id=LANE)
    async with ws(server, include_timing=True) as conn:
        await trio.sleep(1.5)  # the record's times are the trio clock's, not times since the connection opened
        sent_at = trio.current_time()
        await send(conn, event)
        events = await timed_until(conn, *TERMINALS, timeout=WAIT)
    ended_at, done = events[-1]
    response = done["response"]
    (record,) = server.records
    assert record == {
        "user_agent": "", "transport": "websocket", "design": "chained", "connection": 1, "model": "sim-1000",
        "context": "full", "previous_response_id": None, "warmup": False, "stream": False, "stream_id": True, "store": False,
        "input_items": 1, "input_types": {"message": 1}, "tools": len(event["tools"]), "ignored_keys": [],
        "started_at_s": sent_at, "at_s": ended_at, "response_id": response["id"], "outcome": "completed", "appends": 0,
        "request_bytes": frame_bytes(event), "timing_requested": True,
        "phases_ms": response["testbed_timing"]["phases_ms"], "usage": response["usage"],
    }
    assert record["phases_ms"]["decode"] == 300.0  # 300 tokens at 1000 tokens/s


async def test_a_turn_refused_inside_its_lane_empties_that_lanes_slot_only(autojump_clock):
    """WS guide: a failed turn leaves the connection's cache slot empty; with lanes, that lane's."""
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN))
        home = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]["id"]
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        kept = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]["id"]
        # A full-context create (it continues nothing) whose input answers a call it never made.
        stray = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        refused_event = create_event(metadata=ONE_TURN, stream_id=LANE, input=stray)
        await send(conn, refused_event)
        error = await receive(conn, timeout=WAIT)
        # The lane's slot is empty: its last response is not found (store: false); the default lane's is.
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE, previous_response_id=kept, input="go on"))
        not_found = await receive(conn, timeout=WAIT)
        await send(conn, create_event(metadata=ONE_TURN, previous_response_id=home, input="go on"))
        continued = await until(conn, *TERMINALS, timeout=WAIT)
    assert error == {"type": "error", "status": 400, "stream_id": LANE, "error": {
        "type": "invalid_request_error", "code": "invalid_function_call_output",
        "message": error["error"]["message"], "param": error["error"]["param"]}}
    assert (not_found["type"], not_found["error"]["code"], not_found["stream_id"]) == ("error", "previous_response_not_found", LANE)
    assert continued[-1]["type"] == "response.completed"
    refused = [r for r in server.records if r["response_id"] is None]
    assert [(r["outcome"], r["usage"], r["request_bytes"]) for r in refused] == [
        ("error:invalid_function_call_output", None, frame_bytes(refused_event)),
        ("error:previous_response_not_found", None, frame_bytes(create_event(
            metadata=ONE_TURN, stream_id=LANE, previous_response_id=kept, input="go on"))),
    ]


async def pending_steer(conn) -> tuple[str, dict, list[dict]]:
    """A response on LANE that waits for its client call with a steer pending on it: (its id, the
    accepted steer, its calls)."""
    await send(conn, create_event(metadata=TWO_TURNS, stream_id=LANE))
    target = (await until(conn, "response.function_call_arguments.delta", timeout=WAIT))[0]["response"]["id"]
    await send(conn, steer(target))
    events = await until(conn, *TERMINALS, timeout=WAIT)
    accepted = events[0]
    assert accepted["type"] == "response.steer.accepted" and events[-1]["type"] == "response.completed"
    assert (await receive(conn, timeout=WAIT))["type"] == "response.steer.pending"
    return target, accepted["steer"], function_calls(events[-1]["response"])


async def test_a_continuation_refused_returns_its_claimed_steers_naming_the_code(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, accepted, calls = await pending_steer(conn)
        wrong = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        await send(conn, create_event(metadata=TWO_TURNS, stream_id=LANE, previous_response_id=target, input=wrong))
        error = await receive(conn, timeout=WAIT)
        returned = await receive(conn, timeout=WAIT)
        await quiet(conn)
    assert (error["type"], error["error"]["code"], error["stream_id"]) == ("error", "invalid_function_call_output", LANE)
    assert returned == {
        "type": "response.steer.failed", "sequence_number": returned["sequence_number"], "stream_id": LANE,
        "steer": {"id": accepted["id"], "previous_response_id": target, "input": "keep it small"},
        "error": {"type": "invalid_request_error", "code": "successor_creation_failed",
                  "message": "The continuation failed: invalid_function_call_output."},
    }
    assert [r["outcome"] for r in server.records] == ["completed", "error:invalid_function_call_output"]


async def test_an_engine_failure_fails_the_turn_returns_its_steers_and_empties_its_lanes_slot(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        kept = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]["id"]
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        target = (await until(conn, "response.output_text.delta", timeout=WAIT))[0]["response"]["id"]
        server.api.engine.faults = FaultPlan()  # the next flush fails, before the message ends
        await send(conn, steer(target))
        events = await timed_until(conn, "response.steer.failed", timeout=WAIT)
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE, previous_response_id=kept, input="go on"))
        not_found = await receive(conn, timeout=WAIT)
    (failed_at, failed), (refused_at, refused) = events[-2], events[-1]
    assert [e["type"] for _, e in events] == ["response.steer.accepted", *[e["type"] for _, e in events[1:-2]],
                                              "response.failed", "response.steer.failed"]
    assert failed["response"]["error"]["code"] == "engine_failure"
    assert refused == {
        "type": "response.steer.failed", "sequence_number": failed["sequence_number"] + 1, "stream_id": LANE,
        "steer": {"id": events[0][1]["steer"]["id"], "previous_response_id": target, "input": "keep it small"},
        "error": {"type": "invalid_request_error", "code": "response_not_active", "message": f"Response '{target}' failed."},
    }
    assert refused_at == failed_at
    assert (not_found["error"]["code"], not_found["stream_id"]) == ("previous_response_not_found", LANE)
    assert [r["outcome"] for r in server.records] == ["completed", "failed", "error:previous_response_not_found"]


async def test_a_handler_bug_fails_the_connection_with_server_error_and_1011(autojump_clock, monkeypatch):
    from prototype.designs import chained

    async def broken(*args, **kwargs):
        raise KeyError("a bug")

    server = make_server()
    async with ws(server) as conn:
        monkeypatch.setattr(chained, "run_turn", broken)
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        error = await receive(conn, timeout=WAIT)
        try:
            raise AssertionError(await receive(conn, timeout=WAIT))
        except ConnectionClosed as closed:
            reason = closed.reason
    assert error == {"type": "error", "status": 500, "error": {
        "type": "server_error", "code": "server_error", "message": "Internal error: KeyError.", "param": None}}
    assert (reason.code, reason.reason) == (1011, "internal error")
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [("error:server_error", None)]


# --- run_one: what each design is handed ------------------------------------------------------------------


async def test_a_v1_rollout_is_recorded_with_its_appends_and_their_bytes(autojump_clock):
    server = make_server()
    event = create_event(metadata=TWO_TURNS)
    async with ws(server, SUSPENDED, include_timing=True) as conn:
        await send(conn, event)
        done = (await until(conn, "response.done", timeout=WAIT))[-1]
        append = {"type": "response.append", "input": outputs_for(function_calls(done["response"]))}
        await send(conn, append)
        end = (await until(conn, *TERMINALS, timeout=WAIT))[-1]
    assert "testbed_timing" in done["response"] and end["type"] == "response.completed"
    (record,) = server.records
    assert (record["design"], record["response_id"], record["outcome"], record["appends"], record["request_bytes"],
            record["timing_requested"]) == ("suspended", end["response"]["id"], "completed", 1,
                                            frame_bytes(event) + frame_bytes(append), True)
    # The rollout's log: both segments' spans (each segment's timing on the wire has its own only).
    segments = [done["response"]["testbed_timing"]["phases_ms"], end["response"]["testbed_timing"]["phases_ms"]]
    assert record["phases_ms"]["decode"] == sum(s["decode"] for s in segments) == 607.0
    assert record["phases_ms"]["prefill"] == round(sum(s["prefill"] for s in segments), 3)


async def test_a_v1_rollout_waits_for_its_append_as_long_as_the_servers_suspension_ttl(autojump_clock):
    server = make_server(config=ServerConfig(suspension_ttl=7.0))
    async with ws(server, SUSPENDED) as conn:
        await send(conn, create_event(metadata=TWO_TURNS))
        paused_at, _ = (await timed_until(conn, "response.done", timeout=WAIT))[-1]
        ended_at, ended = (await timed_until(conn, *TERMINALS, timeout=WAIT))[-1]
    assert (ended["type"], ended_at - paused_at) == ("response.failed", 7.0)


# --- after_response: the automatic successor --------------------------------------------------------------


async def test_a_steer_on_a_warm_up_rides_a_successor_that_generates(autojump_clock):
    """A warm-up (`generate: false`) is steerable while its post-inference work runs; its automatic
    successor inherits its settings but generates: it carries the steering message to the model."""
    server = make_server(costs=attrs.evolve(ZERO_COSTS, post=1.0))
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE, generate=False))
        target = (await until(conn, "response.created", timeout=WAIT))[-1]["response"]["id"]
        await send(conn, steer(target))
        warm_up = await until(conn, *TERMINALS, timeout=WAIT)
        successor = await until(conn, *TERMINALS, timeout=WAIT)
    assert [e["type"] for e in warm_up] == ["response.steer.accepted", "response.completed"]
    assert warm_up[-1]["response"]["output"] == []
    created, done = successor[0], successor[-1]
    assert (created["type"], created["response"]["previous_response_id"]) == ("response.created", target)
    assert [e["type"] for e in successor[1:3]] == ["response.in_progress", "response.output_item.added"]
    assert (done["type"], [item["type"] for item in done["response"]["output"]]) == ("response.completed", ["message"])
    (record,) = records_of(server, created["response"]["id"])
    assert (record["warmup"], record["input_types"], record["request_bytes"]) == (False, {"message": 1}, 0)


# --- run_one: what each design is handed (continued) --------------------------------------------------------


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_a_stored_websocket_response_belongs_to_the_connections_key(autojump_clock, nursery, design):
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, design, api_key="alice") as conn:
        await send(conn, create_event(metadata=ONE_TURN, store=True))
        done = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]
    assert (await http.request("GET", f"/v1/responses/{done['id']}", key="alice")).json()["id"] == done["id"]
    assert (await http.request("GET", f"/v1/responses/{done['id']}", key="bob")).status == 404


async def test_the_servers_cache_switches_reach_a_websocket_turn(autojump_clock):
    """Switch 4 off: post-inference runs before the terminal event instead of after it."""
    costs = attrs.evolve(ZERO_COSTS, post=1.0)
    ends = []
    for config in (ServerConfig(switches=ALL_SWITCHES_OFF), ServerConfig()):
        async with ws(make_server(costs=costs, config=config)) as conn:
            await send(conn, create_event(metadata=ONE_TURN))
            events = await timed_until(conn, *TERMINALS, timeout=WAIT)
        (last_item_at, _), (ended_at, _) = events[-2], events[-1]
        ends.append(ended_at - last_item_at)
    assert ends == [1.0, 0.0]
