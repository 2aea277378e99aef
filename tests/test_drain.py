"""Faults around the v1 suspension and how the server closes a connection (SIGTERM drain, a close mid-response):
every task released, no KV left, and per response one terminal event with gapless numbering."""

from __future__ import annotations

import json
import signal
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import wsproto
import wsproto.events
from support import (
    TERMINALS,
    DelayedConnector,
    closed_after,
    create_event,
    events_by_response,
    make_server,
    receive,
    send,
    timed_until,
    until,
    ws,
)
from test_bad_input import LINKS, ONE_TURN, calls_of, create, one_way, output, session_kv, turn
from test_faults import PipeConnector, raw_ws, server_tasks_end
from test_http import Link, RawClient, open_client
from trio_websocket import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from prototype.api.costs import ZERO_COSTS, StageCost
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED
from prototype.designs.emitter import Emitter
from prototype.designs.sampling import SamplingLoop
from prototype.protocol import errors
from prototype.server.app import ResponsesServer, drain
from prototype.server.config import ServerConfig
from prototype.server.websocket import CLOSE_HANDSHAKE_SECONDS

LONG = "fixed:1:50:10:400:0"  # one turn of 400 output tokens: 4 s at sim-100
LONG_V1 = "fixed:2:50:10:400:0"  # the same, then a pause, then again
TURN_300 = {"testbed_workload": "fixed:1:100:10:300"}  # 300 output tokens: 0.3 s at sim-1000


def connector_for(link: str, server, nursery: trio.Nursery):
    return PipeConnector(server, nursery) if link == "pipe" else DelayedConnector(server, nursery)


def assert_no_event_lost(events: list[dict[str, Any]]) -> None:
    """Per response: numbered 0, 1, 2, ... and exactly one terminal event, the last of its events."""
    for response_id, seen in events_by_response(events).items():
        assert [e["sequence_number"] for e in seen] == list(range(len(seen))), response_id
        assert [e["type"] in TERMINALS for e in seen].count(True) == 1 and seen[-1]["type"] in TERMINALS, response_id


# --- disconnects around the suspension -----------------------------------------------------------


@pytest.mark.parametrize("moment", ["during response.done", "during an append", "with creates queued"])
async def test_a_disconnect_around_the_suspension_releases_everything(autojump_clock, nursery, monkeypatch, moment: str) -> None:
    server = make_server()
    hold = trio.Event()  # the server is parked at the moment under test
    drop = trio.Event()  # the client has dropped its end

    def park(original):
        async def parked(self, *args):
            hold.set()
            await drop.wait()
            await trio.sleep(0.01)  # the server goes on after the drop, onto a dead stream
            return await original(self, *args)
        return parked

    if moment == "during response.done":
        monkeypatch.setattr(Emitter, "paused", park(Emitter.paused))
    elif moment == "during an append":
        monkeypatch.setattr(SamplingLoop, "take_new_items", park(SamplingLoop.take_new_items))
    async with trio.open_nursery() as server_side:
        async with raw_ws(PipeConnector(server, server_side), SUSPENDED) as (conn, stream):
            await send(conn, create())
            if moment == "during an append":
                done = (await until(conn, "response.done"))[-1]["response"]
                await send(conn, {"type": "response.append", "input": [output(calls_of(done)[0])]})
            elif moment == "with creates queued":
                await until(conn, "response.done")
                for _ in range(3):
                    await send(conn, create(metadata={"testbed_workload": ONE_TURN}))
                hold.set()
            with trio.fail_after(5):
                await hold.wait()
            (session,) = server.sessions
            assert session.busy
            await stream.aclose()  # abrupt: no close frame
            drop.set()
            await server_tasks_end(server_side, server, limit=1.0)
    assert session_kv(server) == {} and server.sessions == set() and server.connections == 0
    assert session.slot.current is None
    assert [r["outcome"] for r in server.records] == ["cancelled"]  # the queued creates never started


# --- the drain (SIGTERM) ---------------------------------------------------------------------------


