"""Where the http design's events go: an SSE stream for `stream: true`, or a collector whose
terminal event's Response is the JSON answer for `stream: false` (docs/protocol.md, §8)."""

from __future__ import annotations

from typing import Any

import h11
import trio

from ...protocol import codec
from ...protocol.errors import ProtocolError
from ...protocol.events import TERMINAL_TYPES
from ..outbox import Outbox
from .exchange import HttpExchange

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
SSE_HEADERS = [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]
# Events that end an SSE stream: the three terminals, and a flat `error` sent in place of one.
STREAM_END_TYPES = TERMINAL_TYPES | {"error"}


def sse_block(event: Any) -> bytes:
    """One server event as SSE: `event: <type>`, `data: <json>`, a blank line (docs/protocol.md)."""
    return f"event: {event.type}\ndata: {codec.encode_event(event)}\n\n".encode()


def sse_error_block(error: ProtocolError, sequence_number: int) -> bytes:
    """A failure once streaming: the flat error event (openai-python `response_error_event.py`)."""
    return f"event: error\ndata: {codec.encode(error.to_sse_event(sequence_number))}\n\n".encode()


class SseSink:
    """The design's sink for `stream: true`: the status line and headers go out with the first
    event, then one chunk (chunked transfer encoding, so the connection can be reused) per event.

    The chunks go through an outbox (server/outbox.py) whose writer `answers.answer_stream` runs:
    the events that are ready together (a turn's closing events, an item's opening ones) go out in
    one socket write, each still its own chunk, encoded by h11 in order as it is queued, so the bytes
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
            out.append(h11.Response(status_code=200, headers=SSE_HEADERS, reason=b"OK"))
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
