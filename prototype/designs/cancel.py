"""Cancelling a response in flight (`POST /v1/responses/{id}/cancel`), the same in every design.

Each design runs its generation inside `cancellable`: the response is registered server-wide
(api/live.py), and a cancel request interrupts whatever the design is waiting on (a model call,
the decode, a hosted tool, a v1 suspension waiting for `response.append`) at once, except a write
to the client, which finishes first. The response then ends like any other, with exactly one
terminal event: `response.cancelled`, status `cancelled`, its output the items that had finished
(docs/protocol.md, "Cancel"). Post-inference work is skipped, so a cancelled response is never
stored, as a v1 rollout cut by a disconnect. `ResponseCancelled` then goes on to the connection,
which treats the turn as ended (a chained connection empties its cache slot, as after a failure).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..api.live import LiveResponse
from ..api.service import ApiService
from ..protocol.response import Response
from .emitter import Emitter


class ResponseCancelled(Exception):
    """The response ended with `response.cancelled`; `response` is the Response object."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.id)
        self.response = response


@asynccontextmanager
async def cancellable(api: ApiService, emitter: Emitter, owner: str | None) -> AsyncIterator[LiveResponse]:
    live = api.live.add(emitter.response, owner)
    to_client = emitter.sink

    async def sink(event: Any) -> None:
        live.sending = True
        try:
            await to_client(event)
        finally:
            live.sending = False
        if live.requested:  # a cancel that arrived during the write takes effect now, between events
            live.scope.cancel()
            await trio.lowlevel.checkpoint()

    emitter.sink = sink
    try:
        with live.scope:
            yield live
        emitter.sink = to_client
        if live.scope.cancelled_caught:
            response = emitter.response
            response.output[:] = [item for item in response.output if getattr(item, "status", None) != "in_progress"]
            await emitter.finished("cancelled")
            raise ResponseCancelled(response)
    finally:
        emitter.sink = to_client
        api.live.remove(live)
