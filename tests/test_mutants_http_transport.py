"""The HTTP transport held to exact answers: bearer auth and the shared endpoint state
(server/endpoint.py), the listener's head reader and replay stream (server/streams.py), the POST
handler (server/http.py) and the HTTP client (client/http.py): each refusal's status, code and
message, each stream's exact events, the virtual times of a drain (docs/protocol.md, §8). In-process
over memory streams under the autojump clock, every wait bounded in virtual time (tests/support.py),
so a hung mutant fails at once. Written against the survivors of the mutation runs (docs/mutation.md)."""

from __future__ import annotations

import json
import random
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from support import make_server
from test_bad_input import first_leaf
from test_endpoints import Raw, Reply, connect

from prototype import workload as wl
from prototype.api.service import IdFactory
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import Rollout, RolloutRecord, task_prompt
from prototype.client.http import (
    ConnectionLost,
    ConnectionPool,
    HttpConnection,
    HttpProtocolError,
    continue_http_rollout,
    post_turn,
    request_headers,
    run_http_rollout,
)
from prototype.client.reconnect import ReconnectPolicy
from prototype.client.sse import SseProtocolError
from prototype.designs.emitter import EngineFailure
from prototype.netem.faults import FaultyStream, Link, LinkFaults
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.server.http import answers as server_http
from prototype.server import routes
from prototype.server.app import drain
from prototype.server.config import ServerConfig
from prototype.server.streams import HeadTooLarge, ReplayStream, read_head

WAIT = 100.0  # virtual seconds: every wait of these tests ends far sooner, and a hang fails at once
LONG = {"testbed_workload": "fixed:1:50:10:400:0"}  # one turn of 400 output tokens: 4 s at sim-100


async def send_raw(client: Raw, method: str, target: str, headers: list[tuple[str, str]], data: bytes = b"") -> Reply:
    """A request with exactly `headers` (and a host and content-length), read to its end."""
    out = client.conn.send(h11.Request(method=method, target=target,
                                       headers=[("host", "testbed"), ("content-length", str(len(data))), *headers]))
    out += (client.conn.send(h11.Data(data=data)) if data else b"") + client.conn.send(h11.EndOfMessage())
    with trio.fail_after(WAIT):
        await client.stream.send_all(out)
        head = await client._next()
        return Reply(head.status_code, {k.decode().lower(): v.decode() for k, v in head.headers}, await rest(client))


async def rest(client: Raw) -> bytes:
    """The body of the answer whose head was read; the next cycle started if the connection stays open."""
    body = bytearray()
    while not isinstance(event := await client._next(), h11.EndOfMessage):
        body += event.data
    if client.conn.our_state is h11.DONE and client.conn.their_state is h11.DONE:
        client.conn.start_next_cycle()
    return bytes(body)


def unauthorized(reply: Reply) -> str:
    """The message of a 401, after checking its status, headers and code."""
    assert (reply.status, reply.headers["www-authenticate"]) == (401, "Bearer"), reply
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_api_key", None)
    return error["message"]


# --- server/endpoint.py ----------------------------------------------------------------------------

MISSING = "Missing bearer authentication in header."
INCORRECT = "Incorrect API key provided."


@pytest.mark.parametrize(("authorization", "message"), [
    (None, MISSING),
    ("Bearer", MISSING),  # a scheme without a key (h11 strips the trailing space of "Bearer ")
    ("Basic YWxpY2U6cHc=", MISSING),
    ("Bearer bob", INCORRECT),
    ("Bearer alice", None),
    ("bearer alice", None),  # the scheme in any case (RFC 9110 §11.1)
    ("BEARER alice", None),
    ("Bearer   alice", None),  # spaces around the key are not part of it
    ("Bearer two words", None),  # the key is everything after the scheme's one space
])
async def test_bearer_auth_against_configured_keys(autojump_clock, nursery, authorization, message) -> None:
    client = connect(nursery, make_server(config=ServerConfig(api_keys=frozenset({"alice", "two words"}))))
    reply = await send_raw(client, "GET", "/v1/models", [] if authorization is None else [("authorization", authorization)])
    if message is None:
        assert reply.status == 200 and reply.json()["object"] == "list"
    else:
        assert unauthorized(reply) == message


@pytest.mark.parametrize(("authorization", "message"), [
    (None, MISSING), ("Bearer", MISSING), ("Token bob", MISSING), ("Bearer bob", None), ("Bearer anyone at all", None),
])
async def test_without_configured_keys_any_bearer_key_is_accepted(autojump_clock, nursery, authorization, message) -> None:
    client = connect(nursery, make_server())
    reply = await send_raw(client, "GET", "/v1/models", [] if authorization is None else [("authorization", authorization)])
    if message is None:
        assert reply.status == 200
    else:
        assert unauthorized(reply) == message


