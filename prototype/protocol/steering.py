"""Steering: `response.steer` submissions and their lifecycle on one connection, sans-IO.

The public reference (openai-python `types/responses/response_steer_*.py`; the steering guide,
developers.openai.com/api/docs/guides/steering) defines the events; this module decides, for each
submission, which one the server sends next. A submission moves through

    accepted --(the target stops at a safe boundary, or ends)--> committed   (the successor's
                                                                               response.created)
    accepted --(the target completes waiting for client tool output)--> pending --(the client's
             explicit response.create for that parent, on its lane)--> committed
    accepted | pending --(no successor can carry it)--> failed

and is refused at once (failed, no id) when its input is invalid, its target is unknown, no longer
running, or already has too many submissions queued. The session (server/websocket/) drives the
book and sends the events; nothing here knows about sockets or time.

Where the sources are silent the choices are ours (docs/protocol.md, Steering):
* a submission is accepted only while its target response is running (after `response.created`,
  before its terminal event); after `response.completed` it is `response_already_completed`, after
  `response.incomplete` or `response.failed` it is `response_not_active`;
* at most `MAX_QUEUED_STEERS` uncommitted submissions per target (`too_many_pending_steers`);
* queued submissions of a target that fails, or whose lane moves on to another parent, fail with
  `response_not_active`; a successor that cannot be created fails them with
  `successor_creation_failed`;
* the book keeps the two most recent responses of each lane (the running one and its parent); an
  older id is `response_not_found`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from .items import Item, parse_input

# Error codes of `response.steer.failed` (openai-python `response_steer_error_code.py`).
RESPONSE_NOT_FOUND = "response_not_found"
INVALID_INPUT = "invalid_input"
STEERING_NOT_SUPPORTED = "steering_not_supported"
TOO_MANY_PENDING_STEERS = "too_many_pending_steers"
RESPONSE_ALREADY_COMPLETED = "response_already_completed"
RESPONSE_NOT_ACTIVE = "response_not_active"
SUCCESSOR_CREATION_FAILED = "successor_creation_failed"

# `response.steer.pending` reason (openai-python `response_steer_pending_reason.py`).
WAITING_FOR_REQUIRED_INPUT = "waiting_for_required_input"

MAX_QUEUED_STEERS = 8  # uncommitted submissions per target response [ours]
RESPONSES_KEPT_PER_LANE = 2  # the running response and its parent [ours]

# Submission states.
ACCEPTED = "accepted"
PENDING = "pending"
COMMITTED = "committed"
FAILED = "failed"

# Target states.
RUNNING = "running"
COMPLETED = "completed"  # ended completed; may be waiting for client tool output
ENDED = "ended"  # incomplete or failed: no longer accepting steering input

_STEER_KEYS = frozenset({"type", "previous_response_id", "input"})
_MESSAGE_KEYS = frozenset({"type", "role", "content"})
_CONTENT_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


@attrs.define(eq=False)
class Submission:
    """One `response.steer`: its id (None until accepted), target, the input as sent (returned
    unchanged in `response.steer.failed`) and as items (what a successor receives)."""

    previous_response_id: str
    input: Any
    items: tuple[Item, ...] = ()
    id: str | None = None
    state: str = ACCEPTED
    notified_pending: bool = False


@attrs.frozen
class Refusal:
    """A steer failed before or after acceptance: the `response.steer.failed` to send."""

    submission: Submission
    code: str
    message: str


@attrs.define(eq=False)
class Target:
    response_id: str
    lane: str | None
    state: str = RUNNING
    required_input: tuple[dict[str, Any], ...] = ()  # stubs of the client calls it waits for
    queue: list[Submission] = attrs.Factory(list)  # uncommitted submissions, in submission order


@attrs.frozen
class Ended:
    """What a target's end means for its queued submissions: a successor carrying `successor` (in
    submission order), `pending` notices to send, or `refused` submissions."""

    successor: tuple[Submission, ...] = ()
    pending: tuple[Submission, ...] = ()
    refused: tuple[Refusal, ...] = ()


def validate_steer(frame: dict[str, Any]) -> tuple[str, tuple[Item, ...]]:
    """The target id and input items of a `response.steer` frame, or ValueError with the reason.

    The event takes only `type`, `previous_response_id` and `input`; input is a string or a
    non-empty array of user messages whose content is a string or input_text/input_image/input_file
    parts (openai-python `response_steer_event.py`)."""
    extra = sorted(set(frame) - _STEER_KEYS)
    if extra:
        raise ValueError(f"response.steer accepts only type, previous_response_id and input; got '{extra[0]}'.")
    previous = frame.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        raise ValueError("response.steer needs 'previous_response_id', a response id.")
    value = frame.get("input")
    if isinstance(value, str):
        if not value:
            raise ValueError("'input' must not be empty.")
        return previous, parse_input(value)
    if not isinstance(value, list) or not value:
        raise ValueError("'input' must be a string or a non-empty array of user messages.")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or set(message) - _MESSAGE_KEYS:
            raise ValueError(f"input[{i}]: a message may carry only type, role and content.")
        if message.get("type", "message") != "message" or message.get("role") != "user":
            raise ValueError(f"input[{i}]: steering accepts only messages with the user role.")
        content = message.get("content")
        if isinstance(content, list):
            if not content or any(not isinstance(p, dict) or p.get("type") not in _CONTENT_PART_TYPES for p in content):
                raise ValueError(f"input[{i}].content: parts must be input_text, input_image or input_file.")
        elif not isinstance(content, str):
            raise ValueError(f"input[{i}].content: expected a string or an array of parts.")
    try:
        items = parse_input(value)
    except Exception as exc:  # ProtocolError from the item parser: the same reason, as invalid_input
        raise ValueError(str(exc)) from None
    return previous, items


def required_input_stubs(output: Sequence[Item]) -> tuple[dict[str, Any], ...]:
    """`required_input` stubs for a response's client function calls (openai-python
    `response_steer_required_input.py`: identifying fields only)."""
    return tuple(
        {"type": "function_call_output", "call_id": item.call_id, "name": item.name}
        for item in output
        if getattr(item, "type", None) == "function_call"
    )


@attrs.define(eq=False)
class SteeringBook:
    """The steering state of one connection."""

    max_queued: int = MAX_QUEUED_STEERS
    targets: dict[str, Target] = attrs.Factory(dict)
    lanes: dict[str | None, list[str]] = attrs.Factory(dict)  # recent response ids per lane, oldest first
    _serials: Any = attrs.Factory(lambda: itertools.count(1))

    # --- the client's submission -------------------------------------------------------------

    def submit(self, frame: dict[str, Any], *, supported: bool = True) -> Submission | Refusal:
        """Accept a `response.steer` (the caller sends `response.steer.accepted`) or refuse it."""
        raw_previous = frame.get("previous_response_id")
        submission = Submission(raw_previous if isinstance(raw_previous, str) else "", frame.get("input"))
        if not supported:
            return Refusal(submission, STEERING_NOT_SUPPORTED, "Steering is not supported by this protocol version.")
        try:
            previous, items = validate_steer(frame)
        except ValueError as exc:
            return Refusal(submission, INVALID_INPUT, str(exc))
        submission.items = items
        target = self.targets.get(previous)
        if target is None:
            return Refusal(submission, RESPONSE_NOT_FOUND, f"Response '{previous}' is not available on this connection.")
        if target.state == COMPLETED:
            return Refusal(submission, RESPONSE_ALREADY_COMPLETED, f"Response '{previous}' has completed.")
        if target.state == ENDED:
            return Refusal(submission, RESPONSE_NOT_ACTIVE, f"Response '{previous}' is no longer accepting steering input.")
        if len(target.queue) >= self.max_queued:
            return Refusal(submission, TOO_MANY_PENDING_STEERS, f"More than {self.max_queued} steering submissions are queued for '{previous}'.")
        submission.id = f"steer_{next(self._serials):032x}"  # the guide's shape: steer_ and 32 hex digits
        target.queue.append(submission)
        return submission

    # --- the server's side: responses start and end --------------------------------------------

    def started(self, response_id: str, lane: str | None) -> list[Refusal]:
        """A response was created on `lane`. Submissions still pending on an older response of the
        lane, which this one does not continue, can no longer be carried: they are refused."""
        refused: list[Refusal] = []
        recent = self.lanes.setdefault(lane, [])
        for old_id in recent:
            old = self.targets[old_id]
            if old.queue:
                refused.extend(self._refuse_all(old, RESPONSE_NOT_ACTIVE, f"Response '{old_id}' was not continued on its lane."))
        recent.append(response_id)
        self.targets[response_id] = Target(response_id, lane)
        while len(recent) > RESPONSES_KEPT_PER_LANE:
            self.targets.pop(recent.pop(0), None)
        return refused

    def stop_requested(self, response_id: str) -> bool:
        """Whether the running response should stop at its next safe output boundary."""
        target = self.targets.get(response_id)
        return target is not None and target.state == RUNNING and bool(target.queue)

    def ended(self, response_id: str, status: str, output: Sequence[Item] = ()) -> Ended:
        """The target sent its terminal event. Queued submissions ride an automatic successor,
        wait for the client's tool output (pending), or are refused if the target failed.
        `output`: the items whose client function calls wait for the client's output (none for a
        response that answered its calls in place)."""
        target = self.targets.get(response_id)
        if target is None:
            return Ended()
        stubs = required_input_stubs(output) if status == "completed" else ()
        target.state = COMPLETED if status == "completed" else ENDED
        target.required_input = stubs
        if not target.queue:
            return Ended()
        if status == "failed":
            return Ended(refused=tuple(self._refuse_all(target, RESPONSE_NOT_ACTIVE, f"Response '{response_id}' failed.")))
        if stubs:
            notices = tuple(s for s in target.queue if not s.notified_pending)
            for submission in notices:
                submission.state = PENDING
                submission.notified_pending = True  # at most once per submission (reference)
            return Ended(pending=notices)
        return Ended(successor=tuple(target.queue))

    def claim(self, lane: str | None, previous_response_id: str | None) -> tuple[Submission, ...]:
        """An explicit `response.create` continuing a parent that waits with pending submissions, on
        the parent's lane, carries them: their items are prepended in submission order."""
        target = self.targets.get(previous_response_id) if previous_response_id else None
        if target is None or target.lane != lane or not target.queue:
            return ()
        return tuple(target.queue)

    def committed(self, submissions: Sequence[Submission]) -> None:
        """The successor's `response.created` went out: the commit point."""
        for submission in submissions:
            submission.state = COMMITTED
            self._dequeue(submission)

    def successor_failed(self, submissions: Sequence[Submission], reason: str) -> list[Refusal]:
        refused = []
        for submission in submissions:
            if submission.state in (ACCEPTED, PENDING):
                submission.state = FAILED
                self._dequeue(submission)
                refused.append(Refusal(submission, SUCCESSOR_CREATION_FAILED, reason))
        return refused

    def is_known(self, response_id: str) -> bool:
        return response_id in self.targets

    def _dequeue(self, submission: Submission) -> None:
        target = self.targets.get(submission.previous_response_id)
        if target is not None and submission in target.queue:
            target.queue.remove(submission)

    def _refuse_all(self, target: Target, code: str, message: str) -> list[Refusal]:
        refused = []
        for submission in target.queue:
            submission.state = FAILED
            refused.append(Refusal(submission, code, message))
        target.queue.clear()
        return refused


def successor_input(submissions: Sequence[Submission]) -> tuple[Item, ...]:
    """The queued input, in submission order."""
    return tuple(item for submission in submissions for item in submission.items)


__all__ = [
    "ACCEPTED", "COMMITTED", "FAILED", "INVALID_INPUT", "MAX_QUEUED_STEERS", "PENDING", "RESPONSE_ALREADY_COMPLETED",
    "RESPONSE_NOT_ACTIVE", "RESPONSE_NOT_FOUND", "STEERING_NOT_SUPPORTED", "SUCCESSOR_CREATION_FAILED",
    "TOO_MANY_PENDING_STEERS", "WAITING_FOR_REQUIRED_INPUT", "Ended", "Refusal", "SteeringBook",
    "Submission", "required_input_stubs", "successor_input", "validate_steer",
]
