"""Responses in flight, server-wide: what `POST /v1/responses/{id}/cancel` reaches.

Each design registers its response once `response.created` has gone out and removes it when the
response has ended (docs/protocol.md, "Cancel"). An entry is found only by the key that created the
response, as stored responses are. A cancel request never interrupts a send to the client: it is
held while an event is being written and takes effect as soon as that write has finished, so the
transport is never left with half an event.
"""

from __future__ import annotations

import attrs
import trio

from ..protocol.response import Response


@attrs.define(eq=False)
class LiveResponse:
    response: Response
    owner: str | None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    ended: trio.Event = attrs.Factory(trio.Event)  # set once the response has left the registry
    requested: bool = False  # a cancel request reached it
    sending: bool = False  # an event is being written to the client

    @property
    def cancellable(self) -> bool:
        """Generation still runs: the design has not yet set the response's final status (it does
        so before its post-inference work and terminal event)."""
        return self.response.status == "in_progress"

    def cancel(self) -> None:
        self.requested = True
        if not self.sending:
            self.scope.cancel()


class LiveResponses:
    def __init__(self) -> None:
        self._by_id: dict[str, LiveResponse] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, response: Response, owner: str | None) -> LiveResponse:
        entry = LiveResponse(response, owner)
        self._by_id[response.id] = entry
        return entry

    def remove(self, entry: LiveResponse) -> None:
        if self._by_id.get(entry.response.id) is entry:
            del self._by_id[entry.response.id]
        entry.ended.set()

    def find(self, response_id: str, owner: str | None) -> LiveResponse | None:
        """The live response with this id, if the key `owner` created it."""
        entry = self._by_id.get(response_id)
        return entry if entry is not None and entry.owner == owner else None
