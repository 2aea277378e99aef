"""One HTTP connection's h11 state machine and the stream under it, and the answers written on a
connection no state machine owns (an error found before any request was parsed)."""

from __future__ import annotations

import http as _http
from typing import Any

import h11
import trio

from ...protocol import codec
from ...protocol.errors import ProtocolError
from ..config import MAX_HEAD_BYTES

JSON_CONTENT_TYPE = b"application/json"


def parse_head(head: bytes) -> h11.Request | None:
    """The request line and headers, or None if they are not valid HTTP/1.1."""
    connection = h11.Connection(h11.SERVER)
    try:
        connection.receive_data(head)
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    return event if isinstance(event, h11.Request) else None


def reason_phrase(status: int) -> bytes:
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
    data = connection.send(h11.Response(status_code=status, headers=headers, reason=reason_phrase(status)))
    return data + connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage())


async def send_simple_error(stream: trio.abc.Stream, status: int, error: ProtocolError) -> None:
    """An error response on a connection no h11 state machine owns; the connection then closes."""
    await stream.send_all(_response_bytes(status, codec.encode(error.to_http_body()).encode()))


class BodyTooLarge(Exception):
    pass


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
        """The request body, up to `limit` bytes; raises BodyTooLarge or h11.RemoteProtocolError."""
        body = bytearray()
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise BodyTooLarge
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
        response = h11.Response(status_code=status, headers=headers + (extra or []), reason=reason_phrase(status))
        if head_only:
            await self.send(response, h11.EndOfMessage())
        else:
            await self.send(response, h11.Data(data=body), h11.EndOfMessage())

    async def send_error(self, error: ProtocolError, *, close: bool = False, extra: list | None = None, head_only: bool = False) -> None:
        self.refused = error
        await self.send_json(error.status, error.to_http_body(), close=close, extra=extra, head_only=head_only)
