"""What every trace reader returns: observed model calls (`Round`), the tasks they make (`Workload`), and errors.

A reader turns its format into `Round`s, one per observed model call, in order within each session. `build` then
cuts sessions into tasks and makes the testbed's `Workload`s from them, the same way for every format:

* A task is one user request: it starts at a round that a user message began (or the session's first round) and
  ends at a round that makes no client tool call. A request that ends on a round with client calls (the user
  interrupted it) ends there: those calls are not replayed, and `Trace.notes` counts them.
* A round whose only calls are hosted (web search) is part of the same Responses API turn as the next round: the
  model keeps going after the hosted call. The two become one turn; the next round's new tokens are the hosted
  call's result.
* Turn 0 appends the whole prompt of the task's first round (nothing is cached in the testbed when a task starts);
  turn k appends what the prompt grew by since round k-1, less round k-1's output, which the context already holds.
  Where the prompt shrank (the agent compacted its context) the turn appends nothing, and `Trace.notes` says so.
* `arrival_s` of a task is when its request began (else when its first round's input was complete), in seconds from
  the trace's first request or model call.
* Content: every task has its own content seed (a hash of the trace's name for it), so two tasks share nothing but
  what the trace says they share. What a session's first prompt found cached (`Round.cached_tokens` of its first
  round) can only have come from other sessions: the system prompt and tools of its provider and model. The median
  of that, over the sessions of one provider and model that found any, is their common prefix
  (`Workload.prefix_tokens`, at most a task's first prompt): every task of the group starts with the same text that
  long, and nothing after it is shared. A later request of a session starts with its session's earlier context,
  which the trace found cached; the replay cannot give it a previous task's content, so it shares the common prefix
  only and prefills the rest (noted).
* Reasoning: a turn's reasoning tokens are its rounds' `reasoning_tokens` (at most its output tokens less one).

Nothing is dropped or changed silently: every adjustment is counted in `Trace.notes`, which the commands print.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import IO

import attrs

from .. import workload as wl
from ..ranges import Range

# Tools that run on the API side: the Responses API's hosted web search, and the names agents log for it
# (Codex: web_search_call items; Claude Code: WebSearch). Everything else is a client tool.
HOSTED_TOOL_NAMES = frozenset({"web_search", "web_search_call", "web_search_preview", "websearch"})
# [assumed] ~4 characters per token, for hosted results a trace gives only in characters (TraceLab result_chars).
CHARS_PER_TOKEN = 4
CHARS_PER_TOKEN_RANGE = Range(3, 5, "code and JSON tokenize densely (~3 characters a token), English prose at ~4-5 "
                              "[assumed]")


def is_hosted(tool_name: str) -> bool:
    return tool_name.lower() in HOSTED_TOOL_NAMES


class TraceError(ValueError):
    """A trace that cannot be loaded: names the file, the line (1-based) and the field."""

    def __init__(self, path: str | PathLike[str], line: int, field: str | None, message: str) -> None:
        self.path, self.line, self.field = str(path), line, field
        where = f"{self.path}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


@attrs.frozen
class Round:
    """One observed model call.

    Attributes:
        session: The session (conversation) it belongs to.
        line: Line of the trace file that holds its token counts (for error messages).
        input_tokens: The whole prompt.
        cached_tokens: The part of the prompt served from the prefix cache (TraceLab's `prefix_tokens`, Codex's
            `cached_input_tokens`; for a generated task, everything before the turn's appended tokens).
        output_tokens: Sampled tokens, reasoning included.
        reasoning_tokens: The reasoning part of `output_tokens` (0 where the trace does not say).
        tool_seconds: Client tool calls this round ends with: how long each took.
        hosted: Hosted calls made in this round: (seconds, result tokens) each.
        starts_request: A user message began this round (a new task starts here).
        started_at: When the prompt was complete (the last user message or tool result before the model's first
            output), in seconds: epoch seconds from a reader, seconds from the trace's first request or model call
            in a `Trace`; None if the trace has no timestamps.
        ended_at: When the model's last output item of the round arrived, same clock.
        request_at: When the user message that began this round arrived (`starts_request` rounds), same clock.
        task: The task `build` put it in; turn: its index among the task's rounds.
        group: Who served it, "provider/model" where the trace says (TraceLab's `provider` and `model`, a Codex
            rollout's `turn_context` model), "" where it does not: `calibrate` fits each group on its own.
    """

    session: str
    line: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int = 0
    tool_seconds: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    hosted: tuple[tuple[float, int], ...] = attrs.field(default=(), converter=tuple)
    starts_request: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    request_at: float | None = None
    task: str = ""
    turn: int = 0
    group: str = ""

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    @property
    def model_seconds(self) -> float | None:
        """From a complete prompt to the last output item: queueing, API work, prefill and decode."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


@attrs.frozen
class Trace:
    """A loaded trace: the tasks to replay and the rounds they were observed as.

    Attributes:
        path: The file or folder read.
        format: Which reader read it (`testbed`, `tracelab-jsonl`, `tracelab-csv`, `codex`).
        tasks: The tasks, in order of arrival where the trace has arrival times.
        rounds: Every observed model call, with `task` and `turn` set.
        notes: What was adjusted to make tasks, one sentence each (empty when nothing was).
    """

    path: str
    format: str
    tasks: tuple[wl.Workload, ...] = attrs.field(converter=tuple)
    rounds: tuple[Round, ...] = attrs.field(converter=tuple)
    notes: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def timed(self) -> bool:
        return any(r.model_seconds is not None for r in self.rounds)


@contextlib.contextmanager
def open_utf8(path: str | PathLike[str], newline: str | None = None) -> Iterator[IO[str]]:
    """`path` opened as UTF-8 text. Bytes that are not UTF-8, wherever the reading meets them, raise a TraceError
    naming the line of the first one; a line ends at LF, CRLF or CR, as Python's universal newlines (and the csv
    module's `newline=""`) count them."""
    try:
        with open(path, encoding="utf-8", newline=newline) as f:
            yield f
    except UnicodeDecodeError:
        data = Path(path).read_bytes()  # the reader's error counts from the block it was decoding, not the file
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = 1 + len(re.findall(rb"\r\n|\r|\n", data[:e.start]))
            raise TraceError(path, line, None, "not a UTF-8 text file") from None
        raise  # the file changed since it was read: its own error stands


def json_objects(path: str | PathLike[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file; a line that is not a JSON object is a
    TraceError naming it."""
    with open_utf8(path) as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(path, line, None, f"invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line, None, "expected a JSON object")
            yield line, obj


def parse_timestamp(value: object) -> float:
    """ISO 8601 ("2026-03-21T10:06:13.380Z") to epoch seconds; ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 timestamp string, got {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {value!r}")
    return moment.timestamp()


def count(obj: dict, key: str, path: str | PathLike[str], line: int, *, prefix: str = "", nullable: bool = False) -> int:
    """A non-negative whole number at obj[key] (a float with no fraction counts); TraceError naming the field."""
    field = prefix + key
    if key not in obj:
        raise TraceError(path, line, field, "missing")
    value = obj[key]
    if value is None and nullable:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise TraceError(path, line, field, f"expected a whole number, got {value!r}")
    if value < 0:
        raise TraceError(path, line, field, f"must be >= 0, got {value!r}")
    return int(value)


@attrs.define
class _Notes:
    interrupted: int = 0
    interrupted_calls: int = 0
    shrank: int = 0
    shrank_tokens: int = 0
    zero_output: int = 0
    continued: int = 0
    continued_tokens: int = 0
    reasoning_clipped: int = 0
    extra: list[str] = attrs.Factory(list)

    def sentences(self) -> list[str]:
        out = list(self.extra)
        if self.interrupted:
            out.append(f"{self.interrupted} request(s) ended on a round with client tool calls (interrupted): "
                       f"their last {self.interrupted_calls} call(s) are not replayed")
        if self.shrank:
            out.append(f"the prompt shrank at {self.shrank} round(s) (context compaction): replayed as appending "
                       f"nothing, so the replayed context exceeds the trace's by up to {self.shrank_tokens} tokens")
        if self.zero_output:
            out.append(f"{self.zero_output} round(s) report 0 output tokens: replayed as 1")
        if self.continued:
            out.append(f"{self.continued} request(s) continue a session whose earlier context the trace found cached "
                       f"({self.continued_tokens} tokens in all): replayed with their own content, sharing only the "
                       "session's common prefix, so those tokens are prefilled")
        if self.reasoning_clipped:
            out.append(f"{self.reasoning_clipped} turn(s) report as many reasoning as output tokens: replayed with "
                       "one visible token")
        return out


def _cut_requests(rounds: Sequence[Round]) -> list[list[Round]]:
    """One session's rounds, cut into requests: a new one at a user message or after a round without client calls
    (hosted-only rounds continue the turn)."""
    requests: list[list[Round]] = []
    for r in rounds:
        if not requests or r.starts_request or not (requests[-1][-1].tool_seconds or requests[-1][-1].hosted):
            requests.append([r])
        else:
            requests[-1].append(r)
    return requests


def _turns(rounds: Sequence[Round], notes: _Notes) -> list[wl.TurnSpec]:
    """The turns of one task from its rounds (see the module docstring)."""
    appended = [rounds[0].input_tokens]
    for previous, r in zip(rounds, rounds[1:]):
        growth = r.input_tokens - previous.input_tokens - previous.output_tokens
        if growth < 0:
            notes.shrank += 1
            notes.shrank_tokens = max(notes.shrank_tokens, -growth)
        appended.append(max(0, growth))
    notes.zero_output += sum(1 for r in rounds if r.output_tokens < 1)
    turns: list[wl.TurnSpec] = []
    group: list[int] = []
    for i, r in enumerate(rounds):
        group.append(i)
        if r.hosted and not r.tool_seconds and i < len(rounds) - 1:
            continue  # hosted-only: the model goes on in the same turn
        hosted: list[wl.HostedCall] = []
        for j in group:
            if j == i:  # the turn's last round: results as the trace gives them
                hosted += [wl.HostedCall(s, tokens) for s, tokens in rounds[j].hosted]
            else:  # results are what the next round appended
                base, rest = divmod(appended[j + 1], len(rounds[j].hosted))
                hosted += [wl.HostedCall(s, base + (rest if n == 0 else 0)) for n, (s, _) in enumerate(rounds[j].hosted)]
        output = sum(max(1, rounds[j].output_tokens) for j in group)
        reasoning = sum(rounds[j].reasoning_tokens for j in group)
        if reasoning >= output:
            notes.reasoning_clipped += 1
            reasoning = output - 1
        turns.append(wl.TurnSpec(appended[group[0]], output, r.tool_seconds, hosted, reasoning))
        group = []
    if turns[-1].tool_seconds:
        notes.interrupted += 1
        notes.interrupted_calls += len(turns[-1].tool_seconds)
        turns[-1] = attrs.evolve(turns[-1], tool_seconds=())
    return turns


def build(path: str | PathLike[str], format: str, sessions: Iterable[Sequence[Round]],
          extra_notes: Iterable[str] = ()) -> Trace:
    """Tasks from each session's rounds (see the module docstring), timestamps made relative to the first one."""
    sessions = [list(s) for s in sessions if s]
    stamps = [t for s in sessions for r in s for t in (r.request_at, r.started_at, r.ended_at) if t is not None]
    origin = min(stamps) if stamps else 0.0

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - origin, 6)  # microseconds: what the formats record

    notes = _Notes(extra=list(extra_notes))
    tasks: list[wl.Workload] = []
    rounds: list[Round] = []
    requests = [(index, request) for session in sessions for index, request in enumerate(_cut_requests(session))]
    prefixes = common_prefix_tokens(requests)
    for index, request in requests:
        first = request[0]
        name = first.session if index == 0 else f"{first.session}/{index}"
        arrival = rel(first.request_at if first.request_at is not None else first.started_at)
        turns = _turns(request, notes)
        prefix = prefixes[common_prefix_name(first)]
        if index > 0 and first.cached_tokens > prefix:
            notes.continued += 1
            notes.continued_tokens += first.cached_tokens - prefix
        tasks.append(wl.Workload(name, 0, turns, arrival_s=arrival, content_seed=content_seed_of_task(name),
                                 prefix=common_prefix_name(first), prefix_tokens=min(prefix, turns[0].appended_tokens)))
        rounds += [attrs.evolve(r, task=name, turn=k, started_at=rel(r.started_at), ended_at=rel(r.ended_at),
                                request_at=rel(r.request_at)) for k, r in enumerate(request)]
    if not tasks:
        raise TraceError(path, 1, None, "the trace holds no model calls")
    if all(t.arrival_s is not None for t in tasks):
        order = sorted(range(len(tasks)), key=lambda i: tasks[i].arrival_s)
        tasks = [tasks[i] for i in order]
    elif any(t.arrival_s is not None for t in tasks):
        notes.extra.append("some tasks have no arrival time: the replay runs tasks one after another")
        tasks = [attrs.evolve(t, arrival_s=None) for t in tasks]
    return Trace(str(path), format, tasks, rounds, notes.sentences())


def content_seed_of_task(name: str) -> int:
    """A replayed task's own content seed: a hash of its name in the trace (session, or session/request), so
    every task of a trace has its own content and a task replays the same content every run."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") >> 1


def common_prefix_tokens(requests: Sequence[tuple[int, Sequence[Round]]]) -> dict[str, int]:
    """Each provider and model's common prefix: the median of what its sessions' first prompts found cached, over
    the sessions that found any (0 where none did). `requests` are (index in its session, rounds)."""
    found: dict[str, list[int]] = {}
    for index, request in requests:
        cached = found.setdefault(common_prefix_name(request[0]), [])
        if index == 0 and request[0].cached_tokens > 0:
            cached.append(request[0].cached_tokens)
    return {name: int(statistics.median_low(cached)) if cached else 0 for name, cached in found.items()}


def common_prefix_name(first: Round) -> str:
    """The common prefix a task shares with the trace's other tasks: one per provider and model (its system
    prompt and tools)."""
    return f"trace:{first.group}" if first.group else "trace"


def adjusted(task: wl.Workload, *, tool_seconds: float | None = None, initial_prompt_tokens: int | None = None,
             closed_loop: bool = False) -> wl.Workload:
    """A trace's task with a swept quantity replaced, as a sweep over generated tasks would set it: every client tool
    call takes `tool_seconds`, turn 0 appends `initial_prompt_tokens`; `closed_loop` drops the arrival time."""
    turns = list(task.turns)
    if tool_seconds is not None:
        turns = [attrs.evolve(t, tool_seconds=(tool_seconds,) * len(t.tool_seconds)) for t in turns]
    if initial_prompt_tokens is not None:
        turns[0] = attrs.evolve(turns[0], appended_tokens=initial_prompt_tokens)
    return attrs.evolve(task, turns=tuple(turns), arrival_s=None if closed_loop else task.arrival_s)


def rounds_from_workloads(workloads: Iterable[wl.Workload]) -> list[Round]:
    """The rounds a set of tasks makes with a perfect prefix cache (everything before the appended tokens cached),
    untimed: what the generator's presets imply, in the same terms as a trace."""
    out = []
    for w in workloads:
        for k, t in enumerate(w.turns):
            out.append(Round(
                session=w.name, line=0, input_tokens=w.prompt_tokens(k), cached_tokens=w.context_before(k),
                output_tokens=t.output_tokens, reasoning_tokens=t.reasoning_tokens, tool_seconds=t.tool_seconds,
                hosted=tuple((h.seconds, h.result_tokens) for h in t.hosted_calls), task=w.name, turn=k,
            ))
    return out
