"""Random sequences: a Hypothesis state machine over the sans-IO core against a reference model, and
random event sequences against a live server under virtual time. Invariants: no crash, one terminal
event per response, gapless numbering, nothing left behind, bounded caches."""

from __future__ import annotations

import json
import logging
import logging.handlers
from collections import Counter
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from support import make_server
from test_bad_input import CORPUS, ONE_TURN, SMALL, TERMINALS, create, session_kv
from test_faults import PipeConnector, raw_ws, server_tasks_end
from trio_websocket import ConnectionClosed

from prototype import metrics
from prototype.api.checks import CallLedger, SafetyState
from prototype.api.service import Context
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.designs.chained import ConnectionCache
from prototype.designs.emitter import Emitter
from prototype.designs.suspended import Suspension
from prototype.engine.kv import Prompt
from prototype.protocol import codec, errors
from prototype.protocol import events as ev
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import CreateRequest, ResponseAppend, ResponseCreate
from prototype.protocol.items import FunctionCall
from prototype.protocol.response import Response
from prototype.server.config import ServerConfig

# --- 1. the sans-IO core, synchronously: the codec, the call ledger, the v2 cache slot, the v1 suspension, the emitter


def drive(coroutine: Any) -> Any:
    """Run a coroutine that never blocks (the sink is a list) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    coroutine.close()
    raise AssertionError("the sans-IO core blocked")


async def chunks(pieces: list[str]):
    for piece in pieces:
        yield piece


# Frames the codec alone refuses, whatever the design and the connection's state.
CODEC_CASES = [case for case in CORPUS if case.stage == "frame" and set(case.designs) == {SUSPENDED, CHAINED}
               and "$prev" not in json.dumps(case.frame if not isinstance(case.frame, bytes) else "")]
DOCUMENTED = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}


def output_frame(kind: str, call_ids: list[str]) -> str:
    frame = {"type": kind, "input": [{"type": "function_call_output", "call_id": c, "output": "ok"} for c in call_ids]}
    return json.dumps({**frame, "model": "sim"} if kind == "response.create" else frame)


class ConversationCore(RuleBasedStateMachine):
    """One connection's protocol state, built from the real sans-IO pieces, against a reference."""

    @initialize()
    def start(self) -> None:
        self.cache = ConnectionCache(("state-machine", 0))
        self.ledger = CallLedger()
        self.items: list = []  # the conversation as the core holds it
        self.suspension: Suspension | None = None  # a v1 rollout waiting for its append
        self.open: Emitter | None = None  # that rollout's emitter
        self.events: dict[str, list] = {}  # response id -> the events its emitter produced
        self.counter = 0
        # The reference model.
        self.pending: set[str] = set()
        self.answered: set[str] = set()
        self.cached: str | None = None
        self.calls_made = 0

    def new_emitter(self) -> Emitter:
        self.counter += 1
        response_id = f"resp_{self.counter}"
        request = CreateRequest(model="sim", input=())
        sink_events: list = []
        self.events[response_id] = sink_events

        async def sink(event: Any) -> None:
            sink_events.append(event)

        return Emitter(Response(response_id, request, created_at=0), sink, metrics.PhaseLog())

    def sample(self, emitter: Emitter, calls: int) -> list[FunctionCall]:
        """The model's turn: a message, then `calls` function calls, through the emitter."""
        drive(emitter.message(f"msg_{self.counter}", chunks(["a", "b"]), incomplete=lambda: False))
        made = []
        for _ in range(calls):
            self.calls_made += 1
            call_id = f"call_{self.calls_made}"
            made.append(drive(emitter.function_call(f"fc_{self.calls_made}", call_id, "read_file", chunks(['{"p"', ':1}']))))
        outputs = emitter.response.output[-(calls + 1):]
        self.ledger.absorb(outputs)
        self.items.extend(outputs)
        self.pending |= {call.call_id for call in made}
        return made

    def reset_conversation(self) -> None:
        """A failed turn: the client starts over with a new conversation (docs/protocol.md (b))."""
        self.ledger, self.items, self.pending, self.answered = CallLedger(), [], set(), set()

    @precondition(lambda self: self.open is None and not self.pending)
    @rule(calls=st.integers(0, 3), suspend=st.booleans())
    def respond(self, calls: int, suspend: bool) -> None:
        """A response samples a turn; with calls it either pauses (v1) or completes (v2)."""
        frame = json.dumps({"type": "response.create", "model": "sim", "input": "go"})
        request = codec.decode_client_event(frame)
        assert isinstance(request, ResponseCreate)
        self.ledger.absorb(request.request.input)
        self.items.extend(request.request.input)
        emitter = self.new_emitter()
        drive(emitter.emit(ev.ResponseCreated, response=emitter.snapshot()))
        drive(emitter.emit(ev.ResponseInProgress, response=emitter.snapshot()))
        made = self.sample(emitter, calls)
        if suspend and made:
            drive(emitter.paused())
            self.open, self.suspension = emitter, Suspension(tuple(call.call_id for call in made))
            self.cache.evict()
            self.cached = None
        else:
            drive(emitter.finished("completed"))
            self.cache.put(emitter.response, Context(self.items, Prompt(), "", self.ledger, SafetyState(), None, self.cache.engine_key))
            self.cached = emitter.response.id

    @precondition(lambda self: self.open is not None)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        """v1: an append answers the pending calls; anything but exactly them is refused."""
        known = sorted(self.pending) + ["call_unknown"]
        answer = data.draw(st.lists(st.sampled_from(known), max_size=4))
        event = codec.decode_client_event(output_frame("response.append", answer))
        assert isinstance(event, ResponseAppend)
        expected_ok = sorted(answer) == sorted(self.pending)  # exactly once each, nothing else
        try:
            self.suspension.check(event.input)
        except ProtocolError as error:
            assert not expected_ok and error.code == errors.INVALID_FUNCTION_CALL_OUTPUT
            return
        assert expected_ok
        self.ledger.absorb(event.input)
        self.items.extend(event.input)
        self.answered |= self.pending
        self.pending = set()
        emitter, self.open, self.suspension = self.open, None, None
        drive(emitter.emit(ev.ResponseInProgress, response=emitter.snapshot()))
        self.sample(emitter, 0)
        drive(emitter.finished("completed"))

    @precondition(lambda self: self.open is None)
    @rule(data=st.data(), previous=st.sampled_from(["cached", "stale", "none"]))
    def chain(self, data: st.DataObject, previous: str) -> None:
        """v2: a create with previous_response_id and tool outputs: a cache hit takes the cached
        conversation and the ledger checks the outputs; anything else empties the slot."""
        previous_id = {"cached": self.cached, "stale": "resp_stale", "none": None}[previous]
        known = sorted(self.pending | self.answered) + ["call_unknown"]
        answer = data.draw(st.lists(st.sampled_from(known), max_size=4))
        body = json.loads(output_frame("response.create", answer))
        if previous_id is not None:
            body["previous_response_id"] = previous_id
        try:
            request = codec.decode_client_event(json.dumps(body)).request
        except ProtocolError as error:  # an empty input without previous_response_id
            assert error.code == errors.EMPTY_INPUT and not answer and previous_id is None
            return
        hit = self.cache.take(previous_id) if previous_id is not None else None
        assert (hit is not None) == (previous_id is not None and previous_id == self.cached)
        self.cached = None  # the slot is empty until a turn succeeds (WS guide)
        if hit is None:
            self.reset_conversation()
            ledger = CallLedger()
        else:
            ledger = hit.ledger
        expected_ok = hit is not None and len(answer) == len(set(answer)) and set(answer) <= self.pending
        if hit is None and not answer:
            expected_ok = True
        try:
            ledger.absorb(request.input)
        except ProtocolError as error:
            assert not expected_ok and error.code == errors.INVALID_FUNCTION_CALL_OUTPUT
            self.cache.evict()  # as the connection does for any failed turn (docs/protocol.md)
            self.reset_conversation()
            return
        assert expected_ok
        if hit is not None:
            self.items.extend(request.input)
            self.answered |= set(answer)
            self.pending -= set(answer)
            if not self.pending:
                emitter = self.new_emitter()
                drive(emitter.emit(ev.ResponseCreated, response=emitter.snapshot()))
                self.sample(emitter, 0)
                drive(emitter.finished("completed"))
                self.cache.put(emitter.response, hit)
                self.cached = emitter.response.id

    @rule(case=st.sampled_from(CODEC_CASES))
    def bad_frame(self, case: Any) -> None:
        """A corpus frame is refused with its code and changes nothing."""
        before = (self.cache.response_id, dict(self.ledger.calls), set(self.ledger.answered), len(self.items))
        frame = case.frame if isinstance(case.frame, (str, bytes)) else json.dumps(case.frame)
        with pytest.raises(ProtocolError) as refused:
            codec.decode_client_event(frame)
        assert (refused.value.code, refused.value.param) == (case.code, case.param)
        assert (self.cache.response_id, dict(self.ledger.calls), set(self.ledger.answered), len(self.items)) == before

    @precondition(lambda self: self.open is not None)
    @rule(twice=st.booleans())
    def fail(self, twice: bool) -> None:
        """The suspended rollout fails (a TTL, an engine fault): one terminal, however often asked."""
        emitter, self.open, self.suspension = self.open, None, None
        for _ in range(2 if twice else 1):
            drive(emitter.finished("failed", error=errors.response_error("x")))
        self.reset_conversation()

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def cache_is_one_slot_matching_the_reference(self) -> None:
        assert self.cache.response_id == self.cached
        assert (self.cache.response_id is None) == (self.cache.context is None) == (self.cache.response is None)

    @invariant()
    def ledger_matches_the_reference_and_a_full_fold(self) -> None:
        assert set(self.ledger.unanswered) == self.pending
        full = CallLedger()
        full.absorb(self.items)
        assert (full.calls, full.answered, full.turn) == (self.ledger.calls, self.ledger.answered, self.ledger.turn)
        assert len(self.ledger.calls) <= self.calls_made  # bounded by what was sampled

    @invariant()
    def events_are_numbered_and_end_once(self) -> None:
        for response_id, events in self.events.items():
            assert [e.sequence_number for e in events] == list(range(len(events)))
            terminals = [i for i, e in enumerate(events) if e.type in TERMINALS]
            assert len(terminals) <= 1
            if terminals:
                assert terminals[0] == len(events) - 1  # nothing after the terminal
            is_open = self.open is not None and self.open.response.id == response_id
            assert len(terminals) == (0 if is_open else 1)
            if any(e.type == "response.done" for e in events):
                assert all(e.response["id"] == response_id for e in events if hasattr(e, "response"))


