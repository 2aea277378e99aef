"""The suspended (v1) wire format from a client: a few helpers over openai-python's WebSocket
connection (`client.responses.connect()`, which needs `pip install "openai[realtime]"`).

v1 is the overnight prototype of OpenAI's post "Speeding up agentic workflows with WebSockets in the
Responses API": one `response.create` starts one long-lived response; at each client tool call the
server sends `response.done` (the response so far, ending in function calls) and waits; the client
answers with `response.append` (the tool outputs) and the same response continues (docs/protocol.md).

openai-python has no types for the two v1 events: its `conn.recv()` parses `response.done` as an
unrelated event type of the same name, and it has no method for `response.append`. So these helpers
read raw frames (`conn.recv_bytes()`) and send a raw one (`conn.send_raw(...)`):

    from openai import OpenAI
    from prototype.client import v1

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="any")
    with v1.connect(client) as conn:                        # the handshake carries the v1 beta header
        conn.response.create(model="gpt-5.4", input="...", tools=[...])
        event = v1.until_pause(conn)                        # response.done, or the terminal event
        while event["type"] == "response.done":
            v1.append(conn, [v1.tool_output(call, "ok") for call in v1.function_calls(event)])
            event = v1.until_pause(conn)

The package itself does not need openai-python: `conn` is any object with `recv_bytes()` and
`send_raw(text)`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from ..protocol.wire import BETA_SUSPENDED

# The handshake header that selects v1 (docs/protocol.md); without it, or with 2026-02-06, the
# server runs the chained (v2) design.
BETA_HEADER = {"OpenAI-Beta": f"responses_websockets={BETA_SUSPENDED}"}
# Events that end a wait: v1's pause, a response's terminal events, and an error event.
PAUSE = "response.done"
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "response.cancelled"})
MAX_EVENTS = 1_000_000  # a runaway stream raises instead of looping forever


class HandshakeRefused(Exception):
    """The server refused the WebSocket upgrade. openai-python shows only the status (e.g. "HTTP
    400"); this keeps the body, decoded as text, and the API error it carries (`{"error": {"code",
    "message", ...}}`, the shape of every refusal of this server and of the API): `code` and
    `message`, None when the body is not such an error."""

    def __init__(self, status: int | None, body: str | bytes | bytearray | memoryview) -> None:
        self.status = status
        self.body = bytes(body).decode("utf-8", "replace") if isinstance(body, (bytes, bytearray, memoryview)) else str(body)
        error = _api_error(self.body)
        self.code: str | None = error.get("code")
        self.message: str | None = error.get("message")
        reason = ": ".join(part for part in (self.code, self.message) if part) or self.body
        super().__init__(f"WebSocket handshake refused with HTTP {status}: {reason}")


def _api_error(body: str) -> dict[str, str | None]:
    """`{"code", "message"}` of an `{"error": {...}}` body, each a string or None; {} for any other body."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(error, dict):
        return {}
    return {key: value if isinstance(value, str) else None for key, value in error.items() if key in ("code", "message")}


@contextlib.contextmanager
def connect(client: Any, **options: Any) -> Iterator[Any]:
    """`client.responses.connect(...)` with the v1 beta header added to `extra_headers`; a refused
    handshake raises `HandshakeRefused` with the server's error body."""
    headers = {**options.pop("extra_headers", {}), **BETA_HEADER}
    manager = client.responses.connect(extra_headers=headers, **options)
    try:
        conn = manager.__enter__()
    except Exception as exc:
        refused = _refusal(exc)
        if refused is None:
            raise
        raise refused from exc
    try:
        yield conn
    finally:
        conn.close()


def _refusal(exc: BaseException) -> HandshakeRefused | None:
    """The `websockets` library's InvalidStatus (or its cause), as HandshakeRefused."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        status = getattr(response, "status_code", None)
        if status is not None:
            return HandshakeRefused(status, getattr(response, "body", b"") or b"")  # websockets gives a bytearray
        seen = seen.__cause__ or seen.__context__
    return None


def until_pause(conn: Any, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read raw frames up to the next `response.done` (a pause for tool output), terminal event or
    `error`, and return it as a dict; every event read is appended to `events` if given."""
    for _ in range(MAX_EVENTS):
        event = json.loads(conn.recv_bytes())
        if events is not None:
            events.append(event)
        if event.get("type") == PAUSE or event.get("type") in TERMINAL or event.get("type") == "error":
            return event
    raise RuntimeError(f"more than {MAX_EVENTS} events without a pause or an end")


def function_calls(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The function calls a `response.done` (or any response event) asks the client to run."""
    return [item for item in event.get("response", {}).get("output", []) if item.get("type") == "function_call"]


def tool_output(call: dict[str, Any], output: str) -> dict[str, Any]:
    """The `function_call_output` item that answers `call`."""
    return {"type": "function_call_output", "call_id": call["call_id"], "output": output}


def append(conn: Any, items: list[dict[str, Any]]) -> None:
    """Send `response.append`: the suspended response continues with these items (tool outputs)."""
    conn.send_raw(json.dumps({"type": "response.append", "input": items}))


def output_text(event: dict[str, Any]) -> str:
    """The text of the message items of a response event."""
    return "".join(
        part.get("text", "")
        for item in event.get("response", {}).get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
