"""Every event every design sends, checked against openai-python's typed models and the invariants that tie a
stream together (numbering, item ids and indexes, statuses, token counts)."""

from __future__ import annotations

import typing
from typing import Any

import numpy as np
import pydantic
import pytest
from openai.types.responses import Response as SdkResponse
from openai.types.responses import ResponseError, ResponseStreamEvent
from openai.types.responses.response import IncompleteDetails
from support import SPARK, create_event, events_by_response, make_server, send, until, ws
from test_inject import MULTI_AGENT, beta_ws

from prototype.api.checks import SPARK_CONTEXT_WINDOW
from prototype.api.costs import ZERO_COSTS, ApiCosts
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import HARNESS_TOOLS, Rollout, run_websocket_rollout
from prototype.client.http import run_http_rollout
from prototype.engine import tokenizer
from prototype.engine.streaming import FaultPlan
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from prototype.workload import HostedCall, TurnSpec, Workload

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
ITEM_PREFIX = {"message": "msg_", "function_call": "fc_", "web_search_call": "ws_"}
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
# v1's pause: not an event type of the shipped API (openai-python has no model for it); its
# `response` must still be a valid Response.
V1_PAUSE = "response.done"

# Two parallel client calls, hosted searches on the first and second turns, a final answer.
TASK = Workload("conformance", 7, (TurnSpec(1200, 30, (0.5, 1.5), (HostedCall(0.8, 120),)),
                                   TurnSpec(300, 25, (0.4,), (HostedCall(0.2, 60), HostedCall(0.3, 40))), TurnSpec(200, 40, ())))
DESIGNS = ["suspended", "chained", "http-stateless", "http-stored"]


async def captured_rollout(design: str, costs: ApiCosts, monkeypatch) -> tuple[list[dict[str, Any]], Any]:
    """(every server event the client received, in order; the rollout record)."""
    events: list[dict[str, Any]] = []
    original = Rollout.received

    def spy(self, event: dict[str, Any], size: int) -> None:
        events.append(event)
        original(self, event, size)

    monkeypatch.setattr(Rollout, "received", spy)
    server = ResponsesServer(ApiService(costs=costs))
    key = server.api.workloads.register(TASK)
    metadata = {"testbed_workload": key, "testbed_decode_tps": "1000"}
    connector = InMemoryConnector(server)
    if design.startswith("http-"):
        record = await run_http_rollout(connector, TASK, variant=design.removeprefix("http-"), metadata=metadata, model="sim-1000")
    else:
        record = await run_websocket_rollout(connector, design, TASK, metadata=metadata, model="sim-1000")
    assert record.status == "completed", record.status
    return events, record


def check_typed(event: dict[str, Any]) -> None:
    if event["type"] == V1_PAUSE:
        SdkResponse.model_validate(event["response"])
        return
    STREAM_EVENT.validate_python(event)
    assert type(STREAM_EVENT.validate_python(event)).__name__ != "ResponseAudioDeltaEvent"


def tokens(text: str) -> int:
    return len(tokenizer.encoding().encode_ordinary(text))


