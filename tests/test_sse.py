"""The strict SSE parser (prototype/client/sse.py), fed the server's own encoder's blocks; each refusal by its exact words."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.client.sse import SseEvent, SseProtocolError, StrictSseParser, parse_stream
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
    assert ([p.type for p in parsed], [p.data for p in parsed], [p.size for p in parsed]) == (
        [e.type for e in events], [json.loads(json.dumps(e.to_dict())) for e in events], [len(sse_block(e)) for e in events])


def test_a_flat_error_event_ends_a_stream() -> None:
    parsed = parse_stream(body_of(text_turn()[:3]) + sse_error_block(ProtocolError("server_error", "boom", status=500), 3))
    assert (parsed[-1].type, parsed[-1].data) == (
        "error", {"type": "error", "code": "server_error", "message": "boom", "param": None, "sequence_number": 3})


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    body = body_of(text_turn(data.draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6))))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
    parser = StrictSseParser()
    parsed = [event for start, end in zip([0, *cuts], [*cuts, len(body)]) for event in parser.feed(body[start:end])]
    parser.close()
    assert parsed == parse_stream(body)


COMPLETED = sse_block(ev.ResponseCompleted(0, RESPONSE))
NOT_A_LINE = "SSE line 1: not an event:, data: or blank line: "


def test_a_stream_may_be_checked_without_an_end_event() -> None:
    parse_stream(sse_block(ev.ResponseCreated(0, RESPONSE)), require_end=False)


# --- what the server never sends: each refusal's exact words, and the parser's counts across feeds ---------------

LONG_NAME = "x" * 100


def created(sequence: int) -> bytes:
    return sse_block(ev.ResponseCreated(sequence, {**RESPONSE, "status": "in_progress"}))


@pytest.mark.parametrize(("body", "message"), [
    (b": " + LONG_NAME.encode() + b"\n", NOT_A_LINE + "b': " + "x" * 78 + "'"),  # a comment, as a keep-alive
    (b"id: 7\n" + COMPLETED, NOT_A_LINE + "b'id: 7'"),
    (b"retry: 1000\n" + COMPLETED, NOT_A_LINE + "b'retry: 1000'"),
    (b"event:response.completed\n" + COMPLETED, NOT_A_LINE + "b'event:response.completed'"),
    (COMPLETED + b"data: [DONE]\n\n", "SSE line 4: data after the end event: b'data: [DONE]'"),
    (COMPLETED + COMPLETED, "SSE line 4: data after the end event: b'event: response.completed'"),
    (b"event: \ndata: {}\n\n", "SSE line 1: bad event name ''"),
    (b"event: response.completed\ndata: [DONE]\n\n", "SSE line 2: a [DONE] sentinel; the stream must end after its end event"),
    (COMPLETED + b"data: " + LONG_NAME.encode() + b"\n", "SSE line 4: data after the end event: b'data: " + "x" * 74 + "'"),
    (COMPLETED[:-2] + LONG_NAME.encode(),
     "SSE line 2: the body ends inside a line: " + repr(COMPLETED.split(b"\n")[1][:80])),
    (b"event: response.completed\n", "SSE line 1: the body ends without the blank line that terminates the last event"),
    (created(0), "SSE line 3: the body ends before an end event (response.completed, .failed, .incomplete, error)"),
    (b"event: response.created\ndata: {}\n\n", "SSE line 2: event: 'response.created' differs from data.type None"),
    (b'event: response.created\ndata: {"type":"response.completed"}\n\n',
     "SSE line 2: event: 'response.created' differs from data.type 'response.completed'"),
    (b"event:  response.completed\n", "SSE line 1: bad event name ' response.completed'"),
    (b"event: response.completed \n", "SSE line 1: bad event name 'response.completed '"),
    (b'event: response.completed\ndata:  [DONE] \n\n', "SSE line 2: a [DONE] sentinel; the stream must end after its end event"),
    (b"event: x\ndata: " + json.dumps({"type": "x", "sequence_number": 1}).encode() + b"\n\n",
     "SSE line 3: sequence_number 1, expected 0"),
    (b"event: x\ndata: " + json.dumps({"type": "x"}).encode() + b"\n\n", "SSE line 3: sequence_number None, expected 0"),
    (created(0) + created(2), "SSE line 6: sequence_number 2, expected 1"),
    (COMPLETED.replace(b"\n", b"\r\n"), "SSE line 1: a carriage return; lines must end with \\n only"),
    (b"event: x\nevent: x\n", "SSE line 2: an event: line inside a block (missing blank line?)"),
    (b"data: {}\n", "SSE line 1: a data: line before the block's event: line"),
    (COMPLETED.replace(b"\n\n", b"\ndata: {}\n\n"), "SSE line 3: a second data: line in one block"),
    (b"event: x\ndata: {not json}\n\n",
     "SSE line 2: data is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"event: x\ndata: [1, 2]\n\n", "SSE line 2: data is not a JSON object"),
    (b"\n", "SSE line 1: a blank line outside a block"),
    (b"event: x\n\n", "SSE line 2: event 'x' has no data: line"),
    (b"event: x\ndata: \xff\n\n", "SSE line 2: invalid UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    (b"event: \xfe\n", "SSE line 1: invalid UTF-8: 'utf-8' codec can't decode byte 0xfe in position 0: invalid start byte"),
    (b"event: response.completed\ndata: {\"type\": \"response.completed\", \"sequence_number\": 0}\n\n\n",
     "SSE line 4: data after the end event: b''"),
])
def test_what_the_server_never_sends_is_refused_naming_its_line_and_what_it_saw(body: bytes, message: str) -> None:
    with pytest.raises(SseProtocolError) as refused:
        parse_stream(body)
    assert str(refused.value) == message


def test_the_parser_counts_sequence_numbers_sizes_and_the_end_across_feeds() -> None:
    parser = StrictSseParser()
    first, second = created(0), created(1)
    assert parser.feed(first[:5]) == [] and parser.feed(first[5:] + second[:-1]) == [
        SseEvent("response.created", json.loads(first.split(b"\n")[1][len(b"data: "):]), len(first))]
    assert (parser.next_sequence, parser.ended) == (1, False)
    with pytest.raises(SseProtocolError, match="^SSE line 5: the body ends without the blank line"):
        parser.close()
    [event] = parser.feed(b"\n")
    assert (event.type, event.size, parser.next_sequence, parser.ended) == ("response.created", len(second), 2, False)
    parser.close(require_end=False)
    with pytest.raises(SseProtocolError, match=r"^SSE line 6: the body ends before an end event"):
        parser.close()
    end = sse_block(ev.ResponseCompleted(2, RESPONSE))
    [event] = parser.feed(end)
    assert (event.type, event.size, parser.next_sequence, parser.ended) == ("response.completed", len(end), 3, True)
    parser.close()


@pytest.mark.parametrize("end_type", ["response.completed", "response.failed", "response.incomplete", "response.cancelled", "error"])
def test_every_end_type_ends_the_stream(end_type: str) -> None:
    block = b"event: " + end_type.encode() + b"\ndata: " + json.dumps({"type": end_type, "sequence_number": 0}).encode() + b"\n\n"
    assert [event.type for event in parse_stream(block)] == [end_type]