async def test_a_query_holding_a_question_mark_is_not_part_of_the_path(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    data = json.dumps({"model": "sim-1000", "input": "hi", "metadata": {"testbed_workload": "fixed:1"}}).encode()
    reply = await send_raw(client, "POST", "/v1/responses?a=1?b=2", [("authorization", "Bearer k"), ("content-type", "application/json")], data)
    assert (reply.status, reply.json()["status"]) == (200, "completed")
    models = await send_raw(client, "GET", "/v1/models?x=?", [("authorization", "Bearer k")])
    assert models.status == 200


async def test_each_http_connection_has_its_serial_number_in_the_records(autojump_clock, nursery) -> None:
    server = make_server()
    data = json.dumps({"model": "sim-1000", "input": "hi", "metadata": {"testbed_workload": "fixed:1"}}).encode()
    headers = [("authorization", "Bearer k"), ("content-type", "application/json")]
    first, second = connect(nursery, server), connect(nursery, server)
    for client in (first, first, second, first):
        assert (await send_raw(client, "POST", "/v1/responses", headers, data)).status == 200
    assert [record["connection"] for record in server.records] == [1, 1, 2, 1]
    assert server.connections_opened == 2


async def post_stream(client: Raw, metadata: dict[str, str]) -> list[dict[str, Any]]:
    """A `stream: true` create; every SSE event of the answer, read to its end."""
    data = json.dumps({"model": "sim-100", "input": "go", "stream": True, "metadata": metadata}).encode()
    reply = await send_raw(client, "POST", "/v1/responses", [("authorization", "Bearer k"), ("content-type", "application/json")], data)
    assert (reply.status, reply.headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    return [json.loads(line[6:]) for line in reply.body.split(b"\n") if line.startswith(b"data: ")]


def stream_in_background(nursery: trio.Nursery, client: Raw) -> dict[str, Any]:
    """POST the long streamed response on `client` in a task of its own; the returned dict gets its
    `events` and the virtual time it `ended_at`."""
    seen: dict[str, Any] = {}

    async def stream() -> None:
        seen["events"] = await post_stream(client, LONG)
        seen["ended_at"] = trio.current_time()

    nursery.start_soon(stream)
    return seen


async def test_a_drain_returns_when_the_last_http_response_ends(autojump_clock, nursery) -> None:
    """A drain waits for the response in flight (4 s) within its grace, closes the idle
    keep-alive connection at once, and returns as soon as the last connection closed."""
    server = make_server()
    idle, streaming = connect(nursery, server), connect(nursery, server)
    assert (await send_raw(idle, "GET", "/v1/models", [("authorization", "Bearer k")])).status == 200
    seen = stream_in_background(nursery, streaming)
    await trio.sleep(1.0)
    with trio.fail_after(WAIT):
        await drain(server, 30.0)
    # The response's 4 s of decode and its prefill: the drain returns as its stream ends.
    assert trio.current_time() == seen["ended_at"] == pytest.approx(4.0107, abs=1e-4)
    assert seen["events"][-1]["type"] == "response.completed"
    assert (server.connections, server.http_in_flight, server.http_idle) == (0, set(), set())
    with trio.fail_after(WAIT):
        assert await idle.stream.receive_some(10) == b""


async def test_a_drain_past_its_grace_cuts_the_http_stream_with_a_flat_error(autojump_clock, nursery) -> None:
    server = make_server()
    streaming = connect(nursery, server)
    seen = stream_in_background(nursery, streaming)
    await trio.sleep(1.0)
    with trio.fail_after(WAIT):
        await drain(server, 0.5)
    assert (trio.current_time(), seen["ended_at"]) == (1.5, 1.5)
    events = seen["events"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1] == {"type": "error", "sequence_number": len(events) - 1, "code": "server_shutting_down",
                          "message": "The server is shutting down; retry on a new connection.", "param": None}


# --- server/streams.py -----------------------------------------------------------------------------


async def test_read_head_reads_until_the_blank_line_and_keeps_what_came_with_it(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    await client.send_all(b"GET / HTTP/1.1\r\nhost: t\r\n")
    await client.send_all(b"\r\nbody")
    with trio.fail_after(WAIT):
        assert await read_head(server_end, 64) == b"GET / HTTP/1.1\r\nhost: t\r\n\r\nbody"


async def test_read_head_returns_nothing_when_the_peer_closes_first(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    await client.send_all(b"GET / HTTP/1.1\r\n")
    await client.aclose()
    with trio.fail_after(WAIT):
        assert await read_head(server_end, 64) == b""


async def test_read_head_refuses_only_past_its_limit(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    await client.send_all(b"x" * 10)  # exactly the limit, unfinished: read on
    heads = []

    async def read() -> None:
        heads.append(await read_head(server_end, 10))

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()  # the reader took the 10 bytes and waits for more
            await client.send_all(b"\r\n\r\n")
    assert heads == [b"x" * 10 + b"\r\n\r\n"]
    client, server_end = trio.testing.memory_stream_pair()
    await client.send_all(b"x" * 11)
    with trio.fail_after(WAIT), pytest.raises(HeadTooLarge):
        await read_head(server_end, 10)


async def test_read_head_takes_a_head_in_large_reads(autojump_clock) -> None:
    """The head is read in reads of up to 64 KiB: a 70,000-byte head takes two reads."""
    sizes: list[int | None] = []

    class Counting(trio.abc.ReceiveStream):
        def __init__(self, data: bytes) -> None:
            self.data = data

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            await trio.lowlevel.checkpoint()
            sizes.append(max_bytes)
            chunk, self.data = self.data[:max_bytes], self.data[max_bytes:]
            return chunk

        async def aclose(self) -> None:
            pass

    head = b"x" * 70_000 + b"\r\n\r\n"
    assert await read_head(Counting(head), 100_000) == head
    assert sizes == [65536, 65536]


async def test_a_replay_stream_gives_its_prefix_then_reads_the_inner_stream(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    replay = ReplayStream(server_end, b"abcdefgh")
    with trio.fail_after(WAIT):
        assert await replay.receive_some(3) == b"abc"
        assert await replay.receive_some(None) == b"defgh"
        await client.send_all(b"more")
        assert await replay.receive_some(None) == b"more"
        await client.send_all(b"123456")
        assert await replay.receive_some(2) == b"12"
        # Writes, the wait before one and the close go to the inner stream.
        await replay.wait_send_all_might_not_block()
        await replay.send_all(b"answer")
        assert await client.receive_some(None) == b"answer"
        await replay.aclose()
        assert await client.receive_some(None) == b""
    with pytest.raises(trio.ClosedResourceError):
        await server_end.send_all(b"x")


async def test_a_replay_of_a_whole_prefix_reads_on_from_the_inner_stream(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    replay = ReplayStream(server_end, b"head")
    await client.send_all(b"tail")
    with trio.fail_after(WAIT):
        assert await replay.receive_some(4) == b"head"
        assert await replay.receive_some(4) == b"tail"


# --- server/http.py --------------------------------------------------------------------------------

AUTH = ("authorization", "Bearer k")
JSON = ("content-type", "application/json")


def create(**fields: Any) -> bytes:
    return json.dumps({"model": "sim-1000", "input": "hi", "metadata": {"testbed_workload": "fixed:1"}, **fields}).encode()


def refusal(reply: Reply, status: int, code: str, *, type: str = "invalid_request_error", param: str | None = None) -> str:
    """The message of a JSON refusal, after checking its status, headers, framing and error."""
    assert (reply.status, reply.headers["content-type"], reply.headers["content-length"]) == (
        status, "application/json", str(len(reply.body))), reply
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (type, code, param), error
    return error["message"]


async def test_each_refusal_of_a_create_has_its_status_message_and_headers(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    assert refusal(await send_raw(client, "POST", "/v1/chat?x=1", [AUTH, JSON], create()), 404, "not_found") == (
        "Invalid URL (POST /v1/chat?x=1).")
    long_target = "/v1/" + "a" * 200  # named up to its first 128 characters
    assert refusal(await send_raw(client, "POST", long_target, [AUTH, JSON], create()), 404, "not_found") == (
        f"Invalid URL (POST {long_target[:128]}).")
    get = await send_raw(client, "GET", "/v1/responses", [AUTH])
    assert refusal(get, 405, "method_not_allowed") == (
        "Method GET is not allowed on /v1/responses: use POST, or GET with Upgrade: websocket.")
    assert (get.headers["allow"], "www-authenticate" in get.headers) == ("POST", False)
    long_method = "PROPFINDEXTENDEDLONG"  # named up to its first 16 characters
    assert refusal(await send_raw(client, long_method, "/v1/responses", [AUTH]), 405, "method_not_allowed") == (
        "Method PROPFINDEXTENDED is not allowed on /v1/responses: use POST, or GET with Upgrade: websocket.")
    head = await send_raw(client, "HEAD", "/v1/responses", [AUTH])  # the head of the body it would send, no body
    assert (head.status, head.body, head.headers["allow"], int(head.headers["content-length"])) == (
        405, b"", "POST", len(get.body) + len("HEAD") - len("GET"))
    assert unauthorized(await send_raw(client, "POST", "/v1/responses", [JSON], create())) == MISSING
    assert refusal(await send_raw(client, "POST", "/v1/responses", [AUTH, ("content-type", "text/plain")], create()), 415,
                   "unsupported_media_type") == "Content-Type 'text/plain' is not supported: send application/json."
    long_type = "text/" + "x" * 100  # named up to its first 64 characters
    assert refusal(await send_raw(client, "POST", "/v1/responses", [AUTH, ("content-type", long_type)], create()), 415,
                   "unsupported_media_type") == f"Content-Type {long_type[:64]!r} is not supported: send application/json."
    assert refusal(await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], b"[1]"), 400, "invalid_json") == (
        "The request body must be one JSON object.")
    # After every refusal the connection still serves.
    assert (await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], create())).json()["status"] == "completed"


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8", "Application/JSON",
                                          "application/json ;charset=utf-8", "application/json; charset=utf-8; v=1"])
async def test_a_json_body_is_read_under_any_spelling_of_its_media_type(autojump_clock, nursery, content_type) -> None:
    client = connect(nursery, make_server())
    reply = await send_raw(client, "POST", "/v1/responses", [AUTH] + ([] if content_type is None else [("content-type", content_type)]), create())
    assert (reply.status, reply.json()["status"]) == (200, "completed")


async def test_a_refused_create_is_in_the_records(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    await trio.sleep(2.0)
    await send_raw(client, "POST", "/v1/responses", [AUTH, ("content-type", "text/plain"), ("user-agent", "probe/1")], create())
    await send_raw(client, "POST", "/v1/responses", [JSON], create())
    assert list(server.records) == [
        {"user_agent": "probe/1", "transport": "http", "design": "http", "connection": 1, "at_s": 2.0, "response_id": None,
         "outcome": "error:unsupported_media_type", "status": 415, "timing_requested": False},
        {"user_agent": "", "transport": "http", "design": "http", "connection": 1, "at_s": 2.0, "response_id": None,
         "outcome": "error:invalid_api_key", "status": 401, "timing_requested": False},
    ]


async def test_a_served_create_is_in_the_records_with_its_phases(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    await trio.sleep(1.0)
    data = create(store=True)
    first = (await send_raw(client, "POST", "/v1/responses", [AUTH, JSON, ("user-agent", "probe/2")], data)).json()
    chained = create(previous_response_id=first["id"], input=[])
    timed = await send_raw(client, "POST", "/v1/responses", [AUTH, JSON, ("x-responsesapi-include-timing-metrics", "TRUE")], chained)
    assert "testbed_timing" in timed.json() and "testbed_timing" not in first
    records = list(server.records)
    assert [(r["design"], r["transport"], r["user_agent"], r["connection"], r["request_bytes"], r["response_id"], r["outcome"],
             r["timing_requested"], r["started_at_s"]) for r in records] == [
        ("http-stateless", "http", "probe/2", 1, len(data), first["id"], "completed", False, 1.0),
        ("http-stored", "http", "", 1, len(chained), timed.json()["id"], "completed", True, records[0]["at_s"]),
    ]
    assert records[0]["usage"] == first["usage"] and records[0]["at_s"] > 1.0
    phases = timed.json()["testbed_timing"]["phases_ms"]
    assert {k: v for k, v in records[1]["phases_ms"].items() if k in phases} == {k: round(v, 3) for k, v in phases.items() if k in records[1]["phases_ms"]}
    assert records[1]["phases_ms"] and all(round(v, 3) == v for v in records[1]["phases_ms"].values())


async def test_a_body_larger_than_the_limit_is_refused_and_the_connection_closed(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(max_body_bytes=200))
    fits = create(input="x" * (200 - len(create(input=""))))
    assert len(fits) == 200
    client = connect(nursery, server)
    assert (await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], fits)).status == 200  # exactly the limit
    refused = await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], fits + b" ")
    assert refusal(refused, 413, "request_too_large") == "The request body is larger than 200 bytes."
    assert refused.headers["connection"] == "close"
    with trio.fail_after(WAIT):
        assert await client.stream.receive_some(10) == b""
    # A chunked body: read up to the limit, refused past it.
    for data, status in ((fits, 200), (fits + b" ", 413)):
        client = connect(nursery, server)
        out = client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
            ("host", "t"), ("transfer-encoding", "chunked"), AUTH, JSON]))
        out += client.conn.send(h11.Data(data=data[:100])) + client.conn.send(h11.Data(data=data[100:])) + client.conn.send(h11.EndOfMessage())
        with trio.fail_after(WAIT):
            await client.stream.send_all(out)
            head = await client._next()
            assert head.status_code == status
            await rest(client)


