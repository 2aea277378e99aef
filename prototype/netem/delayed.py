"""A trio Stream whose traffic reaches the other end late, like a long link (the context managers
that run its delivery tasks are in `links.py`).

Delays are measured on the trio clock (``trio.current_time()``), so under
``trio.testing.MockClock(autojump_threshold=0)`` every arrival time is exact.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import attrs
import trio

from .arrivals import Arrivals

# After a graceful aclose(), queued data is still delivered on schedule (as the kernel does after
# close() on a TCP socket, RFC 9293 §3.6). If the inner stream is still blocked this long after the
# last scheduled arrival (a peer that never reads), the rest is dropped so that no task outlives
# its context manager for ever.
_LINGER_GRACE_SECONDS: Final = 1.0


@attrs.frozen
class _Chunk:
    """One item in flight: data, end of stream (``data is None``), or an error from the inner stream."""

    arrival: float
    data: bytes | None
    error: BaseException | None = None


class DelayedStream(trio.abc.HalfCloseableStream):
    """A Stream whose traffic reaches the other end late, like a long link.

    Everything sent is delivered to the inner stream ``send_delay`` seconds later (plus jitter), and
    with ``receive_delay`` everything the inner stream receives is released to the reader that much
    later. Neither blocks the sender: the link is pipelined, so two sends 1 ms apart arrive 1 ms apart
    after the delay. Order is preserved in each direction, and ``send_eof`` arrives after the data
    sent before it.

    A direction with no delay and no jitter is passed straight through, with no task. A delayed
    direction needs a background task, so build the stream with ``links.py``'s :func:`open_delayed_stream`,
    :func:`open_emulated_pair` or :func:`open_emulated_tcp`, which run those tasks and close the stream
    when they exit.

    Closing: :meth:`aclose` returns at once; data already sent is still delivered on schedule, and
    the inner stream is closed one ``send_delay`` later, when the close reaches the peer (what the
    kernel does after ``close()`` on a TCP socket, RFC 9293 §3.6), unless the inner stream is still
    blocked a second after that (a peer that never reads). A cancelled ``aclose``
    (``trio.aclose_forcefully``) drops whatever is still in flight and closes the inner stream at
    once. Data received but not yet released is dropped either way. The wrapper owns the inner
    stream; the context manager that opened it waits for the delayed close on exit.

    Attributes:
        transport_stream: The wrapped stream.
        send_delay: One-way delay added to what is sent, in seconds.
        receive_delay: Delay added to what is received, in seconds.
        bytes_sent: Bytes accepted by ``send_all`` so far.
        bytes_received: Bytes returned by ``receive_some`` so far.
    """

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        *,
        send_delay: float = 0.0,
        receive_delay: float = 0.0,
        send_jitter: float = 0.0,
        receive_jitter: float = 0.0,
        bandwidth_bytes_per_s: float | None = None,
        seed: int = 0,
        loss: float = 0.0,
        receive_loss: float = 0.0,
    ) -> None:
        """Wraps a stream; the background tasks start only through the ``open_*`` context managers.

        Args:
            transport_stream: The stream to wrap; closing the wrapper closes it.
            send_delay: Seconds between ``send_all`` returning and the data reaching
                ``transport_stream``.
            receive_delay: Seconds between data arriving from ``transport_stream`` and
                ``receive_some`` returning it.
            send_jitter: Standard deviation (and mean) of an exponential extra delay per chunk sent.
            receive_jitter: The same for each chunk received.
            bandwidth_bytes_per_s: If set, ``send_all`` first waits ``len(data) / bandwidth``, the time
                to serialize the chunk onto the link; it applies to the send direction only.
            seed: Seed of the jitter draws.
            loss: Probability that a chunk sent is lost once on the link: it arrives
                ``RETRANSMIT_TIMEOUT_SECONDS`` late (TCP resends it), and the chunks after it wait for
                it (in-order delivery: head-of-line blocking). A TCP stream never loses data for good.
            receive_loss: The same for each chunk received (the far end's sends, on a link of which
                only this end is wrapped: a real socket's client side).

        Raises:
            ValueError: If a delay or jitter is negative or not finite, the bandwidth is not > 0, or
                the loss is not in [0, 1).
        """
        for name, value in (
            ("send_delay", send_delay),
            ("receive_delay", receive_delay),
            ("send_jitter", send_jitter),
            ("receive_jitter", receive_jitter),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if bandwidth_bytes_per_s is not None and not (
            math.isfinite(bandwidth_bytes_per_s) and bandwidth_bytes_per_s > 0
        ):
            raise ValueError(f"bandwidth_bytes_per_s must be None or > 0, got {bandwidth_bytes_per_s!r}")
        for name, value in (("loss", loss), ("receive_loss", receive_loss)):
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        self.transport_stream = transport_stream
        self.send_delay = send_delay
        self.receive_delay = receive_delay
        self.bytes_sent = 0
        self.bytes_received = 0
        self._bandwidth = bandwidth_bytes_per_s
        # Each direction draws from its own generators, so its draws don't depend on how the two interleave.
        self._sent = Arrivals(send_delay, send_jitter, loss, jitter_seed=f"netem:{seed}:send", loss_seed=f"netem:{seed}:loss")
        self._received = Arrivals(
            receive_delay, receive_jitter, receive_loss, jitter_seed=f"netem:{seed}:receive", loss_seed=f"netem:{seed}:receive-loss"
        )
        self._delays_send = self._sent.delays
        self._delays_receive = self._received.delays

        self._started = False
        self._closed = False
        self._sending = False
        self._receiving = False
        self._eof_sent = False
        self._send_error: BaseException | None = None
        # Cancelled by aclose() to wake a task blocked in one of our methods.
        self._wait_scopes: set[trio.CancelScope] = set()

        # Send direction: send_all queues, _deliver forwards each chunk at its arrival time.
        self._outgoing_in, self._outgoing_out = trio.open_memory_channel[_Chunk](math.inf)
        self._deliver_scope = trio.CancelScope()
        self._deliver_done = not self._delays_send
        self._close_at = -math.inf

        # Receive direction: _pump reads and time-stamps, receive_some waits for each timestamp.
        self._incoming_in, self._incoming_out = trio.open_memory_channel[_Chunk](math.inf)
        self._pump_scope = trio.CancelScope()
        self._receive_head: _Chunk | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def start_delivery(self, nursery: trio.Nursery) -> None:
        """Starts the tasks of the delayed directions in ``nursery`` (``links.run_delivery`` does)."""
        if self._started:
            raise RuntimeError("DelayedStream already started")
        self._started = True
        if self._delays_send:
            nursery.start_soon(self._deliver)
        if self._delays_receive:
            nursery.start_soon(self._pump)

    def _check_started(self) -> None:
        if (self._delays_send or self._delays_receive) and not self._started:
            raise RuntimeError("a delayed DelayedStream must be opened with open_delayed_stream()")

    async def aclose(self) -> None:
        """Closes the stream; data already sent is still delivered (see the class docstring).

        Tasks blocked in this stream's methods get ``trio.ClosedResourceError``. If this call is
        cancelled, data still in flight is dropped and the inner stream is closed at once.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        for scope in self._wait_scopes:
            scope.cancel()
        self._pump_scope.cancel()
        if self._deliver_done or not self._started:
            self._outgoing_in.close()
            await self.transport_stream.aclose()
            return
        # The delivery task drains the queue, then closes the inner stream when the close would reach
        # the peer: a FIN travels the same one-way delay as data, after the data (RFC 9293 §3.6).
        self._close_at = self._sent.next(trio.current_time())
        self._deliver_scope.deadline = self._close_at + _LINGER_GRACE_SECONDS
        self._outgoing_in.close()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            self._deliver_scope.cancel()
            raise

    @contextmanager
    def _closable_wait(self) -> Iterator[None]:
        """Turns a wake-up by :meth:`aclose` into ``trio.ClosedResourceError``."""
        scope = trio.CancelScope()
        self._wait_scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._wait_scopes.discard(scope)
        if scope.cancelled_caught:
            raise trio.ClosedResourceError("stream closed while a task was waiting on it")

    # ---- send direction --------------------------------------------------------------------------

    def _check_can_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream is closed")
        if self._eof_sent:
            raise trio.ClosedResourceError("send_eof() was called; can't send any more")
        if self._send_error is not None:
            raise trio.BrokenResourceError("the link failed") from self._send_error
        self._check_started()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Queues ``data`` for delivery ``send_delay`` (plus jitter) from now.

        Returns once the data is queued, after the serialization time ``len(data) / bandwidth`` if a
        bandwidth is set; it never waits for the delivery.

        Raises:
            trio.BusyResourceError: If another task is sending on this stream.
            trio.ClosedResourceError: If the stream was closed, or ``send_eof`` was called.
            trio.BrokenResourceError: If delivering earlier data failed.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            self._check_can_send()
            payload = bytes(data)  # the caller may reuse its buffer once we return
            with self._closable_wait():
                await trio.lowlevel.checkpoint()
                if self._bandwidth is not None and payload:
                    # Serialization delay: the link carries one chunk at a time, in order.
                    await trio.sleep(len(payload) / self._bandwidth)
                if payload and not self._delays_send:
                    await self.transport_stream.send_all(payload)
            self._check_can_send()
            if payload and self._delays_send:
                self._outgoing_in.send_nowait(_Chunk(self._sent.next(trio.current_time()), payload))
            self.bytes_sent += len(payload)
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        """Ends the send direction; the peer reads everything sent before it, then ``b""``.

        A second call does nothing.

        Raises:
            TypeError: If the inner stream has no ``send_eof``.
            trio.BusyResourceError: If another task is sending on this stream.
            trio.ClosedResourceError: If the stream was closed.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            if self._closed:
                raise trio.ClosedResourceError("stream is closed")
            send_eof = getattr(self.transport_stream, "send_eof", None)
            if send_eof is None:
                raise TypeError(f"{type(self.transport_stream).__name__} can't send_eof")
            with self._closable_wait():
                await trio.lowlevel.checkpoint()
            if self._eof_sent:
                return
            self._check_can_send()
            self._eof_sent = True
            if self._delays_send:
                self._outgoing_in.send_nowait(_Chunk(self._sent.next(trio.current_time()), None))
            else:
                with self._closable_wait():
                    await send_eof()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        """Waits until ``send_all`` might not block.

        With a delayed send direction ``send_all`` only queues, so this returns at once; otherwise it
        asks the inner stream.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            if self._closed:
                raise trio.ClosedResourceError("stream is closed")
            with self._closable_wait():
                if self._delays_send:
                    await trio.lowlevel.checkpoint()
                else:
                    await self.transport_stream.wait_send_all_might_not_block()
        finally:
            self._sending = False

    async def _deliver(self) -> None:
        """Background task: forwards each queued chunk to the inner stream at its arrival time."""
        try:
            with self._deliver_scope:
                async for chunk in self._outgoing_out:
                    await trio.sleep_until(chunk.arrival)
                    if chunk.data is None:
                        await self.transport_stream.send_eof()  # type: ignore[attr-defined]
                    else:
                        await self.transport_stream.send_all(chunk.data)
                # The queue ends only when aclose() closes it: wait until the close arrives.
                await trio.sleep_until(self._close_at)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The peer went away: later sends raise BrokenResourceError, the rest is dropped.
            self._send_error = exc
        finally:
            self._deliver_done = True
            if self._closed:
                # aclose_forcefully closes at once, even in a cancelled task: trio's aclose contract.
                await trio.aclose_forcefully(self.transport_stream)

    # ---- receive direction -----------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Returns the next data the peer sent, once its delay has passed; ``b""`` at end of stream.

        Raises:
            ValueError: If ``max_bytes`` is less than 1.
            trio.BusyResourceError: If another task is receiving on this stream.
            trio.ClosedResourceError: If the stream was closed.
            trio.BrokenResourceError: If the inner stream failed.
        """
        if max_bytes is not None:
            max_bytes = operator.index(max_bytes)
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            if self._closed:
                raise trio.ClosedResourceError("stream is closed")
            self._check_started()
            with self._closable_wait():
                if self._delays_receive:
                    data = await self._receive_delayed(max_bytes)
                else:
                    data = await self.transport_stream.receive_some(max_bytes)
        finally:
            self._receiving = False
        self.bytes_received += len(data)
        return data

    async def _receive_delayed(self, max_bytes: int | None) -> bytes:
        # The head chunk stays put while we wait, so a cancelled receive loses nothing.
        if self._receive_head is None:
            self._receive_head = await self._incoming_out.receive()
        head = self._receive_head
        await trio.sleep_until(head.arrival)
        if head.error is not None:
            raise trio.BrokenResourceError("the link failed") from head.error
        if head.data is None:
            return b""
        if max_bytes is None or len(head.data) <= max_bytes:
            self._receive_head = None
            return head.data
        self._receive_head = _Chunk(head.arrival, head.data[max_bytes:])
        return head.data[:max_bytes]

    async def _pump(self) -> None:
        """Background task: reads the inner stream as fast as it delivers and time-stamps each chunk.

        Reading at once (not when the application asks) makes the delay run from the moment the data
        reached this host, like a link whose far end is ``receive_delay`` away.
        """
        with self._pump_scope:
            while True:
                error: BaseException | None = None
                data: bytes | None = None
                try:
                    data = bytes(await self.transport_stream.receive_some())
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    error = exc
                arrival = self._received.next(trio.current_time(), can_be_lost=bool(data))
                self._incoming_in.send_nowait(_Chunk(arrival, data or None, error))
                if not data:
                    return
