"""`POST /v1/responses` on the WebSocket's port (server/http/): exact status, headers and body; keep-alive;
chunked SSE or JSON answers; each way an answer fails before or after its stream started (docs/protocol.md, §8)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from support import DELAYED_LINK, H11Client, make_server

from prototype import netem
from prototype.client.harness import HARNESS_TOOLS
from prototype.client.sse import parse_stream
from prototype.designs.emitter import EngineFailure
from prototype.engine.engine import Engine
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.protocol.items import parse_input
from prototype.server import routes
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from prototype.server.http import answers

WAIT = 100.0  # virtual seconds: every wait of these tests ends far sooner, and a hang fails at once
MODEL = "sim-1000"


def create_body(input: Any = "fix the bug", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": input, "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:3"}, "store": False, **fields}


def create(**fields: Any) -> bytes:
    """A one-turn create body, as bytes."""
    return json.dumps({"model": MODEL, "input": "hi", "metadata": {"testbed_workload": "fixed:1"}, **fields}).encode()


# --- a raw HTTP/1.1 client ---------------------------------------------------------------------------


@attrs.define(eq=False)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient(H11Client):
    """An h11 client on one connection; `request` sends a host, the content length, `auth` and
    `content_type` unless None, then `headers`."""

    async def request(self, method: str = "POST", target: str = "/v1/responses", **fields: Any) -> Answer:
        with trio.fail_after(WAIT):
            await self.send(method, target, **fields)
            return await self.answer()

    async def send(self, method: str, target: str, *, body: bytes | dict | None = None, headers: list[tuple[str, str]] | None = None,
                   auth: str | None = "Bearer testbed", content_type: str | None = "application/json") -> None:
        body = json.dumps(body).encode() if isinstance(body, dict) else body or b""
        all_headers = [("host", "testbed"), ("content-length", str(len(body)))]
        all_headers += [("authorization", auth)] if auth is not None else []
        all_headers += [("content-type", content_type)] if content_type is not None else []
        data = self.conn.send(h11.Request(method=method, target=target, headers=all_headers + (headers or [])))
        await self.stream.send_all(data + (self.conn.send(h11.Data(data=body)) if body else b"") + self.conn.send(h11.EndOfMessage()))

    async def answer(self) -> Answer:
        """The next answer, past any informational ones (their statuses kept in `informational`)."""
        response = await self._next()
        self.informational = []
        while isinstance(response, h11.InformationalResponse):
            self.informational.append(response.status_code)
            response = await self._next()
        assert isinstance(response, h11.Response), response
        body = bytearray()
        while not isinstance(event := await self._next(), h11.EndOfMessage):
            body += event.data
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return Answer(response.status_code, {k.decode().lower(): v.decode() for k, v in response.headers}, bytes(body))

    async def server_closed(self) -> bool:
        with trio.fail_after(WAIT):
            return await self.stream.receive_some(10) == b""

    async def everything(self) -> bytes:
        """Every byte the server sends until it closes (for answers h11 on this side cannot follow)."""
        data = b""
        with trio.fail_after(WAIT):
            while chunk := await self.stream.receive_some(65536):
                data += chunk
        return data


@attrs.define(eq=False)
class Link:
    """Connections to `server`, its side run in `nursery`: zero-latency pipes, or links with `network`'s delay."""

    nursery: trio.Nursery
    server: ResponsesServer
    network: netem.NetworkProfile | None = None

    def open(self) -> RawClient:
        """A zero-latency pipe."""
        client, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_end)
        return RawClient(client)

    async def connect(self) -> RawClient:
        """A connection over `network` (a zero-latency pipe when it is None)."""
        if self.network is None:
            return self.open()
        client, server_end = await self.nursery.start(self._hold_link)
        self.nursery.start_soon(self.server.handle_stream, server_end)
        return RawClient(client)

    async def _hold_link(self, task_status: trio.TaskStatus) -> None:
        async with netem.open_emulated_pair(self.network) as pair:
            task_status.started(pair)
            await trio.sleep_forever()  # until the test's nursery is cancelled


@pytest.fixture(params=[None, DELAYED_LINK], ids=["pipe", "rtt-20ms"])
def network(request):
    return request.param


