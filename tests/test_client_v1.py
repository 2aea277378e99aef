"""prototype/client/v1.py over openai-python against `python -m prototype serve`: one response
across every tool call (response.done, then response.append), and a refused handshake that keeps
the server's reason."""

from __future__ import annotations

import pytest

pytest.importorskip("websockets")
from openai import OpenAI  # noqa: E402

from prototype.client import v1  # noqa: E402

TOOLS = [{
    "type": "function", "name": "run_tests", "description": "Run the test suite.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False},
}]


def client_for(server, key: str = "any") -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0, timeout=10)


def test_a_v1_rollout_is_one_response_paused_at_each_tool_call(cli_server):
    server = cli_server("--costs", "zero", "--quiet")
    events: list[dict] = []
    with v1.connect(client_for(server)) as conn:
        conn.response.create(model="sim-100000", input="Fix the bug.", tools=TOOLS, metadata={"testbed_workload": "fixed:3:500:50:20:0"})
        pauses = []
        event = v1.until_pause(conn, events)
        while event["type"] == v1.PAUSE:
            pauses.append(event)
            calls = v1.function_calls(event)
            assert [c["name"] for c in calls] == ["run_tests"]
            v1.append(conn, [v1.tool_output(call, "1 passed") for call in calls])
            event = v1.until_pause(conn, events)
    assert event["type"] == "response.completed"
    assert len(pauses) == 2  # three turns: two tool calls, then the answer
    assert {p["response"]["id"] for p in pauses} == {event["response"]["id"]}  # one response throughout
    assert [e["type"] for e in events].count("response.created") == 1
    assert v1.output_text(event)


def test_a_refused_handshake_is_decoded_into_the_servers_status_code_and_message(cli_server):
    server = cli_server("--costs", "zero", "--quiet", "--api-key", "secret")
    with pytest.raises(v1.HandshakeRefused) as refused:
        with v1.connect(client_for(server, "wrong")):
            pass
    assert refused.value.status == 401
    # The body decoded (websockets hands it over as a bytearray) and the API error it carries.
    assert isinstance(refused.value.body, str) and refused.value.body.startswith('{"error":')
    assert (refused.value.code, refused.value.message) == ("invalid_api_key", "Incorrect API key provided.")
    assert str(refused.value) == "WebSocket handshake refused with HTTP 401: invalid_api_key: Incorrect API key provided."
