"""Links that break: connection drops at a rate, drops in the middle of a response, and cutting every
open link at once (a server restart).

A broken link behaves as a reset TCP connection does: data in flight is lost, and from then on
both ends' reads and writes raise ``trio.BrokenResourceError`` (trio-websocket reports that as close
code 1006, an HTTP client as a lost connection). Nothing here knows what the bytes mean: a fault is
a property of the link, never of a design.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio


@attrs.frozen
class LinkFaults:
    """What can go wrong with each connection, drawn per connection from its own seed."""

    drops_per_hour: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    """Connection drops at random times: a Poisson process over each connection's lifetime."""
    drop_per_server_chunk: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)])
    """Probability that the link breaks as the server sends a chunk: since a server only sends while it
    answers, these drops land in the middle of a response."""
    seed: int = 0
    """Seed of the draws; connection n of a connector draws from (seed, n)."""

    @property
    def any(self) -> bool:
        return self.drops_per_hour > 0 or self.drop_per_server_chunk > 0


NO_FAULTS = LinkFaults()


@attrs.define(eq=False)
class Link:
    """The shared state of one connection's two ends: whether it is broken, and why."""

    faults: LinkFaults = NO_FAULTS
    serial: int = 0
    broken: bool = False
    reason: str = ""
    _rng: random.Random = attrs.field(init=False)
    _broke: trio.Event = attrs.Factory(trio.Event)
    reads: set[trio.CancelScope] = attrs.Factory(set)  # reads in progress, woken by a cut

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(f"linkfaults:{self.faults.seed}:{self.serial}")

    def cut(self, reason: str) -> None:
        """Break the link now (idempotent)."""
        if not self.broken:
            self.broken, self.reason = True, reason
            self._broke.set()
            for scope in self.reads:
                scope.cancel()

    async def wait_broken(self) -> None:
        await self._broke.wait()

    def server_chunk_sent(self) -> None:
        if self.faults.drop_per_server_chunk and self._rng.random() < self.faults.drop_per_server_chunk:
            self.cut("mid-response drop")

    async def run_timed_drop(self) -> None:
        """Break the link at an exponentially distributed time (the rate's Poisson process)."""
        if self.faults.drops_per_hour <= 0:
            return
        await trio.sleep(self._rng.expovariate(self.faults.drops_per_hour / 3600.0))
        self.cut("timed drop")


class FaultyStream(trio.abc.HalfCloseableStream):
    """One end of a `Link`: passes everything through until the link breaks, then raises
    ``trio.BrokenResourceError`` (a read in progress is woken). What arrives after the break is never
    read: the data in flight is lost."""

    def __init__(self, inner: trio.abc.HalfCloseableStream, link: Link, *, server_side: bool, client_counts: bool = False) -> None:
        """`server_side`: this end is the server's, so its sends are the server's chunks. `client_counts`: this
        client end counts the server's chunks as it receives them instead (a link faulted on the client's
        side only, over a real socket)."""
        self.inner = inner
        self.link = link
        self.server_side = server_side
        self.client_counts = client_counts

    def _check(self) -> None:
        if self.link.broken:
            raise trio.BrokenResourceError(f"the link broke ({self.link.reason})")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._check()
        if self.server_side and data:
            self.link.server_chunk_sent()
            self._check()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        self._check()
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        self._check()
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self._check()
        data: bytes | bytearray = b""
        waits = self.link.reads
        with trio.CancelScope() as scope:
            waits.add(scope)
            try:
                data = await self.inner.receive_some(max_bytes)
            finally:
                waits.discard(scope)
        self._check()
        if self.client_counts and data:
            self.link.server_chunk_sent()
            self._check()
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class LinkRegistry:
    """The open links of a connector, so that a server restart can cut them all."""

    links: set[Link] = attrs.Factory(set)
    opened: int = 0

    def new(self, faults: LinkFaults) -> Link:
        link = Link(faults, self.opened)
        self.opened += 1
        self.links.add(link)
        return link

    def cut_all(self, reason: str) -> int:
        """Break every open link; returns how many."""
        links = [link for link in self.links if not link.broken]
        for link in links:
            link.cut(reason)
        return len(links)


@asynccontextmanager
async def open_faulty_pair(
    client: trio.abc.HalfCloseableStream, server: trio.abc.HalfCloseableStream, link: Link, registry: LinkRegistry | None = None,
) -> AsyncIterator[tuple[FaultyStream, FaultyStream]]:
    """Wrap a connection's two ends in `link`, and run its timed drop while the body runs."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run_timed_drop)
        try:
            yield FaultyStream(client, link, server_side=False), FaultyStream(server, link, server_side=True)
        finally:
            nursery.cancel_scope.cancel()
            if registry is not None:
                registry.links.discard(link)


__all__ = ["NO_FAULTS", "FaultyStream", "Link", "LinkFaults", "LinkRegistry", "open_faulty_pair"]
