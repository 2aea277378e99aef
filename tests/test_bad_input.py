"""Bad input, kept as data: each frame, handshake and HTTP request gets its own documented error; a
bystander rollout on another connection keeps its exact timeline, and the connection stays usable
where the protocol allows (docs/protocol.md). Unknown model names are accepted by design."""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
import trio_websocket
from support import DELAYED_LINK, make_server, receive, send, until, ws
from test_http import Answer, RawClient, open_client
from test_inject import BETA_HEADER, beta_ws

from prototype import workload as wl
from prototype.cli.serve import access_line
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import BETA, CHAINED, HARNESS_TOOLS, SUSPENDED, open_responses_websocket, run_websocket_rollout
from prototype.protocol import errors
from prototype.server.config import ServerConfig

MODEL = "sim-1000"
# A small fixed task (3 turns, 50-token prompt, 10 tokens per tool output, 5 output tokens, 0.3 s
# tools) keeps each case to a few hundred events.
SMALL = "fixed:3:50:10:5:0.3"
ONE_TURN = "fixed:1:50:10:5:0.3"
MAX_MESSAGE = 64 * 1024  # a small frame limit, so the oversized case stays cheap
CONFIG = ServerConfig(max_message_bytes=MAX_MESSAGE, max_body_bytes=MAX_MESSAGE)
BOTH = (SUSPENDED, CHAINED)
TERMINALS = ("response.completed", "response.failed", "response.incomplete")

# Placeholders a corpus frame may contain, filled in from the case's setup.
PREV = "$prev"  # the response id the setup produced (v2: a completed turn; another connection's turn)
CALL = "$call"  # the call id that response is waiting on


def create(**fields: Any) -> dict[str, Any]:
    """A valid `response.create`, with `fields` overriding; a field set to DROP is left out."""
    body = {"type": "response.create", "model": MODEL, "input": "fix the bug", "tools": HARNESS_TOOLS,
            "metadata": {"testbed_workload": SMALL}, "store": False, **fields}
    return {k: v for k, v in body.items() if v is not DROP}


DROP = object()


