"""A response's modeled work starts when its frame or request arrived: a decode (or the server's own work) made to take
5 ms of the autojump clock does not move its virtual times (docs/metrics.md), for a create, a v1 append and an inject,
over a zero-latency pipe and the 20 ms RTT link, for hosted subagents within their cap, and for an http request."""

from __future__ import annotations

import pytest
import trio
from support import DELAYED_LINK, create_event, function_calls, make_server, send, slowed, timed_until, ws
from test_inject import beta_ws

from prototype.client.harness import SUSPENDED
from prototype.protocol import codec

LINKS = {"pipe": None, "rtt-20ms": DELAYED_LINK}
ONE_TURN = {"testbed_workload": "fixed:1:50:10:5:0"}
TWO_TURNS = {"testbed_workload": "fixed:2:50:10:5:0"}


def one_way(link: str) -> float:
    return 0.0 if LINKS[link] is None else LINKS[link].one_way_delay


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


@pytest.fixture
def decode_takes(monkeypatch, autojump_clock):
    return slowed(monkeypatch, codec, "decode_client_event")


async def completion_after_create(link: str, decode_takes, seconds: float) -> float:
    """From a create to its response's end, each frame's decode taking `seconds` (each of these helpers sets the decode's
    time just before the frame it times, so a time left set by the one before changes nothing it measures)."""
    decode_takes(seconds)
    async with ws(make_server(), network=LINKS[link]) as conn:
        sent = trio.current_time()
        await send(conn, create_event(metadata=ONE_TURN))
        return (await timed_until(conn, "response.completed"))[-1][0] - sent


async def completion_after_append(link: str, decode_takes, seconds: float) -> float:
    async with ws(make_server(), SUSPENDED, network=LINKS[link]) as conn:
        await send(conn, create_event(metadata=TWO_TURNS))
        done = (await timed_until(conn, "response.done"))[-1][1]
        decode_takes(seconds)
        sent = trio.current_time()
        await send(conn, {"type": "response.append", "input": [output(function_calls(done["response"])[0]["call_id"])]})
        return (await timed_until(conn, "response.completed"))[-1][0] - sent


async def completion_after_inject(link: str, decode_takes, seconds: float) -> float:
    async with beta_ws(make_server(), network=LINKS[link]) as conn:
        await send(conn, create_event(metadata=TWO_TURNS, multi_agent={"enabled": True}))
        events = await timed_until(conn, "response.function_call_arguments.done")
        response_id, call_id = events[0][1]["response"]["id"], events[-1][1]["item_id"]
        await trio.sleep(1.0)  # the response waits for the call's output
        (call,) = [e["item"] for _, e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
        assert call["id"] == call_id
        decode_takes(seconds)
        sent = trio.current_time()
        await send(conn, {"type": "response.inject", "response_id": response_id, "input": [output(call["call_id"])]})
        return (await timed_until(conn, "response.completed"))[-1][0] - sent


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize(("completion", "modeled"), [(completion_after_create, 0.0215333), (completion_after_append, 0.015601),
                                                     (completion_after_inject, None)], ids=["create", "v1 append", "inject"])
async def test_a_response_or_its_resumed_segment_is_modeled_from_its_frames_arrival_not_from_its_decode(
        autojump_clock, decode_takes, link: str, completion, modeled: float | None) -> None:
    instant = await completion(link, decode_takes, 0.0)
    slow = await completion(link, decode_takes, 0.005)  # shorter than the response's modeled time
    assert slow == pytest.approx(instant, abs=1e-9)
    if modeled is None:  # a response resumed by an inject: its segment outlasts the 5 ms decode
        assert instant > 0.005 + 2 * one_way(link)
    else:
        assert instant == pytest.approx(modeled + 2 * one_way(link), abs=1e-6)


@pytest.mark.parametrize("stream", [True, False])
async def test_an_http_response_is_modeled_from_its_requests_arrival_not_from_the_servers_own_work(autojump_clock, nursery, monkeypatch,
                                                                                                    stream: bool) -> None:
    """The server's own work once the request is read (its client record's fields) is absorbed as a frame's decode is."""
    from test_http import create, open_client

    from prototype import metrics

    work_takes = slowed(monkeypatch, metrics, "protocol_choices")
    took = []
    for seconds in (0.0, 0.005):
        work_takes(seconds)
        client = open_client(nursery, make_server())
        sent = trio.current_time()
        assert (await client.request(body=create(stream=stream))).status == 200
        took.append(trio.current_time() - sent)
    assert took[1] == pytest.approx(took[0], abs=1e-9) and took[0] > 0.005


async def completion_of_subagents(decode_takes, seconds: float) -> float:
    decode_takes(seconds)
    async with beta_ws(make_server()) as conn:
        sent = trio.current_time()
        await send(conn, create_event(metadata={**ONE_TURN, "testbed_subagents": "2"},
                                      multi_agent={"enabled": True, "max_concurrent_subagents": 2}))
        return (await timed_until(conn, "response.completed"))[-1][0] - sent


async def test_hosted_subagents_within_the_cap_are_modeled_from_the_frames_arrival(autojump_clock, decode_takes) -> None:
    instant = await completion_of_subagents(decode_takes, 0.0)
    slow = await completion_of_subagents(decode_takes, 0.005)
    assert slow == pytest.approx(instant, abs=1e-9) and instant > 0.005
