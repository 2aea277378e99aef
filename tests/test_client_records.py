"""The server's client records (docs/metrics.md): one per response, whatever its outcome, and one per request or frame
refused before it ran, over HTTP and WebSocket: its client, times, bytes, outcome, usage and phases."""

from __future__ import annotations

import json

import h11
import pytest
import trio
import trio.testing
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, timed_until, until, ws
from test_http import WAIT, create, open_client, sse_events
from test_lanes import frame_bytes

from prototype.client.harness import SUSPENDED

ONE_TURN = {"testbed_workload": "fixed:1:100:10:300"}  # the final answer: 300 tokens, 0.3 s at sim-1000
LONG = {"testbed_workload": "fixed:1:50:10:400:0"}  # one turn of 400 output tokens: 4 s at sim-100
LANE = "agent"


async def test_a_refused_create_is_in_the_records_and_each_http_connection_has_its_serial_number(autojump_clock, nursery) -> None:
    server = make_server()
    first, second = open_client(nursery, server), open_client(nursery, server)
    await trio.sleep(2.0)
    await first.request(body=create(), content_type="text/plain", headers=[("user-agent", "probe/1")])
    await first.request(body=create(), auth=None)
    common = {"transport": "http", "design": "http", "connection": 1, "at_s": 2.0, "response_id": None, "timing_requested": False}
    assert list(server.records) == [{"user_agent": "probe/1", **common, "outcome": "error:unsupported_media_type", "status": 415},
                                    {"user_agent": "", **common, "outcome": "error:invalid_api_key", "status": 401}]
    for client in (first, first, second, first):
        assert (await client.request(body=create())).status == 200
    assert ([record["connection"] for record in server.records][2:], server.connections_opened) == ([1, 1, 2, 1], 2)


async def test_a_served_create_or_stream_is_in_the_records_with_its_phases(autojump_clock, nursery) -> None:
    server = make_server()
    client = open_client(nursery, server)
    await trio.sleep(1.0)
    data = create(store=True)
    first = (await client.request(body=data, headers=[("user-agent", "probe/2")])).json()
    chained = create(previous_response_id=first["id"], input=[])
    timed = await client.request(body=chained, headers=[("x-responsesapi-include-timing-metrics", "TRUE")])
    assert "testbed_timing" in timed.json() and "testbed_timing" not in first
    records = list(server.records)
    assert [(r["design"], r["transport"], r["user_agent"], r["connection"], r["request_bytes"], r["response_id"], r["outcome"],
             r["timing_requested"], r["started_at_s"]) for r in records] == [
        ("http-stateless", "http", "probe/2", 1, len(data), first["id"], "completed", False, 1.0),
        ("http-stored", "http", "", 1, len(chained), timed.json()["id"], "completed", True, records[0]["at_s"])]
    assert records[0]["usage"] == first["usage"] and records[0]["at_s"] > 1.0
    phases = timed.json()["testbed_timing"]["phases_ms"]
    assert {k: v for k, v in records[1]["phases_ms"].items() if k in phases} == {k: round(v, 3) for k, v in phases.items() if k in records[1]["phases_ms"]}
    assert records[1]["phases_ms"] and all(round(v, 3) == v for v in records[1]["phases_ms"].values())
    # A timed stream carries its timing, and its record its phases.
    plain = sse_events(await client.request(body=create(stream=True)))
    timed = sse_events(await client.request(body=create(stream=True), headers=[("x-responsesapi-include-timing-metrics", "true")]))
    assert "testbed_timing" not in plain[-1]["response"]
    phases = timed[-1]["response"]["testbed_timing"]["phases_ms"]
    await trio.testing.wait_all_tasks_blocked()  # the record is made once the stream's last chunk is written
    record = server.records[-1]
    assert record["timing_requested"] is True and record["phases_ms"]
    assert {k: round(v, 3) for k, v in phases.items() if k in record["phases_ms"]} == {
        k: v for k, v in record["phases_ms"].items() if k in phases}


async def test_a_client_that_leaves_mid_stream_ends_its_connection_without_a_record(autojump_clock, nursery) -> None:
    server = make_server()
    client, data = open_client(nursery, server), create(stream=True, model="sim-100", metadata=LONG)
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("content-length", str(len(data))), ("authorization", "Bearer k")])) + client.conn.send(h11.Data(data=data))
        + client.conn.send(h11.EndOfMessage()))
    with trio.fail_after(WAIT):
        assert (await client._next()).status_code == 200
        await trio.sleep(1.0)
        await client.stream.aclose()
        await server.until(lambda: not server.connections)
    assert (list(server.records), server.http_in_flight) == ([], set())
    assert trio.current_time() == pytest.approx(1.0107, abs=1e-4)  # the stream's first event came after the prefill


