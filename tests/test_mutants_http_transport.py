"""The HTTP transport held to exact answers: bearer auth and the shared endpoint state
(server/endpoint.py), the listener's head reader and replay stream (server/streams.py), the POST
handler (server/http.py) and the HTTP client (client/http.py): each refusal's status, code and
message, each stream's exact events, the virtual times of a drain (docs/protocol.md, §8). In-process
over memory streams under the autojump clock, every wait bounded in virtual time (tests/support.py),
so a hung mutant fails at once. Written against the survivors of the mutation runs (docs/mutation.md)."""

from __future__ import annotations

import json
from typing import Any

import h11
import pytest
import trio
import trio.testing
from support import make_server
from test_endpoints import Raw, Reply, connect

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


async def test_a_drain_returns_when_the_last_http_response_ends(autojump_clock, nursery) -> None:
    """A drain waits for the response in flight (4 s) within its grace, closes the idle
    keep-alive connection at once, and returns as soon as the last connection closed."""
    server = make_server()
    idle, streaming = connect(nursery, server), connect(nursery, server)
    assert (await send_raw(idle, "GET", "/v1/models", [("authorization", "Bearer k")])).status == 200
    seen: dict[str, Any] = {}

    async def stream() -> None:
        seen["events"] = await post_stream(streaming, LONG)
        seen["ended_at"] = trio.current_time()

    nursery.start_soon(stream)
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
    seen: dict[str, Any] = {}

    async def stream() -> None:
        seen["events"] = await post_stream(streaming, LONG)
        seen["ended_at"] = trio.current_time()

    nursery.start_soon(stream)
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
                                          "application/json ;charset=utf-8"])
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
    assert (error["code"], error["message"].startswith("Malformed HTTP request: "), error["message"][-1]) == ("bad_request", True, ".")


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
    client = connect(nursery, make_server(config=ServerConfig(http_idle_timeout=0.0001)))
    reply = await send_raw(client, "GET", "/v1/models", [AUTH])
    assert reply.status == 200


async def test_connection_close_is_honoured_after_the_answer(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    reply = await send_raw(client, "GET", "/v1/models", [AUTH, ("connection", "close")])
    assert reply.status == 200
    with trio.fail_after(WAIT):
        assert await client.stream.receive_some(10) == b""
