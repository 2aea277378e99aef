"""Helpers shared by the tests.

Rules every test here follows (after trio-websocket's test suite):
- servers run in-process; over memory streams under the `autojump_clock` (virtual time, exact
  assertions), or on 127.0.0.1 port 0 in real time; never another address;
- the client side closes first unless a test is about the server closing;
- every wait is bounded on the trio clock (`trio.fail_after`), so a broken server fails a test
  instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio_websocket
from trio_websocket import ConnectionClosed

from prototype import netem
from prototype.api.costs import ZERO_COSTS, ApiCosts
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import HARNESS_TOOLS, open_responses_websocket
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from tests.conftest import REPO

TERMINALS = {"response.completed", "response.failed", "response.incomplete"}
SPARK = "gpt-5.3-codex-spark"  # the model with the 128,000-token window (api/checks.py SPARK_CONTEXT_WINDOW)


class H11Client:
    """The client half of raw HTTP tests: h11 over one stream, reading as the state machine needs."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def _next(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(await self.stream.receive_some(65536))


def make_server(*, costs: ApiCosts = ZERO_COSTS, config: ServerConfig | None = None, **api_fields: Any) -> ResponsesServer:
    return ResponsesServer(ApiService(costs=costs, **api_fields), config or ServerConfig())


def create_event(input: Any = "fix the bug", *, metadata: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "type": "response.create",
        "model": "sim-1000",
        "input": input,
        "tools": HARNESS_TOOLS,
        "metadata": metadata or {"testbed_workload": "fixed:3"},
        "store": False,
        **fields,
    }


def ws(server: ResponsesServer, design: str = "chained", *, network: netem.NetworkProfile | None = None, **kwargs: Any):
    """A harness WebSocket to `server` in memory; `network`: None for a zero-latency pipe, or a link
    with delay (DELAYED_LINK)."""
    return open_responses_websocket(InMemoryConnector(server, network), design, **kwargs)


async def send(conn, event: dict[str, Any] | str | bytes) -> None:
    """`event` as JSON text, or a text or binary frame as it is."""
    await conn.send_message(event if isinstance(event, (str, bytes)) else json.dumps(event))


async def receive(conn, timeout: float = 600) -> dict[str, Any]:
    with trio.fail_after(timeout):
        return json.loads(await conn.get_message())


async def until(conn, *types: str, timeout: float = 600) -> list[dict[str, Any]]:
    """Every event up to and including the first whose type is in `types` (or an error)."""
    events = []
    with trio.fail_after(timeout):
        while True:
            event = json.loads(await conn.get_message())
            events.append(event)
            if event["type"] in types or event["type"] == "error":
                return events


async def timed_until(conn, *types: str, timeout: float = 600) -> list[tuple[float, dict[str, Any]]]:
    """`until`, with the virtual time each event arrived."""
    seen = []
    with trio.fail_after(timeout):
        while True:
            event = json.loads(await conn.get_message())
            seen.append((trio.current_time(), event))
            if event["type"] in types or event["type"] == "error":
                return seen


