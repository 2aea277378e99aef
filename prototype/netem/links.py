"""Emulated links, each a context manager that runs its delayed streams' delivery tasks: one delayed
stream, an in-memory client/server pair for virtual-time runs, and a real TCP socket delayed on the
client side for real-time runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from .delayed import DelayedStream
from .profiles import NetworkProfile, connect_handshake


@asynccontextmanager
async def run_delivery(*streams: DelayedStream) -> AsyncIterator[None]:
    """Runs the background tasks of ``streams`` for the body, then closes them.

    The body's own exception comes out as it is, not wrapped in an ExceptionGroup by the nursery.
    A body that ends normally closes gracefully (in-flight data is delivered, bounded by
    ``delayed._LINGER_GRACE_SECONDS``); one that raises closes forcefully.
    """
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        for stream in streams:
            stream.start_delivery(nursery)
        try:
            yield
        except GeneratorExit:
            raise
        except BaseException as exc:
            body_error = exc
            with trio.CancelScope(shield=True):
                for stream in streams:
                    await trio.aclose_forcefully(stream)
        else:
            for stream in streams:
                await stream.aclose()
    if body_error is not None:
        raise body_error


@asynccontextmanager
async def open_delayed_stream(
    stream: trio.abc.Stream,
    one_way_delay: float,
    *,
    jitter: float = 0.0,
    bandwidth_bytes_per_s: float | None = None,
    seed: int = 0,
    receive_delay: float = 0.0,
    receive_jitter: float = 0.0,
    loss: float = 0.0,
    receive_loss: float = 0.0,
) -> AsyncIterator[DelayedStream]:
    """Wraps ``stream`` in a :class:`DelayedStream` and runs its delivery tasks.

    With zero delays, no jitter and no loss the wrapper only counts bytes (and applies the bandwidth): it
    forwards directly and starts no task. On exit the wrapper, and so ``stream``, is closed.

    Args:
        stream: The stream to wrap.
        one_way_delay: Delay of the send direction, in seconds.
        jitter: Standard deviation of the extra per-chunk delay of the send direction.
        bandwidth_bytes_per_s: Serialization rate of the send direction; None for no limit.
        seed: Seed of the jitter draws.
        receive_delay: Delay of the receive direction, in seconds (0: not delayed).
        receive_jitter: Standard deviation of the extra per-chunk delay of the receive direction.
        loss: Probability that a chunk sent is lost once and resent (:class:`DelayedStream`).
        receive_loss: The same for each chunk received.

    Yields:
        The wrapped stream.
    """
    delayed = DelayedStream(
        stream,
        send_delay=one_way_delay,
        receive_delay=receive_delay,
        send_jitter=jitter,
        receive_jitter=receive_jitter,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        seed=seed,
        loss=loss,
        receive_loss=receive_loss,
    )
    async with run_delivery(delayed):
        yield delayed


@asynccontextmanager
async def open_emulated_pair(profile: NetworkProfile) -> AsyncIterator[tuple[DelayedStream, DelayedStream]]:
    """An in-memory connection with ``profile``'s delays, for virtual-time runs.

    Built on ``trio.testing.memory_stream_pair``, which buffers without limit (unlike
    ``lockstep_stream_pair``), so a send never waits for the peer to read. Each end delays what it
    sends by ``rtt / 2`` with the profile's jitter and bandwidth (jitter seeds ``seed`` for the
    client's sends and ``seed + 1`` for the server's); a request and its response cost exactly one
    RTT. The handshake is not charged here: call :func:`connect_handshake` when the
    pair stands for a new connection.

    Args:
        profile: The network to emulate.

    Yields:
        ``(client_end, server_end)``.
    """
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client, server = (
        DelayedStream(
            raw,
            send_delay=profile.one_way_delay,
            send_jitter=profile.jitter,
            bandwidth_bytes_per_s=profile.bandwidth_bytes_per_s,
            seed=seed,
            loss=profile.loss,
        )
        for raw, seed in ((client_raw, profile.seed), (server_raw, profile.seed + 1))
    )
    async with run_delivery(client, server):
        yield client, server


@asynccontextmanager
async def open_emulated_tcp(host: str | bytes, port: int, profile: NetworkProfile) -> AsyncIterator[DelayedStream]:
    """Connects a real TCP socket and makes it behave like ``profile``'s network, for real-time runs.

    Pays :func:`connect_handshake` after connecting (the socket is plain: TLS is charged in time
    only). Only the client side is wrapped, so it carries both directions' delay: what it sends
    reaches the socket ``rtt / 2`` later, and what the socket receives is released to the reader
    ``rtt / 2`` after it arrived (a background task reads the socket as data comes). An unmodified
    server then sees each request, and the client each response, one RTT apart, as over a real WAN.
    Jitter and loss apply to both directions; bandwidth to the upload only.

    Args:
        host: Server host name or address.
        port: Server port.
        profile: The network to emulate.

    Yields:
        The client end of the connection.
    """
    raw = await trio.open_tcp_stream(host, port)
    try:
        await connect_handshake(profile)
    except BaseException:
        await trio.aclose_forcefully(raw)
        raise
    async with open_delayed_stream(
        raw,
        profile.one_way_delay,
        jitter=profile.jitter,
        bandwidth_bytes_per_s=profile.bandwidth_bytes_per_s,
        seed=profile.seed,
        receive_delay=profile.one_way_delay,
        receive_jitter=profile.jitter,
        loss=profile.loss,
        receive_loss=profile.loss,
    ) as stream:
        yield stream
