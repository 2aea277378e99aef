"""prototype.netem, the WAN emulator, on trio's virtual clock (`autojump_clock`, exact times); real sockets in one test
(port 0, lower bounds only) and trio's stream conformance checks in real time with millisecond delays."""

from __future__ import annotations

import contextlib
import functools
import math
import random
import re

import attrs
import pytest
import trio
import trio.testing

from prototype.netem import (
    CROSS_CONTINENT,
    INTERCONTINENTAL,
    LOOPBACK,
    PRESETS,
    SAME_DC,
    SAME_REGION,
    DelayedStream,
    NetworkProfile,
    connect_handshake,
    faults,
    open_delayed_stream,
    open_emulated_pair,
    open_emulated_tcp,
)
from prototype.netem.arrivals import RETRANSMIT_TIMEOUT_SECONDS, Arrivals
from prototype.netem.links import run_delivery
from prototype.netem.profiles import RTT_RANGE

RTT = 0.040  # a round number between the same-region and cross-continent priors


def exactly(seconds: float) -> object:
    return pytest.approx(seconds, rel=1e-9, abs=1e-12)


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        assert chunk, "unexpected end of stream"
        buf += chunk
    return bytes(buf)


# ---- profiles ------------------------------------------------------------------------------------


def test_presets_defaults_and_handshake_seconds() -> None:
    assert [p.rtt for p in (LOOPBACK, SAME_DC, SAME_REGION, CROSS_CONTINENT, INTERCONTINENTAL)] == [0.0, 0.001, 0.020, 0.080, 0.150]
    assert list(PRESETS.values()) == [LOOPBACK, SAME_DC, SAME_REGION, CROSS_CONTINENT, INTERCONTINENTAL]
    # docs/parameters.md §5: a fresh connection at 80 ms costs 160 ms with TLS 1.3, 240 ms with TLS 1.2.
    assert CROSS_CONTINENT.handshake_seconds == exactly(0.160)
    assert NetworkProfile(rtt=0.080, tls_round_trips=2).handshake_seconds == exactly(0.240)
    assert NetworkProfile(rtt=0.080, tls_round_trips=0).handshake_seconds == exactly(0.080)
    assert SAME_REGION.one_way_delay == exactly(0.010)
    profile = NetworkProfile()  # loopback, one TCP and one TLS round trip
    assert (profile.rtt, profile.jitter, profile.tls_round_trips, profile.tcp_round_trips, profile.bandwidth_bytes_per_s,
            profile.seed, profile.loss) == (0.0, 0.0, 1, 1, None, 0, 0.0)
    assert NetworkProfile(rtt=0.050, tcp_round_trips=2, tls_round_trips=0).handshake_seconds == exactly(0.100)
    assert NetworkProfile(rtt=0.050, tcp_round_trips=0, tls_round_trips=0).handshake_seconds == 0.0
    assert (RTT_RANGE.low, RTT_RANGE.high) == (0.001, 0.150)
    NetworkProfile(jitter=0.0, bandwidth_bytes_per_s=1e-9, loss=0.999)  # the edges that are allowed


# ---- delay and pipelining (virtual time) ---------------------------------------------------------


async def test_sends_arrive_as_far_apart_as_sent_and_bandwidth_adds_serialization_time_in_order(autojump_clock: trio.testing.MockClock) -> None:
    arrivals: list[tuple[float, bytes]] = []
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
        t0 = trio.current_time()

        async def sender() -> None:
            await client.send_all(b"a")
            await trio.sleep(0.010)
            await client.send_all(b"b")
            assert trio.current_time() - t0 == exactly(0.010)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            for _ in range(2):
                data = await server.receive_some()
                arrivals.append((trio.current_time() - t0, bytes(data)))
    assert arrivals == [(exactly(0.020), b"a"), (exactly(0.030), b"b")]
    profile = NetworkProfile(rtt=0.020, bandwidth_bytes_per_s=1_000_000)
    arrivals: list[tuple[float, int]] = []
    async with open_emulated_pair(profile) as (client, server):
        t0 = trio.current_time()
        await client.send_all(b"x" * 10_000)  # 10 ms on the wire
        assert trio.current_time() - t0 == exactly(0.010)
        await client.send_all(b"y" * 5_000)  # 5 ms more, queued behind the first
        assert trio.current_time() - t0 == exactly(0.015)
        for _ in range(2):
            size = len(await server.receive_some(65536))
            arrivals.append((trio.current_time() - t0, size))
    assert arrivals == [(exactly(0.020), 10_000), (exactly(0.025), 5_000)]


