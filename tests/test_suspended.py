"""The suspended design (v1): one Response per rollout, paused at client calls and resumed by an exact append; a pause
past its TTL or the connection's lifetime fails it; its timings, usage, output budget and pinned KV."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, until, ws

from prototype.client.connect import InMemoryConnector
from prototype.client.harness import SUSPENDED, run_websocket_rollout
from prototype.designs.suspended import RolloutEnded, Suspension, SuspensionSlot
from prototype.engine import tokenizer
from prototype.engine.engine import Engine
from prototype.engine.latency import ENGINE_REQUEST_OVERHEAD_S, PREFILL_TOKENS_PER_S
from prototype.protocol.errors import ProtocolError
from prototype.protocol.items import FunctionCallOutput
from prototype.server.config import ServerConfig
from prototype.workload import HostedCall, TurnSpec, Workload

# One turn that makes two parallel client calls, then a final answer.
TWO_CALLS = Workload("two-calls", 3, (TurnSpec(400, 20, (0.3, 0.3)), TurnSpec(50, 20, ())))
LIMIT_MESSAGE = "Responses websocket connection limit reached (0.5 minutes). Create a new websocket connection to continue."


def invalid(code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


async def rollout_to_its_end(conn) -> dict[str, Any]:
    """Answers every pause of the rollout under way with its calls' outputs; its terminal event."""
    while (last := (await until(conn, "response.done", *TERMINALS))[-1])["type"] == "response.done":
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(last["response"]))})
    return last


async def test_first_token_time_is_exactly_the_modeled_cost(autojump_clock):
    # Zero API costs: the first token arrives after the engine overhead, the prefill of the whole
    # prompt and one decode step, nothing else.
    async with ws(make_server(), SUSPENDED) as conn:
        start = trio.current_time()
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1", "testbed_decode_tps": "1000"}))
        events = await until(conn, "response.output_text.delta")
        first_token = trio.current_time() - start
        completed = (await until(conn, "response.completed"))[-1]["response"]
    prompt_tokens = completed["usage"]["input_tokens"]
    assert events[0]["type"] == "response.created"
    assert first_token == pytest.approx(ENGINE_REQUEST_OVERHEAD_S + prompt_tokens / PREFILL_TOKENS_PER_S + 1 / 1000, rel=1e-9)


HOSTED_THEN_CLIENT = Workload("hosted", 1, (TurnSpec(500, 20, (0.3,), (HostedCall(2.0, 100),)), TurnSpec(50, 20, ())))


async def test_a_hosted_search_runs_inside_the_segment_and_the_rollout_pauses_only_at_the_client_call(autojump_clock):
    server = make_server()
    key = server.api.workloads.register(HOSTED_THEN_CLIENT)
    tools = create_event()["tools"] + [{"type": "web_search"}]
    async with ws(server, SUSPENDED) as conn:
        await send(conn, create_event(metadata={"testbed_workload": key}, tools=tools))
        events = await until(conn, "response.done")
        types = [e["type"] for e in events]
        searching = types.index("response.web_search_call.searching")
        completed_at = types.index("response.web_search_call.completed")
        assert searching < completed_at < types.index("response.function_call_arguments.done")
        done = events[-1]["response"]
        assert done["status"] == "in_progress"
        assert [i["type"] for i in done["output"]] == ["web_search_call", "message", "function_call"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(done))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    assert final["id"] == done["id"]
    assert [i["type"] for i in final["output"]] == ["web_search_call", "message", "function_call", "message"]


async def test_a_rollout_failed_at_its_ttl_carries_its_id_and_the_timings_of_the_segment_it_ends(autojump_clock, link):
    # When it fails, with what message, what it releases and that the connection serves on: test_limits.py.
    async with ws(make_server(config=ServerConfig(suspension_ttl=7.5)), SUSPENDED, network=link, include_timing=True) as conn:
        await send(conn, create_event())
        done = (await until(conn, "response.done"))[-1]
        failed = await receive(conn)
    assert (failed["type"], failed["response"]["id"], failed["response"]["status"]) == (
        "response.failed", done["response"]["id"], "failed")
    assert failed["response"]["testbed_timing"]["phases_ms"]["prefill"] > 0


