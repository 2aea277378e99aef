"""One WebSocket connection: read frames, answer bad ones, run each lane's creates FIFO.

The reader task decodes frames and dispatches them; each lane (`stream_id`; no `stream_id` is the
default lane) has a worker task that runs its `response.create`s in arrival order (WS guide: one
response in flight per lane, the rest queued, never rejected until the queue is full); lanes run
side by side. A v1 `response.append` bypasses the queue and goes straight to the suspended rollout.
`response.steer` goes to the connection's steering book (protocol/steering.py), which this session
drives: it answers with `response.steer.accepted` or `.failed`, stops the target at its next safe
boundary, sends `.pending` after a response that waits for client tool output, and runs the
automatic successor on the target's lane. Every task the connection starts lives in its nursery
and ends with it.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from .. import metrics
from ..api.service import ApiService
from ..designs import chained, suspended
from ..designs.cancel import ResponseCancelled
from ..designs.emitter import Emitter, EngineFailure
from ..designs.inject import InjectedOutputs
from ..protocol import codec, errors
from ..protocol.errors import ProtocolError
from ..protocol.events import (
    TERMINAL_TYPES,
    CreateRequest,
    InjectCreated,
    InjectFailed,
    ResponseAppend,
    ResponseCreate,
    ResponseFailed,
    ResponseProcessed,
    ResponseSteer,
    SteerAccepted,
    SteerFailed,
    SteerPending,
)
from ..protocol.inject import BETA_MULTI_AGENT, ROOT, InjectBook, InjectRefused, MalformedInject, ResponseInject
from ..protocol.items import FunctionCall
from ..protocol.steering import WAITING_FOR_REQUIRED_INPUT, Refusal, SteeringBook, Submission, successor_input
from ..protocol.wire import CHAINED, SUSPENDED
from .config import ServerConfig
from .outbox import Outbox

log = logging.getLogger(__name__)

# How long a server-initiated close may wait for the client's close frame (RFC 6455 §7.1.2: the
# closing endpoint waits for the peer's reply before closing TCP). The reply takes one round trip:
# 5 s is 33 of the 150 ms intercontinental preset's (netem.INTERCONTINENTAL), and bounds what a
# client that never answers costs a drain [ours].
CLOSE_HANDSHAKE_SECONDS = 5.0

@attrs.define(eq=False)
class ConnectionInfo:
    """What the handshake told us, recorded with the connection's timing records."""

    design: str
    api_key: str | None
    include_timing: bool = False
    user_agent: str = ""
    connection: int = 0  # the server's serial number for this connection, in the client records
    multi_agent: bool = False  # `OpenAI-Beta: responses_multi_agent=v1`: `multi_agent` and `response.inject`


@attrs.define(eq=False)
class Lane:
    """One `stream_id` of a connection: its queue of creates and its running response's scope."""

    stream_id: str | None
    queue: trio.MemorySendChannel
    scope: trio.CancelScope | None = None  # the running response's, so a drain can cut it short
    # The id its running response announced in `response.created`: the record of a response that ends
    # without returning one (cut by a drain, failed by the engine) still names what the client saw.
    response_id: str | None = None


