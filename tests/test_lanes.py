"""`stream_id` lanes over one WebSocket (docs/protocol.md, Lanes): FIFO per lane, lanes side by side, their limits (each
lane's cache slot and forks across lanes: test_chained.py); each way a lane's response ends, answered on its lane and
recorded; the KV released."""

from __future__ import annotations

import json

import pytest
import trio
from support import DELAYED_LINK, TERMINALS, create_event, make_server, receive, send, timed_until, until, ws
from test_endpoints import cancel_at, connect
from test_steering import failed, steer
from trio_websocket import CloseReason, ConnectionClosed

from prototype.client.connect import InMemoryConnector
from prototype.client.lanes import open_multiplexed
from prototype.engine.streaming import FaultPlan
from prototype.server import websocket
from prototype.server.config import ServerConfig

SHORT = {"testbed_workload": "fixed:3:100:10:20:0.5"}
ONE_TURN = {"testbed_workload": "fixed:1:100:10:300"}  # the final answer: 300 tokens, 0.3 s at sim-1000
WAIT = 60.0  # virtual seconds: every wait below ends far sooner, and a hang fails at once
LANE = "agent"


async def collect(conn, count: int) -> list[tuple[float, dict]]:
    """(virtual time, event) until `count` terminal events or errors have arrived."""
    seen: list[tuple[float, dict]] = []
    while sum(e["type"] in TERMINALS or e["type"] == "error" for _, e in seen) < count:
        seen += await timed_until(conn, *TERMINALS)
    return seen


async def test_each_lane_is_fifo_lanes_run_side_by_side_and_events_echo_their_lane(autojump_clock):
    async with open_multiplexed(InMemoryConnector(make_server())) as mux:
        a, b, default = mux.lane("a"), mux.lane("b"), mux.lanes[None]
        start = trio.current_time()
        for lane in (a, a, b, default):
            await lane.send(create_event(metadata=SHORT))
        times: dict[str, list[float]] = {"a": [], "b": [], None: []}  # each response's created and end

        async def read(lane, name, responses):
            while responses:
                event = await lane.receive()
                assert event.get("stream_id") == name  # absent on the default lane
                if event["type"] == "response.created" or event["type"] in TERMINALS:
                    times[name].append(trio.current_time() - start)
                responses -= event["type"] in TERMINALS

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, a, "a", 2)
            nursery.start_soon(read, b, "b", 1)
            nursery.start_soon(read, default, None, 1)
    (a1_created, a1_done, a2_created, a2_done), (b_created, b_done), (d_created, d_done) = times["a"], times["b"], times[None]
    # Lanes start together and, the model's engine being shared but not saturated, take equally long.
    assert a1_created == b_created == d_created and a1_done == b_done == d_done
    # FIFO on a lane: the second create of lane a starts the instant the first one ends.
    assert a2_done > a2_created == a1_done


async def test_the_33rd_named_lane_and_malformed_ids_get_the_documented_codes_and_the_connection_keeps_serving(autojump_clock):
    server = make_server()
    # The longest id allowed is a lane: letters, numbers, underscores, hyphens and periods, at most 256 (WS guide).
    names = ["a" * 255 + ".", *[f"agent_{n}" for n in range(2, 34)]]
    async with ws(server) as conn:
        for name in names[:32]:  # the WS guide's 32 named lanes; the default lane is not counted
            await send(conn, create_event(stream_id=name, metadata=SHORT))
        await send(conn, create_event(metadata=SHORT))
        events = await collect(conn, 33)
        assert sorted(e.get("stream_id") or "" for _, e in events if e["type"] == "response.completed") == sorted(["", *names[:32]])
        await send(conn, create_event(stream_id=names[32]))
        refused = (await until(conn, *TERMINALS))[-1]
        # The WS guide's example error, word for word, tagged with the refused lane.
        assert refused == {
            "type": "error", "status": 400, "stream_id": "agent_33",
            "error": {"type": "invalid_request_error", "code": "websocket_stream_limit_reached", "param": "stream_id",
                      "message": "This WebSocket connection has reached its maximum number of distinct stream IDs (32). "
                                 "Reuse an existing stream_id or open a new WebSocket connection."}}
        await send(conn, create_event(stream_id="x" * 257))  # each malformed id's refusal: test_request_body.py
        malformed = (await until(conn, *TERMINALS))[-1]
        assert "stream_id" not in malformed and malformed["status"] == 400
        assert (malformed["error"]["code"], malformed["error"]["param"]) == ("invalid_stream_id", "stream_id")
        await send(conn, create_event(stream_id="agent_2", metadata=SHORT))  # an open lane still serves
        done = (await until(conn, *TERMINALS))[-1]
        assert (done["type"], done["stream_id"]) == ("response.completed", "agent_2")


