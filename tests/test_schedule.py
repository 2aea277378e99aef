"""A response's modeled waits run on its own schedule (metrics.PhaseLog.schedule) and the harness's tools from the end
of the turn: the testbed's CPU work (a jump of the autojump clock inside a synchronous call) is absorbed by the modeled
time, not added to it. A client slow to take an event delays only what follows; an engine-batch wait is `queue`."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio
from support import TERMINALS, create_event, exactly, function_calls, make_server, outputs_for, send, slowed, until, ws
from test_response_stream import REASONING

from prototype.api.costs import ZERO_COSTS, ApiCosts, StageCost
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import Rollout, run_websocket_rollout
from prototype.designs import chained
from prototype.designs.chained import ConnectionCache
from prototype.engine import tokenizer
from prototype.engine.engine import Engine
from prototype.engine.latency import LatencyModel
from prototype.engine.memory import SWAP_POLICY
from prototype.engine.policy import ScriptedPolicy
from prototype.protocol import codec
from prototype.workload import HostedCall, TurnSpec, Workload

METADATA = {"testbed_workload": "fixed:2", "testbed_decode_tps": "1000"}
STEP = 1 / 1000  # one decode step at 1000 tokens/s
TWO_TURNS = Workload("two-turns", 0, (TurnSpec(2000, 20, (1.0,)), TurnSpec(600, 20, ())))


@pytest.fixture
def planning_takes(monkeypatch):
    """`planning_takes(seconds)`: every plan from now on takes that long on the running clock."""
    return slowed(monkeypatch, ScriptedPolicy, "plan")


async def second_turn(design: str, work: float, planning_takes) -> tuple[float, float]:
    """(time to the second turn's first token after its request or append was sent, its modeled prefill)."""
    planning_takes(work)
    async with ws(make_server(), design) as conn:
        await send(conn, create_event(metadata=METADATA))
        first = (await until(conn, "response.done" if design == "suspended" else "response.completed"))[-1]["response"]
        answers = outputs_for(function_calls(first))
        start = trio.current_time()
        if design == "suspended":
            await send(conn, {"type": "response.append", "input": answers})
        else:
            await send(conn, create_event(answers, previous_response_id=first["id"], metadata=METADATA))
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        first_token = trio.current_time() - start
        usage = (await until(conn, "response.completed"))[-1]["response"]["usage"]
    if design == "suspended":  # usage covers both model calls of the rollout; the second's is the difference
        return first_token, 0.0
    cached = usage["input_tokens_details"]["cached_tokens"]
    return first_token, LatencyModel(decode_tokens_per_s=1000).prefill_seconds(usage["input_tokens"] - cached, cached)


@pytest.mark.parametrize("design", ["chained", "suspended"])
async def test_work_shorter_than_the_prefill_costs_no_time_and_longer_work_only_its_excess(design, planning_takes, autojump_clock):
    idle, _ = await second_turn(design, 0.0, planning_takes)
    short, prefill = await second_turn(design, 0.004, planning_takes)
    assert idle > 0.004 + STEP and short == exactly(idle)  # the prefill is longer than the work: the work hides inside it
    if design == "chained":  # the prefill counts from when the server took the request
        assert short == exactly(prefill + STEP)
    # The prefill ran while the plan did: the first token, due at `idle`, goes out as soon as longer work ends.
    assert (await second_turn(design, idle + 0.5, planning_takes))[0] == exactly(idle + 0.5)


@pytest.mark.parametrize("design", ["chained", "suspended"])
async def test_the_harness_runs_its_tools_from_the_turns_end(design: str, monkeypatch, autojump_clock) -> None:
    # The client's own work after the turn (building the tool outputs) runs inside the tool time.
    slowed(monkeypatch, Rollout, "tool_plan")(0.25)
    server = make_server()
    key = server.api.workloads.register(TWO_TURNS)
    record = await run_websocket_rollout(InMemoryConnector(server), design, TWO_TURNS,
                                         metadata={"testbed_workload": key, "testbed_decode_tps": "1000"})
    first, second = record.turns
    assert (first.tool_seconds, second.sent_at - first.ended_at) == (exactly(1.0), exactly(1.0))


async def reconnected_first_token(costs: ApiCosts) -> tuple[float, dict[str, float]]:
    """A stored chained response continued over a new connection (its history read back from the
    store): the continuation's time to first token, and its phases in seconds."""
    server = make_server(costs=costs)
    async with ws(server, "chained") as conn:
        await send(conn, create_event(store=True, metadata=METADATA))
        first = (await until(conn, "response.completed"))[-1]["response"]
    await trio.sleep(1)  # the overlapped store write is done
    async with ws(server, "chained", include_timing=True) as conn:
        start = trio.current_time()
        await send(conn, create_event(outputs_for(function_calls(first)), store=True, previous_response_id=first["id"], metadata=METADATA))
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        first_token = trio.current_time() - start
        second = (await until(conn, "response.completed"))[-1]["response"]
    return first_token, {k: v / 1000 for k, v in second["testbed_timing"]["phases_ms"].items()}


async def test_a_store_read_comes_before_the_stages_on_the_schedule_not_beside_them(autojump_clock) -> None:
    # The stored history is read (store_read_per_turn x 1 turn), then the stages run: the read adds its whole time.
    stages = ApiCosts(validate=StageCost(fixed=0.2), safety=StageCost(), render=StageCost(), route=StageCost(), post=0.0)
    without, _ = await reconnected_first_token(attrs.evolve(stages, store_read_per_turn=0.0))
    with_read, phases = await reconnected_first_token(attrs.evolve(stages, store_read_per_turn=0.5))
    assert (phases["store_read"], phases["validate"], with_read - without) == (exactly(0.5), exactly(0.2), exactly(0.5))


async def test_a_swap_in_comes_before_the_prefill_on_the_schedule(autojump_clock) -> None:
    # Between turns the session's KV went to the host (SWAP): first token = swap-in + prefill + one step.
    server = make_server()
    server.api.engine.retention = SWAP_POLICY
    async with ws(server, "chained") as conn:
        await send(conn, create_event(metadata=METADATA))
        first = (await until(conn, "response.completed"))[-1]["response"]
        await trio.sleep(1)  # the swap-out is done
        start = trio.current_time()
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"], metadata=METADATA))
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        first_token = trio.current_time() - start
        usage = (await until(conn, "response.completed"))[-1]["response"]["usage"]
    swap_in = server.api.engine.stats.swap_in_seconds
    cached = usage["input_tokens_details"]["cached_tokens"]
    assert swap_in > 0
    prefill = LatencyModel(decode_tokens_per_s=1000).prefill_seconds(usage["input_tokens"] - cached, cached)
    assert first_token == exactly(swap_in + prefill + STEP)


async def test_a_resumed_segments_timings_start_when_its_append_arrived(monkeypatch, autojump_clock) -> None:
    # The append's frame takes 4 ms to read; timed from the append's arrival, the segment still holds its whole prefill.
    slowed(monkeypatch, codec, "decode_client_event")(0.004)
    async with ws(make_server(), "suspended", include_timing=True) as conn:
        await send(conn, create_event(metadata=METADATA))
        first = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(first))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    cached = final["usage"]["input_tokens_details"]["cached_tokens"] - first["usage"]["input_tokens_details"]["cached_tokens"]
    uncached = final["usage"]["input_tokens"] - first["usage"]["input_tokens"] - cached
    prefill = LatencyModel(decode_tokens_per_s=1000).prefill_seconds(uncached, cached)
    assert final["testbed_timing"]["phases_ms"]["prefill"] == pytest.approx(1000 * prefill, abs=0.001)


