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

Per (design, fault, policy), over the tasks, each figure with its 95% interval: the faults the tasks
met (failures a client recovered from, fell back to HTTP after, or gave up on; per task, exact
Poisson); tasks given up (exact binomial); time lost per task (end-to-end time minus the same task's
with no fault, same design and policy; a task given up is charged all the time it ran, since it must
be run again; a bootstrap over the tasks); kilobytes resent per task (retried requests and
full-context resends); reconnects per task; recovery time (from a failure to the first event of the
retried response, p50 and max); tasks that fell back to HTTP; and completed tasks whose conversation
is item for item the fault-free one (the retries lost and repeated nothing). Then the time lost of
v1 over v2 and of v2 over http, paired over the tasks, each a statement only where its interval
excludes 1 and both cells met at least 30 faults. It writes faults.csv (the cells), faults_tasks.csv
(the tasks) and faults.json (the figures the docs quote) into results/faults/<timestamp>/.

    python -m experiments.faults [--tasks 150] [--speed 1000] [--faults drops restart ...]
    python -m experiments.faults --from-tasks results/faults/latest/faults_tasks.csv   # the tables again, running nothing
"""

from __future__ import annotations

import csv
import hashlib
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import orjson
import trio

from prototype import benchmark, headline, netem, sweep, uncertainty, virtual
from prototype import workload as wl
from prototype.api.service import ApiService, IdFactory
from prototype.cli.common import at_least, plural
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

from .common import experiment_parser, print_table, run_dir, write_csv

IDS = "0" * 12  # the prefix of every id a run's servers give (IdFactory's random prefix is 12 hex digits)
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

    @property
    def breaks(self) -> bool:
        """Whether it ends connections or responses (drops, restarts, engine failures), so that its cost comes in
        faults a client meets; a slow or lossy network costs time on every task without one."""
        return self.links.any or self.restart_every_s > 0 or self.engine_failure_p > 0


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
    # Ids from a fixed prefix: a server's ids are otherwise drawn at random, and their tokens change what a context
    # resent with them costs, so a row would differ from run to run by milliseconds.
    kept = ({"new_id": IdFactory(prefix=IDS)} if before is None
            else {"store": before.api.store, "workloads": before.api.workloads, "new_id": before.api.new_id})
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
        "breaks": run.fault.breaks,
    } for r in records]


# A ratio between two cells is stated only where each rests on at least this many fault events: the exact
# Poisson interval of 30 events spans 20-43, -33% to +43% of the count; fewer events give a wider one.
MIN_EVENTS = 30
# The ratios docs/results.md states: what the first design's faults cost over the second's, on the same tasks.
RATIOS = ((SUSPENDED, CHAINED), (CHAINED, "http"))
# Tasks at the defaults: enough that each cell behind a ratio docs/results.md states meets at least MIN_EVENTS faults
# (the rarest, an engine failure at 0.2% of flushes, comes about once in four tasks).
DEFAULT_TASKS = 150


def faults_met(row: dict[str, Any]) -> int:
    """The failures a task's client met: each run of consecutive failures (a connection lost other than by a clean
    close, or a response that failed) counts once, whether the client recovered from it, fell back to HTTP after
    it, or gave up on it. An HTTP client's kept-alive connection found closed before its request is no failure:
    the request goes out on a new connection at once, as after the server's idle timeout."""
    return len(row["recovery_s"]) + int(row["fell_back"]) + int(row["status"] != "completed")