async def test_a_body_that_stalls_gets_408_at_the_idle_timeout(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server(config=ServerConfig(http_idle_timeout=7.0)))
    await trio.sleep(1.0)
    client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[("host", "t"), ("content-length", "100"), AUTH, JSON]))
    await client.stream.send_all(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\nauthorization: Bearer k\r\n\r\n{\"mo")
    with trio.fail_after(WAIT):
        head = await client._next()
        body = await rest(client)
    reply = Reply(head.status_code, {k.decode(): v.decode() for k, v in head.headers}, body)
    assert refusal(reply, 408, "request_timeout") == "The request body did not arrive in time."
    assert (trio.current_time(), reply.headers["connection"]) == (8.0, "close")


async def test_a_client_that_expects_100_continue_gets_it_before_the_answer(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    data = create()
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), ("expect", "100-continue"), AUTH, JSON])))
    with trio.fail_after(WAIT):
        informational = await client._next()
        assert (type(informational), informational.status_code, informational.reason) == (h11.InformationalResponse, 100, b"Continue")
        await client.stream.send_all(client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
        head = await client._next()
        assert head.status_code == 200 and json.loads(await rest(client))["status"] == "completed"


async def test_a_body_cut_short_is_a_bad_request_and_the_connection_closes(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    await client.stream.send_all(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\nauthorization: Bearer k\r\n\r\n{\"mo")
    await client.stream.send_eof()
    data = b""
    with trio.fail_after(WAIT):
        while chunk := await client.stream.receive_some(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request" and b"connection: close" in head.split(b"\r\n")
    assert json.loads(payload)["error"] == {"type": "invalid_request_error", "code": "bad_request", "param": None, "message":
                                            "Malformed HTTP request: peer closed connection without sending complete message body (received 4 bytes, expected 100)."}


async def test_a_second_request_h11_cannot_parse_is_a_bad_request(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 200
    await client.stream.send_all(b"GET /v1/models HTTP/1.1\r\nbad header\r\n\r\n")
    data = b""
    with trio.fail_after(WAIT):
        while chunk := await client.stream.receive_some(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request"
    error = json.loads(payload)["error"]
    assert (error["code"], error["message"]) == ("bad_request", "Malformed HTTP request: illegal header line: bytearray(b'bad header').")


async def test_a_keep_alive_connection_idles_out_after_the_idle_timeout(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(http_idle_timeout=5.0))
    client = connect(nursery, server)
    assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 200
    await trio.sleep(4.9)  # within the idle timeout the connection still serves
    assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 200
    with trio.fail_after(WAIT):
        assert await client.stream.receive_some(10) == b""
    assert trio.current_time() == pytest.approx(9.9) and server.http_idle == set()


async def test_a_first_request_is_not_held_to_the_idle_timeout(autojump_clock, nursery) -> None:
    """The listener already read the first head; a slow first body is bound by the idle timeout
    only once the body is being read."""
    client = connect(nursery, make_server(config=ServerConfig(http_idle_timeout=0.0)))
    reply = await send_raw(client, "GET", "/v1/models", [AUTH])
    assert reply.status == 200


async def test_a_later_request_may_have_a_head_of_up_to_the_head_limit(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 200
    # The head arrives in two parts: the first, 20,000 bytes, is an incomplete head past h11's default limit of 16 KiB.
    head = client.conn.send(h11.Request(method="GET", target="/v1/models", headers=[("host", "t"), AUTH, ("x-pad", "p" * 40_000)]))
    await client.stream.send_all(head[:20_000])
    await trio.testing.wait_all_tasks_blocked()
    await client.stream.send_all(head[20_000:] + client.conn.send(h11.EndOfMessage()))
    with trio.fail_after(WAIT):
        assert (await client._next()).status_code == 200


async def test_connection_close_is_honoured_after_the_answer(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    reply = await send_raw(client, "GET", "/v1/models", [AUTH, ("connection", "close")])
    assert reply.status == 200
    with trio.fail_after(WAIT):
        assert await client.stream.receive_some(10) == b""


async def test_a_stream_is_one_chunk_per_event_after_its_headers(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    data = create(stream=True)
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), AUTH, JSON])) + client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
    chunks = []
    with trio.fail_after(WAIT):
        head = await client._next()
        while not isinstance(event := await client._next(), h11.EndOfMessage):
            assert (event.chunk_start, event.chunk_end) == (True, True)
            chunks.append(event.data)
    assert (head.status_code, head.reason) == (200, b"OK")
    assert dict(head.headers) == {b"content-type": b"text/event-stream; charset=utf-8", b"cache-control": b"no-cache",
                                  b"transfer-encoding": b"chunked"}
    types = []
    for number, chunk in enumerate(chunks):
        event_line, data_line, end = chunk.decode().split("\n", 2)
        event = json.loads(data_line.removeprefix("data: "))
        assert (event_line, end, event["sequence_number"], data_line) == (
            f"event: {event['type']}", "\n", number, "data: " + json.dumps(event, separators=(",", ":"), ensure_ascii=False))
        types.append(event["type"])
    assert (types[:2], types[-1]) == (["response.created", "response.in_progress"], "response.completed")


def snapshot(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_x", "object": "response", "status": status, **fields}


def faulty_turn(*steps: Any):
    """A stand-in for the http design's turn: sends the events of `steps` in order and raises the
    exception among them when it comes to it."""

    async def turn(api, request, sink, **kwargs):
        for step in steps:
            if isinstance(step, BaseException):
                raise step
            await sink(step)

    return turn


async def post_once(client: Raw, *, stream: bool) -> Reply:
    return await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], create(stream=stream))


def sse_events(reply: Reply) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in reply.body.split(b"\n") if line.startswith(b"data: ")]


INTERNAL = {"error": {"type": "server_error", "code": "server_error", "message": "Internal error: RuntimeError.", "param": None}}


async def test_a_refusal_before_the_stream_starts_is_an_http_error_and_the_connection_serves_on(autojump_clock, nursery, monkeypatch) -> None:
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(ProtocolError("invalid_value", "Refused.", param="input")))
    server = make_server()
    client = connect(nursery, server)
    for stream in (True, False):
        reply = await post_once(client, stream=stream)
        assert refusal(reply, 400, "invalid_value", param="input") == "Refused." and "connection" not in reply.headers
    assert [r["outcome"] for r in server.records] == ["error:invalid_value"] * 2
    monkeypatch.undo()
    assert (await post_once(client, stream=False)).json()["status"] == "completed"


async def test_a_fault_before_the_stream_starts_is_a_500_and_the_connection_closes(autojump_clock, nursery, monkeypatch) -> None:
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(RuntimeError("boom")))
    server = make_server()
    streaming, collecting = connect(nursery, server), connect(nursery, server)
    reply = await post_once(streaming, stream=True)
    assert (reply.status, reply.json(), reply.headers["connection"]) == (500, INTERNAL, "close")
    with trio.fail_after(WAIT):
        assert await streaming.stream.receive_some(10) == b""
    reply = await post_once(collecting, stream=False)  # the whole answer was read: the connection stays open
    assert (reply.status, reply.json(), "connection" in reply.headers) == (500, INTERNAL, False)
    assert [r["outcome"] for r in server.records] == ["error:server_error"] * 2


async def test_a_fault_after_the_stream_started_is_a_flat_error_with_the_next_sequence_number(autojump_clock, nursery, monkeypatch) -> None:
    created = ev.ResponseCreated(0, snapshot("in_progress"))
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(created, ev.ResponseInProgress(1, snapshot("in_progress")),
                                                                  RuntimeError("boom")))
    client = connect(nursery, make_server())
    events = sse_events(await post_once(client, stream=True))
    assert events == [created.to_dict(), ev.ResponseInProgress(1, snapshot("in_progress")).to_dict(),
                      {"type": "error", "code": "server_error", "message": "Internal error: RuntimeError.", "param": None, "sequence_number": 2}]
    # Without a terminal event the collected answer is the error itself.
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(created, ProtocolError("invalid_value", "Late.", param="input")))
    assert refusal(await post_once(client, stream=False), 400, "invalid_value", param="input") == "Late."
    monkeypatch.undo()
    assert (await post_once(client, stream=False)).json()["status"] == "completed"  # the same connection


