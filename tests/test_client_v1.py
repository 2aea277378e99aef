"""The suspended (v1) helpers over openai-python's connection (client/v1.py): against a stand-in connection, then over
openai-python against `python -m prototype serve`."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("websockets")
from openai import OpenAI  # noqa: E402

from prototype.client import v1  # noqa: E402


class FakeConnection:
    """What the v1 helpers use of openai-python's connection: `recv_bytes`, `send_raw`, `close`."""

    def __init__(self, frames: list[dict[str, Any]] | None = None) -> None:
        self.frames, self.sent, self.closed = [json.dumps(frame).encode() for frame in frames or []], [], 0

    def recv_bytes(self) -> bytes:
        return self.frames.pop(0)

    def send_raw(self, text: str) -> None:
        self.sent.append(text)

    def close(self) -> None:
        self.closed += 1


class FakeClient:
    """openai.OpenAI as `v1.connect` calls it: `responses.connect(**options)`, a context manager that opens `conn` or
    raises `error`; every call's options are kept in `calls`."""

    def __init__(self, conn: FakeConnection | None = None, error: BaseException | None = None) -> None:
        self.responses, self.conn, self.error, self.calls = self, conn, error, []

    def connect(self, **options: Any) -> FakeClient:
        self.calls.append(options)
        return self

    def __enter__(self) -> FakeConnection:
        if self.error is not None:
            raise self.error
        return self.conn


class InvalidStatus(Exception):
    """Shaped as the `websockets` library's: the refused handshake's response on `.response`."""

    def __init__(self, status_code: int, body: object = None) -> None:
        super().__init__("server rejected WebSocket connection")
        self.response = SimpleNamespace(status_code=status_code, body=body)


