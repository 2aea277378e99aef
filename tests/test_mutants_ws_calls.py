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
from trio_websocket import CloseReason, ConnectionClosed

from prototype.api.costs import ALL_SWITCHES_OFF, ZERO_COSTS
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.engine.streaming import FaultPlan
from prototype.server import websocket
from prototype.server.app import drain
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
    accepted, completed = events[0], events[-1]
    assert accepted == {"type": "response.steer.accepted", "sequence_number": accepted["sequence_number"], "stream_id": LANE,
                        "steer": {"id": accepted["steer"]["id"], "previous_response_id": target}}
    calls = function_calls(completed["response"])
    assert completed["type"] == "response.completed" and len(calls) == 1
    assert await receive(conn, timeout=WAIT) == {
        "type": "response.steer.pending", "sequence_number": completed["sequence_number"] + 1, "stream_id": LANE,
        "reason": "waiting_for_required_input", "steer": accepted["steer"],
        "required_input": [{"type": "function_call_output", "call_id": calls[0]["call_id"], "name": calls[0]["name"]}],
    }
    return target, accepted["steer"], calls


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
    # The failed turn's record names the response its client saw created, though the turn returned none.
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [
        ("completed", kept), ("failed", target), ("error:previous_response_not_found", None)]


async def test_a_handler_bug_fails_the_connection_with_server_error_and_1011(autojump_clock, monkeypatch, caplog):
    from prototype.designs import chained

    async def broken(*args, **kwargs):
        await trio.sleep(1.0)
        raise KeyError("a bug")

    server = make_server()
    async with ws(server) as conn:
        monkeypatch.setattr(chained, "run_turn", broken)
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))  # queued: never started, the connection fails
        error = await receive(conn, timeout=WAIT)
        try:
            raise AssertionError(await receive(conn, timeout=WAIT))
        except ConnectionClosed as closed:
            reason = closed.reason
    assert error == {"type": "error", "status": 500, "error": {
        "type": "server_error", "code": "server_error", "message": "Internal error: KeyError.", "param": None}}
    assert (reason.code, reason.reason) == (1011, "internal error")
    # The operator's log names the failure, with its traceback.
    (logged,) = [r for r in caplog.records if r.name == "prototype.server.websocket"]
    assert (logged.getMessage(), logged.levelname, logged.exc_info[0]) == ("response handler failed", "ERROR", KeyError)
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [("error:server_error", None)]


async def test_a_cancelled_turn_empties_its_lanes_slot(autojump_clock, nursery):
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, api_key="alice") as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        kept = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]["id"]
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        target = (await until(conn, "response.output_text.delta", timeout=WAIT))[0]["response"]["id"]
        assert (await http.request("POST", f"/v1/responses/{target}/cancel", key="alice")).status == 200
        cancelled = (await until(conn, "response.cancelled", timeout=WAIT))[-1]
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE, previous_response_id=kept, input="go on"))
        not_found = await receive(conn, timeout=WAIT)
    assert cancelled["response"]["id"] == target
    assert (not_found["error"]["code"], not_found["stream_id"]) == ("previous_response_not_found", LANE)
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [
        ("completed", kept), ("cancelled", target), ("error:previous_response_not_found", None)]


async def test_a_write_that_fails_under_a_running_response_records_it_closed_and_stops_the_lanes_worker(autojump_clock, monkeypatch):
    """A connection whose write fails while the reader still waits (the peer vanished): the running
    response's record says `closed`, and its lane's worker stops, so the create queued behind it never runs."""
    original = websocket.WebSocketSession.send

    async def failing(self, event, stream_id=None):
        if event.type == "response.created":
            raise ConnectionClosed(CloseReason(1006, None))
        await original(self, event, stream_id)

    monkeypatch.setattr(websocket.WebSocketSession, "send", failing)
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        await quiet(conn)
    assert [(r["stream_id"], r["outcome"]) for r in server.records] == [(True, "closed")]


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


