"""Clients nobody here wrote, on a real socket (docs/protocol.md §5, §7, §9): openai-python's `responses.connect()` runs
the chained loop, every server event parsing into the SDK's own model; the `websockets` sync client drives a suspended
rollout against `python -m prototype serve`. The blocking SDK runs in a worker thread under `trio.fail_after`."""

from __future__ import annotations

import functools
import json
import typing
from typing import Any

import jsonschema
import pytest
import trio
from openai import OpenAI
from openai.types.responses import Response
from openai.types.responses.responses_server_event import ResponsesServerEvent, ResponseWsError
from websockets.sync.client import connect as ws_connect

MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}
CLIENT_TIMEOUT = 20.0  # seconds for a whole client run; a healthy run takes about 1-2 s
RECV_TIMEOUT = 5.0
MAX_EVENTS = 5000  # per response: a runaway stream fails instead of looping forever
MAX_TURNS = 10


def _event_models() -> dict[str, type]:
    """`type` value -> the model class the SDK's `ResponsesServerEvent` union assigns it."""
    union = typing.get_args(ResponsesServerEvent)[0]  # Annotated[Union[...], PropertyInfo(...)]
    models: dict[str, type] = {}
    for variant in typing.get_args(union):
        for value in typing.get_args(variant.model_fields["type"].annotation):
            models[value] = variant
    return models


EVENT_MODELS = _event_models()


def assert_typed(event: Any, raw: dict[str, Any]) -> None:
    """The SDK parsed `raw` into the model its union names for that type, and the frame validates against it (both:
    `parse_event` never raises, it constructs an unknown or invalid frame without checks)."""
    model = EVENT_MODELS.get(raw.get("type"))
    assert model is not None, f"{raw.get('type')!r} is not a server event type openai-python knows: {raw}"
    assert type(event) is model, f"{raw['type']} parsed as {type(event).__name__}, expected {model.__name__}"
    assert type(event).__module__.startswith("openai.types.responses")
    model.model_validate(raw)  # raises if a required field is missing or has the wrong type


def assert_call_valid(name: str, arguments: str, tools: list[dict[str, Any]]) -> None:
    """The call names one of the request's function tools and its arguments (a JSON string) are valid for its schema."""
    schemas = {tool["name"]: tool["parameters"] for tool in tools}
    assert name in schemas, f"call to {name!r}, not one of the client's tools {sorted(schemas)}"
    jsonschema.validate(json.loads(arguments), schemas[name])


# --- v2 with openai-python ----------------------------------------------------------------------

SDK_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "read_file", "description": "Read the first lines of a file in the repository.", "strict": True,
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer", "minimum": 1}},
                    "required": ["path", "max_lines"], "additionalProperties": False}},
    {"type": "function", "name": "run_tests", "description": "Run a test suite.", "strict": True,
     "parameters": {"type": "object", "properties": {"suite": {"type": "string", "enum": ["unit", "e2e"]}, "verbose": {"type": "boolean"}},
                    "required": ["suite", "verbose"], "additionalProperties": False}},
]


class Tap:
    """Keeps each raw frame next to the event the SDK parsed from it (wraps the connection's `parse_event`)."""

    def __init__(self, conn: Any) -> None:
        self.last: dict[str, Any] | None = None
        parse = conn.parse_event

        def tapped(data: str | bytes) -> Any:
            self.last = json.loads(data)
            return parse(data)

        conn.parse_event = tapped


def read_response(conn: Any, tap: Tap) -> list[tuple[Any, dict[str, Any]]]:
    """(event, raw frame) pairs up to and including a terminal event or an `error` frame."""
    pairs = []
    for event in conn:
        pairs.append((event, tap.last))
        if event.type in TERMINALS or event.type == "error":
            return pairs
        assert len(pairs) < MAX_EVENTS, "no terminal event"
    raise AssertionError("the connection closed before a terminal event")


def sdk_client(port: int) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="test", max_retries=0, timeout=RECV_TIMEOUT)


async def in_thread(fn, *args, **kwargs):
    """A blocking client run in a worker thread, abandoned (and unblocked when the server closes) past its time."""
    with trio.fail_after(CLIENT_TIMEOUT * 2):
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), abandon_on_cancel=True)