def output(call_id: str = CALL, text: str = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def meta(**pairs: str) -> dict[str, str]:
    return {"testbed_workload": SMALL, **pairs}


@attrs.frozen
class Bad:
    """One bad WebSocket frame (a dict as JSON text, a str or bytes frame). `stage`: refused by the reader
    (`frame`: nothing changes) or as a failed turn (`turn`: empties the v2 cache slot). `setup`: `live`
    (v1 suspended / v2 one completed turn), `fresh`, `other_connection` (a turn made on another, closed connection
    with store=false)."""

    name: str
    frame: Any
    code: str | None
    param: str | None = None
    designs: tuple[str, ...] = BOTH
    stage: str = "frame"
    setup: str = "live"


CORPUS: list[Bad] = [
    # --- frames the reader refuses: binary ones, the other design's event, a bad field (each code and message of the
    # codec is pinned in tests/test_codec.py, test_request_body.py and test_protocol.py) ----------------------------------
    Bad("binary, not UTF-8", b"\xff\xfe\xfd", errors.INVALID_JSON),
    Bad("binary, unknown type", b'{"type": "response.fly"}', errors.UNKNOWN_EVENT_TYPE, "type"),
    Bad("append on v2", {"type": "response.append", "input": [output()]}, errors.UNKNOWN_EVENT_TYPE, "type", designs=(CHAINED,)),
    Bad("background", create(background=True), errors.UNSUPPORTED_PARAMETER, "background"),
    # --- a turn's metadata and model, refused when the turn starts: a range error, or a value that names nothing ------
    Bad("unknown workload", create(metadata=meta(testbed_workload="nope")), errors.INVALID_VALUE, "metadata.testbed_workload", stage="turn", setup="fresh"),
    Bad("workload of 0 turns", create(metadata=meta(testbed_workload="fixed:0")), errors.INTEGER_BELOW_MIN_VALUE, "metadata.testbed_workload", stage="turn", setup="fresh"),
    Bad("workload of 100000 turns", create(metadata=meta(testbed_workload="fixed:100000")), errors.INTEGER_ABOVE_MAX_VALUE, "metadata.testbed_workload", stage="turn", setup="fresh"),
    Bad("negative seed", create(metadata=meta(testbed_seed="-1")), errors.INTEGER_BELOW_MIN_VALUE, "metadata.testbed_seed", stage="turn", setup="fresh"),
    Bad("task not a number", create(metadata=meta(testbed_task="x")), errors.INVALID_VALUE, "metadata.testbed_task", stage="turn", setup="fresh"),
    Bad("decode rate zero", create(metadata=meta(testbed_decode_tps="0")), errors.DECIMAL_BELOW_MIN_VALUE, "metadata.testbed_decode_tps", stage="turn", setup="fresh"),
    Bad("decode rate of 10 million", create(metadata=meta(testbed_decode_tps="1e7")), errors.DECIMAL_ABOVE_MAX_VALUE, "metadata.testbed_decode_tps", stage="turn", setup="fresh"),
    Bad("model sim-0", create(model="sim-0"), errors.INVALID_VALUE, "model", stage="turn", setup="fresh"),
    # --- bad state on v2 (these are turns: they empty the cache slot) ---------------------------------
    Bad("workload unknown mid-chain", create(previous_response_id=PREV, input=[output()], metadata=meta(testbed_workload="nope")), errors.INVALID_VALUE, "metadata.testbed_workload", designs=(CHAINED,), stage="turn"),
    Bad("unknown previous_response_id", create(previous_response_id="resp_unknown", input=[output()]), errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id", designs=(CHAINED,), stage="turn"),
    Bad("previous_response_id of another connection (store=false)", create(previous_response_id=PREV, input=[output()]), errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id", designs=(CHAINED,), stage="turn", setup="other_connection"),
    # An output answering its call twice, placed in the input (an unknown call: tests/test_chained.py, test_api_service.py).
    Bad("repeated call_id on v2", create(previous_response_id=PREV, input=[output(), output()]), errors.INVALID_FUNCTION_CALL_OUTPUT, "input[1]", designs=(CHAINED,), stage="turn"),
    Bad("tool output with no call in a new conversation", create(input=[{"role": "user", "content": "x"}, output("call_1")]), errors.INVALID_FUNCTION_CALL_OUTPUT, "input", stage="turn", setup="fresh"),
    # --- bad state on v1 (each append refusal's message, and the rollout resumed after it: tests/test_suspended.py) ------
    Bad("append with only a user message", {"type": "response.append", "input": [{"role": "user", "content": "go on"}]}, errors.INVALID_FUNCTION_CALL_OUTPUT, "input", designs=(SUSPENDED,)),
]

WS_CASES = [pytest.param(case, design, id=f"{design}-{case.name}") for case in CORPUS for design in case.designs]


# --- helpers ----------------------------------------------------------------------------------------


def fill(value: Any, ctx: dict[str, str]) -> Any:
    """The frame with its placeholders replaced by what the setup produced."""
    if isinstance(value, str):
        return ctx.get(value, value)
    if isinstance(value, list):
        return [fill(v, ctx) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, ctx) for k, v in value.items()}
    return value


def calls_of(response: dict[str, Any]) -> list[str]:
    return [item["call_id"] for item in response["output"] if item["type"] == "function_call"]


async def turn(conn, event: dict[str, Any]) -> list[dict[str, Any]]:
    await send(conn, event)
    return await until(conn, "response.done", *TERMINALS)


async def setup(server, conn, design: str, kind: str) -> dict[str, str]:
    """Bring the connection (or another one) into the state a case needs; returns the placeholders."""
    if kind == "live":
        last = (await turn(conn, create()))[-1]
        assert last["type"] == ("response.done" if design == SUSPENDED else "response.completed")
        return {PREV: last["response"]["id"], CALL: calls_of(last["response"])[0]}
    if kind == "other_connection":
        async with open_responses_websocket(InMemoryConnector(server), CHAINED) as other:
            last = (await turn(other, create()))[-1]["response"]
        return {PREV: last["id"], CALL: calls_of(last)[0]}
    return {}


async def check_usable(conn, design: str, case: Bad, ctx: dict[str, str]) -> None:
    """The connection still works after the error, with its state where the protocol keeps it."""
    if design == SUSPENDED and case.setup == "live":
        # The rollout is still suspended: the right append resumes it under the same id.
        await send(conn, {"type": "response.append", "input": [output(ctx[CALL])]})
        resumed = await receive(conn)
        assert resumed["type"] == "response.in_progress" and resumed["response"]["id"] == ctx[PREV]
        assert (await until(conn, "response.done", *TERMINALS))[-1]["type"] == "response.done"
        return
    if design == CHAINED and case.setup == "live":
        follow = create(previous_response_id=ctx[PREV], input=[output(ctx[CALL])])
        events = await turn(conn, follow)
        if case.stage == "frame":  # nothing reached the worker: the cached response is still there
            assert events[-1]["type"] == "response.completed" and events[-1]["response"]["previous_response_id"] == ctx[PREV]
            return
        assert events == [error_frame(errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id", events[0])]
    # Anything else: a new conversation on the same connection completes.
    events = await turn(conn, create(metadata={"testbed_workload": ONE_TURN}))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


def error_frame(code: str, param: str | None, seen: dict[str, Any]) -> dict[str, Any]:
    """The nested WebSocket error shape (docs/protocol.md), with `seen`'s message, which must be present."""
    assert isinstance(seen.get("error", {}).get("message"), str) and seen["error"]["message"]
    return refusal(code, seen["error"]["message"], param)


# Its own instructions: a bystander sharing a prefix with the misbehaving client would rightly run faster
# (the engine's prefix cache is shared by content), which is not what these tests measure.
BYSTANDER_TASK = attrs.evolve(
    wl.fixed(3, initial_prompt_tokens=50, appended_tokens=10, output_tokens=5, tool_seconds=0.3), prefix="bystander", prefix_tokens=20
)
_baseline: list[tuple[float, str, str]] = []


async def bystander(server, *, design: str = CHAINED) -> list[tuple[float, str, str]]:
    """A well-behaved rollout on its own connection; its timeline relative to its start."""
    record = await run_websocket_rollout(
        InMemoryConnector(server), design, BYSTANDER_TASK, metadata={"testbed_workload": SMALL}, model=MODEL)
    assert record.status == "completed" and len(record.turns) == 3
    return [(round(t - record.started_at, 9), d, e) for t, d, e in record.timeline]


async def bystander_baseline() -> list[tuple[float, str, str]]:
    if not _baseline:
        _baseline.extend(await bystander(make_server(config=CONFIG)))
    return _baseline


@attrs.define(eq=False)
class Bystander:
    """Runs `bystander` in the background; `timeline` once it has finished."""

    server: Any
    timeline: list | None = None
    done: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> None:
        try:
            self.timeline = await bystander(self.server)
        finally:
            self.done.set()

    @classmethod
    async def beside(cls, server, nursery: trio.Nursery) -> Bystander:
        """One started on `server` in `nursery`, once its baseline (a run on a server of its own) is known."""
        await bystander_baseline()
        watcher = cls(server)
        nursery.start_soon(watcher.run)
        return watcher

    async def check(self) -> None:
        """It ran as its baseline, to the nanosecond, and the server then released everything."""
        with trio.fail_after(60):
            await self.done.wait()
        assert self.timeline == await bystander_baseline()
        await assert_released(self.server)


def session_kv(server) -> dict:
    """The engine's KV entries held for WebSocket sessions (the http design's are keyed by prompt)."""
    return {key: entry for key, entry in server.api.engine.kv.items() if key[0] in ("chained", "suspended")}


async def assert_released(server) -> None:
    """Once every client has closed, the server holds nothing of theirs within a second."""
    with trio.fail_after(1):
        while server.sessions or server.connections:
            await trio.sleep(0.01)
    assert session_kv(server) == {}


# --- the WebSocket corpus -----------------------------------------------------------------------------


def test_every_code_of_the_corpus_is_documented() -> None:
    assert len({case.name for case in CORPUS}) == len(CORPUS)
    documented = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}
    assert {case.code for case in CORPUS if case.code} <= documented


@pytest.mark.parametrize(("case", "design"), WS_CASES)
async def test_bad_frame_gets_its_code_and_the_connection_stays_usable(autojump_clock, nursery, case: Bad, design: str) -> None:
    server = make_server(config=CONFIG)
    watcher = await Bystander.beside(server, nursery)
    async with open_responses_websocket(InMemoryConnector(server), design) as conn:
        ctx = await setup(server, conn, design, case.setup)
        await send(conn, fill(case.frame, ctx))
        answer = await receive(conn)
        assert answer == error_frame(case.code, case.param, answer)
        await check_usable(conn, design, case, ctx)
    await watcher.check()


@pytest.mark.parametrize("design", BOTH)
async def test_unknown_model_names_are_accepted_by_design(autojump_clock, design: str) -> None:
    # Any name selects a latency profile (the flagship rate for names it does not know), as clients
    # send model names this server cannot know in advance (docs/protocol.md).
    async with open_responses_websocket(InMemoryConnector(make_server()), design) as conn:
        start = trio.current_time()
        events = await turn(conn, create(model="no-such-model-9000", metadata={"testbed_workload": ONE_TURN}))
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["model"] == "no-such-model-9000"
    assert trio.current_time() - start > 5 / 65  # 5 tokens at the flagship's 65 tokens/s


EMPTY_MESSAGES = ["", [{"role": "user", "content": ""}], [{"type": "message", "role": "user", "content": ""}],
                  [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]}]]


async def test_an_empty_message_is_an_input_item_in_every_spelling_and_no_item_is_refused(autojump_clock, nursery) -> None:
    # A request needs one input item (or a previous_response_id); an empty user message is one, as the API
    # accepts it (pydantic-ai sends `{"role": "user", "content": ""}` for a run with instructions only).
    client = open_client(nursery, make_server(config=CONFIG))
    served = [(await client.request(body=good_body(input=empty, stream=False))) for empty in EMPTY_MESSAGES]
    assert {(answer.status, answer.json()["status"]) for answer in served} == {(200, "completed")}
    assert len({answer.json()["usage"]["input_tokens"] for answer in served}) == 1  # the same prompt every way
    for body, code in ((good_body(input=[]), errors.EMPTY_INPUT), (good_body(input=None), errors.MISSING_REQUIRED_PARAMETER),
                       (good_body(input=DROP), errors.MISSING_REQUIRED_PARAMETER)):
        answer = await client.request(body=body)
        assert (answer.status, answer.json()["error"]["code"], answer.json()["error"]["param"]) == (400, code, "input")


# --- each refusal of the reader, exactly: its error, the lane it names, its record, the next frame ---------

# Over a zero-latency pipe and over the 20 ms RTT link.
LINKS = {"pipe": None, "rtt-20ms": DELAYED_LINK}


def one_way(link: str) -> float:
    return 0.0 if LINKS[link] is None else LINKS[link].one_way_delay


def refusal(code: str, message: str, param: str | None = None, **lane: str) -> dict[str, Any]:
    """The WebSocket `error` event of a refusal (docs/protocol.md)."""
    return {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}, **lane}