async def test_zero_delay_forwards_directly_counts_bytes_and_is_the_default(autojump_clock: trio.testing.MockClock) -> None:
    async with open_emulated_pair(LOOPBACK) as (client, server):
        t0 = trio.current_time()
        await client.send_all(b"hello")
        assert (await server.receive_some(), trio.current_time()) == (b"hello", t0)
        assert (client.bytes_sent, server.bytes_received) == (5, 5)
    left, right = trio.testing.memory_stream_pair()
    DelayedStream(left, bandwidth_bytes_per_s=0.5)  # half a byte a second is slow, not refused
    plain = DelayedStream(left)
    assert (plain.send_delay, plain.receive_delay) == (0.0, 0.0)
    await plain.send_all(b"now")  # no delay, no jitter, no loss: no task is needed
    assert await right.receive_some() == b"now" and trio.current_time() == 0.0
    await right.send_all(b"back")
    assert await plain.receive_some(3) == b"bac" and trio.current_time() == 0.0  # a direct read honours max_bytes


async def test_one_stream_delays_both_directions(autojump_clock: trio.testing.MockClock) -> None:
    """The real-socket arrangement, in memory: only the client end is wrapped, delaying both ways."""
    client_raw, server = trio.testing.memory_stream_pair()
    async with open_delayed_stream(client_raw, RTT / 2, receive_delay=RTT / 2) as client:
        t0 = trio.current_time()
        await client.send_all(b"ping")
        assert (await server.receive_some(), trio.current_time() - t0) == (b"ping", exactly(RTT / 2))
        await server.send_all(b"pong")
        assert await client.receive_some(2) == b"po"  # max_bytes is honoured; the rest waits
        assert (await client.receive_some(2), trio.current_time() - t0) == (b"ng", exactly(RTT))
        await server.send_eof()
        assert (await client.receive_some(), trio.current_time() - t0) == (b"", exactly(RTT + RTT / 2))
        assert await client.receive_some() == b""  # end of stream stays ended


# ---- handshake -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("tls_round_trips", "round_trips"), [(0, 1), (1, 2), (2, 3)])
async def test_connect_handshake_costs_tcp_plus_tls_round_trips(autojump_clock: trio.testing.MockClock, tls_round_trips: int,
                                                                 round_trips: int) -> None:
    profile = NetworkProfile(rtt=RTT, tls_round_trips=tls_round_trips)
    t0 = trio.current_time()
    await connect_handshake(profile)
    assert trio.current_time() - t0 == exactly(round_trips * RTT)


# ---- end of stream and closing -------------------------------------------------------------------


async def test_send_eof_after_data(autojump_clock: trio.testing.MockClock) -> None:
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
        t0 = trio.current_time()
        await client.send_all(b"abc")
        await trio.sleep(0.005)
        await client.send_all(b"def")
        await client.send_eof()
        await client.send_eof()  # a second call is harmless
        with pytest.raises(trio.ClosedResourceError):
            await client.send_all(b"late")
        assert (await receive_exactly(server, 6), await server.receive_some()) == (b"abcdef", b"")
        assert trio.current_time() - t0 == exactly(0.005 + RTT / 2)
        # The other direction still works.
        await server.send_all(b"reply")
        assert await client.receive_some() == b"reply"


async def test_aclose_ends_tasks_and_counts_bytes(autojump_clock: trio.testing.MockClock) -> None:
    nurseries_before = list(trio.lowlevel.current_task().child_nurseries)  # pytest-trio's own
    async with trio.open_nursery() as nursery:
        async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
            t0 = trio.current_time()
            await client.send_all(b"12345")
            await client.send_all(bytearray(b"678"))
            assert await receive_exactly(server, 8) == b"12345678"
            await server.send_all(memoryview(b"ok"))
            assert await client.receive_some() == b"ok"
            await client.aclose()
            await client.aclose()  # idempotent
            assert await server.receive_some() == b""
            with pytest.raises(trio.ClosedResourceError):
                await client.send_all(b"x")
            with pytest.raises(trio.ClosedResourceError):
                await client.receive_some()
            assert trio.current_time() - t0 == exactly(RTT + RTT / 2)  # the close took rtt/2 too
            await server.aclose()
        # Leaving the context waited for the server's close to reach the (closed) client end.
        assert trio.current_time() - t0 == exactly(2 * RTT)
        assert (client.bytes_sent, client.bytes_received, server.bytes_sent, server.bytes_received) == (8, 2, 2, 8)
        # No task or nursery of the emulator is left behind.
        assert nursery.child_tasks == frozenset() and trio.lowlevel.current_task().child_nurseries == [*nurseries_before, nursery]


