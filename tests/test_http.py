"""Tests of the http design: `POST /v1/responses` on the WebSocket's port (issue 4).

Rules every test here follows:

* The server runs in-process. Over memory streams the tests run under the `autojump_clock`
  (virtual time) and assert times exactly (`pytest.approx(rel=1e-9)` only absorbs float rounding).
  The openai-python tests use a real socket on 127.0.0.1, port 0, in real time, with the SDK's
  sync client in a worker thread and a timeout on everything.
* The client closes first, except in tests about the server closing.
* Every HTTP answer the harness reads goes through the strict SSE parser (prototype.client.sse), so
  each rollout here also checks the framing.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from support import DELAYED_LINK, H11Client

from prototype import netem
from prototype import workload as wl
from prototype.api import render
from prototype.api.costs import (
    AFTER_SPRINT,
    BEFORE_SPRINT,
    ZERO_COSTS,
    ApiCosts,
    SprintCosts,
    SprintSwitches,
    StageCost,
    sprint_costs,
)
from prototype.api.service import ApiService
from prototype.client import harness
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import HARNESS_TOOLS, open_responses_websocket, run_websocket_rollout
from prototype.client.http import run_http_rollout
from prototype.client.sse import parse_stream
from prototype.designs import http as http_design
from prototype.designs.emitter import EngineFailure
from prototype.engine.engine import HTTP_AFFINITY, Engine
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.protocol.items import FunctionCallOutput, Message, parse_input
from prototype.server.http import answers as server_http
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig

MODEL = "sim-1000"


def exactly(seconds: float) -> Any:
    return pytest.approx(seconds, rel=1e-9, abs=1e-12)


def make_server(*, costs: ApiCosts = ZERO_COSTS, config: ServerConfig | None = None, **api_fields: Any) -> ResponsesServer:
    return ResponsesServer(ApiService(costs=costs, **api_fields), config or ServerConfig())


def create_body(input: Any = "fix the bug", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": input, "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:3"}, "store": False, **fields}


# --- a raw HTTP/1.1 client over a memory stream ---------------------------------------------------


@attrs.define(eq=False)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient(H11Client):
    """An h11 client on one in-memory connection to the server."""

    async def request(
        self, method: str = "POST", target: str = "/v1/responses", *, body: bytes | dict | None = None,
        headers: list[tuple[str, str]] | None = None, auth: str | None = "Bearer testbed",
        content_type: str | None = "application/json", send_end: bool = True,
    ) -> Answer:
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        body = body or b""
        all_headers = [("host", "testbed"), ("content-length", str(len(body)))]
        if auth is not None:
            all_headers.append(("authorization", auth))
        if content_type is not None:
            all_headers.append(("content-type", content_type))
        all_headers += headers or []
        data = self.conn.send(h11.Request(method=method, target=target, headers=all_headers))
        data += self.conn.send(h11.Data(data=body)) if body else b""
        if send_end:
            data += self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(data)
        return await self.answer()

    async def answer(self) -> Answer:
        response = await self._next()
        self.informational = []
        while isinstance(response, h11.InformationalResponse):
            self.informational.append(response.status_code)
            response = await self._next()
        assert isinstance(response, h11.Response), response
        body = bytearray()
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        headers = {k.decode().lower(): v.decode() for k, v in response.headers}
        return Answer(response.status_code, headers, bytes(body))

    async def server_closed(self) -> bool:
        with trio.fail_after(5):
            return await self.stream.receive_some(1) == b""


@attrs.define(eq=False)
class Link:
    """Connections to `server` whose server side runs in `nursery`: zero-latency pipes, or links with
    `network`'s delay."""

    nursery: trio.Nursery
    server: ResponsesServer
    network: netem.NetworkProfile | None = None

    def open(self) -> RawClient:
        """A zero-latency pipe."""
        client, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.handle_stream, server_end)
        return RawClient(client)

    async def connect(self) -> RawClient:
        """A connection over `network` (a zero-latency pipe when it is None)."""
        if self.network is None:
            return self.open()
        client, server_end = await self.nursery.start(self._hold_link)
        self.nursery.start_soon(self.server.handle_stream, server_end)
        return RawClient(client)

    async def _hold_link(self, task_status: trio.TaskStatus) -> None:
        async with netem.open_emulated_pair(self.network) as pair:
            task_status.started(pair)
            await trio.sleep_forever()  # until the test's nursery is cancelled


