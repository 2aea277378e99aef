"""A strict parser of the server's SSE streams (docs/protocol.md), sans-IO: bytes in, events out.

General SSE clients are lenient (comments, `id:`, `retry:`, multi-line data, a missing final blank
line, `data: [DONE]`); this one accepts exactly what the server promises to send, so a test that
streams through it checks the framing:

* every event is one block: `event: <type>`, `data: <one JSON object>`, a blank line; lines end
  with `\\n` only and are valid UTF-8;
* `event:` equals the data's `type`; no `[DONE]` sentinel;
* `sequence_number` starts at 0 and goes up by one per event of the stream;
* the stream ends after one end event (`response.completed`, `.failed`, `.incomplete`, or a flat
  `error`), and nothing follows it; the body must end on a blank line.

Anything else raises `SseProtocolError` naming the line.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..protocol.events import TERMINAL_TYPES

END_TYPES = TERMINAL_TYPES | {"error"}
_EVENT = b"event: "
_DATA = b"data: "


class SseProtocolError(Exception):
    """The stream broke the framing the server promises."""


@attrs.frozen
class SseEvent:
    """One parsed block: the event type, the data object, and the block's size in bytes."""

    type: str
    data: dict[str, Any]
    size: int


@attrs.define(eq=False)
class StrictSseParser:
    """Feed body bytes as they arrive with `feed`; call `close` when the body ends."""

    _buffer: bytearray = attrs.Factory(bytearray)
    _event: str | None = None
    _data: dict[str, Any] | None = None
    _block_size: int = 0
    _line: int = 0
    next_sequence: int = 0
    ended: bool = False  # an end event has been parsed

    def _fail(self, message: str) -> SseProtocolError:
        return SseProtocolError(f"SSE line {self._line}: {message}")

    def feed(self, data: bytes | bytearray) -> list[SseEvent]:
        """The events completed by `data`, in order."""
        self._buffer += data
        events = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return events
            raw = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            self._line += 1
            event = self._take_line(raw)
            if event is not None:
                events.append(event)

    def _take_line(self, raw: bytes) -> SseEvent | None:
        if self.ended:
            raise self._fail(f"data after the end event: {raw[:80]!r}")
        if b"\r" in raw:
            raise self._fail("a carriage return; lines must end with \\n only")
        self._block_size += len(raw) + 1
        if raw == b"":
            return self._end_block()
        if raw.startswith(_EVENT):
            if self._event is not None or self._data is not None:
                raise self._fail("an event: line inside a block (missing blank line?)")
            name = self._decode(raw[len(_EVENT) :])
            if not name or name != name.strip():
                raise self._fail(f"bad event name {name!r}")
            self._event = name
            return None
        if raw.startswith(_DATA):
            if self._event is None:
                raise self._fail("a data: line before the block's event: line")
            if self._data is not None:
                raise self._fail("a second data: line in one block")
            text = self._decode(raw[len(_DATA) :])
            if text.strip() == "[DONE]":
                raise self._fail("a [DONE] sentinel; the stream must end after its end event")
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise self._fail(f"data is not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise self._fail("data is not a JSON object")
            if obj.get("type") != self._event:
                raise self._fail(f"event: {self._event!r} differs from data.type {obj.get('type')!r}")
            self._data = obj
            return None
        raise self._fail(f"not an event:, data: or blank line: {raw[:80]!r}")

    def _end_block(self) -> SseEvent:
        if self._event is None:
            raise self._fail("a blank line outside a block")
        if self._data is None:
            raise self._fail(f"event {self._event!r} has no data: line")
        sequence = self._data.get("sequence_number")
        if sequence != self.next_sequence:
            raise self._fail(f"sequence_number {sequence!r}, expected {self.next_sequence}")
        self.next_sequence += 1
        event = SseEvent(self._event, self._data, self._block_size)
        self._event, self._data, self._block_size = None, None, 0
        self.ended = event.type in END_TYPES
        return event

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(f"invalid UTF-8: {exc}") from None

    def close(self, *, require_end: bool = True) -> None:
        """The body ended: refuse a partial line, a block without its blank line, and (unless
        `require_end` is false) a stream without an end event."""
        if self._buffer:
            self._line += 1  # the unfinished line is the one after the last whole line
            raise self._fail(f"the body ends inside a line: {bytes(self._buffer[:80])!r}")
        if self._event is not None or self._data is not None:
            raise self._fail("the body ends without the blank line that terminates the last event")
        if require_end and not self.ended:
            raise self._fail("the body ends before an end event (response.completed, .failed, .incomplete, error)")


def parse_stream(body: bytes, *, require_end: bool = True) -> list[SseEvent]:
    """Every event of a whole SSE body, checked strictly."""
    parser = StrictSseParser()
    events = parser.feed(body)
    parser.close(require_end=require_end)
    return events


__all__ = ["END_TYPES", "SseEvent", "SseProtocolError", "StrictSseParser", "parse_stream"]