def outputs_for(calls: list[dict[str, Any]], text: str = "ok") -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": c["call_id"], "output": text} for c in calls]


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def events_by_response(events: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """The numbered events (those with a `sequence_number`) grouped by the response they belong to: the
    id of the latest `response.created` before them (None before the first)."""
    grouped: dict[str | None, list[dict[str, Any]]] = {}
    current = None
    for event in events:
        if event["type"] == "response.created":
            current = event["response"]["id"]
        if "sequence_number" in event:
            grouped.setdefault(current, []).append(event)
    return grouped


# The link a transport test runs over besides a zero-latency pipe: the benchmark's default network
# (prototype/benchmark.py DEFAULT_NETWORK, 20 ms RTT), with no handshake charged so a test's times
# count from its first frame.
DELAYED_LINK = netem.NetworkProfile(rtt=netem.SAME_REGION.rtt, tcp_round_trips=0, tls_round_trips=0)


@attrs.define(eq=False)
class DelayedConnector:
    """Opens in-memory links with `network`'s delays (netem.open_emulated_pair), the server's side of
    each run in `nursery`, so a test can wait for every server task to end."""

    server: Any
    nursery: trio.Nursery
    network: netem.NetworkProfile = DELAYED_LINK

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        async with netem.open_emulated_pair(self.network) as (client, server_end):
            self.nursery.start_soon(self.server.handle_stream, server_end)
            yield client


# --- a scripted WebSocket server, for clients held to exact frames -------------------------------------


class Close:
    """In a script: the server closes the connection with this code."""

    def __init__(self, code: int) -> None:
        self.code = code


class Pause:
    """In a script: the server waits this many seconds before its next frame."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class ScriptedServer:
    """A WebSocket server that answers each frame it receives (on whichever connection) with the next reply of its
    script: events to send (a `bytes` one as a binary frame), `Pause`s, then optionally a `Close`. It records every frame as `(connection, event)`. A frame
    past the end of the script is answered with close 1011, so a client that asks once too often fails its test."""

    def __init__(self, replies: list[list[dict[str, Any] | bytes | Close | Pause]]) -> None:
        self.replies = list(replies)
        self.received: list[tuple[int, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []  # each connection's handshake headers
        self.connections = 0

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        connection = self.connections
        self.connections += 1
        async with trio.open_nursery() as nursery:
            request = await trio_websocket.wrap_server_stream(nursery, stream)
            self.headers.append({name.decode(): value.decode() for name, value in request.headers})
            socket = await request.accept()
            try:
                while True:
                    self.received.append((connection, json.loads(await socket.get_message())))
                    for frame in self.replies.pop(0) if self.replies else [Close(1011)]:
                        if isinstance(frame, Close):
                            await socket.aclose(frame.code)
                            return
                        if isinstance(frame, Pause):
                            await trio.sleep(frame.seconds)
                            continue
                        await socket.send_message(frame if isinstance(frame, bytes) else json.dumps(frame, ensure_ascii=False))
            except trio_websocket.ConnectionClosed:
                pass
            finally:
                nursery.cancel_scope.cancel()


async def closed_after(conn) -> tuple[list[dict[str, Any]], int, str]:
    """The events up to the server's close, and its close code and reason."""
    events = []
    with trio.fail_after(100), pytest.raises(ConnectionClosed) as closed:
        while True:
            events.append(await receive(conn))
    return events, closed.value.reason.code, closed.value.reason.reason


def slowed(monkeypatch, owner: Any, name: str):
    """Patches `owner.name` so that each call first moves the running trio clock on by the seconds last given to the
    setter it returns (0 until then): the testbed's own CPU work, which a response's modeled schedule absorbs."""
    original, taking = getattr(owner, name), [0.0]

    def slow(*args: Any, **kwargs: Any) -> Any:
        trio.lowlevel.current_clock().jump(taking[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)
    return lambda seconds: taking.__setitem__(0, seconds)


def exactly(seconds: float) -> Any:
    """A virtual time, equal up to float rounding."""
    return pytest.approx(seconds, rel=1e-9, abs=1e-12)


def exit_code(call, *args: Any) -> int | str | None:
    """The code `call(*args)` exits with, by SystemExit as argparse raises it."""
    with pytest.raises(SystemExit) as exited:
        call(*args)
    return exited.value.code


def child_env(tmp_path) -> dict[str, str]:
    """A `python -m` child's environment: this checkout's code, its results and cache in `tmp_path`."""
    return dict(os.environ, PYTHONPATH=str(REPO), TESTBED_RESULTS=str(tmp_path / "results"), TESTBED_CACHE=str(tmp_path / "cache"),
                MPLBACKEND="Agg")


def run_into_a_closed_pipe(tmp_path, *argv: str) -> None:
    """`python -m <argv>` with its stdout a pipe whose reader has gone (`| head -0`): it exits 0, no traceback."""
    with open(tmp_path / "stderr", "w") as stderr:
        child = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=stderr, env=child_env(tmp_path),
                                 cwd=tmp_path)
        child.stdout.close()  # every line it prints meets a closed pipe
        assert child.wait(timeout=300) == 0
    err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