async def test_a_fault_after_the_terminal_event_adds_nothing_to_the_stream(autojump_clock, nursery, monkeypatch) -> None:
    created, completed = ev.ResponseCreated(0, snapshot("in_progress")), ev.ResponseCompleted(1, snapshot("completed"))
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(created, completed, ProtocolError("invalid_value", "Late.")))
    client = connect(nursery, make_server())
    assert sse_events(await post_once(client, stream=True)) == [created.to_dict(), completed.to_dict()]
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(created, completed, RuntimeError("boom")))
    assert sse_events(await post_once(client, stream=True)) == [created.to_dict(), completed.to_dict()]
    reply = await post_once(client, stream=False)  # the terminal snapshot is the answer
    assert (reply.status, reply.json()) == (200, snapshot("completed"))


async def test_a_failed_response_is_a_500_with_its_error_and_the_records_say_so(autojump_clock, nursery, monkeypatch) -> None:
    failed = ev.ResponseFailed(1, snapshot("failed", error={"code": "engine_failure", "message": "The engine failed."}))
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(ev.ResponseCreated(0, snapshot("in_progress")), failed,
                                                                  EngineFailure("injected")))
    server = make_server()
    client = connect(nursery, server)
    # A refusal first, so that the failure's record cannot take its code.
    await send_raw(client, "POST", "/v1/responses", [AUTH, ("content-type", "text/plain")], create())
    events = sse_events(await post_once(client, stream=True))
    assert [e["type"] for e in events] == ["response.created", "response.failed"]
    reply = await post_once(client, stream=False)
    assert (reply.status, reply.json()) == (500, {"error": {"type": "server_error", "code": "engine_failure", "message": "The engine failed.",
                                                            "param": None}})
    assert [r["outcome"] for r in server.records] == ["error:unsupported_media_type", "error:server_error", "error:server_error"]
    assert (await post_once(client, stream=True)).status == 200  # the connection serves on


async def test_each_refusal_of_a_route_has_its_allow_header(autojump_clock, nursery, monkeypatch) -> None:
    server = make_server()
    client = connect(nursery, server)
    post = await send_raw(client, "POST", "/v1/models", [AUTH])
    assert refusal(post, 405, "method_not_allowed") == "Method POST is not allowed on /v1/models: use GET."
    assert post.headers["allow"] == "GET" and "www-authenticate" not in post.headers
    put = await send_raw(client, "PUT", "/v1/responses/resp_1", [AUTH])
    assert refusal(put, 405, "method_not_allowed") == "Method PUT is not allowed on /v1/responses/resp_1: use GET, DELETE."
    assert put.headers["allow"] == "GET, DELETE"
    long_path = "/v1/models/" + "m" * 200  # the method named up to 16 characters, the path up to 128
    long = await send_raw(client, "PROPFINDEXTENDEDLONG", long_path, [AUTH])
    assert refusal(long, 405, "method_not_allowed") == f"Method PROPFINDEXTENDED is not allowed on {long_path[:128]}: use GET."
    head = await send_raw(client, "HEAD", "/v1/models", [AUTH])
    assert (head.status, head.body, head.headers["allow"]) == (405, b"", "GET")
    missing = await send_raw(client, "GET", "/v1/responses/resp_nope", [AUTH])
    assert missing.status == 404 and "www-authenticate" not in missing.headers

    async def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(routes, "answer", broken)
    reply = await send_raw(client, "GET", "/v1/models", [AUTH])
    assert (reply.status, reply.json(), "connection" in reply.headers) == (500, INTERNAL, False)
    monkeypatch.undo()
    assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 200


async def test_an_answer_written_before_any_request_is_framed_and_closes(autojump_clock, nursery) -> None:
    server = make_server()
    server.draining = True
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\n")
    data = b""
    with trio.fail_after(WAIT):
        while chunk := await client.receive_some(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"HTTP/1.1 503 Service Unavailable", b"content-type: application/json",
                                   f"content-length: {len(payload)}".encode(), b"connection: close"]
    assert json.loads(payload)["error"]["code"] == "server_shutting_down"


# --- client/http.py --------------------------------------------------------------------------------

TASK = wl.fixed(3, initial_prompt_tokens=100, appended_tokens=20, output_tokens=30, tool_seconds=2.0)


class Tapped(trio.abc.Stream):
    """The server's end of a connection, keeping every byte the server read."""

    def __init__(self, inner: trio.abc.Stream, tap: bytearray) -> None:
        self.inner, self.tap = inner, tap

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.tap += data
        return data

    async def send_all(self, data) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class TapConnector:
    """Memory streams to `server`, each connection's bytes as the server read them kept in `taps`."""

    server: Any
    taps: list[bytearray] = attrs.Factory(list)

    @asynccontextmanager
    async def open_stream(self):
        client, server_end = trio.testing.memory_stream_pair()
        tap = bytearray()
        self.taps.append(tap)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.server.handle_stream, Tapped(server_end, tap))
            try:
                yield client
            finally:
                await client.aclose()

    def requests(self) -> list[list[tuple[dict[str, str], dict[str, Any]]]]:
        """Per connection: each request's headers and JSON body."""
        out = []
        for tap in self.taps:
            conn, requests = h11.Connection(h11.SERVER), []
            conn.receive_data(bytes(tap))
            while True:
                event = conn.next_event()
                if isinstance(event, h11.Request):
                    headers, body = {k.decode(): v.decode() for k, v in event.headers}, b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    requests.append((headers, json.loads(body)))
                    # The server's side of the exchange is not replayed: pretend it answered.
                    conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                    conn.send(h11.EndOfMessage())
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        break
                    conn.start_next_cycle()
                else:
                    break
            out.append(requests)
        return out