@attrs.define(eq=False)
class WebSocketSession:
    api: ApiService
    config: ServerConfig
    ws: WebSocketConnection
    info: ConnectionInfo
    slot: suspended.SuspensionSlot = attrs.Factory(suspended.SuspensionSlot)
    # The engine keys a connection's pinned KV by a serial number, never id(), which Python reuses.
    cache: chained.ConnectionCache = attrs.Factory(
        lambda self: chained.ConnectionCache(("chained", self.api.new_session_serial())), takes_self=True
    )
    lanes: dict[str | None, Lane] = attrs.Factory(dict)
    steering: SteeringBook = attrs.Factory(SteeringBook)
    emitters: dict[str, Emitter] = attrs.Factory(dict)  # the steering book's responses: steer events number in theirs
    busy_lanes: int = 0
    # WS guide: at most 16 responses in flight per connection across its lanes; a lane whose next
    # create finds them all taken waits here, its create accepted and queued.
    in_flight: trio.Semaphore | None = None
    expired: bool = False
    idle: trio.Event = attrs.Factory(trio.Event)
    nursery: trio.Nursery | None = None
    records: Any = None  # the server's bounded log of client records (`ResponsesServer.records`), if any
    appends: int = 0  # v1 `response.append` frames delivered on this connection
    append_bytes: int = 0  # their total size, for the records' `request_bytes`
    closing: bool = False  # a lane saw the connection close or fail: the workers stop
    # Each lane's response whose terminal event has not gone out yet (its `response.created`
    # snapshot and next sequence number), so a response cut short by a drain still gets one.
    open_responses: dict = attrs.Factory(dict)
    abort_reason: ProtocolError | None = None
    # `response.inject`: the book decides (protocol/inject.py); the emitters of the active responses
    # number its events; the waiting backends are woken when an injection answers their calls.
    injects: InjectBook = attrs.Factory(InjectBook)
    active: dict[str, Emitter] = attrs.Factory(dict)
    waiting: dict[str, dict[str, InjectedOutputs]] = attrs.Factory(dict)  # response id -> agent -> backend
    shutdown: tuple | None = None  # a drain's request to close (see `shut_down`)
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
            response_id = event.response["id"]
            self.injects.closed(response_id)  # from here on an injection is `response_already_completed`
            self.active.pop(response_id, None)
            self.waiting.pop(response_id, None)
        elif stream_id in self.open_responses and hasattr(event, "sequence_number"):
            self.open_responses[stream_id][1] = event.sequence_number + 1
        if stream_id is None:
            await self.outbox.send(codec.encode_event(event))
        else:  # events of a lane echo its stream_id (openai-python `ResponsesServerEvent`)
            await self.outbox.send(codec.encode({**event.to_dict(), "stream_id": stream_id}))

    async def fail_open_response(self, stream_id: str | None, reason: ProtocolError) -> None:
        """End a lane's response that was cancelled before its terminal event with `response.failed`."""
        snapshot, next_sequence = self.open_responses.pop(stream_id)
        response = dict(snapshot, status="failed", error={"code": reason.code, "message": reason.message})
        await self.send(ResponseFailed(next_sequence, response=response), stream_id)

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
                self.record_refusal(error)
                await self.send_error_and_close(error, 1008, "malformed response.inject")  # close code [ours]
                return
            except ProtocolError as error:
                self.record_refusal(error)
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
            self.appends += 1
            self.append_bytes += size
        elif isinstance(event, ResponseSteer):
            await self.steer(event)
        elif isinstance(event, ResponseInject):
            if self.info.design != CHAINED or not self.info.multi_agent:
                raise ProtocolError(
                    errors.UNKNOWN_EVENT_TYPE, f"response.inject needs the 'OpenAI-Beta: {BETA_MULTI_AGENT}' header on a v2 connection.",
                    param="type",
                )
            await self.inject(event, arrived)
        elif isinstance(event, ResponseProcessed):
            pass  # Codex's optional acknowledgement (docs/protocol.md)

    # --- injection: the session drives the sans-IO book -------------------------------------------

    async def inject(self, event: ResponseInject, arrived: float) -> None:
        """`response.inject.created`, numbered in the target's sequence, and the waiting response
        resumes once every call it waits for is answered; else `response.inject.failed` with the
        raw input (sequence number 0 and no lane when the target is not active [ours]); items the
        target cannot take are an `error` event on the target's lane, and the connection keeps serving."""
        emitter = self.active.get(event.response_id)
        streamed = [] if emitter is None else [
            item.call_id for item in emitter.response.output if isinstance(item, FunctionCall) and item.status == "completed"
        ]
        try:
            outcome = self.injects.submit(event, streamed)
        except ProtocolError as error:
            self.record_refusal(error)
            lane = next((lane.stream_id for lane in self.lanes.values() if lane.response_id == event.response_id), None)
            await self.send_error(error, lane)
            return
        if isinstance(outcome, InjectRefused):
            fields = {"response_id": event.response_id, "input": event.raw_input, "error": {"code": outcome.code, "message": outcome.message}}
            if emitter is None:
                await self.send(InjectFailed(sequence_number=0, **fields))
            else:
                await emitter.emit(InjectFailed, **fields)
            return
        await emitter.emit(InjectCreated, response_id=event.response_id)
        for agent in outcome.resumes:
            self.waiting[event.response_id][agent].wake(arrived)

    def injected_outputs(self, emitter: Emitter, agent: str = ROOT) -> InjectedOutputs:
        backend = InjectedOutputs(self.injects, emitter.response.id, self.config.suspension_ttl, emitter.log, agent)
        self.waiting.setdefault(emitter.response.id, {})[agent] = backend
        return backend

    # --- steering: the session drives the sans-IO book --------------------------------------------

    async def steer(self, event: ResponseSteer) -> None:
        """v1 refuses (`steering_not_supported`); v2 accepts while the target runs (docs/protocol.md)."""
        outcome = self.steering.submit(event.frame, supported=self.info.design == CHAINED)
        if isinstance(outcome, Refusal):
            await self.send_refusals([outcome])
        else:
            await self.send_steer_event(outcome.previous_response_id, SteerAccepted, steer={"id": outcome.id, "previous_response_id": outcome.previous_response_id})

    async def send_steer_event(self, response_id: str, event_type: type, **fields: Any) -> None:
        """A steer event numbered in its target's sequence and tagged with its lane; 0 and no lane
        when the target is not available [ours]."""
        emitter = self.emitters.get(response_id)
        if emitter is None:
            await self.send(event_type(sequence_number=0, **fields))
        else:
            await emitter.emit(event_type, **fields)

    async def send_refusals(self, refusals: list[Refusal]) -> None:
        for refusal in refusals:
            submission = refusal.submission
            steer = {"previous_response_id": submission.previous_response_id, "input": submission.input}
            if submission.id is not None:
                steer = {"id": submission.id, **steer}
            error = {"type": "invalid_request_error", "code": refusal.code, "message": refusal.message}
            await self.send_steer_event(submission.previous_response_id, SteerFailed, steer=steer, error=error)

    def lane_view(self, lane: Lane, claimed: tuple[Submission, ...]) -> chained.LaneView:
        refusals: list[Refusal] = []

        async def on_created(emitter: Emitter) -> None:
            response_id = emitter.response.id
            self.active[response_id] = emitter
            self.injects.opened(response_id, takes_input=emitter.response.request.takes_injected_input)
            self.steering.committed(claimed)  # the successor's response.created is the commit point
            refusals.extend(self.steering.started(response_id, lane.stream_id))
            self.emitters[response_id] = emitter
            self.emitters = {rid: e for rid, e in self.emitters.items() if self.steering.is_known(rid)}
            await self.send_refusals(refusals)

        return attrs.evolve(
            self.cache.view(lane.stream_id), on_created=on_created, stop_requested=self.steering.stop_requested,
            injected_outputs=self.injected_outputs,
        )

    async def after_response(self, response, claimed_for_next: list) -> CreateRequest | None:
        """The terminal event went out: pending notices, refusals, or the automatic successor that
        inherits the response's settings and continues from it with the queued input."""
        # A response that takes injected outputs answered its calls in place (designs/inject.py): it
        # never ends waiting for the client's tool output, so a steer on it has nothing to wait for.
        awaiting = () if response.request.takes_injected_input else response.output
        ended = self.steering.ended(response.id, response.status, awaiting)
        for submission in ended.pending:
            await self.send_steer_event(
                response.id, SteerPending, reason=WAITING_FOR_REQUIRED_INPUT,
                required_input=[dict(stub) for stub in self.steering.targets[response.id].required_input],
                steer={"id": submission.id, "previous_response_id": response.id},
            )
        await self.send_refusals(list(ended.refused))
        if not ended.successor:
            return None
        claimed_for_next.extend(ended.successor)
        return attrs.evolve(response.request, previous_response_id=response.id, input=successor_input(ended.successor), generate=True)

    # --- the lanes' workers ------------------------------------------------------------------------

    async def worker(self, lane: Lane, queue: trio.MemoryReceiveChannel) -> None:
        free_since = -math.inf  # when the lane last finished a response
        async for event, queued_at, size in queue:
            request: CreateRequest | None = event.request
            claimed = self.steering.claim(lane.stream_id, request.previous_response_id)
            if claimed:  # queued steering input is prepended, in submission order (reference)
                request = attrs.evolve(request, input=successor_input(claimed) + request.input)
            while request is not None:
                if self.expired:
                    await self.send_refusals(self.steering.successor_failed(claimed, "The connection reached its lifetime limit."))
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
        self, lane: Lane, request: CreateRequest, queued_at: float, claimed: tuple, successor_claims: list, size: int = 0,
        starts_at: float | None = None,
    ) -> CreateRequest | None:
        """One response on `lane`; returns the automatic successor's request, if any. `size`: the
        create frame's bytes (0 for an automatic successor), for the client records."""
        self.busy_lanes += 1
        self.idle = trio.Event() if self.busy_lanes == 1 else self.idle
        now = trio.current_time()
        phase_log = metrics.PhaseLog(schedule=now if starts_at is None else min(starts_at, now))
        phase_log.record(metrics.QUEUE, queued_at, max(phase_log.schedule, queued_at))
        phase_log.client = self.protocol_choices(request)
        appends_before, append_bytes_before = self.appends, self.append_bytes
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
                successor = await self.after_response(response, successor_claims)
        except ProtocolError as error:
            outcome = f"error:{error.code}"
            self.cache.evict(lane.stream_id)  # a failed turn leaves the lane's slot empty (docs/protocol.md)
            await self.send_error(error, lane.stream_id)
            await self.send_refusals(self.steering.successor_failed(claimed, f"The continuation failed: {error.code}."))
        except ConnectionClosed:
            outcome = "closed"
            self.closing = True
        except EngineFailure:
            outcome = "failed"  # already answered with response.failed
            self.cache.evict(lane.stream_id)  # as for any failed turn (docs/protocol.md)
            await self.fail_steers_of_running(view)
        except ResponseCancelled as cancelled:
            response, outcome = cancelled.response, "cancelled"  # already answered with response.cancelled
            self.cache.evict(lane.stream_id)  # a cancelled turn is not chained from (docs/protocol.md, "Cancel")
            await self.fail_steers_of_running(view)
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
            self.keep_record(phase_log, response, outcome, self.appends - appends_before, size + self.append_bytes - append_bytes_before,
                             announced_id=lane.response_id)
        return successor

    async def fail_steers_of_running(self, view: chained.LaneView) -> None:
        """The lane's running response failed: its queued steering input is returned."""
        recent = self.steering.lanes.get(view.lane) or []
        if recent:
            ended = self.steering.ended(recent[-1], "failed")
            await self.send_refusals(list(ended.refused))

    # --- client records: who spoke and how it used the protocol ----------------------

    def protocol_choices(self, request) -> dict[str, Any]:
        info = self.info
        return metrics.protocol_choices(
            request, transport="websocket", design=info.design, user_agent=info.user_agent, connection=info.connection
        )

    def keep_record(self, phase_log: metrics.PhaseLog, response, outcome: str, appends: int, request_bytes: int = 0,
                    announced_id: str | None = None) -> None:
        """One record per `response.create` that reached the worker, whatever its outcome.
        `request_bytes`: the client's frames for it (the create and, in v1, its appends);
        `announced_id`: the id its `response.created` gave, for a response that did not return."""
        if self.records is None:
            return
        record = dict(phase_log.client or {})
        record.update(
            started_at_s=phase_log.spans[0][1] if phase_log.spans else None,  # the create's arrival (the queue span)
            at_s=trio.current_time(),
            response_id=response.id if response is not None else announced_id,
            outcome=outcome,
            appends=appends,
            request_bytes=request_bytes,
            timing_requested=self.info.include_timing,
            phases_ms={k: round(v * 1000, 3) for k, v in phase_log.totals().items()},
            usage=response.usage.to_dict() if response is not None else None,
        )
        self.records.append(record)

    def record_refusal(self, error: ProtocolError) -> None:
        """A frame refused before it was queued (e.g. a create with `stream_id`)."""
        if self.records is None:
            return
        info = self.info
        self.records.append({
            "user_agent": info.user_agent, "transport": "websocket", "design": info.design, "connection": info.connection,
            "at_s": trio.current_time(), "response_id": None, "outcome": f"error:{error.code}", "param": error.param,
            "stream_id": error.param == "stream_id",
        })

    async def run_one(self, request, phase_log: metrics.PhaseLog, view: chained.LaneView):
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
