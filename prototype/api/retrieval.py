"""The read side of the Responses API and the model list, without I/O of their own: query
parameters, the input-items page, the events of a stored response, the model objects.

Shapes follow the public API reference and openai-python (`resources/responses/responses.py`,
`resources/responses/input_items.py`, `types/responses/response_item_list.py`, `types/model.py`);
what the testbed does differently is marked **[ours]** in docs/protocol.md ("Stored responses").
The HTTP shell (server/routes.py) calls these and writes the answers.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs

import attrs

from ..engine.latency import decode_rate_for_model
from ..protocol import events as ev
from ..protocol.errors import INVALID_VALUE, ProtocolError
from .store import ResponseStore, StoredTurn
from .workloads import MAX_DECODE_TPS

# Error codes. The two integer-range codes are the public API's spelling for an out-of-range
# integer parameter; the others are [ours] (the reference answers these with `code: null`).
RESPONSE_NOT_FOUND = "response_not_found"
MODEL_NOT_FOUND = "model_not_found"  # the API's code for a model it does not serve
RESPONSE_IN_PROGRESS = "response_in_progress"
RESPONSE_NOT_CANCELLABLE = "response_not_cancellable"
INTEGER_BELOW_MIN_VALUE = "integer_below_min_value"
INTEGER_ABOVE_MAX_VALUE = "integer_above_max_value"

# `GET /v1/responses/{id}/input_items` (openai-python `input_items.py`): limit 1..100, default 20;
# order asc or desc, default desc.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
ORDERS = ("asc", "desc")
# openai-python `types/responses/response_includable.py`. Accepted everywhere `include` is; the
# simulator's items carry none of these extra fields, so none changes an answer [ours].
INCLUDABLE = frozenset({
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
})

_INTEGER = re.compile(r"^[+-]?\d+$")


# --- errors -------------------------------------------------------------------------------------


def response_not_found(response_id: str) -> ProtocolError:
    """Unknown, deleted, never stored, or another key's: the same answer, so ids do not leak."""
    return ProtocolError(RESPONSE_NOT_FOUND, f"Response with id '{response_id}' not found.", param="response_id", status=404)


def response_in_progress(response_id: str) -> ProtocolError:
    return ProtocolError(
        RESPONSE_IN_PROGRESS,
        f"Response '{response_id}' is still in progress: cancel it, or delete it once it has ended.",
        param="response_id",
    )


def not_cancellable(status: str) -> ProtocolError:
    # The reference's wording for a finished response ("Cannot cancel a completed response.").
    return ProtocolError(RESPONSE_NOT_CANCELLABLE, f"Cannot cancel a {status} response.", param="response_id")


# --- query parameters ---------------------------------------------------------------------------


def parse_query(target: str) -> dict[str, list[str]]:
    """The query string of a request target; a repeated key keeps every value."""
    _, _, query = target.partition("?")
    return parse_qs(query, keep_blank_values=True)


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def parse_int(query: dict[str, list[str]], name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    raw = _last(query, name)
    if raw is None:
        return None
    if not _INTEGER.match(raw):
        raise ProtocolError(INVALID_VALUE, f"Invalid type for '{name}': expected an integer, but got {raw[:32]!r}.", param=name)
    value = int(raw)
    if value < minimum:
        raise ProtocolError(
            INTEGER_BELOW_MIN_VALUE,
            f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum}, but got {value} instead.",
            param=name,
        )
    if maximum is not None and value > maximum:
        raise ProtocolError(
            INTEGER_ABOVE_MAX_VALUE,
            f"Invalid '{name}': integer above maximum value. Expected a value <= {maximum}, but got {value} instead.",
            param=name,
        )
    return value


def parse_bool(query: dict[str, list[str]], name: str) -> bool:
    raw = _last(query, name)
    if raw is None or raw.lower() == "false":
        return False
    if raw.lower() == "true":
        return True
    raise ProtocolError(INVALID_VALUE, f"Invalid value for '{name}': expected true or false, but got {raw[:32]!r}.", param=name)