@pytest.fixture(params=[None, DELAYED_LINK], ids=["pipe", "rtt-20ms"])
def network(request):
    """The link an HTTP shell test runs over: a zero-latency pipe, or the 20 ms RTT link."""
    return request.param


def error_of(answer: Answer, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "code", "message", "param"}
    assert body["error"]["code"] == code
    assert body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]
    return body["error"]


def assert_completed_stream(answer: Answer) -> list[Any]:
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["transfer-encoding"] == "chunked"
    events = parse_stream(answer.body)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    return events


# --- the same transcript in every design ----------------------------------------------------------


GENERATED = wl.generate_one("coding", seed=11, turns_median=5, turns_max=6, parallel_calls_p=0.5, hosted_call_p=0.5)


@pytest.mark.parametrize("workload", [wl.fixed(4), GENERATED], ids=["fixed", "generated"])
async def test_same_transcript_and_usage_in_every_design(autojump_clock, workload: wl.Workload) -> None:
    assert len(workload.turns) >= 3
    server = ResponsesServer()
    key = server.api.workloads.register(workload)
    metadata = {"testbed_workload": key}
    connector = InMemoryConnector(server)
    records = {
        "suspended": await run_websocket_rollout(connector, "suspended", workload, metadata=metadata, model=MODEL),
        "chained": await run_websocket_rollout(connector, "chained", workload, metadata=metadata, model=MODEL),
        "stateless": await run_http_rollout(connector, workload, variant="stateless", metadata=metadata, model=MODEL),
        "stored": await run_http_rollout(connector, workload, variant="stored", metadata=metadata, model=MODEL),
    }
    reference = records["suspended"]
    assert reference.status == "completed"
    assert len(reference.transcript) >= 2 * len(workload.turns)
    for name, record in records.items():
        assert record.status == "completed", name
        assert len(record.turns) == len(workload.turns), name
        assert record.transcript == reference.transcript, name
        for field in ("input_tokens", "output_tokens"):
            assert record.usage[field] == reference.usage[field], (name, field)
    assert records["stateless"].design == "http-stateless" and records["stored"].design == "http-stored"
    # One response per turn over http, with the stored chain walked from scratch every turn.
    assert len(records["stored"].response_ids) == len(workload.turns)
    # Stateless resends the history, so its requests grow; stored sends only the new items.
    stateless_sent = [turn.bytes_sent for turn in records["stateless"].turns]
    assert stateless_sent == sorted(stateless_sent) and stateless_sent[-1] > 2 * records["stored"].turns[-1].bytes_sent
    if workload is GENERATED:
        assert any(item["type"] == "web_search_call" for item in reference.transcript)


async def test_stored_chain_is_rebuilt_from_scratch_every_turn(autojump_clock) -> None:
    server = make_server(costs=attrs.evolve(ZERO_COSTS, store_read_per_turn=0.002))
    workload = wl.fixed(4)
    key = server.api.workloads.register(workload)
    record = await run_http_rollout(
        InMemoryConnector(server), workload, variant="stored", metadata={"testbed_workload": key}, include_timing=True
    )
    assert record.status == "completed"
    reads = [turn.server_timing["phases_ms"].get("store_read") for turn in record.turns]
    assert reads == [None, pytest.approx(2.0), pytest.approx(4.0), pytest.approx(6.0)]  # one read per earlier turn


# --- handshakes and round trips through the WAN emulator ------------------------------------------


RTT = 0.080
TLS13 = netem.NetworkProfile(rtt=RTT, tls_round_trips=1)  # TCP 1 RTT + TLS 1.3 1 RTT
KNOWN_COSTS = ApiCosts(
    validate=StageCost(fixed=0.010), safety=StageCost(fixed=0.020), render=StageCost(fixed=0.030),
    route=StageCost(fixed=0.040), post=0.050, store_read_per_turn=0.0,
)
SERVER_PRE = 0.100  # the four fixed stage costs: all the server does before response.created


def first_event_times(record) -> list[float]:
    """When each turn's first event (response.created) arrived."""
    times = []
    for turn in record.turns:
        times.append(min(t for t, direction, _ in record.timeline if direction == "recv" and t >= turn.sent_at))
    return times


