"""The server's routes, connection handling, outbox and HTTP exchange held to exact answers: the
status, error code, param and message of each refusal, and what each route answers
(docs/protocol.md, "Stored responses", "Compaction", "Cancel"). In-process over memory streams under
the autojump clock (tests/support.py). Written against the survivors of the mutation runs
(docs/mutation.md)."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import attrs
import h11
import pytest
import trio
import trio.testing
import trio_websocket
from support import make_server
from test_bad_input import first_leaf
from test_endpoints import Raw, Reply, body, connect, error_of

from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService, owner_of
from prototype.client.sse import parse_stream
from prototype.protocol.wire import TIMING_HEADER
from prototype.server.app import ResponsesServer, drain, serve_responses
from prototype.server.config import HEAD_TIMEOUT_SECONDS, MAX_HEAD_BYTES, ServerConfig
from prototype.server.outbox import Outbox, send_one_by_one

# --- server/routes.py ---------------------------------------------------------------------------------


async def test_a_replay_from_starting_after_zero_skips_only_the_first_event(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    rid = (await client.request("POST", "/v1/responses", body=body(store=True))).json()["id"]
    replay = parse_stream((await client.request("GET", f"/v1/responses/{rid}?stream=true")).body)
    after_zero = (await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=0")).body
    assert [json.loads(line[6:]) for line in after_zero.split(b"\n") if line.startswith(b"data: ")] == [e.data for e in replay[1:]]
    assert error_of(await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=-1"), 400, "integer_below_min_value",
                    "starting_after") == "Invalid 'starting_after': integer below minimum value. Expected a value >= 0, but got -1 instead."


async def test_a_cancel_during_post_inference_finds_a_completed_response(autojump_clock, nursery) -> None:
    """Billing and the store write run after the response took its final status and before its
    terminal event: the response is still live, no longer cancellable."""
    server = make_server(costs=attrs.evolve(ZERO_COSTS, post=1.0))
    streaming, http = connect(nursery, server), connect(nursery, server)
    await streaming.start("POST", "/v1/responses", body=body(stream=True, metadata={"testbed_workload": "fixed:1"}))
    events = await streaming.events_until("response.output_item.done")
    rid, done_at = events[0]["response"]["id"], trio.current_time()
    assert server.api.live.find(rid, owner_of("alice")) is not None
    refused = await http.request("POST", f"/v1/responses/{rid}/cancel")
    assert error_of(refused, 400, "response_not_cancellable", "response_id") == "Cannot cancel a completed response."
    (terminal,) = await streaming.events_until("response.completed")
    assert (trio.current_time(), terminal["response"]["status"]) == (done_at + 1.0, "completed")


async def post_raw(client: Raw, target: str, data: bytes) -> Reply:
    """A POST whose body is `data` as it is (JSON or not)."""
    headers = [("host", "testbed"), ("content-length", str(len(data))), ("authorization", "Bearer alice"),
               ("content-type", "application/json")]
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target=target, headers=headers))
                                 + client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
    head = await client._next()
    return Reply(head.status_code, {k.decode().lower(): v.decode() for k, v in head.headers}, await client.rest())


def compact_body(**fields) -> dict:
    return {"model": "sim-1000", **fields}


async def test_compact_refuses_a_body_that_is_not_one_json_object(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    for raw, message in ((b"[1]", "The request body must be one JSON object."),
                         (b"{", "The request body is not valid JSON: Expecting property name enclosed in double quotes: "
                                "line 1 column 2 (char 1).")):
        assert error_of(await post_raw(client, "/v1/responses/compact", raw), 400, "invalid_json", None) == message


async def test_compact_needs_an_input_or_a_previous_response(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    refused = await client.request("POST", "/v1/responses/compact", body=compact_body(instructions="be brief"))
    assert error_of(refused, 400, "missing_required_parameter", "input") == "Missing required parameter: 'input'."
    # Either one is enough: an input alone, or a stored response alone.
    alone = await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug"))
    *users, _ = alone.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"]
    first = (await client.request("POST", "/v1/responses", body=body(store=True, metadata={"testbed_workload": "fixed:1"}))).json()
    chained = await client.request("POST", "/v1/responses/compact", body=compact_body(previous_response_id=first["id"]))
    *users, item = chained.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"] and item["type"] == "compaction"
    # Nothing is stored.
    assert server.api.store.get(chained.json()["id"]) is None


async def test_compact_reads_the_instructions(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    plain, instructed = [
        (await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug", **extra))).json()["usage"]
        for extra in ({}, {"instructions": "be brief"})
    ]
    created = (await client.request("POST", "/v1/responses", body={
        "model": "sim-1000", "input": "fix the bug", "instructions": "be brief", "metadata": {"testbed_workload": "fixed:1"}})).json()
    assert instructed["input_tokens"] == created["usage"]["input_tokens"] > plain["input_tokens"]


# --- server/app.py: the listener ----------------------------------------------------------------------


async def raw_reply(stream: trio.abc.Stream) -> tuple[int, dict]:
    """The status and JSON body of the one answer the server writes before it closes."""
    data = b""
    with trio.fail_after(WAIT):
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload)


async def test_a_head_past_the_limit_gets_431_and_the_connection_closes(autojump_clock, nursery) -> None:
    server = make_server()
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/responses HTTP/1.1\r\nx-pad: " + b"a" * MAX_HEAD_BYTES)
    assert await raw_reply(client) == (431, {"error": {
        "type": "invalid_request_error", "code": "request_header_too_large", "message": "The request head is too large.", "param": None}})


async def test_a_connection_that_sends_no_head_is_closed_after_the_head_timeout(autojump_clock, nursery) -> None:
    server = make_server()
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/responses HTTP/1.1\r\n")  # never finished
    with trio.fail_after(WAIT):
        assert await client.receive_some(65536) == b""
    assert (trio.current_time(), server.connections) == (HEAD_TIMEOUT_SECONDS, 0)


async def test_a_head_h11_cannot_parse_is_a_bad_request(autojump_clock, nursery) -> None:
    server = make_server()
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"NOT HTTP AT ALL\r\n\r\n")
    assert await raw_reply(client) == (400, {"error": {
        "type": "invalid_request_error", "code": "bad_request", "message": "Malformed HTTP request head.", "param": None}})


async def test_a_draining_server_refuses_a_new_connection_with_503(autojump_clock, nursery) -> None:
    server = make_server()
    server.draining = True
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/models HTTP/1.1\r\nhost: testbed\r\n\r\n")
    assert await raw_reply(client) == (503, {"error": {
        "type": "server_error", "code": "server_shutting_down", "message": "The server is shutting down; retry on a new connection.",
        "param": None}})


async def test_a_connection_past_the_limit_gets_503_and_the_count_goes_back(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(max_connections=1))
    first = connect(nursery, server)
    assert (await first.request("GET", "/v1/models")).status == 200  # the one connection allowed is served
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    await client.send_all(b"GET /v1/models HTTP/1.1\r\nhost: testbed\r\n\r\n")
    assert await raw_reply(client) == (503, {"error": {
        "type": "server_error", "code": "server_is_overloaded", "message": "Too many connections.", "param": None}})
    await trio.testing.wait_all_tasks_blocked()
    assert server.connections == 1


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
WAIT = 100.0  # virtual seconds: any wait of these tests ends far sooner, and a hang fails at once


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


async def design_of(ws) -> str:
    """v1 answers an append with no suspended response; v2 does not know the event."""
    await ws.send_message(json.dumps({"type": "response.append", "input": []}))
    return json.loads(await ws.get_message())["error"]["code"]


@pytest.mark.parametrize(("beta", "answer"), [
    (None, "unknown_event_type"),  # no header: v2
    (b"other=1,responses_websockets=2026-02-04", "no_suspended_response"),  # entries split on commas, without spaces too
    (b"other=1, responses_websockets=2026-02-06", "unknown_event_type"),
])
async def test_the_beta_header_selects_the_design(autojump_clock, beta, answer) -> None:
    headers = [AUTH] if beta is None else [AUTH, (b"openai-beta", beta)]
    async with handshake(make_server(), headers) as ws:
        assert await design_of(ws) == answer


@pytest.mark.parametrize(("beta", "multi_agent"), [
    (b"responses_websockets=2026-02-06, responses_multi_agent=v1", True),
    (b"responses_multi_agent=v1,responses_websockets=2026-02-06", True),
    (b"responses_websockets=2026-02-06", False),
])
async def test_the_multi_agent_beta_is_one_entry_of_the_header(autojump_clock, beta, multi_agent) -> None:
    server = make_server()
    async with handshake(server, [AUTH, (b"openai-beta", beta)]):
        await trio.sleep(0.1)
        (session,) = server.sessions
        assert session.info.multi_agent is multi_agent


async def test_the_handshake_fills_the_connection_info(autojump_clock) -> None:
    server = make_server(config=ServerConfig(worker=3))
    headers = [AUTH, (b"openai-beta", b"responses_websockets=2026-02-04"), (b"user-agent", b"codex/1"), (TIMING_HEADER.encode(), b"TRUE")]
    async with handshake(server, headers) as first, handshake(server, [AUTH]) as second:
        assert (first.handshake_headers, second.handshake_headers) != ((), ())
        workers = [dict(ws.handshake_headers).get(b"x-testbed-worker") for ws in (first, second)]
        assert workers == [b"3", b"3"]
        infos = sorted((session.info for session in server.sessions), key=lambda info: info.connection)
    async with handshake(make_server(), [AUTH]) as unnumbered:  # a server that is no worker of several sends none
        assert b"x-testbed-worker" not in dict(unnumbered.handshake_headers)
    assert [(i.design, i.api_key, i.include_timing, i.user_agent, i.connection) for i in infos] == [
        ("suspended", "testbed", True, "codex/1", 1), ("chained", "testbed", False, "", 2)]


async def test_a_drain_closes_an_idle_websocket_with_1001_and_its_reason(autojump_clock) -> None:
    server = make_server()
    async with handshake(server, [AUTH]) as ws:
        await trio.sleep(0.1)
        async with trio.open_nursery() as draining:
            draining.start_soon(drain, server, 1.0)
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                while True:
                    await ws.get_message()
    assert (closed.value.reason.code, closed.value.reason.reason) == (1001, "server shutting down")


async def test_a_handshake_that_races_a_drain_is_closed_as_the_drain_closes_the_rest(autojump_clock) -> None:
    class DrainDuringHandshake(ResponsesServer):
        def check_auth(self, headers):  # the drain starts while this handshake is being read
            self.draining = True
            return super().check_auth(headers)

    server = DrainDuringHandshake(ApiService(costs=ZERO_COSTS), ServerConfig())
    async with handshake(server, [AUTH]) as ws:
        error = json.loads(await ws.get_message())
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
    assert error == {"type": "error", "status": 503, "error": {
        "type": "server_error", "code": "server_shutting_down", "message": "The server is shutting down; retry on a new connection.", "param": None}}
    assert (closed.value.reason.code, closed.value.reason.reason) == (1001, "server shutting down")


async def test_the_listener_binds_a_free_loopback_port_by_default(nursery) -> None:
    with trio.fail_after(10):  # real seconds: a listener that never reports it started
        first, second = [await nursery.start(serve_responses, make_server()) for _ in range(2)]
    (host, port), (_, other_port) = [listeners[0].socket.getsockname() for listeners in (first, second)]
    assert (host, len(first), len(second)) == ("127.0.0.1", 1, 1) and port != other_port


# --- server/outbox.py ---------------------------------------------------------------------------------


class GatedWriter:
    """An outbox's `write`: records each batch; each write waits until `open` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.open = trio.Event()

    async def __call__(self, batch: list[str]) -> None:
        await self.open.wait()
        self.batches.append(list(batch))


