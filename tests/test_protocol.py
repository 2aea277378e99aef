"""The protocol's items, server events, errors and Response object: each as parsed and as sent, with its exact refusal."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from prototype.protocol import codec, errors
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.protocol.items import (
    ENCRYPTED_CONTENT_MIN_CHARS,
    ENCRYPTED_CONTENT_PREFIX,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    Message,
    OpaqueItem,
    Reasoning,
    WebSearchCall,
    encode_reasoning,
    parse_input,
    parse_item,
)
from prototype.protocol.response import Response, Usage


def create(**body: Any):
    return codec.parse_create_body({"model": "m", "input": "x", **body})


def refusal(parse, *args) -> tuple[str, str, str | None]:
    """The code, message and param of the ProtocolError that `parse(*args)` raises."""
    with pytest.raises(ProtocolError) as caught:
        parse(*args)
    return caught.value.code, caught.value.message, caught.value.param


# --- reasoning items and their blobs -------------------------------------------------------------


def test_a_reasoning_item_goes_on_the_wire_with_an_empty_summary_and_its_status() -> None:
    assert Reasoning("rs_1", "thinking").to_dict() == {"type": "reasoning", "id": "rs_1", "summary": []}
    assert Reasoning("rs_1", "thinking", status="completed").to_dict() == {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed"}
    assert Reasoning("rs_1", "thinking", status="completed").exported().to_dict() == {
        "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("thinking"),
        "status": "completed"}


def blob_payload(blob: str) -> bytes:
    assert blob.startswith(ENCRYPTED_CONTENT_PREFIX)
    return base64.urlsafe_b64decode(blob[len(ENCRYPTED_CONTENT_PREFIX) :])


@pytest.mark.parametrize("text", ["", "short", "é" * 100])
def test_a_short_reasoning_blob_is_padded_to_the_real_apis_minimum_size(text: str) -> None:
    """Short reasoning gives a blob of at least 1,700 characters and less than one base64 quantum more."""
    blob = encode_reasoning(text)
    assert ENCRYPTED_CONTENT_MIN_CHARS <= len(blob) < ENCRYPTED_CONTENT_MIN_CHARS + 4
    encoded = text.encode("utf-8")
    assert blob_payload(blob).rstrip(b"\0") == (len(encoded).to_bytes(4, "big") + encoded).rstrip(b"\0")
    assert parse_item({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob}) == Reasoning("rs_1", text, encrypted_content=blob)


@pytest.mark.parametrize("size", [1500, 1501, 1502, 3000])
def test_a_long_reasoning_blob_carries_the_text_and_no_padding(size: int) -> None:
    text = "r" * size
    blob = encode_reasoning(text)
    assert blob_payload(blob) == size.to_bytes(4, "big") + text.encode("utf-8")
    assert parse_item({"type": "reasoning", "id": "rs_2", "encrypted_content": blob, "status": "completed"}) == Reasoning(
        "rs_2", text, encrypted_content=blob, status="completed")


def ours(payload: bytes) -> str:
    return ENCRYPTED_CONTENT_PREFIX + base64.urlsafe_b64encode(payload).decode("ascii")


@pytest.mark.parametrize("damaged", [
    pytest.param(encode_reasoning("r" * 3000)[:-400], id="truncated"), pytest.param(ENCRYPTED_CONTENT_PREFIX, id="empty"),
    pytest.param(ENCRYPTED_CONTENT_PREFIX + "abc", id="bad base64"),
    pytest.param(ENCRYPTED_CONTENT_PREFIX + "é" * 8, id="not ascii"),
    pytest.param(ours((2).to_bytes(4, "big") + b"\xff\xfe"), id="not utf-8"),
])
def test_a_damaged_reasoning_blob_is_refused(damaged: str) -> None:
    """A blob of ours cut short or altered cannot be verified: the real API's error, never a shorter or empty text."""
    assert refusal(parse_item, {"type": "reasoning", "id": "rs_3", "encrypted_content": damaged}, "input[2]") == (
        errors.INVALID_ENCRYPTED_CONTENT, "The encrypted content for item rs_3 could not be verified.",
        "input[2].encrypted_content")


# --- compaction items ----------------------------------------------------------------------------


@pytest.mark.parametrize(("rounds", "offset"), [(0, 0), (3, 41), (2**24 + 1, 2**24 + 7), (2**32 - 1, 2**32 - 2)])
def test_a_compaction_item_sent_back_restores_its_rounds_offset_and_summary(rounds: int, offset: int) -> None:
    item = Compaction("cmp_1", "the summary, é", rounds=rounds, offset=offset)
    wire = item.to_dict()
    assert (wire, parse_item(wire)) == ({"type": "compaction", "id": "cmp_1", "encrypted_content": item.encrypted_content}, item)


