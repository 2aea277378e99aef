"""The benchmark reproduced with a client nobody here wrote: on one live server the same task runs through the harness
and through openai-python (`rollout_client("sdk")`, in a worker thread), in both WebSocket designs, to the same
transcript and usage; the server's records tell the two apart by user agent."""

from __future__ import annotations

import pytest
import trio

from prototype import workload as wl
from prototype.client.connect import TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.client.sdk import rollout_client

pytest.importorskip("openai")

MODEL = "sim-100000"  # 100k tokens/s: a turn decodes in milliseconds
TURNS = 3
SPEC = f"fixed:{TURNS}:2000:200:50:0.01"
WORKLOAD = wl.fixed(TURNS, initial_prompt_tokens=2000, appended_tokens=200, output_tokens=50, tool_seconds=0.01)
METADATA = {"testbed_workload": SPEC}
ROLLOUT_TIMEOUT = 20.0  # seconds per rollout; a healthy one takes well under a second


async def sdk_rollout(port: int, design: str, **kwargs):
    """The SDK's rollout as an experiment swaps it in for the harness's."""
    with trio.fail_after(ROLLOUT_TIMEOUT + 5):
        return await rollout_client("sdk")(TcpConnector("127.0.0.1", port), design, WORKLOAD, metadata=METADATA, model=MODEL,
                                           timeout=ROLLOUT_TIMEOUT, **kwargs)


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_sdk_client_reproduces_the_harness_and_the_timing_header_returns_its_client_fields(live_server, design):
    server, port = live_server
    with trio.fail_after(ROLLOUT_TIMEOUT):
        ours = await rollout_client("harness")(TcpConnector("127.0.0.1", port), design, WORKLOAD, metadata=METADATA, model=MODEL)
    theirs = await sdk_rollout(port, design, include_timing=True)

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
