"""The clients' helpers held to exact values: the v1 helpers over openai-python's connection (with a stand-in
connection that records what it is sent), the strict SSE parser's bookkeeping, the connectors and the lanes.
Written against the survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import json
import random
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio_websocket
from support import Close, Pause, ScriptedServer, make_server

from prototype.api.service import owner_of
from prototype.client import v1
from prototype.client.connect import InMemoryConnector, RoundRobinConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED, Rollout, RolloutRecord, TurnRecord, request_body, task_prompt
from prototype.client.lanes import LANE_BUFFER, LaneChannel, Multiplexed, run_multiplexed_rollouts
from prototype.client.reconnect import OPENAI_PYTHON, ReconnectPolicy
from prototype.client.reconnecting import ReconnectingRollout, _close_code, run_reconnecting_rollout
from prototype.client.sse import END_TYPES, SseEvent, SseProtocolError, StrictSseParser, parse_stream
from prototype.netem import NetworkProfile
from prototype.protocol import events as ev
from prototype.server.http import sse_block
from prototype.workload import fixed

# ---------------------------------------------------------------- v1 helpers (sans-IO stand-ins)


class FakeConnection:
    """What the v1 helpers use of openai-python's connection: `recv_bytes`, `send_raw`, `close`."""

    def __init__(self, frames: list[dict[str, Any]] | None = None) -> None:
        self.frames = [json.dumps(frame).encode() for frame in frames or []]
        self.sent: list[str] = []
        self.closed = 0

    def recv_bytes(self) -> bytes:
        return self.frames.pop(0)

    def send_raw(self, text: str) -> None:
        self.sent.append(text)

    def close(self) -> None:
        self.closed += 1


class FakeManager:
    def __init__(self, conn: FakeConnection | None, error: BaseException | None) -> None:
        self.conn, self.error = conn, error

    def __enter__(self) -> FakeConnection:
        if self.error is not None:
            raise self.error
        assert self.conn is not None
        return self.conn


class FakeResponses:
    def __init__(self, conn: FakeConnection | None = None, error: BaseException | None = None) -> None:
        self.conn, self.error = conn, error
        self.calls: list[dict[str, Any]] = []

    def connect(self, **options: Any) -> FakeManager:
        self.calls.append(options)
        return FakeManager(self.conn, self.error)


class FakeClient:
    def __init__(self, conn: FakeConnection | None = None, error: BaseException | None = None) -> None:
        self.responses = FakeResponses(conn, error)


class FakeHttpResponse:
    def __init__(self, status_code: int, body: object) -> None:
        self.status_code, self.body = status_code, body


class InvalidStatus(Exception):
    """Shaped as the `websockets` library's: the refused handshake's response on `.response`."""

    def __init__(self, response: FakeHttpResponse) -> None:
        super().__init__("server rejected WebSocket connection")
        self.response = response