def parse_include(query: dict[str, list[str]]) -> tuple[str, ...]:
    """`include` or `include[]`, repeated (openai-python sends `include[]=...`)."""
    values = (*query.get("include", ()), *query.get("include[]", ()))
    for value in values:
        if value not in INCLUDABLE:
            raise ProtocolError(
                INVALID_VALUE,
                f"Invalid value for 'include': {value[:64]!r}; supported values are {', '.join(sorted(INCLUDABLE))}.",
                param="include",
            )
    return tuple(values)


@attrs.frozen
class ListQuery:
    after: str | None = None
    limit: int = DEFAULT_LIMIT
    order: str = "desc"
    include: tuple[str, ...] = ()


def parse_list_query(query: dict[str, list[str]]) -> ListQuery:
    limit = parse_int(query, "limit", minimum=1, maximum=MAX_LIMIT)
    order = _last(query, "order")
    if order is not None and order not in ORDERS:
        raise ProtocolError(
            INVALID_VALUE, f"Invalid value for 'order': {order[:32]!r}. Supported values are: 'asc' and 'desc'.", param="order"
        )
    return ListQuery(_last(query, "after"), DEFAULT_LIMIT if limit is None else limit, order or "desc", parse_include(query))


# --- stored responses ---------------------------------------------------------------------------


def stored(store: ResponseStore, response_id: str, owner: str | None) -> StoredTurn:
    """The stored response, if the key `owner` created it; else `response_not_found`."""
    turn = store.get(response_id)
    if turn is None or turn.owner != owner:
        raise response_not_found(response_id)
    return turn


def stored_context(store: ResponseStore, response_id: str, owner: str | None) -> list[StoredTurn]:
    """The response and the stored responses it chains from, first to last. The walk stops at a
    link that was deleted: its items went with it."""
    turns = [stored(store, response_id, owner)]
    while turns[-1].previous_response_id is not None:
        earlier = store.get(turns[-1].previous_response_id)
        if earlier is None or earlier.owner != owner:
            break
        turns.append(earlier)
    turns.reverse()
    return turns


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "web_search_call": "ws"}


def input_items(turns: Sequence[StoredTurn]) -> list[dict[str, Any]]:
    """The items the last turn's model call was given, oldest first: every earlier turn's input and
    output, then the last turn's input. An item sent without an id gets one derived from the turn
    that stored it and its place there, so a cursor (`after`) names the same item every time."""
    items: list[dict[str, Any]] = []
    for number, turn in enumerate(turns):
        stem = turn.id.partition("_")[2] or turn.id
        groups = [("in", turn.input)] if number == len(turns) - 1 else [("in", turn.input), ("out", turn.output)]
        for where, group in groups:
            for index, item in enumerate(group):
                record = item.to_dict()
                if not record.get("id"):
                    record["id"] = f"{_ID_PREFIX.get(record['type'], 'item')}_{stem}_{where}{index}"
                items.append(record)
    return items


def input_items_page(items: Sequence[dict[str, Any]], query: ListQuery) -> dict[str, Any]:
    """One page of the list, in the reference's list shape (`response_item_list.py`)."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    start = 0
    if query.after is not None:
        position = next((i for i, item in enumerate(ordered) if item["id"] == query.after), None)
        if position is None:
            raise ProtocolError(INVALID_VALUE, f"Invalid value for 'after': no input item with id {query.after[:64]!r}.", param="after")
        start = position + 1
    page = ordered[start : start + query.limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + query.limit < len(ordered),
    }


def deletion(response_id: str) -> dict[str, Any]:
    """The reference's answer to `DELETE /v1/responses/{id}`."""
    return {"id": response_id, "object": "response", "deleted": True}


_TERMINALS = {
    "failed": ev.ResponseFailed,
    "incomplete": ev.ResponseIncomplete,
    "cancelled": ev.ResponseCancelled,
}


