"""Tests of prototype.client.sse, the strict SSE parser the harness reads HTTP streams with.

Rules every test here follows:

* Sans-IO: bytes in, events out, no trio and no sockets.
* A valid stream is built from the server's own encoder (`prototype.server.http.sse_block`), so
  what the parser accepts is exactly what the server sends.
* Every rejection is asserted by the error's wording, so a test fails if the parser refuses a
  stream for the wrong reason.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.client.sse import SseProtocolError, StrictSseParser, parse_stream
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.server.http import sse_block, sse_error_block

RESPONSE = {"id": "resp_1", "object": "response", "status": "completed", "output": []}


def text_turn(deltas: list[str] = ["Hel", "lo"]) -> list[object]:  # noqa: B006 - never mutated
    """The events of docs/protocol.md, numbered from 0."""
    events: list[object] = [ev.ResponseCreated(0, {**RESPONSE, "status": "in_progress"}), ev.ResponseInProgress(1, RESPONSE)]
    events.append(ev.OutputItemAdded(2, 0, {"id": "msg_1", "type": "message"}))
    for delta in deltas:
        events.append(ev.OutputTextDelta(len(events), "msg_1", 0, 0, delta))
    events.append(ev.OutputTextDone(len(events), "msg_1", 0, 0, "".join(deltas)))
    events.append(ev.OutputItemDone(len(events), 0, {"id": "msg_1", "type": "message"}))
    events.append(ev.ResponseCompleted(len(events), RESPONSE))
    return events


def body_of(events: list[object]) -> bytes:
    return b"".join(sse_block(event) for event in events)


def test_a_well_formed_stream_parses_to_its_events() -> None:
    events = text_turn()
    parsed = parse_stream(body_of(events))
    assert [p.type for p in parsed] == [e.type for e in events]
    assert [p.data for p in parsed] == [json.loads(json.dumps(e.to_dict())) for e in events]
    assert [p.size for p in parsed] == [len(sse_block(e)) for e in events]


def test_the_block_is_event_line_data_line_blank_line() -> None:
    block = sse_block(ev.OutputTextDelta(4, "msg_01", 0, 0, "Hi"))
    assert block == (
        b'event: response.output_text.delta\n'
        b'data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_01","output_index":0,'
        b'"content_index":0,"delta":"Hi","logprobs":[]}\n\n'
    )


def test_a_flat_error_event_ends_a_stream() -> None:
    events = text_turn()[:3]
    body = body_of(events) + sse_error_block(ProtocolError("server_error", "boom", status=500), 3)
    parsed = parse_stream(body)
    assert parsed[-1].type == "error"
    assert parsed[-1].data == {"type": "error", "code": "server_error", "message": "boom", "param": None, "sequence_number": 3}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    body = body_of(text_turn(data.draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6))))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
    parser = StrictSseParser()
    parsed = []
    for start, end in zip([0, *cuts], [*cuts, len(body)]):
        parsed.extend(parser.feed(body[start:end]))
    parser.close()
    assert parsed == parse_stream(body)


COMPLETED = sse_block(ev.ResponseCompleted(0, RESPONSE))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b": keep-alive comment\n\n" + COMPLETED, "not an event:, data: or blank line"),
        (b"id: 7\n" + COMPLETED, "not an event:, data: or blank line"),
        (b"retry: 1000\n" + COMPLETED, "not an event:, data: or blank line"),
        (b'event: response.created\ndata: {"type":"response.completed","sequence_number":0}\n\n', "differs from data.type"),
        (COMPLETED + b"data: [DONE]\n\n", "after the end event"),
        (b"event: response.completed\ndata: [DONE]\n\n", "[DONE]"),
        (COMPLETED[:-1], "without the blank line"),
        (COMPLETED[:-2], "ends inside a line"),
        (COMPLETED.replace(b"\n", b"\r\n"), "carriage return"),
        (b'data: {"type":"x","sequence_number":0}\n\n', "before the block's event: line"),
        (COMPLETED.replace(b"\n\n", b"\ndata: {}\n\n"), "a second data: line"),
        (b"\n" + COMPLETED, "a blank line outside a block"),
        (b"event: response.completed\n\n", "has no data: line"),
        (b"event: response.completed\nevent: response.completed\n", "an event: line inside a block"),
        (b"event: response.completed\ndata: {not json}\n\n", "not JSON"),
        (b"event: response.completed\ndata: [1, 2]\n\n", "not a JSON object"),
        (b"event: \ndata: {}\n\n", "bad event name"),
        (sse_block(ev.ResponseCompleted(3, RESPONSE)), "sequence_number 3, expected 0"),
        (sse_block(ev.ResponseCreated(0, RESPONSE)), "before an end event"),
        (b"event: response.completed\ndata: \xff\n\n", "invalid UTF-8"),
        (b"event:response.completed\n" + COMPLETED, "not an event:, data: or blank line"),
        (COMPLETED + COMPLETED, "after the end event"),
    ],
)
def test_what_the_server_never_sends_is_refused(body: bytes, reason: str) -> None:
    with pytest.raises(SseProtocolError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        parse_stream(body)


def test_a_stream_may_be_checked_without_an_end_event() -> None:
    parse_stream(sse_block(ev.ResponseCreated(0, RESPONSE)), require_end=False)
