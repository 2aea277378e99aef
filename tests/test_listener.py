"""The listener (server/app.py, server/streams.py): one port for HTTP and the WebSocket upgrade; the head read
bounded in size and time; each handshake refused with its status or accepted with its design and betas."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
import trio_websocket
from support import make_server
from test_bad_input import first_leaf

from prototype.protocol.wire import TIMING_HEADER
from prototype.server import http
from prototype.server.app import serve_responses
from prototype.server.config import HEAD_TIMEOUT_SECONDS, MAX_HEAD_BYTES, ServerConfig
from prototype.server.streams import HeadTooLarge, ReplayStream, read_head

WAIT = 100.0  # virtual seconds: any wait of these tests ends far sooner, and a hang fails at once


# --- before the request: the head, the connection limit, a drain ---------------------------------------


async def answer_before_the_request(server, nursery: trio.Nursery, sent: bytes) -> tuple[list[bytes], bytes]:
    """The head lines and body of the one answer the server writes before it closes."""
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(sent)
    data = b""
    with trio.fail_after(WAIT):
        while chunk := await client.receive_some(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), payload


SHUTTING_DOWN = {"type": "server_error", "code": "server_shutting_down", "message": "The server is shutting down; retry on a new connection.",
                 "param": None}


@pytest.mark.parametrize(("sent", "draining", "status", "error"), [
    (b"GET /v1/responses HTTP/1.1\r\nx-pad: " + b"a" * MAX_HEAD_BYTES, False, b"431 Request Header Fields Too Large",
     {"type": "invalid_request_error", "code": "request_header_too_large", "message": "The request head is too large.", "param": None}),
    (b"NOT HTTP AT ALL\r\n\r\n", False, b"400 Bad Request",
     {"type": "invalid_request_error", "code": "bad_request", "message": "Malformed HTTP request head.", "param": None}),
    (b"GET /v1/models HTTP/1.1\r\nhost: testbed\r\n\r\n", True, b"503 Service Unavailable", SHUTTING_DOWN),
], ids=["head too large", "not HTTP", "draining"])
async def test_a_connection_refused_before_its_request_gets_a_framed_error_and_closes(autojump_clock, nursery, sent, draining, status, error) -> None:
    server = make_server()
    server.draining = draining
    head, payload = await answer_before_the_request(server, nursery, sent)
    assert head == [b"HTTP/1.1 " + status, b"content-type: application/json", f"content-length: {len(payload)}".encode(), b"connection: close"]
    assert json.loads(payload) == {"error": error}


async def test_a_handler_fault_ends_its_connection_only_logged_with_its_traceback(autojump_clock, nursery, monkeypatch, caplog) -> None:
    async def broken(*args) -> None:
        raise RuntimeError("boom")

    server, serve_http = make_server(), http.serve_http
    models = b"GET /v1/models HTTP/1.1\r\nhost: testbed\r\nauthorization: Bearer testbed\r\nconnection: close\r\n\r\n"
    monkeypatch.setattr(http, "serve_http", broken)
    with caplog.at_level("ERROR", logger="prototype.server.app"):
        assert (await answer_before_the_request(server, nursery, models), server.connections) == (([b""], b""), 0)
    logged = [(r.name, r.getMessage(), r.exc_info[0]) for r in caplog.records]
    assert logged == [("prototype.server.app", "connection handler failed", RuntimeError)]
    monkeypatch.setattr(http, "serve_http", serve_http)
    assert (await answer_before_the_request(server, nursery, models))[0][0] == b"HTTP/1.1 200 OK"  # the server serves on


@pytest.mark.parametrize(("half_closes", "closed_at"), [(False, HEAD_TIMEOUT_SECONDS), (True, 0.0)], ids=["stalls", "half-closes"])
async def test_a_connection_that_never_finishes_its_head_is_closed_without_an_answer(autojump_clock, nursery, half_closes, closed_at) -> None:
    server = make_server()
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/responses HTTP/1.1\r\n")  # never finished
    if half_closes:  # the peer's end of stream comes before a head: nothing to answer
        await client.send_eof()
    with trio.fail_after(WAIT):
        assert await client.receive_some(65536) == b""
    assert (trio.current_time(), server.connections) == (closed_at, 0)


async def test_the_listener_binds_a_free_loopback_port_by_default(nursery) -> None:
    with trio.fail_after(10):  # real seconds: a listener that never reports it started
        first, second = [await nursery.start(serve_responses, make_server()) for _ in range(2)]
    (host, port), (_, other_port) = [listeners[0].socket.getsockname() for listeners in (first, second)]
    assert (host, len(first), len(second)) == ("127.0.0.1", 1, 1) and port != other_port


# --- the WebSocket handshake ------------------------------------------------------------------------------


@asynccontextmanager
async def handshake(server, headers: list, resource: str = "/v1/responses"):
    """A client WebSocket to `server` with exactly `headers` (no others added)."""
    client, server_end = trio.testing.memory_stream_pair()
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.handle_stream, server_end)
            ws = await trio_websocket.wrap_client_stream(nursery, client, "testbed", resource, extra_headers=headers)
            try:
                yield ws
            finally:
                nursery.cancel_scope.cancel()


async def refusal_of(server, headers: list, resource: str = "/v1/responses") -> tuple[int, dict]:
    refused: list[trio_websocket.ConnectionRejected] = []
    try:
        async with handshake(server, headers, resource):
            pass
    except* trio_websocket.ConnectionRejected as group:
        refused.append(first_leaf(group))
    assert refused, "the handshake was accepted"
    assert (b"content-type", b"application/json") in refused[0].headers
    return refused[0].status_code, json.loads(refused[0].body)


AUTH = (b"authorization", b"Bearer testbed")


async def test_each_handshake_refusal_has_its_status_and_message(autojump_clock) -> None:
    server = make_server()
    assert await refusal_of(server, [AUTH], "/v1/chat") == (404, {"error": {
        "type": "invalid_request_error", "code": "not_found", "message": "No WebSocket endpoint at b'/v1/chat'.", "param": None}})
    assert await refusal_of(server, [AUTH, (b"openai-beta", b"responses_websockets=2025-01-01")]) == (400, {"error": {
        "type": "invalid_request_error", "code": "unsupported_beta", "message": "Unknown responses_websockets version '2025-01-01'.",
        "param": "OpenAI-Beta"}})
    long_path = "/v1/" + "p" * 80  # named up to its first 64 bytes
    assert (await refusal_of(server, [AUTH], long_path))[1]["error"]["message"] == f"No WebSocket endpoint at {long_path.encode()[:64]!r}."
    # The value is everything after the first "=", named up to its first 32 characters.
    long_value = "2026-02-06=" + "x" * 40
    assert (await refusal_of(server, [AUTH, (b"openai-beta", b"responses_websockets=" + long_value.encode())]))[1]["error"]["message"] == (
        f"Unknown responses_websockets version {long_value[:32]!r}.")
    disabled = make_server(config=ServerConfig(websocket_enabled=False))
    assert await refusal_of(disabled, [AUTH]) == (426, {"error": {
        "type": "invalid_request_error", "code": "upgrade_required", "message": "WebSocket mode is disabled on this server; use HTTP.",
        "param": None}})


INJECT = {"type": "response.inject", "response_id": "resp_1", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}


@pytest.mark.parametrize(("beta", "answer", "multi_agent"), [
    (None, "unknown_event_type", False),  # no header: v2
    (b"other=1,responses_websockets=2026-02-04", "no_suspended_response", False),  # entries split on commas, without spaces too
    (b"other=1, responses_websockets=2026-02-06", "unknown_event_type", False),
    (b"responses_websockets=2026-02-06, responses_multi_agent=v1", "unknown_event_type", True),
    (b"responses_multi_agent=v1,responses_websockets=2026-02-06", "unknown_event_type", True),
])
async def test_the_beta_header_selects_the_design_and_the_multi_agent_beta_is_one_entry_of_it(autojump_clock, beta, answer, multi_agent) -> None:
    async with handshake(make_server(), [AUTH] if beta is None else [AUTH, (b"openai-beta", beta)]) as ws:
        await ws.send_message(json.dumps({"type": "response.append", "input": []}))  # v1: nothing suspended; v2: unknown
        assert json.loads(await ws.get_message())["error"]["code"] == answer
        await ws.send_message(json.dumps(INJECT))  # with the beta it is taken (its target is not found); without, unknown
        injected = json.loads(await ws.get_message())
    assert (injected["type"], injected.get("error", {}).get("code")) == (
        ("response.inject.failed", "response_not_found") if multi_agent else ("error", "unknown_event_type"))


async def test_a_connection_cancelled_mid_session_still_closes_its_websocket_with_the_close_handshake(autojump_clock, nursery) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    serving = trio.CancelScope()

    async def serve() -> None:
        with serving:
            await make_server().handle_stream(server_end)

    nursery.start_soon(serve)
    ws = await trio_websocket.wrap_client_stream(nursery, client, "testbed", "/v1/responses", extra_headers=[AUTH])
    serving.cancel()  # a listener stopped with a session open (no drain)
    with pytest.raises(trio_websocket.ConnectionClosed) as closed, trio.fail_after(WAIT):
        await ws.get_message()
    assert (closed.value.reason.code, trio.current_time()) == (1000, 0.0)


async def test_the_handshake_gives_the_connection_its_design_client_timing_and_number(autojump_clock) -> None:
    server = make_server(config=ServerConfig(worker=3))
    headers = [AUTH, (b"openai-beta", b"responses_websockets=2026-02-04"), (b"user-agent", b"codex/1"), (TIMING_HEADER.encode(), b"TRUE")]
    create = {"type": "response.create", "model": "sim-1000", "input": "go", "metadata": {"testbed_workload": "fixed:1"}}
    terminals = []
    async with handshake(server, headers) as first, handshake(server, [AUTH]) as second:
        workers = [dict(ws.handshake_headers).get(b"x-testbed-worker") for ws in (first, second)]
        for ws in (first, second):
            await ws.send_message(json.dumps(create))
            while (event := json.loads(await ws.get_message()))["type"] != "response.completed":
                pass
            terminals.append(event)
    async with handshake(make_server(), [AUTH]) as unnumbered:  # a server that is no worker of several sends none
        assert b"x-testbed-worker" not in dict(unnumbered.handshake_headers)
    assert (workers, ["testbed_timing" in event["response"] for event in terminals]) == ([b"3", b"3"], [True, False])
    assert [(r["design"], r["user_agent"], r["connection"], r["timing_requested"]) for r in server.records] == [
        ("suspended", "codex/1", 1, True), ("chained", "", 2, False)]


# --- the head reader and the replay stream (server/streams.py) -----------------------------------------


async def test_read_head_reads_until_the_blank_line_keeping_what_came_with_it_or_nothing_if_the_peer_closes(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    await client.send_all(b"GET / HTTP/1.1\r\nhost: t\r\n")
    await client.send_all(b"\r\nbody")
    with trio.fail_after(WAIT):
        assert await read_head(server_end, 64) == b"GET / HTTP/1.1\r\nhost: t\r\n\r\nbody"
        await client.send_all(b"GET / HTTP/1.1\r\n")
        await client.aclose()
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


async def test_read_head_takes_a_head_in_reads_of_64_kib(autojump_clock) -> None:
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
    assert (await read_head(Counting(head), 100_000), sizes) == (head, [65536, 65536])


async def test_a_replay_stream_gives_its_prefix_then_reads_the_inner_stream(autojump_clock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    replay = ReplayStream(server_end, b"abcdefgh")
    with trio.fail_after(WAIT):
        assert (await replay.receive_some(3), await replay.receive_some(None)) == (b"abc", b"defgh")
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
    client, server_end = trio.testing.memory_stream_pair()  # a read of the whole prefix, then the inner stream
    replay = ReplayStream(server_end, b"head")
    await client.send_all(b"tail")
    with trio.fail_after(WAIT):
        assert (await replay.receive_some(4), await replay.receive_some(4)) == (b"head", b"tail")

