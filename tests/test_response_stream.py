"""The events a response streams (designs/emitter.py, sampling.py): each item announced, streamed and done;
deltas capped; exactly one terminal event; a cancel keeps only the finished items."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from support import TERMINALS, create_event, make_server, send, timed_until, until, ws
from test_endpoints import connect, error_of

from prototype import metrics
from prototype.designs.emitter import Emitter, failing_on_error
from prototype.engine import tokenizer
from prototype.engine.streaming import EngineFailure
from prototype.protocol.events import CreateRequest
from prototype.protocol.items import decode_reasoning
from prototype.protocol.response import Response
from prototype.workload import TurnSpec, Workload

# A first turn that reasons for 15 tokens before its message and call, then a final answer that reasons for 10.
REASONING = Workload("reasoning", 2, (TurnSpec(300, 40, (0.3,), (), 15), TurnSpec(50, 30, (), (), 10)))


def reasoning_item(item_id: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], **extra, "status": status}


async def test_a_reasoning_item_is_announced_sampled_at_the_decode_rate_and_exported(autojump_clock) -> None:
    server = make_server()
    key = server.api.workloads.register(REASONING)
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": key, "testbed_decode_tps": "100"}, include=["reasoning.encrypted_content"]))
        events = await timed_until(conn, *TERMINALS)
    # A response opens with created, then in_progress; usage is reported once it has ended, not while it runs.
    assert [(e["type"], e["response"]["status"], e["response"]["usage"]) for _, e in events[:2]] == [
        ("response.created", "in_progress", None), ("response.in_progress", "in_progress", None)]
    (added_at, added), (done_at, done) = ((t, e) for t, e in events if e["type"].startswith("response.output_item.") and e["output_index"] == 0)
    item_id = added["item"]["id"]
    assert item_id.startswith("rs_")
    assert added == {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": reasoning_item(item_id, "in_progress")}
    blob = done["item"]["encrypted_content"]
    assert done == {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0,
                    "item": reasoning_item(item_id, "completed", encrypted_content=blob)}
    assert done_at - added_at == pytest.approx(15 / 100, abs=1e-12)  # 15 tokens at 100 tokens/s
    assert len(tokenizer.encode(decode_reasoning(blob))) == 15  # the text is the sampled tokens, nothing between them
    final = events[-1][1]["response"]
    assert final["output"][0] == reasoning_item(item_id, "completed", encrypted_content=blob)
    # The message: one output_text part, announced empty, streamed, then done with the whole text.
    message = final["output"][1]
    text = message["content"][0]["text"]
    part_events = [e for _, e in events if e.get("output_index") == 1 and e["type"].startswith(("response.content_part.", "response.output_text."))]
    msg_id = message["id"]
    assert part_events[0] == {"type": "response.content_part.added", "sequence_number": part_events[0]["sequence_number"], "item_id": msg_id,
                              "output_index": 1, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}
    assert {(e["type"], e["content_index"]) for e in part_events[1:-2]} == {("response.output_text.delta", 0)}
    assert "".join(e["delta"] for e in part_events[1:-2]) == text
    assert [{k: v for k, v in e.items() if k != "sequence_number"} for e in part_events[-2:]] == [
        {"type": "response.output_text.done", "item_id": msg_id, "output_index": 1, "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", "item_id": msg_id, "output_index": 1, "content_index": 0,
         "part": {"type": "output_text", "text": text, "annotations": []}}]
    # The call after the message: announced empty, done with its streamed arguments.
    (_, call_added), (_, call_done) = ((t, e) for t, e in events if e["type"].startswith("response.output_item.") and e["output_index"] == 2)
    call = final["output"][2]
    assert call == {"type": "function_call", "id": call["id"], "call_id": call["call_id"], "name": call["name"],
                    "arguments": call["arguments"], "status": "completed"}
    assert (call_added["item"], call_done["item"]) == ({**call, "arguments": "", "status": "in_progress"}, call)
    deltas = "".join(e["delta"] for _, e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == call["arguments"] and json.loads(call["arguments"])
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 15}


async def test_deltas_carry_at_most_the_configured_tokens(autojump_clock) -> None:
    # A 1 s flush interval coalesces the whole 30-token message; `flush_tokens` caps each delta.
    server = make_server(flush_interval=1.0, flush_tokens=5)
    async with ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1:100:10:30"}))
        events = await until(conn, *TERMINALS)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert [len(tokenizer.encode(d)) for d in deltas] == [1, 5, 5, 5, 5, 5, 4]  # the first token goes out at once
    assert "".join(deltas) == events[-1]["response"]["output"][0]["content"][0]["text"]


# --- the terminal event, and a failure inside a response ---------------------------------------------------


def recording_emitter() -> tuple[Emitter, list[Any]]:
    """An emitter of a fresh response, and the events it sends."""
    sent: list[Any] = []

    async def sink(event: Any) -> None:
        sent.append(event)

    return Emitter(Response("resp_1", CreateRequest("sim-1", ()), created_at=0), sink, metrics.PhaseLog()), sent


async def test_a_response_ends_with_exactly_one_terminal_event() -> None:
    emitter, sent = recording_emitter()
    async with failing_on_error(emitter):  # a response that ends normally is not failed
        await emitter.finished("completed")
    await emitter.finished("failed", error={"code": "server_error", "message": "late"})
    assert [event.type for event in sent] == ["response.completed"]
    assert (emitter.response.status, emitter.response.error) == ("completed", None)


@pytest.mark.parametrize(("raised", "error"), [
    # (an engine failure with its message, and a context past the window: tests/test_faults.py, from the server's side)
    (EngineFailure(), {"code": "server_error", "message": "The engine failed mid-response."}),  # no message of its own
    (RuntimeError("a bug"), {"code": "server_error", "message": "The server had an error while processing the response."}),
])
async def test_a_failure_inside_a_response_fails_it_once_and_goes_on_to_the_connection(raised, error) -> None:
    emitter, sent = recording_emitter()
    with pytest.raises(type(raised)) as caught:
        async with failing_on_error(emitter):
            raise raised
    assert caught.value is raised and [event.type for event in sent] == ["response.failed"]
    assert (emitter.response.status, emitter.response.error, sent[0].response["error"]) == ("failed", error, error)


# --- a cancel ------------------------------------------------------------------------------------------------


async def cancelled_mid_response(nursery, task: str | Workload, until_type: str, *, design: str = "chained", decode_tps: str = "10",
                                 after: float = 0.0, **options: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A response to `task` (a workload name, or one to register) created by key alice, cancelled over HTTP
    `after` seconds past its first `until_type` event: (its events up to that one, its events from there to
    `response.cancelled`). Another key's cancel finds nothing; alice's is answered at once with the cancelled
    response, which the records keep as cancelled."""
    server = make_server()
    name = task if isinstance(task, str) else server.api.workloads.register(task)
    async with ws(server, design, api_key="alice", **options) as conn:
        await send(conn, create_event(metadata={"testbed_workload": name, "testbed_decode_tps": decode_tps}))
        events = await until(conn, until_type)
        rid = events[0]["response"]["id"]
        await trio.sleep(after)
        http = connect(nursery, server)  # opened now: an idle connection would have been closed
        error_of(await http.request("POST", f"/v1/responses/{rid}/cancel", key="bob"), 404, "response_not_found", "response_id")
        reply = await http.request("POST", f"/v1/responses/{rid}/cancel", key="alice")
        cancelled_at = trio.current_time()
        tail = await until(conn, "response.cancelled")
        assert trio.current_time() == cancelled_at
    cancelled = tail[-1]["response"]
    assert (cancelled["id"], cancelled["status"]) == (rid, "cancelled") and reply.status == 200 and reply.json() == cancelled
    assert [r["outcome"] for r in server.records if r["response_id"] == rid] == ["cancelled"]
    return events, tail