async def test_bad_inputs_get_their_own_codes_and_the_connection_stays_usable(autojump_clock, link):
    server = make_server()
    key = server.api.workloads.register(TWO_CALLS)
    async with ws(server, SUSPENDED, network=link) as conn:
        await send(conn, {"type": "response.append", "input": [output("call_1")]})
        assert await receive(conn) == invalid(
            "no_suspended_response", "response.append: no response is waiting for tool output on this connection.", None)
        await send(conn, "{not json")
        assert (await receive(conn))["error"]["code"] == "invalid_json"
        await send(conn, {"type": "response.fly"})
        assert await receive(conn) == invalid("unknown_event_type", "Unknown event type 'response.fly'.", "type")
        await send(conn, create_event(previous_response_id="resp_1"))
        assert (await receive(conn))["error"]["code"] == "unsupported_parameter"
        await send(conn, create_event(generate=False))
        assert (await receive(conn))["error"]["param"] == "generate"
        # An append that does not answer exactly the pending calls is refused with its reason.
        await send(conn, create_event(metadata={"testbed_workload": key}))
        done = (await until(conn, "response.done"))[-1]["response"]
        first, second = (call["call_id"] for call in function_calls(done))
        assert (first, second) == ("call_2", "call_3")  # named by their place in the conversation (input, message, calls)
        refusals = [
            ([output(first), output(first)], "a call_id is answered twice"),
            ([output(first), output(second), output("call_zz"), output("call_aa")], "call_id 'call_aa' is not pending"),
            ([output(second)], f"no function_call_output for pending call_id '{first}'"),
            ([output(first)], f"no function_call_output for pending call_id '{second}'"),
            ([], f"no function_call_output for pending call_id '{first}'")]
        for items, problem in refusals:
            await send(conn, {"type": "response.append", "input": items})
            assert await receive(conn) == invalid("invalid_function_call_output", f"response.append: {problem}.", "input")
        # Every refusal left the rollout paused: the exact answer resumes it.
        await send(conn, {"type": "response.append", "input": [output(second), output(first)]})
        resumed = await receive(conn)
        assert (resumed["type"], resumed["response"]["id"]) == ("response.in_progress", done["id"])
        assert (await until(conn, "response.completed"))[-1]["response"]["status"] == "completed"


def workloads():
    """Random tasks: 1 to 5 turns of 1 to 30 output tokens, each but the last ending in a call of 0, 0.1 or 2 s."""
    turn = st.tuples(st.integers(1, 30), st.sampled_from([0.0, 0.1, 2.0]))
    return st.builds(lambda turns, seed: Workload("random", seed, tuple(
        TurnSpec(200 if i == 0 else 30, out, (tool,) if i < len(turns) - 1 else ()) for i, (out, tool) in enumerate(turns))),
        st.lists(turn, min_size=1, max_size=5), st.integers(0, 2**31))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=workloads())
def test_every_rollout_ends_with_one_terminal_and_increasing_sequence_numbers_and_both_designs_give_one_transcript(task):
    async def main():
        records = {}
        for design in ("suspended", "chained"):
            server = make_server()
            key = server.api.workloads.register(task)
            records[design] = await run_websocket_rollout(InMemoryConnector(server), design, task, metadata={"testbed_workload": key})
        return records

    records = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for design, record in records.items():
        assert record.status == "completed" and len(record.turns) == len(task.turns)
        terminals = [e for _, d, e in record.timeline if d == "recv" and e in TERMINALS]
        assert len(terminals) == len(record.response_ids) == (1 if design == "suspended" else len(task.turns))
        for response_id in record.response_ids:
            numbers = [n for r, n in record.sequence_numbers if r == response_id]
            assert numbers == list(range(len(numbers)))
    suspended, chained = records.values()
    assert suspended.transcript == chained.transcript  # the task's message, three items a call, the final message
    assert len(suspended.transcript) == 1 + 3 * (len(task.turns) - 1) + 1
    assert [suspended.usage[key] for key in ("input_tokens", "output_tokens")] == [chained.usage[key] for key in ("input_tokens", "output_tokens")]


async def test_a_second_append_right_after_the_first_gets_an_error_and_the_first_is_applied(autojump_clock, link, monkeypatch):
    # A second append read before the resumed rollout runs must not replace the first one's items; a slow
    # `resumed` (its send blocked for 0.1 s) holds that window open every time.
    from prototype.designs import suspended
    from prototype.designs.emitter import Emitter

    original_resumed, original_answer, applied = Emitter.resumed, suspended.ClientOverSocket.answer, []

    async def slow_resumed(self, at=None):
        await trio.sleep(0.1)
        await original_resumed(self, at)

    async def spy_answer(self, calls):
        items = await original_answer(self, calls)
        applied.append([item.output for item in items])
        return items

    monkeypatch.setattr(Emitter, "resumed", slow_resumed)
    monkeypatch.setattr(suspended.ClientOverSocket, "answer", spy_answer)
    async with ws(make_server(), SUSPENDED, network=link) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2"}))
        done = (await until(conn, "response.done"))[-1]["response"]
        calls = function_calls(done)
        await send(conn, {"type": "response.append", "input": outputs_for(calls, "first")})
        await send(conn, {"type": "response.append", "input": outputs_for(calls, "second")})
        events = []
        while not any(e["type"] == "response.completed" for e in events) or not any(e["type"] == "error" for e in events):
            events.append(await receive(conn, timeout=5))
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["no_suspended_response"]
    assert applied == [["first"] * len(calls)] and [e["type"] for e in events].count("response.in_progress") == 1


