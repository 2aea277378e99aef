"""Conversation items: what goes into a Response's context and what comes out of it.

Shapes follow openai-python `types/responses/response_input_item_param.py` and
`response_output_item.py` (docs/protocol.md, §5.3). `parse_item` turns one JSON object from a
request into an item or raises `ProtocolError(invalid_value)` naming the field path; `to_dict`
gives the wire form back. Item types a client may send that the simulator does not act on
(custom tool calls, reasoning from another server, ...) travel as `OpaqueItem` so real clients are
not refused.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, ClassVar, Union

import attrs

from .errors import INVALID_ENCRYPTED_CONTENT, INVALID_TYPE, INVALID_VALUE, MISSING_REQUIRED_PARAMETER, ProtocolError

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PART_TYPES = ("input_text", "output_text", "text", "refusal")

# Item types real clients send back in full-context mode that we keep and render but never sample
# (openai-python `response_input_item_param.py`; Codex resends reasoning and custom tool items).
OPAQUE_ITEM_TYPES = frozenset(
    {
        "reasoning",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "tool_search_call",
        "tool_search_output",
        "image_generation_call",
        "compaction",
        "item_reference",
    }
)


def _bad(path: str, message: str) -> ProtocolError:
    """The real API's codes: a missing field, a wrong type, or a value out of its set."""
    if message.startswith("Missing required"):
        return ProtocolError(MISSING_REQUIRED_PARAMETER, message, param=path)
    if message.startswith("Invalid type"):
        return ProtocolError(INVALID_TYPE, message, param=path)
    return ProtocolError(INVALID_VALUE, message, param=path)


@attrs.frozen
class Message:
    """A chat message; `content` is a tuple of `(part_type, text)` pairs."""

    role: str
    content: tuple[tuple[str, str], ...]
    id: str | None = None
    status: str | None = None
    type: ClassVar[str] = "message"

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.content)

    def to_dict(self) -> dict[str, Any]:
        parts = []
        for part_type, text in self.content:
            part: dict[str, Any] = {"type": part_type, "text": text}
            if part_type == "output_text":
                part["annotations"] = []
            parts.append(part)
        out: dict[str, Any] = {"type": "message", "role": self.role, "content": parts}
        if self.id is not None:
            out["id"] = self.id
        if self.status is not None:
            out["status"] = self.status
        return out


@attrs.frozen
class FunctionCall:
    """A call the model made to a client-side function tool; `arguments` is a JSON string."""

    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = "completed"
    type: ClassVar[str] = "function_call"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }
        if self.id is not None:
            out["id"] = self.id
        if self.status is not None:
            out["status"] = self.status
        return out


@attrs.frozen
class FunctionCallOutput:
    """The client's answer to one function call."""

    call_id: str
    output: str
    id: str | None = None
    status: str | None = None
    type: ClassVar[str] = "function_call_output"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "function_call_output", "call_id": self.call_id, "output": self.output}
        if self.id is not None:
            out["id"] = self.id
        if self.status is not None:
            out["status"] = self.status
        return out


@attrs.frozen
class WebSearchCall:
    """A hosted web_search call: the server runs it inside the response (no client round trip).

    `result` is the text the hosted service put into the model's context. The public item does not
    carry it (openai-python `response_function_web_search.py`), so it is not on the wire; it is kept
    here so that a context rebuilt from stored items renders the same tokens.
    """

    id: str
    query: str
    status: str = "completed"
    result: str = ""
    type: ClassVar[str] = "web_search_call"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "web_search_call",
            "id": self.id,
            "status": self.status,
            "action": {"type": "search", "query": self.query},
        }


# A reasoning item's `encrypted_content`: opaque to the client, and at least the size of the real API's ciphertext,
# ~1,700 characters an item measured against a gpt-5.x model (LibreChat-AI/agents PR #422, docs/parameters.md §1)
# [src]; longer reasoning makes it longer (base64 of the text, [ours]). Encoded, not encrypted, as vLLM's replay
# blobs are (vllm-project/vllm PR #57323): the simulator only needs it to survive the client's round trip.
ENCRYPTED_CONTENT_PREFIX = "tbr1."
ENCRYPTED_CONTENT_MIN_CHARS = 1700


def encode_reasoning(text: str) -> str:
    """The `encrypted_content` carrying `text`: a length, the UTF-8 text, zero padding up to the minimum size."""
    payload = len(text.encode("utf-8")).to_bytes(4, "big") + text.encode("utf-8")
    room = (ENCRYPTED_CONTENT_MIN_CHARS - len(ENCRYPTED_CONTENT_PREFIX)) * 3 // 4
    payload += bytes(max(0, room - len(payload)))
    return ENCRYPTED_CONTENT_PREFIX + base64.urlsafe_b64encode(payload).decode("ascii")