# --- a client slow to take an event delays only what is sent after it -----------------------------------------


async def slow_write_turn(nursery, task: str | Workload, event_type: str, write: float, **fields: Any) -> tuple[Any, list[tuple[float, Any]]]:
    """A chained turn of `task` (a workload name, or one to register) at 100 tokens/s and zero API costs, whose
    client takes `write` seconds to accept each `event_type` event: (its response, each event sent with its time)."""
    api = ApiService(costs=ZERO_COSTS)
    name = task if isinstance(task, str) else api.workloads.register(task)
    request = codec.decode_client_event(json.dumps(create_event(metadata={"testbed_workload": name, "testbed_decode_tps": "100"}, **fields))).request
    sent: list[tuple[float, Any]] = []

    async def sink(event: Any) -> None:
        sent.append((trio.current_time(), event))
        if event.type == event_type:
            await trio.sleep(write)

    return await chained.run_turn(api, request, sink, ConnectionCache(("slow", write)).view(None), nursery), sent


async def test_a_slow_write_of_response_created_is_not_added_to_the_prefill(autojump_clock, nursery) -> None:
    # The prefill starts on the response's schedule, when pre-inference work ended.
    ended = {}
    for write in (0.0, 0.5):
        _, sent = await slow_write_turn(nursery, "fixed:1:100:10:25", "response.created", write)
        ended[write] = sent[-1][0] - sent[0][0]  # from response.created to the terminal event
    assert 0.25 < ended[0.0] < 0.5  # the prefill, then 25 tokens at 100 tokens/s
    assert ended[0.5] == pytest.approx(0.5, abs=1e-12)


