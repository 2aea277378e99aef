"""Faults: what each design pays when connections fail, with clients that reconnect as real ones do.

Every design runs the same seeded coding tasks under each fault model, with each reconnect policy
(prototype/client/reconnect.py: openai-python's, Codex's), against an in-process server on the
virtual clock. The faults are injected below the designs, never in them:

* `drops`: connections drop at random times (netem/faults.py, a Poisson process per connection);
* `mid-response`: the link breaks as the server sends a chunk, so in the middle of a response;
* `restart`: the whole server restarts (every link cut, nothing accepted for the downtime, every
  in-memory state lost: v2 caches, v1 rollouts, engine KV; the response store survives, as a
  database would);
* `rolling`: a rolling restart of `serve --workers 4` emulated in process: the workers restart one
  after another, each one's connections cut and its state lost, while the others take new connections
  (the kernel spreads connections over the listening workers, SO_REUSEPORT);
* `lossy` and `jitter`: netem profiles (1% of chunks lost once and resent after TCP's 200 ms minimum
  retransmission timeout; 80 ms RTT with 20 ms of jitter);
* `engine`: the engine fails mid-response (engine/streaming.py FaultPlan): `response.failed`, the
  connection stays up.

The fault rates are [assumed]: harsher than a good network, so that every task meets several faults
and the designs' costs show; Codex users report stream disconnects on the order of one request in
five in bad weeks (openai/codex issues on stream disconnects), which `mid-response` approaches.

Per (design, fault, policy), over the tasks: tasks failed; reconnects per task; time lost per task
(end-to-end time minus the same task's with no fault, same design and policy); kilobytes resent per
task (retried requests and full-context resends); recovery time (from a failure to the first event of
the retried response, p50 and max); tasks that fell back to HTTP; and completed tasks whose
conversation is item for item the fault-free one (the retries lost and repeated nothing).

    nice -n 5 python -m experiments.faults [--tasks 6] [--speed 1000] [--faults drops restart ...]
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import trio

from prototype import benchmark, netem, sweep, virtual
from prototype import workload as wl
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector, RoundRobinConnector
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord
from prototype.client.http import STATELESS, STORED, run_http_rollout
from prototype.client.reconnect import CODEX, OPENAI_PYTHON, POLICIES, ReconnectPolicy
from prototype.client.reconnecting import run_reconnecting_rollout
from prototype.engine.engine import Engine
from prototype.engine.streaming import FaultPlan
from prototype.netem.faults import NO_FAULTS, LinkFaults
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig

from .common import experiment_parser, report

# Designs, with the two ways to keep a conversation: in the connection (chained, suspended) or a store.
DESIGNS = ("http", "http-stored", CHAINED, "chained-stored", SUSPENDED)


@attrs.frozen
class FaultModel:
    """One way the world breaks; every field is injected below the designs."""

    name: str
    links: LinkFaults = NO_FAULTS
    network: netem.NetworkProfile = benchmark.DEFAULT_NETWORK
    restart_every_s: float = 0.0  # a (rolling) restart begins this often; 0: never
    downtime_s: float = 0.0  # how long a restarting server (or worker) accepts nothing
    workers: int = 1  # > 1: restarts are rolling, one worker at a time, `stagger_s` apart
    stagger_s: float = 30.0
    engine_failure_p: float = 0.0  # per flush of sampled text (FaultPlan.failure_p)


# [assumed] rates, chosen so that a task of a few minutes meets a few faults.
FAULT_MODELS = {
    m.name: m for m in (
        FaultModel("none"),
        FaultModel("drops", links=LinkFaults(drops_per_hour=30, seed=1)),
        FaultModel("mid-response", links=LinkFaults(drop_per_server_chunk=0.002, seed=2)),
        FaultModel("restart", restart_every_s=300, downtime_s=5),
        FaultModel("rolling", restart_every_s=300, downtime_s=5, workers=4),
        FaultModel("lossy", network=attrs.evolve(benchmark.DEFAULT_NETWORK, loss=0.01, jitter=0.005)),
        FaultModel("jitter", network=attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=0.080, jitter=0.020)),
        FaultModel("engine", engine_failure_p=0.002),
    )
}


@attrs.frozen
class FaultRun:
    """One grid point: a design's tasks under a fault model with a reconnect policy (a pure function of it)."""

    design: str
    fault: FaultModel
    policy: ReconnectPolicy
    decode_tps: float
    config: benchmark.BenchConfig


