"""A field of the wrong type gets one exact error (protocol/codec.py): code `invalid_type` (the real API's), the
field as `param`, and the message "Invalid type for '<param>': expected <type>." (docs/protocol.md),
on both the POST body and a WebSocket `response.create` frame."""

from __future__ import annotations

import json
import math

import pytest

from prototype.protocol import codec
from prototype.protocol.errors import INVALID_REQUEST_ERROR, INVALID_TYPE, ProtocolError

BODY = {"model": "sim-1000", "input": "hi"}


@pytest.mark.parametrize(
    ("field", "value", "param", "expected"),
    [
        ("model", 5, "model", "a string"),
        ("previous_response_id", ["resp_1"], "previous_response_id", "a string"),
        ("generate", "false", "generate", "a boolean"),
        ("max_output_tokens", 1.5, "max_output_tokens", "an integer"),
        ("max_output_tokens", True, "max_output_tokens", "an integer"),  # a bool is not a number here
        ("temperature", "0.2", "temperature", "a finite number"),
        ("temperature", math.inf, "temperature", "a finite number"),
        ("top_p", math.nan, "top_p", "a finite number"),
        ("tool_choice", 3, "tool_choice", "a string or an object"),
        ("parallel_tool_calls", 1, "parallel_tool_calls", "a boolean"),
        ("store", "yes", "store", "a boolean"),
        ("stream", 0, "stream", "a boolean"),
        ("instructions", {"text": "x"}, "instructions", "a string"),
        ("tools", {"type": "function"}, "tools", "an array"),
        ("metadata", ["a"], "metadata", "an object of string values"),
        ("tools", [{"type": "function", "name": "f", "parameters": "{}"}], "tools[0].parameters", "an object (a JSON schema)"),
    ],
)
def test_a_field_of_the_wrong_type_gets_the_exact_error(field, value, param, expected):
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body({**BODY, field: value})
    error = caught.value
    assert (error.code, error.param, error.status, error.type) == (INVALID_TYPE, param, 400, INVALID_REQUEST_ERROR)
    assert error.message == str(error) == f"Invalid type for '{param}': expected {expected}."


def test_the_websocket_frame_gets_the_same_error():
    frame = json.dumps({"type": "response.create", **BODY, "store": "no"})
    with pytest.raises(ProtocolError) as caught:
        codec.decode_client_event(frame)
    assert caught.value.message == "Invalid type for 'store': expected a boolean."
    assert caught.value.param == "store" and caught.value.code == INVALID_TYPE
