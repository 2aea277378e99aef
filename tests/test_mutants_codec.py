"""The WebSocket frame decoder, path by path: each event type, each refusal with its exact code,
message and param, and the reading of frames the fast JSON parser hands to the standard library
(docs/protocol.md §4, §5.6). Written against the survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import pytest

from prototype.protocol import codec, errors
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer, ToolDef
from prototype.protocol.items import parse_input


def refusal(frame: str | bytes) -> tuple[str, str, str | None]:
    with pytest.raises(ProtocolError) as caught:
        codec.decode_client_event(frame)
    return caught.value.code, caught.value.message, caught.value.param


def test_create_is_parsed_as_a_websocket_body() -> None:
    """`stream_id` (a lane) is accepted on WebSocket only, so the create body is read as one."""
    event = codec.decode_client_event('{"type": "response.create", "model": "m", "input": "hi", "stream_id": "lane-1.a"}')
    assert isinstance(event, ResponseCreate)
    assert event.request.stream_id == "lane-1.a"
    assert event.request.input == parse_input("hi")
    assert refusal('{"type": "response.create", "model": "m", "input": "hi", "stream_id": "bad lane"}') == (
        errors.INVALID_STREAM_ID,
        "The 'stream_id' field must be a non-empty string with at most 256 characters and may only contain letters, "
        "numbers, underscores, hyphens, and periods.",
        "stream_id",
    )


def test_append_carries_its_input_and_refuses_a_frame_without_one() -> None:
    items = [{"type": "function_call_output", "call_id": "call_1", "output": "done"}]
    event = codec.decode_client_event(json.dumps({"type": "response.append", "input": items}))
    assert event == ResponseAppend(parse_input(items))
    assert refusal('{"type": "response.append"}') == (errors.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", "input")
    # The key itself is what is required: a misspelt key is no input.
    assert refusal('{"type": "response.append", "Input": []}') == (errors.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", "input")


def test_steer_keeps_the_frame_as_sent() -> None:
    frame = {"type": "response.steer", "previous_response_id": "resp_1", "input": [{"type": "message", "role": "user", "content": "stop"}]}
    event = codec.decode_client_event(json.dumps(frame))
    assert isinstance(event, ResponseSteer)
    assert event.frame == frame
    assert event.previous_response_id == "resp_1"


@pytest.mark.parametrize(("value", "expected"), [("resp_7", "resp_7"), (7, None), (None, None)])
def test_processed_keeps_only_a_string_response_id(value, expected) -> None:
    event = codec.decode_client_event(json.dumps({"type": "response.processed", "response_id": value}))
    assert event == ResponseProcessed(expected)
    assert codec.decode_client_event('{"type": "response.processed"}') == ResponseProcessed(None)


def test_event_types_are_matched_exactly() -> None:
    for event_type in ("RESPONSE.CREATE", "Response.Append", "response.steer ", "response.processed.x"):
        assert refusal(json.dumps({"type": event_type, "input": "x"})) == (
            errors.UNKNOWN_EVENT_TYPE, f"Unknown event type {event_type!r}.", "type"
        )


def test_a_frame_without_a_type_is_refused_as_such() -> None:
    assert refusal('{"input": "x"}') == (errors.UNKNOWN_EVENT_TYPE, "Missing event 'type'.", "type")
    assert refusal('{"type": null, "input": "x"}') == (errors.UNKNOWN_EVENT_TYPE, "Missing event 'type'.", "type")
    # `TYPE` is another key: the frame still has no type.
    assert refusal('{"TYPE": "response.create", "input": "x"}') == (errors.UNKNOWN_EVENT_TYPE, "Missing event 'type'.", "type")


def test_an_unknown_type_is_quoted_in_at_most_64_characters() -> None:
    long_type = "x" * 64 + "yz"
    assert refusal(json.dumps({"type": long_type})) == (errors.UNKNOWN_EVENT_TYPE, f"Unknown event type {'x' * 64!r}.", "type")
    assert refusal('{"type": 42}') == (errors.UNKNOWN_EVENT_TYPE, "Unknown event type '42'.", "type")


def test_a_frame_that_is_not_an_object_is_refused() -> None:
    assert refusal("[1, 2]") == (errors.INVALID_JSON, "The frame must be one JSON object.", None)
    with pytest.raises(ProtocolError) as caught:
        codec.loads_object(b'"text"', "request body")
    assert (caught.value.code, caught.value.message) == (errors.INVALID_JSON, "The request body must be one JSON object.")


@pytest.mark.parametrize("frame", ['{"type": "response.create",', b'{"type": "response.create",'])
def test_invalid_json_names_the_frame_and_the_parser_error(frame: str | bytes) -> None:
    assert refusal(frame) == (errors.INVALID_JSON, "The frame is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 28 (char 27).", None)
    with pytest.raises(ProtocolError) as caught:
        codec.loads_object(frame, "request body")
    assert caught.value.message == "The request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 28 (char 27)."


@pytest.mark.parametrize("frame", ['{"a": NaN, "b": 1e400}', b'{"a": NaN, "b": 1e400}'])
def test_what_orjson_refuses_is_read_as_the_standard_library_reads_it(frame: str | bytes) -> None:
    obj = codec.loads_object(frame)
    assert list(obj) == ["a", "b"] and math.isnan(obj["a"]) and obj["b"] == math.inf


@pytest.mark.parametrize("as_bytes", [False, True])
def test_integers_of_19_or_more_digits_are_read_exactly(as_bytes: bool) -> None:
    """orjson would read them as floats; the codec hands such frames to the standard library."""
    for number in (2**64, 2**63 + 1, 9999999999999999999, 10**30 + 7):
        text = json.dumps({"n": number, "s": "x"})
        obj = codec.loads_object(text.encode() if as_bytes else text)
        assert obj == {"n": number, "s": "x"} and type(obj["n"]) is int
    # A run of 19 digits inside a string sends the frame the same way; it reads the same.
    assert codec.loads_object('{"s": "1234567890123456789"}') == {"s": "1234567890123456789"}
    # 18 digits stay on the fast path, exactly.
    assert codec.loads_object('{"n": 123456789012345678}') == {"n": 123456789012345678}


def test_an_invalid_frame_with_a_long_digit_run_gets_the_standard_library_error() -> None:
    frame = '{"n": 12345678901234567890,'
    assert refusal(frame) == (errors.INVALID_JSON, "The frame is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 28 (char 27).", None)


def test_a_long_digit_run_still_gets_the_unicode_check() -> None:
    frame = '{"type": "response.create", "input": "\\ud800", "n": 12345678901234567890}'
    assert refusal(frame) == (errors.INVALID_JSON, "The request body is not valid JSON: a string holds a lone surrogate (not valid Unicode).", None)


def test_a_text_frame_with_a_raw_lone_surrogate_raises_only_protocol_errors() -> None:
    """A WebSocket text frame is valid UTF-8, so a raw lone surrogate cannot arrive that way; called
    directly, the decoder still raises nothing but ProtocolError (docs/protocol.md §5.6)."""
    for frame in ('{"type": "response.create", "model": "m", "input": "a\ud800b"}', '{"type": "response.create", "model": "m", "input": "a\ud800b", "max_output_tokens": 12345678901234567890}'):
        try:
            codec.decode_client_event(frame)
        except ProtocolError as exc:
            assert exc.code == errors.INVALID_JSON


# --- the create body, field by field ----------------------------------------------------------------


@attrs.frozen
class Refused:
    name: str
    body: Any
    error: tuple[str, str, str | None]
    websocket: bool = False


REFUSED = [
    Refused('not an object', ['x'], ('invalid_json', 'The request body must be a JSON object.', None)),
    Refused('background', {'input': 'x', 'background': True}, ('unsupported_parameter', "'background' is not supported in this mode.", 'background')),
    Refused('conversation ws', {'input': 'x', 'conversation': 'c'}, ('unsupported_parameter', "'conversation' is not supported by this server.", 'conversation'), websocket=True),
    Refused('prompt ws', {'input': 'x', 'prompt': {'id': 'p'}}, ('unsupported_parameter', "'prompt' is not supported by this server.", 'prompt'), websocket=True),
    Refused('stream_id http', {'input': 'x', 'stream_id': 'lane'}, ('unsupported_parameter', "'stream_id' is not supported by this server.", 'stream_id')),
    Refused('conversation http', {'input': 'x', 'conversation': 'c'}, ('unsupported_parameter', "'conversation' is not supported by this server.", 'conversation')),
    Refused('prompt http', {'input': 'x', 'prompt': {'id': 'p'}}, ('unsupported_parameter', "'prompt' is not supported by this server.", 'prompt')),
    Refused('bad stream_id ws', {'input': 'x', 'stream_id': 5}, ('invalid_stream_id', "The 'stream_id' field must be a non-empty string with at most 256 characters and may only contain letters, numbers, underscores, hyphens, and periods.", 'stream_id'), websocket=True),
    Refused('model type', {'input': 'x', 'model': 5}, ('invalid_type', "Invalid type for 'model': expected a string.", 'model')),
    Refused('model bool', {'input': 'x', 'model': True}, ('invalid_type', "Invalid type for 'model': expected a string.", 'model')),
    Refused('previous type', {'input': 'x', 'previous_response_id': 5}, ('invalid_type', "Invalid type for 'previous_response_id': expected a string.", 'previous_response_id')),
    Refused('generate type', {'input': 'x', 'generate': 'no'}, ('invalid_type', "Invalid type for 'generate': expected a boolean.", 'generate')),
    Refused('generate number', {'input': 'x', 'generate': 0}, ('invalid_type', "Invalid type for 'generate': expected a boolean.", 'generate')),
    Refused('no input', {}, ('missing_required_parameter', "Missing required parameter: 'input'.", 'input')),
    Refused('null input', {'input': None}, ('missing_required_parameter', "Missing required parameter: 'input'.", 'input')),
    Refused('empty input', {'input': []}, ('empty_input', "'input' must not be empty without 'previous_response_id'.", 'input')),
    Refused('tools type', {'input': 'x', 'tools': {}}, ('invalid_type', "Invalid type for 'tools': expected an array.", 'tools')),
    Refused('tool not object', {'input': 'x', 'tools': [{'type': 'function', 'name': 'read_file', 'parameters': {'type': 'object'}}, 5]}, ('invalid_value', "Invalid tool at 'tools[1]': expected an object with a 'type'.", 'tools[1]')),
    Refused('tool no type', {'input': 'x', 'tools': [{'name': 'a'}]}, ('invalid_value', "Invalid tool at 'tools[0]': expected an object with a 'type'.", 'tools[0]')),
    Refused('tool type not str', {'input': 'x', 'tools': [{'type': 1}]}, ('invalid_value', "Invalid tool at 'tools[0]': expected an object with a 'type'.", 'tools[0]')),
    Refused('function no name', {'input': 'x', 'tools': [{'type': 'function', 'name': 'read_file', 'parameters': {'type': 'object'}}, {'type': 'function'}]}, ('missing_required_parameter', "Missing required parameter: 'tools[1].name'.", 'tools[1].name')),
    Refused('function name type', {'input': 'x', 'tools': [{'type': 'function', 'name': 5}]}, ('invalid_type', "Invalid type for 'tools[0].name': expected a string.", 'tools[0].name')),
    Refused('function bad name', {'input': 'x', 'tools': [{'type': 'function', 'name': 'a b'}]}, ('invalid_value', "Invalid 'tools[0].name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$' of at most 64 characters.", 'tools[0].name')),
    Refused('function params type', {'input': 'x', 'tools': [{'type': 'function', 'name': 'a', 'parameters': []}]}, ('invalid_type', "Invalid type for 'tools[0].parameters': expected an object (a JSON schema).", 'tools[0].parameters')),
    Refused('metadata type', {'input': 'x', 'metadata': []}, ('invalid_type', "Invalid type for 'metadata': expected an object of string values.", 'metadata')),
    Refused('metadata too many', {'input': 'x', 'metadata': {'0': 'v', '1': 'v', '2': 'v', '3': 'v', '4': 'v', '5': 'v', '6': 'v', '7': 'v', '8': 'v', '9': 'v', '10': 'v', '11': 'v', '12': 'v', '13': 'v', '14': 'v', '15': 'v', '16': 'v'}}, ('object_above_max_properties', "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with 17 properties instead.", 'metadata')),
    Refused('metadata value type', {'input': 'x', 'metadata': {'k': 1}}, ('invalid_type', "Invalid type for 'metadata.k': expected a string.", 'metadata.k')),
    Refused('metadata key long', {'input': 'x', 'metadata': {'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk': 'v'}}, ('string_above_max_length', "Invalid metadata entry 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk': keys up to 64 characters, string values up to 512.", 'metadata.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk')),
    Refused('metadata value long', {'input': 'x', 'metadata': {'k': 'vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv'}}, ('string_above_max_length', "Invalid metadata entry 'k': keys up to 64 characters, string values up to 512.", 'metadata.k')),
    Refused('parallel type', {'input': 'x', 'parallel_tool_calls': 1}, ('invalid_type', "Invalid type for 'parallel_tool_calls': expected a boolean.", 'parallel_tool_calls')),
    Refused('store type', {'input': 'x', 'store': 'yes'}, ('invalid_type', "Invalid type for 'store': expected a boolean.", 'store')),
    Refused('stream type', {'input': 'x', 'stream': 1}, ('invalid_type', "Invalid type for 'stream': expected a boolean.", 'stream')),
    Refused('instructions type', {'input': 'x', 'instructions': 1}, ('invalid_type', "Invalid type for 'instructions': expected a string.", 'instructions')),
    Refused('include type', {'input': 'x', 'include': 'a'}, ('invalid_type', "Invalid type for 'include': expected an array of strings.", 'include')),
    Refused('include items', {'input': 'x', 'include': ['a', 1]}, ('invalid_type', "Invalid type for 'include': expected an array of strings.", 'include')),
    Refused('reasoning type', {'input': 'x', 'reasoning': 'high'}, ('invalid_type', "Invalid type for 'reasoning': expected an object.", 'reasoning')),
    Refused('tool_choice unknown', {'input': 'x', 'tool_choice': {'type': 'function', 'name': 'nope'}}, ('invalid_value', "Tool choice 'nope' not found in 'tools' parameter.", 'tool_choice')),
    Refused('multi_agent type', {'model': 'm', 'input': 'x', 'multi_agent': 'x'}, ('invalid_type', "Invalid type for 'multi_agent': expected an object.", 'multi_agent')),
    Refused('multi_agent no enabled', {'model': 'm', 'input': 'x', 'multi_agent': {}}, ('missing_required_parameter', "Missing required parameter: 'multi_agent.enabled'.", 'multi_agent.enabled')),
    Refused('multi_agent enabled type', {'model': 'm', 'input': 'x', 'multi_agent': {'enabled': 1}}, ('invalid_type', "Invalid type for 'multi_agent.enabled': expected a boolean.", 'multi_agent.enabled')),
    Refused('subagents bool', {'model': 'm', 'input': 'x', 'multi_agent': {'enabled': True, 'max_concurrent_subagents': True}}, ('invalid_type', "Invalid type for 'multi_agent.max_concurrent_subagents': expected an integer.", 'multi_agent.max_concurrent_subagents')),
    Refused('subagents float', {'model': 'm', 'input': 'x', 'multi_agent': {'enabled': True, 'max_concurrent_subagents': 2.0}}, ('invalid_type', "Invalid type for 'multi_agent.max_concurrent_subagents': expected an integer.", 'multi_agent.max_concurrent_subagents')),
    Refused('subagents low', {'model': 'm', 'input': 'x', 'multi_agent': {'enabled': True, 'max_concurrent_subagents': 0}}, ('integer_below_min_value', "Invalid 'multi_agent.max_concurrent_subagents': integer below minimum value 1.", 'multi_agent.max_concurrent_subagents')),
    Refused('context_management type', {'model': 'm', 'input': 'x', 'context_management': {}}, ('invalid_type', "Invalid type for 'context_management': expected a non-empty array of objects.", 'context_management')),
    Refused('context_management empty', {'model': 'm', 'input': 'x', 'context_management': []}, ('invalid_type', "Invalid type for 'context_management': expected a non-empty array of objects.", 'context_management')),
    Refused('context_management entry type', {'model': 'm', 'input': 'x', 'context_management': [{'type': 'compaction'}, 5]}, ('invalid_type', "Invalid type for 'context_management[1]': expected an object.", 'context_management[1]')),
    Refused('context_management entry kind', {'model': 'm', 'input': 'x', 'context_management': [{}]}, ('invalid_value', "Invalid 'context_management[0].type': only 'compaction' is supported.", 'context_management[0].type')),
    Refused('compact_threshold string', {'model': 'm', 'input': 'x', 'context_management': [{'type': 'compaction', 'compact_threshold': '1000'}]}, ('invalid_type', "Invalid type for 'context_management[0].compact_threshold': expected an integer.", 'context_management[0].compact_threshold')),
    Refused('compact_threshold bool', {'model': 'm', 'input': 'x', 'context_management': [{'type': 'compaction', 'compact_threshold': True}]}, ('invalid_type', "Invalid type for 'context_management[0].compact_threshold': expected an integer.", 'context_management[0].compact_threshold')),
    Refused('compact_threshold low', {'model': 'm', 'input': 'x', 'context_management': [{'type': 'compaction'}, {'type': 'compaction', 'compact_threshold': 999}]}, ('integer_below_min_value', "Invalid 'context_management[1].compact_threshold': integer below minimum value 1000.", 'context_management[1].compact_threshold')),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda case: case.name)
def test_a_refused_body_gets_its_code_message_and_param(case: Refused) -> None:
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body(case.body, websocket=case.websocket)
    assert (caught.value.code, caught.value.message, caught.value.param) == case.error


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "input": "x", "background": False},
        {"model": "m", "previous_response_id": "resp_1"},
        {"model": "m", "previous_response_id": "resp_1", "input": []},
        {"model": "m", "generate": False},
        {"model": "m", "generate": False, "input": None},
        {"model": "m", "input": "x", "metadata": {str(i): "v" for i in range(16)}},
        {"model": "m", "input": "x", "metadata": {"k" * 64: "v" * 512}},
        {"model": "m", "input": "x", "conversation": None, "prompt": None, "stream_id": None},
    ],
)
def test_bodies_at_the_limits_are_accepted(body: dict[str, Any]) -> None:
    request = codec.parse_create_body(body)
    assert request.metadata == body.get("metadata", {})
    assert request.input == (parse_input(body["input"]) if body.get("input") is not None else ())


def test_a_body_is_read_as_a_post_body_unless_told_otherwise() -> None:
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body({"input": "x", "stream_id": "lane-1"})
    assert (caught.value.code, caught.value.param) == (errors.UNSUPPORTED_PARAMETER, "stream_id")


def test_defaults_of_a_minimal_body() -> None:
    request = codec.parse_create_body({"model": "m", "input": "hi"})
    assert (request.model, request.input, request.instructions, request.tools) == ("m", parse_input("hi"), None, ())
    assert (request.tool_choice, request.parallel_tool_calls, request.previous_response_id) == ("auto", True, None)
    assert (request.store, request.generate, request.max_output_tokens, request.metadata) == (True, True, None, {})
    assert (request.temperature, request.top_p, request.stream, request.stream_id) == (None, None, False, None)
    assert (request.extra_keys, request.include, request.reasoning) == ((), (), None)
    # Explicit nulls are the defaults too.
    nulls = {key: None for key in ("tools", "tool_choice", "parallel_tool_calls", "store", "stream", "generate", "metadata", "include")}
    assert codec.parse_create_body({"model": "m", "input": "hi", **nulls}) == request


@pytest.mark.parametrize("model", [None, ""])
def test_a_body_without_a_model_is_refused_after_its_other_faults(model: str | None) -> None:
    body = {"input": "hi", **({} if model is None else {"model": model})}
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body(body)
    assert (caught.value.code, caught.value.message, caught.value.param) == (
        errors.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'model'.", "model")
    with pytest.raises(ProtocolError) as caught:  # every other check comes first, the metadata's included
        codec.parse_create_body({**body, "metadata": {"k": 1}})
    assert caught.value.param == "metadata.k"
    # multi_agent and context_management too (they were read after the model's check, so a body without a
    # model was refused for it whatever else was wrong).
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body({**body, "multi_agent": {}})
    assert caught.value.param == "multi_agent.enabled"
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body({**body, "context_management": []})
    assert caught.value.param == "context_management"


def test_every_field_of_a_full_body_is_kept() -> None:
    function = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
    hosted = {"type": "web_search"}
    body = {
        "model": "sim-100", "input": [{"type": "message", "role": "user", "content": "hi"}], "instructions": "be brief",
        "tools": [function, hosted], "tool_choice": "required", "parallel_tool_calls": False,
        "previous_response_id": "resp_1", "store": False, "generate": False, "max_output_tokens": 64,
        "metadata": {"k": "v"}, "temperature": 0.5, "top_p": 0.25, "stream": True, "stream_id": "lane-2",
        "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}, "user": "u", "truncation": "auto",
    }
    request = codec.parse_create_body(body, websocket=True)
    assert request.model == "sim-100" and request.input == parse_input(body["input"]) and request.instructions == "be brief"
    assert request.tools == (ToolDef("function", "read_file", {"type": "object"}, function), ToolDef("web_search", None, None, hosted))
    assert (request.tool_choice, request.parallel_tool_calls, request.previous_response_id) == ("required", False, "resp_1")
    assert (request.store, request.generate, request.max_output_tokens, request.metadata) == (False, False, 64, {"k": "v"})
    assert (request.temperature, request.top_p, request.stream, request.stream_id) == (0.5, 0.25, True, "lane-2")
    assert (request.extra_keys, request.include, request.reasoning) == (("truncation", "user"), ("reasoning.encrypted_content",), {"effort": "low"})
    # Over HTTP the same body without the lane reads the same, with no stream_id.
    http = codec.parse_create_body({key: value for key, value in body.items() if key != "stream_id"})
    assert http == attrs.evolve(request, stream_id=None)


def test_a_non_function_tool_keeps_a_name_only_if_it_is_a_string() -> None:
    (tool,) = codec.parse_create_body({"model": "m", "input": "x", "tools": [{"type": "custom", "name": 5}]}).tools
    assert (tool.type, tool.name, tool.parameters) == ("custom", None, None)
    (tool,) = codec.parse_create_body({"model": "m", "input": "x", "tools": [{"type": "custom", "name": "grammar"}]}).tools
    assert tool.name == "grammar"


def test_encode_is_compact_and_keeps_non_ascii_and_big_integers() -> None:
    assert codec.encode({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'
    assert codec.encode({"n": 2**70}) == '{"n":1180591620717411303424}'
    assert codec.encode({1: "x"}) == '{"1":"x"}'


@pytest.mark.parametrize(
    ("entries", "threshold"),
    [
        (None, None),
        ([{"type": "compaction"}], codec.DEFAULT_COMPACT_THRESHOLD),
        ([{"type": "compaction", "compact_threshold": None}], codec.DEFAULT_COMPACT_THRESHOLD),
        ([{"type": "compaction", "compact_threshold": 1000}], 1000),
        ([{"type": "compaction", "compact_threshold": 5000}, {"type": "compaction", "compact_threshold": 2000}, {"type": "compaction"}], 2000),
    ],
)
def test_the_compact_threshold_is_the_least_of_the_entries(entries: list[dict[str, Any]] | None, threshold: int | None) -> None:
    """`context_management`: each entry's threshold, the default where it names none; the least wins."""
    assert codec.parse_create_body({"model": "m", "input": "x", "context_management": entries}).compact_threshold == threshold
