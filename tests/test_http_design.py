"""The http design (designs/http.py): each POST one turn, stateless or stored (the chain rebuilt every turn): events
and phases at exact virtual times, storage and keys, routing and prefix affinity, the handshakes a client pays, the
sprint's profiles (docs/protocol.md §8; docs/parameters.md §6)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import attrs
import pytest
import trio
from support import exactly, make_server

from prototype import metrics, netem
from prototype import workload as wl
from prototype.api import render
from prototype.api.costs import AFTER_SPRINT, BEFORE_SPRINT, ZERO_COSTS, ApiCosts, SprintCosts, SprintSwitches, StageCost
from prototype.api.service import ApiService, owner_of
from prototype.client import harness
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import HARNESS_TOOLS, run_websocket_rollout
from prototype.client.http import run_http_rollout
from prototype.designs import http as http_design
from prototype.engine.engine import HTTP_AFFINITY
from prototype.protocol import errors
from prototype.protocol.codec import parse_create_body
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import CreateRequest
from prototype.protocol.items import FunctionCall, FunctionCallOutput, Message, parse_input
from prototype.server.app import ResponsesServer

MODEL = "sim-1000"
RTT = 0.080
TLS13 = netem.NetworkProfile(rtt=RTT, tls_round_trips=1)  # TCP 1 RTT + TLS 1.3 1 RTT
KNOWN_COSTS = ApiCosts(
    validate=StageCost(fixed=0.010), safety=StageCost(fixed=0.020), render=StageCost(fixed=0.030),
    route=StageCost(fixed=0.040), post=0.050, store_read_per_turn=0.0)
COSTS = attrs.evolve(KNOWN_COSTS, store_read_per_turn=0.004)
SERVER_PRE = 0.100  # the four fixed stage costs: all the server does before response.created


# --- one turn, called directly ----------------------------------------------------------------------


class Sink(list):
    """Every event the turn sends, as the wire carries it, with the virtual time it was sent."""

    async def __call__(self, event: Any) -> None:
        self.append((trio.current_time(), event.to_dict()))

    @property
    def types(self) -> list[str]:
        return [event["type"] for _, event in self]


def first_request(api: ApiService, turns: int = 3, prompt: str = "fix the bug", **fields: Any) -> CreateRequest:
    key = api.workloads.register(wl.fixed(turns))
    body = {"model": MODEL, "input": prompt, "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": key}, **fields}
    return parse_create_body(body)


def outputs_for(response) -> list[FunctionCallOutput]:
    calls = [item for item in response.output if isinstance(item, FunctionCall)]
    assert calls
    return [FunctionCallOutput(call.call_id, "ok") for call in calls]


def next_stored(first: CreateRequest, response, **fields: Any) -> CreateRequest:
    return parse_create_body({
        "model": MODEL, "tools": HARNESS_TOOLS, "metadata": first.metadata, "previous_response_id": response.id,
        "input": [item.to_dict() for item in outputs_for(response)], **fields})


def next_stateless(first: CreateRequest, response) -> CreateRequest:
    items = [*first.input, *response.output, *outputs_for(response)]
    return parse_create_body({
        "model": MODEL, "tools": HARNESS_TOOLS, "metadata": first.metadata, "store": False,
        "input": [item.to_dict() for item in items]})


async def test_a_turn_records_its_phases_in_the_callers_log_at_their_virtual_times(autojump_clock) -> None:
    api = ApiService(costs=COSTS)
    log, sink, timed = metrics.PhaseLog(), Sink(), Sink()
    start = trio.current_time()
    response = await http_design.run_http_turn(api, first_request(api, store=False), sink, log=log)
    assert sink.types[:2] == ["response.created", "response.in_progress"] and sink.types[-1] == "response.completed"
    # Pre-inference (the four fixed stage costs) before response.created; post-inference before the terminal event.
    assert sink[0][0] - start == exactly(0.100)
    totals = log.totals()
    assert "store_read" not in totals  # a stateless turn reads nothing from the store
    assert {phase: totals[phase] for phase in ("validate", "safety", "render", "route", "post")} == {
        "validate": exactly(0.010), "safety": exactly(0.020), "render": exactly(0.030), "route": exactly(0.040), "post": exactly(0.050)
    }
    assert [(s, e) for phase, s, e in log.spans if phase == "post"] == [(exactly(sink[-1][0] - 0.050), exactly(sink[-1][0]))]
    # Timings go out only when asked for.
    assert all("testbed_timing" not in event.get("response", {}) for _, event in sink)
    await http_design.run_http_turn(api, first_request(api, store=False), timed, include_timing=True)
    phases_ms = timed[-1][1]["response"]["testbed_timing"]["phases_ms"]
    assert [phases_ms[phase] for phase in ("validate", "safety", "render", "route", "post")] == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert response.status == "completed" and response.incomplete_details is None
    assert response.id.startswith("resp_") and isinstance(sink[0][1]["response"]["created_at"], int)
    assert [event["response"]["id"] for _, event in sink if "response" in event] == [response.id] * 3


async def test_a_turn_cut_at_max_output_tokens_ends_incomplete_and_is_stored_so(autojump_clock) -> None:
    api, sink = ApiService(costs=COSTS), Sink()
    response = await http_design.run_http_turn(api, first_request(api, max_output_tokens=16), sink)
    assert sink.types[-1] == "response.incomplete"
    assert sink[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    stored = api.store.get(response.id).response
    assert (stored["status"], stored["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    # A turn that runs to its end is stored completed, with no details.
    done = await http_design.run_http_turn(api, first_request(api), Sink())
    stored = api.store.get(done.id).response
    assert (stored["status"], stored["incomplete_details"]) == ("completed", None)


async def test_the_stored_chain_is_read_under_the_callers_key_only(autojump_clock) -> None:
    api = ApiService(costs=COSTS)
    first = first_request(api, store=True)
    response = await http_design.run_http_turn(api, first, Sink(), api_key="key-a")
    assert api.store.get(response.id).owner == owner_of("key-a")
    second = next_stored(first, response)
    # A request without a key finds nothing, refused before its first event (another key's: test_limits.py).
    with pytest.raises(ProtocolError) as caught:
        await http_design.run_http_turn(api, second, sink := Sink(), api_key=None)
    assert (caught.value.code, caught.value.param, sink) == (errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id", [])
    log, sink, before = metrics.PhaseLog(), Sink(), trio.current_time()
    continued = await http_design.run_http_turn(api, second, sink, api_key="key-a", log=log)
    assert sink.types[-1] == "response.completed"
    # One store read (one earlier turn), before everything else.
    assert [(phase, s - before, e - before) for phase, s, e in log.spans[:1]] == [("store_read", exactly(0.0), exactly(0.004))]
    assert sink[0][0] - before == exactly(0.004 + 0.100)
    # The rebuilt history is in the prompt: the continuation's input counts the first turn's prompt and output.
    assert continued.usage.input_tokens > response.usage.input_tokens + response.usage.output_tokens
    assert api.store.get(continued.id).owner == owner_of("key-a")


async def test_the_variant_follows_previous_response_id_and_must_match_the_request(autojump_clock) -> None:
    assert http_design.variant_of(parse_create_body({"model": MODEL, "input": "x"})) == "stateless"
    assert http_design.variant_of(parse_create_body({"model": MODEL, "input": "x", "previous_response_id": "resp_1"})) == "stored"
    api = ApiService(costs=COSTS)
    stateless = first_request(api, store=False)
    with pytest.raises(ValueError, match="variant 'stored' does not match a request with previous_response_id=None"):
        await http_design.run_http_turn(api, stateless, Sink(), variant="stored")
    with pytest.raises(ValueError, match="variant 'chained' does not match"):
        await http_design.run_http_turn(api, stateless, Sink(), variant="chained")
    response = await http_design.run_http_turn(api, first_request(api), Sink(), variant="stateless")
    with pytest.raises(ValueError, match=f"variant 'stateless' does not match a request with previous_response_id='{response.id}'"):
        await http_design.run_http_turn(api, next_stored(first_request(api), response), Sink(), variant="stateless")
    assert len(api.live) == 0


async def test_a_warm_up_prefills_and_sends_no_output(autojump_clock) -> None:
    api = ApiService(costs=COSTS)
    warm, sink = first_request(api, generate=False, store=False), Sink()
    response = await http_design.run_http_turn(api, warm, sink)
    assert sink.types == ["response.created", "response.completed"] and response.output == [] and response.status == "completed"
    # The prompt is now on the engine: the same turn with generation finds it.
    cold = ApiService(costs=COSTS)
    baseline = await http_design.run_http_turn(cold, first_request(cold, store=False), Sink())
    real = await http_design.run_http_turn(api, first_request(api, store=False), Sink())
    assert real.usage.cached_tokens > baseline.usage.cached_tokens


# --- the same transcript in every design; handshakes and round trips; the sprint's profiles ------------


GENERATED = wl.generate_one("coding", seed=11, turns_median=5, turns_max=6, parallel_calls_p=0.5, hosted_call_p=0.5)


@pytest.mark.parametrize("workload", [wl.fixed(4), GENERATED], ids=["fixed", "generated"])
async def test_same_transcript_and_usage_in_every_design(autojump_clock, workload: wl.Workload) -> None:
    assert len(workload.turns) >= 3
    server = ResponsesServer()
    metadata = {"testbed_workload": server.api.workloads.register(workload)}
    connector = InMemoryConnector(server)
    records = {
        "suspended": await run_websocket_rollout(connector, "suspended", workload, metadata=metadata, model=MODEL),
        "chained": await run_websocket_rollout(connector, "chained", workload, metadata=metadata, model=MODEL),
        "stateless": await run_http_rollout(connector, workload, variant="stateless", metadata=metadata, model=MODEL),
        "stored": await run_http_rollout(connector, workload, variant="stored", metadata=metadata, model=MODEL)}
    reference = records["suspended"]
    assert reference.status == "completed" and len(reference.transcript) >= 2 * len(workload.turns)
    usage = {name: (record.usage["input_tokens"], record.usage["output_tokens"]) for name, record in records.items()}
    for name, record in records.items():
        assert (record.status, len(record.turns), record.transcript, usage[name]) == (
            "completed", len(workload.turns), reference.transcript, usage["suspended"]), name
    assert records["stateless"].design == "http-stateless" and records["stored"].design == "http-stored"
    # One response per turn over http (what each variant sends every turn: test_http_client.py).
    assert len(records["stored"].response_ids) == len(workload.turns)
    if workload is GENERATED:
        assert any(item["type"] == "web_search_call" for item in reference.transcript)


async def test_stored_chain_is_rebuilt_from_scratch_every_turn(autojump_clock) -> None:
    server = make_server(costs=attrs.evolve(ZERO_COSTS, store_read_per_turn=0.002))
    record = await completed_http_rollout(server, wl.fixed(4), variant="stored", include_timing=True)
    reads = [turn.server_timing["phases_ms"].get("store_read") for turn in record.turns]
    assert reads == [None, pytest.approx(2.0), pytest.approx(4.0), pytest.approx(6.0)]  # one read per earlier turn


async def completed_http_rollout(server: ResponsesServer, workload: wl.Workload, network=None, **options: Any):
    """The workload, registered on `server`, run by the http client to completion."""
    metadata = {"testbed_workload": server.api.workloads.register(workload)}
    record = await run_http_rollout(InMemoryConnector(server, network), workload, metadata=metadata, **options)
    assert record.status == "completed"
    return record


def first_event_times(record) -> list[float]:
    """When each turn's first event (response.created) arrived."""
    return [min(t for t, direction, _ in record.timeline if direction == "recv" and t >= turn.sent_at) for turn in record.turns]


