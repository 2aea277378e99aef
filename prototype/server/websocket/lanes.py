"""A connection's lanes: each `stream_id` (and the default lane, none) runs its creates in order.

A lane opens with its worker task on first use, up to the server's `max_streams` named lanes. The
worker takes the lane's queued creates one at a time (WS guide: one response in flight per lane,
the rest queued), each waiting for one of the connection's `max_in_flight` places across its lanes,
and runs the response its design makes of it, then the automatic successor a steer asked for. Each
way a response ends is answered on its lane and recorded: its terminal event, a refusal inside the
turn, an engine failure, a cancel, a closed connection, a handler bug.
"""

from __future__ import annotations

import functools
import logging
import math

import attrs
import trio
from trio_websocket import ConnectionClosed

from ... import metrics
from ...designs import chained, suspended
from ...designs.cancel import ResponseCancelled
from ...designs.emitter import Emitter, EngineFailure
from ...protocol import errors
from ...protocol.errors import ProtocolError, response_error
from ...protocol.events import CreateRequest, ResponseCreate, ResponseFailed
from ...protocol.steering import Refusal, Submission, successor_input
from ...protocol.wire import CHAINED, SUSPENDED
from .closing import CLOSE_HANDSHAKE_SECONDS

log = logging.getLogger(__package__)


@attrs.define(eq=False)
class Lane:
    """One `stream_id` of a connection: its queue of creates and its running response's scope."""

    stream_id: str | None
    queue: trio.MemorySendChannel
    scope: trio.CancelScope | None = None  # the running response's, so a drain can cut it short
    # The id its running response announced in `response.created`: the record of a response that ends
    # without returning one (cut by a drain, failed by the engine) still names what the client saw.
    response_id: str | None = None


