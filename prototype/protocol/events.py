"""Client and server events of the Responses API, as plain values.

Client events are what a peer sends over WebSocket (docs/protocol.md); server events are what the
server streams, identical over WebSocket and SSE (openai-python
`types/responses/responses_server_event.py`; docs/protocol.md). A server event's `to_dict` is exactly
the JSON object on the wire. Lifecycle events carry a snapshot of the Response taken when they were
emitted, as a dict, because the Response keeps changing after them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Union

import attrs

from .items import Item

# --- client events -------------------------------------------------------------------------------


@attrs.frozen
class ToolDef:
    """A tool offered in a request. Function tools have a name and a JSON schema; hosted tools
    (`web_search`, ...) only a type. `raw` is the tool exactly as sent, echoed back in the Response."""

    type: str
    name: str | None
    parameters: dict[str, Any] | None
    raw: dict[str, Any] = attrs.field(eq=False, hash=False)


# openai-python 3.63.0 `ResponseCreateMultiAgent.max_concurrent_subagents`: "The default is `3`".
DEFAULT_MAX_CONCURRENT_SUBAGENTS = 3


@attrs.frozen
class MultiAgent:
    """`multi_agent` as sent, validated (openai-python `ResponseCreateMultiAgent`)."""

    enabled: bool
    max_concurrent_subagents: int = DEFAULT_MAX_CONCURRENT_SUBAGENTS

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "max_concurrent_subagents": self.max_concurrent_subagents}


@attrs.frozen
class CreateRequest:
    """The body of `response.create` (WebSocket) or `POST /v1/responses` (HTTP), validated."""

    model: str
    input: tuple[Item, ...]
    instructions: str | None = None
    tools: tuple[ToolDef, ...] = ()
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True  # the public POST API's default (Responses API reference)
    generate: bool = True
    max_output_tokens: int | None = None
    metadata: dict[str, str] = attrs.field(factory=dict, eq=False, hash=False)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False  # only meaningful over HTTP; ignored on WebSocket (docs/protocol.md)
    stream_id: str | None = None  # WebSocket only: the lane (openai-python `ResponsesClientEvent`)
    extra_keys: tuple[str, ...] = ()  # accepted and ignored keys, recorded for the timing records
    include: tuple[str, ...] = ()  # e.g. "reasoning.encrypted_content": reasoning items carry their blob
    reasoning: dict[str, Any] | None = attrs.field(default=None, eq=False, hash=False)  # echoed; effort is not modeled
    # `multi_agent` (openai-python `ResponseCreateMultiAgent`): enabled, the response waits at a
    # client function call for `response.inject` instead of ending there (protocol/inject.py).
    multi_agent: MultiAgent | None = None
    # `context_management: [{"type": "compaction", "compact_threshold": N}]`: the context is
    # compacted when it crosses N tokens (api/compaction.py).
    compact_threshold: int | None = None

    @property
    def takes_injected_input(self) -> bool:
        return self.multi_agent is not None and self.multi_agent.enabled

    @property
    def subagents(self) -> int:
        """Hosted subagents the simulated root runs in all: `metadata.testbed_subagents`; 0 without
        multi_agent [ours]. `multi_agent.max_concurrent_subagents` caps how many run at once, not this."""
        if not self.takes_injected_input:
            return 0
        asked = self.metadata.get("testbed_subagents", "0")
        return int(asked) if asked.isdigit() else 0

    @property
    def wants_encrypted_reasoning(self) -> bool:
        return "reasoning.encrypted_content" in self.include

    @property
    def function_tools(self) -> tuple[ToolDef, ...]:
        return tuple(tool for tool in self.tools if tool.type == "function")

    def offers_hosted(self, tool_type: str) -> bool:
        return any(tool.type.startswith(tool_type) for tool in self.tools)


@attrs.frozen
class ResponseCreate:
    """`{"type": "response.create", ...body}`: flat, no wrapper (WS events ref)."""

    request: CreateRequest
    type: ClassVar[str] = "response.create"


@attrs.frozen
class ResponseAppend:
    """v1 only: `{"type": "response.append", "input": [...]}` resumes the suspended response (Codex
    `ResponseAppendWsRequest`)."""

    input: tuple[Item, ...]
    type: ClassVar[str] = "response.append"


@attrs.frozen
class ResponseSteer:
    """`response.steer` (openai-python `response_steer_event.py`): the frame as sent, validated by
    the steering book (protocol/steering.py), which returns bad input in `response.steer.failed`."""

    frame: dict[str, Any] = attrs.field(eq=False, hash=False)
    type: ClassVar[str] = "response.steer"

    @property
    def previous_response_id(self) -> str | None:
        value = self.frame.get("previous_response_id")
        return value if isinstance(value, str) else None


@attrs.frozen
class ResponseProcessed:
    """Codex's optional post-turn acknowledgement; ignored (docs/protocol.md)."""

    response_id: str | None
    type: ClassVar[str] = "response.processed"


ClientEvent = Union[ResponseCreate, ResponseAppend, ResponseSteer, ResponseProcessed]

# --- server events -------------------------------------------------------------------------------


