"""The subagents experiment's injecting client (`client/inject.py`) against the in-process server on a virtual clock:
every call answered once with its own output, after its tool time; the run's status, usage and the bytes it sent."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket
from support import make_server
from test_bad_input import first_leaf

from prototype import netem
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import tool_output_text
from prototype.client.inject import InjectedRun, run_injected_subagents
from prototype.engine.streaming import FaultPlan
from prototype.server.config import ServerConfig
from prototype.workload import fixed

MODEL = "sim-1000"
TWO_TURNS = fixed(2, initial_prompt_tokens=100, appended_tokens=10, output_tokens=20, tool_seconds=0.5)
TWO_TURNS_METADATA = {"testbed_workload": "fixed:2:100:10:20:0.5"}


async def injected_run(subagents: int, tool_seconds: float, network: netem.NetworkProfile | None = None) -> InjectedRun:
    workload = fixed(3, initial_prompt_tokens=100, appended_tokens=10, output_tokens=20, tool_seconds=tool_seconds)
    spec = f"fixed:3:100:10:20:{tool_seconds:g}"
    return await run_injected_subagents(InMemoryConnector(make_server(), network), workload, subagents,
                                        metadata={"testbed_workload": spec}, model=MODEL)


async def test_subagents_wait_their_tool_time_cost_n_times_one_run_all_at_once_and_send_one_inject_per_call(autojump_clock):
    instant = await injected_run(2, 0.0)
    await trio.sleep(10.0)
    two = await injected_run(2, 0.5)
    assert instant.started_at == 0.0 and two.started_at == pytest.approx(10.0 + instant.seconds)
    # Two client calls per agent on the critical path, the agents in parallel: one second more in all.
    assert (two.seconds, instant.injects, instant.status) == (pytest.approx(instant.seconds + 1.0), 4, "completed")
    one, four = await injected_run(1, 0.5), await injected_run(4, 0.5)
    assert one.status == two.status == four.status == "completed" and (one.injects, two.injects, four.injects) == (2, 4, 8)
    # `max_concurrent_subagents` asks for all four, beyond the server's default of three.
    assert two.seconds == pytest.approx(one.seconds) and four.seconds == pytest.approx(one.seconds)
    tokens = ("output_tokens", "input_tokens")
    assert [two.usage[k] for k in tokens] == [2 * one.usage[k] for k in tokens]
    assert one.usage["output_tokens"] > 0
    # The second agent adds its two compact inject frames (the metadata's "1" becomes "2": same length); its
    # call ids are `call_agent1_<n>` with a one-digit n, the response id `resp_` and 18 hex digits.
    workload = fixed(3, initial_prompt_tokens=100, appended_tokens=10, output_tokens=20, tool_seconds=0.5)
    extra = 0
    for turn in (0, 1):
        frame = {"type": "response.inject", "response_id": "resp_" + "0" * 18, "input": [
            {"type": "function_call_output", "call_id": f"call_agent1_{turn}", "output": tool_output_text(workload, turn, 0)}]}
        extra += len(json.dumps(frame, separators=(",", ":")).encode())
    assert two.bytes_sent - one.bytes_sent == extra


async def test_the_run_sends_its_api_key_and_stores_nothing(autojump_clock, monkeypatch) -> None:
    server = make_server(config=ServerConfig(api_keys=frozenset({"testbed", "k2"})))
    stored: list[str] = []
    monkeypatch.setattr(server.api.store, "put", lambda response_id, *args, **kwargs: stored.append(response_id))
    connector = InMemoryConnector(server)
    for key in ({}, {"api_key": "k2"}):  # the default key, then another the server takes
        run = await run_injected_subagents(connector, TWO_TURNS, 1, metadata=TWO_TURNS_METADATA, model=MODEL, **key)
        assert (run.status, run.injects) == ("completed", 1)
    assert stored == []  # `store: false`: the experiment measures the response, not the store
    with pytest.raises(BaseExceptionGroup) as raised:  # from the run's nursery
        await run_injected_subagents(connector, TWO_TURNS, 1, metadata=TWO_TURNS_METADATA, model=MODEL, api_key="wrong")
    error = first_leaf(raised.value)
    assert isinstance(error, trio_websocket.ConnectionRejected)
    assert error.status_code == 401 and b'"invalid_api_key"' in error.body


async def test_a_refused_request_and_a_failed_response_end_the_run_with_their_status(autojump_clock) -> None:
    server = make_server()
    refused = await run_injected_subagents(InMemoryConnector(server), TWO_TURNS, 1, metadata=TWO_TURNS_METADATA, model="sim-0")
    assert (refused.status, refused.usage, refused.injects) == ("error", {}, 0)
    server.api.engine.faults = FaultPlan(flushes_before_failure=0)  # the first flush fails
    failed = await run_injected_subagents(InMemoryConnector(server), TWO_TURNS, 1, metadata=TWO_TURNS_METADATA, model=MODEL)
    assert (failed.status, failed.injects) == ("failed", 0)
