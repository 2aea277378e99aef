"""A client nobody here wrote, on a real socket (docs/protocol.md §5, §7, §9): openai-python's `responses.connect()` runs
the chained loop and steers, every server event and error frame parsing into the SDK's own model. The SDK client
(client/sdk.py) reproduces the benchmark: the same task through the harness and through openai-python
(`rollout_client("sdk")`), in both WebSocket designs, to the same transcript and usage, the server's records telling the
two apart by user agent; its lanes and steer run against the server (the v1 loop over openai-python: test_client_v1.py).
The blocking SDK runs in a worker thread under `trio.fail_after`; real time: events, never durations."""

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

from prototype.client.connect import TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.client.sdk import rollout_client, run_sdk_lanes, run_sdk_steer
from prototype.workload import fixed

MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}
CLIENT_TIMEOUT = 20.0  # seconds for a whole client run; a healthy run takes about 1-2 s
RECV_TIMEOUT = 5.0
MAX_EVENTS = 5000  # per response: a runaway stream fails instead of looping forever
MAX_TURNS = 10


def _event_models() -> dict[str, type]:
    """`type` value -> the model class the SDK's `ResponsesServerEvent` union assigns it."""
    union = typing.get_args(ResponsesServerEvent)[0]  # Annotated[Union[...], PropertyInfo(...)]
    return {value: variant for variant in typing.get_args(union)
            for value in typing.get_args(variant.model_fields["type"].annotation)}


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
    """Every event typed; created first, completed last, one response. Returns (its id, the completed response)."""
    for event, raw in pairs:
        assert_typed(event, raw)
    created, completed = pairs[0][0], pairs[-1][0]
    assert (created.type, completed.type) == ("response.created", "response.completed")
    assert completed.response.id == created.response.id
    return created.response.id, completed.response


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
        conn.response.create(model=MODEL, input=[], tools=SDK_TOOLS, previous_response_id="resp_does_not_exist_0001", store=False)
        turns.append({"pairs": read_response(conn, tap), "calls": []})
        # `conn.response.steer` at an unknown response, then at the completed last one: each answered by one failure.
        for target in ("resp_missing", pairs[-1][0].response.id):
            conn.response.steer(input=[{"type": "message", "role": "user", "content": "late"}], previous_response_id=target)
            turns.append({"pairs": [next((event, tap.last) for event in conn)], "calls": []})
    return turns


async def test_sdk_function_call_loop_chains_with_previous_response_id(live_server):
    _, port = live_server
    *turns, unknown, missing, late = await in_thread(run_tool_loop, port)
    assert len(turns) == 3, [t["pairs"][-1][1] for t in turns]
    # An unknown previous_response_id: one error frame in place of response.created, typed as the SDK's WebSocket error.
    [(event, raw)] = unknown["pairs"]
    assert_typed(event, raw)
    assert isinstance(event, ResponseWsError) and (event.status, event.error.code, event.error.param) == (
        400, "previous_response_not_found", "previous_response_id")
    for steer, code in ((missing, "response_not_found"), (late, "response_already_completed")):
        [(event, raw)] = steer["pairs"]
        assert_typed(event, raw)
        assert (event.type, event.error.code, "stream_id" in raw) == ("response.steer.failed", code, False)  # the default lane
    # Each turn chains from the one before; the non-final turns call the client's strict tools with schema-valid
    # arguments (the stream's numbering, items and usage, every design's: test_wire_conformance.py).
    ids = []
    for i, turn in enumerate(turns):
        response_id, completed = assert_well_formed(turn["pairs"])
        assert turn["pairs"][0][0].response.previous_response_id == completed.previous_response_id == (ids[-1] if ids else None)
        ids.append(response_id)
        assert bool(turn["calls"]) == (i < 2), f"turn {i}: {turn['calls']}"
        for call in turn["calls"]:
            assert_call_valid(call.name, call.arguments, SDK_TOOLS)


def compact_then_continue(port: int) -> tuple[Any, list[tuple[Any, dict[str, Any]]]]:
    """The WS guide's standalone compaction: `responses.compact` over HTTP, then its window as a new chain's input."""
    client = sdk_client(port)
    compacted = client.responses.compact(model=MODEL, input=[{"role": "user", "content": "Find the failing test."}])
    with client.responses.connect() as conn:
        tap = Tap(conn)
        conn.response.create(model=MODEL, input=[item.to_dict(warnings=False) for item in compacted.output], store=False,
                             metadata={"testbed_workload": "fixed:1"})
        return compacted, read_response(conn, tap)


async def test_sdk_compacts_and_the_window_starts_a_new_chain(live_server):
    _, port = live_server
    compacted, window = await in_thread(compact_then_continue, port)
    assert (compacted.object, [item.type for item in compacted.output]) == ("response.compaction", ["message", "compaction"])
    assert assert_well_formed(window)[1].previous_response_id is None


# --- the SDK client (client/sdk.py): the benchmark's rollouts, lanes and steering -----------------------------------