# --- items on the wire, and every refusal with its exact code, message and param ---------------------

BLOB = encode_reasoning("why")


@pytest.mark.parametrize("sent", [
    {"type": "function_call_output", "call_id": "call_1", "output": "done", "id": "fco_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "done"},  # id and status only when set
    {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}", "id": "fc_1", "status": "in_progress"},
    {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAAforeign"},  # another server's blob
    {"type": "item_reference", "id": "msg_1"},
], ids=lambda sent: "-".join(map(str, sent.values()))[:40])
def test_an_item_goes_back_on_the_wire_as_it_was_sent(sent: dict[str, Any]) -> None:
    assert parse_item(sent).to_dict() == sent


def test_a_function_call_output_of_content_parts_is_their_text() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}]
    assert parse_item({"type": "function_call_output", "call_id": "c", "output": parts}).to_dict()["output"] == "ab"


def typed(param: str, expected: str = "a string") -> tuple[str, str, str]:
    return ("invalid_type", f"Invalid type for '{param}': expected {expected}.", param)


def missing(field: str) -> tuple[str, str, str]:
    return ("missing_required_parameter", f"Missing required field '{field}' in input[4].", f"input[4].{field}")


CONTENT = "a string or an array of content parts"
ITEM_REFUSALS = [
    pytest.param([1], typed("input[4]", "an object"), id='not an object'),
    pytest.param({'content': 'x'}, missing("type"), id='no type'),
    pytest.param({'type': 'input_image'}, ('invalid_value', "Invalid value for 'input[4].type': unknown item type 'input_image'.", 'input[4].type'), id='unknown type'),
    pytest.param({'type': 5}, ('invalid_value', "Invalid value for 'input[4].type': unknown item type 5.", 'input[4].type'), id='type not a string'),
    pytest.param({'type': 'message', 'content': 'x'}, missing("role"), id='role missing'),
    pytest.param({'type': 'message', 'role': 5, 'content': 'x'}, typed("input[4].role"), id='role not a string'),
    pytest.param({'role': 'king', 'content': 'x'}, ('invalid_value', "Invalid value for 'input[4].role': 'king'; expected one of ('user', 'system', 'developer', 'assistant').", 'input[4].role'), id='role unknown'),
    pytest.param({'role': 'user'}, missing("content"), id='content missing'),
    pytest.param({'role': 'user', 'content': None}, typed("input[4].content", CONTENT), id='content null'),
    pytest.param({'role': 'user', 'content': 5}, typed("input[4].content", CONTENT), id='content a number'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text', 'text': 'a'}, 'x']}, typed("input[4].content[1]", "an object"), id='part not an object'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_image', 'image_url': 'u'}]}, ('invalid_value', "Unsupported content part type 'input_image' at 'input[4].content[0]': the simulator takes text parts only.", 'input[4].content[0].type'), id='part type unknown'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text', 'text': 5}]}, typed("input[4].content[0].text"), id='part text not a string'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text'}]}, typed("input[4].content[0].text"), id='part without text'),
    pytest.param({'role': 'user', 'content': 'x', 'id': 5}, typed("input[4].id"), id='message id not a string'),
    pytest.param({'role': 'user', 'content': 'x', 'status': 5}, typed("input[4].status"), id='message status not a string'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f'}, missing("arguments"), id='call without arguments'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': {}}, typed("input[4].arguments"), id='call arguments an object'),
    pytest.param({'type': 'function_call', 'name': 'f', 'arguments': '{}'}, missing("call_id"), id='call without call_id'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'arguments': '{}'}, missing("name"), id='call without name'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': '{}', 'id': 1}, typed("input[4].id"), id='call id not a string'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': '{}', 'status': 1}, typed("input[4].status"), id='call status not a string'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c'}, missing("output"), id='output without output'),
    pytest.param({'type': 'function_call_output', 'output': 'x'}, missing("call_id"), id='output without call_id'),
    # A named output without a call_id is no answer to a call (Codex's goal outputs are opaque only with a string name).
    pytest.param({'type': 'function_call_output', 'name': 5, 'output': 'done'}, missing("call_id"), id='named output without call_id'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 5}, typed("input[4].output", CONTENT), id='output a number'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': [{'type': 'input_text', 'text': 'a'}, 5]},
                 typed("input[4].output[1]", "an object"), id='output part not an object'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 'x', 'id': 5}, typed("input[4].id"), id='output id not a string'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 'x', 'status': 5}, typed("input[4].status"), id='output status not a string'),
    pytest.param({'type': 'web_search_call', 'action': {'query': 'q'}}, missing("id"), id='search without id'),
    pytest.param({'type': 'web_search_call', 'id': 'ws_1', 'status': 5}, typed("input[4].status"), id='search status not a string'),
    pytest.param({'type': 'reasoning', 'encrypted_content': BLOB}, missing("id"), id='our reasoning without id'),
    pytest.param({'type': 'reasoning', 'id': 'rs_1', 'encrypted_content': BLOB, 'status': 5}, typed("input[4].status"), id='our reasoning status'),
    pytest.param({'type': 'reasoning', 'id': 5, 'encrypted_content': ENCRYPTED_CONTENT_PREFIX + 'abc'}, (errors.INVALID_ENCRYPTED_CONTENT,
                 "The encrypted content for item ? could not be verified.", "input[4].encrypted_content"), id='damaged blob, id not a string'),
    pytest.param({'type': 'compaction', 'id': 5, 'encrypted_content': Compaction("cmp_1", "s").encrypted_content}, typed("input[4].id"),
                 id='our compaction id not a string'),
]


