"""The answer to a create that passed its checks: the http design's turn (designs/http.py) run into
an SSE stream or into the JSON Response, each way it can end answered as docs/protocol.md (§8) says:
a refusal before the stream started is an HTTP error, one after it a flat SSE `error`; a response
that failed while it ran a 500 with its error; a drain past its grace `server_shutting_down`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from ... import metrics
from ...designs.cancel import ResponseCancelled
from ...designs.emitter import EngineFailure
from ...designs.http import run_http_turn
from ...protocol.errors import SERVER_ERROR, ProtocolError, server_shutting_down
from ...protocol.events import CreateRequest
from ...protocol.response import Response
from ..endpoint import Endpoint
from .exchange import HttpExchange
from .sinks import CollectingSink, SseSink

log = logging.getLogger(__package__)


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


def internal_error(exc: BaseException) -> ProtocolError:
    return ProtocolError(SERVER_ERROR, f"Internal error: {type(exc).__name__}.", status=500, type="server_error")


async def answer_stream(server: Endpoint, exchange: HttpExchange, create: CreateRequest, include_timing: bool, api_key: str, phase_log: metrics.PhaseLog) -> Response | None:
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
    stream started, which `answer_stream` sends once the sink's writer is gone."""
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
            return None, (internal_error(exc), True)
        await sink.fail(internal_error(exc))
    await sink.end()
    return response, None


async def answer_json(server: Endpoint, exchange: HttpExchange, create: CreateRequest, include_timing: bool, api_key: str, phase_log: metrics.PhaseLog) -> Response | None:
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
        failure = internal_error(exc)
    terminal = sink.terminal
    if terminal is None:  # refused before the response started (or a fault before its terminal)
        await exchange.send_error(failure or internal_error(RuntimeError("no terminal event")))
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
