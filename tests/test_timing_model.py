"""The timing model the results rest on: what a resumed v1 segment pays, the prefill formula, the
model-name profiles, the timing header on both transports, and a stored v1 rollout continued later.

Each test here guards a change that would shift every published figure without failing anything
else: all times are exact under the autojump clock (`pytest.approx(rel=1e-9)` absorbs float
rounding only).
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from support import create_event, function_calls, make_server, outputs_for, send, until, ws
from test_http import Link

from prototype.api.costs import ApiCosts, StageCost
from prototype.api.service import owner_of
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import HARNESS_TOOLS, run_websocket_rollout
from prototype.engine.latency import (
    CACHE_ATTENTION_TOKENS2_PER_S,
    ENGINE_REQUEST_OVERHEAD_S,
    FLAGSHIP_TOKENS_PER_S,
    PREFILL_TOKENS_PER_S,
    SPARK_BURST_TOKENS_PER_S,
    SPARK_TOKENS_PER_S,
    LatencyModel,
    decode_rate_for_model,
)
from prototype.workload import TurnSpec, Workload

TIMING_HEADER = "x-responsesapi-include-timing-metrics"
V2_BETA = "responses_websockets=2026-02-06"


def exactly(seconds: float) -> Any:
    return pytest.approx(seconds, rel=1e-9, abs=1e-12)


# --- the prefill formula ----------------------------------------------------------------------------


@pytest.mark.parametrize(("uncached", "cached"), [(0, 0), (1, 0), (3000, 0), (3000, 50_000), (0, 120_000), (875, 119_000)])
def test_prefill_charges_new_tokens_and_their_attention_to_cached_ones(uncached: int, cached: int) -> None:
    # t = t0 + n/R + n*C/Q (docs/parameters.md §3): cached tokens cost only as context attended to.
    expected = ENGINE_REQUEST_OVERHEAD_S + uncached / PREFILL_TOKENS_PER_S + uncached * cached / CACHE_ATTENTION_TOKENS2_PER_S
    assert LatencyModel().prefill_seconds(uncached, cached) == exactly(expected)


def test_prefill_of_a_fully_cached_prompt_is_the_request_overhead_alone() -> None:
    model = LatencyModel()
    assert model.prefill_seconds(0, 1_000_000) == exactly(ENGINE_REQUEST_OVERHEAD_S)
    assert LatencyModel(cache_attention=None).prefill_seconds(2000, 1_000_000) == exactly(ENGINE_REQUEST_OVERHEAD_S + 2000 / PREFILL_TOKENS_PER_S)


async def test_a_chained_turn_prefills_only_its_new_tokens(autojump_clock) -> None:
    # Zero API costs: a continuation's first token comes after the engine overhead, the prefill of the
    # uncached tokens attending to the cached ones, and one decode step; nothing else.
    server = make_server()
    async with ws(server, "chained") as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2", "testbed_decode_tps": "1000"}))
        first = (await until(conn, "response.completed"))[-1]["response"]
        start = trio.current_time()
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"],
                                      metadata={"testbed_workload": "fixed:2", "testbed_decode_tps": "1000"}))
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        first_token = trio.current_time() - start
        second = (await until(conn, "response.completed"))[-1]["response"]
    usage = second["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    uncached = usage["input_tokens"] - cached
    assert cached > 0 and uncached > 0
    assert first_token == exactly(LatencyModel(decode_tokens_per_s=1000).prefill_seconds(uncached, cached) + 1 / 1000)


# --- a resumed v1 segment pays no fixed pre-inference cost ------------------------------------------


def with_fixed(costs: ApiCosts, extra: float) -> ApiCosts:
    """`costs` with `extra` seconds added to the fixed part of each of the four pre-inference stages."""
    def more(stage: StageCost) -> StageCost:
        return attrs.evolve(stage, fixed=stage.fixed + extra)
    return attrs.evolve(costs, validate=more(costs.validate), safety=more(costs.safety), render=more(costs.render), route=more(costs.route))


TWO_TURNS = Workload("two-turns", 0, (TurnSpec(2000, 20, (1.0,)), TurnSpec(600, 20, ())))


async def v1_first_token_times(costs: ApiCosts) -> tuple[float, float, dict[str, float]]:
    """(first segment's time to first token, resumed segment's, resumed segment's phases in ms)."""
    server = make_server(costs=costs)
    key = server.api.workloads.register(TWO_TURNS)
    metadata = {"testbed_workload": key, "testbed_decode_tps": "1000"}
    async with ws(server, "suspended", include_timing=True) as conn:
        start = trio.current_time()
        await send(conn, create_event(metadata=metadata))
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        first = trio.current_time() - start
        done = (await until(conn, "response.done"))[-1]["response"]
        resumed_at = trio.current_time()
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(done), "x " * 300)})
        await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
        resumed = trio.current_time() - resumed_at
        final = (await until(conn, "response.completed"))[-1]["response"]
    return first, resumed, final["testbed_timing"]["phases_ms"]