def test_v1_connect_adds_the_beta_header_over_the_callers_and_keeps_the_other_options() -> None:
    conn = FakeConnection()
    client = FakeClient(conn)
    headers = {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-06"}
    with v1.connect(client, extra_headers=headers, websocket_connection_options={"max_size": None}) as opened:
        assert opened is conn and conn.closed == 0
    assert conn.closed == 1
    assert client.responses.calls == [{
        "extra_headers": {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-04"},
        "websocket_connection_options": {"max_size": None},
    }]
    assert headers == {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-06"}  # the caller's dict is left as it was
    with v1.connect(FakeClient(FakeConnection())) as _:
        pass
    assert v1.BETA_HEADER == {"OpenAI-Beta": "responses_websockets=2026-02-04"}


def test_v1_connect_closes_the_connection_when_the_body_raises() -> None:
    conn = FakeConnection()
    with pytest.raises(KeyError), v1.connect(FakeClient(conn)):
        raise KeyError("boom")
    assert conn.closed == 1


def test_a_refused_v1_handshake_keeps_the_status_and_the_body_found_through_the_cause() -> None:
    refusal = InvalidStatus(FakeHttpResponse(400, b'{"error":{"code":"unsupported_beta"}}'))
    wrapped = RuntimeError("openai wrapped it")
    wrapped.__cause__ = refusal
    with pytest.raises(v1.HandshakeRefused) as refused, v1.connect(FakeClient(error=wrapped)):
        pass
    assert (refused.value.status, refused.value.body) == (400, '{"error":{"code":"unsupported_beta"}}')
    assert str(refused.value) == 'WebSocket handshake refused with HTTP 400: {"error":{"code":"unsupported_beta"}}'
    assert refused.value.__cause__ is wrapped


def test_a_refused_v1_handshake_is_found_through_the_context_and_decodes_bad_bytes_with_replacement() -> None:
    try:
        try:
            raise InvalidStatus(FakeHttpResponse(403, b"no \xff"))
        except InvalidStatus:
            raise OSError("handshake failed") from None
    except OSError as exc:
        error = exc
    error.__suppress_context__ = False
    refused = v1._refusal(error)
    assert refused is not None and (refused.status, refused.body) == (403, "no \ufffd")


@pytest.mark.parametrize(("body", "text"), [(None, ""), (b"", ""), ("already text", "already text")])
def test_a_refusal_body_that_is_missing_or_text(body: object, text: str) -> None:
    refused = v1._refusal(InvalidStatus(FakeHttpResponse(401, body)))
    assert refused is not None and (refused.status, refused.body) == (401, text)


def test_a_refusal_whose_response_has_no_body_keeps_an_empty_one() -> None:
    class StatusOnly:
        status_code = 502

    refused = v1._refusal(InvalidStatus(StatusOnly()))  # type: ignore[arg-type]
    assert refused is not None and (refused.status, refused.body) == (502, "")


def test_a_failure_that_is_not_a_refusal_is_raised_as_it_is() -> None:
    error = ConnectionResetError("reset")
    assert v1._refusal(error) is None
    with pytest.raises(ConnectionResetError) as raised, v1.connect(FakeClient(error=error)):
        pass
    assert raised.value is error


@pytest.mark.parametrize("end", ["response.done", "response.completed", "response.failed", "response.incomplete",
                                 "response.cancelled", "error"])
def test_until_pause_stops_at_each_pause_end_or_error_and_keeps_every_event(end: str) -> None:
    frames = [{"type": "response.created"}, {"type": "response.output_text.delta"}, {"type": end, "n": 1}, {"type": "later"}]
    conn = FakeConnection(frames)
    events: list[dict[str, Any]] = []
    assert v1.until_pause(conn, events) == {"type": end, "n": 1}
    assert events == frames[:3]
    assert [json.loads(frame) for frame in conn.frames] == [{"type": "later"}]
    assert v1.until_pause(FakeConnection(frames)) == {"type": end, "n": 1}  # without a list


def test_until_pause_gives_up_after_its_most_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v1, "MAX_EVENTS", 3)
    conn = FakeConnection([{"type": "response.output_text.delta"}] * 3 + [{"type": "response.completed"}])
    with pytest.raises(RuntimeError, match=r"^more than 3 events without a pause or an end$"):
        v1.until_pause(conn)
    assert v1.until_pause(FakeConnection([{"type": "x"}] * 2 + [{"type": "response.done"}])) == {"type": "response.done"}


def test_v1_function_calls_tool_outputs_append_and_output_text() -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "run_tests", "arguments": "{}"}
    event = {"type": "response.done", "response": {"output": [
        {"type": "reasoning"}, call,
        {"type": "message", "content": [{"type": "output_text", "text": "Hel"}, {"type": "refusal"}, {"type": "output_text", "text": "lo"}]},
        {"type": "message"}, {"type": "function_call", "call_id": "call_2"},
    ]}}
    assert v1.function_calls(event) == [call, {"type": "function_call", "call_id": "call_2"}]
    assert v1.function_calls({"type": "error"}) == [] and v1.function_calls({"response": {}}) == []
    assert v1.output_text(event) == "Hello"
    assert v1.output_text({"type": "error"}) == "" and v1.output_text({"response": {}}) == ""
    assert v1.tool_output(call, "1 passed") == {"type": "function_call_output", "call_id": "call_1", "output": "1 passed"}
    conn = FakeConnection()
    v1.append(conn, [v1.tool_output(call, "ok")])
    assert [json.loads(text) for text in conn.sent] == [
        {"type": "response.append", "input": [{"type": "function_call_output", "call_id": "call_1", "output": "ok"}]}]


# ---------------------------------------------------------------- connectors


class FakeWorker:
    """A worker as RoundRobinConnector sees one: `refusing` and `open_stream`, which here names the worker."""

    def __init__(self, name: str, refusing: bool = False) -> None:
        self.name, self.refusing = name, refusing

    def open_stream(self) -> str:
        return self.name


def test_new_connections_go_to_the_workers_in_turn_skipping_those_that_are_down() -> None:
    workers = [FakeWorker("w0"), FakeWorker("w1"), FakeWorker("w2")]
    pool = RoundRobinConnector(workers)  # type: ignore[arg-type]
    assert [pool.open_stream() for _ in range(4)] == ["w0", "w1", "w2", "w0"]
    workers[2].refusing = True
    assert [pool.open_stream() for _ in range(4)] == ["w1", "w0", "w1", "w0"]
    workers[0].refusing = workers[1].refusing = True
    # All down: the first worker is asked, and its refusal is the answer.
    assert pool.open_stream() == "w0"


# ---------------------------------------------------------------- the strict SSE parser

COMPLETED_BLOCK = sse_block(ev.ResponseCompleted(0, {"id": "resp_1", "object": "response", "status": "completed", "output": []}))
LONG_NAME = "x" * 100


def created(sequence: int) -> bytes:
    return sse_block(ev.ResponseCreated(sequence, {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b": " + LONG_NAME.encode() + b"\n", "SSE line 1: not an event:, data: or blank line: b': " + "x" * 78 + "'"),
        (COMPLETED_BLOCK + b"data: " + LONG_NAME.encode() + b"\n", "SSE line 4: data after the end event: b'data: " + "x" * 74 + "'"),
        (COMPLETED_BLOCK[:-2] + LONG_NAME.encode(),
         "SSE line 2: the body ends inside a line: " + repr(COMPLETED_BLOCK.split(b"\n")[1][:80])),
        (b"event: response.completed\n", "SSE line 1: the body ends without the blank line that terminates the last event"),
        (created(0), "SSE line 3: the body ends before an end event (response.completed, .failed, .incomplete, error)"),
        (b"event: response.created\ndata: {}\n\n", "SSE line 2: event: 'response.created' differs from data.type None"),
        (b'event: response.created\ndata: {"type":"response.completed"}\n\n',
         "SSE line 2: event: 'response.created' differs from data.type 'response.completed'"),
        (b"event:  response.completed\n", "SSE line 1: bad event name ' response.completed'"),
        (b"event: response.completed \n", "SSE line 1: bad event name 'response.completed '"),
        (b'event: response.completed\ndata:  [DONE] \n\n', "SSE line 2: a [DONE] sentinel; the stream must end after its end event"),
        (b"event: x\ndata: " + json.dumps({"type": "x", "sequence_number": 1}).encode() + b"\n\n",
         "SSE line 3: sequence_number 1, expected 0"),
        (b"event: x\ndata: " + json.dumps({"type": "x"}).encode() + b"\n\n", "SSE line 3: sequence_number None, expected 0"),
        (created(0) + created(2), "SSE line 6: sequence_number 2, expected 1"),
        (COMPLETED_BLOCK.replace(b"\n", b"\r\n"), "SSE line 1: a carriage return; lines must end with \\n only"),
        (b"event: x\nevent: x\n", "SSE line 2: an event: line inside a block (missing blank line?)"),
        (b"data: {}\n", "SSE line 1: a data: line before the block's event: line"),
        (COMPLETED_BLOCK.replace(b"\n\n", b"\ndata: {}\n\n"), "SSE line 3: a second data: line in one block"),
        (b"event: x\ndata: {not json}\n\n",
         "SSE line 2: data is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"event: x\ndata: [1, 2]\n\n", "SSE line 2: data is not a JSON object"),
        (b"\n", "SSE line 1: a blank line outside a block"),
        (b"event: x\n\n", "SSE line 2: event 'x' has no data: line"),
        (b"event: x\ndata: \xff\n\n", "SSE line 2: invalid UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
        (b"event: \xfe\n", "SSE line 1: invalid UTF-8: 'utf-8' codec can't decode byte 0xfe in position 0: invalid start byte"),
        (b"event: response.completed\ndata: {\"type\": \"response.completed\", \"sequence_number\": 0}\n\n\n",
         "SSE line 4: data after the end event: b''"),
    ],
)
def test_each_refusal_names_its_line_and_what_it_saw(body: bytes, message: str) -> None:
    with pytest.raises(SseProtocolError) as refused:
        parse_stream(body)
    assert str(refused.value) == message


def test_the_parser_counts_sequence_numbers_sizes_and_the_end_across_feeds() -> None:
    parser = StrictSseParser()
    first, second = created(0), created(1)
    assert parser.feed(first[:5]) == [] and parser.feed(first[5:] + second[:-1]) == [
        SseEvent("response.created", json.loads(first.split(b"\n")[1][len(b"data: "):]), len(first))]
    assert (parser.next_sequence, parser.ended) == (1, False)
    with pytest.raises(SseProtocolError, match="^SSE line 5: the body ends without the blank line"):
        parser.close()
    [event] = parser.feed(b"\n")
    assert (event.type, event.size, parser.next_sequence, parser.ended) == ("response.created", len(second), 2, False)
    parser.close(require_end=False)
    with pytest.raises(SseProtocolError, match=r"^SSE line 6: the body ends before an end event"):
        parser.close()
    end = sse_block(ev.ResponseCompleted(2, {"id": "resp_1", "object": "response", "status": "completed", "output": []}))
    [event] = parser.feed(end)
    assert (event.type, event.size, parser.next_sequence, parser.ended) == ("response.completed", len(end), 3, True)
    parser.close()


@pytest.mark.parametrize("end_type", sorted(END_TYPES))
def test_every_end_type_ends_the_stream(end_type: str) -> None:
    block = b"event: " + end_type.encode() + b"\ndata: " + json.dumps({"type": end_type, "sequence_number": 0}).encode() + b"\n\n"
    [event] = parse_stream(block)
    assert event.type == end_type
    assert END_TYPES == {"response.completed", "response.failed", "response.incomplete", "response.cancelled", "error"}


# ---------------------------------------------------------------- lanes over a stand-in WebSocket


class FakeWebSocket:
    """What `Multiplexed` uses of a trio-websocket connection: messages to read (then a close), and what it is sent."""

    def __init__(self, messages: list[str | bytes]) -> None:
        self.messages = list(messages)
        self.sent: list[str] = []

    async def send_message(self, text: str) -> None:
        self.sent.append(text)

    async def get_message(self) -> str | bytes:
        await trio.lowlevel.checkpoint()
        if not self.messages:
            raise trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1000, None))
        return self.messages.pop(0)


def lane_rollout() -> Rollout:
    return Rollout(fixed(1, initial_prompt_tokens=10, appended_tokens=1, output_tokens=1), RolloutRecord(CHAINED, "w", 0.0))


async def test_a_lane_stamps_only_its_creates_and_counts_the_compact_bytes_it_sent(autojump_clock) -> None:
    socket = FakeWebSocket([])
    mux = Multiplexed(socket)  # type: ignore[arg-type]
    default, rollout = mux.lane(None), lane_rollout()
    agent = mux.lane("agent-1", rollout)
    await trio.sleep(1.5)
    assert await agent.send({"type": "response.create", "input": "é"}) == len('{"type":"response.create","input":"\\u00e9","stream_id":"agent-1"}')
    assert await agent.send({"type": "response.cancel", "response_id": "r"}) == len('{"type":"response.cancel","response_id":"r"}')
    assert await default.send({"type": "response.create"}) == len('{"type":"response.create"}')
    assert socket.sent == ['{"type":"response.create","input":"\\u00e9","stream_id":"agent-1"}',
                           '{"type":"response.cancel","response_id":"r"}', '{"type":"response.create"}']
    assert rollout.record.timeline == [(1.5, "send", "response.create"), (1.5, "send", "response.cancel")]
    with pytest.raises(ValueError, match=r"^lane 'agent-1' is already registered$"):
        mux.lane("agent-1")
    with pytest.raises(ValueError, match=r"^lane None is already registered$"):
        mux.lane(None)
    assert LANE_BUFFER == 100_000 and agent.events.statistics().max_buffer_size == LANE_BUFFER


async def read_all_lanes(mux: Multiplexed, agent: LaneChannel, default: LaneChannel, events: list[dict[str, Any]]) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mux.read)
        assert await agent.until("response.output_text.delta") == events[:2]
        assert await agent.until_pause() == events[4]
        assert await default.until("never") == [events[2]]  # an error ends a wait
        assert await default.until("response.created") == [events[3]]  # an unknown lane's events go to the default lane