def assert_well_formed(pairs: list[tuple[Any, dict[str, Any]]]) -> tuple[str, Response]:
    """Every event typed, numbered from 0; created first, one terminal, last, completed. Returns (id, completed response)."""
    for event, raw in pairs:
        assert_typed(event, raw)
    types = [event.type for event, _ in pairs]
    assert types[0] == "response.created", types
    assert types[-1] == "response.completed", f"ended with {pairs[-1][1]}"
    assert sum(t in TERMINALS for t in types) == 1, types
    assert [event.sequence_number for event, _ in pairs] == list(range(len(pairs)))
    created, completed = pairs[0][0].response, pairs[-1][0].response
    assert completed.id == created.id
    assert all(event.response.id == created.id for event, _ in pairs if hasattr(event, "response"))
    assert completed.status == "completed"
    return created.id, completed


def run_tool_loop(port: int) -> list[dict[str, Any]]:
    """Create; answer the response's calls in the next create with `previous_response_id`; stop at one without calls."""
    turns: list[dict[str, Any]] = []
    with sdk_client(port).responses.connect() as conn:
        tap = Tap(conn)
        previous_id: str | None = None
        next_input: Any = "The unit tests fail after the last refactor; find out why and fix it."
        for _ in range(MAX_TURNS):
            # The tools are not inherited through previous_response_id (docs/protocol.md).
            chain = {} if previous_id is None else {"previous_response_id": previous_id}
            conn.response.create(model=MODEL, input=next_input, tools=SDK_TOOLS, metadata={"testbed_workload": "fixed:3"},
                                 store=False, **chain)
            pairs = read_response(conn, tap)
            calls = [item for item in pairs[-1][0].response.output if item.type == "function_call"] if pairs[-1][0].type in TERMINALS else []
            turns.append({"pairs": pairs, "calls": calls})
            if pairs[-1][0].type != "response.completed" or not calls:
                break
            previous_id = pairs[-1][0].response.id
            next_input = [{"type": "function_call_output", "call_id": call.call_id,
                           "output": json.dumps({"ok": True, "tool": call.name})} for call in calls]
    return turns


async def test_sdk_function_call_loop_chains_with_previous_response_id(live_server):
    _, port = live_server
    turns = await in_thread(run_tool_loop, port)
    assert len(turns) == 3, [t["pairs"][-1][1] for t in turns]
    ids = []
    for i, turn in enumerate(turns):
        pairs = turn["pairs"]
        response_id, completed = assert_well_formed(pairs)
        created = pairs[0][0].response
        assert created.previous_response_id == (ids[-1] if ids else None), f"turn {i}"
        assert completed.previous_response_id == created.previous_response_id
        ids.append(response_id)
        usage = completed.usage
        assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
        assert usage.output_tokens_details.reasoning_tokens >= 0
        # The non-final turns call the client's tools with schema-valid arguments; what was streamed (deltas,
        # arguments.done, output_item.done) is what the response holds.
        assert bool(turn["calls"]) == (i < 2), f"turn {i}: {turn['calls']}"
        for call in turn["calls"]:
            assert_call_valid(call.name, call.arguments, SDK_TOOLS)
            assert call.call_id and call.status == "completed"
            deltas = "".join(e.delta for e, _ in pairs if e.type == "response.function_call_arguments.delta" and e.item_id == call.id)
            done = [e.arguments for e, _ in pairs if e.type == "response.function_call_arguments.done" and e.item_id == call.id]
            assert (deltas, done) == (call.arguments, [call.arguments])
        streamed = [e.item.id for e, _ in pairs if e.type == "response.output_item.done"]
        assert streamed == [item.id for item in completed.output]
    assert len(set(ids)) == 3
    # The chained context grows turn by turn.
    inputs = [t["pairs"][-1][0].response.usage.input_tokens for t in turns]
    assert inputs == sorted(inputs) and len(set(inputs)) == 3, inputs


