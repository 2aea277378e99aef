"""HTTP on the WebSocket's port: `POST /v1/responses` (h11), as the real API serves both on one
path (docs/protocol.md, §8).

`serve_http` runs a keep-alive loop over one connection: read a request with h11, answer it, and
go on to the next request on the same connection until the client closes or asks to. A request the
server refuses gets its HTTP status and the flat `{"error": {...}}` body; every refusal except an
oversized or broken body leaves the connection open, because the body was read to its end first.

| request                                           | answer                          |
| a path of server/routes.py (retrieve, delete,     | that route's answer; 405 with   |
|   input_items, cancel, models)                    |   its `Allow` otherwise         |
| any other path than /v1/responses                 | 404                             |
| method other than POST (GET without an Upgrade)   | 405, `Allow: POST`              |
| no usable `Authorization: Bearer`, or a wrong key | 401 (shared with the WebSocket) |
| a Content-Type that is not application/json       | 415                             |
| a body over `max_body_bytes`                      | 413, then close                 |
| a body cut short, or not HTTP/1.1                 | 400 `bad_request`, then close   |
| a body still incomplete after the idle timeout    | 408, then close                 |
| not JSON, or not a valid create body              | 400 (codes of docs/protocol.md) |
| `stream: true`                                    | 200 `text/event-stream`         |
| otherwise                                         | 200, the Response as JSON       |

The status line and headers of a stream go out with its first event, so an error found before
the first event (`previous_response_not_found`, a bad item) is still an HTTP error; one found
after it is a flat SSE `error` event, unless the response already ended with its terminal event.
"""

from __future__ import annotations

import http as _http
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import h11
import trio

from .. import metrics
from ..designs.cancel import ResponseCancelled
from ..designs.emitter import EngineFailure
from ..designs.http import run_http_turn
from ..protocol import codec
from ..protocol.errors import SERVER_ERROR, ProtocolError, server_shutting_down
from ..protocol.events import TERMINAL_TYPES, CreateRequest
from ..protocol.response import Response
from ..protocol.wire import RESPONSES_PATH, TIMING_HEADER
from . import routes
from .config import MAX_HEAD_BYTES
from .endpoint import Endpoint, path_of
from .outbox import Outbox

log = logging.getLogger(__name__)

# Error codes of the HTTP shell, all [ours]: no public source names them.
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
REQUEST_TOO_LARGE = "request_too_large"
REQUEST_TIMEOUT = "request_timeout"
BAD_REQUEST = "bad_request"

JSON_MEDIA_TYPE = "application/json"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = b"application/json"
# Events that end an SSE stream: the three terminals, and a flat `error` sent in place of one.
STREAM_END_TYPES = TERMINAL_TYPES | {"error"}


def parse_head(head: bytes) -> h11.Request | None:
    """The request line and headers, or None if they are not valid HTTP/1.1."""
    connection = h11.Connection(h11.SERVER)
    try:
        connection.receive_data(head)
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    return event if isinstance(event, h11.Request) else None


def _reason(status: int) -> bytes:
    try:
        return _http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _response_bytes(status: int, body: bytes) -> bytes:
    """A whole response, then close, from a fresh h11 server connection that has read no request:
    h11's server state machine takes a Response in IDLE (IDLE -> SEND_BODY, h11 `_state.py`), for an
    error answered before any request was parsed. Content-Length frames the body, as no request
    said which HTTP version the client speaks."""
    connection = h11.Connection(h11.SERVER)
    headers = [(b"content-type", JSON_CONTENT_TYPE), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    data = connection.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
    return data + connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage())


async def send_simple_error(stream: trio.abc.Stream, status: int, error: ProtocolError) -> None:
    """An error response on a connection no h11 state machine owns; the connection then closes."""
    await stream.send_all(_response_bytes(status, codec.encode(error.to_http_body()).encode()))


def sse_block(event: Any) -> bytes:
    """One server event as SSE: `event: <type>`, `data: <json>`, a blank line (docs/protocol.md)."""
    return f"event: {event.type}\ndata: {codec.encode_event(event)}\n\n".encode()