async def test_the_reader_routes_by_stream_id_counts_bytes_and_closes_every_lane_at_the_end(autojump_clock) -> None:
    events = [
        {"type": "response.created", "stream_id": "agent-1", "response": {"id": "resp_a", "instructions": "é"}, "sequence_number": 0},
        {"type": "response.output_text.delta", "stream_id": "agent-1", "sequence_number": 1, "delta": "é"},
        {"type": "error", "error": {"code": "x"}},
        {"type": "response.created", "stream_id": "agent-9", "response": {"id": "resp_z"}},
        {"type": "response.completed", "stream_id": "agent-1", "response": {"id": "resp_a", "status": "completed"}},
    ]
    texts = [json.dumps(event, ensure_ascii=False) for event in events]
    socket = FakeWebSocket([texts[0], texts[1].encode(), *texts[2:]])
    mux = Multiplexed(socket)  # type: ignore[arg-type]
    default, rollout = mux.lane(None), lane_rollout()
    rollout.start_turn([], 0)
    agent = mux.lane("agent-1", rollout)
    # On the virtual clock, a lane that waits for ever fails at once rather than hanging the test.
    with trio.fail_after(60):
        await read_all_lanes(mux, agent, default, events)
    sizes = [len(text.encode()) for text in texts]
    assert rollout.record.turns[0].bytes_received == sizes[0] + sizes[1] + sizes[4]
    assert rollout.record.timeline[-1] == (0.0, "recv", "response.completed")
    for lane in (agent, default):
        with pytest.raises(trio.EndOfChannel):
            await lane.receive()


