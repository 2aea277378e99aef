"""A rollout that survives lost connections: the harness's tool loop with a `ReconnectPolicy`.

What the client keeps so that it can go on: the whole conversation so far (every item it sent, and
every output item of every response that reached its pause or terminal event), the id of the last
response that did, and the items of the request in progress. What it does when a connection ends
under a request and its policy reconnects (which closes, how often, with what wait: reconnect.py;
docs/protocol.md, "Reconnecting"):

* chained (v2): open a new connection and send the request again with `previous_response_id`: with
  `store: true` the server hydrates the chain from its store; with `store: false` the new connection's
  cache is empty, the server answers `previous_response_not_found`, and the client resends the whole
  conversation without `previous_response_id` (WS guide pattern (b); what Codex does on a new socket).
* suspended (v1): the response is gone with its connection (the server cancels the coroutine and keeps
  nothing, whatever `store` says), so the client starts a new response with the whole conversation as
  its input: everything up to the last `response.done` it received, and the tool outputs it owed.
  Output of the interrupted segment is thrown away; it is sampled again.
* http: the same request again on a new connection (http.py, `run_http_rollout` with a policy).

Events of a response whose connection broke are not kept: the client learned that the response failed
(the close came before its terminal event), and the retried response's events replace them, so each
event of a completed response reaches the client's records once.

A turn that had to be retried keeps its start: its time includes the failure, the backoff and the
retry (the user waited for all of it). The record counts reconnects, the bytes sent again, the wait
from each failure to the first event of the retried response, and whether the task fell back to HTTP.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import trio
import trio_websocket

from ..protocol import errors
from ..protocol.wire import CHAINED, SUSPENDED
from ..workload import Workload
from .connect import Connector
from .harness import (
    FIRST_TOKEN_TYPES,
    PAUSE_TYPES,
    Rollout,
    RolloutRecord,
    WsChannel,
    function_calls,
    open_responses_websocket,
    request_body,
    task_prompt,
)
from .reconnect import ReconnectPolicy

# What ends a connection under the client: a close (any code), a broken link, a refused connect.
LOST = (trio_websocket.ConnectionClosed, trio_websocket.HandshakeError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
# How long opening a connection (TCP, TLS, upgrade) may take: the `websockets` library's `open_timeout`
# default, 10 s, which openai-python's connect() uses.
OPEN_TIMEOUT_SECONDS = 10.0
# How long closing a connection that broke may take before the client walks away from it.
CLOSE_GRACE_SECONDS = 5.0


class _Lost(Exception):
    """The connection ended under a request: `code` is its close code (None: the link broke, it never
    opened, or an `error` or `response.failed` the policy retries on a new connection ended it)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(code)
        self.code = code


