"""The protocol's items, server events, errors and Response object: each as parsed and as sent, with its exact refusal."""

from __future__ import annotations

import base64
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


# --- reasoning items and their blobs -------------------------------------------------------------


def test_a_reasoning_item_goes_on_the_wire_with_an_empty_summary_and_its_status() -> None:
    assert Reasoning("rs_1", "thinking").to_dict() == {"type": "reasoning", "id": "rs_1", "summary": []}
    assert Reasoning("rs_1", "thinking", status="completed").to_dict() == {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed"}
    exported = Reasoning("rs_1", "thinking", status="completed").exported()
    assert exported.to_dict() == {
        "type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("thinking"), "status": "completed",
    }


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
        "rs_2", text, encrypted_content=blob, status="completed"
    )


def ours(payload: bytes) -> str:
    return ENCRYPTED_CONTENT_PREFIX + base64.urlsafe_b64encode(payload).decode("ascii")


@pytest.mark.parametrize(
    "damaged",
    [
        pytest.param(encode_reasoning("r" * 3000)[:-400], id="truncated"),
        pytest.param(ENCRYPTED_CONTENT_PREFIX, id="empty"),
        pytest.param(ENCRYPTED_CONTENT_PREFIX + "abc", id="bad base64"),
        pytest.param(ENCRYPTED_CONTENT_PREFIX + "é" * 8, id="not ascii"),
        pytest.param(ours((2).to_bytes(4, "big") + b"\xff\xfe"), id="not utf-8"),
    ],
)
def test_a_damaged_reasoning_blob_is_refused(damaged: str) -> None:
    """A blob of ours cut short or altered cannot be verified: the real API's error, never a shorter or empty text."""
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "reasoning", "id": "rs_3", "encrypted_content": damaged}, "input[2]")
    assert (caught.value.code, caught.value.message, caught.value.param) == (
        errors.INVALID_ENCRYPTED_CONTENT, "The encrypted content for item rs_3 could not be verified.", "input[2].encrypted_content"
    )


# --- compaction items ----------------------------------------------------------------------------


@pytest.mark.parametrize(("rounds", "offset"), [(0, 0), (3, 41), (2**24 + 1, 2**24 + 7), (2**32 - 1, 2**32 - 2)])
def test_a_compaction_item_sent_back_restores_its_rounds_offset_and_summary(rounds: int, offset: int) -> None:
    item = Compaction("cmp_1", "the summary, é", rounds=rounds, offset=offset)
    wire = item.to_dict()
    assert wire == {"type": "compaction", "id": "cmp_1", "encrypted_content": item.encrypted_content}
    assert parse_item(wire) == item


# --- function call outputs -----------------------------------------------------------------------


def test_a_function_call_output_goes_back_on_the_wire_with_its_id_and_status_only_when_set() -> None:
    sent = {"type": "function_call_output", "call_id": "call_1", "output": "done", "id": "fco_1", "status": "completed"}
    assert parse_item(sent).to_dict() == sent
    bare = {"type": "function_call_output", "call_id": "call_1", "output": "done"}
    assert parse_item(bare).to_dict() == bare


def test_a_function_call_output_of_content_parts_is_their_text_and_a_bad_part_is_named_by_its_path() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}]
    assert parse_item({"type": "function_call_output", "call_id": "c", "output": parts}).to_dict()["output"] == "ab"
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "function_call_output", "call_id": "c", "output": [parts[0], 5]}, "input[3]")
    assert (caught.value.code, caught.value.message, caught.value.param) == (
        errors.INVALID_TYPE, "Invalid type for 'input[3].output[1]': expected an object.", "input[3].output[1]"
    )


# --- items: every refusal with its exact code, message and param ---------------------------------

