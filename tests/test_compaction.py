"""Compaction (docs/protocol.md, "Compaction"): `context_management` compacts a context past its threshold and the chain
continues; `POST /v1/responses/compact` answers a window that starts a new chain; a client that resends its history keeps
only the window."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from support import TERMINALS, create_event, function_calls, make_server, outputs_for, receive, send, timed_until, until, ws
from test_endpoints import connect

from prototype.api.costs import ALL_SWITCHES_ON, CacheSwitches
from prototype.api.render import preamble_key, render_full
from prototype.client.harness import HARNESS_TOOLS
from prototype.designs.compaction import summary_tokens
from prototype.engine import tokenizer
from prototype.engine.engine import Engine
from prototype.engine.memory import SWAP_POLICY
from prototype.protocol.compaction import window, window_of_dicts
from prototype.protocol.events import ToolDef
from prototype.protocol.items import Compaction, Message, parse_item
from prototype.server.config import ServerConfig

THRESHOLD = 1000  # the API reference's minimum
COMPACTING = [{"type": "compaction", "compact_threshold": THRESHOLD}]
FOUR_TURNS = {"testbed_workload": "fixed:4:100:10:20:0"}
BIG_OUTPUT = " alpha" * 400  # 400 tokens a tool output: the context crosses 1000 tokens at the fourth turn


async def run_chain(conn, metadata: dict[str, str] = FOUR_TURNS, second_message: str | None = None,
                    **fields: Any) -> list[list[tuple[float, dict]]]:
    """A chained rollout answering every call with BIG_OUTPUT (the first outputs with `second_message`, a second user
    message, if given); each turn's timed events."""
    turns, previous, new_input = [], None, "fix the bug"
    while True:
        extra = {"previous_response_id": previous} if previous else {}
        await send(conn, create_event(new_input, metadata=metadata, **extra, **fields))
        events = await timed_until(conn, *TERMINALS)
        turns.append(events)
        response = events[-1][1]["response"]
        calls = function_calls(response)
        if not calls:
            return turns
        new_input = outputs_for(calls, BIG_OUTPUT)
        if previous is None and second_message is not None:
            new_input.append({"type": "message", "role": "user", "content": second_message})
        previous = response["id"]


async def test_under_swap_a_compaction_leaves_the_old_context_as_prefix_cache_instead_of_swapping_it_out(autojump_clock):
    # The summary call is followed at once by the call on the compacted prompt: nothing is swapped out between them,
    # so the chain moves exactly the bytes it moves without compaction (its three pauses).
    plain_server, compacting_server = (make_server(engine=Engine(retention=SWAP_POLICY)) for _ in range(2))
    async with ws(plain_server) as conn:
        plain = await run_chain(conn)
    async with ws(compacting_server) as conn:
        compacted = await run_chain(conn, context_management=COMPACTING)
    assert [e["type"] for _, e in compacted[3]].count("response.compaction.compacting") == 1
    plain_stats, compacting_stats = plain_server.api.engine.stats, compacting_server.api.engine.stats
    assert compacting_stats.swap_out_bytes == plain_stats.swap_out_bytes > 0
    assert compacting_stats.swap_in_bytes == plain_stats.swap_in_bytes
    assert [t[-1][0] - t[0][0] for t in compacted[:3]] == pytest.approx([t[-1][0] - t[0][0] for t in plain[:3]], rel=1e-12)


