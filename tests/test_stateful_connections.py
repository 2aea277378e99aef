"""A Hypothesis state machine over several WebSocket connections to one server at once:
creates, appends (one, or two back to back), disconnects, and waits that run into the suspension
time-to-live and the connection lifetime, in any interleaving; with them creates chained from the
connection's last response, another connection's or one that never was, warm-ups, workloads that name
nothing, steers and the bad input corpus's frames. After every step the model's invariants are checked
on what the clients received and what the server applied:

* per response, sequence numbers run 0, 1, 2, ... with no gap or repeat, at most one terminal
  event, and nothing after it;
* a connection the server closed (lifetime) saw exactly one terminal event for every response it
  saw start;
* every append the server applied appears in the rollout's transcript exactly once, and on a
  connection still open every append sent was either applied or refused with its error;
* every error is a documented refusal, `response.done` comes on v1 only, and the server logs no error.

At the end every connection still open serves a new task (or has reached its lifetime), and once every
client has left nothing of theirs remains on the server.

The server runs in a trio run on a thread with a MockClock that moves only when a rule says so
(`wait`), so each step is deterministic; a rule settles with `wait_all_tasks_blocked` before the
invariants are read.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import threading
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from support import create_event, events_by_response, function_calls, make_server, outputs_for, ws
from test_bad_input import CORPUS, session_kv
from trio_websocket import ConnectionClosed

from prototype.client.harness import CHAINED, SUSPENDED
from prototype.designs.emitter import Emitter
from prototype.designs.sampling import SamplingLoop
from prototype.designs.suspended import Suspension
from prototype.protocol import errors
from prototype.protocol.events import TERMINAL_TYPES
from prototype.server.config import ServerConfig

CONNECTIONS = 2
STEP_S = 0.05  # virtual time advances in steps this long, the server settling after each
LIFETIME_S = 6.0
SUSPENSION_TTL_S = 2.0
REFUSED_APPENDS = {"no_suspended_response", "invalid_function_call_output"}
DOCUMENTED = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}
# The corpus's frames that stand alone (no placeholder to fill) and refuse no append: bad on any connection, in any state.
BAD_FRAMES = [case.frame for case in CORPUS if case.code not in REFUSED_APPENDS and "$" not in str(case.frame)]
TASK = {"model": "sim-10000", "metadata": {"testbed_workload": "fixed:1:50:10:20:0"}}  # one turn of 20 tokens


class Conn:
    def __init__(self, design: str) -> None:
        self.design = design
        self.events: list[dict[str, Any]] = []
        self.appends_sent: list[str] = []
        self.scope = trio.CancelScope()
        self.closed = False
        self.dropped = False  # the client disconnected (its close may still be under way)
        self.closed_by_server: int | None = None  # the close code, when the server closed it
        self.outbox_send, self.outbox = trio.open_memory_channel[str](64)

    def response_ids(self) -> list[str]:
        return [e["response"]["id"] for e in self.events if e["type"] == "response.created"]

    def last_response(self) -> dict[str, Any] | None:
        return next((e["response"] for e in reversed(self.events) if e["type"] == "response.completed"), None)

    def pending_calls(self) -> list[dict[str, Any]] | None:
        """The calls of the v1 rollout paused at the last event, if it is a `response.done`."""
        if self.events and self.events[-1]["type"] == "response.done":
            return [i for i in self.events[-1]["response"]["output"] if i["type"] == "function_call"]
        return None


async def run_connection(server, conn: Conn, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with conn.scope:
        async with ws(server, conn.design) as client:
            task_status.started()

            async def writer() -> None:
                async for frame in conn.outbox:
                    await client.send_message(frame)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                try:
                    while True:
                        conn.events.append(json.loads(await client.get_message()))
                except ConnectionClosed as closed:
                    conn.closed_by_server = closed.reason.code
                nursery.cancel_scope.cancel()
    conn.closed = True


class ServerThread:
    """A trio run on a thread, driven one call at a time from the test's thread."""

    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()  # moves only when `advance` jumps it
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _main(self) -> None:
        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as self.nursery:
                self.stop = trio.Event()
                self.ready.set()
                await self.stop.wait()
                self.nursery.cancel_scope.cancel()

        trio.run(main, clock=self.clock)

    def call(self, fn, *args):
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def close(self) -> None:
        def stop() -> None:
            # Closing handshakes wait on timeouts: the clock runs on to them so the run ends at once (set
            # from within the run: the clock reads its runner from the thread it is set on).
            self.clock.autojump_threshold = 0
            self.stop.set()

        trio.from_thread.run_sync(stop, trio_token=self.token)
        self.thread.join(10)
        assert not self.thread.is_alive(), "the server's trio run did not end"


