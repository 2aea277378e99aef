"""prototype/ws_internals.py: the trio-websocket internals it reads exist, and it writes what the public calls write."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing
import trio_websocket

from prototype import ws_internals
from prototype.server.outbox import Outbox, send_one_by_one

MESSAGES: list[str | bytes] = ['{"type":"response.output_text.done"}', "x" * 200, b"\x00\x01binary", "é" * 70_000, ""]


class RecordingStream(trio.abc.Stream):
    """A stream that records each `send_all` it is given, then passes it on."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []
        self.broken = False  # True: every write fails as a reset TCP connection's does

    async def send_all(self, data: Any) -> None:
        if self.broken:
            raise trio.BrokenResourceError("connection reset")
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def connected(nursery: trio.Nursery, wrap: Any = trio_websocket.wrap_server_stream
                    ) -> tuple[trio_websocket.WebSocketConnection, trio_websocket.WebSocketConnection, RecordingStream]:
    """(server end, client end, the server's recorded stream) of one open WebSocket connection; `wrap`: the server's
    `wrap_server_stream`."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    recording = RecordingStream(server_stream)
    accepted: list[trio_websocket.WebSocketConnection] = []

    async def accept() -> None:
        request = await wrap(nursery, recording)
        accepted.append(await request.accept())

    nursery.start_soon(accept)
    client = await trio_websocket.wrap_client_stream(nursery, client_stream, "testbed", "/", message_queue_size=16)
    await trio.testing.wait_all_tasks_blocked()
    recording.writes.clear()  # the handshake's response
    return accepted[0], client, recording


async def test_the_trio_websocket_internals_the_testbed_relies_on_are_there(autojump_clock, nursery) -> None:
    server, client, _ = await connected(nursery)
    for ws in (server, client):
        missing = ws_internals.missing_internals(ws)
        assert not missing, (
            f"trio-websocket {trio_websocket.__version__} changed what prototype/ws_internals.py reads: {missing}. "
            "Port send_messages and received_message_nowait to it (or to a public API that does the same), "
            "then widen the trio-websocket range in pyproject.toml.")
    assert ws_internals.can_batch(server)


async def test_the_servers_connection_answers_a_ping_while_it_is_open(autojump_clock, nursery) -> None:
    server, client, recording = await connected(nursery, ws_internals.wrap_server_stream)
    assert isinstance(server, ws_internals.ClosingAwareWebSocket)
    await client.ping(b"alive")  # returns once the pong with the same payload has arrived
    assert recording.writes == [b"\x8a\x05alive"]  # the pong frame: FIN, opcode 10, unmasked, the ping's payload


async def test_without_an_internal_the_server_gets_trio_websockets_own_connection_with_its_options_and_a_warning(
        autojump_clock, nursery, monkeypatch, caplog) -> None:
    # A trio-websocket whose connection lacks one of them (its own reader task uses all three that 0.12 has).
    monkeypatch.setattr(ws_internals, "SERVER_INTERNALS", ("_handle_ping_frame", *ws_internals.SERVER_INTERNALS[1:]))
    server, client, _ = await connected(nursery, functools.partial(ws_internals.wrap_server_stream, max_message_size=16))
    assert type(server) is trio_websocket.WebSocketConnection
    assert [record.getMessage().split(" lacks ")[1] for record in caplog.records] == ["_handle_ping_frame: one socket write per message"]
    await client.send_message("x" * 17)
    with pytest.raises(trio_websocket.ConnectionClosed) as closed:
        await server.get_message()
    assert closed.value.reason.code == 1009  # over the max_message_size it was given: message too big


async def test_several_messages_in_one_write_are_the_bytes_one_send_message_each_writes(autojump_clock, nursery) -> None:
    one_each, one_each_client, one_each_stream = await connected(nursery)
    batched, batched_client, batched_stream = await connected(nursery)
    for message in MESSAGES:
        await one_each.send_message(message)
    await ws_internals.send_messages(batched, MESSAGES)
    assert len(one_each_stream.writes) == len(MESSAGES) and len(batched_stream.writes) == 1
    assert batched_stream.writes[0] == b"".join(one_each_stream.writes)
    for client in (one_each_client, batched_client):
        assert [await client.get_message() for _ in MESSAGES] == MESSAGES


async def test_a_received_message_is_taken_without_waiting_in_order_and_none_once_there_is_none(autojump_clock, nursery) -> None:
    server, client, _ = await connected(nursery)
    assert ws_internals.received_message_nowait(client) is None
    await ws_internals.send_messages(server, MESSAGES[:3])
    await trio.testing.wait_all_tasks_blocked()  # the client's reader task has queued all three
    assert [ws_internals.received_message_nowait(client) for _ in range(4)] == [*MESSAGES[:3], None]
    await server.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert ws_internals.received_message_nowait(client) is None
    with pytest.raises(trio_websocket.ConnectionClosed):
        await client.get_message()


async def test_after_the_connection_closed_a_batch_raises_connection_closed_as_send_message_does(autojump_clock, nursery) -> None:
    server, client, recording = await connected(nursery)
    await client.aclose()
    await trio.testing.wait_all_tasks_blocked()
    writes = len(recording.writes)
    with pytest.raises(trio_websocket.ConnectionClosed) as batched:
        await ws_internals.send_messages(server, MESSAGES)
    with pytest.raises(trio_websocket.ConnectionClosed) as one:
        await server.send_message(MESSAGES[0])
    assert len(recording.writes) == writes
    assert batched.value.reason is one.value.reason and one.value.reason.code == 1000  # the client's normal close


async def test_a_batch_on_a_broken_stream_aborts_and_raises_the_abnormal_closure_as_send_message_does(autojump_clock, nursery) -> None:
    reasons = []
    for send in (ws_internals.send_messages, lambda ws, messages: ws.send_message(messages[0])):
        server, _, recording = await connected(nursery)
        recording.broken = True
        with pytest.raises(trio_websocket.ConnectionClosed) as caught:
            await send(server, MESSAGES)
        assert caught.value.reason is server.closed
        reasons.append((caught.value.reason.code, caught.value.reason.reason))
    assert reasons[0] == reasons[1] and reasons[0][0] == 1006  # abnormal closure: the stream broke


class OnlyEnter:
    async def __aenter__(self) -> None: ...


class OnlyExit:
    async def __aexit__(self, *exc_info: object) -> None: ...


def not_a_coroutine_function() -> None: ...


@pytest.mark.parametrize(("name", "value"), [
    ("_wsproto", object()), ("_stream", object()), ("_stream_lock", OnlyEnter()), ("_stream_lock", OnlyExit()), ("_close_reason", "closed"),
    ("_abort_web_socket", not_a_coroutine_function), ("_recv_channel", object())])
async def test_an_internal_of_another_kind_is_named_as_missing_and_stops_batching(autojump_clock, nursery, name: str, value: object) -> None:
    server, _, _ = await connected(nursery)
    setattr(server, name, value)
    assert ws_internals.missing_internals(server) == [f"{name} ({ws_internals.INTERNALS[name]})"]
    assert not ws_internals.can_batch(server)


class PublicOnly:
    """A WebSocket with trio-websocket's public calls only: what a version without the internals looks like."""

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    async def send_message(self, message: str | bytes) -> None:
        self.sent.append(message)


async def test_without_the_internals_the_outbox_sends_one_message_at_a_time_and_reads_wait(autojump_clock) -> None:
    ws = PublicOnly()
    assert [name.split()[0] for name in ws_internals.missing_internals(ws)] == list(ws_internals.INTERNALS)
    assert not ws_internals.can_batch(ws)
    box = Outbox.for_websocket(ws)
    assert box.write.func is send_one_by_one
    await box.write(MESSAGES)
    assert ws.sent == MESSAGES and ws_internals.received_message_nowait(ws) is None