@pytest.mark.parametrize("variant", ["stateless", "stored"])
async def test_first_byte_is_handshake_plus_one_rtt_plus_server_time_and_keep_alive_pays_the_handshake_once(
        autojump_clock, variant: str) -> None:
    assert TLS13.handshake_seconds == exactly(2 * RTT)
    workload, records = wl.fixed(3, tool_seconds=0.5), {}
    for keep_alive in (True, False):
        server = make_server(costs=KNOWN_COSTS)  # a fresh server each: same prefix-cache state
        records[keep_alive] = await completed_http_rollout(server, workload, TLS13, variant=variant, keep_alive=keep_alive)
    for keep_alive, record in records.items():
        gaps = [first - turn.sent_at for first, turn in zip(first_event_times(record), record.turns)]
        handshakes = [2 * RTT] + [0.0 if keep_alive else 2 * RTT] * 2
        assert gaps == [exactly(h + RTT + SERVER_PRE) for h in handshakes]
        # Each request left after its handshake (turn 0 only, with keep-alive), reaching the server half an RTT later.
        sends = [t - turn.sent_at for (t, direction, _), turn in zip((e for e in record.timeline if e[1] == "send"), record.turns)]
        assert sends == [exactly(h) for h in handshakes]
    assert records[True].transcript == records[False].transcript
    assert records[False].seconds - records[True].seconds == exactly(2 * 2 * RTT)


