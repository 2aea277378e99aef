"""Faults: disconnects, a server restart between turns, an engine failure mid-decode, a client that stops reading
(over `pipe_pair`, a bounded in-memory stream, so writers block), and experiments.faults' counting."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from support import make_server, receive, send, until
from test_bad_input import (
    BOTH,
    ONE_TURN,
    TERMINALS,
    Bystander,
    assert_released,
    bystander_baseline,
    calls_of,
    create,
    output,
    session_kv,
    turn,
)

from experiments import faults
from prototype import benchmark, uncertainty
from prototype.api.store import ResponseStore
from prototype.client import harness
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import BETA, CHAINED, SUSPENDED, open_responses_websocket
from prototype.client.reconnect import CODEX, OPENAI_PYTHON
from prototype.designs.emitter import EngineFailure
from prototype.designs.sampling import SamplingLoop
from prototype.engine.streaming import ContextWindowExceeded, FaultPlan
from prototype.netem.faults import LinkFaults
from prototype.protocol import errors
from prototype.server.config import ServerConfig
from prototype.server.websocket import CLOSE_HANDSHAKE_SECONDS
from prototype.workload import fixed

# --- a bounded in-memory stream ---------------------------------------------------------------------


@attrs.define(eq=False)
class Pipe:
    """One direction of a bounded byte stream: a writer blocks while `capacity` bytes wait unread,
    as a TCP sender does when the receiver's window and its own send buffer are full."""

    capacity: int
    buffer: bytearray = attrs.Factory(bytearray)
    written: int = 0  # bytes ever accepted from the writer
    writer_closed: bool = False
    reader_closed: bool = False
    _changed: trio.Event = attrs.Factory(trio.Event)

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        view = memoryview(bytes(data))
        while view:
            if self.writer_closed:
                raise trio.ClosedResourceError
            if self.reader_closed:
                raise trio.BrokenResourceError("the reader went away")
            room = self.capacity - len(self.buffer)
            if room <= 0:
                await self._changed.wait()
                continue
            chunk = view[:room]
            self.buffer += chunk
            self.written += len(chunk)
            view = view[len(chunk):]
            self.notify()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def read(self, max_bytes: int | None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self.buffer and not self.writer_closed:
            if self.reader_closed:
                raise trio.ClosedResourceError
            await self._changed.wait()
        if self.reader_closed:
            raise trio.ClosedResourceError
        n = len(self.buffer) if max_bytes is None else min(max_bytes, len(self.buffer))
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.notify()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data


class PipeStream(trio.abc.Stream):
    def __init__(self, out: Pipe, into: Pipe) -> None:
        self.out, self.into = out, into

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.out.write(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.into.read(max_bytes)

    async def aclose(self) -> None:
        self.out.writer_closed = True  # the peer reads what is left, then EOF
        self.out.notify()
        self.into.reader_closed = True  # the peer's writes now fail
        self.into.buffer.clear()
        self.into.notify()
        await trio.lowlevel.checkpoint()


def pipe_pair(capacity: int) -> tuple[PipeStream, PipeStream, Pipe]:
    """(client end, server end, the server-to-client pipe)."""
    up, down = Pipe(capacity), Pipe(capacity)
    return PipeStream(up, down), PipeStream(down, up), down


@attrs.define(eq=False)
class PipeConnector:
    """Opens bounded pipes to `server`; the server's side of each runs in `nursery`."""

    server: Any
    nursery: trio.Nursery
    capacity: int = 16 * 1024
    downs: list[Pipe] = attrs.Factory(list)  # the server-to-client pipe of each connection, in order

    @asynccontextmanager
    async def open_stream(self) -> AsyncIterator[trio.abc.Stream]:
        client, server_end, down = pipe_pair(self.capacity)
        self.downs.append(down)
        self.nursery.start_soon(self.server.handle_stream, server_end)
        try:
            yield client
        finally:
            await client.aclose()


async def server_tasks_end(nursery: trio.Nursery, server: Any, limit: float = 1.0) -> float:
    """Seconds until every server-side task of the connections has ended (at most `limit`)."""
    start = trio.current_time()
    with trio.fail_after(limit):
        while nursery.child_tasks or server.sessions or server.connections:
            await trio.sleep(0.001)
    return trio.current_time() - start


@asynccontextmanager
async def raw_ws(connector: Any, design: str) -> AsyncIterator[tuple[trio_websocket.WebSocketConnection, trio.abc.Stream]]:
    """A client WebSocket and its byte stream, so a test can drop the stream without a close frame."""
    async with connector.open_stream() as stream, trio.open_nursery() as nursery:
        headers = [(b"authorization", b"Bearer testbed"), (b"openai-beta", BETA[design].encode())]
        ws = await trio_websocket.wrap_client_stream(nursery, stream, "testbed", "/v1/responses", extra_headers=headers, max_message_size=1 << 30)
        try:
            yield ws, stream
        finally:
            nursery.cancel_scope.cancel()


LONG_TOKENS = 1000
LONG = f"fixed:1:50:10:{LONG_TOKENS}:0"  # one turn of 1,000 output tokens: 20 s at sim-50, 1 s at sim-1000
# Bad frames a non-reading client keeps sending: 800 of 100 bytes, more than twice what the pipe
# and the server's read buffers hold.
FLOOD = 800
FLOOD_FRAME = json.dumps({"type": "response.fly", "pad": "x" * 70})


# --- disconnects ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("abrupt", [True, False], ids=["dropped", "closed"])
@pytest.mark.parametrize(("design", "moment"), [(SUSPENDED, "mid-stream"), (SUSPENDED, "suspended"), (CHAINED, "mid-stream"),
                                               (CHAINED, "between turns")])
async def test_disconnect_releases_the_rollout_within_a_second(autojump_clock, nursery, design: str, moment: str, abrupt: bool) -> None:
    server = make_server()
    watcher = await Bystander.beside(server, nursery)
    async with trio.open_nursery() as server_side:
        connector = PipeConnector(server, server_side)
        async with raw_ws(connector, design) as (conn, stream):
            if moment == "mid-stream":
                await send(conn, create(metadata={"testbed_workload": LONG}))
                await until(conn, "response.output_text.delta")
            else:
                await turn(conn, create())
            (mine,) = [s for s in server.sessions if isinstance(s.ws._stream.inner, PipeStream)]
            key = mine.cache.engine_key if design == CHAINED else next(k for k in session_kv(server) if k[0] == SUSPENDED)
            assert key in session_kv(server)
            if abrupt:
                await stream.aclose()  # no close frame: what a crashed client or a dead network leaves
            else:
                await conn.aclose()
            disconnected_at = trio.current_time()
            with trio.fail_after(1):  # this connection's server tasks end; the bystander's go on
                while server_side.child_tasks or mine in server.sessions:
                    await trio.sleep(0.001)
        assert trio.current_time() - disconnected_at <= 1.0 and key not in session_kv(server)
        assert not watcher.done.is_set()  # the bystander was still running all along
    # The bystander, running all along on another connection, saw nothing of it.
    await watcher.check()


# --- a server restart between turns ---------------------------------------------------------------


def strip(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k not in ("id", "status")} for item in items]


async def uninterrupted_chain(turns: int) -> list[dict[str, Any]]:
    """The outputs of `turns` chained turns of SMALL on one connection of one server."""
    server = make_server()
    outputs = []
    async with open_responses_websocket(InMemoryConnector(server), CHAINED) as conn:
        previous = None
        for _ in range(turns):
            fields = {"previous_response_id": previous["id"], "input": [output(calls_of(previous)[0])]} if previous else {}
            previous = (await turn(conn, create(**fields)))[-1]["response"]
            outputs.append(strip(previous["output"]))
    return outputs


async def test_restart_with_store_true_continues_the_chain_through_hydration(autojump_clock, tmp_path) -> None:
    before = make_server(store=ResponseStore(str(tmp_path / "responses.db")))
    async with open_responses_websocket(InMemoryConnector(before), CHAINED) as conn:
        first = (await turn(conn, create(store=True)))[-1]["response"]
    await trio.sleep(1)  # the overlapped post-inference work (the store write) has finished
    before.api.store.close()  # the process is gone; only the file remains
    after = make_server(store=ResponseStore(str(tmp_path / "responses.db")))
    async with open_responses_websocket(InMemoryConnector(after), CHAINED, include_timing=True) as conn:
        second = (await turn(conn, create(store=True, previous_response_id=first["id"], input=[output(calls_of(first)[0])])))[-1]["response"]
        assert second["status"] == "completed" and second["previous_response_id"] == first["id"]
        assert "store_read" in second["testbed_timing"]["phases_ms"]  # rebuilt from the store
        third = (await turn(conn, create(store=True, previous_response_id=second["id"], input=[output(calls_of(second)[0])])))[-1]["response"]
        assert "store_read" not in third["testbed_timing"]["phases_ms"]  # the cache again
    # The same conversation as without the restart.
    assert [strip(r["output"]) for r in (first, second, third)] == await uninterrupted_chain(3)


# --- an engine failure mid-decode ---------------------------------------------------------------------


def only_session(server) -> Any:
    (session,) = server.sessions
    return session


def assert_one_terminal_and_numbered(events: list[dict[str, Any]]) -> None:
    numbered = [e["sequence_number"] for e in events if "sequence_number" in e]
    assert numbered == list(range(numbered[0], numbered[0] + len(numbered)))
    assert sum(e["type"] in TERMINALS for e in events) == 1 and events[-1]["type"] in TERMINALS


# What a response that an injected engine fault ends carries: the schema's code, a message saying what failed.
INJECTED_FAILURE = {"code": "server_error", "message": "The engine failed mid-response: injected engine failure"}


async def test_an_engine_failure_or_a_refused_turn_on_v2_fails_the_turn_and_empties_the_cache(autojump_clock) -> None:
    server = make_server()
    async with open_responses_websocket(InMemoryConnector(server), CHAINED) as conn:
        first = (await turn(conn, create()))[-1]["response"]
        assert only_session(server).cache.response_id == first["id"]
        server.api.engine.faults = FaultPlan(flushes_before_failure=2)  # the third flush fails
        events = await turn(conn, create(previous_response_id=first["id"], input=[output(calls_of(first)[0])]))
        assert [e["type"] for e in events] == [
            "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.delta", "response.failed"]
        assert_one_terminal_and_numbered(events)
        failed = events[-1]["response"]
        assert (failed["status"], failed["error"]) == ("failed", INJECTED_FAILURE)
        session = only_session(server)
        assert (session.cache.response_id, session.cache.context, session.cache.response) == (None, None, None)
        # The connection is usable; neither id can be chained from.
        for stale in (first["id"], failed["id"]):
            missing = await turn(conn, create(previous_response_id=stale, input=[output(calls_of(first)[0])]))
            assert missing[-1]["error"]["code"] == errors.PREVIOUS_RESPONSE_NOT_FOUND
        again = (await turn(conn, create()))[-1]["response"]
        assert again["status"] == "completed" and only_session(server).cache.response_id == again["id"]
        # docs/protocol.md: a failed turn never leaves a response in the slot ("we empty the slot altogether"),
        # whether or not it chained from one; nor does a request refused at its start (a turn-level 400).
        server.api.engine.faults = FaultPlan()
        assert (await turn(conn, create()))[-1]["type"] == "response.failed" and only_session(server).cache.response_id is None
        missing = await turn(conn, create(previous_response_id=again["id"], input=[output(calls_of(again)[0])]))
        assert missing[-1]["error"]["code"] == errors.PREVIOUS_RESPONSE_NOT_FOUND
        second = (await turn(conn, create()))[-1]["response"]
        refused = await turn(conn, create(metadata={"testbed_workload": "nope"}))
        assert refused[-1]["error"]["code"] == errors.INVALID_VALUE and only_session(server).cache.response_id is None
        missing = await turn(conn, create(previous_response_id=second["id"], input=[output(calls_of(second)[0])]))
        assert missing[-1]["error"]["code"] == errors.PREVIOUS_RESPONSE_NOT_FOUND
    await assert_released(server)


# Each way a v1 resume fails once its append is taken: the events of the resume, and the response's error.


def fail_a_flush(server, monkeypatch, done) -> tuple[list[str], Any]:
    monkeypatch.setattr(server.api.engine, "faults", FaultPlan(flushes_before_failure=1))  # the resume's second flush fails
    return (["response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta",
             "response.failed"], lambda: INJECTED_FAILURE)


def fail_taking_the_append(server, monkeypatch, done) -> tuple[list[str], Any]:
    async def failing(self, items):
        raise EngineFailure("the engine went away while the append was rendered")

    monkeypatch.setattr(SamplingLoop, "take_new_items", failing)
    return ["response.in_progress", "response.failed"], lambda: {
        "code": "server_error", "message": "The engine failed mid-response: the engine went away while the append was rendered"}


def refuse_past_the_window(server, monkeypatch, done) -> tuple[list[str], Any]:
    # A real engine's window (VllmEngine raises it before sending vLLM a request it would refuse); here the simulated
    # engine refuses any prompt longer than the rollout's first, so the resume is refused.
    engine_class, window, refused = type(server.api.engine), done["usage"]["input_tokens"], []
    prefill_call = engine_class.prefill_call

    async def refusing(self, latency, call, **kwargs):
        if len(call.prompt) > window:
            refused.append(len(call.prompt))
            raise ContextWindowExceeded(len(call.prompt), window)
        return await prefill_call(self, latency, call, **kwargs)

    monkeypatch.setattr(engine_class, "prefill_call", refusing)
    # Found once the response has started: the schema's `server_error`, never `context_length_exceeded`.
    return ["response.in_progress", "response.failed"], lambda: {"code": "server_error", "message": (
        f"The engine failed mid-response: its context of {refused[0]:,} tokens exceeds the context window of {window:,} tokens")}


@pytest.mark.parametrize("failure", [fail_a_flush, fail_taking_the_append, refuse_past_the_window])
async def test_a_resume_that_fails_on_v1_fails_the_rollout_once_and_frees_it(autojump_clock, monkeypatch, failure) -> None:
    server = make_server()
    async with open_responses_websocket(InMemoryConnector(server), SUSPENDED) as conn:
        events = await turn(conn, create())
        done = events[-1]["response"]
        with monkeypatch.context() as patched:
            types, error = failure(server, patched, done)
            await send(conn, {"type": "response.append", "input": [output(calls_of(done)[0])]})
            rest = await until(conn, *TERMINALS)
        assert [e["type"] for e in rest] == types
        assert_one_terminal_and_numbered(events + rest)
        assert (rest[-1]["response"]["id"], rest[-1]["response"]["error"]) == (done["id"], error())
        assert only_session(server).slot.current is None and session_kv(server) == {}
        # The append was taken (it started the resume); a second one finds nothing suspended.
        await send(conn, {"type": "response.append", "input": [output(calls_of(done)[0])]})
        assert (await receive(conn))["error"]["code"] == errors.NO_SUSPENDED_RESPONSE
        assert (await turn(conn, create(metadata={"testbed_workload": ONE_TURN})))[-1]["type"] == "response.completed"
    await assert_released(server)


# --- a client that stops reading ----------------------------------------------------------------------


async def test_a_response_whose_client_stopped_reading_ends_after_the_lifetime_grace(autojump_clock, nursery) -> None:
    # At the connection limit a response in flight may finish; one that cannot (its client reads nothing, so it is
    # blocked writing) is cancelled `lifetime_grace` later and the connection closes: it is not held for ever.
    server = make_server(config=ServerConfig(connection_lifetime=60, lifetime_grace=30))
    connector = PipeConnector(server, nursery, 16 * 1024)
    async with open_responses_websocket(connector, CHAINED) as stalled:
        await send(stalled, create(model="sim-5", metadata={"testbed_workload": LONG}))  # 200 s of decoding
        start = trio.current_time()
        with trio.fail_after(600):  # virtual seconds: without the grace the session is held for ever
            while server.sessions:
                await trio.sleep(0.5)
        closed_after = trio.current_time() - start
        # The limit, the grace, then three bounded writes no one reads: the response's failure, the limit's
        # error and close (send_error_and_close), and the server's last close (app.serve_websocket).
        assert 60 + 30 < closed_after <= 60 + 30 + 3 * CLOSE_HANDSHAKE_SECONDS + 0.5
        assert server.api.engine.stats.decoded_tokens < LONG_TOKENS


@pytest.mark.parametrize("design", BOTH)
async def test_a_client_that_stops_reading_holds_bounded_server_memory(autojump_clock, nursery, design: str) -> None:
    server = make_server()
    baseline = await bystander_baseline()
    capacity = 16 * 1024
    connector = PipeConnector(server, nursery, capacity)
    async with open_responses_websocket(connector, design) as stalled:
        down = connector.downs[-1]
        await send(stalled, create(model="sim-50", metadata={"testbed_workload": LONG}))  # 20 s of decoding
        flood_sent = 0

        async def flood() -> None:  # and it keeps sending bad frames it will not read the answers to
            nonlocal flood_sent
            for _ in range(FLOOD):
                await stalled.send_message(FLOOD_FRAME)
                flood_sent += 1

        async with trio.open_nursery() as flooding:
            flooding.start_soon(flood)
            await trio.sleep(5)
            tracemalloc.start()
            try:
                written, decoded = down.written, server.api.engine.stats.decoded_tokens
                memory_before = tracemalloc.get_traced_memory()[0]
                await trio.sleep(15)  # 15 s more of virtual time: decoding would have gone on
                grown = tracemalloc.get_traced_memory()[0] - memory_before
            finally:
                tracemalloc.stop()
            # The server stopped producing: nothing more written, nothing more decoded, no memory grown.
            assert (down.written, server.api.engine.stats.decoded_tokens) == (written, decoded) and decoded < LONG_TOKENS // 2
            assert written <= capacity + 64 * 1024  # the pipe, plus what the client's reader task holds
            assert grown < 64 * 1024, grown
            assert flood_sent < FLOOD // 2  # the server stopped reading too: the client's sends block

            # Another client on the same server is not affected at all, to the nanosecond.
            watcher = Bystander(server)
            await watcher.run()
            assert watcher.timeline == baseline

            # The client reads again: everything arrives, in order, nothing lost or repeated.
            events, refusals = [], 0
            with trio.fail_after(120):
                while not events or events[-1]["type"] not in TERMINALS or refusals < FLOOD:
                    event = json.loads(await stalled.get_message())
                    if event["type"] == "error":
                        assert event["error"]["code"] == errors.UNKNOWN_EVENT_TYPE
                        refusals += 1
                    else:
                        events.append(event)
        assert flood_sent == FLOOD
        assert_one_terminal_and_numbered(events)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        done = next(e for e in events if e["type"] == "response.output_text.done")
        assert text == done["text"] and len(text) > 0 and events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["usage"]["output_tokens"] == LONG_TOKENS


@pytest.mark.parametrize("design", BOTH)
async def test_a_client_that_stopped_reading_closes_within_its_close_timeout(autojump_clock, nursery, design: str) -> None:
    """The server, blocked writing, never reads the close frame: the harness gives up after CLOSE_TIMEOUT_SECONDS."""
    server = make_server()
    connector = PipeConnector(server, nursery, 16 * 1024)
    with trio.fail_after(60):  # the close without a bound waits forever
        async with open_responses_websocket(connector, design) as stalled:
            await send(stalled, create(model="sim-50", metadata={"testbed_workload": LONG}))  # 20 s of decoding
            with trio.move_on_after(5):
                for _ in range(FLOOD):  # blocks once the server stopped reading
                    await stalled.send_message(FLOOD_FRAME)
            down = connector.downs[-1]
            assert len(down.buffer) >= down.capacity - 1024  # the server's writes wait on the full pipe
            closing = trio.current_time()
    assert trio.current_time() - closing == pytest.approx(harness.CLOSE_TIMEOUT_SECONDS)
    assert await server_tasks_end(nursery, server) < 0.01 and server.api.engine.stats.decoded_tokens < LONG_TOKENS // 2


# --- experiments.faults: what each cell counts, and what its figures rest on ------------------------

FAULTED_TASK = fixed(4, initial_prompt_tokens=200, appended_tokens=50, output_tokens=40, tool_seconds=10.0)


def fault_row(design: str, fault: str, task: str, *, e2e: float, recoveries: int = 0, status: str = "completed",
              fell_back: bool = False) -> dict[str, Any]:
    """A row as `faults.fault_records` writes it, one task of one cell."""
    return {"design": design, "fault": fault, "policy": "openai-python", "task": task, "status": status, "e2e_s": e2e,
            "reconnects": recoveries, "resent_bytes": 1000 * recoveries, "recovery_s": [0.5] * recoveries,
            "retried_responses": 0, "fell_back": fell_back, "transcript": [task], "breaks": True}


def test_a_cell_charges_a_give_up_all_its_time_counts_a_fall_back_and_leaves_out_what_fails_without_faults() -> None:
    rows = [fault_row(CHAINED, "none", f"t{i}", e2e=100.0) for i in range(4)]
    rows += [fault_row(CHAINED, "drops", "t0", e2e=103.0, recoveries=1), fault_row(CHAINED, "drops", "t1", e2e=101.0, recoveries=1),
             fault_row(CHAINED, "drops", "t2", e2e=100.0),
             fault_row(CHAINED, "drops", "t3", e2e=40.0, status="error:gave_up")]  # gave up 40 s in: all 40 s are lost
    cell = {r["fault"]: r for r in faults.summarize(rows)}["drops"]
    # Over the completed tasks alone the mean would be 4/3 s: the client that gave up would look cheapest.
    assert cell["time_lost_s"].value == (3 + 1 + 0 + 40) / 4
    assert cell["time_lost_s"].n == 4 and cell["time_lost_s"].method == "bootstrap"
    gave_up = cell["gave_up"]
    assert (gave_up.value, gave_up.n, gave_up.method) == (0.25, 4, "exact binomial")
    # Clopper-Pearson for 1 of 4: the lower end solves 1 - (1 - p)^4 = 0.025, the upper one (1 - p)^4 + 4p(1 - p)^3 = 0.025.
    assert gave_up.low == pytest.approx(1 - 0.975 ** 0.25) and gave_up.high == pytest.approx(0.80588, abs=1e-5)
    assert cell["faults"] == 3  # two recovered from, one given up on
    assert cell["same_conversation"] == 3
    # A client that falls back to HTTP counts the fault it fell back after.
    rows = [fault_row(SUSPENDED, "none", "t0", e2e=100.0),
            fault_row(SUSPENDED, "drops", "t0", e2e=120.0, recoveries=2, fell_back=True)]
    cell = {r["fault"]: r for r in faults.summarize(rows)}["drops"]
    assert cell["faults"] == 3 and cell["fell_back"] == 1 and cell["time_lost_s"].value == 20.0
    # A task that fails without faults too is left out of the faulted cells (openai-python's 60-minute limit).
    rows = [fault_row(CHAINED, "none", "t0", e2e=100.0), fault_row(CHAINED, "none", "t1", e2e=3600.0, status="error:closed_1000"),
            fault_row(CHAINED, "drops", "t0", e2e=104.0, recoveries=1),
            fault_row(CHAINED, "drops", "t1", e2e=3600.0, recoveries=1, status="error:closed_1000")]
    table = {r["fault"]: r for r in faults.summarize(rows)}
    assert (table["drops"]["tasks"], table["drops"]["left_out"], table["drops"]["time_lost_s"].value) == (1, 1, 4.0)
    assert table["drops"]["gave_up"].value == 0 and table["drops"]["faults"] == 1
    assert (table["none"]["tasks"], table["none"]["left_out"], table["none"]["gave_up"].value) == (2, 0, 0.5)


def test_each_cell_counts_its_faults_with_an_exact_poisson_interval_and_bootstraps_time_over_its_tasks() -> None:
    recoveries = [0, 1, 2, 0, 3, 1, 0, 2, 1, 2]  # 12 faults over 10 tasks
    rows = [fault_row(CHAINED, "none", f"t{i}", e2e=100.0) for i in range(10)]
    rows += [fault_row(CHAINED, "drops", f"t{i}", e2e=100.0 + 1.5 * k + 0.1 * i, recoveries=k) for i, k in enumerate(recoveries)]
    table = {r["fault"]: r for r in faults.summarize(rows)}
    cell = table["drops"]
    assert cell["tasks"] == 10 and cell["faults"] == 12 and cell["faults_per_task"] == uncertainty.events_per(12, 10)
    assert (cell["faults_per_task"].n, cell["faults_per_task"].of, cell["faults_per_task"].method) == (12, "events", "exact Poisson")
    # Garwood's exact interval for 12 events, per task.
    assert (cell["faults_per_task"].low, cell["faults_per_task"].high) == pytest.approx((0.62006, 2.09616), abs=1e-4)
    lost = cell["time_lost_s"]
    assert (lost.n, lost.of, lost.method) == (10, "tasks", "bootstrap")
    assert lost.value == pytest.approx(1.5 * 1.2 + 0.45) and lost.low < lost.value < lost.high
    assert (cell["recovery_p50_s"].n, cell["recovery_p50_s"].of) == (12, "recoveries")
    clean = table["none"]  # no fault met: zero, with an upper end that 10 tasks cannot rule out
    assert clean["faults"] == 0 and clean["faults_per_task"].low == 0 and clean["faults_per_task"].high == pytest.approx(0.36889, abs=1e-4)


def ratio_rows(lost: list[float], factor: list[float], recoveries: int) -> list[dict[str, Any]]:
    rows = []
    for i, seconds in enumerate(lost):
        for design, times in ((CHAINED, 1.0), (SUSPENDED, factor[i])):
            rows.append(fault_row(design, "none", f"t{i}", e2e=100.0))
            rows.append(fault_row(design, "drops", f"t{i}", e2e=100.0 + times * seconds, recoveries=recoveries))
    return rows


def test_a_ratio_of_time_lost_is_paired_over_tasks_and_judged_on_thirty_faults_a_cell_or_on_tasks_where_none_break() -> None:
    lost = [1.0, 3.0, 7.0, 12.0, 20.0, 40.0]  # tasks that lose very different times; v1 loses twice v2's on each
    def pair(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {r["pair"]: r for r in faults.ratios(faults.summarize(rows))}["suspended / chained"]

    few = pair(ratio_rows(lost, [2.0] * 6, recoveries=4))  # 24 faults a cell
    # Paired over the tasks the ratio is 2 in every resample; resampled apart, the tasks' spread would widen it.
    assert (few["ratio"].low, few["ratio"].value, few["ratio"].high) == (2.0, 2.0, 2.0)
    assert few["ratio"].method == "paired bootstrap" and few["ratio"].n == 6
    assert few["events"] == 24 and few["carried"].startswith("too few faults")
    enough = pair(ratio_rows(lost, [2.0] * 6, recoveries=5))  # 30 faults a cell
    assert enough["events"] == 30 and enough["carried"] == "more"
    mixed = pair(ratio_rows(lost, [0.5, 2.0, 0.5, 2.0, 0.5, 2.0], recoveries=5))  # ahead on some tasks, behind on others
    assert mixed["ratio"].low < 1 < mixed["ratio"].high and mixed["carried"] == "not separated"
    rows = [dict(row, breaks=False) for row in ratio_rows(lost, [2.0] * 6, recoveries=0)]  # loss, jitter: no fault met
    (pair,) = [r for r in faults.ratios(faults.summarize(rows)) if r["pair"] == "suspended / chained"]
    assert pair["events"] == 0 and pair["carried"] == "more"
    breaking = faults.ratios(faults.summarize(ratio_rows(lost, [2.0] * 6, recoveries=0)))
    assert [r["carried"] for r in breaking if r["pair"] == "suspended / chained"] == ["too few faults (< 30)"]


def test_a_harsh_fault_costs_each_design_time_and_a_fault_run_gives_the_same_rows_whatever_ran_before() -> None:
    config = benchmark.BenchConfig(task_list=(FAULTED_TASK,))
    harsh = faults.FaultModel("harsh", links=LinkFaults(drop_per_server_chunk=0.01, seed=1))
    rows = [row for fault in (faults.FAULT_MODELS["none"], harsh) for design in (CHAINED, SUSPENDED)
            for row in faults.fault_records(faults.FaultRun(design, fault, OPENAI_PYTHON, 100.0, config))]
    table = {(r["design"], r["fault"]): r for r in faults.summarize(rows)}
    for design in (CHAINED, SUSPENDED):
        assert table[(design, "none")]["faults"] == 0 and table[(design, "none")]["time_lost_s"].value == 0
        assert table[(design, "harsh")]["faults"] >= 1 and table[(design, "harsh")]["time_lost_s"].value > 0
        assert table[(design, "harsh")]["gave_up"].value == 0 and table[(design, "harsh")]["same_conversation"] == 1
    """A v1 task restarted after an engine failure resends its context with the ids the server gave; ids drawn at
    random per server would make the resent context, and so the row, differ from run to run by milliseconds."""
    run = faults.FaultRun(SUSPENDED, faults.FAULT_MODELS["engine"], CODEX, 1000.0, benchmark.BenchConfig(n_tasks=1, seed=0))
    first = faults.fault_records(run)
    assert faults.faults_met(first[0]) == 1  # the task met the failure, and its restart resent the context
    for _ in range(3):
        assert faults.fault_records(run) == first


def test_the_faults_experiment_at_a_tiny_size_prints_its_counts_and_that_it_is_not_for_conclusions(tmp_path, monkeypatch, capsys) -> None:
    from experiments import common

    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path))
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    options = ["--tasks", "2", "--turns", "3", "--faults", "mid-response", "engine", "--designs", "chained", "suspended",
               "--policies", "codex"]
    table = faults.main([*options, "--in-process", "--no-cache"])
    assert {(r["fault"], r["design"]) for r in table} == {(f, d) for f in ("none", "mid-response", "engine") for d in (CHAINED, SUSPENDED)}
    assert all(r["tasks"] == 2 and r["gave_up"].value == 0 and r["same_conversation"] == 2 for r in table)
    out = capsys.readouterr().out
    assert "not for conclusions" in out.lower() and "policy codex: 5 retries" in out
    headline = json.loads((tmp_path / "faults" / "latest" / "faults.json").read_text())["headline"]
    assert headline["command"] == "python -m experiments.faults " + " ".join(options)  # the runner's options change no figure
    cells = {(r["fault"], r["design"]): r for r in table}
    figure = headline["figures"]["mid-response.codex.suspended.faults_per_task"]
    assert (figure["n"], figure["method"]) == (cells[("mid-response", SUSPENDED)]["faults"], "exact Poisson")
    assert headline["figures"]["engine.codex.chained.time_lost"]["n"] == 2
    assert {tuple(row[:1]) for row in headline["tables"]["time_lost.codex"]["rows"]} == {("mid-response",), ("engine",)}
    tasks = tmp_path / "faults" / "latest" / "faults_tasks.csv"
    again = faults.main(["--from-tasks", str(tasks)])  # the same tables from the tasks' file, running nothing
    assert json.dumps(faults.csv_rows(again)) == json.dumps(faults.csv_rows(table))  # NaN where no recovery, in both
    assert json.loads((tmp_path / "faults" / "latest" / "faults.json").read_text())["headline"] == headline
