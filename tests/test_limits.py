"""Every limit of `ServerConfig` and API-key ownership of stored responses, each hit with a small value; and how the
load experiment counts what a session lost and what the server added."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from support import SPARK, closed_after, make_server, receive, send, until, ws
from test_bad_input import (
    BOTH,
    LINKS,
    ONE_TURN,
    SMALL,
    TERMINALS,
    Bystander,
    assert_released,
    bystander_baseline,
    calls_of,
    create,
    good_body,
    handshake_refusal,
    one_way,
    output,
    session_kv,
    turn,
)
from test_http import open_client
from trio_websocket import ConnectionClosed

from prototype import workload as wl
from prototype.api import render
from prototype.api.checks import (
    FLAGSHIP_CONTEXT_WINDOW,
    MAX_TOKEN_BYTES,
    RUN_BLOCK_BYTES,
    SPARK_CONTEXT_WINDOW,
    context_window,
    fewest_tokens,
    require_appended_fits,
)
from prototype.api.costs import ApiCosts
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.engine import tokenizer
from prototype.protocol import codec, errors
from prototype.protocol.items import FunctionCallOutput, Message
from prototype.server.config import (
    CONNECTION_LIFETIME_SECONDS,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_MESSAGE_BYTES,
    MAX_QUEUED_CREATES,
    ServerConfig,
)


async def http(server, nursery, body: dict[str, Any] | bytes, *, key: str = "testbed") -> tuple[int, Any]:
    """One POST /v1/responses on a new in-memory connection: (status, parsed JSON body)."""
    client = open_client(nursery, server)
    answer = await client.request(body=body, auth=f"Bearer {key}")
    await client.stream.aclose()
    return answer.status, answer.json()


def test_defaults_are_the_documented_ones() -> None:
    config = ServerConfig()
    assert config.api_keys is None  # any non-empty Bearer key (docs/protocol.md)
    assert (config.max_message_bytes, config.max_body_bytes) == (MAX_MESSAGE_BYTES, MAX_BODY_BYTES) == (16 << 20, 16 << 20)
    assert config.max_queued_creates == MAX_QUEUED_CREATES == 32
    assert config.connection_lifetime == CONNECTION_LIFETIME_SECONDS == 3600
    assert (config.suspension_ttl, config.max_connections) == (300.0, MAX_CONNECTIONS)


# --- API keys: a stored response is its key's alone ----------------------------------------------------


@pytest.mark.parametrize("configured", [True, False], ids=["configured keys", "any key"])
async def test_a_stored_response_is_readable_only_with_the_key_that_created_it(autojump_clock, nursery, configured: bool) -> None:
    server = make_server(config=ServerConfig(api_keys=frozenset({"alpha", "beta"}) if configured else None))
    async with ws(server, api_key="alpha") as conn:
        by_ws = (await turn(conn, create(store=True)))[-1]["response"]
    status, by_http = await http(server, nursery, good_body(store=True, metadata={"testbed_workload": SMALL}), key="alpha")
    assert status == 200
    await trio.sleep(1)  # the overlapped store writes have finished
    for stored in (by_ws, by_http):
        answer = [output(calls_of(stored)[0])]
        follow = create(store=True, previous_response_id=stored["id"], input=answer)
        # Another key: not found, over either transport, exactly as if it did not exist.
        async with ws(server, api_key="beta") as conn:
            events = await turn(conn, follow)
            assert [e["error"]["code"] for e in events] == [errors.PREVIOUS_RESPONSE_NOT_FOUND]
        status, body = await http(server, nursery, good_body(store=True, previous_response_id=stored["id"], input=answer), key="beta")
        assert (status, body["error"]["code"]) == (400, errors.PREVIOUS_RESPONSE_NOT_FOUND)
        assert body["error"]["message"] == f"Previous response with id '{stored['id']}' not found."
        # The creating key: the chain continues, over either transport.
        async with ws(server, api_key="alpha") as conn:
            events = await turn(conn, follow)
            assert events[-1]["type"] == "response.completed" and events[-1]["response"]["previous_response_id"] == stored["id"]
        status, body = await http(server, nursery, good_body(store=True, previous_response_id=stored["id"], input=answer), key="alpha")
        assert (status, body["previous_response_id"]) == (200, stored["id"])
    # The store keeps a digest of the key, never the key.
    row = server.api.store.get(by_ws["id"])
    assert row.owner and "alpha" not in row.owner


# --- maximum connections ----------------------------------------------------------------------------


async def test_max_connections_refuses_the_next_with_503_and_admits_again_after_a_close(autojump_clock, nursery) -> None:
    server = make_server(config=ServerConfig(max_connections=2))
    async with ws(server) as first, ws(server, SUSPENDED) as second:
        await send(first, create(metadata={"testbed_workload": ONE_TURN}))
        await send(second, create())
        assert server.connections == 2
        client_end, server_end = trio.testing.memory_stream_pair()
        nursery.start_soon(server.handle_stream, server_end)
        with trio.fail_after(30):  # a server that admits the third instead never answers the handshake with a refusal
            refused = await handshake_refusal(client_end, "/v1/responses", [(b"authorization", b"Bearer testbed")])
            status, body = await http(server, nursery, good_body(stream=False))
        assert (refused.status_code, json.loads(refused.body)["error"]) == (503, {
            "type": "server_error", "code": "server_is_overloaded", "message": "Too many connections.", "param": None})
        assert (status, body["error"]["code"]) == (503, "server_is_overloaded")
        # The two admitted connections were not disturbed.
        assert (await until(first, *TERMINALS))[-1]["type"] == "response.completed"
        assert ((await until(second, "response.done"))[-1]["type"], server.connections) == ("response.done", 2)
    with trio.fail_after(1):
        while server.connections:
            await trio.sleep(0.01)
    async with ws(server) as again:
        assert (await turn(again, create(metadata={"testbed_workload": ONE_TURN})))[-1]["type"] == "response.completed"
    assert (await http(server, nursery, good_body(stream=False)))[0] == 200


# --- frame and body size ------------------------------------------------------------------------------


def padded(size: int) -> str:
    """A valid create frame of exactly `size` bytes (ASCII, so characters = bytes), padded in `user`, a field the
    API accepts and the model never reads."""
    frame = create(metadata={"testbed_workload": ONE_TURN}, user="")
    text = json.dumps(frame)
    frame["user"] = "x" * (size - len(text))
    text = json.dumps(frame)
    assert len(text.encode()) == size
    return text


@pytest.mark.parametrize("design", BOTH)
async def test_frame_size_limit_takes_a_frame_at_the_limit_and_closes_1009_above(autojump_clock, nursery, design: str) -> None:
    limit = 8192
    server = make_server(config=ServerConfig(max_message_bytes=limit))
    watcher = await Bystander.beside(server, nursery)
    async with ws(server, design) as conn:
        await conn.send_message(padded(limit))
        assert (await until(conn, *TERMINALS))[-1]["type"] == "response.completed"
        await conn.send_message(padded(limit + 1))
        with pytest.raises(ConnectionClosed) as closed:
            await receive(conn)
        assert closed.value.reason.code == 1009
    await watcher.check()


# --- the context window -----------------------------------------------------------------------------

# The API's answer to an input longer than the model's window (docs/protocol.md, "Errors").
WINDOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
WINDOW_ERROR = {"type": "invalid_request_error", "code": "context_length_exceeded", "message": WINDOW_MESSAGE, "param": "input"}


def test_each_model_name_has_its_models_context_window() -> None:
    assert [context_window(name) for name in (SPARK, "gpt-5.3-codex-spark-burst", "Codex-Spark-mini")] == [SPARK_CONTEXT_WINDOW] * 3 == [128_000] * 3
    assert [context_window(name) for name in ("gpt-5.4", "sim-1000", "no-such-model")] == [FLAGSHIP_CONTEXT_WINDOW] * 3 == [1_050_000] * 3


def sized_input(body: dict[str, Any], tokens: int) -> dict[str, Any]:
    """`body` with an `input` of one-token words whose rendered prompt (instructions, tools, the message) is
    exactly `tokens` long, as the server renders it."""
    def rendered(text: str) -> int:
        request = codec.parse_create_body({**body, "input": text})
        return len(render.render_full(render.preamble_key(request.instructions, request.tools), request.input))

    words = tokenizer.text_of(np.random.default_rng(7), tokens - rendered(""))
    assert rendered(words) == tokens
    return {**body, "input": words}


@pytest.mark.parametrize("transport", ["http", CHAINED, SUSPENDED])
async def test_an_input_one_token_over_the_window_is_refused_at_once_and_one_at_it_is_served(autojump_clock, nursery, transport: str) -> None:
    # Modeled costs: a request that is served pays validation, rendering and safety per token; the refused one pays
    # nothing, so its answer comes at the instant it was sent.
    server = make_server(costs=ApiCosts())
    at_window = sized_input(good_body(model=SPARK, stream=False), SPARK_CONTEXT_WINDOW)
    over = {**at_window, "input": at_window["input"] + tokenizer.single_token_words()[0]}
    if transport == "http":
        start = trio.current_time()
        status, answer = await http(server, nursery, json.dumps(over).encode())
        assert (status, answer) == (400, {"error": WINDOW_ERROR})
        assert trio.current_time() == start
        status, answer = await http(server, nursery, json.dumps(at_window).encode())
        assert (status, answer["status"], answer["usage"]["input_tokens"]) == (200, "completed", SPARK_CONTEXT_WINDOW)
        return
    async with ws(server, transport) as conn:
        start = trio.current_time()
        await send(conn, {"type": "response.create", **over})
        assert await receive(conn) == {"type": "error", "status": 400, "error": WINDOW_ERROR}
        assert trio.current_time() == start
        await send(conn, {"type": "response.create", **at_window})
        events = await until(conn, *TERMINALS)
        assert events[-1]["type"] == "response.completed" and events[-1]["response"]["usage"]["input_tokens"] == SPARK_CONTEXT_WINDOW
    await assert_released(server)


async def test_an_append_that_would_take_a_rollout_past_the_window_is_refused_and_the_rollout_stays_paused(autojump_clock) -> None:
    server = make_server()
    async with ws(server, SUSPENDED) as conn:
        paused = (await turn(conn, create(model=SPARK)))[-1]["response"]
        room = SPARK_CONTEXT_WINDOW - paused["usage"]["input_tokens"] - paused["usage"]["output_tokens"]
        too_long = tokenizer.text_of(np.random.default_rng(3), room + 1000)
        await send(conn, {"type": "response.append", "input": [output(calls_of(paused)[0], too_long)]})
        # Refused before it is taken, as the API refuses a request too long: never inside a response.failed.
        assert await receive(conn) == {"type": "error", "status": 400, "error": WINDOW_ERROR}
        # The rollout is still paused: an append that fits resumes it, in the same response.
        await send(conn, {"type": "response.append", "input": [output(calls_of(paused)[0])]})
        resumed = await until(conn, "response.done", *TERMINALS)
        assert resumed[0]["type"] == "response.in_progress" and resumed[-1]["response"]["id"] == paused["id"]
        assert resumed[-1]["response"]["status"] in ("in_progress", "completed")
    await assert_released(server)


def test_an_append_is_refused_one_token_past_the_window_as_rendered_and_taken_at_it() -> None:
    items = [FunctionCallOutput("call_1", tokenizer.text_of(np.random.default_rng(5), 3000))]
    rendered = len(render.render_items(items))
    require_appended_fits(SPARK_CONTEXT_WINDOW - rendered, items, SPARK_CONTEXT_WINDOW)  # fills the window exactly: taken
    require_appended_fits(0, items, SPARK_CONTEXT_WINDOW)  # far inside: taken without tokenizing
    with pytest.raises(errors.ProtocolError) as refused:
        require_appended_fits(SPARK_CONTEXT_WINDOW - rendered + 1, items, SPARK_CONTEXT_WINDOW)
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, "context_length_exceeded", "input")


async def test_a_10_mib_input_of_one_letter_is_refused_without_being_tokenized(autojump_clock, nursery) -> None:
    # The input: 10 MiB of "x", 1,310,720 tokens (cl100k's longest run of "x" in one token is 8). Its runs
    # prove it too long for the flagship's window before the tokenizer runs (seconds for one 10 MiB word).
    text = "x" * (10 << 20)
    assert fewest_tokens([text], FLAGSHIP_CONTEXT_WINDOW) > FLAGSHIP_CONTEXT_WINDOW
    server = make_server(costs=ApiCosts())
    start = trio.current_time()
    status, answer = await http(server, nursery, json.dumps(good_body(model="gpt-5.4", input=text)).encode())
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (400, "context_length_exceeded", "input")
    assert trio.current_time() == start
    status, answer = await http(server, nursery, json.dumps(good_body(stream=False)).encode())  # still serving
    assert (status, answer["status"]) == (200, "completed")


def test_the_longest_token_is_the_bounds_figure() -> None:
    encoding = tokenizer.encoding()
    longest = 0
    for token in range(encoding.n_vocab):
        try:
            longest = max(longest, len(encoding.decode_single_token_bytes(token)))
        except KeyError:
            continue
    assert longest == MAX_TOKEN_BYTES == 128


TEXTS = st.lists(st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
    st.builds(lambda char, n: char * n, st.sampled_from(["x", " ", "1", "-", "\n", "é", "a", "=", "\t", "ab"]),
              st.integers(1, 3000)),
), min_size=1, max_size=6).map("".join)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=3))
def test_the_bound_never_exceeds_the_rendered_count(texts: list[str]) -> None:
    items = [Message("user", (("input_text", text),)) for text in texts]
    # limit 0: every text is also bounded by its runs
    assert fewest_tokens([render.item_text(item) for item in items], 0) <= len(render.render_items(items))


# cl100k's longest run of one byte inside a token: 8 for "x", 128 for a space. A run of n needs ceil(n / R) tokens;
# runs share at most one token with the run before; a text that cannot pass the limit on its own (4 bytes a
# character at most) is bounded by its length alone: one token per 128 bytes. Each text adds its item's separator.
@pytest.mark.parametrize(("texts", "limit", "bound"), [
    (["x" * 9], 0, 1 + 2),
    (["a" + "x" * 17], 0, 1 + 3),
    (["x" * 9, "a" + "x" * 17], 0, (1 + 2) + (1 + 3)),
    (["x" * 17], 4 * 17, 1 + 1),
    (["bad \ud800 text"], 0, 1 + 1),  # a lone surrogate, which the render keeps too, is bounded like any text
    # read in blocks of 2^20 bytes, a run cut at a block's end counts as two: 131,072 + 8,192 - 1 tokens, the "a"
    # alone in the third block adds nothing
    (["x" * RUN_BLOCK_BYTES + " " * RUN_BLOCK_BYTES + "a"], 0, 1 + 139_263),
])
def test_the_bound_takes_each_run_of_one_byte_at_its_longest_token(texts: list[str], limit: int, bound: int) -> None:
    assert fewest_tokens(texts, limit) == bound


@pytest.mark.parametrize("preset", sorted(wl.PRESETS))
def test_the_presets_prompts_stay_inside_the_flagship_window(preset: str) -> None:
    # The simulated workloads run under the flagship's window (any name without "spark"): their longest prompt, with
    # room for the rendering's item headers, stays inside it (coding: 830k tokens over these 400 tasks).
    longest = max(task.prompt_tokens(len(task.turns) - 1) for task in (wl.generate_one(preset, seed=0, index=i) for i in range(400)))
    assert longest < 0.9 * FLAGSHIP_CONTEXT_WINDOW


# --- queued creates per connection ------------------------------------------------------------------


async def test_queued_creates_over_the_limit_are_refused_on_v1_while_a_rollout_is_suspended(autojump_clock) -> None:
    server = make_server(config=ServerConfig(max_queued_creates=1))
    async with ws(server, SUSPENDED) as conn:
        done = (await turn(conn, create()))[-1]["response"]
        await send(conn, create(metadata={"testbed_workload": ONE_TURN}))  # waits behind the whole rollout
        await send(conn, create(metadata={"testbed_workload": ONE_TURN}))  # refused
        refusal = await receive(conn)
        assert refusal["error"]["code"] == errors.TOO_MANY_QUEUED_REQUESTS
        for _ in range(2):  # the rollout goes on: two more segments
            await send(conn, {"type": "response.append", "input": [output(calls_of(done)[0])]})
            done = (await until(conn, "response.done", *TERMINALS))[-1]["response"]
        assert done["status"] == "completed"
        queued = await until(conn, *TERMINALS)
        assert queued[0]["type"] == "response.created" and queued[-1]["type"] == "response.completed"


# --- suspension time-to-live ------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [2.5, 40.0])
async def test_suspension_ttl_is_configurable_and_frees_the_rollout(autojump_clock, nursery, ttl: float) -> None:
    server = make_server(config=ServerConfig(suspension_ttl=ttl))
    await bystander_baseline()
    async with ws(server, SUSPENDED) as conn:
        done = (await turn(conn, create()))[-1]
        # An append just inside the TTL resumes; the TTL starts again at the next pause.
        await trio.sleep(ttl - 0.001)
        await send(conn, {"type": "response.append", "input": [output(calls_of(done["response"])[0])]})
        done = (await until(conn, "response.done", *TERMINALS))[-1]
        assert done["type"] == "response.done"
        paused_at = trio.current_time()
        watcher = await Bystander.beside(server, nursery)  # another connection, busy while this one expires
        failed = await receive(conn)
        assert trio.current_time() - paused_at == pytest.approx(ttl, rel=1e-9)
        assert failed["type"] == "response.failed" and failed["response"]["error"] == {
            "code": "server_error", "message": f"No response.append within {ttl:g} s; the rollout was released."}
        assert failed["sequence_number"] == done["sequence_number"] + 1
        mine = [key for key in session_kv(server) if key[0] == SUSPENDED]
        assert mine == []  # the rollout's KV was released; only the bystander's cache is held
        await send(conn, {"type": "response.append", "input": [output(calls_of(done["response"])[0])]})
        assert (await receive(conn))["error"]["code"] == errors.NO_SUSPENDED_RESPONSE
        assert (await turn(conn, create(metadata={"testbed_workload": ONE_TURN})))[-1]["type"] == "response.completed"
    await watcher.check()


# --- connection lifetime: the responses in flight end, then the limit's error and close 1000 -------------------

LIMIT_MESSAGE = "Responses websocket connection limit reached (0.2 minutes). Create a new websocket connection to continue."
LIMIT_ERROR = {"type": "error", "status": 400, "error": {
    "type": "invalid_request_error", "code": "websocket_connection_limit_reached", "message": LIMIT_MESSAGE, "param": None}}
# A response the limit cuts short: the schema's code and the limit's message; the limit's code follows in LIMIT_ERROR.
LIMIT_REACHED = {"code": "server_error", "message": LIMIT_MESSAGE}
LONG = {"testbed_workload": "fixed:1:50:10:400:0"}  # one turn of 400 output tokens: 4 s at sim-100


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("state", ["v2 idle", "v1 idle", "v1 paused"])
async def test_the_lifetime_limit_closes_a_quiet_connection_with_its_error_and_1000_failing_a_paused_rollout(autojump_clock, state, link) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=12.0))
    async with ws(server, CHAINED if state == "v2 idle" else SUSPENDED, network=LINKS[link]) as conn:
        done = (await turn(conn, create()))[-1] if state == "v1 paused" else None
        assert len(session_kv(server)) == (0 if done is None else 1)
        events, code, reason = await closed_after(conn)
        # The limit counts from the accept, one way after the client's upgrade request went out at 0.
        assert trio.current_time() == pytest.approx(12.0 + 2 * one_way(link), abs=1e-9)
        assert session_kv(server) == {}  # a paused rollout's KV is released
    assert (events[-1], len(events), code, reason) == (LIMIT_ERROR, 1 if done is None else 2, 1000, "connection limit reached")
    if done is not None:
        assert events[0] == {"type": "response.failed", "sequence_number": done["sequence_number"] + 1, "response": {
            **events[0]["response"], "id": done["response"]["id"], "status": "failed", "error": LIMIT_REACHED}}
    await assert_released(server)


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("grace", [100.0, 1.0])
async def test_at_the_lifetime_limit_a_response_in_flight_ends_within_the_grace_and_the_queue_is_dropped(
        autojump_clock, link: str, grace: float) -> None:
    server = make_server(config=ServerConfig(connection_lifetime=12.0, lifetime_grace=grace))
    async with ws(server, network=LINKS[link]) as conn:
        await trio.sleep(10.0)
        sent = trio.current_time()
        await send(conn, create(model="sim-100", metadata=LONG))  # 4 s, past the limit
        await send(conn, create(metadata={"testbed_workload": ONE_TURN}))  # queued behind it: dropped at the limit
        created = await receive(conn)
        events, code, reason = await closed_after(conn)
        closed_after_sent = trio.current_time() - sent
    assert (code, reason) == (1000, "connection limit reached")
    assert [e["type"] for e in events].count("response.created") == 0 and events[-1] == LIMIT_ERROR
    if grace == 100.0:  # it finishes, and the close follows its terminal event at once
        assert closed_after_sent == pytest.approx(4.0165333 + 2 * one_way(link), abs=1e-6)
        assert events[-2]["type"] == "response.completed"
    else:  # cut when the grace is over (the limit one way after the open), failed with the limit's error
        assert closed_after_sent == pytest.approx(12.0 + grace + 2 * one_way(link) - sent, abs=1e-9)
        assert events[-2] == {"type": "response.failed", "sequence_number": events[-3]["sequence_number"] + 1,
                              "response": {**created["response"], "status": "failed", "error": LIMIT_REACHED}}


def load_record(transcript: list[dict[str, Any]], events: list[tuple[str, int, str]], status: str = "completed"):
    """A harness record of a session that received `events`, (response id, sequence number, type)."""
    from prototype.client.harness import RolloutRecord

    return RolloutRecord("chained", "w", 0.0, status=status, transcript=transcript,
                         timeline=[(0.0, "recv", event_type) for _, _, event_type in events],
                         sequence_numbers=[(response_id, number) for response_id, number, _ in events])


REFERENCE_EVENTS = [("r", 0, "response.created"), ("r", 1, "response.output_text.delta"), ("r", 2, "response.completed")]


def test_a_lost_or_repeated_item_is_counted() -> None:
    from experiments.load import lost_and_duplicated

    both = [{"a": 1}, {"b": 2}]
    expected = load_record(both, REFERENCE_EVENTS)
    two_responses = [*REFERENCE_EVENTS, ("s", 0, "response.created")]
    delta = ("r", 1, "response.output_text.delta")
    for transcript, events, counted in [
        (both, REFERENCE_EVENTS, (0, 0)), ([{"a": 1}], REFERENCE_EVENTS, (1, 0)), ([*both, {"b": 2}], REFERENCE_EVENTS, (0, 1)),
        (both[::-1], REFERENCE_EVENTS, (1, 1)), ([{"a": 1}, {"b": 3}], REFERENCE_EVENTS, (1, 1)),  # another item's text: not the reference's
        # Deltas coalesced differently are not a loss; a gap in the numbering is, and so is a repeat.
        (both, [*REFERENCE_EVENTS[:2], ("r", 2, "response.output_text.delta"), ("r", 3, "response.completed")], (0, 0)),
        (both, [REFERENCE_EVENTS[0], REFERENCE_EVENTS[2]], (1, 0)), (both, [*REFERENCE_EVENTS[:2], delta, REFERENCE_EVENTS[2]], (0, 1)),
        (both, REFERENCE_EVENTS[:2], (1, 0)),  # a missing tail: numbered 0, 1 without a gap, but no terminal event
        (both, two_responses, (0, 1)),  # one response too many
    ]:
        assert lost_and_duplicated(load_record(transcript, events), expected) == counted, (transcript, events)
    assert lost_and_duplicated(None, expected) == (2 + 3, 0)  # two items, three events
    assert lost_and_duplicated(load_record(both, REFERENCE_EVENTS), load_record(both, two_responses)) == (1, 0)  # a response missing


def test_the_lone_rollout_is_checked_like_every_session_and_never_becomes_the_reference() -> None:
    from experiments.load import tally

    expected = load_record([{"a": 1}], REFERENCE_EVENTS)
    alone_differs = load_record([{"a": 2}], REFERENCE_EVENTS)
    # Were the lone rollout the reference, the two sessions equal to it would count as lost instead.
    assert tally(alone_differs, [alone_differs, alone_differs], expected, "chained") == (3, 3)
    assert tally(expected, [expected, None], expected, "chained") == (1 + 3, 0)


@pytest.mark.parametrize("design", [SUSPENDED, CHAINED])
async def test_load_overhead_is_what_the_server_added_beyond_the_model_whatever_the_cache_held(autojump_clock, design: str) -> None:
    """The load experiment's per-turn overhead is exactly the API stages the server charged (their phase log),
    cold or with the whole conversation cached; zero under zero costs, never the prefill a warm turn skipped."""
    from experiments import load
    from prototype.api.costs import ZERO_COSTS, ApiCosts
    from prototype.api.service import ApiService
    from prototype.client.harness import run_websocket_rollout
    from prototype.engine.latency import LatencyModel, decode_rate_for_model
    from prototype.metrics import DECODE, PREFILL
    from prototype.server.app import ResponsesServer

    workload, spec = load.task_of(load.LoadRun(design, 1, 1, 3, 1000, 200, 50, 0.5, 0.0))
    latency = LatencyModel(decode_tokens_per_s=decode_rate_for_model(load.MODEL))
    for costs in (ApiCosts(), ZERO_COSTS):
        server = ResponsesServer(ApiService(costs=costs))
        cold, warm = [await run_websocket_rollout(InMemoryConnector(server), design, workload, model=load.MODEL,
                                                  metadata={"testbed_workload": spec}, include_timing=True) for _ in range(2)]
        assert [tokens[1] for tokens in load.turn_tokens(warm)] > [tokens[1] for tokens in load.turn_tokens(cold)]  # more cached
        for record in (cold, warm):
            stages = [sum(ms for phase, ms in turn.server_timing["phases_ms"].items() if phase not in (PREFILL, DECODE)) / 1000
                      for turn in record.turns]
            assert load.turn_overheads(record, latency) == pytest.approx(stages, abs=1e-9)
            if costs is ZERO_COSTS:
                assert stages == [0.0, 0.0, 0.0]
            else:
                assert min(stages) > 0