def decode_reasoning(blob: str) -> str | None:
    """The text an `encrypted_content` of this server carries; None if the blob is not one of ours.
    A blob that is ours by its prefix but damaged raises ValueError (empty reasoning is a valid text)."""
    if not blob.startswith(ENCRYPTED_CONTENT_PREFIX):
        return None
    # Each step's failure is a ValueError: non-ASCII text, bad base64 (binascii.Error), bad UTF-8 (UnicodeError).
    payload = base64.urlsafe_b64decode(blob[len(ENCRYPTED_CONTENT_PREFIX) :].encode("ascii"))
    size = int.from_bytes(payload[:4], "big")
    if len(payload) < 4 + size:
        raise ValueError("the blob is shorter than the text it announces")
    return payload[4 : 4 + size].decode("utf-8")


@attrs.frozen
class Reasoning:
    """A reasoning item: the model's hidden reasoning tokens, sampled before its visible output.

    `text` never goes on the wire. With `include: ["reasoning.encrypted_content"]` the item carries
    `encrypted_content`, which a stateless client sends back so the server can restore the reasoning
    (openai-python `response_reasoning_item.py`); otherwise only its id and an empty summary leave.
    """

    id: str
    text: str
    encrypted_content: str | None = None
    status: str | None = None
    type: ClassVar[str] = "reasoning"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "reasoning", "id": self.id, "summary": []}
        if self.encrypted_content is not None:
            out["encrypted_content"] = self.encrypted_content
        if self.status is not None:
            out["status"] = self.status
        return out

    def exported(self) -> Reasoning:
        """The same item carrying its `encrypted_content`."""
        return attrs.evolve(self, encrypted_content=encode_reasoning(self.text))


@attrs.frozen
class OpaqueItem:
    """An item type the simulator carries and renders but does not interpret."""

    type: str
    data: str  # the item's JSON, canonical (sorted keys), so it renders identically every time

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.data)


# A compaction item's `encrypted_content` carries its summary the way a reasoning item's does, under
# its own prefix (encoded, not encrypted: the simulator only needs it to survive the client's trip).
COMPACTION_PREFIX = "tbc1."


@attrs.frozen
class Compaction:
    """A compaction item (openai-python `ResponseCompactionItem`): the model's summary of the
    context it replaced. `summary` never goes on the wire; `encrypted_content` carries it, so a
    client that sends the item back restores the same context."""

    id: str
    summary: str
    rounds: int = 0  # client tool rounds since the last user message that the summary covers (the policy's turn index)
    offset: int = 0  # items of the conversation the window no longer holds, so call ids go on counting from there
    type: ClassVar[str] = "compaction"

    @property
    def encrypted_content(self) -> str:
        payload = self.rounds.to_bytes(4, "big") + self.offset.to_bytes(4, "big") + self.summary.encode("utf-8")
        return COMPACTION_PREFIX + base64.urlsafe_b64encode(payload).decode("ascii")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "compaction", "id": self.id, "encrypted_content": self.encrypted_content}


def _decode_compaction(blob: str) -> tuple[int, int, str] | None:
    """The rounds, offset and summary a compaction item of this server carries; None if the blob is not one of ours."""
    if not blob.startswith(COMPACTION_PREFIX):
        return None
    try:
        payload = base64.urlsafe_b64decode(blob[len(COMPACTION_PREFIX) :].encode("ascii"))
        return int.from_bytes(payload[:4], "big"), int.from_bytes(payload[4:8], "big"), payload[8:].decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        return None


Item = Union[Message, FunctionCall, FunctionCallOutput, WebSearchCall, Reasoning, OpaqueItem, Compaction]