async def test_each_v1_rollout_of_a_connection_counts_only_its_own_appends(autojump_clock):
    server = make_server()
    async with ws(server, SUSPENDED) as conn:
        sizes = []
        for text in ("fix the bug", "and the next one"):
            event = create_event(text, metadata=TWO_TURNS)
            await send(conn, event)
            done = (await until(conn, "response.done", timeout=WAIT))[-1]
            append = {"type": "response.append", "input": outputs_for(function_calls(done["response"]), text * 3)}
            await send(conn, append)
            await until(conn, *TERMINALS, timeout=WAIT)
            sizes.append(frame_bytes(event) + frame_bytes(append))
    assert [(r["outcome"], r["appends"], r["request_bytes"]) for r in server.records] == [
        ("completed", 1, sizes[0]), ("completed", 1, sizes[1])]
    assert sizes[0] != sizes[1]


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


# --- keep_record, record_refusal, protocol_choices: the records ------------------------------------------


async def test_a_create_that_waited_for_its_lane_is_recorded_from_its_arrival_with_its_queue_time(autojump_clock):
    server = make_server()
    first, second = create_event(metadata=ONE_TURN, stream_id=LANE), create_event(metadata=ONE_TURN, stream_id=LANE, input="and again")
    async with ws(server) as conn:
        await trio.sleep(2.0)
        sent_at = trio.current_time()
        await send(conn, first)
        await send(conn, second)  # queued behind the first on its lane
        ends = [(await timed_until(conn, *TERMINALS, timeout=WAIT))[-1] for _ in range(2)]
    (first_end, _), (second_end, _) = ends
    assert [(r["started_at_s"], r["at_s"], r["phases_ms"]["queue"], r["request_bytes"]) for r in server.records] == [
        (sent_at, first_end, 0.0, frame_bytes(first)),
        (sent_at, second_end, round((first_end - sent_at) * 1000, 3), frame_bytes(second)),
    ]
    assert first_end > sent_at


