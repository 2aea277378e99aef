"""A WebSocket session's reader, dispatch, lifetime and close held to what a client sees: the exact
`error` of each refused frame and the lane it names, the frame read after it, the bytes and appends
in the client records, the arrival time a response's modeled work starts from, the close code and
reason of a malformed `response.inject`, of the lifetime limit and of a drain (docs/protocol.md,
"Errors", "Limits"). In-process over memory streams, on a zero-latency pipe and on a link with delay,
under the autojump clock; every wait is bounded in virtual time, so a hung server fails a test at
once. Written against the survivors of the mutation runs (docs/mutation.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
import trio_websocket
import wsproto
import wsproto.events
from support import DELAYED_LINK, create_event, make_server
from test_inject import beta_ws

from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED
from prototype.protocol import codec, errors
from prototype.server.app import ResponsesServer, drain
from prototype.server.config import ServerConfig
from prototype.server.websocket import CLOSE_HANDSHAKE_SECONDS

WAIT = 100.0  # virtual seconds: every wait of these tests ends far sooner, and a hang fails at once
LINKS = {"pipe": None, "rtt-20ms": DELAYED_LINK}
ONE_TURN = {"testbed_workload": "fixed:1:50:10:5:0"}
TWO_TURNS = {"testbed_workload": "fixed:2:50:10:5:0"}
THREE_TURNS = {"testbed_workload": "fixed:3:50:10:5:0"}


@asynccontextmanager
async def opened(server, design: str = CHAINED, *, multi_agent: bool = False, network=None) -> AsyncIterator[Any]:
    """A client WebSocket to `server` for `design` (with the multi-agent beta if asked) over `network`
    (None: a zero-latency pipe)."""
    beta = BETA[design] + (", responses_multi_agent=v1" if multi_agent else "")
    with trio.fail_after(WAIT):
        async with beta_ws(server, beta, network) as conn:
            yield conn


async def send(conn, frame: dict | str | bytes) -> None:
    await conn.send_message(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))


async def receive(conn) -> dict:
    with trio.fail_after(WAIT):
        return json.loads(await conn.get_message())


async def until(conn, *types: str) -> list[tuple[float, dict]]:
    """Every event, with its arrival time, up to and including the first of `types`."""
    seen = []
    with trio.fail_after(WAIT):
        while True:
            event = json.loads(await conn.get_message())
            seen.append((trio.current_time(), event))
            if event["type"] in types:
                return seen


async def closed_after(conn) -> tuple[list[dict], int, str]:
    """The events up to the server's close, and its close code and reason."""
    events = []
    with trio.fail_after(WAIT), pytest.raises(trio_websocket.ConnectionClosed) as closed:
        while True:
            events.append(json.loads(await conn.get_message()))
    return events, closed.value.reason.code, closed.value.reason.reason


def error(code: str, message: str, param: str | None = None, **extra: Any) -> dict:
    """The WebSocket `error` event of a refusal (docs/protocol.md)."""
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param},
            **extra}


def calls_of(response: dict) -> list[str]:
    return [item["call_id"] for item in response["output"] if item["type"] == "function_call"]


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def one_way(link: str) -> float:
    return 0.0 if LINKS[link] is None else LINKS[link].one_way_delay


def refusal_record(code: str, param: str | None, design: str = CHAINED, at: float = 0.0) -> dict:
    return {"user_agent": "", "transport": "websocket", "design": design, "connection": 1, "at_s": at, "response_id": None,
            "outcome": f"error:{code}", "param": param, "stream_id": param == "stream_id"}


# --- the reader: a refused frame, the next frame, the lane a refusal names -------------------------------


NOT_JSON = error("invalid_json", "The frame is not valid JSON: Expecting value: line 1 column 1 (char 0).")


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_a_frame_that_is_no_event_is_refused_and_the_next_one_is_served(autojump_clock, design: str, link: str) -> None:
    server = make_server()
    async with opened(server, design, network=LINKS[link]) as conn:
        await send(conn, "not json")
        assert await receive(conn) == NOT_JSON
        await send(conn, create_event(metadata=ONE_TURN))
        events = await until(conn, "response.completed")
    assert [e["type"] for _, e in events][:2] == ["response.created", "response.in_progress"]
    assert list(server.records)[0] == refusal_record("invalid_json", None, design, at=3 * one_way(link))


