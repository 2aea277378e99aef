"""The endpoints beside `POST /v1/responses`: read, delete and cancel a response, list its input
items, and the model list (docs/protocol.md, "Stored responses" and "Models").

| request                                   | answer                                            |
| GET    /v1/responses/{id}                 | the stored Response; `stream=true`: its events     |
| DELETE /v1/responses/{id}                 | `{id, object: "response", deleted: true}`          |
| GET    /v1/responses/{id}/input_items     | a page of the items the response was given         |
| POST   /v1/responses/{id}/cancel          | the response in flight, ended with status cancelled |
| POST   /v1/responses/compact              | a compacted window of the conversation (a new chain) |
| GET    /v1/models, /v1/models/{id}        | the simulated profiles as Model objects            |

A handler returns an `Answer` (a JSON body, or the events of an SSE stream) or raises
ProtocolError; server/http/serving.py routes the request here and writes the answer. (server/endpoint.py
is the state every connection shares; this module is the routes beside `POST /v1/responses`.) Every response id is
looked up for the key that asks: another key's response is `response_not_found`, as an unknown id.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import attrs
import trio

from ..api import retrieval
from ..api.service import owner_of
from ..designs import compaction
from ..protocol import codec
from ..protocol.errors import MISSING_REQUIRED_PARAMETER, ProtocolError
from .endpoint import Endpoint

# [ours] How long a cancel request waits for the response's terminal event to go out before it
# answers with the response as it stands (a client that stopped reading can hold the write).
CANCEL_WAIT_SECONDS = 10.0


@attrs.frozen
class Answer:
    body: dict[str, Any] | None = None
    events: list[Any] | None = None  # an SSE stream instead of a JSON body
    status: int = 200


@attrs.frozen
class Call:
    """What a handler is given: the server, the id in the path (if any), the query, the caller."""

    server: Endpoint
    ident: str
    query: dict[str, list[str]]
    owner: str | None
    body: bytes = b""  # the request body, for the one route that takes one (compact)


Handler = Callable[[Call], Awaitable[Answer]]


async def retrieve(call: Call) -> Answer:
    retrieval.parse_include(call.query)
    stream = retrieval.parse_bool(call.query, "stream")
    starting_after = retrieval.parse_int(call.query, "starting_after", minimum=0)
    turn = retrieval.stored(call.server.api.store, call.ident, call.owner)
    if stream:
        return Answer(events=retrieval.replay_events(turn.response, starting_after))
    return Answer(turn.response)


async def delete(call: Call) -> Answer:
    """Deletion removes the stored object and nothing else: a chained connection that caches the
    response keeps chaining from it; a response still in flight (a v1 rollout suspended or not)
    is refused, since it has no stored object yet (docs/protocol.md)."""
    api = call.server.api
    turn = api.store.get(call.ident)
    if turn is not None and turn.owner == call.owner:
        api.store.delete(call.ident)
        return Answer(retrieval.deletion(call.ident))
    if api.live.find(call.ident, call.owner) is not None:
        raise retrieval.response_in_progress(call.ident)
    raise retrieval.response_not_found(call.ident)


async def list_input_items(call: Call) -> Answer:
    query = retrieval.parse_list_query(call.query)
    turns = retrieval.stored_context(call.server.api.store, call.ident, call.owner)
    return Answer(retrieval.input_items_page(retrieval.input_items(turns), query))


async def cancel(call: Call) -> Answer:
    """End a response in flight with status cancelled; answer with it once its terminal event went
    out. A finished response (stored) cannot be cancelled; a cancelled one is not stored."""
    api = call.server.api
    live = api.live.find(call.ident, call.owner)
    if live is None:
        raise retrieval.not_cancellable(retrieval.stored(api.store, call.ident, call.owner).response["status"])
    if not live.cancellable:
        raise retrieval.not_cancellable(live.response.status)
    live.cancel()
    with trio.move_on_after(CANCEL_WAIT_SECONDS):
        await live.ended.wait()
    return Answer(live.response.to_dict())


async def compact(call: Call) -> Answer:
    """`POST /v1/responses/compact`: the conversation (its `input`, after a stored
    `previous_response_id`'s) compacted into a window that a new response takes as its `input`
    (WS guide, "Standalone /responses/compact"); nothing is stored."""
    body = codec.loads_object(call.body, what="request body")
    fields = {key: body[key] for key in ("model", "input", "instructions", "previous_response_id") if key in body}
    if "input" not in fields and "previous_response_id" not in fields:
        raise ProtocolError(MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", param="input")
    request = codec.parse_create_body(fields)
    return Answer(await compaction.compact_conversation(call.server.api, request, call.owner))


async def list_models(call: Call) -> Answer:
    return Answer(retrieval.model_list())


async def retrieve_model(call: Call) -> Answer:
    return Answer(retrieval.model_object(call.ident))


@attrs.frozen
class Route:
    pattern: re.Pattern[str]
    methods: dict[str, Handler]  # method -> handler; the keys are the `Allow` header


ROUTES = (
    Route(re.compile(r"/v1/responses/(compact)"), {"POST": compact}),  # before the id route, which would take "compact"
    Route(re.compile(r"/v1/responses/([^/]+)"), {"GET": retrieve, "DELETE": delete}),
    Route(re.compile(r"/v1/responses/([^/]+)/input_items"), {"GET": list_input_items}),
    Route(re.compile(r"/v1/responses/([^/]+)/cancel"), {"POST": cancel}),
    Route(re.compile(r"/v1/models()"), {"GET": list_models}),
    Route(re.compile(r"/v1/models/(.+)"), {"GET": retrieve_model}),
)


def find(path: str) -> tuple[Route, str] | None:
    """The route a path names and the (percent-decoded) id in it; None for any other path."""
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match:
            return route, unquote(match.group(1))
    return None


async def answer(server: Endpoint, handler: Handler, ident: str, target: str, api_key: str, body: bytes) -> Answer:
    return await handler(Call(server, ident, retrieval.parse_query(target), owner_of(api_key), body))


__all__ = ["CANCEL_WAIT_SECONDS", "ROUTES", "Answer", "Call", "Route", "answer", "find"]
