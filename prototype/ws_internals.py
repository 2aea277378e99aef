"""The one place the testbed reaches into trio-websocket's internals, for three things its public API
cannot do: write several messages in one socket write, take a message its reader task already
holds without a trip through the scheduler, and leave unanswered a ping that arrives after the
server's own close frame (`wrap_server_stream`).

trio-websocket (0.12) frames one message per `send_message` and writes it under the connection's
stream lock (a checkpoint for the lock, one for the write); `get_message` is its message channel's
`receive()`, two checkpoints even when a message is waiting. `send_messages` and
`received_message_nowait` do what those do, with the same framing state, lock and error handling,
so a peer sees the same bytes; only the socket writes and the task switches are fewer.

pyproject.toml pins the versions these attributes were read from. `missing_internals` names what a
version lacks (tests/test_ws_internals.py fails with those names); on such a version both functions
fall back to the public calls, so the testbed keeps working, one write and one task switch per
message.
"""

from __future__ import annotations

import functools
import inspect
import logging

import trio
import trio_websocket
import wsproto
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest
from wsproto import ConnectionType
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, Ping, TextMessage

log = logging.getLogger(__name__)

# What each function relies on, attribute by attribute, and the kind of object it must be.
INTERNALS: dict[str, str] = {
    "_wsproto": "the connection's wsproto.WSConnection, which frames each message",
    "_stream": "the trio Stream under the connection",
    "_stream_lock": "the lock `send_message` writes under (async context manager)",
    "_close_reason": "None until the connection closed",
    "_abort_web_socket": "the coroutine `send_message` runs when the stream broke",
    "_recv_channel": "the trio.MemoryReceiveChannel the reader task puts messages into",
}


def missing_internals(ws: WebSocketConnection) -> list[str]:
    """The internals of INTERNALS that `ws` lacks or has in another form; [] when all are there."""
    checks = {
        "_wsproto": lambda value: isinstance(value, wsproto.WSConnection),
        "_stream": lambda value: isinstance(value, trio.abc.SendStream),
        "_stream_lock": lambda value: hasattr(value, "__aenter__") and hasattr(value, "__aexit__"),
        "_close_reason": lambda value: value is None or isinstance(value, trio_websocket.CloseReason),
        "_abort_web_socket": inspect.iscoroutinefunction,
        "_recv_channel": lambda value: isinstance(value, trio.MemoryReceiveChannel),
    }
    missing = []
    for name, usable in checks.items():
        if not hasattr(ws, name) or not usable(getattr(ws, name)):
            missing.append(f"{name} ({INTERNALS[name]})")
    return missing


def can_batch(ws: WebSocketConnection) -> bool:
    """Whether `send_messages` may write `ws`'s messages in one write; logs once per process when not."""
    missing = missing_internals(ws)
    if missing:
        _warn_missing(tuple(missing))
    return not missing


@functools.cache
def _warn_missing(missing: tuple[str, ...]) -> None:
    log.warning("trio-websocket %s lacks %s: one socket write per message", trio_websocket.__version__, ", ".join(missing))


async def send_messages(ws: WebSocketConnection, messages: list[str | bytes]) -> None:
    """Send `messages`, each its own WebSocket message, in one write to `ws`'s stream, framed and
    locked as `send_message` does (trio-websocket 0.12 `WebSocketConnection._send`). Raises
    ConnectionClosed as it does. `ws` must pass `can_batch`."""
    if ws._close_reason:
        raise ConnectionClosed(ws._close_reason)
    frames = ws._wsproto
    data = b"".join(
        frames.send(TextMessage(data=message) if isinstance(message, str) else BytesMessage(data=message)) for message in messages
    )
    async with ws._stream_lock:
        try:
            await ws._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await ws._abort_web_socket()
            raise ConnectionClosed(ws._close_reason) from None


def received_message_nowait(ws: WebSocketConnection) -> str | bytes | None:
    """A message `ws`'s reader task has already received, taken without a checkpoint; None when
    there is none or the internals are missing (then `get_message` waits, or raises ConnectionClosed)."""
    channel = getattr(ws, "_recv_channel", None)
    if channel is None:
        return None
    try:
        return channel.receive_nowait()
    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError, AttributeError):
        return None


# --- a server connection that does not answer pings once it is closing ---------------------------------

# What `wrap_server_stream` relies on: the connection's ping handler and reader task, and the request
# reader that `trio_websocket.wrap_server_stream` awaits (trio-websocket 0.12).
SERVER_INTERNALS = ("_handle_ping_event", "_reader_task", "_get_request", "_wsproto")


class ClosingAwareWebSocket(WebSocketConnection):
    """trio-websocket's connection, answering a ping only while the connection is open.

    trio-websocket (0.12) answers every ping its reader task reads. Once this side has sent its close
    frame, wsproto refuses to frame a pong (`LocalProtocolError: Event Pong ... cannot be sent in state
    LOCAL_CLOSING`), and the error ends the reader task, so a client that pings while the server closes
    (after a malformed `response.inject`, a drain, the lifetime limit) made the connection's nursery fail
    with a traceback (trio-websocket issue 184, fix proposed in PR 198). A ping is left unanswered from our
    close frame on: the close handshake under way ends the connection, and RFC 6455 §5.5.2 asks for a pong
    only before a close frame was received."""

    async def _handle_ping_event(self, event: Ping) -> None:
        if self._wsproto.state is ConnectionState.OPEN:  # no checkpoint between this and the pong's framing
            await super()._handle_ping_event(event)


async def wrap_server_stream(nursery: trio.Nursery, stream: trio.abc.Stream, **options) -> WebSocketRequest:
    """`trio_websocket.wrap_server_stream` (same options), on a `ClosingAwareWebSocket`: the same three
    steps, the connection, its reader task in `nursery`, the handshake's request. A trio-websocket that
    lacks what this relies on gets its own function (and pings after a close fail as before)."""
    if not all(hasattr(WebSocketConnection, name) for name in SERVER_INTERNALS[:3]):
        _warn_missing(tuple(name for name in SERVER_INTERNALS[:3] if not hasattr(WebSocketConnection, name)))
        return await trio_websocket.wrap_server_stream(nursery, stream, **options)
    connection = ClosingAwareWebSocket(stream, wsproto.WSConnection(ConnectionType.SERVER), **options)
    nursery.start_soon(connection._reader_task)
    return await connection._get_request()
