"""One WebSocket connection: read frames, answer bad ones, run creates FIFO, one at a time.

The reader task decodes frames and dispatches them; the worker task runs `response.create`s in
arrival order (WS guide: one response in flight per connection, the rest queued, never rejected
until the queue is full). A v1 `response.append` bypasses the queue and goes straight to the
suspended rollout. Every task the connection starts lives in its nursery and ends with it.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from .. import metrics
from ..api.service import ApiService
from ..designs import chained, suspended
from ..designs.cancel import ResponseCancelled
from ..designs.emitter import EngineFailure
from ..protocol import codec, errors
from ..protocol.errors import ProtocolError
from ..protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer, SteerFailed
from ..protocol.wire import SUSPENDED
from .config import ServerConfig

log = logging.getLogger(__name__)

_SESSION_SERIALS = itertools.count(1)

@attrs.define(eq=False)
class ConnectionInfo:
    """What the handshake told us, recorded with the connection's timing records."""

    design: str
    api_key: str | None
    include_timing: bool = False
    user_agent: str = ""
    connection: int = 0  # the server's serial number for this connection, in the client records


@attrs.define(eq=False)
class WebSocketSession:
    api: ApiService
    config: ServerConfig
    ws: WebSocketConnection
    info: ConnectionInfo
    slot: suspended.SuspensionSlot = attrs.Factory(suspended.SuspensionSlot)
    # The engine keys a connection's pinned KV by a serial number, never id(), which Python reuses.
    cache: chained.ConnectionCache = attrs.Factory(lambda: chained.ConnectionCache(("chained", next(_SESSION_SERIALS))))
    busy: bool = False
    expired: bool = False
    current: trio.CancelScope | None = None
    idle: trio.Event = attrs.Factory(trio.Event)
    responses: list = attrs.Factory(list)  # (response id, outcome) of each finished response, for records
    records: Any = None  # the server's bounded log of client records (`ResponsesServer.records`), if any
    appends: int = 0  # v1 `response.append` frames delivered on this connection
    append_bytes: int = 0  # their total size, for the records' `request_bytes`

    async def send(self, event: object) -> None:
        await self.ws.send_message(codec.encode_event(event))

    async def send_error(self, error: ProtocolError) -> None:
        await self.ws.send_message(codec.encode(error.to_ws_event()))

    async def run(self) -> None:
        send_queue, receive_queue = trio.open_memory_channel[tuple[ResponseCreate, float, int]](self.config.max_queued_creates)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.worker, receive_queue, nursery)
                nursery.start_soon(self.lifetime)
                await self.reader(send_queue)
                nursery.cancel_scope.cancel()  # overlapped post work is shielded and still finishes
        except* ConnectionClosed:  # from any task of the nursery, so it arrives inside a group
            pass
        finally:
            # Close drops all state (docs/protocol.md): the v2 cache and the engine KV held under
            # this connection's key, which no other connection can reach (the key is this session).
            self.cache.evict()
            self.api.engine.release(self.cache.engine_key)

    async def reader(self, queue: trio.MemorySendChannel) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return
            try:
                event = codec.decode_client_event(message)
                await self.dispatch(event, queue, len(message.encode()) if isinstance(message, str) else len(message))
            except ProtocolError as error:
                self.record_refusal(error)
                await self.send_error(error)

    async def dispatch(self, event: object, queue: trio.MemorySendChannel, size: int = 0) -> None:
        """`size`: the frame's bytes, for the client records."""
        if isinstance(event, ResponseCreate):
            request = event.request
            if self.info.design == SUSPENDED:
                for field, bad in (("previous_response_id", request.previous_response_id is not None), ("generate", not request.generate)):
                    if bad:
                        raise ProtocolError(errors.UNSUPPORTED_PARAMETER, f"'{field}' is not supported on the suspended (v1) protocol.", param=field)
            try:
                queue.send_nowait((event, trio.current_time(), size))
            except trio.WouldBlock:
                raise ProtocolError(
                    errors.TOO_MANY_QUEUED_REQUESTS, f"More than {self.config.max_queued_creates} response.create requests are waiting on this connection."
                ) from None
        elif isinstance(event, ResponseAppend):
            if self.info.design != SUSPENDED:
                raise ProtocolError(
                    errors.UNKNOWN_EVENT_TYPE,
                    "response.append is not supported in ws v2; use response.create with previous_response_id",
                    param="type",
                )
            if self.slot.current is None:
                raise ProtocolError(errors.NO_SUSPENDED_RESPONSE, "response.append: no response is waiting for tool output on this connection.")
            self.slot.current.deliver(event.input)
            self.appends += 1
            self.append_bytes += size
        elif isinstance(event, ResponseSteer):
            await self.send(SteerFailed(0, event.previous_response_id, event.input))
        elif isinstance(event, ResponseProcessed):
            pass  # Codex's optional acknowledgement (docs/protocol.md)

    async def worker(self, queue: trio.MemoryReceiveChannel, nursery: trio.Nursery) -> None:
        async for event, queued_at, size in queue:
            if self.expired:
                return
            self.busy = True
            self.idle = trio.Event()
            phase_log = metrics.PhaseLog()
            phase_log.record(metrics.QUEUE, queued_at, trio.current_time())
            phase_log.client = self.protocol_choices(event.request)
            appends_before, append_bytes_before, response, outcome = self.appends, self.append_bytes, None, "cancelled"
            try:
                with trio.CancelScope() as self.current:
                    response = await self.run_one(event.request, phase_log, nursery)
                    self.responses.append((response.id, response.status))
                    outcome = response.status
            except ProtocolError as error:
                outcome = f"error:{error.code}"
                self.cache.evict()  # a failed turn leaves the slot empty, chained or not (docs/protocol.md)
                await self.send_error(error)
            except ConnectionClosed:
                outcome = "closed"
                return
            except EngineFailure:
                outcome = "failed"  # already answered with response.failed
                self.cache.evict()  # as for any failed turn (docs/protocol.md)
            except ResponseCancelled as cancelled:
                response, outcome = cancelled.response, "cancelled"  # already answered with response.cancelled
                self.cache.evict()  # a cancelled turn is not chained from (docs/protocol.md, "Cancel")
            except Exception as exc:  # a handler bug: fail loudly on this connection only
                outcome = "error:server_error"
                log.exception("response handler failed")
                await self.send_error(ProtocolError(errors.SERVER_ERROR, f"Internal error: {type(exc).__name__}.", status=500, type="server_error"))
                await self.ws.aclose(1011, "internal error")
                return
            finally:
                self.busy = False
                self.current = None
                self.idle.set()
                self.keep_record(phase_log, response, outcome, self.appends - appends_before, size + self.append_bytes - append_bytes_before)

    # --- client records (issue 7): who spoke and how it used the protocol ----------------------

    def protocol_choices(self, request) -> dict[str, Any]:
        info = self.info
        return metrics.protocol_choices(
            request, transport="websocket", design=info.design, user_agent=info.user_agent, connection=info.connection
        )

    def keep_record(self, phase_log: metrics.PhaseLog, response, outcome: str, appends: int, request_bytes: int = 0) -> None:
        """One record per `response.create` that reached the worker, whatever its outcome.
        `request_bytes`: the client's frames for it (the create and, in v1, its appends)."""
        if self.records is None:
            return
        record = dict(phase_log.client or {})
        record.update(
            started_at_s=phase_log.spans[0][1] if phase_log.spans else None,  # the create's arrival (the queue span)
            at_s=trio.current_time(),
            response_id=response.id if response is not None else None,
            outcome=outcome,
            appends=appends,
            request_bytes=request_bytes,
            timing_requested=self.info.include_timing,
            phases_ms={k: round(v * 1000, 3) for k, v in phase_log.totals().items()},
            usage=response.usage.to_dict() if response is not None else None,
        )
        self.records.append(record)

    def record_refusal(self, error: ProtocolError) -> None:
        """A frame refused before it was queued (e.g. a create with `stream_id`)."""
        if self.records is None:
            return
        info = self.info
        self.records.append({
            "user_agent": info.user_agent, "transport": "websocket", "design": info.design, "connection": info.connection,
            "at_s": trio.current_time(), "response_id": None, "outcome": f"error:{error.code}", "param": error.param,
            "stream_id": error.param == "stream_id",
        })

    async def run_one(self, request, phase_log: metrics.PhaseLog, nursery: trio.Nursery):
        if self.info.design == SUSPENDED:
            return await suspended.run_rollout(
                self.api, request, self.send, self.slot,
                ttl=self.config.suspension_ttl, include_timing=self.info.include_timing,
                api_key=self.info.api_key, log=phase_log,
            )
        return await chained.run_turn(
            self.api, request, self.send, self.cache, nursery,
            switches=self.config.switches, include_timing=self.info.include_timing,
            api_key=self.info.api_key, log=phase_log,
        )

    async def lifetime(self) -> None:
        """At the connection limit: let an in-flight v2 response finish (a suspended v1 rollout counts
        as a disconnect), then send `websocket_connection_limit_reached` and close 1000 (WS guide)."""
        await trio.sleep(self.config.connection_lifetime)
        self.expired = True
        if self.busy:
            if self.info.design == SUSPENDED and self.current is not None:
                self.current.cancel()
            await self.idle.wait()
        limit = errors.connection_limit_reached(self.config.connection_lifetime / 60)
        try:
            await self.send_error(limit)
            await self.ws.aclose(1000, "connection limit reached")
        except ConnectionClosed:
            pass
