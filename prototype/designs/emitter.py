"""Builds one response's server events in order, numbering them, and hands each to a sink.

The sink is the transport (a WebSocket frame, an SSE block); the emitter does not know which.
`sequence_number` is 0-based per response and runs on across v1 suspensions (docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs

from .. import metrics
from ..engine.streaming import EngineFailure  # defined in the lower layer; re-exported for the designs and servers
from ..protocol import events as ev
from ..protocol.errors import response_error
from ..protocol.items import FunctionCall, Item, Message, Reasoning, WebSearchCall
from ..protocol.response import Response

Sink = Callable[[Any], Awaitable[None]]


@attrs.define(eq=False)
class Emitter:
    response: Response
    sink: Sink
    log: metrics.PhaseLog
    include_timing: bool = False
    sequence_number: int = 0
    segment_start: int = 0  # index in response.output where the current v1 segment begins
    segment_started_at: float = -float("inf")  # v1: when the current segment resumed; timings since then
    terminal_sent: bool = False

    async def emit(self, event_type: type, **fields: Any) -> None:
        event = event_type(sequence_number=self.sequence_number, **fields)
        self.sequence_number += 1
        await self.sink(event)

    def snapshot(self, output: list[Item] | None = None, since: float = -float("inf"), *, usage_so_far: bool = False) -> dict[str, Any]:
        if self.include_timing:
            self.response.timing = self.log.to_dict(since)
        return self.response.to_dict(output=output, usage_so_far=usage_so_far)

    async def created(self, *, generating: bool) -> None:
        """`response.created`, then `response.in_progress` unless this is a warm-up, which goes
        straight to `response.completed` (docs/protocol.md)."""
        await self.emit(ev.ResponseCreated, response=self.snapshot())
        if generating:
            await self.emit(ev.ResponseInProgress, response=self.snapshot())

    async def resumed(self, at: float) -> None:
        """v1: the suspended rollout continues after `response.append` (which arrived `at`): the new
        segment's timings are those from then on."""
        self.segment_start = len(self.response.output)
        self.segment_started_at = at
        await self.emit(ev.ResponseInProgress, response=self.snapshot())

    async def paused(self) -> None:
        """v1: `response.done` with the same id, status in_progress, the segment's items."""
        segment = self.response.output[self.segment_start :]
        await self.emit(ev.ResponseDone, response=self.snapshot(segment, self.segment_started_at, usage_so_far=True))

    async def finished(self, status: str, *, error: dict[str, Any] | None = None, reason: str | None = None) -> None:
        """Exactly one terminal event per response."""
        if self.terminal_sent:
            return
        self.terminal_sent = True
        response = self.response
        response.status = status
        since = self.segment_started_at  # the timing of the last segment (the whole response outside v1)
        if status == "failed":
            response.error = error
            await self.emit(ev.ResponseFailed, response=self.snapshot(since=since))
        elif status == "incomplete":
            response.incomplete_details = {"reason": reason}
            await self.emit(ev.ResponseIncomplete, response=self.snapshot(since=since))
        elif status == "cancelled":
            await self.emit(ev.ResponseCancelled, response=self.snapshot(since=since))
        else:
            await self.emit(ev.ResponseCompleted, response=self.snapshot(since=since))

    # --- output items -------------------------------------------------------------------------

    async def message(self, item_id: str, chunks: Any, *, incomplete: bool = False) -> Message:
        """Stream an assistant message from an async iterator of text chunks."""
        index = len(self.response.output)
        placeholder = Message("assistant", (), id=item_id, status="in_progress")
        self.response.output.append(placeholder)
        await self.emit(ev.OutputItemAdded, output_index=index, item=placeholder.to_dict())
        empty_part = {"type": "output_text", "text": "", "annotations": []}
        await self.emit(ev.ContentPartAdded, item_id=item_id, output_index=index, content_index=0, part=empty_part)
        pieces = []
        async for chunk in chunks:
            pieces.append(chunk)
            await self.emit(ev.OutputTextDelta, item_id=item_id, output_index=index, content_index=0, delta=chunk)
        text = "".join(pieces)
        await self.emit(ev.OutputTextDone, item_id=item_id, output_index=index, content_index=0, text=text)
        part = {"type": "output_text", "text": text, "annotations": []}
        await self.emit(ev.ContentPartDone, item_id=item_id, output_index=index, content_index=0, part=part)
        item = Message("assistant", (("output_text", text),), id=item_id, status="incomplete" if incomplete else "completed")
        self.response.output[index] = item
        await self.emit(ev.OutputItemDone, output_index=index, item=item.to_dict())
        return item

    async def function_call(self, item_id: str, call_id: str, name: str, chunks: Any) -> FunctionCall:
        index = len(self.response.output)
        placeholder = FunctionCall(call_id, name, "", id=item_id, status="in_progress")
        self.response.output.append(placeholder)
        await self.emit(ev.OutputItemAdded, output_index=index, item=placeholder.to_dict())
        pieces = []
        async for chunk in chunks:
            pieces.append(chunk)
            await self.emit(ev.FunctionCallArgumentsDelta, item_id=item_id, output_index=index, delta=chunk)
        arguments = "".join(pieces)
        await self.emit(ev.FunctionCallArgumentsDone, item_id=item_id, output_index=index, arguments=arguments)
        item = FunctionCall(call_id, name, arguments, id=item_id, status="completed")
        self.response.output[index] = item
        await self.emit(ev.OutputItemDone, output_index=index, item=item.to_dict())
        return item

    async def reasoning(self, item_id: str, sample: Callable[[], Awaitable[str]], *, export: bool) -> Reasoning:
        """A reasoning item: announced, sampled hidden (`sample` returns its text once its tokens are
        decoded), then done, with its `encrypted_content` when `export`. No deltas: the public API
        streams only summaries, which the simulator does not produce."""
        index = len(self.response.output)
        placeholder = Reasoning(item_id, "", status="in_progress")
        self.response.output.append(placeholder)
        await self.emit(ev.OutputItemAdded, output_index=index, item=placeholder.to_dict())
        item = Reasoning(item_id, await sample(), status="completed")
        if export:
            item = item.exported()
        self.response.output[index] = item
        await self.emit(ev.OutputItemDone, output_index=index, item=item.to_dict())
        return item

    async def web_search_started(self, item: WebSearchCall) -> int:
        index = len(self.response.output)
        self.response.output.append(item)
        await self.emit(ev.OutputItemAdded, output_index=index, item=item.to_dict())
        await self.emit(ev.WebSearchInProgress, item_id=item.id, output_index=index)
        await self.emit(ev.WebSearchSearching, item_id=item.id, output_index=index)
        return index

    async def web_search_finished(self, index: int, item: WebSearchCall) -> None:
        self.response.output[index] = item
        await self.emit(ev.WebSearchCompleted, item_id=item.id, output_index=index)
        await self.emit(ev.OutputItemDone, output_index=index, item=item.to_dict())


@asynccontextmanager
async def failing_on_error(emitter: Emitter) -> AsyncIterator[None]:
    """After `response.created`, any failure still ends the response with exactly one terminal
    event: `response.failed` carrying the error, then the exception goes on to the connection."""
    try:
        yield
    except EngineFailure as exc:
        await emitter.finished("failed", error=response_error(exc.message))
        raise
    except Exception:
        await emitter.finished("failed", error=response_error("The server had an error while processing the response."))
        raise
