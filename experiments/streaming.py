"""Streaming capacity: one server process streaming text deltas to N concurrent sessions (issue 10).

A server runs in a child process (`serve --costs zero --flush-interval F [--flush-tokens K]`); this
process opens N WebSocket sessions to it at once, and each sends one `response.create` whose answer
is a long text message (`fixed:1:<prompt>:0:<output>:0`, no tool call) at model `sim-<tps>`. Deltas
are standard `response.output_text.delta` events; with F > 0 each carries every token sampled since
the previous flush (the first token of an item goes out at once, the last when it is ready), and
with K at most K tokens.

Reported per flush setting:

* `lag_1`: one session alone at `--single-tps` (default 4000): how far the stream falls behind the
  engine, (real stream time - modeled stream time) / modeled stream time, where the stream time is
  from the first delta received to the terminal event received, and the modeled one is the same
  request's on the virtual clock ((output - 1) / tps: the engine's decode after the first token);
  `turn_lag_1` the same for the whole turn (request sent to terminal event), which adds the
  server's fixed per-request work (validation, rendering, tokenizing) and the engine's modeled
  request overhead and prefill to both sides;
* `agg_tokens_per_s`: N sessions together at `--tps` each: output tokens delivered / wall time
  (first request sent to last terminal event received), against `offered_tokens_per_s` = N x tps;
  `lag_n_p50`, `lag_n_p99`: the stream lag per session under that load;
* `events_per_s`: delta events the client received per second, all sessions together;
* `server_core_share`: server CPU time / wall time (/proc schedstat).

    python -m experiments.streaming [--sessions 100] [--tps 4000] [--output 8000] [--flush-intervals 0.002 ... 0.1]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import trio
import trio.lowlevel
import trio.testing

from prototype import sweep
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector, TcpConnector
from prototype.client.harness import CHAINED, RolloutRecord, run_websocket_rollout
from prototype.server.app import ResponsesServer
from prototype.workload import fixed

from .common import add_list, cpu_seconds, experiment_parser, raise_fd_limit, report, server_process

COLUMNS = (
    "flush_ms", "flush_tokens", "lag_1", "turn_lag_1", "sessions", "offered_tokens_per_s", "agg_tokens_per_s", "lag_n_p50", "lag_n_p99",
    "events_per_s", "server_core_share",
)


def spec_of(prompt: int, output: int) -> str:
    return f"fixed:1:{prompt}:0:{output}:0"


def modeled_turn_seconds(prompt: int, output: int, tps: float) -> tuple[float, float]:
    """The turn's time and its stream's time (first delta to terminal event) on the virtual clock:
    exactly what the engine model charges."""
    workload = fixed(1, initial_prompt_tokens=prompt, appended_tokens=0, output_tokens=output, tool_seconds=0.0)

    async def run() -> RolloutRecord:
        server = ResponsesServer(ApiService(costs=ZERO_COSTS, flush_interval=0.05))
        return await run_websocket_rollout(
            InMemoryConnector(server), CHAINED, workload, metadata={"testbed_workload": spec_of(prompt, output)}, model=f"sim-{tps:g}"
        )

    record = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert record.status == "completed", record.status
    turn = record.turns[0]
    return turn.ended_at - turn.sent_at, turn.ended_at - turn.first_token_at


async def run_sessions(port: int, sessions: int, prompt: int, output: int, tps: float) -> list[RolloutRecord]:
    connector = TcpConnector("127.0.0.1", port)
    workload = fixed(1, initial_prompt_tokens=prompt, appended_tokens=0, output_tokens=output, tool_seconds=0.0)
    metadata = {"testbed_workload": spec_of(prompt, output)}
    records: list[RolloutRecord] = []
    go = trio.Event()

    async def one() -> None:
        await go.wait()
        records.append(await run_websocket_rollout(connector, CHAINED, workload, metadata=metadata, model=f"sim-{tps:g}"))

    async with trio.open_nursery() as nursery:
        for _ in range(sessions):
            nursery.start_soon(one)
        await trio.lowlevel.checkpoint()
        go.set()
    return records


def measure(flush: float, flush_tokens: int | None, args: argparse.Namespace) -> dict[str, Any]:
    server_args = ["--costs", "zero", "--flush-interval", f"{flush:g}"]
    if flush_tokens:
        server_args += ["--flush-tokens", str(flush_tokens)]
    modeled_1 = modeled_turn_seconds(args.prompt, args.output, args.single_tps)
    modeled_n = modeled_turn_seconds(args.prompt, args.output, args.tps)
    with server_process(*server_args) as (process, port):
        trio.run(run_sessions, port, 1, args.prompt, 50, args.single_tps)  # warm-up: imports, tokenizer, caches
        single = trio.run(run_sessions, port, 1, args.prompt, args.output, args.single_tps)[0]
        cpu0 = cpu_seconds(process.pid)
        records = trio.run(run_sessions, port, args.sessions, args.prompt, args.output, args.tps)
        cpu = cpu_seconds(process.pid) - cpu0
    bad = [r.status for r in records + [single] if r.status != "completed"]
    if bad:
        raise RuntimeError(f"sessions ended {bad[:3]}")
    turn = single.turns[0]
    lag_1 = (turn.ended_at - turn.first_token_at) / modeled_1[1] - 1
    turn_lag_1 = (turn.ended_at - turn.sent_at) / modeled_1[0] - 1
    wall = max(r.turns[0].ended_at for r in records) - min(r.turns[0].sent_at for r in records)
    tokens = sum(r.usage["output_tokens"] for r in records)
    lags = [(r.turns[0].ended_at - r.turns[0].first_token_at) / modeled_n[1] - 1 for r in records]
    deltas = sum(1 for r in records for _, kind, t in r.timeline if kind == "recv" and t == "response.output_text.delta")
    return {
        "flush_ms": flush * 1000,
        "flush_tokens": flush_tokens or "",
        "lag_1": lag_1,
        "turn_lag_1": turn_lag_1,
        "sessions": args.sessions,
        "offered_tokens_per_s": args.sessions * args.tps,
        "agg_tokens_per_s": tokens / wall,
        "lag_n_p50": float(np.percentile(lags, 50)),
        "lag_n_p99": float(np.percentile(lags, 99)),
        "events_per_s": deltas / wall,
        "server_core_share": cpu / wall,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--sessions", type=int, default=100, help="concurrent sessions (default 100)")
    parser.add_argument("--tps", type=float, default=4000.0, help="decode tokens/s of each concurrent session (default 4000)")
    parser.add_argument("--single-tps", type=float, default=4000.0, help="decode tokens/s of the lone session (default 4000)")
    parser.add_argument("--prompt", type=int, default=100, help="prompt tokens (default 100)")
    parser.add_argument("--output", type=int, default=8000, help="output tokens per session (default 8000)")
    add_list(parser, "--flush-intervals", float, [0.002, 0.005, 0.01, 0.02, 0.05, 0.1], "delta coalescing intervals in seconds (0: one delta per token)")
    add_list(parser, "--flush-tokens", int, [0], "most tokens per delta (0: no bound)")
    parser.add_argument("--csv", default="streaming.csv", help="CSV file name in results/streaming/<timestamp>/ (default streaming.csv)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    print(
        f"{args.sessions} sessions x {args.output} output tokens at {args.tps:g} tokens/s each; lone session at "
        f"{args.single_tps:g} tokens/s; prompt {args.prompt} tokens; API stage costs zero; server and client on this machine",
        flush=True,
    )
    grid = [(flush, flush_tokens or None) for flush_tokens in args.flush_tokens for flush in args.flush_intervals]
    rows = sweep.measured(lambda point: measure(*point, args), grid, desc="streaming")
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    main()