async def test_a_slow_write_is_not_added_to_the_sampling_time(autojump_clock, nursery) -> None:
    # The engine samples on its own schedule: a slow announcement of each item delays only when its end is sent.
    for write in (0.0, 0.5):
        response, sent = await slow_write_turn(nursery, REASONING, "response.output_item.added", write)
        reasoning, message, call = response.output
        for index, count in enumerate([15, 25, len(tokenizer.encode(call.arguments))]):  # sampled at 100 tokens/s
            (added_at, _), (done_at, _) = ((t, e) for t, e in sent if e.type.startswith("response.output_item.") and e.output_index == index)
            assert done_at - added_at == pytest.approx(max(write, count / 100), abs=1e-12), index
        assert response.usage.reasoning_tokens == 15


async def test_a_slow_write_after_a_hosted_search_is_not_added_to_the_next_model_call(autojump_clock, nursery) -> None:
    # A slow write of the search's end does not push back the pre-inference work and prefill that follow it.
    task = Workload("hosted", 1, (TurnSpec(500, 20, (0.3,), (HostedCall(2.0, 100),)), TurnSpec(50, 20, ())))
    after = {}
    for write in (0.0, 0.5):
        response, sent = await slow_write_turn(nursery, task, "response.web_search_call.completed", write,
                                               tools=[*create_event()["tools"], {"type": "web_search"}])
        assert [item.type for item in response.output] == ["web_search_call", "message", "function_call"]
        (searched_at,) = [t for t, e in sent if e.type == "response.web_search_call.completed"]
        (message_done_at,) = [t for t, e in sent if e.type == "response.output_item.done" and e.output_index == 1]
        after[write] = message_done_at - searched_at
    assert after[0.0] > 0.2  # the prefill, then 20 tokens at 100 tokens/s
    assert after[0.5] == pytest.approx(max(0.5, after[0.0]), abs=1e-12)


async def test_a_model_call_queued_behind_a_full_batch_logs_its_wait(autojump_clock) -> None:
    server = make_server(engine=Engine(max_batch=1))
    responses: dict[str, dict[str, Any]] = {}

    async def one(name: str, delay: float) -> None:
        await trio.sleep(delay)
        async with ws(server, include_timing=True) as conn:
            await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:30"}))
            responses[name] = (await until(conn, *TERMINALS))[-1]["response"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", 0.0)
        nursery.start_soon(one, "second", 0.001)
    first, second = (responses[name]["testbed_timing"]["phases_ms"] for name in ("first", "second"))
    assert first["queue"] == 0.0
    # The second asked 1 ms after the first and waited for the first's whole model call.
    assert second["queue"] == pytest.approx(first["prefill"] + first["decode"] - 1.0, abs=0.002)
    spans = responses["second"]["testbed_timing"]["spans"]
    assert [span[0] for span in spans].count("queue") == 2  # the lane's, then the engine's
    # After a wait in the engine the prefill starts at admission, not back on the response's schedule.
    engine_queue = [span for span in spans if span[0] == "queue"][-1]
    (prefill,) = [span for span in spans if span[0] == "prefill"]
    assert prefill[1] == engine_queue[2] and prefill[2] - prefill[1] == second["prefill"] > 0