@pytest.mark.parametrize("link", LINKS)
async def test_a_refused_create_on_a_lane_names_its_lane(autojump_clock, link: str) -> None:
    server = make_server(config=ServerConfig(max_streams=1, max_queued_creates=1))
    async with opened(server, network=LINKS[link]) as conn:
        for stream_id in ("a", "a", "a", "b"):  # one runs, one waits, the third is one too many; "b" is a lane too many
            await send(conn, create_event(metadata=ONE_TURN, stream_id=stream_id))
        await send(conn, create_event(metadata=ONE_TURN, stream_id="c", multi_agent={"enabled": True}))
        errors = [event for _, event in await until(conn, "response.completed") if event["type"] == "error"]
        errors += [event for _, event in await until(conn, "response.completed") if event["type"] == "error"]
    assert errors == [
        error("too_many_queued_requests", "More than 1 response.create requests are waiting on this lane.", stream_id="a"),
        error("websocket_stream_limit_reached", "This WebSocket connection has reached its maximum number of distinct stream IDs (1). "
              "Reuse an existing stream_id or open a new WebSocket connection.", "stream_id", stream_id="b"),
        error("unsupported_parameter", "'multi_agent' needs the 'OpenAI-Beta: responses_multi_agent=v1' header on the connection.",
              "multi_agent", stream_id="c"),
    ]
    assert [r["outcome"] for r in server.records if r["response_id"] is None] == [
        "error:too_many_queued_requests", "error:websocket_stream_limit_reached", "error:unsupported_parameter"]


async def test_a_lanes_events_carry_its_stream_id(autojump_clock) -> None:
    async with opened(make_server()) as conn:
        await send(conn, create_event(metadata=ONE_TURN, stream_id="a"))
        events = await until(conn, "response.completed")
    assert {event.get("stream_id") for _, event in events} == {"a"}


# --- dispatch: what each design refuses -------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("previous_response_id", "resp_1"), ("generate", False), ("stream_id", "a"), ("multi_agent", {"enabled": True}),
])
async def test_v1_refuses_each_field_of_v2_without_naming_a_lane(autojump_clock, field: str, value: Any) -> None:
    server = make_server()
    async with opened(server, SUSPENDED, multi_agent=True) as conn:
        await send(conn, create_event(**{field: value}))
        assert await receive(conn) == error("unsupported_parameter", f"'{field}' is not supported on the suspended (v1) protocol.", field)
        await send(conn, create_event(metadata=ONE_TURN))  # the refused create took nothing: the next is served
        assert (await until(conn, "response.completed"))[0][1]["type"] == "response.created"
    assert list(server.records)[0] == refusal_record("unsupported_parameter", field, SUSPENDED)


async def test_an_append_on_v2_is_an_unknown_event(autojump_clock) -> None:
    async with opened(make_server()) as conn:
        await send(conn, {"type": "response.append", "input": [output("call_1")]})
        assert await receive(conn) == error(
            "unknown_event_type", "response.append is not supported in ws v2; use response.create with previous_response_id", "type")


INJECT = {"type": "response.inject", "response_id": "resp_x", "input": [output("call_1")]}


@pytest.mark.parametrize(("design", "multi_agent"), [(CHAINED, False), (SUSPENDED, True)])
async def test_an_inject_needs_the_beta_on_a_v2_connection(autojump_clock, design: str, multi_agent: bool) -> None:
    async with opened(make_server(), design, multi_agent=multi_agent) as conn:
        await send(conn, INJECT)
        assert await receive(conn) == error(
            "unknown_event_type", "response.inject needs the 'OpenAI-Beta: responses_multi_agent=v1' header on a v2 connection.", "type")


async def test_with_the_beta_an_inject_and_a_multi_agent_create_are_taken(autojump_clock) -> None:
    async with opened(make_server(), multi_agent=True) as conn:
        await send(conn, INJECT)
        assert await receive(conn) == {"type": "response.inject.failed", "sequence_number": 0, "response_id": "resp_x",
                                       "input": INJECT["input"], "error": {"code": "response_not_found", "message": "Response 'resp_x' not found."}}
        await send(conn, create_event(metadata=ONE_TURN, multi_agent={"enabled": True}))
        assert (await until(conn, "response.completed"))[-1][1]["response"]["multi_agent"] == {
            "enabled": True, "max_concurrent_subagents": 3}


async def test_a_steer_on_v1_is_refused_as_unsupported(autojump_clock) -> None:
    async with opened(make_server(), SUSPENDED) as conn:
        await send(conn, {"type": "response.steer", "previous_response_id": "resp_1", "input": "stop"})
        assert await receive(conn) == {
            "type": "response.steer.failed", "sequence_number": 0, "steer": {"previous_response_id": "resp_1", "input": "stop"},
            "error": {"type": "invalid_request_error", "code": "steering_not_supported",
                      "message": "Steering is not supported by this protocol version."}}