async def rollout(server, connector=None, **kwargs: Any):
    metadata = {"testbed_workload": server.api.workloads.register(TASK)}
    with trio.fail_after(WAIT):
        return await run_http_rollout(connector or InMemoryConnector(server), TASK, metadata=metadata, **kwargs)


def function_call_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in items if item["type"] == "function_call_output"]


async def test_a_stateless_rollout_resends_the_whole_conversation_on_one_connection(autojump_clock) -> None:
    server = make_server()
    connector = TapConnector(server)
    record = await rollout(server, connector)
    (requests,) = connector.requests()
    assert (record.design, record.status, len(record.turns), record.reconnects) == ("http-stateless", "completed", 3, 0)
    headers = [h for h, _ in requests]
    assert headers[0] == {"host": "testbed", "content-length": headers[0]["content-length"], "authorization": "Bearer testbed",
                          "content-type": "application/json", "accept": "text/event-stream", "user-agent": "prototype-harness"}
    bodies = [b for _, b in requests]
    assert [(b["store"], b["stream"], "previous_response_id" in b, b["include"]) for b in bodies] == [
        (False, True, False, ["reasoning.encrypted_content"])] * 3
    # Each request holds the one before it, the answer's output and the tool outputs.
    for before, after in zip(bodies, bodies[1:]):
        assert after["input"][:len(before["input"])] == before["input"]
        assert function_call_outputs(after["input"][len(before["input"]):])
    assert [turn.bytes_sent for turn in record.turns] == [int(h["content-length"]) for h in headers]
    assert [len(json.dumps(b, separators=(",", ":"))) for b in bodies] == [turn.bytes_sent for turn in record.turns]
    assert record.ended_at == trio.current_time() and record.started_at == 0.0
    assert ({b["model"] for b in bodies}, record.workload) == ({"gpt-5.4"}, TASK.name)  # the default model


async def test_a_stored_rollout_sends_only_the_tool_outputs_after_the_last_response(autojump_clock) -> None:
    server = make_server()
    connector = TapConnector(server)
    record = await rollout(server, connector, variant="stored", api_key="key-2", include_timing=True)
    (requests,) = connector.requests()
    assert (record.design, record.status, len(requests)) == ("http-stored", "completed", 3)
    headers, bodies = [h for h, _ in requests], [b for _, b in requests]
    assert [(h["authorization"], h["x-responsesapi-include-timing-metrics"], "connection" in h) for h in headers] == [
        ("Bearer key-2", "true", False)] * 3
    assert [(b["store"], "include" in b) for b in bodies] == [(True, False)] * 3
    assert "previous_response_id" not in bodies[0]
    assert [b["previous_response_id"] for b in bodies[1:]] == record.response_ids[:2]
    assert all(item["type"] == "function_call_output" for b in bodies[1:] for item in b["input"])
    assert all(turn.server_timing for turn in record.turns)


async def test_without_keep_alive_every_request_asks_to_close_and_opens_its_own_connection(autojump_clock) -> None:
    server = make_server()
    connector = TapConnector(server)
    record = await rollout(server, connector, keep_alive=False)
    per_connection = connector.requests()
    assert [len(requests) for requests in per_connection] == [1, 1, 1]
    assert [requests[0][0]["connection"] for requests in per_connection] == ["close"] * 3
    assert (record.status, record.reconnects) == ("completed", 0)


async def test_an_unknown_variant_is_refused(autojump_clock) -> None:
    with pytest.raises(ValueError, match=r"^variant must be one of \('stateless', 'stored'\), not 'chained'$"):
        await rollout(make_server(), variant="chained")


async def test_a_refused_request_ends_the_rollout_with_its_code(autojump_clock) -> None:
    server = make_server(config=ServerConfig(api_keys=frozenset({"right"})))
    await trio.sleep(1.0)
    record = await rollout(server, api_key="wrong")
    assert (record.status, len(record.turns), record.turns[0].ended_at, record.ended_at) == ("error:invalid_api_key", 1, 1.0, 1.0)
    assert record.timeline == [(1.0, "send", "POST /v1/responses"), (1.0, "recv", "http 401")]


async def test_a_capped_response_ends_the_rollout_with_its_status(autojump_clock) -> None:
    server = make_server()
    metadata = {"testbed_workload": server.api.workloads.register(TASK)}
    with trio.fail_after(WAIT):
        record = await run_http_rollout(InMemoryConnector(server), TASK, metadata=metadata, model="sim-1000")
    assert record.status == "completed"


CLOSE = object()  # in a scripted answer: close the connection there


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def completed_answer(status: str = "completed", *, content_type: bytes = b"text/event-stream; charset=utf-8") -> list:
    """A stream whose one event ends the response without calls (the rollout ends with it)."""
    event = {"type": f"response.{status}", "sequence_number": 0, "response": {"id": "resp_1", "status": status, "output": []}}
    return [h11.Response(status_code=200, headers=[(b"content-type", content_type), (b"transfer-encoding", b"chunked")]),
            h11.Data(data=sse(event)), h11.EndOfMessage()]


