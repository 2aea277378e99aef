"""The `response.create` body, field by field (protocol/codec.py, protocol/rules.py): each refusal's code,
message and param, the values at each limit, the defaults, and what a request derives from its fields."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import pytest

from prototype.protocol import codec
from prototype.protocol.errors import ProtocolError
from prototype.protocol.events import ToolDef
from prototype.protocol.items import Message, parse_input

DROP = object()  # a field left out of the body
FUNCTION = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
CUSTOM = {"type": "custom", "name": "apply_patch_grammar"}
MCP = {"type": "mcp", "server_label": "docs", "server_url": "https://example.invalid/mcp"}
TOOL_TYPES = ("'function', 'file_search', 'computer', 'computer_use_preview', 'web_search', 'web_search_2025_08_26', 'mcp', "
              "'code_interpreter', 'programmatic_tool_calling', 'image_generation', 'local_shell', 'shell', 'custom', 'namespace', "
              "'tool_search', 'web_search_preview', 'web_search_preview_2025_03_11', 'apply_patch'")
CHOICE_TYPES = ("'function', 'custom', 'mcp', 'shell', 'apply_patch', 'programmatic_tool_calling', 'file_search', 'web_search', "
                "'web_search_preview', 'web_search_preview_2025_03_11', 'computer', 'computer_use', 'computer_use_preview', "
                "'image_generation', 'code_interpreter'")
STREAM_ID = ("The 'stream_id' field must be a non-empty string with at most 256 characters and may only contain letters, numbers, "
             "underscores, hyphens, and periods.")
NAME_PATTERN = "string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$' of at most 64 characters."


def body(**fields: Any) -> dict[str, Any]:
    """A create body of model "m" and input "x", `fields` overriding (DROP leaves one out)."""
    return {k: v for k, v in {"model": "m", "input": "x", **fields}.items() if v is not DROP}


def typed(param: str, expected: str) -> tuple:
    return ("invalid_type", f"Invalid type for '{param}': expected {expected}.", param)


def missing(param: str) -> tuple:
    return ("missing_required_parameter", f"Missing required parameter: '{param}'.", param)


def enum(value: str, allowed: str, param: str) -> tuple:
    return ("invalid_value", f"Invalid value: {value!r}. Supported values are: {allowed}.", param)


def below(param: str, kind: str, limit: Any, got: Any) -> tuple:
    return (f"{kind}_below_min_value", f"Invalid '{param}': {kind} below minimum value. Expected a value >= {limit}, but got {got} instead.", param)


def above(param: str, kind: str, limit: Any, got: Any) -> tuple:
    return (f"{kind}_above_max_value", f"Invalid '{param}': {kind} above maximum value. Expected a value <= {limit}, but got {got} instead.", param)


def not_found(name: str) -> tuple:
    return ("invalid_value", f"Tool choice '{name}' not found in 'tools' parameter.", "tool_choice")


def unsupported(param: str, where: str = "by this server") -> tuple:
    return ("unsupported_parameter", f"'{param}' is not supported {where}.", param)


def tool_entry(name: str = "x") -> dict[str, str]:
    return {"type": "function", "name": name}


ALLOWED = {"type": "allowed_tools", "mode": "auto"}
R = pytest.param  # a refused body: (body, websocket, error)
REFUSED = [
    R(["x"], False, ("invalid_json", "The request body must be a JSON object.", None), id="not an object"),
    R(body(background=True), False, unsupported("background", "in this mode"), id="background"),
    *(R(body(**{key: value}), websocket, unsupported(key), id=f"{key} {'ws' if websocket else 'http'}")
      for key, value in (("conversation", "c"), ("prompt", {"id": "p"}), ("stream_id", "lane")) for websocket in (False, True)
      if not (key == "stream_id" and websocket)),
    *(R(body(stream_id=value), True, ("invalid_stream_id", STREAM_ID, "stream_id"), id=f"stream_id {value!r:.8}")
      for value in (5, "a b", "s" * 257, "")),
    *(R(body(**{key: value}), False, ("unknown_parameter", f"Unknown parameter: '{key}'.", key), id=f"unknown parameter {key}")
      for key, value in (("temprature", 0.5), ("messages", [{"role": "user", "content": "x"}]), ("max_tokens", None),
                         ("type", "response.create"))),  # a frame's `type` is no field of a POST body
    R(body(**{"k" * 70: 1}), False, ("unknown_parameter", f"Unknown parameter: '{'k' * 64}'.", "k" * 64), id="unknown parameter of 70"),
    *(R(body(model=value), False, typed("model", "a string"), id=f"model {value!r}") for value in (5, True, ["m"])),
    *(R(body(**{key: value}), False, typed(key, expected), id=f"{key} {value!r}") for key, value, expected in (
        ("previous_response_id", 5, "a string"), ("previous_response_id", ["resp_1"], "a string"), ("generate", "no", "a boolean"),
        ("generate", 0, "a boolean"), ("max_output_tokens", 1.5, "an integer"), ("max_output_tokens", True, "an integer"),
        ("temperature", "0.2", "a finite number"), ("temperature", math.inf, "a finite number"), ("temperature", True, "a finite number"),
        ("top_p", math.nan, "a finite number"), ("top_p", "1", "a finite number"), ("tool_choice", 3, "a string or an object"),
        ("parallel_tool_calls", 1, "a boolean"), ("store", "yes", "a boolean"), ("stream", 1, "a boolean"), ("stream", "true", "a boolean"),
        ("instructions", 1, "a string"), ("instructions", {"text": "x"}, "a string"), ("tools", {}, "an array"),
        ("metadata", [], "an object of string values"), ("metadata", "m", "an object of string values"),
        ("include", "a", "an array of strings"), ("include", ["a", 1], "an array of strings"), ("reasoning", "high", "an object"),
        ("reasoning", [], "an object"), ("text", "plain", "an object"), ("user", 5, "a string"), ("prompt_cache_key", ["k"], "a string"),
        ("truncation", 1, "a string"), ("top_logprobs", 2.0, "an integer"), ("max_tool_calls", True, "an integer"),
        ("multi_agent", "x", "an object"), ("context_management", {}, "a non-empty array of objects"),
        ("context_management", [], "a non-empty array of objects"))),
    R(body(input=DROP), False, missing("input"), id="no input"),
    R({}, False, missing("input"), id="empty body"),
    R(body(input=None), False, missing("input"), id="null input"),
    R(body(input=[]), False, ("empty_input", "'input' must not be empty without 'previous_response_id'.", "input"), id="empty input"),
    R(body(input=5), False, typed("input", "a string or an array of items"), id="input a number"),
    R(body(input=[5]), False, typed("input[0]", "an object"), id="an item not an object"),
    R(body(input=[{"type": "function_call_output", "call_id": 1, "output": "x"}]), False, typed("input[0].call_id", "a string"), id="call_id a number"),
    R(body(input=[{"role": "user", "content": "a"}, {"role": "user"}]), False,
      ("missing_required_parameter", "Missing required field 'content' in input[1].", "input[1].content"), id="the second item"),
    R(body(tools=[FUNCTION, 5]), False, ("invalid_value", "Invalid tool at 'tools[1]': expected an object with a 'type'.", "tools[1]"), id="tool not an object"),
    *(R(body(tools=[tool]), False, ("invalid_value", "Invalid tool at 'tools[0]': expected an object with a 'type'.", "tools[0]"), id=f"tool {tool}")
      for tool in ({"name": "a"}, {"type": 1})),
    R(body(tools=[FUNCTION, {"type": "function"}]), False, missing("tools[1].name"), id="function without a name"),
    R(body(tools=[tool_entry(5)]), False, typed("tools[0].name", "a string"), id="function name a number"),
    *(R(body(tools=[tool_entry(name)]), False, ("invalid_value", f"Invalid 'tools[0].name': {NAME_PATTERN}", "tools[0].name"), id=f"function name {name:.8}")
      for name in ("a b", "read file", "f" * 65)),
    R(body(tools=[{**tool_entry("a"), "parameters": []}]), False, typed("tools[0].parameters", "an object (a JSON schema)"), id="parameters a list"),
    R(body(tools=[{**tool_entry("f"), "parameters": "{}"}]), False, typed("tools[0].parameters", "an object (a JSON schema)"), id="parameters a string"),
    *(R(body(tools=[{"type": kind, "name": "f"}]), False, enum(kind, TOOL_TYPES, "tools[0].type"), id=f"tool type {kind}")
      for kind in ("browser", "functon", "web_search_previe")),
    R(body(metadata={str(i): "v" for i in range(17)}), False, ("object_above_max_properties", "Invalid 'metadata': too many properties. Expected an "
      "object with at most 16 properties, but got an object with 17 properties instead.", "metadata"), id="metadata of 17"),
    R(body(metadata={"k": 1}), False, typed("metadata.k", "a string"), id="metadata value a number"),
    R(body(metadata={"k" * 65: "v"}), False, ("string_above_max_length", f"Invalid metadata entry {'k' * 65!r}: keys up to 64 characters, string "
      "values up to 512.", f"metadata.{'k' * 65}"), id="metadata key of 65"),
    R(body(metadata={"k": "v" * 513}), False, ("string_above_max_length", "Invalid metadata entry 'k': keys up to 64 characters, string values up "
      "to 512.", "metadata.k"), id="metadata value of 513"),
    R(body(multi_agent={}), False, missing("multi_agent.enabled"), id="multi_agent without enabled"),
    R(body(multi_agent={"max_concurrent_subagents": 2}), False, missing("multi_agent.enabled"), id="multi_agent with a cap only"),
    R(body(multi_agent={"enabled": 1}), False, typed("multi_agent.enabled", "a boolean"), id="enabled a number"),
    *(R(body(multi_agent={"enabled": True, "max_concurrent_subagents": value}), False, typed("multi_agent.max_concurrent_subagents", "an integer"),
        id=f"subagents {value!r}") for value in (True, 2.0)),
    R(body(multi_agent={"enabled": True, "max_concurrent_subagents": 0}), False, ("integer_below_min_value", "Invalid "
      "'multi_agent.max_concurrent_subagents': integer below minimum value 1.", "multi_agent.max_concurrent_subagents"), id="subagents 0"),
    R(body(context_management=[{"type": "compaction"}, 5]), False, typed("context_management[1]", "an object"), id="context entry a number"),
    *(R(body(context_management=[entry]), False, ("invalid_value", "Invalid 'context_management[0].type': only 'compaction' is supported.",
        "context_management[0].type"), id=f"context entry {entry}") for entry in ({}, {"type": "truncation"})),
    *(R(body(context_management=[{"type": "compaction", "compact_threshold": value}]), False, typed("context_management[0].compact_threshold",
        "an integer"), id=f"threshold {value!r}") for value in ("1000", True)),
    R(body(context_management=[{"type": "compaction"}, {"type": "compaction", "compact_threshold": 999}]), False, ("integer_below_min_value",
      "Invalid 'context_management[1].compact_threshold': integer below minimum value 1000.", "context_management[1].compact_threshold"),
      id="threshold 999"),
    # The API reference's ranges and enums (protocol/rules.py).
    R(body(temperature=-0.5), False, below("temperature", "decimal", 0, -0.5), id="temperature below 0"),
    R(body(temperature=2.5), False, above("temperature", "decimal", 2, 2.5), id="temperature above 2"),
    R(body(top_p=1.01), False, above("top_p", "decimal", 1, 1.01), id="top_p above 1"),
    R(body(top_p=-1), False, below("top_p", "decimal", 0, -1), id="top_p below 0"),
    *(R(body(max_output_tokens=value), False, below("max_output_tokens", "integer", 16, value), id=f"max_output_tokens {value}") for value in (0, 15)),
    R(body(max_tool_calls=0), False, below("max_tool_calls", "integer", 1, 0), id="max_tool_calls 0"),
    R(body(top_logprobs=-1), False, below("top_logprobs", "integer", 0, -1), id="top_logprobs -1"),
    R(body(top_logprobs=21), False, above("top_logprobs", "integer", 20, 21), id="top_logprobs 21"),
    R(body(truncation="sometimes"), False, enum("sometimes", "'auto', 'disabled'", "truncation"), id="truncation unknown"),
    R(body(truncation="a" * 70), False, enum("a" * 64, "'auto', 'disabled'", "truncation"), id="enum value quoted in 64 characters"),
    R(body(service_tier="gold"), False, enum("gold", "'auto', 'default', 'flex', 'scale', 'priority'", "service_tier"), id="service_tier"),
    R(body(reasoning={"effort": "extreme"}), False, enum("extreme", "'none', 'minimal', 'low', 'medium', 'high', 'xhigh'", "reasoning.effort"),
      id="reasoning effort"),
    R(body(reasoning={"summary": "long"}), False, enum("long", "'auto', 'concise', 'detailed'", "reasoning.summary"), id="reasoning summary"),
    R(body(text={"verbosity": "loud"}), False, enum("loud", "'low', 'medium', 'high'", "text.verbosity"), id="text verbosity"),
    R(body(text={"format": "json"}), False, typed("text.format", "an object"), id="text format a string"),
    R(body(text={"format": {"type": "xml"}}), False, enum("xml", "'text', 'json_object', 'json_schema'", "text.format.type"), id="text format type"),
    R(body(text={"format": {}}), False, typed("text.format.type", "a string"), id="text format without type"),
    R(body(safety_identifier="s" * 65), False, ("string_above_max_length", "Invalid 'safety_identifier': string too long. Expected a string with "
      "maximum length 64, but got a string with length 65 instead.", "safety_identifier"), id="safety_identifier of 65"),
    *(R(body(**fields), False, ("invalid_value", "The 'stream_options' parameter is only allowed when 'stream' is true.", "stream_options"),
        id=f"stream_options {fields}") for fields in ({"stream_options": {"include_obfuscation": False}}, {"stream": False, "stream_options": {}})),
    # tool_choice: a mode, or a tool the body declares (matched by type and name or label).
    R(body(tool_choice="sometimes"), False, enum("sometimes", "'none', 'auto', 'required'", "tool_choice"), id="tool_choice mode"),
    R(body(tools=[FUNCTION], tool_choice={"type": 3}), False, typed("tool_choice.type", "a string"), id="tool_choice type a number"),
    *(R(body(tools=[{"type": "web_search"}], tool_choice={"type": kind}), False, enum(kind, CHOICE_TYPES, "tool_choice.type"), id=f"choice type {kind!r}")
      for kind in ("web", "")),
    R(body(tool_choice={"type": "function", "name": "nope"}), False, not_found("nope"), id="choice of an undeclared function"),
    R(body(tools=[FUNCTION], tool_choice={"type": "function", "name": "f" * 64 + "gh"}), False, not_found("f" * 64), id="quoted in 64"),
    R(body(tools=[CUSTOM], tool_choice={"type": "custom", "name": "other"}), False, not_found("other"), id="another custom tool"),
    R(body(tools=[tool_entry("other")], tool_choice={"type": "custom", "name": "other"}), False, not_found("other"), id="a function is no custom tool"),
    *(R(body(tools=[tools], tool_choice={"type": kind, **choice}), False, typed("tool_choice.name", "a string"), id=f"{kind} name {choice}")
      for kind, tools in (("function", FUNCTION), ("custom", CUSTOM)) for choice in ({}, {"name": 5}, {"name": ["read_file"]})),
    R(body(tools=[MCP], tool_choice={"type": "mcp", "server_label": "code"}), False, not_found("code"), id="another mcp server"),
    R(body(tools=[{**FUNCTION, "server_label": "docs"}], tool_choice={"type": "mcp", "server_label": "docs"}), False, not_found("docs"),
      id="a label on another type"),
    R(body(tools=[MCP], tool_choice={"type": "mcp"}), False, not_found("None"), id="mcp without a label"),
    R(body(tools=[MCP], tool_choice={"type": "mcp", "server_label": 7}), False, not_found("7"), id="mcp label a number"),
    R(body(tools=[{"type": "web_search"}], tool_choice={"type": "file_search"}), False, not_found("file_search"), id="hosted tool not declared"),
    R(body(tools=[tool_entry("read_file")], tool_choice={**ALLOWED, "mode": "none", "tools": []}), False, enum("none", "'auto', 'required'",
      "tool_choice.mode"), id="allowed_tools mode"),
    *(R(body(tools=[tool_entry("read_file")], tool_choice={**ALLOWED, "tools": tools}), False, typed("tool_choice.tools", "an array of tool objects"),
        id=f"allowed_tools {tools}") for tools in ({}, ["read_file"])),
    R(body(tools=[tool_entry("read_file")], tool_choice={**ALLOWED, "tools": [tool_entry("read_file"), tool_entry()]}), False, not_found("x"),
      id="allowed_tools second tool unknown"),
    R(body(tools=[tool_entry("read_file")], tool_choice={**ALLOWED, "tools": [tool_entry("read_file"), {"type": "browser"}]}), False,
      enum("browser", CHOICE_TYPES, "tool_choice.tools[1].type"), id="allowed_tools second tool type"),
]


@pytest.mark.parametrize(("sent", "websocket", "error"), REFUSED)
def test_a_refused_body_gets_its_code_message_and_param(sent: Any, websocket: bool, error: tuple) -> None:
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body(sent, websocket=True) if websocket else codec.parse_create_body(sent)  # a POST body unless told
    refused = caught.value
    assert (refused.code, refused.message, refused.param, refused.status, str(refused)) == (*error, 400, error[1])
    assert refused.to_ws_event() == {"type": "error", "status": 400, "error": {
        "type": "invalid_request_error", "code": error[0], "message": error[1], "param": error[2]}}


@pytest.mark.parametrize("model", [DROP, ""])
def test_a_body_without_a_model_is_refused_after_its_other_faults(model: Any) -> None:
    def refused(**fields: Any) -> tuple:
        with pytest.raises(ProtocolError) as caught:
            codec.parse_create_body(body(model=model, **fields))
        return caught.value.code, caught.value.message, caught.value.param

    assert refused() == missing("model")
    # Every other check comes first: the metadata's, multi_agent's and context_management's included.
    assert (refused(metadata={"k": 1})[2], refused(multi_agent={})[2], refused(context_management=[])[2]) == (
        "metadata.k", "multi_agent.enabled", "context_management")


ACCEPTED = [
    {"background": False}, {"previous_response_id": "resp_1", "input": DROP}, {"previous_response_id": "resp_1", "input": []},
    {"generate": False, "input": DROP}, {"generate": False, "input": None}, {"metadata": {str(i): "v" for i in range(16)}},
    {"metadata": {"k" * 64: "v" * 512}}, {"conversation": None, "prompt": None, "stream_id": None},
    {"temperature": 0}, {"temperature": 2}, {"temperature": 1.5}, {"top_p": 0}, {"top_p": 1}, {"max_output_tokens": 16},
    {"top_logprobs": 0}, {"top_logprobs": 20}, {"max_tool_calls": 1}, {"tool_choice": "none"}, {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "name": "read_file"}},
    {"tools": [CUSTOM], "tool_choice": {"type": "custom", "name": "apply_patch_grammar"}},
    {"tools": [FUNCTION, MCP], "tool_choice": {"type": "mcp", "server_label": "docs"}},
    {"tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "read_file"}]}},
    {"truncation": "auto"}, {"truncation": "disabled"}, {"service_tier": "flex"}, {"reasoning": {"effort": "xhigh", "summary": "auto"}},
    {"text": {"format": {"type": "json_object"}, "verbosity": "low"}}, {"include": ["reasoning.encrypted_content"]}, {"user": "u"},
    {"safety_identifier": "s" * 64}, {"stream": True, "stream_options": {"include_obfuscation": False}},
]


@pytest.mark.parametrize("fields", ACCEPTED, ids=lambda fields: json.dumps(fields, default=str)[:40])
def test_values_at_the_limits_are_accepted(fields: dict[str, Any]) -> None:
    sent = body(tools=[FUNCTION], **fields) if "tools" not in fields else body(**fields)
    request = codec.parse_create_body(sent)
    assert request.metadata == sent.get("metadata", {})
    assert request.input == (parse_input(sent["input"]) if sent.get("input") is not None else ())
    assert request.tool_choice == sent.get("tool_choice", "auto")


@pytest.mark.parametrize(("tool_type", "choice_type"), [
    ("file_search", "file_search"), ("code_interpreter", "code_interpreter"), ("image_generation", "image_generation"),
    ("web_search", "web_search"), ("web_search_preview", "web_search"), ("web_search", "web_search_preview_2025_03_11"),
    ("computer_use_preview", "computer"), ("computer_use_preview", "computer_use_preview"),
])
def test_a_forced_hosted_tool_matches_a_declared_tool_of_its_family(tool_type: str, choice_type: str) -> None:
    accepted = codec.parse_create_body(body(tools=[FUNCTION, {"type": tool_type}], tool_choice={"type": choice_type}))
    assert accepted.tool_choice == {"type": choice_type}
    with pytest.raises(ProtocolError) as caught:
        codec.parse_create_body(body(tools=[FUNCTION], tool_choice={"type": choice_type}))
    assert (caught.value.code, caught.value.message, caught.value.param) == not_found(choice_type)


def test_the_defaults_of_a_minimal_body_and_of_explicit_nulls() -> None:
    request = codec.parse_create_body({"model": "m", "input": "hi"})
    assert (request.model, request.input, request.instructions, request.tools) == ("m", parse_input("hi"), None, ())
    assert (request.tool_choice, request.parallel_tool_calls, request.previous_response_id) == ("auto", True, None)
    assert (request.store, request.generate, request.max_output_tokens, request.metadata) == (True, True, None, {})  # store: the POST API's
    assert (request.temperature, request.top_p, request.stream, request.stream_id) == (None, None, False, None)
    assert (request.extra_keys, request.include, request.reasoning) == ((), (), None)
    nulls = {key: None for key in ("tools", "tool_choice", "parallel_tool_calls", "store", "stream", "generate", "metadata", "include")}
    assert codec.parse_create_body({"model": "m", "input": "hi", **nulls}) == request


def test_every_field_of_a_full_body_is_kept() -> None:
    hosted = {"type": "web_search"}
    sent = {
        "model": "sim-100", "input": [{"type": "message", "role": "user", "content": "hi"}], "instructions": "be brief",
        "tools": [FUNCTION, hosted], "tool_choice": "required", "parallel_tool_calls": False,
        "previous_response_id": "resp_1", "store": False, "generate": False, "max_output_tokens": 64,
        "metadata": {"k": "v"}, "temperature": 0.5, "top_p": 0.25, "stream": True, "stream_id": "lane-2",
        "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}, "user": "u", "truncation": "auto",
    }
    request = codec.parse_create_body(sent, websocket=True)
    assert request.model == "sim-100" and request.input == parse_input(sent["input"]) and request.instructions == "be brief"
    assert request.tools == (ToolDef("function", "read_file", {"type": "object"}, FUNCTION), ToolDef("web_search", None, None, hosted))
    assert (request.tool_choice, request.parallel_tool_calls, request.previous_response_id) == ("required", False, "resp_1")
    assert (request.store, request.generate, request.max_output_tokens, request.metadata) == (False, False, 64, {"k": "v"})
    assert (request.temperature, request.top_p, request.stream, request.stream_id) == (0.5, 0.25, True, "lane-2")
    assert (request.extra_keys, request.include, request.reasoning) == (("truncation", "user"), ("reasoning.encrypted_content",), {"effort": "low"})
    # Over HTTP the same body without the lane reads the same, with no stream_id.
    assert codec.parse_create_body({key: value for key, value in sent.items() if key != "stream_id"}) == attrs.evolve(request, stream_id=None)


def test_the_frame_openai_agents_sends_is_accepted_with_its_unknown_keys_recorded() -> None:
    # docs/protocol.md: shorthand message, stream: true, an empty include and tools, keys the server does not act on.
    frame = {"type": "response.create", "instructions": "be brief", "model": "gpt-test", "input": [{"content": "hello", "role": "user"}],
             "include": [], "tools": [], "stream": True, "client_metadata": {"x": 1}, "prompt_cache_key": "k"}
    request = codec.decode_client_event(json.dumps(frame)).request
    assert request.input == (Message("user", (("input_text", "hello"),)),)
    assert request.extra_keys == ("client_metadata", "prompt_cache_key")  # `include` is acted on
    assert request.include == () and not request.wants_encrypted_reasoning


@pytest.mark.parametrize(("entries", "threshold"), [
    (None, None),
    ([{"type": "compaction"}], codec.DEFAULT_COMPACT_THRESHOLD),
    ([{"type": "compaction", "compact_threshold": None}], codec.DEFAULT_COMPACT_THRESHOLD),
    ([{"type": "compaction", "compact_threshold": 1000}], 1000),
    ([{"type": "compaction", "compact_threshold": 5000}, {"type": "compaction", "compact_threshold": 2000}, {"type": "compaction"}], 2000),
])
def test_the_compact_threshold_is_the_least_of_the_entries(entries: list[dict[str, Any]] | None, threshold: int | None) -> None:
    """`context_management`: each entry's threshold, the default where it names none; the least wins."""
    assert codec.parse_create_body(body(context_management=entries)).compact_threshold == threshold