def new_server(config: benchmark.BenchConfig, fault: FaultModel, before: ResponsesServer | None = None) -> ResponsesServer:
    """A server for the benchmark; `before`: a server whose store, workload catalog and id sequence it shares
    (another worker of the same `serve --workers`, or the process it replaces after a restart: a database and
    the ids it holds outlive the process); the rest (caches, suspended rollouts, engine KV) is its own."""
    kept = {} if before is None else {"store": before.api.store, "workloads": before.api.workloads, "new_id": before.api.new_id}
    engine = Engine(faults=FaultPlan(failure_p=fault.engine_failure_p) if fault.engine_failure_p else None)
    api = ApiService(costs=config.costs, flush_interval=config.flush_interval, sprint=config.sprint, latency=config.latency,
                     http_affinity=config.http_affinity, engine=engine, **kept)
    return ResponsesServer(api, ServerConfig(suspension_ttl=benchmark.BENCH_SUSPENSION_TTL))


async def restart(worker: InMemoryConnector, config: benchmark.BenchConfig, fault: FaultModel) -> None:
    """One worker's restart: its connections cut, nothing accepted for the downtime, a fresh process."""
    worker.refusing = True
    worker.links.cut_all("server restart")
    await trio.sleep(fault.downtime_s)
    worker.server = new_server(config, fault, worker.server)
    worker.refusing = False


async def restarts(workers: list[InMemoryConnector], config: benchmark.BenchConfig, fault: FaultModel) -> None:
    while True:
        await trio.sleep(fault.restart_every_s)
        for index, worker in enumerate(workers):
            if index:
                await trio.sleep(fault.stagger_s)
            await restart(worker, config, fault)


async def run_tasks(run: FaultRun) -> list[RolloutRecord]:
    fault, config = run.fault, run.config
    # The workers share one store and one catalog, as `serve --workers N --store FILE` shares its file.
    first = new_server(config, fault)
    workers = [InMemoryConnector(first if i == 0 else new_server(config, fault, first), fault.network, faults=fault.links)
               for i in range(fault.workers)]
    connector = workers[0] if len(workers) == 1 else RoundRobinConnector(workers)
    records = []
    async with trio.open_nursery() as nursery:
        if fault.restart_every_s:
            nursery.start_soon(restarts, workers, config, fault)
        for task in config.tasks():
            records.append(await run_task(run, connector, workers, task))
        nursery.cancel_scope.cancel()
    return records


async def run_task(run: FaultRun, connector: Any, workers: list[InMemoryConnector], task: wl.Workload) -> RolloutRecord:
    metadata = {"testbed_workload": workers[0].server.api.workloads.register(task), "testbed_decode_tps": f"{run.decode_tps:g}"}
    stored = run.design.endswith("-stored")
    if run.design.startswith("http"):
        return await run_http_rollout(connector, task, variant=STORED if stored else STATELESS, metadata=metadata,
                                      include_timing=True, policy=run.policy)
    design = CHAINED if run.design.startswith(CHAINED) else SUSPENDED
    return await run_reconnecting_rollout(connector, design, task, run.policy, metadata=metadata, include_timing=True, store=stored)