ITEM_REFUSALS = [
    pytest.param([1], ('invalid_type', "Invalid type for 'input[4]': expected an object.", 'input[4]'), id='not an object'),
    pytest.param({'content': 'x'}, ('missing_required_parameter', "Missing required field 'type' in input[4].", 'input[4].type'), id='no type'),
    pytest.param({'type': 'input_image'}, ('invalid_value', "Invalid value for 'input[4].type': unknown item type 'input_image'.", 'input[4].type'), id='unknown type'),
    pytest.param({'type': 5}, ('invalid_value', "Invalid value for 'input[4].type': unknown item type 5.", 'input[4].type'), id='type not a string'),
    pytest.param({'type': 'message', 'content': 'x'}, ('missing_required_parameter', "Missing required field 'role' in input[4].", 'input[4].role'), id='role missing'),
    pytest.param({'type': 'message', 'role': 5, 'content': 'x'}, ('invalid_type', "Invalid type for 'input[4].role': expected a string.", 'input[4].role'), id='role not a string'),
    pytest.param({'role': 'king', 'content': 'x'}, ('invalid_value', "Invalid value for 'input[4].role': 'king'; expected one of ('user', 'system', 'developer', 'assistant').", 'input[4].role'), id='role unknown'),
    pytest.param({'role': 'user'}, ('missing_required_parameter', "Missing required field 'content' in input[4].", 'input[4].content'), id='content missing'),
    pytest.param({'role': 'user', 'content': None}, ('invalid_type', "Invalid type for 'input[4].content': expected a string or an array of content parts.", 'input[4].content'), id='content null'),
    pytest.param({'role': 'user', 'content': 5}, ('invalid_type', "Invalid type for 'input[4].content': expected a string or an array of content parts.", 'input[4].content'), id='content a number'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text', 'text': 'a'}, 'x']}, ('invalid_type', "Invalid type for 'input[4].content[1]': expected an object.", 'input[4].content[1]'), id='part not an object'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_image', 'image_url': 'u'}]}, ('invalid_value', "Unsupported content part type 'input_image' at 'input[4].content[0]': the simulator takes text parts only.", 'input[4].content[0].type'), id='part type unknown'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text', 'text': 5}]}, ('invalid_type', "Invalid type for 'input[4].content[0].text': expected a string.", 'input[4].content[0].text'), id='part text not a string'),
    pytest.param({'role': 'user', 'content': [{'type': 'input_text'}]}, ('invalid_type', "Invalid type for 'input[4].content[0].text': expected a string.", 'input[4].content[0].text'), id='part without text'),
    pytest.param({'role': 'user', 'content': 'x', 'id': 5}, ('invalid_type', "Invalid type for 'input[4].id': expected a string.", 'input[4].id'), id='message id not a string'),
    pytest.param({'role': 'user', 'content': 'x', 'status': 5}, ('invalid_type', "Invalid type for 'input[4].status': expected a string.", 'input[4].status'), id='message status not a string'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f'}, ('missing_required_parameter', "Missing required field 'arguments' in input[4].", 'input[4].arguments'), id='call without arguments'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': {}}, ('invalid_type', "Invalid type for 'input[4].arguments': expected a string.", 'input[4].arguments'), id='call arguments an object'),
    pytest.param({'type': 'function_call', 'name': 'f', 'arguments': '{}'}, ('missing_required_parameter', "Missing required field 'call_id' in input[4].", 'input[4].call_id'), id='call without call_id'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'arguments': '{}'}, ('missing_required_parameter', "Missing required field 'name' in input[4].", 'input[4].name'), id='call without name'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': '{}', 'id': 1}, ('invalid_type', "Invalid type for 'input[4].id': expected a string.", 'input[4].id'), id='call id not a string'),
    pytest.param({'type': 'function_call', 'call_id': 'c', 'name': 'f', 'arguments': '{}', 'status': 1}, ('invalid_type', "Invalid type for 'input[4].status': expected a string.", 'input[4].status'), id='call status not a string'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c'}, ('missing_required_parameter', "Missing required field 'output' in input[4].", 'input[4].output'), id='output without output'),
    pytest.param({'type': 'function_call_output', 'output': 'x'}, ('missing_required_parameter', "Missing required field 'call_id' in input[4].", 'input[4].call_id'), id='output without call_id'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 5}, ('invalid_type', "Invalid type for 'input[4].output': expected a string or an array of content parts.", 'input[4].output'), id='output a number'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 'x', 'id': 5}, ('invalid_type', "Invalid type for 'input[4].id': expected a string.", 'input[4].id'), id='output id not a string'),
    pytest.param({'type': 'function_call_output', 'call_id': 'c', 'output': 'x', 'status': 5}, ('invalid_type', "Invalid type for 'input[4].status': expected a string.", 'input[4].status'), id='output status not a string'),
    pytest.param({'type': 'web_search_call', 'action': {'query': 'q'}}, ('missing_required_parameter', "Missing required field 'id' in input[4].", 'input[4].id'), id='search without id'),
    pytest.param({'type': 'web_search_call', 'id': 'ws_1', 'status': 5}, ('invalid_type', "Invalid type for 'input[4].status': expected a string.", 'input[4].status'), id='search status not a string'),
]