def replay_events(response: dict[str, Any], starting_after: int | None = None) -> list[Any]:
    """The events of a stored response, rebuilt from it in the order the server streams them:
    created, in_progress, each output item (its text or arguments in one delta), the terminal.
    Numbered from 0; with `starting_after`, only the later ones [ours: the reference replays the
    events as they were streamed; docs/protocol.md]."""
    numbers = itertools.count()
    started = {**response, "status": "in_progress", "output": [], "usage": None, "error": None, "incomplete_details": None}
    started.pop("testbed_timing", None)
    events: list[Any] = [ev.ResponseCreated(next(numbers), started), ev.ResponseInProgress(next(numbers), started)]
    for index, item in enumerate(response.get("output", [])):
        events.extend(_item_events(numbers, index, item))
    events.append(_TERMINALS.get(response.get("status", ""), ev.ResponseCompleted)(next(numbers), response))
    if starting_after is not None:
        events = [event for event in events if event.sequence_number > starting_after]
    return events


def _item_events(numbers: Iterator[int], index: int, item: dict[str, Any]) -> Iterator[Any]:
    item_id = item.get("id", "")
    kind = item.get("type")
    if kind == "message":
        yield ev.OutputItemAdded(next(numbers), index, {**item, "content": [], "status": "in_progress"})
        for part_index, part in enumerate(item.get("content", [])):
            text = part.get("text", "")
            empty = {"type": part.get("type", "output_text"), "text": "", "annotations": []}
            yield ev.ContentPartAdded(next(numbers), item_id, index, part_index, empty)
            if text:
                yield ev.OutputTextDelta(next(numbers), item_id, index, part_index, text)
            yield ev.OutputTextDone(next(numbers), item_id, index, part_index, text)
            yield ev.ContentPartDone(next(numbers), item_id, index, part_index, part)
    elif kind == "function_call":
        arguments = item.get("arguments", "")
        yield ev.OutputItemAdded(next(numbers), index, {**item, "arguments": "", "status": "in_progress"})
        if arguments:
            yield ev.FunctionCallArgumentsDelta(next(numbers), item_id, index, arguments)
        yield ev.FunctionCallArgumentsDone(next(numbers), item_id, index, arguments)
    elif kind == "web_search_call":
        yield ev.OutputItemAdded(next(numbers), index, {**item, "status": "in_progress"})
        for progress in (ev.WebSearchInProgress, ev.WebSearchSearching, ev.WebSearchCompleted):
            yield progress(next(numbers), item_id, index)
    else:
        yield ev.OutputItemAdded(next(numbers), index, item)
    yield ev.OutputItemDone(next(numbers), index, item)


# --- models -------------------------------------------------------------------------------------

# The three profiles of docs/serving.md's model table, by the names it uses for them (GPT-5.4 at the
# flagship's 65 tokens/s, GPT-5.3-Codex-Spark at 1000, its bursts at 4000); any other name is accepted too and
# selects by the same rules (engine/latency.py), so every id is retrievable.
LISTED_MODELS = ("gpt-5.4", "gpt-5.3-codex-spark", "gpt-5.3-codex-spark-burst")
# [ours] A fixed date so answers are identical across runs: 2026-04-01 UTC, the month of the OpenAI
# post the profiles' decode rates come from.
MODELS_CREATED = 1775001600
OWNED_BY = "testbed"


def model_object(model_id: str) -> dict[str, Any]:
    """The reference's Model (`types/model.py`), with the decode rate the name selects [ours]. A `sim-<N>` name
    whose N is not a usable rate (one `response.create` refuses) is not found, as the API answers for a model
    it does not serve (404 `model_not_found`)."""
    rate = decode_rate_for_model(model_id)
    if not 0 < rate < MAX_DECODE_TPS:
        raise ProtocolError(MODEL_NOT_FOUND, f"The model '{model_id[:64]}' does not exist.", param="model", status=404)
    return {
        "id": model_id,
        "object": "model",
        "created": MODELS_CREATED,
        "owned_by": OWNED_BY,
        "testbed_decode_tokens_per_s": rate,
    }


def model_list() -> dict[str, Any]:
    return {"object": "list", "data": [model_object(name) for name in LISTED_MODELS]}
