"""The benchmark's rollout through openai-python, a client nobody here wrote.

`run_sdk_rollout` plays the same workload as `harness.run_websocket_rollout`: the same task prompt,
the same tools (`HARNESS_TOOLS`), the same tool outputs and tool times, the same request fields,
but over `OpenAI().responses.connect()`:

* chained (v2): `conn.response.create(...)` per turn, with `previous_response_id` after the first;
* suspended (v1): `connect(extra_headers={"OpenAI-Beta": "responses_websockets=2026-02-04"})`, one
  `conn.response.create(...)`, then `response.append` frames through `conn.send_raw(...)` (the SDK
  has no typed method for an event the public API lacks; docs/protocol.md).

It records the same `RolloutRecord`/`TurnRecord` fields as the harness. The SDK's client blocks,
so times are real time from `time.perf_counter` (never the trio clock), and tools wait with
`time.sleep`. Run it standalone, or from trio in a worker thread:
`await trio.to_thread.run_sync(functools.partial(run_sdk_rollout, ...), abandon_on_cancel=True)`.
Every rollout is bounded by `timeout`: past it the connection is closed and `TimeoutError` raised.

Wire bytes differ from the harness's for the same events: the SDK serializes with `json.dumps`'
default separators and sends only the fields given, in its own order. `bytes_sent` counts what the
SDK actually wrote.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

from ..protocol.wire import TIMING_HEADER
from ..workload import Workload
from .harness import (
    BETA,
    CHAINED,
    FIRST_TOKEN_TYPES,
    HARNESS_TOOLS,
    PAUSE_TYPES,
    SUSPENDED,
    Rollout,
    RolloutRecord,
    TurnRecord,
    request_body,
    run_websocket_rollout,
    task_prompt,
    turn_outcome,
)

DEFAULT_TIMEOUT_S = 600.0
MAX_EVENTS_PER_TURN = 1_000_000  # a runaway stream ends the rollout instead of looping forever


class SdkRollout(Rollout):
    """The harness's bookkeeping on the `time.perf_counter` clock, with tools that block."""

    def __init__(self, workload: Workload, record: RolloutRecord) -> None:
        super().__init__(workload, record, clock=time.perf_counter)

    def run_tools(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:  # type: ignore[override]
        wait, outputs = self.tool_plan(calls)
        start = time.perf_counter()
        time.sleep(wait)
        self.record.turns[-1].tool_seconds = time.perf_counter() - start
        return outputs


class _SentBytes:
    """Counts the bytes the SDK writes to its socket. `conn.send` and `conn.send_raw` both end in
    the connection's `_send(data)`; wrapping that one instance attribute sees the SDK's own
    serialization. If a later SDK renames it, the count falls back to our own JSON encoding."""

    def __init__(self, conn: Any) -> None:
        self.total = 0
        self.exact = callable(getattr(conn, "_send", None))
        if self.exact:
            inner = conn._send

            def counting_send(data: bytes | str) -> None:
                self.total += len(data.encode() if isinstance(data, str) else data)
                inner(data)

            conn._send = counting_send

    def measure(self, send: Callable[[], None], fallback: dict[str, Any]) -> int:
        before = self.total
        send()
        return self.total - before if self.exact else len(json.dumps(fallback).encode())


def run_sdk_rollout(
    base_url: str,
    design: str,
    workload: Workload,
    *,
    metadata: dict[str, str],
    model: str = "gpt-5.4",
    api_key: str = "testbed",
    store: bool = False,
    include_timing: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    on_turn_end: Callable[[TurnRecord], None] | None = None,
) -> RolloutRecord:
    """One task over one WebSocket opened by openai-python; `base_url` is the HTTP base
    (`http://127.0.0.1:PORT/v1`), from which the SDK derives `ws://…/v1/responses`."""
    from openai import OpenAI  # the test extra installs it; the package itself does not need it

    if design not in (SUSPENDED, CHAINED):
        raise ValueError(f"design must be {SUSPENDED!r} or {CHAINED!r}, not {design!r}")
    rollout = SdkRollout(workload, RolloutRecord(design, workload.name, time.perf_counter()))  # before connect()
    base = request_body(workload, model=model, metadata=metadata, store=store, include_reasoning=design == CHAINED and not store)
    first_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}]
    headers = {"OpenAI-Beta": BETA[design]}
    if include_timing:
        headers[TIMING_HEADER] = "true"

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    timed_out = threading.Event()
    try:
        with client.responses.connect(extra_headers=headers) as conn:

            def expire() -> None:
                timed_out.set()
                conn.close()

            watchdog = threading.Timer(timeout, expire)
            watchdog.daemon = True
            watchdog.start()
            try:
                _drive(conn, rollout, design, base, first_input, on_turn_end)
                # The task ends at its final event; closing the socket is not part of it (as in the harness).
                rollout.record.ended_at = time.perf_counter()
            except Exception as exc:
                if timed_out.is_set():
                    raise TimeoutError(f"SDK rollout did not finish within {timeout} s") from exc
                raise
            finally:
                watchdog.cancel()
    finally:
        client.close()
    return rollout.record


