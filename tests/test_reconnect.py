"""Clients that reconnect (client/reconnect.py, reconnecting.py) and the faults that make them (netem/faults.py, the
engine's FaultPlan), on the autojump clock with seeded faults; a retried conversation equals the fault-free one."""

from __future__ import annotations

import json
import random
import types
from typing import Any

import attrs
import pytest
import trio
import trio.testing
import trio_websocket
from openai.types.websocket_reconnection import is_recoverable_close
from support import Close, Pause, ScriptedServer

from prototype import benchmark, netem
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector, RoundRobinConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED, RolloutRecord, request_body, task_prompt
from prototype.client.http import STATELESS, STORED, run_http_rollout
from prototype.client.reconnect import CODEX, NEVER, OPENAI_PYTHON, ReconnectPolicy
from prototype.client.reconnecting import OPEN_TIMEOUT_SECONDS, ReconnectingRollout, _close_code, run_reconnecting_rollout
from prototype.engine.engine import Engine
from prototype.engine.streaming import FaultPlan
from prototype.netem.faults import LinkFaults
from prototype.protocol import errors
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from prototype.workload import fixed

TASK = fixed(4, initial_prompt_tokens=200, appended_tokens=50, output_tokens=40, tool_seconds=10.0)
DELAYED = netem.NetworkProfile(rtt=0.020)
LINKS = [None, DELAYED]
LINK_IDS = ["pipe", "20ms"]
# No jitter: every wait of the backoff is exact.
STEADY = ReconnectPolicy("steady", initial_delay=0.5, max_retries=5)
CODEX_STEADY = attrs.evolve(CODEX, jitter=(1.0, 1.0))


def server_with(lifetime: float = 3600.0, **api: Any) -> ResponsesServer:
    return ResponsesServer(ApiService(costs=ZERO_COSTS, **api), ServerConfig(connection_lifetime=lifetime))


async def converse(server: ResponsesServer, design: str, *, network: netem.NetworkProfile | None = None,
                   faults: LinkFaults | None = None, policy: ReconnectPolicy = OPENAI_PYTHON, store: bool = False,
                   connector: Any = None, task: Any = TASK) -> RolloutRecord:
    metadata = {"testbed_workload": server.api.workloads.register(task), "testbed_decode_tps": "100"}
    connector = connector or InMemoryConnector(server, network, faults=faults)
    with trio.fail_after(600):
        if design.startswith("http"):
            return await run_http_rollout(connector, task, variant=STORED if store else STATELESS, metadata=metadata, policy=policy)
        return await run_reconnecting_rollout(connector, design, task, policy, metadata=metadata, store=store)


def plain(record: RolloutRecord) -> list[str]:
    """The timeline without deltas and per-item events: requests, pauses, ends, errors."""
    keep = {"response.create", "response.append", "response.created", "response.done", "response.completed", "response.failed", "error"}
    return [f"{direction} {kind}" for _, direction, kind in record.timeline if kind in keep]


def assert_each_completed_event_once(record: RolloutRecord) -> None:
    """Every response the client saw complete has each sequence number once, from 0, without a gap."""
    completed = {rid for rid, status in record.outcomes.items() if status == "completed"}
    assert completed
    for rid in completed:
        numbers = sorted(n for r, n in record.sequence_numbers if r == rid)
        assert numbers == list(range(len(numbers)))


def test_openai_python_backs_off_from_half_a_second_to_eight_after_exactly_its_recoverable_close_codes() -> None:
    rng = random.Random(0)
    for attempt, base in enumerate([0.5, 1, 2, 4, 8, 8], start=1):
        assert 0.75 * base <= OPENAI_PYTHON.delay(attempt, rng) < base
    assert OPENAI_PYTHON.retries_after_close(None) and not OPENAI_PYTHON.fallback_to_http
    retried = {code for code in range(1000, 5000) if OPENAI_PYTHON.retries_after_close(code)}
    assert retried == {1001, 1005, 1006, 1011, 1012, 1013, 1015}
    # The installed SDK's own decision (openai-python `types/websocket_reconnection.py`), code for code.
    assert all(OPENAI_PYTHON.retries_after_close(code) == is_recoverable_close(code) for code in range(1000, 5000))


