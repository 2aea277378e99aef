"""The suspended design (v1, the overnight prototype): one Response for the whole rollout.

Read top to bottom, `run_rollout` is the design's description (OpenAI blog; docs/protocol.md):

1. pre-inference work once: validate, classify, render, resolve the model and route;
2. the sampling loop; when the model calls a client function tool, the loop streams the call,
   sends `response.done` (same response id, status in_progress, the pending calls) and blocks in
   the loop until `response.append` brings one output per pending call;
3. the new items are validated, classified and rendered alone, their tokens appended to the
   resident KV, and sampling resumes in the same coroutine;
4. post-inference work (billing, storing) once, at the end, before `response.completed`.

A suspension has a time-to-live; on expiry the rollout fails (`server_error`, the one code of the
API's schema for a failure of the server's own, with a message saying so) and its state is released. A disconnect cancels the coroutine (the connection's nursery) and the `finally`
releases the engine's KV.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import trio

from .. import metrics
from ..api.checks import require_appended_fits
from ..api.service import ApiService, Context, owner_of
from ..protocol.errors import INVALID_FUNCTION_CALL_OUTPUT, NO_SUSPENDED_RESPONSE, ProtocolError, response_error
from ..protocol.events import CreateRequest
from ..protocol.items import Item
from ..protocol.response import Response
from .cancel import cancellable
from .emitter import Emitter, Sink, failing_on_error
from .sampling import HostedTools, SamplingLoop, ToolCall, unexpected_outputs

# docs/protocol.md: 300 s, as vLLM RFC #52113's cache_control.ttl default; above TraceLab's p99 tool
# latency of 3.6 min.
SUSPENSION_TTL_SECONDS = 300.0


class SuspensionExpired(Exception):
    pass


@attrs.define(eq=False)
class Suspension:
    """A paused rollout's mailbox: the calls it waits for and the append that answers them."""

    pending: tuple[str, ...]
    fits: Callable[[Sequence[Item]], None] = lambda items: None  # refuses an append too long for the window
    _answered: trio.Event = attrs.Factory(trio.Event)
    _items: Sequence[Item] = ()
    _ended: ProtocolError | None = None  # why the rollout will not resume (connection closing)
    answered_at: float | None = None  # when the append that answered it arrived

    @property
    def answered(self) -> bool:
        return self._answered.is_set()

    def check(self, items: Sequence[Item]) -> None:
        """Refuse an append that does not answer exactly the pending calls; the rollout stays paused."""
        problem = unexpected_outputs(self.pending, items)
        if problem:
            raise ProtocolError(INVALID_FUNCTION_CALL_OUTPUT, f"response.append: {problem}.", param="input")

    def deliver(self, items: Sequence[Item], arrived: float) -> None:
        """Take one append (its frame read at `arrived`). Synchronous, so two appends
        read back to back cannot both be taken: the second finds the suspension answered."""
        if self.answered:
            raise no_suspended_response()
        self.check(items)
        self.fits(items)
        self._items = items
        self.answered_at = arrived
        self._answered.set()

    def end(self, reason: ProtocolError) -> None:
        """Wake the paused rollout to fail with `reason` instead of resuming."""
        if not self.answered:
            self._ended = reason
            self._answered.set()

    async def wait(self) -> Sequence[Item]:
        await self._answered.wait()
        if self._ended is not None:
            raise RolloutEnded(self._ended)
        return self._items


class RolloutEnded(Exception):
    """The connection is closing (lifetime limit, server drain): the rollout ends with
    `response.failed` carrying this error instead of pausing again."""

    def __init__(self, reason: ProtocolError) -> None:
        super().__init__(reason.message)
        self.reason = reason


def no_suspended_response() -> ProtocolError:
    return ProtocolError(NO_SUSPENDED_RESPONSE, "response.append: no response is waiting for tool output on this connection.")


