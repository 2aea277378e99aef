"""A connection's outgoing messages, several per socket write when they are ready together.

A response's task produces its events back to back wherever the model does not make it wait: the
closing events of a turn (`output_text.done`, `content_part.done`, `output_item.done`,
`response.completed`), an item's opening events, a flush of coalesced deltas. Written one message
per `send_message`, each costs a socket write and a trio checkpoint (a trip through the scheduler).
Here the producer only queues its messages; the connection's writer task runs once the producer
waits for something (the next token, the client's tool output) and writes every message queued
since its last write as one buffer. Each message is still its own WebSocket frame, framed by the
connection's own wsproto state exactly as `send_message` frames it (prototype/ws_internals.py): a
client sees the same messages in the same order, only more of them per TCP segment.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ..ws_internals import can_batch, send_messages

# Queued bytes past which a producer waits for the writer, as it would wait on a full socket send
# buffer with direct writes: a client that stops reading holds its responses back (the model stops
# decoding for it) instead of letting the server's memory grow. 16 KiB is Linux's default initial
# TCP send buffer (net.ipv4.tcp_wmem, Documentation/networking/ip-sysctl.rst): a turn's closing
# events fit in it, and a message bigger than it still goes out whole, in the batch it joined.
OUTBOX_LIMIT_BYTES = 16 * 1024


async def send_one_by_one(ws: WebSocketConnection, messages: list[str | bytes]) -> None:
    """One `send_message` per message: where trio-websocket lacks what `send_messages` uses."""
    for message in messages:
        await ws.send_message(message)


# What a failed write raises: the WebSocket closed, or the HTTP client's stream broke or closed.
WRITE_FAILURES = (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError)


@attrs.define(eq=False)
class Outbox:
    """The messages a connection's tasks have queued and its writer has not written yet."""

    write: Callable[[list[Any]], Awaitable[None]]
    """Writes a batch of messages in order, in one socket write."""
    limit: int = OUTBOX_LIMIT_BYTES
    """Queued bytes past which `send` waits for the writer (OUTBOX_LIMIT_BYTES)."""
    writes: int = 0
    """Socket writes so far (each of one or more messages)."""
    _queued: list[Any] = attrs.Factory(list)
    _queued_bytes: int = 0
    _writing: bool = False
    _failure: BaseException | None = None
    _ready: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    _drained: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    @classmethod
    def for_websocket(cls, ws: WebSocketConnection) -> Outbox:
        return cls(functools.partial(send_messages if can_batch(ws) else send_one_by_one, ws))

    async def send(self, message: Any) -> None:
        """Queue one message. Returns at once, without a checkpoint, unless more than `limit`
        bytes are waiting (then it waits until they are written). Once a write has failed, raises
        what it raised (ConnectionClosed, trio.BrokenResourceError), as a direct write would."""
        if self._failure is not None:
            raise self._failure
        self._queued.append(message)
        self._queued_bytes += len(message)
        self._ready.unpark_all()
        if self._queued_bytes > self.limit:
            await self.flush()

    async def flush(self) -> None:
        """Wait until everything queued so far is written; raises what a failed write raised."""
        while (self._queued or self._writing) and self._failure is None:
            await self._drained.park()
        if self._failure is not None:
            raise self._failure

    async def run(self) -> None:
        """The writer: every message queued since its last write, in one write. Returns when a
        write fails (later sends raise its error); runs until cancelled otherwise."""
        while True:
            while not self._queued:
                await self._ready.park()
            batch, self._queued, self._queued_bytes = self._queued, [], 0
            self._writing = True
            try:
                await self.write(batch)
                self.writes += 1
            except WRITE_FAILURES as failure:
                self._failure = failure
                return
            finally:
                self._writing = False
                self._drained.unpark_all()