async def test_before_sprint_profile_delays_the_first_byte_by_its_fixed_costs(autojump_clock) -> None:
    extra = SprintCosts(config_load=0.020, intermediate_hop=0.030, slow_safety_fixed=0.050, slow_safety_per_ktok=0.0)
    workload, firsts = wl.fixed(2), {}
    for name, switches in (("after", AFTER_SPRINT), ("before", BEFORE_SPRINT), ("hop", SprintSwitches(direct_inference_hop=False))):
        record = await completed_http_rollout(make_server(costs=KNOWN_COSTS, sprint=switches, sprint_extra=extra), workload)
        firsts[name] = [first - turn.sent_at for first, turn in zip(first_event_times(record), record.turns)]
    assert firsts["after"] == [exactly(SERVER_PRE)] * 2 and firsts["before"] == [exactly(SERVER_PRE + 0.100)] * 2
    assert firsts["hop"] == [exactly(SERVER_PRE + 0.030)] * 2


async def test_render_cache_tokenizes_only_what_it_has_not_seen(autojump_clock) -> None:
    render_per_token = attrs.evolve(ZERO_COSTS, render=StageCost(per_ktok=1.0))  # 1 ms per token rendered
    workload, timings = wl.fixed(3), {}
    for name, switches in (("after", AFTER_SPRINT), ("before", SprintSwitches(cross_request_render_cache=False))):
        server = make_server(costs=render_per_token, sprint=switches)
        record = await completed_http_rollout(server, workload, variant="stored", include_timing=True)
        usages = [server.api.store.get(rid).response["usage"]["input_tokens"] for rid in record.response_ids]
        sent = [parse_input([item for item in record.transcript if item["type"] == "function_call_output"][i : i + 1]) for i in range(2)]
        timings[name] = ([t.server_timing["phases_ms"]["render"] for t in record.turns], usages, sent)
    after, usages, sent = timings["after"]
    before, usages_before, _ = timings["before"]
    assert usages == usages_before
    # Before: the whole prompt is re-tokenized every turn (one model call per turn: input = prompt).
    assert before == [pytest.approx(n) for n in usages]
    # After: turn 0 tokenizes everything; later turns only the tool output they bring.
    assert after[0] == pytest.approx(usages[0])
    assert after[1:] == [pytest.approx(len(render.render_items(items))) for items in sent]


