"""The endpoints beside `POST /v1/responses` (server/routes.py): retrieve, replay, delete, input items, cancel,
compact and models, each refusal with its status, code, param and `Allow` header (docs/protocol.md)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from support import create_event, function_calls, make_server, outputs_for, send, until, ws
from test_http import Answer, RawClient

from prototype import metrics
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import IdFactory, owner_of
from prototype.client.harness import HARNESS_TOOLS
from prototype.client.sse import parse_stream
from prototype.designs.cancel import ResponseCancelled, cancellable
from prototype.designs.emitter import Emitter
from prototype.protocol.events import CreateRequest
from prototype.protocol.response import Response
from prototype.server import routes
from prototype.server.app import ResponsesServer
from prototype.server.routes import CANCEL_WAIT_SECONDS

SLOW = {"testbed_workload": "fixed:3", "testbed_decode_tps": "10"}  # 300 tokens a turn: 30 s of decode


# --- a raw HTTP/1.1 client over a memory stream ----------------------------------------------------


class Raw(RawClient):
    """test_http's client as key alice unless told (None: no authorization); `body` as JSON or `data` as it is;
    `start` reads the head of an answer, `events_until` and `rest` its stream as it comes."""

    @staticmethod
    def fields(key: str | None, body: dict | None, data: bytes | None) -> dict[str, Any]:
        return {"body": body if data is None else data, "auth": None if key is None else f"Bearer {key}",
                "content_type": "application/json" if body is not None or data else None}

    async def request(self, method: str, target: str, *, key: str | None = "alice", body: dict | None = None,
                      data: bytes | None = None) -> Answer:
        return await super().request(method, target, **self.fields(key, body, data))

    async def start(self, method: str, target: str, *, body: dict | None = None) -> h11.Response:
        await self.send(method, target, **self.fields("alice", body, None))
        head = await self._next()
        assert isinstance(head, h11.Response), head
        return head

    async def rest(self) -> bytes:
        body = bytearray()
        while not isinstance(event := await self._next(), h11.EndOfMessage):
            body += event.data
        self.conn.start_next_cycle()
        return bytes(body)

    async def events_until(self, *types: str) -> list[dict[str, Any]]:
        """SSE events of a started stream, up to the first of `types`."""
        events: list[dict[str, Any]] = []
        buffer = b""
        while True:
            event = await self._next()
            assert isinstance(event, h11.Data), event
            buffer += event.data
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                events.append(json.loads(block.split(b"data: ", 1)[1]))
                if events[-1]["type"] in types:
                    assert buffer == b""
                    return events


def connect(nursery: trio.Nursery, server: ResponsesServer) -> Raw:
    client, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(server.handle_stream, server_end)
    return Raw(client)


def error_of(reply: Answer, status: int, code: str, param: str | None) -> str:
    assert (reply.status, reply.headers["content-type"]) == (status, "application/json"), reply
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), error
    return error["message"]


def body(input: Any = "fix the bug", **fields: Any) -> dict[str, Any]:
    return {"model": "sim-1000", "input": input, "tools": HARNESS_TOOLS, "metadata": {"testbed_workload": "fixed:3"}, **fields}


async def stored_chain(client: Raw, turns: int = 2) -> list[dict[str, Any]]:
    """`turns` stored responses over HTTP, each chaining from the last with the call's output."""
    responses = [(await client.request("POST", "/v1/responses", body=body())).json()]
    for _ in range(turns - 1):
        answer = outputs_for(function_calls(responses[-1]))
        responses.append((await client.request("POST", "/v1/responses", body=body(answer, previous_response_id=responses[-1]["id"]))).json())
    assert all(r["status"] == "completed" for r in responses)
    return responses


# --- error paths, raw HTTP --------------------------------------------------------------------------