async def test_a_lanes_wait_ends_at_a_pause_or_at_an_error() -> None:
    for end in ["response.done", "response.failed", "error"]:
        send_channel, receive_channel = trio.open_memory_channel[tuple[dict[str, Any], int]](10)
        lane = LaneChannel(None, "a", receive_channel)  # type: ignore[arg-type]
        for event in [{"type": "response.in_progress"}, {"type": end}, {"type": "after"}]:
            await send_channel.send((event, 1))
        await send_channel.aclose()  # a wait that read past its end fails at once
        assert await lane.until_pause() == {"type": end}
        assert await lane.receive() == {"type": "after"}


async def test_multiplexed_rollouts_run_each_task_on_its_lane_with_the_defaults_a_caller_gets(autojump_clock) -> None:
    server = make_server()
    workloads = [fixed(2, initial_prompt_tokens=50, appended_tokens=5, output_tokens=5, name=f"task-{i}") for i in range(2)]
    asked: list[object] = []
    ended: list[TurnRecord] = []

    def metadata_for(index: int) -> dict[str, str]:
        asked.append(index)
        return {"testbed_workload": "fixed:2:50:5:5:0", "lane": f"agent-{index}"}

    records = await run_multiplexed_rollouts(InMemoryConnector(server), workloads, metadata_for=metadata_for, on_turn_end=ended.append)
    assert sorted(asked) == [0, 1]  # type: ignore[type-var]
    assert [(r.design, r.workload, r.status, len(r.turns)) for r in records] == [("chained", "task-0", "completed", 2),
                                                                                  ("chained", "task-1", "completed", 2)]
    assert sorted(id(turn) for turn in ended) == sorted(id(turn) for r in records for turn in r.turns)
    assert all(turn.server_timing is None for r in records for turn in r.turns)  # no timings unless asked
    assert all(server.api.store.get(response_id) is None for r in records for response_id in r.response_ids)  # store: false

    stored_records = await run_multiplexed_rollouts(InMemoryConnector(server), workloads[:1], metadata_for=metadata_for,
                                                    store=True, include_timing=True)
    [record] = stored_records
    assert all(turn.server_timing is not None for turn in record.turns)
    stored = server.api.store.get(record.response_ids[-1])
    assert stored is not None and stored.owner == owner_of("testbed")
    assert (stored.response["model"], stored.response["metadata"]) == ("gpt-5.4", {"testbed_workload": "fixed:2:50:5:5:0", "lane": "agent-0"})