@pytest.mark.parametrize(("item", "error"), ITEM_REFUSALS)
def test_a_refused_item_gets_its_code_message_and_param(item: Any, error: tuple[str, str, str]) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_item(item, "input[4]")
    assert (caught.value.code, caught.value.message, caught.value.param) == error


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
        "content": [{"type": "output_text", "text": "a", "annotations": []}, {"type": "refusal", "text": "no"}, {"type": "text", "text": "c"}],
    }


def test_a_function_call_keeps_every_field() -> None:
    sent = {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}", "id": "fc_1", "status": "in_progress"}
    assert parse_item(sent) == FunctionCall("call_1", "read_file", "{}", id="fc_1", status="in_progress")
    assert parse_item(sent).to_dict() == sent
    bare = parse_item({"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"})
    assert bare.to_dict() == {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"}


@pytest.mark.parametrize(
    ("sent", "query", "status"),
    [
        ({"type": "web_search_call", "id": "ws_1", "status": "searching", "action": {"type": "search", "query": "trio"}}, "trio", "searching"),
        ({"type": "web_search_call", "id": "ws_1"}, "", "completed"),
        ({"type": "web_search_call", "id": "ws_1", "action": "search"}, "", "completed"),
        ({"type": "web_search_call", "id": "ws_1", "action": {"query": 5}}, "", "completed"),
    ],
)
def test_a_web_search_call_keeps_a_string_query_and_its_status(sent: dict[str, Any], query: str, status: str) -> None:
    assert parse_item(sent) == WebSearchCall("ws_1", query, status=status)


def test_items_the_simulator_does_not_interpret_travel_as_canonical_json() -> None:
    goal = {"type": "function_call_output", "name": "goal_objective", "namespace": "agent", "output": "ship it"}
    assert parse_item(goal) == OpaqueItem("function_call_output", '{"name":"goal_objective","namespace":"agent","output":"ship it","type":"function_call_output"}')
    foreign = {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAAforeign"}
    assert parse_item(foreign) == OpaqueItem("reasoning", '{"encrypted_content":"gAAAAforeign","id":"rs_9","summary":[],"type":"reasoning"}')
    assert parse_item(foreign).to_dict() == foreign
    other_compaction = {"type": "compaction", "id": "cmp_9", "encrypted_content": "gAAAAforeign"}
    assert parse_item(other_compaction) == OpaqueItem("compaction", '{"encrypted_content":"gAAAAforeign","id":"cmp_9","type":"compaction"}')
    assert parse_item({"type": "item_reference", "id": "msg_1"}).to_dict() == {"type": "item_reference", "id": "msg_1"}


def test_a_reasoning_item_of_ours_needs_an_id_and_a_string_status() -> None:
    blob = encode_reasoning("why")
    assert parse_item({"type": "reasoning", "id": "", "encrypted_content": blob}) == Reasoning("", "why", encrypted_content=blob)
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "reasoning", "encrypted_content": blob}, "input[1]")
    assert (caught.value.code, caught.value.message, caught.value.param) == (
        errors.MISSING_REQUIRED_PARAMETER, "Missing required field 'id' in input[1].", "input[1].id"
    )
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "reasoning", "id": 5, "encrypted_content": ENCRYPTED_CONTENT_PREFIX + "abc"})
    assert caught.value.message == "The encrypted content for item ? could not be verified."
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "reasoning", "id": "rs_1", "encrypted_content": blob, "status": 5}, "input[1]")
    assert (caught.value.code, caught.value.param) == (errors.INVALID_TYPE, "input[1].status")


def test_a_compaction_item_without_an_id_is_kept() -> None:
    item = Compaction("cmp_1", "s", rounds=2, offset=3)
    assert parse_item({"type": "compaction", "encrypted_content": item.encrypted_content}) == Compaction("", "s", rounds=2, offset=3)