@pytest.mark.parametrize(("fields", "subagents", "at_once"), [
    ({}, 0, None),
    ({"metadata": {"testbed_subagents": "2"}}, 0, None),  # without multi_agent: no hosted subagents
    ({"multi_agent": {"enabled": False}, "metadata": {"testbed_subagents": "2"}}, 0, 3),
    ({"multi_agent": {"enabled": True}}, 0, 3),
    ({"multi_agent": {"enabled": True}, "metadata": {"testbed_subagents": "2"}}, 2, 3),
    # max_concurrent_subagents caps how many run at once (the SDK's default 3), not how many run.
    ({"multi_agent": {"enabled": True}, "metadata": {"testbed_subagents": "5"}}, 5, 3),
    ({"multi_agent": {"enabled": True, "max_concurrent_subagents": 8}, "metadata": {"testbed_subagents": "5"}}, 5, 8),
    ({"multi_agent": {"enabled": True, "max_concurrent_subagents": 1}, "metadata": {"testbed_subagents": "5"}}, 5, 1),
    ({"multi_agent": {"enabled": True}, "metadata": {"testbed_subagents": "two"}}, 0, 3),
    ({"multi_agent": {"enabled": True}, "metadata": {"testbed_subagents": "-1"}}, 0, 3),
])
def test_hosted_subagents_are_asked_in_metadata_and_multi_agent_caps_how_many_at_once(fields: dict, subagents: int, at_once: int | None) -> None:
    request = codec.parse_create_body(body(**fields))
    assert request.subagents == subagents
    assert (request.multi_agent.max_concurrent_subagents if request.multi_agent else None) == at_once
    assert request.takes_injected_input is bool(fields.get("multi_agent", {}).get("enabled"))


def test_what_a_request_offers_and_asks_for() -> None:
    request = codec.parse_create_body(body(tools=[{"type": "web_search_preview"}, FUNCTION, {"type": "custom", "name": "patch"}],
                                           include=["reasoning.encrypted_content"]))
    assert [tool.name for tool in request.function_tools] == ["read_file"]
    assert request.offers_hosted("web_search") and request.offers_hosted("web_search_preview")
    assert not request.offers_hosted("file_search") and not request.offers_hosted("web_search_preview_2025")
    assert request.wants_encrypted_reasoning and request.tools[2].name == "patch"
    (tool,) = codec.parse_create_body(body(tools=[{"type": "custom", "name": 5}])).tools  # a name only if it is a string
    assert (tool.type, tool.name, tool.parameters) == ("custom", None, None)
    plain = codec.parse_create_body(body(include=["message.output_text.logprobs"]))
    assert not plain.wants_encrypted_reasoning and plain.function_tools == () and not plain.offers_hosted("web_search")