def error_of(answer: Answer, status: int, code: str, param: str | None = None, *, type: str = "invalid_request_error") -> dict[str, Any]:
    """The error of a JSON refusal, after checking its status, framing and every field but the message."""
    assert (answer.status, answer.headers["content-type"], answer.headers["content-length"]) == (
        status, "application/json", str(len(answer.body))), answer
    error = answer.json()["error"]
    assert (set(error), error["type"], error["code"], error["param"]) == ({"type", "code", "message", "param"}, type, code, param), error
    assert error["message"]
    return error


def assert_completed_stream(answer: Answer) -> list[Any]:
    assert (answer.status, answer.headers["content-type"][:17], answer.headers["transfer-encoding"]) == (200, "text/event-stream", "chunked")
    events = parse_stream(answer.body)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    return events


def sse_events(answer: Answer) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in answer.body.split(b"\n") if line.startswith(b"data: ")]


def open_client(nursery: trio.Nursery, server: ResponsesServer) -> RawClient:
    return Link(nursery, server).open()


# --- bearer auth, shared with the WebSocket ----------------------------------------------------------

MISSING = "Missing bearer authentication in header."
INCORRECT = "Incorrect API key provided."


def unauthorized(answer: Answer) -> str:
    assert answer.headers["www-authenticate"] == "Bearer"
    return error_of(answer, 401, "invalid_api_key")["message"]


KEYS = frozenset({"alice", "two words"})


@pytest.mark.parametrize(("keys", "authorization", "message"), [
    (KEYS, None, MISSING),
    (KEYS, "Bearer", MISSING),  # a scheme without a key (h11 strips the trailing space of "Bearer ")
    (KEYS, "Basic YWxpY2U6cHc=", MISSING),
    (KEYS, "Bearer bob", INCORRECT),
    (KEYS, "Bearer alice", None),
    (KEYS, "bearer alice", None),  # the scheme in any case (RFC 9110 §11.1)
    (KEYS, "BEARER alice", None),
    (KEYS, "Bearer   alice", None),  # spaces around the key are not part of it
    (KEYS, "Bearer two words", None),  # the key is everything after the scheme's one space
    *((None, auth, message) for auth, message in ((None, MISSING), ("Bearer", MISSING), ("Token bob", MISSING), ("Bearer bob", None),
                                                  ("Bearer anyone at all", None))),  # no keys configured: any bearer key
])
async def test_bearer_auth_against_the_configured_keys_or_any_key(autojump_clock, nursery, keys, authorization, message) -> None:
    client = open_client(nursery, make_server(config=ServerConfig(api_keys=keys)))
    answer = await client.request("GET", "/v1/models", auth=authorization, content_type=None)
    if message is None:
        assert answer.status == 200 and answer.json()["object"] == "list"
    else:
        assert unauthorized(answer) == message


# --- the refusals of a create --------------------------------------------------------------------------


async def test_each_refusal_of_a_create_has_its_status_message_and_headers(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())

    def refused(answer: Answer, status: int, code: str, param: str | None = None) -> str:
        assert "www-authenticate" not in answer.headers  # only an auth refusal asks for bearer auth
        return error_of(answer, status, code, param)["message"]

    assert refused(await client.request("POST", "/v1/chat?x=1", body=create()), 404, "not_found") == "Invalid URL (POST /v1/chat?x=1)."
    long_target = "/v1/" + "a" * 200  # named up to its first 128 characters
    assert refused(await client.request("POST", long_target, body=create()), 404, "not_found") == f"Invalid URL (POST {long_target[:128]})."
    get = await client.request("GET", content_type=None)
    assert refused(get, 405, "method_not_allowed") == "Method GET is not allowed on /v1/responses: use POST, or GET with Upgrade: websocket."
    assert get.headers["allow"] == "POST"
    long_method = "PROPFINDEXTENDEDLONG"  # named up to its first 16 characters
    assert refused(await client.request(long_method, content_type=None), 405, "method_not_allowed") == (
        "Method PROPFINDEXTENDED is not allowed on /v1/responses: use POST, or GET with Upgrade: websocket.")
    head = await client.request("HEAD", content_type=None)  # the head of the body it would send, no body
    assert (head.status, head.body, head.headers["allow"], int(head.headers["content-length"])) == (
        405, b"", "POST", len(get.body) + len("HEAD") - len("GET"))
    assert unauthorized(await client.request(body=create(), auth=None)) == MISSING
    assert refused(await client.request(body=create(), content_type="text/plain"), 415, "unsupported_media_type") == (
        "Content-Type 'text/plain' is not supported: send application/json.")
    long_type = "text/" + "x" * 100  # named up to its first 64 characters
    assert refused(await client.request(body=create(), content_type=long_type), 415, "unsupported_media_type") == (
        f"Content-Type {long_type[:64]!r} is not supported: send application/json.")
    assert refused(await client.request(body=b"[1]"), 400, "invalid_json") == "The request body must be one JSON object."
    # After every refusal the connection still serves.
    assert (await client.request(body=create())).json()["status"] == "completed"


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8", "Application/JSON",
                                          "application/json ;charset=utf-8", "application/json; charset=utf-8; v=1"])
