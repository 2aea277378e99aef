"""The API's read side (prototype/api/retrieval.py): the query parameters and their refusals (code, param,
message), a stored response's input items and their pages, the events a stored response replays as, and the
model objects. tests/test_endpoints.py drives the same code over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from prototype.api import retrieval
from prototype.api.retrieval import ListQuery
from prototype.api.store import ResponseStore
from prototype.protocol.errors import ProtocolError
from prototype.protocol.items import FunctionCall, FunctionCallOutput, Message, Reasoning, WebSearchCall


def refused(call, *args: Any, **kwargs: Any) -> tuple[int, str, str | None, str]:
    with pytest.raises(ProtocolError) as caught:
        call(*args, **kwargs)
    error = caught.value
    return error.status, error.code, error.param, error.message


# --- query parameters ----------------------------------------------------------------------------


def test_a_query_keeps_every_value_of_a_repeated_key_and_blank_values():
    assert retrieval.parse_query("/v1/responses/r/input_items?limit=2&include[]=a&include[]=b&after=") == {
        "limit": ["2"], "include[]": ["a", "b"], "after": [""]}
    assert retrieval.parse_query("/v1/models") == {}


def test_an_integer_parameter_takes_its_last_value_within_its_bounds():
    for query, expected in (({}, None), ({"limit": []}, None), ({"limit": ["500", "+7"]}, 7), ({"limit": ["1"]}, 1),
                            ({"limit": ["100"]}, 100)):
        assert retrieval.parse_int(query, "limit", minimum=1, maximum=100) == expected
    assert retrieval.parse_int({"n": ["-3"]}, "n", minimum=-3) == -3
    assert retrieval.parse_int({"n": ["123456789012"]}, "n", minimum=0) == 123456789012  # no maximum


def test_an_integer_parameter_out_of_bounds_or_not_an_integer_is_refused_with_its_name_and_value():
    assert refused(retrieval.parse_int, {"limit": ["7", "0"]}, "limit", minimum=1, maximum=100) == (
        400, "integer_below_min_value", "limit",
        "Invalid 'limit': integer below minimum value. Expected a value >= 1, but got 0 instead.")
    assert refused(retrieval.parse_int, {"limit": ["101"]}, "limit", minimum=1, maximum=100) == (
        400, "integer_above_max_value", "limit",
        "Invalid 'limit': integer above maximum value. Expected a value <= 100, but got 101 instead.")
    assert refused(retrieval.parse_int, {"starting_after": ["2.5"]}, "starting_after", minimum=0) == (
        400, "invalid_value", "starting_after", "Invalid type for 'starting_after': expected an integer, but got '2.5'.")
    long = "x" * 40
    assert refused(retrieval.parse_int, {"limit": [long]}, "limit", minimum=1)[3] == (
        f"Invalid type for 'limit': expected an integer, but got {'x' * 32!r}.")
    for bad in ("", "1 ", "0x10", "1e3"):
        assert refused(retrieval.parse_int, {"limit": [bad]}, "limit", minimum=1)[:3] == (400, "invalid_value", "limit")


def test_a_boolean_parameter_is_true_or_false_in_any_case():
    for query, expected in (({}, False), ({"stream": ["FALSE"]}, False), ({"stream": ["True"]}, True),
                            ({"stream": ["true", "false"]}, False)):
        assert retrieval.parse_bool(query, "stream") is expected
    assert refused(retrieval.parse_bool, {"stream": ["yes"]}, "stream") == (
        400, "invalid_value", "stream", "Invalid value for 'stream': expected true or false, but got 'yes'.")
    assert refused(retrieval.parse_bool, {"stream": ["y" * 40]}, "stream")[3] == (
        f"Invalid value for 'stream': expected true or false, but got {'y' * 32!r}.")


def test_include_takes_both_spellings_in_order_and_refuses_an_unknown_value_listing_the_known_ones():
    query = {"include": ["reasoning.encrypted_content"], "include[]": ["web_search_call.results", "message.output_text.logprobs"]}
    assert retrieval.parse_include(query) == (
        "reasoning.encrypted_content", "web_search_call.results", "message.output_text.logprobs")
    assert retrieval.parse_include({}) == ()
    known = ", ".join(sorted(retrieval.INCLUDABLE))
    assert refused(retrieval.parse_include, {"include[]": ["file_search_call.results", "bogus"]}) == (
        400, "invalid_value", "include", f"Invalid value for 'include': 'bogus'; supported values are {known}.")
    assert refused(retrieval.parse_include, {"include": ["z" * 80]})[3] == (
        f"Invalid value for 'include': {'z' * 64!r}; supported values are {known}.")
    assert len(retrieval.INCLUDABLE) == 8 and "computer_call_output.output.image_url" in retrieval.INCLUDABLE


def test_a_list_query_defaults_to_twenty_newest_first_and_refuses_another_order():
    assert retrieval.parse_list_query({}) == ListQuery(None, 20, "desc", ())
    assert retrieval.parse_list_query({"after": ["a", "b"], "limit": ["3"], "order": ["asc"], "include[]": ["web_search_call.results"]}) == (
        ListQuery("b", 3, "asc", ("web_search_call.results",)))
    assert retrieval.parse_list_query({"order": ["desc"]}).order == "desc"
    assert refused(retrieval.parse_list_query, {"order": ["up"]}) == (
        400, "invalid_value", "order", "Invalid value for 'order': 'up'. Supported values are: 'asc' and 'desc'.")
    assert refused(retrieval.parse_list_query, {"order": ["o" * 40]})[3] == (
        f"Invalid value for 'order': {'o' * 32!r}. Supported values are: 'asc' and 'desc'.")
    assert refused(retrieval.parse_list_query, {"limit": ["101"]})[:3] == (400, "integer_above_max_value", "limit")
    assert refused(retrieval.parse_list_query, {"limit": ["0"]})[:3] == (400, "integer_below_min_value", "limit")


# --- errors --------------------------------------------------------------------------------------


def test_the_lookup_errors_name_the_response():
    errors = (retrieval.response_in_progress("resp_1"), retrieval.not_cancellable("failed"), retrieval.response_not_found("resp_1"))
    assert [(error.status, error.code, error.param, error.message) for error in errors] == [
        (400, "response_in_progress", "response_id", "Response 'resp_1' is still in progress: cancel it, or delete it once it has ended."),
        (400, "response_not_cancellable", "response_id", "Cannot cancel a failed response."),
        (404, "response_not_found", "response_id", "Response with id 'resp_1' not found.")]


# --- stored responses ----------------------------------------------------------------------------


def put(store: ResponseStore, rid: str, previous: str | None, owner: str | None, input: list, output: list) -> None:
    store.put(rid, previous_response_id=previous, owner=owner, created_at=0.0, input=input, output=output, response={"id": rid})


def test_a_stored_context_walks_back_through_the_owners_responses_and_stops_at_a_gap():
    store = ResponseStore()
    for rid, previous in (("resp_a", None), ("resp_b", "resp_a"), ("resp_c", "resp_b")):
        put(store, rid, previous, "alice", [], [])
    assert [turn.id for turn in retrieval.stored_context(store, "resp_c", "alice")] == ["resp_a", "resp_b", "resp_c"]
    assert refused(retrieval.stored_context, store, "resp_c", "bob")[:2] == (404, "response_not_found")
    assert refused(retrieval.stored, store, "resp_zz", "alice")[3] == "Response with id 'resp_zz' not found."
    assert retrieval.stored(store, "resp_b", "alice").id == "resp_b"
    put(store, "resp_x", None, "bob", [], [])
    put(store, "resp_y", "resp_x", "alice", [], [])  # chains from another key's response: not followed
    assert [turn.id for turn in retrieval.stored_context(store, "resp_y", "alice")] == ["resp_y"]
    store.delete("resp_b")
    assert [turn.id for turn in retrieval.stored_context(store, "resp_c", "alice")] == ["resp_c"]
    put(store, "resp_anon", None, None, [], [])
    assert retrieval.stored(store, "resp_anon", None).id == "resp_anon"
    assert refused(retrieval.stored, store, "resp_anon", "alice")[0] == 404


def test_input_items_are_every_earlier_turns_input_and_output_then_the_last_input_with_stable_ids():
    store = ResponseStore()
    first_in = [Message("user", (("input_text", "fix it"),)), Message("user", (("input_text", "now"),), id="msg_given")]
    first_out = [Reasoning("rs_1", "think"), WebSearchCall("ws_1", "q"), FunctionCall("call_1", "shell", "{}")]
    put(store, "resp_one", None, "k", first_in, first_out)
    put(store, "plain", "resp_one", "k", [FunctionCallOutput("call_1", "ok"), WebSearchCall("", "q2")], [Message("assistant", (("output_text", "done"),))])
    items = retrieval.input_items(retrieval.stored_context(store, "plain", "k"))
    assert [item["id"] for item in items] == [
        "msg_one_in0", "msg_given", "rs_1", "ws_1", "fc_one_out2", "fco_plain_in0", "ws_plain_in1"]
    assert items[0] == {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}], "id": "msg_one_in0"}
    # the last turn's output is not part of its input
    assert "done" not in str(items)
    store2 = ResponseStore()
    put(store2, "resp_two", None, "k", [Message("user", (("input_text", "hi"),))], [])
    put(store2, "resp_three", "resp_two", "k", [Reasoning("", "r"), Message("user", (("input_text", "x"),))], [])
    assert [item["id"] for item in retrieval.input_items(retrieval.stored_context(store2, "resp_three", "k"))] == [
        "msg_two_in0", "item_three_in0", "msg_three_in1"]
    # An item's id takes everything after the response id's first underscore.
    put(store2, "resp_srv_7", None, "k", [Message("user", (("input_text", "hi"),))], [])
    assert retrieval.input_items(retrieval.stored_context(store2, "resp_srv_7", "k"))[0]["id"] == "msg_srv_7_in0"


def test_a_page_of_input_items_follows_after_limit_and_order_and_says_when_there_is_more():
    items = [{"id": f"i{n}"} for n in range(5)]

    def ids(page: dict[str, Any]) -> list[str]:
        return [item["id"] for item in page["data"]]

    page = retrieval.input_items_page(items, ListQuery(limit=2, order="asc"))
    assert page == {"object": "list", "data": items[:2], "first_id": "i0", "last_id": "i1", "has_more": True}
    assert ids(retrieval.input_items_page(items, ListQuery(limit=2, order="desc"))) == ["i4", "i3"]
    assert ids(retrieval.input_items_page(items, ListQuery(after="i1", limit=2, order="asc"))) == ["i2", "i3"]
    assert retrieval.input_items_page(items, ListQuery(after="i2", limit=2, order="asc"))["has_more"] is False  # exactly the rest
    assert retrieval.input_items_page(items, ListQuery(after="i1", limit=2, order="asc"))["has_more"] is True
    assert ids(retrieval.input_items_page(items, ListQuery(after="i3", limit=2, order="desc"))) == ["i2", "i1"]
    assert retrieval.input_items_page(items, ListQuery(after="i0", order="desc")) == {
        "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    assert retrieval.input_items_page(items, ListQuery(limit=5, order="asc"))["has_more"] is False
    assert refused(retrieval.input_items_page, items, ListQuery(after="nope")) == (
        400, "invalid_value", "after", "Invalid value for 'after': no input item with id 'nope'.")
    assert refused(retrieval.input_items_page, items, ListQuery(after="n" * 80))[3] == (
        f"Invalid value for 'after': no input item with id {'n' * 64!r}.")
    assert retrieval.deletion("resp_9") == {"id": "resp_9", "object": "response", "deleted": True}


# --- replayed events ------------------------------------------------------------------------------


RESPONSE = {
    "id": "resp_r", "object": "response", "status": "completed", "usage": {"total_tokens": 9}, "error": None,
    "incomplete_details": None, "testbed_timing": {"ttft": 1.0},
    "output": [
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "hello", "annotations": []}, {"type": "refusal", "text": ""}, {"text": "x"}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": "{\"a\":1}", "status": "completed"},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "shell", "status": "completed"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"}, {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant"}],
}


def test_a_stored_response_replays_as_the_events_the_server_streams():
    events = [event.to_dict() for event in retrieval.replay_events(RESPONSE)]
    started = {**{k: v for k, v in RESPONSE.items() if k != "testbed_timing"}, "status": "in_progress", "output": [], "usage": None}
    message, call, bare_call, search, reasoning, empty = RESPONSE["output"]
    part = {"type": "output_text", "text": "", "annotations": []}
    def at(n: int, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": f"response.{kind}", "sequence_number": n, **fields}

    text = {"item_id": "msg_1", "output_index": 0, "logprobs": []}
    assert events == [
        at(0, "created", response=started), at(1, "in_progress", response=started),
        at(2, "output_item.added", output_index=0, item={**message, "content": [], "status": "in_progress"}),
        at(3, "content_part.added", item_id="msg_1", output_index=0, content_index=0, part=part),
        at(4, "output_text.delta", **text, content_index=0, delta="hello"),
        at(5, "output_text.done", **text, content_index=0, text="hello"),
        at(6, "content_part.done", item_id="msg_1", output_index=0, content_index=0, part=message["content"][0]),
        at(7, "content_part.added", item_id="msg_1", output_index=0, content_index=1, part={"type": "refusal", "text": "", "annotations": []}),
        at(8, "output_text.done", **text, content_index=1, text=""),
        at(9, "content_part.done", item_id="msg_1", output_index=0, content_index=1, part=message["content"][1]),
        at(10, "content_part.added", item_id="msg_1", output_index=0, content_index=2, part=part),
        at(11, "output_text.delta", **text, content_index=2, delta="x"),
        at(12, "output_text.done", **text, content_index=2, text="x"),
        at(13, "content_part.done", item_id="msg_1", output_index=0, content_index=2, part={"text": "x"}),
        at(14, "output_item.done", output_index=0, item=message),
        at(15, "output_item.added", output_index=1, item={**call, "arguments": "", "status": "in_progress"}),
        at(16, "function_call_arguments.delta", item_id="fc_1", output_index=1, delta="{\"a\":1}"),
        at(17, "function_call_arguments.done", item_id="fc_1", output_index=1, arguments="{\"a\":1}"),
        at(18, "output_item.done", output_index=1, item=call),
        at(19, "output_item.added", output_index=2, item={**bare_call, "arguments": "", "status": "in_progress"}),
        at(20, "function_call_arguments.done", item_id="fc_2", output_index=2, arguments=""),
        at(21, "output_item.done", output_index=2, item=bare_call),
        at(22, "output_item.added", output_index=3, item={**search, "status": "in_progress"}),
        *(at(23 + i, f"web_search_call.{step}", item_id="ws_1", output_index=3) for i, step in enumerate(("in_progress", "searching", "completed"))),
        at(26, "output_item.done", output_index=3, item=search),
        at(27, "output_item.added", output_index=4, item=reasoning), at(28, "output_item.done", output_index=4, item=reasoning),
        at(29, "output_item.added", output_index=5, item={**empty, "content": [], "status": "in_progress"}),
        at(30, "output_item.done", output_index=5, item=empty), at(31, "completed", response=RESPONSE)]
    assert [event.sequence_number for event in retrieval.replay_events(RESPONSE, starting_after=29)] == [30, 31]
    assert retrieval.replay_events(RESPONSE, starting_after=31) == []
    assert [event.sequence_number for event in retrieval.replay_events(RESPONSE, starting_after=0)][:1] == [1]


def test_a_replay_ends_with_the_terminal_its_status_names_and_fills_what_the_response_left_out():
    for status, terminal in (("failed", "response.failed"), ("incomplete", "response.incomplete"),
                             ("cancelled", "response.cancelled"), ("completed", "response.completed"),
                             ("in_progress", "response.completed")):
        events = retrieval.replay_events({"id": "r", "status": status})
        assert [event.type for event in events] == ["response.created", "response.in_progress", terminal]
    bare = retrieval.replay_events({"id": "r"})
    assert [event.type for event in bare] == ["response.created", "response.in_progress", "response.completed"]
    assert bare[0].response == {"id": "r", "status": "in_progress", "output": [], "usage": None, "error": None, "incomplete_details": None}
    item = retrieval.replay_events({"output": [{"type": "function_call", "arguments": "{}"}]})[2]
    assert item.to_dict()["item"] == {"type": "function_call", "arguments": "", "status": "in_progress"}
    delta = retrieval.replay_events({"output": [{"type": "function_call", "arguments": "{}"}]})[3]
    assert (delta.type, delta.item_id) == ("response.function_call_arguments.delta", "")
    events = retrieval.replay_events({"output": [{"type": "message", "id": "m", "content": [{"type": "output_text"}]}]})
    assert [(event.type, getattr(event, "text", None)) for event in events[3:6]] == [  # a part without text: empty text
        ("response.content_part.added", None), ("response.output_text.done", ""), ("response.content_part.done", None)]


# --- models --------------------------------------------------------------------------------------


def test_model_objects_name_the_profile_a_name_selects_and_one_without_a_usable_rate_is_not_found() -> None:
    assert retrieval.model_list() == {"object": "list", "data": [
        {"id": "gpt-5.4", "object": "model", "created": 1775001600, "owned_by": "testbed", "testbed_decode_tokens_per_s": 65.0},
        {"id": "gpt-5.3-codex-spark", "object": "model", "created": 1775001600, "owned_by": "testbed", "testbed_decode_tokens_per_s": 1000.0},
        {"id": "gpt-5.3-codex-spark-burst", "object": "model", "created": 1775001600, "owned_by": "testbed", "testbed_decode_tokens_per_s": 4000.0},
    ]}
    for name, rate in (("sim-7", 7.0), ("sim-250000", 250000.0), ("sim-9999999", 9999999.0), ("spark", 1000.0),
                       ("flagship", 65.0), ("sim-0.5", 0.5)):
        assert retrieval.model_object(name)["testbed_decode_tokens_per_s"] == rate
    # No usable rate: what response.create refuses is not found, named up to its first 64 characters.
    for name in ("sim-0", "sim-0.0", "sim-10000000", "sim-0" + "0" * 80):
        message = f"The model '{name[:64]}' does not exist."
        assert refused(retrieval.model_object, name) == (404, "model_not_found", "model", message)