# --- routing and prefix-cache affinity -----------------------------------------------------------------


@pytest.mark.parametrize("routes", [(True, True), (True, False), (False, True), (False, False)], ids=["home-home", "home-away", "away-home", "away-away"])
async def test_a_turn_routed_away_finds_nothing_and_leaves_nothing(autojump_clock, monkeypatch, routes: tuple[bool, bool]) -> None:
    """Routed home a turn finds the earlier turn's prefix; routed elsewhere it finds nothing and leaves nothing."""
    api, draws = ApiService(costs=COSTS), iter(routes)
    monkeypatch.setattr(http_design, "reaches_prefix_cache", lambda items, affinity: next(draws))
    first = first_request(api, store=False)
    home = ("http", http_design.conversation_key(first.input))
    one = await http_design.run_http_turn(api, first, Sink())
    assert set(api.engine.kv) == ({home} if routes[0] else set())
    two = await http_design.run_http_turn(api, next_stateless(first, one), Sink())
    assert set(api.engine.kv) == ({home} if routes[0] or routes[1] else set())
    cached = two.usage.cached_tokens
    if not routes[1]:
        assert cached == 0
    elif routes[0]:
        # More than the first turn's whole prompt: its output too, in whole blocks.
        assert cached > one.usage.input_tokens and cached % api.engine.block_size == 0
    else:
        assert cached == one.usage.cached_tokens  # what any first turn finds: the preset's common prefix