@pytest.mark.parametrize("last", ["lane16", None], ids=["a 17th lane", "the default lane"])
async def test_the_17th_response_in_flight_on_any_lane_is_queued_until_one_of_the_16_ends(autojump_clock, last):
    server = make_server()
    async with ws(server) as conn:
        start = trio.current_time()
        for n in range(16):  # 16 lanes, one create each, all sent at once
            await send(conn, create_event(stream_id=f"lane{n}", metadata=SHORT))
        events = []
        while sum(e["type"] == "response.created" for _, e in events) < 16:
            events += await timed_until(conn, "response.created")
        await send(conn, create_event(metadata=SHORT, **({} if last is None else {"stream_id": last})))
        while sum(e["type"] in TERMINALS or e["type"] == "error" for _, e in events) < 17:
            events += await timed_until(conn, *TERMINALS)
    created = {e.get("stream_id"): t - start for t, e in events if e["type"] == "response.created"}
    completed = {e.get("stream_id"): t - start for t, e in events if e["type"] == "response.completed"}
    assert len(completed) == 17 and not [e for _, e in events if e["type"] == "error"]  # queued, never refused
    (pre_inference,) = {created[f"lane{n}"] for n in range(16)}  # the 16 start together
    # The 17th starts the instant the first of the 16 ends, not before: its pre-inference work follows that terminal event.
    first_end = min(completed[f"lane{n}"] for n in range(16))
    assert created[last] == pytest.approx(first_end + pre_inference, abs=1e-9) and first_end > pre_inference


async def test_a_full_lane_queue_refuses_on_that_lane_only(autojump_clock):
    async with ws(make_server(config=ServerConfig(max_queued_creates=1))) as conn:
        for _ in range(3):  # one runs, one waits, the third is refused
            await send(conn, create_event(stream_id="busy"))
        await send(conn, create_event(stream_id="quiet"))
        events = await collect(conn, 4)
    errors = [(e["stream_id"], e["error"]["code"]) for _, e in events if e["type"] == "error"]
    assert errors == [("busy", "too_many_queued_requests")]
    assert sorted(e.get("stream_id") for _, e in events if e["type"] == "response.completed") == ["busy", "busy", "quiet"]


def frame_bytes(event: dict) -> int:
    return len(json.dumps(event).encode())


async def quiet(conn, seconds: float = 5.0) -> None:
    """Nothing arrives for `seconds`."""
    with trio.move_on_after(seconds):
        raise AssertionError(await receive(conn))


async def kept_and_running(conn) -> tuple[str, str]:
    """A completed response on LANE, then the id of the next one once it streams text."""
    await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
    kept = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]["id"]
    await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE))
    return kept, (await until(conn, "response.output_text.delta", timeout=WAIT))[0]["response"]["id"]


async def assert_lane_slot_empty(conn, kept: str) -> None:
    """The lane's last response is not found (store: false): its cache slot is empty."""
    await send(conn, create_event(metadata=ONE_TURN, stream_id=LANE, previous_response_id=kept, input="go on"))
    not_found = await receive(conn, timeout=WAIT)
    assert (not_found["type"], not_found["error"]["code"], not_found["stream_id"]) == ("error", "previous_response_not_found", LANE)