def test_codex_backs_off_from_200_ms_doubling_then_https_and_each_wait_is_its_capped_backoff_times_one_jitter_draw() -> None:
    rng = random.Random(0)
    for attempt, base in enumerate([0.2, 0.4, 0.8, 1.6, 3.2], start=1):
        assert 0.9 * base <= CODEX.delay(attempt, rng) < 1.1 * base
    assert CODEX.retries_after_close(1000) and CODEX.retries_after_close(4000)
    assert CODEX.max_retries == 5 and CODEX.fallback_to_http and STEADY.worst_case_wait == 0.5 + 1 + 2 + 4 + 8
    # Each wait is its capped backoff times one draw from the jitter; the worst case sums them at the top.
    policy = ReconnectPolicy("six", max_retries=6, initial_delay=0.5, backoff_factor=3.0, max_delay=10.0, jitter=(0.5, 2.0))
    rng, same = random.Random(7), random.Random(7)
    bases = [0.5, 1.5, 4.5, 10.0, 10.0, 10.0]  # tripling from half a second, capped at 10 s
    assert [policy.delay(attempt, rng) for attempt in range(1, 7)] == [base * same.uniform(0.5, 2.0) for base in bases]
    assert policy.worst_case_wait == sum(bases) * 2.0
    # Without jitter no number is drawn: the waits are the backoff itself and the generator is left as it was.
    steady, state = attrs.evolve(policy, jitter=(1.5, 1.5)), rng.getstate()
    assert ([steady.delay(attempt, rng) for attempt in range(1, 7)], rng.getstate()) == ([base * 1.5 for base in bases], state)


CALL = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}
LOST_ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "cut"}]}
LIMIT = "websocket_connection_limit_reached"
ONE_TURN = fixed(1, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, name="one-turn")
# Two turns: the call, whose tool runs 2 s, then the answer.
TWO_TURNS = fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0, name="two-turns")
TWICE = ReconnectPolicy("twice", initial_delay=0.5, max_retries=2)  # openai-python's rules, its own numbers
# Codex's rules (the connection limit is a retryable stream error; one count per request) with the same numbers.
TWICE_CODEX = attrs.evolve(TWICE, name="twice-codex", reconnect_errors=frozenset({LIMIT}), reset_on_any_event=False)


def created_event(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}}


def response_events(kind: str, response_id: str, *output: dict[str, Any], status: str = "completed") -> list[dict[str, Any]]:
    """A response's events: created, each output item done, then `kind` (a pause or an end)."""
    items = [{"type": "response.output_item.done", "item": item} for item in output]
    return [created_event(response_id), *items, {"type": kind, "response": {"id": response_id, "status": status, "output": list(output)}}]


def first_turn(design: str, response_id: str = "resp_0") -> list[dict[str, Any]]:
    """Turn 0's response, ending in the call: paused (v1) or completed (chained)."""
    if design == SUSPENDED:
        return response_events("response.done", response_id, CALL, status="in_progress")
    return response_events("response.completed", response_id, CALL)


def failed(response_id: str, code: str) -> dict[str, Any]:
    return {"type": "response.failed",
            "response": {"id": response_id, "status": "failed", "output": [], "error": {"code": code, "message": code}}}


def failed_by_the_limit(response_id: str) -> dict[str, Any]:
    """A response the connection limit cut, as the server fails it: `server_error`, with the limit's message."""
    error = errors.response_error(errors.connection_limit_reached(60).message)
    return {"type": "response.failed", "response": {"id": response_id, "status": "failed", "output": [], "error": error}}


def error(code: str) -> dict[str, Any]:
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": code}}


async def reconnecting(server: ScriptedServer, design: str = CHAINED, policy: ReconnectPolicy = TWICE, task: Any = TWO_TURNS,
                       **options: Any) -> RolloutRecord:
    with trio.fail_after(600):
        return await run_reconnecting_rollout(InMemoryConnector(server), design, task, policy, metadata=options.pop("metadata", {}),
                                              **options)


def frame_kinds(server: ScriptedServer) -> list[tuple[int, str, str | None]]:
    return [(connection, event["type"], event.get("previous_response_id")) for connection, event in server.received]


