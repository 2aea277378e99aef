"""The delayed stream (`netem/delayed.py`) held to exact messages, defaults and seeded draws: each refusal's
error and text, a broken inner stream read through a delayed direction, and each direction's jitter drawn from
its own seed. Written against the survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import random
import re

import pytest
import trio
import trio.testing

from prototype.netem.delayed import DelayedStream, open_delayed_stream, run_delivery


class BrokenInner(trio.abc.HalfCloseableStream):
    """An inner stream whose peer reset the connection: every read fails."""

    async def send_all(self, data) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("connection reset")

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class NoEof(trio.abc.Stream):
    """An inner stream that cannot half-close."""

    async def send_all(self, data) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.sleep_forever()
        return b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"send_delay": -1.0}, "send_delay must be a finite number >= 0, got -1.0"),
    ({"receive_delay": float("inf")}, "receive_delay must be a finite number >= 0, got inf"),
    ({"send_jitter": -0.5}, "send_jitter must be a finite number >= 0, got -0.5"),
    ({"receive_jitter": float("nan")}, "receive_jitter must be a finite number >= 0, got nan"),
    ({"bandwidth_bytes_per_s": 0}, "bandwidth_bytes_per_s must be None or > 0, got 0"),
    ({"bandwidth_bytes_per_s": float("inf")}, "bandwidth_bytes_per_s must be None or > 0, got inf"),
    ({"loss": 1.0}, "loss must be in [0, 1), got 1.0"),
    ({"receive_loss": -0.1}, "receive_loss must be in [0, 1), got -0.1"),
])
def test_each_bad_parameter_is_refused_by_name_and_value(kwargs, message: str) -> None:
    left, _right = trio.testing.memory_stream_pair()
    with pytest.raises(ValueError, match=exactly(message)):
        DelayedStream(left, **kwargs)


async def test_a_slow_link_is_accepted_and_the_defaults_delay_nothing(autojump_clock) -> None:
    left, right = trio.testing.memory_stream_pair()
    DelayedStream(left, bandwidth_bytes_per_s=0.5)  # half a byte a second is slow, not refused
    plain = DelayedStream(left)
    assert (plain.send_delay, plain.receive_delay) == (0.0, 0.0)
    await plain.send_all(b"now")  # no delay, no jitter, no loss: no task is needed
    assert await right.receive_some() == b"now" and trio.current_time() == 0.0


async def test_the_lifecycle_errors_say_what_went_wrong(autojump_clock) -> None:
    left, _right = trio.testing.memory_stream_pair()
    unopened = DelayedStream(left, send_delay=0.01)
    with pytest.raises(RuntimeError, match=exactly("a delayed DelayedStream must be opened with open_delayed_stream()")):
        await unopened.send_all(b"x")
    twice = DelayedStream(left, send_delay=0.01)
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match=exactly("DelayedStream already started"))):
        async with run_delivery(twice, twice):
            pass


async def test_each_refused_call_names_its_reason(autojump_clock) -> None:
    left, _right = trio.testing.memory_stream_pair()
    async with open_delayed_stream(left, 0.01) as stream:
        await stream.send_eof()
        with pytest.raises(trio.ClosedResourceError, match=exactly("send_eof() was called; can't send any more")):
            await stream.send_all(b"x")
        with pytest.raises(ValueError, match=exactly("max_bytes must be >= 1")):
            await stream.receive_some(0)
        await stream.aclose()
        for call in (stream.send_all(b"x"), stream.send_eof(), stream.wait_send_all_might_not_block(),
                     stream.receive_some()):
            with pytest.raises(trio.ClosedResourceError, match=exactly("stream is closed")):
                await call
    with pytest.raises(TypeError, match=exactly("NoEof can't send_eof")):
        await DelayedStream(NoEof()).send_eof()


async def test_a_second_sender_or_reader_is_refused_by_name(autojump_clock) -> None:
    left, _right = trio.testing.memory_stream_pair()
    async with open_delayed_stream(left, 0.01, bandwidth_bytes_per_s=100.0) as stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, b"x" * 100)  # one second on the wire
            await trio.testing.wait_all_tasks_blocked()
            for call in (stream.send_all, stream.send_eof, stream.wait_send_all_might_not_block):
                with pytest.raises(trio.BusyResourceError, match=exactly("another task is sending on this stream")):
                    await (call(b"y") if call == stream.send_all else call())
            nursery.start_soon(stream.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError, match=exactly("another task is receiving on this stream")):
                await stream.receive_some()
            nursery.cancel_scope.cancel()


async def test_a_waiting_sender_keeps_others_out(autojump_clock) -> None:
    left, right = trio.testing.lockstep_stream_pair()
    stream = DelayedStream(left)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.wait_send_all_might_not_block)  # waits for a reader on the other end
        await trio.testing.wait_all_tasks_blocked()
        # Refused by the wrapper itself, not by the inner stream's own check.
        with pytest.raises(trio.BusyResourceError, match=exactly("another task is sending on this stream")):
            await stream.send_all(b"x")
        nursery.cancel_scope.cancel()


async def test_a_broken_inner_stream_fails_the_delayed_read_after_its_delay(autojump_clock) -> None:
    async with open_delayed_stream(BrokenInner(), 0.0, receive_delay=0.25) as stream:
        with pytest.raises(trio.BrokenResourceError, match=exactly("the link failed")) as broken:
            await stream.receive_some()
        assert trio.current_time() == 0.25
        assert isinstance(broken.value.__cause__, trio.BrokenResourceError)
        assert str(broken.value.__cause__) == "connection reset"


async def test_a_broken_peer_fails_later_sends_with_the_links_message(autojump_clock) -> None:
    left, right = trio.testing.memory_stream_pair()
    async with open_delayed_stream(left, 0.01) as stream:
        await right.aclose()
        await stream.send_all(b"lost")
        await trio.sleep(0.02)
        with pytest.raises(trio.BrokenResourceError, match=exactly("the link failed")):
            await stream.send_all(b"again")


async def test_each_direction_draws_its_jitter_from_its_own_seed(autojump_clock) -> None:
    left, right = trio.testing.memory_stream_pair()
    send_draws = random.Random("netem:0:send")
    receive_draws = random.Random("netem:0:receive")
    async with open_delayed_stream(left, 0.05, jitter=0.01, receive_delay=0.02, receive_jitter=0.03) as stream:
        await stream.send_all(b"")  # nothing to send: no draw
        await stream.send_all(b"out")
        assert await right.receive_some() == b"out"
        assert trio.current_time() == pytest.approx(0.05 + send_draws.expovariate(1 / 0.01), abs=1e-12)
        sent_at = trio.current_time()
        await right.send_all(b"in")
        assert await stream.receive_some() == b"in"
        assert trio.current_time() == pytest.approx(sent_at + 0.02 + receive_draws.expovariate(1 / 0.03), abs=1e-12)
