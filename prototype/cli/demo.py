"""`python -m prototype demo`: one small rollout per WebSocket design under virtual time, with its
event timeline, so a reader sees the two designs' wire behaviour side by side.

Each design runs on a fresh server of its own (an empty prefix cache, render cache and store), so
the times do not depend on which design runs first: a design run second on a shared server would
find the task's prompt already in the prefix cache and look faster for it. Each event line says
what the sampling loop (prototype/designs/sampling.py) is doing at that moment."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator

from .. import virtual, workload
from ..client.connect import InMemoryConnector
from ..client.harness import CHAINED, SUSPENDED, RolloutRecord, run_websocket_rollout
from ..server.app import ResponsesServer
from .common import add_list, at_least, positive

DESIGNS = (SUSPENDED, CHAINED)
TOOL_SECONDS = 0.3  # the client's tool time per tool turn: the coding preset's median (docs/parameters.md §2)

# What the sampling loop is doing when an event goes by; the two events whose meaning depends on
# what follows them (a response that ends or pauses) are told apart in `notes`.
NOTES = {
    "response.created": "API work done (validate, render, route)",
    "response.in_progress": "the sampling loop is running",
    "response.output_item.added": "sampling: a new output item",
    "response.output_item.done": "sampling: the item is complete",
    "response.function_call_arguments.done": "the model called a client tool",
    "response.web_search_call.in_progress": "blocked at the tool-call point (hosted web_search)",
    "response.web_search_call.searching": "blocked at the tool-call point while the service searches",
    "response.web_search_call.completed": "answered by the hosted tool service: the loop resumes",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=at_least(2), default=3, help="model turns in the task, at least 2 (default 3)")
    parser.add_argument("--tps", type=positive(float), default=1000.0, help="decode tokens/s (default 1000, Codex-Spark class)")
    parser.add_argument("--output-tokens", type=at_least(1), default=40, help="text tokens per turn (default 40)")
    parser.add_argument("--hosted", action="store_true", help="make each tool turn start with a hosted web_search")
    add_list(parser, "--designs", str, DESIGNS, "the designs to run, in this order, each on a fresh server", choices=list(DESIGNS))


def notes(record: RolloutRecord) -> Iterator[tuple[float, str, str, str]]:
    """(time, direction, event type, what the sampling loop is doing) per event of the timeline."""
    timeline = record.timeline
    requests = 0
    for index, (time, direction, event_type) in enumerate(timeline):
        following = timeline[index + 1] if index + 1 < len(timeline) else None
        if event_type == "response.create":
            requests += 1
            note = ("a new request: API work, then a sampling loop starts" if requests == 1 else
                    "a new request: a new sampling loop over the cached response")
        elif event_type == "response.append":
            note = "answered by response.append: the loop resumes"
        elif event_type == "response.in_progress" and requests == 1 and index > 2:
            note = "the sampling loop resumes past the tool-call point"
        elif event_type in ("response.done", "response.completed") and following is not None and following[1] == "send":
            note = ("blocked at the tool-call point, awaiting response.append"
                    if event_type == "response.done" else
                    "ends at the tool-call point; kept in the connection's cache")
        elif event_type == "response.completed":
            note = "the model answered: the sampling loop ends"
        else:
            note = NOTES.get(event_type, "")
        yield time, direction, event_type, note


def print_timeline(record: RolloutRecord) -> None:
    print(f"\n== {record.design}: {record.status} in {record.seconds:.3f} s (virtual), {len(record.turns)} turns, "
          f"{len(record.response_ids)} response id(s)")
    origin = record.started_at
    pending: Counter[str] = Counter()

    def flush() -> None:
        for kind, count in pending.items():
            print(f"   {'':>9}  {'':4} ... {count} x {kind}")
        pending.clear()

    for time, direction, event_type, note in notes(record):
        if event_type.endswith(".delta"):
            pending[event_type] += 1
            continue
        flush()
        arrow = "C->S" if direction == "send" else "S->C"
        print(f"   {1000 * (time - origin):9.1f}ms {arrow} {event_type:<38} {note}".rstrip())
    flush()
    for turn in record.turns:
        ttft = f"{1000 * turn.ttft:.1f}" if turn.ttft is not None else "-"
        print(f"   turn {turn.turn}: ttft {ttft} ms, turn {1000 * (turn.ended_at - turn.sent_at):.1f} ms, "
              f"tool {1000 * turn.tool_seconds:.0f} ms, sent {turn.bytes_sent} B, received {turn.bytes_received} B")


def demo_task(turns: int, output_tokens: int, hosted: bool) -> workload.Workload:
    searches = (workload.HostedCall(seconds=0.5, result_tokens=200),) if hosted else ()
    base = workload.fixed(turns, initial_prompt_tokens=2000, appended_tokens=400, output_tokens=output_tokens,
                          tool_seconds=TOOL_SECONDS, name="demo")
    return workload.Workload(
        base.name, base.seed,
        tuple(t if not t.tool_seconds else workload.TurnSpec(t.appended_tokens, t.output_tokens, t.tool_seconds, searches)
              for t in base.turns),
    )


def run(args: argparse.Namespace) -> int:
    task = demo_task(args.turns, args.output_tokens, args.hosted)

    async def main() -> None:
        print(f"demo task: {args.turns} turns, {args.output_tokens} text tokens per turn at {args.tps:g} tokens/s, "
              f"tool time {TOOL_SECONDS:g} s{', one hosted web_search per tool turn' if args.hosted else ''}; "
              "each design on a fresh server")
        for design in args.designs:
            server = ResponsesServer()
            key = server.api.workloads.register(task)
            metadata = {"testbed_workload": key, "testbed_decode_tps": str(args.tps)}
            record = await run_websocket_rollout(InMemoryConnector(server), design, task, metadata=metadata)
            print_timeline(record)

    virtual.run(main)
    return 0