def time_lost(row: dict[str, Any], clean: dict[str, Any]) -> float:
    """What the faults cost the task: its end-to-end time minus the same task's without faults (same design and
    policy). A task that did not complete (its client gave up) is charged all the time it ran: the user then starts
    it again, which takes the fault-free time again (a rerun assumed to meet no fault), so what the faults cost is
    the time until the give-up. Give-ups are never left out, which would make a client that gives up look cheap."""
    if row["status"] != "completed":
        return row["e2e_s"]
    return row["e2e_s"] - clean["e2e_s"]


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (design, fault, policy) against the same design and policy with no fault: counts over tasks
    with their exact intervals (faults and reconnects per task: Poisson; give-ups: binomial), means over tasks with
    a bootstrap interval over the tasks, the recovery median with one over the recoveries. `left_out`: tasks that
    did not complete without faults either, left out of a faulted cell."""
    baseline = {(r["design"], r["policy"], r["task"]): r for r in rows if r["fault"] == "none"}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["fault"], row["policy"]), []).append(row)
    table = []
    for (design, fault, policy), everything in groups.items():
        # A task that does not complete without faults either (a policy that ends a task at the connection's time
        # limit) says nothing about what faults cost: it is left out of the cells with faults, and counted.
        group = [r for r in everything if fault == "none" or baseline[(design, policy, r["task"])]["status"] == "completed"]
        clean = [baseline[(design, policy, r["task"])] for r in group]
        done = [(r, b) for r, b in zip(group, clean) if r["status"] == "completed"]
        lost = [time_lost(r, b) for r, b in zip(group, clean)]
        recovery = [s for r in group for s in r["recovery_s"]]
        tasks = len(group)
        table.append({
            "design": design, "fault": fault, "policy": policy, "tasks": tasks, "left_out": len(everything) - tasks,
            "breaks": group[0]["breaks"],
            "faults": (events := sum(faults_met(r) for r in group)),
            "faults_per_task": uncertainty.events_per(events, tasks),
            "gave_up": uncertainty.rate(tasks - len(done), tasks, of="tasks"),
            "time_lost_s": uncertainty.bootstrap(lost),
            "reconnects_per_task": uncertainty.events_per(sum(r["reconnects"] for r in group), tasks, of="reconnects"),
            "resent_kb": uncertainty.bootstrap([r["resent_bytes"] / 1000 for r in group]),
            "recovery_p50_s": uncertainty.bootstrap(recovery, np.median, of="recoveries"),
            "recovery_max_s": max(recovery) if recovery else float("nan"),
            "fell_back": sum(1 for r in group if r["fell_back"]),
            "same_conversation": sum(1 for r, b in done if r["transcript"] == b["transcript"]),
            "lost_by_task": dict(zip((r["task"] for r in group), lost)),
        })
    order = {d: i for i, d in enumerate(DESIGNS)}
    faults = list(FAULT_MODELS)
    table.sort(key=lambda r: (faults.index(r["fault"]) if r["fault"] in faults else 99, r["policy"], order.get(r["design"], 99)))
    return table


def ratios(table: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each fault and policy, the time lost of each pair in `RATIOS` (first over second): the ratio of the two
    designs' total time lost on the same tasks, with a paired bootstrap interval over the tasks. `events` is the
    smaller of the two cells' fault counts; `carried` says whether the pair's statement stands: both cells rest on
    at least `MIN_EVENTS` faults (for a fault model that breaks something) and the interval lies above 1 ("more"),
    below it ("less"), or neither."""
    cells = {(r["design"], r["fault"], r["policy"]): r for r in table}
    out = []
    for row in table:
        for first, second in RATIOS:
            other = cells.get((second, row["fault"], row["policy"]))
            if row["design"] != first or row["fault"] == "none" or other is None:
                continue
            tasks = sorted(set(row["lost_by_task"]) & set(other["lost_by_task"]))
            mine, theirs = [row["lost_by_task"][t] for t in tasks], [other["lost_by_task"][t] for t in tasks]
            if sum(theirs) > 0:
                ratio = uncertainty.paired_bootstrap(mine, theirs, _ratio_of_totals, of="tasks")
            else:  # the second design lost no time: no ratio
                ratio = uncertainty.Estimate(math.nan, math.nan, math.nan, len(tasks), "tasks", "paired bootstrap")
            events = min(row["faults"], other["faults"])
            out.append({"fault": row["fault"], "policy": row["policy"], "pair": f"{first} / {second}", "ratio": ratio,
                        "events": events, "carried": verdict(ratio, events if row["breaks"] else None)})
    return out


def _ratio_of_totals(first: np.ndarray, second: np.ndarray) -> float:
    return float(first.sum() / second.sum())


