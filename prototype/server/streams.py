"""Small trio Stream helpers for the listener: read a request head, then replay it."""

from __future__ import annotations

import trio


class HeadTooLarge(Exception):
    pass


async def read_head(stream: trio.abc.Stream, limit: int) -> bytes:
    """Bytes up to and including the end of the HTTP request head (and whatever came with it).
    Returns b"" if the peer closed first."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > limit:
            raise HeadTooLarge
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b""
        buffer += chunk
    return bytes(buffer)


class ReplayStream(trio.abc.Stream):
    """A Stream that first yields `prefix`, then reads from `inner`: hands trio-websocket (or h11)
    a connection whose first bytes the listener already read to choose the protocol."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            chunk, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return chunk
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()