# openai-python's codes whose close a server can send (1005, 1006 and 1015 never travel in a close frame: a broken
# link reads as 1006, test_mid_response_drops_lose_and_repeat_nothing), and codes outside them.
@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 3000, 4000])
async def test_a_close_under_a_response_is_retried_by_openai_python_for_its_codes_only(autojump_clock, code: int) -> None:
    server = ScriptedServer([[created_event("resp_0"), Close(code)], response_events("response.completed", "resp_1")])
    record = await reconnecting(server, policy=attrs.evolve(OPENAI_PYTHON, jitter=(1.0, 1.0)), task=ONE_TURN)
    if is_recoverable_close(code):
        assert (record.status, record.reconnects, server.connections, trio.current_time()) == ("completed", 1, 2, 0.5)
    else:
        assert (record.status, record.reconnects, server.connections) == (f"error:closed_{code}", 0, 1)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_the_connection_limit_ends_the_task_under_openai_python(autojump_clock, design: str) -> None:
    # Chained: the next create is answered by the limit. v1: the limit came while the resumed rollout streamed: it
    # fails at its next pause, then the error and the close.
    server = ScriptedServer([first_turn(design), [*([failed_by_the_limit("resp_0")] if design == SUSPENDED else []), error(LIMIT), Close(1000)]])
    record = await reconnecting(server, design, OPENAI_PYTHON)
    assert (record.status, record.reconnects, record.retried_responses, server.connections) == (f"error:{LIMIT}", 0, 0, 1)
    assert trio.current_time() == record.ended_at == record.turns[1].ended_at == 2.0
    assert record.outcomes == ({"resp_0": "failed"} if design == SUSPENDED else {"resp_0": "completed"})
    # The task's first response cut by the limit ends its one turn there, asking nothing again.
    server = ScriptedServer([[created_event("resp_0"), failed_by_the_limit("resp_0"), error(LIMIT), Close(1000)]])
    record = await reconnecting(server, design, OPENAI_PYTHON, task=ONE_TURN)
    assert (record.status, record.retried_responses, len(server.received), len(record.turns)) == (f"error:{LIMIT}", 0, 1, 1)
    assert record.turns[0].ended_at == record.ended_at == 2.0


async def test_a_request_answered_by_the_connection_limit_goes_again_after_a_backoff_on_a_new_connection_under_codex(
        autojump_clock) -> None:
    server = ScriptedServer([first_turn(CHAINED), [error(LIMIT), Close(1000)], response_events("response.completed", "resp_1", ANSWER)])
    record = await reconnecting(server, CHAINED, TWICE_CODEX)
    # The refused create goes again on a new connection after the first backoff, still continuing the chain.
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", "resp_0"), (1, "response.create", "resp_0")]
    assert server.received[1][1] == server.received[2][1]
    assert (record.reconnects, record.full_resends, record.retried_responses, record.recovery_seconds) == (1, 0, 0, [0.5])
    assert trio.current_time() == record.ended_at == 2.5  # the tool's 2 s, then the 0.5 s backoff
    size = len(json.dumps(server.received[1][1], separators=(",", ":")))
    assert (record.turns[1].bytes_sent, record.resent_bytes) == (2 * size, size)
    assert (record.status, record.transcript[-1], len(record.turns)) == ("completed", ANSWER, 2)


async def test_a_v1_response_failed_by_the_connection_limit_starts_over_with_the_whole_conversation_under_codex(autojump_clock) -> None:
    server = ScriptedServer([
        first_turn(SUSPENDED),
        # The limit came while the resumed segment streamed: it fails at its next pause, then the error and the close.
        [{"type": "response.in_progress", "response": {"id": "resp_0", "status": "in_progress", "output": []}},
         {"type": "response.output_item.done", "item": LOST_ITEM}, failed_by_the_limit("resp_0"), error(LIMIT), Close(1000)],
        response_events("response.completed", "resp_1", ANSWER)])
    record = await reconnecting(server, SUSPENDED, TWICE_CODEX)
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.append", None), (1, "response.create", None)]
    outputs = server.received[1][1]["input"]
    assert [item["type"] for item in outputs] == ["function_call_output"]
    assert server.received[2][1]["input"] == [*server.received[0][1]["input"], CALL, *outputs]  # all of it, the outputs it owed
    assert (record.reconnects, record.full_resends, record.retried_responses, record.recovery_seconds) == (1, 1, 0, [0.5])
    assert trio.current_time() == record.ended_at == 2.5
    assert LOST_ITEM not in record.transcript and record.transcript[-1] == ANSWER
    assert (record.status, record.outcomes) == ("completed", {"resp_0": "failed", "resp_1": "completed"})


