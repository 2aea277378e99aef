"""Clients that reconnect (prototype/client/reconnect.py, reconnecting.py) and the faults that make
them (prototype/netem/faults.py, the engine's FaultPlan).

Rules every test here follows (after tests/support.py): an in-process server over memory streams
under the `autojump_clock`, over a zero-latency pipe and over a 20 ms RTT link; every fault is
seeded, so each run gives the same timeline; every wait is bounded (`trio.fail_after`). A retried
conversation is checked against the same task run without faults, item for item.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from openai.types.websocket_reconnection import is_recoverable_close
from support import Close, ScriptedServer

from prototype import benchmark, netem
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector, RoundRobinConnector
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord
from prototype.client.http import STATELESS, STORED, run_http_rollout
from prototype.client.reconnect import CODEX, NEVER, OPENAI_PYTHON, ReconnectPolicy
from prototype.client.reconnecting import OPEN_TIMEOUT_SECONDS, run_reconnecting_rollout
from prototype.engine.engine import Engine
from prototype.engine.streaming import FaultPlan
from prototype.netem.delayed import RETRANSMIT_TIMEOUT_SECONDS, DelayedStream, run_delivery
from prototype.netem.faults import Link, LinkFaults, LinkRegistry, open_faulty_pair
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from prototype.workload import fixed

TASK = fixed(4, initial_prompt_tokens=200, appended_tokens=50, output_tokens=40, tool_seconds=10.0)
DELAYED = netem.NetworkProfile(rtt=0.020)
LINKS = [None, DELAYED]
LINK_IDS = ["pipe", "20ms"]
# A turn of 4 s (400 tokens at 100 tokens/s), longer than the 1 s connections of the limit's worst case.
LONG_TURN = fixed(2, initial_prompt_tokens=200, appended_tokens=50, output_tokens=400, tool_seconds=1.0, name="long-turn")
# No jitter: every wait of the backoff is exact.
STEADY = ReconnectPolicy("steady", initial_delay=0.5, max_retries=5)
CODEX_STEADY = attrs.evolve(CODEX, jitter=(1.0, 1.0))


def server_with(lifetime: float = 3600.0, grace: float | None = None, **api: Any) -> ResponsesServer:
    limits = {"connection_lifetime": lifetime} if grace is None else {"connection_lifetime": lifetime, "lifetime_grace": grace}
    return ResponsesServer(ApiService(costs=ZERO_COSTS, **api), ServerConfig(**limits))


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
        numbers = Counter(n for r, n in record.sequence_numbers if r == rid)
        assert max(numbers.values()) == 1
        assert sorted(numbers) == list(range(len(numbers)))


# --- the policies -------------------------------------------------------------------------------------


def test_openai_python_backoff_doubles_from_half_a_second_to_eight_within_its_jitter() -> None:
    rng = random.Random(0)
    for attempt, base in enumerate([0.5, 1, 2, 4, 8, 8], start=1):
        assert 0.75 * base <= OPENAI_PYTHON.delay(attempt, rng) < base
    assert OPENAI_PYTHON.retries_after_close(1006) and OPENAI_PYTHON.retries_after_close(None)
    assert OPENAI_PYTHON.retries_after_close(1012) and not OPENAI_PYTHON.retries_after_close(1000)
    assert not OPENAI_PYTHON.retries_after_close(1008) and not OPENAI_PYTHON.fallback_to_http


def test_codex_backoff_is_200_ms_doubling_then_https() -> None:
    rng = random.Random(0)
    for attempt, base in enumerate([0.2, 0.4, 0.8, 1.6, 3.2], start=1):
        assert 0.9 * base <= CODEX.delay(attempt, rng) < 1.1 * base
    assert CODEX.retries_after_close(1000) and CODEX.retries_after_close(4000)
    assert CODEX.max_retries == 5 and CODEX.fallback_to_http
    assert STEADY.worst_case_wait == 0.5 + 1 + 2 + 4 + 8


def test_openai_python_reconnects_after_exactly_its_recoverable_close_codes() -> None:
    retried = {code for code in range(1000, 5000) if OPENAI_PYTHON.retries_after_close(code)}
    assert retried == {1001, 1005, 1006, 1011, 1012, 1013, 1015}
    # The installed SDK's own decision (openai-python `types/websocket_reconnection.py`), code for code.
    assert all(OPENAI_PYTHON.retries_after_close(code) == is_recoverable_close(code) for code in range(1000, 5000))


ONE_TURN = fixed(1, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, name="one-turn")


def created_event(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}}


def completed_event(response_id: str) -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": response_id, "status": "completed", "output": []}}


async def scripted_rollout(server: ScriptedServer, policy: ReconnectPolicy) -> RolloutRecord:
    with trio.fail_after(600):
        return await run_reconnecting_rollout(InMemoryConnector(server), CHAINED, ONE_TURN, policy, metadata={})


# openai-python's codes whose close a server can send (1005, 1006 and 1015 never travel in a close frame: a broken
# link reads as 1006, test_mid_response_drops_lose_and_repeat_nothing), and codes outside them.
@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 3000, 4000])
async def test_a_close_under_a_response_is_retried_by_openai_python_for_its_codes_only(autojump_clock, code: int) -> None:
    server = ScriptedServer([[created_event("resp_0"), Close(code)], [created_event("resp_1"), completed_event("resp_1")]])
    record = await scripted_rollout(server, attrs.evolve(OPENAI_PYTHON, jitter=(1.0, 1.0)))
    if is_recoverable_close(code):
        assert (record.status, record.reconnects, server.connections, trio.current_time()) == ("completed", 1, 2, 0.5)
    else:
        assert (record.status, record.reconnects, server.connections) == (f"error:closed_{code}", 0, 1)


CALL = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"}
LIMIT = "websocket_connection_limit_reached"
TWO_TURNS = fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0, name="two-turns")


def with_call(kind: str, response_id: str, status: str) -> list[dict[str, Any]]:
    return [created_event(response_id), {"type": "response.output_item.done", "item": CALL},
            {"type": kind, "response": {"id": response_id, "status": status, "output": [CALL]}}]


def limit_events(response_id: str | None) -> list[dict[str, Any]]:
    """What the server sends at the connection limit: the cut response's `response.failed` (if one was running),
    the `error`."""
    error = {"type": "invalid_request_error", "code": LIMIT, "message": "limit"}
    failed = [] if response_id is None else [
        {"type": "response.failed", "response": {"id": response_id, "status": "failed", "output": [], "error": error}}]
    return [*failed, {"type": "error", "status": 400, "error": error}]


async def test_a_request_answered_by_the_connection_limit_ends_the_task_under_openai_python(autojump_clock) -> None:
    server = ScriptedServer([with_call("response.completed", "resp_0", "completed"), [*limit_events(None), Close(1000)]])
    with trio.fail_after(600):
        record = await run_reconnecting_rollout(InMemoryConnector(server), CHAINED, TWO_TURNS, OPENAI_PYTHON, metadata={})
    assert (record.status, record.reconnects, server.connections) == (f"error:{LIMIT}", 0, 1)
    assert trio.current_time() == record.ended_at == record.turns[1].ended_at == 2.0


async def test_a_v1_response_failed_by_the_connection_limit_ends_the_task_under_openai_python(autojump_clock) -> None:
    # The limit came while the resumed rollout streamed: it fails at its next pause, then the error and the close.
    server = ScriptedServer([with_call("response.done", "resp_0", "in_progress"), [*limit_events("resp_0"), Close(1000)]])
    with trio.fail_after(600):
        record = await run_reconnecting_rollout(InMemoryConnector(server), SUSPENDED, TWO_TURNS, OPENAI_PYTHON, metadata={})
    assert (record.status, record.reconnects, record.retried_responses, server.connections) == (f"error:{LIMIT}", 0, 0, 1)
    assert record.outcomes == {"resp_0": "failed"} and trio.current_time() == record.ended_at == 2.0


async def test_openai_python_resets_its_count_at_every_event_so_responses_cut_after_one_never_spend_it(autojump_clock) -> None:
    # Seven responses in a row break after their response.created (close 1011, which openai-python retries), more than
    # its 5 attempts; the eighth completes. Each response.created resets the count (`_record_websocket_progress`), so
    # every reconnect is a first attempt, after 0.5 s.
    cut = [[created_event(f"resp_{n}"), Close(1011)] for n in range(7)]
    server = ScriptedServer([*cut, [created_event("resp_7"), completed_event("resp_7")]])
    record = await scripted_rollout(server, attrs.evolve(OPENAI_PYTHON, jitter=(1.0, 1.0)))
    assert (record.status, record.reconnects, server.connections) == ("completed", 7, 8)
    assert trio.current_time() == record.ended_at == 7 * 0.5
    assert record.recovery_seconds == [0.5] * 7


async def test_codex_counts_every_broken_response_of_one_request_whatever_it_received(autojump_clock) -> None:
    # The same seven cut responses: one sampling request, one count (codex-rs `responses_retry.rs`); without its
    # HTTPS fallback, the sixth cut is one more than its 5 retries.
    cut = [[created_event(f"resp_{n}"), Close(1011)] for n in range(7)]
    server = ScriptedServer([*cut, [created_event("resp_7"), completed_event("resp_7")]])
    record = await scripted_rollout(server, attrs.evolve(CODEX_STEADY, fallback_to_http=False))
    assert (record.status, record.reconnects, server.connections) == ("error:gave_up", 5, 6)
    assert trio.current_time() == pytest.approx(0.2 + 0.4 + 0.8 + 1.6 + 3.2)


def test_each_wait_is_its_capped_backoff_times_one_draw_from_the_jitter_and_the_worst_case_sums_them_at_the_top() -> None:
    policy = ReconnectPolicy("six", max_retries=6, initial_delay=0.5, backoff_factor=3.0, max_delay=10.0, jitter=(0.5, 2.0))
    rng, same = random.Random(7), random.Random(7)
    bases = [0.5, 1.5, 4.5, 10.0, 10.0, 10.0]  # tripling from half a second, capped at 10 s
    assert [policy.delay(attempt, rng) for attempt in range(1, 7)] == [base * same.uniform(0.5, 2.0) for base in bases]
    assert policy.worst_case_wait == sum(bases) * 2.0
    # Without jitter no number is drawn: the waits are the backoff itself and the generator is left as it was.
    steady, state = attrs.evolve(policy, jitter=(1.5, 1.5)), rng.getstate()
    assert [steady.delay(attempt, rng) for attempt in range(1, 7)] == [base * 1.5 for base in bases]
    assert rng.getstate() == state


# --- netem: loss and links that break --------------------------------------------------------------


async def test_a_lost_chunk_arrives_one_retransmission_timeout_late_and_holds_the_next(autojump_clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    sender = DelayedStream(a, send_delay=0.010, loss=0.5, seed=3)
    arrivals = []
    async with run_delivery(sender):
        start = trio.current_time()
        for i in range(8):
            await sender.send_all(bytes([i]))
        while len(arrivals) < 8:
            data = await b.receive_some()
            arrivals += [(trio.current_time() - start, byte) for byte in data]
    # Seed 3 loses chunk 1 (and others); every chunk after a lost one waits for it: order is kept.
    assert [byte for _, byte in arrivals] == list(range(8))
    assert arrivals[0][0] == pytest.approx(0.010)
    assert {round(t, 6) for t, _ in arrivals} <= {0.010, round(0.010 + RETRANSMIT_TIMEOUT_SECONDS, 6)}
    assert round(arrivals[-1][0], 6) == round(0.010 + RETRANSMIT_TIMEOUT_SECONDS, 6)


async def test_a_cut_link_breaks_both_ends_and_wakes_a_waiting_read(autojump_clock) -> None:
    client_raw, server_raw = trio.testing.memory_stream_pair()
    registry = LinkRegistry()
    link = registry.new(LinkFaults())
    async with open_faulty_pair(client_raw, server_raw, link, registry) as (client, server):
        await client.send_all(b"ping")
        assert await server.receive_some() == b"ping"

        async def cut_later() -> None:
            await trio.sleep(1.5)
            assert registry.cut_all("restart") == 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_later)
            with pytest.raises(trio.BrokenResourceError):
                await client.receive_some()
        assert trio.current_time() == 1.5
        with pytest.raises(trio.BrokenResourceError):
            await server.send_all(b"late")
    assert registry.links == set()


async def test_timed_drops_are_a_seeded_poisson_process(autojump_clock) -> None:
    times = []
    for serial in range(3):
        link = Link(LinkFaults(drops_per_hour=3600, seed=7), serial)
        start = trio.current_time()
        await link.run_timed_drop()
        times.append(trio.current_time() - start)
        assert link.broken and link.reason == "timed drop"
    expected = [random.Random(f"linkfaults:7:{s}").expovariate(1.0) for s in range(3)]
    assert times == pytest.approx(expected)


# --- the 60-minute limit (seconds here) --------------------------------------------------------------


async def test_openai_python_ends_the_task_at_a_clean_close_and_opens_no_new_connection(autojump_clock) -> None:
    server = server_with(lifetime=15)
    connector = InMemoryConnector(server, faults=LinkFaults())
    record = await converse(server, CHAINED, connector=connector)
    # The limit closed the connection (1000) while turn 1's tools ran; turn 2's create found it closed. 1000 is not
    # among openai-python's recoverable codes: its iteration ends, and it opens nothing.
    assert (record.status, record.reconnects, connector.links.opened) == ("error:closed_1000", 0, 1)
    assert plain(record)[-1] == "send response.create" and len(record.turns) == 2
    assert record.ended_at == pytest.approx(record.turns[-1].ended_at + 10.0)  # when turn 1's tools returned


async def test_openai_python_ends_the_task_at_the_connection_limit_error(autojump_clock) -> None:
    # The limit comes in the middle of turn 0 (a 4 s turn on a 1 s connection); past the 0.5 s grace the response
    # fails with the limit's code, then the error and close 1000 follow. The SDK does nothing of its own with them.
    record = await converse(server_with(lifetime=1.0, grace=0.5), CHAINED, task=LONG_TURN)
    assert (record.status, record.reconnects, record.retried_responses) == ("error:websocket_connection_limit_reached", 0, 0)
    assert record.ended_at == pytest.approx(1.5)
    assert plain(record) == ["send response.create", "recv response.created", "recv response.failed"]


@pytest.mark.parametrize("policy", [OPENAI_PYTHON, CODEX], ids=["openai-python", "codex"])
async def test_a_connection_that_keeps_closing_at_its_limit_ends_the_task_within_the_policys_budget(autojump_clock, policy) -> None:
    # 1 s connections, 0.5 s grace, a 4 s turn: no turn can finish on a WebSocket. openai-python ends the task at the
    # first limit; Codex retries the turn 5 times (each a new connection, failed after 1.5 s), then goes on over HTTPS.
    record = await converse(server_with(lifetime=1.0, grace=0.5), CHAINED, task=LONG_TURN, policy=policy)
    if policy is OPENAI_PYTHON:
        assert (record.status, record.reconnects, record.fell_back_to_http) == ("error:websocket_connection_limit_reached", 0, False)
        return
    assert (record.status, record.reconnects, record.fell_back_to_http) == ("completed", 5, True)
    assert record.transcript == (await converse(server_with(), CHAINED, task=LONG_TURN)).transcript


async def test_codex_past_the_limit_spends_a_retry_backs_off_and_resends_the_context(autojump_clock) -> None:
    reference = await converse(server_with(), CHAINED, policy=CODEX_STEADY)
    record = await converse(server_with(lifetime=15), CHAINED, policy=CODEX_STEADY)
    assert record.status == "completed" and record.transcript == reference.transcript
    # Turn 2's create fails on the closed socket (close 1000): a stream that ended before response.completed, retried
    # after Codex's first backoff (0.2 s) on a new connection with previous_response_id, which is told the chain is
    # gone; the third create carries the whole conversation.
    assert record.seconds == pytest.approx(reference.seconds + 0.2)
    assert (record.reconnects, record.full_resends, record.recovery_seconds) == (1, 1, [pytest.approx(0.2)])
    assert plain(record)[6:12] == [
        "send response.create", "send response.create", "recv error", "send response.create", "recv response.created",
        "recv response.completed",
    ]
    assert_each_completed_event_once(record)


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_under_codex_a_task_longer_than_the_limit_completes_with_the_same_conversation(autojump_clock, design: str, network) -> None:
    reference = await converse(server_with(), design, network=network, policy=CODEX)
    record = await converse(server_with(lifetime=15), design, network=network, policy=CODEX)
    assert record.status == "completed"
    assert record.transcript == reference.transcript
    assert record.reconnects == 1 and record.full_resends == 1 and record.resent_bytes > 0
    assert_each_completed_event_once(record)


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
async def test_chained_with_a_store_hydrates_after_the_limit_instead_of_resending(autojump_clock, network) -> None:
    reference = await converse(server_with(), CHAINED, network=network, store=True, policy=CODEX)
    record = await converse(server_with(lifetime=15), CHAINED, network=network, store=True, policy=CODEX)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert record.reconnects == 1 and record.full_resends == 0
    assert "recv error" not in plain(record)


async def test_v1_at_the_limit_starts_a_new_response_with_the_whole_conversation(autojump_clock) -> None:
    record = await converse(server_with(lifetime=15), SUSPENDED, policy=CODEX)
    # The rollout paused at 10.98 s (its second response.done); the limit at 15 s ends it while the
    # tools run; the append at 20.98 s finds the connection gone, and a new response starts.
    creates = [kind for kind in plain(record) if kind == "send response.create"]
    assert len(creates) == 2 and len([r for r, s in record.outcomes.items() if s == "completed"]) == 1
    assert record.status == "completed"


# --- drops in the middle of responses ------------------------------------------------------------------


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
@pytest.mark.parametrize("design,store", [(CHAINED, False), (CHAINED, True), (SUSPENDED, False), ("http", False), ("http", True)])
async def test_mid_response_drops_lose_and_repeat_nothing(autojump_clock, design: str, store: bool, network) -> None:
    reference = await converse(server_with(), design, network=network, store=store)
    faults = LinkFaults(drop_per_server_chunk=0.01, seed=1)
    record = await converse(server_with(), design, network=network, faults=faults, store=store)
    assert record.status == "completed"
    assert record.transcript == reference.transcript
    assert record.reconnects >= 1 and record.resent_bytes > 0 and record.recovery_seconds
    assert record.seconds > reference.seconds
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
    assert record.status == "error:gave_up"
    assert record.reconnects == 5
    # Six open timeouts, and 0.5 + 1 + 2 + 4 + 8 s of backoff between them.
    assert trio.current_time() == pytest.approx(6 * OPEN_TIMEOUT_SECONDS + STEADY.worst_case_wait)


# --- restarts and fallbacks ----------------------------------------------------------------------------


async def restart_after(connector: InMemoryConnector, delay: float, downtime: float) -> None:
    """Restart the connector's server `delay` seconds from now: links cut, `downtime` refusing, then a fresh server
    with the same store, workload catalog and ids."""
    await trio.sleep(delay)
    connector.refusing = True
    connector.links.cut_all("restart")
    await trio.sleep(downtime)
    api = connector.server.api
    connector.server = ResponsesServer(ApiService(costs=ZERO_COSTS, store=api.store, workloads=api.workloads, new_id=api.new_id))
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
    assert record.reconnects >= 2  # refused at least once while down
    assert record.recovery_seconds[0] > 2.0


async def test_a_retried_turn_counts_every_request_it_sent_and_only_the_repeats_as_resent(autojump_clock) -> None:
    reference = await converse(server_with(), CHAINED)
    server = server_with()
    connector = InMemoryConnector(server, faults=LinkFaults())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_after, connector, 10.7, 2.0)  # in the middle of turn 1
        record = await converse(server, CHAINED, connector=connector)
    assert record.status == "completed" and record.transcript == reference.transcript
    # Turn 1 went three times: cut, again with previous_response_id (not found on the new server), then with
    # the whole conversation. Its bytes are all three requests'; the two repeats are the resent bytes.
    extra = [turn.bytes_sent - ref.bytes_sent for turn, ref in zip(record.turns, reference.turns, strict=True)]
    assert extra[0] == 0 and extra[1] > 0 and extra[2:] == [0] * (len(extra) - 2)
    assert record.resent_bytes == extra[1] and record.full_resends == 1


@pytest.mark.parametrize("network", LINKS, ids=LINK_IDS)
@pytest.mark.parametrize("store", [True, False])
async def test_under_codex_each_clean_close_is_one_reconnect_and_a_turn_starts_before_its_connection(
        autojump_clock, network, store: bool) -> None:
    server = server_with(lifetime=8)
    connector = InMemoryConnector(server, network, faults=LinkFaults())
    record = await converse(server, CHAINED, connector=connector, store=store, policy=CODEX)
    assert record.status == "completed"
    assert connector.links.opened == record.reconnects + 1  # one new connection per reconnect, no other
    # Each clean close costs one create that found the socket closed, sent again on a new connection; without a
    # store, that one is told the chain is gone, and a third goes with the whole conversation.
    creates = [kind for kind in plain(record) if kind == "send response.create"]
    assert record.reconnects >= 2 and record.reconnects * (1 if store else 2) == len(creates) - len(record.turns)
    assert record.full_resends == (0 if store else record.reconnects)
    # Turn 0 starts with the task, before the handshakes of the connection it opens (docs/metrics.md).
    assert record.turns[0].sent_at == record.started_at


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


async def test_codex_falls_back_to_https_when_the_websocket_retries_are_spent(autojump_clock) -> None:
    reference = await converse(server_with(), CHAINED)
    server = server_with()
    connector = InMemoryConnector(server, faults=LinkFaults())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_after, connector, 10.7, 8.0)  # longer than Codex's ~6.2 s of backoff
        record = await converse(server, CHAINED, connector=connector, policy=CODEX)
    assert record.fell_back_to_http and record.status == "completed"
    assert record.transcript == reference.transcript


async def test_the_fallback_to_https_keeps_the_api_key_and_the_timing_header(autojump_clock) -> None:
    server = ResponsesServer(ApiService(costs=ZERO_COSTS), ServerConfig(api_keys=frozenset({"key-1"})))
    metadata = {"testbed_workload": server.api.workloads.register(TASK), "testbed_decode_tps": "100"}
    connector = InMemoryConnector(server, faults=LinkFaults())

    async def restart() -> None:
        await trio.sleep(10.7)
        connector.refusing = True
        connector.links.cut_all("restart")
        await trio.sleep(8.0)
        api = server.api
        connector.server = ResponsesServer(ApiService(costs=ZERO_COSTS, store=api.store, workloads=api.workloads, new_id=api.new_id),
                                           ServerConfig(api_keys=frozenset({"key-1"})))
        connector.refusing = False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart)
        record = await run_reconnecting_rollout(connector, CHAINED, TASK, CODEX, metadata=metadata, api_key="key-1", include_timing=True)
    assert record.fell_back_to_http and record.status == "completed"
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


# --- engine failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED, "http"])
async def test_engine_failures_are_retried_and_the_conversation_is_unchanged(autojump_clock, design: str) -> None:
    reference = await converse(server_with(), design)
    server = server_with(engine=Engine(faults=FaultPlan(failure_p=0.01, seed=2)))
    record = await converse(server, design)
    assert record.status == "completed" and record.transcript == reference.transcript
    assert record.retried_responses >= 1 and record.reconnects == 0
    assert "failed" in record.outcomes.values()


# --- compare and the experiment ------------------------------------------------------------------------


async def test_benchmark_rows_count_the_reconnects_of_a_task_past_the_limit(autojump_clock) -> None:
    config = benchmark.BenchConfig(task_list=(TASK,), network=DELAYED, reconnect=CODEX)
    server = ResponsesServer(ApiService(costs=config.costs), ServerConfig(connection_lifetime=15, suspension_ttl=3600))
    records = await benchmark.run_design(CHAINED, 100.0, [TASK], config, server=server)
    row = benchmark.task_row(CHAINED, 100.0, records[0])
    assert row["reconnects"] == 1
    assert benchmark.summarize([row])[0]["reconnects"] == 1