@pytest.mark.parametrize(("item", "error"), ITEM_REFUSALS)
def test_a_refused_item_gets_its_code_message_and_param(item: Any, error: tuple[str, str, str]) -> None:
    assert refusal(parse_item, item, "input[4]") == error


def test_a_lone_item_is_named_as_the_first_of_the_input_by_default() -> None:
    assert refusal(parse_item, {"role": "user"})[1:] == ("Missing required field 'content' in input[0].", "input[0].content")


# --- items as parsed -----------------------------------------------------------------------------


def test_messages_keep_their_parts_ids_and_statuses() -> None:
    assert parse_item({"role": "assistant", "content": "done"}) == Message("assistant", (("output_text", "done"),))
    assert parse_item({"type": "message", "role": "developer", "content": "rules"}) == Message("developer", (("input_text", "rules"),))
    parts = [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "no"}, {"type": "text", "text": "c"}]
    message = parse_item({"type": "message", "role": "assistant", "content": parts, "id": "msg_1", "status": "completed"})
    assert message == Message("assistant", (("output_text", "a"), ("refusal", "no"), ("text", "c")), id="msg_1", status="completed")
    assert message.text == "anoc"
    assert message.to_dict() == {
        "type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
        "content": [{"type": "output_text", "text": "a", "annotations": []}, {"type": "refusal", "text": "no"},
                    {"type": "text", "text": "c"}]}


def test_calls_and_outputs_keep_their_fields() -> None:
    sent = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}", "id": "fc_1", "status": "in_progress"}
    assert parse_item(sent) == FunctionCall("call_1", "read_file", "{}", id="fc_1", status="in_progress")
    # A named output with a call_id answers that call; only one that answers no call is opaque context.
    assert parse_item({"type": "function_call_output", "call_id": "call_1", "name": "read_file", "output": "done"}) == FunctionCallOutput(
        "call_1", "done")


@pytest.mark.parametrize(("sent", "query", "status"), [
    ({"type": "web_search_call", "id": "ws_1", "status": "searching", "action": {"type": "search", "query": "trio"}}, "trio", "searching"),
    ({"type": "web_search_call", "id": "ws_1"}, "", "completed"),
    ({"type": "web_search_call", "id": "ws_1", "action": "search"}, "", "completed"),
    ({"type": "web_search_call", "id": "ws_1", "action": {"query": 5}}, "", "completed"),
])
def test_a_web_search_call_keeps_a_string_query_and_its_status(sent: dict[str, Any], query: str, status: str) -> None:
    assert parse_item(sent) == WebSearchCall("ws_1", query, status=status)


@pytest.mark.parametrize(("sent", "kind"), [
    ({"type": "function_call_output", "name": "goal_objective", "namespace": "agent", "output": "ship it"}, "function_call_output"),
    ({"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAAforeign"}, "reasoning"),
    ({"type": "compaction", "id": "cmp_9", "encrypted_content": "gAAAAforeign"}, "compaction"),
    ({"type": "reasoning", "id": "rs_1", "summary": []}, "reasoning"),  # no blob
    ({"type": "compaction", "id": "cmp_1"}, "compaction"),
    ({"type": "compaction", "id": "cmp_1", "encrypted_content": 5}, "compaction"),
])
def test_items_the_simulator_does_not_interpret_travel_as_canonical_json(sent: dict[str, Any], kind: str) -> None:
    assert parse_item(sent) == OpaqueItem(kind, json.dumps(sent, sort_keys=True, separators=(",", ":")))


