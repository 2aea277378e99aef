"""How the harness reaches a server: in memory (virtual time) or over TCP (real time), optionally
through the WAN emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import attrs
import trio
import trio.testing

from .. import netem
from ..netem.faults import FaultyStream, LinkFaults, LinkRegistry, open_faulty_pair

# The harness must take multi-MB response.completed frames (openai-python and openai-agents use
# max_size=None; docs/protocol.md).
CLIENT_MAX_MESSAGE_BYTES = 1 << 30


class Connector(Protocol):
    def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        """An async context manager giving a fresh byte stream to the server."""


class ConnectionRefused(OSError):
    """Nothing accepts connections (the in-process server is down: a restart in progress)."""


@attrs.define(eq=False)
class InMemoryConnector:
    """Memory streams to a server in this process; with a network profile, through netem and
    paying its handshake round trips on every new connection; with `faults`, over links that break
    (prototype/netem/faults.py). `server` may be replaced between connections (a restart), and
    while `refusing` is set a new connection fails after its TCP round trip, as a port with no
    listener answers a SYN with a reset."""

    server: object  # ResponsesServer; typed loosely to keep client below server in the layering
    network: netem.NetworkProfile | None = None
    faults: LinkFaults | None = None
    links: LinkRegistry = attrs.Factory(LinkRegistry)
    refusing: bool = False

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        if self.refusing:
            await trio.sleep(self.network.rtt if self.network is not None else 0)
            raise ConnectionRefused("connection refused")
        server = self.server
        async with trio.open_nursery() as nursery:
            if self.network is None:
                client, server_end = trio.testing.memory_stream_pair()
                async with self._faulty(client, server_end) as (client, server_end):
                    nursery.start_soon(server.handle_stream, server_end)
                    try:
                        yield client
                    finally:
                        await client.aclose()
            else:
                await netem.connect_handshake(self.network)
                async with netem.open_emulated_pair(self.network) as (client, server_end), self._faulty(client, server_end) as (client, server_end):
                    nursery.start_soon(server.handle_stream, server_end)
                    try:
                        yield client
                    finally:
                        await client.aclose()

    @asynccontextmanager
    async def _faulty(self, client: trio.abc.Stream, server_end: trio.abc.Stream) -> AsyncIterator[tuple[trio.abc.Stream, trio.abc.Stream]]:
        """With `faults` (even `NO_FAULTS`), each connection is registered (a restart cuts them all) and may
        break; without, the plain streams (no wrapper on the hot path)."""
        if self.faults is None:
            yield client, server_end
            return
        link = self.links.new(self.faults)
        async with open_faulty_pair(client, server_end, link, self.links) as pair:
            yield pair


@attrs.define(eq=False)
class TcpConnector:
    """A real socket to `host:port`; with a network profile, delayed through netem; with `faults`, over a
    link that breaks on the client's side (the socket is closed under the client, and the server sees the
    connection end in the middle of whatever it was doing)."""

    host: str
    port: int
    network: netem.NetworkProfile | None = None
    faults: LinkFaults | None = None
    links: LinkRegistry = attrs.Factory(LinkRegistry)

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        if self.faults is None:
            async with self._open_plain() as stream:
                yield stream
            return
        async with self._open_plain() as stream:
            link = self.links.new(self.faults)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(link.run_timed_drop)
                try:
                    yield FaultyStream(stream, link, server_side=False, client_counts=True)
                finally:
                    nursery.cancel_scope.cancel()
                    self.links.links.discard(link)

    @asynccontextmanager
    async def _open_plain(self) -> AsyncIterator[trio.abc.Stream]:
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


@attrs.define(eq=False)
class RoundRobinConnector:
    """New connections spread over several in-process workers in turn, as the kernel spreads them over
    `serve --workers N`'s listening processes (SO_REUSEPORT); a worker that is down (`refusing`) is
    skipped, as a closed listener gets no connections. All down: the connection is refused."""

    workers: list[InMemoryConnector]
    turn: int = 0

    def open_stream(self) -> AbstractAsyncContextManager[trio.abc.Stream]:
        for _ in range(len(self.workers)):
            worker = self.workers[self.turn % len(self.workers)]
            self.turn += 1
            if not worker.refusing:
                return worker.open_stream()
        return self.workers[0].open_stream()
