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
  (first request sent to last terminal event received; the mean over `--repeats` runs), against `offered_tokens_per_s` = N x tps
  and `limit_tokens_per_s`, the same count over the same sessions on the virtual clock (what a
  server with no cost of its own would show: below the offered rate by construction, since the
  engine's request overhead and prefill come before each stream's first token). The N WebSockets
  are all opened first, then all requests go out together: the handshakes (`connect_s`, from the
  processes' start to the last session connected) are not part of the streaming figures;
  `lag_n_p50`, `lag_n_p99`: the stream lag per session under that load (every session of every
  repeat); `first_late_ms_p50`,
  `first_late_ms_p99`: how much later than modeled each session's first delta came (its time to
  first token, real minus modeled); `tail_ms_p50`, `tail_ms_p99`: from each session's last delta to
  its terminal event (the closing events, which carry the whole text again);
* `events_per_s`: delta events the client received per second, all sessions together;
* `server_core_share`: server CPU time / wall time (/proc schedstat); `server_cpu_us_per_token`
  the server's CPU per streamed token; `client_core_share`: the client processes' CPU time / wall
  time, all together; `server_waiting_share` and `client_waiting_share`: the time they were ready
  to run but waited for a core (schedstat's run delay: the machine's other jobs), over wall time;
  `load_avg`: the machine's 1-minute load average, the higher of the run's start and end;
* `limit_share`: `agg_tokens_per_s` / `limit_tokens_per_s`.

The stack's floor for the same load, measured in the same run: a server process with none of the
testbed's logic (trio, trio-websocket, wsproto and orjson, the testbed's receive buffer and batched
writes) answers each session's request by replaying what the testbed's server sends for it, the
same messages in the same groups at the same times from the request's arrival (groups already due
go out in one write), taken from the testbed's own answer on the virtual clock (`captured_answer`);
the same client processes run the same N sessions against it. The runs alternate, `--repeats` of
each, so both meet the same machine. With one delta per token (F = 0) there is no floor to replay:
where the testbed falls behind it merges the tokens due into one delta, so how many events it sends
depends on how late it is, and a replay of the schedule's events would carry more than the testbed
does; those rows leave the floor's columns empty.

* `floor_tokens_per_s`: the same count against the floor (mean over the repeats, 95% bootstrap
  interval over them; `agg_tokens_per_s` likewise); `floor_limit_share` its share of the limit,
  what the stack alone reaches on this machine;
* `floor_share`: `agg_tokens_per_s` / `floor_tokens_per_s` (paired bootstrap over the repeats): the
  testbed's share of what its stack streams; `floor_lag_n_p50`, `floor_first_late_ms_p50`,
  `floor_tail_ms_p50`, `floor_cpu_us_per_token` the floor's counterparts of the testbed's figures;
