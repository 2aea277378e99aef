"""A comparison a reviewer can trust, the same rules for every design: generated tasks share only the preset's common
prefix; per-turn figures (docs/metrics.md) are exact virtual times; an unanswered call is refused as the API refuses it;
reasoning is counted, and its `encrypted_content` goes back only where the design needs it."""

from __future__ import annotations

from typing import Any

import pytest
from support import create_event, function_calls, make_server, send, until, ws
from test_http import Link, create_body, error_of
from test_suspended import invalid

from prototype import netem
from prototype import workload as wl
from prototype.api import render
from prototype.client import harness
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED, run_websocket_rollout
from prototype.client.http import run_http_rollout
from prototype.engine import tokenizer
from prototype.engine.kv import BLOCK_SIZE
from prototype.engine.kv import common_prefix as _common_prefix
from prototype.protocol.codec import parse_create_body
from prototype.protocol.items import ENCRYPTED_CONTENT_MIN_CHARS, Message

DESIGNS = ("http-stateless", "http-stored", CHAINED, SUSPENDED)


async def run(server, design: str, task: wl.Workload, *, decode_tps: float = 1000.0, network=None, **kwargs: Any):
    metadata = {"testbed_workload": server.api.workloads.register(task), "testbed_decode_tps": f"{decode_tps:g}"}
    connector = InMemoryConnector(server, network)
    if design in (CHAINED, SUSPENDED):
        record = await run_websocket_rollout(connector, design, task, metadata=metadata, include_timing=True, **kwargs)
    else:
        variant = design.removeprefix("http-")
        record = await run_http_rollout(connector, task, variant=variant, metadata=metadata, include_timing=True, **kwargs)
    assert record.status == "completed", (design, record.status)
    return record


def first_prompt(task: wl.Workload) -> list[int]:
    """The token ids of a task's first model call, as the server renders the harness's first request."""
    body = harness.request_body(task, model="m", metadata={}, store=False)
    body["input"] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": harness.task_prompt(task)}]}]
    request = parse_create_body(body)
    return list(render.render_full(render.preamble_key(request.instructions, request.tools), request.input).ids)


def common_prefix_tokens(task: wl.Workload) -> int:
    """The preset's common prefix as rendered: instructions and tools, then the user item's header (separator, role)."""
    body = harness.request_body(task, model="m", metadata={}, store=False)
    request = parse_create_body({**body, "input": "x"})
    header = render.render_items([Message("user", (("input_text", ""),))])
    return len(render.render_preamble(render.preamble_key(request.instructions, request.tools))) + len(header)


# --- distinct tasks, one common prefix ------------------------------------------------------------------------------


def test_two_generated_tasks_share_exactly_the_common_prefix() -> None:
    tasks = wl.generate("coding", seed=0, n_tasks=3)
    prompts = [first_prompt(t) for t in tasks]
    shared = common_prefix_tokens(tasks[0])
    assert shared > tasks[0].prefix_tokens == 7400  # the system prompt, the tools and the item header
    for other in prompts[1:]:
        assert _common_prefix(prompts[0], other) == shared  # ... and not one token of the task after it
    # Everything else a task draws is its own: tool outputs and the model's text differ too.
    assert harness.tool_output_text(tasks[0], 0, 0) != harness.tool_output_text(tasks[1], 0, 0)


@pytest.mark.parametrize("design", DESIGNS)
async def test_no_design_finds_more_than_the_common_prefix_on_a_first_turn(autojump_clock, design: str) -> None:
    tasks = wl.generate("coding", seed=0, n_tasks=2, fixed_turns=1)  # one turn each: usage is the first turn's
    server = make_server()
    first, second = [await run(server, design, task) for task in tasks]
    shared = common_prefix_tokens(tasks[0])
    # None on the first task; on the second, whole blocks of the prefix, no more.
    assert (first.usage["cached_tokens"], second.usage["cached_tokens"]) == (0, shared - shared % BLOCK_SIZE)
    assert second.usage["input_tokens"] > second.usage["cached_tokens"] + 500


# --- one stopwatch -------------------------------------------------------------------------------------------------


RTT = 0.020
NETWORK = netem.NetworkProfile(rtt=RTT, tcp_round_trips=1, tls_round_trips=1)
RATE = 1000.0  # tokens/s
TASK = wl.fixed(3, initial_prompt_tokens=500, appended_tokens=100, output_tokens=40, tool_seconds=0.25, reasoning_tokens=10)
# Round trips turn 0 pays before its request goes out: TCP and TLS for both transports, and the upgrade on WebSocket.
CONNECT_RTTS = {"http-stateless": 2, "http-stored": 2, CHAINED: 3, SUSPENDED: 3}


def exactly(seconds: float) -> Any:
    return pytest.approx(seconds, abs=2e-6)  # the server reports phases in whole microseconds