async def test_the_context_is_compacted_past_its_threshold_not_at_it_and_the_chain_continues(autojump_clock):
    plain_server, compacting_server = make_server(), make_server()
    async with ws(plain_server) as conn:
        plain = await run_chain(conn)
    async with ws(compacting_server) as conn:
        compacted = await run_chain(conn, context_management=COMPACTING)
    assert len(plain) == len(compacted) == 4  # the same rollout, to the end, through previous_response_id
    usage = lambda turn: turn[-1][1]["response"]["usage"]  # noqa: E731
    # The first three turns are identical: the context has not crossed the threshold yet.
    assert [usage(t) for t in plain[:3]] == [usage(t) for t in compacted[:3]]
    assert usage(plain[2])["input_tokens"] < THRESHOLD < usage(plain[3])["input_tokens"]
    # The fourth turn: the model reads the whole context once more, streams a compaction item, then
    # samples from the compacted window.
    fourth = compacted[3]
    kinds = [e["type"] for _, e in fourth]
    added = kinds.index("response.output_item.added")
    assert kinds[added : added + 3] == ["response.output_item.added", "response.compaction.compacting", "response.output_item.done"]
    (added_at, added_event), (compacting_at, compacting), (done_at, done) = fourth[added : added + 3]
    assert added_event["item"]["type"] == done["item"]["type"] == "compaction" and compacting["item_id"] == done["item"]["id"]
    assert compacting["output_index"] == 0 and done["item"]["encrypted_content"].startswith("tbc1.")
    # The item is announced empty, under the id and index it is done with.
    assert added_event["item"] == {"type": "compaction", "id": done["item"]["id"], "encrypted_content": ""}
    assert done["item"]["id"].startswith("cmp_") and added_event["output_index"] == done["output_index"] == 0
    # It covers the three rounds of calls before it and drops the nine items they made (three turns of a message, a
    # call and its output); the summary is as long as the usage says.
    summary = parse_item(done["item"])
    assert (summary.rounds, summary.offset) == (3, 9)
    assert len(tokenizer.encoding().encode_ordinary(summary.summary)) == summary_tokens(usage(plain[3])["input_tokens"])
    assert compacting_server.api.engine.stats.decoded_tokens == plain_server.api.engine.stats.decoded_tokens + len(
        tokenizer.encoding().encode_ordinary(summary.summary))
    context_before = usage(plain[3])["input_tokens"]  # what the model would have read without compaction
    # The summary is sampled at the model's decode rate (sim-1000: 1000 tokens/s).
    assert done_at - compacting_at == pytest.approx(summary_tokens(context_before) / 1000, abs=1e-9)
    assert [item["type"] for item in fourth[-1][1]["response"]["output"]] == ["compaction", "message"]
    # input_tokens counts both model calls: the compaction read (the old context) and the turn.
    turn_context = usage(compacted[3])["input_tokens"] - context_before
    assert 0 < turn_context < context_before / 2
    assert usage(compacted[3])["output_tokens"] == usage(plain[3])["output_tokens"] + summary_tokens(context_before)
    # What the prefix cache keeps of the compacted prompt: its head (instructions, tools, the user
    # message), equal to the old prompt's; the summary and what follows are prefilled anew.
    head_cached = usage(compacted[3])["input_tokens_details"]["cached_tokens"] - usage(plain[3])["input_tokens_details"]["cached_tokens"]
    head = len(render_full(preamble_key(None, tuple(ToolDef(t["type"], t.get("name"), t.get("parameters"), t) for t in HARNESS_TOOLS)),
                           [Message("user", (("input_text", "fix the bug"),))]))
    assert 0 < head_cached <= head < turn_context
    # A context of exactly the threshold is not compacted; one token more is (the fourth's is the rollout's largest).
    for threshold, compactions in ((context_before, 0), (context_before - 1, 1)):
        async with ws(make_server()) as conn:
            turns = await run_chain(conn, context_management=[{"type": "compaction", "compact_threshold": threshold}])
        assert [e["type"] for turn in turns for _, e in turn].count("response.compaction.compacting") == compactions


async def v1_rollout(**fields: Any) -> tuple[list[str], dict]:
    """A v1 rollout answering every call with BIG_OUTPUT: its event types and its terminal event."""
    async with ws(make_server(), design="suspended") as conn:
        await send(conn, create_event(metadata=FOUR_TURNS, **fields))
        kinds = []
        while True:
            events = await until(conn, "response.done", *TERMINALS)
            kinds += [e["type"] for e in events]
            if events[-1]["type"] != "response.done":
                return kinds, events[-1]
            await send(conn, {"type": "response.append", "input": outputs_for(function_calls(events[-1]["response"]), BIG_OUTPUT)})


