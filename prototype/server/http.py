"""HTTP on the WebSocket's port: `POST /v1/responses` (h11)."""

from __future__ import annotations

import h11
import trio

from ..protocol import codec
from ..protocol.errors import ProtocolError


def parse_head(head: bytes) -> h11.Request | None:
    """The request line and headers, or None if they are not valid HTTP/1.1."""
    connection = h11.Connection(h11.SERVER)
    try:
        connection.receive_data(head)
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    return event if isinstance(event, h11.Request) else None


def _response_bytes(status: int, body: bytes, content_type: bytes = b"application/json", extra: list | None = None) -> bytes:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    connection.next_event()
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    data = connection.send(h11.Response(status_code=status, headers=headers + (extra or [])))
    return data + connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage())


async def send_simple_error(stream: trio.abc.Stream, status: int, error: ProtocolError) -> None:
    await stream.send_all(_response_bytes(status, codec.encode(error.to_http_body()).encode()))


async def serve_http(server, stream: trio.abc.Stream) -> None:
    head = await stream.receive_some()
    request = parse_head(head)
    assert request is not None
    await send_simple_error(stream, 501, ProtocolError("not_implemented", "HTTP is not served yet.", status=501))