def verdict(ratio: uncertainty.Estimate, events: int | None) -> str:
    """Whether a ratio of time lost carries a statement: "more" or "less" where the interval excludes 1 and both
    cells rest on `MIN_EVENTS` faults, "not separated" where the interval holds 1, "too few faults" otherwise.
    `events` None: a fault model that breaks nothing (loss, jitter), whose cost is in every task, not in faults:
    the interval over the tasks decides alone."""
    if events is not None and events < MIN_EVENTS:
        return f"too few faults (< {MIN_EVENTS})"
    if ratio.has_interval and ratio.low > 1:
        return "more"
    if ratio.has_interval and ratio.high < 1:
        return "less"
    return "not separated"


COLUMNS = ("fault", "policy", "design", "tasks", "faults", "faults_per_task", "gave_up", "time_lost_s", "resent_kb",
           "reconnects_per_task", "recovery_p50_s", "recovery_max_s", "fell_back", "same_conversation", "left_out")


def count_and_share(estimate: uncertainty.Estimate) -> str:
    """A rate as its count of the trials and the interval of its share: `0 [0%, 5%]`."""
    if not estimate.n:
        return "-"
    return f"{round(estimate.value * estimate.n)} [{estimate.low:.0%}, {estimate.high:.0%}]"


FORMATS = {
    "faults_per_task": lambda e: e.format("{:.2f}"),
    "gave_up": count_and_share,
    "time_lost_s": lambda e: e.format("{:.2f}"),
    "resent_kb": lambda e: e.format("{:.0f}"),
    "reconnects_per_task": lambda e: e.format("{:.2f}"),
    "recovery_p50_s": lambda e: e.format("{:.2f}") if e.n else "-",
}