def refusal_record(code: str, param: str | None, design: str = CHAINED, at: float = 0.0) -> dict[str, Any]:
    return {"user_agent": "", "transport": "websocket", "design": design, "connection": 1, "at_s": at, "response_id": None,
            "outcome": f"error:{code}", "param": param, "stream_id": param == "stream_id"}


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("design", BOTH)
async def test_a_frame_that_is_no_event_is_refused_and_the_next_one_is_served(autojump_clock, design: str, link: str) -> None:
    server = make_server()
    async with ws(server, design, network=LINKS[link]) as conn:
        await send(conn, "not json")
        assert await receive(conn) == refusal("invalid_json", "The frame is not valid JSON: Expecting value: line 1 column 1 (char 0).")
        await send(conn, create(metadata={"testbed_workload": ONE_TURN}))
        assert [e["type"] for e in await until(conn, *TERMINALS)][:2] == ["response.created", "response.in_progress"]
    # The frame arrived three one-way delays after the upgrade went out (the handshake's round trip, then the frame).
    assert list(server.records)[0] == refusal_record("invalid_json", None, design, at=3 * one_way(link))


@pytest.mark.parametrize("link", LINKS)
async def test_a_refused_create_on_a_lane_names_its_lane(autojump_clock, link: str) -> None:
    server = make_server(config=ServerConfig(max_streams=1, max_queued_creates=1))
    one_turn = {"testbed_workload": ONE_TURN}
    async with ws(server, network=LINKS[link]) as conn:
        for stream_id in ("a", "a", "a", "b"):  # one runs, one waits, the third is one too many; "b" is a lane too many
            await send(conn, create(metadata=one_turn, stream_id=stream_id))
        await send(conn, create(metadata=one_turn, stream_id="c", multi_agent={"enabled": True}))
        events: list[dict[str, Any]] = []
        while [e["type"] for e in events].count("response.completed") < 2:  # the two creates of lane "a" run
            events.append(await receive(conn))
    assert [event for event in events if event["type"] == "error"] == [
        refusal("too_many_queued_requests", "More than 1 response.create requests are waiting on this lane.", stream_id="a"),
        refusal("websocket_stream_limit_reached", "This WebSocket connection has reached its maximum number of distinct stream IDs (1). "
                "Reuse an existing stream_id or open a new WebSocket connection.", "stream_id", stream_id="b"),
        refusal("unsupported_parameter", "'multi_agent' needs the 'OpenAI-Beta: responses_multi_agent=v1' header on the connection.",
                "multi_agent", stream_id="c")]
    assert [r["outcome"] for r in server.records if r["response_id"] is None] == [
        "error:too_many_queued_requests", "error:websocket_stream_limit_reached", "error:unsupported_parameter"]