@pytest.mark.parametrize("link", LINKS)
async def test_drain_ends_every_response_with_a_terminal_event_then_closes_1001(autojump_clock, nursery, link: str) -> None:
    server = make_server()
    async with trio.open_nursery() as server_side:
        connector = connector_for(link, server, server_side)
        async with raw_ws(connector, CHAINED) as (v2, _), raw_ws(connector, SUSPENDED) as (v1_paused, _), raw_ws(connector, SUSPENDED) as (v1_streaming, _), raw_ws(connector, CHAINED) as (idle, _):
            await send(v2, create(model="sim-100", metadata={"testbed_workload": LONG}))
            await send(v2, create(metadata={"testbed_workload": ONE_TURN}))  # queued: never starts
            paused = await turn(v1_paused, create())
            await send(v1_streaming, create(model="sim-100", metadata={"testbed_workload": LONG_V1}))
            first = [await receive(v2), await receive(v1_streaming)]
            assert [e["type"] for e in first] == ["response.created"] * 2
            drained_at = trio.current_time()
            async with trio.open_nursery() as draining:
                draining.start_soon(drain, server, 30.0)
                (v2_events, v2_code, _), (v1p_events, v1p_code, _), (v1s_events, v1s_code, _), (idle_events, idle_code, _) = [
                    await closed_after(conn) for conn in (v2, v1_paused, v1_streaming, idle)]
        assert trio.current_time() - drained_at < 5.0  # the 4 s turns finished; the grace was not needed
        await server_tasks_end(server_side, server)
    assert (v2_code, v1p_code, v1s_code, idle_code) == (1001, 1001, 1001, 1001)
    # v2: the turn in flight finishes; the queued create never starts.
    assert v2_events[-2]["type"] == "response.completed" and [e["type"] for e in v2_events].count("response.created") == 0
    assert_no_event_lost(first[:1] + v2_events[:-1])
    # v1 paused: fails at once, with the drain's message (the schema's code); the drain's code follows in the error.
    assert [e["type"] for e in v1p_events] == ["response.failed", "error"]
    assert v1p_events[0]["response"]["error"] == SHUTTING_DOWN
    assert_no_event_lost(paused + v1p_events[:-1])
    # v1 streaming: streams its segment to the end, then fails where it would pause.
    assert v1s_events[-2]["type"] == "response.failed" and v1s_events[-2]["response"]["error"] == SHUTTING_DOWN
    assert "response.function_call_arguments.done" in [e["type"] for e in v1s_events]
    assert_no_event_lost(first[1:] + v1s_events[:-1])
    for events in (v2_events, v1p_events, v1s_events, idle_events):
        assert events[-1] == closing_error("drain")
    assert session_kv(server) == {} and server.sessions == set() and server.connections == 0


# What a response the drain cuts short fails with: the schema's code, the drain's message.
SHUTTING_DOWN = {"code": "server_error", "message": "The server is shutting down; retry on a new connection."}


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("kind", ["turn", "warm-up"])
async def test_drain_past_its_grace_fails_the_response_in_flight(autojump_clock, link: str, kind: str) -> None:
    server = make_server()
    async with trio.open_nursery() as server_side:
        async with raw_ws(connector_for(link, server, server_side), CHAINED) as (conn, _):
            if kind == "turn":
                await send(conn, create(model="sim-100", metadata={"testbed_workload": LONG}))  # 4 s
            else:  # a long prefill: a warm-up sends `response.created`, then nothing until its prefill ends
                await send(conn, create(model="sim-100", generate=False, input="fix the bug " * 40000))
            created = await receive(conn)
            drained_at = trio.current_time()
            async with trio.open_nursery() as draining:
                draining.start_soon(drain, server, 1.0)
                events, code, _ = await closed_after(conn)
                closed_at = trio.current_time()
            # The grace, then the cut, which reaches the client one way later; the drain ends when
            # the client's close frame is back, a round trip after the cut.
            assert closed_at - drained_at == pytest.approx(1.0 + one_way(link), abs=1e-6)
            assert trio.current_time() - drained_at == pytest.approx(1.0 + 2 * one_way(link), abs=1e-6)
        await server_tasks_end(server_side, server)
    assert (code, created["type"], events[-1]["type"]) == (1001, "response.created", "error")
    failed = events[-2]
    assert failed["type"] == "response.failed" and (kind == "turn" or failed["sequence_number"] == 1)
    # The response as it was created, failed with the drain's reason (the snapshot the server kept).
    assert failed["response"] == {**created["response"], "status": "failed", "error": SHUTTING_DOWN}
    assert_no_event_lost([created, *events[:-1]])
    assert session_kv(server) == {}


