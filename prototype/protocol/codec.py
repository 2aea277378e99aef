"""The JSON codec: text in gives a client event or a `ProtocolError`; a server event out gives text.

Sans-IO: no trio, no sockets. A create's unknown top-level fields are refused (`unknown_parameter`), as
the API refuses them; known fields it does not act on are accepted and recorded; `stream` is ignored on
WebSocket; bad input never raises anything but `ProtocolError` (docs/protocol.md, "Errors").

JSON goes through orjson (faster than the standard library on these events, both ways: it is on
every frame's path) with the standard library's `json` as the reference: whatever orjson refuses
(`NaN`, integers beyond 64 bits, non-string keys, lone surrogates, invalid UTF-8) is handed to
`json`, so what is accepted, what is refused and the error text are the standard library's. orjson
reads an integer beyond 64 bits as a float without complaint, so a frame with a run of 19 or more
digits goes to `json` directly. Encoding writes the standard library's JSON values, except that a
non-finite float comes out as `null` rather than the non-JSON `NaN`/`Infinity`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from .errors import (
    EMPTY_INPUT,
    INTEGER_BELOW_MIN_VALUE,
    INVALID_JSON,
    INVALID_VALUE,
    MISSING_REQUIRED_PARAMETER,
    OBJECT_ABOVE_MAX_PROPERTIES,
    STRING_ABOVE_MAX_LENGTH,
    UNKNOWN_EVENT_TYPE,
    UNSUPPORTED_PARAMETER,
    ProtocolError,
    invalid_stream_id,
)
from .events import (
    ClientEvent,
    CreateRequest,
    MultiAgent,
    ResponseAppend,
    ResponseCreate,
    ResponseProcessed,
    ResponseSteer,
    ToolDef,
)
from .inject import DEFAULT_MAX_CONCURRENT_SUBAGENTS, parse_inject
from .items import parse_input
from .rules import (
    check_enums,
    check_function_name,
    check_known_parameters,
    check_ranges,
    check_tool_choice,
    check_tool_type,
    check_unicode,
    invalid_type,
)

STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# 2**63 has 19 digits: shorter integers are exact in orjson, longer ones it reads as floats. A run
# of 19 ASCII digits is found at C speed by mapping every digit to "0" and everything else to a
# space (a regex search for it cost ~1 ms on a 70 KB frame, 40 times orjson's parse).
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19


def _has_long_digit_run(text: str | bytes) -> bool:
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return raw.translate(_DIGITS_AS_ZERO).find(_LONG_DIGIT_RUN) >= 0

# Keys of the POST body we act on; the API's other fields are accepted and ignored (recorded as `extra_keys`),
# any other field is refused (rules.check_known_parameters).
_KNOWN_KEYS = frozenset(
    {
        "type", "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "previous_response_id", "store", "generate", "max_output_tokens", "metadata", "temperature",
        "top_p", "stream", "background", "stream_id", "conversation", "include", "reasoning", "prompt",
        "multi_agent", "context_management",
    }
)
# Metadata limits of the public API: 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_MAX_PAIRS = 16
_METADATA_MAX_KEY = 64
_METADATA_MAX_VALUE = 512


def _type_error(param: str, expected: str) -> ProtocolError:
    return invalid_type(param, expected)


def _optional(body: dict[str, Any], key: str, kinds: tuple[type, ...], expected: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python; a number field must not take true/false.
    if isinstance(value, bool) and bool not in kinds:
        raise _type_error(key, expected)
    if not isinstance(value, kinds):
        raise _type_error(key, expected)
    return value


def _parse_tools(value: Any) -> tuple[ToolDef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _type_error("tools", "an array")
    tools = []
    for i, raw in enumerate(value):
        path = f"tools[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise ProtocolError(INVALID_VALUE, f"Invalid tool at '{path}': expected an object with a 'type'.", param=path)
        check_tool_type(raw["type"], f"{path}.type")
        name = raw.get("name")
        parameters = raw.get("parameters")
        if raw["type"] == "function":
            if name is None:
                raise ProtocolError(MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{path}.name'.", param=f"{path}.name")
            if not isinstance(name, str):
                raise _type_error(f"{path}.name", "a string")
            check_function_name(name, f"{path}.name")
            if parameters is not None and not isinstance(parameters, dict):
                raise _type_error(f"{path}.parameters", "an object (a JSON schema)")
        tools.append(ToolDef(raw["type"], name if isinstance(name, str) else None, parameters, raw))
    return tuple(tools)


def _parse_metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _type_error("metadata", "an object of string values")
    if len(value) > _METADATA_MAX_PAIRS:
        raise ProtocolError(
            OBJECT_ABOVE_MAX_PROPERTIES,
            f"Invalid 'metadata': too many properties. Expected an object with at most {_METADATA_MAX_PAIRS} properties, but got an object with {len(value)} properties instead.",
            param="metadata",
        )
    for key, item in value.items():
        if not isinstance(item, str):
            raise _type_error(f"metadata.{key}", "a string")
        if len(key) > _METADATA_MAX_KEY or len(item) > _METADATA_MAX_VALUE:
            raise ProtocolError(
                STRING_ABOVE_MAX_LENGTH,
                f"Invalid metadata entry {key!r}: keys up to {_METADATA_MAX_KEY} characters, "
                f"string values up to {_METADATA_MAX_VALUE}.",
                param=f"metadata.{key}",
            )
    return dict(value)


def _parse_stream_id(value: Any) -> str | None:
    """A lane name: 1 to 256 characters of letters, digits, `_`, `-` and `.`; the empty string is not
    one (omit the field for the default lane) (WS guide, "Run conversations in parallel")."""
    if value is None:
        return None
    if not isinstance(value, str) or not STREAM_ID_PATTERN.fullmatch(value):
        raise invalid_stream_id()
    return value


# API reference (`context_management[].compact_threshold`): "minimum: 1000".
COMPACT_THRESHOLD_MIN = 1000
# The threshold when an entry names none [ours: the reference leaves it to the server].
DEFAULT_COMPACT_THRESHOLD = 200_000


def _parse_multi_agent(value: Any) -> MultiAgent | None:
    """`{enabled, max_concurrent_subagents}` (openai-python `ResponseCreateMultiAgent`: `enabled`
    required; the reference sets no upper bound on the subagents)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error("multi_agent", "an object")
    if "enabled" not in value:
        raise ProtocolError(MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'multi_agent.enabled'.", param="multi_agent.enabled")
    if not isinstance(value["enabled"], bool):
        raise _type_error("multi_agent.enabled", "a boolean")
    most = value.get("max_concurrent_subagents", DEFAULT_MAX_CONCURRENT_SUBAGENTS)
    if isinstance(most, bool) or not isinstance(most, int):
        raise _type_error("multi_agent.max_concurrent_subagents", "an integer")
    if most < 1:
        raise ProtocolError(
            INTEGER_BELOW_MIN_VALUE, "Invalid 'multi_agent.max_concurrent_subagents': integer below minimum value 1.",
            param="multi_agent.max_concurrent_subagents",
        )
    return MultiAgent(value["enabled"], most)


def _parse_compact_threshold(value: Any) -> int | None:
    """`context_management`: null, or an array of at least one `{"type": "compaction",
    "compact_threshold": N}` with N >= 1000 or null (API reference; "Currently only 'compaction' is
    supported"). Returns the threshold, or None without compaction."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _type_error("context_management", "a non-empty array of objects")
    threshold = None
    for index, entry in enumerate(value):
        param = f"context_management[{index}]"
        if not isinstance(entry, dict):
            raise _type_error(param, "an object")
        if entry.get("type") != "compaction":
            raise ProtocolError(INVALID_VALUE, f"Invalid '{param}.type': only 'compaction' is supported.", param=f"{param}.type")
        given = entry.get("compact_threshold")
        if given is None:
            given = DEFAULT_COMPACT_THRESHOLD
        elif isinstance(given, bool) or not isinstance(given, int):
            raise _type_error(f"{param}.compact_threshold", "an integer")
        elif given < COMPACT_THRESHOLD_MIN:
            raise ProtocolError(
                INTEGER_BELOW_MIN_VALUE, f"Invalid '{param}.compact_threshold': integer below minimum value {COMPACT_THRESHOLD_MIN}.",
                param=f"{param}.compact_threshold",
            )
        threshold = given if threshold is None else min(threshold, given)
    return threshold


def parse_create_body(body: Any, *, websocket: bool = False) -> CreateRequest:
    """Validate a `response.create` / POST body into a `CreateRequest`. `stream_id` is WebSocket
    only (openai-python `ResponsesClientEvent`: not part of POST /v1/responses)."""
    if not isinstance(body, dict):
        raise ProtocolError(INVALID_JSON, "The request body must be a JSON object.")
    check_known_parameters(body, websocket=websocket)
    if body.get("background") is True:
        raise ProtocolError(UNSUPPORTED_PARAMETER, "'background' is not supported in this mode.", param="background")
    for key in ("conversation", "prompt") if websocket else ("stream_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise ProtocolError(UNSUPPORTED_PARAMETER, f"'{key}' is not supported by this server.", param=key)
    stream_id = _parse_stream_id(body.get("stream_id")) if websocket else None
    model = _optional(body, "model", (str,), "a string")
    previous_response_id = _optional(body, "previous_response_id", (str,), "a string")
    generate = _optional(body, "generate", (bool,), "a boolean")
    generate = True if generate is None else generate
    if "input" not in body or body["input"] is None:
        if previous_response_id is None and generate:
            raise ProtocolError(MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", param="input")
        items: tuple = ()
    else:
        items = parse_input(body["input"])
    if not items and previous_response_id is None and generate:
        raise ProtocolError(EMPTY_INPUT, "'input' must not be empty without 'previous_response_id'.", param="input")
    check_ranges(body)  # temperature, top_p, max_output_tokens, max_tool_calls, top_logprobs
    max_output_tokens = body.get("max_output_tokens")
    temperature, top_p = body.get("temperature"), body.get("top_p")
    tools = _parse_tools(body.get("tools"))
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice is not None:
        check_tool_choice(tool_choice, [tool.raw for tool in tools])
    check_enums(body)  # truncation, service_tier, reasoning, text, user, ...
    parallel = _optional(body, "parallel_tool_calls", (bool,), "a boolean")
    store = _optional(body, "store", (bool,), "a boolean")
    stream = _optional(body, "stream", (bool,), "a boolean")
    instructions = _optional(body, "instructions", (str,), "a string")
    include = _optional(body, "include", (list,), "an array of strings")
    if include is not None and not all(isinstance(value, str) for value in include):
        raise _type_error("include", "an array of strings")
    reasoning = _optional(body, "reasoning", (dict,), "an object")
    metadata = _parse_metadata(body.get("metadata"))
    multi_agent = _parse_multi_agent(body.get("multi_agent"))
    compact_threshold = _parse_compact_threshold(body.get("context_management"))
    if not model:
        # The API requires `model` (it could come from a stored `prompt`, which this server does not support);
        # checked last, so a body with other faults is refused for those first.
        raise ProtocolError(MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'model'.", param="model")
    return CreateRequest(
        model=model,
        input=items,
        instructions=instructions,
        tools=tools,
        tool_choice=tool_choice if tool_choice is not None else "auto",
        parallel_tool_calls=True if parallel is None else parallel,
        previous_response_id=previous_response_id,
        store=True if store is None else store,
        generate=generate,
        max_output_tokens=max_output_tokens,
        metadata=metadata,
        temperature=temperature,
        top_p=top_p,
        stream=bool(stream),
        stream_id=stream_id,
        extra_keys=tuple(sorted(key for key in body if key not in _KNOWN_KEYS)),
        include=tuple(include or ()),
        reasoning=reasoning,
        multi_agent=multi_agent,
        compact_threshold=compact_threshold,
    )


def loads_object(text: str | bytes, what: str = "frame") -> dict[str, Any]:
    """Parse one frame or body as a JSON object, or raise `ProtocolError(invalid_json)`; `what`
    names it in the message ("frame" on a WebSocket, "request body" over HTTP)."""
    if _has_long_digit_run(text):
        obj = _loads_reference(text, what)
    else:
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            obj = _loads_reference(text, what)
    if not isinstance(obj, dict):
        raise ProtocolError(INVALID_JSON, f"The {what} must be one JSON object.")
    check_unicode(text, obj)
    return obj


def _loads_reference(text: str | bytes, what: str) -> Any:
    """The standard library's reading of what orjson refused: its value or its error."""
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")  # binary frames are decoded leniently [ours]
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(INVALID_JSON, f"The {what} is not valid JSON: {exc}.") from None
    return obj


def decode_client_event(text: str | bytes) -> ClientEvent:
    """One WebSocket frame in, one client event out, or a `ProtocolError`."""
    obj = loads_object(text)
    event_type = obj.get("type")
    if event_type == "response.create":
        return ResponseCreate(parse_create_body(obj, websocket=True))
    if event_type == "response.append":
        if "input" not in obj:
            raise ProtocolError(MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'input'.", param="input")
        return ResponseAppend(parse_input(obj["input"]))
    if event_type == "response.steer":
        return ResponseSteer(obj)
    if event_type == "response.inject":
        return parse_inject(obj)
    if event_type == "response.processed":
        response_id = obj.get("response_id")
        return ResponseProcessed(response_id if isinstance(response_id, str) else None)
    if event_type is None:
        raise ProtocolError(UNKNOWN_EVENT_TYPE, "Missing event 'type'.", param="type")
    raise ProtocolError(UNKNOWN_EVENT_TYPE, f"Unknown event type {str(event_type)[:64]!r}.", param="type")


def encode(obj: dict[str, Any]) -> str:
    """Compact JSON, as the API sends it (UTF-8 text, non-ASCII characters unescaped)."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # orjson.JSONEncodeError: a non-string key, an integer beyond 64 bits, ...
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def encode_event(event: Any) -> str:
    return encode(event.to_dict())