async def test_a_graceful_close_still_delivers_data_in_flight_and_a_forceful_one_drops_it(autojump_clock: trio.testing.MockClock) -> None:
    """Like close() on a TCP socket: a server may send its response and close at once."""
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
        t0 = trio.current_time()
        await server.send_all(b"response")
        await server.aclose()
        assert trio.current_time() == t0  # prompt
        assert (await client.receive_some(), await client.receive_some()) == (b"response", b"")
        assert trio.current_time() - t0 == exactly(RTT / 2)
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
        t0 = trio.current_time()
        await server.send_all(b"response")
        await trio.aclose_forcefully(server)
        assert (await client.receive_some(), trio.current_time(), server.bytes_sent) == (b"", t0, 8)


async def test_aclose_wakes_a_blocked_reader_and_the_bodys_exception_is_not_wrapped(autojump_clock: trio.testing.MockClock) -> None:
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):

        async def reader() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await server.receive_some()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            await server.aclose()
    with pytest.raises(KeyError):  # an exception of the body is not wrapped
        async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, _server):
            await client.send_all(b"x")
            raise KeyError("boom")


# ---- the delayed stream's refusals, lifecycle and seeds ------------------------------------------


def test_a_directions_chunks_arrive_in_order_late_by_the_delay_a_jitter_and_a_resend_each_from_its_seed() -> None:
    def arrivals(delay: float, jitter: float, loss: float) -> Arrivals:
        return Arrivals(delay, jitter, loss, jitter_seed="j", loss_seed="l")

    assert [arrivals(*p).delays for p in ((0.0, 0.0, 0.0), (0.1, 0.0, 0.0), (0.0, 0.1, 0.0), (0.0, 0.0, 0.1))] == [False, True, True, True]
    assert arrivals(0.0, 0.0, 0.0).next(2.0) == 2.0
    jittered, jitter_draws = arrivals(0.01, 0.002, 0.0), random.Random("j")
    assert jittered.next(1.0) == 1.0 + 0.01 + jitter_draws.expovariate(1 / 0.002)
    assert jittered.next(0.0) == jittered.last > 1.0  # never before the chunk sent before it
    lossy, loss_draws = arrivals(0.01, 0.0, 0.5), random.Random("l")
    assert lossy.next(5.0, can_be_lost=False) == 5.01  # an end of stream from the far end: no loss, and no draw
    late = [round(lossy.next(10.0 + i) - (10.0 + i), 9) for i in range(20)]
    assert late == [round(0.01 + (RETRANSMIT_TIMEOUT_SECONDS if loss_draws.random() < 0.5 else 0.0), 9) for _ in range(20)]
    assert set(late) == {0.01, 0.21}


def whole(message: str) -> str:
    return rf"^{re.escape(message)}\Z"  # the whole message: `$` would also match before a final newline


DELAYED = functools.partial(DelayedStream, trio.testing.MemorySendStream())


@pytest.mark.parametrize(("make", "kwargs", "message"), [
    (DELAYED, {"send_delay": -1.0}, "send_delay must be a finite number >= 0, got -1.0"),
    (DELAYED, {"receive_delay": math.inf}, "receive_delay must be a finite number >= 0, got inf"),
    (DELAYED, {"send_jitter": -0.5}, "send_jitter must be a finite number >= 0, got -0.5"),
    (DELAYED, {"receive_jitter": math.nan}, "receive_jitter must be a finite number >= 0, got nan"),
    (DELAYED, {"bandwidth_bytes_per_s": 0}, "bandwidth_bytes_per_s must be None or > 0, got 0"),
    (DELAYED, {"bandwidth_bytes_per_s": math.inf}, "bandwidth_bytes_per_s must be None or > 0, got inf"),
    (DELAYED, {"loss": 1.0}, "loss must be in [0, 1), got 1.0"),
    (DELAYED, {"receive_loss": -0.1}, "receive_loss must be in [0, 1), got -0.1"),
    (DELAYED, {"receive_loss": 1.0}, "receive_loss must be in [0, 1), got 1.0"),
    (NetworkProfile, {"rtt": -0.001}, "rtt must be a finite number >= 0, got -0.001"),
    (NetworkProfile, {"jitter": math.inf}, "jitter must be a finite number >= 0, got inf"),
    (NetworkProfile, {"jitter": math.nan}, "jitter must be a finite number >= 0, got nan"),
    (NetworkProfile, {"bandwidth_bytes_per_s": 0.0}, "bandwidth_bytes_per_s must be None or a finite number > 0, got 0.0"),
    (NetworkProfile, {"bandwidth_bytes_per_s": math.inf}, "bandwidth_bytes_per_s must be None or a finite number > 0, got inf"),
    (NetworkProfile, {"bandwidth_bytes_per_s": -5.0}, "bandwidth_bytes_per_s must be None or a finite number > 0, got -5.0"),
    (NetworkProfile, {"tcp_round_trips": -1}, "'tcp_round_trips' must be >= 0: -1"),
    (NetworkProfile, {"tls_round_trips": -1}, "'tls_round_trips' must be >= 0: -1"),
    (NetworkProfile, {"loss": -0.1}, "'loss' must be >= 0.0: -0.1"), (NetworkProfile, {"loss": 1.0}, "'loss' must be < 1.0: 1.0"),
])
def test_a_delayed_stream_and_a_profile_name_the_value_they_refuse(make, kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=whole(message)):
        make(**kwargs)