async def test_drain_past_its_grace_fails_each_lanes_response_on_its_own_lane(autojump_clock) -> None:
    # A multiplexing client routes events by `stream_id`: the failure must name the cut response's lane.
    server = make_server()
    async with trio.open_nursery() as server_side:
        async with raw_ws(PipeConnector(server, server_side), CHAINED) as (conn, _):
            # A lane whose response ended before the drain has nothing left to cut.
            await send(conn, create(model="sim-100", metadata={"testbed_workload": "fixed:1:50:10:1"}, stream_id="done"))
            for lane in ("a", "b"):
                await send(conn, create(model="sim-100", metadata={"testbed_workload": LONG}, stream_id=lane))  # 4 s each
            await send(conn, create(model="sim-100", metadata={"testbed_workload": LONG}))  # and the default lane
            before: list[dict[str, Any]] = []
            while [e["type"] for e in before].count("response.created") < 4 or before[-1]["type"] != "response.completed":
                before.append(await receive(conn))
            drained_at = trio.current_time()
            async with trio.open_nursery() as draining:
                draining.start_soon(drain, server, 1.0)
                events, code, _ = await closed_after(conn)
        await server_tasks_end(server_side, server)
    assert (code, [e.get("stream_id") for e in before if e["type"] == "response.completed"]) == (1001, ["done"])
    created = [e for e in before if e["type"] == "response.created" and e.get("stream_id") != "done"]
    lane_of = {e["response"]["id"]: e.get("stream_id") for e in created}
    assert set(lane_of.values()) == {"a", "b", None}
    # Each cut response is recorded as failed, when the grace ended.
    cut = [r for r in server.records if r["outcome"] != "completed"]
    assert sorted((r["outcome"], r["at_s"], r["response_id"]) for r in cut) == sorted(("failed", drained_at + 1.0, r) for r in lane_of)
    failures = [e for e in events if e["type"] == "response.failed"]
    assert sorted(e["response"]["id"] for e in failures) == sorted(lane_of)
    for event in failures:
        assert event.get("stream_id") == lane_of[event["response"]["id"]], event
        assert event["response"]["status"] == "failed" and event["response"]["error"] == SHUTTING_DOWN
    # Per lane, the cut response's events run on without a gap and end with its failure.
    for lane in lane_of.values():
        on_lane = [e for e in before + events[:-1] if e.get("stream_id") == lane]
        assert_no_event_lost(on_lane)
        assert on_lane[-1]["type"] == "response.failed"
    assert session_kv(server) == {}


# --- the drain of a WebSocket connection: its error and close, in the session's own nursery ----------------

@pytest.mark.parametrize("link", LINKS)
async def test_a_drain_closes_an_open_connection_with_its_error_and_1001(autojump_clock, link: str) -> None:
    server = make_server()
    async with ws(server, network=LINKS[link]) as conn:
        await trio.sleep(1.0)
        drained_at = trio.current_time()
        async with trio.open_nursery() as draining:
            draining.start_soon(drain, server, 5.0)
            events, code, reason = await closed_after(conn)
            assert trio.current_time() == pytest.approx(drained_at + one_way(link), abs=1e-9)  # at once: nothing is in flight
    assert (events, code, reason) == ([closing_error("drain")], 1001, "server shutting down")
    # A connection whose handshake raced the drain is closed the same way.
    async with ws(DrainDuringHandshake(ApiService(costs=ZERO_COSTS), ServerConfig()), network=LINKS[link]) as conn:
        assert await closed_after(conn) == ([closing_error("drain")], 1001, "server shutting down")


class DrainDuringHandshake(ResponsesServer):
    def check_auth(self, headers):  # the drain starts while this connection's handshake is read
        self.draining = True
        return super().check_auth(headers)


async def test_a_drain_that_reaches_a_session_already_over_does_nothing(autojump_clock) -> None:
    """A session whose run returned (no nursery), or whose nursery closed before its run returned, starts no
    close: trio would refuse the task ("Nursery is closed to new arrivals"), taking serve's SIGTERM path down."""
    server = make_server()
    async with ws(server) as conn:
        await trio.sleep(1.0)
        (session,) = server.sessions
    with trio.fail_after(100):
        while server.sessions:
            await trio.sleep(0.1)
    reason = errors.server_shutting_down()
    session.shut_down(reason, 1001, "server shutting down", 0.0)
    assert (session.shutdown, session.nursery, conn.closed.code) == ((reason, 1001, "server shutting down", 0.0), None, 1000)
    async with trio.open_nursery() as ended:
        pass
    session.nursery = ended
    session.shut_down(reason, 1001, "server shutting down", 0.0)  # raises nothing