def _string(obj: dict[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _bad(f"{path}.{key}", f"Missing required field '{key}' in {path}.")
        return None
    if not isinstance(value, str):
        raise _bad(f"{path}.{key}", f"Invalid type for '{path}.{key}': expected a string.")
    return value


def _parse_content(value: Any, path: str, role: str) -> tuple[tuple[str, str], ...]:
    default_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(value, str):
        return ((default_type, value),)
    if not isinstance(value, list):
        raise _bad(path, f"Invalid type for '{path}': expected a string or an array of content parts.")
    parts = []
    for i, part in enumerate(value):
        part_path = f"{path}[{i}]"
        if not isinstance(part, dict):
            raise _bad(part_path, f"Invalid type for '{part_path}': expected an object.")
        part_type = part.get("type")
        if part_type not in TEXT_PART_TYPES:
            raise _bad(
                f"{part_path}.type",
                f"Unsupported content part type {part_type!r} at '{part_path}': the simulator takes text parts only.",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise _bad(f"{part_path}.text", f"Invalid type for '{part_path}.text': expected a string.")
        parts.append((part_type, text))
    return tuple(parts)


def _parse_output(value: Any, path: str) -> str:
    """A function_call_output's `output`: a string, or content parts joined as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(text for _, text in _parse_content(value, path, "user"))
    raise _bad(path, f"Invalid type for '{path}': expected a string or an array of content parts.")


def parse_item(obj: Any, path: str = "input[0]") -> Item:
    """Parse one input item; raise `ProtocolError(invalid_value)` with the field path when malformed."""
    if not isinstance(obj, dict):
        raise _bad(path, f"Invalid type for '{path}': expected an object.")
    item_type = obj.get("type")
    if item_type is None and "role" in obj:
        item_type = "message"  # the shorthand openai-agents sends: {"role": ..., "content": ...}
    if item_type == "message":
        role = _string(obj, "role", path)
        if role not in MESSAGE_ROLES:
            raise _bad(f"{path}.role", f"Invalid value for '{path}.role': {role!r}; expected one of {MESSAGE_ROLES}.")
        if "content" not in obj:
            raise _bad(f"{path}.content", f"Missing required field 'content' in {path}.")
        content = _parse_content(obj["content"], f"{path}.content", role)
        return Message(role, content, id=_string(obj, "id", path, required=False), status=_string(obj, "status", path, required=False))
    if item_type == "function_call":
        arguments = _string(obj, "arguments", path)
        return FunctionCall(
            call_id=_string(obj, "call_id", path),
            name=_string(obj, "name", path),
            arguments=arguments,
            id=_string(obj, "id", path, required=False),
            status=_string(obj, "status", path, required=False),
        )
    if item_type == "function_call_output":
        if obj.get("call_id") is None and isinstance(obj.get("name"), str):
            # Codex's goal feature sends named outputs that answer no call ({"name": "goal_objective",
            # "namespace": "agent", ...}): carried as context, never matched to a pending call.
            return OpaqueItem(item_type, json.dumps(obj, sort_keys=True, separators=(",", ":")))
        if "output" not in obj:
            raise _bad(f"{path}.output", f"Missing required field 'output' in {path}.")
        return FunctionCallOutput(
            call_id=_string(obj, "call_id", path),
            output=_parse_output(obj["output"], f"{path}.output"),
            id=_string(obj, "id", path, required=False),
            status=_string(obj, "status", path, required=False),
        )
    if item_type == "web_search_call":
        action = obj.get("action") if isinstance(obj.get("action"), dict) else {}
        query = action.get("query", "")
        return WebSearchCall(
            id=_string(obj, "id", path),
            query=query if isinstance(query, str) else "",
            status=_string(obj, "status", path, required=False) or "completed",
        )
    if item_type == "reasoning" and isinstance(obj.get("encrypted_content"), str):
        try:
            text = decode_reasoning(obj["encrypted_content"])
        except ValueError:
            item_id = obj.get("id") if isinstance(obj.get("id"), str) else "?"
            # The real API's answer to a blob it cannot read (code and wording: docs/protocol.md).
            raise ProtocolError(
                INVALID_ENCRYPTED_CONTENT, f"The encrypted content for item {item_id} could not be verified.",
                param=f"{path}.encrypted_content",
            ) from None
        if text is not None:
            return Reasoning(
                id=_string(obj, "id", path) or "", text=text, encrypted_content=obj["encrypted_content"],
                status=_string(obj, "status", path, required=False),
            )
        # Another server's blob: carried and rendered as sent, not interpreted.
    if item_type == "compaction" and isinstance(obj.get("encrypted_content"), str):
        decoded = _decode_compaction(obj["encrypted_content"])
        if decoded is not None:
            rounds, offset, summary = decoded
            return Compaction(id=_string(obj, "id", path, required=False) or "", summary=summary, rounds=rounds, offset=offset)
        # Another server's compaction: carried and rendered as sent, not interpreted.
    if isinstance(item_type, str) and item_type in OPAQUE_ITEM_TYPES:
        return OpaqueItem(item_type, json.dumps(obj, sort_keys=True, separators=(",", ":")))
    if item_type is None:
        raise _bad(f"{path}.type", f"Missing required field 'type' in {path}.")
    raise _bad(f"{path}.type", f"Invalid value for '{path}.type': unknown item type {item_type!r}.")


def parse_input(value: Any, path: str = "input") -> tuple[Item, ...]:
    """A request's `input`: a string is one user message; an array is parsed item by item."""
    if isinstance(value, str):
        return (Message("user", (("input_text", value),)),)
    if not isinstance(value, list):
        raise _bad(path, f"Invalid type for '{path}': expected a string or an array of items.")
    return tuple(parse_item(obj, f"{path}[{i}]") for i, obj in enumerate(value))