@pytest.mark.parametrize(("field", "value"), [
    ("previous_response_id", "resp_1"), ("generate", False), ("stream_id", "a"), ("multi_agent", {"enabled": True})])
async def test_v1_refuses_each_field_of_v2_without_naming_a_lane(autojump_clock, field: str, value: Any) -> None:
    server = make_server()
    async with beta_ws(server, f"{BETA[SUSPENDED]}, {BETA_HEADER}") as conn:  # with the multi-agent beta, which v1 ignores
        await send(conn, create(**{field: value}))
        assert await receive(conn) == refusal("unsupported_parameter", f"'{field}' is not supported on the suspended (v1) protocol.", field)
        await send(conn, create(metadata={"testbed_workload": ONE_TURN}))  # the refused create took nothing: the next is served
        assert (await until(conn, *TERMINALS))[0]["type"] == "response.created"
    assert list(server.records)[0] == refusal_record("unsupported_parameter", field, SUSPENDED)


async def test_an_append_on_v2_is_an_unknown_event(autojump_clock) -> None:
    async with ws(make_server()) as conn:
        await send(conn, {"type": "response.append", "input": [output("call_1")]})
        assert await receive(conn) == refusal(
            "unknown_event_type", "response.append is not supported in ws v2; use response.create with previous_response_id", "type")