async def test_a_delayed_stream_refuses_each_call_out_of_its_lifecycle_with_its_reason(autojump_clock: trio.testing.MockClock) -> None:
    left, _right = trio.testing.memory_stream_pair()
    with pytest.raises(RuntimeError, match=whole("a delayed DelayedStream must be opened with open_delayed_stream()")):
        await DelayedStream(left, send_delay=0.01).send_all(b"x")
    twice = DelayedStream(left, send_delay=0.01)
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match=whole("DelayedStream already started"))):
        async with run_delivery(twice, twice):
            pass
    async with open_delayed_stream(left, 0.01) as stream:
        await stream.send_eof()
        with pytest.raises(trio.ClosedResourceError, match=whole("send_eof() was called; can't send any more")):
            await stream.send_all(b"x")
        with pytest.raises(ValueError, match=whole("max_bytes must be >= 1")):
            await stream.receive_some(0)
        await stream.aclose()
        for call in (stream.send_all(b"x"), stream.send_eof(), stream.wait_send_all_might_not_block(), stream.receive_some()):
            with pytest.raises(trio.ClosedResourceError, match=whole("stream is closed")):
                await call
    with pytest.raises(TypeError, match=whole("MemoryReceiveStream can't send_eof")):
        await DelayedStream(trio.testing.MemoryReceiveStream()).send_eof()


async def test_a_second_sender_or_reader_is_refused_by_name(autojump_clock: trio.testing.MockClock) -> None:
    left, _right = trio.testing.memory_stream_pair()
    async with open_delayed_stream(left, 0.01, bandwidth_bytes_per_s=100.0) as stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, b"x" * 100)  # one second on the wire
            await trio.testing.wait_all_tasks_blocked()
            for call in (stream.send_all, stream.send_eof, stream.wait_send_all_might_not_block):
                with pytest.raises(trio.BusyResourceError, match=whole("another task is sending on this stream")):
                    await (call(b"y") if call == stream.send_all else call())
            nursery.start_soon(stream.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError, match=whole("another task is receiving on this stream")):
                await stream.receive_some()
            nursery.cancel_scope.cancel()
    # A sender waiting on an undelayed inner stream is refused by the wrapper itself, not by the inner stream's check.
    left, _right = trio.testing.lockstep_stream_pair()
    stream = DelayedStream(left)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.wait_send_all_might_not_block)  # waits for a reader on the other end
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError, match=whole("another task is sending on this stream")):
            await stream.send_all(b"x")
        nursery.cancel_scope.cancel()


async def reset() -> None:
    """A peer that reset the connection: every read or write of the stream it hooks fails."""
    raise trio.BrokenResourceError("connection reset")


async def test_a_broken_link_fails_reads_after_their_delay_and_later_sends_with_its_message(autojump_clock: trio.testing.MockClock) -> None:
    async with open_delayed_stream(trio.testing.MemoryReceiveStream(reset), 0.0, receive_delay=0.25) as stream:
        with pytest.raises(trio.BrokenResourceError, match=whole("the link failed")) as broken:
            await stream.receive_some()
        assert trio.current_time() == 0.25
        assert type(broken.value.__cause__) is trio.BrokenResourceError and str(broken.value.__cause__) == "connection reset"
    async with open_emulated_pair(NetworkProfile(rtt=RTT)) as (client, server):
        await trio.aclose_forcefully(server)
        await client.send_all(b"into the void")  # queued: the sender can't know yet
        await trio.sleep(RTT)
        with pytest.raises(trio.BrokenResourceError, match=whole("the link failed")):
            await client.send_all(b"again")


