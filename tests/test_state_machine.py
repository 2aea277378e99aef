"""A Hypothesis state machine over the sans-IO core (the codec, the call ledger, the v2 cache slot, the v1 suspension,
the emitter) against a reference model: one terminal event per response, gapless numbering, one cache slot, a ledger
equal to a full fold of the conversation (random sequences against a live server: tests/test_stateful_connections.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_bad_input import CORPUS, TERMINALS

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
        request = codec.decode_client_event(json.dumps({"type": "response.create", "model": "sim", "input": "go"}))
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