def test_a_string_input_is_one_user_message_and_a_bad_input_is_named() -> None:
    assert parse_input("hi") == (Message("user", (("input_text", "hi"),)),)
    assert parse_input([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == (
        Message("user", (("input_text", "a"),)), Message("assistant", (("output_text", "b"),)),
    )
    for value in (5, None, {"role": "user"}):
        with pytest.raises(ProtocolError) as caught:
            parse_input(value, "input")
        assert (caught.value.code, caught.value.message, caught.value.param) == (
            errors.INVALID_TYPE, "Invalid type for 'input': expected a string or an array of items.", "input"
        )
    with pytest.raises(ProtocolError) as caught:
        parse_input([{"role": "user", "content": "a"}, {"role": "user"}])
    assert caught.value.param == "input[1].content"


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
        assert event.to_dict() == wire
        assert list(event.to_dict()) == list(wire)
        assert codec.encode_event(event) == codec.encode(wire)
    assert ev.TERMINAL_TYPES == {"response.completed", "response.failed", "response.incomplete", "response.cancelled"}


# --- the Response object -------------------------------------------------------------------------


def test_usage_adds_every_count_and_reports_the_total() -> None:
    usage = Usage(10, 4, 3, 1)
    usage.add(Usage(20, 8, 5, 2))
    assert usage == Usage(30, 12, 8, 3)
    assert usage.to_dict() == {
        "input_tokens": 30, "input_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
        "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 38,
    }


def test_a_response_echoes_its_request_and_sends_usage_once_it_has_ended() -> None:
    request = create(
        instructions="be brief", max_output_tokens=64, metadata={"k": "v"}, parallel_tool_calls=False, previous_response_id="resp_0",
        reasoning={"effort": "low"}, store=False, temperature=0.5, top_p=0.9, tool_choice="required",
        tools=[{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
    )
    answer = Message("assistant", (("output_text", "ok"),), id="msg_1", status="completed")
    response = Response("resp_1", request, 1700000000, output=[answer], usage=Usage(5, 1, 2, 0))
    running = response.to_dict()
    assert running == {
        "id": "resp_1", "object": "response", "created_at": 1700000000, "status": "in_progress", "error": None,
        "incomplete_details": None, "instructions": "be brief", "max_output_tokens": 64, "metadata": {"k": "v"}, "model": "m",
        "output": [answer.to_dict()], "parallel_tool_calls": False, "previous_response_id": "resp_0", "reasoning": {"effort": "low"},
        "store": False, "temperature": 0.5, "tool_choice": "required",
        "tools": [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}], "top_p": 0.9, "usage": None,
    }
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


def test_a_lone_item_is_named_as_the_first_of_the_input_by_default() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_item({"role": "user"})
    assert (caught.value.message, caught.value.param) == ("Missing required field 'content' in input[0].", "input[0].content")


def test_a_named_function_call_output_with_a_call_id_answers_that_call() -> None:
    """Only an output that answers no call (Codex's goal outputs) is carried as opaque context."""

    sent = {"type": "function_call_output", "call_id": "call_1", "name": "read_file", "output": "done"}
    assert parse_item(sent) == FunctionCallOutput("call_1", "done")
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "function_call_output", "name": 5, "output": "done"}, "input[1]")
    assert (caught.value.code, caught.value.param) == (errors.MISSING_REQUIRED_PARAMETER, "input[1].call_id")


def test_reasoning_and_compaction_items_without_a_blob_are_carried_as_sent() -> None:
    assert parse_item({"type": "reasoning", "id": "rs_1", "summary": []}) == OpaqueItem("reasoning", '{"id":"rs_1","summary":[],"type":"reasoning"}')
    assert parse_item({"type": "compaction", "id": "cmp_1"}) == OpaqueItem("compaction", '{"id":"cmp_1","type":"compaction"}')
    assert parse_item({"type": "compaction", "id": "cmp_1", "encrypted_content": 5}) == OpaqueItem(
        "compaction", '{"encrypted_content":5,"id":"cmp_1","type":"compaction"}'
    )


def test_a_compaction_item_of_ours_with_an_id_that_is_not_a_string_is_named_by_its_path() -> None:
    blob = Compaction("cmp_1", "s").encrypted_content
    with pytest.raises(ProtocolError) as caught:
        parse_item({"type": "compaction", "id": 5, "encrypted_content": blob}, "input[1]")
    assert (caught.value.code, caught.value.message, caught.value.param) == (
        errors.INVALID_TYPE, "Invalid type for 'input[1].id': expected a string.", "input[1].id"
    )


def test_an_input_message_goes_back_on_the_wire_as_it_was_sent() -> None:
    sent = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    assert parse_item(sent).to_dict() == sent


def test_an_error_has_its_shape_on_each_transport() -> None:
    error = errors.previous_response_not_found("resp_x")
    fields = {"code": "previous_response_not_found", "message": "Previous response with id 'resp_x' not found.", "param": "previous_response_id"}
    assert error.to_ws_event() == {"type": "error", "status": 400, "error": {"type": "invalid_request_error", **fields}}
    assert error.to_sse_event(7) == {"type": "error", **fields, "sequence_number": 7}
    assert error.to_http_body() == {"error": {"type": "invalid_request_error", **fields}}