def run_warm_up_chain_and_unknown_previous(port: int) -> dict[str, list]:
    results = {}
    with sdk_client(port).responses.connect() as conn:
        tap = Tap(conn)
        common = {"model": MODEL, "tools": SDK_TOOLS, "metadata": {"testbed_workload": "fixed:2"}, "store": False}
        conn.response.create(input="Warm the connection up.", generate=False, **common)
        results["warm"] = read_response(conn, tap)
        conn.response.create(input=[], previous_response_id=results["warm"][-1][0].response.id, **common)
        results["chained"] = read_response(conn, tap)
        conn.response.create(input=[], previous_response_id="resp_does_not_exist_0001", **common)
        results["unknown"] = read_response(conn, tap)
        # A 4xx turn empties the one-slot cache (docs/protocol.md), and the chained turn was store=false.
        conn.response.create(input=[], previous_response_id=results["chained"][-1][0].response.id, **common)
        results["evicted"] = read_response(conn, tap)
        conn.response.create(input="Start over with the full context.", **common)
        results["fresh"] = read_response(conn, tap)
    return results


def assert_not_found(pairs: list, missing_id: str) -> None:
    [(event, raw)] = pairs  # one error frame in place of response.created
    assert_typed(event, raw)
    assert isinstance(event, ResponseWsError)
    assert (event.status, event.error.type, event.error.code, event.error.param, event.error.message) == (
        400, "invalid_request_error", "previous_response_not_found", "previous_response_id",
        f"Previous response with id '{missing_id}' not found.")


async def test_sdk_warm_up_chains_with_empty_input_and_previous_response_not_found_keeps_the_connection_usable(live_server):
    _, port = live_server
    results = await in_thread(run_warm_up_chain_and_unknown_previous, port)
    warm_id, warm_response = assert_well_formed(results["warm"])
    # docs/protocol.md: created -> completed; nothing is sampled, so no item events in between.
    assert [event.type for event, _ in results["warm"] if event.type != "response.in_progress"] == [
        "response.created", "response.completed"]
    assert warm_response.output == [] and warm_response.usage is not None and warm_response.usage.output_tokens == 0
    chained_id, chained_response = assert_well_formed(results["chained"])
    assert chained_id != warm_id and results["chained"][0][0].response.previous_response_id == warm_id
    assert chained_response.usage is not None and chained_response.usage.input_tokens > 0  # the warm-up's input is its context
    assert_not_found(results["unknown"], "resp_does_not_exist_0001")
    assert_not_found(results["evicted"], chained_id)
    fresh_id, fresh = assert_well_formed(results["fresh"])
    assert fresh_id != warm_id
    assert results["fresh"][0][0].response.previous_response_id is None
    assert fresh.usage is not None and fresh.usage.output_tokens > 0


# --- v1 with the `websockets` sync client, against the CLI server ---------------------------------

V1_HEADERS = {"Authorization": "Bearer x", "OpenAI-Beta": "responses_websockets=2026-02-04"}
V1_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                    "required": ["city", "unit"], "additionalProperties": False}},
    {"type": "function", "name": "lookup", "description": "Look a record up by its id.",
     "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": False}},
]


def v1_create(**extra: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": MODEL, "tools": V1_TOOLS, "metadata": {"testbed_workload": "fixed:4"}, "store": False,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Plan my trip."}]}], **extra}


def output_for(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny, 21"}


def send(ws: Any, event: dict[str, Any] | str) -> None:
    ws.send(event if isinstance(event, str) else json.dumps(event))


def recv(ws: Any, timeout: float = RECV_TIMEOUT) -> dict[str, Any]:
    frame = ws.recv(timeout=timeout)
    assert isinstance(frame, str), f"server sent a binary frame: {frame!r}"
    return json.loads(frame)


def assert_ws_error(frame: dict[str, Any], code: str, param: Any = None) -> None:
    """The nested WebSocket error shape (docs/protocol.md), with a message, which the SDK also accepts."""
    assert frame == {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "param": param,
                                                                "message": frame["error"]["message"] or "a message"}}
    ResponseWsError.model_validate(frame)


