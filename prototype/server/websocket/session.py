"""The WebSocket session: one connection's state, its outgoing messages and its tasks.

`run` starts the connection's tasks in its own nursery (the lifetime limit, the outbox's writer, the
default lane's worker, a drain's close if one raced the handshake), reads frames until the client
closes, and drops everything the connection held when it ends. The session's other work lives with
its concern: reading.py, lanes.py and closing.py (mixed into the session), steering.py,
injection.py and records.py (the session's parts).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ...api.service import ApiService
from ...designs import chained, suspended
from ...protocol import codec
from ...protocol.errors import ProtocolError
from ...protocol.events import TERMINAL_TYPES
from ..config import ServerConfig
from ..outbox import Outbox
from .closing import Closing
from .injection import Injections
from .lanes import Lane, LaneWorkers
from .reading import Reading
from .records import ClientRecords, ConnectionInfo
from .steering import Steering


@attrs.define(eq=False)
class WebSocketSession(Reading, LaneWorkers, Closing):
    api: ApiService
    config: ServerConfig
    ws: WebSocketConnection
    info: ConnectionInfo
    # The server's bounded log of client records (`ResponsesServer.records`), if any; the session's records keep to it.
    log: Any = None
    records: ClientRecords = attrs.Factory(lambda self: ClientRecords(self.info, self.log), takes_self=True)
    slot: suspended.SuspensionSlot = attrs.Factory(suspended.SuspensionSlot)
    # The engine keys a connection's pinned KV by a serial number, never id(), which Python reuses.
    cache: chained.ConnectionCache = attrs.Factory(
        lambda self: chained.ConnectionCache(("chained", self.api.new_session_serial())), takes_self=True
    )
    steering: Steering = attrs.Factory(lambda self: Steering(self.send), takes_self=True)
    injections: Injections = attrs.Factory(lambda self: Injections(self.config.suspension_ttl), takes_self=True)
    # The lanes, and what their workers share: the responses in flight and the idle event a close waits on.
    lanes: dict[str | None, Lane] = attrs.Factory(dict)
    busy_lanes: int = 0
    # WS guide: at most 16 responses in flight per connection across its lanes; a lane whose next
    # create finds them all taken waits here, its create accepted and queued.
    in_flight: trio.Semaphore | None = None
    idle: trio.Event = attrs.Factory(trio.Event)
    # Each lane's response whose terminal event has not gone out yet (its `response.created`
    # snapshot and next sequence number), so a response cut short by a drain still gets one.
    open_responses: dict = attrs.Factory(dict)
    closing: bool = False  # a lane saw the connection close or fail: the workers stop
    # How the connection ends (closing.py).
    expired: bool = False  # closing: the workers take no more creates
    abort_reason: ProtocolError | None = None  # the error a response cut short by the close fails with
    shutdown: tuple | None = None  # a drain's request to close (see `shut_down`)
    nursery: trio.Nursery | None = None
    # Outgoing messages: queued by the lanes, written several per socket write by `run`'s writer.
    outbox: Outbox = attrs.Factory(lambda self: Outbox.for_websocket(self.ws), takes_self=True)

    @property
    def busy(self) -> bool:
        return self.busy_lanes > 0

    async def send(self, event: Any, stream_id: str | None = None) -> None:
        kind = event.type
        if kind == "response.created":
            self.open_responses[stream_id] = [event.response, 1]
            if (lane := self.lanes.get(stream_id)) is not None:
                lane.response_id = event.response["id"]
        elif kind in TERMINAL_TYPES:
            self.open_responses.pop(stream_id, None)
            self.injections.ended(event.response["id"])
        elif stream_id in self.open_responses and hasattr(event, "sequence_number"):
            self.open_responses[stream_id][1] = event.sequence_number + 1
        if stream_id is None:
            await self.outbox.send(codec.encode_event(event))
        else:  # events of a lane echo its stream_id (openai-python `ResponsesServerEvent`)
            await self.outbox.send(codec.encode({**event.to_dict(), "stream_id": stream_id}))

    async def send_error(self, error: ProtocolError, stream_id: str | None = None) -> None:
        event = error.to_ws_event()
        if stream_id is not None:
            event["stream_id"] = stream_id
        # Written before this returns: a close that follows (a drain, the lifetime limit, an
        # internal error) must not overtake it or the events queued before it.
        await self.outbox.send(codec.encode(event))
        await self.outbox.flush()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.in_flight = trio.Semaphore(self.config.max_in_flight)
                self.lane(None)
                nursery.start_soon(self.lifetime)
                nursery.start_soon(self.outbox.run)
                if self.shutdown is not None:
                    nursery.start_soon(self.close_after_in_flight, *self.shutdown)
                await self.reader()
                nursery.cancel_scope.cancel()  # overlapped post work is shielded and still finishes
        except* ConnectionClosed:  # from any task of the nursery, so it arrives inside a group
            pass
        finally:
            self.nursery = None  # a drain that reaches a session already over has nothing to close
            # Close drops all state (docs/protocol.md): the v2 cache and the engine KV held under
            # this connection's keys, which no other connection can reach (the keys are this session's).
            self.cache.evict(everything=True)
            for stream_id in self.lanes:
                self.api.engine.release(self.cache.lane_key(stream_id))
