"""Load: N concurrent sessions of each WebSocket design over real loopback sockets.

For each design (suspended v1, chained v2) and each N, a fresh server runs in a child process
(`python -m prototype serve --costs zero`: no modeled API-stage cost, so what it spends is its own
work), and this process runs N rollouts at once against it with the harness over TCP. Every rollout
is the same fixed task, `fixed:<turns>:<prompt>:<appended>:<output>:<tool s>`, at model
`sim-100000` (100,000 tokens/s: decoding is modeled as almost nothing).

Reported per design and N:

* `turns_per_s`: turns completed per second of wall time, all sessions together;
* `overhead_p50_ms`, `overhead_p99_ms`, `overhead_max_ms`: each turn's time (request sent to pause or terminal event
  received) minus what the engine model charged that very turn (request overhead, prefill of the
  tokens it did not find cached, decode), computed from the usage its pause or terminal event
  carried (`modeled_turn_seconds`): the same cache state as the real turn, which a shared prompt
  found in the prefix cache makes warmer than a lone cold run. The server starts every modeled
  wait at the request's arrival at the earliest and never ends one before its deadline, so the
  figure is never negative. What is left is real work and queueing: in the server, and in the
  client process, which shares the machine with it;
* `server_cpu_ms_per_turn` and `server_core_share` (/proc schedstat): the server's own CPU time;
  `server_waiting_share` the time it was ready to run but waited for a CPU (schedstat's run
  delay: other processes on the machine), and `client_core_share` the client processes' CPU time,
  to show which side was the bottleneck. The N sessions run in `--client-processes` processes
  (default 4), so that one Python thread parsing every session's events is not what limits the
  figures; the processes time with one system-wide monotonic clock (clock.PreciseClock);
* `kb_per_session`: (peak server RSS while the sessions are open - RSS before them) / the most
  sessions open at once (/proc/<pid>/status VmRSS, sampled every 10 ms). All sessions start
  together, so that is N; the RSS of a Python process hardly falls when sessions end, so the peak
  is the memory the N sessions needed;
* `lost`, `duplicated`: conversation items and events missing or repeated. Every transcript (of
  the rollout run alone on the server first, and of each concurrent one) must equal, item for
  item, the virtual-clock reference's, which is never replaced, and each response must carry the
  reference's events, numbered 0, 1, 2, ... to the last (a missing tail is lost). Both must be 0;
  the script exits 1 otherwise.

* `workers`: server processes (`serve --workers N`: one port, SO_REUSEPORT); the server's CPU and
  RSS are summed over the parent and its workers;
* `offered_turns_per_s`: the load the sessions offer when nothing queues. Session i sends its first
  request i x --stagger / N seconds in and each next one a modeled turn and a think time
  (--tool-seconds) after the last ended; `offered_turns_per_s` divides all their turns by the span
  from the first request to the last turn's modeled end, as `turns_per_s` divides the turns
  carried by the run's span, so the two agree when nothing queues; below saturation `turns_per_s`
  comes close to it, at saturation it falls behind and the overhead is queueing.
  `peak_turns_per_s` is the most requests sent within one second: with a stagger equal to the think
  time, N / think time, as many as the mean while all sessions are open; with a shorter stagger the
  turns arrive in waves, N / stagger a second; with none, all N in one instant. --stagger spreads
  the starts so that a think time's worth of first turns does not arrive at one instant.

    python -m experiments.load [--sessions 100 1000] [--turns 5] [--designs suspended chained] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import trio

from prototype import sweep, virtual
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative
from prototype.client.connect import InMemoryConnector, TcpConnector
from prototype.client.harness import (
    CHAINED,
    SUSPENDED,
    RolloutRecord,
    request_body,
    run_websocket_rollout,
    tool_output_text,
)
from prototype.clock import PreciseClock
from prototype.engine.latency import (
    ENGINE_REQUEST_OVERHEAD_S,
    PREFILL_TOKENS_PER_S,
    LatencyModel,
    decode_rate_for_model,
)
from prototype.server.app import ResponsesServer
from prototype.workload import Workload, fixed

from .common import (
    add_list,
    cpu_seconds,
    experiment_parser,
    process_tree,
    raise_fd_limit,
    report,
    rss_bytes,
    run_delay_seconds,
    server_process,
    settle_client_process,
)

MODEL = "sim-100000"
DESIGNS = (SUSPENDED, CHAINED)
RSS_SAMPLE_S = 0.010
COLUMNS = (
    "design", "workers", "sessions", "offered_turns_per_s", "peak_turns_per_s", "turns", "completed", "wall_s", "turns_per_s", "overhead_p50_ms", "overhead_p99_ms", "overhead_max_ms",
    "server_cpu_ms_per_turn", "server_core_share", "server_waiting_share", "client_core_share", "rss_before_mb", "rss_peak_mb", "max_open", "kb_per_session",
    "lost", "duplicated",
)


def task_of(args: argparse.Namespace | LoadRun) -> tuple[Workload, str]:
    workload = fixed(
        args.turns, initial_prompt_tokens=args.prompt, appended_tokens=args.appended, output_tokens=args.output,
        tool_seconds=args.tool_seconds,
    )
    spec = f"fixed:{args.turns}:{args.prompt}:{args.appended}:{args.output}:{args.tool_seconds:g}"
    return workload, spec


def reference(design: str, workload: Workload, spec: str) -> RolloutRecord:
    """The same rollout in-process on a virtual clock: its transcript, and each turn's modeled time."""

    async def run() -> RolloutRecord:
        server = ResponsesServer(ApiService(costs=ZERO_COSTS))
        return await run_websocket_rollout(InMemoryConnector(server), design, workload, metadata={"testbed_workload": spec}, model=MODEL)

    record = virtual.run(run)
    assert record.status == "completed", record.status
    return record


