"""`response.inject`: client tool outputs committed to an active response, sans-IO.

The public sources (openai-python 3.63.0 `types/beta/beta_response_inject_*.py`; the multi-agent guide,
developers.openai.com/api/docs/guides/responses-multi-agent, "Inject tool outputs over WebSocket")
define the frame and its two answers: the input items are validated and committed atomically,
`response.inject.created` if they were, else `response.inject.failed` carrying the raw input back
and an error whose code is one of the two its type allows (`BetaResponseInjectFailedEvent.Error.code`):
`response_already_completed` (the client then sends the input in a new `response.create` continuing
the completed response) or `response_not_found`. A frame that does not match the event's schema
gets a generic 400 error and the connection closes.

This book decides which answer each injection gets and when a waiting response resumes; the session
(server/websocket.py) sends the events and wakes the response; nothing here knows about sockets or
time. Where the sources are silent the choices are ours (docs/protocol.md, "Inject"):

* a response takes injected input when it was created with `multi_agent.enabled`; it is open from
  its `response.created` to its terminal event, and its outputs are accepted while it generates
  (for any call it has streamed) as well as while it waits at its tool call point;
* items the response cannot take (an item other than a `function_call_output`, the type's
  description: "Currently, the server accepts client-owned tool outputs that resume a waiting agent";
  an output that answers no streamed call of the response, or one already answered) are not a
  reason `response.inject.failed` can carry: they are refused as the API refuses the same items in
  a `response.create`, with an `error` event (`ProtocolError`: 400 `invalid_request_error`, the
  API's message and param for an output whose call it cannot find; the code is ours, the API sends
  `code: null`), and the connection keeps serving;
* a response that ended is `response_already_completed` whatever its status; the book remembers the
  last `ENDED_KEPT` ended responses, an older or unknown id (and an active response that does not
  take injected input) is `response_not_found`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import attrs

from .errors import INVALID_FUNCTION_CALL_OUTPUT, INVALID_VALUE, RESPONSE_ALREADY_COMPLETED, RESPONSE_NOT_FOUND, ProtocolError
from .events import DEFAULT_MAX_CONCURRENT_SUBAGENTS
from .items import FunctionCallOutput, Item, parse_input

# The beta the multi-agent guide names for inject and `multi_agent`: sent as `OpenAI-Beta` on the
# WebSocket handshake (openai-python's connector "doesn't yet accept betas").
BETA_MULTI_AGENT = "responses_multi_agent=v1"
ENDED_KEPT = 256  # ended responses remembered per connection, for `response_already_completed` [ours]

_INJECT_KEYS = frozenset({"type", "response_id", "input"})


class MalformedInject(ProtocolError):
    """A `response.inject` that does not match the event's schema: a 400 error, then the connection
    closes (multi-agent guide)."""


@attrs.frozen
class ResponseInject:
    """`{"type": "response.inject", "response_id": ..., "input": [...]}` (openai-python
    `BetaResponseInjectEvent`): `raw_input` as sent (returned in `response.inject.failed`)."""

    response_id: str
    raw_input: list[Any] = attrs.field(eq=False, hash=False)
    type: str = "response.inject"


def parse_inject(frame: dict[str, Any]) -> ResponseInject:
    """The frame's schema: `response_id` a string, `input` a non-empty array of input items."""
    extra = sorted(set(frame) - _INJECT_KEYS)
    if extra:
        raise MalformedInject("unknown_parameter", f"Unknown parameter: '{extra[0][:64]}'.", param=extra[0][:64])
    response_id = frame.get("response_id")
    if not isinstance(response_id, str) or not response_id:
        raise MalformedInject("missing_required_parameter", "response.inject needs 'response_id', a string.", param="response_id")
    raw = frame.get("input")
    if not isinstance(raw, list) or not raw:
        raise MalformedInject("missing_required_parameter", "response.inject needs 'input', a non-empty array of items.", param="input")
    try:
        parse_input(raw)
    except ProtocolError as error:
        raise MalformedInject(error.code, error.message, param=error.param) from None
    return ResponseInject(response_id, raw)


@attrs.frozen
class InjectRefused:
    """`response.inject.failed`: the code (`response_already_completed` or `response_not_found`, the two its
    type allows) and message of its error."""

    code: str
    message: str


@attrs.frozen
class InjectCommitted:
    """`response.inject.created`; `resumes`: the agents of the response that were waiting and whose
    calls are now all answered, so the session wakes them."""

    resumes: tuple[str, ...]