async def drained(server, conn, grace: float) -> tuple[list[tuple[float, dict]], int]:
    """Drain `server` with `grace`: every event `conn` gets until the close, timed, and the close code."""
    seen = []
    with trio.fail_after(100):
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
        await send(conn, create_event(metadata=TURN_300))
        await until(conn, *TERMINALS, timeout=100)
        await send(conn, create_event(metadata=TURN_300))
        started_at = (await timed_until(conn, "response.created", timeout=100))[-1][0]
        events, code = await drained(server, conn, 30.0)
    (ended_at, ended), (error_at, error) = events[-2], events[-1]
    assert (ended["type"], error["error"]["code"], code) == ("response.completed", "server_shutting_down", 1001)
    assert ended_at == error_at > started_at + 0.3  # the turn's 300 tokens decoded, then the drain's error at once
    # Two lanes in flight: the drain waits for the later one to end, not for the first.
    server = make_server()
    async with ws(server) as conn:
        await send(conn, create_event(metadata=TURN_300, stream_id="short"))
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:900"}, stream_id="long"))
        started_at = (await timed_until(conn, "response.created", timeout=100))[-1][0]
        events, code = await drained(server, conn, 30.0)
    ends = [(at, e["stream_id"]) for at, e in events if e["type"] == "response.completed"]
    assert [lane for _, lane in ends] == ["short", "long"] and ends[1][0] - ends[0][0] > 0.5
    assert (events[-1][0], events[-1][1]["type"], code) == (ends[1][0], "error", 1001)
    assert [r["outcome"] for r in server.records] == ["completed", "completed"]


async def test_a_drain_that_cuts_a_response_before_it_was_created_sends_no_terminal_event(autojump_clock):
    # Cut during its pre-inference work: the client never saw the response, only the drain's error and close.
    server = make_server(costs=attrs.evolve(ZERO_COSTS, validate=StageCost(fixed=5.0)))
    async with ws(server) as conn:
        await send(conn, create_event(metadata=TURN_300, stream_id="agent"))
        await trio.sleep(0.5)
        events, code = await drained(server, conn, 1.0)
    assert ([(e["type"], e["error"]["code"]) for _, e in events], code) == ([("error", "server_shutting_down")], 1001)
    assert [(r["outcome"], r["response_id"]) for r in server.records] == [("cancelled", None)]


# --- the drain of HTTP connections ----------------------------------------------------------------------


async def post_stream(client: RawClient, metadata: dict[str, str]) -> list[dict[str, Any]]:
    """A `stream: true` create; every SSE event of the answer, read to its end."""
    data = json.dumps({"model": "sim-100", "input": "go", "stream": True, "metadata": metadata}).encode()
    reply = await client.request(body=data)
    assert (reply.status, reply.headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    return [json.loads(line[6:]) for line in reply.body.split(b"\n") if line.startswith(b"data: ")]


def stream_in_background(nursery: trio.Nursery, client: RawClient) -> dict[str, Any]:
    """POST the long streamed response in a task of its own; the dict gets its `events` and `ended_at`."""
    seen: dict[str, Any] = {}

    async def stream() -> None:
        seen["events"] = await post_stream(client, {"testbed_workload": LONG})
        seen["ended_at"] = trio.current_time()

    nursery.start_soon(stream)
    return seen


async def test_a_drain_past_its_grace_cuts_the_http_stream_with_a_flat_error(autojump_clock, nursery) -> None:
    server = make_server()
    seen = stream_in_background(nursery, open_client(nursery, server))
    await trio.sleep(1.0)
    with trio.fail_after(100):
        await drain(server, 0.5)
    assert (trio.current_time(), seen["ended_at"]) == (1.5, 1.5)
    events = seen["events"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1] == {"type": "error", "sequence_number": len(events) - 1, "code": "server_shutting_down",
                          "message": "The server is shutting down; retry on a new connection.", "param": None}


@pytest.mark.parametrize("link", LINKS)
async def test_a_drain_lets_an_http_stream_finish_closes_idle_keep_alives_and_refuses_new_connections(autojump_clock, nursery, link) -> None:
    server = make_server()
    connect = Link(nursery, server, LINKS[link]).connect
    idle, streaming = await connect(), await connect()
    assert (await idle.request("GET", "/v1/models", content_type=None)).status == 200
    started_at = trio.current_time()
    seen = stream_in_background(nursery, streaming)
    await trio.sleep(1.0)  # mid-stream
    assert server.http_in_flight
    async with trio.open_nursery() as draining:
        draining.start_soon(drain, server, 30.0)
        await trio.sleep(0.1)
        assert (await (await connect()).request(body=b"")).status == 503
        assert await idle.server_closed()  # the idle keep-alive connection was closed at once
    drained_at = trio.current_time()
    await trio.sleep(1.0)
    # The response's 4 s of decode and its prefill, sent and answered one way each: the drain returns as its stream ends.
    assert seen["ended_at"] == pytest.approx(drained_at + one_way(link), abs=1e-9)
    assert drained_at == pytest.approx(started_at + 4.0107 + one_way(link), abs=1e-4)
    assert seen["events"][-1]["type"] == "response.completed"
    assert_no_event_lost(seen["events"])
    assert (server.connections, server.http_in_flight, server.http_idle) == (0, set(), set())


# --- the close's error event; a client that never answers the close ------------------------------------------

def closing_error(close: str, lifetime_minutes: float = 0.2) -> dict[str, Any]:
    """The `error` event a close sends before its close frame."""
    if close == "drain":
        return {"type": "error", "status": 503, "error": {"type": "server_error", "code": errors.SERVER_SHUTTING_DOWN,
                "message": "The server is shutting down; retry on a new connection.", "param": None}}
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": errors.CONNECTION_LIMIT_REACHED, "message":
            f"Responses websocket connection limit reached ({lifetime_minutes:g} minutes). Create a new websocket connection to continue.", "param": None}}


