"""The codec (protocol/codec.py): JSON read and written as the standard library does; a frame decoded into its event
or refused with its exact error (docs/protocol.md)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.protocol import codec
from prototype.protocol.errors import INVALID_JSON, MISSING_REQUIRED_PARAMETER, UNKNOWN_EVENT_TYPE, ProtocolError
from prototype.protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer
from prototype.protocol.items import FunctionCallOutput, Message


def refusal(frame: str | bytes | dict, decode=codec.decode_client_event) -> tuple[str, str, str | None]:
    with pytest.raises(ProtocolError) as caught:
        decode(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
    return caught.value.code, caught.value.message, caught.value.param


def as_body(frame: str | bytes) -> dict:
    return codec.loads_object(frame, "request body")


# --- JSON, read and written as the standard library does ------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


def reference_loads(text: str | bytes) -> object:
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return ("ok", json.loads(text))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return ("invalid_json", f"The frame is not valid JSON: {exc}.")


def codec_loads(text: str | bytes) -> object:
    try:
        return ("ok", codec.loads_object(text))
    except ProtocolError as exc:
        assert exc.code == INVALID_JSON
        if exc.message.startswith("The frame must be one JSON object"):
            return ("ok", json.loads(text))  # valid JSON, not an object: the reference parsed it too
        return ("invalid_json", exc.message)


@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_encode_and_loads_read_and_write_as_the_standard_library_does(obj: dict) -> None:
    text = codec.encode(obj)
    assert json.loads(text) == json.loads(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
    assert text.encode("utf-8").decode("utf-8") == text  # plain UTF-8 text, as a text frame carries
    for text in (json.dumps(obj), json.dumps(obj, ensure_ascii=False), json.dumps(obj).encode()):
        assert codec_loads(text) == reference_loads(text)


@given(st.text(alphabet='{}[]":,0123456789.eE+-truefalsnNaIfiy \\u\ud800x', max_size=30) | st.binary(max_size=30))
def test_loads_accepts_and_refuses_what_the_standard_library_does(text: str | bytes) -> None:
    assert codec_loads(text) == reference_loads(text)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_what_orjson_cannot_read_is_read_as_the_standard_library_reads_it(as_bytes: bool) -> None:
    def loads(text: str) -> dict:
        return codec.loads_object(text.encode() if as_bytes else text)

    obj = loads('{"a": NaN, "b": 1e400}')
    assert list(obj) == ["a", "b"] and math.isnan(obj["a"]) and obj["b"] == math.inf
    assert loads('{"a": 1, "a": 2}') == {"a": 2}  # the last duplicate wins in both
    # Integers of 19 or more digits, which orjson would read as floats, are read exactly.
    for number in (2**64, 2**63 + 1, 9999999999999999999, 10**30 + 7):
        obj = loads(json.dumps({"n": number, "s": "x"}))
        assert obj == {"n": number, "s": "x"} and type(obj["n"]) is int
    assert loads('{"s": "1234567890123456789"}') == {"s": "1234567890123456789"}  # a run inside a string: the same
    assert loads('{"n": 123456789012345678}') == {"n": 123456789012345678}  # 18 digits: the fast path, exactly


@pytest.mark.parametrize("frame", ['{"type": "response.create",', b'{"type": "response.create",', '{"n": 12345678901234567890,'])
def test_invalid_json_is_refused_with_the_standard_librarys_error(frame: str | bytes) -> None:
    error = "Expecting property name enclosed in double quotes: line 1 column 28 (char 27)."
    assert refusal(frame) == (INVALID_JSON, f"The frame is not valid JSON: {error}", None)
    assert refusal(frame, as_body)[1] == f"The request body is not valid JSON: {error}"


LONE_SURROGATE = (INVALID_JSON, "The request body is not valid JSON: a string holds a lone surrogate (not valid Unicode).", None)


@pytest.mark.parametrize("frame", [
    '{"type": "response.create", "model": "m", "input": "x", "metadata": {"\\ud800": "v"}}',
    '{"type": "response.create", "model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "\\uDBFF"}]}]}',
    '{"type": "response.create", "model": "m", "input": "x", "include": ["a", "\\udc00"]}',
    '{"type": "response.create", "model": "m", "input": "\\ud83d"}',
    '{"type": "response.create", "model": "m", "input": "\\ude00\\ud83d"}',
    '{"type": "response.create", "model": "m", "input": "x\\udfff"}',
    '{"type": "response.create", "input": "\\ud800", "n": 12345678901234567890}',  # a long digit run: still checked
])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_lone_surrogate_anywhere_in_a_frame_is_invalid_json(frame: str, as_bytes: bool) -> None:
    """In a key, deep in the input, in an array: text or binary frame, the same refusal."""
    assert refusal(frame.encode() if as_bytes else frame) == LONE_SURROGATE


def test_a_surrogate_pair_is_valid_unicode_and_an_escaped_backslash_is_text() -> None:
    pair = codec.decode_client_event('{"type": "response.create", "model": "m", "input": "smile \\ud83d\\ude00"}')
    assert pair.request.input[0].content == (("input_text", "smile \U0001F600"),)
    literal = codec.decode_client_event('{"type": "response.create", "model": "m", "input": "\\\\ud800"}')
    assert literal.request.input[0].content == (("input_text", "\\ud800"),)


def test_a_text_frame_with_a_raw_lone_surrogate_raises_only_protocol_errors() -> None:
    """It cannot arrive in a text frame (valid UTF-8); called directly, the decoder raises only ProtocolError (§5.6)."""
    for frame in ('{"type": "response.create", "model": "m", "input": "a\ud800b"}',
                  '{"type": "response.create", "model": "m", "input": "a\ud800b", "max_output_tokens": 12345678901234567890}'):
        try:
            codec.decode_client_event(frame)
        except ProtocolError as exc:
            assert exc.code == INVALID_JSON


def test_encode_is_compact_utf8_and_writes_what_orjson_refuses_as_the_standard_library_does() -> None:
    assert codec.encode({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'
    assert codec.encode({"n": 2**70, "s": "é"}) == '{"n":1180591620717411303424,"s":"é"}'
    assert codec.encode({1: "x"}) == '{"1":"x"}'  # a non-string key, as the standard library writes it
    # The one documented difference from the standard library, which writes non-JSON NaN.
    assert codec.encode({"a": float("nan"), "b": float("inf")}) == '{"a":null,"b":null}'


# --- frames: each client event, and each frame refused --------------------------------------------------


def test_a_create_frame_is_read_as_a_websocket_body_in_text_or_binary() -> None:
    """`stream_id` (a lane) is accepted on WebSocket only, so the create body is read as one."""
    frame = '{"type": "response.create", "model": "m", "input": "hi", "stream_id": "lane-1.a", "store": false}'
    for event in (codec.decode_client_event(frame), codec.decode_client_event(frame.encode())):
        assert isinstance(event, ResponseCreate)
        assert (event.request.model, event.request.input, event.request.stream_id, event.request.store) == (
            "m", (Message("user", (("input_text", "hi"),)),), "lane-1.a", False)


def test_append_and_steer_frames_carry_what_was_sent() -> None:
    items = [{"type": "function_call_output", "call_id": "call_1", "output": "done"}]
    assert codec.decode_client_event(json.dumps({"type": "response.append", "input": items})) == ResponseAppend(
        (FunctionCallOutput("call_1", "done"),))
    frame = {"type": "response.steer", "previous_response_id": "resp_1", "input": [{"type": "message", "role": "user", "content": "stop"}]}
    steer = codec.decode_client_event(json.dumps(frame))
    assert isinstance(steer, ResponseSteer) and (steer.frame, steer.previous_response_id) == (frame, "resp_1")


@pytest.mark.parametrize(("value", "expected"), [("resp_7", "resp_7"), (7, None), (None, None)])
def test_processed_and_steer_keep_only_a_string_response_id(value, expected) -> None:
    assert codec.decode_client_event(json.dumps({"type": "response.processed", "response_id": value})) == ResponseProcessed(expected)
    assert codec.decode_client_event('{"type": "response.processed"}') == ResponseProcessed(None)
    assert ResponseSteer({"type": "response.steer", "previous_response_id": value}).previous_response_id == expected
    assert ResponseSteer({"type": "response.steer"}).previous_response_id is None


MISSING_TYPE = (UNKNOWN_EVENT_TYPE, "Missing event 'type'.", "type")
MISSING_INPUT = (MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", "input")
FRAME_REFUSALS = [
    pytest.param("not json", (INVALID_JSON, "The frame is not valid JSON: Expecting value: line 1 column 1 (char 0).", None), id="not json"),
    pytest.param('{"type": "response.create", "input": "x", "top_p": 1e999}',
                 ("invalid_type", "Invalid type for 'top_p': expected a finite number.", "top_p"), id="a number past a float's range"),
    pytest.param('"a string"', (INVALID_JSON, "The frame must be one JSON object.", None), id="a string"),
    pytest.param({"input": "x"}, MISSING_TYPE, id="no type"),
    pytest.param({"type": None, "input": "x"}, MISSING_TYPE, id="type null"),
    pytest.param({"TYPE": "response.create", "input": "x"}, MISSING_TYPE, id="TYPE is another key"),
    pytest.param({"type": "response.cancel"}, (UNKNOWN_EVENT_TYPE, "Unknown event type 'response.cancel'.", "type"), id="unknown"),
    pytest.param({"type": 42}, (UNKNOWN_EVENT_TYPE, "Unknown event type '42'.", "type"), id="a number"),
    pytest.param({"type": "x" * 64 + "yz"}, (UNKNOWN_EVENT_TYPE, f"Unknown event type {'x' * 64!r}.", "type"), id="quoted in 64 characters"),
    *(pytest.param({"type": kind, "input": "x"}, (UNKNOWN_EVENT_TYPE, f"Unknown event type {kind!r}.", "type"), id=f"matched exactly: {kind}")
      for kind in ("RESPONSE.CREATE", "Response.Append", "response.steer ", "response.processed.x")),
    pytest.param({"type": "response.append"}, MISSING_INPUT, id="append without input"),
    pytest.param({"type": "response.append", "Input": []}, MISSING_INPUT, id="append with a misspelt key"),
    pytest.param({"type": "response.append", "input": {"a": 1}},
                 ("invalid_type", "Invalid type for 'input': expected a string or an array of items.", "input"), id="append input an object"),
    pytest.param({"type": "response.inject", "response_id": "r"},
                 (MISSING_REQUIRED_PARAMETER, "response.inject needs 'input', a non-empty array of items.", "input"), id="inject without input"),
    pytest.param({"type": "response.inject", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
                 (MISSING_REQUIRED_PARAMETER, "response.inject needs 'response_id', a string.", "response_id"), id="inject without target"),
]


@pytest.mark.parametrize(("frame", "error"), FRAME_REFUSALS)
def test_a_refused_frame_gets_its_code_message_and_param(frame, error) -> None:
    assert refusal(frame) == error


@pytest.mark.parametrize("frame", ["{not json", "", "   \n", '{"type":"response.create","input":"x"} trailing', "{'type': 'response.create'}",
                                   "[" * 20_000, "42", "null", "true", "NaN", b"\xff\xfe", b"\x00\x01\x02", b"[]"])
def test_a_frame_that_is_not_one_json_object_is_invalid_json(frame: str | bytes) -> None:
    assert refusal(frame)[0] == INVALID_JSON


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["response.create", "response.append", "response.steer", "response.processed", "x"])},
    optional={
        "input": json_values, "model": json_values, "tools": json_values, "metadata": json_values, "store": json_values,
        "previous_response_id": json_values, "generate": json_values, "max_output_tokens": json_values,
        "temperature": json_values, "top_p": json_values, "tool_choice": json_values, "truncation": json_values,
        "reasoning": json_values, "text": json_values, "include": json_values, "top_logprobs": json_values})


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=50), st.binary(max_size=50), event_like.map(json.dumps), json_values.map(json.dumps)))
def test_decoding_never_raises_anything_but_protocol_error(frame) -> None:
    try:
        codec.decode_client_event(frame)
    except ProtocolError as error:
        assert error.code and error.status == 400