async def test_a_resumed_v1_segment_pays_no_fixed_pre_inference_cost(autojump_clock) -> None:
    base_first, base_resumed, phases = await v1_first_token_times(ApiCosts())
    more_first, more_resumed, _ = await v1_first_token_times(with_fixed(ApiCosts(), 1.0))
    # The first segment pays every stage's fixed cost; a resume pays none of it.
    assert more_first - base_first == exactly(4.0)
    assert more_resumed == exactly(base_resumed)
    # What a resume does pay is the per-token part over the appended items only: validation and
    # safety check the same new tokens, so their times stand in the ratio of their per-1k-token
    # rates; the reused route costs nothing.
    defaults = ApiCosts()
    assert phases["route"] == 0
    assert phases["validate"] > 0
    ratio = defaults.safety.per_ktok / defaults.validate.per_ktok
    assert phases["safety"] == pytest.approx(ratio * phases["validate"], abs=0.002)  # phases_ms carry 3 decimals


async def test_a_chained_continuation_pays_f_ws_of_the_fixed_cost(autojump_clock) -> None:
    # The shipped design's cached turn still pays the share f_ws of each fixed cost (api/costs.py).
    async def second_turn_first_token(costs: ApiCosts) -> float:
        server = make_server(costs=costs)
        key = server.api.workloads.register(TWO_TURNS)
        metadata = {"testbed_workload": key, "testbed_decode_tps": "1000"}
        async with ws(server, "chained") as conn:
            await send(conn, create_event(metadata=metadata))
            first = (await until(conn, "response.completed"))[-1]["response"]
            start = trio.current_time()
            await send(conn, create_event(outputs_for(function_calls(first), "x " * 300), previous_response_id=first["id"], metadata=metadata))
            await until(conn, "response.output_text.delta", "response.function_call_arguments.delta")
            return trio.current_time() - start

    base = await second_turn_first_token(ApiCosts())
    more = await second_turn_first_token(with_fixed(ApiCosts(), 1.0))
    assert more - base == exactly(4.0 * ApiCosts().cached_fixed_share)


# --- model names pick the decode rate (the table in docs/serving.md) ------------------------------------------


MODEL_NAMES = [
    ("gpt-5.4", FLAGSHIP_TOKENS_PER_S),
    ("gpt-5.2", FLAGSHIP_TOKENS_PER_S),
    ("gpt-5.3-codex", FLAGSHIP_TOKENS_PER_S),
    ("gpt-5.3-codex-spark", SPARK_TOKENS_PER_S),
    ("GPT-5.3-Codex-Spark", SPARK_TOKENS_PER_S),
    ("gpt-5.3-codex-spark-burst", SPARK_BURST_TOKENS_PER_S),
    ("sim-250", 250.0),
    ("sim-12.5", 12.5),
]


@pytest.mark.parametrize(("model", "rate"), MODEL_NAMES)
def test_model_name_selects_the_profile(model: str, rate: float) -> None:
    assert decode_rate_for_model(model) == rate


def test_profile_rates_are_the_published_ones() -> None:
    # OpenAI blog: ~65 tokens/s for GPT-5-class models; Codex-Spark above 1,000, bursts to 4,000.
    assert (FLAGSHIP_TOKENS_PER_S, SPARK_TOKENS_PER_S, SPARK_BURST_TOKENS_PER_S) == (65.0, 1000.0, 4000.0)


@pytest.mark.parametrize(("model", "metadata", "rate"), [
    *((name, {}, rate) for name, rate in MODEL_NAMES),
    ("gpt-5.4", {"testbed_decode_tps": "500"}, 500.0),
    ("gpt-5.3-codex-spark", {"testbed_decode_tps": "2000"}, 2000.0),
])
async def test_served_tokens_arrive_at_the_rate_the_name_or_metadata_selects(autojump_clock, model: str, metadata: dict[str, str], rate: float) -> None:
    server = make_server()
    times: list[float] = []
    async with ws(server, "chained") as conn:
        await send(conn, create_event(model=model, metadata={"testbed_workload": "fixed:1:100:10:30", **metadata}))
        with trio.fail_after(600):
            while True:
                event = json.loads(await conn.get_message())
                if event["type"] == "response.output_text.delta":
                    times.append(trio.current_time())
                if event["type"] == "response.completed":
                    break
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) >= 5
    assert gaps == [exactly(1 / rate)] * len(gaps)


# --- the timing header, on both transports ----------------------------------------------------------


HEADER_VALUES = [("true", True), ("TRUE", True), ("True", True), ("false", False), ("1", False), ("yes", False), ("", False), (None, False)]


@pytest.mark.parametrize(("value", "timed"), HEADER_VALUES)
async def test_websocket_sends_timings_only_when_the_header_says_true(autojump_clock, value: str | None, timed: bool) -> None:
    server = make_server()
    headers = [(b"authorization", b"Bearer testbed"), (b"openai-beta", V2_BETA.encode())]
    if value is not None:
        headers.append((TIMING_HEADER.encode(), value.encode()))
    async with InMemoryConnector(server).open_stream() as stream, trio.open_nursery() as nursery:
        conn = await trio_websocket.wrap_client_stream(nursery, stream, "testbed", "/v1/responses", extra_headers=headers)
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        completed = (await until(conn, "response.completed"))[-1]["response"]
        await conn.aclose()
        nursery.cancel_scope.cancel()
    assert ("testbed_timing" in completed) is timed
    if timed:
        assert completed["testbed_timing"]["phases_ms"]["decode"] > 0