# --- the connection's lifetime ends a rollout ----------------------------------------------------------


async def first_segment(config: ServerConfig) -> tuple[float, list[dict[str, Any]], dict[str, Any] | None]:
    """A v1 rollout whose first segment streams 300 tokens at 10 tokens/s (30 s): (seconds from the
    create to the event ending the segment, the events up to it, the error after it if any)."""
    server = make_server(config=config)
    async with ws(server, "suspended") as conn:
        opened = trio.current_time()
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}))
        events = await until(conn, "response.failed", "response.done")
        ended = trio.current_time() - opened
        error = await receive(conn) if events[-1]["type"] == "response.failed" else None
    assert server.api.engine.kv == {}
    return ended, events, error


async def test_a_streaming_rollout_fails_where_it_would_pause_once_the_lifetime_is_reached(autojump_clock) -> None:
    paused_at, paused, _ = await first_segment(ServerConfig())
    failed_at, events, error = await first_segment(ServerConfig(connection_lifetime=20.0))
    # The segment streams to its end, past the 20 s lifetime, then fails where it would have paused.
    assert failed_at == pytest.approx(paused_at, abs=1e-9) and paused_at > 20.0
    assert [e["type"] for e in events] == [e["type"] for e in paused[:-1]] + ["response.failed"]
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["type"] == "function_call"
    failed = events[-1]["response"]
    message = "Responses websocket connection limit reached (0.333333 minutes). Create a new websocket connection to continue."
    assert (failed["status"], failed["error"]) == ("failed", {"code": "server_error", "message": message})
    assert error["error"] == {"type": "invalid_request_error", "code": "websocket_connection_limit_reached", "message": message, "param": None}


async def test_once_the_connection_closes_a_paused_rollout_wakes_to_fail_and_no_append_is_taken() -> None:
    limit, slot = ProtocolError("websocket_connection_limit_reached", LIMIT_MESSAGE), SuspensionSlot()
    paused = slot.current = Suspension(("call_1",))
    slot.end(limit)
    assert (slot.current, slot.ended, paused.answered) == (None, limit, True)
    with pytest.raises(ProtocolError) as refused:
        slot.deliver([FunctionCallOutput("call_1", "ok")], 0.0)
    assert refused.value.code == "no_suspended_response"
    with pytest.raises(RolloutEnded) as ended:
        await paused.wait()
    assert (ended.value.reason, str(ended.value)) == (limit, LIMIT_MESSAGE)
    # An append taken before the end is still applied: the rollout resumes with it.
    answered, items = Suspension(("call_2",)), [FunctionCallOutput("call_2", "ok")]
    answered.deliver(items, 0.0)
    answered.end(limit)
    assert await answered.wait() == items


# --- what a rollout reports: its timings, its usage, its output budget -----------------------------------


async def test_v1_timings_carry_the_queue_and_client_and_each_pause_only_its_segment(autojump_clock) -> None:
    async with ws(make_server(), "suspended", include_timing=True) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:3"}))
        first = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(first))})
        resumed = await receive(conn)
        resumed_at = trio.current_time()
        second = (await until(conn, "response.done"))[-1]["response"]
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(second))})
        final = (await until(conn, "response.completed"))[-1]["response"]
    assert resumed["type"] == "response.in_progress"
    # Each pause's usage is the rollout's so far: it grows to the final usage (docs/protocol.md).
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert 0 < first["usage"][key] < second["usage"][key] < final["usage"][key], key
    # Every event carries what the connection logged of the create (its client record); the first
    # pause carries the rollout from its arrival, the queue included.
    for response in (first, second, final):
        assert response["testbed_timing"]["client"]["design"] == "suspended"
    assert "queue" in first["testbed_timing"]["phases_ms"]
    # A later pause carries its own segment only: from the resume on.
    timing = second["testbed_timing"]
    assert "queue" not in timing["phases_ms"] and timing["origin_s"] == resumed_at and timing["spans"][0][1] == 0.0