def json_answer(status: int, body: bytes) -> list:
    return [h11.Response(status_code=status, headers=[(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]),
            h11.Data(data=body), h11.EndOfMessage()]


@attrs.define(eq=False)
class Scripted:
    """A server that answers each request with the next answer of `answers` (h11 events, or CLOSE),
    whatever the connection it comes on."""

    answers: list
    connections: int = 0
    requests: list = attrs.Factory(list)  # (connection number, time) of each request read

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        number, conn = self.connections, h11.Connection(h11.SERVER)
        try:
            while self.answers:
                while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                    if isinstance(event, h11.ConnectionClosed):
                        return
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                self.requests.append((number, trio.current_time()))
                for item in self.answers.pop(0):
                    if item is CLOSE:
                        return
                    if isinstance(item, float):  # a pause of that many seconds inside the answer
                        await trio.sleep(item)
                        continue
                    if callable(item):  # an action on the link there (a reset: `faulty_rollout`)
                        item()
                        continue
                    await stream.send_all(conn.send(item))
                conn.start_next_cycle()
            while await stream.receive_some(65536):  # until the client closes
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


ONE_TURN = wl.fixed(1, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5)


async def scripted_rollout(*answers: list, **kwargs: Any):
    server = Scripted(list(answers))
    with trio.fail_after(WAIT):
        record = await run_http_rollout(InMemoryConnector(server), ONE_TURN, metadata={}, **kwargs)
    return server, record


async def scripted_failure(*answers: list, **kwargs: Any) -> BaseException:
    with pytest.raises(BaseExceptionGroup) as raised:
        await scripted_rollout(*answers, **kwargs)
    return first_leaf(raised.value)


async def test_the_client_reads_past_an_informational_answer(autojump_clock) -> None:
    continue_ = h11.InformationalResponse(status_code=100, headers=[])
    _, record = await scripted_rollout([continue_, continue_, *completed_answer()])
    assert (record.status, record.turns[0].ended_at) == ("completed", 0.0)


async def test_a_stream_in_plain_text_event_stream_is_read(autojump_clock) -> None:
    _, record = await scripted_rollout(completed_answer("incomplete", content_type=b"text/event-stream"))
    assert record.status == "incomplete"


async def test_an_answer_that_breaks_the_promised_framing_is_a_protocol_error(autojump_clock) -> None:
    failure = await scripted_failure(json_answer(500, b"oops, not JSON"))
    assert (type(failure), str(failure)) == (HttpProtocolError, "HTTP 500 without an error body: b'oops, not JSON'")
    failure = await scripted_failure(json_answer(502, b'{"no": "error"}'))
    assert str(failure) == "HTTP 502 without an error body: b'{\"no\": \"error\"}'"
    failure = await scripted_failure(json_answer(500, b"x" * 300))
    assert str(failure) == f"HTTP 500 without an error body: {b'x' * 200!r}"
    failure = await scripted_failure(completed_answer(content_type=b"application/json"))
    assert (type(failure), str(failure)) == (HttpProtocolError, "a stream was asked for, got Content-Type 'application/json'")


async def test_an_error_answer_or_event_ends_the_rollout_with_its_code(autojump_clock) -> None:
    refusal_body = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Slow down."}}).encode()
    _, record = await scripted_rollout(json_answer(429, refusal_body))
    assert (record.status, record.timeline[-1][1:]) == ("error:rate_limit_exceeded", ("recv", "http 429"))
    flat = {"type": "error", "code": "server_error", "message": "x", "param": None, "sequence_number": 0}
    _, record = await scripted_rollout([h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")]),
                                        h11.Data(data=sse(flat)), h11.EndOfMessage()])
    assert record.status == "error:server_error"


async def test_a_connection_closed_before_the_answer_is_lost(autojump_clock) -> None:
    failure = await scripted_failure([CLOSE])
    assert (type(failure), str(failure), failure.answered) == (
        ConnectionLost, "can't handle event type ConnectionClosed when role=SERVER and state=SEND_RESPONSE", False)
    head = h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")])
    failure = await scripted_failure([head, CLOSE])
    assert (type(failure), failure.answered) == (ConnectionLost, True)


async def test_a_lost_request_is_sent_again_under_the_policy_and_gives_up_after_its_retries(autojump_clock) -> None:
    policy = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)
    server, record = await scripted_rollout([CLOSE], [CLOSE], [CLOSE], policy=policy)
    assert (record.status, record.reconnects, server.connections) == ("error:gave_up", 2, 3)
    assert [at for _, at in server.requests] == [0.0, 0.5, 1.5]  # 0.5 s, then 1 s of backoff
    sent = record.turns[0].bytes_sent // 3
    assert (record.resent_bytes, record.turns[0].bytes_sent) == (2 * sent, 3 * sent)
    server, record = await scripted_rollout([CLOSE], completed_answer(), policy=policy)
    assert (record.status, record.reconnects, record.recovery_seconds, record.retried_responses) == ("completed", 1, [0.5], 0)


async def test_a_failed_response_is_asked_for_again_only_if_the_policy_says_so(autojump_clock) -> None:
    policy = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)
    server, record = await scripted_rollout(completed_answer("failed"), completed_answer(), policy=policy)
    assert (record.status, record.retried_responses, record.reconnects, server.connections) == ("completed", 1, 0, 1)
    assert (record.recovery_seconds, record.transcript[-1]["role"]) == ([0.5], "user")
    keep = ReconnectPolicy("keep", initial_delay=0.5, max_retries=2, retry_failed_responses=False)
    _, record = await scripted_rollout(completed_answer("failed"), completed_answer(), policy=keep)
    assert (record.status, record.retried_responses) == ("failed", 0)
    _, record = await scripted_rollout(completed_answer("failed"))
    assert record.status == "failed"


async def test_recovery_is_timed_from_the_first_loss_to_the_first_answer_and_each_retry_counted(autojump_clock) -> None:
    policy = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)
    head, event, end = completed_answer()
    # Lost at 0 and again at 0.5 (after 0.5 s of backoff); answered at 1.5 (after 1 s more), its end 2 s later.
    server, record = await scripted_rollout([CLOSE], [CLOSE], [head, event, 2.0, end], policy=policy)
    assert (record.status, record.reconnects, record.recovery_seconds) == ("completed", 2, [1.5])
    assert (record.turns[0].ended_at, trio.current_time()) == (1.5, 3.5)
    failed_head, failed_event, failed_end = completed_answer("failed")
    server, record = await scripted_rollout([failed_head, failed_event, failed_end], completed_answer("failed"),
                                            [head, 1.0, event, end], policy=policy)
    # Two failed responses asked for again; the turn ends with the third answer, at 0.5 + 1 + 1 (its event after a 1 s pause),
    # and a retried turn forgets what the failed answers set (none of them had a token).
    assert (record.status, record.retried_responses, record.recovery_seconds) == ("completed", 2, [2.5])
    assert (record.turns[0].first_token_at, record.turns[0].ended_at - record.started_at) == (None, 2.5)


async def test_the_backoffs_jitter_is_drawn_from_the_tasks_own_seed(autojump_clock) -> None:
    policy = ReconnectPolicy("jittered", initial_delay=0.5, max_retries=2, jitter=(0.5, 1.5))
    server, record = await scripted_rollout([CLOSE], [CLOSE], completed_answer(), policy=policy)
    rng = random.Random(f"reconnect:http:{ONE_TURN.name}")
    first, second = policy.delay(1, rng), policy.delay(2, rng)
    assert [at for _, at in server.requests] == [0.0, first, first + second]


async def test_a_kept_alive_connection_found_closed_is_replaced_once(autojump_clock) -> None:
    """The server closed the idle connection while the tools ran: the request goes again on a new one."""
    two_turns = wl.fixed(3, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=5.0)
    server = make_server(config=ServerConfig(http_idle_timeout=1.0))
    metadata = {"testbed_workload": server.api.workloads.register(two_turns)}
    with trio.fail_after(WAIT):
        record = await run_http_rollout(InMemoryConnector(server), two_turns, metadata=metadata)
    assert (record.status, record.reconnects, server.connections_opened) == ("completed", 2, 3)
    # Not on a first request: there the connection was new.
    failure = await scripted_failure([CLOSE], [CLOSE])
    assert type(failure) is ConnectionLost


async def test_a_replayed_stream_has_the_stream_headers(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    stored = (await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], create(store=True))).json()
    await client.stream.send_all(client.conn.send(h11.Request(method="GET", target=f"/v1/responses/{stored['id']}?stream=true",
                                                              headers=[("host", "t"), AUTH])) + client.conn.send(h11.EndOfMessage()))
    with trio.fail_after(WAIT):
        head = await client._next()
        events = [json.loads(line[6:]) for line in (await rest(client)).split(b"\n") if line.startswith(b"data: ")]
    assert (head.status_code, head.reason) == (200, b"OK")
    assert dict(head.headers) == {b"content-type": b"text/event-stream; charset=utf-8", b"cache-control": b"no-cache",
                                  b"transfer-encoding": b"chunked"}
    assert events[-1]["response"] == stored


async def test_a_timed_stream_carries_its_timing_and_its_record_its_phases(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    plain = sse_events(await post_once(client, stream=True))
    timed = sse_events(await send_raw(client, "POST", "/v1/responses", [AUTH, JSON, ("x-responsesapi-include-timing-metrics", "true")],
                                      create(stream=True)))
    assert "testbed_timing" not in plain[-1]["response"]
    phases = timed[-1]["response"]["testbed_timing"]["phases_ms"]
    await trio.testing.wait_all_tasks_blocked()  # the record is made once the stream's last chunk is written
    record = server.records[-1]
    assert record["timing_requested"] is True and record["phases_ms"]
    assert {k: round(v, 3) for k, v in phases.items() if k in record["phases_ms"]} == {
        k: v for k, v in record["phases_ms"].items() if k in phases}


async def test_a_client_that_leaves_mid_stream_ends_its_connection_without_a_record(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    data = create(stream=True, model="sim-100", metadata=LONG)
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), AUTH, JSON])) + client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
    with trio.fail_after(WAIT):
        assert (await client._next()).status_code == 200
        await trio.sleep(1.0)
        await client.stream.aclose()
        await server.until(lambda: not server.connections)
    assert (list(server.records), server.http_in_flight) == ([], set())
    assert trio.current_time() == pytest.approx(1.0107, abs=1e-4)  # the stream's first event came after the prefill