# openai-python counts failed responses in a row, Codex in its one count of attempts: with no lost connection between
# them, both retry the same times after the same waits.
@pytest.mark.parametrize("policy", [TWICE, TWICE_CODEX], ids=["openai-python", "codex"])
@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_failed_responses_are_retried_from_the_last_turn_until_the_policy_gives_up(autojump_clock, design: str,
                                                                                         policy: ReconnectPolicy) -> None:
    server = ScriptedServer([
        [created_event("resp_0"), failed("resp_0", "server_error")],
        first_turn(design, "resp_1"),
        # Turn 1 fails three times: the policy retries it twice (0.5 s, then 1 s), then the task fails.
        *[[created_event(f"resp_{n}"), failed(f"resp_{n}", "server_error")] for n in (2, 3, 4)]])
    record = await reconnecting(server, design, policy)
    follow = "response.append" if design == SUSPENDED else "response.create"
    previous = None if design == SUSPENDED else "resp_1"
    # Each retry asks again for what the failed response was asked: a turn that failed is sent as it was, from its
    # last completed turn; the turn after a success starts with its attempts counted from one again.
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", None), (0, follow, previous),
                                   (0, "response.create" if design == SUSPENDED else follow, previous),
                                   (0, "response.create" if design == SUSPENDED else follow, previous)]
    assert (record.status, record.retried_responses, record.reconnects, record.recovery_seconds) == (
        "failed", 3, 0, [0.5, 0.5, 1.0])
    assert trio.current_time() == record.ended_at == 0.5 + 2.0 + 0.5 + 1.0 and len(record.turns) == 2
    assert record.resent_bytes == record.turns[0].bytes_sent // 2 + record.turns[1].bytes_sent - len(
        json.dumps(server.received[2][1], separators=(",", ":")))
    # A policy that does not retry failed responses fails the task at once.
    server = ScriptedServer([[created_event("resp_0"), failed("resp_0", "server_error")]])
    record = await reconnecting(server, design, attrs.evolve(TWICE, retry_failed_responses=False))
    assert (record.status, record.retried_responses, record.recovery_seconds, len(server.received)) == ("failed", 0, [], 1)


async def test_an_error_event_does_not_reset_openai_pythons_count_of_attempts(autojump_clock) -> None:
    # A chain lost with its connection: the first event on the new one is `previous_response_not_found`, and the whole
    # conversation goes again. That connection closes before any other event: the second attempt in a row.
    server = ScriptedServer([first_turn(CHAINED), [Close(1011)], [error("previous_response_not_found")], [Close(1011)]])
    record = await reconnecting(server, CHAINED, attrs.evolve(TWICE, max_retries=1))
    assert (record.status, record.reconnects, server.connections, trio.current_time()) == ("error:gave_up", 1, 2, 2.5)
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", "resp_0"),
                                   (1, "response.create", "resp_0"), (1, "response.create", None)]


async def test_a_turn_whose_connection_closed_under_its_tools_starts_when_they_returned(autojump_clock) -> None:
    completed = {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [ANSWER], "note": "é"}}
    server = ScriptedServer([
        [*first_turn(CHAINED), Close(1011)],  # the server goes away while the tool runs
        # The retried request, its answer 1 s after its first event; one event comes as a binary frame.
        [created_event("resp_1"), Pause(1.0), json.dumps({"type": "response.output_item.done", "item": ANSWER}).encode(), completed],
    ])
    record = await reconnecting(server)
    assert (record.status, record.reconnects) == ("completed", 1)
    # The create found the connection closed (1011: retried), waited 0.5 s and went on a new connection, where the chain
    # was asked for as the client last knew it.
    assert frame_kinds(server) == [(0, "response.create", None), (1, "response.create", "resp_0")]
    assert (record.turns[1].sent_at, record.turns[1].ended_at, record.ended_at) == (2.0, 3.5, 3.5)
    assert record.recovery_seconds == [0.5]  # from the failure to the retried response's first event
    received = [json.dumps(created_event("resp_1")), json.dumps({"type": "response.output_item.done", "item": ANSWER}),
                json.dumps(completed, ensure_ascii=False)]
    assert record.turns[1].bytes_received == sum(len(text.encode()) for text in received)


@pytest.mark.parametrize(("design", "store"), [(CHAINED, None), (SUSPENDED, False), (SUSPENDED, True), (CHAINED, True)])
async def test_the_reconnecting_client_sends_the_harness_request_with_the_defaults_or_the_callers_options(
        autojump_clock, design: str, store: bool | None) -> None:
    server = ScriptedServer([response_events("response.completed", "resp_0", ANSWER)])
    await trio.sleep(1.0)
    options = {} if store is None else {"model": "m", "store": store, "include_timing": True, "api_key": "key-1",
                                        "instructions": "mine"}
    record = await reconnecting(server, design, metadata={"k": "v"}, **options)
    assert (record.design, record.workload, record.status, record.started_at, record.ended_at) == (
        design, "two-turns", "completed", 1.0, 1.0)
    headers = server.headers[0]
    assert (headers["authorization"], headers.get("x-responsesapi-include-timing-metrics"), headers["openai-beta"]) == (
        ("Bearer testbed", None, BETA[design]) if store is None else ("Bearer key-1", "true", BETA[design]))
    prompt = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TWO_TURNS)}]}]
    # Only an unstored chain asks for the reasoning blob it would need to resend the conversation (v1 never needs it).
    body = (request_body(TWO_TURNS, model="gpt-5.4", metadata={"k": "v"}, store=False, include_reasoning=True) if store is None
            else request_body(TWO_TURNS, model="m", metadata={"k": "v"}, store=store, instructions="mine"))
    assert server.received[0][1] == {"type": "response.create", **body, "input": prompt}
    with pytest.raises(ValueError, match=r"^design must be 'suspended' or 'chained', not 'http'$"):  # the WebSocket designs only
        ReconnectingRollout(InMemoryConnector(None), "http", TWO_TURNS, TWICE, metadata={})