async def test_each_direction_draws_its_jitter_and_loss_from_seeds_of_its_own(autojump_clock: trio.testing.MockClock) -> None:
    left, right = trio.testing.memory_stream_pair()
    draws = {name: random.Random(f"netem:3:{name}") for name in ("send", "loss", "receive", "receive-loss")}

    def resent(name: str) -> float:
        return RETRANSMIT_TIMEOUT_SECONDS if draws[name].random() < 0.5 else 0.0

    async with open_delayed_stream(left, 0.05, jitter=0.01, seed=3, receive_delay=0.02, receive_jitter=0.03, loss=0.5,
                                   receive_loss=0.5) as stream:
        for n in range(4):
            start = trio.current_time()
            await stream.send_all(b"")  # nothing to send: no draw
            await stream.send_all(b"out")
            assert await right.receive_some() == b"out"
            assert trio.current_time() == exactly(start + 0.05 + draws["send"].expovariate(1 / 0.01) + resent("loss")), n
            sent_at = trio.current_time()
            await right.send_all(b"in")
            assert await stream.receive_some() == b"in"
            assert trio.current_time() == exactly(sent_at + 0.02 + draws["receive"].expovariate(1 / 0.03) + resent("receive-loss")), n
        sent_at = trio.current_time()
        await right.send_eof()  # an end of stream is never lost (and draws no loss): only its delay and jitter
        assert await stream.receive_some() == b""
        assert trio.current_time() == exactly(sent_at + 0.02 + draws["receive"].expovariate(1 / 0.03))


# ---- trio's generic stream contract (real time, millisecond delays) ------------------------------


@pytest.mark.parametrize("profile", [
    NetworkProfile(rtt=0.002), NetworkProfile(rtt=0.002, jitter=0.001, bandwidth_bytes_per_s=2e9, seed=3), LOOPBACK,
    None,  # one side delayed both ways
], ids=["pair", "pair_jitter_bandwidth", "loopback", "one_side_both_ways"])
async def test_trio_half_closeable_stream_contract(profile: NetworkProfile | None) -> None:
    async with contextlib.AsyncExitStack() as stack:

        async def make() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
            if profile is not None:
                return await stack.enter_async_context(open_emulated_pair(profile))
            left, right = trio.testing.memory_stream_pair()
            delays = {"jitter": 0.0005, "receive_delay": 0.001, "receive_jitter": 0.0005}
            return await stack.enter_async_context(open_delayed_stream(left, 0.001, **delays)), right

        await trio.testing.check_half_closeable_stream(make, None)


# ---- real sockets (real time) --------------------------------------------------------------------


async def test_real_loopback_echo_takes_one_rtt(nursery: trio.Nursery) -> None:
    async def echo(stream: trio.SocketStream) -> None:
        async for data in stream:
            await stream.send_all(data)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    profile = NetworkProfile(rtt=RTT, tls_round_trips=0)
    t_connect = trio.current_time()
    async with open_emulated_tcp("127.0.0.1", port, profile) as stream:
        assert trio.current_time() - t_connect >= profile.handshake_seconds
        t0 = trio.current_time()
        await stream.send_all(b"ping")
        assert await receive_exactly(stream, 4) == b"ping"
        elapsed = trio.current_time() - t0
        assert (stream.bytes_sent, stream.bytes_received) == (4, 4)
    # A lower bound only: the emulated delay is a sleep of at least one RTT; how much longer real
    # time takes depends on the machine's load (printed, not bounded).
    assert RTT <= elapsed
    print(f"loopback echo: {1000 * elapsed:.1f} ms for a {1000 * RTT:g} ms RTT")
    nursery.cancel_scope.cancel()


# ---- the emulated links' seeds and parameters ----------------------------------------------------

LOSSY = NetworkProfile(rtt=0.020, jitter=0.003, bandwidth_bytes_per_s=100_000.0, seed=5, loss=0.3)
LOSSY_DELAYS = {"send_delay": 0.010, "send_jitter": 0.003, "bandwidth_bytes_per_s": 100_000.0, "loss": 0.3}  # one direction's


async def arrivals(send_end: trio.abc.SendStream, receive_end: trio.abc.ReceiveStream, n: int = 30) -> list[tuple[float, bytes]]:
    """Sends n small chunks 1 ms apart; when each read returned, and what."""
    t0, seen = trio.current_time(), []
    async with trio.open_nursery() as nursery:

        async def sender() -> None:
            for i in range(n):
                await send_end.send_all(b"<%02d>" % i)
                await trio.sleep(0.001)

        nursery.start_soon(sender)
        total = 0
        while total < 4 * n:
            data = await receive_end.receive_some()
            total += len(data)
            seen.append((round(trio.current_time() - t0, 9), bytes(data)))
    return seen