async def test_a_handler_fault_is_logged_with_its_traceback(autojump_clock, nursery, monkeypatch, caplog) -> None:
    async def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    client = connect(nursery, make_server())
    monkeypatch.setattr(routes, "answer", broken)
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(RuntimeError("boom")))
    with caplog.at_level("ERROR", logger="prototype.server.http"):
        assert (await send_raw(client, "GET", "/v1/models", [AUTH])).status == 500
        assert (await post_once(client, stream=False)).status == 500
    assert [(r.name, r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("prototype.server.http", "endpoint handler failed", RuntimeError), ("prototype.server.http", "http response handler failed", RuntimeError)]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_cancelled_response_is_in_the_records_as_cancelled(autojump_clock, nursery, stream) -> None:
    server = make_server(new_id=IdFactory("t"))
    waiting, other = connect(nursery, server), connect(nursery, server)
    replies: list[Reply] = []

    async def post() -> None:
        replies.append(await send_raw(waiting, "POST", "/v1/responses", [AUTH, JSON], create(stream=stream, model="sim-100", metadata=LONG)))

    nursery.start_soon(post)
    await trio.sleep(1.0)
    cancelled = await send_raw(other, "POST", "/v1/responses/resp_t000001/cancel", [AUTH])
    assert cancelled.json()["status"] == "cancelled"
    with trio.fail_after(WAIT):
        while not replies:
            await trio.sleep(0.1)
    await trio.testing.wait_all_tasks_blocked()
    (record,) = [r for r in server.records if r.get("response_id")]
    assert (record["response_id"], record["outcome"], record["usage"]) == ("resp_t000001", "cancelled", cancelled.json()["usage"])


async def test_a_fault_is_named_by_its_type_and_a_turn_without_a_terminal_is_an_internal_error(autojump_clock, nursery, monkeypatch) -> None:
    client = connect(nursery, make_server())
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(KeyError("k")))
    reply = await post_once(client, stream=False)
    assert (reply.status, reply.json()["error"]["message"]) == (500, "Internal error: KeyError.")
    # A turn that ends without its terminal event and without a refusal: an internal error all the same.
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(EngineFailure("injected")))
    reply = await post_once(client, stream=False)
    assert (reply.status, reply.json()) == (500, INTERNAL)


async def test_a_failed_response_without_its_error_is_a_500_server_error(autojump_clock, nursery, monkeypatch) -> None:
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(ev.ResponseFailed(0, snapshot("failed"))))
    client = connect(nursery, make_server())
    reply = await post_once(client, stream=False)
    assert (reply.status, reply.json()) == (500, {"error": {"type": "server_error", "code": "server_error", "message": "", "param": None}})