async def test_first_byte_is_handshake_plus_one_rtt_plus_server_time(autojump_clock) -> None:
    server = make_server(costs=KNOWN_COSTS)
    workload = wl.fixed(1)
    key = server.api.workloads.register(workload)
    record = await run_http_rollout(InMemoryConnector(server, TLS13), workload, metadata={"testbed_workload": key})
    assert record.status == "completed"
    assert TLS13.handshake_seconds == exactly(2 * RTT)
    (first,) = first_event_times(record)
    assert first - record.turns[0].sent_at == exactly(2 * RTT + RTT + SERVER_PRE)
    # The request left after the handshake and reached the server half an RTT later.
    sends = [t for t, direction, _ in record.timeline if direction == "send"]
    assert sends == [exactly(record.turns[0].sent_at + 2 * RTT)]


@pytest.mark.parametrize("variant", ["stateless", "stored"])
async def test_keep_alive_pays_the_handshake_once(autojump_clock, variant: str) -> None:
    workload = wl.fixed(3, tool_seconds=0.5)
    records = {}
    for keep_alive in (True, False):
        server = make_server(costs=KNOWN_COSTS)  # a fresh server each: same prefix-cache state
        key = server.api.workloads.register(workload)
        records[keep_alive] = await run_http_rollout(
            InMemoryConnector(server, TLS13), workload, variant=variant, metadata={"testbed_workload": key}, keep_alive=keep_alive
        )
    for keep_alive, record in records.items():
        assert record.status == "completed"
        gaps = [first - turn.sent_at for first, turn in zip(first_event_times(record), record.turns)]
        handshakes = [2 * RTT] + [0.0 if keep_alive else 2 * RTT] * 2
        assert gaps == [exactly(h + RTT + SERVER_PRE) for h in handshakes]
    assert records[True].transcript == records[False].transcript
    assert records[False].seconds - records[True].seconds == exactly(2 * 2 * RTT)


# --- the API profiles before and after the single-request sprint ----------------------------------


def test_sprint_costs_add_back_what_each_switch_removed() -> None:
    costs = ApiCosts()
    extra = SprintCosts()
    assert sprint_costs(costs, AFTER_SPRINT) is costs
    before = sprint_costs(costs, BEFORE_SPRINT, extra)
    assert before.route.fixed == pytest.approx(costs.route.fixed + extra.config_load + extra.intermediate_hop)
    assert before.safety.fixed == pytest.approx(costs.safety.fixed + extra.slow_safety_fixed)
    assert before.safety.per_ktok == pytest.approx(costs.safety.per_ktok + extra.slow_safety_per_ktok)
    assert (before.validate, before.render, before.post) == (costs.validate, costs.render, costs.post)
    hop_only = sprint_costs(costs, SprintSwitches(direct_inference_hop=False), extra)
    assert hop_only.route.fixed == pytest.approx(costs.route.fixed + extra.intermediate_hop)
    assert hop_only.safety == costs.safety


async def test_before_sprint_profile_delays_the_first_byte_by_its_fixed_costs(autojump_clock) -> None:
    extra = SprintCosts(config_load=0.020, intermediate_hop=0.030, slow_safety_fixed=0.050, slow_safety_per_ktok=0.0)
    workload = wl.fixed(2)
    firsts = {}
    for name, switches in (("after", AFTER_SPRINT), ("before", BEFORE_SPRINT), ("hop", SprintSwitches(direct_inference_hop=False))):
        server = make_server(costs=KNOWN_COSTS, sprint=switches, sprint_extra=extra)
        key = server.api.workloads.register(workload)
        record = await run_http_rollout(InMemoryConnector(server), workload, metadata={"testbed_workload": key})
        assert record.status == "completed"
        firsts[name] = [first - turn.sent_at for first, turn in zip(first_event_times(record), record.turns)]
    assert firsts["after"] == [exactly(SERVER_PRE)] * 2
    assert firsts["before"] == [exactly(SERVER_PRE + 0.100)] * 2
    assert firsts["hop"] == [exactly(SERVER_PRE + 0.030)] * 2


async def test_render_cache_tokenizes_only_what_it_has_not_seen(autojump_clock) -> None:
    render_per_token = attrs.evolve(ZERO_COSTS, render=StageCost(per_ktok=1.0))  # 1 ms per token rendered
    workload = wl.fixed(3)
    timings = {}
    for name, switches in (("after", AFTER_SPRINT), ("before", SprintSwitches(cross_request_render_cache=False))):
        server = make_server(costs=render_per_token, sprint=switches)
        key = server.api.workloads.register(workload)
        record = await run_http_rollout(
            InMemoryConnector(server), workload, variant="stored", metadata={"testbed_workload": key}, include_timing=True
        )
        assert record.status == "completed"
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