def turn_tokens(record: RolloutRecord) -> list[tuple[int, int, int] | None]:
    """Each turn's own (input, cached, output) tokens, from the usage its pause or terminal event
    carried: a v1 rollout's usage is cumulative over its segments (docs/protocol.md), so a turn of
    the same response as the one before is the difference. None: the turn carried no usage."""
    out: list[tuple[int, int, int] | None] = []
    before: dict[str, tuple[int, int, int]] = {}
    for turn in record.turns:
        usage = turn.usage
        if not usage:
            out.append(None)
            continue
        total = (usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"])
        last = before.get(turn.response_id, (0, 0, 0))
        out.append((total[0] - last[0], total[1] - last[1], total[2] - last[2]))
        before[turn.response_id] = total
    return out


def modeled_turn_seconds(record: RolloutRecord, latency: LatencyModel) -> list[float | None]:
    """What the engine model charged each turn, from its own tokens (`turn_tokens`): one model call
    (the load task's turns are one function call each) prefilling what it did not find cached,
    then decoding its output. None where the turn carried no usage."""
    return [
        None if tokens is None else latency.prefill_seconds(tokens[0] - tokens[1], tokens[1]) + latency.decode_seconds(tokens[2])
        for tokens in turn_tokens(record)
    ]


def turn_overheads(record: RolloutRecord, latency: LatencyModel) -> list[float]:
    """Each ended turn's time beyond what the engine model charged it (`modeled_turn_seconds`)."""
    return [
        (turn.ended_at - turn.sent_at) - modeled
        for turn, modeled in zip(record.turns, modeled_turn_seconds(record, latency))
        if turn.ended_at is not None and modeled is not None
    ]


def _items(record: RolloutRecord) -> Counter:
    return Counter(json.dumps(item, sort_keys=True) for item in record.transcript)


def _by_response(record: RolloutRecord) -> list[list[tuple[int, str]]]:
    """Each response's events as (sequence number, type), responses in the order they began.
    (Every received event but `error` carries a sequence number, in the timeline's order.)"""
    types = [event_type for _, direction, event_type in record.timeline if direction == "recv" and event_type != "error"]
    events: dict[str, list[tuple[int, str]]] = {}
    for (response_id, number), event_type in zip(record.sequence_numbers, types):
        events.setdefault(response_id, []).append((number, event_type))
    return list(events.values())


def _structure(events: list[tuple[int, str]]) -> Counter:
    """The events that do not depend on timing: all but deltas, which the server may coalesce
    differently run to run (`--flush-interval`); their text is checked through the transcript."""
    return Counter(event_type for _, event_type in events if not event_type.endswith(".delta"))


def lost_and_duplicated(record: RolloutRecord | None, expected: RolloutRecord) -> tuple[int, int]:
    """Items and events missing from / repeated in a session, against the reference. Strict: a
    transcript that is not the reference's, item for item, is counted; the reference
    says how many events each response has, so a missing tail (a terminal event never received)
    and a missing response are lost too."""
    want_events = _by_response(expected)
    if record is None:
        return sum(_items(expected).values()) + sum(len(seen) for seen in want_events), 0
    want, got = _items(expected), _items(record)
    lost = sum((want - got).values())
    duplicated = sum((got - want).values())
    if lost == duplicated == 0 and record.transcript != expected.transcript:
        lost = duplicated = 1  # same items in another order: counted as one of each
    got_events = _by_response(record)
    for index, seen in enumerate(got_events):
        wanted = _structure(want_events[index]) if index < len(want_events) else Counter()
        structure = _structure(seen)
        lost += sum((wanted - structure).values())  # a missing tail: the pause or terminal event
        duplicated += sum((structure - wanted).values())
        numbers = Counter(number for number, _ in seen)
        duplicated += sum(c - 1 for c in numbers.values())
        lost += max(numbers) + 1 - len(numbers)  # gaps in the numbering
    lost += sum(len(seen) for seen in want_events[len(got_events):])
    if record.status != "completed":
        lost += 1
    return lost, duplicated


def tally(alone: RolloutRecord, records: list[RolloutRecord | None], expected: RolloutRecord, design: str) -> tuple[int, int]:
    """Losses of the lone rollout and of every concurrent session, each against the virtual-clock
    reference (never replaced: a lone rollout that differs from it is itself a loss)."""
    lost = duplicated = reported = 0
    for record in [alone, *records]:
        lo, du = lost_and_duplicated(record, expected)
        lost, duplicated = lost + lo, duplicated + du
        if (lo or du) and reported < 3:
            reported += 1
            where = describe_difference(record, expected) if record is not None else "the session failed"
            print(f"  {design}: a rollout lost {lo} and repeated {du}: {where}", file=sys.stderr)
    return lost, duplicated


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def describe_difference(record: RolloutRecord, expected: RolloutRecord) -> str:
    """The first place where a transcript or a sequence of numbers departs from the reference."""
    if record.status != "completed":
        return f"status {record.status!r}"
    for index, (got, want) in enumerate(zip(record.transcript, expected.transcript)):
        if got != want:
            return f"item {index}: {json.dumps(got)[:200]} instead of {json.dumps(want)[:200]}"
    if len(record.transcript) != len(expected.transcript):
        return f"{len(record.transcript)} items instead of {len(expected.transcript)}"
    got, want = _by_response(record), _by_response(expected)
    if len(got) != len(want):
        return f"{len(got)} responses instead of {len(want)}"
    for index, (seen, wanted) in enumerate(zip(got, want)):
        if _structure(seen) != _structure(wanted):
            return f"response {index}: events {dict(_structure(seen))} instead of {dict(_structure(wanted))}"
        numbers = [number for number, _ in seen]
        if numbers != list(range(len(numbers))):
            return f"response {index}: sequence numbers {numbers[:50]}"
    return "no difference found"


def prepare_client_process(workload: Workload) -> None:
    """Before the start: what a spawned client process loads on first use (the tokenizer's tables,
    for the request's instructions and the tools' outputs) is loaded, so that no session's turn waits
    while another session of the process loads it."""
    request_body(workload, model=MODEL, metadata={}, store=False)
    tool_output_text(workload, 0, 0)
    settle_client_process()


def client_process(
    port: int, design: str, workload: Workload, spec: str, delays: list[float], start: Any, results: Any
) -> None:
    """One client process: a rollout per delay, each starting that many seconds after every
    process has passed the `start` barrier."""
    prepare_client_process(workload)
    start.wait()
    cpu_before = _own_cpu()

    async def main() -> list[RolloutRecord | None]:
        connector = TcpConnector("127.0.0.1", port)
        metadata = {"testbed_workload": spec}
        records: list[RolloutRecord | None] = []
        started = trio.current_time()

        async def one(delay: float) -> None:
            await trio.sleep_until(started + delay)
            try:
                records.append(await run_websocket_rollout(connector, design, workload, metadata=metadata, model=MODEL))
            except Exception as exc:  # noqa: BLE001 - a failed session is counted as lost and reported
                print(f"  a session failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                records.append(None)

        async with trio.open_nursery() as nursery:
            for delay in delays:
                nursery.start_soon(one, delay)
        return records

    records = trio.run(main, clock=PreciseClock())
    results.put((records, _own_cpu() - cpu_before))


def most_open(records: list[RolloutRecord | None]) -> int:
    """The most rollouts open at once, from their start and end times (one clock for all processes)."""
    edges = []
    for record in records:
        if record is not None and record.turns and record.turns[-1].ended_at is not None:
            edges += [(record.started_at, 1), (record.turns[-1].ended_at, -1)]
    open_now = peak = 0
    for _, step in sorted(edges):
        open_now += step
        peak = max(peak, open_now)
    return peak


def offered_load(modeled: Sequence[float], thinks: Sequence[float], sessions: int, stagger: float) -> tuple[float, float]:
    """(offered_turns_per_s, peak_turns_per_s) of the module docstring: when each request goes out
    if nothing queues, session i starting i * stagger / sessions seconds in and sending each next
    request `modeled[k] + thinks[k]` after turn k's. `modeled`: each turn's modeled seconds;
    `thinks`: the think time after each turn (after the last: none)."""
    offsets = [0.0]
    for turn_seconds, think in zip(modeled[:-1], thinks):
        offsets.append(offsets[-1] + turn_seconds + think)
    starts = np.arange(sessions) * stagger / sessions
    sends = np.sort(np.add.outer(starts, offsets).ravel())
    span = starts[-1] + offsets[-1] + modeled[-1]
    # The most sends in a one-second window: the windows that start at a send hold the most;
    # 1e-9 keeps a send one float step short of a whole second after another out of its window.
    within = np.searchsorted(sends, sends + 1.0 - 1e-9, side="left") - np.arange(sends.size)
    return float(sends.size / span), float(within.max())


async def run_sessions(
    port: int, pid: int, design: str, workload: Workload, spec: str, sessions: int, stagger: float = 0.0, processes: int = 1
) -> dict[str, Any]:
    """`sessions` rollouts at once in `processes` client processes (with `stagger` > 0, session i
    starts i * stagger / sessions seconds in, spreading the starts evenly); the server's RSS
    sampled all along."""
    connector = TcpConnector("127.0.0.1", port)
    metadata = {"testbed_workload": spec}
    state = {"peak_rss": 0}

    # One rollout first, alone: imports, the tokenizer and the workload cache are loaded before
    # "before", and its transcript is what every concurrent rollout must reproduce.
    alone = await run_websocket_rollout(connector, design, workload, metadata=metadata, model=MODEL)
    pids = process_tree(pid)  # the server and its workers (serve --workers N)
    context = multiprocessing.get_context("spawn")  # no trio state inherited from this process
    delays = [i * stagger / sessions for i in range(sessions)]
    shares = [delays[i::processes] for i in range(processes) if delays[i::processes]]
    start, results = context.Barrier(len(shares) + 1), context.Queue()
    workers = [
        context.Process(target=client_process, args=(port, design, workload, spec, share, start, results), daemon=True)
        for share in shares
    ]
    for worker in workers:
        worker.start()
    rss_before = sum(map(rss_bytes, pids))
    cpu_before = sum(map(cpu_seconds, pids))
    delay_before = sum(map(run_delay_seconds, pids))
    client_before = _own_cpu()

    async def sample() -> None:
        while True:
            state["peak_rss"] = max(state["peak_rss"], sum(map(rss_bytes, pids)))
            await trio.sleep(RSS_SAMPLE_S)

    records: list[RolloutRecord | None] = []
    client_cpu = 0.0
    async with trio.open_nursery() as outer:
        outer.start_soon(sample)
        await trio.to_thread.run_sync(start.wait)  # every client process imported and ready
        started = trio.current_time()
        for _ in workers:
            part, cpu = await trio.to_thread.run_sync(results.get)
            records += part
            client_cpu += cpu
        wall = trio.current_time() - started
        outer.cancel_scope.cancel()
    for worker in workers:
        worker.join()
    # The sessions' own span on the clients' shared clock: not the hand-over of the records.
    spans = [(r.started_at, r.turns[-1].ended_at) for r in records if r is not None and r.turns and r.turns[-1].ended_at is not None]
    if spans:
        wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return {
        "alone": alone,
        "records": records,
        "wall": wall,
        "cpu": sum(map(cpu_seconds, pids)) - cpu_before,
        "run_delay": sum(map(run_delay_seconds, pids)) - delay_before,
        "client_cpu": client_cpu + _own_cpu() - client_before,
        "rss_before": rss_before,
        "peak_rss": max(state["peak_rss"], rss_before),
        "max_open": most_open(records),
    }


def measure(
    design: str, sessions: int, workload: Workload, spec: str, stagger: float = 0.0, workers: int = 1, processes: int = 1
) -> dict[str, Any]:
    expected = reference(design, workload, spec)
    modeled = [turn.ended_at - turn.sent_at for turn in expected.turns]
    with server_process("--costs", "zero", "--workers", str(workers)) as (process, port):  # inherits main()'s raised fd limit
        out = trio.run(run_sessions, port, process.pid, design, workload, spec, sessions, stagger, processes)
    records = out["records"]
    done = [r for r in records if r is not None and r.status == "completed"]
    latency = LatencyModel(decode_tokens_per_s=decode_rate_for_model(MODEL))  # what `serve` charges MODEL
    overheads = [overhead for record in done for overhead in turn_overheads(record, latency)]
    lost, duplicated = tally(out["alone"], records, expected, design)
    turns = sum(len(r.turns) for r in done)
    thinks = [max(turn.tool_seconds, default=0.0) for turn in workload.turns]
    offered, peak = offered_load(modeled, thinks, sessions, stagger)
    return {
        "design": design,
        "workers": workers,
        "sessions": sessions,
        "offered_turns_per_s": offered,
        "peak_turns_per_s": peak,
        "turns": turns,
        "completed": len(done),
        "wall_s": out["wall"],
        "turns_per_s": turns / out["wall"],
        "overhead_p50_ms": 1000 * float(np.percentile(overheads, 50)) if overheads else float("nan"),
        "overhead_p99_ms": 1000 * float(np.percentile(overheads, 99)) if overheads else float("nan"),
        "overhead_max_ms": 1000 * max(overheads) if overheads else float("nan"),
        "server_cpu_ms_per_turn": 1000 * out["cpu"] / max(turns, 1),
        "server_core_share": out["cpu"] / out["wall"],
        "server_waiting_share": out["run_delay"] / out["wall"],
        "client_core_share": out["client_cpu"] / out["wall"],
        "rss_before_mb": out["rss_before"] / 2**20,
        "rss_peak_mb": out["peak_rss"] / 2**20,
        "max_open": out["max_open"],
        "kb_per_session": (out["peak_rss"] - out["rss_before"]) / 1024 / max(out["max_open"], 1),
        "lost": lost,
        "duplicated": duplicated,
        "modeled_turn_ms": 1000 * statistics.fmean(modeled),
    }


@attrs.frozen
class LoadRun:
    """One point of the load grid (the task's knobs under task_of's names)."""

    design: str
    sessions: int
    workers: int
    turns: int
    prompt: int
    appended: int
    output: int
    tool_seconds: float
    stagger: float
    client_processes: int = 4


def measure_run(run: LoadRun) -> dict[str, Any]:
    workload, spec = task_of(run)
    started = time.perf_counter()
    row = measure(run.design, run.sessions, workload, spec, run.stagger, run.workers, run.client_processes)
    print(f"  {run.design} x {run.sessions}, {run.workers} worker(s): {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--sessions", at_least(1), [100, 1000], "concurrent sessions")
    parser.add_argument("--turns", type=at_least(1), default=5, help="turns per rollout (default 5)")
    add_list(parser, "--designs", str, DESIGNS, "WebSocket designs to run", choices=list(DESIGNS))
    parser.add_argument("--prompt", type=at_least(1), default=1000, help="initial prompt tokens (default 1000)")
    parser.add_argument("--appended", type=non_negative(int), default=200, help="tool output tokens per turn (default 200)")
    parser.add_argument("--output", type=at_least(1), default=50, help="output tokens per turn (default 50)")
    parser.add_argument("--tool-seconds", type=non_negative(float), default=0.2, help="client tool time per call (default 0.2)")
    parser.add_argument("--stagger", type=non_negative(float), default=0.0, help="spread the sessions' starts evenly over this many seconds (default 0: all at once)")
    add_list(parser, "--workers", at_least(1), [1], "server processes (serve --workers), each value in turn")
    parser.add_argument("--client-processes", type=at_least(1), default=4, help="client processes the sessions are spread over (default 4)")
    parser.add_argument("--csv", default="load.csv", help="CSV file name in results/<its stem>/<timestamp>/ (default load.csv)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    workload, spec = task_of(args)
    print(
        f"task {spec} at {MODEL}; modeled engine time per call: {ENGINE_REQUEST_OVERHEAD_S * 1000:g} ms + prompt/"
        f"{PREFILL_TOKENS_PER_S:g} tokens/s prefill + output/100000 tokens/s decode; API stage costs zero",
        flush=True,
    )
    grid = [LoadRun(design, sessions, workers, args.turns, args.prompt, args.appended, args.output, args.tool_seconds, args.stagger,
                    args.client_processes)
            for sessions in args.sessions for workers in args.workers for design in args.designs]
    # Real time on real sockets: one run at a time in this process, never cached (prototype/sweep.py).
    rows = sweep.measured(measure_run, grid, desc="load")
    report(rows, args.csv, COLUMNS)
    return rows


if __name__ == "__main__":
    rows = main()
    if any(row["lost"] or row["duplicated"] for row in rows):
        sys.exit(1)