async def test_an_engine_failure_fails_the_turn_returns_its_steers_and_empties_its_lanes_slot(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        kept, target = await kept_and_running(conn)
        server.api.engine.faults = FaultPlan()  # the next flush fails, before the message ends
        await send(conn, steer(target))
        events = await timed_until(conn, "response.steer.failed", timeout=WAIT)
        await assert_lane_slot_empty(conn, kept)
    (failed_at, failed), (refused_at, refused) = events[-2], events[-1]
    assert [e["type"] for _, e in events] == ["response.steer.accepted", *[e["type"] for _, e in events[1:-2]],
                                              "response.failed", "response.steer.failed"]
    assert failed["response"]["error"]["code"] == "server_error" and refused_at == failed_at
    assert refused == {
        "type": "response.steer.failed", "sequence_number": failed["sequence_number"] + 1, "stream_id": LANE,
        "steer": {"id": events[0][1]["steer"]["id"], "previous_response_id": target, "input": "keep it small"},
        "error": {"type": "invalid_request_error", "code": "response_not_active", "message": f"Response '{target}' failed."}}
    # The failed turn's record names the response its client saw created, though the turn returned none.
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [
        ("completed", kept), ("failed", target), ("error:previous_response_not_found", None)]


async def test_a_cancelled_turn_returns_its_steers_and_empties_its_lanes_slot(autojump_clock, nursery):
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, api_key="alice") as conn:
        kept, target = await kept_and_running(conn)
        await send(conn, steer(target))
        accepted = (await until(conn, "response.steer.accepted", timeout=WAIT))[-1]
        cancelled_at, reply = await cancel_at(http, target)
        events = await timed_until(conn, "response.steer.failed", timeout=WAIT)
        await quiet(conn, 30.0)  # nothing more: the steer rode no successor
        await assert_lane_slot_empty(conn, kept)
    (ended_at, ended), (refused_at, refused) = events[-2], events[-1]
    assert (ended["type"], ended["response"]["id"]) == ("response.cancelled", target) and reply.json() == ended["response"]
    assert failed(refused, "response_not_active", target, "keep it small", steer_id=accepted["steer"]["id"],
                  message=f"Response '{target}' failed.")
    assert refused["stream_id"] == LANE and refused["sequence_number"] == ended["sequence_number"] + 1
    assert ended_at == refused_at == cancelled_at
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [
        ("completed", kept), ("cancelled", target), ("error:previous_response_not_found", None)]


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
        with pytest.raises(ConnectionClosed) as closed:
            await receive(conn, timeout=WAIT)
    assert error == {"type": "error", "status": 500, "error": {
        "type": "server_error", "code": "server_error", "message": "Internal error: KeyError.", "param": None}}
    assert (closed.value.reason.code, closed.value.reason.reason) == (1011, "internal error")
    # The operator's log names the failure, with its traceback.
    (logged,) = [r for r in caplog.records if r.name == "prototype.server.websocket"]
    assert (logged.getMessage(), logged.levelname, logged.exc_info[0]) == ("response handler failed", "ERROR", KeyError)
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [("error:server_error", None)]


async def test_a_write_that_fails_under_a_running_response_records_it_closed_and_stops_the_lanes_worker(autojump_clock, monkeypatch):
    """The peer vanished: the running response's record says `closed`; the create queued behind it never runs."""
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


def held_kv(server) -> list:
    """The engine's KV entries held under a WebSocket connection's keys (a lane's: the connection's and its `stream_id`)."""
    return sorted(repr(key) for key in server.api.engine.kv if "chained" in (key[0], key[0][0]))


@pytest.mark.parametrize("network", [None, DELAYED_LINK], ids=["pipe", "rtt-20ms"])
async def test_a_closed_connection_releases_the_kv_of_every_lane(autojump_clock, network) -> None:
    server = make_server()
    async with ws(server, network=network) as conn:
        for stream_id in (None, "a"):
            await send(conn, create_event(metadata=ONE_TURN, **({} if stream_id is None else {"stream_id": stream_id})))
            await until(conn, "response.completed", timeout=WAIT)
        held = held_kv(server)
    with trio.fail_after(WAIT):
        while server.sessions:
            await trio.sleep(0.001)
    assert (len(held), held_kv(server)) == (2, [])

