"""Streaming capacity: one server process streaming text deltas to N concurrent sessions.

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
  request's on the virtual clock (the engine's decode after the first token); `turn_lag_1` the same
  for the whole turn (request sent, on the open connection, to terminal event), which adds the
  server's fixed per-request work (validation, rendering, tokenizing) and the engine's modeled
  request overhead and prefill to both sides;
* `agg_tokens_per_s`: N sessions together at `--tps` each: output tokens delivered / wall time
  (first request sent to last terminal event received), against `offered_tokens_per_s` = N x tps
  and `limit_tokens_per_s`, the same count over the same sessions on the virtual clock (what a
  server with no cost of its own would show: below the offered rate by construction, since the
  engine's request overhead and prefill come before each stream's first token). The N WebSockets
  are all opened first, then all requests go out together: the handshakes (`connect_s`, from the
  processes' start to the last session connected) are not part of the streaming figures;
  `lag_n_p50`, `lag_n_p99`: the stream lag per session under that load; `first_late_ms_p50`,
  `first_late_ms_p99`: how much later than modeled each session's first delta came (its time to
  first token, real minus modeled); `tail_ms_p50`, `tail_ms_p99`: from each session's last delta to
  its terminal event (the closing events, which carry the whole text again);
* `events_per_s`: delta events the client received per second, all sessions together;
* `server_core_share`: server CPU time / wall time (/proc schedstat); `server_cpu_us_per_token`
  the server's CPU per streamed token; `client_core_share`: the client processes' CPU time / wall
  time, all together; `server_waiting_share` and `client_waiting_share`: the time they were ready
  to run but waited for a core (schedstat's run delay: the machine's other jobs), over wall time;
  `load_avg`: the machine's 1-minute load average at the end of the run;
* `limit_share`: `agg_tokens_per_s` / `limit_tokens_per_s`; `met`: whether the run meets the target
  for an idle machine, `limit_share` >= 0.97 with `lag_n_p50` <= 1%.

The N sessions are spread over `--client-processes` processes, so the client is not one Python
thread parsing every event of every session. The default is one process per core the server's one
process leaves free (the cores this process may run on, less one; at least one): more client
processes than free cores compete with the server for a core, and the figure would measure that
competition rather than the server (docs/speed.md: on 2 cores, four client processes used twice
the CPU of one and waited for a core most of the run). Every process times with the same
system-wide monotonic clock (clock.PreciseClock: `time.perf_counter`), so their times compare
directly.

    python -m experiments.streaming [--sessions 100] [--tps 4000] [--output 8000] [--flush-intervals 0.002 ... 0.1] [--client-processes N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio
import trio.lowlevel

from prototype import sweep, virtual
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.connect import Connector, InMemoryConnector, TcpConnector
from prototype.client.harness import CHAINED, RolloutRecord, run_websocket_rollout
from prototype.clock import PreciseClock
from prototype.server.app import ResponsesServer
from prototype.workload import fixed

from .common import (
    add_list,
    cpu_seconds,
    experiment_parser,
    raise_fd_limit,
    report,
    run_delay_seconds,
    server_process,
    settle_client_process,
)

COLUMNS = (
    "flush_ms", "flush_tokens", "lag_1", "turn_lag_1", "sessions", "offered_tokens_per_s", "limit_tokens_per_s", "agg_tokens_per_s",
    "lag_n_p50", "lag_n_p99", "first_late_ms_p50", "first_late_ms_p99", "tail_ms_p50", "tail_ms_p99", "events_per_s",
    "server_core_share", "server_waiting_share", "server_cpu_us_per_token", "client_processes", "client_core_share",
    "client_waiting_share", "connect_s", "load_avg", "limit_share", "met",
)
# The target on an idle machine (docs/speed.md): the aggregate at least 0.97 of the virtual-clock
# limit, with the sessions' stream lag p50 at most 1%.
TARGET_LIMIT_SHARE = 0.97
TARGET_LAG_P50 = 0.01


def free_cores() -> int:
    """The cores this process may run on, less the one the server's process takes; at least one."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def spec_of(prompt: int, output: int) -> str:
    return f"fixed:1:{prompt}:0:{output}:0"


def modeled_runs(
    prompt: int, output: int, single_tps: float, tps: float, sessions: int, flush: float, flush_tokens: int | None
) -> tuple[RolloutRecord, list[RolloutRecord]]:
    """What the engine model charges for the measured sequence: the same warm-up, lone session and
    N sessions, against an in-memory server with the same settings, on the virtual clock. The
    sequence matters: the warm-up leaves the prompt's blocks in the prefix cache, so the measured
    sessions prefill only their last block, here as on the real server."""

    async def run() -> tuple[RolloutRecord, list[RolloutRecord]]:
        server = ResponsesServer(ApiService(costs=ZERO_COSTS, flush_interval=flush, flush_tokens=flush_tokens))
        connector = InMemoryConnector(server)
        await run_sessions(connector, 1, prompt, 50, single_tps)
        (single,) = await run_sessions(connector, 1, prompt, output, single_tps)
        return single, await run_sessions(connector, sessions, prompt, output, tps)

    single, many = virtual.run(run)
    assert all(record.status == "completed" for record in (single, *many))
    return single, many