@attrs.define(eq=False)
class SuspensionSlot:
    """Where the connection finds the rollout's current suspension (None while it runs).

    An append is taken or refused here, synchronously: the slot is emptied in the same step that
    answers it, so every append is either applied or answered with `no_suspended_response`. Once
    the connection is closing (`end`), a rollout that is streaming fails at its next pause and a
    paused one fails at once, each with one terminal event."""

    current: Suspension | None = None
    ended: ProtocolError | None = None

    def deliver(self, items: Sequence[Item], arrived: float) -> None:
        suspension = self.current
        if suspension is None:
            raise no_suspended_response()
        suspension.deliver(items, arrived)
        self.current = None

    def end(self, reason: ProtocolError) -> None:
        self.ended = reason
        if self.current is not None:
            self.current.end(reason)
            self.current = None


@attrs.define(eq=False)
class ClientOverSocket:
    """Backend 2 in v1: pause with `response.done`, wait for `response.append`."""

    emitter: Emitter
    slot: SuspensionSlot
    ttl: float
    context: Context | None = None  # the rollout's context, which an append extends
    window: int = 0  # the longest prompt it may reach (ApiService.context_window)

    def fits(self, items: Sequence[Item]) -> None:
        """An append that would take the rollout's context past the window is refused as the API refuses a
        request too long (`context_length_exceeded`), and the rollout stays paused."""
        if self.context is not None:
            require_appended_fits(len(self.context.prompt), items, self.window)

    async def answer(self, calls: Sequence[ToolCall]) -> Sequence[Item]:
        if self.slot.ended is not None:
            raise RolloutEnded(self.slot.ended)
        suspension = Suspension(tuple(call.item.call_id for call in calls), self.fits)
        self.slot.current = suspension
        try:
            await self.emitter.paused()
            with trio.move_on_after(self.ttl):
                items = await suspension.wait()
            if not suspension.answered:
                raise SuspensionExpired
            # An append taken in the same instant as the expiry is still applied: it was accepted.
            items = await suspension.wait()
            self.emitter.log.schedule = suspension.answered_at  # the rollout resumes from the append's arrival
            await self.emitter.resumed(at=suspension.answered_at)
            return items
        finally:
            if self.slot.current is suspension:
                self.slot.current = None


async def run_rollout(
    api: ApiService,
    request: CreateRequest,
    sink: Sink,
    slot: SuspensionSlot,
    *,
    ttl: float = SUSPENSION_TTL_SECONDS,
    include_timing: bool = False,
    api_key: str | None = None,
    log: metrics.PhaseLog | None = None,
) -> Response:
    log = log if log is not None else metrics.PhaseLog()
    response = Response(api.new_id("resp"), request, created_at=int(time.time()))
    emitter = Emitter(response, sink, log, include_timing)
    engine_key = ("suspended", response.id)
    try:
        context = await api.pre_inference(log, request, request.input, engine_key=engine_key)
        await emitter.created(generating=True)
        loop = SamplingLoop(
            api,
            emitter,
            context,
            hosted=HostedTools(api, log, context.route.policy.workload.text_seed),
            client=ClientOverSocket(emitter, slot, ttl, context, api.context_window(request.model)),
            pinned_kv=True,
        )
        async with cancellable(api, emitter, owner_of(api_key)), failing_on_error(emitter):
            try:
                outcome = await loop.run()
            except SuspensionExpired:
                await emitter.finished(
                    "failed", error=response_error(f"No response.append within {ttl:g} s; the rollout was released.")
                )
                return response
            except RolloutEnded as ended:
                # The reason's own code follows in the connection's `error` event (server/websocket/closing.py).
                await emitter.finished("failed", error=response_error(ended.reason.message))
                return response
            response.status = outcome  # the stored record is the finished response
            await api.post_inference(log, response, context.items[len(request.input) :], owner=owner_of(api_key))
            await emitter.finished(outcome, reason="max_output_tokens" if outcome == "incomplete" else None)
        return response
    finally:
        api.engine.release(engine_key)