@pytest.mark.parametrize("seed", [0, 7])
async def test_the_backoffs_jitter_is_drawn_from_the_seed_and_the_task(autojump_clock, seed: int) -> None:
    policy = ReconnectPolicy("jittered", initial_delay=1.0, max_retries=2, jitter=(0.5, 1.5))
    server = ScriptedServer([[created_event("resp_0"), Close(1011)], response_events("response.completed", "resp_0", ANSWER)])
    record = await reconnecting(server, CHAINED, policy, **({} if seed == 0 else {"seed": seed}))
    assert (record.status, record.reconnects) == ("completed", 1)
    assert trio.current_time() == policy.delay(1, random.Random(f"reconnect:{seed}:two-turns"))


async def test_a_refused_connection_is_retried_with_the_policys_backoff_until_it_gives_up(autojump_clock) -> None:
    server = ScriptedServer([response_events("response.completed", "resp_0", ANSWER)])
    connector = InMemoryConnector(server, refusing=True)  # nothing listens until 0.7 s

    async def accept_later() -> None:
        await trio.sleep(0.7)
        connector.refusing = False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_later)
        with trio.fail_after(60):
            record = await run_reconnecting_rollout(connector, CHAINED, TWO_TURNS, TWICE, metadata={})
    # Refused at 0 and at 0.5 s; the third attempt, after 1 s more, connects.
    assert (record.status, record.reconnects, record.recovery_seconds, record.ended_at) == ("completed", 2, [1.5], 1.5)
    assert (record.turns[0].sent_at, server.connections) == (0.0, 1)
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(InMemoryConnector(ScriptedServer([]), refusing=True), CHAINED, TWO_TURNS, TWICE, metadata={})
    assert (record.status, record.reconnects, record.ended_at - record.started_at, record.turns) == ("error:gave_up", 2, 1.5, [])


async def test_a_reconnecting_task_ends_at_its_final_event_not_after_its_close(autojump_clock) -> None:
    server = ScriptedServer([response_events("response.completed", "resp_0", ANSWER)])
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(InMemoryConnector(server, netem.NetworkProfile(rtt=0.1)), CHAINED, TWO_TURNS, TWICE,
                                                metadata={})
    # Three round trips of handshakes, then the create and its answer; the close handshake after it is not the task's.
    assert (record.status, record.turns[0].sent_at, record.ended_at) == ("completed", 0.0, pytest.approx(0.4))
    assert trio.current_time() > record.ended_at


def ClosedSocket(code: int | None) -> types.SimpleNamespace:  # noqa: N802
    """A connection as `_close_code` reads one: the reason it closed with, if it did."""
    return types.SimpleNamespace(closed=None if code is None else trio_websocket.CloseReason(code, None))


def test_the_close_code_is_the_closes_own_else_the_connections() -> None:
    # An error with a `reason` of its own (as ssl.SSLError has), not a close reason.
    LinkErrorWithReason = type("LinkErrorWithReason", (OSError,), {"reason": "WRONG_VERSION_NUMBER"})  # noqa: N806
    closed = trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1011, "engine"))
    assert _close_code(closed, None) == 1011 and _close_code(closed, ClosedSocket(1000)) == 1011  # type: ignore[arg-type]
    assert _close_code(trio_websocket.ConnectionClosed(None), ClosedSocket(1006)) == 1006  # type: ignore[arg-type]
    assert _close_code(LinkErrorWithReason("tls"), ClosedSocket(1006)) == 1006  # type: ignore[arg-type]
    assert _close_code(trio.BrokenResourceError(), ClosedSocket(None)) is None  # type: ignore[arg-type]
    assert _close_code(OSError("refused"), None) is None