ConversationCore.TestCase.settings = settings(max_examples=80, stateful_step_count=20, deadline=None)
TestConversationCore = ConversationCore.TestCase


# --- 2. random event sequences against a live server, under virtual time ---------------------------------


@attrs.define(eq=False)
class Client:
    design: str
    ws: Any = None
    stream: Any = None
    events: list = attrs.Factory(list)
    close_code: int | None = None
    done: bool = False
    closing: bool = False  # the test closed it

    def last(self, *types: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e["type"] in types), None)


async def client_task(connector: PipeConnector, client: Client, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with raw_ws(connector, client.design) as (client.ws, client.stream):
        task_status.started()
        try:
            while True:
                client.events.append(json.loads(await client.ws.get_message()))
        except ConnectionClosed as closed:
            client.close_code = closed.reason.code
        finally:
            client.done = True


def outputs(response: dict[str, Any] | None) -> list[dict[str, Any]]:
    calls = [] if response is None else [i["call_id"] for i in response["output"] if i["type"] == "function_call"]
    return [{"type": "function_call_output", "call_id": c, "output": "ok"} for c in calls or ["call_none"]]


FRAME_CASES = [case for case in CORPUS if "$prev" not in json.dumps(case.frame if not isinstance(case.frame, bytes) else "")]
ACTIONS = ["open", "create", "create", "create", "append", "append", "bad", "steer", "sleep", "sleep", "close"]
CREATES = ["fresh", "fresh", "chain", "chain", "other", "bogus", "bad_metadata", "warm_up"]


def check_events(client: Client) -> None:
    """Per response: numbers 0, 1, 2, ...; one terminal, last; v1-only events on v1 only."""
    numbers: dict[str, list[int]] = {}
    terminals: Counter = Counter()
    current = None
    for event in client.events:
        kind = event["type"]
        assert isinstance(kind, str)
        if kind == "error":
            assert event["status"] == 400 and event["error"]["code"] in DOCUMENTED and event["error"]["type"] == "invalid_request_error", event
            continue
        if kind == "response.steer.failed":
            continue
        if kind == "response.created":
            current = event["response"]["id"]
            assert current not in numbers
            numbers[current] = []
        assert current is not None, event
        assert terminals[current] == 0, f"{kind} after the terminal of {current}"
        if "response" in event:
            assert event["response"]["id"] == current
        numbers[current].append(event["sequence_number"])
        if kind in TERMINALS:
            terminals[current] += 1
        if kind == "response.done":
            assert client.design == SUSPENDED
    for response_id, seen in numbers.items():
        assert seen == list(range(len(seen))), (response_id, seen)
    unfinished = [r for r in numbers if terminals[r] == 0]
    if client.close_code is None and not client.closing:
        assert unfinished == [], unfinished  # the connection is open and quiet: every response ended
    else:
        assert len(unfinished) <= 1  # only the one in flight when the connection went


async def play(data: st.DataObject) -> None:
    server = make_server(config=ServerConfig(suspension_ttl=5.0, max_queued_creates=3, max_message_bytes=64 * 1024))
    errors_logged = logging.handlers.BufferingHandler(1 << 30)
    errors_logged.setLevel(logging.ERROR)
    logging.getLogger("prototype").addHandler(errors_logged)
    clients: list[Client] = []
    try:
        async with trio.open_nursery() as server_side, trio.open_nursery() as client_side:
            connector = PipeConnector(server, server_side, capacity=1 << 20)

            async def send(client: Client, frame: Any) -> None:
                try:
                    await client.ws.send_message(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
                except ConnectionClosed:
                    pass

            for design in data.draw(st.lists(st.sampled_from([SUSPENDED, CHAINED]), min_size=1, max_size=3), label="first clients"):
                clients.append(Client(design))
                await client_side.start(client_task, connector, clients[-1])
            for _ in range(data.draw(st.integers(3, 24), label="steps")):
                # Mostly let the server catch up between actions; sometimes race it.
                await trio.sleep(data.draw(st.sampled_from([0.05, 0.05, 0.05, 0.0]), label="gap"))
                live = [c for c in clients if not c.done and not c.closing]
                action = data.draw(st.sampled_from(ACTIONS if live else ["open"]), label="action")
                if action == "open" and len(live) < 3:
                    client = Client(data.draw(st.sampled_from([SUSPENDED, CHAINED]), label="design"))
                    await client_side.start(client_task, connector, client)
                    clients.append(client)
                    continue
                if not live:
                    continue
                client = data.draw(st.sampled_from(live), label="client")
                if action == "create":
                    kind = data.draw(st.sampled_from(CREATES), label="create")
                    last = client.last("response.completed")
                    others = [c.last("response.completed") for c in clients if c is not client and c.last("response.completed")]
                    if kind == "fresh":
                        frame = create(metadata={"testbed_workload": data.draw(st.sampled_from([SMALL, ONE_TURN]))})
                    elif kind == "bad_metadata":
                        frame = create(metadata={"testbed_workload": "nope"})
                    elif kind == "warm_up":
                        frame = create(generate=False)
                    else:
                        target = {"chain": last, "other": others[0] if others else None, "bogus": None}[kind]
                        frame = create(previous_response_id=target["response"]["id"] if target else "resp_bogus", input=outputs(target and target["response"]))
                    await send(client, frame)
                elif action == "append":
                    paused = client.last("response.done")
                    right = data.draw(st.booleans(), label="right answer")
                    items = outputs(paused and paused["response"]) if right else [{"type": "function_call_output", "call_id": "call_x", "output": "?"}]
                    await send(client, {"type": "response.append", "input": items})
                elif action == "bad":
                    case = data.draw(st.sampled_from(FRAME_CASES), label="corpus frame")
                    await send(client, case.frame if isinstance(case.frame, (str, bytes)) else json.dumps(case.frame))
                elif action == "steer":
                    await send(client, {"type": "response.steer", "previous_response_id": "resp_x", "input": "faster"})
                elif action == "sleep":
                    await trio.sleep(data.draw(st.sampled_from([0, 0.01, 0.3, 2.0, 6.0]), label="sleep"))
                elif action == "close":
                    client.closing = True
                    if data.draw(st.booleans(), label="dropped"):
                        await client.stream.aclose()
                    else:
                        with trio.move_on_after(5):
                            await client.ws.aclose()
                # Caches bounded, at every step: KV only for live sessions, one cache slot each.
                assert len(session_kv(server)) <= len(server.sessions)
                assert len(server.sessions) <= len(clients)

            await trio.sleep(100)  # everything queued has run; suspended rollouts have expired
            for client in clients:
                check_events(client)
            # Every connection still open is usable: a new task completes on it.
            for client in [c for c in clients if not c.done and not c.closing]:
                before = len(client.events)
                await send(client, create(metadata={"testbed_workload": ONE_TURN}))
                with trio.fail_after(30):
                    while not any(e["type"] in TERMINALS for e in client.events[before:]):
                        await trio.sleep(0.01)
                assert client.events[-1]["type"] == "response.completed", client.events[before:]
            # Every client leaves; then nothing of theirs remains on the server.
            for client in clients:
                if not client.done:
                    with trio.move_on_after(5):
                        await client.ws.aclose()
            await server_tasks_end(server_side, server)
            assert session_kv(server) == {} and server.connections == 0
            client_side.cancel_scope.cancel()
    finally:
        logging.getLogger("prototype").removeHandler(errors_logged)
    assert [r.getMessage() for r in errors_logged.buffer] == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), clock=st.builds(trio.testing.MockClock, autojump_threshold=st.just(0)))
def test_random_event_sequences_against_a_live_server(data: st.DataObject, clock: trio.testing.MockClock) -> None:
    trio.run(play, data, clock=clock)
