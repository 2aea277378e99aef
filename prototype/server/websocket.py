"""One WebSocket connection: read frames, answer bad ones, run creates FIFO, one at a time.

The reader task decodes frames and dispatches them; the worker task runs `response.create`s in
arrival order (WS guide: one response in flight per connection, the rest queued, never rejected
until the queue is full). A v1 `response.append` bypasses the queue and goes straight to the
suspended rollout. Every task the connection starts lives in its nursery and ends with it.
"""

from __future__ import annotations

import logging

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from .. import metrics
from ..api.service import ApiService
from ..designs import chained, suspended
from ..designs.emitter import EngineFailure
from ..protocol import codec, errors
from ..protocol.errors import ProtocolError
from ..protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer, SteerFailed
from .config import ServerConfig

log = logging.getLogger(__name__)

SUSPENDED = "suspended"  # wire v1
CHAINED = "chained"  # wire v2


@attrs.define(eq=False)
class ConnectionInfo:
    """What the handshake told us, recorded with the connection's timing records."""

    design: str
    api_key: str | None
    include_timing: bool = False
    user_agent: str = ""


@attrs.define(eq=False)
class WebSocketSession:
    api: ApiService
    config: ServerConfig
    ws: WebSocketConnection
    info: ConnectionInfo
    slot: suspended.SuspensionSlot = attrs.Factory(suspended.SuspensionSlot)
    cache: chained.ConnectionCache = attrs.Factory(lambda self: chained.ConnectionCache(("chained", id(self))), takes_self=True)
    busy: bool = False
    expired: bool = False
    current: trio.CancelScope | None = None
    idle: trio.Event = attrs.Factory(trio.Event)
    responses: list = attrs.Factory(list)  # (response id, outcome) of each finished response, for records

    async def send(self, event: object) -> None:
        await self.ws.send_message(codec.encode_event(event))

    async def send_error(self, error: ProtocolError) -> None:
        await self.ws.send_message(codec.encode(error.to_ws_event()))

    async def run(self) -> None:
        send_queue, receive_queue = trio.open_memory_channel[tuple[ResponseCreate, float]](self.config.max_queued_creates)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.worker, receive_queue, nursery)
                nursery.start_soon(self.lifetime)
                await self.reader(send_queue)
                nursery.cancel_scope.cancel()  # overlapped post work is shielded and still finishes
        except ConnectionClosed:
            pass

    async def reader(self, queue: trio.MemorySendChannel) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return
            try:
                event = codec.decode_client_event(message)
                await self.dispatch(event, queue)
            except ProtocolError as error:
                await self.send_error(error)

    async def dispatch(self, event: object, queue: trio.MemorySendChannel) -> None:
        if isinstance(event, ResponseCreate):
            request = event.request
            if self.info.design == SUSPENDED:
                for field, bad in (("previous_response_id", request.previous_response_id is not None), ("generate", not request.generate)):
                    if bad:
                        raise ProtocolError(errors.UNSUPPORTED_PARAMETER, f"'{field}' is not supported on the suspended (v1) protocol.", param=field)
            try:
                queue.send_nowait((event, trio.current_time()))
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
        elif isinstance(event, ResponseSteer):
            await self.send(SteerFailed(0, event.previous_response_id, event.input))
        elif isinstance(event, ResponseProcessed):
            pass  # Codex's optional acknowledgement (PROTOCOL.md §4.5)

    async def worker(self, queue: trio.MemoryReceiveChannel, nursery: trio.Nursery) -> None:
        async for event, queued_at in queue:
            if self.expired:
                return
            self.busy = True
            self.idle = trio.Event()
            phase_log = metrics.PhaseLog()
            phase_log.record(metrics.QUEUE, queued_at, trio.current_time())
            try:
                with trio.CancelScope() as self.current:
                    response = await self.run_one(event.request, phase_log, nursery)
                    self.responses.append((response.id, response.status))
            except ProtocolError as error:
                await self.send_error(error)
            except ConnectionClosed:
                return
            except EngineFailure:
                pass  # already answered with response.failed; the cache slot was emptied when the turn began
            except Exception as exc:  # a handler bug: fail loudly on this connection only
                log.exception("response handler failed")
                await self.send_error(ProtocolError(errors.SERVER_ERROR, f"Internal error: {type(exc).__name__}.", status=500, type="server_error"))
                await self.ws.aclose(1011, "internal error")
                return
            finally:
                self.busy = False
                self.current = None
                self.idle.set()

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