async def test_a_json_body_is_read_under_any_spelling_of_its_media_type(autojump_clock, nursery, content_type) -> None:
    answer = await open_client(nursery, make_server()).request(body=create(), content_type=content_type)
    assert (answer.status, answer.json()["status"]) == (200, "completed")


async def test_a_query_holding_a_question_mark_is_not_part_of_the_path(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())
    answer = await client.request("POST", "/v1/responses?a=1?b=2", body=create())
    assert (answer.status, answer.json()["status"]) == (200, "completed")
    assert (await client.request("GET", "/v1/models?x=?", content_type=None)).status == 200


async def test_a_body_larger_than_the_limit_is_refused_and_the_connection_closed(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(max_body_bytes=200))
    fits = create(input="x" * (200 - len(create(input=""))))
    assert len(fits) == 200
    client = open_client(nursery, server)
    assert (await client.request(body=fits)).status == 200  # exactly the limit
    refused = await client.request(body=fits + b" ")
    assert error_of(refused, 413, "request_too_large")["message"] == "The request body is larger than 200 bytes."
    assert refused.headers["connection"] == "close" and await client.server_closed()
    # A chunked body: read up to the limit, refused past it.
    for data, status in ((fits, 200), (fits + b" ", 413)):
        client = open_client(nursery, server)
        out = client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
            ("host", "t"), ("transfer-encoding", "chunked"), ("authorization", "Bearer k"), ("content-type", "application/json")]))
        out += client.conn.send(h11.Data(data=data[:100])) + client.conn.send(h11.Data(data=data[100:])) + client.conn.send(h11.EndOfMessage())
        await client.stream.send_all(out)
        assert (await client.answer()).status == status