@pytest.mark.parametrize("design", ["suspended", "chained"])
async def test_only_the_key_that_created_a_response_cancels_it(autojump_clock, nursery, design) -> None:
    await cancelled_mid_response(nursery, "fixed:3", "response.created", design=design, after=2.0)  # 2 s into 30 s of decode


async def test_a_cancel_during_reasoning_leaves_no_unfinished_item(autojump_clock, nursery) -> None:
    long_reasoning = Workload("long-reasoning", 4, (TurnSpec(300, 400, (0.3,), (), 300), TurnSpec(50, 30, ())))
    events, tail = await cancelled_mid_response(nursery, long_reasoning, "response.output_item.added", decode_tps="100", after=1.0)
    assert events[-1]["item"]["type"] == "reasoning"
    (cancelled,) = tail
    assert cancelled["sequence_number"] == events[-1]["sequence_number"] + 1 and cancelled["response"]["output"] == []


async def test_a_cancel_while_a_call_streams_keeps_only_the_finished_items(autojump_clock, nursery) -> None:
    events, tail = await cancelled_mid_response(nursery, "fixed:2", "response.function_call_arguments.delta", include_timing=True)
    added = [e for e in events if e["type"] == "response.output_item.added"][-1]["item"]
    assert added == {"type": "function_call", "id": added["id"], "call_id": added["call_id"], "name": added["name"],
                     "arguments": "", "status": "in_progress"}
    (cancelled,) = tail
    response = cancelled["response"]
    assert [(i["type"], i["status"]) for i in response["output"]] == [("message", "completed")]
    assert response["testbed_timing"]["phases_ms"]["prefill"] > 0  # the timings of the whole response