def check_response_stream(stream: list[dict[str, Any]]) -> None:
    """The events of one response (one rollout in v1): numbering, items, statuses, usage."""
    response_id = stream[0]["response"]["id"]
    assert (stream[0]["type"], response_id[:5]) == ("response.created", "resp_")
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    terminals = [e for e in stream if e["type"] in TERMINAL]
    assert len(terminals) == 1 and stream[-1] is terminals[0]

    output: list[dict[str, Any]] = []  # done items, by output_index
    open_items: dict[str, dict[str, Any]] = {}  # item id -> the added item
    streamed_tokens = 0  # one delta per token (no coalescing): deltas count sampled tokens
    hidden_tokens = 0  # a hosted call's query is sampled but not streamed
    segment_start = 0
    for event in stream:
        check_typed(event)
        kind = event["type"]
        if "response" in event:
            assert event["response"]["id"] == response_id
        if kind == "response.output_item.added":
            item = event["item"]
            assert event["output_index"] == len(output) + len(open_items)
            assert item["id"].startswith(ITEM_PREFIX[item["type"]]) and item["status"] == "in_progress"
            open_items[item["id"]] = {**item, "output_index": event["output_index"]}
        elif kind == "response.output_item.done":
            item = event["item"]
            added = open_items.pop(item["id"])
            assert event["output_index"] == added["output_index"] == len(output)
            assert (item["type"], item["status"]) == (added["type"], "completed")
            if item["type"] == "web_search_call":
                hidden_tokens += tokens(item["action"]["query"])
            output.append(item)
        elif kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            assert event["item_id"] in open_items and event["output_index"] == open_items[event["item_id"]]["output_index"]
            streamed_tokens += 1
        elif kind.startswith("response.web_search_call."):
            added = open_items[event["item_id"]]
            assert (added["type"], event["output_index"]) == ("web_search_call", added["output_index"])
        elif kind == V1_PAUSE:
            paused = event["response"]
            assert (open_items, paused["status"], paused["output"]) == ({}, "in_progress", output[segment_start:])
            segment_start = len(output)
    final = stream[-1]["response"]
    assert (open_items, final["status"], final["output"]) == ({}, "completed", output)
    usage = final["usage"]
    assert usage["output_tokens"] == streamed_tokens + hidden_tokens
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 <= usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]


@pytest.mark.parametrize("design", DESIGNS)
async def test_every_event_is_typed_and_the_stream_holds_together(autojump_clock, monkeypatch, design: str) -> None:
    events, record = await captured_rollout(design, ZERO_COSTS, monkeypatch)
    streams = events_by_response(events)
    assert None not in streams  # nothing before the first response.created
    assert len(streams) == (1 if design == "suspended" else len(TASK.turns))
    for stream in streams.values():
        check_response_stream(stream)
    kinds = [e["type"] for e in events]
    # Each lifecycle of a hosted call, and the two parallel calls, appear.
    counted = ("response.web_search_call.completed", "response.function_call_arguments.done", V1_PAUSE)
    assert [kinds.count(kind) for kind in counted] == [3, 3, 2 if design == "suspended" else 0]
    # Timings are sent only on request.
    assert not any("testbed_timing" in (e.get("response") or {}) for e in events)