# ---------------------------------------------------------------- the reconnecting client's close codes


class ClosedSocket:
    """A connection as `_close_code` reads one: the reason it closed with, if it did."""

    def __init__(self, code: int | None) -> None:
        self.closed = None if code is None else trio_websocket.CloseReason(code, None)


class LinkErrorWithReason(OSError):
    """An error that carries a `reason` of its own (as `ssl.SSLError` does), not a close reason."""

    reason = "WRONG_VERSION_NUMBER"


def test_the_close_code_is_the_closes_own_else_the_connections() -> None:
    closed = trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1011, "engine"))
    assert _close_code(closed, None) == 1011
    assert _close_code(closed, ClosedSocket(1000)) == 1011  # type: ignore[arg-type]
    assert _close_code(trio_websocket.ConnectionClosed(None), ClosedSocket(1006)) == 1006  # type: ignore[arg-type]
    assert _close_code(LinkErrorWithReason("tls"), ClosedSocket(1006)) == 1006  # type: ignore[arg-type]
    assert _close_code(trio.BrokenResourceError(), ClosedSocket(None)) is None  # type: ignore[arg-type]
    assert _close_code(OSError("refused"), None) is None


# ---------------------------------------------------------------- the reconnecting client against a scripted server


CALL = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}
LOST_ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "cut"}]}
LIMIT = "websocket_connection_limit_reached"
# Two turns: the call, whose tool runs 2 s, then the answer.
TWO_TURNS = fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0, name="scripted")
STEADY = ReconnectPolicy("steady", initial_delay=0.5, max_retries=2)  # openai-python's rules, its own numbers
# Codex's rules (the connection limit is a retryable stream error; one count per request) with the same numbers.
STEADY_CODEX = attrs.evolve(STEADY, name="steady-codex", reconnect_errors=frozenset({LIMIT}), reset_on_any_event=False)


def created_event(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}}