async def reference_arrivals(seed: int, **delays: float) -> list[tuple[float, bytes]]:
    """The same chunks through one DelayedStream with `seed` and `delays` on its sending end."""
    raw_send, raw_receive = trio.testing.memory_stream_pair()
    stream = DelayedStream(raw_send, seed=seed, **delays)
    async with run_delivery(stream):
        return await arrivals(stream, raw_receive)


async def test_an_emulated_pair_delays_each_direction_with_its_own_seed(autojump_clock: trio.testing.MockClock) -> None:
    async with open_emulated_pair(LOSSY) as (client, server):
        upload = await arrivals(client, server)
        download = await arrivals(server, client)
    assert upload == await reference_arrivals(5, **LOSSY_DELAYS)  # the client's sends: the profile's seed
    assert download == await reference_arrivals(6, **LOSSY_DELAYS)  # the server's: the next seed
    assert upload != download
    sent = b"".join(b"<%02d>" % i for i in range(30))
    assert b"".join(data for _, data in upload) == b"".join(data for _, data in download) == sent  # jitter and loss never reorder
    assert max(t - 0.001 * int(data[1:3]) for t, data in upload) > 0.2  # a lost chunk waited for its resend


@pytest.fixture
def opened_tcp(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, trio.abc.Stream]]:
    """trio.open_tcp_stream replaced by memory streams: (host, port, the server's end) of each connection opened."""
    opened: list[tuple[str, int, trio.abc.Stream]] = []

    async def open_tcp_stream(host: str, port: int) -> trio.abc.Stream:
        client_end, server_end = trio.testing.memory_stream_pair()
        opened.append((host, port, server_end))
        return client_end

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
    return opened


async def test_an_emulated_tcp_connection_pays_the_handshake_and_delays_and_loses_in_both_directions(
    autojump_clock: trio.testing.MockClock, opened_tcp: list[tuple[str, int, trio.abc.Stream]],
) -> None:
    """What the wrapper adds is the profile's; only the client end is wrapped, so it carries the download's delays too."""
    opened = opened_tcp
    profile = attrs.evolve(LOSSY, tls_round_trips=2)
    t0 = trio.current_time()
    async with open_emulated_tcp("server.example", 443, profile) as stream:
        assert trio.current_time() - t0 == exactly(3 * 0.020)
        ((host, port, server_end),) = opened
        assert (host, port) == ("server.example", 443)
        upload = await arrivals(stream, server_end)
        download = await arrivals(server_end, stream)
    assert upload == await reference_arrivals(5, **LOSSY_DELAYS)
    raw_send, raw_receive = trio.testing.memory_stream_pair()
    async with open_delayed_stream(raw_receive, 0.0, seed=5, receive_delay=0.010, receive_jitter=0.003,
                                   receive_loss=0.3) as receiving:
        assert download == await arrivals(raw_send, receiving)
    assert not any(t == exactly(0.010 + 0.001 * int(data[1:3])) for t, data in download[1:])  # jittered
    for direction in (upload, download):  # in each, a lost chunk waited for its resend
        assert max(t - 0.001 * int(data[1:3]) for t, data in direction) > 0.2


async def test_an_emulated_tcp_connection_cut_short_in_its_handshake_closes_the_socket(
    autojump_clock: trio.testing.MockClock, opened_tcp: list[tuple[str, int, trio.abc.Stream]],
) -> None:
    entered = False
    with trio.move_on_after(0.050) as scope:
        async with open_emulated_tcp("h", 1, NetworkProfile(rtt=0.040)):
            entered = True
    assert scope.cancelled_caught and not entered
    assert await opened_tcp[0][2].receive_some() == b""  # the socket was closed at once
    assert trio.current_time() == exactly(0.050)


# ---- links that break (prototype/netem/faults.py) ------------------------------------------------


