"""The server's routes, connection handling, outbox and HTTP exchange held to exact answers: the
status, error code, param and message of each refusal, and what each route answers
(docs/protocol.md, "Stored responses", "Compaction", "Cancel"). In-process over memory streams under
the autojump clock (tests/support.py). Written against the survivors of the mutation runs
(docs/mutation.md)."""

from __future__ import annotations

import json

import attrs
import h11
import trio
from support import make_server
from test_endpoints import Raw, Reply, body, connect, error_of

from prototype.api.costs import ZERO_COSTS
from prototype.api.service import owner_of
from prototype.client.sse import parse_stream

# --- server/routes.py ---------------------------------------------------------------------------------


async def test_a_replay_from_starting_after_zero_skips_only_the_first_event(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    rid = (await client.request("POST", "/v1/responses", body=body(store=True))).json()["id"]
    replay = parse_stream((await client.request("GET", f"/v1/responses/{rid}?stream=true")).body)
    after_zero = (await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=0")).body
    assert [json.loads(line[6:]) for line in after_zero.split(b"\n") if line.startswith(b"data: ")] == [e.data for e in replay[1:]]
    assert error_of(await client.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=-1"), 400, "integer_below_min_value",
                    "starting_after") == "Invalid 'starting_after': integer below minimum value. Expected a value >= 0, but got -1 instead."


async def test_a_cancel_during_post_inference_finds_a_completed_response(autojump_clock, nursery) -> None:
    """Billing and the store write run after the response took its final status and before its
    terminal event: the response is still live, no longer cancellable."""
    server = make_server(costs=attrs.evolve(ZERO_COSTS, post=1.0))
    streaming, http = connect(nursery, server), connect(nursery, server)
    await streaming.start("POST", "/v1/responses", body=body(stream=True, metadata={"testbed_workload": "fixed:1"}))
    events = await streaming.events_until("response.output_item.done")
    rid, done_at = events[0]["response"]["id"], trio.current_time()
    assert server.api.live.find(rid, owner_of("alice")) is not None
    refused = await http.request("POST", f"/v1/responses/{rid}/cancel")
    assert error_of(refused, 400, "response_not_cancellable", "response_id") == "Cannot cancel a completed response."
    (terminal,) = await streaming.events_until("response.completed")
    assert (trio.current_time(), terminal["response"]["status"]) == (done_at + 1.0, "completed")


async def post_raw(client: Raw, target: str, data: bytes) -> Reply:
    """A POST whose body is `data` as it is (JSON or not)."""
    headers = [("host", "testbed"), ("content-length", str(len(data))), ("authorization", "Bearer alice"),
               ("content-type", "application/json")]
    await client.stream.send_all(client.conn.send(h11.Request(method="POST", target=target, headers=headers))
                                 + client.conn.send(h11.Data(data=data)) + client.conn.send(h11.EndOfMessage()))
    head = await client._next()
    return Reply(head.status_code, {k.decode().lower(): v.decode() for k, v in head.headers}, await client.rest())


def compact_body(**fields) -> dict:
    return {"model": "sim-1000", **fields}


async def test_compact_refuses_a_body_that_is_not_one_json_object(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    for raw, message in ((b"[1]", "The request body must be one JSON object."),
                         (b"{", "The request body is not valid JSON: Expecting property name enclosed in double quotes: "
                                "line 1 column 2 (char 1).")):
        assert error_of(await post_raw(client, "/v1/responses/compact", raw), 400, "invalid_json", None) == message


async def test_compact_needs_an_input_or_a_previous_response(autojump_clock, nursery) -> None:
    server = make_server()
    client = connect(nursery, server)
    refused = await client.request("POST", "/v1/responses/compact", body=compact_body(instructions="be brief"))
    assert error_of(refused, 400, "missing_required_parameter", "input") == "Missing required parameter: 'input'."
    # Either one is enough: an input alone, or a stored response alone.
    alone = await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug"))
    *users, _ = alone.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"]
    first = (await client.request("POST", "/v1/responses", body=body(store=True, metadata={"testbed_workload": "fixed:1"}))).json()
    chained = await client.request("POST", "/v1/responses/compact", body=compact_body(previous_response_id=first["id"]))
    *users, item = chained.json()["output"]
    assert [user["content"][0]["text"] for user in users] == ["fix the bug"] and item["type"] == "compaction"
    # Nothing is stored.
    assert server.api.store.get(chained.json()["id"]) is None


async def test_compact_reads_the_instructions(autojump_clock, nursery) -> None:
    client = connect(nursery, make_server())
    plain, instructed = [
        (await client.request("POST", "/v1/responses/compact", body=compact_body(input="fix the bug", **extra))).json()["usage"]
        for extra in ({}, {"instructions": "be brief"})
    ]
    created = (await client.request("POST", "/v1/responses", body={
        "model": "sim-1000", "input": "fix the bug", "instructions": "be brief", "metadata": {"testbed_workload": "fixed:1"}})).json()
    assert instructed["input_tokens"] == created["usage"]["input_tokens"] > plain["input_tokens"]