async def test_a_v1_rollout_compacts_inside_its_one_response(autojump_clock):
    _, plain = await v1_rollout()
    kinds, final = await v1_rollout(context_management=COMPACTING)
    assert final["type"] == "response.completed" and kinds.count("response.compaction.compacting") == 1
    (summary,) = [parse_item(item) for item in final["response"]["output"] if item["type"] == "compaction"]
    # The one response's usage adds the summary to the tokens its turns sampled before and after it.
    assert final["response"]["usage"]["output_tokens"] == plain["response"]["usage"]["output_tokens"] + len(
        tokenizer.encoding().encode_ordinary(summary.summary))


def test_the_window_and_a_resent_history_keep_the_user_messages_and_everything_from_the_latest_compaction_on():
    user1, user2 = Message("user", (("input_text", "a"),)), Message("user", (("input_text", "b"),))
    said = Message("assistant", (("output_text", "x"),))
    first, second = Compaction("cmp_1", "s1"), Compaction("cmp_2", "s2")
    assert window([user1, said, first, user2, said, second, said]) == [user1, user2, second, said]
    assert window([user1, said]) == [user1, said]
    wire = [item.to_dict() for item in (user1, said, first, said)]
    assert window_of_dicts(wire) == [wire[0], *wire[2:]]
    # The item survives the client's round trip with its summary, so a resent window renders the same.
    assert parse_item(first.to_dict()) == first
    assert len(render_full("p", [first])) == len(render_full("p", [parse_item(first.to_dict())]))
    # A resent history keeps its user messages (typed or easy, not an output whatever its role) and what follows the item.
    said = {"type": "message", "role": "assistant", "content": "x"}
    typed_user, easy_user = {"type": "message", "role": "user", "content": "a"}, {"role": "user", "content": "b"}
    output = {"type": "function_call_output", "role": "user", "call_id": "c", "output": "y"}
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "tbc1."}
    assert window_of_dicts([typed_user, said]) == [typed_user, said]
    assert window_of_dicts([typed_user, easy_user, said, output, compaction, said]) == [typed_user, easy_user, compaction, said]


# --- POST /v1/responses/compact in process, over raw HTTP/1.1 -------------------------------------------------------


async def test_compact_answers_the_window_of_a_stored_chain_and_its_input(autojump_clock):
    server = make_server()
    async with trio.open_nursery() as nursery:
        client = connect(nursery, server)
        first = (await client.request("POST", "/v1/responses", body={
            "model": "sim-1000", "input": "fix the bug", "store": True, "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:2"},
        })).json()
        assert [item["type"] for item in first["output"]] == ["message", "function_call"]
        decoded = server.api.engine.stats.decoded_tokens
        ask = {"model": "sim-1000", "input": outputs_for(function_calls(first)), "previous_response_id": first["id"]}
        reply, again = [await client.request("POST", "/v1/responses/compact", body=ask) for _ in range(2)]
        nursery.cancel_scope.cancel()
    assert reply.status == 200
    body = reply.json()
    # The summary depends only on the conversation: compacting it again writes the same one.
    assert again.json()["output"] == [*body["output"][:-1], {**body["output"][-1], "id": again.json()["output"][-1]["id"]}]
    assert server.api.engine.stats.decoded_tokens == decoded + 2 * body["usage"]["output_tokens"]
    assert sorted(body) == ["created_at", "id", "object", "output", "usage"]
    assert body["id"].startswith("resp_") and body["object"] == "response.compaction" and isinstance(body["created_at"], int)
    # The stored chain (the user message, the model's message and call) and the input (the call's output): the window
    # is the user message and the compaction item, which says how many rounds it covers (one call) and how many items
    # it dropped (the message, the call and its output), so call ids count on past them in the new chain.
    *users, item = body["output"]
    assert users == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]}]
    compaction = parse_item(item)
    assert item["id"].startswith("cmp_") and (compaction.rounds, compaction.offset) == (1, 3)
    usage = body["usage"]
    assert usage["output_tokens"] == summary_tokens(usage["input_tokens"]) == len(tokenizer.encoding().encode_ordinary(compaction.summary))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_compact_reads_a_seen_conversations_prefix_from_the_cache_and_refuses_an_unknown_one(autojump_clock):
    server = make_server()
    async with trio.open_nursery() as nursery:
        client = connect(nursery, server)
        first = (await client.request("POST", "/v1/responses", body={
            "model": "sim-1000", "input": "fix the bug", "store": True, "metadata": {"testbed_workload": "fixed:1"}})).json()
        reply, unknown = [await client.request("POST", "/v1/responses/compact", body={
            "model": "sim-1000", "input": "now the docs", "previous_response_id": previous}) for previous in (first["id"], "resp_nope")]
        nursery.cancel_scope.cancel()
    usage = reply.json()["usage"]
    assert 0 < usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]
    # Both user messages are kept; the model's message between them is dropped.
    *users, item = reply.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug", "now the docs"]
    assert (parse_item(item).rounds, parse_item(item).offset) == (0, 1)
    assert (unknown.status, unknown.json()) == (400, {"error": {
        "type": "invalid_request_error", "code": "previous_response_not_found",
        "message": "Previous response with id 'resp_nope' not found.", "param": "previous_response_id"}})


