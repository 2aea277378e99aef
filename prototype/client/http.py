"""The harness's HTTP transport: one `POST /v1/responses` per turn, the answer read as SSE.

It speaks HTTP/1.1 itself with h11 over the connector's byte stream (in memory under a virtual
clock, or TCP), and reads the stream with the strict parser of `sse.py`, so every harness run also
checks the server's framing. Two variants (docs/protocol.md):

* `stateless`: `store: false`, and every request resends the whole conversation so far: the task,
  every output item received and every tool output sent;
* `stored`: `store: true`, and every later request sends only the tool outputs with
  `previous_response_id` naming the last response.

Connections: with `keep_alive` one connection serves the whole rollout (reopened only if the
server closes it); without, every request opens a new connection, paying the network profile's TCP
and TLS handshake (`netem.connect_handshake`) before it goes out, and asks the server to close it
after the answer. A turn's start is taken before the connection is opened, so its time to first
token includes the handshake, as a WebSocket client's first turn includes its connection
(docs/metrics.md). Closing a connection never delays the rollout: it finishes in the background.

Byte counts (docs/metrics.md): `bytes_sent` is the request body, `bytes_received` the SSE blocks
(event line, data line, blank line), i.e. the HTTP body without its chunked framing and headers.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs
import h11
import trio

from ..protocol.compaction import window_of_dicts
from ..protocol.wire import RESPONSES_PATH, STATELESS, STORED, VARIANTS
from ..workload import Workload
from .connect import Connector
from .harness import Rollout, RolloutRecord, function_calls, request_body, task_prompt
from .reconnect import ReconnectPolicy
from .sse import END_TYPES, StrictSseParser

DESIGN_NAMES = {STATELESS: "http-stateless", STORED: "http-stored"}
USER_AGENT = b"prototype-harness"


class ConnectionLost(Exception):
    """The connection ended before the answer did. `answered` says whether any of the answer had
    arrived (a request is retried on a fresh connection only if none had)."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class HttpProtocolError(Exception):
    """The server's answer broke HTTP or the promised content type."""


@attrs.define(eq=False)
class HttpConnection:
    """One HTTP/1.1 client connection: h11 over a stream held open by a background task until
    `close`."""

    stream: trio.abc.Stream
    _release: trio.Event
    conn: h11.Connection = attrs.Factory(lambda: h11.Connection(h11.CLIENT))
    requests: int = 0

    @property
    def reusable(self) -> bool:
        return self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE

    def close(self) -> None:
        self._release.set()

    async def _next_event(self, answered: bool) -> Any:
        """The server's next event of the answer in progress. A close before the answer's end is h11's
        `RemoteProtocolError` (a close is a `ConnectionClosed` event only between answers, where this
        is never called; a body delimited by the close ends with `EndOfMessage`)."""
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ConnectionLost(str(exc), answered=answered) from None
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ConnectionLost(f"the connection broke: {exc}", answered=answered) from None
            self.conn.receive_data(data)

    async def post(self, body: bytes, headers: list[tuple[bytes, bytes]], rollout: Rollout) -> dict[str, Any]:
        """Send one request and read its answer through `rollout`; return the end event (a
        terminal, a flat `error`, or `{"type": "error", "status": <HTTP status>, "error": {...}}`
        for a refusal)."""
        self.requests += 1
        request = h11.Request(
            method=b"POST",
            target=RESPONSES_PATH.encode(),
            headers=[(b"host", b"testbed"), (b"content-length", str(len(body)).encode()), *headers],
        )
        data = self.conn.send(request) + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        rollout.record.timeline.append((trio.current_time(), "send", f"POST {RESPONSES_PATH}"))
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionLost(f"the connection broke: {exc}", answered=False) from None

        response = await self._next_event(answered=False)
        while isinstance(response, h11.InformationalResponse):
            response = await self._next_event(answered=False)
        assert isinstance(response, h11.Response)
        content_type = dict(response.headers).get(b"content-type", b"").decode("latin-1")
        if response.status_code != 200:
            body_bytes = await self._read_body()
            try:
                error = json.loads(body_bytes)["error"]
            except (ValueError, KeyError, TypeError):
                raise HttpProtocolError(f"HTTP {response.status_code} without an error body: {body_bytes[:200]!r}") from None
            rollout.record.timeline.append((trio.current_time(), "recv", f"http {response.status_code}"))
            return {"type": "error", "status": response.status_code, "error": error}
        if content_type.split(";")[0].strip() != "text/event-stream":
            raise HttpProtocolError(f"a stream was asked for, got Content-Type {content_type!r}")

        parser = StrictSseParser()
        end: dict[str, Any] | None = None
        while True:
            event = await self._next_event(answered=True)
            if isinstance(event, h11.Data):
                for sse in parser.feed(event.data):
                    rollout.received(sse.data, sse.size)
                    if sse.type in END_TYPES:
                        end = sse.data
            elif isinstance(event, h11.EndOfMessage):
                parser.close()
                break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        assert end is not None  # the parser refuses a body that ends before an end event
        return end

    async def _read_body(self) -> bytes:
        body = bytearray()
        while True:
            event = await self._next_event(answered=True)
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return bytes(body)


