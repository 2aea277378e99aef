"""`response.inject` on one connection: the session drives the sans-IO book (protocol/inject.py).

The emitters of the connection's active responses number the events an injection answers with; the
agents of a response that wait for client tool output (designs/inject.py) are woken when an
injection answers their calls.
"""

from __future__ import annotations

import attrs

from ...designs.emitter import Emitter
from ...designs.inject import InjectedOutputs
from ...protocol.errors import ProtocolError
from ...protocol.events import InjectCreated, InjectFailed
from ...protocol.inject import ROOT, InjectBook, InjectRefused, ResponseInject
from ...protocol.items import FunctionCall


@attrs.define(eq=False)
class Injections:
    ttl: float  # how long a waiting response waits for its calls' outputs (the server's suspension TTL)
    book: InjectBook = attrs.Factory(InjectBook)
    active: dict[str, Emitter] = attrs.Factory(dict)  # response id -> its emitter, while it runs
    waiting: dict[str, dict[str, InjectedOutputs]] = attrs.Factory(dict)  # response id -> agent -> backend

    def opened(self, emitter: Emitter) -> None:
        """A response was created: from here on an injection into it is answered in its sequence."""
        response_id = emitter.response.id
        self.active[response_id] = emitter
        self.book.opened(response_id, takes_input=emitter.response.request.takes_injected_input)

    def ended(self, response_id: str) -> None:
        """Its terminal event went out: from here on an injection is `response_already_completed`."""
        self.book.closed(response_id)
        self.active.pop(response_id, None)
        self.waiting.pop(response_id, None)

    def injected_outputs(self, emitter: Emitter, agent: str = ROOT) -> InjectedOutputs:
        """The backend an agent of a `multi_agent` response waits on for its calls' outputs."""
        backend = InjectedOutputs(self.book, emitter.response.id, self.ttl, emitter.log, agent)
        self.waiting.setdefault(emitter.response.id, {})[agent] = backend
        return backend

    async def inject(self, event: ResponseInject, arrived: float, session) -> None:
        """`response.inject.created`, numbered in the target's sequence, and the waiting response
        resumes once every call it waits for is answered; else `response.inject.failed` with the
        raw input (sequence number 0 and no lane when the target is not active [ours]); items the
        target cannot take are an `error` event on the target's lane, and the connection keeps serving."""
        emitter = self.active.get(event.response_id)
        streamed = [] if emitter is None else [
            item.call_id for item in emitter.response.output if isinstance(item, FunctionCall) and item.status == "completed"
        ]
        try:
            outcome = self.book.submit(event, streamed)
        except ProtocolError as error:
            session.records.refusal(error)
            lane = next((lane.stream_id for lane in session.lanes.values() if lane.response_id == event.response_id), None)
            await session.send_error(error, lane)
            return
        if isinstance(outcome, InjectRefused):
            fields = {"response_id": event.response_id, "input": event.raw_input, "error": {"code": outcome.code, "message": outcome.message}}
            if emitter is None:
                await session.send(InjectFailed(sequence_number=0, **fields))
            else:
                await emitter.emit(InjectFailed, **fields)
            return
        await emitter.emit(InjectCreated, response_id=event.response_id)
        for agent in outcome.resumes:
            self.waiting[event.response_id][agent].wake(arrived)