async def test_a_stream_handler_fault_is_logged_with_its_traceback(autojump_clock, nursery, monkeypatch, caplog) -> None:
    client = connect(nursery, make_server())
    monkeypatch.setattr(server_http, "run_http_turn", faulty_turn(RuntimeError("boom")))
    with caplog.at_level("ERROR", logger="prototype.server.http"):
        assert (await post_once(client, stream=True)).status == 500
    assert [(r.name, r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("prototype.server.http", "http response handler failed", RuntimeError)]


def calling_answer() -> list:
    """A stream whose response asks for one function call (the rollout goes on with its output)."""
    call = {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{}", "status": "completed"}
    event = {"type": "response.completed", "sequence_number": 0, "response": {"id": "resp_1", "status": "completed", "output": [call]}}
    return [h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")]),
            h11.Data(data=sse(event)), h11.EndOfMessage()]


async def test_a_reused_connection_closed_before_any_answer_is_replaced_but_not_one_cut_mid_answer(autojump_clock) -> None:
    server, record = await scripted_rollout(calling_answer(), [CLOSE], completed_answer())
    assert (record.status, record.reconnects, server.connections, len(record.turns)) == ("completed", 1, 2, 2)
    head = h11.Response(status_code=200, headers=[(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")])
    failure = await scripted_failure(calling_answer(), [head, CLOSE], completed_answer())
    assert (type(failure), failure.answered) == (ConnectionLost, True)


async def test_an_answer_without_a_content_type_is_a_protocol_error(autojump_clock) -> None:
    answer = completed_answer()
    answer[0] = h11.Response(status_code=200, headers=[(b"transfer-encoding", b"chunked")])
    failure = await scripted_failure(answer)
    assert (type(failure), str(failure)) == (HttpProtocolError, "a stream was asked for, got Content-Type ''")


async def test_the_requests_carry_the_instructions_and_the_compaction_threshold(autojump_clock) -> None:
    server = make_server()
    connector = TapConnector(server)
    record = await rollout(server, connector, instructions="be brief", compact_threshold=5000)
    bodies = [b for _, b in connector.requests()[0]]
    assert record.status == "completed"
    assert [(b["instructions"], b["context_management"]) for b in bodies] == [
        ("be brief", [{"type": "compaction", "compact_threshold": 5000}])] * len(bodies)


async def test_a_declared_body_past_the_limit_is_refused_before_any_100_continue(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server(config=ServerConfig(max_body_bytes=200)))
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", "201"), ("expect", "100-continue"), AUTH, JSON])))
    with trio.fail_after(WAIT):
        first = await client._next()
    assert (type(first), first.status_code) == (h11.Response, 413)


async def test_only_an_auth_refusal_asks_for_bearer_auth(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    for reply in (await send_raw(client, "POST", "/v1/responses", [AUTH, ("content-type", "text/plain")], create()),
                  await send_raw(client, "POST", "/v1/nope", [AUTH, JSON], create()),
                  await send_raw(client, "POST", "/v1/responses", [AUTH, JSON], b"[1]")):
        assert reply.status in (415, 404, 400) and "www-authenticate" not in reply.headers


RESET = object()  # in a scripted answer of `faulty_rollout`: the link is reset there (a TCP RST)


async def faulty_rollout(*answers: list, workload: wl.Workload = ONE_TURN, **kwargs: Any):
    """`scripted_rollout` over links that break: at each RESET of an answer, every open link is cut."""
    server = Scripted([])
    connector = InMemoryConnector(server, faults=LinkFaults())

    def reset() -> None:
        connector.links.cut_all("reset by peer")

    server.answers = [[reset if item is RESET else item for item in answer] for answer in answers]
    with trio.fail_after(WAIT):
        record = await run_http_rollout(connector, workload, metadata={}, **kwargs)
    return server, record


async def faulty_failure(*answers: list, **kwargs: Any) -> BaseException:
    with pytest.raises(BaseExceptionGroup) as raised:
        await faulty_rollout(*answers, **kwargs)
    return first_leaf(raised.value)


async def test_a_connection_reset_while_the_answer_is_read_is_lost_with_why_and_whether_any_came(autojump_clock) -> None:
    broke = "the connection broke: the link broke (reset by peer)"
    failure = await faulty_failure([RESET])
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, False)
    head, event, end = completed_answer()
    failure = await faulty_failure([head, 0.5, RESET])  # cut once the head has arrived
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, True)
    # An error answer cut in its body was answered: the request is not sent again, even on a reused connection.
    error_head = h11.Response(status_code=429, headers=[(b"content-type", b"application/json"), (b"content-length", b"100")])
    failure = await faulty_failure([error_head, h11.Data(data=b'{"error": '), 0.5, RESET])
    assert (type(failure), str(failure), failure.answered) == (ConnectionLost, broke, True)
    failure = await faulty_failure(calling_answer(), [error_head, h11.Data(data=b'{"error": '), 0.5, RESET], completed_answer())
    assert (type(failure), failure.answered) == (ConnectionLost, True)


async def test_a_kept_alive_connection_reset_while_idle_is_replaced_when_the_next_request_is_sent(autojump_clock) -> None:
    """The link is reset while the tool runs (2 s): the next request's send finds it broken."""
    with_a_tool = wl.fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0)
    server, record = await faulty_rollout([*calling_answer(), 1.0, RESET], completed_answer(), workload=with_a_tool)
    assert (record.status, record.reconnects, server.connections, len(record.turns)) == ("completed", 1, 2, 2)
    assert server.requests == [(1, 0.0), (2, 2.0)]


async def test_a_request_sent_on_a_broken_or_closed_connection_is_lost_unanswered(autojump_clock) -> None:
    rollout_ = Rollout(ONE_TURN, RolloutRecord("http-stateless", ONE_TURN.name, 0.0))
    client, _ = trio.testing.memory_stream_pair()
    link = Link()
    link.cut("reset by peer")
    with pytest.raises(ConnectionLost) as lost:
        await HttpConnection(FaultyStream(client, link, server_side=False), trio.Event()).post(b"{}", [], rollout_)
    assert (str(lost.value), lost.value.answered) == ("the connection broke: the link broke (reset by peer)", False)
    client, _ = trio.testing.memory_stream_pair()
    await client.aclose()
    with pytest.raises(ConnectionLost) as lost:
        await HttpConnection(client, trio.Event()).post(b"{}", [], rollout_)
    assert (str(lost.value), lost.value.answered) == ("the connection broke: virtual connection closed", False)
    assert rollout_.record.timeline == [(0.0, "send", "POST /v1/responses")] * 2


async def test_an_error_body_in_several_chunks_is_read_whole(autojump_clock) -> None:
    body = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Slow down."}}).encode()
    head, _, end = json_answer(429, body)
    _, record = await scripted_rollout([head, h11.Data(data=body[:20]), 1.0, h11.Data(data=body[20:]), end])
    assert (record.status, record.timeline[-1]) == ("error:rate_limit_exceeded", (1.0, "recv", "http 429"))


async def test_a_pooled_connection_serves_on_after_an_error_answer_and_closing_the_pool_drops_it(autojump_clock) -> None:
    """The pool as a caller of `post_turn` uses it (experiments/steering.py): a refusal leaves the connection
    reusable; once the pool is closed, the next request opens a new connection."""
    refusal = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Slow down."}}).encode()
    server = Scripted([json_answer(429, refusal), completed_answer(), completed_answer()])
    rollout_ = Rollout(ONE_TURN, RolloutRecord("http-stateless", ONE_TURN.name, 0.0))
    rollout_.start_turn([], 2)
    headers = request_headers(api_key="k", keep_alive=True, include_timing=False)
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            pool = ConnectionPool(nursery, InMemoryConnector(server), keep_alive=True)
            refused = await post_turn(pool, b"{}", headers, rollout_)
            answered = await post_turn(pool, b"{}", headers, rollout_)
            pool.close()
            assert pool.idle is None
            again = await post_turn(pool, b"{}", headers, rollout_)
            pool.close()
    assert (refused["status"], refused["error"]["code"], answered["type"], again["type"]) == (
        429, "rate_limit_exceeded", "response.completed", "response.completed")
    assert [number for number, _ in server.requests] == [1, 1, 2]


async def test_a_stream_that_ends_without_a_terminal_event_is_refused(autojump_clock) -> None:
    head, _, end = completed_answer()
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "status": "in_progress", "output": []}}
    failure = await scripted_failure([head, h11.Data(data=sse(created)), end])
    assert (type(failure), str(failure)) == (
        SseProtocolError, "SSE line 3: the body ends before an end event (response.completed, .failed, .incomplete, error)")


async def test_the_first_request_carries_the_task_as_one_user_message(autojump_clock) -> None:
    server = make_server()
    connector = TapConnector(server)
    await rollout(server, connector)
    (_, first), *_ = connector.requests()[0]
    assert first["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]


async def test_the_fallback_sends_the_whole_conversation_with_the_instructions_on_one_connection(autojump_clock) -> None:
    """`continue_http_rollout` (Codex's fallback once its WebSocket retries are spent) with the conversation so far."""
    server = make_server()
    connector = TapConnector(server)
    metadata = {"testbed_workload": server.api.workloads.register(TASK)}
    rollout_ = Rollout(TASK, RolloutRecord("chained", TASK.name, 0.0))
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]
    with trio.fail_after(WAIT):
        await continue_http_rollout(connector, rollout_, [], first, policy=None, model="gpt-5.4", metadata=metadata,
                                    instructions="be brief", api_key="testbed", include_timing=False)
    (requests,) = connector.requests()
    bodies = [b for _, b in requests]
    assert (rollout_.record.status, len(bodies), len(rollout_.record.turns)) == ("completed", 3, 3)
    assert [(b["instructions"], b["store"], b["stream"]) for b in bodies] == [("be brief", False, True)] * 3
    assert bodies[0]["input"] == first
    for before, after in zip(bodies, bodies[1:]):
        assert after["input"][:len(before["input"])] == before["input"]


async def test_a_fallback_inside_a_turn_adds_its_resend_to_that_turn(autojump_clock) -> None:
    """`turn_open`: the turn was recorded on the WebSocket (300 bytes sent there, and sent again once in full); the
    fallback's first request belongs to it, a resend of the whole conversation, and the later turns are its own."""
    server = make_server()
    connector = TapConnector(server)
    metadata = {"testbed_workload": server.api.workloads.register(TASK)}
    rollout_ = Rollout(TASK, RolloutRecord("chained", TASK.name, 0.0))
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TASK)}]}]
    rollout_.start_turn(first, 300)
    rollout_.record.resent_bytes, rollout_.record.full_resends = 300, 1
    with trio.fail_after(WAIT):
        await continue_http_rollout(connector, rollout_, [], first, policy=None, model="gpt-5.4", metadata=metadata,
                                    instructions=None, api_key="testbed", include_timing=False, turn_open=True)
    sizes = [int(headers["content-length"]) for headers, _ in connector.requests()[0]]
    record = rollout_.record
    assert (record.status, len(sizes), [turn.bytes_sent for turn in record.turns]) == ("completed", 3, [300 + sizes[0], *sizes[1:]])
    assert (record.resent_bytes, record.full_resends) == (300 + sizes[0], 2)


async def test_a_turn_starts_before_its_request_is_serialized(autojump_clock, monkeypatch) -> None:
    """The client's own work on a request (here 0.25 s to serialize it) is part of its turn, as a
    connection it has to open first is (docs/metrics.md)."""
    from types import SimpleNamespace

    from prototype.client import http as client_http

    def slow_dumps(*args: Any, **kwargs: Any) -> str:
        autojump_clock.jump(0.25)
        return json.dumps(*args, **kwargs)

    monkeypatch.setattr(client_http, "json", SimpleNamespace(dumps=slow_dumps, loads=json.loads))
    _, record = await scripted_rollout(completed_answer())
    assert (record.turns[0].sent_at, record.timeline[0]) == (0.0, (0.25, "send", "POST /v1/responses"))


async def test_a_close_after_an_informational_answer_is_a_close_before_any_answer(autojump_clock) -> None:
    """A `100 Continue` is not the answer: a connection closed after it is lost unanswered, so a reused one is replaced."""
    continue_ = h11.InformationalResponse(status_code=100, headers=[])
    failure = await scripted_failure([continue_, CLOSE])
    assert (type(failure), str(failure), failure.answered) == (
        ConnectionLost, "can't handle event type ConnectionClosed when role=SERVER and state=SEND_RESPONSE", False)
    server, record = await scripted_rollout(calling_answer(), [continue_, CLOSE], completed_answer())
    assert (record.status, record.reconnects, server.connections, len(record.turns)) == ("completed", 1, 2, 2)


async def test_a_refusal_after_a_lost_request_ends_the_recovery_at_its_status(autojump_clock) -> None:
    policy = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)
    refusal = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Slow down."}}).encode()
    _, record = await scripted_rollout([CLOSE], json_answer(429, refusal), policy=policy)
    assert (record.status, record.reconnects, record.recovery_seconds) == ("error:rate_limit_exceeded", 1, [0.5])
