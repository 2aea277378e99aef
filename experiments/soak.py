"""Soak: a long-running `serve` stays flat.

`python -m prototype serve` runs in a child process with the bounds of its per-conversation
structures set small (`--engine-sessions`, `--render-cache-tokens`, `--kv-ttl`, `--max-records`), so that they are
reached during the warm-up. This process runs `--concurrency` clients in a loop for `--seconds` of
real time, each one short conversation after another, rotating over http (stateless), v1
(suspended) and v2 (chained). Every conversation is distinct (its own `instructions`, so its own
http routing key, engine session and render-cache entries) and its transcript must equal, item for
item and event for event, the virtual-clock reference of its design (experiments/load.py's strict
check): anything else is counted lost.

Reported every `--sample` seconds: the server's RSS (/proc/<pid>/status), its open file descriptors
(/proc/<pid>/fd), and what it prints with `--stats-interval`: live trio tasks, connections, engine
KV entries and remembered sessions, render-cache tokens. At the end, after the clients stop: the
same, idle.

With `--faults`, the clients' connections break under them (prototype/netem/faults.py, on the
client's side of each socket: drops at `--drops-per-hour` per connection, and at `--drop-per-chunk`
of the chunks the server sends, so in the middle of responses), and the clients reconnect under
`--policy` (prototype/client/reconnect.py). The check is then the one the faults promise: for every
fault, each event of a response the client saw complete reached it exactly once (its sequence
numbers from 0, none missing, none repeated), and the conversation is the reference's item for item;
or the client learned that the conversation failed (its retries were spent): counted `failed`, not
lost. The server must still end idle with nothing left behind.

Exits 1 if any conversation was lost, if RSS grew by more than `--rss-growth-mb` from the end of the
warm-up (the first `--warmup` share of the run) to the end, or if the idle server still holds
tasks, connections or descriptors beyond its baseline.

    nice -n 10 python -m experiments.soak [--seconds 240] [--concurrency 12]
    nice -n 10 python -m experiments.soak --faults --seconds 90
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from prototype import virtual
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.cli.common import at_least, checked, non_negative, positive
from prototype.client.connect import InMemoryConnector, TcpConnector
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord, run_websocket_rollout
from prototype.client.http import STATELESS, run_http_rollout
from prototype.client.reconnect import POLICIES, ReconnectPolicy
from prototype.client.reconnecting import run_reconnecting_rollout
from prototype.netem.faults import LinkFaults
from prototype.server.app import ResponsesServer
from prototype.workload import fixed

from .common import experiment_parser, raise_fd_limit, report, rss_bytes
from .load import lost_and_duplicated

MODEL = "sim-100000"  # decoding is modeled as almost nothing: the server's own work dominates
TURNS, PROMPT, APPENDED, OUTPUT = 2, 300, 50, 20
SPEC = f"fixed:{TURNS}:{PROMPT}:{APPENDED}:{OUTPUT}:0"
DESIGNS = ("http", SUSPENDED, CHAINED)
# The bounds under test, small enough to be reached in the warm-up [ours].
SERVE_FLAGS = ("--costs", "zero", "--quiet", "--engine-sessions", "500", "--render-cache-tokens", "20000", "--kv-ttl", "5", "--max-records", "1000", "--stats-interval", "1")
COLUMNS = ("t_s", "conversations", "lost", "rss_mb", "fds", "tasks", "connections", "kv_entries", "engine_sessions", "render_cache_tokens")


def workload():
    return fixed(TURNS, initial_prompt_tokens=PROMPT, appended_tokens=APPENDED, output_tokens=OUTPUT, tool_seconds=0.0)


async def converse(connector: Any, design: str, instructions: str | None, policy: ReconnectPolicy | None = None) -> RolloutRecord:
    """One conversation; with `policy`, by a client that reconnects."""
    metadata = {"testbed_workload": SPEC}
    if design == "http":
        return await run_http_rollout(connector, workload(), variant=STATELESS, metadata=metadata, model=MODEL, instructions=instructions,
                                      policy=policy)
    if policy is not None:
        return await run_reconnecting_rollout(connector, design, workload(), policy, metadata=metadata, model=MODEL, instructions=instructions)
    return await run_websocket_rollout(connector, design, workload(), metadata=metadata, model=MODEL, instructions=instructions)


def faulted_lost_and_duplicated(record: RolloutRecord, expected: RolloutRecord) -> tuple[int, int]:
    """Under faults: events of the responses the client saw complete that are missing or repeated
    (each one's sequence numbers must run from 0 without a gap or a repeat), and conversation items
    missing or repeated against the reference. A conversation that ended otherwise than completed is
    not counted here: the client learned that it failed."""
    if record.status != "completed":
        return 0, 0
    lost = duplicated = 0
    want = Counter(json.dumps(item, sort_keys=True) for item in expected.transcript)
    got = Counter(json.dumps(item, sort_keys=True) for item in record.transcript)
    lost, duplicated = sum((want - got).values()), sum((got - want).values())
    if lost == duplicated == 0 and record.transcript != expected.transcript:
        lost = duplicated = 1  # the same items in another order
    completed = {rid for rid, status in record.outcomes.items() if status == "completed"}
    if not completed:
        lost += 1  # completed, but no response's terminal event arrived
    for rid in completed:
        numbers = Counter(n for r, n in record.sequence_numbers if r == rid)
        duplicated += sum(c - 1 for c in numbers.values())
        lost += max(numbers) + 1 - len(numbers)
    return lost, duplicated


def references() -> dict[str, RolloutRecord]:
    """Each design's conversation in-process on a virtual clock (instructions do not change what
    the simulated model samples, so one reference serves every conversation of a design)."""

    async def run(design: str) -> RolloutRecord:
        return await converse(InMemoryConnector(ResponsesServer(ApiService(costs=ZERO_COSTS))), design, "reference")

    out = {}
    for design in DESIGNS:
        out[design] = virtual.run(run, design)
        assert out[design].status == "completed", (design, out[design].status)
    return out


class Server:
    """The serve child process; its stdout is drained by a thread (the stats lines)."""

    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prototype", "serve", "--port", "0", *flags],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
        )
        first = self.proc.stdout.readline()
        if "listening on" not in first:
            raise RuntimeError(f"server did not start: {first!r}")
        self.port = int(first.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        self.stats: dict[str, int] = {}
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("stats "):
                self.stats = json.loads(line[6:])
            else:
                self.lines.put(line)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def sample(self, t: float, conversations: int, lost: int) -> dict[str, Any]:
        return {"t_s": round(t, 1), "conversations": conversations, "lost": lost, "rss_mb": rss_bytes(self.proc.pid) / 2**20,
                "fds": self.fds(), **{k: self.stats.get(k, -1) for k in COLUMNS[6:]}, "tasks": self.stats.get("tasks", -1)}

    def stop(self) -> int:
        self.proc.terminate()  # SIGTERM: the server drains, then exits
        return self.proc.wait(timeout=60)


async def soak(server: Server, refs: dict[str, RolloutRecord], args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, int]]:
    faults = LinkFaults(drops_per_hour=args.drops_per_hour, drop_per_server_chunk=args.drop_per_chunk) if args.faults else None
    policy = POLICIES[args.policy] if args.faults else None
    connector = TcpConnector("127.0.0.1", server.port, faults=faults)
    state = {"conversations": 0, "lost": 0, "duplicated": 0, "serial": 0, "failed": 0, "reconnects": 0, "retried": 0}
    samples: list[dict[str, Any]] = []
    started = trio.current_time()
    deadline = started + args.seconds

    async def client(index: int) -> None:
        turn = index
        while trio.current_time() < deadline:
            design = DESIGNS[turn % len(DESIGNS)]
            turn += 1
            state["serial"] += 1
            instructions = f"conversation {state['serial']}"
            try:
                record = await converse(connector, design, instructions, policy)
            except Exception as exc:  # noqa: BLE001 - a failed conversation is counted lost and reported
                print(f"  a {design} conversation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                record = None
            if record is not None and args.faults:
                lost, duplicated = faulted_lost_and_duplicated(record, refs[design])
                state["failed"] += record.status != "completed"
                state["reconnects"] += record.reconnects
                state["retried"] += record.retried_responses
            else:
                lost, duplicated = lost_and_duplicated(record, refs[design])
            state["conversations"] += 1
            state["lost"] += lost
            state["duplicated"] += duplicated

    async def sampler() -> None:
        while True:
            samples.append(server.sample(trio.current_time() - started, state["conversations"], state["lost"] + state["duplicated"]))
            print("  " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in samples[-1].items()), flush=True)
            await trio.sleep(args.sample)

    async with trio.open_nursery() as outer:
        outer.start_soon(sampler)
        async with trio.open_nursery() as clients:
            for i in range(args.concurrency):
                clients.start_soon(client, i)
        outer.cancel_scope.cancel()
    return samples, state


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--seconds", type=positive(float), default=240.0, help="real time the clients run (default 240)")
    parser.add_argument("--concurrency", type=at_least(1), default=12, help="clients at once (default 12)")
    parser.add_argument("--sample", type=positive(float), default=10.0, help="seconds between samples (default 10)")
    parser.add_argument("--warmup", type=checked(float, lambda share: 0 <= share < 1, "at least 0 and below 1"), default=0.25, help="share of the run counted as warm-up (default 0.25)")
    parser.add_argument("--rss-growth-mb", type=non_negative(float), default=16.0, help="most RSS may grow after the warm-up, MB (default 16)")
    parser.add_argument("--csv", default="soak.csv", help="file name under results/ (default soak.csv)")
    parser.add_argument("--faults", action="store_true", help="break the clients' connections; the clients reconnect")
    parser.add_argument("--drops-per-hour", type=float, default=3600.0,
                        help="with --faults: connection drops per connection-hour (default 3600: one a second)")
    parser.add_argument("--drop-per-chunk", type=float, default=0.005,
                        help="with --faults: share of the server's chunks at which the link breaks (default 0.005)")
    parser.add_argument("--policy", default="openai-python", choices=list(POLICIES), help="with --faults: the clients' reconnect policy")
    args = parser.parse_args(argv)
    raise_fd_limit()
    refs = references()
    server = Server(*SERVE_FLAGS)
    baseline_fds = server.fds()
    for _ in range(50):  # the first stats line: the idle server's own tasks
        if server.stats:
            break
        time.sleep(0.1)
    baseline_tasks = server.stats.get("tasks", -1)
    print(f"soak: {args.concurrency} clients for {args.seconds:g} s, task {SPEC} at {MODEL}, designs {', '.join(DESIGNS)}; serve {' '.join(SERVE_FLAGS)}", flush=True)
    if args.faults:
        print(f"faults: {args.drops_per_hour:g} drops per connection-hour, the link breaks at {args.drop_per_chunk:.2%} of the server's "
              f"chunks; clients reconnect as {args.policy}", flush=True)
    try:
        samples, state = trio.run(soak, server, refs, args)
        time.sleep(2.5)  # a stats line after the clients closed
        idle = server.sample(args.seconds, state["conversations"], state["lost"] + state["duplicated"])
    finally:
        code = server.stop()
    warm = [s for s in samples if s["t_s"] >= args.warmup * args.seconds]
    after_warmup = warm[0]["rss_mb"] if warm else samples[0]["rss_mb"]
    growth = idle["rss_mb"] - after_warmup
    verdict = {
        "conversations": state["conversations"],
        "lost": state["lost"],
        "duplicated": state["duplicated"],
        **({"failed_known": state["failed"], "reconnects": state["reconnects"], "retried_responses": state["retried"]} if args.faults else {}),
        "rss_after_warmup_mb": after_warmup,
        "rss_end_mb": idle["rss_mb"],
        "rss_growth_after_warmup_mb": growth,
        "rss_bound_mb": args.rss_growth_mb,
        "idle_tasks": idle["tasks"],
        "baseline_tasks": baseline_tasks,
        "idle_connections": idle["connections"],
        "idle_fds": idle["fds"],
        "baseline_fds": baseline_fds,
        "server_exit_code": code,
    }
    report([*samples, idle], args.csv, COLUMNS)
    print("\n" + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in verdict.items()))
    failures = []
    if state["lost"] or state["duplicated"]:
        failures.append(f"{state['lost']} lost and {state['duplicated']} repeated")
    if growth > args.rss_growth_mb:
        failures.append(f"RSS grew {growth:.1f} MB after the warm-up (bound {args.rss_growth_mb:g} MB)")
    if idle["connections"] != 0 or idle["fds"] > baseline_fds or idle["tasks"] != baseline_tasks:
        failures.append(
            f"the idle server holds {idle['connections']} connections, {idle['fds']} descriptors (baseline {baseline_fds}) "
            f"and {idle['tasks']} tasks (baseline {baseline_tasks})"
        )
    verdict["failures"] = failures
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return verdict


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
