"""The agent harness (prototype/client/harness.py), to exact values: what each received event does to the record, a
turn's start, its tools' time and outputs, the request fields, the channel's bytes, what ends a turn and the tool loop,
over a stand-in WebSocket and a scripted server on a virtual clock."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio_websocket
from support import Close, ScriptedServer

from prototype.client import harness
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import (
    CHAINED,
    HARNESS_TOOLS,
    SUSPENDED,
    WEB_SEARCH_TOOL,
    Rollout,
    RolloutRecord,
    TurnRecord,
    WsChannel,
    drive_websocket_rollout,
    function_calls,
    is_steered,
    request_body,
    run_websocket_rollout,
    shared_instructions,
    task_prompt,
    tool_output_text,
    turn_outcome,
)
from prototype.engine import tokenizer
from prototype.workload import TurnSpec, Workload, fixed

CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file", "arguments": "{}", "status": "completed"}
ANSWER = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "done"}]}
USAGE = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 60}, "output_tokens": 7,
         "output_tokens_details": {"reasoning_tokens": 3}}
SCRIPTED = fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0, name="scripted")


class Clock:
    """A clock the test sets by hand (a blocking client's `time.perf_counter`)."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


def rollout_on(clock: Clock, workload: Workload | None = None) -> Rollout:
    workload = workload or fixed(2, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0)
    return Rollout(workload, RolloutRecord(CHAINED, workload.name, 0.0), clock=clock)


def test_each_received_event_is_counted_and_the_pause_and_terminal_events_close_the_turn() -> None:
    clock = Clock()
    rollout = rollout_on(clock)
    clock.now = 1.0
    rollout.start_turn([{"type": "message", "id": "m0", "status": "x", "encrypted_content": "blob", "role": "user"}], 40)
    record = rollout.record
    assert (record.turns, record.transcript) == ([TurnRecord(0, 1.0, bytes_sent=40)], [{"type": "message", "role": "user"}])
    events = [
        (1.5, {"type": "response.created", "response": {"id": "resp_a"}, "sequence_number": 0}, 10),
        (2.0, {"type": "response.function_call_arguments.delta", "sequence_number": 1}, 20),
        (2.5, {"type": "response.output_text.delta", "sequence_number": 2}, 30),
        (3.0, {"type": "response.output_item.done", "item": CALL}, 40),
        (3.5, {"type": "response.done", "response": {"id": "resp_a", "status": "in_progress", "usage": USAGE,
                                                     "testbed_timing": {"api_ms": 1}}, "sequence_number": 4}, 50)]
    for at, event, size in events:
        clock.now = at
        rollout.received(event, size)
    turn = record.turns[0]
    # The first delta of either kind is the first token; a pause ends the turn with its usage and timing, but only a
    # terminal event names the response's outcome and adds its usage to the task's.
    assert (turn.first_token_at, turn.ended_at, turn.bytes_received, turn.ttft) == (2.0, 3.5, 150, 1.0)  # ttft from its start
    assert (turn.response_id, turn.usage, turn.server_timing) == ("resp_a", USAGE, {"api_ms": 1})
    assert record.timeline == [(at, "recv", event["type"]) for at, event, _ in events]
    assert record.sequence_numbers == [("resp_a", 0), ("resp_a", 1), ("resp_a", 2), ("resp_a", 4)]
    assert record.transcript[1:] == [{"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"}]
    assert (record.outcomes, record.response_ids) == ({}, [])
    assert record.usage == {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0}

    clock.now = 4.0
    rollout.start_turn([], 5, at=3.75)
    for _ in range(2):  # the same terminal event twice: one response id, its usage counted each time it came
        rollout.received({"type": "response.completed", "response": {"id": "resp_a", "status": "completed", "usage": USAGE}}, 5)
    rollout.received({"type": "response.failed", "response": {"id": "resp_b", "status": "failed",
                                                               "usage": {**USAGE, "output_tokens_details": None}}}, 5)
    rollout.received({"type": "response.incomplete", "response": {"id": "resp_c"}}, 5)
    assert record.turns[1] == TurnRecord(1, 3.75, ended_at=4.0, bytes_sent=5, bytes_received=20, response_id="resp_a")
    assert record.turns[1].ttft is None  # no token came
    assert record.outcomes == {"resp_a": "completed", "resp_b": "failed", "resp_c": ""}
    assert record.response_ids == ["resp_a", "resp_b", "resp_c"]
    assert record.usage == {"input_tokens": 300, "cached_tokens": 180, "output_tokens": 21, "reasoning_tokens": 6}
    rollout.received({"type": "error", "error": {"code": "x"}}, 7)
    assert (record.turns[1].ended_at, record.turns[1].bytes_received, record.timeline[-1]) == (4.0, 27, (4.0, "recv", "error"))
    rollout.received({"note": "no type"}, 1)  # an event without a type is recorded with an empty one
    assert record.timeline[-1] == (4.0, "recv", "")


# Turn 0 makes two calls (3 s and 1 s); turn 1 one call whose spec names 0.5 s; turn 2 answers.
TWO_CALLS = Workload("two-calls", 5, [TurnSpec(20, 5, (3.0, 1.0)), TurnSpec(9, 5, (0.5,)), TurnSpec(4, 5, ())])


async def test_a_turns_tools_run_as_long_as_the_longest_from_its_end_and_return_outputs_of_the_workloads_sizes(autojump_clock):
    workload = TWO_CALLS
    rollout = Rollout(workload, RolloutRecord(CHAINED, workload.name, 0.0), clock=Clock())
    rollout.start_turn([], 0)
    calls = [{"call_id": "a"}, {"call_id": "b"}, {"call_id": "c"}]  # a call past the spec's: no time, one token
    wait, outputs = rollout.tool_plan(calls)
    assert wait == 3.0
    assert [o["call_id"] for o in outputs] == ["a", "b", "c"] and {o["type"] for o in outputs} == {"function_call_output"}
    assert [tokenizer.count_tokens(o["output"]) for o in outputs] == [5, 4, 1]  # turn 1's 9 tokens split, remainder first
    assert [o["output"] for o in outputs] == [tool_output_text(workload, 0, i) for i in range(3)]
    rollout.start_turn([], 0)
    rollout.start_turn([], 0)
    wait, outputs = rollout.tool_plan([{"call_id": "d"}])  # turn 2 has no spec of its own: the last turn's, no time
    assert (wait, [tokenizer.count_tokens(o["output"]) for o in outputs]) == (0.0, [1])
    rollout.start_turn([], 0)  # a turn past the workload's last (a steered successor's): as the last turn, no time
    wait, outputs = rollout.tool_plan([{"call_id": "e"}])
    assert (wait, [tokenizer.count_tokens(o["output"]) for o in outputs]) == (0.0, [1])
    # Run on the trio clock, the tools start when the turn ended and their time is recorded.
    rollout = Rollout(workload, RolloutRecord(CHAINED, workload.name, 0.0))
    rollout.start_turn([], 0)
    rollout.record.turns[-1].ended_at = 1.0
    await trio.sleep(1.25)
    outputs = await rollout.run_tools([{"call_id": "a"}, {"call_id": "b"}])
    assert trio.current_time() == 4.0 and rollout.record.turns[-1].tool_seconds == 3.0  # from the turn's end, 1.0
    assert [o["call_id"] for o in outputs] == ["a", "b"]
    rollout.start_turn([], 0)  # a turn that has not ended: the tools start now
    await rollout.run_tools([{"call_id": "c"}])
    assert trio.current_time() == 4.5 and rollout.record.turns[-1].tool_seconds == 0.5


def test_tool_outputs_and_prompts_are_the_tasks_own_and_the_prefix_is_shared() -> None:
    task = fixed(3, initial_prompt_tokens=30, appended_tokens=6, output_tokens=5, content_seed=11)
    other = fixed(3, initial_prompt_tokens=30, appended_tokens=6, output_tokens=5, content_seed=12)
    texts = {tool_output_text(task, turn, index) for turn in range(2) for index in range(2)}
    assert len(texts) == 4  # each turn and call its own text
    assert tool_output_text(task, 0, 0) != tool_output_text(other, 0, 0) and task_prompt(task) != task_prompt(other)
    assert tool_output_text(task, 1, 0) == tool_output_text(fixed(3, initial_prompt_tokens=30, appended_tokens=6,
                                                                   output_tokens=5, content_seed=11), 1, 0)
    assert tokenizer.count_tokens(task_prompt(task)) == 30
    with_prefix = Workload("p", 0, task.turns, content_seed=11, prefix="coding", prefix_tokens=25)
    same_prefix = Workload("q", 0, task.turns, content_seed=99, prefix="coding", prefix_tokens=25)
    other_prefix = Workload("r", 0, task.turns, content_seed=11, prefix="writing", prefix_tokens=25)
    assert tokenizer.count_tokens(task_prompt(with_prefix)) == 5  # the rest of turn 0 after the prefix
    all_prefix = Workload("s", 0, task.turns, content_seed=11, prefix="coding", prefix_tokens=30)
    assert tokenizer.count_tokens(task_prompt(all_prefix)) == 1  # at least one token of its own
    assert shared_instructions(task) is None
    assert shared_instructions(with_prefix) == shared_instructions(same_prefix) != shared_instructions(other_prefix)
    assert tokenizer.count_tokens(shared_instructions(with_prefix) or "") == 25


def test_every_request_repeats_the_same_fields_and_asks_only_for_what_the_caller_asked() -> None:
    task = fixed(2, initial_prompt_tokens=10)
    assert request_body(task, model="m", metadata={"k": "v"}, store=True) == {
        "model": "m", "tools": [*HARNESS_TOOLS, WEB_SEARCH_TOOL], "metadata": {"k": "v"}, "store": True, "tool_choice": "auto",
        "reasoning": {"effort": "medium"}}
    body = request_body(task, model="m", metadata={}, store=False, include_reasoning=True, instructions="be brief", compact_threshold=900)
    assert (body["include"], body["instructions"], body["context_management"]) == (
        ["reasoning.encrypted_content"], "be brief", [{"type": "compaction", "compact_threshold": 900}])
    prefixed = Workload("p", 0, task.turns, prefix="coding", prefix_tokens=5)
    assert request_body(prefixed, model="m", metadata={}, store=False)["instructions"] == shared_instructions(prefixed)
    assert request_body(prefixed, model="m", metadata={}, store=False, instructions="own")["instructions"] == "own"
    assert "compact_threshold" not in json.dumps(request_body(task, model="m", metadata={}, store=False, compact_threshold=None))


class FakeWebSocket:
    """What the harness's channel and the lanes' reader use of a trio-websocket connection: messages to read (then a
    close), and what it is sent."""

    def __init__(self, messages: list[str | bytes]) -> None:
        self.messages, self.sent = list(messages), []

    async def send_message(self, text: str) -> None:
        self.sent.append(text)

    async def get_message(self) -> str | bytes:
        await trio.lowlevel.checkpoint()
        if not self.messages:
            raise trio_websocket.ConnectionClosed(trio_websocket.CloseReason(1000, None))
        return self.messages.pop(0)


async def test_the_channel_sends_compact_json_escaping_non_ascii_and_counts_its_bytes(autojump_clock) -> None:
    socket = FakeWebSocket([])
    rollout = rollout_on(Clock())
    channel = WsChannel(socket, rollout)  # type: ignore[arg-type]
    await trio.sleep(2.5)
    assert await channel.send({"type": "response.create", "input": "plain"}) == len('{"type":"response.create","input":"plain"}')
    assert await channel.send({"type": "response.append", "input": "é"}) == len('{"type":"response.append","input":"\\u00e9"}')
    assert socket.sent == ['{"type":"response.create","input":"plain"}', '{"type":"response.append","input":"\\u00e9"}']
    assert rollout.record.timeline == [(2.5, "send", "response.create"), (2.5, "send", "response.append")]


@pytest.mark.parametrize("end", ["response.done", "response.completed", "response.failed", "response.incomplete", "error"])
async def test_the_channel_reads_until_a_pause_an_end_or_an_error_counting_bytes(end: str) -> None:
    events = [{"type": "response.created", "response": {"id": "r", "instructions": "é"}}, {"type": "response.output_text.delta", "delta": "é"},
              {"type": end, "response": {"id": "r", "status": "x"}, "error": {"code": "c"}}, {"type": "after"}]
    texts = [json.dumps(event, ensure_ascii=False) for event in events]
    socket = FakeWebSocket([texts[0], texts[1].encode(), *texts[2:]])
    rollout = rollout_on(Clock())
    rollout.start_turn([], 0)
    assert await WsChannel(socket, rollout).until_pause() == events[2]  # type: ignore[arg-type]
    assert rollout.record.turns[0].bytes_received == sum(len(text.encode()) for text in texts[:3])
    assert socket.messages == [texts[3]]


def test_what_ends_a_turn_and_what_continues_it_as_a_steered_response() -> None:
    def response(status: str, *output: dict[str, Any]) -> dict[str, Any]:
        return {"id": "r", "status": status, "output": list(output)}

    assert turn_outcome(CHAINED, {"type": "error", "error": {"code": "rate_limit_exceeded"}}) == ("error:rate_limit_exceeded", [])
    assert turn_outcome(SUSPENDED, {"type": "response.done", "response": response("in_progress", ANSWER, CALL)}) == (None, [CALL])
    assert turn_outcome(CHAINED, {"type": "response.completed", "response": response("completed", CALL)}) == (None, [CALL])
    assert turn_outcome(CHAINED, {"type": "response.completed", "response": response("completed", ANSWER)}) == ("completed", [])
    assert turn_outcome(SUSPENDED, {"type": "response.completed", "response": response("completed", CALL)}) == ("completed", [])
    assert turn_outcome(CHAINED, {"type": "response.incomplete", "response": response("incomplete", CALL)}) == ("incomplete", [])
    assert function_calls([ANSWER, CALL, {"type": "function_call_output"}]) == [CALL]
    # Only an incomplete response stopped for steering is steered (its successor continues the turn).
    steered = {"type": "response.incomplete", "response": {"incomplete_details": {"reason": "steered"}}}
    assert is_steered(steered) and not is_steered({**steered, "type": "response.completed"})
    assert not is_steered({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}})
    assert not is_steered({"type": "response.incomplete", "response": {"incomplete_details": None}})
    assert not is_steered({"type": "response.incomplete", "response": None}) and not is_steered({"type": "error"})