def test_render_cache_equals_a_full_render() -> None:
    cache = render.RenderCache()
    items = parse_input([
        {"type": "message", "role": "user", "content": "fix the bug"},
        {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{\"path\": \"a.py\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "print('hi')"},
    ])
    key = render.preamble_key("be brief", ())
    prompt, tokenized = cache.render_full(key, items)
    assert prompt.ids == render.render_full(key, items).ids
    assert tokenized == len(prompt)
    again, tokenized = cache.render_full(key, [*items, FunctionCallOutput("call_2", "more")])
    assert again.ids == render.render_full(key, [*items, FunctionCallOutput("call_2", "more")]).ids
    assert tokenized == len(render.render_items([FunctionCallOutput("call_2", "more")]))
    small = render.RenderCache(max_tokens=10)
    small.render_full(key, items)
    assert small.tokens <= 10 or len(small) == 1


# --- routing and prefix-cache affinity ------------------------------------------------------------


def test_affinity_draw_is_deterministic_and_near_its_probability() -> None:
    first = Message("user", (("input_text", "fix the bug"),))
    draws = [http_design.reaches_prefix_cache([first] * n) for n in range(1, 4001)]
    assert draws == [http_design.reaches_prefix_cache([first] * n) for n in range(1, 4001)]
    assert abs(sum(draws) / len(draws) - HTTP_AFFINITY) < 0.02
    assert http_design.reaches_prefix_cache([first], affinity=1.0)
    assert not http_design.reaches_prefix_cache([first], affinity=0.0)


def test_affinity_misses_are_drawn_per_task_and_turn() -> None:
    """Generated tasks have their own content, so which turns miss differs from task to task."""
    prompts = [Message("user", (("input_text", harness.task_prompt(w)),)) for w in wl.generate(seed=0, n_tasks=20)]
    misses = [tuple(n for n in range(1, 200) if not http_design.reaches_prefix_cache([first] * n)) for first in prompts]
    assert len(set(misses)) == 20
    assert abs(sum(map(len, misses)) / (20 * 199) - (1 - HTTP_AFFINITY)) < 0.03


# --- the HTTP shell: answers, errors, keep-alive ----------------------------------------------------


async def test_stream_false_returns_the_response_json(autojump_clock, nursery, network) -> None:
    link = Link(nursery, make_server(), network)
    client = await link.connect()
    answer = await client.request(body=create_body(stream=False))
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    response = answer.json()
    assert response["object"] == "response" and response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["usage"]["output_tokens"] > 0
    assert "testbed_timing" not in response
    timed = await client.request(body=create_body(stream=False), headers=[("x-responsesapi-include-timing-metrics", "true")])
    assert "prefill" in timed.json()["testbed_timing"]["phases_ms"]
    capped = (await client.request(body=create_body(stream=False, max_output_tokens=16))).json()
    assert capped["status"] == "incomplete" and capped["incomplete_details"] == {"reason": "max_output_tokens"}
    assert capped["usage"]["output_tokens"] == 16  # the API's smallest cap


async def test_one_connection_serves_request_after_request(autojump_clock, nursery, network) -> None:
    server = make_server()
    link = Link(nursery, server, network)
    client = await link.connect()
    first = assert_completed_stream(await client.request(body=create_body(stream=True)))
    response = first[-1].data["response"]
    call = next(item for item in response["output"] if item["type"] == "function_call")
    answer = await client.request(
        body=create_body([*parse_and_dump("fix the bug"), *response["output"],
                          {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}], stream=True)
    )
    assert_completed_stream(answer)
    assert server.connections == 1


def parse_and_dump(text: str) -> list[dict[str, Any]]:
    return [item.to_dict() for item in parse_input(text)]


async def test_refusals_get_status_and_error_body_and_the_server_keeps_serving(autojump_clock, nursery, network) -> None:
    server = make_server(config=ServerConfig(api_keys=frozenset({"secret"}), max_body_bytes=4096))
    link = Link(nursery, server, network)
    client = await link.connect()
    auth = "Bearer secret"

    # Every refusal below keeps the connection open: a good request follows on the same one.
    error_of(await client.request(body=b'{"model": "x", "inp', auth=auth), 400, "invalid_json")
    error_of(await client.request(body=b"[1, 2]", auth=auth), 400, "invalid_json")
    error_of(await client.request(body={"model": MODEL, "input": 5}, auth=auth), 400, "invalid_type", "input")
    error_of(await client.request(body={"model": MODEL}, auth=auth), 400, "missing_required_parameter", "input")
    error_of(await client.request(body=create_body(background=True), auth=auth), 400, "unsupported_parameter", "background")
    answer = await client.request("GET", body=b"", auth=auth)
    error_of(answer, 405, "method_not_allowed")
    assert answer.headers["allow"] == "POST"
    error_of(await client.request("PUT", body=create_body(), auth=auth), 405, "method_not_allowed")
    answer = await client.request("HEAD", auth=auth)
    assert answer.status == 405 and answer.body == b"" and answer.headers["allow"] == "POST"
    answer = await client.request(body=create_body(stream=True), auth=auth, headers=[("expect", "100-continue")])
    assert_completed_stream(answer)
    assert client.informational == [100]
    error_of(await client.request("POST", "/v1/chat/completions", body=create_body(), auth=auth), 404, "not_found")
    error_of(await client.request(body=create_body(), auth=auth, content_type="text/plain"), 415, "unsupported_media_type")
    for bad in ("Bearer wrong", None, "Basic c2VjcmV0", "Bearer"):
        answer = await client.request(body=create_body(), auth=bad)
        error_of(answer, 401, "invalid_api_key")
        assert answer.headers["www-authenticate"] == "Bearer"
    missing = error_of(
        await client.request(body=create_body([], previous_response_id="resp_nope"), auth=auth),
        400, "previous_response_not_found", "previous_response_id",
    )
    assert missing["message"] == "Previous response with id 'resp_nope' not found."
    assert_completed_stream(await client.request(body=create_body(stream=True), auth=auth))

    # An oversized body: 413, then the server closes (the body was not read).
    answer = await client.request(body=b"x" * 5000, auth=auth)
    error_of(answer, 413, "request_too_large")
    assert answer.headers["connection"] == "close"
    assert await client.server_closed()

    # A chunked body that grows past the limit: 413 too.
    client = await link.connect()
    data = client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[
        ("host", "t"), ("transfer-encoding", "chunked"), ("authorization", auth), ("content-type", "application/json")]))
    for _ in range(5):
        data += client.conn.send(h11.Data(data=b" " * 1000))
    await client.stream.send_all(data)
    error_of(await client.answer(), 413, "request_too_large")
    assert await client.server_closed()

    # A body cut short by the client closing its side: 400, then close.
    client = await link.connect()
    head = b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\nauthorization: Bearer secret\r\n\r\n{\"model\""
    await client.stream.send_all(head)
    await client.stream.send_eof()
    client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[("host", "t"), ("content-length", "100")]))
    error_of(await client.answer(), 400, "bad_request")
    assert await client.server_closed()

    # Garbage instead of HTTP: 400 and close; the server still serves new connections.
    client = await link.connect()
    await client.stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
    raw = await client.stream.receive_some(65536)
    assert raw.startswith(b"HTTP/1.1 400 ")
    client = await link.connect()
    assert_completed_stream(await client.request(body=create_body(stream=True), auth=auth))