async def _hold_stream(connector: Connector, release: trio.Event, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
    """Open a connection, hand its stream over, keep it open until `release` is set."""
    async with connector.open_stream() as stream:
        task_status.started(stream)
        await release.wait()


@attrs.define(eq=False)
class ConnectionPool:
    """At most one idle connection (a client sends one request at a time); closing runs in the
    background so it never delays the rollout."""

    nursery: trio.Nursery
    connector: Connector
    keep_alive: bool
    idle: HttpConnection | None = None

    async def acquire(self) -> HttpConnection:
        if self.idle is not None:
            connection, self.idle = self.idle, None
            if connection.reusable:
                return connection
            connection.close()
        release = trio.Event()
        stream = await self.nursery.start(_hold_stream, self.connector, release)
        return HttpConnection(stream, release)

    def release(self, connection: HttpConnection) -> None:
        if self.keep_alive and connection.reusable:
            self.idle = connection
        else:
            connection.close()

    def discard(self, connection: HttpConnection) -> None:
        connection.close()

    def close(self) -> None:
        if self.idle is not None:
            self.idle.close()
            self.idle = None


def request_headers(*, api_key: str, keep_alive: bool, include_timing: bool) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"authorization", f"Bearer {api_key}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"user-agent", USER_AGENT),
    ]
    if not keep_alive:
        headers.append((b"connection", b"close"))
    if include_timing:
        headers.append((b"x-responsesapi-include-timing-metrics", b"true"))
    return headers


async def post_turn(pool: ConnectionPool, body: bytes, headers: list[tuple[bytes, bytes]], rollout: Rollout) -> dict[str, Any]:
    """One request on a pooled connection; retried once on a fresh connection if the pooled one
    turned out closed before any answer (a server idle timeout racing the request)."""
    for attempt in range(2):
        connection = await pool.acquire()
        try:
            end = await connection.post(body, headers, rollout)
        except ConnectionLost as lost:
            pool.discard(connection)
            if lost.answered or attempt or connection.requests == 1:
                raise  # only a reused connection may have gone stale while idle
            rollout.record.reconnects += 1  # a new connection, because the kept-alive one had ended
            continue
        except BaseException:
            pool.discard(connection)
            raise
        pool.release(connection)
        return end
    raise AssertionError("unreachable")


async def run_http_rollout(
    connector: Connector,
    workload: Workload,
    *,
    variant: str = STATELESS,
    metadata: dict[str, str],
    model: str = "gpt-5.4",
    keep_alive: bool = True,
    include_timing: bool = False,
    api_key: str = "testbed",
    instructions: str | None = None,
    compact_threshold: int | None = None,
    policy: ReconnectPolicy | None = None,
) -> RolloutRecord:
    """One task over HTTP: a `POST /v1/responses` (stream: true) per turn, `stateless` (full history)
    or `stored` (`previous_response_id`). `compact_threshold`: server-side compaction; a stateless
    client then resends only the latest compacted window. With `policy`, a request whose connection is
    lost (or whose response fails on the server) is sent again on a new connection, with the policy's
    backoff (prototype/client/reconnecting.py)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    rollout = Rollout(workload, RolloutRecord(DESIGN_NAMES[variant], workload.name, trio.current_time()))
    stored = variant == STORED
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}]
    await _http_tool_loop(connector, rollout, [], first, stored=stored, policy=policy, keep_alive=keep_alive, api_key=api_key,
                          include_timing=include_timing, model=model, metadata=metadata, instructions=instructions,
                          compact_threshold=compact_threshold)
    return rollout.record


async def continue_http_rollout(
    connector: Connector, rollout: Rollout, history: list[dict[str, Any]], pending: list[dict[str, Any]], *,
    policy: ReconnectPolicy | None, model: str, metadata: dict[str, str], instructions: str | None, api_key: str,
    include_timing: bool, turn_open: bool = False,
) -> None:
    """Go on with a conversation over HTTP, stateless (the whole conversation every turn): Codex's
    fallback once its WebSocket retries are spent. `history` is the conversation so far, `pending` the
    items of the request in progress; `turn_open`: that request's turn is already recorded."""
    await _http_tool_loop(connector, rollout, list(history), pending, stored=False, policy=policy, keep_alive=True,
                          api_key=api_key, include_timing=include_timing, model=model, metadata=metadata,
                          instructions=instructions, turn_open=turn_open)