@pytest.mark.parametrize("policy", ["openai-python", "codex"])
async def test_responses_cut_after_their_first_event_spend_a_retry_under_codex_only(autojump_clock, policy: str) -> None:
    # Seven responses in a row break after their response.created (close 1011, retried by both), then one completes.
    # openai-python resets its count at every event (`_record_websocket_progress`): each reconnect is a first attempt,
    # after 0.5 s. Codex counts one sampling request once (codex-rs `responses_retry.rs`): without its HTTPS fallback,
    # the sixth cut is one more than its 5 retries.
    cut = [[created_event(f"resp_{n}"), Close(1011)] for n in range(7)]
    server = ScriptedServer([*cut, response_events("response.completed", "resp_7")])
    if policy == "codex":
        record = await reconnecting(server, policy=attrs.evolve(CODEX_STEADY, fallback_to_http=False), task=ONE_TURN)
        assert (record.status, record.reconnects, server.connections) == ("error:gave_up", 5, 6)
        assert trio.current_time() == pytest.approx(0.2 + 0.4 + 0.8 + 1.6 + 3.2)
        return
    record = await reconnecting(server, policy=attrs.evolve(OPENAI_PYTHON, jitter=(1.0, 1.0)), task=ONE_TURN)
    assert (record.status, record.reconnects, server.connections, record.recovery_seconds) == ("completed", 7, 8, [0.5] * 7)
    assert trio.current_time() == record.ended_at == 7 * 0.5


async def test_openai_python_ends_the_task_at_the_limits_clean_close_or_error_and_opens_no_new_connection(autojump_clock) -> None:
    server = server_with(lifetime=15)
    connector = InMemoryConnector(server, faults=LinkFaults())
    record = await converse(server, CHAINED, connector=connector)
    # The limit closed the connection (1000) while turn 1's tools ran; turn 2's create found it closed. 1000 is not
    # among openai-python's recoverable codes: its iteration ends, and it opens nothing.
    assert (record.status, record.reconnects, connector.links.opened) == ("error:closed_1000", 0, 1)
    assert plain(record)[-1] == "send response.create" and len(record.turns) == 2
    assert record.ended_at == pytest.approx(record.turns[-1].ended_at + 10.0)  # when turn 1's tools returned
    # A response failed by the limit, then its error: test_the_connection_limit_ends_the_task_under_openai_python.


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
@pytest.mark.parametrize("design,store", [(CHAINED, False), (CHAINED, True), (SUSPENDED, False)])
async def test_under_codex_a_task_longer_than_the_limit_completes_with_the_same_conversation(
        autojump_clock, design: str, store: bool, network) -> None:
    reference = await converse(server_with(), design, network=network, store=store, policy=CODEX_STEADY)
    server = server_with(lifetime=15)
    connector = InMemoryConnector(server, network, faults=LinkFaults())
    record = await converse(server, design, connector=connector, store=store, policy=CODEX_STEADY)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert_each_completed_event_once(record)
    assert connector.links.opened == record.reconnects + 1  # one new connection per reconnect, no other
    # Turn 0 starts with the task, before the handshakes of the connection it opens (docs/metrics.md).
    assert record.turns[0].sent_at == record.started_at
    # The clean close costs one create that found the socket closed, sent again on a new connection; without a store,
    # that one is told the chain is gone, and a third goes with the whole conversation.
    creates = [kind for kind in plain(record) if kind == "send response.create"]
    if design == CHAINED:
        assert len(creates) - len(record.turns) == record.reconnects * (1 if store else 2)
    if (design, store, network) == (CHAINED, False, None):
        # Turn 2's create fails on the closed socket (close 1000): a stream that ended before response.completed, retried
        # after Codex's first backoff (0.2 s) on a new connection with previous_response_id, which is told the chain is
        # gone; the third create carries the whole conversation.
        assert record.seconds == pytest.approx(reference.seconds + 0.2)
        assert record.recovery_seconds == [pytest.approx(0.2)] and plain(record)[6:12] == [
            "send response.create", "send response.create", "recv error", "send response.create", "recv response.created",
            "recv response.completed"]
    if store:  # a stored chain is hydrated after the limit instead of resent
        assert (record.reconnects, record.full_resends, "recv error" in plain(record)) == (1, 0, False)
        return
    assert record.reconnects == 1 and record.full_resends == 1 and record.resent_bytes > 0
    if design == SUSPENDED:
        # Paused at 10.98 s (its second response.done); the limit at 15 s ends it while the tools run; the append at
        # 20.98 s finds the connection gone, and a new response starts.
        assert len(creates) == 2 and len([r for r, s in record.outcomes.items() if s == "completed"]) == 1


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
@pytest.mark.parametrize("design,store", [(CHAINED, False), (CHAINED, True), (SUSPENDED, False), ("http", False), ("http", True)])
async def test_mid_response_drops_lose_and_repeat_nothing(autojump_clock, design: str, store: bool, network) -> None:
    reference = await converse(server_with(), design, network=network, store=store)
    faults = LinkFaults(drop_per_server_chunk=0.01, seed=1)
    record = await converse(server_with(), design, network=network, faults=faults, store=store)
    assert (record.status, record.transcript) == ("completed", reference.transcript)
    assert record.reconnects >= 1 and record.resent_bytes > 0 and record.recovery_seconds and record.seconds > reference.seconds
    assert_each_completed_event_once(record)
    # A retried turn's first token and end are the retried response's: numbers, in order.
    for turn in record.turns:
        assert isinstance(turn.first_token_at, float) and isinstance(turn.ended_at, float)
        assert turn.sent_at <= turn.first_token_at <= turn.ended_at