@pytest.mark.parametrize("design", DESIGNS)
async def test_per_turn_figures_are_the_exact_virtual_times(autojump_clock, design: str) -> None:
    """docs/metrics.md's turn (from before its connection to its ending event; first token: the first output delta), at
    no API cost: its handshakes (turn 0), one round trip, the prefill, the decode of reasoning, text and arguments."""
    record = await run(make_server(), design, TASK, decode_tps=RATE, network=NETWORK)
    calls = [item for item in record.transcript if item["type"] == "function_call"]
    assert len(record.turns) == 3 and len(calls) == 2
    for turn in record.turns:
        connect = CONNECT_RTTS[design] * RTT if turn.turn == 0 else 0.0
        prefill = turn.server_timing["phases_ms"]["prefill"] / 1000
        spec = TASK.turns[turn.turn]
        args = len(tokenizer.encode(calls[turn.turn]["arguments"])) if turn.turn < 2 else 0
        assert turn.ttft == exactly(connect + RTT + prefill + (spec.reasoning_tokens + 1) / RATE), turn.turn
        assert turn.ended_at - turn.sent_at == exactly(connect + RTT + prefill + (spec.output_tokens + args) / RATE)
        assert turn.tool_seconds == (0.25 if turn.turn < 2 else 0.0)
    # The task runs from the first request's start to the final event: turns, then tools, back to back.
    assert (record.started_at, record.ended_at) == (record.turns[0].sent_at, record.turns[-1].ended_at)
    gaps = [b.sent_at - a.ended_at for a, b in zip(record.turns, record.turns[1:])]
    assert gaps == [exactly(0.25)] * 2


# --- chained continuations answer every pending call ------------------------------------------------------------


async def test_a_continuation_with_a_pending_call_is_refused_like_the_api_on_websocket_and_http(autojump_clock, nursery) -> None:
    server = make_server()
    async with ws(server, CHAINED) as conn:
        await send(conn, create_event())
        first = (await until(conn, "response.completed"))[-1]["response"]
        (call,) = function_calls(first)
        await send(conn, create_event(previous_response_id=first["id"], input="and another thing"))
        (error,) = await until(conn, "response.completed")
    assert error == invalid("invalid_function_call_output", f"No tool output found for function call {call['call_id']}.", "input")
    record = await run(server, "http-stored", wl.fixed(2))
    call_id = next(item["call_id"] for item in record.transcript if item["type"] == "function_call")
    answer = await Link(nursery, server).open().request(
        body=create_body(input="and another thing", previous_response_id=record.response_ids[0], store=True))
    assert error_of(answer, 400, "invalid_function_call_output", "input")["message"] == (
        f"No tool output found for function call {call_id}.")


# --- reasoning ---------------------------------------------------------------------------------------------------


async def test_reasoning_tokens_are_counted_and_the_blob_goes_where_the_design_needs_it(autojump_clock) -> None:
    task = wl.fixed(3, initial_prompt_tokens=300, appended_tokens=50, output_tokens=40, reasoning_tokens=15)
    server = make_server()
    records = {design: await run(server, design, task) for design in DESIGNS}
    for design, record in records.items():
        assert record.usage["output_tokens"] == 3 * 40 + sum(
            len(tokenizer.encode(i["arguments"])) for i in record.transcript if i["type"] == "function_call"), design
        assert [i["type"] for i in record.transcript].count("reasoning") == 3
    # Upload per turn: a stateless client resends every reasoning item with its blob; the others never do.
    stateless, stored = records["http-stateless"].turns, records["http-stored"].turns
    assert stateless[2].bytes_sent - stateless[1].bytes_sent > ENCRYPTED_CONTENT_MIN_CHARS > stored[2].bytes_sent
    chained_sent = [t.bytes_sent for t in records[CHAINED].turns]
    assert max([t.bytes_sent for t in records[SUSPENDED].turns][1:]) < ENCRYPTED_CONTENT_MIN_CHARS
    assert chained_sent[2] - chained_sent[1] < ENCRYPTED_CONTENT_MIN_CHARS  # no blob resent
    # Download: chained asks for the blob (as Codex does without a store), suspended never gets it.
    assert records[CHAINED].turns[0].bytes_received - records[SUSPENDED].turns[0].bytes_received > ENCRYPTED_CONTENT_MIN_CHARS


async def test_a_good_blob_restores_the_context_and_another_servers_is_carried_unread(autojump_clock) -> None:
    server = make_server()
    task = wl.fixed(2, initial_prompt_tokens=300, appended_tokens=50, output_tokens=40, reasoning_tokens=15)
    metadata = {"testbed_workload": server.api.workloads.register(task)}
    user = {"type": "message", "role": "user", "content": "fix the bug"}
    async with ws(server, CHAINED) as conn:
        await send(conn, create_event(input=[user], include=["reasoning.encrypted_content"], metadata=metadata))
        first = (await until(conn, "response.completed"))[-1]["response"]
        (reasoning,) = [item for item in first["output"] if item["type"] == "reasoning"]
        assert len(reasoning["encrypted_content"]) >= ENCRYPTED_CONTENT_MIN_CHARS
        answers = [{"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in function_calls(first)]
        # The chained continuation: the server's own context, reasoning included.
        await send(conn, create_event(input=answers, previous_response_id=first["id"], metadata=metadata))
        chained = (await until(conn, "response.completed"))[-1]["response"]
        # A stateless client resends the whole conversation; the blob brings the reasoning back.
        history = [user, *first["output"], *answers]
        await send(conn, create_event(input=history, metadata=metadata))
        stateless = (await until(conn, "response.completed"))[-1]["response"]
        # Another server's blob is carried as sent, not read: that context lacks the reasoning's text.
        foreign = [dict(item, encrypted_content="gAAAA" + item["encrypted_content"][5:]) if item["type"] == "reasoning" else item
                   for item in history]
        await send(conn, create_event(input=foreign, metadata=metadata))
        carried = (await until(conn, "response.completed"))[-1]["response"]
    # The good blob restores the context token for token: the same prompt as the chained continuation's.
    assert stateless["usage"]["input_tokens"] == chained["usage"]["input_tokens"]
    assert carried["usage"]["input_tokens"] != chained["usage"]["input_tokens"]  # a damaged blob is test_protocol's