async def test_a_client_that_expects_100_continue_gets_it_unless_its_declared_body_is_too_large(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server(config=ServerConfig(max_body_bytes=200)))
    data = create()
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), ("expect", "100-continue"), ("authorization", "Bearer k")])))
    with trio.fail_after(WAIT):
        informational = await client._next()
        assert (type(informational), informational.status_code, informational.reason) == (h11.InformationalResponse, 100, b"Continue")
        await client.stream.send_all(client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
        answer = await client.answer()
    assert (answer.status, answer.json()["status"]) == (200, "completed")
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", "201"), ("expect", "100-continue"), ("authorization", "Bearer k")])))
    with trio.fail_after(WAIT):
        first = await client._next()
    # Refused before any 100 Continue, announcing the close: the body it declared is never read.
    assert (type(first), first.status_code, dict(first.headers).get(b"connection")) == (h11.Response, 413, b"close")


async def test_a_body_that_stalls_gets_408_at_the_idle_timeout(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server(config=ServerConfig(http_idle_timeout=7.0)))
    await trio.sleep(1.0)
    client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[("host", "t"), ("content-length", "100")]))
    await client.stream.send_all(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\nauthorization: Bearer k\r\n\r\n{\"mo")
    with trio.fail_after(WAIT):
        answer = await client.answer()
    assert error_of(answer, 408, "request_timeout")["message"] == "The request body did not arrive in time."
    assert (trio.current_time(), answer.headers["connection"]) == (8.0, "close")


async def test_a_body_cut_short_is_a_bad_request_and_the_connection_closes(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())
    await client.stream.send_all(b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\nauthorization: Bearer k\r\n\r\n{\"mo")
    await client.stream.send_eof()
    head, _, payload = (await client.everything()).partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request" and b"connection: close" in head.split(b"\r\n")
    assert json.loads(payload)["error"] == {"type": "invalid_request_error", "code": "bad_request", "param": None, "message":
                                            "Malformed HTTP request: peer closed connection without sending complete message body (received 4 bytes, expected 100)."}


async def test_a_second_request_h11_cannot_parse_is_a_bad_request(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())
    assert (await client.request("GET", "/v1/models", content_type=None)).status == 200
    await client.stream.send_all(b"GET /v1/models HTTP/1.1\r\nbad header\r\n\r\n")
    head, _, payload = (await client.everything()).partition(b"\r\n\r\n")
    assert (head.split(b"\r\n")[0], json.loads(payload)["error"]["code"], json.loads(payload)["error"]["message"]) == (
        b"HTTP/1.1 400 Bad Request", "bad_request", "Malformed HTTP request: illegal header line: bytearray(b'bad header').")


# --- keep-alive ------------------------------------------------------------------------------------------


async def test_one_connection_serves_request_after_request_until_it_asks_to_close(autojump_clock, nursery, network) -> None:
    server = make_server()
    client = await Link(nursery, server, network).connect()
    first = assert_completed_stream(await client.request(body=create_body(stream=True)))
    response = first[-1].data["response"]
    call = next(item for item in response["output"] if item["type"] == "function_call")
    resent = [item.to_dict() for item in parse_input("fix the bug")] + response["output"]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    assert_completed_stream(await client.request(body=create_body([*resent, answer], stream=True)))
    assert server.connections == 1
    assert_completed_stream(await client.request(body=create_body(stream=True), headers=[("connection", "close")]))
    assert await client.server_closed()


async def test_a_keep_alive_connection_idles_out_after_the_idle_timeout(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(http_idle_timeout=5.0))
    client = open_client(nursery, server)
    assert (await client.request("GET", "/v1/models", content_type=None)).status == 200
    await trio.sleep(4.9)  # within the idle timeout the connection still serves
    assert (await client.request("GET", "/v1/models", content_type=None)).status == 200 and await client.server_closed()
    assert trio.current_time() == pytest.approx(9.9) and server.http_idle == set()


async def test_a_first_request_is_not_held_to_the_idle_timeout(autojump_clock, nursery) -> None:
    # The listener already read the first head: only the body is bound by the idle timeout.
    client = open_client(nursery, make_server(config=ServerConfig(http_idle_timeout=0.0)))
    assert (await client.request("GET", "/v1/models", content_type=None)).status == 200


async def test_a_later_request_may_have_a_head_of_up_to_the_head_limit(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())
    assert (await client.request("GET", "/v1/models", content_type=None)).status == 200
    # The head arrives in two parts: the first, 20,000 bytes, is an incomplete head past h11's default limit of 16 KiB.
    head = client.conn.send(h11.Request(method="GET", target="/v1/models", headers=[("host", "t"), ("authorization", "Bearer k"),
                                                                                   ("x-pad", "p" * 40_000)]))
    await client.stream.send_all(head[:20_000])
    await trio.testing.wait_all_tasks_blocked()
    await client.stream.send_all(head[20_000:] + client.conn.send(h11.EndOfMessage()))
    assert (await client.answer()).status == 200


# --- the answer: JSON, or one SSE event a chunk ---------------------------------------------------------


async def test_stream_false_returns_the_response_json(autojump_clock, nursery, network) -> None:
    client = await Link(nursery, make_server(), network).connect()
    answer = await client.request(body=create_body(stream=False))
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    response = answer.json()
    assert response["object"] == "response" and response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["usage"]["output_tokens"] > 0 and "testbed_timing" not in response
    timed = await client.request(body=create_body(stream=False), headers=[("x-responsesapi-include-timing-metrics", "true")])
    assert "prefill" in timed.json()["testbed_timing"]["phases_ms"]
    capped = (await client.request(body=create_body(stream=False, max_output_tokens=16))).json()
    assert (capped["status"], capped["incomplete_details"], capped["usage"]["output_tokens"]) == (
        "incomplete", {"reason": "max_output_tokens"}, 16)  # the API's smallest cap


async def test_a_stream_is_one_chunk_per_event_after_its_headers(autojump_clock, nursery) -> None:
    client = open_client(nursery, make_server())
    data = create(stream=True)
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), ("authorization", "Bearer k")])) + client.conn.send(h11.Data(data=data))
        + client.conn.send(h11.EndOfMessage()))
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


