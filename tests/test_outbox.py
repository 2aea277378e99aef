"""The server's outbox (server/outbox.py): several messages per socket write, and the client sees exactly what one
write per message gave it."""

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
    """Every event the client received, with its message's size (`created_at`, wall-clock seconds, left out)."""
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


def write_one_by_one(monkeypatch) -> None:
    """The outbox as a server without one: each message written as it is sent, nothing ever queued."""

    async def one_write_each(self: Outbox, message: str | bytes) -> None:
        await self.write([message])

    async def nothing_queued(self: Outbox) -> None:
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(Outbox, "send", one_write_each)
    monkeypatch.setattr(Outbox, "flush", nothing_queued)


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
    write_one_by_one(monkeypatch)
    one_each = await received(design, network, monkeypatch)

    assert (batched, sum(batches)) == (one_each, len(batched))
    # The ends of turns go out together: each turn's closing events (text/arguments done, item
    # done, then the pause or terminal event) in one write at least.
    assert len(batches) < len(batched) and max(batches) >= 3


class BrokenWebSocket:
    async def send_message(self, message: str) -> None:
        raise ConnectionClosed(None)


async def test_after_a_failed_write_sends_and_flushes_raise_connection_closed(autojump_clock) -> None:
    box = Outbox.for_websocket(BrokenWebSocket())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(box.run)
        await box.send("aaaa")
        with pytest.raises(ConnectionClosed):
            await box.flush()
        with pytest.raises(ConnectionClosed):
            await box.send("bbbb")
    assert box.writes == 0


class GatedWriter:
    """An outbox's `write`: records each batch; each write waits until `open` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.open = trio.Event()

    async def __call__(self, batch: list[str]) -> None:
        await self.open.wait()
        self.batches.append(list(batch))


async def test_each_write_takes_every_message_queued_since_the_last_and_is_counted(autojump_clock, nursery) -> None:
    writer = GatedWriter()
    box = Outbox(writer)
    nursery.start_soon(box.run)
    await box.send("a")
    await box.send("b")
    await trio.testing.wait_all_tasks_blocked()  # the writer took "a" and "b" and waits in its write
    flushed_at = []

    async def flush() -> None:
        await box.flush()
        flushed_at.append(trio.current_time())

    nursery.start_soon(flush)
    await trio.testing.wait_all_tasks_blocked()  # nothing queued, a write in progress: the flush waits
    await box.send("c")
    await box.send("d")
    await trio.sleep(2.0)
    assert (writer.batches, box.writes, flushed_at) == ([], 0, [])  # a write in progress holds the flush
    writer.open.set()
    await trio.testing.wait_all_tasks_blocked()
    assert (writer.batches, box.writes, flushed_at) == ([["a", "b"], ["c", "d"]], 2, [2.0])
    await box.send("e")
    await box.flush()
    assert (writer.batches[-1], box.writes) == (["e"], 3)


async def test_a_sender_waits_only_past_the_limit_and_resumes_in_order_once_the_batch_is_written(autojump_clock, nursery) -> None:
    writer = GatedWriter()
    box = Outbox(writer, limit=8)
    nursery.start_soon(box.run)
    await box.send("x")
    await trio.testing.wait_all_tasks_blocked()  # the writer holds "x"
    with trio.move_on_after(1.0) as at_the_limit:
        await box.send("aaaa")
        await box.send("bbbb")  # 8 bytes queued: at the limit, not past it
    assert not at_the_limit.cancelled_caught
    done = []

    async def sender() -> None:
        await box.send("c")
        done.append("c")

    nursery.start_soon(sender)
    await trio.sleep(1.0)
    assert done == []  # past the limit: it waits
    writer.open.set()
    await box.flush()
    await trio.testing.wait_all_tasks_blocked()  # it resumes once its batch was written
    assert done == ["c"] and [m for batch in writer.batches for m in batch] == ["x", "aaaa", "bbbb", "c"]


async def sse_bytes(nursery: trio.Nursery, network: netem.NetworkProfile | None) -> tuple[bytes, int]:
    """The bytes of two SSE answers on one keep-alive connection as received, and the server's socket writes."""
    from test_http import Link, RawClient, assert_completed_stream, create_body
    from test_http_client import Tapped

    from prototype.server import http

    writes = 0

    def counted(method):
        async def counting(self, *args) -> None:
            nonlocal writes
            writes += 1
            await method(self, *args)
        return counting

    server = ResponsesServer(ApiService(costs=ZERO_COSTS, new_id=IdFactory("same")))
    client = await Link(nursery, server, network).connect()
    received = bytearray()
    client = RawClient(Tapped(client.stream, received))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http.HttpExchange, "send", counted(http.HttpExchange.send))
        patch.setattr(http.HttpExchange, "write", counted(http.HttpExchange.write))
        first = assert_completed_stream(await client.request(body=create_body(stream=True)))
        assert_completed_stream(await client.request(body=create_body(stream=True, input="again")))
    assert len(first) > 10
    return bytes(received), writes


@pytest.mark.parametrize("link", ["pipe", "rtt-20ms"])
async def test_an_sse_answer_is_byte_for_byte_what_one_write_per_event_sent(autojump_clock, nursery, monkeypatch, link: str) -> None:
    """Over links that never push back (over a bandwidth-limited link one write per event groups tokens otherwise)."""
    import time

    monkeypatch.setattr(time, "time", lambda: 1_770_000_000.0)  # the responses' created_at, whole seconds of wall time
    batched, batched_writes = await sse_bytes(nursery, LINKS[link])
    write_one_by_one(monkeypatch)
    one_each, one_each_writes = await sse_bytes(nursery, LINKS[link])

    assert (batched, batched.count(b"event: response.completed\n")) == (one_each, 2)
    # One write per event before (the head with the first, the last chunk on its own); several
    # events per write now: at least a turn's closing events together.
    assert batched_writes < one_each_writes - 4
