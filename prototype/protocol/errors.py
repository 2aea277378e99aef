"""Protocol errors: what a peer did wrong, as the wire reports it.

Every bad input the sans-IO core sees becomes a `ProtocolError` carrying the HTTP-style status, the
error type, a stable code, the offending parameter and a message (docs/protocol.md). The same error
renders in the three shapes the transports use: nested on WebSocket, flat inside an SSE stream, and
as an `{"error": {...}}` body before an HTTP stream starts.
"""

from __future__ import annotations

from typing import Any

# Stable error codes. The documented ones keep OpenAI's exact spelling (clients match on them:
# Soju06/codex-lb#1529); the rest are ours, listed in docs/protocol.md
INVALID_JSON = "invalid_json"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
INVALID_VALUE = "invalid_value"
INVALID_TYPE = "invalid_type"
INTEGER_BELOW_MIN_VALUE = "integer_below_min_value"
INTEGER_ABOVE_MAX_VALUE = "integer_above_max_value"
DECIMAL_BELOW_MIN_VALUE = "decimal_below_min_value"
DECIMAL_ABOVE_MAX_VALUE = "decimal_above_max_value"
STRING_ABOVE_MAX_LENGTH = "string_above_max_length"
OBJECT_ABOVE_MAX_PROPERTIES = "object_above_max_properties"
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
EMPTY_INPUT = "empty_input"
UNSUPPORTED_PARAMETER = "unsupported_parameter"
# A top-level field the API does not define: "Unknown parameter: 'x'.", param `x` (the API's 400, quoted in
# openai/codex issue 10834 and teabranch/open-responses-server issue 41).
UNKNOWN_PARAMETER = "unknown_parameter"
PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
TOO_MANY_QUEUED_REQUESTS = "too_many_queued_requests"
NO_SUSPENDED_RESPONSE = "no_suspended_response"
INVALID_FUNCTION_CALL_OUTPUT = "invalid_function_call_output"
INVALID_ENCRYPTED_CONTENT = "invalid_encrypted_content"  # the real API's code (theopenco/llmgateway PR #3600)
CONNECTION_LIMIT_REACHED = "websocket_connection_limit_reached"
CONNECTION_LIMIT_MESSAGE = "Responses websocket connection limit reached"
STEERING_NOT_SUPPORTED = "steering_not_supported"
# WS guide, "Errors to handle": a malformed `stream_id`, and a 33rd named lane on one connection.
INVALID_STREAM_ID = "invalid_stream_id"
WEBSOCKET_STREAM_LIMIT_REACHED = "websocket_stream_limit_reached"
# Multi-agent guide, "Inject tool outputs over WebSocket": why a `response.inject` was not committed.
RESPONSE_ALREADY_COMPLETED = "response_already_completed"
RESPONSE_NOT_FOUND = "response_not_found"
SERVER_ERROR = "server_error"
SERVER_SHUTTING_DOWN = "server_shutting_down"
# An input longer than the model's context window, refused before any response starts (a request, a v1 append),
# with the API's code and message (public reports: dyad-sh/dyad issue 1672, james-6-23/codex2api issue 415,
# the-open-agent/openagent issue 2344: type invalid_request_error, param `input`).
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTEXT_WINDOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."

INVALID_REQUEST_ERROR = "invalid_request_error"


class ProtocolError(Exception):
    """A request the server refuses, with everything the wire needs to say why."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = INVALID_REQUEST_ERROR,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status
        self.type = type

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, param={self.param!r}, status={self.status})"

    def error_object(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code, "message": self.message, "param": self.param}

    def to_ws_event(self) -> dict[str, Any]:
        """The nested WebSocket shape (WS guide; openai-python `ResponseWsError`)."""
        return {"type": "error", "status": self.status, "error": self.error_object()}

    def to_sse_event(self, sequence_number: int) -> dict[str, Any]:
        """The flat in-stream SSE shape (openai-python `response_error_event.py`)."""
        return {
            "type": "error",
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "sequence_number": sequence_number,
        }

    def to_http_body(self) -> dict[str, Any]:
        """The body of an HTTP error answered before any streaming."""
        return {"error": self.error_object()}


def response_error(message: str) -> dict[str, str]:
    """The `error` of a Response that failed after it started (`response.failed`): its code is one of the
    values the API's schema allows (openai-python `types/responses/response_error.py`, `ResponseError.code`),
    and of those only `server_error` says the server failed it; `message` says what failed (docs/protocol.md,
    "Codes inside a Response"). The free-form codes above go in `error` events, never here."""
    return {"code": SERVER_ERROR, "message": message}


def ends_connection(error: dict[str, Any]) -> bool:
    """Whether a failed Response's `error` says its connection reached its lifetime limit (the message of
    `connection_limit_reached`, which the response fails with before the `error` event that carries the code)."""
    return str(error.get("message", "")).startswith(CONNECTION_LIMIT_MESSAGE)


def previous_response_not_found(response_id: str) -> ProtocolError:
    # WS guide: the documented code, param and message; keep the wording exact.
    return ProtocolError(
        PREVIOUS_RESPONSE_NOT_FOUND,
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
    )


def connection_limit_reached(minutes: float) -> ProtocolError:
    # WS guide: the message Codex and openai-python users see at the 60-minute limit.
    return ProtocolError(
        CONNECTION_LIMIT_REACHED,
        f"{CONNECTION_LIMIT_MESSAGE} ({minutes:g} minutes). "
        "Create a new websocket connection to continue.",
    )


def invalid_stream_id() -> ProtocolError:
    # WS guide: the documented code, param and message; the error carries no `stream_id`.
    return ProtocolError(
        INVALID_STREAM_ID,
        "The 'stream_id' field must be a non-empty string with at most 256 characters and may only contain "
        "letters, numbers, underscores, hyphens, and periods.",
        param="stream_id",
    )


def websocket_stream_limit_reached(limit: int) -> ProtocolError:
    # WS guide: the documented code, param and message; the error carries the refused `stream_id`.
    return ProtocolError(
        WEBSOCKET_STREAM_LIMIT_REACHED,
        f"This WebSocket connection has reached its maximum number of distinct stream IDs ({limit}). "
        "Reuse an existing stream_id or open a new WebSocket connection.",
        param="stream_id",
    )


def context_length_exceeded() -> ProtocolError:
    # The API's 400 for an input longer than the model's window: its code, message and param, word for word.
    return ProtocolError(CONTEXT_LENGTH_EXCEEDED, CONTEXT_WINDOW_MESSAGE, param="input")


def unknown_parameter(name: str) -> ProtocolError:
    # The API's 400 for a field it does not define: its code, message and param.
    return ProtocolError(UNKNOWN_PARAMETER, f"Unknown parameter: '{name[:64]}'.", param=name[:64])


def server_shutting_down() -> ProtocolError:
    # [ours]: a drain (SIGTERM) refuses new connections and ends responses cut short with this.
    return ProtocolError(SERVER_SHUTTING_DOWN, "The server is shutting down; retry on a new connection.", status=503, type="server_error")