@pytest.mark.parametrize("link", LINKS)
async def test_a_client_that_never_answers_the_close_is_dropped_a_close_handshake_after_the_limit(autojump_clock, link: str) -> None:
    """The server waits `CLOSE_HANDSHAKE_SECONDS` for its close frame, then ends the connection (RFC 6455 §7.1.1)."""
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    protocol = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    async with InMemoryConnector(server, LINKS[link]).open_stream() as client:
        await client.send_all(protocol.send(wsproto.events.Request(host="testbed", target="/v1/responses",
                                                                    extra_headers=[(b"authorization", b"Bearer k")])))
        data = b""
        with trio.fail_after(100):
            while b"\r\n\r\n" not in data:
                data += await client.receive_some()
            protocol.receive_data(data)
            assert isinstance(next(protocol.events()), wsproto.events.AcceptConnection)
            while chunk := await client.receive_some():  # it reads, and sends nothing more: no close frame
                protocol.receive_data(chunk)
        eof_at = trio.current_time()
    await trio.testing.wait_all_tasks_blocked()
    # The limit counts from the accept, one way after 0; the stream ends when the server's wait for the
    # close frame ends, `CLOSE_HANDSHAKE_SECONDS` later.
    assert eof_at == pytest.approx(one_way(link) + 12.0 + CLOSE_HANDSHAKE_SECONDS, abs=1e-9)
    assert not server.sessions and not server.connections
    assert [(type(e), getattr(e, "data", None), getattr(e, "code", None), getattr(e, "reason", None)) for e in protocol.events()] == [
        (wsproto.events.TextMessage, json.dumps(closing_error("limit"), separators=(",", ":")), None, None),
        (wsproto.events.CloseConnection, None, 1000, "connection limit reached"),
    ]


async def test_a_client_that_reads_nothing_is_dropped_a_close_handshake_after_the_limit(autojump_clock, nursery) -> None:
    """Its socket takes nothing (a lockstep stream), so not even the limit's error is written: the session
    ends `CLOSE_HANDSHAKE_SECONDS` after the limit all the same."""
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    client, server_end = trio.testing.lockstep_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    protocol = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with trio.fail_after(100):
        await client.send_all(protocol.send(wsproto.events.Request(host="testbed", target="/v1/responses",
                                                                    extra_headers=[(b"authorization", b"Bearer k")])))
        head = b""
        while b"\r\n\r\n" not in head:  # the upgrade's answer, and nothing after it
            head += await client.receive_some(1)
    await trio.sleep(16.9)
    with trio.fail_after(0.2):  # a session still open then is held for ever
        while server.sessions:
            await trio.sleep(0.001)
    assert trio.current_time() == pytest.approx(12.0 + CLOSE_HANDSHAKE_SECONDS, abs=1e-3)


def test_sigterm_drains_the_real_server(cli_server) -> None:
    server = cli_server("--costs", "zero")
    headers = {"Authorization": "Bearer k", "OpenAI-Beta": BETA[CHAINED]}
    with ws_connect(f"ws://127.0.0.1:{server.port}/v1/responses", additional_headers=headers, open_timeout=10) as conn:
        conn.send(json.dumps(create(model="sim-200", metadata={"testbed_workload": LONG})))  # 2 s of decode
        assert json.loads(conn.recv(timeout=10))["type"] == "response.created"
        server.proc.send_signal(signal.SIGTERM)
        events = []
        try:
            while True:
                events.append(json.loads(conn.recv(timeout=20)))
        except Exception as exc:  # the close
            close_code = getattr(getattr(exc, "rcvd", None), "code", None)
    assert (close_code, [e["type"] for e in events][-2:], events[-1]["error"]["code"]) == (
        1001, ["response.completed", "error"], errors.SERVER_SHUTTING_DOWN)
    server.proc.wait(timeout=20)
    code, out, err = server.stop()
    assert code == 0 and "drained" in out, err