async def test_error_paths_have_exact_status_code_and_param(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    (response,) = await stored_chain(client, 1)
    rid = response["id"]
    not_found = (404, "response_not_found", "response_id")
    # Another key's response is not found either, by every endpoint; it stays there for its owner.
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
        assert "resp_nope" in error_of(await client.request(method, f"/v1/responses/resp_nope{path}"), *not_found)
        error_of(await client.request(method, f"/v1/responses/{rid}{path}", key="bob"), *not_found)
    assert (await client.request("GET", f"/v1/responses/{rid}")).json() == response
    # Each query parameter of each route is read (each refusal's message: tests/test_retrieval.py).
    below, above, invalid = "integer_below_min_value", "integer_above_max_value", "invalid_value"
    for query, code, param in (
            ("/input_items?limit=0", below, "limit"), ("/input_items?limit=101", above, "limit"),
            ("/input_items?limit=2.5", invalid, "limit"), ("/input_items?order=sideways", invalid, "order"),
            ("/input_items?after=msg_unknown", invalid, "after"), ("/input_items?include[]=bogus", invalid, "include"),
            ("?include=bogus", invalid, "include"), ("?stream=maybe", invalid, "stream"),
            ("?stream=true&starting_after=-1", below, "starting_after"),
            ("?stream=true&starting_after=x", invalid, "starting_after")):
        error_of(await client.request("GET", f"/v1/responses/{rid}{query}"), 400, code, param)
    # Bad values are refused before the id is looked up.
    error_of(await client.request("GET", "/v1/responses/resp_nope/input_items?limit=0"), 400, below, "limit")
    # A finished response cannot be cancelled (the reference's wording).
    assert error_of(await client.request("POST", f"/v1/responses/{rid}/cancel"), 400, "response_not_cancellable", "response_id") == (
        "Cannot cancel a completed response.")
    reply = await client.request("GET", f"/v1/responses/{rid}/cancel")
    error_of(reply, 405, "method_not_allowed", None)
    assert reply.headers["allow"] == "POST"
    for target in ("/v1/responses/", f"/v1/responses/{rid}/input_items/x", "/v1/models/"):
        error_of(await client.request("GET", target), 404, "not_found", None)
    for target in (f"/v1/responses/{rid}", "/v1/models", "/v1/models/spark"):
        reply = await client.request("GET", target, key=None)
        error_of(reply, 401, "invalid_api_key", None)
        assert reply.headers["www-authenticate"] == "Bearer"
    # The connection served every refusal and still answers.
    assert (await client.request("GET", f"/v1/responses/{rid}")).status == 200 and server.connections == 1


async def test_each_refusal_of_a_route_has_its_allow_header(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    post = await client.request("POST", "/v1/models")
    assert error_of(post, 405, "method_not_allowed", None) == "Method POST is not allowed on /v1/models: use GET."
    assert post.headers["allow"] == "GET" and "www-authenticate" not in post.headers
    put = await client.request("PUT", "/v1/responses/resp_1")
    assert error_of(put, 405, "method_not_allowed", None) == "Method PUT is not allowed on /v1/responses/resp_1: use GET, DELETE."
    assert put.headers["allow"] == "GET, DELETE"
    long_path = "/v1/models/" + "m" * 200  # the method named up to 16 characters, the path up to 128
    long = await client.request("PROPFINDEXTENDEDLONG", long_path)
    assert error_of(long, 405, "method_not_allowed", None) == f"Method PROPFINDEXTENDED is not allowed on {long_path[:128]}: use GET."
    head = await client.request("HEAD", "/v1/models")
    assert (head.status, head.body, head.headers["allow"]) == (405, b"", "GET")
    missing = await client.request("GET", "/v1/responses/resp_nope")
    assert missing.status == 404 and "www-authenticate" not in missing.headers


# --- retrieve, stream replay, input items, delete ---------------------------------------------------


async def test_retrieve_answers_the_stored_response_and_replays_its_events(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    head = await client.start("POST", "/v1/responses", body=body(stream=True))
    assert head.status_code == 200
    original = parse_stream(await client.rest())
    stored = original[-1].data["response"]
    rid = stored["id"]
    assert (await client.request("GET", f"/v1/responses/{rid}?include[]=reasoning.encrypted_content")).json() == stored
    head = await client.start("GET", f"/v1/responses/{rid}?stream=true")
    assert (head.status_code, head.reason) == (200, b"OK")
    assert dict(head.headers) == {b"content-type": b"text/event-stream; charset=utf-8", b"cache-control": b"no-cache",
                                  b"transfer-encoding": b"chunked"}
    replay = parse_stream(await client.rest())
    # The same events in the same order, each run of deltas as one delta carrying the whole text.
    collapsed = [e.type for i, e in enumerate(original) if not (e.type.endswith(".delta") and original[i + 1].type == e.type)]
    assert [e.type for e in replay] == collapsed and [e.data["sequence_number"] for e in replay] == list(range(len(replay)))
    assert replay[-1].data["response"] == stored
    assert replay[0].data["response"]["status"] == "in_progress" and replay[0].data["response"]["output"] == []
    original_text = "".join(e.data["delta"] for e in original if e.type == "response.output_text.delta")
    assert [e.data["delta"] for e in replay if e.type == "response.output_text.delta"] == [original_text]
    assert [e.data["item"] for e in replay if e.type == "response.output_item.done"] == [
        e.data["item"] for e in original if e.type == "response.output_item.done"]
    for after in (5, 0):  # (parse_stream wants 0 first)
        later = (await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after={after}")).body.split(b"\n")
        assert [json.loads(line[6:]) for line in later if line.startswith(b"data: ")] == [e.data for e in replay[after + 1:]]
    after_all = await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after={len(replay) + 3}")
    assert after_all.status == 200 and after_all.body == b""


async def test_input_items_are_the_context_paged_with_after_limit_and_order(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    first, second, third = await stored_chain(client, 3)
    items = (await client.request("GET", f"/v1/responses/{third['id']}/input_items?order=asc&limit=100")).json()
    assert items["object"] == "list" and items["has_more"] is False
    data = items["data"]
    # The context the third turn was given: every earlier turn's input and output, then its input.
    expected = ["message", *(i["type"] for i in first["output"]), "function_call_output",
                *(i["type"] for i in second["output"]), "function_call_output"]
    assert [i["type"] for i in data] == expected and data[1:3] == first["output"]
    assert data[0]["content"] == [{"type": "input_text", "text": "fix the bug"}]
    ids = [i["id"] for i in data]
    assert len(set(ids)) == len(ids) and (items["first_id"], items["last_id"]) == (ids[0], ids[-1])
    assert ids[0] == f"msg_{first['id'].partition('_')[2]}_in0"
    # Default: newest first, 20 a page.
    assert [i["id"] for i in (await client.request("GET", f"/v1/responses/{third['id']}/input_items")).json()["data"]] == ids[::-1]
    # A page of 2 after the first item (every page's rule: tests/test_retrieval.py).
    page = (await client.request("GET", f"/v1/responses/{third['id']}/input_items?order=asc&limit=2&after={ids[0]}")).json()
    assert ([i["id"] for i in page["data"]], page["has_more"]) == (ids[1:3], True)
    # Deleting the middle response removes its items; the walk stops there.
    assert (await client.request("DELETE", f"/v1/responses/{second['id']}")).json() == {
        "id": second["id"], "object": "response", "deleted": True}
    left = (await client.request("GET", f"/v1/responses/{third['id']}/input_items?order=asc")).json()["data"]
    assert [i["id"] for i in left] == ids[-1:]
    error_of(await client.request("GET", f"/v1/responses/{second['id']}"), 404, "response_not_found", "response_id")
    error_of(await client.request("DELETE", f"/v1/responses/{second['id']}"), 404, "response_not_found", "response_id")
    # The chain can no longer be rebuilt from the store: chaining from the third fails.
    refused = await client.request("POST", "/v1/responses", body=body(outputs_for(function_calls(third)), previous_response_id=third["id"]))
    error_of(refused, 400, "previous_response_not_found", "previous_response_id")


async def test_deleting_a_response_a_chained_connection_caches(autojump_clock, nursery) -> None:
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, "chained", api_key="alice") as conn, ws(server, "chained", api_key="alice") as other:
        await send(conn, create_event(store=True))
        first = (await until(conn, "response.completed"))[-1]["response"]
        # Stored under the connection's key: another key finds nothing.
        assert (await http.request("GET", f"/v1/responses/{first['id']}")).json()["id"] == first["id"]
        error_of(await http.request("GET", f"/v1/responses/{first['id']}", key="bob"), 404, "response_not_found", "response_id")
        deleted = await http.request("DELETE", f"/v1/responses/{first['id']}")
        assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
        error_of(await http.request("GET", f"/v1/responses/{first['id']}"), 404, "response_not_found", "response_id")
        # The connection's cache is untouched: it chains from the deleted response, in memory.
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"], store=True))
        assert (await until(conn, "response.completed"))[-1]["type"] == "response.completed"
        # Nothing else can: another connection, or HTTP, would need the stored object.
        await send(other, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"]))
        assert (await until(other, "response.completed"))[-1]["error"]["code"] == "previous_response_not_found"
        refused = await http.request("POST", "/v1/responses", body=body(outputs_for(function_calls(first)), previous_response_id=first["id"]))
        error_of(refused, 400, "previous_response_not_found", "previous_response_id")


async def test_deleting_a_suspended_v1_response_is_refused_until_it_ends(autojump_clock, nursery) -> None:
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, "suspended", api_key="alice") as conn:
        await send(conn, create_event(store=True))
        paused = (await until(conn, "response.done"))[-1]["response"]
        rid = paused["id"]
        message = error_of(await http.request("DELETE", f"/v1/responses/{rid}"), 400, "response_in_progress", "response_id")
        assert message == f"Response '{rid}' is still in progress: cancel it, or delete it once it has ended."
        error_of(await http.request("DELETE", f"/v1/responses/{rid}", key="bob"), 404, "response_not_found", "response_id")
        error_of(await http.request("GET", f"/v1/responses/{rid}"), 404, "response_not_found", "response_id")
        while True:  # the rollout goes on to its end
            await send(conn, {"type": "response.append", "input": outputs_for(function_calls(paused))})
            last = (await until(conn, "response.done", "response.completed"))[-1]
            if last["type"] == "response.completed":
                break
            paused = last["response"]
        stored = (await http.request("GET", f"/v1/responses/{rid}")).json()
        assert (stored["id"], stored["status"]) == (rid, "completed")
        error_of(await http.request("GET", f"/v1/responses/{rid}", key="bob"), 404, "response_not_found", "response_id")
        assert (await http.request("DELETE", f"/v1/responses/{rid}")).json()["deleted"] is True
        error_of(await http.request("GET", f"/v1/responses/{rid}"), 404, "response_not_found", "response_id")


# --- cancel ------------------------------------------------------------------------------------------


async def cancel_at(http: Raw, rid: str, key: str = "alice") -> tuple[float, Answer]:
    reply = await http.request("POST", f"/v1/responses/{rid}/cancel", key=key)
    return trio.current_time(), reply


async def test_cancel_ends_an_http_stream_with_response_cancelled(autojump_clock, nursery) -> None:
    server = make_server()
    streaming, http = connect(nursery, server), connect(nursery, server)
    await streaming.start("POST", "/v1/responses", body=body(stream=True, metadata=SLOW))
    rid = (await streaming.events_until("response.created"))[0]["response"]["id"]
    await trio.sleep(1.5)
    error_of((await cancel_at(http, rid, key="bob"))[1], 404, "response_not_found", "response_id")
    cancelled_at, reply = await cancel_at(http, rid)
    events = await streaming.events_until("response.cancelled")
    assert trio.current_time() == cancelled_at  # nothing waited: the terminal went out at once
    assert await streaming.rest() == b""
    terminal = events[-1]
    assert terminal["response"]["status"] == "cancelled" and terminal["response"]["id"] == rid
    assert terminal["response"]["output"] == []  # the message was cut mid-way: only finished items stay
    assert [e["type"] for e in events[-2:]] == ["response.output_text.delta", "response.cancelled"]
    assert terminal["sequence_number"] == events[-2]["sequence_number"] + 1
    assert reply.status == 200 and reply.json() == terminal["response"]
    # Not stored; gone from the live set: a second cancel finds nothing.
    for method, target in (("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                           ("GET", f"/v1/responses/{rid}/input_items"), ("POST", f"/v1/responses/{rid}/cancel")):
        error_of(await http.request(method, target), 404, "response_not_found", "response_id")
    assert len(server.api.live) == 0
    records = [(r["outcome"], r["usage"]) for r in server.records if r.get("response_id") == rid]
    assert records == [("cancelled", reply.json()["usage"])]
    assert (await streaming.request("POST", "/v1/responses", body=body())).json()["status"] == "completed"


async def test_cancel_answers_a_json_request_with_the_cancelled_response(autojump_clock, nursery) -> None:
    server = make_server(new_id=IdFactory("t"))
    waiting, http = connect(nursery, server), connect(nursery, server)
    replies: list[tuple[float, Answer]] = []
    answered = trio.Event()

    async def post() -> None:
        reply = await waiting.request("POST", "/v1/responses", body=body(stream=False, metadata=SLOW))
        replies.append((trio.current_time(), reply))
        answered.set()

    nursery.start_soon(post)
    await trio.sleep(1.0)
    cancelled_at, reply = await cancel_at(http, "resp_t000001")
    assert reply.json()["status"] == "cancelled"
    await answered.wait()
    ((answered_at, answer),) = replies
    assert answered_at == cancelled_at and answer.status == 200 and answer.json() == reply.json()
    await trio.testing.wait_all_tasks_blocked()
    assert [(r["outcome"], r["usage"]) for r in server.records if r.get("response_id")] == [("cancelled", reply.json()["usage"])]


async def test_a_cancel_during_post_inference_finds_a_completed_response(autojump_clock, nursery) -> None:
    """Billing and the store write run after the response took its final status and before its
    terminal event: the response is still live, no longer cancellable."""
    server = make_server(costs=attrs.evolve(ZERO_COSTS, post=1.0))
    streaming, http = connect(nursery, server), connect(nursery, server)
    await streaming.start("POST", "/v1/responses", body=body(stream=True, metadata={"testbed_workload": "fixed:1"}))
    rid, done_at = (await streaming.events_until("response.output_item.done"))[0]["response"]["id"], trio.current_time()
    assert server.api.live.find(rid, owner_of("alice")) is not None
    refused = await http.request("POST", f"/v1/responses/{rid}/cancel")
    assert error_of(refused, 400, "response_not_cancellable", "response_id") == "Cannot cancel a completed response."
    (terminal,) = await streaming.events_until("response.completed")
    assert (trio.current_time(), terminal["response"]["status"]) == (done_at + 1.0, "completed")


async def test_cancel_ends_a_chained_turn_and_empties_the_cache_slot(autojump_clock, nursery) -> None:
    server = make_server()
    http = connect(nursery, server)
    async with ws(server, "chained", api_key="alice") as conn:
        await send(conn, create_event(store=True, metadata={"testbed_workload": "fixed:3", "testbed_decode_tps": "100"}))
        first = (await until(conn, "response.completed"))[-1]["response"]
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"], store=True, metadata=SLOW))
        rid = (await until(conn, "response.created"))[-1]["response"]["id"]
        await trio.sleep(2.0)
        cancelled_at, reply = await cancel_at(http, rid)
        events = await until(conn, "response.cancelled")
        assert trio.current_time() == cancelled_at
        assert events[-1]["response"]["status"] == "cancelled" and reply.json() == events[-1]["response"]
        # The cancelled turn is neither cached nor stored: chaining from it is refused; from the
        # turn before it works (rebuilt from the store).
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=rid))
        assert (await until(conn, "response.completed"))[-1]["error"]["code"] == "previous_response_not_found"
        await send(conn, create_event(outputs_for(function_calls(first)), previous_response_id=first["id"]))
        assert (await until(conn, "response.completed"))[-1]["type"] == "response.completed"


async def test_cancel_ends_a_suspended_v1_rollout(autojump_clock, nursery) -> None:
    server = make_server()
    async with ws(server, "suspended", api_key="alice") as conn:
        await send(conn, create_event(store=True, metadata={"testbed_workload": "fixed:3", "testbed_decode_tps": "100"}))
        done = await until(conn, "response.done")
        paused = done[-1]["response"]
        await trio.sleep(60.0)  # the rollout waits for response.append
        http = connect(nursery, server)
        cancelled_at, reply = await cancel_at(http, paused["id"])
        (terminal,) = await until(conn, "response.cancelled")
        assert trio.current_time() == cancelled_at
        assert terminal["sequence_number"] == done[-1]["sequence_number"] + 1  # numbering runs on
        response = terminal["response"]
        assert (response["id"], response["status"]) == (paused["id"], "cancelled")
        assert response["output"] == paused["output"]  # the segment's finished items
        assert reply.json() == response
        await send(conn, {"type": "response.append", "input": outputs_for(function_calls(paused))})
        assert (await until(conn, "error"))[-1]["error"]["code"] == "no_suspended_response"
        error_of(await http.request("GET", f"/v1/responses/{paused['id']}"), 404, "response_not_found", "response_id")
        await send(conn, create_event(metadata={"testbed_workload": "fixed:1"}))
        assert (await until(conn, "response.completed"))[-1]["type"] == "response.completed"


@pytest.mark.parametrize(("opens_at", "answered_at", "status"), [(3.0, 3.0, "cancelled"), (20.0, 1.0 + CANCEL_WAIT_SECONDS, "in_progress")])
async def test_a_cancel_during_a_write_takes_effect_once_the_write_ends(autojump_clock, opens_at, answered_at, status) -> None:
    """A client that stops reading holds the write of an event: the cancel never cuts it. It takes
    effect when the write ends, or the cancel request answers after CANCEL_WAIT_SECONDS with the
    response as it stands."""
    server = make_server()
    emitter = Emitter(Response("resp_t", CreateRequest("sim-1", ()), created_at=0), None, metrics.PhaseLog())
    gate, written, outcome = trio.Event(), [], {}

    async def sink(event: Any) -> None:
        if event.type == "response.output_text.delta":
            await gate.wait()
        written.append((trio.current_time(), event.type))

    async def chunks():
        yield "a"
        await trio.sleep(100)
        yield "b"

    async def design() -> None:
        await emitter.created(generating=True)
        try:
            async with cancellable(server.api, emitter, "o"):
                await emitter.message("msg_t", chunks())
        except ResponseCancelled as cancelled:
            outcome["response"] = cancelled.response

    async def ask_cancel() -> None:
        await trio.sleep(1.0)
        assert server.api.live.find("resp_t", "o").sending
        outcome["answer"] = await routes.cancel(routes.Call(server, "resp_t", {}, "o"))
        outcome["answered_at"] = trio.current_time()

    async def open_gate() -> None:
        await trio.sleep(opens_at)
        gate.set()

    emitter.sink = sink
    async with trio.open_nursery() as nursery:
        for task in (design, ask_cancel, open_gate):
            nursery.start_soon(task)
    assert written[-2:] == [(opens_at, "response.output_text.delta"), (opens_at, "response.cancelled")]
    assert outcome["response"].status == "cancelled" and outcome["response"].output == []
    assert (outcome["answered_at"], outcome["answer"].body["status"]) == (answered_at, status) and len(server.api.live) == 0


# --- compact -------------------------------------------------------------------------------------------


def compact_body(**fields: Any) -> dict[str, Any]:
    return {"model": "sim-1000", **fields}


async def test_compact_needs_one_json_object_with_an_input_or_a_previous_response(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    for raw, message in ((b"[1]", "The request body must be one JSON object."),
                         (b"{", "The request body is not valid JSON: Expecting property name enclosed in double quotes: "
                                "line 1 column 2 (char 1).")):
        assert error_of(await client.request("POST", "/v1/responses/compact", data=raw), 400, "invalid_json", None) == message
    refused = await client.request("POST", "/v1/responses/compact", body=compact_body(instructions="be brief"))
    assert error_of(refused, 400, "missing_required_parameter", "input") == "Missing required parameter: 'input'."
    # Either one is enough: an input alone, or a stored response alone.
    *users, _ = (await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug"))).json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"]
    first = (await client.request("POST", "/v1/responses", body=body(store=True, metadata={"testbed_workload": "fixed:1"}))).json()
    chained = await client.request("POST", "/v1/responses/compact", body=compact_body(previous_response_id=first["id"]))
    *users, item = chained.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"] and item["type"] == "compaction"
    assert server.api.store.get(chained.json()["id"]) is None  # nothing is stored


async def test_compact_reads_the_instructions(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    plain, instructed = [
        (await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug", **extra))).json()["usage"]
        for extra in ({}, {"instructions": "be brief"})]
    created = (await client.request("POST", "/v1/responses", body={
        "model": "sim-1000", "input": "fix the bug", "instructions": "be brief", "metadata": {"testbed_workload": "fixed:1"}})).json()
    assert instructed["input_tokens"] == created["usage"]["input_tokens"] > plain["input_tokens"]


# --- openai-python against a real socket ---------------------------------------------------------------

SDK_TIMEOUT = 30.0
SDK_MODEL = "sim-100000"


def sdk_client(port: int):
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-alice", max_retries=0, timeout=10.0)


def exercise_every_endpoint(port: int) -> None:
    """create, retrieve (JSON and stream), input_items, models, delete and cancel with openai-python, each answer checked."""
    from openai import BadRequestError, NotFoundError
    from openai.types import Model
    from openai.types.responses import Response

    client = sdk_client(port)
    other, meta = client.with_options(api_key="sk-bob"), {"testbed_workload": "fixed:2"}
    first = client.responses.create(model=SDK_MODEL, input="fix the bug", tools=HARNESS_TOOLS, metadata=meta)
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model=SDK_MODEL, previous_response_id=first.id, tools=HARNESS_TOOLS, metadata=meta,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "2 tests failed"}])
    retrieved = client.responses.retrieve(second.id, include=["reasoning.encrypted_content"])
    assert isinstance(retrieved, Response) and retrieved.model_dump() == second.model_dump()
    replay = list(client.responses.retrieve(second.id, stream=True))
    assert (replay[0].type, replay[-1].type, replay[-1].response.output_text) == ("response.created", "response.completed", second.output_text)
    after = client.responses.retrieve(second.id, stream=True, starting_after=3)
    assert [e.sequence_number for e in after] == [e.sequence_number for e in replay[4:]]
    asc = list(client.responses.input_items.list(second.id, order="asc", limit=1))  # one item a page: the SDK followed `after`
    assert [item.type for item in asc] == ["message", *(i.type for i in first.output), "function_call_output"]
    assert [item.id for item in first.output] == [item.id for item in asc[1:-1]]
    assert [item.id for item in client.responses.input_items.list(second.id)] == [item.id for item in asc][::-1]
    assert [m.id for m in client.models.list().data] == ["gpt-5.4", "gpt-5.3-codex-spark", "gpt-5.3-codex-spark-burst"]
    model = client.models.retrieve("sim-1234")
    assert isinstance(model, Model) and (model.id, model.object, model.owned_by) == ("sim-1234", "model", "testbed")
    assert model.model_dump()["testbed_decode_tokens_per_s"] == 1234.0
    refusals = [(lambda: other.responses.retrieve(first.id), NotFoundError, 404, "response_not_found"),
                (lambda: other.responses.delete(first.id), NotFoundError, 404, "response_not_found"),
                (lambda: client.responses.delete(first.id), None, None, None),  # openai-python returns nothing for a deletion
                (lambda: client.responses.retrieve(first.id), NotFoundError, 404, "response_not_found"),
                (lambda: client.responses.cancel(second.id), BadRequestError, 400, "response_not_cancellable"),
                (lambda: client.responses.create(model=SDK_MODEL, input="x", previous_response_id="resp_missing"), BadRequestError, 400,
                 "previous_response_not_found")]
    for call_it, error, status, code in refusals:
        if error is None:
            assert call_it() is None
            continue
        with pytest.raises(error) as caught:
            call_it()
        assert (caught.value.status_code, caught.value.body["code"]) == (status, code)
    events, cancelled = [], None
    with client.responses.create(model="sim-20", input="fix the bug", tools=HARNESS_TOOLS, metadata=meta, stream=True) as stream:
        for event in stream:
            events.append(event)
            if event.type == "response.in_progress":  # cancellable from here on (docs/protocol.md)
                cancelled = client.responses.cancel(event.response.id)
    client.close()
    assert isinstance(cancelled, Response) and cancelled.status == "cancelled"
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"] and events[-1].type == "response.cancelled"
    assert all(type(event).__module__.startswith("openai.types.responses") for event in events)  # typed by the SDK
    # openai-python has no type for response.cancelled: it builds its union's first member, with the fields as sent.
    assert events[-1].model_dump()["response"] == cancelled.model_dump(exclude_unset=True)


async def test_openai_sdk_drives_every_endpoint(live_server) -> None:
    with trio.fail_after(SDK_TIMEOUT):
        await trio.to_thread.run_sync(exercise_every_endpoint, live_server[1], abandon_on_cancel=True)