def drive_rollout(ws: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Create; answer each `response.done`'s calls with one `response.append`, until a terminal event (the first
    suspension first refuses a wrong call_id). Returns (every event, the response.done events, the first after each append)."""
    send(ws, v1_create())
    events: list[dict[str, Any]] = []
    dones: list[dict[str, Any]] = []
    resumed_after: list[dict[str, Any]] = []
    while True:
        event = recv(ws)
        assert event["type"] != "error", event
        events.append(event)
        assert len(events) < MAX_EVENTS, "no terminal event"
        if event["type"] in TERMINALS:
            return events, dones, resumed_after
        if event["type"] != "response.done":
            continue
        dones.append(event)
        calls = [item for item in event["response"]["output"] if item["type"] == "function_call"]
        assert calls, f"response.done without a pending call: {event}"
        if len(dones) == 1:
            # A wrong call_id is refused and the rollout stays suspended: nothing else streams.
            send(ws, {"type": "response.append", "input": [output_for("call_not_pending")]})
            assert_ws_error(recv(ws), "invalid_function_call_output", "input")
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)
        send(ws, {"type": "response.append", "input": [output_for(call["call_id"]) for call in calls]})
        resumed = recv(ws)
        events.append(resumed)
        resumed_after.append(resumed)


def test_v1_websockets_client_suspended_rollout(cli_server):
    server = cli_server("--costs", "zero")
    with ws_connect(f"ws://127.0.0.1:{server.port}/v1/responses", additional_headers=V1_HEADERS, open_timeout=RECV_TIMEOUT,
                    close_timeout=2, max_size=None) as ws:
        # Bad input with nothing in flight: each is answered with one error frame, the connection stays.
        for frame, code, param in [({"type": "response.append", "input": [output_for("call_1")]}, "no_suspended_response", None),
                                   ("{this is not json", "invalid_json", None),
                                   ({"type": "response.frobnicate", "input": []}, "unknown_event_type", "type"),
                                   (v1_create(previous_response_id="resp_earlier"), "unsupported_parameter",
                                    "previous_response_id")]:
            send(ws, frame)
            assert_ws_error(recv(ws), code, param)

        events, dones, resumed_after = drive_rollout(ws)

        # After the rollout nothing is suspended any more.
        send(ws, {"type": "response.append", "input": [output_for("call_1")]})
        assert_ws_error(recv(ws), "no_suspended_response")

    types = [event["type"] for event in events]
    assert (types[0], types[-1], types.count("response.done"), sum(t in TERMINALS for t in types)) == (
        "response.created", "response.completed", 3, 1)
    # One response for the whole rollout: the id never changes.
    assert {event["response"]["id"] for event in events if "response" in event} == {events[0]["response"]["id"]}
    # Resuming announces itself with response.in_progress (docs/protocol.md).
    assert [event["type"] for event in resumed_after] == ["response.in_progress"] * 3
    # sequence_number runs on across suspensions: 0, 1, 2, ... over the whole rollout.
    numbers = [event["sequence_number"] for event in events]
    assert numbers == list(range(len(events))), numbers

    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["usage"]["output_tokens"] > 0
    # Its output is the whole rollout: every streamed item, and every call each response.done carried.
    assert completed["output"] == [event["item"] for event in events if event["type"] == "response.output_item.done"]
    output_by_id = {item["id"]: item for item in completed["output"]}
    call_ids = []
    for done in dones:
        assert done["response"]["status"] == "in_progress"
        for item in done["response"]["output"]:
            assert output_by_id.get(item["id"]) == item, f"{item} missing from the completed output"
            if item["type"] == "function_call":
                assert_call_valid(item["name"], item["arguments"], V1_TOOLS)
                call_ids.append(item["call_id"])
    assert [item["call_id"] for item in completed["output"] if item["type"] == "function_call"] == call_ids
    assert len(set(call_ids)) == len(call_ids) == 3
    # docs/protocol.md: `response.done` has `"usage":{…cumulative…}`; the final usage sums the segments.
    usages = [done["response"]["usage"] for done in dones] + [completed["usage"]]
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        values = [usage[key] for usage in usages]
        assert values == sorted(values) and len(set(values)) == len(values), (key, values)