async def _http_tool_loop(
    connector: Connector, rollout: Rollout, history: list[dict[str, Any]], new_items: list[dict[str, Any]], *, stored: bool,
    policy: ReconnectPolicy | None, keep_alive: bool, api_key: str, include_timing: bool, model: str,
    metadata: dict[str, str], instructions: str | None, turn_open: bool = False, compact_threshold: int | None = None,
) -> None:
    base = {
        **request_body(rollout.workload, model=model, metadata=metadata, store=stored, include_reasoning=not stored,
                       instructions=instructions, compact_threshold=compact_threshold),
        "stream": True,
    }
    headers = request_headers(api_key=api_key, keep_alive=keep_alive, include_timing=include_timing)
    previous_id: str | None = None
    rng = random.Random(f"reconnect:http:{rollout.workload.name}")
    async with trio.open_nursery() as nursery:
        pool = ConnectionPool(nursery, connector, keep_alive)
        try:
            while True:
                if not stored:
                    body = {**base, "input": history + new_items}
                else:
                    body = {**base, "input": new_items}
                    if previous_id is not None:
                        body["previous_response_id"] = previous_id
                started_at = trio.current_time()  # before any connection the request needs (docs/metrics.md)
                data = json.dumps(body, separators=(",", ":")).encode()
                if turn_open:
                    rollout.record.turns[-1].bytes_sent += len(data)
                    rollout.record.resent_bytes += len(data)
                    rollout.record.full_resends += 1
                    turn_open = False
                else:
                    rollout.start_turn(new_items, len(data), at=started_at)
                end = await _post_with_retries(pool, data, headers, rollout, policy, rng)
                if end is None:
                    rollout.record.status = "error:gave_up"
                    break
                if end["type"] == "error":
                    error = end.get("error") if "status" in end else end
                    rollout.record.turns[-1].ended_at = trio.current_time()
                    rollout.record.status = f"error:{(error or {}).get('code')}"
                    break
                response = end["response"]
                calls = function_calls(response["output"])
                if end["type"] != "response.completed" or not calls:
                    rollout.record.status = response["status"]
                    break
                if not stored:
                    history.extend(new_items)
                    history.extend(response["output"])
                    history = window_of_dicts(history)  # after a compaction item, only its window is resent
                previous_id = response["id"]
                new_items = await rollout.run_tools(calls)
        finally:
            rollout.record.ended_at = trio.current_time()
            pool.close()


async def _post_with_retries(pool: ConnectionPool, data: bytes, headers: list[tuple[bytes, bytes]], rollout: Rollout,
                             policy: ReconnectPolicy | None, rng: random.Random) -> dict[str, Any] | None:
    """`post_turn`, sent again under `policy` when the connection is lost or the response fails on the
    server; None once the policy's retries are spent. Without a policy, a lost connection raises."""
    record = rollout.record
    turn = record.turns[-1]
    mark = len(record.transcript)
    failed_at: float | None = None
    attempt = 0
    while True:
        seen = len(record.timeline)
        try:
            end = await post_turn(pool, data, headers, rollout)
        except (ConnectionLost, OSError):
            if policy is None:
                raise
            end = None
        failed = end is None or (end["type"] == "response.failed" and policy is not None and policy.retry_failed_responses)
        if not failed or policy is None:
            if failed_at is not None:
                # An answer is on the timeline: its events, or the refusal's status (`HttpConnection.post`).
                answered_at = next(t for t, direction, _ in record.timeline[seen:] if direction == "recv")
                record.recovery_seconds.append(answered_at - failed_at)
            return end
        failed_at = trio.current_time() if failed_at is None else failed_at
        if end is not None:
            record.retried_responses += 1
        attempt += 1
        if attempt > policy.max_retries:
            return None
        # What the failed attempt delivered is dropped; the turn goes on with the retry.
        del record.transcript[mark:]
        turn.first_token_at = turn.ended_at = None
        record.reconnects += end is None
        await trio.sleep(policy.delay(attempt, rng))
        turn.bytes_sent += len(data)
        record.resent_bytes += len(data)


__all__ = [
    "DESIGN_NAMES", "ConnectionLost", "ConnectionPool", "HttpConnection",
    "HttpProtocolError", "continue_http_rollout", "post_turn", "request_headers", "run_http_rollout",
]