async def test_a_turn_leaves_one_record_with_its_client_its_times_its_bytes_and_its_usage(autojump_clock):
    server, event = make_server(), create_event(metadata=ONE_TURN, stream_id=LANE)
    async with ws(server, include_timing=True) as conn:
        await trio.sleep(1.5)  # the record's times are the trio clock's, not times since the connection opened
        sent_at = trio.current_time()
        await send(conn, event)
        events = await timed_until(conn, *TERMINALS, timeout=WAIT)
    ended_at, done = events[-1]
    response = done["response"]
    (record,) = server.records
    assert record == {
        "user_agent": "", "transport": "websocket", "design": "chained", "connection": 1, "model": "sim-1000",
        "context": "full", "previous_response_id": None, "warmup": False, "stream": False, "stream_id": True, "store": False,
        "input_items": 1, "input_types": {"message": 1}, "tools": len(event["tools"]), "ignored_keys": [],
        "started_at_s": sent_at, "at_s": ended_at, "response_id": response["id"], "outcome": "completed", "appends": 0,
        "request_bytes": frame_bytes(event), "timing_requested": True,
        "phases_ms": response["testbed_timing"]["phases_ms"], "usage": response["usage"]}
    assert record["phases_ms"]["decode"] == 300.0  # 300 tokens at 1000 tokens/s


async def test_a_create_that_waited_for_its_lane_is_recorded_from_its_arrival_with_its_queue_time(autojump_clock):
    server = make_server()
    first, second = create_event(metadata=ONE_TURN, stream_id=LANE), create_event(metadata=ONE_TURN, stream_id=LANE, input="and again")
    async with ws(server) as conn:
        await trio.sleep(2.0)
        sent_at = trio.current_time()
        await send(conn, first)
        await send(conn, second)  # queued behind the first on its lane
        ends = [(await timed_until(conn, *TERMINALS, timeout=WAIT))[-1] for _ in range(2)]
    (first_end, _), (second_end, _) = ends
    assert [(r["started_at_s"], r["at_s"], r["phases_ms"]["queue"], r["request_bytes"]) for r in server.records] == [
        (sent_at, first_end, 0.0, frame_bytes(first)),
        (sent_at, second_end, round((first_end - sent_at) * 1000, 3), frame_bytes(second))]
    assert first_end > sent_at


async def test_a_refused_frame_is_recorded_with_its_code_and_param(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await trio.sleep(3.0)
        await send(conn, create_event(stream_id="bad lane"))
        assert (await receive(conn, timeout=WAIT))["error"]["code"] == "invalid_stream_id"
        await trio.sleep(1.0)
        await send(conn, {"type": "response.append", "input": []})
        assert (await receive(conn, timeout=WAIT))["error"]["code"] == "unknown_event_type"
    common = {"user_agent": "", "transport": "websocket", "design": "chained", "connection": 1, "response_id": None}
    assert list(server.records) == [
        {**common, "at_s": 3.0, "outcome": "error:invalid_stream_id", "param": "stream_id", "stream_id": True},
        {**common, "at_s": 4.0, "outcome": "error:unknown_event_type", "param": "type", "stream_id": False}]


async def test_each_v1_rollout_is_recorded_with_its_appends_their_bytes_and_every_segments_phases(autojump_clock):
    """Text frames count their UTF-8 bytes, binary frames as they are; each rollout of a connection only its own."""
    server, sizes, segments, ids = make_server(), [], [], []
    async with ws(server, SUSPENDED, include_timing=True) as conn:
        for text, turns in (("répare le bogue ✓", 3), ("and the next one", 2)):
            metadata = {"testbed_workload": f"fixed:{turns}:100:10:300:0"}
            frames: list[str | bytes] = [json.dumps(create_event(text, metadata=metadata), ensure_ascii=False)]
            await send(conn, frames[0])
            segments.append([])
            for n in range(turns - 1):
                done = (await until(conn, "response.done", timeout=WAIT))[-1]["response"]
                segments[-1].append(done["testbed_timing"]["phases_ms"])
                append = json.dumps({"type": "response.append", "input": outputs_for(function_calls(done), f"{text} {n}")},
                                    ensure_ascii=False)
                frames.append(append.encode() if n == 0 else append)  # the first append a binary frame
                await send(conn, frames[-1])
            end = (await until(conn, *TERMINALS, timeout=WAIT))[-1]["response"]
            segments[-1].append(end["testbed_timing"]["phases_ms"])
            ids.append(end["id"])
            sizes.append(sum(len(frame.encode() if isinstance(frame, str) else frame) for frame in frames))
    assert [(r["design"], r["response_id"], r["outcome"], r["appends"], r["request_bytes"], r["timing_requested"])
            for r in server.records] == [
        ("suspended", ids[0], "completed", 2, sizes[0], True), ("suspended", ids[1], "completed", 1, sizes[1], True)]
    # The rollout's log: every segment's spans (each segment's timing on the wire has its own only).
    for record, spans in zip(server.records, segments):
        assert record["phases_ms"]["decode"] == sum(s["decode"] for s in spans)
        assert record["phases_ms"]["prefill"] == round(sum(s["prefill"] for s in spans), 3)
    assert server.records[1]["phases_ms"]["decode"] == 607.0
