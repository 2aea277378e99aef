"""`response.steer` on one connection: the session drives the sans-IO book (protocol/steering.py).

v1 refuses (`steering_not_supported`); v2 accepts while the target runs (docs/protocol.md,
"Steering"). Every answer is numbered in its target's sequence and tagged with its lane, or sent at
sequence number 0 without a lane when the target is not available [ours]. When a steered response
ends, its pending notices and refusals go out, and the automatic successor that carries the queued
input is returned for its lane's worker to run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from ...designs.emitter import Emitter
from ...protocol.events import CreateRequest, SteerAccepted, SteerFailed, SteerPending
from ...protocol.steering import WAITING_FOR_REQUIRED_INPUT, Refusal, SteeringBook, Submission, successor_input


@attrs.define(eq=False)
class Steering:
    send: Callable[[Any], Awaitable[None]]  # the session's send, for an event outside any response's sequence
    book: SteeringBook = attrs.Factory(SteeringBook)
    emitters: dict[str, Emitter] = attrs.Factory(dict)  # the book's responses: steer events number in theirs

    async def steer(self, frame: dict[str, Any], *, supported: bool) -> None:
        """Answer a `response.steer` frame: accepted, or failed with the book's reason."""
        outcome = self.book.submit(frame, supported=supported)
        if isinstance(outcome, Refusal):
            await self.send_refusals([outcome])
        else:
            await self.send_event(outcome.previous_response_id, SteerAccepted, steer={"id": outcome.id, "previous_response_id": outcome.previous_response_id})

    async def send_event(self, response_id: str, event_type: type, **fields: Any) -> None:
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
            await self.send_event(submission.previous_response_id, SteerFailed, steer=steer, error=error)

    async def started(self, emitter: Emitter, claimed: tuple[Submission, ...], lane: str | None, refusals: list[Refusal]) -> None:
        """A response was created on `lane`: the steers it carries (`claimed`) are committed, and the
        lane's earlier steers that can no longer ride anything are refused."""
        response_id = emitter.response.id
        self.book.committed(claimed)  # the successor's response.created is the commit point
        refusals.extend(self.book.started(response_id, lane))
        self.emitters[response_id] = emitter
        self.emitters = {rid: e for rid, e in self.emitters.items() if self.book.is_known(rid)}
        await self.send_refusals(refusals)

    async def after_response(self, response, claimed_for_next: list) -> CreateRequest | None:
        """The terminal event went out: pending notices, refusals, or the automatic successor that
        inherits the response's settings and continues from it with the queued input."""
        # A response that takes injected outputs answered its calls in place (designs/inject.py): it
        # never ends waiting for the client's tool output, so a steer on it has nothing to wait for.
        awaiting = () if response.request.takes_injected_input else response.output
        ended = self.book.ended(response.id, response.status, awaiting)
        for submission in ended.pending:
            await self.send_event(
                response.id, SteerPending, reason=WAITING_FOR_REQUIRED_INPUT,
                required_input=[dict(stub) for stub in self.book.targets[response.id].required_input],
                steer={"id": submission.id, "previous_response_id": response.id},
            )
        await self.send_refusals(list(ended.refused))
        if not ended.successor:
            return None
        claimed_for_next.extend(ended.successor)
        return attrs.evolve(response.request, previous_response_id=response.id, input=successor_input(ended.successor), generate=True)

    async def running_failed(self, lane: str | None) -> None:
        """The lane's running response failed: its queued steering input is returned."""
        recent = self.book.lanes.get(lane) or []
        if recent:
            ended = self.book.ended(recent[-1], "failed")
            await self.send_refusals(list(ended.refused))

    async def successor_failed(self, claimed: tuple[Submission, ...], message: str) -> None:
        """The automatic successor carrying `claimed` will not run: their input is returned."""
        await self.send_refusals(self.book.successor_failed(claimed, message))