def turn_seconds(record: RolloutRecord) -> tuple[float, float, float]:
    """The turn's request sent, first delta and terminal event."""
    turn = record.turns[0]
    return turn.sent_at, turn.first_token_at or turn.sent_at, turn.ended_at or turn.sent_at


async def run_sessions(
    connector: Connector, sessions: int, prompt: int, output: int, tps: float, all_connected: Callable[[], Any] | None = None
) -> list[RolloutRecord]:
    """`sessions` concurrent sessions: each opens its WebSocket, and once every one is open (and
    `all_connected`, a blocking wait for the other processes' sessions, has returned) all send their
    request together. The handshakes are not streaming: the turns start after them."""
    workload = fixed(1, initial_prompt_tokens=prompt, appended_tokens=0, output_tokens=output, tool_seconds=0.0)
    metadata = {"testbed_workload": spec_of(prompt, output)}
    records: list[RolloutRecord] = []
    opened = 0
    go = trio.Event()

    async def connected() -> None:
        nonlocal opened
        opened += 1
        if opened == sessions:
            if all_connected is not None:
                await trio.to_thread.run_sync(all_connected)
            go.set()
        await go.wait()

    async def one() -> None:
        records.append(await run_websocket_rollout(connector, CHAINED, workload, metadata=metadata, model=f"sim-{tps:g}", connected=connected))

    async with trio.open_nursery() as nursery:
        for _ in range(sessions):
            nursery.start_soon(one)
    return records


def session_figures(record: RolloutRecord) -> tuple[str, float, float, float, int, int, float]:
    """What the parent needs of a session (small to send between processes): status, request
    sent, first delta, terminal event, output tokens, delta events, last delta."""
    turn = record.turns[0]
    times = [at for at, kind, t in record.timeline if kind == "recv" and t == "response.output_text.delta"]
    output = record.usage["output_tokens"] if record.status == "completed" else 0
    ended = turn.ended_at or turn.sent_at
    return record.status, turn.sent_at, turn.first_token_at or turn.sent_at, ended, output, len(times), times[-1] if times else ended


def client_process(
    port: int, sessions: int, prompt: int, output: int, tps: float, ready: Any, connect: Any, go: Any, results: Any
) -> None:
    """One client process: its share of the sessions. It reports `ready` once imported and again
    once its sessions are connected; the parent sets `connect` when every process is ready, and
    `go` when every session is connected, so all connect together and then stream together."""
    settle_client_process()
    ready.put("imported")
    connect.wait()
    cpu0, wait0 = time.process_time(), run_delay_seconds(os.getpid())
    connector = TcpConnector("127.0.0.1", port)

    def all_connected() -> None:
        ready.put("connected")
        go.wait()

    records = trio.run(run_sessions, connector, sessions, prompt, output, tps, all_connected, clock=PreciseClock())
    results.put(([session_figures(r) for r in records], time.process_time() - cpu0, run_delay_seconds(os.getpid()) - wait0))


