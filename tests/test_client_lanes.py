"""Lanes from the client's side (client/lanes.py): several agents' conversations over one WebSocket, each on its own
`stream_id`; multiplexed rollouts run each task on its lane against the in-process server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from support import make_server
from test_harness import FakeWebSocket

from prototype.api.service import owner_of
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, Rollout, RolloutRecord, TurnRecord, run_websocket_rollout
from prototype.client.lanes import LANE_BUFFER, LaneChannel, Multiplexed, run_multiplexed_rollouts
from prototype.workload import fixed


def lane_rollout() -> Rollout:
    return Rollout(fixed(1, initial_prompt_tokens=10, appended_tokens=1, output_tokens=1), RolloutRecord(CHAINED, "w", 0.0))


async def test_a_lane_stamps_only_its_creates_and_counts_the_compact_bytes_it_sent(autojump_clock) -> None:
    socket = FakeWebSocket([])
    mux = Multiplexed(socket)  # type: ignore[arg-type]
    default, rollout = mux.lane(None), lane_rollout()
    agent = mux.lane("agent-1", rollout)
    await trio.sleep(1.5)
    assert await agent.send({"type": "response.create", "input": "é"}) == len('{"type":"response.create","input":"\\u00e9","stream_id":"agent-1"}')
    assert await agent.send({"type": "response.cancel", "response_id": "r"}) == len('{"type":"response.cancel","response_id":"r"}')
    assert await default.send({"type": "response.create"}) == len('{"type":"response.create"}')
    assert socket.sent == ['{"type":"response.create","input":"\\u00e9","stream_id":"agent-1"}',
                           '{"type":"response.cancel","response_id":"r"}', '{"type":"response.create"}']
    assert rollout.record.timeline == [(1.5, "send", "response.create"), (1.5, "send", "response.cancel")]
    with pytest.raises(ValueError, match=r"^lane 'agent-1' is already registered$"):
        mux.lane("agent-1")
    with pytest.raises(ValueError, match=r"^lane None is already registered$"):
        mux.lane(None)
    assert LANE_BUFFER == 100_000 and agent.events.statistics().max_buffer_size == LANE_BUFFER


async def test_the_reader_routes_by_stream_id_counts_bytes_and_closes_every_lane_at_the_end(autojump_clock) -> None:
    events = [
        {"type": "response.created", "stream_id": "agent-1", "response": {"id": "resp_a", "instructions": "é"}, "sequence_number": 0},
        {"type": "response.output_text.delta", "stream_id": "agent-1", "sequence_number": 1, "delta": "é"},
        {"type": "error", "error": {"code": "x"}},
        {"type": "response.created", "stream_id": "agent-9", "response": {"id": "resp_z"}},
        {"type": "response.completed", "stream_id": "agent-1", "response": {"id": "resp_a", "status": "completed"}}]
    texts = [json.dumps(event, ensure_ascii=False) for event in events]
    socket = FakeWebSocket([texts[0], texts[1].encode(), *texts[2:]])
    mux = Multiplexed(socket)  # type: ignore[arg-type]
    default, rollout = mux.lane(None), lane_rollout()
    rollout.start_turn([], 0)
    agent = mux.lane("agent-1", rollout)
    with trio.fail_after(60):  # on the virtual clock, a wait for ever fails at once
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mux.read)
            assert (await agent.until("response.output_text.delta"), await agent.until_pause()) == (events[:2], events[4])
            assert await default.until("never") == [events[2]]  # an error ends a wait
            assert await default.until("response.created") == [events[3]]  # an unknown lane's events go to the default lane
    sizes = [len(text.encode()) for text in texts]
    assert (rollout.record.turns[0].bytes_received, rollout.record.timeline[-1]) == (
        sizes[0] + sizes[1] + sizes[4], (0.0, "recv", "response.completed"))
    for lane in (agent, default):
        with pytest.raises(trio.EndOfChannel):
            await lane.receive()


async def test_a_lanes_wait_ends_at_a_pause_or_at_an_error() -> None:
    for end in ["response.done", "response.failed", "error"]:
        send_channel, receive_channel = trio.open_memory_channel[tuple[dict[str, Any], int]](10)
        lane = LaneChannel(None, "a", receive_channel)  # type: ignore[arg-type]
        for event in [{"type": "response.in_progress"}, {"type": end}, {"type": "after"}]:
            await send_channel.send((event, 1))
        await send_channel.aclose()  # a wait that read past its end fails at once
        assert (await lane.until_pause(), await lane.receive()) == ({"type": end}, {"type": "after"})


async def test_multiplexed_rollouts_run_each_task_on_its_lane_with_the_defaults_a_caller_gets(autojump_clock) -> None:
    server = make_server()
    workloads = [fixed(2, initial_prompt_tokens=50, appended_tokens=5, output_tokens=5, name=f"task-{i}") for i in range(2)]
    asked: list[object] = []
    ended: list[TurnRecord] = []

    def metadata_for(index: int) -> dict[str, str]:
        asked.append(index)
        return {"testbed_workload": "fixed:2:50:5:5:0", "lane": f"agent-{index}"}

    start = trio.current_time()
    records = await run_multiplexed_rollouts(InMemoryConnector(server), workloads, metadata_for=metadata_for, on_turn_end=ended.append)
    assert sorted(asked) == [0, 1]  # type: ignore[type-var]
    assert [(r.design, r.workload, r.status, len(r.turns)) for r in records] == [("chained", "task-0", "completed", 2),
                                                                                  ("chained", "task-1", "completed", 2)]
    # Without a network, a lane per task and a connection per task agree exactly (docs/protocol.md, Lanes): to the
    # nanosecond (the runs start at different clock values, so float rounding may differ), with the same transcripts.
    separate_server, separate = make_server(), [RolloutRecord(CHAINED, "", 0.0)] * 2

    async def one(i: int) -> None:
        connector = InMemoryConnector(separate_server)
        separate[i] = await run_websocket_rollout(connector, CHAINED, workloads[i], metadata=metadata_for(i))

    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(one, i)
    assert [r.seconds for r in records] == pytest.approx([r.seconds for r in separate], abs=1e-9)
    assert [r.transcript for r in records] == [r.transcript for r in separate]
    assert max(r.ended_at for r in records) - start == pytest.approx(max(r.seconds for r in records), abs=1e-9)
    assert sorted(id(turn) for turn in ended) == sorted(id(turn) for r in records for turn in r.turns)
    assert all(turn.server_timing is None for r in records for turn in r.turns)  # no timings unless asked
    assert all(server.api.store.get(response_id) is None for r in records for response_id in r.response_ids)  # store: false

    [record] = await run_multiplexed_rollouts(InMemoryConnector(server), workloads[:1], metadata_for=metadata_for, store=True,
                                              include_timing=True)
    assert all(turn.server_timing is not None for turn in record.turns)
    stored = server.api.store.get(record.response_ids[-1])
    assert stored is not None and stored.owner == owner_of("testbed")
    assert (stored.response["model"], stored.response["metadata"]) == ("gpt-5.4", {"testbed_workload": "fixed:2:50:5:5:0", "lane": "agent-0"})