async def compacting_chain_with_a_second_user_message() -> list[dict]:
    """Eight compacting turns, a second user message with the first outputs: each turn's terminal response."""
    async with ws(make_server(), include_timing=True) as conn:
        turns = await run_chain(conn, {"testbed_workload": "fixed:8:100:10:20:0"}, "and the docs", context_management=COMPACTING)
    return [turn[-1][1]["response"] for turn in turns]


async def test_each_compaction_counts_every_item_dropped_so_far_and_summarises_the_same_context_alike(autojump_clock):
    first_run, second_run = [await compacting_chain_with_a_second_user_message() for _ in range(2)]
    compactions = [[(i, parse_item(item)) for i, r in enumerate(run) for item in r["output"] if item["type"] == "compaction"]
                   for run in (first_run, second_run)]
    # Three compactions, at the fourth, sixth and eighth turns. The first drops the three turns' message, call and
    # output (9 items) and keeps both user messages; each later one drops the compaction before it and two more turns
    # (7 items), counted on from the items dropped before.
    assert [(turn, c.rounds, c.offset) for turn, c in compactions[0]] == [(3, 2, 9), (5, 4, 16), (7, 6, 23)]
    # The same context is summarised alike, whichever server does it.
    assert [c.summary for _, c in compactions[0]] == [c.summary for _, c in compactions[1]]
    # The summary's decode is a decode span of the turn's timing: its tokens at the model's 1000 tokens/s.
    turn, compaction = compactions[0][0]
    summary_ms = len(tokenizer.encoding().encode_ordinary(compaction.summary)) * 1.0
    spans = first_run[turn]["testbed_timing"]["spans"]
    assert any(phase == "decode" and end - start == pytest.approx(summary_ms, abs=1e-3) for phase, start, end in spans)


@pytest.mark.parametrize("switches", [ALL_SWITCHES_ON, CacheSwitches(incremental_checks=False)], ids=["incremental", "full checks"])
async def test_the_calls_a_compaction_drops_still_count_an_output_sent_again_for_one_is_refused_as_answered(autojump_clock, switches):
    async with ws(make_server(config=ServerConfig(switches=switches))) as conn:
        turns = await run_chain(conn, context_management=COMPACTING)
        first_call = function_calls(turns[0][-1][1]["response"])[0]  # answered, then dropped by the fourth turn's window
        await send(conn, create_event(outputs_for([first_call]), previous_response_id=turns[-1][-1][1]["response"]["id"]))
        error = (await receive(conn))["error"]
    assert (error["code"], error["param"]) == ("invalid_function_call_output", "input[0]")  # answered twice, not unknown
