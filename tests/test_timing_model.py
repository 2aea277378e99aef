"""The timing model every published figure rests on, exact under the autojump clock: the prefill formula, what a
resumed or continued turn pays, the model-name rates, the timing header, a stored v1 rollout continued later."""

from __future__ import annotations

import itertools
import json
import pathlib
import re
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from support import create_event, exactly, function_calls, make_server, outputs_for, send, until, ws
from test_http import Link

from prototype.api.costs import ZERO_COSTS, ApiCosts, StageCost
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


# --- the prefill formula ----------------------------------------------------------------------------


@pytest.mark.parametrize(("uncached", "cached"), [(0, 0), (1, 0), (3000, 0), (3000, 50_000), (0, 120_000), (875, 119_000),
                                                 (0, 1_000_000), (2000, 1_000_000)])
def test_prefill_charges_new_tokens_and_their_attention_to_cached_ones(uncached: int, cached: int) -> None:
    # t = t0 + n/R + n*C/Q (docs/parameters.md §3): cached tokens cost only as context attended to (or nothing).
    expected = ENGINE_REQUEST_OVERHEAD_S + uncached / PREFILL_TOKENS_PER_S + uncached * cached / CACHE_ATTENTION_TOKENS2_PER_S
    assert LatencyModel().prefill_seconds(uncached, cached) == exactly(expected)
    assert LatencyModel(cache_attention=None).prefill_seconds(uncached, cached) == exactly(
        ENGINE_REQUEST_OVERHEAD_S + uncached / PREFILL_TOKENS_PER_S)


def with_fixed(costs: ApiCosts, extra: float) -> ApiCosts:
    """`costs` with `extra` seconds added to the fixed part of each of the four pre-inference stages."""
    def more(stage: StageCost) -> StageCost:
        return attrs.evolve(stage, fixed=stage.fixed + extra)
    return attrs.evolve(costs, validate=more(costs.validate), safety=more(costs.safety), render=more(costs.render), route=more(costs.route))


TWO_TURNS = Workload("two-turns", 0, (TurnSpec(2000, 20, (1.0,)), TurnSpec(600, 20, ())))
FIRST_TOKEN = ("response.output_text.delta", "response.function_call_arguments.delta")


async def first_tokens(design: str, costs: ApiCosts = ZERO_COSTS) -> tuple[float, float, dict[str, Any]]:
    """TWO_TURNS at 1000 tokens/s: (the first turn's time to first token, the second's from its request or append, the
    final response)."""
    server = make_server(costs=costs)
    metadata = {"testbed_workload": server.api.workloads.register(TWO_TURNS), "testbed_decode_tps": "1000"}
    async with ws(server, design, include_timing=True) as conn:
        start = trio.current_time()
        await send(conn, create_event(metadata=metadata))
        await until(conn, *FIRST_TOKEN)
        first = trio.current_time() - start
        done = (await until(conn, "response.done", "response.completed"))[-1]["response"]
        resumed_at, answers = trio.current_time(), outputs_for(function_calls(done), "x " * 300)
        await send(conn, {"type": "response.append", "input": answers} if design == "suspended"
                   else create_event(answers, previous_response_id=done["id"], metadata=metadata))
        await until(conn, *FIRST_TOKEN)
        resumed = trio.current_time() - resumed_at
        return first, resumed, (await until(conn, "response.completed"))[-1]["response"]


async def test_a_resumed_v1_segment_pays_no_fixed_pre_inference_cost_and_a_chained_turn_f_ws_of_it(autojump_clock) -> None:
    base_first, base_resumed, final = await first_tokens("suspended", ApiCosts())
    more_first, more_resumed, _ = await first_tokens("suspended", with_fixed(ApiCosts(), 1.0))
    # The first segment pays every stage's fixed cost; a resume pays none of it.
    assert (more_first - base_first, more_resumed) == (exactly(4.0), exactly(base_resumed))
    # A resume pays the per-token part over the appended items only: validation and safety check the same new tokens,
    # so their times stand in the ratio of their per-1k-token rates; the reused route costs nothing.
    phases, defaults = final["testbed_timing"]["phases_ms"], ApiCosts()
    assert phases["route"] == 0 and phases["validate"] > 0
    ratio = defaults.safety.per_ktok / defaults.validate.per_ktok
    assert phases["safety"] == pytest.approx(ratio * phases["validate"], abs=0.002)  # phases_ms carry 3 decimals
    # The shipped chained design's cached turn still pays the share f_ws of each fixed cost (api/costs.py).
    _, base, _ = await first_tokens("chained", ApiCosts())
    _, more, _ = await first_tokens("chained", with_fixed(ApiCosts(), 1.0))
    assert more - base == exactly(4.0 * defaults.cached_fixed_share)


# --- model names pick the decode rate (the table in docs/serving.md) ------------------------------------------


# One name of each kind; each row of the documented table's names: test_the_documented_model_table_is_what_the_server_does.
MODEL_NAMES = [("gpt-5.3-codex", FLAGSHIP_TOKENS_PER_S), ("GPT-5.3-Codex-Spark", SPARK_TOKENS_PER_S),
               ("gpt-5.3-codex-spark-burst", SPARK_BURST_TOKENS_PER_S), ("sim-12.5", 12.5)]


def test_profile_rates_are_the_published_ones() -> None:
    # OpenAI blog: ~65 tokens/s for GPT-5-class models; Codex-Spark above 1,000, bursts to 4,000.
    assert (FLAGSHIP_TOKENS_PER_S, SPARK_TOKENS_PER_S, SPARK_BURST_TOKENS_PER_S) == (65.0, 1000.0, 4000.0)


