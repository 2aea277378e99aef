"""The listener: one port, `POST /v1/responses` (HTTP) and the WebSocket upgrade on
`GET /v1/responses`, as the real API serves both (docs/protocol.md).

`ResponsesServer.handle_stream` reads the request head and dispatches on it before any WebSocket
code runs; the same entry point serves real sockets (`serve_responses`) and in-memory streams under
a virtual clock. A handler exception ends that connection only, never the server.
"""

from __future__ import annotations

import logging

import attrs
import h11
import trio
import trio_websocket

from ..protocol import codec
from ..protocol.errors import ProtocolError, server_shutting_down
from ..protocol.inject import BETA_MULTI_AGENT
from ..protocol.wire import BETA_CHAINED, BETA_SUSPENDED, CHAINED, RESPONSES_PATH, SUSPENDED, TIMING_HEADER, WS_RECEIVE_BYTES
from ..ws_internals import wrap_server_stream
from . import http
from .config import HEAD_TIMEOUT_SECONDS, MAX_HEAD_BYTES
from .endpoint import Endpoint, path_of
from .streams import HeadTooLarge, ReplayStream, read_head
from .websocket import CLOSE_HANDSHAKE_SECONDS, ConnectionInfo, WebSocketSession

log = logging.getLogger(__name__)

def choose_design(headers: dict[str, str]) -> str:
    """`responses_websockets=2026-02-04` selects v1; `2026-02-06` or none selects v2; other dates are
    refused so a run is never filed under the wrong design (docs/protocol.md)."""
    for entry in headers.get("openai-beta", "").split(","):
        name, _, value = entry.strip().partition("=")
        if name == "responses_websockets":
            if value == BETA_SUSPENDED:
                return SUSPENDED
            if value == BETA_CHAINED:
                return CHAINED
            raise ProtocolError("unsupported_beta", f"Unknown responses_websockets version {value[:32]!r}.", param="OpenAI-Beta")
    return CHAINED


def wants_multi_agent(headers: dict[str, str]) -> bool:
    """`OpenAI-Beta: responses_multi_agent=v1` on the handshake enables `multi_agent` and
    `response.inject` (multi-agent guide: pass it in the connection headers)."""
    return any(entry.strip() == BETA_MULTI_AGENT for entry in headers.get("openai-beta", "").split(","))


@attrs.define(eq=False)
class ResponsesServer(Endpoint):
    """The listener: the shared endpoint state, plus the live connections and sessions."""

    connections: int = 0
    sessions: set = attrs.Factory(set)  # live WebSocket sessions, for tests and load reports

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one connection to the end; never raises."""
        self.connections += 1
        try:
            with trio.move_on_after(HEAD_TIMEOUT_SECONDS) as head_scope:
                try:
                    head = await read_head(stream, MAX_HEAD_BYTES)
                except HeadTooLarge:
                    await http.send_simple_error(stream, 431, ProtocolError("request_header_too_large", "The request head is too large.", status=431))
                    return
            if head_scope.cancelled_caught or not head:
                return
            if self.draining:
                await http.send_simple_error(stream, 503, server_shutting_down())
                return
            if self.connections > self.config.max_connections:
                await http.send_simple_error(stream, 503, ProtocolError("server_is_overloaded", "Too many connections.", status=503, type="server_error"))
                return
            request = http.parse_head(head)
            if request is None:
                await http.send_simple_error(stream, 400, ProtocolError("bad_request", "Malformed HTTP request head."))
                return
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
            if "websocket" in headers.get("upgrade", "").lower():
                await self.serve_websocket(ReplayStream(stream, head), request, headers)
            else:
                await http.serve_http(self, ReplayStream(stream, head))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio_websocket.ConnectionClosed):
            pass
        except Exception:
            log.exception("connection handler failed")
        finally:
            self.connections -= 1
            self.notify()
            with trio.move_on_after(1) as scope:
                scope.shield = True
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def serve_websocket(self, stream: trio.abc.Stream, request: h11.Request, headers: dict[str, str]) -> None:
        async with trio.open_nursery() as nursery:
            ws_request = await wrap_server_stream(
                nursery, stream, max_message_size=self.config.max_message_bytes, receive_buffer_size=WS_RECEIVE_BYTES
            )
            refusal: tuple[int, ProtocolError] | None = None
            try:
                if path_of(request.target.decode("latin-1")) != RESPONSES_PATH:
                    raise ProtocolError("not_found", f"No WebSocket endpoint at {request.target[:64]!r}.", status=404)
                if not self.config.websocket_enabled:
                    raise ProtocolError("upgrade_required", "WebSocket mode is disabled on this server; use HTTP.", status=426)
                api_key = self.check_auth(headers)
                design = choose_design(headers)
            except ProtocolError as error:
                refusal = (error.status, error)
            if refusal is not None:
                status, error = refusal
                body = codec.encode(error.to_http_body()).encode()
                await ws_request.reject(status, extra_headers=[(b"content-type", b"application/json")], body=body)
                nursery.cancel_scope.cancel()
                return
            worker = [] if self.config.worker is None else [(b"x-testbed-worker", str(self.config.worker).encode())]
            try:
                ws = await ws_request.accept(extra_headers=worker)
            except trio_websocket.ConnectionClosed:  # the client went away during the handshake: nothing to serve
                nursery.cancel_scope.cancel()
                return
            info = ConnectionInfo(
                design,
                api_key,
                include_timing=headers.get(TIMING_HEADER, "").lower() == "true",
                user_agent=headers.get("user-agent", ""),
                connection=self.next_connection_number(),
                multi_agent=wants_multi_agent(headers),
            )
            session = WebSocketSession(self.api, self.config, ws, info, log=self.records)
            self.sessions.add(session)
            if self.draining:  # the handshake raced a drain: close it as the drain closes the rest
                session.shut_down(server_shutting_down(), 1001, "server shutting down", 0.0)
            try:
                await session.run()
            finally:
                self.sessions.discard(session)
                with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_HANDSHAKE_SECONDS):
                    await ws.aclose()  # a no-op when the session already closed it
                nursery.cancel_scope.cancel()


async def drain(server: ResponsesServer, grace: float) -> None:
    """Stop serving without losing an event (SIGTERM): refuse new connections with 503; let every
    response in flight end with its terminal event within `grace` seconds (a paused v1 rollout
    fails at once; past the grace a response is cut short with `response.failed`, or on HTTP the
    flat SSE error / a 503); close each WebSocket with 1001 (going away) and each idle HTTP
    keep-alive connection. Returns when every connection has closed."""
    server.draining = True
    for scope in list(server.http_idle):
        scope.cancel()
    reason = server_shutting_down()
    for session in list(server.sessions):
        session.shut_down(reason, 1001, "server shutting down", grace)
    with trio.move_on_after(grace):
        await server.until(lambda: not server.http_in_flight)
    for scope in list(server.http_in_flight):
        scope.cancel()
    await server.until(lambda: not server.connections)


async def serve_responses(
    server: ResponsesServer,
    port: int = 0,
    *,
    host: str | None = "127.0.0.1",
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on a TCP port; `await nursery.start(serve_responses, server)` returns the listeners."""
    await trio.serve_tcp(server.handle_stream, port, host=host, task_status=task_status)