def _next(messages: Any, workers: list) -> Any:
    """The next message from the client processes; one that failed is an error, not a wait for ever."""
    while True:
        try:
            return messages.get(timeout=0.05)
        except queue.Empty:
            failed = [worker.exitcode for worker in workers if worker.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a client process failed (exit code {failed[0]})") from None


def run_client_processes(
    port: int, processes: int, sessions: int, prompt: int, output: int, tps: float
) -> tuple[list, float, float, float]:
    """`sessions` spread over `processes` client processes; returns every session's figures, the
    client processes' CPU seconds and run-delay seconds, and the seconds it took to open every
    session's WebSocket (all opened at once)."""
    context = multiprocessing.get_context("spawn")  # no trio state inherited from this process
    shares = [n for n in (sessions // processes + (i < sessions % processes) for i in range(processes)) if n]
    ready, connect, go, results = context.Queue(), context.Event(), context.Event(), context.Queue()
    workers = [
        context.Process(target=client_process, args=(port, n, prompt, output, tps, ready, connect, go, results), daemon=True)
        for n in shares
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            _next(ready, workers)  # every process imported: all sessions connect together
        opening = time.perf_counter()
        connect.set()
        for _ in workers:
            _next(ready, workers)  # every session connected: all requests go out together
        connect_s = time.perf_counter() - opening
        go.set()
        figures, cpu, waited = [], 0.0, 0.0
        for _ in workers:
            part, seconds, delay = _next(results, workers)
            figures += part
            cpu += seconds
            waited += delay
    finally:
        for worker in workers:
            if worker.exitcode is None and not go.is_set():
                worker.terminate()  # the run failed before it started: nothing to wait for
            worker.join()
    return figures, cpu, waited, connect_s


def measure(flush: float, flush_tokens: int | None, args: argparse.Namespace) -> dict[str, Any]:
    server_args = ["--costs", "zero", "--flush-interval", f"{flush:g}"]
    if flush_tokens:
        server_args += ["--flush-tokens", str(flush_tokens)]
    modeled_single, modeled_many = modeled_runs(args.prompt, args.output, args.single_tps, args.tps, args.sessions, flush, flush_tokens)
    with server_process(*server_args) as (process, port):
        connector = TcpConnector("127.0.0.1", port)
        trio.run(run_sessions, connector, 1, args.prompt, 50, args.single_tps)  # warm-up: imports, tokenizer, caches
        single = trio.run(run_sessions, connector, 1, args.prompt, args.output, args.single_tps, clock=PreciseClock())[0]
        cpu0, wait0 = cpu_seconds(process.pid), run_delay_seconds(process.pid)
        figures, client_cpu, client_wait, connect_s = run_client_processes(
            port, args.client_processes, args.sessions, args.prompt, args.output, args.tps
        )
        cpu, wait = cpu_seconds(process.pid) - cpu0, run_delay_seconds(process.pid) - wait0
    bad = [f[0] for f in figures if f[0] != "completed"] + ([single.status] if single.status != "completed" else [])
    if bad:
        raise RuntimeError(f"sessions ended {bad[:3]}")
    (sent, first, ended), (m_sent, m_first, m_ended) = turn_seconds(single), turn_seconds(modeled_single)
    lag_1 = (ended - first) / (m_ended - m_first) - 1
    turn_lag_1 = (ended - sent) / (m_ended - m_sent) - 1
    wall = max(f[3] for f in figures) - min(f[1] for f in figures)
    modeled = [turn_seconds(record) for record in modeled_many]
    modeled_wall = max(m[2] for m in modeled) - min(m[0] for m in modeled)
    # The sessions are alike and start together: each stream is set against the modeled streams' median.
    modeled_stream = float(np.median([m[2] - m[1] for m in modeled]))
    tokens = sum(f[4] for f in figures)
    lags = [(f[3] - f[2]) / modeled_stream - 1 for f in figures]
    modeled_ttft = float(np.median([m[1] - m[0] for m in modeled]))
    late_first = [(f[2] - f[1] - modeled_ttft) * 1000 for f in figures]
    tails = [(f[3] - f[6]) * 1000 for f in figures]
    deltas = sum(f[5] for f in figures)
    row = {
        "flush_ms": flush * 1000,
        "flush_tokens": flush_tokens or "",
        "lag_1": lag_1,
        "turn_lag_1": turn_lag_1,
        "sessions": args.sessions,
        "offered_tokens_per_s": args.sessions * args.tps,
        "limit_tokens_per_s": sum(record.usage["output_tokens"] for record in modeled_many) / modeled_wall,
        "agg_tokens_per_s": tokens / wall,
        "lag_n_p50": float(np.percentile(lags, 50)),
        "lag_n_p99": float(np.percentile(lags, 99)),
        "first_late_ms_p50": float(np.percentile(late_first, 50)),
        "first_late_ms_p99": float(np.percentile(late_first, 99)),
        "tail_ms_p50": float(np.percentile(tails, 50)),
        "tail_ms_p99": float(np.percentile(tails, 99)),
        "events_per_s": deltas / wall,
        "server_core_share": cpu / wall,
        "server_waiting_share": wait / wall,
        "server_cpu_us_per_token": cpu / tokens * 1e6,
        "client_processes": args.client_processes,
        "client_core_share": client_cpu / wall,
        "client_waiting_share": client_wait / wall,
        "connect_s": connect_s,
        "load_avg": os.getloadavg()[0],
    }
    row["limit_share"] = row["agg_tokens_per_s"] / row["limit_tokens_per_s"]
    row["met"] = row["limit_share"] >= TARGET_LIMIT_SHARE and row["lag_n_p50"] <= TARGET_LAG_P50
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--sessions", type=at_least(1), default=100, help="concurrent sessions (default 100)")
    parser.add_argument("--tps", type=positive(float), default=4000.0, help="decode tokens/s of each concurrent session (default 4000)")
    parser.add_argument("--single-tps", type=positive(float), default=4000.0, help="decode tokens/s of the lone session (default 4000)")
    parser.add_argument("--prompt", type=at_least(1), default=100, help="prompt tokens (default 100)")
    parser.add_argument("--output", type=at_least(1), default=8000, help="output tokens per session (default 8000)")
    add_list(parser, "--flush-intervals", non_negative(float), [0.002, 0.005, 0.01, 0.02, 0.05, 0.1], "delta coalescing intervals in seconds (0: one delta per token)")
    add_list(parser, "--flush-tokens", non_negative(int), [0], "most tokens per delta (0: no bound)")
    cores = free_cores()
    parser.add_argument("--client-processes", type=at_least(1), default=cores,
                        help=f"processes the N sessions are spread over (default {cores}: the cores the server's process leaves free)")
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