async def test_without_reconnects_a_drop_fails_the_task_with_its_close_code(autojump_clock) -> None:
    record = await converse(server_with(), CHAINED, faults=LinkFaults(drop_per_server_chunk=0.01, seed=1), policy=NEVER)
    assert record.status == "error:closed_1006" and record.reconnects == 0
    # The cut turn never ended: what its lost response delivered is forgotten.
    assert (record.turns[-1].first_token_at, record.turns[-1].ended_at) == (None, None)


async def test_a_handshake_whose_answer_is_lost_times_out_then_backs_off_exactly(autojump_clock) -> None:
    # The link breaks at every connection's first server chunk (the upgrade's answer): each attempt waits out
    # the open timeout.
    server = server_with()
    connector = InMemoryConnector(server, faults=LinkFaults(drop_per_server_chunk=0.999999, seed=0))
    record = await converse(server, CHAINED, connector=connector, policy=STEADY)
    assert (record.status, record.reconnects) == ("error:gave_up", 5)
    # Six open timeouts, and 0.5 + 1 + 2 + 4 + 8 s of backoff between them.
    assert trio.current_time() == pytest.approx(6 * OPEN_TIMEOUT_SECONDS + STEADY.worst_case_wait)


async def restart_after(connector: InMemoryConnector, delay: float, downtime: float, config: ServerConfig | None = None) -> None:
    """Restart the connector's server `delay` seconds from now: links cut, `downtime` refusing, then a fresh server
    with the same store, workload catalog and ids."""
    await trio.sleep(delay)
    connector.refusing = True
    connector.links.cut_all("restart")
    await trio.sleep(downtime)
    api = connector.server.api
    connector.server = ResponsesServer(ApiService(costs=ZERO_COSTS, store=api.store, workloads=api.workloads, new_id=api.new_id),
                                       config or ServerConfig())
    connector.refusing = False


@pytest.mark.parametrize("design,store", [(CHAINED, False), (CHAINED, True), (SUSPENDED, False), ("http", True)])
async def test_a_server_restart_mid_task_is_survived(autojump_clock, design: str, store: bool) -> None:
    reference = await converse(server_with(), design, store=store)
    server = server_with()
    connector = InMemoryConnector(server, faults=LinkFaults())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_after, connector, 10.7, 2.0)  # in the middle of turn 1
        record = await converse(server, design, connector=connector, store=store)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert record.reconnects >= 2 and record.recovery_seconds[0] > 2.0  # refused at least once while down
    if (design, store) == (CHAINED, False):
        # Turn 1 went three times: cut, again with previous_response_id (not found on the new server), then with the
        # whole conversation. Its bytes are all three requests'; the two repeats are the resent bytes.
        extra = [turn.bytes_sent - ref.bytes_sent for turn, ref in zip(record.turns, reference.turns, strict=True)]
        assert extra[0] == 0 and extra[1] > 0 and extra[2:] == [0] * (len(extra) - 2)
        assert record.resent_bytes == extra[1] and record.full_resends == 1


async def test_a_v1_restart_counts_all_but_the_tool_outputs_it_owed_as_resent(autojump_clock) -> None:
    reference = await converse(server_with(), SUSPENDED, policy=CODEX)
    record = await converse(server_with(lifetime=8), SUSPENDED, policy=CODEX)
    assert record.status == "completed" and record.transcript == reference.transcript
    # Each limit ends the connection while the tools run; the append then finds it gone, and the turn goes as a
    # new response carrying the whole conversation. Of that request, only the tool outputs were owed: the
    # reference's append of the same turn is `{"type":"response.append","input":<outputs>}`.
    append_frame = len('{"type":"response.append","input":}')
    restarted = [i for i, (turn, ref) in enumerate(zip(record.turns, reference.turns, strict=True)) if turn.bytes_sent != ref.bytes_sent]
    assert len(restarted) >= 2 and record.full_resends == len(restarted) == record.reconnects
    assert record.resent_bytes == sum(record.turns[i].bytes_sent - (reference.turns[i].bytes_sent - append_frame) for i in restarted)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_a_refused_request_ends_the_task_with_its_code_and_no_reconnect(autojump_clock, design: str) -> None:
    record = await run_reconnecting_rollout(InMemoryConnector(server_with(), faults=LinkFaults()), design, TASK, CODEX,
                                            metadata={"testbed_workload": "bogus:1"})
    assert (record.status, record.reconnects, record.fell_back_to_http) == ("error:invalid_value", 0, False)
    assert [(turn.sent_at, turn.ended_at) for turn in record.turns] == [(0.0, 0.0)]
    assert plain(record) == ["send response.create", "recv error"]  # asked once: the refusal is not retried
    server = ScriptedServer([first_turn(design), [error("invalid_value")]])  # on a later turn
    record = await reconnecting(server, design)
    assert (record.status, record.reconnects, record.full_resends, record.turns[1].ended_at) == ("error:invalid_value", 0, 0, 2.0)
    assert frame_kinds(server) == [(0, "response.create", None),
                                   (0, "response.append", None) if design == SUSPENDED else (0, "response.create", "resp_0")]


