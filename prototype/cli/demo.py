"""`python -m prototype demo`: one small rollout per WebSocket design under virtual time, with its
event timeline, so a reader sees the two designs' wire behaviour side by side."""

from __future__ import annotations

import argparse
from collections import Counter

import trio
import trio.testing

from .. import workload
from ..client.connect import InMemoryConnector
from ..client.harness import CHAINED, SUSPENDED, RolloutRecord, run_websocket_rollout
from ..server.app import ResponsesServer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=3, help="model turns in the task (default 3)")
    parser.add_argument("--tps", type=float, default=1000.0, help="decode tokens/s (default 1000, Codex-Spark class)")
    parser.add_argument("--output-tokens", type=int, default=40, help="text tokens per turn (default 40)")
    parser.add_argument("--hosted", action="store_true", help="make each tool turn start with a hosted web_search")


def _print_timeline(record: RolloutRecord) -> None:
    print(f"\n== {record.design}: {record.status} in {record.seconds:.3f} s (virtual), {len(record.turns)} turns, "
          f"{len(record.response_ids)} response id(s)")
    origin = record.started_at
    pending: Counter[str] = Counter()
    last = None

    def flush() -> None:
        for kind, count in pending.items():
            print(f"   {'':>9}  {'':4} ... {count} x {kind}")
        pending.clear()

    for time, direction, event_type in record.timeline:
        if event_type.endswith(".delta"):
            pending[event_type] += 1
            last = (time, direction, event_type)
            continue
        if pending:
            flush()
        arrow = "C->S" if direction == "send" else "S->C"
        print(f"   {1000 * (time - origin):9.1f}ms {arrow} {event_type}")
    if pending and last:
        flush()
    for turn in record.turns:
        ttft = f"{1000 * turn.ttft:.1f}" if turn.ttft is not None else "-"
        print(f"   turn {turn.turn}: ttft {ttft} ms, turn {1000 * (turn.ended_at - turn.sent_at):.1f} ms, "
              f"tool {1000 * turn.tool_seconds:.0f} ms, sent {turn.bytes_sent} B, received {turn.bytes_received} B")


def run(args: argparse.Namespace) -> int:
    hosted = (workload.HostedCall(seconds=0.5, result_tokens=200),) if args.hosted else ()
    base = workload.fixed(args.turns, initial_prompt_tokens=2000, appended_tokens=400, output_tokens=args.output_tokens, tool_seconds=0.3, name="demo")
    task = workload.Workload(
        base.name, base.seed,
        tuple(t if not t.tool_seconds else workload.TurnSpec(t.appended_tokens, t.output_tokens, t.tool_seconds, hosted) for t in base.turns),
    )

    async def main() -> None:
        server = ResponsesServer()
        key = server.api.workloads.register(task)
        metadata = {"testbed_workload": key, "testbed_decode_tps": str(args.tps)}
        print(f"demo task: {args.turns} turns, {args.output_tokens} text tokens per turn at {args.tps:g} tokens/s, "
              f"tool time 0.3 s{', one hosted web_search per tool turn' if hosted else ''}")
        for design in (SUSPENDED, CHAINED):
            record = await run_websocket_rollout(InMemoryConnector(server), design, task, metadata=metadata)
            _print_timeline(record)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return 0