async def test_each_write_takes_every_message_queued_since_the_last_and_is_counted(autojump_clock, nursery) -> None:
    writer = GatedWriter()
    box = Outbox(writer)
    nursery.start_soon(box.run)
    await box.send("a")
    await box.send("b")
    await trio.testing.wait_all_tasks_blocked()  # the writer took "a" and "b" and waits in its write
    flushed_at = []

    async def flush() -> None:
        await box.flush()
        flushed_at.append(trio.current_time())

    nursery.start_soon(flush)
    await trio.testing.wait_all_tasks_blocked()  # nothing queued, a write in progress: the flush waits
    await box.send("c")
    await box.send("d")
    await trio.sleep(2.0)
    assert (writer.batches, box.writes, flushed_at) == ([], 0, [])  # a write in progress holds the flush
    writer.open.set()
    await trio.testing.wait_all_tasks_blocked()
    assert (writer.batches, box.writes, flushed_at) == ([["a", "b"], ["c", "d"]], 2, [2.0])
    await box.send("e")
    await box.flush()
    assert (writer.batches[-1], box.writes) == (["e"], 3)


async def test_a_sender_waits_only_past_the_limit(autojump_clock, nursery) -> None:
    writer = GatedWriter()
    box = Outbox(writer, limit=8)
    nursery.start_soon(box.run)
    await box.send("x")
    await trio.testing.wait_all_tasks_blocked()  # the writer holds "x"
    with trio.move_on_after(1.0) as at_the_limit:
        await box.send("aaaa")
        await box.send("bbbb")  # 8 bytes queued: at the limit, not past it
    assert not at_the_limit.cancelled_caught
    with trio.move_on_after(1.0) as past_the_limit:
        await box.send("c")
    assert past_the_limit.cancelled_caught


async def test_one_by_one_sends_each_message_in_order() -> None:
    sent: list[str] = []

    class Socket:
        async def send_message(self, message: str) -> None:
            sent.append(message)

    await send_one_by_one(Socket(), ["a", "b", "c"])
    assert sent == ["a", "b", "c"]