async def test_codex_falls_back_to_https_when_the_websocket_retries_are_spent_keeping_the_key_and_the_timing_header(
        autojump_clock) -> None:
    reference = await converse(server_with(), CHAINED)
    config = ServerConfig(api_keys=frozenset({"key-1"}))
    server = ResponsesServer(ApiService(costs=ZERO_COSTS), config)
    metadata = {"testbed_workload": server.api.workloads.register(TASK), "testbed_decode_tps": "100"}
    connector = InMemoryConnector(server, faults=LinkFaults())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_after, connector, 10.7, 8.0, config)  # longer than Codex's ~6.2 s of backoff
        record = await run_reconnecting_rollout(connector, CHAINED, TASK, CODEX, metadata=metadata, api_key="key-1", include_timing=True)
    assert record.fell_back_to_http and record.status == "completed" and record.transcript == reference.transcript
    assert all(turn.server_timing is not None for turn in record.turns)  # over HTTP as over the WebSocket
    # Stateless (`store: false`, the whole conversation every turn) over one kept-alive connection, as Codex's fallback.
    fallback = [r for r in connector.server.records if r["transport"] == "http"]
    assert len(fallback) >= 2 and {(r["store"], r["context"], r["connection"]) for r in fallback} == {(False, "full", 1)}


async def test_a_rolling_restart_sends_new_connections_to_the_workers_that_are_up(autojump_clock) -> None:
    workers = [InMemoryConnector(server_with(), faults=LinkFaults()) for _ in range(2)]
    for worker in workers[1:]:
        worker.server.api.workloads = workers[0].server.api.workloads
    pool = RoundRobinConnector(workers)
    reference = await converse(server_with(), CHAINED)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_after, workers[0], 10.7, 60.0)
        record = await converse(workers[0].server, CHAINED, connector=pool)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert record.reconnects == 1  # the next connection went to the worker that was up: no refusal
    # The pool itself: workers in turn, skipping those that are down.
    workers = [types.SimpleNamespace(refusing=False, open_stream=lambda n=n: f"w{n}") for n in range(3)]
    pool = RoundRobinConnector(workers)  # type: ignore[arg-type]
    assert [pool.open_stream() for _ in range(4)] == ["w0", "w1", "w2", "w0"]
    workers[2].refusing = True
    assert [pool.open_stream() for _ in range(4)] == ["w1", "w0", "w1", "w0"]
    workers[0].refusing = workers[1].refusing = True
    assert pool.open_stream() == "w0"  # all down: the first worker is asked, and its refusal is the answer


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED, "http"])
async def test_engine_failures_are_retried_and_the_conversation_is_unchanged(autojump_clock, design: str) -> None:
    reference = await converse(server_with(), design)
    record = await converse(server_with(engine=Engine(faults=FaultPlan(failure_p=0.01, seed=2))), design)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert record.retried_responses >= 1 and record.reconnects == 0 and "failed" in record.outcomes.values()


async def test_benchmark_rows_count_the_reconnects_of_a_task_past_the_limit(autojump_clock) -> None:
    config = benchmark.BenchConfig(task_list=(TASK,), network=DELAYED, reconnect=CODEX)
    server = ResponsesServer(ApiService(costs=config.costs), ServerConfig(connection_lifetime=15, suspension_ttl=3600))
    row = benchmark.task_row(CHAINED, 100.0, (await benchmark.run_design(CHAINED, 100.0, [TASK], config, server=server))[0])
    assert (row["reconnects"], benchmark.summarize([row])[0]["reconnects"]) == (1, 1)
    # The policy serves http rollouts too: a response the engine fails is sent again, and the task completes.
    flaky = server_with(engine=Engine(faults=FaultPlan(failure_p=0.01, seed=2)))
    (record,) = await benchmark.run_design("http", 100.0, [TASK], config, server=flaky)
    assert record.status == "completed" and record.retried_responses >= 1
