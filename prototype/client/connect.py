"""How the harness reaches a server: in memory (virtual time) or over TCP (real time), optionally
through the WAN emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import attrs
import trio
import trio.testing

from .. import netem

# The harness must take multi-MB response.completed frames (openai-python and openai-agents use
# max_size=None; docs/protocol.md).
CLIENT_MAX_MESSAGE_BYTES = 1 << 30


class Connector(Protocol):
    def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        """An async context manager giving a fresh byte stream to the server."""


@attrs.define(eq=False)
class InMemoryConnector:
    """Memory streams to a server in this process; with a network profile, through netem and
    paying its handshake round trips on every new connection."""

    server: object  # ResponsesServer; typed loosely to keep client below server in the layering
    network: netem.NetworkProfile | None = None

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        async with trio.open_nursery() as nursery:
            if self.network is None:
                client, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(self.server.handle_stream, server_end)
                try:
                    yield client
                finally:
                    await client.aclose()
            else:
                await netem.connect_handshake(self.network)
                async with netem.open_emulated_pair(self.network) as (client, server_end):
                    nursery.start_soon(self.server.handle_stream, server_end)
                    try:
                        yield client
                    finally:
                        await client.aclose()


@attrs.define(eq=False)
class TcpConnector:
    host: str
    port: int
    network: netem.NetworkProfile | None = None

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        network = self.network
        if network is None or (network.rtt == 0 and network.jitter == 0 and network.bandwidth_bytes_per_s is None):
            # No delay to add (netem.LOOPBACK): the plain socket, without the delaying wrapper's
            # per-chunk task switches, which are the testbed's own cost, not the network's.
            stream = await trio.open_tcp_stream(self.host, self.port)
            try:
                yield stream
            finally:
                await stream.aclose()
        else:
            async with netem.open_emulated_tcp(self.host, self.port, self.network) as stream:
                yield stream