def test_link_faults_are_none_by_default_refuse_impossible_rates_and_break_on_a_chunk_drawn_from_their_seed() -> None:
    assert faults.NO_FAULTS == faults.LinkFaults(0.0, 0.0, 0) and not faults.NO_FAULTS.any
    assert faults.LinkFaults(drops_per_hour=0.5).any and faults.LinkFaults(drop_per_server_chunk=0.5).any
    faults.LinkFaults(drop_per_server_chunk=0.0, drops_per_hour=0.0)
    for kwargs in ({"drops_per_hour": -1.0}, {"drop_per_server_chunk": -0.1}, {"drop_per_server_chunk": 1.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            faults.LinkFaults(**kwargs)
    chunky = faults.LinkFaults(drop_per_server_chunk=0.05, seed=3)
    counts = [chunks_until_broken(faults.Link(chunky, serial)) for serial in range(40)]
    assert counts == [chunks_until_broken(faults.Link(chunky, serial)) for serial in range(40)]  # repeatable
    assert counts != [chunks_until_broken(faults.Link(attrs.evolve(chunky, seed=4), serial)) for serial in range(40)]
    assert len(set(counts)) > 10 and min(counts) >= 1
    assert 10 < sum(counts) / len(counts) < 40  # a geometric count of mean 1 / 0.05
    link = faults.Link(chunky, 0)
    chunks_until_broken(link)
    assert (link.broken, link.reason, chunks_until_broken(faults.Link(faults.NO_FAULTS))) == (True, "mid-response drop", 0)


def chunks_until_broken(link: faults.Link, limit: int = 10_000) -> int:
    for sent in range(1, limit + 1):
        link.server_chunk_sent()
        if link.broken:
            return sent
    return 0


async def test_a_timed_drop_cuts_the_link_at_its_poisson_draw(autojump_clock: trio.testing.MockClock) -> None:
    timed = faults.LinkFaults(drops_per_hour=7200.0, drop_per_server_chunk=0.0, seed=9)
    link = faults.Link(timed, 2)
    for _ in range(5):
        link.server_chunk_sent()  # a rate of 0 draws nothing: the drop's draw is the generator's first
    t0 = trio.current_time()
    await link.run_timed_drop()
    # Connection n of seed s draws from its own generator (see Link); 7200 drops an hour is 2 a second.
    assert trio.current_time() - t0 == exactly(random.Random("linkfaults:9:2").expovariate(2.0))
    assert (link.broken, link.reason) == (True, "timed drop")
    slow = faults.Link(faults.LinkFaults(drops_per_hour=0.5, seed=9), 2)  # under one drop an hour still drops
    t1 = trio.current_time()
    await slow.run_timed_drop()
    assert trio.current_time() - t1 == exactly(random.Random("linkfaults:9:2").expovariate(0.5 / 3600)) and slow.broken
    t0 = trio.current_time() - random.Random("linkfaults:9:2").expovariate(2.0)
    never = faults.Link(faults.LinkFaults(drop_per_server_chunk=0.5))
    await never.run_timed_drop()
    assert trio.current_time() - t0 == exactly(random.Random("linkfaults:9:2").expovariate(2.0)) and not never.broken


async def test_a_cut_is_final_and_wakes_reads_and_waiters(autojump_clock: trio.testing.MockClock) -> None:
    link = faults.Link()
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = faults.FaultyStream(client_raw, link, server_side=False)
    woken: list[str] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            with pytest.raises(trio.BrokenResourceError) as broke:
                await client.receive_some()
            woken.append(str(broke.value))

        async def wait() -> None:
            await link.wait_broken()
            woken.append("waiter")

        nursery.start_soon(read)
        nursery.start_soon(wait)
        await trio.sleep(1.0)
        assert woken == [] and len(link.reads) == 1
        link.cut("restart")
        link.cut("later")  # a second cut changes nothing
    assert sorted(woken) == ["the link broke (restart)", "waiter"] and link.reads == set()
    assert (link.broken, link.reason, trio.current_time()) == (True, "restart", exactly(1.0))
    for call in (client.send_all(b"x"), client.send_eof(), client.wait_send_all_might_not_block(), client.receive_some()):
        with pytest.raises(trio.BrokenResourceError, match=r"^the link broke \(restart\)$"):
            await call
    await client.aclose()  # closing a broken end still closes what it wraps
    with pytest.raises(trio.ClosedResourceError):
        await client_raw.send_all(b"x")


async def test_a_faulty_stream_passes_everything_through_until_the_link_breaks(autojump_clock: trio.testing.MockClock) -> None:
    link = faults.Link()
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = faults.FaultyStream(client_raw, link, server_side=False)
    server = faults.FaultyStream(server_raw, link, server_side=True)
    await client.send_all(b"request")
    assert await server.receive_some(3) == b"req"
    await server.wait_send_all_might_not_block()
    await server.send_all(b"response")
    await server.send_eof()
    assert (await client.receive_some(), await client.receive_some()) == (b"response", b"")


async def test_a_chunk_that_breaks_the_link_is_never_delivered_and_a_counting_client_breaks_on_arrival(autojump_clock: trio.testing.MockClock) -> None:
    link = faults.Link(faults.LinkFaults(drop_per_server_chunk=0.999))
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = faults.FaultyStream(client_raw, link, server_side=False)
    server = faults.FaultyStream(server_raw, link, server_side=True)
    await client.send_all(b"")
    await client.send_all(b"request")  # the client's chunks never break it
    assert not link.broken
    await server.send_all(b"")  # nor does an empty send
    assert not link.broken
    with pytest.raises(trio.BrokenResourceError, match="mid-response drop"):
        await server.send_all(b"response")
    with trio.move_on_after(1.0):
        assert await client_raw.receive_some() != b"response"
    assert trio.current_time() == exactly(1.0)  # nothing was sent
    link = faults.Link(faults.LinkFaults(drop_per_server_chunk=0.999))
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = faults.FaultyStream(client_raw, link, server_side=False, client_counts=True)
    await client.send_all(b"request")
    assert not link.broken
    await server_raw.send_all(b"response")
    with pytest.raises(trio.BrokenResourceError, match="mid-response drop"):
        await client.receive_some()
    uncounted = faults.Link(faults.LinkFaults(drop_per_server_chunk=0.999))
    plain = faults.FaultyStream(server_raw, uncounted, server_side=False)
    assert await plain.receive_some() == b"request" and not uncounted.broken


async def test_a_registry_numbers_its_links_a_restart_cuts_them_and_a_faulty_pair_leaves_it_on_exit(autojump_clock: trio.testing.MockClock) -> None:
    registry = faults.LinkRegistry()
    seeded = faults.LinkFaults(seed=1)
    first, second, third = (registry.new(seeded) for _ in range(3))
    assert [link.serial for link in (first, second, third)] == [0, 1, 2] and registry.opened == 3
    assert registry.links == {first, second, third} and first.faults is seeded
    second.cut("timed drop")
    assert registry.cut_all("restart") == 2
    assert [link.reason for link in (first, second, third)] == ["restart", "timed drop", "restart"]
    assert registry.cut_all("restart") == 0
    registry = faults.LinkRegistry()
    link = registry.new(faults.LinkFaults(drops_per_hour=3600.0, seed=2))
    client_raw, server_raw = trio.testing.memory_stream_pair()
    async with faults.open_faulty_pair(client_raw, server_raw, link, registry) as (client, server):
        assert (client.server_side, server.server_side) == (False, True)
        assert (client.client_counts, server.client_counts, client.link, server.link) == (False, False, link, link)
        await link.wait_broken()
        assert link.reason == "timed drop" and registry.links == {link}
    assert registry.links == set()
    quiet = registry.new(faults.NO_FAULTS)
    async with faults.open_faulty_pair(client_raw, server_raw, quiet):
        await trio.sleep(3600.0)
    assert not quiet.broken and registry.links == {quiet}  # no registry given: left as it was


async def test_a_send_eof_in_progress_refuses_other_senders_until_it_returns() -> None:
    class EofWaitsForTheReader(trio.abc.HalfCloseableStream):
        def __init__(self) -> None:
            self.reader_ready = trio.Event()

        async def send_eof(self) -> None:
            await self.reader_ready.wait()

        async def send_all(self, data: bytes) -> None: ...
        async def wait_send_all_might_not_block(self) -> None: ...
        async def receive_some(self, max_bytes: int | None = None) -> bytes: ...
        async def aclose(self) -> None: ...

    inner = EofWaitsForTheReader()
    stream = DelayedStream(inner)  # undelayed: its send_eof is the inner stream's
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_eof)
        await trio.testing.wait_all_tasks_blocked()
        for call in (stream.send_all, stream.send_eof, stream.wait_send_all_might_not_block):
            with pytest.raises(trio.BusyResourceError, match=whole("another task is sending on this stream")):
                await (call(b"y") if call == stream.send_all else call())
        inner.reader_ready.set()
    await stream.send_eof()  # free again once it returned: a second one does nothing
    with pytest.raises(trio.ClosedResourceError, match=whole("send_eof() was called; can't send any more")):
        await stream.send_all(b"z")


async def test_closing_a_stream_whose_link_broke_closes_the_inner_stream_at_once(autojump_clock: trio.testing.MockClock) -> None:
    closed: list[float] = []
    inner = trio.testing.MemorySendStream(send_all_hook=reset, close_hook=lambda: closed.append(trio.current_time()))
    async with open_delayed_stream(inner, 0.1) as stream:
        await stream.send_all(b"x")
        await trio.sleep(0.2)  # delivered at 0.1, where the peer had reset the connection
        await stream.aclose()
        assert closed == [0.2]