def test_items_of_ours_without_an_id_are_kept() -> None:
    assert parse_item({"type": "reasoning", "id": "", "encrypted_content": BLOB}) == Reasoning("", "why", encrypted_content=BLOB)
    item = Compaction("cmp_1", "s", rounds=2, offset=3)
    assert parse_item({"type": "compaction", "encrypted_content": item.encrypted_content}) == Compaction("", "s", rounds=2, offset=3)


def test_a_string_input_is_one_user_message_and_a_bad_input_is_named() -> None:
    assert parse_input("hi") == (Message("user", (("input_text", "hi"),)),)
    assert parse_input([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == (
        Message("user", (("input_text", "a"),)), Message("assistant", (("output_text", "b"),)))
    for value in (5, None, {"role": "user"}):
        assert refusal(parse_input, value, "input") == (
            errors.INVALID_TYPE, "Invalid type for 'input': expected a string or an array of items.", "input")
    assert refusal(parse_input, [{"role": "user", "content": "a"}, {"role": "user"}])[2] == "input[1].content"


# --- server events on the wire -------------------------------------------------------------------


def test_server_events_carry_their_type_first_then_their_fields_in_order() -> None:
    snapshot = {"id": "resp_1", "status": "in_progress"}
    cases = [
        (ev.ResponseCreated(0, snapshot), {"type": "response.created", "sequence_number": 0, "response": snapshot}),
        (ev.ResponseInProgress(1, snapshot), {"type": "response.in_progress", "sequence_number": 1, "response": snapshot}),
        (ev.ResponseDone(2, snapshot), {"type": "response.done", "sequence_number": 2, "response": snapshot}),
        (ev.ResponseCompleted(3, snapshot), {"type": "response.completed", "sequence_number": 3, "response": snapshot}),
        (ev.ResponseFailed(3, snapshot), {"type": "response.failed", "sequence_number": 3, "response": snapshot}),
        (ev.ResponseIncomplete(3, snapshot), {"type": "response.incomplete", "sequence_number": 3, "response": snapshot}),
        (ev.ResponseCancelled(3, snapshot), {"type": "response.cancelled", "sequence_number": 3, "response": snapshot}),
        (ev.OutputItemAdded(4, 0, {"id": "m"}), {"type": "response.output_item.added", "sequence_number": 4, "output_index": 0, "item": {"id": "m"}}),
        (ev.OutputItemDone(5, 1, {"id": "m"}), {"type": "response.output_item.done", "sequence_number": 5, "output_index": 1, "item": {"id": "m"}}),
        (ev.ContentPartAdded(6, "m", 0, 0, {"type": "output_text"}), {"type": "response.content_part.added", "sequence_number": 6, "item_id": "m", "output_index": 0, "content_index": 0, "part": {"type": "output_text"}}),
        (ev.ContentPartDone(7, "m", 0, 1, {"type": "output_text"}), {"type": "response.content_part.done", "sequence_number": 7, "item_id": "m", "output_index": 0, "content_index": 1, "part": {"type": "output_text"}}),
        (ev.OutputTextDelta(8, "m", 2, 0, "Hel"), {"type": "response.output_text.delta", "sequence_number": 8, "item_id": "m", "output_index": 2, "content_index": 0, "delta": "Hel", "logprobs": []}),
        (ev.OutputTextDone(9, "m", 2, 0, "Hello"), {"type": "response.output_text.done", "sequence_number": 9, "item_id": "m", "output_index": 2, "content_index": 0, "text": "Hello", "logprobs": []}),
        (ev.FunctionCallArgumentsDelta(10, "fc", 1, "{"), {"type": "response.function_call_arguments.delta", "sequence_number": 10, "item_id": "fc", "output_index": 1, "delta": "{"}),
        (ev.FunctionCallArgumentsDone(11, "fc", 1, "{}"), {"type": "response.function_call_arguments.done", "sequence_number": 11, "item_id": "fc", "output_index": 1, "arguments": "{}"}),
        (ev.WebSearchInProgress(12, "ws", 0), {"type": "response.web_search_call.in_progress", "sequence_number": 12, "item_id": "ws", "output_index": 0}),
        (ev.WebSearchSearching(13, "ws", 0), {"type": "response.web_search_call.searching", "sequence_number": 13, "item_id": "ws", "output_index": 0}),
        (ev.WebSearchCompleted(14, "ws", 0), {"type": "response.web_search_call.completed", "sequence_number": 14, "item_id": "ws", "output_index": 0}),
        (ev.SteerAccepted(15, {"id": "st"}), {"type": "response.steer.accepted", "sequence_number": 15, "steer": {"id": "st"}}),
        (ev.SteerFailed(0, {"input": "go"}, {"code": "c"}), {"type": "response.steer.failed", "sequence_number": 0, "steer": {"input": "go"}, "error": {"code": "c"}}),
        (ev.SteerPending(16, "r", [{"call_id": "c"}], {"id": "st"}), {"type": "response.steer.pending", "sequence_number": 16, "reason": "r", "required_input": [{"call_id": "c"}], "steer": {"id": "st"}}),
        (ev.CompactionCompacting(17, "cmp", 0), {"type": "response.compaction.compacting", "sequence_number": 17, "item_id": "cmp", "output_index": 0}),
        (ev.InjectCreated(18, "resp_1"), {"type": "response.inject.created", "sequence_number": 18, "response_id": "resp_1"}),
        (ev.InjectFailed(19, "resp_1", ["x"], {"code": "c"}), {"type": "response.inject.failed", "sequence_number": 19, "response_id": "resp_1", "input": ["x"], "error": {"code": "c"}}),
    ]
    for event, wire in cases:
        assert (event.to_dict(), list(event.to_dict())) == (wire, list(wire)) and codec.encode_event(event) == codec.encode(wire)
    assert ev.TERMINAL_TYPES == {"response.completed", "response.failed", "response.incomplete", "response.cancelled"}


# --- the Response object -------------------------------------------------------------------------


def test_usage_adds_every_count_and_reports_the_total() -> None:
    usage = Usage(10, 4, 3, 1)
    usage.add(Usage(20, 8, 5, 2))
    assert usage == Usage(30, 12, 8, 3)
    assert usage.to_dict() == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
                               "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 38}


def test_a_response_echoes_its_request_and_sends_usage_once_it_has_ended() -> None:
    request = create(
        instructions="be brief", max_output_tokens=64, metadata={"k": "v"}, parallel_tool_calls=False, previous_response_id="resp_0",
        reasoning={"effort": "low"}, store=False, temperature=0.5, top_p=0.9, tool_choice="required",
        tools=[{"type": "function", "name": "read_file", "parameters": {"type": "object"}}])
    answer = Message("assistant", (("output_text", "ok"),), id="msg_1", status="completed")
    response = Response("resp_1", request, 1700000000, output=[answer], usage=Usage(5, 1, 2, 0))
    running = response.to_dict()
    assert running == {
        "id": "resp_1", "object": "response", "created_at": 1700000000, "status": "in_progress", "error": None,
        "incomplete_details": None, "instructions": "be brief", "max_output_tokens": 64, "metadata": {"k": "v"}, "model": "m",
        "output": [answer.to_dict()], "parallel_tool_calls": False, "previous_response_id": "resp_0", "reasoning": {"effort": "low"},
        "store": False, "temperature": 0.5, "tool_choice": "required",
        "tools": [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}], "top_p": 0.9, "usage": None}
    assert response.to_dict(usage_so_far=True)["usage"] == Usage(5, 1, 2, 0).to_dict()
    assert response.to_dict(output=[])["output"] == []
    response.status = "completed"
    assert response.to_dict()["usage"] == Usage(5, 1, 2, 0).to_dict()
    response.timing = {"queued_ms": 1.5}
    assert response.to_dict()["testbed_timing"] == {"queued_ms": 1.5}


def test_a_response_sends_the_sampling_defaults_and_echoes_multi_agent_and_compaction_only_when_sent() -> None:
    plain = Response("resp_1", create(), 1).to_dict()
    assert (plain["temperature"], plain["top_p"]) == (1.0, 1.0)
    assert "multi_agent" not in plain and "context_management" not in plain and "testbed_timing" not in plain
    sent = create(multi_agent={"enabled": True, "max_concurrent_subagents": 2}, context_management=[{"type": "compaction", "compact_threshold": 20000}])
    wire = Response("resp_2", sent, 1).to_dict()
    assert wire["multi_agent"] == {"enabled": True, "max_concurrent_subagents": 2}
    assert wire["context_management"] == [{"type": "compaction", "compact_threshold": 20000}]
    zero = Response("resp_3", create(temperature=0, top_p=0), 1).to_dict()
    assert (zero["temperature"], zero["top_p"]) == (0, 0)