# --- the handshake ------------------------------------------------------------------------------------


def first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def handshake_refusal(stream: trio.abc.Stream, resource: str, headers: list) -> trio_websocket.ConnectionRejected:
    """The server's refusal of a WebSocket handshake (the test fails if it accepts)."""
    refused: list[BaseException] = []
    try:
        async with trio.open_nursery() as inner:
            await trio_websocket.wrap_client_stream(inner, stream, "testbed", resource, extra_headers=headers)
    except* trio_websocket.ConnectionRejected as group:
        refused.append(first_leaf(group))
    assert refused, "the handshake was accepted"
    return refused[0]


@pytest.mark.parametrize("headers", [[], [(b"authorization", b"Bearer wrong")]], ids=["no authorization", "wrong key"])
async def test_bad_handshake_is_refused_with_its_status(autojump_clock, nursery, headers: list) -> None:
    server = make_server(config=attrs.evolve(CONFIG, api_keys=frozenset({"secret", "testbed"})))
    watcher = await Bystander.beside(server, nursery)
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    refused = await handshake_refusal(client, "/v1/responses", headers)
    body = json.loads(refused.body)
    assert (refused.status_code, body["error"]["code"]) == (401, "invalid_api_key") and body["error"]["message"]
    # The server goes on serving: a good handshake on the same server.
    async with open_responses_websocket(InMemoryConnector(server), CHAINED, api_key="secret") as conn:
        assert (await turn(conn, create(metadata={"testbed_workload": ONE_TURN})))[-1]["type"] == "response.completed"
    await watcher.check()


# --- HTTP (docs/protocol.md, §8; prototype/server/http.py) -------------------------------------------


