"""Lanes on the client side: one WebSocket, many conversations, routed by `stream_id`.

`Multiplexed` owns one connection and one reader task that routes each server event to the lane
whose `stream_id` it echoes; events without one go to the default lane (as openai-ruby's
`Responses::Session` routes them; docs/protocol.md). A lane is a channel the harness's tool loop
(`harness.drive_websocket_rollout`) can drive like a whole connection: `send` stamps a
`response.create` with the lane's `stream_id`, `until_pause` reads the lane's events.

`run_multiplexed_rollouts` plays N tasks at once over one connection, one lane each: the
subagents experiment's multiplexed case.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio_websocket

from ..workload import Workload
from .connect import Connector
from .harness import (
    CHAINED,
    PAUSE_TYPES,
    Rollout,
    RolloutRecord,
    TurnRecord,
    drive_websocket_rollout,
    open_responses_websocket,
    request_body,
    task_prompt,
)

LANE_BUFFER = 100_000  # events a lane may hold unread; the reader blocks past it (back-pressure)


@attrs.define(eq=False)
class LaneChannel:
    """One lane: what it sends carries its `stream_id`; what it receives was routed to it."""

    mux: Multiplexed
    stream_id: str | None
    events: trio.MemoryReceiveChannel
    rollout: Rollout | None = None

    async def send(self, event: dict[str, Any]) -> int:
        if event["type"] == "response.create" and self.stream_id is not None:
            event = {**event, "stream_id": self.stream_id}
        if self.rollout is not None:
            self.rollout.record.timeline.append((trio.current_time(), "send", event["type"]))
        return await self.mux.send(event)

    async def receive(self) -> dict[str, Any]:
        event, size = await self.events.receive()
        if self.rollout is not None:
            self.rollout.received(event, size)
        return event

    async def until_pause(self) -> dict[str, Any]:
        """Events until `response.done`, a terminal event or an error; returns that event."""
        while True:
            event = await self.receive()
            if event.get("type") in PAUSE_TYPES or event.get("type") == "error":
                return event

    async def until(self, *types: str) -> list[dict[str, Any]]:
        """Every event up to and including the first of `types` (or an error)."""
        seen = []
        while True:
            seen.append(await self.receive())
            if seen[-1].get("type") in types or seen[-1].get("type") == "error":
                return seen


@attrs.define(eq=False)
class Multiplexed:
    ws: trio_websocket.WebSocketConnection
    routes: dict[str | None, trio.MemorySendChannel] = attrs.Factory(dict)
    lanes: dict[str | None, LaneChannel] = attrs.Factory(dict)

    def lane(self, stream_id: str | None, rollout: Rollout | None = None) -> LaneChannel:
        """Register a lane before sending on it (openai-ruby does the same)."""
        if stream_id in self.lanes:
            raise ValueError(f"lane {stream_id!r} is already registered")
        send_channel, receive_channel = trio.open_memory_channel[tuple[dict[str, Any], int]](LANE_BUFFER)
        self.routes[stream_id] = send_channel
        lane = self.lanes[stream_id] = LaneChannel(self, stream_id, receive_channel, rollout)
        return lane

    async def send(self, event: dict[str, Any]) -> int:
        text = json.dumps(event, separators=(",", ":"))
        await self.ws.send_message(text)
        return len(text.encode())

    async def read(self) -> None:
        """Route every event by its `stream_id`; unknown lanes go to the default lane."""
        try:
            while True:
                message = await self.ws.get_message()
                event = json.loads(message)
                size = len(message.encode()) if isinstance(message, str) else len(message)
                route = self.routes.get(event.get("stream_id")) or self.routes[None]
                await route.send((event, size))
        except trio_websocket.ConnectionClosed:
            for route in self.routes.values():
                await route.aclose()


@asynccontextmanager
async def open_multiplexed(connector: Connector, *, api_key: str = "testbed", include_timing: bool = False) -> AsyncIterator[Multiplexed]:
    """A chained (v2) connection with its reader running and the default lane registered."""
    async with open_responses_websocket(connector, CHAINED, api_key=api_key, include_timing=include_timing) as ws:
        mux = Multiplexed(ws)
        mux.lane(None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mux.read)
            try:
                yield mux
            finally:
                nursery.cancel_scope.cancel()


async def run_multiplexed_rollouts(
    connector: Connector,
    workloads: Sequence[Workload],
    *,
    metadata_for: Callable[[int], dict[str, str]],
    model: str = "gpt-5.4",
    store: bool = False,
    include_timing: bool = False,
    api_key: str = "testbed",
    on_turn_end: Callable[[TurnRecord], None] | None = None,
) -> list[RolloutRecord]:
    """N tasks at once over one WebSocket, task i on lane `agent-i`, all started together."""
    records: list[RolloutRecord | None] = [None] * len(workloads)
    async with open_multiplexed(connector, api_key=api_key, include_timing=include_timing) as mux:

        async def one(index: int, workload: Workload) -> None:
            rollout = Rollout(workload, RolloutRecord(CHAINED, workload.name, trio.current_time()))
            lane = mux.lane(f"agent-{index}", rollout)
            base = request_body(workload, model=model, metadata=metadata_for(index), store=store)
            first_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}]
            await drive_websocket_rollout(lane, rollout, CHAINED, base, first_input, on_turn_end)
            rollout.record.ended_at = trio.current_time()
            records[index] = rollout.record

        async with trio.open_nursery() as nursery:
            for index, workload in enumerate(workloads):
                nursery.start_soon(one, index, workload)
    return [record for record in records if record is not None]