async def test_a_refused_frame_is_recorded_with_its_code_and_param(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await trio.sleep(3.0)
        await send(conn, create_event(stream_id="bad lane"))
        assert (await receive(conn, timeout=WAIT))["error"]["code"] == "invalid_stream_id"
        await trio.sleep(1.0)
        await send(conn, {"type": "response.append", "input": []})
        assert (await receive(conn, timeout=WAIT))["error"]["code"] == "unknown_event_type"
    common = {"user_agent": "", "transport": "websocket", "design": "chained", "connection": 1, "response_id": None}
    assert list(server.records) == [
        {**common, "at_s": 3.0, "outcome": "error:invalid_stream_id", "param": "stream_id", "stream_id": True},
        {**common, "at_s": 4.0, "outcome": "error:unknown_event_type", "param": "type", "stream_id": False},
    ]


# --- steer, send_steer_event, send_refusals: the answers to response.steer ---------------------------------


def steer_failed(sequence_number: int, steer: dict, code: str, message: str, **lane: str) -> dict:
    return {"type": "response.steer.failed", "sequence_number": sequence_number, **lane, "steer": steer,
            "error": {"type": "invalid_request_error", "code": code, "message": message}}


async def test_a_steer_refused_at_once_has_no_id_and_is_numbered_in_its_targets_sequence_if_known(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await send(conn, steer("resp_unknown"))
        unknown = await receive(conn, timeout=WAIT)
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        before = await until(conn, "response.output_text.delta", timeout=WAIT)
        target = before[0]["response"]["id"]
        await send(conn, {"type": "response.steer", "previous_response_id": target, "input": ""})
        invalid = await receive(conn, timeout=WAIT)
    assert unknown == steer_failed(0, {"previous_response_id": "resp_unknown", "input": "keep it small"}, "response_not_found",
                                   "Response 'resp_unknown' is not available on this connection.")
    assert invalid == steer_failed(before[-1]["sequence_number"] + 1, {"previous_response_id": target, "input": ""},
                                   "invalid_input", "'input' must not be empty.", stream_id=LANE)


async def test_v1_refuses_a_steer_on_its_running_rollout_outside_its_sequence(autojump_clock):
    server = make_server()
    async with ws(server, SUSPENDED) as conn:
        await send(conn, create_event(metadata=TWO_TURNS))
        target = (await until(conn, "response.output_text.delta", timeout=WAIT))[0]["response"]["id"]
        await send(conn, steer(target))
        refused = (await until(conn, "response.steer.failed", timeout=WAIT))[-1]
        done = (await until(conn, "response.done", timeout=WAIT))[-1]
    assert refused == steer_failed(0, {"previous_response_id": target, "input": "keep it small"}, "steering_not_supported",
                                   "Steering is not supported by this protocol version.")
    assert done["response"]["status"] == "in_progress"  # the rollout went on, unsteered


# --- run_create under a drain: the session's busy count and the records of cut responses ------------------


async def drained(server, conn, grace: float) -> tuple[list[tuple[float, dict]], int]:
    """Drain `server` with `grace`: every event `conn` gets until the close, timed, and the close code."""
    seen = []
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as draining:
            draining.start_soon(drain, server, grace)
            try:
                while True:
                    seen.append((trio.current_time(), await receive(conn)))
            except ConnectionClosed as closed:
                return seen, closed.reason.code


async def test_a_drain_waits_for_the_connections_later_responses_on_every_lane(autojump_clock):
    # A connection whose first response ended: the drain waits for the one in flight now.
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN))
        await until(conn, *TERMINALS, timeout=WAIT)
        await send(conn, create_event(metadata=ONE_TURN))
        started_at = (await timed_until(conn, "response.created", timeout=WAIT))[-1][0]
        events, code = await drained(server, conn, 30.0)
    (ended_at, ended), (error_at, error) = events[-2], events[-1]
    assert (ended["type"], error["error"]["code"], code) == ("response.completed", "server_shutting_down", 1001)
    assert ended_at == error_at > started_at + 0.3  # the turn's 300 tokens decoded, then the drain's error at once
    # Two lanes in flight: the drain waits for the later one to end, not for the first.
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id="short"))
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:900"}, stream_id="long"))
        started_at = (await timed_until(conn, "response.created", timeout=WAIT))[-1][0]
        events, code = await drained(server, conn, 30.0)
    ends = [(at, e["stream_id"]) for at, e in events if e["type"] == "response.completed"]
    assert [lane for _, lane in ends] == ["short", "long"] and ends[1][0] - ends[0][0] > 0.5
    assert (events[-1][0], events[-1][1]["type"], code) == (ends[1][0], "error", 1001)
    assert [r["outcome"] for r in server.records] == ["completed", "completed"]


async def test_a_response_a_drain_cuts_past_its_grace_is_recorded_as_failed(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN))  # a lane whose response ended before the drain
        await until(conn, *TERMINALS, timeout=WAIT)
        await trio.sleep(1.0)
        drained_at = trio.current_time()
        await send(conn, create_event(model="sim-100", metadata={"testbed_workload": "fixed:1:100:10:400"}, stream_id=LANE))  # 4 s
        cut = (await until(conn, "response.created", timeout=WAIT))[-1]["response"]["id"]
        events, code = await drained(server, conn, 1.0)
    assert ([e["type"] for _, e in events][-2:], code) == (["response.failed", "error"], 1001)
    assert [(r["outcome"], r["at_s"], r["response_id"]) for r in list(server.records)[1:]] == [("failed", drained_at + 1.0, cut)]


async def test_a_drain_that_cuts_a_response_before_it_was_created_sends_no_terminal_event(autojump_clock):
    # Cut during its pre-inference work: the client never saw the response, so it gets no event of it,
    # only the drain's error and close.
    from prototype.api.costs import StageCost

    server = make_server(costs=attrs.evolve(ZERO_COSTS, validate=StageCost(fixed=5.0)))
    async with ws(server) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
        await trio.sleep(0.5)
        events, code = await drained(server, conn, 1.0)
    assert ([(e["type"], e["error"]["code"]) for _, e in events], code) == ([("error", "server_shutting_down")], 1001)
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [("cancelled", None)]
