"""Backend 3 of the suspension point: outputs the client injects into the active response.

A chained (v2) response created with `multi_agent.enabled` does not end at a client function call:
its sampling loop blocks at `SamplingLoop.tool_call_point`, as a v1 rollout does, and resumes when
`response.inject` has committed an output for every call it made (multi-agent guide, "Inject tool
outputs over WebSocket": "the waiting agent can then resume without waiting for the whole
multi-agent response to finish"). Outputs injected while the response still generates are held
until it reaches the point. The book (protocol/inject.py) decides; the session (server/websocket/)
feeds it the frames and wakes the waiting loop through `wake`.

Hosted subagents: with `metadata.testbed_subagents = N` [ours: the simulated root agent does not
decide to spawn], the response runs N agents, each its own sampling loop over its own context and
engine key, all streaming into the one response, at most `multi_agent.max_concurrent_subagents` of
them at once (openai-python 3.63.0 `ResponseCreateMultiAgent`: "the maximum number of subagents that
can be active simultaneously", with "no fixed limit on ... the total number of subagents created
during a run"): the others wait, in order, for one to finish. Each waits at its own tool call point
for its own injected outputs, still active, and the response ends when the last one finishes. (The
real API's `agent` attribution on items and events, and its `multi_agent_call` items, are not
modeled.)

A response that waits longer than the suspension time-to-live fails (`server_error`, with a message
saying so), as a v1 rollout does [ours: the sources state no limit].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import trio

from .. import metrics
from ..api.service import ApiService, Context
from ..protocol.inject import ROOT, InjectBook
from ..protocol.items import Item
from .emitter import Emitter
from .sampling import COMPLETED, INCOMPLETE, HostedTools, SamplingLoop, ToolCall
from .suspended import SuspensionExpired


@attrs.define(eq=False)
class InjectedOutputs:
    """Wait at the tool call point for the injected outputs of `calls`."""

    book: InjectBook
    response_id: str
    ttl: float
    log: metrics.PhaseLog
    agent: str = ROOT
    _wake: trio.Event = attrs.Factory(trio.Event)
    resumed_at: float | None = None  # when the injection that completed the answers arrived

    def wake(self, arrived: float) -> None:
        """The session committed an injection that answers every call this agent waits for."""
        self.resumed_at = arrived
        self._wake.set()

    async def answer(self, calls: Sequence[ToolCall]) -> Sequence[Item]:
        self.book.wait_for(self.response_id, [call.item.call_id for call in calls], self.agent)
        if self.book.answered(self.response_id, self.agent) is None:  # outputs injected while it generated may already answer
            self._wake = trio.Event()
            with trio.move_on_after(self.ttl):
                await self._wake.wait()
            if self.book.answered(self.response_id, self.agent) is None:
                raise SuspensionExpired
            self.log.schedule = self.resumed_at  # the model resumes from the injection's arrival
        return self.book.resume(self.response_id, self.agent)


@attrs.define(eq=False)
class AgentEmitter(Emitter):
    """One hosted agent's view of the response: its own phase log (its own model schedule), its
    events numbered in the response's one sequence."""

    parent: Emitter | None = attrs.field(default=None, kw_only=True)

    async def emit(self, event_type: type, **fields) -> None:
        assert self.parent is not None
        await self.parent.emit(event_type, **fields)


async def sample_subagents(
    api: ApiService, emitter: Emitter, context: Context, subagents: int, backend_for: Callable[[Emitter, str], InjectedOutputs],
) -> str:
    """N agents in one response, at most `max_concurrent_subagents` at once: agent 0 extends `context`,
    the others start from the same request on engine keys of their own; an agent beyond the cap starts
    when one ends (its schedule from then). Returns `incomplete` if any agent ran out of output budget."""
    request = emitter.response.request
    cap = request.multi_agent.max_concurrent_subagents
    slots = trio.Semaphore(cap)
    outcomes: list[str] = []

    async def run(index: int, schedule: float | None) -> None:
        try:
            name = f"agent{index}"
            log = metrics.PhaseLog(schedule=schedule)
            view = AgentEmitter(emitter.response, emitter.sink, log, emitter.include_timing, parent=emitter)
            ctx = context if index == 0 else await api.pre_inference(log, request, request.input, engine_key=(context.engine_key, name))
            loop = SamplingLoop(
                api, view, ctx, hosted=HostedTools(api, log, ctx.route.policy.workload.text_seed), client=backend_for(view, name),
                pinned_kv=False, export_reasoning=request.wants_encrypted_reasoning, agent=name,
            )
            outcomes.append(await loop.run())
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for index in range(subagents):  # slots are taken here, in the agents' order, not in the order trio runs them
            await slots.acquire()
            # The first `cap` start with the response; a later one when a slot freed up, its schedule from then.
            nursery.start_soon(run, index, emitter.log.schedule if index < cap else trio.current_time())
    return INCOMPLETE if INCOMPLETE in outcomes else COMPLETED