* `met`: whether `floor_share` is at least `TARGET_FLOOR_SHARE`, decided on its interval (`yes`,
  `no`, or `not separated`); `loaded` when the load average was above the machine's cores
  (experiments.efficiency's rule).

The N sessions are spread over `--client-processes` processes, so the client is not one Python
thread parsing every event of every session. The default is one process per core the server's one
process leaves free (the cores this process may run on, less one; at least one): more client
processes than free cores compete with the server for a core, and the figure would measure that
competition rather than the server. Every process times with the same
system-wide monotonic clock (clock.PreciseClock: `time.perf_counter`), so their times compare
directly.

    python -m experiments.streaming [--sessions 100] [--tps 4000] [--output 8000] [--flush-intervals 0.002 ... 0.1] [--repeats 5] [--client-processes N]
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import attrs
import numpy as np
import orjson
import trio
import trio_websocket

from prototype import sweep, uncertainty, virtual
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.connect import Connector, InMemoryConnector, TcpConnector
from prototype.client.harness import (
    CHAINED,
    RolloutRecord,
    open_responses_websocket,
    request_body,
    run_websocket_rollout,
    task_prompt,
)
from prototype.clock import PreciseClock
from prototype.protocol.events import TERMINAL_TYPES
from prototype.protocol.wire import WS_RECEIVE_BYTES
from prototype.server.app import ResponsesServer
from prototype.workload import Workload, fixed
from prototype.ws_internals import send_messages

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
from .efficiency import machine_loaded

COLUMNS = (
    "flush_ms", "flush_tokens", "lag_1", "turn_lag_1", "sessions", "repeats", "offered_tokens_per_s", "limit_tokens_per_s",
    "agg_tokens_per_s", "agg_low", "agg_high", "floor_tokens_per_s", "floor_low", "floor_high",
    "floor_share", "floor_share_low", "floor_share_high", "limit_share", "floor_limit_share",
    "lag_n_p50", "lag_n_p99", "floor_lag_n_p50", "first_late_ms_p50", "first_late_ms_p99", "floor_first_late_ms_p50",
    "tail_ms_p50", "tail_ms_p99", "floor_tail_ms_p50", "events_per_s",
    "server_core_share", "server_waiting_share", "server_cpu_us_per_token", "floor_cpu_us_per_token", "client_processes",
    "client_core_share", "client_waiting_share", "connect_s", "load_avg", "target_floor_share", "met",
)
# The target: the testbed streams at least 0.95 of what its stack alone streams the same sessions
# (docs/speed.md, "Targets"): 5% of the 100 streams' 2.0 s leaves about 1 ms of server CPU a session
# for the testbed's own work at the streams' two ends.
TARGET_FLOOR_SHARE = 0.95
MAX_MESSAGE_BYTES = 16 * 2**20
FLOOR_COLUMNS = (
    "floor_tokens_per_s", "floor_low", "floor_high", "floor_share", "floor_share_low", "floor_share_high", "floor_limit_share",
    "floor_lag_n_p50", "floor_first_late_ms_p50", "floor_tail_ms_p50", "floor_cpu_us_per_token", "target_floor_share", "met",
)


def free_cores() -> int:
    """The cores this process may run on, less the one the server's process takes; at least one."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def spec_of(prompt: int, output: int) -> str:
    return f"fixed:1:{prompt}:0:{output}:0"


def session_workload(prompt: int, output: int) -> Workload:
    return fixed(1, initial_prompt_tokens=prompt, appended_tokens=0, output_tokens=output, tool_seconds=0.0)


def streaming_server(flush: float, flush_tokens: int | None) -> ResponsesServer:
    """An in-memory server with the settings `serve --costs zero` runs with."""
    return ResponsesServer(ApiService(costs=ZERO_COSTS, flush_interval=flush, flush_tokens=flush_tokens))


def modeled_runs(
    prompt: int, output: int, single_tps: float, tps: float, sessions: int, flush: float, flush_tokens: int | None
) -> tuple[RolloutRecord, list[RolloutRecord]]:
    """What the engine model charges for the measured sequence: the same warm-up, lone session and
    N sessions, against an in-memory server with the same settings, on the virtual clock. The
    sequence matters: the warm-up leaves the prompt's blocks in the prefix cache, so the measured
    sessions prefill only their last block, here as on the real server."""

    async def run() -> tuple[RolloutRecord, list[RolloutRecord]]:
        connector = InMemoryConnector(streaming_server(flush, flush_tokens))
        await run_sessions(connector, 1, prompt, 50, single_tps)
        (single,) = await run_sessions(connector, 1, prompt, output, single_tps)
        return single, await run_sessions(connector, sessions, prompt, output, tps)

    single, many = virtual.run(run)
    assert all(record.status == "completed" for record in (single, *many))
    return single, many


def captured_answer(prompt: int, output: int, tps: float, flush: float, flush_tokens: int | None) -> list[tuple[float, list[str]]]:
    """What the testbed's server sends a session for the measured request, after the same warm-up, on
    the virtual clock: its messages in the groups that arrive together, each group with its time
    from the request's send (which, in memory and on the virtual clock, is its arrival)."""
    workload = session_workload(prompt, output)
    body = request_body(workload, model=f"sim-{tps:g}", metadata={"testbed_workload": spec_of(prompt, output)}, store=False,
                        include_reasoning=True)
    request = {"type": "response.create", **body,
               "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task_prompt(workload)}]}]}

    async def run() -> list[tuple[float, list[str]]]:
        connector = InMemoryConnector(streaming_server(flush, flush_tokens))
        await run_sessions(connector, 1, prompt, 50, tps)
        groups: list[tuple[float, list[str]]] = []
        async with open_responses_websocket(connector, CHAINED) as ws:
            sent = trio.current_time()
            await ws.send_message(orjson.dumps(request).decode())
            while True:
                message = await ws.get_message()
                at = trio.current_time() - sent
                if groups and groups[-1][0] == at:
                    groups[-1][1].append(message)
                else:
                    groups.append((at, [message]))
                if orjson.loads(message)["type"] in TERMINAL_TYPES:
                    return groups

    return virtual.run(run)


def floor_server(answer: list[tuple[float, list[str]]], ready: Any) -> None:
    """The floor's server process: trio-websocket on 127.0.0.1 (the testbed's receive buffer) answers
    every request it reads (and parses) by sending `answer`'s groups at their times from the
    request's arrival, each in one write with any others already due; nothing else. Puts its port
    on `ready`."""
    settle_client_process()  # its collector kept as `serve` keeps its own

    async def answer_each(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            arrived = trio.current_time()
            orjson.loads(message)
            sent = 0
            while sent < len(answer):
                await trio.sleep_until(arrived + answer[sent][0])
                due = bisect.bisect_right(answer, trio.current_time() - arrived, lo=sent, key=lambda group: group[0])
                # Groups whose time has passed go out in the same write, as the testbed's writer sends
                # whatever was queued since its last write.
                await send_messages(ws, [message for _, group in answer[sent:due] for message in group])
                sent = due

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listener = await nursery.start(lambda task_status: trio_websocket.serve_websocket(
                answer_each, "127.0.0.1", 0, ssl_context=None, max_message_size=MAX_MESSAGE_BYTES,
                receive_buffer_size=WS_RECEIVE_BYTES, task_status=task_status,
            ))
            ready.put(listener.port)

    trio.run(main)


@contextmanager
def floor_process(answer: list[tuple[float, list[str]]]) -> Iterator[tuple[Any, int]]:
    """`floor_server` in a child process; yields (process, port)."""
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    process = context.Process(target=floor_server, args=(answer, ready), daemon=True)
    process.start()
    try:
        yield process, _next(ready, [process])
    finally:
        process.terminate()
        process.join()


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
    workload = session_workload(prompt, output)
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


@attrs.frozen
class LoadRun:
    """One run of the N sessions against a server process: every session's figures (`session_figures`)
    and what the processes spent."""

    figures: list
    server_cpu_s: float
    server_wait_s: float
    client_cpu_s: float
    client_wait_s: float
    connect_s: float

    @property
    def wall_s(self) -> float:
        """From the first request sent to the last terminal event received."""
        return max(f[3] for f in self.figures) - min(f[1] for f in self.figures)

    @property
    def tokens(self) -> int:
        return sum(f[4] for f in self.figures)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def load_run(pid: int, port: int, args: argparse.Namespace) -> LoadRun:
    """The N sessions against the server process `pid` listening on `port`."""
    cpu0, wait0 = cpu_seconds(pid), run_delay_seconds(pid)
    figures, client_cpu, client_wait, connect_s = run_client_processes(
        port, args.client_processes, args.sessions, args.prompt, args.output, args.tps
    )
    bad = [f[0] for f in figures if f[0] != "completed"]
    if bad:
        raise RuntimeError(f"sessions ended {bad[:3]}")
    return LoadRun(figures, cpu_seconds(pid) - cpu0, run_delay_seconds(pid) - wait0, client_cpu, client_wait, connect_s)


def session_lateness(runs: list[LoadRun], modeled_stream: float, modeled_ttft: float) -> dict[str, list[float]]:
    """Every session's stream lag, first delta's lateness (ms) and tail (ms), over all the runs."""
    figures = [f for run in runs for f in run.figures]
    return {
        "lag": [(f[3] - f[2]) / modeled_stream - 1 for f in figures],
        "first_late_ms": [(f[2] - f[1] - modeled_ttft) * 1000 for f in figures],
        "tail_ms": [(f[3] - f[6]) * 1000 for f in figures],
    }


def at_least_target(estimate: uncertainty.Estimate, target: float) -> str:
    """Whether `estimate` is at least `target`, on its interval."""
    if not estimate.has_interval:
        return "not separated"
    if estimate.low >= target:
        return "yes"
    return "no" if estimate.high < target else "not separated"


def measure(flush: float, flush_tokens: int | None, args: argparse.Namespace) -> dict[str, Any]:
    server_args = ["--costs", "zero", "--flush-interval", f"{flush:g}"]
    if flush_tokens:
        server_args += ["--flush-tokens", str(flush_tokens)]
    load = os.getloadavg()[0]
    modeled_single, modeled_many = modeled_runs(args.prompt, args.output, args.single_tps, args.tps, args.sessions, flush, flush_tokens)
    # One delta per token is no floor to replay: where the testbed falls behind it merges the tokens due
    # into one delta, so how many events it sends depends on how late it is (module docstring).
    floor_context = floor_process(captured_answer(args.prompt, args.output, args.tps, flush, flush_tokens)) if flush > 0 else nullcontext()
    runs: list[LoadRun] = []
    floor_runs: list[LoadRun] = []
    with server_process(*server_args) as (process, port), floor_context as floor:
        servers = [(runs, process.pid, port)] + ([(floor_runs, floor[0].pid, floor[1])] if floor else [])
        for _, _, warmed in servers:  # warm-up: imports, tokenizer, caches
            trio.run(run_sessions, TcpConnector("127.0.0.1", warmed), 1, args.prompt, 50, args.single_tps)
        single = trio.run(run_sessions, TcpConnector("127.0.0.1", port), 1, args.prompt, args.output, args.single_tps,
                          clock=PreciseClock())[0]
        for repeat in range(args.repeats):  # alternating, each first in turn: both meet the same machine
            for into, pid, at in servers if repeat % 2 == 0 else servers[::-1]:
                into.append(load_run(pid, at, args))
    if single.status != "completed":
        raise RuntimeError(f"the lone session ended {single.status!r}")
    (sent, first, ended), (m_sent, m_first, m_ended) = turn_seconds(single), turn_seconds(modeled_single)
    modeled = [turn_seconds(record) for record in modeled_many]
    modeled_wall = max(m[2] for m in modeled) - min(m[0] for m in modeled)
    limit = sum(record.usage["output_tokens"] for record in modeled_many) / modeled_wall
    # The sessions are alike and start together: each stream is set against the modeled streams' median.
    modeled_stream = float(np.median([m[2] - m[1] for m in modeled]))
    modeled_ttft = float(np.median([m[1] - m[0] for m in modeled]))
    late = session_lateness(runs, modeled_stream, modeled_ttft)
    rates = [run.tokens_per_s for run in runs]
    agg = uncertainty.bootstrap(rates, np.mean, of="runs")
    wall = sum(run.wall_s for run in runs)
    tokens = sum(run.tokens for run in runs)
    load = max(load, os.getloadavg()[0])
    row = {
        "flush_ms": flush * 1000,
        "flush_tokens": flush_tokens or "",
        "lag_1": (ended - first) / (m_ended - m_first) - 1,
        "turn_lag_1": (ended - sent) / (m_ended - m_sent) - 1,
        "sessions": args.sessions,
        "repeats": args.repeats,
        "offered_tokens_per_s": args.sessions * args.tps,
        "limit_tokens_per_s": limit,
        "agg_tokens_per_s": agg.value, "agg_low": agg.low, "agg_high": agg.high,
        "limit_share": agg.value / limit,
        "lag_n_p50": float(np.percentile(late["lag"], 50)),
        "lag_n_p99": float(np.percentile(late["lag"], 99)),
        "first_late_ms_p50": float(np.percentile(late["first_late_ms"], 50)),
        "first_late_ms_p99": float(np.percentile(late["first_late_ms"], 99)),
        "tail_ms_p50": float(np.percentile(late["tail_ms"], 50)),
        "tail_ms_p99": float(np.percentile(late["tail_ms"], 99)),
        "events_per_s": sum(f[5] for run in runs for f in run.figures) / wall,
        "server_core_share": sum(run.server_cpu_s for run in runs) / wall,
        "server_waiting_share": sum(run.server_wait_s for run in runs) / wall,
        "server_cpu_us_per_token": sum(run.server_cpu_s for run in runs) / tokens * 1e6,
        "client_processes": args.client_processes,
        "client_core_share": sum(run.client_cpu_s for run in runs) / wall,
        "client_waiting_share": sum(run.client_wait_s for run in runs) / wall,
        "connect_s": float(np.median([run.connect_s for run in runs])),
        "load_avg": load,
    }
    row |= floor_figures(rates, floor_runs, limit, modeled_stream, modeled_ttft, load)
    return {column: row[column] for column in COLUMNS}


def floor_figures(rates: list[float], floor_runs: list[LoadRun], limit: float, modeled_stream: float, modeled_ttft: float,
                  load: float) -> dict[str, Any]:
    """The floor's columns from its runs (none: every column empty) and the testbed's rates of the same repeats."""
    if not floor_runs:
        return dict.fromkeys(FLOOR_COLUMNS, "")
    late = session_lateness(floor_runs, modeled_stream, modeled_ttft)
    floor_rates = [run.tokens_per_s for run in floor_runs]
    floor = uncertainty.bootstrap(floor_rates, np.mean, of="runs")
    share = uncertainty.paired_bootstrap(rates, floor_rates, lambda a, b: np.sum(a) / np.sum(b), of="runs")
    return {
        "floor_tokens_per_s": floor.value, "floor_low": floor.low, "floor_high": floor.high,
        "floor_share": share.value, "floor_share_low": share.low, "floor_share_high": share.high,
        "floor_limit_share": floor.value / limit,
        "floor_lag_n_p50": float(np.percentile(late["lag"], 50)),
        "floor_first_late_ms_p50": float(np.percentile(late["first_late_ms"], 50)),
        "floor_tail_ms_p50": float(np.percentile(late["tail_ms"], 50)),
        "floor_cpu_us_per_token": sum(run.server_cpu_s for run in floor_runs) / sum(run.tokens for run in floor_runs) * 1e6,
        "target_floor_share": TARGET_FLOOR_SHARE,
        "met": "loaded" if machine_loaded(load) else at_least_target(share, TARGET_FLOOR_SHARE),
    }


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
    parser.add_argument("--repeats", type=at_least(1), default=5,
                        help="runs of the N sessions against the testbed and against the floor, alternating (default 5)")
    parser.add_argument("--client-processes", type=at_least(1), default=cores,
                        help=f"processes the N sessions are spread over (default {cores}: the cores the server's process leaves free)")
    parser.add_argument("--csv", default="streaming.csv", help="CSV file name in results/streaming/<timestamp>/ (default streaming.csv)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    print(
        f"{args.sessions} sessions x {args.output} output tokens at {args.tps:g} tokens/s each; lone session at "
        f"{args.single_tps:g} tokens/s; prompt {args.prompt} tokens; API stage costs zero; server and client on this machine; "
        f"{args.repeats} runs against the testbed and against the stack's floor, alternating; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    grid = [(flush, flush_tokens or None) for flush_tokens in args.flush_tokens for flush in args.flush_intervals]
    rows = sweep.measured(lambda point: measure(*point, args), grid, desc="streaming")
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