def good_body(**fields: Any) -> dict[str, Any]:
    body = create(**{"metadata": {"testbed_workload": ONE_TURN}, **fields})
    del body["type"]
    return body


@attrs.frozen
class BadHttp:
    """One bad HTTP request: `raw` bytes as they are, or one built from the fields. `closes`: the server answers
    and closes; otherwise the connection serves a good request next."""

    name: str
    status: int
    code: str
    param: str | None = None
    method: str = "POST"
    target: str = "/v1/responses"
    body: Any = attrs.field(factory=good_body)
    content_type: str | None = "application/json"
    raw: bytes | None = None
    closes: bool = False


CHUNKED_HEAD = b"POST /v1/responses HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nauthorization: Bearer secret\r\ncontent-type: application/json\r\n\r\n"
HTTP_CORPUS = [
    BadHttp("GET without upgrade", 405, "method_not_allowed", method="GET", body=b""),
    BadHttp("root path", 404, "not_found", target="/"),
    BadHttp("path below a response", 404, "not_found", target="/v1/responses/resp_1/steps"),
    BadHttp("multipart", 415, "unsupported_media_type", content_type="multipart/form-data; boundary=x"),
    BadHttp("invalid JSON body", 400, "invalid_json", body=b'{"model": "x", "inp'),
    BadHttp("empty body", 400, "invalid_json", body=b""),
    BadHttp("body not UTF-8", 400, "invalid_json", body=b"\xff\xfe"),
    BadHttp("body with the WebSocket event's type", 400, "unknown_parameter", "type", body={"type": "response.create", **good_body()}),
    BadHttp("workload out of range", 400, "integer_above_max_value", "metadata.testbed_workload", body=good_body(metadata={"testbed_workload": "fixed:100000"})),
    BadHttp("model sim-0 streamed", 400, "invalid_value", "model", body=good_body(model="sim-0", stream=True)),
    BadHttp("GET a sim-<N> model with no usable rate", 404, "model_not_found", "model", method="GET", target="/v1/models/sim-0", body=b""),
    BadHttp("chunked body over the limit", 413, "request_too_large", raw=CHUNKED_HEAD + b"".join(b"%x\r\n%s\r\n" % (4096, b" " * 4096) for _ in range(17)), closes=True),
]


async def send_case(client: RawClient, case: BadHttp) -> Answer:
    if case.raw is None:
        return await client.request(case.method, case.target, body=case.body, auth="Bearer secret", content_type=case.content_type)
    # Put our h11 in the state a request leaves it in, then send the bytes as they are.
    client.conn.send(h11.Request(method="POST", target="/v1/responses", headers=[("host", "t"), ("content-length", "100")]))
    await client.stream.send_all(case.raw)
    return await client.answer()


@pytest.mark.parametrize("case", HTTP_CORPUS, ids=lambda c: c.name)
async def test_bad_http_request_gets_its_status_and_code(autojump_clock, nursery, case: BadHttp) -> None:
    server = make_server(config=attrs.evolve(CONFIG, api_keys=frozenset({"secret", "testbed"})))
    watcher = await Bystander.beside(server, nursery)
    client = open_client(nursery, server)
    answer = await send_case(client, case)
    assert (answer.status, answer.headers["content-type"]) == (case.status, "application/json"), answer.body
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (case.code, case.param, "invalid_request_error") and error["message"]
    assert answer.headers.get("allow") == ("POST" if case.status == 405 else None)
    assert answer.headers.get("www-authenticate") == ("Bearer" if case.status == 401 else None)
    assert answer.headers.get("connection") == ("close" if case.closes else None)  # a close is announced (RFC 9112 §9.6)
    if case.method == "POST" and case.target == "/v1/responses" and case.raw is None and not case.closes:
        # Every refused create is in the access log with its code, whether refused as it parsed or after.
        refusal = server.records[-1]
        assert refusal["outcome"] == f"error:{case.code}" and refusal["response_id"] is None
        assert f" error:{case.code} " in access_line(refusal)
    if case.closes:
        assert await client.server_closed()
    else:  # the same connection serves a good request next
        assert (await client.request(body=good_body(stream=False))).json()["status"] == "completed"
        await client.stream.aclose()
    await watcher.check()