TURNS = 3
WORKLOAD = fixed(TURNS, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=50, tool_seconds=0.01)
METADATA = {"testbed_workload": f"fixed:{TURNS}:2000:200:50:0.01"}


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_sdk_client_reproduces_the_harness_and_the_timing_header_returns_its_client_fields(live_server, design):
    server, port = live_server
    with trio.fail_after(CLIENT_TIMEOUT):
        ours = await rollout_client("harness")(TcpConnector("127.0.0.1", port), design, WORKLOAD, metadata=METADATA, model=MODEL)
    with trio.fail_after(CLIENT_TIMEOUT + 5):  # the SDK's rollout, as an experiment swaps it in for the harness's
        theirs = await rollout_client("sdk")(TcpConnector("127.0.0.1", port), design, WORKLOAD, metadata=METADATA, model=MODEL,
                                             timeout=CLIENT_TIMEOUT, include_timing=True)

    for record in (ours, theirs):
        assert (record.status, len(record.turns)) == ("completed", TURNS)
        assert all(t.first_token_at is not None and t.sent_at <= t.first_token_at <= t.ended_at for t in record.turns)
        assert all(t.bytes_sent > 0 and t.bytes_received > 0 for t in record.turns)
    assert theirs.transcript == ours.transcript
    assert len(ours.transcript) == 1 + 3 * (TURNS - 1) + 1  # prompt; (text, call, output) per tool turn; answer
    # The same task twice on one server: the second run also finds the first's blocks in the prefix cache.
    assert {k: v for k, v in theirs.usage.items() if k != "cached_tokens"} == {k: v for k, v in ours.usage.items() if k != "cached_tokens"}
    assert theirs.usage["cached_tokens"] >= ours.usage["cached_tokens"]
    assert len(theirs.response_ids) == len(ours.response_ids) == (TURNS if design == CHAINED else 1)
    assert [t.tool_seconds > 0 for t in theirs.turns] == [True] * (TURNS - 1) + [False]

    # The server's records: the SDK's user agent, the same protocol choices as the harness.
    sdk_records = [r for r in server.records if r["user_agent"].startswith("OpenAI/Python")]
    harness_records = [r for r in server.records if r not in sdk_records]
    assert len(sdk_records) == len(harness_records) == len(ours.response_ids)
    for mine, other in zip(harness_records, sdk_records):
        for field in ("design", "context", "warmup", "stream", "input_items", "input_types", "appends", "outcome"):
            assert mine[field] == other[field], field
    if design == SUSPENDED:
        assert sdk_records[0]["appends"] == TURNS - 1 and sdk_records[0]["context"] == "full"
    else:
        assert [r["context"] for r in sdk_records] == ["full"] + ["chained"] * (TURNS - 1)
    # The SDK run asked for the timing, the harness's did not.
    assert [r["timing_requested"] for r in server.records] == [r in sdk_records for r in server.records]
    # With the timing header, each terminal event carries the client fields in `testbed_timing.client`.
    for turn in theirs.turns:
        client = turn.server_timing["client"]
        assert client["user_agent"].startswith("OpenAI/Python") and "prefill" in turn.server_timing["phases_ms"]
        assert (client["transport"], client["design"], client["warmup"], client["stream_id"]) == (
            "websocket", design, False, False)
        assert client["context"] == ("full" if turn.turn == 0 or design == SUSPENDED else "chained")


async def test_sdk_drives_subagent_lanes_to_completion(live_server):
    _, port = live_server
    workloads = [fixed(3, initial_prompt_tokens=200, appended_tokens=20, output_tokens=20, tool_seconds=0.05)] * 3
    records = await in_thread(run_sdk_lanes, f"http://127.0.0.1:{port}/v1", workloads, model="sim-100000", timeout=CLIENT_TIMEOUT,
                              metadata_for=lambda i: {"testbed_workload": "fixed:3:200:20:20:0.05"})
    assert ([r.status for r in records], [len(r.turns) for r in records]) == (["completed"] * 3, [3, 3, 3])
    assert all(len(set(r.response_ids)) == 3 for r in records)


async def test_sdk_steer_accepted_steered_and_successor(live_server):
    _, port = live_server
    slow_text = {"testbed_workload": "fixed:3:100:10:200:0"}  # 200 tokens at sim-200: ~1 s to steer into
    result = await in_thread(run_sdk_steer, f"http://127.0.0.1:{port}/v1", metadata=slow_text, text="only the tests",
                             model="sim-200", stream_id="main", timeout=CLIENT_TIMEOUT)
    kinds = [e["type"] for e in result["events"]]
    successor_at = len(kinds) - 1 - kinds[::-1].index("response.created")
    at = [kinds.index("response.steer.accepted"), kinds.index("response.incomplete"), successor_at]
    accepted, ended, successor = (result["events"][i] for i in at)
    assert result["steer_to_token_s"] is not None and at == sorted(at)
    assert accepted["stream_id"] == ended["stream_id"] == successor["stream_id"] == "main"
    assert ended["response"]["incomplete_details"] == {"reason": "steered"}
    assert successor["response"]["previous_response_id"] == ended["response"]["id"] == accepted["steer"]["previous_response_id"]