@pytest.mark.parametrize("link", LINKS)
async def test_a_malformed_inject_is_refused_and_closes_the_connection_1008(autojump_clock, link: str) -> None:
    server = make_server()
    async with opened(server, multi_agent=True, network=LINKS[link]) as conn:
        await send(conn, {**INJECT, "input": []})
        events, code, reason = await closed_after(conn)
    assert events == [error("missing_required_parameter", "response.inject needs 'input', a non-empty array of items.", "input")]
    assert (code, reason) == (1008, "malformed response.inject")
    assert list(server.records) == [refusal_record("missing_required_parameter", "input", at=3 * one_way(link))]


# --- what the records count: the client's frames, in bytes, and its appends -------------------------------


async def test_a_v1_rollouts_record_counts_the_bytes_of_its_create_and_appends(autojump_clock) -> None:
    """Text frames count their UTF-8 bytes (not characters); binary frames count as they are."""
    server = make_server()
    create = json.dumps(create_event("répare le bogue ✓", metadata=THREE_TURNS), ensure_ascii=False)
    async with opened(server, SUSPENDED) as conn:
        await send(conn, create)
        done = (await until(conn, "response.done"))[-1][1]
        first = json.dumps({"type": "response.append", "input": [output(calls_of(done["response"])[0])]}).encode()
        await send(conn, first)  # a binary frame
        done = (await until(conn, "response.done"))[-1][1]
        second = json.dumps({"type": "response.append", "input": [{**output(calls_of(done["response"])[0]), "output": "données ✓"}]},
                            ensure_ascii=False)
        await send(conn, second)
        await until(conn, "response.completed")
    (record,) = server.records
    assert (record["appends"], record["request_bytes"]) == (2, len(create.encode()) + len(first) + len(second.encode()))
    assert len(create.encode()) > len(create)


# --- when a response's modeled work starts: when its frame arrived ----------------------------------------


@pytest.fixture
def slow_decode(monkeypatch, autojump_clock):
    """Decoding a frame takes `seconds` of the clock (the testbed's own CPU work, which the modeled time
    absorbs: metrics.PhaseLog.schedule)."""
    decode = codec.decode_client_event
    taking = {"seconds": 0.0}

    def slow(message):
        autojump_clock.jump(taking["seconds"])
        return decode(message)

    monkeypatch.setattr(codec, "decode_client_event", slow)
    return taking


async def completion_after_create(link: str) -> float:
    async with opened(make_server(), network=LINKS[link]) as conn:
        sent = trio.current_time()
        await send(conn, create_event(metadata=ONE_TURN))
        return (await until(conn, "response.completed"))[-1][0] - sent


@pytest.mark.parametrize("link", LINKS)
async def test_a_response_is_modeled_from_its_frames_arrival_not_from_its_decode(autojump_clock, slow_decode, link: str) -> None:
    instant = await completion_after_create(link)
    slow_decode["seconds"] = 0.005  # shorter than the response's modeled 21.5 ms
    slowed = await completion_after_create(link)
    assert slowed == pytest.approx(instant, abs=1e-9) and instant == pytest.approx(0.0215333 + 2 * one_way(link), abs=1e-6)


async def completion_after_append(link: str, slow_decode, seconds: float) -> float:
    async with opened(make_server(), SUSPENDED, network=LINKS[link]) as conn:
        await send(conn, create_event(metadata=TWO_TURNS))
        done = (await until(conn, "response.done"))[-1][1]
        slow_decode["seconds"] = seconds
        sent = trio.current_time()
        await send(conn, {"type": "response.append", "input": [output(calls_of(done["response"])[0])]})
        completed = (await until(conn, "response.completed"))[-1][0] - sent
        slow_decode["seconds"] = 0.0
        return completed


@pytest.mark.parametrize("link", LINKS)
async def test_a_v1_segment_is_modeled_from_its_appends_arrival(autojump_clock, slow_decode, link: str) -> None:
    instant = await completion_after_append(link, slow_decode, 0.0)
    slowed = await completion_after_append(link, slow_decode, 0.005)
    assert slowed == pytest.approx(instant, abs=1e-9) and instant == pytest.approx(0.015601 + 2 * one_way(link), abs=1e-6)