def paused_or_ended(kind: str, response_id: str, *output: dict[str, Any], status: str = "completed") -> list[dict[str, Any]]:
    items = [{"type": "response.output_item.done", "item": item} for item in output]
    return [*items, {"type": kind, "response": {"id": response_id, "status": status, "output": list(output)}}]


def failed(response_id: str, code: str) -> dict[str, Any]:
    return {"type": "response.failed",
            "response": {"id": response_id, "status": "failed", "output": [], "error": {"code": code, "message": code}}}


def error(code: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code, "message": code}}


def first_turn(design: str) -> list[dict[str, Any] | Close]:
    kind = "response.done" if design == SUSPENDED else "response.completed"
    return [created_event("resp_0"), *paused_or_ended(kind, "resp_0", CALL, status="in_progress" if design == SUSPENDED else "completed")]


async def reconnecting(server: ScriptedServer, design: str, policy: ReconnectPolicy = STEADY) -> RolloutRecord:
    with trio.fail_after(60):
        return await run_reconnecting_rollout(InMemoryConnector(server), design, TWO_TURNS, policy, metadata={})


def frame_kinds(server: ScriptedServer) -> list[tuple[int, str, str | None]]:
    return [(connection, event["type"], event.get("previous_response_id")) for connection, event in server.received]


async def test_a_request_answered_by_the_connection_limit_goes_again_after_a_backoff_on_a_new_connection_under_codex(
        autojump_clock) -> None:
    server = ScriptedServer([
        first_turn(CHAINED),
        [error(LIMIT), Close(1000)],
        [created_event("resp_1"), *paused_or_ended("response.completed", "resp_1", ANSWER)],
    ])
    record = await reconnecting(server, CHAINED, STEADY_CODEX)
    assert record.status == "completed"
    # The refused create goes again on a new connection after the first backoff, still continuing the chain.
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", "resp_0"), (1, "response.create", "resp_0")]
    assert server.received[1][1] == server.received[2][1]
    assert (record.reconnects, record.full_resends, record.retried_responses, record.recovery_seconds) == (1, 0, 0, [0.5])
    assert trio.current_time() == record.ended_at == 2.5  # the tool's 2 s, then the 0.5 s backoff
    size = len(json.dumps(server.received[1][1], separators=(",", ":")))
    assert (record.turns[1].bytes_sent, record.resent_bytes) == (2 * size, size)
    assert record.transcript[-1] == ANSWER and len(record.turns) == 2


def v1_cut_by_the_limit() -> list[list[Any]]:
    return [
        first_turn(SUSPENDED),
        # The limit came while the resumed segment streamed: it fails at its next pause, then the error and the close.
        [{"type": "response.in_progress", "response": {"id": "resp_0", "status": "in_progress", "output": []}},
         {"type": "response.output_item.done", "item": LOST_ITEM}, failed("resp_0", LIMIT), error(LIMIT), Close(1000)],
        [created_event("resp_1"), *paused_or_ended("response.completed", "resp_1", ANSWER)],
    ]


async def test_a_v1_response_failed_by_the_connection_limit_starts_over_with_the_whole_conversation_under_codex(autojump_clock) -> None:
    server = ScriptedServer(v1_cut_by_the_limit())
    record = await reconnecting(server, SUSPENDED, STEADY_CODEX)
    assert record.status == "completed"
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.append", None), (1, "response.create", None)]
    outputs = server.received[1][1]["input"]
    assert [item["type"] for item in outputs] == ["function_call_output"]
    first_input = server.received[0][1]["input"]
    assert server.received[2][1]["input"] == [*first_input, CALL, *outputs]  # the whole conversation, the outputs it owed
    assert (record.reconnects, record.full_resends, record.retried_responses, record.recovery_seconds) == (1, 1, 0, [0.5])
    assert trio.current_time() == record.ended_at == 2.5
    assert LOST_ITEM not in record.transcript and record.transcript[-1] == ANSWER
    assert record.outcomes == {"resp_0": "failed", "resp_1": "completed"}


