"""The request rules of the public Responses API that the codec enforces beyond the fields' types.

Sans-IO. Each rule refuses what the real API refuses, with its status (400), code and param: the
ranges and enums of the API reference for `POST /v1/responses` (openai-python's
`ResponseCreateParams`), and the rules that tie fields together (`tool_choice` must name a tool
that `tools` declares). Codes follow the real API's spelling (`integer_below_min_value`,
`decimal_above_max_value`, `invalid_value`, ...); docs/protocol.md keeps the table.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import (
    DECIMAL_ABOVE_MAX_VALUE,
    DECIMAL_BELOW_MIN_VALUE,
    INTEGER_ABOVE_MAX_VALUE,
    INTEGER_BELOW_MIN_VALUE,
    INVALID_JSON,
    INVALID_TYPE,
    INVALID_VALUE,
    STRING_ABOVE_MAX_LENGTH,
    ProtocolError,
    unknown_parameter,
)

# The API reference's ranges: temperature "between 0 and 2", top_p a probability mass in [0, 1],
# top_logprobs "an integer between 0 and 20"; the API refuses max_output_tokens below 16
# ("integer below minimum value. Expected a value >= 16", seen in vectorize-io/hindsight#58).
DECIMAL_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
INTEGER_MINIMA = {"max_output_tokens": 16, "max_tool_calls": 1, "top_logprobs": 0}
INTEGER_MAXIMA = {"top_logprobs": 20}
# Enumerations of the API reference (ResponseCreateParams and the shared Reasoning type).
ENUMS = {
    "truncation": ("auto", "disabled"),
    "service_tier": ("auto", "default", "flex", "scale", "priority"),
}
NESTED_ENUMS = {
    ("reasoning", "effort"): ("none", "minimal", "low", "medium", "high", "xhigh"),
    ("reasoning", "summary"): ("auto", "concise", "detailed"),
    ("text", "verbosity"): ("low", "medium", "high"),
}
TEXT_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICE_MODES = ("none", "auto", "required")
# The tool types of the API reference (openai-python 3.57 `ToolParam`): any other `tools[i].type` is refused.
TOOL_TYPES = (
    "function", "file_search", "computer", "computer_use_preview", "web_search", "web_search_2025_08_26", "mcp",
    "code_interpreter", "programmatic_tool_calling", "image_generation", "local_shell", "shell", "custom", "namespace",
    "tool_search", "web_search_preview", "web_search_preview_2025_03_11", "apply_patch",
)
# The types a `tool_choice` object may name (openai-python 3.57 `ToolChoice`: `ToolChoiceTypesParam`'s hosted tools,
# function, custom, mcp, shell, apply_patch, programmatic_tool_calling; `allowed_tools` is checked on its own), plus
# `web_search`, which the testbed accepts for the web_search tool it answers (docs/protocol.md).
TOOL_CHOICE_TYPES = (
    "function", "custom", "mcp", "shell", "apply_patch", "programmatic_tool_calling", "file_search", "web_search",
    "web_search_preview", "web_search_preview_2025_03_11", "computer", "computer_use", "computer_use_preview",
    "image_generation", "code_interpreter",
)
# A hosted tool choice matches a declared tool of its family (`web_search_preview` forces a `web_search` tool).
TOOL_FAMILIES = {
    **dict.fromkeys(("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"), "web_search"),
    **dict.fromkeys(("computer", "computer_use", "computer_use_preview"), "computer"),
}
# The top-level fields of a create body: openai-python 3.63's `ResponseCreateParams` (every field of
# `POST /v1/responses`) and its WebSocket `ResponseCreate` event (`type`, `generate`, `stream_id`), plus
# `multi_agent` (the multi-agent guide's field, which that release does not type yet) and
# `client_metadata`, which Codex CLI sends in its WebSocket creates (openai/codex `ResponseCreateWsRequest`) to
# the real API. Any other field is refused as the API refuses it: 400 `unknown_parameter`.
CREATE_PARAMETERS = frozenset({
    "access_programs", "background", "background_options", "context_management", "conversation", "image", "include",
    "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation",
    "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream", "stream_options",
    "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    "multi_agent", "client_metadata",
})
# Over HTTP the testbed also takes `generate: false` (a warm-up, as on WebSocket [ours]); a `stream_id` there is
# known but refused as `unsupported_parameter` (codec.parse_create_body). The WebSocket event adds its `type`.
HTTP_CREATE_PARAMETERS = CREATE_PARAMETERS | {"generate", "stream_id"}
WEBSOCKET_CREATE_PARAMETERS = HTTP_CREATE_PARAMETERS | {"type"}
STRING_FIELDS = ("user", "safety_identifier", "prompt_cache_key")
# The API reference: a safety_identifier is at most 64 characters.
STRING_MAX_LENGTHS = {"safety_identifier": 64}
# Function names: the API reference's pattern for tool names, 64 characters at most.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A lone surrogate can only enter a parsed body through a \uD800-\uDFFF escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def invalid_type(param: str, expected: str) -> ProtocolError:
    return ProtocolError(INVALID_TYPE, f"Invalid type for '{param}': expected {expected}.", param=param)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_known_parameters(body: dict[str, Any], *, websocket: bool) -> None:
    """Refuse the first field (in the body's order) that the API does not define, with the API's
    `unknown_parameter`."""
    known = WEBSOCKET_CREATE_PARAMETERS if websocket else HTTP_CREATE_PARAMETERS
    for key in body:
        if key not in known:
            raise unknown_parameter(str(key))


def check_ranges(body: dict[str, Any]) -> None:
    for key, (low, high) in DECIMAL_RANGES.items():
        value = body.get(key)
        if value is None:
            continue
        if not _number(value) or not math.isfinite(value):
            raise invalid_type(key, "a finite number")
        if value < low:
            raise ProtocolError(DECIMAL_BELOW_MIN_VALUE, f"Invalid '{key}': decimal below minimum value. Expected a value >= {low:g}, but got {value!r} instead.", param=key)
        if value > high:
            raise ProtocolError(DECIMAL_ABOVE_MAX_VALUE, f"Invalid '{key}': decimal above maximum value. Expected a value <= {high:g}, but got {value!r} instead.", param=key)
    for key, low in INTEGER_MINIMA.items():
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise invalid_type(key, "an integer")
        if value < low:
            raise ProtocolError(INTEGER_BELOW_MIN_VALUE, f"Invalid '{key}': integer below minimum value. Expected a value >= {low}, but got {value} instead.", param=key)
        high = INTEGER_MAXIMA.get(key)
        if high is not None and value > high:
            raise ProtocolError(INTEGER_ABOVE_MAX_VALUE, f"Invalid '{key}': integer above maximum value. Expected a value <= {high}, but got {value} instead.", param=key)


def _enum(value: Any, param: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise invalid_type(param, "a string")
    if value not in allowed:
        raise ProtocolError(INVALID_VALUE, f"Invalid value: {value[:64]!r}. Supported values are: {', '.join(repr(a) for a in allowed)}.", param=param)


def check_enums(body: dict[str, Any]) -> None:
    for key, allowed in ENUMS.items():
        if body.get(key) is not None:
            _enum(body[key], key, allowed)
    for parent in ("reasoning", "text"):
        value = body.get(parent)
        if value is not None and not isinstance(value, dict):
            raise invalid_type(parent, "an object")
    for (parent, key), allowed in NESTED_ENUMS.items():
        value = (body.get(parent) or {}).get(key)
        if value is not None:
            _enum(value, f"{parent}.{key}", allowed)
    text_format = (body.get("text") or {}).get("format")
    if text_format is not None:
        if not isinstance(text_format, dict):
            raise invalid_type("text.format", "an object")
        _enum(text_format.get("type"), "text.format.type", TEXT_FORMATS)
    for key in STRING_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise invalid_type(key, "a string")
        limit = STRING_MAX_LENGTHS.get(key)
        if limit is not None and len(value) > limit:
            raise ProtocolError(STRING_ABOVE_MAX_LENGTH, f"Invalid '{key}': string too long. Expected a string with maximum length {limit}, but got a string with length {len(value)} instead.", param=key)
    if body.get("stream_options") is not None and body.get("stream") is not True:
        # Chat Completions' rule, carried over by the Responses API.
        raise ProtocolError(INVALID_VALUE, "The 'stream_options' parameter is only allowed when 'stream' is true.", param="stream_options")


def check_tool_type(kind: str, param: str) -> None:
    _enum(kind, param, TOOL_TYPES)


def check_function_name(name: str, param: str) -> None:
    if not FUNCTION_NAME.match(name):
        raise ProtocolError(INVALID_VALUE, f"Invalid '{param}': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$' of at most 64 characters.", param=param)


def _tool_not_found(name: str) -> ProtocolError:
    # The real API's message; its code is null there, `invalid_value` here [ours].
    return ProtocolError(INVALID_VALUE, f"Tool choice '{name[:64]}' not found in 'tools' parameter.", param="tool_choice")


def _declared(tool_choice: dict[str, Any], tools: list[dict[str, Any]], param: str) -> None:
    """A forced or allowed tool must be one that `tools` declares: a function by name, a hosted
    tool by type or its family's (`web_search` also matches `web_search_preview`), an MCP server by label."""
    kind = tool_choice.get("type")
    _enum(kind, f"{param}.type", TOOL_CHOICE_TYPES)
    if kind in ("function", "custom"):
        name = tool_choice.get("name")
        if not isinstance(name, str):
            raise invalid_type(f"{param}.name", "a string")
        if not any(tool.get("type") == kind and tool.get("name") == name for tool in tools):
            raise _tool_not_found(name)
    elif kind == "mcp":
        label = tool_choice.get("server_label")
        if not any(tool.get("type") == "mcp" and tool.get("server_label") == label for tool in tools):
            raise _tool_not_found(str(label))
    elif not any(TOOL_FAMILIES.get(tool.get("type"), tool.get("type")) == TOOL_FAMILIES.get(kind, kind) for tool in tools):
        raise _tool_not_found(kind)


def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]]) -> None:
    """`tool_choice` is a mode, a tool to force, or `allowed_tools`; a tool it names must exist."""
    if isinstance(tool_choice, str):
        _enum(tool_choice, "tool_choice", TOOL_CHOICE_MODES)
        return
    if not isinstance(tool_choice, dict):
        raise invalid_type("tool_choice", "a string or an object")
    if tool_choice.get("type") == "allowed_tools":
        _enum(tool_choice.get("mode"), "tool_choice.mode", ("auto", "required"))
        allowed = tool_choice.get("tools")
        if not isinstance(allowed, list) or not all(isinstance(entry, dict) for entry in allowed):
            raise invalid_type("tool_choice.tools", "an array of tool objects")
        for i, entry in enumerate(allowed):
            _declared(entry, tools, f"tool_choice.tools[{i}]")
        return
    _declared(tool_choice, tools, "tool_choice")


def check_unicode(text: str | bytes, obj: Any) -> None:
    """Text that is not valid Unicode (a lone surrogate, which JSON can spell as `\\ud800`) is
    refused as invalid JSON, as strict parsers and the real API do. The walk runs only when the raw
    text holds a surrogate escape at all, so ordinary requests pay one regex search."""
    escape = _SURROGATE_ESCAPE if isinstance(text, str) else _SURROGATE_ESCAPE_BYTES
    if escape.search(text) is None:
        return
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ProtocolError(INVALID_JSON, "The request body is not valid JSON: a string holds a lone surrogate (not valid Unicode).") from None
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