def csv_rows(table: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table as flat CSV rows: each estimate as its value with `_low`, `_high` and `_n` beside it."""
    out = []
    for row in table:
        flat: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, uncertainty.Estimate):
                flat.update({key: value.value, f"{key}_low": value.low, f"{key}_high": value.high, f"{key}_n": value.n})
            elif key != "lost_by_task":
                flat[key] = value
        out.append(flat)
    return out


def headline_section(table: Sequence[dict[str, Any]], pairs: Sequence[dict[str, Any]], *, name: str, command: str,
             workload: str, first_tasks: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the docs quote, as data: every cell's time lost, faults per task, give-ups and bytes resent, every ratio,
    and the tables docs/results.md prints (time lost and kilobytes resent per cell, ratios), each per policy; as its
    data, each cell's first task as faults_tasks.csv holds it (what a test runs again to find the committed data
    stale)."""
    figures: dict[str, dict[str, Any]] = {}
    for row in table:
        key = f"{row['fault']}.{row['policy']}.{row['design']}"
        where = f"{row['design']} under {row['fault']} with {row['policy']}'s reconnects"
        figures[f"{key}.time_lost"] = headline.figure(row["time_lost_s"], "{:.2f} s", label=f"time lost per task, {where} (give-ups charged)")
        figures[f"{key}.faults_per_task"] = headline.figure(row["faults_per_task"], "{:.2f}", label=f"faults met per task, {where}")
        figures[f"{key}.gave_up"] = headline.figure(row["gave_up"], "{:.0%}", label=f"tasks given up, {where}")
        figures[f"{key}.resent_kb"] = headline.figure(row["resent_kb"], "{:.0f} KB", label=f"kilobytes resent per task, {where}")
    for pair in pairs:
        first, second = pair["pair"].split(" / ")
        figures[f"{pair['fault']}.{pair['policy']}.{first}_over_{second}"] = headline.figure(
            pair["ratio"], "{:.2f}x", label=f"time lost, {first} over {second}, under {pair['fault']} with {pair['policy']}'s "
            f"reconnects, paired over the tasks; the smaller cell met {pair['events']} faults; {pair['carried']}")
    tables: dict[str, dict[str, Any]] = {}
    designs = [d for d in DESIGNS if any(r["design"] == d for r in table)]
    for policy in dict.fromkeys(r["policy"] for r in table):
        cells = {(r["fault"], r["design"]): r for r in table if r["policy"] == policy and r["fault"] != "none"}
        faults = list(dict.fromkeys(f for f, _ in cells))
        tables[f"time_lost.{policy}"] = headline.table(["fault", *designs], [
            [fault, *(_cell(cells.get((fault, d))) for d in designs)] for fault in faults])
        tables[f"resent_kb.{policy}"] = headline.table(["fault", *designs], [
            [fault, *(cells[(fault, d)]["resent_kb"].format("{:.0f}") if (fault, d) in cells else "-" for d in designs)]
            for fault in faults])
        mine = [p for p in pairs if p["policy"] == policy]
        names = list(dict.fromkeys(p["pair"] for p in mine))
        by = {(p["fault"], p["pair"]): p for p in mine}
        tables[f"ratios.{policy}"] = headline.table(["fault", *names], [
            [fault, *(_ratio_cell(by.get((fault, n))) for n in names)] for fault in dict.fromkeys(p["fault"] for p in mine)])
    return headline.section(name, command=command, workload=workload, figures=figures, tables=tables,
                            data=list(first_tasks) if first_tasks is not None else None)


def _cell(row: dict[str, Any] | None) -> str:
    """A docs table's cell: time lost per task with its interval, and the faults it rests on."""
    if row is None:
        return "-"
    gave_up = round(row["gave_up"].value * row["tasks"])
    return (f"{row['time_lost_s'].format('{:.2f}')} s; {plural(row['faults'], 'fault')}"
            + (f"; {gave_up} gave up" if gave_up else ""))


def _ratio_cell(pair: dict[str, Any] | None) -> str:
    if pair is None:
        return "-"
    return f"{pair['ratio'].format('{:.2f}')}: {pair['carried']}"


def command_line(argv: Sequence[str]) -> str:
    """The command that makes these figures: the options that change them (the runner's do not)."""
    runner = {"--jobs", "--cluster"}
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in runner:
            skip = True
        elif arg not in ("--in-process", "--no-cache") and not arg.startswith(("--jobs=", "--cluster=")):
            kept.append(arg)
    return " ".join(["python -m experiments.faults", *kept])


def write_headline(path: Path, table: Sequence[dict[str, Any]], pairs: Sequence[dict[str, Any]], *, command: str,
                   workload: str, rows: Sequence[dict[str, Any]] = ()) -> Path:
    """results/faults/<timestamp>/faults.json: the headline section the docs' figures are taken from."""
    return headline.write(path, {"headline": headline_section(table, pairs, name=path.stem, command=command, workload=workload,
                                                              first_tasks=first_tasks(rows))})


def first_tasks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (design, fault, policy) cell's first task, as faults_tasks.csv holds it."""
    first: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        first.setdefault((row["design"], row["fault"], row["policy"]), row)
    return task_csv_rows(list(first.values()))


# The per-task rows as faults_tasks.csv keeps them: enough to make every table again (`--from-tasks`).
TASK_COLUMNS = ("design", "fault", "policy", "task", "status", "e2e_s", "reconnects", "resent_bytes", "recovery_s",
                "retried_responses", "fell_back", "breaks", "transcript")


def task_csv_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each task's row with its recoveries as one field and its conversation as a digest (what the tables compare)."""
    return [{**{c: row[c] for c in TASK_COLUMNS}, "recovery_s": " ".join(repr(s) for s in row["recovery_s"]),
             "transcript": _digest(row["transcript"])} for row in rows]


def _digest(transcript: Any) -> str:
    if isinstance(transcript, str):
        return transcript
    return hashlib.sha256(orjson.dumps(transcript, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def read_task_rows(path: Path) -> list[dict[str, Any]]:
    """faults_tasks.csv back as rows `summarize` takes (floats written by repr read back exactly)."""
    with open(path, newline="") as f:
        return [{**row, "e2e_s": float(row["e2e_s"]), "reconnects": int(row["reconnects"]),
                 "resent_bytes": int(row["resent_bytes"]), "recovery_s": [float(x) for x in row["recovery_s"].split()],
                 "retried_responses": int(row["retried_responses"]), "fell_back": row["fell_back"] == "True",
                 "breaks": row["breaks"] == "True"} for row in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--tasks", type=at_least(1), default=DEFAULT_TASKS, help=f"coding tasks per design (default {DEFAULT_TASKS})")
    parser.add_argument("--turns", type=at_least(1), default=None, help="fix the turns per task (default: drawn from the preset)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--speed", type=float, default=1000.0, help="decode tokens/s (default 1000)")
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=DESIGNS, help="designs (default all)")
    parser.add_argument("--faults", nargs="+", default=list(FAULT_MODELS), choices=list(FAULT_MODELS),
                        help="fault models (default all; 'none' is always run, as the baseline)")
    parser.add_argument("--policies", nargs="+", default=[OPENAI_PYTHON.name, CODEX.name], choices=list(POLICIES),
                        help="reconnect policies (default openai-python codex)")
    parser.add_argument("--csv", default="faults.csv", help="file name under results/ (default faults.csv)")
    parser.add_argument("--from-tasks", default=None, metavar="CSV",
                        help="run nothing: make the tables, faults.csv and faults.json again from a run's faults_tasks.csv")
    sweep.add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    command, workload = command_line(argv), f"{args.tasks} coding tasks (seed {args.seed}) at {args.speed:g} tokens/s, virtual time"
    if args.from_tasks:
        source = Path(args.from_tasks)
        rows, folder = read_task_rows(source), source.parent
        made = folder / Path(args.csv).with_suffix(".json").name
        if made.exists():  # the run's own command and workload
            before = headline.headline_of(made)
            command, workload = before["command"], before["workload"]
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        faults = list(dict.fromkeys(r["fault"] for r in rows))
    else:
        config = benchmark.BenchConfig(n_tasks=args.tasks, seed=args.seed, fixed_turns=args.turns)
        faults = ["none", *[f for f in args.faults if f != "none"]]
        policies = args.policies
        grid = [FaultRun(design, FAULT_MODELS[fault], POLICIES[policy], args.speed, config)
                for fault in faults for policy in policies for design in args.designs]
        with sweep.runner_from_args(args) as runner:
            results = runner.map(fault_records, grid, desc="faults", first=lambda run: run.fault.restart_every_s > 0)
        rows = [row for rows in results for row in rows]
        folder = run_dir(Path(args.csv).stem)
        write_csv(folder / f"{Path(args.csv).stem}_tasks.csv", task_csv_rows(rows))
    table = summarize(rows)
    tasks = max(r["tasks"] for r in table)
    print(f"\n{workload}. Each figure: value [95% interval]; faults per task and reconnects per task exact Poisson, "
          f"gave_up exact binomial (count [share interval]), time lost and resent KB a bootstrap over the tasks, the "
          f"recovery median one over the recoveries. time lost = end-to-end time minus the same task's without faults; "
          f"a task that gave up is charged all the time it ran (it must be run again)")
    print_table(table, COLUMNS, FORMATS)
    path = folder / args.csv
    write_csv(path, csv_rows(table))
    print(f"wrote {path}")
    pairs = ratios(table)
    if pairs:
        print(f"\nTime lost, one design over another on the same tasks (paired bootstrap over the tasks); a statement "
              f"stands where the interval excludes 1 and, for a fault model that breaks something, both cells rest on at "
              f"least {MIN_EVENTS} faults:")
        print_table(pairs, ("fault", "policy", "pair", "ratio", "events", "carried"), formats={"ratio": lambda e: e.format("{:.2f}")})
    thin = sorted({r["fault"] for r in pairs if r["carried"].startswith("too few")}, key=faults.index)
    if thin:
        print(f"\nNot for conclusions: at {tasks} tasks the ratios under {', '.join(thin)} rest on fewer than "
              f"{MIN_EVENTS} faults in a cell.")
    print(f"wrote {write_headline(path.with_suffix('.json'), table, pairs, command=command, workload=workload, rows=rows)}")
    print("\nFault models [assumed rates]:")
    for name in faults:
        if name in FAULT_MODELS:
            print(f"  {name:<13} {describe(FAULT_MODELS[name])}")
    for policy in policies:
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
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
