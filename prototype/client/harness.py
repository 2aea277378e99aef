"""The agent harness: runs a workload's rollout against a design and records where time went.

It plays the client side of the tool loop: send the task, wait for the model's tool calls, run the
tools locally (simulated: wait the workload's tool time on the trio clock, return output of the
workload's size), send the outputs back, until the final answer. Per turn it records the request
start, the first token, the end of the turn and the bytes each way, by the definitions of
docs/metrics.md, which every client (this harness, the HTTP transport, the openai-python client)
stamps at the same points: a turn starts before any connection work its request needs (turn 0
pays the TCP, TLS and WebSocket handshakes of the connection it opens), its first token is the
first output delta received, it ends when the event that ends it has been received.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import numpy as np
import orjson
import trio
import trio_websocket

from ..engine import tokenizer
from ..protocol.events import TERMINAL_TYPES
from ..protocol.wire import BETA_CHAINED, BETA_SUSPENDED, CHAINED, SUSPENDED, WS_RECEIVE_BYTES
from ..workload import Workload
from ..ws_internals import received_message_nowait
from .connect import CLIENT_MAX_MESSAGE_BYTES, Connector

# The OpenAI-Beta header value of each WebSocket design.
BETA = {SUSPENDED: f"responses_websockets={BETA_SUSPENDED}", CHAINED: f"responses_websockets={BETA_CHAINED}"}
FIRST_TOKEN_TYPES = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})
PAUSE_TYPES = TERMINAL_TYPES | {"response.done"}
# Messages trio-websocket's reader task may hold for the harness. Its default, 1, parks the reader
# after every message until the harness takes it: a task switch per event. 16 lets it parse a
# turn's closing events from one read in one go. The reader keeps reading the socket until this
# queue is full, so what it holds is what the server has written and is no longer held back by: a
# client that stops reading pushes back on the server only once the queue is full. In
# tests/test_faults.py's client that stops reading while it floods the server with bad frames, the
# server read 277-336 of the 800 frames before it stopped with a queue of 1, 329 with 16, 431 with
# 64 and 570 with 256: past 64 the server goes on reading (and answering) a client that reads
# nothing for more than half the flood.
WS_MESSAGE_QUEUE = 16
# How long the harness waits for the server's reply to its close frame before it drops the
# connection: the `websockets` library's `close_timeout` default, 10 s. A server that is blocked
# writing to this client (which stopped reading) never reads the close frame; unbounded, the close
# would wait forever.
CLOSE_TIMEOUT_SECONDS = 10.0
# trio-websocket's handshake waits for the server's answer without end when the server closes the
# connection before answering (its reader ends, the handshake's event is never set), so it is bounded
# as trio-websocket's own `open_websocket` bounds it: `connect_timeout`, CONN_TIMEOUT = 60 s.
HANDSHAKE_TIMEOUT_SECONDS = 60.0

# The harness's own function tools: a file read and a command run, the two kinds of call that
# dominate coding-agent traces (AgentCgroup: Read/Edit vs Bash).
HARNESS_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "type": "function",
        "name": "run_command",
        "description": "Run a shell command in the repository.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1}},
            "required": ["command"],
        },
    },
]
WEB_SEARCH_TOOL = {"type": "web_search"}


@attrs.define
class TurnRecord:
    turn: int
    sent_at: float
    first_token_at: float | None = None
    ended_at: float | None = None
    tool_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    server_timing: dict[str, Any] | None = None
    response_id: str = ""
    usage: dict[str, Any] | None = None
    """The usage the turn's pause or terminal event carried: the response's so far (cumulative over a v1
    rollout's segments), None where the event carried none."""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at


@attrs.define
class RolloutRecord:
    design: str
    workload: str
    started_at: float
    ended_at: float = 0.0
    status: str = ""
    turns: list[TurnRecord] = attrs.Factory(list)
    transcript: list[dict[str, Any]] = attrs.Factory(list)  # every conversation item, ids removed
    usage: dict[str, int] = attrs.Factory(
        lambda: {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0}
    )
    timeline: list[tuple[float, str, str]] = attrs.Factory(list)  # (time, "send"/"recv", event type)
    response_ids: list[str] = attrs.Factory(list)
    sequence_numbers: list[tuple[str, int]] = attrs.Factory(list)  # (response id, sequence_number) per event
    # What recovering from lost connections cost (prototype/client/reconnecting.py); zero without faults.
    reconnects: int = 0  # new connections opened because one ended before the task did
    resent_bytes: int = 0  # request bytes sent again: retried requests and full-context resends
    full_resends: int = 0  # requests that carried the whole conversation again
    retried_responses: int = 0  # responses that failed on a live connection and were asked for again
    recovery_seconds: list[float] = attrs.Factory(list)  # from each failure to the retried response's first event
    fell_back_to_http: bool = False
    outcomes: dict[str, str] = attrs.Factory(dict)  # response id -> status of its terminal event, as received

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


def tool_output_text(workload: Workload, turn: int, index: int) -> str:
    # A turn past the workload's last (steering can add turns) is sized as the last: one token a call.
    sizes = workload.tool_output_tokens(min(turn, len(workload.turns) - 1))
    n_tokens = sizes[index] if index < len(sizes) else 1
    return tokenizer.text_of(np.random.default_rng([workload.text_seed & 0xFFFFFFFF, turn, 1000 + index]), n_tokens)


def _prefix_seed(prefix: str) -> int:
    return int.from_bytes(hashlib.blake2b(prefix.encode(), digest_size=4).digest(), "little")


def shared_instructions(workload: Workload) -> str | None:
    """The common prefix's text: the preset's system prompt, the same for every task with the same `prefix`
    (`prefix_tokens` one-token words); None for a task without one. Sent as `instructions`, which the API renders
    before the conversation together with the tool definitions (docs/parameters.md §1)."""
    if not workload.prefix_tokens:
        return None
    return tokenizer.text_of(np.random.default_rng([_prefix_seed(workload.prefix), 999_998]), workload.prefix_tokens)


def task_prompt(workload: Workload) -> str:
    """The task's own prompt: the rest of turn 0's tokens after the common prefix, from the task's content seed."""
    n_tokens = max(1, workload.turns[0].appended_tokens - workload.prefix_tokens)
    return tokenizer.text_of(np.random.default_rng([workload.text_seed & 0xFFFFFFFF, 999_999]), n_tokens)


def _strip_ids(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the conversation has it, whatever the design: without ids, status, or the reasoning blob that only
    some designs ask for."""
    return {k: v for k, v in item.items() if k not in ("id", "status", "encrypted_content")}


@attrs.define(eq=False)
class Rollout:
    """Shared bookkeeping of one rollout, whatever the transport. `clock` is the trio clock for the
    harness; a blocking client (prototype/client/sdk.py) passes `time.perf_counter`."""

    workload: Workload
    record: RolloutRecord
    clock: Callable[[], float] = trio.current_time
    _response_id: str = ""

    def received(self, event: dict[str, Any], size: int) -> None:
        now = self.clock()
        turn = self.record.turns[-1]
        turn.bytes_received += size
        event_type = event.get("type", "")
        self.record.timeline.append((now, "recv", event_type))
        if event_type == "response.created":
            self._response_id = event["response"]["id"]
        if "sequence_number" in event:
            self.record.sequence_numbers.append((self._response_id, event["sequence_number"]))
        if event_type in FIRST_TOKEN_TYPES and turn.first_token_at is None:
            turn.first_token_at = now
        elif event_type == "response.output_item.done":
            self.record.transcript.append(_strip_ids(event["item"]))
        if event_type in PAUSE_TYPES:
            turn.ended_at = now
            response = event.get("response") or {}
            turn.server_timing = response.get("testbed_timing")
            usage = response.get("usage")
            turn.response_id, turn.usage = self._response_id, usage
            if event_type in TERMINAL_TYPES:
                self.record.outcomes[response.get("id")] = response.get("status", "")
                if response.get("id") not in self.record.response_ids:
                    self.record.response_ids.append(response.get("id"))
                if usage:
                    self.record.usage["input_tokens"] += usage["input_tokens"]
                    self.record.usage["cached_tokens"] += usage["input_tokens_details"]["cached_tokens"]
                    self.record.usage["output_tokens"] += usage["output_tokens"]
                    details = usage.get("output_tokens_details") or {}
                    self.record.usage["reasoning_tokens"] += details.get("reasoning_tokens", 0)

    def start_turn(self, sent_items: list[dict[str, Any]], size: int, *, at: float | None = None) -> None:
        """A new turn whose request (`size` payload bytes) started at `at` (default now): the time the client set
        out to send it, before any connection it had to open first (docs/metrics.md)."""
        self.record.turns.append(TurnRecord(len(self.record.turns), self.clock() if at is None else at, bytes_sent=size))
        self.record.transcript.extend(_strip_ids(item) for item in sent_items)

    def tool_plan(self, calls: list[dict[str, Any]]) -> tuple[float, list[dict[str, Any]]]:
        """How long the turn's calls run (concurrently: the longest) and the outputs they return."""
        turn = self.record.turns[-1].turn
        seconds = self.workload.turns[min(turn, len(self.workload.turns) - 1)].tool_seconds
        wait = max((seconds[i] if i < len(seconds) else 0.0) for i in range(len(calls)))
        outputs = [
            {"type": "function_call_output", "call_id": call["call_id"], "output": tool_output_text(self.workload, turn, i)}
            for i, call in enumerate(calls)
        ]
        return wait, outputs

    async def run_tools(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run the turn's function calls on the trio clock; return their outputs in call order. The
        tools start when the event that handed them over arrived (the turn's end), so the harness's
        own work since (reading the event, building the outputs) runs inside the tool time instead
        of adding to it."""
        turn = self.record.turns[-1]
        start = self.clock() if turn.ended_at is None else turn.ended_at
        wait, outputs = self.tool_plan(calls)
        await trio.sleep_until(start + wait)
        turn.tool_seconds = self.clock() - start
        return outputs


# What Codex asks for when it does not store responses (docs/codex.md): the reasoning comes back as an opaque blob the
# client keeps, so the conversation can be resent in full.
INCLUDE_REASONING = ["reasoning.encrypted_content"]
REASONING = {"effort": "medium"}


def request_body(
    workload: Workload, *, model: str, metadata: dict[str, str], store: bool, include_reasoning: bool = False,
    instructions: str | None = None, compact_threshold: int | None = None,
) -> dict[str, Any]:
    """The fields every request of a rollout repeats (Codex resends instructions and tools every turn: they are not
    inherited through previous_response_id). `include_reasoning`: ask for reasoning items' encrypted_content, which a
    client that may have to resend the conversation needs (http stateless; chained, for a cache miss). `instructions`
    replaces the workload's shared ones (experiments/soak.py makes each conversation distinct with it)."""
    # The same tools on every task, as a real agent offers (web_search too: the model decides whether to search), so
    # the tool definitions are part of the common prefix.
    tools = [*HARNESS_TOOLS, WEB_SEARCH_TOOL]
    body: dict[str, Any] = {
        "model": model, "tools": tools, "metadata": metadata, "store": store, "tool_choice": "auto", "reasoning": REASONING,
    }
    if include_reasoning:
        body["include"] = INCLUDE_REASONING
    instructions = shared_instructions(workload) if instructions is None else instructions
    if instructions is not None:
        body["instructions"] = instructions
    if compact_threshold is not None:  # server-side compaction (experiments/compaction.py)
        body["context_management"] = [{"type": "compaction", "compact_threshold": compact_threshold}]
    return body


@asynccontextmanager
async def open_responses_websocket(
    connector: Connector, design: str, *, api_key: str = "testbed", include_timing: bool = False
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    headers = [(b"authorization", f"Bearer {api_key}".encode()), (b"openai-beta", BETA[design].encode())]
    if include_timing:
        headers.append((b"x-responsesapi-include-timing-metrics", b"true"))
    async with connector.open_stream() as stream, trio.open_nursery() as nursery:
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
                ws = await trio_websocket.wrap_client_stream(
                    nursery, stream, "testbed", "/v1/responses", extra_headers=headers, max_message_size=CLIENT_MAX_MESSAGE_BYTES,
                    receive_buffer_size=WS_RECEIVE_BYTES, message_queue_size=WS_MESSAGE_QUEUE,
                )
        except trio.TooSlowError:
            nursery.cancel_scope.cancel()
            raise trio_websocket.ConnectionTimeout(f"no handshake answer within {HANDSHAKE_TIMEOUT_SECONDS:g} s") from None
        try:
            yield ws
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT_SECONDS):
                await ws.aclose()
            nursery.cancel_scope.cancel()


class WsChannel:
    """JSON events over one WebSocket, counting payload bytes."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, rollout: Rollout) -> None:
        self.ws = ws
        self.rollout = rollout

    async def send(self, event: dict[str, Any]) -> int:
        raw = orjson.dumps(event)  # ~35 times faster than json on a 50 KB request
        # Non-ASCII text is sent escaped, as json.dumps writes it (and its byte count with it).
        text = raw.decode() if raw.isascii() else json.dumps(event, separators=(",", ":"))
        self.rollout.record.timeline.append((trio.current_time(), "send", event["type"]))
        await self.ws.send_message(text)
        return len(text)  # ASCII: one byte a character

    async def until_pause(self) -> dict[str, Any]:
        """Events until `response.done` or a terminal event; returns that event."""
        while True:
            message = received_message_nowait(self.ws)
            if message is None:
                message = await self.ws.get_message()
            event = orjson.loads(message)  # the standard library's reading of a well-formed event, faster
            self.rollout.received(event, len(message.encode()) if isinstance(message, str) else len(message))
            if event.get("type") in PAUSE_TYPES or event.get("type") == "error":
                return event


def function_calls(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in output if item.get("type") == "function_call"]


def turn_outcome(design: str, pause: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """What the event that ended a turn means for the rollout: `(status, [])` when the rollout is
    over (an error, a final answer, a failure), or `(None, calls)` when the client runs tools next:
    v1's `response.done`, or a chained turn that completed with function calls."""
    if pause["type"] == "error":
        return f"error:{pause['error']['code']}", []
    response = pause["response"]
    calls = function_calls(response["output"])
    if pause["type"] == "response.done" or (design == CHAINED and pause["type"] == "response.completed" and calls):
        return None, calls
    return response["status"], []


async def run_websocket_rollout(
    connector: Connector,
    design: str,
    workload: Workload,
    *,
    metadata: dict[str, str],
    model: str = "gpt-5.4",
    store: bool = False,
    include_timing: bool = False,
    api_key: str = "testbed",
    on_turn_end: Callable[[TurnRecord], None] | None = None,
    instructions: str | None = None,
    connected: Callable[[], Awaitable[None]] | None = None,
    compact_threshold: int | None = None,
) -> RolloutRecord:
    """One task over one WebSocket: `suspended` (create once, append per tool round) or `chained`
    (a create with previous_response_id per turn). `connected`, if given, is awaited once the
    connection is open; the task then starts when it returns, so its turns leave the handshake out
    (a benchmark of what follows it: experiments/streaming.py)."""
    rollout = Rollout(workload, RolloutRecord(design, workload.name, trio.current_time()))
    # v1 never needs the blob: its reasoning stays in the coroutine. v2 asks for it as Codex does without a store.
    base = request_body(
        workload, model=model, metadata=metadata, store=store, include_reasoning=design == CHAINED and not store, instructions=instructions,
        compact_threshold=compact_threshold,
    )
    first_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}]
    # Turn 0 starts before the connection is opened: its TCP, TLS and upgrade round trips are paid by the first
    # request, as an HTTP client's first request pays its connection (docs/metrics.md).
    started_at = rollout.record.started_at
    async with open_responses_websocket(connector, design, api_key=api_key, include_timing=include_timing) as ws:
        if connected is not None:
            await connected()
            started_at = rollout.record.started_at = trio.current_time()
        await drive_websocket_rollout(WsChannel(ws, rollout), rollout, design, base, first_input, on_turn_end, started_at=started_at)
        # The task ends at its final event; closing the socket afterwards is not part of it (the
        # HTTP harness likewise stops at the terminal event).
        rollout.record.ended_at = trio.current_time()
    return rollout.record


def is_steered(pause: dict[str, Any]) -> bool:
    """A response stopped for steering input: its automatic successor follows on the same lane."""
    details = (pause.get("response") or {}).get("incomplete_details") or {}
    return pause["type"] == "response.incomplete" and details.get("reason") == "steered"


async def drive_websocket_rollout(
    channel: Any,
    rollout: Rollout,
    design: str,
    base: dict[str, Any],
    first_input: list[dict[str, Any]],
    on_turn_end: Callable[[TurnRecord], None] | None = None,
    *,
    started_at: float | None = None,
) -> None:
    """The tool loop over a channel (a whole WebSocket, or one lane of a multiplexed one). A
    steered response is followed by its automatic successor: the loop reads on, sending nothing.
    `started_at`: when turn 0 started, before the connection it needed was opened (docs/metrics.md);
    later turns start when the previous turn's tools return, before the request is sent."""
    event: dict[str, Any] | None = {"type": "response.create", **base, "input": first_input}
    sent_items = first_input
    at = started_at
    while True:
        rollout.start_turn(sent_items, await channel.send(event) if event is not None else 0, at=at)
        at = None
        pause = await channel.until_pause()
        if on_turn_end is not None and pause["type"] != "error":
            on_turn_end(rollout.record.turns[-1])
        if is_steered(pause):
            event, sent_items = None, []
            continue
        final_status, calls = turn_outcome(design, pause)
        if final_status is not None:
            rollout.record.status = final_status
            return
        response = pause["response"]
        sent_items = await rollout.run_tools(calls)
        at = rollout.clock()  # the next request starts now, on the open connection
        if design == SUSPENDED:
            event = {"type": "response.append", "input": sent_items}
        else:
            event = {"type": "response.create", **base, "previous_response_id": response["id"], "input": sent_items}
