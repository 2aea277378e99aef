"""The WebSocket frame decoder, path by path: each event type, each refusal with its exact code,
message and param, and the reading of frames the fast JSON parser hands to the standard library
(docs/protocol.md §4, §5.6). Written against the survivors of the mutation run (docs/mutation.md)."""

from __future__ import annotations

import json
import math

import pytest

from prototype.protocol import codec, errors
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer
from prototype.protocol.items import parse_input


def refusal(frame: str | bytes) -> tuple[str, str, str | None]:
    with pytest.raises(ProtocolError) as caught:
        codec.decode_client_event(frame)
    return caught.value.code, caught.value.message, caught.value.param


def test_create_is_parsed_as_a_websocket_body() -> None:
    """`stream_id` (a lane) is accepted on WebSocket only, so the create body is read as one."""
    event = codec.decode_client_event('{"type": "response.create", "input": "hi", "stream_id": "lane-1.a"}')
    assert isinstance(event, ResponseCreate)
    assert event.request.stream_id == "lane-1.a"
    assert event.request.input == parse_input("hi")
    assert refusal('{"type": "response.create", "input": "hi", "stream_id": "bad lane"}') == (
        errors.INVALID_VALUE, "Invalid 'stream_id': 1 to 256 characters of A-Z, a-z, 0-9, '_', '.', '-'.", "stream_id"
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
    for frame in ('{"type": "response.create", "input": "a\ud800b"}', '{"type": "response.create", "input": "a\ud800b", "n": 12345678901234567890}'):
        try:
            codec.decode_client_event(frame)
        except ProtocolError as exc:
            assert exc.code == errors.INVALID_JSON