class ScriptedChannel:
    """A channel that records what it is sent and answers each wait with the next pause of its script."""

    def __init__(self, rollout: Rollout, pauses: list[dict[str, Any]]) -> None:
        self.rollout, self.pauses, self.sent = rollout, list(pauses), []

    async def send(self, event: dict[str, Any]) -> int:
        self.sent.append((trio.current_time(), event))
        await trio.sleep(0.25)  # a slow write: the turn started when the client set out to send
        return 10 * len(self.sent)

    async def until_pause(self) -> dict[str, Any]:
        await trio.sleep(1.0)  # each response takes 1 s
        pause = self.pauses.pop(0)
        self.rollout.received(pause, 1)
        return pause


def pause(kind: str, response_id: str, *output: dict[str, Any], status: str = "completed", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "response": {"id": response_id, "status": status, "output": list(output), **fields}}


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_the_tool_loop_sends_each_turn_at_its_start_and_follows_a_steered_response(autojump_clock, design: str) -> None:
    task = fixed(3, initial_prompt_tokens=10, appended_tokens=5, output_tokens=5, tool_seconds=2.0)
    rollout = Rollout(task, RolloutRecord(design, task.name, 0.0))
    kind = "response.done" if design == SUSPENDED else "response.completed"
    steered = pause("response.incomplete", "resp_0", status="incomplete", incomplete_details={"reason": "steered"})
    channel = ScriptedChannel(rollout, [pause(kind, "resp_0", CALL), steered, pause(kind, "resp_1", CALL),
                                        pause("response.completed", "resp_2", ANSWER)])
    ended: list[TurnRecord] = []
    base = {"model": "m"}
    first = [{"type": "message", "role": "user", "content": "go"}]
    await trio.sleep(0.5)
    await drive_websocket_rollout(channel, rollout, design, base, first, ended.append, started_at=0.25)
    record = rollout.record
    assert record.status == "completed"
    outputs = [[{"type": "function_call_output", "call_id": "call_1", "output": tool_output_text(task, turn, 0)}] for turn in (0, 2)]
    if design == SUSPENDED:
        follow = [{"type": "response.append", "input": outputs[0]}, {"type": "response.append", "input": outputs[1]}]
    else:
        follow = [{"type": "response.create", "model": "m", "previous_response_id": f"resp_{n}", "input": outputs[n]} for n in (0, 1)]
    # Sent at 0.5, then after each pause and its tools (turn 0's 2 s; turn 2, past the task's calls, none), each write
    # taking 0.25 s; the steered response's successor is read, not asked for.
    assert channel.sent == [(0.5, {"type": "response.create", "model": "m", "input": first}), (3.75, follow[0]), (6.0, follow[1])]
    assert [(turn.turn, turn.sent_at, turn.bytes_sent, turn.ended_at) for turn in record.turns] == [
        (0, 0.25, 10, 1.75), (1, 3.75, 20, 5.0), (2, 5.0, 0, 6.0), (3, 6.0, 30, 7.25)]
    assert [turn.turn for turn in ended] == [0, 1, 2, 3]