@pytest.mark.parametrize(("model", "metadata", "rate"), [
    *((name, {}, rate) for name, rate in MODEL_NAMES), ("gpt-5.4", {"testbed_decode_tps": "500"}, 500.0),
    ("gpt-5.3-codex-spark", {"testbed_decode_tps": "2000"}, 2000.0)])
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
    assert len(gaps) >= 5 and gaps == [exactly(1 / rate)] * len(gaps)


# --- the timing header, on both transports ----------------------------------------------------------


HEADER_VALUES = [("true", True), ("TRUE", True), ("True", True), ("false", False), ("1", False), ("yes", False), ("", False), (None, False)]


@pytest.mark.parametrize(("value", "timed"), HEADER_VALUES)
async def test_both_transports_send_timings_only_when_the_header_says_true(autojump_clock, nursery, value: str | None, timed: bool):
    server = make_server()
    headers = [(b"authorization", b"Bearer testbed"), (b"openai-beta", V2_BETA.encode())]
    if value is not None:
        headers.append((TIMING_HEADER.encode(), value.encode()))
    async with InMemoryConnector(server).open_stream() as stream, trio.open_nursery() as inner:
        conn = await trio_websocket.wrap_client_stream(inner, stream, "testbed", "/v1/responses", extra_headers=headers)
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        completed = (await until(conn, "response.completed"))[-1]["response"]
        await conn.aclose()
        inner.cancel_scope.cancel()
    assert ("testbed_timing" in completed) is timed
    if timed:
        assert completed["testbed_timing"]["phases_ms"]["decode"] > 0
    body = {"model": "sim-1000", "input": "fix the bug", "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:1"}, "store": False, "stream": False}
    answer = await Link(nursery, server).open().request(body=body, headers=[] if value is None else [(TIMING_HEADER, value)])
    assert answer.status == 200 and ("testbed_timing" in answer.json()) is timed


# --- a stored v1 rollout, continued later -----------------------------------------------------------


STORED = Workload("stored-v1", 5, (TurnSpec(1500, 20, (0.5,)), TurnSpec(400, 20, (0.5,)), TurnSpec(300, 20, ())))
FOLLOW_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now the docs"}]}


async def input_tokens_over_http(server, nursery, body: dict[str, Any]) -> int:
    answer = await Link(nursery, server).open().request(body={**body, "stream": False})
    assert answer.status == 200, answer.body
    return answer.json()["usage"]["input_tokens"]


async def test_a_stored_v1_rollout_keeps_its_tool_outputs_and_continues_with_them_over_http_and_websocket(autojump_clock, nursery):
    server = make_server()
    key = server.api.workloads.register(STORED)
    record = await run_websocket_rollout(InMemoryConnector(server), "suspended", STORED, metadata={"testbed_workload": key}, store=True)
    assert record.status == "completed" and len(record.response_ids) == 1
    (response_id,), transcript = record.response_ids, record.transcript
    chain = server.api.store.chain(response_id, owner_of("testbed"))
    stored = [item.to_dict() for turn in chain for item in [*turn.input, *turn.output]]
    outputs = [i for i in transcript if i["type"] == "function_call_output"]
    assert len(outputs) == 2
    assert [i["call_id"] for i in stored if i["type"] == "function_call_output"] == [o["call_id"] for o in outputs]
    assert [i["type"] for i in stored] == [i["type"] for i in transcript]
    common = {"model": "sim-1000", "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:1"}, "store": False}
    # The reference: the whole conversation resent as input, as a stateless client would.
    full = await input_tokens_over_http(server, nursery, {**common, "input": [*transcript, FOLLOW_UP]})
    # Continued from the store over HTTP.
    chained_http = await input_tokens_over_http(server, nursery, {**common, "input": [FOLLOW_UP], "previous_response_id": response_id})
    # Continued from the store over a new WebSocket (the connection cache is cold: it hydrates).
    async with ws(server, "chained") as conn:
        await send(conn, {"type": "response.create", **common, "input": [FOLLOW_UP], "previous_response_id": response_id})
        completed = (await until(conn, "response.completed"))[-1]
    assert (completed["type"], chained_http) == ("response.completed", completed["response"]["usage"]["input_tokens"])
    assert chained_http == full


def readme_model_table() -> list[tuple[str, str]]:
    """(model name cell, decode speed cell) of the model-name table in docs/serving.md."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    section = text.split("## What a request runs", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    header = lines.index("| model name | decode speed |")
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[header + 2:])  # to the first non-table line
    return [tuple(cell.strip() for cell in line.strip("|").split("|")) for line in rows]


# Names a user would send for each row of the table, in the table's order.
README_EXAMPLES = [["gpt-5.3-codex-spark-burst", "Spark-Burst", "burst"], ["gpt-5.3-codex-spark", "codex-spark-mini"],
                   ["sim-100000", "sim-250"], ["gpt-5.4", "gpt-5.2", "o3"]]


def test_the_documented_model_table_is_what_the_server_does() -> None:
    rows = readme_model_table()
    assert len(rows) == len(README_EXAMPLES)
    for (cell, speed), names in zip(rows, README_EXAMPLES):
        for name in names:
            if "<N>" in cell:  # sim-<N>: N tokens/s
                assert speed.startswith("N tokens/s") and decode_rate_for_model(name) == float(name.removeprefix("sim-"))
            else:
                assert decode_rate_for_model(name) == float(re.match(r"(\d+) tokens/s", speed).group(1)), (cell, name)
        for quoted in re.findall(r"`([^`]+)`", cell):
            if quoted not in ("spark", "burst", "sim-<N>"):  # the e.g. names the row itself gives
                assert quoted in names, (cell, quoted)
