"""One HTTP connection served request after request: each request's body read (bounded), checked
and refused with its status and error, routed to server/routes.py or answered as a create
(answers.py), and recorded in the server's client records (docs/protocol.md, §8)."""

from __future__ import annotations

import logging
from typing import Any

import h11
import trio

from ... import metrics
from ...protocol import codec
from ...protocol.errors import SERVER_ERROR, ProtocolError
from ...protocol.wire import RESPONSES_PATH, TIMING_HEADER
from .. import routes
from ..endpoint import Endpoint, path_of
from .answers import answer_json, answer_stream, internal_error
from .exchange import BodyTooLarge, HttpExchange
from .sinks import SSE_HEADERS, sse_block

log = logging.getLogger(__package__)

# Error codes of the HTTP shell, all [ours]: no public source names them.
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
REQUEST_TOO_LARGE = "request_too_large"
REQUEST_TIMEOUT = "request_timeout"
BAD_REQUEST = "bad_request"

JSON_MEDIA_TYPE = "application/json"


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
        try:
            exchange.conn.start_next_cycle()
        except h11.LocalProtocolError:
            return  # h11 goes on only when both sides are DONE: not after Connection: close or a broken exchange


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
    except BodyTooLarge:
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
                f"Content-Type {headers['content-type'][:64]!r} is not supported: send application/json.",
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
    answer = answer_stream if create.stream else answer_json
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
        await exchange.send_error(internal_error(exc))
        return
    if answer.events is None:
        await exchange.send_json(answer.status, answer.body or {})
        return
    head = h11.Response(status_code=200, headers=SSE_HEADERS, reason=b"OK")
    await exchange.send(head, *(h11.Data(data=sse_block(event)) for event in answer.events), h11.EndOfMessage())