def sse_error_block(error: ProtocolError, sequence_number: int) -> bytes:
    """A failure once streaming: the flat error event (openai-python `response_error_event.py`)."""
    return f"event: error\ndata: {codec.encode(error.to_sse_event(sequence_number))}\n\n".encode()


class _BodyTooLarge(Exception):
    pass


class _Closed(Exception):
    """The peer closed the connection between requests."""


class HttpExchange:
    """One connection's h11 state machine and the stream under it, with the few reads and writes
    the handler needs."""

    def __init__(self, stream: trio.abc.Stream, number: int = 0) -> None:
        self.stream = stream
        self.number = number  # the connection's serial number in the server's records
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.refused: ProtocolError | None = None  # the last error this exchange answered with, for the access log

    async def next_event(self) -> Any:
        """The next h11 event, reading from the stream as needed; raises h11.RemoteProtocolError."""
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(await self.stream.receive_some(65536))

    def encode(self, *events: Any) -> bytes:
        """`events` as h11 writes them, in order (a Data event its own chunk), advancing its state."""
        return b"".join(self.conn.send(event) or b"" for event in events)

    async def send(self, *events: Any) -> None:
        data = self.encode(*events)
        if data:
            await self.stream.send_all(data)

    async def write(self, chunks: list[bytes]) -> None:
        """Bytes `encode` gave, several at once, in one write (an outbox's batch)."""
        await self.stream.send_all(b"".join(chunks))

    async def read_body(self, limit: int) -> bytes:
        """The request body, up to `limit` bytes; raises _BodyTooLarge or h11.RemoteProtocolError."""
        body = bytearray()
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise _BodyTooLarge
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:  # ConnectionClosed before the end of the message
                raise h11.RemoteProtocolError("peer closed connection without sending complete message body")

    async def send_json(
        self, status: int, obj: dict[str, Any], *, close: bool = False, extra: list | None = None, head_only: bool = False
    ) -> None:
        """A whole JSON answer with its Content-Length; `head_only` for a HEAD request (no body)."""
        body = codec.encode(obj).encode()
        headers = [(b"content-type", JSON_CONTENT_TYPE), (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        response = h11.Response(status_code=status, headers=headers + (extra or []), reason=_reason(status))
        if head_only:
            await self.send(response, h11.EndOfMessage())
        else:
            await self.send(response, h11.Data(data=body), h11.EndOfMessage())

    async def send_error(self, error: ProtocolError, *, close: bool = False, extra: list | None = None, head_only: bool = False) -> None:
        self.refused = error
        await self.send_json(error.status, error.to_http_body(), close=close, extra=extra, head_only=head_only)


class SseSink:
    """The design's sink for `stream: true`: the status line and headers go out with the first
    event, then one chunk (chunked transfer encoding, so the connection can be reused) per event.

    The chunks go through an outbox (server/outbox.py) whose writer `_answer_stream` runs: the
    events that are ready together (a turn's closing events, an item's opening ones) go out in one
    socket write, each still its own chunk, encoded by h11 in order as it is queued, so the bytes
    on the wire are the same as with one write per event."""

    def __init__(self, exchange: HttpExchange) -> None:
        self.exchange = exchange
        self.outbox = Outbox(exchange.write)
        self.started = False
        self.ended = False  # a terminal event (or a flat error) went out
        self.next_sequence = 0

    async def __call__(self, event: Any) -> None:
        out: list[Any] = []
        if not self.started:
            headers = [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]
            out.append(h11.Response(status_code=200, headers=headers, reason=b"OK"))
            self.started = True
        out.append(h11.Data(data=sse_block(event)))
        self.next_sequence = event.sequence_number + 1  # every server event is numbered (protocol/events.py)
        self.ended = self.ended or event.type in STREAM_END_TYPES
        await self.outbox.send(self.exchange.encode(*out))

    async def fail(self, error: ProtocolError) -> None:
        """End a started stream that has no terminal event with the flat error event."""
        if not self.ended:
            self.ended = True
            await self.outbox.send(self.exchange.encode(h11.Data(data=sse_error_block(error, self.next_sequence))))

    async def end(self) -> None:
        """The stream's last chunk; returns once everything queued is written."""
        await self.outbox.send(self.exchange.encode(h11.EndOfMessage()))
        await self.outbox.flush()


class CollectingSink:
    """The design's sink for `stream: false`: keeps the events; the answer is the terminal one's
    Response."""

    def __init__(self) -> None:
        self.terminal: dict[str, Any] | None = None

    async def __call__(self, event: Any) -> None:
        await trio.lowlevel.checkpoint()
        if event.type in TERMINAL_TYPES:
            self.terminal = event.to_dict()


@contextmanager
def _in_flight(server: Any) -> Iterator[trio.CancelScope]:
    """A response being produced, which a drain may cut short after its grace."""
    with trio.CancelScope() as scope:
        server.http_in_flight.add(scope)
        try:
            yield scope
        finally:
            server.http_in_flight.discard(scope)
            server.notify()


def _internal_error(exc: BaseException) -> ProtocolError:
    return ProtocolError(SERVER_ERROR, f"Internal error: {type(exc).__name__}.", status=500, type="server_error")


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True  # no Content-Type at all: read the body as JSON [ours, lenient]
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == JSON_MEDIA_TYPE


async def serve_http(server: Endpoint, stream: trio.abc.Stream) -> None:
    """Serve HTTP requests on one connection until the client closes it, asks to, or idles out.

    `server` gives the ApiService, the ServerConfig, `check_auth` and the records.
    """
    exchange = HttpExchange(stream, server.next_connection_number())
    idle_timeout = server.config.http_idle_timeout
    first = True
    while True:
        event: Any = None
        # The first request's head is already here (the listener read it to dispatch); a later one
        # may take up to the idle timeout to start.
        if server.draining and not first:
            return  # shutting down: no next request on this connection
        with trio.move_on_after(float("inf") if first else idle_timeout) as idle_scope:
            if not first:
                server.http_idle.add(idle_scope)  # a drain ends the wait
            try:
                event = await exchange.next_event()
            except h11.RemoteProtocolError as exc:
                await _refuse_broken(exchange, str(exc))
                return
            finally:
                server.http_idle.discard(idle_scope)
        first = False
        if not isinstance(event, h11.Request):
            return  # closed by the client, or idle too long
        await serve_request(server, exchange, event)
        if exchange.conn.our_state is not h11.DONE or exchange.conn.their_state is not h11.DONE:
            return  # Connection: close, or a broken exchange
        try:
            exchange.conn.start_next_cycle()
        except h11.LocalProtocolError:
            return


async def _refuse_broken(exchange: HttpExchange, detail: str) -> None:
    """A request h11 cannot read (bad framing, a body cut short): 400, then the connection closes."""
    if exchange.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
        error = ProtocolError(BAD_REQUEST, f"Malformed HTTP request: {detail}.")
        await exchange.send_error(error, close=True)


async def serve_request(server: Endpoint, exchange: HttpExchange, request: h11.Request) -> None:
    """Answer one request whose head has been read."""
    config = server.config
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
    target = request.target.decode("latin-1")

    # The body first (bounded), so that every refusal but these two keeps the connection usable.
    declared = headers.get("content-length")
    too_large = ProtocolError(
        REQUEST_TOO_LARGE, f"The request body is larger than {config.max_body_bytes} bytes.", status=413
    )
    if declared is not None and declared.isdigit() and int(declared) > config.max_body_bytes:
        await exchange.send_error(too_large, close=True)
        return
    if exchange.conn.they_are_waiting_for_100_continue:
        await exchange.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
    try:
        # A client that stalls mid-body is dropped after the idle timeout, like an idle connection.
        with trio.move_on_after(config.http_idle_timeout) as body_scope:
            body = await exchange.read_body(config.max_body_bytes)
        if body_scope.cancelled_caught:
            await exchange.send_error(ProtocolError(REQUEST_TIMEOUT, "The request body did not arrive in time.", status=408), close=True)
            return
    except _BodyTooLarge:
        await exchange.send_error(too_large, close=True)
        return
    except h11.RemoteProtocolError as exc:
        await _refuse_broken(exchange, str(exc))
        return

    path = path_of(target)
    found = routes.find(path)
    if found is not None:
        await _serve_endpoint(server, exchange, request, headers, target, path, *found, body=body)
        return
    try:
        if path != RESPONSES_PATH:
            raise ProtocolError(NOT_FOUND, f"Invalid URL ({request.method.decode('latin-1')} {target[:128]}).", status=404)
        if request.method != b"POST":
            exchange_extra = [(b"allow", b"POST")]
            error = ProtocolError(
                METHOD_NOT_ALLOWED,
                f"Method {request.method.decode('latin-1')[:16]} is not allowed on {RESPONSES_PATH}: "
                "use POST, or GET with Upgrade: websocket.",
                status=405,
            )
            await exchange.send_error(error, extra=exchange_extra, head_only=request.method == b"HEAD")
            return
        api_key = server.check_auth(headers)
        if not _is_json(headers.get("content-type")):
            raise ProtocolError(
                UNSUPPORTED_MEDIA_TYPE,
                f"Content-Type {headers.get('content-type', '')[:64]!r} is not supported: send application/json.",
                status=415,
            )
        create = codec.parse_create_body(codec.loads_object(body, what="request body"))
    except ProtocolError as error:
        extra = [(b"www-authenticate", b"Bearer")] if error.status == 401 else None
        server.records.append({  # a refused request, so the access log shows it too
            "user_agent": headers.get("user-agent", ""), "transport": "http", "design": "http", "connection": exchange.number,
            "at_s": trio.current_time(), "response_id": None, "outcome": f"error:{error.code}", "status": error.status,
            "timing_requested": False,
        })
        await exchange.send_error(error, extra=extra)
        return

    include_timing = headers.get(TIMING_HEADER, "").lower() == "true"
    phase_log = metrics.PhaseLog(schedule=trio.current_time())
    phase_log.client = metrics.protocol_choices(
        create, transport="http", design="http-stored" if create.previous_response_id else "http-stateless",
        user_agent=headers.get("user-agent", ""), connection=exchange.number,
    )
    answer = _answer_stream if create.stream else _answer_json
    started_at = trio.current_time()
    exchange.refused = None
    response = await answer(server, exchange, create, include_timing, api_key, phase_log)
    refused = exchange.refused
    server.records.append({
        **phase_log.client,
        "started_at_s": started_at,
        "at_s": trio.current_time(),
        "request_bytes": len(body),
        "response_id": response.id if response is not None else None,
        # A refusal after the body parsed (an unusable model, a previous_response_id not found) names its code.
        "outcome": response.status if response is not None else f"error:{refused.code if refused else SERVER_ERROR}",
        "usage": response.usage.to_dict() if response is not None else None,
        "timing_requested": include_timing,
        "phases_ms": {k: round(v * 1000, 3) for k, v in phase_log.totals().items()},
    })


async def _serve_endpoint(
    server: Endpoint, exchange: HttpExchange, request: h11.Request, headers: dict[str, str], target: str, path: str,
    route: routes.Route, ident: str, body: bytes = b"",
) -> None:
    """A request to one of the routes beside `POST /v1/responses` (server/routes.py): a JSON
    answer or an SSE replay."""
    method = request.method.decode("latin-1")
    handler = route.methods.get(method)
    if handler is None:
        allow = ", ".join(route.methods)
        error = ProtocolError(METHOD_NOT_ALLOWED, f"Method {method[:16]} is not allowed on {path[:128]}: use {allow}.", status=405)
        await exchange.send_error(error, extra=[(b"allow", allow.encode())], head_only=method == "HEAD")
        return
    try:
        answer = await routes.answer(server, handler, ident, target, server.check_auth(headers), body)
    except ProtocolError as error:
        await exchange.send_error(error, extra=[(b"www-authenticate", b"Bearer")] if error.status == 401 else None)
        return
    except Exception as exc:
        log.exception("endpoint handler failed")
        await exchange.send_error(_internal_error(exc))
        return
    if answer.events is None:
        await exchange.send_json(answer.status, answer.body or {})
        return
    head = h11.Response(status_code=200, headers=[(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")], reason=b"OK")
    await exchange.send(head, *(h11.Data(data=sse_block(event)) for event in answer.events), h11.EndOfMessage())


async def _answer_stream(server: Endpoint, exchange: HttpExchange, create: CreateRequest, include_timing: bool, api_key: str, phase_log: metrics.PhaseLog) -> Response | None:
    """Stream the response as SSE, the sink's writer beside it; returns it (None if refused before
    it started). Raises trio.BrokenResourceError or ClosedResourceError if the client went away."""
    sink = SseSink(exchange)
    gone: trio.BrokenResourceError | trio.ClosedResourceError | None = None
    response, refusal = None, None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sink.outbox.run)
        try:
            response, refusal = await _stream_response(server, sink, create, include_timing, api_key, phase_log)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:  # raised below, outside the nursery's group
            gone = error
        nursery.cancel_scope.cancel()  # the writer, idle once the sink's end flushed
    if gone is not None:
        raise gone
    if refusal is not None:  # nothing was queued: the refusal is the whole answer
        error, close = refusal
        await exchange.send_error(error, close=close)
    return response


async def _stream_response(
    server: Endpoint, sink: SseSink, create: CreateRequest, include_timing: bool, api_key: str, phase_log: metrics.PhaseLog,
) -> tuple[Response | None, tuple[ProtocolError, bool] | None]:
    """(the response, None), or (None, (the error, whether to close)) for a refusal before the
    stream started, which `_answer_stream` sends once the sink's writer is gone."""
    response = None
    try:
        with _in_flight(server) as scope:
            response = await run_http_turn(server.api, create, sink, include_timing=include_timing, api_key=api_key, log=phase_log)
        if scope.cancelled_caught:  # a drain past its grace
            raise server_shutting_down()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise  # the client went away: nothing left to tell it
    except EngineFailure:
        pass  # the response already ended with response.failed
    except ResponseCancelled as cancelled:
        response = cancelled.response  # it already ended with response.cancelled
    except ProtocolError as error:
        if not sink.started:
            return None, (error, False)
        await sink.fail(error)
    except Exception as exc:
        log.exception("http response handler failed")
        if not sink.started:
            return None, (_internal_error(exc), True)
        await sink.fail(_internal_error(exc))
    await sink.end()
    return response, None


async def _answer_json(server: Endpoint, exchange: HttpExchange, create: CreateRequest, include_timing: bool, api_key: str, phase_log: metrics.PhaseLog) -> Response | None:
    """Answer with the finished Response as JSON; returns it (None if refused)."""
    sink = CollectingSink()
    failure: ProtocolError | None = None
    finished = None
    try:
        with _in_flight(server) as scope:
            finished = await run_http_turn(server.api, create, sink, include_timing=include_timing, api_key=api_key, log=phase_log)
        if scope.cancelled_caught:  # a drain past its grace
            raise server_shutting_down()
    except EngineFailure:
        pass
    except ResponseCancelled as cancelled:
        finished = cancelled.response  # answered below with its terminal snapshot, status cancelled
    except ProtocolError as error:
        failure = error
    except Exception as exc:
        log.exception("http response handler failed")
        failure = _internal_error(exc)
    terminal = sink.terminal
    if terminal is None:  # refused before the response started (or a fault before its terminal)
        await exchange.send_error(failure or _internal_error(RuntimeError("no terminal event")))
        return None
    response = terminal["response"]
    if terminal["type"] == "response.failed":
        # A response that failed while it ran [ours]: a 500 carrying the response's error, as an
        # HTTP client expects for a server-side failure.
        error = response.get("error") or {}
        await exchange.send_json(
            500,
            {"error": {"type": "server_error", "code": error.get("code", SERVER_ERROR), "message": error.get("message", ""), "param": None}},
        )
        return finished
    await exchange.send_json(200, response)
    return finished


__all__ = [
    "CollectingSink", "HttpExchange", "SseSink", "parse_head", "send_simple_error", "serve_http", "serve_request",
    "sse_block", "sse_error_block",
]
