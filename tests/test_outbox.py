"""The server's outbox: several WebSocket messages per socket write, and nothing else changed.

A client must see exactly the messages, in exactly the order, that one `send_message` per event
gave it: checked here over a zero-latency pipe, over the benchmark's 20 ms link, and over a slower
link with jitter and a bandwidth limit, for both WebSocket designs, against the same server writing
each message on its own.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from support import DELAYED_LINK
from trio_websocket import ConnectionClosed

from prototype import netem
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService, IdFactory
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED, Rollout, run_websocket_rollout
from prototype.server import outbox as outbox_module
from prototype.server.app import ResponsesServer
from prototype.server.outbox import Outbox
from prototype.workload import fixed

TASK = fixed(3, initial_prompt_tokens=300, appended_tokens=80, output_tokens=40, tool_seconds=0.5)
JITTERY = netem.NetworkProfile(rtt=0.030, jitter=0.004, bandwidth_bytes_per_s=2_000_000, seed=3)
LINKS = {"pipe": None, "rtt-20ms": DELAYED_LINK, "jitter-2MB/s": JITTERY}


async def received(design: str, network: netem.NetworkProfile | None, monkeypatch) -> list[tuple[dict[str, Any], int]]:
    """Every event the client received, with its message's size, in order (`created_at`, wall-clock seconds, left out)."""
    events: list[tuple[dict[str, Any], int]] = []
    original = Rollout.received

    def spy(self, event: dict[str, Any], size: int) -> None:
        response = event.get("response")
        events.append(({**event, "response": {k: v for k, v in response.items() if k != "created_at"}} if response else event, size))
        original(self, event, size)

    monkeypatch.setattr(Rollout, "received", spy)
    server = ResponsesServer(ApiService(costs=ZERO_COSTS, new_id=IdFactory("same")))
    key = server.api.workloads.register(TASK)
    record = await run_websocket_rollout(InMemoryConnector(server, network), design, TASK, metadata={"testbed_workload": key}, model="sim-1000")
    assert record.status == "completed"
    monkeypatch.setattr(Rollout, "received", original)
    return events


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("design", [SUSPENDED, CHAINED])
async def test_the_client_sees_exactly_the_messages_one_write_per_message_sent(autojump_clock, monkeypatch, design: str, link: str) -> None:
    network = LINKS[link]
    batches: list[int] = []
    batched_send = outbox_module.send_messages

    async def counting(ws, messages):
        batches.append(len(messages))
        await batched_send(ws, messages)

    monkeypatch.setattr(outbox_module, "send_messages", counting)
    batched = await received(design, network, monkeypatch)
    monkeypatch.setattr(outbox_module, "send_messages", batched_send)

    async def one_write_each(self: Outbox, message: str | bytes) -> None:
        await self.write([message])

    async def nothing_queued(self: Outbox) -> None:
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(Outbox, "send", one_write_each)
    monkeypatch.setattr(Outbox, "flush", nothing_queued)
    one_each = await received(design, network, monkeypatch)

    assert batched == one_each
    assert sum(batches) == len(batched)
    # The ends of turns go out together: each turn's closing events (text/arguments done, item
    # done, then the pause or terminal event) in one write at least.
    assert len(batches) < len(batched) and max(batches) >= 3


class FakeWebSocket:
    """Records what is sent; each send waits until `open` is set, or fails once `broken`."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.open = trio.Event()
        self.broken = False

    async def send_message(self, message: str) -> None:
        await self.open.wait()
        if self.broken:
            raise ConnectionClosed(None)
        self.sent.append(message)


async def test_a_sender_waits_once_the_queued_bytes_pass_the_limit_and_order_holds(autojump_clock) -> None:
    ws = FakeWebSocket()
    box = Outbox.for_websocket(ws)
    box.limit = 10
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.run)
        await box.send("aaaa")
        await box.send("bbbb")
        await trio.sleep(1)  # the writer took both and is stuck in the socket write
        done = []

        async def sender() -> None:
            for message in ("cccc", "dddd", "eeee"):  # the third passes 10 bytes queued
                await box.send(message)
                done.append(message)

        nursery.start_soon(sender)
        await trio.sleep(1)
        assert done == ["cccc", "dddd"]
        ws.open.set()
        await box.flush()
        await trio.testing.wait_all_tasks_blocked()  # the sender resumes after its batch was written
        assert done == ["cccc", "dddd", "eeee"]
        assert ws.sent == ["aaaa", "bbbb", "cccc", "dddd", "eeee"]
        nursery.cancel_scope.cancel()


async def test_after_a_failed_write_sends_and_flushes_raise_connection_closed(autojump_clock) -> None:
    ws = FakeWebSocket()
    ws.broken = True
    ws.open.set()
    box = Outbox.for_websocket(ws)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.run)
        await box.send("aaaa")
        with pytest.raises(ConnectionClosed):
            await box.flush()
        with pytest.raises(ConnectionClosed):
            await box.send("bbbb")
    assert ws.sent == [] and box.writes == 0