# --- each way the answer fails -----------------------------------------------------------------------------


def snapshot(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_x", "object": "response", "status": status, **fields}


CREATED = ev.ResponseCreated(0, snapshot("in_progress"))
INTERNAL = {"error": {"type": "server_error", "code": "server_error", "message": "Internal error: RuntimeError.", "param": None}}


def faulty_turn(*steps: Any):
    """A stand-in for the http design's turn: sends `steps` in order, raising the exception among them."""

    async def turn(api, request, sink, **kwargs):
        for step in steps:
            if isinstance(step, BaseException):
                raise step
            await sink(step)

    return turn


async def post_once(client: RawClient, *, stream: bool) -> Answer:
    return await client.request(body=create(stream=stream))


async def test_a_refusal_before_the_stream_starts_is_an_http_error_and_the_connection_serves_on(autojump_clock, nursery, monkeypatch) -> None:
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(ProtocolError("invalid_value", "Refused.", param="input")))
    server = make_server()
    client = open_client(nursery, server)
    for stream in (True, False):
        answer = await post_once(client, stream=stream)
        assert error_of(answer, 400, "invalid_value", "input")["message"] == "Refused." and "connection" not in answer.headers
    assert [r["outcome"] for r in server.records] == ["error:invalid_value"] * 2
    monkeypatch.undo()
    assert (await post_once(client, stream=False)).json()["status"] == "completed"


async def test_a_fault_before_the_stream_starts_is_a_500_and_the_connection_closes(autojump_clock, nursery, monkeypatch) -> None:
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(RuntimeError("boom")))
    server = make_server()
    streaming, collecting = open_client(nursery, server), open_client(nursery, server)
    answer = await post_once(streaming, stream=True)
    assert (answer.status, answer.json(), answer.headers["connection"]) == (500, INTERNAL, "close")
    assert await streaming.server_closed()
    answer = await post_once(collecting, stream=False)  # the whole answer was read: the connection stays open
    assert (answer.status, answer.json(), "connection" in answer.headers) == (500, INTERNAL, False)
    assert [r["outcome"] for r in server.records] == ["error:server_error"] * 2
    # A fault is named by its type; a turn that ends without its terminal event or a refusal is an internal error too.
    for fault, message in ((KeyError("k"), "Internal error: KeyError."), (EngineFailure("injected"), INTERNAL["error"]["message"])):
        monkeypatch.setattr(answers, "run_http_turn", faulty_turn(fault))
        answer = await post_once(collecting, stream=False)
        assert (answer.status, answer.json()) == (500, {"error": {**INTERNAL["error"], "message": message}})


async def test_a_fault_after_the_stream_started_is_a_flat_error_with_the_next_sequence_number(autojump_clock, nursery, monkeypatch) -> None:
    in_progress = ev.ResponseInProgress(1, snapshot("in_progress"))
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(CREATED, in_progress, RuntimeError("boom")))
    client = open_client(nursery, make_server())
    assert sse_events(await post_once(client, stream=True)) == [CREATED.to_dict(), in_progress.to_dict(), {
        "type": "error", "code": "server_error", "message": "Internal error: RuntimeError.", "param": None, "sequence_number": 2}]
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(CREATED, ProtocolError("invalid_value", "Late.", param="input")))
    assert sse_events(await post_once(client, stream=True)) == [CREATED.to_dict(), {
        "type": "error", "code": "invalid_value", "message": "Late.", "param": "input", "sequence_number": 1}]
    # Without a terminal event the collected answer is the error itself.
    assert error_of(await post_once(client, stream=False), 400, "invalid_value", "input")["message"] == "Late."
    monkeypatch.undo()
    assert (await post_once(client, stream=False)).json()["status"] == "completed"  # the same connection