async def completion_after_inject(link: str, slow_decode, seconds: float) -> float:
    async with opened(make_server(), multi_agent=True, network=LINKS[link]) as conn:
        await send(conn, create_event(metadata=TWO_TURNS, multi_agent={"enabled": True}))
        events = await until(conn, "response.function_call_arguments.done")
        response_id, call_id = events[0][1]["response"]["id"], events[-1][1]["item_id"]
        await trio.sleep(1.0)  # the response waits for the call's output
        (call,) = [e["item"] for _, e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
        slow_decode["seconds"] = seconds
        sent = trio.current_time()
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": [output(call["call_id"])]})
        completed = (await until(conn, "response.completed"))[-1][0] - sent
        slow_decode["seconds"] = 0.0
        assert call["id"] == call_id
        return completed


@pytest.mark.parametrize("link", LINKS)
async def test_a_response_resumed_by_an_inject_is_modeled_from_the_injects_arrival(autojump_clock, slow_decode, link: str) -> None:
    instant = await completion_after_inject(link, slow_decode, 0.0)
    slowed = await completion_after_inject(link, slow_decode, 0.005)
    assert slowed == pytest.approx(instant, abs=1e-9) and instant > 0.005 + 2 * one_way(link)


# --- the lifetime limit: the responses in flight end, then its error and close 1000 -----------------------


LIMIT_REACHED = {"code": "websocket_connection_limit_reached",
                 "message": "Responses websocket connection limit reached (0.2 minutes). Create a new websocket connection to continue."}
LIMIT_ERROR = {"type": "error", "status": 400, "error": {"type": "invalid_request_error", **LIMIT_REACHED, "param": None}}
LONG = {"testbed_workload": "fixed:1:50:10:400:0"}  # one turn of 400 output tokens: 4 s at sim-100


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_the_lifetime_limit_closes_an_idle_connection_with_its_error_and_1000(autojump_clock, design: str, link: str) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    async with opened(server, design, network=LINKS[link]) as conn:
        events, code, reason = await closed_after(conn)
        # The limit counts from the accept, one way after the client's upgrade request went out at 0.
        assert trio.current_time() == pytest.approx(12.0 + 2 * one_way(link), abs=1e-9)
    assert (events, code, reason) == ([LIMIT_ERROR], 1000, "connection limit reached")


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("grace", [100.0, 1.0])
async def test_at_the_lifetime_limit_a_response_in_flight_ends_within_the_grace_and_the_queue_is_dropped(
    autojump_clock, link: str, grace: float
) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=12.0, lifetime_grace=grace))
    async with opened(server, network=LINKS[link]) as conn:
        await trio.sleep(10.0)
        sent = trio.current_time()
        await send(conn, create_event(model="sim-100", metadata=LONG))  # 4 s, past the limit
        await send(conn, create_event(metadata=ONE_TURN))  # queued behind it: dropped at the limit
        created = await receive(conn)
        events, code, reason = await closed_after(conn)
        closed_after_sent = trio.current_time() - sent
    assert (code, reason) == (1000, "connection limit reached")
    assert [e["type"] for e in events].count("response.created") == 0 and events[-1] == LIMIT_ERROR
    if grace == 100.0:  # it finishes, and the close follows its terminal event at once
        assert closed_after_sent == pytest.approx(4.0165333 + 2 * one_way(link), abs=1e-6)
        assert events[-2]["type"] == "response.completed"
    else:  # cut when the grace is over (the limit one way after the open), failed with the limit's error
        assert closed_after_sent == pytest.approx(12.0 + grace + 2 * one_way(link) - sent, abs=1e-9)
        assert events[-2] == {"type": "response.failed", "sequence_number": events[-3]["sequence_number"] + 1,
                              "response": {**created["response"], "status": "failed", "error": LIMIT_REACHED}}


@pytest.mark.parametrize("link", LINKS)
async def test_at_the_lifetime_limit_a_paused_v1_rollout_fails_with_the_limit(autojump_clock, link: str) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    async with opened(server, SUSPENDED, network=LINKS[link]) as conn:
        await send(conn, create_event(metadata=TWO_TURNS))
        done = (await until(conn, "response.done"))[-1][1]
        (failed, limit), code, reason = await closed_after(conn)
        assert trio.current_time() == pytest.approx(12.0 + 2 * one_way(link), abs=1e-9)
    assert (limit, code, reason) == (LIMIT_ERROR, 1000, "connection limit reached")
    assert failed == {"type": "response.failed", "sequence_number": done["sequence_number"] + 1,
                      "response": {**failed["response"], "id": done["response"]["id"], "status": "failed", "error": LIMIT_REACHED}}


# --- a drain: close 1001 with the drain's error, in the session's own nursery -----------------------------