def test_stream_event_union_knows_every_type_the_designs_send() -> None:
    # A guard on the check above: the SDK's union must name each lifecycle event type we send, or
    # `check_typed` would validate against the wrong model.
    union = typing.get_args(ResponseStreamEvent)[0]
    names = {value for variant in typing.get_args(union) for value in typing.get_args(variant.model_fields["type"].annotation)}
    sent = {
        "response.created", "response.in_progress", "response.completed", "response.output_item.added",
        "response.output_item.done", "response.content_part.added", "response.content_part.done", "response.output_text.delta",
        "response.output_text.done", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.web_search_call.in_progress", "response.web_search_call.searching", "response.web_search_call.completed"}
    assert sent <= names


# --- every way a response ends other than completed: codes and reasons inside the API's schema ----------------

# The values openai-python's Response allows: `ResponseError.code` (types/responses/response_error.py) and
# `IncompleteDetails.reason` (types/responses/response.py), read from the SDK rather than copied.
ERROR_CODES = frozenset(typing.get_args(ResponseError.model_fields["code"].annotation))
INCOMPLETE_REASONS = frozenset(value for arg in typing.get_args(IncompleteDetails.model_fields["reason"].annotation)
                               for value in typing.get_args(arg))
WEB_SEARCH = {"type": "web_search"}


async def _ended(conn, event: dict[str, Any], *, after: str | None = None) -> dict[str, Any]:
    """Send `event`; with `after`, read up to that event first (a v1 pause); the terminal event that ends it."""
    await send(conn, event)
    if after is not None:
        await until(conn, after)
    return (await until(conn, *TERMINAL))[-1]


async def engine_fault_v2(server) -> list[dict[str, Any]]:
    server.api.engine.faults = FaultPlan(flushes_before_failure=1)
    async with ws(server) as conn:
        return [await _ended(conn, create_event())]


async def hosted_result_past_the_window(server) -> list[dict[str, Any]]:
    # The input fits the window; the search result the response reads mid-way does not.
    key = server.api.workloads.register(Workload("past-the-window", 1, (TurnSpec(10, 20, (), (HostedCall(0.5, 4_000),)),)))
    text = tokenizer.text_of(np.random.default_rng(0), SPARK_CONTEXT_WINDOW - 3_000)
    async with ws(server) as conn:
        return [await _ended(conn, create_event(text, model=SPARK, metadata={"testbed_workload": key}, tools=[*HARNESS_TOOLS, WEB_SEARCH]))]


async def a_paused_v1_rollout(server) -> list[dict[str, Any]]:  # ended by the suspension's TTL
    async with ws(server, "suspended") as conn:
        return [await _ended(conn, create_event(), after="response.done")]


async def inject_wait_past_the_ttl(server) -> list[dict[str, Any]]:
    async with beta_ws(server) as conn:
        return [await _ended(conn, create_event(metadata={"testbed_workload": "fixed:2"}, multi_agent=MULTI_AGENT))]


async def lifetime_cuts_a_streaming_v2_response(server) -> list[dict[str, Any]]:
    async with ws(server) as conn:  # 300 tokens at 10 a second: 30 s, past the 5 s lifetime and its 1 s grace
        return [await _ended(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:300", "testbed_decode_tps": "10"}))]


async def output_budget_runs_out(server) -> list[dict[str, Any]]:
    ends = []
    for design in ("chained", "suspended"):
        async with ws(server, design) as conn:
            ends.append(await _ended(conn, create_event(max_output_tokens=16)))
    return ends


async def steered(server) -> list[dict[str, Any]]:
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3:100:10:300:0.5"}, stream_id="agent"))
        target = (await until(conn, "response.output_text.delta"))[0]["response"]["id"]
        await send(conn, {"type": "response.steer", "previous_response_id": target, "input": "keep it small"})
        return [(await until(conn, *TERMINAL))[-1]]


ENDINGS = {  # name -> (scenario, the server's config, the terminal event it ends with)
    "engine_fault_v2": (engine_fault_v2, ServerConfig(), "response.failed"),
    "hosted_result_past_the_window": (hosted_result_past_the_window, ServerConfig(), "response.failed"),
    "suspension_ttl_v1": (a_paused_v1_rollout, ServerConfig(suspension_ttl=1.0), "response.failed"),
    "inject_wait_past_the_ttl": (inject_wait_past_the_ttl, ServerConfig(suspension_ttl=1.0), "response.failed"),
    "lifetime_cuts_a_streaming_v2_response": (lifetime_cuts_a_streaming_v2_response, ServerConfig(connection_lifetime=5.0, lifetime_grace=1.0),
                                              "response.failed"),
    "output_budget_runs_out": (output_budget_runs_out, ServerConfig(), "response.incomplete"),
    "steered": (steered, ServerConfig(), "response.incomplete"),
}


@pytest.mark.parametrize("name", list(ENDINGS))
async def test_every_failed_or_incomplete_response_carries_a_code_or_reason_of_the_apis_schema(autojump_clock, name) -> None:
    scenario, config, kind = ENDINGS[name]
    ends = await scenario(make_server(config=config))
    assert ends and {end["type"] for end in ends} == {kind}
    for end in ends:
        response = end["response"]
        if kind == "response.failed":
            assert response["error"]["code"] in ERROR_CODES and response["error"]["message"], response["error"]
        else:
            assert response["incomplete_details"]["reason"] in INCOMPLETE_REASONS, response["incomplete_details"]
        check_typed(end)  # the SDK's model of the whole event, its Response's `error` and `incomplete_details` included