def _drive(
    conn: Any,
    rollout: SdkRollout,
    design: str,
    base: dict[str, Any],
    first_input: list[dict[str, Any]],
    on_turn_end: Callable[[TurnRecord], None] | None,
) -> None:
    sent = _SentBytes(conn)

    def timeline_send(event_type: str) -> None:
        rollout.record.timeline.append((time.perf_counter(), "send", event_type))

    def create(fields: dict[str, Any]) -> int:
        timeline_send("response.create")
        return sent.measure(lambda: conn.response.create(**fields), {"type": "response.create", **fields})

    def append(items: list[dict[str, Any]]) -> int:
        event = {"type": "response.append", "input": items}
        timeline_send("response.append")
        return sent.measure(lambda: conn.send_raw(json.dumps(event)), event)

    def until_pause() -> dict[str, Any]:
        for _ in range(MAX_EVENTS_PER_TURN):
            data = conn.recv_bytes()
            typed = conn.parse_event(data)  # the SDK's own model; `.type` is kept for unknown types
            event = json.loads(data)
            rollout.received(event, len(data))
            if typed.type in PAUSE_TYPES or typed.type == "error":
                return event
        raise RuntimeError(f"more than {MAX_EVENTS_PER_TURN} events in one turn")

    sent_items = first_input
    # Turn 0 started with the rollout, before `connect()` opened the socket (docs/metrics.md).
    started_at = rollout.record.started_at
    size = create({**base, "input": first_input})
    while True:
        rollout.start_turn(sent_items, size, at=started_at)
        pause = until_pause()
        if on_turn_end is not None and pause["type"] != "error":
            on_turn_end(rollout.record.turns[-1])
        final_status, calls = turn_outcome(design, pause)
        if final_status is not None:
            rollout.record.status = final_status
            return
        response = pause["response"]
        sent_items = rollout.run_tools(calls)
        started_at = time.perf_counter()
        if design == SUSPENDED:
            size = append(sent_items)
        else:
            size = create({**base, "previous_response_id": response["id"], "input": sent_items})


