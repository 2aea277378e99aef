"""How a WebSocket connection ends on the server's side: the lifetime limit, a drain, a malformed
frame or a handler bug. The responses in flight end with their terminal events first (within a
grace, else cut with `response.failed`), then the reason goes out as an `error` and the close
handshake runs, bounded, so a client that never answers cannot hold the connection.
"""

from __future__ import annotations

import math

import trio
from trio_websocket import ConnectionClosed

from ...protocol import errors
from ...protocol.errors import ProtocolError

# How long a server-initiated close may wait for the client's close frame (RFC 6455 §7.1.2: the
# closing endpoint waits for the peer's reply before closing TCP). The reply takes one round trip:
# 5 s is 33 of the 150 ms intercontinental preset's (netem.INTERCONTINENTAL), and bounds what a
# client that never answers costs a drain [ours].
CLOSE_HANDSHAKE_SECONDS = 5.0


class Closing:
    """The close paths of a `WebSocketSession` (mixed into it: every method's `self` is the session)."""

    async def lifetime(self) -> None:
        """At the connection limit: the in-flight response ends with a terminal event, then the
        `error` `websocket_connection_limit_reached` and close 1000. The WS guide
        (https://developers.openai.com/api/docs/guides/websocket-mode) gives the 60-minute limit and
        that error code, and says to open a new connection; it names no close code, so the close is
        the normal one (RFC 6455 §7.4.1). A response still running `lifetime_grace` seconds after
        the limit (one whose client stopped reading cannot end) is cancelled and fails with it."""
        await trio.sleep(self.config.connection_lifetime)
        limit = errors.connection_limit_reached(self.config.connection_lifetime / 60)
        await self.close_after_in_flight(limit, 1000, "connection limit reached", self.config.lifetime_grace)

    def shut_down(self, reason: ProtocolError, code: int, close_reason: str, grace: float) -> None:
        """A drain: close as `close_after_in_flight` does, in this connection's own nursery, so the
        close ends with the connection whatever happens first."""
        self.shutdown = (reason, code, close_reason, grace)
        if self.nursery is None:
            return
        try:
            self.nursery.start_soon(self.close_after_in_flight, *self.shutdown)
        except RuntimeError:  # its last task has ended and its nursery has closed: the session is over
            pass

    async def close_after_in_flight(self, reason: ProtocolError, code: int, close_reason: str, grace: float = math.inf) -> None:
        """Take no more creates (queued ones are dropped); let the responses in flight end with
        their terminal events: a v2 turn finishes, a v1 rollout fails with `reason` at once if
        paused or at its next pause if streaming; one still running after `grace` seconds is
        cancelled and fails with `reason`. Then send `reason` as an error and close with `code`."""
        self.expired = True
        self.slot.end(reason)
        if self.busy:
            with trio.move_on_after(grace):
                await self.idle.wait()
            if self.busy:
                self.abort_reason = reason
                for lane in self.lanes.values():
                    if lane.scope is not None:
                        lane.scope.cancel()
                await self.idle.wait()
        await self.send_error_and_close(reason, code, close_reason)

    async def send_error_and_close(self, reason: ProtocolError, code: int, close_reason: str) -> None:
        """Send `reason` as an `error`, then close with `code` and wait for the client's close frame.

        Shielded and bounded: `aclose` ends the reader at once, and the reader's return cancels the
        connection's nursery; unshielded, that cancel would cut the handshake short and drop the
        frames still on a delayed link (the terminal event, the error, the close), which the client
        would see as 1006."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_HANDSHAKE_SECONDS) as handshake:
            try:
                await self.send_error(reason)
                await self.ws.aclose(code, close_reason)
            except ConnectionClosed:
                pass
        if handshake.cancelled_caught and self.nursery is not None:
            # A client that reads nothing never gets the error or the close frame: the session ends
            # without them, and the server drops the connection (app.serve_websocket).
            self.nursery.cancel_scope.cancel()