async def test_auth_is_shared_with_the_websocket_path(autojump_clock, nursery, network) -> None:
    server = make_server(config=ServerConfig(api_keys=frozenset({"secret"})))
    link = Link(nursery, server, network)
    upgrade = [("upgrade", "websocket"), ("connection", "Upgrade"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
               ("sec-websocket-version", "13")]
    client = await link.connect()
    error_of(await client.request("GET", headers=upgrade, auth="Bearer wrong", content_type=None), 401, "invalid_api_key")
    async with open_responses_websocket(InMemoryConnector(server), "chained", api_key="secret") as ws:
        await ws.send_message(json.dumps({"type": "response.create", **create_body()}))
        while json.loads(await ws.get_message())["type"] != "response.completed":
            pass
    client = await link.connect()
    error_of(await client.request(body=create_body(), auth="Bearer wrong"), 401, "invalid_api_key")
    assert_completed_stream(await client.request(body=create_body(stream=True), auth="Bearer secret"))


async def test_connection_close_is_honoured(autojump_clock, nursery, network) -> None:
    client = await Link(nursery, make_server(), network).connect()
    answer = await client.request(body=create_body(stream=True), headers=[("connection", "close")])
    assert_completed_stream(answer)
    assert await client.server_closed()


async def test_idle_keep_alive_connection_is_closed_and_the_harness_reconnects(autojump_clock, network) -> None:
    server = make_server(config=ServerConfig(http_idle_timeout=1.0))
    workload = wl.fixed(3, tool_seconds=5.0)  # every tool run outlasts the idle timeout
    key = server.api.workloads.register(workload)
    record = await run_http_rollout(InMemoryConnector(server, network), workload, metadata={"testbed_workload": key})
    assert record.status == "completed" and len(record.turns) == 3


class FailingEngine(Engine):
    """Fails the first `failures` model calls, as an injected fault."""

    failures: int = 1

    async def prefill(self, latency, *, uncached: int, cached: int, start: float | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise EngineFailure("injected")
        await super().prefill(latency, uncached=uncached, cached=cached)


async def test_engine_failure_ends_the_stream_with_response_failed(autojump_clock, nursery, network) -> None:
    engine = FailingEngine()
    engine.failures = 2
    client = await Link(nursery, make_server(engine=engine), network).connect()
    answer = await client.request(body=create_body(stream=True))
    events = parse_stream(answer.body)
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].data["response"]["error"]["code"] == "engine_failure"
    answer = await client.request(body=create_body(stream=False))
    assert answer.status == 500
    assert answer.json()["error"]["code"] == "engine_failure" and answer.json()["error"]["type"] == "server_error"
    assert_completed_stream(await client.request(body=create_body(stream=True)))  # same connection


async def test_a_failure_after_streaming_started_is_a_flat_sse_error(autojump_clock, nursery, network, monkeypatch) -> None:
    async def faulty(api, request, sink, **kwargs):
        await sink(ev.ResponseCreated(0, {"id": "resp_x", "object": "response", "status": "in_progress"}))
        raise ProtocolError("invalid_value", "A late refusal.", param="input")

    monkeypatch.setattr(server_http, "run_http_turn", faulty)
    client = await Link(nursery, make_server(), network).connect()
    events = parse_stream((await client.request(body=create_body(stream=True))).body)
    assert [e.type for e in events] == ["response.created", "error"]
    assert events[-1].data == {"type": "error", "code": "invalid_value", "message": "A late refusal.", "param": "input", "sequence_number": 1}
    monkeypatch.undo()
    assert_completed_stream(await client.request(body=create_body(stream=True)))


# --- openai-python against a real socket -----------------------------------------------------------


SDK_TIMEOUT = 20.0
SDK_MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds


@attrs.define(eq=False)
class CountingServer(ResponsesServer):
    accepted: int = 0

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        self.accepted += 1
        await ResponsesServer.handle_stream(self, stream)


async def test_openai_sdk_responses_create_streaming_and_not(nursery) -> None:
    from openai import OpenAI
    from openai.types.responses import Response

    server = CountingServer(ApiService(costs=ZERO_COSTS))
    listeners = await nursery.start(server_http_serve, server)
    port = listeners[0].socket.getsockname()[1]

    def run_client() -> dict[str, Any]:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0, timeout=10.0)
        out: dict[str, Any] = {}
        first = client.responses.create(
            model=SDK_MODEL, input="fix the bug", tools=HARNESS_TOOLS, store=True, metadata={"testbed_workload": "fixed:2"}
        )
        out["first"] = first
        call = next(item for item in first.output if item.type == "function_call")
        events = []
        with client.responses.create(
            model=SDK_MODEL, previous_response_id=first.id, tools=HARNESS_TOOLS, stream=True,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "2 tests failed"}],
            metadata={"testbed_workload": "fixed:2"},
        ) as stream:
            for event in stream:
                events.append(event)
        out["events"] = events
        try:
            client.responses.create(model=SDK_MODEL, input="x", previous_response_id="resp_missing")
        except Exception as exc:  # noqa: BLE001 - the SDK's exception type is what is checked
            out["error"] = exc
        client.close()
        return out

    with trio.fail_after(SDK_TIMEOUT):
        out = await trio.to_thread.run_sync(run_client, abandon_on_cancel=True)
    first = out["first"]
    assert isinstance(first, Response) and first.status == "completed"
    assert [item.type for item in first.output] == ["message", "function_call"]
    assert first.usage.input_tokens > 0
    events = out["events"]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    for event in events:
        assert type(event).__module__.startswith("openai.types.responses"), event
    assert events[-1].response.previous_response_id == first.id
    assert events[-1].response.output_text
    assert any(event.type == "response.output_text.delta" for event in events)
    error = out["error"]
    assert type(error).__name__ == "BadRequestError" and error.status_code == 400
    assert error.body["code"] == "previous_response_not_found"
    assert server.accepted == 1  # httpx kept the one connection alive across the three requests


async def server_http_serve(server: ResponsesServer, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    from prototype.server.app import serve_responses

    await serve_responses(server, 0, task_status=task_status)
