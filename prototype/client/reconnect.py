"""When a client reconnects: which closes it retries after, how often, how long it waits, what resets
its count, and when it gives up on WebSocket for HTTP.

The harness (prototype/client/harness.py for WebSocket, prototype/client/http.py for HTTP), `compare`
and the experiments take one `ReconnectPolicy`; two presets copy the public clients, each read in the
version named here:

* `OPENAI_PYTHON`: openai-python 3.63.0 (the version the test install brings; 3.57.0's
  `_websocket_connection.py` decides the same) `responses.connect()` with `on_reconnecting` set. When
  the connection closes under its event iterator (`_iter_events`) it reconnects only after the close
  codes of `_RECOVERABLE_CLOSE_CODES` (`types/websocket_reconnection.py`: 1001 going away, 1005 no
  status, 1006 abnormal, 1011 internal error, 1012 service restart, 1013 try again later, 1015 TLS
  failure; RFC 6455 §7.4.1); after any other close, 1000 included, the iteration ends and the SDK
  opens nothing. It makes up to `max_retries=5` attempts, waiting `min(initial_delay * 2**(attempt-1),
  max_delay)` with `initial_delay=0.5`, `max_delay=8.0`, times a jitter drawn from [0.75, 1.0)
  (`_reconnect`); a failed connect spends an attempt. The count is reset by any event received whose
  `type` is not `error` (`_record_websocket_progress`, called by `recv` and `recv_bytes`), and by
  nothing else: a reconnect that succeeds does not reset it. At the connection limit the SDK does
  nothing of its own: the `error` event (`websocket_connection_limit_reached`) reaches the application
  like any event, and the close 1000 that follows ends the iteration.
* `CODEX`: Codex CLI (codex-rs, as stored: `codex-api/src/endpoint/responses_websocket.rs`,
  `codex-api/src/sse/responses.rs`, `core/src/api_bridge.rs`, `core/src/responses_retry.rs`). A
  stream that ends before `response.completed` (a close with any code: "websocket closed by server
  before response.completed"), an `error` carrying `websocket_connection_limit_reached` (mapped to
  `ApiError::Retryable` without a delay) and a `response.failed` (also `ApiError::Retryable`) are
  the same retryable stream error: the sampling request is retried up to `stream_max_retries`
  (default 5, `DEFAULT_STREAM_MAX_RETRIES` in codex-rs `model-provider-info`), waiting
  `200 ms * 2**(attempt-1)` times a jitter in [0.9, 1.1) (codex-rs `backoff`: `INITIAL_DELAY_MS =
  200`, `BACKOFF_FACTOR = 2.0`) on a new connection with the full context (docs/codex.md); once the
  WebSocket retries are spent it switches the session to HTTPS (`try_switch_fallback_transport`)
  with the count reset. The count belongs to one sampling request
  (`handle_retryable_response_stream_error`'s `retries`): the next request, after a response that
  completed, starts from zero.

A client under either policy therefore stops: openai-python's at the first clean close or connection
limit (the task ends with `error:closed_1000` or `error:websocket_connection_limit_reached`), Codex's
after its retries, then over HTTP, which has no connection limit.
"""

from __future__ import annotations

import random

import attrs

from ..protocol import errors

# RFC 6455 §7.4.1, as openai-python lists them (types/websocket_reconnection.py `_RECOVERABLE_CLOSE_CODES`).
OPENAI_PYTHON_CLOSE_CODES = frozenset({1001, 1005, 1006, 1011, 1012, 1013, 1015})
# Codex retries any stream that ends before response.completed; the codes a WebSocket can end with.
ANY_CLOSE = frozenset(range(1000, 5000))


@attrs.frozen
class ReconnectPolicy:
    """How a client recovers from a lost connection or a failed response. Unless given, it decides as
    openai-python does (which closes it retries after, which errors, what resets its count); the presets give
    each client's numbers."""

    name: str
    """Short name, for tables."""
    close_codes: frozenset[int] = OPENAI_PYTHON_CLOSE_CODES
    """Close codes received in the middle of a response after which the client reconnects."""
    reconnect_errors: frozenset[str] = frozenset()
    """Error codes (an `error` frame, or a `response.failed`) after which the client opens a new connection and
    asks again, spending an attempt and waiting its backoff (Codex: `websocket_connection_limit_reached`)."""
    reset_on_any_event: bool = True
    """What resets the count: any event received whose type is not `error` (openai-python), or only a response
    that reaches its pause or terminal event (Codex: one count per sampling request)."""
    retry_failed_responses: bool = True
    """Whether a `response.failed` with a server error is retried (from the last completed turn)."""
    max_retries: int = 5
    """Consecutive attempts before giving up (or falling back to HTTP)."""
    initial_delay: float = 0.5
    """Wait before the first attempt, seconds."""
    backoff_factor: float = 2.0
    """Each further attempt waits this many times longer."""
    max_delay: float = float("inf")
    """Cap on one wait, seconds."""
    jitter: tuple[float, float] = (1.0, 1.0)
    """Each wait is multiplied by a factor drawn uniformly from this range."""
    fallback_to_http: bool = False
    """Once the WebSocket retries are spent, continue the task over HTTP (full context, SSE)."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before attempt `attempt` (1-based)."""
        base = min(self.initial_delay * self.backoff_factor ** (attempt - 1), self.max_delay)
        low, high = self.jitter
        return base * (low if low == high else rng.uniform(low, high))

    def retries_after_close(self, code: int | None) -> bool:
        """Whether a close in the middle of a response (`None`: the link broke, read as 1006) is retried."""
        return (1006 if code is None else code) in self.close_codes

    @property
    def worst_case_wait(self) -> float:
        """The longest the backoff alone can add before the client gives up (jitter at its top)."""
        return sum(min(self.initial_delay * self.backoff_factor ** (a - 1), self.max_delay) for a in range(1, self.max_retries + 1)) * self.jitter[1]


OPENAI_PYTHON = ReconnectPolicy(
    "openai-python", close_codes=OPENAI_PYTHON_CLOSE_CODES, reconnect_errors=frozenset(), reset_on_any_event=True, max_retries=5,
    initial_delay=0.5, max_delay=8.0, jitter=(0.75, 1.0),
)
CODEX = ReconnectPolicy(
    "codex", close_codes=ANY_CLOSE, reconnect_errors=frozenset({errors.CONNECTION_LIMIT_REACHED}), reset_on_any_event=False,
    max_retries=5, initial_delay=0.2, backoff_factor=2.0, jitter=(0.9, 1.1), fallback_to_http=True,
)
# A client that never reconnects: the first lost connection fails the task.
NEVER = ReconnectPolicy("never", close_codes=frozenset(), reconnect_errors=frozenset(), retry_failed_responses=False, max_retries=0)
POLICIES = {p.name: p for p in (OPENAI_PYTHON, CODEX, NEVER)}


__all__ = ["ANY_CLOSE", "CODEX", "NEVER", "OPENAI_PYTHON", "OPENAI_PYTHON_CLOSE_CODES", "POLICIES", "ReconnectPolicy"]