async def test_a_fault_after_the_terminal_event_adds_nothing_to_the_stream(autojump_clock, nursery, monkeypatch) -> None:
    completed = ev.ResponseCompleted(1, snapshot("completed"))
    client = open_client(nursery, make_server())
    for fault in (ProtocolError("invalid_value", "Late."), RuntimeError("boom")):
        monkeypatch.setattr(answers, "run_http_turn", faulty_turn(CREATED, completed, fault))
        assert sse_events(await post_once(client, stream=True)) == [CREATED.to_dict(), completed.to_dict()]
    answer = await post_once(client, stream=False)  # the terminal snapshot is the answer
    assert (answer.status, answer.json()) == (200, snapshot("completed"))


async def test_a_failed_response_is_a_500_with_its_error_and_the_records_say_so(autojump_clock, nursery, monkeypatch) -> None:
    failed = ev.ResponseFailed(1, snapshot("failed", error={"code": "server_error", "message": "The engine failed mid-response."}))
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(CREATED, failed, EngineFailure("injected")))
    server = make_server()
    client = open_client(nursery, server)
    # A refusal first, so that the failure's record cannot take its code.
    await client.request(body=create(), content_type="text/plain")
    assert [e["type"] for e in sse_events(await post_once(client, stream=True))] == ["response.created", "response.failed"]
    answer = await post_once(client, stream=False)
    assert (answer.status, answer.json()) == (500, {"error": {"type": "server_error", "code": "server_error",
                                                              "message": "The engine failed mid-response.", "param": None}})
    assert [r["outcome"] for r in server.records] == ["error:unsupported_media_type", "error:server_error", "error:server_error"]
    assert (await post_once(client, stream=True)).status == 200  # the connection serves on
    # A failed response without its error: a 500 server_error all the same.
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(ev.ResponseFailed(0, snapshot("failed"))))
    answer = await post_once(client, stream=False)
    assert (answer.status, answer.json()) == (500, {"error": {"type": "server_error", "code": "server_error", "message": "", "param": None}})


async def test_each_handler_fault_is_a_500_logged_with_its_traceback(autojump_clock, nursery, monkeypatch, caplog) -> None:
    async def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    client, answer = open_client(nursery, make_server()), routes.answer
    monkeypatch.setattr(routes, "answer", broken)
    monkeypatch.setattr(answers, "run_http_turn", faulty_turn(RuntimeError("boom")))
    with caplog.at_level("ERROR", logger="prototype.server.http"):
        models = await client.request("GET", "/v1/models", content_type=None)
        assert (models.status, models.json(), "connection" in models.headers) == (500, INTERNAL, False)
        monkeypatch.setattr(routes, "answer", answer)
        assert (await client.request("GET", "/v1/models", content_type=None)).status == 200  # the same connection serves on
        assert [(await post_once(client, stream=stream)).status for stream in (False, True)] == [500, 500]
    assert [(r.name, r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("prototype.server.http", "endpoint handler failed", RuntimeError), ("prototype.server.http", "http response handler failed", RuntimeError),
        ("prototype.server.http", "http response handler failed", RuntimeError)]


class FailingEngine(Engine):
    """Fails the first `failures` model calls."""

    failures: int = 2

    async def prefill(self, latency, *, uncached: int, cached: int, start: float | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise EngineFailure("injected")
        await super().prefill(latency, uncached=uncached, cached=cached)


async def test_engine_failure_ends_the_stream_with_response_failed(autojump_clock, nursery, network) -> None:
    client = await Link(nursery, make_server(engine=FailingEngine()), network).connect()
    events = parse_stream((await client.request(body=create_body(stream=True))).body)
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].data["response"]["error"] == {"code": "server_error", "message": "The engine failed mid-response: injected"}
    answer = await client.request(body=create_body(stream=False))
    error_of(answer, 500, "server_error", type="server_error")
    assert_completed_stream(await client.request(body=create_body(stream=True)))  # same connection