async def test_an_error_ends_the_loop_without_a_turn_end_callback(autojump_clock) -> None:
    rollout = Rollout(SCRIPTED, RolloutRecord(CHAINED, SCRIPTED.name, 0.0))
    ended: list[TurnRecord] = []
    channel = ScriptedChannel(rollout, [{"type": "error", "error": {"code": "invalid_value"}}])
    await drive_websocket_rollout(channel, rollout, CHAINED, {}, [], ended.append)
    # Without `started_at`, turn 0 is stamped once its request is written.
    assert (rollout.record.status, ended, rollout.record.turns[0].sent_at) == ("error:invalid_value", [], 0.25)


def two_turn_script(kind: str) -> list[list[Any]]:
    return [[{"type": "response.created", "response": {"id": "resp_0"}},
             pause(kind, "resp_0", CALL, status="in_progress" if kind == "response.done" else "completed")],
            [{"type": "response.created", "response": {"id": "resp_1"}}, pause("response.completed", "resp_1", ANSWER)]]


@pytest.mark.parametrize("design", [CHAINED, SUSPENDED])
async def test_a_websocket_rollout_sends_the_harness_request_with_its_headers_and_ends_at_the_final_event(
        autojump_clock, design: str) -> None:
    server, task = ScriptedServer(two_turn_script("response.done" if design == SUSPENDED else "response.completed")), SCRIPTED
    await trio.sleep(1.0)
    with trio.fail_after(60):
        record = await run_websocket_rollout(InMemoryConnector(server), design, task, metadata={"k": "v"})
    assert (record.design, record.workload, record.status, record.started_at, record.ended_at) == (design, "scripted", "completed", 1.0, 3.0)
    headers = server.headers[0]
    assert (headers["authorization"], headers["openai-beta"]) == ("Bearer testbed", harness.BETA[design])
    assert "x-responsesapi-include-timing-metrics" not in headers
    [(_, first), (_, second)] = server.received
    base = request_body(task, model="gpt-5.4", metadata={"k": "v"}, store=False, include_reasoning=design == CHAINED)
    assert first == {"type": "response.create", **base, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(task)}]}]}
    outputs = [{"type": "function_call_output", "call_id": "call_1", "output": tool_output_text(task, 0, 0)}]
    if design == SUSPENDED:
        assert second == {"type": "response.append", "input": outputs}
    else:
        assert second == {"type": "response.create", **base, "previous_response_id": "resp_0", "input": outputs}