class _ServerEvent:
    """`to_dict` is `type`, then the attrs fields in order, then the constant `_EXTRA` fields."""

    type: ClassVar[str] = ""
    _EXTRA: ClassVar[dict[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for field in attrs.fields(type(self)):
            out[field.name] = getattr(self, field.name)
        out.update(self._EXTRA)
        return out


@attrs.frozen
class _ResponseSnapshotEvent(_ServerEvent):
    sequence_number: int
    response: dict[str, Any]


class ResponseCreated(_ResponseSnapshotEvent):
    type = "response.created"


class ResponseInProgress(_ResponseSnapshotEvent):
    type = "response.in_progress"


class ResponseDone(_ResponseSnapshotEvent):
    """v1's pause signal: the rollout waits for `response.append` (docs/protocol.md)."""

    type = "response.done"


class ResponseCompleted(_ResponseSnapshotEvent):
    type = "response.completed"


class ResponseFailed(_ResponseSnapshotEvent):
    type = "response.failed"


class ResponseIncomplete(_ResponseSnapshotEvent):
    type = "response.incomplete"


class ResponseCancelled(_ResponseSnapshotEvent):
    """The terminal of a response ended by `POST /v1/responses/{id}/cancel` (status `cancelled`).
    The streaming reference names no such event; the name is the reference's webhook event for a
    cancelled response (docs/protocol.md, "Cancel")."""

    type = "response.cancelled"


TERMINAL_TYPES = frozenset({ResponseCompleted.type, ResponseFailed.type, ResponseIncomplete.type, ResponseCancelled.type})


@attrs.frozen
class _OutputItemEvent(_ServerEvent):
    sequence_number: int
    output_index: int
    item: dict[str, Any]


class OutputItemAdded(_OutputItemEvent):
    type = "response.output_item.added"


class OutputItemDone(_OutputItemEvent):
    type = "response.output_item.done"


@attrs.frozen
class _ContentPartEvent(_ServerEvent):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: dict[str, Any]


class ContentPartAdded(_ContentPartEvent):
    type = "response.content_part.added"


class ContentPartDone(_ContentPartEvent):
    type = "response.content_part.done"


@attrs.frozen
class OutputTextDelta(_ServerEvent):
    """One streamed chunk of text: the tokens sampled since the last flush."""

    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    type: ClassVar[str] = "response.output_text.delta"

    def to_dict(self) -> dict[str, Any]:  # the hottest event: spelled out, no field walk
        return {
            "type": self.type,
            "sequence_number": self.sequence_number,
            "item_id": self.item_id,
            "output_index": self.output_index,
            "content_index": self.content_index,
            "delta": self.delta,
            "logprobs": [],
        }


@attrs.frozen
class OutputTextDone(_ServerEvent):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    type: ClassVar[str] = "response.output_text.done"
    _EXTRA: ClassVar[dict[str, Any]] = {"logprobs": []}


@attrs.frozen
class FunctionCallArgumentsDelta(_ServerEvent):
    sequence_number: int
    item_id: str
    output_index: int
    delta: str
    type: ClassVar[str] = "response.function_call_arguments.delta"


@attrs.frozen
class FunctionCallArgumentsDone(_ServerEvent):
    """No `name` here: clients read it from the item (openai-python
    `response_function_call_arguments_done_event.py`)."""

    sequence_number: int
    item_id: str
    output_index: int
    arguments: str
    type: ClassVar[str] = "response.function_call_arguments.done"


@attrs.frozen
class _WebSearchProgress(_ServerEvent):
    sequence_number: int
    item_id: str
    output_index: int


class WebSearchInProgress(_WebSearchProgress):
    type = "response.web_search_call.in_progress"


class WebSearchSearching(_WebSearchProgress):
    type = "response.web_search_call.searching"


class WebSearchCompleted(_WebSearchProgress):
    type = "response.web_search_call.completed"


@attrs.frozen
class SteerAccepted(_ServerEvent):
    """The server owns the input; the successor's `response.created` is the commit point
    (openai-python `response_steer_accepted_event.py`). `steer`: `{id, previous_response_id}`."""

    sequence_number: int
    steer: dict[str, Any]
    type: ClassVar[str] = "response.steer.accepted"


@attrs.frozen
class SteerPending(_ServerEvent):
    """After `response.completed` of a response waiting for client tool output: the input stays
    queued until the client's explicit continuation (openai-python `response_steer_pending_event.py`)."""

    sequence_number: int
    reason: str
    required_input: list[dict[str, Any]]
    steer: dict[str, Any]
    type: ClassVar[str] = "response.steer.pending"


@attrs.frozen
class SteerFailed(_ServerEvent):
    """Input refused or not committed, returned as sent; `steer.id` only once one was allocated
    (openai-python `response_steer_failed_event.py`)."""

    sequence_number: int
    steer: dict[str, Any]
    error: dict[str, Any]
    type: ClassVar[str] = "response.steer.failed"


@attrs.frozen
class CompactionCompacting(_ServerEvent):
    """The model samples a compaction item's summary; the event carries none of it (openai-python
    `ResponseCompactionCompactingEvent`)."""

    sequence_number: int
    item_id: str
    output_index: int
    type: ClassVar[str] = "response.compaction.compacting"


@attrs.frozen
class InjectCreated(_ServerEvent):
    """Every injected item was validated and committed to the active response (openai-python
    `BetaResponseInjectCreatedEvent`); numbered in that response's sequence."""

    sequence_number: int
    response_id: str
    type: ClassVar[str] = "response.inject.created"


@attrs.frozen
class InjectFailed(_ServerEvent):
    """Nothing was committed; the raw input comes back for a new `response.create` (openai-python
    `BetaResponseInjectFailedEvent`). `error`: `{code, message}`."""

    sequence_number: int
    response_id: str
    input: list[Any]
    error: dict[str, Any]
    type: ClassVar[str] = "response.inject.failed"


ServerEvent = Union[
    ResponseCreated,
    ResponseInProgress,
    ResponseDone,
    ResponseCompleted,
    ResponseFailed,
    ResponseIncomplete,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    OutputTextDelta,
    OutputTextDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    WebSearchInProgress,
    WebSearchSearching,
    WebSearchCompleted,
    SteerAccepted,
    SteerPending,
    SteerFailed,
    CompactionCompacting,
    InjectCreated,
    InjectFailed,
]