def fault_records(run: FaultRun) -> list[dict[str, Any]]:
    """The grid's pure function: one row per task."""
    records = virtual.run(run_tasks, run)
    return [{
        "design": run.design, "fault": run.fault.name, "policy": run.policy.name, "task": r.workload, "status": r.status,
        "e2e_s": r.seconds, "reconnects": r.reconnects, "resent_bytes": r.resent_bytes, "recovery_s": list(r.recovery_seconds),
        "retried_responses": r.retried_responses, "fell_back": r.fell_back_to_http, "transcript": r.transcript,
    } for r in records]


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (design, fault, policy), against the same design and policy with no fault."""
    baseline = {(r["design"], r["policy"], r["task"]): r for r in rows if r["fault"] == "none"}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["fault"], row["policy"]), []).append(row)
    table = []
    for (design, fault, policy), group in groups.items():
        done = [r for r in group if r["status"] == "completed"]
        clean = [baseline.get((design, policy, r["task"])) for r in done]
        lost = [r["e2e_s"] - b["e2e_s"] for r, b in zip(done, clean) if b is not None]
        recovery = [s for r in group for s in r["recovery_s"]]
        table.append({
            "design": design, "fault": fault, "policy": policy, "tasks": len(group),
            "failed": len(group) - len(done),
            "reconnects_per_task": statistics.fmean(r["reconnects"] for r in group),
            "time_lost_per_task_s": statistics.fmean(lost) if lost else float("nan"),
            "resent_kb_per_task": statistics.fmean(r["resent_bytes"] for r in group) / 1000,
            "recovery_p50_s": float(np.percentile(recovery, 50)) if recovery else float("nan"),
            "recovery_max_s": max(recovery) if recovery else float("nan"),
            "fell_back": sum(1 for r in group if r["fell_back"]),
            "same_conversation": sum(1 for r, b in zip(done, clean) if b is not None and r["transcript"] == b["transcript"]),
        })
    order = {d: i for i, d in enumerate(DESIGNS)}
    faults = list(FAULT_MODELS)
    table.sort(key=lambda r: (faults.index(r["fault"]) if r["fault"] in faults else 99, r["policy"], order.get(r["design"], 99)))
    return table


COLUMNS = ("fault", "policy", "design", "tasks", "failed", "reconnects_per_task", "time_lost_per_task_s", "resent_kb_per_task",
           "recovery_p50_s", "recovery_max_s", "fell_back", "same_conversation")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=6, help="coding tasks per design (default 6)")
    parser.add_argument("--turns", type=int, default=None, help="fix the turns per task (default: drawn from the preset)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--speed", type=float, default=1000.0, help="decode tokens/s (default 1000)")
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=DESIGNS, help="designs (default all)")
    parser.add_argument("--faults", nargs="+", default=list(FAULT_MODELS), choices=list(FAULT_MODELS),
                        help="fault models (default all; 'none' is always run, as the baseline)")
    parser.add_argument("--policies", nargs="+", default=[OPENAI_PYTHON.name, CODEX.name], choices=list(POLICIES),
                        help="reconnect policies (default openai-python codex)")
    parser.add_argument("--csv", default="faults.csv", help="file name under results/ (default faults.csv)")
    sweep.add_arguments(parser)
    args = parser.parse_args(argv)
    config = benchmark.BenchConfig(n_tasks=args.tasks, seed=args.seed, fixed_turns=args.turns)
    faults = ["none", *[f for f in args.faults if f != "none"]]
    grid = [FaultRun(design, FAULT_MODELS[fault], POLICIES[policy], args.speed, config)
            for fault in faults for policy in args.policies for design in args.designs]
    with sweep.runner_from_args(args) as runner:
        results = runner.map(fault_records, grid, desc="faults", first=lambda run: run.fault.restart_every_s > 0)
    rows = [row for rows in results for row in rows]
    table = summarize(rows)
    print(f"\n{args.tasks} coding tasks (seed {args.seed}) at {args.speed:g} tokens/s, virtual time; "
          f"time lost = end-to-end time minus the same task's without faults")
    report(table, args.csv, COLUMNS)
    print("\nFault models [assumed rates]:")
    for name in faults:
        print(f"  {name:<13} {describe(FAULT_MODELS[name])}")
    for policy in args.policies:
        p = POLICIES[policy]
        print(f"  policy {p.name}: {p.max_retries} retries, backoff {p.initial_delay:g} s x{p.backoff_factor:g}"
              + (f" (cap {p.max_delay:g} s)" if p.max_delay != float("inf") else "") + (", then HTTP" if p.fallback_to_http else ""))
    return table


def describe(fault: FaultModel) -> str:
    parts = []
    if fault.links.drops_per_hour:
        parts.append(f"{fault.links.drops_per_hour:g} drops per connection-hour")
    if fault.links.drop_per_server_chunk:
        parts.append(f"the link breaks at {fault.links.drop_per_server_chunk:.1%} of the server's chunks")
    if fault.restart_every_s:
        what = f"rolling restart of {fault.workers} workers, {fault.stagger_s:g} s apart," if fault.workers > 1 else "server restart"
        parts.append(f"{what} every {fault.restart_every_s:g} s, {fault.downtime_s:g} s down")
    if fault.engine_failure_p:
        parts.append(f"engine fails at {fault.engine_failure_p:.1%} of flushes")
    net = fault.network
    parts.append(f"RTT {net.rtt * 1000:g} ms" + (f", jitter {net.jitter * 1000:g} ms" if net.jitter else "")
                 + (f", {net.loss:.0%} of chunks lost once (resent after 200 ms)" if net.loss else ""))
    return "; ".join(parts)


if __name__ == "__main__":
    main()
    sys.exit(0)
