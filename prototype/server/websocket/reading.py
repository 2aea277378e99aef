"""A WebSocket connection's reader: each frame decoded and dispatched, a bad one answered.

A frame the codec or the connection's design refuses gets its `error` (tagged with the lane of a
refused create on v2), and the next frame is read; a malformed `response.inject` closes the
connection (multi-agent guide). A create goes to its lane's queue, an append to the suspended v1
rollout, a steer to the steering book, an inject to the injection book (docs/protocol.md).
"""

from __future__ import annotations

import trio
from trio_websocket import ConnectionClosed

from ...protocol import codec, errors
from ...protocol.errors import ProtocolError
from ...protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer
from ...protocol.inject import BETA_MULTI_AGENT, MalformedInject, ResponseInject
from ...protocol.wire import CHAINED, SUSPENDED


class Reading:
    """The reader of a `WebSocketSession` (mixed into it: every method's `self` is the session)."""

    async def reader(self) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return
            arrived = trio.current_time()
            event = None
            try:
                event = codec.decode_client_event(message)
                await self.dispatch(event, len(message.encode()) if isinstance(message, str) else len(message), arrived)
            except MalformedInject as error:  # multi-agent guide: a generic 400 error, then the connection closes
                self.records.refusal(error)
                await self.send_error_and_close(error, 1008, "malformed response.inject")  # close code [ours]
                return
            except ProtocolError as error:
                self.records.refusal(error)
                # A refused create's error names its lane (WS guide: `websocket_stream_limit_reached`
                # carries the refused `stream_id`); a malformed `stream_id` never became a lane, and
                # v1 has no lanes.
                request = getattr(event, "request", None)
                tagged = request is not None and self.info.design == CHAINED
                await self.send_error(error, request.stream_id if tagged else None)

    async def dispatch(self, event: object, size: int, arrived: float) -> None:
        """`size`: the frame's bytes, for the client records; `arrived`: when the frame was read."""
        if isinstance(event, ResponseCreate):
            request = event.request
            if self.info.design == SUSPENDED:
                # v1 had one response per connection and no lanes (docs/protocol.md).
                for field, bad in (
                    ("previous_response_id", request.previous_response_id is not None),
                    ("generate", not request.generate),
                    ("stream_id", request.stream_id is not None),
                    ("multi_agent", request.multi_agent is not None),
                ):
                    if bad:
                        raise ProtocolError(errors.UNSUPPORTED_PARAMETER, f"'{field}' is not supported on the suspended (v1) protocol.", param=field)
            elif request.multi_agent is not None and not self.info.multi_agent:
                raise ProtocolError(
                    errors.UNSUPPORTED_PARAMETER, f"'multi_agent' needs the 'OpenAI-Beta: {BETA_MULTI_AGENT}' header on the connection.",
                    param="multi_agent",
                )
            lane = self.lane(request.stream_id)
            try:
                lane.queue.send_nowait((event, arrived, size))
            except trio.WouldBlock:
                raise ProtocolError(
                    errors.TOO_MANY_QUEUED_REQUESTS, f"More than {self.config.max_queued_creates} response.create requests are waiting on this lane."
                ) from None
        elif isinstance(event, ResponseAppend):
            if self.info.design != SUSPENDED:
                raise ProtocolError(
                    errors.UNKNOWN_EVENT_TYPE,
                    "response.append is not supported in ws v2; use response.create with previous_response_id",
                    param="type",
                )
            self.slot.deliver(event.input, arrived)
            self.records.appended(size)
        elif isinstance(event, ResponseSteer):
            await self.steering.steer(event.frame, supported=self.info.design == CHAINED)
        elif isinstance(event, ResponseInject):
            if self.info.design != CHAINED or not self.info.multi_agent:
                raise ProtocolError(
                    errors.UNKNOWN_EVENT_TYPE, f"response.inject needs the 'OpenAI-Beta: {BETA_MULTI_AGENT}' header on a v2 connection.",
                    param="type",
                )
            await self.injections.inject(event, arrived, self)
        elif isinstance(event, ResponseProcessed):
            pass  # Codex's optional acknowledgement (docs/protocol.md)