async def test_each_conversation_keeps_its_own_kv_on_its_engine(autojump_clock, monkeypatch) -> None:
    monkeypatch.setattr(http_design, "reaches_prefix_cache", lambda items, affinity: True)
    api = ApiService(costs=COSTS)
    firsts = [first_request(api, store=False), first_request(api, prompt="write the docs", store=False)]
    responses = [await http_design.run_http_turn(api, first, Sink()) for first in firsts]
    assert set(api.engine.kv) == {("http", http_design.conversation_key(first.input)) for first in firsts}
    for first, response in zip(firsts, responses):
        await http_design.run_http_turn(api, next_stateless(first, response), Sink())
    assert len(api.engine.kv) == 2


def user(text: str) -> Message:
    return Message("user", (("input_text", text),))


def documented_draw(items: list) -> float:
    """The draw docs/parameters.md §6 documents (published runs replay only with it): a 64-bit blake2b of the item
    count and the first item's text, as a fraction of 2**64."""
    first = render.item_text(items[0]) if items else ""
    digest = hashlib.blake2b(f"{len(items)}\x00{first}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


CONVERSATIONS = [
    [],
    [user("fix the bug")],
    [user("fix the bug"), user("and the tests")],
    [user("write the docs"), user("x"), user("y")],
    [user("lone \ud800 surrogate")]]


@pytest.mark.parametrize("items", CONVERSATIONS, ids=["empty", "one", "two", "three", "surrogate"])
def test_a_turn_reaches_its_prefix_exactly_when_its_documented_draw_is_below_the_affinity(items: list) -> None:
    draw = documented_draw(items)
    assert 0.0 <= draw < 1.0 and not http_design.reaches_prefix_cache(items, affinity=draw)
    assert http_design.reaches_prefix_cache(items, affinity=math.nextafter(draw, 1.0))  # the next float up


def test_the_draw_depends_on_the_first_item_and_the_count_only() -> None:
    a, b = [user("fix the bug"), user("one"), user("two")], [user("fix the bug"), user("three"), user("four")]
    assert documented_draw(a) == documented_draw(b)
    for affinity in (0.1, 0.5, 0.9):
        hits = [[http_design.reaches_prefix_cache(c[:1] + c[1:2] * n, affinity=affinity) for n in range(1, 200)] for c in (a, b)]
        assert hits[0] == hits[1]


def test_a_conversation_is_keyed_by_its_first_item() -> None:
    key = http_design.conversation_key
    assert key([user("fix the bug")]) == key([user("fix the bug"), user("more")]) == key([user("fix the bug"), user("other")])
    assert key([user("fix the bug")]) != key([user("write the docs")]) and key([]) != key([user("fix the bug")])
    assert key([user("a \ud800")]) != key([user("a \udc00")])  # any text has a key, even a lone surrogate


def test_the_default_affinity_is_the_share_of_turns_routed_home_and_misses_are_drawn_per_task_and_turn() -> None:
    first = user("fix the bug")
    draws = [http_design.reaches_prefix_cache([first] * n) for n in range(1, 4001)]
    assert abs(sum(draws) / len(draws) - HTTP_AFFINITY) < 0.02
    assert http_design.reaches_prefix_cache([first], affinity=1.0) and not http_design.reaches_prefix_cache([first], affinity=0.0)
    # Generated tasks have their own content, so which turns miss differs from task to task.
    prompts = [user(harness.task_prompt(w)) for w in wl.generate(seed=0, n_tasks=20)]
    misses = [tuple(n for n in range(1, 200) if not http_design.reaches_prefix_cache([first] * n)) for first in prompts]
    assert len(set(misses)) == 20 and abs(sum(map(len, misses)) / (20 * 199) - (1 - HTTP_AFFINITY)) < 0.03