async def run_sdk_websocket_rollout(
    connector: Any,
    design: str,
    workload: Workload,
    *,
    metadata: dict[str, str],
    model: str = "gpt-5.4",
    store: bool = False,
    include_timing: bool = False,
    api_key: str = "testbed",
    on_turn_end: Callable[[TurnRecord], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - bounds the blocking SDK rollout in its thread
) -> RolloutRecord:
    """A drop-in for `harness.run_websocket_rollout` in trio code (experiments): the same arguments,
    the rollout driven by openai-python in a worker thread. `connector` must be a `TcpConnector`
    without a network profile (the SDK opens its own socket, so the WAN emulator cannot sit under
    it). Times in the record are `time.perf_counter` seconds: compare durations, not instants, with
    records of the built-in harness. `on_turn_end` runs on the worker thread."""
    host, port = getattr(connector, "host", None), getattr(connector, "port", None)
    if host is None or port is None or getattr(connector, "network", None) is not None:
        raise ValueError("the SDK client needs a TcpConnector(host, port) without a network profile")
    run = functools.partial(
        run_sdk_rollout, f"http://{host}:{port}/v1", design, workload, metadata=metadata, model=model, api_key=api_key,
        store=store, include_timing=include_timing, timeout=timeout, on_turn_end=on_turn_end,
    )
    return await trio.to_thread.run_sync(run, abandon_on_cancel=True)


def rollout_client(name: str) -> Callable[..., Any]:
    """`"harness"`: the built-in trio client; `"sdk"`: openai-python. Both are awaited the same way."""
    clients = {"harness": run_websocket_rollout, "sdk": run_sdk_websocket_rollout}
    if name not in clients:
        raise ValueError(f"unknown rollout client {name!r}; choose one of {sorted(clients)}")
    return clients[name]


# --- lanes and steering through openai-python -------------------------------------------


def run_sdk_lanes(
    base_url: str,
    workloads: list[Workload],
    *,
    metadata_for: Callable[[int], dict[str, str]],
    model: str = "gpt-5.4",
    api_key: str = "testbed",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[RolloutRecord]:
    """N tasks at once over one openai-python connection, task i on `stream_id` `agent-i`
    (`conn.response.create(stream_id=...)`). The SDK has one blocking receiver per connection: a
    reader thread routes events by `stream_id` into a queue, and this thread runs each lane's tool
    loop, waiting out tool times with a timer heap instead of `time.sleep`."""
    import heapq
    import queue

    from openai import OpenAI

    lanes = {f"agent-{i}": i for i in range(len(workloads))}
    rollouts = [SdkRollout(w, RolloutRecord(CHAINED, w.name, time.perf_counter())) for w in workloads]
    bases = [request_body(w, model=model, metadata=metadata_for(i), store=False) for i, w in enumerate(workloads)]
    inbox: queue.Queue = queue.Queue()
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    deadline = time.perf_counter() + timeout
    try:
        with client.responses.connect(extra_headers={"OpenAI-Beta": BETA[CHAINED]}) as conn:

            def read() -> None:
                try:
                    while True:
                        data = conn.recv_bytes()
                        inbox.put((json.loads(data), len(data)))
                except Exception as exc:  # the connection closed: the loop below stops on it
                    inbox.put((exc, 0))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            timers: list[tuple[float, int, list[dict[str, Any]]]] = []
            for stream_id, i in lanes.items():
                first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workloads[i])}]}]
                rollouts[i].start_turn(first, 0)
                conn.response.create(**bases[i], input=first, stream_id=stream_id)
            running = len(workloads)
            while running:
                now = time.perf_counter()
                if now > deadline:
                    raise TimeoutError(f"SDK lanes did not finish within {timeout} s")
                while timers and timers[0][0] <= now:
                    _, i, outputs = heapq.heappop(timers)
                    rollouts[i].start_turn(outputs, 0)
                    previous = rollouts[i].record.response_ids[-1]
                    conn.response.create(**bases[i], previous_response_id=previous, input=outputs, stream_id=f"agent-{i}")
                wait = (timers[0][0] - now) if timers else deadline - now
                try:
                    event, size = inbox.get(timeout=max(0.0, wait))
                except queue.Empty:
                    continue
                if isinstance(event, Exception):
                    raise event
                i = lanes[event["stream_id"]]
                rollouts[i].received(event, size)
                if event["type"] not in PAUSE_TYPES and event["type"] != "error":
                    continue
                status, calls = turn_outcome(CHAINED, event)
                if status is not None:
                    rollouts[i].record.status = status
                    rollouts[i].record.ended_at = time.perf_counter()
                    running -= 1
                    continue
                wait_s, outputs = rollouts[i].tool_plan(calls)
                rollouts[i].record.turns[-1].tool_seconds = wait_s
                heapq.heappush(timers, (time.perf_counter() + wait_s, i, outputs))
    finally:
        client.close()
    return [rollout.record for rollout in rollouts]


def run_sdk_steer(
    base_url: str,
    *,
    metadata: dict[str, str],
    text: str,
    after_deltas: int = 1,
    model: str = "gpt-5.4",
    api_key: str = "testbed",
    stream_id: str | None = "main",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Create, steer with `text` after `after_deltas` text deltas (`conn.response.steer`), and read
    until the automatic successor's first token or the steer's failure. Returns the events seen (as
    the SDK parsed them: `.type`) and the seconds from the steer to the successor's first token."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
    seen: list[dict[str, Any]] = []
    try:
        with client.responses.connect(extra_headers={"OpenAI-Beta": BETA[CHAINED]}) as conn:
            fields: dict[str, Any] = {"model": model, "metadata": metadata, "store": False, "tools": list(HARNESS_TOOLS)}
            if stream_id is not None:
                fields["stream_id"] = stream_id
            conn.response.create(**fields, input="start the task")
            deltas, steered_at, target, successor = 0, None, None, None
            deadline = time.perf_counter() + timeout
            while time.perf_counter() < deadline:
                data = conn.recv_bytes()
                typed = conn.parse_event(data)
                event = json.loads(data)
                seen.append(event)
                if typed.type == "response.created":
                    if target is None:
                        target = event["response"]["id"]
                    else:
                        successor = event["response"]["id"]
                elif typed.type in FIRST_TOKEN_TYPES and successor is not None:
                    return {"events": seen, "steer_to_token_s": time.perf_counter() - steered_at}
                elif typed.type == "response.output_text.delta" and steered_at is None:
                    deltas += 1
                    if deltas >= after_deltas:
                        steered_at = time.perf_counter()
                        conn.response.steer(input=text, previous_response_id=target)
                elif typed.type in ("response.steer.failed", "error"):
                    return {"events": seen, "steer_to_token_s": None}
            raise TimeoutError(f"no successor token within {timeout} s")
    finally:
        client.close()
