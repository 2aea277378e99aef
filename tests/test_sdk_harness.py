"""The benchmark reproduced with a client nobody here wrote (issue 7).

One live server; the same 3-turn workload runs through the built-in harness
(`harness.run_websocket_rollout`, trio) and through openai-python (`sdk.run_sdk_rollout`, in a worker
thread), in both WebSocket designs. The transcripts (every item both ways, ids removed) and the
token usage must be identical: the SDK client is a faithful stand-in for the harness. The server's
client records tell the two clients apart by user agent, and with the timing header the SDK's
terminal events carry the client fields in `testbed_timing.client`.
"""

from __future__ import annotations

import functools

import pytest
import trio

from prototype import workload as wl
from prototype.client.connect import TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED, run_websocket_rollout
from prototype.client.sdk import rollout_client, run_sdk_rollout, run_sdk_websocket_rollout

pytest.importorskip("openai")

MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds
TURNS = 3
SPEC = f"fixed:{TURNS}:2000:200:50:0.01"
WORKLOAD = wl.fixed(TURNS, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=50, tool_seconds=0.01)
METADATA = {"testbed_workload": SPEC}
ROLLOUT_TIMEOUT = 20.0  # seconds per rollout; a healthy one takes well under a second


async def sdk_rollout(port: int, design: str, **kwargs):
    run = functools.partial(
        run_sdk_rollout, f"http://127.0.0.1:{port}/v1", design, WORKLOAD,
        metadata=METADATA, model=MODEL, api_key="testbed", timeout=ROLLOUT_TIMEOUT, **kwargs,
    )
    with trio.fail_after(ROLLOUT_TIMEOUT + 5):
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_sdk_client_reproduces_the_harness(live_server, design):
    server, port = live_server
    with trio.fail_after(ROLLOUT_TIMEOUT):
        ours = await run_websocket_rollout(TcpConnector("127.0.0.1", port), design, WORKLOAD, metadata=METADATA, model=MODEL)
    theirs = await sdk_rollout(port, design)

    for record in (ours, theirs):
        assert record.status == "completed"
        assert len(record.turns) == TURNS
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


async def test_timing_header_returns_client_fields(live_server):
    server, port = live_server
    record = await sdk_rollout(port, CHAINED, include_timing=True)
    assert record.status == "completed"
    for turn in record.turns:
        client = turn.server_timing["client"]
        assert client["user_agent"].startswith("OpenAI/Python")
        assert client["transport"] == "websocket" and client["design"] == CHAINED
        assert client["context"] == ("full" if turn.turn == 0 else "chained")
        assert client["warmup"] is False and client["stream_id"] is False
        assert "prefill" in turn.server_timing["phases_ms"]
    assert all(r["timing_requested"] for r in server.records)


async def test_experiments_can_swap_the_client(live_server):
    """`rollout_client("sdk")` is awaited exactly like the built-in harness."""
    _, port = live_server
    connector = TcpConnector("127.0.0.1", port)
    assert rollout_client("harness") is run_websocket_rollout
    assert rollout_client("sdk") is run_sdk_websocket_rollout
    with trio.fail_after(ROLLOUT_TIMEOUT):
        records = [
            await rollout_client(name)(connector, CHAINED, WORKLOAD, metadata=METADATA, model=MODEL)
            for name in ("harness", "sdk")
        ]
    assert records[0].transcript == records[1].transcript
    with pytest.raises(ValueError):
        rollout_client("curl")