class Connections(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server = make_server(config=ServerConfig(connection_lifetime=LIFETIME_S, suspension_ttl=SUSPENSION_TTL_S))
        self.applied: list[tuple[str, str]] = []  # (response id, output text) per item a rollout took in
        self.accepted: list[str] = []  # output texts of the appends the server accepted (Suspension.deliver)
        self.waited = False  # the last rule advanced the clock
        take, deliver = SamplingLoop.take_new_items, Suspension.deliver
        applied, accepted = self.applied, self.accepted

        async def spy_take(loop, items):
            applied.extend((loop.emitter.response.id, getattr(item, "output", None)) for item in items)
            return await take(loop, items)

        def spy_deliver(suspension, items, arrived=None):
            deliver(suspension, items, arrived)
            accepted.extend(getattr(item, "output", None) for item in items)

        async def slow_resumed(emitter, at=None):
            await trio.sleep(STEP_S)  # `response.in_progress` takes a step to send: a second append races it
            await resumed(emitter, at)

        resumed = Emitter.resumed
        self._originals = (take, deliver, resumed)
        SamplingLoop.take_new_items, Suspension.deliver, Emitter.resumed = spy_take, spy_deliver, slow_resumed
        self.logged = logging.handlers.BufferingHandler(1 << 30)
        self.logged.setLevel(logging.ERROR)
        logging.getLogger("prototype").addHandler(self.logged)
        self.trio = ServerThread()
        self.conns: list[Conn | None] = [None] * CONNECTIONS
        self.serial = 0

    def teardown(self) -> None:
        try:
            self.trio.call(self._serve_once_more_then_leave)
        finally:
            self.trio.close()
            SamplingLoop.take_new_items, Suspension.deliver, Emitter.resumed = self._originals
            logging.getLogger("prototype").removeHandler(self.logged)

    async def _serve_once_more_then_leave(self) -> None:
        self.trio.clock.autojump_threshold = 0  # the clock runs on to each timer from here
        for conn in filter(None, self.conns):
            if conn.closed or conn.dropped:
                continue
            conn.outbox_send.send_nowait(json.dumps(create_event(model=TASK["model"], metadata={**TASK["metadata"], "last": "yes"})))
            with trio.fail_after(100):  # it may wait behind what is queued, and a paused rollout's time-to-live
                while not conn.closed and not any(e["type"] == "response.completed" and e["response"]["metadata"].get("last")
                                                  for e in conn.events):
                    await trio.sleep(STEP_S)
            assert not conn.closed or conn.closed_by_server == 1000, conn.events[-3:]  # served, or closed at its lifetime
        for conn in filter(None, self.conns):
            if not conn.closed:
                await self._disconnect(conn)
        with trio.fail_after(100):
            while self.server.sessions or self.server.connections:
                await trio.sleep(STEP_S)
        assert session_kv(self.server) == {}

    async def _settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()

    def settle(self) -> None:
        self.trio.call(self._settle)

    def live(self, index: int) -> Conn | None:
        conn = self.conns[index]
        return conn if conn is not None and not conn.closed and not conn.dropped else None

    # --- rules ---------------------------------------------------------------------------------------

    @initialize(designs=st.lists(st.sampled_from([SUSPENDED, CHAINED]), min_size=CONNECTIONS, max_size=CONNECTIONS))
    def open_all(self, designs: list[str]) -> None:
        for index, design in enumerate(designs):
            self.open(index, design)

    @rule(index=st.integers(0, CONNECTIONS - 1), design=st.sampled_from([SUSPENDED, CHAINED]))
    def open(self, index: int, design: str) -> None:
        if self.live(index) is not None:
            return
        conn = Conn(design)
        self.conns[index] = conn

        async def start() -> None:
            await self.trio.nursery.start(run_connection, self.server, conn)
            await trio.testing.wait_all_tasks_blocked()

        self.trio.call(start)

    def _send(self, conn: Conn, *frames: dict[str, Any] | str | bytes) -> None:
        """Send `frames` back to back (nothing runs in between), then let the server settle."""

        async def send() -> None:
            for frame in frames:
                try:
                    conn.outbox_send.send_nowait(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
                except trio.BrokenResourceError:
                    pass
            await trio.testing.wait_all_tasks_blocked()

        self.trio.call(send)

    @rule(index=st.integers(0, CONNECTIONS - 1), turns=st.integers(1, 3))
    def create(self, index: int, turns: int) -> None:
        if (conn := self.live(index)) is not None:
            self._send(conn, create_event(model="sim-10000", metadata={"testbed_workload": f"fixed:{turns}:50:10:20:0"}))

    @rule(index=st.integers(0, CONNECTIONS - 1), kind=st.sampled_from(["chain", "other", "bogus", "bad_workload", "warm_up"]))
    def create_more(self, index: int, kind: str) -> None:
        """Chained from this connection's last response, another connection's or one that never was; a workload that
        names nothing; a warm-up (v1 refuses a chain and a warm-up)."""
        if (conn := self.live(index)) is None:
            return
        fields: dict[str, Any] = dict(TASK)
        if kind == "bad_workload":
            fields["metadata"] = {"testbed_workload": "nope"}
        elif kind == "warm_up":
            fields["generate"] = False
        else:
            source = {"chain": conn, "other": self.conns[(index + 1) % CONNECTIONS], "bogus": None}[kind]
            last = source.last_response() if source is not None else None
            fields["previous_response_id"] = last["id"] if last else "resp_bogus"
            fields["input"] = outputs_for(function_calls(last)) if last else outputs_for([{"call_id": "call_none"}])
        self._send(conn, create_event(**fields))

    @rule(index=st.integers(0, CONNECTIONS - 1), frame=st.sampled_from(BAD_FRAMES))
    def bad_frame(self, index: int, frame: Any) -> None:
        if (conn := self.live(index)) is not None:
            self._send(conn, frame)

    @rule(index=st.integers(0, CONNECTIONS - 1))
    def steer(self, index: int) -> None:
        if (conn := self.live(index)) is not None:
            self._send(conn, {"type": "response.steer", "previous_response_id": "resp_x", "input": "faster"})

    @rule(index=st.integers(0, CONNECTIONS - 1), twice=st.booleans(), matching=st.booleans())
    def append(self, index: int, twice: bool, matching: bool) -> None:
        if (conn := self.live(index)) is None or conn.design != SUSPENDED:
            return
        calls = conn.pending_calls() if matching else None
        frames = []
        for _ in range(2 if twice else 1):  # twice: the second races the first
            self.serial += 1
            frame = f"append {self.serial}"
            call_ids = [c["call_id"] for c in calls] if calls else ["call_none"]
            conn.appends_sent.append(frame)
            frames.append({"type": "response.append", "input": [
                {"type": "function_call_output", "call_id": call_id, "output": f"{frame}/{k}"} for k, call_id in enumerate(call_ids)]})
        self._send(conn, *frames)

    async def _disconnect(self, conn: Conn) -> None:
        conn.dropped = True
        conn.scope.cancel()
        await trio.testing.wait_all_tasks_blocked()

    @rule(index=st.integers(0, CONNECTIONS - 1))
    def disconnect(self, index: int) -> None:
        if (conn := self.live(index)) is not None:
            self.trio.call(self._disconnect, conn)

    @rule(seconds=st.sampled_from([STEP_S, 0.5, 2.5]))
    def wait(self, seconds: float) -> None:
        async def advance() -> None:
            # The clock runs on its own for `seconds`, jumping to each sleeper's deadline once every
            # task is blocked, so each timer fires at its exact virtual time; then it stops again.
            self.trio.clock.autojump_threshold = 0
            try:
                await trio.sleep(seconds)
                await trio.testing.wait_all_tasks_blocked()
            finally:
                self.trio.clock.autojump_threshold = float("inf")

        self.trio.call(advance)
        self.waited = True

    # --- invariants ----------------------------------------------------------------------------------

    @invariant()
    def each_response_is_numbered_and_ends_once(self) -> None:
        self.settle()
        for conn in filter(None, self.conns):
            # A steer refused for want of its target is numbered 0 on its own, no response's event.
            numbered = [e for e in conn.events if e["type"] != "response.steer.failed"]
            for response_id, seen in events_by_response(numbered).items():
                assert response_id is not None and [e["sequence_number"] for e in seen] == list(range(len(seen))), response_id
                assert all(e["response"]["id"] == response_id for e in seen if "response" in e), response_id
                terminals = [i for i, e in enumerate(seen) if e["type"] in TERMINAL_TYPES]
                assert len(terminals) <= 1 and (not terminals or terminals[0] == len(seen) - 1), response_id
                if conn.closed_by_server is not None:
                    assert len(terminals) == 1, f"{response_id} cut off by the server's close"

    @invariant()
    def errors_are_documented_refusals_pauses_v1_only_nothing_logged_and_kv_bounded(self) -> None:
        for conn in filter(None, self.conns):
            for event in conn.events:
                if event["type"] == "error":
                    assert (event["status"], event["error"]["type"], event["error"]["code"] in DOCUMENTED) == (400, "invalid_request_error", True)
                assert event["type"] != "response.done" or conn.design == SUSPENDED
        assert [record.getMessage() for record in self.logged.buffer] == []
        assert len(session_kv(self.server)) <= len(self.server.sessions)  # KV for live sessions only, one cache slot each

    @invariant()
    def every_accepted_append_appears_once_and_every_sent_one_is_answered(self) -> None:
        applied = [text for _, text in self.applied]
        assert len(applied) == len(set(applied)), "an append's item was applied twice"
        assert len(self.accepted) == len(set(self.accepted)), "an append was accepted twice"
        assert set(applied) <= set(self.accepted), "an item applied that no append delivered"
        accepted_frames = {text.split("/")[0] for text in self.accepted}
        applied_frames = {text.split("/")[0] for text in applied}
        for conn in filter(None, self.conns):
            mine = set(conn.appends_sent)
            if conn.closed or conn.dropped:
                continue
            refused = sum(1 for e in conn.events if e["type"] == "error" and e["error"]["code"] in REFUSED_APPENDS)
            assert len(accepted_frames & mine) + refused == len(mine), (accepted_frames & mine, refused, conn.appends_sent)
            if self.waited:  # time moved on: every accepted append is in its rollout's transcript
                assert accepted_frames & mine <= applied_frames, "an accepted append never reached the transcript"
        self.waited = False


Connections.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestConnectionsUnderInterleavedAppendsCreatesDisconnectsAndExpiry = pytest.mark.slow(Connections.TestCase)