async def test_a_request_refused_on_a_later_turn_ends_the_task_with_its_code(autojump_clock) -> None:
    server = ScriptedServer([first_turn(CHAINED), [error("invalid_value")]])
    record = await reconnecting(server, CHAINED)
    assert record.status == "error:invalid_value"
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", "resp_0")]  # asked once
    assert (record.reconnects, record.full_resends, record.turns[1].ended_at) == (0, 0, 2.0)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_failed_responses_are_retried_from_the_last_turn_until_the_policy_gives_up(autojump_clock, design: str) -> None:
    kind = "response.done" if design == SUSPENDED else "response.completed"
    server = ScriptedServer([
        [created_event("resp_0"), failed("resp_0", "server_error")],
        [created_event("resp_1"), *paused_or_ended(kind, "resp_1", CALL, status="in_progress" if design == SUSPENDED else "completed")],
        # Turn 1 fails three times: the policy retries it twice (0.5 s, then 1 s), then the task fails.
        [created_event("resp_2"), failed("resp_2", "server_error")],
        [created_event("resp_3"), failed("resp_3", "server_error")],
        [created_event("resp_4"), failed("resp_4", "server_error")],
    ])
    record = await reconnecting(server, design)
    assert record.status == "failed"
    follow = "response.append" if design == SUSPENDED else "response.create"
    previous = None if design == SUSPENDED else "resp_1"
    # Each retry asks again for what the failed response was asked: a turn that failed is sent as it was, from its
    # last completed turn; the turn after a success starts with its attempts counted from one again.
    assert frame_kinds(server) == [(0, "response.create", None), (0, "response.create", None), (0, follow, previous),
                                   (0, "response.create" if design == SUSPENDED else follow, previous),
                                   (0, "response.create" if design == SUSPENDED else follow, previous)]
    assert (record.retried_responses, record.reconnects) == (3, 0)
    assert record.recovery_seconds == [0.5, 0.5, 1.0]
    assert trio.current_time() == record.ended_at == 0.5 + 2.0 + 0.5 + 1.0
    assert len(record.turns) == 2
    assert record.resent_bytes == record.turns[0].bytes_sent // 2 + record.turns[1].bytes_sent - len(
        json.dumps(server.received[2][1], separators=(",", ":")))


async def test_a_policy_that_does_not_retry_failed_responses_fails_the_task_at_once(autojump_clock) -> None:
    server = ScriptedServer([[created_event("resp_0"), failed("resp_0", "server_error")]])
    record = await reconnecting(server, CHAINED, attrs.evolve(STEADY, retry_failed_responses=False))
    assert (record.status, record.retried_responses, record.recovery_seconds, trio.current_time()) == ("failed", 0, [], 0.0)
    assert len(server.received) == 1


@pytest.mark.parametrize(("code", "status", "reconnects"), [(1008, "error:closed_1008", 0), (1011, "completed", 1)])
async def test_a_close_in_the_middle_of_a_response_is_retried_only_for_the_codes_the_policy_lists(
        autojump_clock, code: int, status: str, reconnects: int) -> None:
    server = ScriptedServer([
        [created_event("resp_0"), Close(code)],
        [created_event("resp_1"), *paused_or_ended("response.completed", "resp_1", ANSWER)],
    ])
    # openai-python's codes (1011 among them, 1008 not) with its backoff but no jitter.
    record = await reconnecting(server, CHAINED, attrs.evolve(OPENAI_PYTHON, jitter=(1.0, 1.0)))
    assert (record.status, record.reconnects) == (status, reconnects)
    assert trio.current_time() == 0.5 * reconnects


async def test_a_turn_whose_connection_closed_under_its_tools_starts_when_they_returned(autojump_clock) -> None:
    server = ScriptedServer([
        [*first_turn(CHAINED), Close(1011)],  # the server goes away while the tool runs
        # The retried request, its answer 1 s after its first event; one event comes as a binary frame.
        [created_event("resp_1"), Pause(1.0), json.dumps({"type": "response.output_item.done", "item": ANSWER}).encode(),
         {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [ANSWER], "note": "é"}}],
    ])
    record = await reconnecting(server, CHAINED)
    assert (record.status, record.reconnects) == ("completed", 1)
    # The create found the connection closed (1011: retried), waited 0.5 s and went on a new connection, where the chain
    # was asked for as the client last knew it.
    assert frame_kinds(server) == [(0, "response.create", None), (1, "response.create", "resp_0")]
    assert (record.turns[1].sent_at, record.turns[1].ended_at, record.ended_at) == (2.0, 3.5, 3.5)
    assert record.recovery_seconds == [0.5]  # from the failure to the retried response's first event
    received = [json.dumps(created_event("resp_1")), json.dumps({"type": "response.output_item.done", "item": ANSWER}),
                json.dumps({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [ANSWER],
                                                                      "note": "é"}}, ensure_ascii=False)]
    assert record.turns[1].bytes_received == sum(len(text.encode()) for text in received)


def answer_only() -> list[list[Any]]:
    return [[created_event("resp_0"), *paused_or_ended("response.completed", "resp_0", ANSWER)]]