# Turn 1: 16 reasoning tokens, 24 of text and a call; turn 2: 10 reasoning tokens and 20 of text.
BUDGETED = Workload("budgeted", 2, (TurnSpec(300, 40, (0.3,), (), 16), TurnSpec(50, 30, (), (), 10)))


def message_tokens(item: dict[str, Any]) -> int:
    return len(tokenizer.encode(item["content"][0]["text"]))


@pytest.mark.parametrize(("budget", "expected"), [
    (None, [("reasoning", 16, "completed"), ("message", 24, "completed"), ("function_call", None, "completed"),
            ("reasoning", 10, "completed"), ("message", 20, "completed")]),
    # Reasoning is sampled only if the budget leaves room after it; text fills what is left.
    (16, [("message", 16, "incomplete")]),  # 16 is the API's least budget
    (20, [("reasoning", 16, "completed"), ("message", 4, "incomplete")]),
    # Exactly enough for the first turn: it completes and calls; the second turn has nothing left.
    (40, [("reasoning", 16, "completed"), ("message", 24, "completed"), ("function_call", None, "completed"), ("message", 0, "incomplete")]),
    (60, [("reasoning", 16, "completed"), ("message", 24, "completed"), ("function_call", None, "completed"),
          ("reasoning", 10, "completed"), ("message", 10, "incomplete")])])
async def test_a_v1_rollouts_output_budget_runs_across_its_turns_and_it_is_stored_with_its_final_status(autojump_clock, budget, expected) -> None:
    server = make_server()
    key = server.api.workloads.register(BUDGETED)
    async with ws(server, SUSPENDED, include_timing=True) as conn:
        await send(conn, create_event(metadata={"testbed_workload": key}, max_output_tokens=budget, store=True))
        last = await rollout_to_its_end(conn)
    response = last["response"]
    status, details = ("completed", None) if budget is None else ("incomplete", {"reason": "max_output_tokens"})
    assert (last["type"], response["status"], response["incomplete_details"]) == (f"response.{status}", status, details)
    reasoning = iter([16, 10])
    shape = [(item["type"], message_tokens(item) if item["type"] == "message" else next(reasoning) if item["type"] == "reasoning" else None,
              item["status"]) for item in response["output"]]
    assert shape == expected
    usage, stats = response["usage"], server.api.engine.stats
    assert usage["output_tokens_details"]["reasoning_tokens"] == sum(n for kind, n, _ in expected if kind == "reasoning")
    # Usage sums every model call's tokens, the cached ones included.
    assert usage["input_tokens_details"]["cached_tokens"] == stats.cached_tokens
    assert usage["input_tokens"] == stats.prefill_tokens + stats.cached_tokens
    assert usage["output_tokens"] == stats.decoded_tokens  # every turn's tokens, each decoded once
    if budget is None:
        assert stats.model_calls == 2 and stats.cached_tokens > 0
        (call,) = [item for item in response["output"] if item["type"] == "function_call"]
        assert usage["output_tokens"] == 40 + 30 + len(tokenizer.encode(call["arguments"]))
    assert response["testbed_timing"]["phases_ms"]["prefill"] > 0
    stored = server.api.store.get(response["id"]).response
    assert (stored["status"], stored["incomplete_details"]) == (status, None)  # stored before the terminal event


@pytest.mark.parametrize(("design", "shared"), [("suspended", True), ("chained", False)])
async def test_a_v1_rollouts_kv_serves_other_sessions_through_its_decode_past_the_idle_ttl(autojump_clock, design, shared) -> None:
    # A v1 rollout's KV is held from its prefill on: a lookup during its decode finds its blocks; an unpinned
    # (chained) call's KV is idle-timed from its last use, so past the TTL the same lookup finds nothing.
    server = make_server(engine=Engine(kv_ttl=0.05))
    frame = create_event(metadata={"testbed_workload": "fixed:1:2000:10:30", "testbed_decode_tps": "10"})
    cached: dict[str, int] = {}
    prompt_tokens: dict[str, int] = {}

    async def one(name: str, path: str, delay: float) -> None:
        await trio.sleep(delay)
        async with ws(server, path) as conn:
            await send(conn, frame)
            response = (await until(conn, "response.done", *TERMINALS))[-1]["response"]
            usage = response["usage"]
            cached[name], prompt_tokens[name] = usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first", design, 0.0)
        nursery.start_soon(one, "second", "chained", 1.0)  # 1 s into the first's 3 s decode
    assert cached["first"] == 0 and prompt_tokens["first"] == prompt_tokens["second"] > 16
    # The same prompt: its whole blocks, never its last token (`KVResidency.cached_prefix`).
    assert cached["second"] == ((prompt_tokens["second"] - 1) // 16 * 16 if shared else 0)
