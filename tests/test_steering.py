"""`response.steer` on the chained design (docs/protocol.md, Steering): the steered stop and its automatic successor,
pending at client tool calls, every `response.steer.failed` code; v1 refuses. Virtual time, exact events."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, timed_until, until, ws
from test_inject import MULTI_AGENT, beta_ws, calls_done, until_calls
from trio_websocket import ConnectionClosed

from prototype.api.costs import ZERO_COSTS
from prototype.client.harness import SUSPENDED
from prototype.protocol.steering import MAX_QUEUED_STEERS
from prototype.server.config import ServerConfig

LONG_TEXT = {"testbed_workload": "fixed:3:100:10:300:0.5"}  # 300-token messages: 0.3 s at sim-1000
FINAL_ONLY = {"testbed_workload": "fixed:1:100:10:300"}  # one turn: the final answer
LANE = "agent"


def steer(previous_response_id: str, text: str = "keep it small") -> dict:
    return {"type": "response.steer", "previous_response_id": previous_response_id, "input": text}


async def start(conn, metadata=LONG_TEXT, **fields) -> tuple[str, list[dict]]:
    """Create on LANE and read up to the first text delta; returns (response id, events)."""
    await send(conn, create_event(metadata=metadata, stream_id=LANE, **fields))
    events = await until(conn, "response.output_text.delta")
    return events[0]["response"]["id"], events


async def test_steering_stops_at_the_end_of_the_item_and_the_successor_inherits_the_settings(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, before = await start(conn)
        steered_at = trio.current_time()
        await send(conn, steer(target))
        events = await timed_until(conn, *TERMINALS)
        successor_events = await timed_until(conn, *TERMINALS)
    accepted_at, accepted = events[0]
    assert accepted_at == steered_at and accepted == {
        "type": "response.steer.accepted", "sequence_number": accepted["sequence_number"],
        "steer": {"id": accepted["steer"]["id"], "previous_response_id": target}, "stream_id": LANE}
    assert accepted["steer"]["id"].startswith("steer_") and len(accepted["steer"]["id"]) == 6 + 32
    # Numbered in the target's sequence: after what was sent before it, before what follows.
    numbers = [e["sequence_number"] for e in before] + [e["sequence_number"] for _, e in events]
    assert numbers == list(range(len(numbers)))
    # The message in progress finished; the planned tool call was never started.
    item_done_at, item_done = next((t, e) for t, e in events if e["type"] == "response.output_item.done")
    ended_at, ended = events[-1]
    assert (ended["type"], ended_at, ended["response"]["incomplete_details"]) == (
        "response.incomplete", item_done_at, {"reason": "steered"})
    assert [(i["type"], i["status"]) for i in ended["response"]["output"]] == [("message", "completed")]
    # The automatic successor: created without a client request, continuing from the target.
    created_at, created = successor_events[0]
    assert created["type"] == "response.created" and created["sequence_number"] == 0 and created["stream_id"] == LANE
    assert created_at >= ended_at
    successor = created["response"]
    assert (successor["previous_response_id"], successor_events[-1][1]["type"]) == (target, "response.completed")
    keys = ("model", "tools", "metadata", "store", "tool_choice", "parallel_tool_calls")
    assert {key: successor[key] for key in keys} == {key: ended["response"][key] for key in keys}
    # The server's record of the successor: its input is the steering message, nothing else.
    # The client's bytes: the create frame for the target, none for the automatic successor.
    record = [r for r in server.records if r["response_id"] == successor["id"]][0]
    assert (record["input_items"], record["input_types"], record["stream_id"], record["request_bytes"]) == (
        1, {"message": 1}, True, 0)
    (target_record,) = [r for r in server.records if r["response_id"] == target]
    assert target_record["request_bytes"] == len(json.dumps(create_event(metadata=LONG_TEXT, stream_id=LANE)).encode())


async def test_a_steer_on_a_warm_up_rides_a_successor_that_generates(autojump_clock):
    """A warm-up is steerable while its post-inference work runs; its successor generates, carrying the message."""
    server = make_server(costs=attrs.evolve(ZERO_COSTS, post=1.0))
    async with ws(server) as conn:
        await send(conn, create_event(metadata=FINAL_ONLY, stream_id=LANE, generate=False))
        target = (await until(conn, "response.created"))[-1]["response"]["id"]
        await send(conn, steer(target))
        warm_up = await until(conn, *TERMINALS)
        successor = await until(conn, *TERMINALS)
    assert [e["type"] for e in warm_up] == ["response.steer.accepted", "response.completed"]
    assert warm_up[-1]["response"]["output"] == []
    created, done = successor[0], successor[-1]
    assert (created["type"], created["response"]["previous_response_id"]) == ("response.created", target)
    assert [e["type"] for e in successor[1:3]] == ["response.in_progress", "response.output_item.added"]
    assert (done["type"], [item["type"] for item in done["response"]["output"]]) == ("response.completed", ["message"])
    (record,) = [r for r in server.records if r["response_id"] == created["response"]["id"]]
    assert (record["warmup"], record["input_types"], record["request_bytes"]) == (False, {"message": 1}, 0)


def failed(event: dict, code: str, previous: str, given, *, steer_id: str | None = None, message: str | None = None) -> bool:
    steer = {"previous_response_id": previous, "input": given} | ({} if steer_id is None else {"id": steer_id})
    assert (event["type"], event["steer"], event["error"]["code"], event["error"]["type"]) == (
        "response.steer.failed", steer, code, "invalid_request_error"), event
    assert event["error"]["message"] and message in (None, event["error"]["message"]), event
    return True


NOT_EMPTY = "'input' must not be empty."
NOT_MESSAGES = "'input' must be a string or a non-empty array of user messages."
ONLY_USER = "input[0]: steering accepts only messages with the user role."
ONLY_KEYS = "input[0]: a message may carry only type, role and content."
PARTS = "input[0].content: parts must be input_text, input_image or input_file."
BAD_INPUTS = [  # (input, the message of its invalid_input)
    ("", NOT_EMPTY), ([], NOT_MESSAGES), ({"text": "an object"}, NOT_MESSAGES),
    ([{"role": "assistant", "content": "no"}], ONLY_USER),
    ([{"type": "item_reference", "role": "user", "content": "x"}], ONLY_USER),
    ([{"type": "function_call_output", "call_id": "call_1", "output": "x"}], ONLY_KEYS),
    ([{"role": "user", "content": "x", "name": "n"}], ONLY_KEYS), (["a bare string"], ONLY_KEYS),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], PARTS), ([{"role": "user", "content": []}], PARTS),
    ([{"role": "user", "content": ["x"]}], PARTS),
    ([{"role": "user", "content": 5}], "input[0].content: expected a string or an array of parts."),
    # Parts the item parser refuses: its reason, as invalid_input.
    ([{"role": "user", "content": [{"type": "input_image"}]}],
     "Unsupported content part type 'input_image' at 'input[0].content[0]': the simulator takes text parts only."),
    ([{"role": "user", "content": [{"type": "input_text", "text": 5}]}], "Invalid type for 'input[0].content[0].text': expected a string."),
]


async def test_bad_steering_input_is_returned_as_invalid_input_and_user_messages_are_accepted(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, before = await start(conn)
        for number, (given, message) in enumerate(BAD_INPUTS):
            await send(conn, {"type": "response.steer", "previous_response_id": target, "input": given})
            refused = (await until(conn, "response.steer.failed"))[-1]
            assert failed(refused, "invalid_input", target, given, message=message)
            if number == 0:  # numbered in the target's sequence, on its lane
                assert (refused["sequence_number"], refused["stream_id"]) == (before[-1]["sequence_number"] + 1, LANE)
        # Only type, previous_response_id and input: the target decides the lane.
        await send(conn, {**steer(target), "stream_id": LANE})
        assert failed((await until(conn, "response.steer.failed"))[-1], "invalid_input", target, "keep it small",
                      message="response.steer accepts only type, previous_response_id and input; got 'stream_id'.")
        # The target must be named by a non-empty string; anything else is echoed as "".
        for previous in (123, "", None):
            await send(conn, {"type": "response.steer", "previous_response_id": previous, "input": "x"})
            assert failed((await until(conn, "response.steer.failed"))[-1], "invalid_input", "", "x",
                          message="response.steer needs 'previous_response_id', a response id.")
        # User messages as an array are accepted, with or without type and as parts.
        given = [{"role": "user", "content": "keep it small"},
                 {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and fast"}]}]
        await send(conn, {"type": "response.steer", "previous_response_id": target, "input": given})
        accepted = (await until(conn, "response.steer.accepted"))[-1]
        await until(conn, "response.incomplete")
        successor = await until(conn, *TERMINALS)
    assert accepted["steer"]["previous_response_id"] == target
    assert successor[0]["type"] == "response.created" and successor[-1]["type"] == "response.completed"
    # The successor carries those two messages only: no refused input was queued.
    record = [r for r in server.records if r["response_id"] == successor[0]["response"]["id"]][0]
    assert (record["input_items"], record["input_types"]) == (2, {"message": 2})


async def test_unknown_ended_completed_and_forgotten_targets_are_refused_and_a_steered_final_answer_completes(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        await send(conn, steer("resp_unknown"))
        unknown = await receive(conn)
        assert failed(unknown, "response_not_found", "resp_unknown", "keep it small",
                      message="Response 'resp_unknown' is not available on this connection.")
        assert unknown["sequence_number"] == 0 and "stream_id" not in unknown
        # A steered response is no longer active once its successor runs.
        target, _ = await start(conn)
        await send(conn, steer(target))
        await until(conn, "response.incomplete")
        successor = (await until(conn, "response.created"))[-1]["response"]["id"]
        await send(conn, steer(target, "again"))
        not_active = (await until(conn, "response.steer.failed"))[-1]
        assert failed(not_active, "response_not_active", target, "again") and not_active["stream_id"] == LANE
        completed = (await until(conn, *TERMINALS))[-1]
        assert completed["response"]["id"] == successor
        await send(conn, steer(successor, "late"))
        late = await receive(conn)
        assert failed(late, "response_already_completed", successor, "late")
        assert late["sequence_number"] == completed["sequence_number"] + 1 and late["stream_id"] == LANE
        # The connection keeps each lane's running response and its parent only.
        ids = []
        for _ in range(3):  # three responses one after the other on LANE
            await send(conn, create_event(metadata=FINAL_ONLY, stream_id=LANE))
            ids.append((await until(conn, "response.created"))[-1]["response"]["id"])
            if len(ids) < 3:
                await until(conn, *TERMINALS)
        await send(conn, steer(ids[1], "to the parent"))
        parent = (await until(conn, "response.steer.failed"))[-1]
        await send(conn, steer(ids[0], "to the oldest"))
        oldest = (await until(conn, "response.steer.failed"))[-1]
        await until(conn, "response.output_text.delta")  # the final answer is under way
        await send(conn, steer(ids[2], "to the running one"))
        events = await until(conn, *TERMINALS)
        successor = await until(conn, *TERMINALS)
    assert failed(parent, "response_already_completed", ids[1], "to the parent")
    assert failed(oldest, "response_not_found", ids[0], "to the oldest")
    # A final answer is not cut: it completes normally, and an automatic successor follows.
    assert (events[0]["type"], events[0]["steer"]["previous_response_id"]) == ("response.steer.accepted", ids[2])
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["incomplete_details"] is None
    assert (successor[0]["type"], successor[0]["response"]["previous_response_id"], successor[-1]["type"]) == (
        "response.created", ids[2], "response.completed")


async def test_too_many_pending_steers(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, _ = await start(conn)
        for i in range(MAX_QUEUED_STEERS + 1):
            await send(conn, steer(target, f"note {i}"))
        answers = [e for e in await until(conn, "response.incomplete") if e["type"].startswith("response.steer")]
        successor = (await until(conn, "response.created"))[-1]["response"]["id"]
        await until(conn, *TERMINALS)
    assert [a["type"] for a in answers] == ["response.steer.accepted"] * MAX_QUEUED_STEERS + ["response.steer.failed"]
    assert failed(answers[-1], "too_many_pending_steers", target, f"note {MAX_QUEUED_STEERS}")
    record = [r for r in server.records if r["response_id"] == successor][0]
    assert record["input_types"] == {"message": MAX_QUEUED_STEERS}  # every accepted note, in one successor


async def test_a_continuation_that_fails_returns_the_pending_input_naming_the_code(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, accepted, _ = await pending_steer(conn)
        wrong = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        await send(conn, create_event(metadata=LONG_TEXT, stream_id=LANE, previous_response_id=target, input=wrong))
        error = await receive(conn)
        returned = await receive(conn)
        with trio.move_on_after(5):  # and nothing more
            raise AssertionError(await receive(conn))
    assert (error["type"], error["error"]["code"], error["stream_id"]) == ("error", "invalid_function_call_output", LANE)
    assert failed(returned, "successor_creation_failed", target, "keep it small", steer_id=accepted["id"],
                  message="The continuation failed: invalid_function_call_output.")
    assert (returned["stream_id"], [r["outcome"] for r in server.records]) == (LANE, ["completed", "error:invalid_function_call_output"])


async def test_v1_refuses_steering(autojump_clock):
    server = make_server()
    async with ws(server, SUSPENDED) as conn:
        await send(conn, create_event(metadata=LONG_TEXT))
        target = (await until(conn, "response.output_text.delta"))[0]["response"]["id"]
        await send(conn, steer(target))
        refused = (await until(conn, "response.steer.failed"))[-1]
        assert failed(refused, "steering_not_supported", target, "keep it small",
                      message="Steering is not supported by this protocol version.")
        assert refused["sequence_number"] == 0 and "stream_id" not in refused
        done = await until(conn, "response.done")
    assert (done[-1]["type"], done[-1]["response"]["status"]) == ("response.done", "in_progress")  # the rollout went on, unsteered


async def pending_steer(conn) -> tuple[str, dict, list[dict]]:
    """A response on LANE steered at its client tool call: the steer waits as pending. Returns (its id, the accepted
    steer, its calls)."""
    await send(conn, create_event(metadata=LONG_TEXT, stream_id=LANE))
    target = (await until(conn, "response.function_call_arguments.delta"))[0]["response"]["id"]
    await send(conn, steer(target))
    events = await until(conn, *TERMINALS)
    accepted, completed, calls = events[0], events[-1], function_calls(events[-1]["response"])
    assert accepted["type"] == "response.steer.accepted" and completed["type"] == "response.completed" and len(calls) == 1
    assert await receive(conn) == {
        "type": "response.steer.pending", "sequence_number": completed["sequence_number"] + 1,
        "reason": "waiting_for_required_input",
        "required_input": [{"type": "function_call_output", "call_id": calls[0]["call_id"], "name": calls[0]["name"]}],
        "steer": accepted["steer"], "stream_id": LANE}
    return target, accepted["steer"], calls


async def test_a_pending_steer_fails_at_once_when_its_lane_starts_an_unrelated_response(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, accepted, _ = await pending_steer(conn)
        sent_at = trio.current_time()
        await send(conn, create_event(metadata=FINAL_ONLY, stream_id=LANE))  # continues nothing: the lane moves on
        events = await timed_until(conn, *TERMINALS)
    # The steer can no longer be carried: it fails before the unrelated response's first event, in its target's sequence.
    (failed_at, refused), (created_at, created) = events[0], events[1]
    assert failed(refused, "response_not_active", target, "keep it small", steer_id=accepted["id"])
    assert refused["stream_id"] == LANE and failed_at == created_at == sent_at
    assert created["type"] == "response.created" and created["response"]["previous_response_id"] is None
    assert ([e["type"] for _, e in events[2:]].count("response.steer.failed"), events[-1][1]["type"]) == (0, "response.completed")
    record = [r for r in server.records if r["response_id"] == created["response"]["id"]][0]
    assert record["input_types"] == {"message": 1}  # the client's own input only: the steer's message was not carried


async def test_a_pending_steer_waits_for_the_call_and_rides_its_targets_own_continuation_not_a_fork(autojump_clock):
    server = make_server()
    async with ws(server) as conn:
        target, accepted, calls = await pending_steer(conn)
        with trio.move_on_after(30):  # nothing more until the client answers the call
            raise AssertionError(await receive(conn))
        await send(conn, create_event(metadata=LONG_TEXT, stream_id="side", previous_response_id=target, input=outputs_for(calls)))
        fork = await until(conn, *TERMINALS)
        await send(conn, create_event(metadata=LONG_TEXT, stream_id=LANE, previous_response_id=target, input=outputs_for(calls)))
        continuation = await until(conn, *TERMINALS)
    # The fork (another lane, same parent) runs without the steer: no steer event, no message.
    assert [e["type"] for e in fork if e["type"].startswith("response.steer")] == []
    assert fork[0]["stream_id"] == "side" and fork[-1]["type"] == "response.completed"
    fork_record = [r for r in server.records if r["response_id"] == fork[0]["response"]["id"]][0]
    assert (fork_record["input_items"], fork_record["input_types"]) == (1, {"function_call_output": 1})
    # The target's own lane continues it and carries the queued message, prepended to the client's tool output.
    assert continuation[0]["type"] == "response.created" and continuation[-1]["type"] == "response.completed"
    record = [r for r in server.records if r["response_id"] == continuation[0]["response"]["id"]][0]
    assert (record["input_items"], record["input_types"]) == (2, {"message": 1, "function_call_output": 1})
    assert accepted["previous_response_id"] == target


async def test_a_steer_on_a_response_that_answered_its_calls_in_place_rides_an_automatic_successor(autojump_clock):
    # A multi-agent response answers its call in place: when it completes, the steer rides the automatic successor,
    # never pending on input the client already gave.
    server = make_server()
    async with beta_ws(server) as conn:
        await send(conn, create_event(metadata={"testbed_workload": "fixed:2:100:10:400:0"}, multi_agent=MULTI_AGENT))
        events = await until_calls(conn)
        target = events[0][1]["response"]["id"]
        ((_, call),) = calls_done(events)
        await send(conn, {"type": "response.inject", "response_id": target, "input": outputs_for([call["item"]])})
        await until(conn, "response.output_text.delta")  # the final answer
        await send(conn, steer(target))
        events = await until(conn, *TERMINALS)
        # The successor inherits `multi_agent` and waits at its own call: the test answers it.
        successor = await until_calls(conn)
        ((_, next_call),) = calls_done(successor)
        created = successor[0][1]
        await send(conn, {"type": "response.inject", "response_id": created["response"]["id"],
                          "input": outputs_for([next_call["item"]])})
        successor = [e for _, e in successor] + await until(conn, *TERMINALS)
    assert events[0]["type"] == "response.steer.accepted" and events[-1]["type"] == "response.completed"
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["message", "function_call", "message"]
    assert created["type"] == "response.created" and created["response"]["previous_response_id"] == target
    assert "response.steer.pending" not in [e["type"] for e in successor] and successor[-1]["type"] == "response.completed"
    record = [r for r in server.records if r["response_id"] == created["response"]["id"]][0]
    assert record["input_types"] == {"message": 1}  # the steering message, nothing else


async def test_a_steer_whose_successor_would_outlive_the_connection_fails_and_the_connection_closes(autojump_clock):
    # The lifetime limit strikes while the steered response finishes its message: no successor; its queued input comes
    # back, then the limit's error and the close.
    server = make_server(config=ServerConfig(connection_lifetime=0.2))
    async with ws(server) as conn:
        target, _ = await start(conn)
        await send(conn, steer(target))
        events = await timed_until(conn, "response.steer.failed")
        accepted = events[0][1]
        limit = await receive(conn)
        with pytest.raises(ConnectionClosed) as closed:
            await receive(conn)
    (ended_at, ended), (refused_at, refused) = events[-2], events[-1]
    assert ended["type"] == "response.incomplete" and ended["response"]["incomplete_details"] == {"reason": "steered"}
    assert failed(refused, "successor_creation_failed", target, "keep it small", steer_id=accepted["steer"]["id"],
                  message="The connection reached its lifetime limit.")
    assert (refused["sequence_number"], refused["stream_id"], refused_at) == (ended["sequence_number"] + 1, LANE, ended_at)
    assert "response.created" not in [e["type"] for _, e in events]
    assert (limit["type"], limit["error"]["code"]) == ("error", "websocket_connection_limit_reached")
    assert closed.value.reason.code == 1000
