"""The sans-IO protocol core: codec in and out, items, errors. No trio, no sockets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.protocol import codec, errors
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import (
    OutputTextDelta,
    ResponseAppend,
    ResponseCreate,
    ResponseProcessed,
    ResponseSteer,
    SteerFailed,
)
from prototype.protocol.items import FunctionCall, FunctionCallOutput, Message, OpaqueItem


def decode(obj) -> object:
    return codec.decode_client_event(obj if isinstance(obj, (str, bytes)) else json.dumps(obj))


def test_create_is_flat_and_takes_string_input():
    event = decode({"type": "response.create", "model": "gpt-5.4", "input": "hello", "store": False})
    assert isinstance(event, ResponseCreate)
    request = event.request
    assert request.model == "gpt-5.4"
    assert request.input == (Message("user", (("input_text", "hello"),)),)
    assert request.store is False


def test_create_defaults_follow_the_public_api():
    request = decode({"type": "response.create", "model": "gpt-5.4", "input": "x"}).request
    assert request.store is True  # the POST API's default
    assert request.generate is True
    assert request.parallel_tool_calls is True
    assert request.previous_response_id is None


def test_shorthand_messages_stream_and_unknown_keys_are_accepted():
    # openai-agents' frame (docs/protocol.md): shorthand message, stream: true, include, empty tools.
    frame = {
        "type": "response.create", "instructions": "be brief", "model": "gpt-test",
        "input": [{"content": "hello", "role": "user"}], "include": [], "tools": [], "stream": True,
        "client_metadata": {"x": 1}, "prompt_cache_key": "k",
    }
    request = decode(frame).request
    assert request.input == (Message("user", (("input_text", "hello"),)),)
    assert request.extra_keys == ("client_metadata", "prompt_cache_key")  # `include` is acted on
    assert request.include == () and not request.wants_encrypted_reasoning


def test_items_parse_and_round_trip():
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}", "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
    ]
    request = decode({"type": "response.create", "model": "gpt-5.4", "input": items}).request
    message, call, output, parts_output, reasoning = request.input
    assert call == FunctionCall("call_1", "f", "{}", id="fc_1", status="completed")
    assert output == FunctionCallOutput("call_1", "done")
    assert parts_output.output == "ab"
    assert isinstance(reasoning, OpaqueItem) and reasoning.to_dict() == items[4]
    assert message.to_dict() == items[0]
    assert call.to_dict() == items[1]


def test_append_steer_processed():
    append = decode({"type": "response.append", "input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]})
    assert append == ResponseAppend((FunctionCallOutput("c", "o"),))
    steer = decode({"type": "response.steer", "previous_response_id": "resp_1", "input": "go"})
    assert isinstance(steer, ResponseSteer) and steer.previous_response_id == "resp_1"
    assert steer.frame == {"type": "response.steer", "previous_response_id": "resp_1", "input": "go"}
    assert decode({"type": "response.processed", "response_id": "resp_1"}) == ResponseProcessed("resp_1")


def test_binary_frames_are_decoded_as_utf8_json():
    assert isinstance(decode(b'{"type":"response.create","model":"gpt-5.4","input":"x"}'), ResponseCreate)


# (frame, code, param): each bad input has its own code (docs/protocol.md).
BAD_FRAMES = [
    ("not json", errors.INVALID_JSON, None),
    (b"\xff\xfe", errors.INVALID_JSON, None),
    ("[1, 2]", errors.INVALID_JSON, None),
    ('"a string"', errors.INVALID_JSON, None),
    ({"input": "x"}, errors.UNKNOWN_EVENT_TYPE, "type"),
    ({"type": "response.cancel"}, errors.UNKNOWN_EVENT_TYPE, "type"),
    ({"type": 7}, errors.UNKNOWN_EVENT_TYPE, "type"),
    ({"type": "response.create"}, errors.MISSING_REQUIRED_PARAMETER, "input"),
    ({"type": "response.create", "model": "gpt-5.4", "input": []}, errors.EMPTY_INPUT, "input"),
    ({"type": "response.create", "model": "gpt-5.4", "input": 5}, errors.INVALID_TYPE, "input"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [5]}, errors.INVALID_TYPE, "input[0]"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"type": "nope"}]}, errors.INVALID_VALUE, "input[0].type"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"content": "x"}]}, errors.MISSING_REQUIRED_PARAMETER, "input[0].type"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"role": "king", "content": "x"}]}, errors.INVALID_VALUE, "input[0].role"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"role": "user"}]}, errors.MISSING_REQUIRED_PARAMETER, "input[0].content"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, errors.INVALID_VALUE, "input[0].content[0].type"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"type": "function_call_output", "output": "x"}]}, errors.MISSING_REQUIRED_PARAMETER, "input[0].call_id"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"type": "function_call_output", "call_id": "c"}]}, errors.MISSING_REQUIRED_PARAMETER, "input[0].output"),
    ({"type": "response.create", "model": "gpt-5.4", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, errors.INVALID_TYPE, "input[0].arguments"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "store": "yes"}, errors.INVALID_TYPE, "store"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "stream": "true"}, errors.INVALID_TYPE, "stream"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "max_output_tokens": 0}, errors.INTEGER_BELOW_MIN_VALUE, "max_output_tokens"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "max_output_tokens": True}, errors.INVALID_TYPE, "max_output_tokens"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "temperature": "hot"}, errors.INVALID_TYPE, "temperature"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "metadata": {"k": 1}}, errors.INVALID_TYPE, "metadata.k"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, errors.OBJECT_ABOVE_MAX_PROPERTIES, "metadata"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "metadata": "m"}, errors.INVALID_TYPE, "metadata"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "tools": {}}, errors.INVALID_TYPE, "tools"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "tools": [{"type": "function"}]}, errors.MISSING_REQUIRED_PARAMETER, "tools[0].name"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "tools": [{"name": "f"}]}, errors.INVALID_VALUE, "tools[0]"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "background": True}, errors.UNSUPPORTED_PARAMETER, "background"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "stream_id": "a b"}, errors.INVALID_STREAM_ID, "stream_id"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "stream_id": "s" * 257}, errors.INVALID_STREAM_ID, "stream_id"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "stream_id": 7}, errors.INVALID_STREAM_ID, "stream_id"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "stream_id": ""}, errors.INVALID_STREAM_ID, "stream_id"),
    ({"type": "response.inject", "response_id": "r"}, "missing_required_parameter", "input"),
    ({"type": "response.inject", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "missing_required_parameter", "response_id"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "multi_agent": {"max_concurrent_subagents": 2}}, errors.MISSING_REQUIRED_PARAMETER, "multi_agent.enabled"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "multi_agent": {"enabled": True, "max_concurrent_subagents": 0}}, errors.INTEGER_BELOW_MIN_VALUE, "multi_agent.max_concurrent_subagents"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "context_management": [{"type": "compaction", "compact_threshold": 999}]}, errors.INTEGER_BELOW_MIN_VALUE, "context_management[0].compact_threshold"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "context_management": [{"type": "truncation"}]}, errors.INVALID_VALUE, "context_management[0].type"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "context_management": []}, errors.INVALID_TYPE, "context_management"),
    ({"type": "response.create", "model": "gpt-5.4", "input": "x", "conversation": "conv_1"}, errors.UNSUPPORTED_PARAMETER, "conversation"),
    ({"type": "response.append"}, errors.MISSING_REQUIRED_PARAMETER, "input"),
    ({"type": "response.append", "input": {"a": 1}}, errors.INVALID_TYPE, "input"),
    # What the API requires or restricts: a model, a tool type it knows, a tool_choice type it knows (exactly).
    ({"type": "response.create", "input": "x"}, errors.MISSING_REQUIRED_PARAMETER, "model"),
    ({"type": "response.create", "model": "", "input": "x"}, errors.MISSING_REQUIRED_PARAMETER, "model"),
    ({"type": "response.create", "model": 5, "input": "x"}, errors.INVALID_TYPE, "model"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "functon", "name": "f"}]}, errors.INVALID_VALUE, "tools[0].type"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search_previe"}]}, errors.INVALID_VALUE, "tools[0].type"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search_preview"}], "tool_choice": {"type": "web"}},
     errors.INVALID_VALUE, "tool_choice.type"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": ""}},
     errors.INVALID_VALUE, "tool_choice.type"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": 3}},
     errors.INVALID_TYPE, "tool_choice.type"),
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search"}],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_searc"}]}}, errors.INVALID_VALUE, "tool_choice.tools[0].type"),
    # A known type whose tool is not declared: the API's "not found" message.
    ({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "file_search"}},
     errors.INVALID_VALUE, "tool_choice"),
]


@pytest.mark.parametrize(("frame", "code", "param"), BAD_FRAMES)
def test_bad_frames_get_their_own_code(frame, code, param):
    with pytest.raises(ProtocolError) as caught:
        decode(frame)
    assert (caught.value.code, caught.value.param, caught.value.status) == (code, param, 400)
    wire = caught.value.to_ws_event()
    assert wire == {"type": "error", "status": 400, "error": {"type": "invalid_request_error", "code": code, "message": caught.value.message, "param": param}}


ACCEPTED_AT_THE_LIMITS = [
    {"temperature": 0}, {"temperature": 2}, {"temperature": 1.5}, {"top_p": 0}, {"top_p": 1},
    {"max_output_tokens": 16}, {"top_logprobs": 0}, {"top_logprobs": 20}, {"max_tool_calls": 1},
    {"tool_choice": "none"}, {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "name": "read_file"}},
    {"tool_choice": {"type": "web_search"}, "tools": [{"type": "web_search_preview"}]},
    {"tool_choice": {"type": "web_search_preview"}, "tools": [{"type": "web_search"}]},
    {"tool_choice": {"type": "computer_use_preview"}, "tools": [{"type": "computer_use_preview"}]},
    {"tools": [{"type": "mcp", "server_label": "s"}], "tool_choice": {"type": "mcp", "server_label": "s"}},
    {"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "read_file"}]}},
    {"truncation": "auto"}, {"truncation": "disabled"}, {"service_tier": "flex"},
    {"reasoning": {"effort": "xhigh", "summary": "auto"}}, {"text": {"format": {"type": "json_object"}, "verbosity": "low"}},
    {"include": ["reasoning.encrypted_content"]}, {"user": "u"}, {"safety_identifier": "s" * 64},
    {"stream": True, "stream_options": {"include_obfuscation": False}}, {"metadata": {"k" * 64: "v" * 512}},
]


def test_refusals_say_what_the_api_expects():
    with pytest.raises(ProtocolError) as caught:
        decode({"type": "response.create", "input": "x"})
    assert caught.value.message == "Missing required parameter: 'model'."
    with pytest.raises(ProtocolError) as caught:
        decode({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "functon", "name": "f"}]})
    assert caught.value.message.startswith("Invalid value: 'functon'. Supported values are: 'function', 'file_search', ")
    with pytest.raises(ProtocolError) as caught:
        decode({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web"}})
    assert caught.value.message.startswith("Invalid value: 'web'. Supported values are: 'function', 'custom', ")


@pytest.mark.parametrize("fields", ACCEPTED_AT_THE_LIMITS)
def test_values_at_the_limits_are_accepted(fields):
    tools = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
    event = codec.decode_client_event(json.dumps({"type": "response.create", "model": "gpt-5.4", "input": "x", "tools": tools, **fields}))
    assert isinstance(event, ResponseCreate)


def test_a_surrogate_pair_is_valid_unicode_and_a_lone_surrogate_is_not():
    pair = codec.decode_client_event('{"type": "response.create", "model": "gpt-5.4", "input": "smile \\ud83d\\ude00"}')
    assert pair.request.input[0].content == (("input_text", "smile \U0001F600"),)
    for text in ('"\\ud83d"', '"\\ude00\\ud83d"', '"x\\udfff"'):
        with pytest.raises(ProtocolError) as caught:
            codec.decode_client_event('{"type": "response.create", "model": "gpt-5.4", "input": ' + text + "}")
        assert (caught.value.code, caught.value.status) == (errors.INVALID_JSON, 400)
    # A literal backslash before "ud800" is text, not an escape.
    literal = codec.decode_client_event('{"type": "response.create", "model": "gpt-5.4", "input": "\\\\ud800"}')
    assert literal.request.input[0].content == (("input_text", "\\ud800"),)


def test_error_shapes_per_transport():
    error = errors.previous_response_not_found("resp_x")
    assert error.to_ws_event()["error"]["message"] == "Previous response with id 'resp_x' not found."
    assert error.to_sse_event(7) == {"type": "error", "code": "previous_response_not_found", "message": "Previous response with id 'resp_x' not found.", "param": "previous_response_id", "sequence_number": 7}
    assert error.to_http_body() == {"error": {"type": "invalid_request_error", "code": "previous_response_not_found", "message": "Previous response with id 'resp_x' not found.", "param": "previous_response_id"}}


def test_server_events_encode_to_the_wire_shape():
    delta = OutputTextDelta(4, "msg_01", 0, 0, "Hel")
    assert json.loads(codec.encode_event(delta)) == {
        "type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_01", "output_index": 0,
        "content_index": 0, "delta": "Hel", "logprobs": [],
    }
    error = {"type": "invalid_request_error", "code": "response_not_found", "message": "m"}
    steer = SteerFailed(0, {"previous_response_id": "resp_1", "input": "go"}, error).to_dict()
    assert steer == {"type": "response.steer.failed", "sequence_number": 0, "steer": {"previous_response_id": "resp_1", "input": "go"}, "error": error}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["response.create", "response.append", "response.steer", "response.processed", "x"])},
    optional={
        "input": json_values, "model": json_values, "tools": json_values, "metadata": json_values, "store": json_values,
        "previous_response_id": json_values, "generate": json_values, "max_output_tokens": json_values,
        "temperature": json_values, "top_p": json_values, "tool_choice": json_values, "truncation": json_values,
        "reasoning": json_values, "text": json_values, "include": json_values, "top_logprobs": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=50), st.binary(max_size=50), event_like.map(json.dumps), json_values.map(json.dumps)))
def test_decoding_never_raises_anything_but_protocol_error(frame):
    try:
        codec.decode_client_event(frame)
    except ProtocolError as error:
        assert error.code and error.status == 400