async def test_the_reconnecting_client_sends_the_harness_request_with_the_defaults_a_caller_gets(autojump_clock) -> None:
    server = ScriptedServer(answer_only())
    await trio.sleep(1.0)
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(InMemoryConnector(server), CHAINED, TWO_TURNS, STEADY, metadata={"k": "v"})
    assert (record.design, record.workload, record.status, record.started_at, record.ended_at) == (CHAINED, "scripted", "completed", 1.0, 1.0)
    assert server.headers[0]["authorization"] == "Bearer testbed" and "x-responsesapi-include-timing-metrics" not in server.headers[0]
    prompt = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(TWO_TURNS)}]}]
    # Without a store, chained asks for the reasoning blob it would need to resend the conversation.
    assert server.received[0][1] == {"type": "response.create", **request_body(TWO_TURNS, model="gpt-5.4", metadata={"k": "v"},
                                                                               store=False, include_reasoning=True), "input": prompt}


@pytest.mark.parametrize(("design", "store"), [(SUSPENDED, False), (SUSPENDED, True), (CHAINED, True)])
async def test_the_reconnecting_client_passes_the_callers_options(autojump_clock, design: str, store: bool) -> None:
    server = ScriptedServer(answer_only())
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(InMemoryConnector(server), design, TWO_TURNS, STEADY, metadata={}, model="m", store=store,
                                                include_timing=True, api_key="key-1", instructions="mine")
    assert (record.design, record.status) == (design, "completed")
    assert (server.headers[0]["authorization"], server.headers[0]["x-responsesapi-include-timing-metrics"]) == ("Bearer key-1", "true")
    assert server.headers[0]["openai-beta"] == BETA[design]
    first = server.received[0][1]
    assert first == {"type": "response.create", **request_body(TWO_TURNS, model="m", metadata={}, store=store, instructions="mine"),
                     "input": first["input"]}  # no reasoning blob: v1 never needs it, and a stored chain is hydrated


def test_the_reconnecting_client_takes_only_the_websocket_designs() -> None:
    with pytest.raises(ValueError, match=r"^design must be 'suspended' or 'chained', not 'http'$"):
        ReconnectingRollout(InMemoryConnector(None), "http", TWO_TURNS, STEADY, metadata={})


@pytest.mark.parametrize("seed", [0, 7])
async def test_the_backoffs_jitter_is_drawn_from_the_seed_and_the_task(autojump_clock, seed: int) -> None:
    policy = ReconnectPolicy("jittered", initial_delay=1.0, max_retries=2, jitter=(0.5, 1.5))
    server = ScriptedServer([[created_event("resp_0"), Close(1011)], *answer_only()])
    with trio.fail_after(60):
        options = {} if seed == 0 else {"seed": seed}
        record = await run_reconnecting_rollout(InMemoryConnector(server), CHAINED, TWO_TURNS, policy, metadata={}, **options)
    assert (record.status, record.reconnects) == ("completed", 1)
    assert trio.current_time() == policy.delay(1, random.Random(f"reconnect:{seed}:scripted"))


async def accept_after(connector: InMemoryConnector, seconds: float) -> None:
    await trio.sleep(seconds)
    connector.refusing = False


async def test_a_refused_connection_is_retried_with_the_policys_backoff(autojump_clock) -> None:
    server = ScriptedServer(answer_only())
    connector = InMemoryConnector(server, refusing=True)  # nothing listens until 0.7 s
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_after, connector, 0.7)
        with trio.fail_after(60):
            record = await run_reconnecting_rollout(connector, CHAINED, TWO_TURNS, STEADY, metadata={})
    # Refused at 0 and at 0.5 s; the third attempt, after 1 s more, connects.
    assert (record.status, record.reconnects, record.recovery_seconds, record.ended_at) == ("completed", 2, [1.5], 1.5)
    assert (record.turns[0].sent_at, server.connections) == (0.0, 1)


async def test_a_client_that_gives_up_ends_the_task_when_it_does(autojump_clock) -> None:
    connector = InMemoryConnector(ScriptedServer([]), refusing=True)
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(connector, CHAINED, TWO_TURNS, STEADY, metadata={})
    assert (record.status, record.reconnects, record.ended_at, record.turns) == ("error:gave_up", 2, 1.5, [])


async def test_a_reconnecting_task_ends_at_its_final_event_not_after_its_close(autojump_clock) -> None:
    server = ScriptedServer(answer_only())
    with trio.fail_after(60):
        record = await run_reconnecting_rollout(InMemoryConnector(server, NetworkProfile(rtt=0.1)), CHAINED, TWO_TURNS, STEADY, metadata={})
    # Three round trips of handshakes, then the create and its answer; the close handshake after it is not the task's.
    assert (record.status, record.turns[0].sent_at) == ("completed", 0.0)
    assert record.ended_at == pytest.approx(0.4) and trio.current_time() > record.ended_at