ROOT = "root"  # the response's own agent; hosted subagents wait under their own names


@attrs.define(eq=False)
class Target:
    """A response that takes injected input: the outputs committed so far, by call id, and, for
    each of its agents waiting at its tool call point, the calls it waits for."""

    answers: dict[str, Item] = attrs.Factory(dict)
    consumed: set[str] = attrs.Factory(set)  # calls whose outputs an agent already took
    waiting: dict[str, tuple[str, ...]] = attrs.Factory(dict)


@attrs.define(eq=False)
class InjectBook:
    """The injection targets of one connection."""

    targets: dict[str, Target] = attrs.Factory(dict)
    ended: OrderedDict[str, None] = attrs.Factory(OrderedDict)
    active: set[str] = attrs.Factory(set)  # every response between its created and terminal events

    def opened(self, response_id: str, *, takes_input: bool) -> None:
        self.active.add(response_id)
        if takes_input:
            self.targets[response_id] = Target()

    def closed(self, response_id: str) -> None:
        """The response's terminal event went out: later injections are `response_already_completed`."""
        self.active.discard(response_id)
        self.targets.pop(response_id, None)
        self.ended[response_id] = None
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def submit(self, inject: ResponseInject, streamed_calls: Sequence[str]) -> InjectCommitted | InjectRefused:
        """Commit all of `inject`'s items or none. `streamed_calls`: the call ids of the function
        calls the response has streamed so far. Raises `ProtocolError` for items the response cannot
        take (an `error` event, not `response.inject.failed`: see the module docstring)."""
        response_id = inject.response_id
        target = self.targets.get(response_id)
        if target is None:
            if response_id in self.ended:
                return InjectRefused(RESPONSE_ALREADY_COMPLETED, f"Response '{response_id}' has already completed.")
            if response_id in self.active:
                return InjectRefused(RESPONSE_NOT_FOUND, f"Response '{response_id}' does not take injected input: create it with multi_agent enabled.")
            return InjectRefused(RESPONSE_NOT_FOUND, f"Response '{response_id}' not found.")
        items = parse_input(inject.raw_input)
        streamed = set(streamed_calls)
        seen: set[str] = set()
        for index, item in enumerate(items):
            if not isinstance(item, FunctionCallOutput):
                raise ProtocolError(INVALID_VALUE, f"Invalid value: {item.type!r}. Supported values are: 'function_call_output'.",
                                    param=f"input[{index}].type")
            call_id = item.call_id
            if call_id not in streamed:
                # The API's message and param for an output whose call it cannot find (api/checks.py).
                raise ProtocolError(INVALID_FUNCTION_CALL_OUTPUT, f"No tool call found for function call output with call_id {call_id}.",
                                    param="input")
            if call_id in seen or call_id in target.answers or call_id in target.consumed:
                raise ProtocolError(INVALID_FUNCTION_CALL_OUTPUT, f"function_call_output for call_id '{call_id}' answered twice.",
                                    param=f"input[{index}]")
            seen.add(call_id)
        for item in items:
            target.answers[item.call_id] = item
        return InjectCommitted(resumes=tuple(agent for agent in target.waiting if self.answered(response_id, agent) is not None))

    def wait_for(self, response_id: str, call_ids: Sequence[str], agent: str = ROOT) -> None:
        """An agent of the response reached its tool call point and waits for these calls' outputs."""
        self.targets[response_id].waiting[agent] = tuple(call_ids)

    def answered(self, response_id: str, agent: str = ROOT) -> list[Item] | None:
        """The outputs the waiting agent resumes with, in its calls' order, once all are in."""
        target = self.targets.get(response_id)
        calls = None if target is None else target.waiting.get(agent)
        if calls is None or any(call_id not in target.answers for call_id in calls):
            return None
        return [target.answers[call_id] for call_id in calls]

    def resume(self, response_id: str, agent: str = ROOT) -> list[Item]:
        """Take the outputs: the agent resumes sampling and generates again."""
        items = self.answered(response_id, agent)
        assert items is not None
        target = self.targets[response_id]
        for call_id in target.waiting.pop(agent):
            target.consumed.add(call_id)
            del target.answers[call_id]
        return items


__all__ = [
    "BETA_MULTI_AGENT", "DEFAULT_MAX_CONCURRENT_SUBAGENTS", "InjectBook", "InjectCommitted", "InjectRefused",
    "MalformedInject", "ROOT", "ResponseInject", "Target", "parse_inject",
]
