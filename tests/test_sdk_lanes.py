"""Lanes (`conn.response.create(stream_id=...)`) and steering (`conn.response.steer(...)`) driven by openai-python on a
real socket; every frame the server sends parses into the SDK's own typed model. Real time: events, never durations."""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI
from test_sdk_websocket import CLIENT_TIMEOUT, assert_typed, in_thread

from prototype.client.harness import BETA, CHAINED, HARNESS_TOOLS
from prototype.client.sdk import run_sdk_lanes, run_sdk_steer
from prototype.workload import fixed

SLOW_TEXT = {"testbed_workload": "fixed:3:100:10:200:0"}  # 200 tokens at sim-200: ~1 s to steer into
MAX_EVENTS = 5000


def sdk_events(port: int, script) -> list[dict[str, Any]]:
    """Run `script(conn, read)` on an SDK connection; `read()` returns the next raw frame, its typed parse checked."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=CLIENT_TIMEOUT)
    seen: list[dict[str, Any]] = []
    try:
        with client.responses.connect(extra_headers={"OpenAI-Beta": BETA[CHAINED]}) as conn:

            def read() -> dict[str, Any]:
                data = conn.recv_bytes()
                raw = json.loads(data)
                assert_typed(conn.parse_event(data), raw)
                seen.append(raw)
                return raw

            script(conn, read)
    finally:
        client.close()
    return seen


async def test_sdk_drives_subagent_lanes_to_completion(live_server):
    _, port = live_server
    workloads = [fixed(3, initial_prompt_tokens=200, appended_tokens=20, output_tokens=20, tool_seconds=0.05)] * 3
    records = await in_thread(
        run_sdk_lanes, f"http://127.0.0.1:{port}/v1", workloads,
        metadata_for=lambda i: {"testbed_workload": "fixed:3:200:20:20:0.05"}, model="sim-100000", timeout=CLIENT_TIMEOUT,
    )
    assert ([r.status for r in records], [len(r.turns) for r in records]) == (["completed"] * 3, [3, 3, 3])
    assert all(len(set(r.response_ids)) == 3 for r in records)


async def test_sdk_steer_accepted_steered_and_successor(live_server):
    _, port = live_server
    result = await in_thread(
        run_sdk_steer, f"http://127.0.0.1:{port}/v1", metadata=SLOW_TEXT, text="only the tests", model="sim-200",
        stream_id="main", timeout=CLIENT_TIMEOUT,
    )
    kinds = [e["type"] for e in result["events"]]
    successor_at = len(kinds) - 1 - kinds[::-1].index("response.created")
    at = [kinds.index("response.steer.accepted"), kinds.index("response.incomplete"), successor_at]
    accepted, ended, successor = (result["events"][i] for i in at)
    assert result["steer_to_token_s"] is not None and at == sorted(at)
    assert accepted["stream_id"] == ended["stream_id"] == successor["stream_id"] == "main"
    assert ended["response"]["incomplete_details"] == {"reason": "steered"}
    assert successor["response"]["previous_response_id"] == ended["response"]["id"] == accepted["steer"]["previous_response_id"]


async def test_sdk_steer_events_and_failures_parse_as_the_sdk_types(live_server):
    _, port = live_server

    def script(conn, read):
        conn.response.steer(input="hello", previous_response_id="resp_missing")
        failed = read()
        assert (failed["type"], failed["error"]["code"]) == ("response.steer.failed", "response_not_found")
        conn.response.create(model="sim-100000", input="go", tools=HARNESS_TOOLS, store=False, metadata={"testbed_workload": "fixed:2"})
        while (event := read())["type"] != "response.completed":
            pass
        conn.response.steer(input=[{"type": "message", "role": "user", "content": "late"}], previous_response_id=event["response"]["id"])
        late = read()
        assert (late["type"], late["error"]["code"]) == ("response.steer.failed", "response_already_completed")
        assert "stream_id" not in late  # the default lane

    await in_thread(sdk_events, port, script)
