"""The codec's JSON (orjson, with the standard library as the reference) reads and writes exactly
what the standard library would: same values, same acceptance, same error text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prototype.protocol import codec
from prototype.protocol.errors import INVALID_JSON, ProtocolError

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
def test_encode_reads_back_as_the_standard_library_writes(obj: dict) -> None:
    text = codec.encode(obj)
    assert json.loads(text) == json.loads(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
    assert text.encode("utf-8").decode("utf-8") == text  # plain UTF-8 text, as a text frame carries


@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_loads_reads_what_the_standard_library_reads(obj: dict) -> None:
    for text in (json.dumps(obj), json.dumps(obj, ensure_ascii=False), json.dumps(obj).encode()):
        assert codec_loads(text) == reference_loads(text)


@given(st.text(alphabet='{}[]":,0123456789.eE+-truefalsnNaIfiy \\u\ud800x', max_size=30) | st.binary(max_size=30))
def test_loads_accepts_and_refuses_what_the_standard_library_does(text: str | bytes) -> None:
    assert codec_loads(text) == reference_loads(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": NaN}', None),  # the standard library reads NaN; orjson does not
        ('{"a": 123456789012345678901234567890}', 123456789012345678901234567890),
        ('{"a": 1, "a": 2}', 2),  # the last duplicate wins in both
        ('{"a": 1e400}', float("inf")),
    ],
)
def test_loads_edge_values(text: str, value: object) -> None:
    got = codec.loads_object(text)["a"]
    if value is None:
        assert got != got  # NaN
    else:
        assert got == value


def test_encode_falls_back_for_what_orjson_refuses() -> None:
    assert codec.encode({"n": 2**70, "s": "é"}) == '{"n":1180591620717411303424,"s":"é"}'
    assert codec.encode({1: "x"}) == '{"1":"x"}'  # a non-string key, as the standard library writes it


def test_encode_writes_non_finite_floats_as_null():
    """The one documented difference from the standard library, which writes non-JSON NaN."""
    assert codec.encode({"a": float("nan"), "b": float("inf")}) == '{"a":null,"b":null}'