SHUTTING_DOWN_ERROR = {"type": "error", "status": 503, "error": {
    "type": "server_error", "code": "server_shutting_down", "message": "The server is shutting down; retry on a new connection.", "param": None}}


@pytest.mark.parametrize("link", LINKS)
async def test_a_drain_closes_an_open_connection_with_its_error_and_1001(autojump_clock, link: str) -> None:
    server = make_server()
    async with opened(server, network=LINKS[link]) as conn:
        await trio.sleep(1.0)
        drained_at = trio.current_time()
        async with trio.open_nursery() as draining:
            draining.start_soon(drain, server, 5.0)
            events, code, reason = await closed_after(conn)
            assert trio.current_time() == pytest.approx(drained_at + one_way(link), abs=1e-9)  # at once: nothing is in flight
    assert (events, code, reason) == ([SHUTTING_DOWN_ERROR], 1001, "server shutting down")


class DrainDuringHandshake(ResponsesServer):
    def check_auth(self, headers):  # the drain starts while this connection's handshake is read
        self.draining = True
        return super().check_auth(headers)


@pytest.mark.parametrize("link", LINKS)
async def test_a_connection_whose_handshake_raced_a_drain_is_closed_as_the_drain_closes_the_rest(autojump_clock, link: str) -> None:
    server = DrainDuringHandshake(ApiService(costs=ZERO_COSTS), ServerConfig())
    async with opened(server, network=LINKS[link]) as conn:
        events, code, reason = await closed_after(conn)
    assert (events, code, reason) == ([SHUTTING_DOWN_ERROR], 1001, "server shutting down")


async def test_a_drain_that_reaches_a_session_already_over_does_nothing(autojump_clock) -> None:
    server = make_server()
    async with opened(server) as conn:
        await trio.sleep(1.0)
        (session,) = server.sessions
    with trio.fail_after(WAIT):
        while server.sessions:
            await trio.sleep(0.1)
    session.shut_down(errors.server_shutting_down(), 1001, "server shutting down", 0.0)  # neither raises nor starts a close
    assert session.shutdown is not None and session.nursery is None and conn.closed.code == 1000


# --- a client that never answers the close ---------------------------------------------------------------


@pytest.mark.parametrize("link", LINKS)
async def test_a_client_that_never_answers_the_close_is_dropped_a_close_handshake_after_the_limit(autojump_clock, link: str) -> None:
    """It gets the limit's error and close frame; the server waits `CLOSE_HANDSHAKE_SECONDS` for its
    close frame, then ends the session and the connection (RFC 6455 §7.1.1)."""
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    protocol = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    async with InMemoryConnector(server, LINKS[link]).open_stream() as client:
        await client.send_all(protocol.send(wsproto.events.Request(host="testbed", target="/v1/responses",
                                                                    extra_headers=[(b"authorization", b"Bearer k")])))
        data = b""
        with trio.fail_after(WAIT):
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
        (wsproto.events.TextMessage, json.dumps(LIMIT_ERROR, separators=(",", ":")), None, None),
        (wsproto.events.CloseConnection, None, 1000, "connection limit reached"),
    ]


async def test_a_client_that_reads_nothing_is_dropped_a_close_handshake_after_the_limit(autojump_clock, nursery) -> None:
    """Its socket takes nothing (a lockstep stream: a write waits for the reader), so the limit's error
    cannot even be written: the session ends `CLOSE_HANDSHAKE_SECONDS` after the limit all the same."""
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    client, server_end = trio.testing.lockstep_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    protocol = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    with trio.fail_after(WAIT):
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


# --- the session's end: nothing of it stays on the server -------------------------------------------------


def held_kv(server) -> list:
    """The engine's KV entries held under a WebSocket connection's keys (a lane's: the connection's and its `stream_id`)."""
    return sorted(repr(key) for key in server.api.engine.kv if "chained" in (key[0], key[0][0]))


@pytest.mark.parametrize("link", LINKS)
async def test_a_closed_connection_releases_the_kv_of_every_lane(autojump_clock, link: str) -> None:
    server = make_server()
    async with opened(server, network=LINKS[link]) as conn:
        for stream_id in (None, "a"):
            await send(conn, create_event(metadata=ONE_TURN, **({} if stream_id is None else {"stream_id": stream_id})))
            await until(conn, "response.completed")
        held = held_kv(server)
    with trio.fail_after(WAIT):
        while server.sessions:
            await trio.sleep(0.001)
    assert (len(held), held_kv(server)) == (2, [])