class LaneWorkers:
    """The lanes of a `WebSocketSession` (mixed into it: every method's `self` is the session)."""

    def lane(self, stream_id: str | None) -> Lane:
        """The lane of `stream_id`, opened (with its worker) on first use, up to `max_streams`."""
        lane = self.lanes.get(stream_id)
        if lane is None:
            if stream_id is not None and len(self.lanes) - (None in self.lanes) >= self.config.max_streams:
                raise errors.websocket_stream_limit_reached(self.config.max_streams)  # the default lane is not counted
            send_queue, receive_queue = trio.open_memory_channel[tuple[ResponseCreate, float, int]](self.config.max_queued_creates)
            lane = self.lanes[stream_id] = Lane(stream_id, send_queue)
            self.nursery.start_soon(self.worker, lane, receive_queue)
        return lane

    async def worker(self, lane: Lane, queue: trio.MemoryReceiveChannel) -> None:
        free_since = -math.inf  # when the lane last finished a response
        async for event, queued_at, size in queue:
            request: CreateRequest | None = event.request
            claimed = self.steering.book.claim(lane.stream_id, request.previous_response_id)
            if claimed:  # queued steering input is prepended, in submission order (reference)
                request = attrs.evolve(request, input=successor_input(claimed) + request.input)
            while request is not None:
                if self.expired:
                    await self.steering.successor_failed(claimed, "The connection reached its lifetime limit.")
                    return
                successor_claims: list[Submission] = []
                # The response's schedule starts when its frame arrived, or when the lane freed up if
                # it had to wait for the one before, or when an in-flight slot freed up if the
                # connection had none (metrics.PhaseLog.schedule).
                starts_at = max(queued_at, free_since)
                try:
                    self.in_flight.acquire_nowait()
                except trio.WouldBlock:
                    await self.in_flight.acquire()
                    starts_at = trio.current_time()
                try:
                    request = await self.run_create(lane, request, queued_at, claimed, successor_claims, size, starts_at)
                finally:
                    self.in_flight.release()
                free_since = trio.current_time()
                if self.closing:
                    return
                claimed, queued_at, size = tuple(successor_claims), free_since, 0

    async def run_create(
        self, lane: Lane, request: CreateRequest, queued_at: float, claimed: tuple, successor_claims: list,
        size: int = 0, starts_at: float | None = None,
    ) -> CreateRequest | None:
        """One response on `lane`; returns the automatic successor's request, if any. `size`: the
        create frame's bytes (0 for an automatic successor), for the client records."""
        self.busy_lanes += 1
        self.idle = trio.Event() if self.busy_lanes == 1 else self.idle
        now = trio.current_time()
        phase_log = metrics.PhaseLog(schedule=now if starts_at is None else min(starts_at, now))
        phase_log.record(metrics.QUEUE, queued_at, max(phase_log.schedule, queued_at))
        phase_log.client = self.records.protocol_choices(request)
        appends_before, append_bytes_before = self.records.appends, self.records.append_bytes
        response, outcome, successor = None, "cancelled", None
        view = self.lane_view(lane, claimed)
        lane.response_id = None
        try:
            with trio.CancelScope() as scope:
                lane.scope = scope
                response = await self.run_one(request, phase_log, view)
                outcome = response.status
            if scope.cancelled_caught and self.abort_reason is not None and lane.stream_id in self.open_responses:
                outcome = "failed"  # cut short by a drain past its grace: it still gets its terminal event,
                with trio.move_on_after(CLOSE_HANDSHAKE_SECONDS):  # unless its client stopped reading
                    await self.fail_open_response(lane.stream_id, self.abort_reason)
            if response is not None and self.info.design == CHAINED:
                successor = await self.steering.after_response(response, successor_claims)
        except ProtocolError as error:
            outcome = f"error:{error.code}"
            self.cache.evict(lane.stream_id)  # a failed turn leaves the lane's slot empty (docs/protocol.md)
            await self.send_error(error, lane.stream_id)
            await self.steering.successor_failed(claimed, f"The continuation failed: {error.code}.")
        except ConnectionClosed:
            outcome = "closed"
            self.closing = True
        except EngineFailure:
            outcome = "failed"  # already answered with response.failed
            self.cache.evict(lane.stream_id)  # as for any failed turn (docs/protocol.md)
            await self.steering.running_failed(view.lane)
        except ResponseCancelled as cancelled:
            response, outcome = cancelled.response, "cancelled"  # already answered with response.cancelled
            self.cache.evict(lane.stream_id)  # a cancelled turn is not chained from (docs/protocol.md, "Cancel")
            await self.steering.running_failed(view.lane)
        except Exception as exc:  # a handler bug: fail loudly on this connection only
            outcome = "error:server_error"
            log.exception("response handler failed")
            self.closing = True
            await self.send_error_and_close(
                ProtocolError(errors.SERVER_ERROR, f"Internal error: {type(exc).__name__}.", status=500, type="server_error"), 1011, "internal error"
            )
        finally:
            lane.scope = None
            self.busy_lanes -= 1
            if self.busy_lanes == 0:
                self.idle.set()
            self.records.keep(phase_log, response, outcome, self.records.appends - appends_before,
                              size + self.records.append_bytes - append_bytes_before, announced_id=lane.response_id)
        return successor

    def lane_view(self, lane: Lane, claimed: tuple[Submission, ...]) -> chained.LaneView:
        """What a turn on `lane` sees: its cache slot, and the hooks of steering and injection."""
        refusals: list[Refusal] = []

        async def on_created(emitter: Emitter) -> None:
            self.injections.opened(emitter)
            await self.steering.started(emitter, claimed, lane.stream_id, refusals)

        return attrs.evolve(
            self.cache.view(lane.stream_id), on_created=on_created, stop_requested=self.steering.book.stop_requested,
            injected_outputs=self.injections.injected_outputs,
        )

    async def run_one(self, request, phase_log: metrics.PhaseLog, view: chained.LaneView):
        """The response `request` asks for, as the connection's design runs it."""
        if self.info.design == SUSPENDED:
            return await suspended.run_rollout(
                self.api, request, self.send, self.slot,
                ttl=self.config.suspension_ttl, include_timing=self.info.include_timing,
                api_key=self.info.api_key, log=phase_log,
            )
        stream_id = view.lane
        return await chained.run_turn(
            self.api, request, functools.partial(self.send, stream_id=stream_id), view, self.nursery,
            switches=self.config.switches, include_timing=self.info.include_timing,
            api_key=self.info.api_key, log=phase_log,
        )

    async def fail_open_response(self, stream_id: str | None, reason: ProtocolError) -> None:
        """End a lane's response that was cancelled before its terminal event with `response.failed`."""
        snapshot, next_sequence = self.open_responses.pop(stream_id)
        # The reason's own code follows in the connection's `error` event; inside the Response, the schema's code.
        response = dict(snapshot, status="failed", error=response_error(reason.message))
        await self.send(ResponseFailed(next_sequence, response=response), stream_id)