async def test_a_websocket_rollout_passes_the_callers_options_and_starts_once_connected(autojump_clock) -> None:
    server, task = ScriptedServer(two_turn_script("response.completed")), SCRIPTED
    connected_at: list[float] = []
    ended: list[int] = []

    async def connected() -> None:
        connected_at.append(trio.current_time())
        await trio.sleep(0.5)

    with trio.fail_after(60):
        record = await run_websocket_rollout(InMemoryConnector(server), CHAINED, task, metadata={}, model="sim-1", store=True,
                                             include_timing=True, api_key="key-1", instructions="mine", connected=connected,
                                             compact_threshold=50, on_turn_end=lambda turn: ended.append(turn.turn))
    assert (connected_at, record.started_at, record.turns[0].sent_at, record.ended_at, ended) == ([0.0], 0.5, 0.5, 2.5, [0, 1])
    headers = server.headers[0]
    assert (headers["authorization"], headers["x-responsesapi-include-timing-metrics"]) == ("Bearer key-1", "true")
    first = server.received[0][1]
    assert first == {"type": "response.create", **request_body(task, model="sim-1", metadata={}, store=True, instructions="mine",
                                                               compact_threshold=50), "input": first["input"]}
    assert "include" not in first  # with a store, no reasoning blob


async def test_a_websocket_rollout_closes_its_connection_after_the_task(autojump_clock) -> None:
    server = ScriptedServer([[{"type": "error", "error": {"code": "invalid_value"}}, Close(1000)]])
    with trio.fail_after(60):
        record = await run_websocket_rollout(InMemoryConnector(server), CHAINED, SCRIPTED, metadata={})
    assert (record.status, record.ended_at, len(record.turns)) == ("error:invalid_value", 0.0, 1)


class ClosesBeforeTheHandshake:
    """A server that reads the handshake request and closes the connection without answering it."""

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        await stream.receive_some(65536)
        await stream.aclose()


async def test_a_handshake_the_server_closes_without_answering_fails_after_the_handshake_timeout(autojump_clock) -> None:
    with pytest.RaisesGroup(trio_websocket.ConnectionTimeout, flatten_subgroups=True):
        async with harness.open_responses_websocket(InMemoryConnector(ClosesBeforeTheHandshake()), CHAINED):
            pass
    assert trio.current_time() == harness.HANDSHAKE_TIMEOUT_SECONDS
