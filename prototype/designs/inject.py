"""Backend 3 of the suspension point: outputs the client injects into the active response.

A chained (v2) response created with `multi_agent.enabled` does not end at a client function call:
its sampling loop blocks at `SamplingLoop.tool_call_point`, as a v1 rollout does, and resumes when
`response.inject` has committed an output for every call it made (multi-agent guide, "Inject tool
outputs over WebSocket": "the waiting agent can then resume without waiting for the whole
multi-agent response to finish"). Outputs injected while the response still generates are held
until it reaches the point. The book (protocol/inject.py) decides; the session (server/websocket.py)
feeds it the frames and wakes the waiting loop through `wake`.

A response that waits longer than the suspension time-to-live fails with `suspension_timeout`, as a
v1 rollout does [ours: the sources state no limit].
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from .. import metrics
from ..protocol.inject import InjectBook
from ..protocol.items import Item
from .sampling import ToolCall
from .suspended import SuspensionExpired


@attrs.define(eq=False)
class InjectedOutputs:
    """Wait at the tool call point for the injected outputs of `calls`."""

    book: InjectBook
    response_id: str
    ttl: float
    log: metrics.PhaseLog
    _wake: trio.Event = attrs.Factory(trio.Event)
    resumed_at: float | None = None  # when the injection that completed the answers arrived

    def wake(self, arrived: float) -> None:
        """The session committed an injection that answers every call this response waits for."""
        self.resumed_at = arrived
        self._wake.set()

    async def answer(self, calls: Sequence[ToolCall]) -> Sequence[Item]:
        self.book.wait_for(self.response_id, [call.item.call_id for call in calls])
        if self.book.answered(self.response_id) is None:  # outputs injected while it generated may already answer
            self._wake = trio.Event()
            with trio.move_on_after(self.ttl):
                await self._wake.wait()
            if self.book.answered(self.response_id) is None:
                raise SuspensionExpired
            self.log.schedule = self.resumed_at  # the model resumes from the injection's arrival
        return self.book.resume(self.response_id)