def _first(group: BaseException) -> Any:
    """The first exception of a (nested) exception group."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def _close_code(exc: BaseException, ws: trio_websocket.WebSocketConnection | None) -> int | None:
    reason = getattr(exc, "reason", None) if isinstance(exc, trio_websocket.ConnectionClosed) else None
    if reason is None and ws is not None:
        reason = ws.closed
    return getattr(reason, "code", None)


class ReconnectingRollout:
    """One task over WebSocket (`suspended` or `chained`) that reconnects under `policy`."""

    def __init__(self, connector: Connector, design: str, workload: Workload, policy: ReconnectPolicy, *,
                 metadata: dict[str, str], model: str = "gpt-5.4", store: bool = False, include_timing: bool = False,
                 api_key: str = "testbed", instructions: str | None = None, seed: int = 0) -> None:
        if design not in (SUSPENDED, CHAINED):
            raise ValueError(f"design must be {SUSPENDED!r} or {CHAINED!r}, not {design!r}")
        self.connector, self.design, self.policy = connector, design, policy
        self.store, self.include_timing, self.api_key = store, include_timing, api_key
        self.rollout = Rollout(workload, RolloutRecord(design, workload.name, trio.current_time()))
        # As the harness asks (harness.run_websocket_rollout): chained without a store keeps the reasoning blob, as
        # Codex does; v1 never needed it: a v1 restart resends its reasoning items as received, without the blob,
        # which this server carries as opaque items (docs/protocol.md, "Reconnecting").
        self.base = request_body(workload, model=model, metadata=metadata, store=store,
                                 include_reasoning=design == CHAINED and not store, instructions=instructions)
        self.http_args = {"model": model, "metadata": metadata, "instructions": instructions}
        self.history: list[dict[str, Any]] = []  # the conversation up to the last response that paused or ended
        self.pending: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}
        ]
        self.last_id: str | None = None  # chained: the response to continue from
        self.alive = False  # suspended: a rollout is paused on the current connection, waiting for an append
        self.full_context = False  # chained: the next request resends everything (the chain was not found)
        # The policy's count of attempts: openai-python's is reset by any event that is not an `error`, Codex's by a
        # response that reaches its pause or end (reconnect.py).
        self.attempt = 0
        # openai-python has no count of failed responses (the SDK never asks again; the application does [ours]):
        # `response.failed` in a row, reset by a response that reaches its pause or end. Codex counts them in `attempt`.
        self.failed_in_a_row = 0
        self.failed_at: float | None = None  # when the current run of failures began
        self.rng = random.Random(f"reconnect:{seed}:{workload.name}")
        self.turn_open = False  # a turn record exists for `pending` (a retry reuses it)
        self._transcript_mark = 0  # the transcript's length when the open turn's request went out
        # When the next turn started: the task's start for turn 0, else when its tools returned; a request that
        # could not go out (the connection was gone) keeps it, so the turn counts the reconnect (docs/metrics.md).
        self.next_turn_at = self.rollout.record.started_at

    @property
    def record(self) -> RolloutRecord:
        return self.rollout.record

    async def run(self) -> RolloutRecord:
        while self.record.status == "":
            opened = False
            try:
                with trio.CancelScope(deadline=trio.current_time() + OPEN_TIMEOUT_SECONDS) as scope:
                    async with open_responses_websocket(self.connector, self.design, api_key=self.api_key,
                                                        include_timing=self.include_timing) as ws:
                        opened, scope.deadline = True, float("inf")
                        try:
                            await self.converse(WsChannel(ws, self.rollout))
                        except _Lost:
                            scope.deadline = trio.current_time() + CLOSE_GRACE_SECONDS
                            raise
                        except LOST as exc:
                            scope.deadline = trio.current_time() + CLOSE_GRACE_SECONDS
                            raise _Lost(_close_code(exc, ws)) from exc
                        self.record.ended_at = trio.current_time()
                if not opened:  # the handshake did not finish in time (its answer was lost with the link)
                    raise _Lost(None)
            except* _Lost as group:
                await self.recover(_first(group))
            except* LOST as group:  # the connection could not be opened (refused, handshake cut)
                await self.recover(_Lost(_close_code(_first(group), None)))
        if not self.record.ended_at:
            self.record.ended_at = trio.current_time()
        return self.record

    async def recover(self, lost: _Lost) -> None:
        """After a lost connection: stop, give up or fall back as the policy says, or count it and wait its backoff."""
        record = self.record
        self.alive = False  # a v1 rollout does not outlive its connection
        if self.turn_open:
            self._forget_attempt()
        if lost.code is not None and not self.policy.retries_after_close(lost.code):
            # openai-python after a close outside its recoverable codes, 1000 included: its iteration ends and it
            # opens nothing (`_iter_events`); the task ends there.
            record.status = f"error:closed_{lost.code}"
            return
        if self.failed_at is None:
            self.failed_at = trio.current_time()
        self.attempt += 1
        if self.attempt > self.policy.max_retries:
            if self.policy.fallback_to_http:
                await self.continue_over_http()
            else:
                record.status = "error:gave_up"
            return
        record.reconnects += 1
        await trio.sleep(self.policy.delay(self.attempt, self.rng))

    def _forget_attempt(self) -> None:
        """Drop what an interrupted response delivered: its items from the transcript; the turn restarts."""
        turn = self.record.turns[-1]
        del self.record.transcript[self._transcript_mark:]
        turn.first_token_at = None
        turn.ended_at = None

    def request(self) -> tuple[dict[str, Any], bool]:
        """The next frame, and whether it carries the whole conversation."""
        if self.design == SUSPENDED:
            if self.alive:
                return {"type": "response.append", "input": self.pending}, False
            return {"type": "response.create", **self.base, "input": self.history + self.pending}, bool(self.history)
        if self.last_id is not None and not self.full_context:
            return {"type": "response.create", **self.base, "previous_response_id": self.last_id, "input": self.pending}, False
        return {"type": "response.create", **self.base, "input": self.history + self.pending}, bool(self.history)

    async def send(self, channel: WsChannel) -> None:
        event, resend = self.request()
        record = self.record
        size = await channel.send(event)
        retry = self.turn_open
        if not self.turn_open:
            self.rollout.start_turn(self.pending, size, at=self.next_turn_at)
            self._transcript_mark = len(record.transcript)
            self.turn_open = True
        else:
            record.turns[-1].bytes_sent += size
            record.resent_bytes += size
        if resend:
            record.full_resends += 1
            if not retry:  # a new turn's request carrying the conversation again: all but its new items is resent
                record.resent_bytes += max(0, size - len(orjson.dumps(self.pending)))

    async def converse(self, channel: WsChannel) -> None:
        """Requests on one connection until the task ends or the connection does."""
        while True:
            await self.send(channel)
            items: list[dict[str, Any]] = []
            pause = await self.until_pause(channel, items)
            kind = pause["type"]
            if kind == "error":
                code = pause["error"]["code"]
                if code == errors.PREVIOUS_RESPONSE_NOT_FOUND and self.last_id is not None and not self.full_context:
                    self.full_context = True  # the new connection's cache is empty and nothing was stored
                    continue
                if code in self.policy.reconnect_errors:  # Codex at the connection limit: a retryable stream error
                    raise _Lost(None)
                self.record.turns[-1].ended_at = trio.current_time()
                self.record.status = f"error:{code}"
                return
            response = pause["response"]
            if kind == "response.failed":
                error = response.get("error") or {}
                # A response cut by the connection limit fails with `server_error` and the limit's message (the
                # schema's code; the limit's own code comes next, in the `error` event): the client reads the message.
                code = errors.CONNECTION_LIMIT_REACHED if errors.ends_connection(error) else error.get("code")
                if code in self.policy.reconnect_errors:  # a response cut by the connection limit: on a new one
                    raise _Lost(None)
                if code == errors.CONNECTION_LIMIT_REACHED:  # the connection is closing: nothing to ask again on it
                    self.record.turns[-1].ended_at = trio.current_time()
                    self.record.status = f"error:{code}"
                    return
                if self.policy.retry_failed_responses and (attempt := self._count_failed_response()) <= self.policy.max_retries:
                    self.record.retried_responses += 1
                    self.failed_at = self.failed_at if self.failed_at is not None else trio.current_time()
                    self._forget_attempt()
                    self.alive = False
                    await trio.sleep(self.policy.delay(attempt, self.rng))
                    continue
            self.attempt, self.failed_in_a_row, self.failed_at = 0, 0, None
            self.history.extend(self.pending)
            self.history.extend(items)
            self.turn_open = False
            calls = function_calls(response["output"]) if kind in ("response.done", "response.completed") else []
            if kind == "response.done" or (self.design == CHAINED and kind == "response.completed" and calls):
                self.alive = kind == "response.done"
                self.last_id, self.full_context = response["id"], False
                self.pending = await self.rollout.run_tools(calls)
                self.next_turn_at = trio.current_time()
                continue
            self.record.status = response["status"]
            return

    async def until_pause(self, channel: WsChannel, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Events until the response pauses or ends; collects its output items into `items`. The first
        event after a failure ends the recovery; under openai-python any event but an `error` resets the count."""
        while True:
            message = await channel.ws.get_message()
            event = orjson.loads(message)
            self.rollout.received(event, len(message.encode()) if isinstance(message, str) else len(message))
            kind = event.get("type")
            if self.policy.reset_on_any_event and isinstance(kind, str) and kind and kind != "error":
                self.attempt = 0  # openai-python's `_record_websocket_progress`
            if self.failed_at is not None and kind == "response.created":
                self.record.recovery_seconds.append(trio.current_time() - self.failed_at)
                self.failed_at = None
            if kind == "response.output_item.done":
                items.append(event["item"])
            if kind in PAUSE_TYPES or kind == "error":
                return event

    def _count_failed_response(self) -> int:
        """Count one `response.failed` the policy may ask again; returns its attempt number."""
        if self.policy.reset_on_any_event:  # the response's own events reset `attempt`: count failures in a row
            self.failed_in_a_row += 1
            return self.failed_in_a_row
        self.attempt += 1  # Codex: the sampling request's one count
        return self.attempt

    async def continue_over_http(self) -> None:
        """Codex's fallback: the rest of the task over HTTP, resending the whole conversation each turn."""
        from .http import continue_http_rollout  # http.py builds on harness.py, as this module does

        self.record.fell_back_to_http = True
        await continue_http_rollout(self.connector, self.rollout, self.history, self.pending, policy=self.policy,
                                    api_key=self.api_key, include_timing=self.include_timing, turn_open=self.turn_open,
                                    **self.http_args)


async def run_reconnecting_rollout(connector: Connector, design: str, workload: Workload, policy: ReconnectPolicy,
                                   **options: Any) -> RolloutRecord:
    """One task over WebSocket, reconnecting under `policy` (see the module docstring)."""
    return await ReconnectingRollout(connector, design, workload, policy, **options).run()


__all__ = ["FIRST_TOKEN_TYPES", "LOST", "ReconnectingRollout", "run_reconnecting_rollout"]