@pytest.mark.parametrize(("value", "timed"), HEADER_VALUES)
async def test_http_sends_timings_only_when_the_header_says_true(autojump_clock, nursery, value: str | None, timed: bool) -> None:
    server = make_server()
    client = Link(nursery, server).open()
    headers = [] if value is None else [(TIMING_HEADER, value)]
    body = {"model": "sim-1000", "input": "fix the bug", "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:1"}, "store": False, "stream": False}
    answer = await client.request(body=body, headers=headers)
    assert answer.status == 200
    assert ("testbed_timing" in answer.json()) is timed


# --- a stored v1 rollout, continued later -----------------------------------------------------------


STORED = Workload("stored-v1", 5, (TurnSpec(1500, 20, (0.5,)), TurnSpec(400, 20, (0.5,)), TurnSpec(300, 20, ())))
FOLLOW_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now the docs"}]}


async def stored_v1_rollout(server) -> tuple[str, list[dict[str, Any]]]:
    """A v1 rollout with store=true; (its response id, every conversation item in order)."""
    key = server.api.workloads.register(STORED)
    record = await run_websocket_rollout(InMemoryConnector(server), "suspended", STORED, metadata={"testbed_workload": key}, store=True)
    assert record.status == "completed" and len(record.response_ids) == 1
    return record.response_ids[0], record.transcript


async def test_a_stored_v1_rollout_keeps_the_appended_tool_outputs(autojump_clock) -> None:
    server = make_server()
    response_id, transcript = await stored_v1_rollout(server)
    chain = server.api.store.chain(response_id, owner_of("testbed"))
    stored = [item.to_dict() for turn in chain for item in [*turn.input, *turn.output]]
    outputs = [i for i in transcript if i["type"] == "function_call_output"]
    assert len(outputs) == 2
    assert [i["call_id"] for i in stored if i["type"] == "function_call_output"] == [o["call_id"] for o in outputs]
    assert [i["type"] for i in stored] == [i["type"] for i in transcript]


async def input_tokens_over_http(server, nursery, body: dict[str, Any]) -> int:
    answer = await Link(nursery, server).open().request(body={**body, "stream": False})
    assert answer.status == 200, answer.body
    return answer.json()["usage"]["input_tokens"]


async def test_a_stored_v1_rollout_continues_with_its_tool_outputs_over_http_and_websocket(autojump_clock, nursery) -> None:
    server = make_server()
    response_id, transcript = await stored_v1_rollout(server)
    common = {"model": "sim-1000", "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:1"}, "store": False}
    # The reference: the whole conversation resent as input, as a stateless client would.
    full = await input_tokens_over_http(server, nursery, {**common, "input": [*transcript, FOLLOW_UP]})
    # Continued from the store over HTTP.
    chained_http = await input_tokens_over_http(server, nursery, {**common, "input": [FOLLOW_UP], "previous_response_id": response_id})
    # Continued from the store over a new WebSocket (the connection cache is cold: it hydrates).
    async with ws(server, "chained") as conn:
        await send(conn, {"type": "response.create", **common, "input": [FOLLOW_UP], "previous_response_id": response_id})
        completed = (await until(conn, "response.completed"))[-1]
    assert completed["type"] == "response.completed"
    chained_ws = completed["response"]["usage"]["input_tokens"]
    assert chained_http == full
    assert chained_ws == full


def readme_model_table() -> list[tuple[str, str]]:
    """(model name cell, decode speed cell) of the model-name table in docs/serving.md."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    section = text.split("## What a request runs", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    header = lines.index("| model name | decode speed |")
    rows = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break  # the table ends at its first non-table line
        first, second = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((first, second))
    return rows


# Names a user would send for each row of the table, in the table's order.
README_EXAMPLES = [
    ["gpt-5.3-codex-spark-burst", "Spark-Burst", "burst"],
    ["gpt-5.3-codex-spark", "codex-spark-mini"],
    ["sim-100000", "sim-250"],
    ["gpt-5.4", "gpt-5.2", "o3"],
]


def test_the_documented_model_table_is_what_the_server_does() -> None:
    rows = readme_model_table()
    assert len(rows) == len(README_EXAMPLES)
    for (cell, speed), names in zip(rows, README_EXAMPLES):
        for name in names:
            if "<N>" in cell:  # sim-<N>: N tokens/s
                assert speed.startswith("N tokens/s")
                assert decode_rate_for_model(name) == float(name.removeprefix("sim-"))
            else:
                assert decode_rate_for_model(name) == float(re.match(r"(\d+) tokens/s", speed).group(1)), (cell, name)
        for quoted in re.findall(r"`([^`]+)`", cell):
            if quoted not in ("spark", "burst", "sim-<N>"):  # the e.g. names the row itself gives
                assert quoted in names, (cell, quoted)