def test_v1_connect_adds_the_beta_header_over_the_callers_keeps_the_other_options_and_closes_the_connection() -> None:
    conn = FakeConnection()
    client = FakeClient(conn)
    headers = {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-06"}
    with v1.connect(client, extra_headers=headers, websocket_connection_options={"max_size": None}) as opened:
        assert opened is conn and conn.closed == 0
    assert conn.closed == 1
    assert client.calls == [{"extra_headers": {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-04"},
                             "websocket_connection_options": {"max_size": None}}]
    assert headers == {"X-Trace": "1", "OpenAI-Beta": "responses_websockets=2026-02-06"}  # the caller's dict is left as it was
    with v1.connect(client := FakeClient(FakeConnection())):
        pass
    assert client.calls == [{"extra_headers": {"OpenAI-Beta": "responses_websockets=2026-02-04"}}]
    with pytest.raises(KeyError), v1.connect(FakeClient(conn := FakeConnection())):
        raise KeyError("boom")
    assert conn.closed == 1  # closed when the body raises too


def test_a_refused_v1_handshake_keeps_the_status_and_the_body_found_through_the_cause_or_the_context() -> None:
    wrapped = RuntimeError("openai wrapped it")
    wrapped.__cause__ = InvalidStatus(400, b'{"error":{"code":"unsupported_beta"}}')
    with pytest.raises(v1.HandshakeRefused) as refused, v1.connect(FakeClient(error=wrapped)):
        pass
    assert (refused.value.status, refused.value.body, refused.value.code, refused.value.message, str(refused.value)) == (
        400, '{"error":{"code":"unsupported_beta"}}', "unsupported_beta", None,
        "WebSocket handshake refused with HTTP 400: unsupported_beta")
    assert refused.value.__cause__ is wrapped
    # A bytearray body with a code and a message: the real server's refusal, below.
    odd = v1._refusal(InvalidStatus(400, '{"error":{"code":7,"message":"m","param":"p"}}'))  # a code that is not a string
    assert (odd.code, odd.message, str(odd)) == (None, "m", "WebSocket handshake refused with HTTP 400: m")
    try:
        try:
            raise InvalidStatus(403, b"no \xff")
        except InvalidStatus:
            raise OSError("handshake failed") from None
    except OSError as exc:
        error = exc
    error.__suppress_context__ = False
    refusal = v1._refusal(error)
    assert refusal is not None and (refusal.status, refusal.body) == (403, "no \ufffd")  # bad bytes decoded with replacement


@pytest.mark.parametrize(("response", "text"), [(InvalidStatus(401).response, ""), (InvalidStatus(401, b"").response, ""),
                                                (InvalidStatus(401, "already text").response, "already text"),
                                                (SimpleNamespace(status_code=401), "")])  # a response with no body at all
def test_a_refusal_body_that_is_missing_or_text(response, text: str) -> None:
    error = InvalidStatus(0)
    error.response = response
    refused = v1._refusal(error)
    assert refused is not None and (refused.status, refused.body) == (401, text)
    other = ConnectionResetError("reset")  # a failure that is not a refusal is raised as it is
    assert v1._refusal(other) is None
    with pytest.raises(ConnectionResetError) as raised, v1.connect(FakeClient(error=other)):
        pass
    assert raised.value is other


@pytest.mark.parametrize("end", ["response.done", "response.completed", "response.failed", "response.incomplete",
                                 "response.cancelled", "error"])
def test_until_pause_stops_at_each_pause_end_or_error_keeps_every_event_and_gives_up_after_its_most(
        end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = [{"type": "response.created"}, {"type": "response.output_text.delta"}, {"type": end, "n": 1}, {"type": "later"}]
    conn, events = FakeConnection(frames), []
    assert (v1.until_pause(conn, events), events) == ({"type": end, "n": 1}, frames[:3])
    assert [json.loads(frame) for frame in conn.frames] == [{"type": "later"}]
    assert v1.until_pause(FakeConnection(frames)) == {"type": end, "n": 1}  # without a list
    # It gives up after its most events.
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
    assert (v1.output_text(event), v1.output_text({"type": "error"}), v1.output_text({"response": {}})) == ("Hello", "", "")
    assert v1.tool_output(call, "1 passed") == {"type": "function_call_output", "call_id": "call_1", "output": "1 passed"}
    conn = FakeConnection()
    v1.append(conn, [v1.tool_output(call, "ok")])
    assert [json.loads(text) for text in conn.sent] == [
        {"type": "response.append", "input": [{"type": "function_call_output", "call_id": "call_1", "output": "ok"}]}]


TOOLS = [{
    "type": "function", "name": "run_tests", "description": "Run the test suite.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False},
}]


def test_a_v1_rollout_is_one_response_paused_at_each_tool_call_and_a_refused_handshake_keeps_the_servers_reason(cli_server):
    server = cli_server("--costs", "zero", "--quiet", "--api-key", "secret")

    def client_for(key: str) -> OpenAI:
        return OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0, timeout=10)

    with pytest.raises(v1.HandshakeRefused) as refused, v1.connect(client_for("wrong")):
        pass
    # The body decoded (websockets hands it over as a bytearray) and the API error it carries.
    assert isinstance(refused.value.body, str) and refused.value.body.startswith('{"error":')
    assert (refused.value.status, refused.value.code, refused.value.message) == (
        401, "invalid_api_key", "Incorrect API key provided.")
    assert str(refused.value) == "WebSocket handshake refused with HTTP 401: invalid_api_key: Incorrect API key provided."
    events: list[dict] = []
    with v1.connect(client_for("secret")) as conn:
        conn.response.create(model="sim-100000", input="Fix the bug.", tools=TOOLS, metadata={"testbed_workload": "fixed:3:500:50:20:0"})
        pauses = []
        event = v1.until_pause(conn, events)
        while event["type"] == v1.PAUSE:
            pauses.append(event)
            calls = v1.function_calls(event)
            assert [c["name"] for c in calls] == ["run_tests"]
            v1.append(conn, [v1.tool_output(call, "1 passed") for call in calls])
            event = v1.until_pause(conn, events)
    assert (event["type"], len(pauses)) == ("response.completed", 2)  # three turns: two tool calls, then the answer
    assert {p["response"]["id"] for p in pauses} == {event["response"]["id"]}  # one response throughout
    assert [e["type"] for e in events].count("response.created") == 1 and v1.output_text(event)
