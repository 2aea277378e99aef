"""The side-by-side benchmark: every design on the same tasks, at several decode speeds.

`run_design` drives one design over a set of tasks against an in-process server under virtual
time; `task_row` turns a rollout into the per-task figures the table reports; `summarize` makes the
table. The `compare` command (prototype/cli/compare.py) runs the grid, and notebooks and
experiments import the same functions.

Where a turn's time goes (per turn, from the client's records and the server's timing events):
server pre-inference by stage (validate, safety, render, route, store_read), queueing, prefill,
decode, hosted tools, blocking post-inference; the rest of the turn is network and client time.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from . import metrics, netem, uncertainty, virtual
from . import workload as wl
from .api.costs import AFTER_SPRINT, ApiCosts, SprintCosts, SprintSwitches
from .api.service import ApiService
from .client.connect import Connector, InMemoryConnector, TcpConnector
from .client.harness import CHAINED, SUSPENDED, RolloutRecord
from .client.http import STATELESS, STORED, run_http_rollout
from .client.reconnect import CODEX, ReconnectPolicy
from .client.reconnecting import run_reconnecting_rollout
from .clock import PreciseClock
from .engine import latency
from .engine.engine import HTTP_AFFINITY, Engine
from .engine.kv import BLOCK_SIZE, KV_TTL_SECONDS
from .engine.vllm_client import VllmClient, WorkerProcess, open_vllm_process
from .engine.vllm_engine import RealCall, open_vllm_engine
from .engine.vllm_models import ModelSpec
from .protocol.items import ENCRYPTED_CONTENT_MIN_CHARS
from .server.app import ResponsesServer, serve_responses
from .server.collector import short_full_collections
from .server.config import CONNECTION_LIFETIME_SECONDS, ServerConfig  # noqa: F401 - compare prints it
from .uncertainty import Estimate

HTTP = "http"
HTTP_STORED = "http-stored"
DESIGNS = (HTTP, CHAINED, SUSPENDED)
ALL_DESIGNS = (HTTP, HTTP_STORED, CHAINED, SUSPENDED)
DECODE_SPEEDS = (latency.FLAGSHIP_TOKENS_PER_S, latency.SPARK_TOKENS_PER_S, latency.SPARK_BURST_TOKENS_PER_S)
# Deltas are coalesced every 50 ms [ours]: the first token of an item still goes out at once, so
# time to first token is unchanged, and a 65 tokens/s turn costs ~150 events instead of ~500.
BENCH_FLUSH_INTERVAL = 0.05
# docs/parameters.md §5: RTT priors 1/20/80/150 ms [assumed]; a client in the same region as the API.
DEFAULT_NETWORK = netem.SAME_REGION
API_OVERHEAD_PHASES = metrics.PRE_INFERENCE + (metrics.POST,)
# The default tool-time mixture is capped at 600 s and puts 0.78% of calls past v1's default 300 s
# suspension TTL (docs/parameters.md §6): a comparison of latency lets v1 wait as long as the slowest tool,
# up to the 3600 s maximum of vLLM RFC #52113's cache_control.ttl.
BENCH_SUSPENSION_TTL = 3600.0


@attrs.frozen
class BenchConfig:
    preset: str | wl.WorkloadParams = wl.DEFAULT_PRESET  # a preset name, or parameters (a preset file)
    n_tasks: int = 20
    seed: int = 0
    network: netem.NetworkProfile = DEFAULT_NETWORK
    costs: ApiCosts = ApiCosts()
    flush_interval: float = BENCH_FLUSH_INTERVAL
    keep_alive: bool = True  # HTTP clients pool connections (openai-python uses httpx keep-alive)
    fixed_turns: int | None = None
    task_list: tuple[wl.Workload, ...] | None = None  # explicit tasks instead of the seeded preset
    sprint: SprintSwitches = AFTER_SPRINT  # the API profile: after the pre-WebSocket speed-ups
    latency: latency.LatencyModel = latency.LatencyModel()  # prefill and engine overhead (decode: per run)
    source: str | None = None  # where task_list came from (a trace), for the parameters table
    http_affinity: float = HTTP_AFFINITY  # docs/parameters.md §6 [assumed]: http turns routed back to their prefix
    # How the clients recover from a lost connection (client/reconnect.py). The workloads are a coding agent's, and
    # Codex is the agent client: past the 60-minute limit it opens a new connection and resends the context. The
    # openai-python SDK alone ends the task there (it reconnects only after its recoverable close codes).
    reconnect: ReconnectPolicy = CODEX

    def tasks(self) -> list[wl.Workload]:
        if self.task_list is not None:
            return list(self.task_list)
        overrides = {} if self.fixed_turns is None else {"fixed_turns": self.fixed_turns}
        return wl.generate(self.preset, seed=self.seed, n_tasks=self.n_tasks, **overrides)


def bench_server(config: BenchConfig, engine: Engine | None = None) -> ResponsesServer:
    """A server for the benchmark, on `engine` (default: a fresh simulated one)."""
    api = ApiService(costs=config.costs, flush_interval=config.flush_interval, sprint=config.sprint, latency=config.latency,
                     http_affinity=config.http_affinity)
    if engine is not None:
        api.engine = engine
    return ResponsesServer(api, ServerConfig(suspension_ttl=BENCH_SUSPENSION_TTL))


async def run_design(
    design: str,
    decode_tps: float,
    tasks: Sequence[wl.Workload],
    config: BenchConfig,
    *,
    server: ResponsesServer | None = None,
    connector: Connector | None = None,
) -> list[RolloutRecord]:
    """Run `tasks` through `design` against an in-process server (by default a fresh one, reached over
    memory streams through the config's network profile): one after another, or, when every task has an
    arrival time (a trace's), open-loop: each starts at its arrival, whether or not earlier ones are done."""
    server = server if server is not None else bench_server(config)
    connector = connector if connector is not None else InMemoryConnector(server, config.network)
    if tasks and all(task.arrival_s is not None for task in tasks):
        return await _run_open_loop(design, decode_tps, tasks, config, server, connector)
    return [await _run_task(design, decode_tps, task, config, server, connector) for task in tasks]


async def _run_open_loop(design: str, decode_tps: float, tasks: Sequence[wl.Workload], config: BenchConfig,
                         server: ResponsesServer, connector: Connector) -> list[RolloutRecord]:
    start = trio.current_time()
    records: list[RolloutRecord | None] = [None] * len(tasks)

    async def run_at(index: int, task: wl.Workload) -> None:
        await trio.sleep_until(start + task.arrival_s)
        records[index] = await _run_task(design, decode_tps, task, config, server, connector)

    async with trio.open_nursery() as nursery:
        for index, task in enumerate(tasks):
            nursery.start_soon(run_at, index, task)
    return records


class TaskFailed(RuntimeError):
    """A benchmark task that did not complete: the designs are compared on tasks that all finish."""


async def _run_task(design: str, decode_tps: float, task: wl.Workload, config: BenchConfig,
                    server: ResponsesServer, connector: Connector) -> RolloutRecord:
    metadata = {"testbed_workload": server.api.workloads.register(task), "testbed_decode_tps": f"{decode_tps:g}"}
    if design in (SUSPENDED, CHAINED):
        record = await run_reconnecting_rollout(connector, design, task, config.reconnect, metadata=metadata, include_timing=True)
    else:
        variant = STORED if design == HTTP_STORED else STATELESS
        record = await run_http_rollout(
            connector, task, variant=variant, metadata=metadata, keep_alive=config.keep_alive, include_timing=True,
            policy=config.reconnect,
        )
    if record.status != "completed":
        raise TaskFailed(f"{design} at {decode_tps:g} tokens/s: task {task.name} ended {record.status!r}")
    return record


def run_design_virtual(design: str, decode_tps: float, config: BenchConfig) -> list[RolloutRecord]:
    """`run_design` under a fresh virtual clock, the scheduler seeded (prototype/virtual.py): the same
    records for the same arguments, whatever ran before in the process; as fast as the CPU allows."""
    return virtual.run(run_design, design, decode_tps, config.tasks(), config)


def run_design_real(
    design: str, decode_tps: float, config: BenchConfig, *, measured: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> list[RolloutRecord]:
    """`run_design` in real time over loopback TCP: the server listens on 127.0.0.1, the client
    connects through netem (the same network profile, delaying both directions on its side).
    Timers fire at their deadlines (clock.PreciseClock), not up to 1 ms after them. `measured()` is
    entered around the run alone, after the collector's settling (a full collection of all the
    process holds, tens of milliseconds), so a CPU clock or a profiler started there sees the run's
    cost only (experiments/profile_turn.py)."""

    async def main() -> list[RolloutRecord]:
        server = bench_server(config)
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(serve_responses, server, 0))
            port = listeners[0].socket.getsockname()[1]
            connector = TcpConnector("127.0.0.1", port, config.network)
            records = await run_design(design, decode_tps, config.tasks(), config, server=server, connector=connector)
            nursery.cancel_scope.cancel()
        return records

    with short_full_collections(), measured():  # the collector settled as `serve` settles it (server/collector.py)
        return trio.run(main, clock=PreciseClock())


def run_designs_on_vllm(designs: Sequence[str], config: BenchConfig, spec: ModelSpec, *, python: str | None = None,
                        decode_tps: float = latency.SPARK_TOKENS_PER_S,
                        worker: WorkerProcess | None = None,
                        parallel: bool = False) -> dict[str, tuple[list[RolloutRecord], list[RealCall]]]:
    """Each design on the config's tasks over the real engine (vLLM, started once here), in real time
    through the config's network profile: per design its rollouts and vLLM's record of each model call.
    Every design gets an engine of its own over the one worker (its own cache salt and simulated
    bookkeeping), so none finds another's prefixes. `decode_tps` only names the model profile: vLLM
    decides when tokens are ready. `worker`: a worker already running (a test session's) instead of a new one.
    `parallel`: the designs at once, each on a worker of its own (a third of the wall time for three designs; each
    worker still has one request in flight, so its counters stay exact, but the designs share the CPU)."""

    Results = dict[str, tuple[list[RolloutRecord], list[RealCall]]]

    async def run_on(client: VllmClient, design: str, run: str, results: Results) -> None:
        async with open_vllm_engine(spec, client=client, namespace=f"{design}-{run}") as engine:
            records = await run_design(design, decode_tps, config.tasks(), config, server=bench_server(config, engine))
            results[design] = (records, list(engine.records))

    async def on_own_worker(design: str, run: str, results: Results) -> None:
        async with open_vllm_process(spec, python=python) as client:
            await run_on(client, design, run, results)

    async def main() -> Results:
        results: Results = {}
        run = secrets.token_hex(4)  # a worker that served other runs holds their prefixes: this run finds none
        if parallel and worker is None:
            async with trio.open_nursery() as nursery:
                for design in designs:
                    nursery.start_soon(on_own_worker, design, run, results)
            return {design: results[design] for design in designs}
        connect = VllmClient.over_fds(worker) if worker is not None else open_vllm_process(spec, python=python)
        async with connect as client:
            for design in designs:
                await run_on(client, design, run, results)
        return results

    return trio.run(main, clock=PreciseClock())


@attrs.frozen
class DesignRun:
    """One point of a grid (prototype/sweep.py): a design at a decode speed on a configuration's
    tasks, under virtual time, or in real time over loopback with `real` (not a pure function:
    the runner runs those one at a time and never caches them)."""

    design: str
    decode_tps: float
    config: BenchConfig
    real: bool = False

    def records(self) -> list[RolloutRecord]:
        return (run_design_real if self.real else run_design_virtual)(self.design, self.decode_tps, self.config)


def design_records(run: DesignRun) -> list[RolloutRecord]:
    """The rollouts of one grid point (for timelines; `design_rows` for tables)."""
    return run.records()


def design_rows(run: DesignRun) -> list[dict[str, Any]]:
    """The task rows (`task_row`) of one grid point."""
    return [task_row(run.design, run.decode_tps, record) for record in run.records()]


def design_sweep(
    runner: Any,
    name: str,
    values: Sequence[Any],
    configure: Callable[[Any], tuple[float, BenchConfig]],
    *,
    designs: Sequence[str] = DESIGNS,
) -> list[dict[str, Any]]:
    """Every design at every value of a swept parameter, through `runner` (a sweep.Runner);
    `configure(value)` gives the decode speed and the BenchConfig for that value. Returns the task
    rows with the swept value under `name`."""
    points = [(value, DesignRun(design, float(tps), config)) for value in values
              for tps, config in [configure(value)] for design in designs]
    results = runner.map(design_rows, [run for _, run in points], desc=name)
    return [{name: value, **row} for (value, _), rows in zip(points, results) for row in rows]


def turn_phases(record: RolloutRecord) -> list[dict[str, float]]:
    """Seconds per phase for each turn: the server's phases plus `network_client` (the rest of the
    turn's wall time) and `tool` (client tool time after the turn)."""
    out = []
    for turn in record.turns:
        server = {k: v / 1000 for k, v in ((turn.server_timing or {}).get("phases_ms") or {}).items()}
        server.pop(metrics.POST_OVERLAPPED, None)  # after the terminal event: not in the turn
        wall = turn.ended_at - turn.sent_at
        phases = dict(server)
        phases["network_client"] = max(0.0, wall - sum(server.values()))
        phases["tool"] = turn.tool_seconds
        out.append(phases)
    return out


def task_row(design: str, decode_tps: float, record: RolloutRecord) -> dict[str, Any]:
    phases = turn_phases(record)
    api_overhead = sum(p.get(k, 0.0) for p in phases for k in API_OVERHEAD_PHASES)
    totals: dict[str, float] = {}
    for p in phases:
        for k, v in p.items():
            totals[k] = totals.get(k, 0.0) + v
    return {
        "design": design,
        "decode_tps": decode_tps,
        "task": record.workload,
        "turns": len(record.turns),
        "e2e_s": record.seconds,
        "ttft_s": [t.ttft for t in record.turns if t.ttft is not None],
        "api_overhead_s": api_overhead,
        "bytes_sent_per_turn": statistics.fmean(t.bytes_sent for t in record.turns),
        "bytes_received_per_turn": statistics.fmean(t.bytes_received for t in record.turns),
        "input_tokens": record.usage["input_tokens"],
        "cached_tokens": record.usage["cached_tokens"],
        "output_tokens": record.usage["output_tokens"],
        "reasoning_tokens": record.usage.get("reasoning_tokens", 0),
        "web_searches": sum(1 for item in record.transcript if item.get("type") == "web_search_call"),
        "function_calls": sum(1 for item in record.transcript if item.get("type") == "function_call"),
        "phase_totals_s": totals,
        "reconnects": record.reconnects,
        "resent_bytes": record.resent_bytes,
        "recovery_s": list(record.recovery_seconds),
        "fell_back_to_http": record.fell_back_to_http,
    }


# The figures `summarize` gives with a 95% interval over the tasks (prototype/uncertainty.py), each a column with
# `<name>_low` and `<name>_high` beside it; their n is the `tasks` column. A ratio to http (speedup, gain, TTFT
# ratio) resamples the tasks of both designs together: they ran the same tasks.
ESTIMATED = ("e2e_mean_s", "e2e_p50_s", "speedup_vs_http", "gain_vs_http", "ttft_p50_ms", "ttft_p50_ratio_vs_http")


def estimates(group: Sequence[dict[str, Any]], http: Sequence[dict[str, Any]] | None, *, intervals: bool = True) -> dict[str, Estimate]:
    """A (design, speed)'s headline figures over its tasks, each with its interval: mean and median end-to-end time
    per task (s), the speed-up over http (total http time / total time, the same tasks), the gain (1 - total time /
    total http time), the median per-turn TTFT (ms) and its ratio to http's. `http` is http's rows at the same speed;
    the ratios are NaN unless it holds the same tasks in the same order. `intervals` false: the values alone."""
    n = len(group)
    e2e = [r["e2e_s"] for r in group]
    ttft = [r["ttft_s"] for r in group]

    def estimate(statistic: Callable[[np.ndarray], np.ndarray], method: str = "bootstrap") -> Estimate:
        return uncertainty.resample(n, statistic, of="tasks", method=method, interval=intervals)

    figures = {
        "e2e_mean_s": estimate(uncertainty.unit_mean(e2e)),
        "e2e_p50_s": estimate(uncertainty.unit_percentile([[t] for t in e2e], 50)),
        "ttft_p50_ms": estimate(uncertainty.unit_percentile(ttft, 50)).scaled(1000),
    }
    if http is None or [r.get("task") for r in http] != [r.get("task") for r in group]:
        nan = Estimate(float("nan"), float("nan"), float("nan"), n, "tasks", "paired bootstrap")
        figures |= {"speedup_vs_http": nan, "gain_vs_http": nan, "ttft_p50_ratio_vs_http": nan}
    elif http is group:  # http against itself: 1x, no gain, in every resample
        figures |= {name: Estimate(value, value, value, n, "tasks", "exact") for name, value in
                    (("speedup_vs_http", 1.0), ("gain_vs_http", 0.0), ("ttft_p50_ratio_vs_http", 1.0))}
    else:
        own, theirs = uncertainty.unit_total(e2e), uncertainty.unit_total([r["e2e_s"] for r in http])
        own_ttft, their_ttft = uncertainty.unit_percentile(ttft, 50), uncertainty.unit_percentile([r["ttft_s"] for r in http], 50)
        figures |= {
            "speedup_vs_http": estimate(lambda c: theirs(c) / own(c), "paired bootstrap"),
            "gain_vs_http": estimate(lambda c: 1 - own(c) / theirs(c), "paired bootstrap"),
            "ttft_p50_ratio_vs_http": estimate(lambda c: own_ttft(c) / their_ttft(c), "paired bootstrap"),
        }
    return {name: figures[name] for name in ESTIMATED}


def with_intervals(figures: dict[str, Estimate]) -> dict[str, float]:
    """Estimates as table columns: `name`, `name_low`, `name_high`."""
    return {f"{name}{part}": value for name, e in figures.items()
            for part, value in (("", e.value), ("_low", e.low), ("_high", e.high))}


def interval_of(row: dict[str, Any], name: str) -> Estimate:
    """A summary row's figure back as an estimate (n: its `tasks`)."""
    return Estimate(row[name], row[f"{name}_low"], row[f"{name}_high"], row["tasks"], "tasks",
                    "paired bootstrap" if name in ("speedup_vs_http", "gain_vs_http", "ttft_p50_ratio_vs_http") else "bootstrap")


def summarize(rows: Sequence[dict[str, Any]], *, intervals: bool = True) -> list[dict[str, Any]]:
    """One row per (design, speed): end-to-end time per task (mean, p50 with their intervals, p90), speed-up vs
    http (ratio of total e2e over the same tasks, so of their means) and the gain (1 - design/http on the means),
    per-turn TTFT p50 and its ratio to http's, each with its 95% interval over the tasks (`estimates`; `intervals`
    false leaves the intervals NaN, for a caller that makes its own), API overhead share of wall time, bytes sent
    and received per turn over all the tasks' turns (docs/metrics.md), the share of input tokens found in the
    prefix cache, and what the tasks did: reasoning's share of output tokens, hosted web searches per task, client
    calls per turn that ended in calls (parallel calls push it above 1)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["decode_tps"]), []).append(row)
    table = []
    for (design, tps), group in groups.items():
        e2e = np.array([r["e2e_s"] for r in group])
        figures = estimates(group, groups.get((HTTP, tps)), intervals=intervals)
        columns = with_intervals(figures)
        table.append({
            "design": design,
            "decode_tps": tps,
            "tasks": len(group),
            **{k: columns[k] for k in columns if k.startswith(("e2e_mean_s", "e2e_p50_s"))},
            "e2e_p90_s": float(np.percentile(e2e, 90)),
            **{k: columns[k] for k in columns if k.startswith(("speedup_vs_http", "gain_vs_http", "ttft_p50_ms", "ttft_p50_ratio"))},
            "api_overhead_share": float(sum(r["api_overhead_s"] for r in group) / e2e.sum()),
            # Every turn weighs the same (all the tasks' bytes over all their turns), as in the compare figure.
            "bytes_sent_per_turn": _per_turn(group, "bytes_sent_per_turn"),
            "bytes_received_per_turn": _per_turn(group, "bytes_received_per_turn"),
            "cached_share": _ratio(group, "cached_tokens", "input_tokens"),
            "reasoning_share": _ratio(group, "reasoning_tokens", "output_tokens"),
            "web_searches_per_task": float(np.mean([r.get("web_searches", 0) for r in group])),
            "calls_per_tool_turn": float(sum(r.get("function_calls", 0) for r in group) / max(1, sum(r["turns"] - 1 for r in group))),
            "reconnects": int(sum(r.get("reconnects", 0) for r in group)),
        })
    order = {d: i for i, d in enumerate(ALL_DESIGNS)}
    table.sort(key=lambda r: (r["decode_tps"], order.get(r["design"], 99)))
    return table


def _describe_policy(policy: ReconnectPolicy) -> str:
    if policy.max_retries == 0:
        return f"{policy.name}: never"
    return (f"{policy.name}: {policy.max_retries} retries, backoff {policy.initial_delay:g} s x{policy.backoff_factor:g}"
            + (" then HTTP" if policy.fallback_to_http else ""))
def _per_turn(group: Sequence[dict[str, Any]], key: str) -> float:
    """A per-task per-turn mean, over all the group's turns: sum(mean * turns) / sum(turns)."""
    turns = sum(r["turns"] for r in group)
    return float(sum(r[key] * r["turns"] for r in group) / turns) if turns else float("nan")


def _ratio(group: Sequence[dict[str, Any]], part: str, whole: str) -> float:
    total = sum(r.get(whole, 0) for r in group)
    return float(sum(r.get(part, 0) for r in group) / total) if total else float("nan")


def task_list_rows(tasks: Sequence[wl.Workload]) -> list[tuple[str, str, str]]:
    """What an explicit task list (a trace's) replays, measured from the tasks: turns, common prefix, parallel calls,
    hosted searches, reasoning and tool times, in place of a preset's distributions."""
    turns = [t for task in tasks for t in task.turns]
    tool_turns = [t for t in turns if t.tool_seconds]
    calls = np.array([s for t in tool_turns for s in t.tool_seconds])
    hosted = [h for t in turns for h in t.hosted_calls]
    output = sum(t.output_tokens for t in turns)
    prefixes = sorted({(task.prefix, task.prefix_tokens) for task in tasks if task.prefix_tokens})
    source = "measured from the tasks"
    return [
        ("turns per task", f"median {statistics.median(len(task.turns) for task in tasks):g}, max "
         f"{max(len(task.turns) for task in tasks)}" if tasks else "none", source),
        ("common prefix", ", ".join(f"{n} tokens ({name or 'unnamed'})" for name, n in prefixes) + " shared by tasks of one "
         "provider and model; the rest of each task its own content" if prefixes else "none: every task its own content",
         "the trace's cached first prompts (prototype/traces/base.py)"),
        ("parallel client calls", f"{sum(len(t.tool_seconds) > 1 for t in tool_turns) / len(tool_turns):.1%} of tool turns, "
         f"{len(calls) / len(tool_turns):.2f} calls a tool turn" if tool_turns else "none", source),
        ("hosted web_search", f"{len(hosted)} in {sum(bool(t.hosted_calls) for t in turns)} turns, median "
         f"{statistics.median(h.seconds for h in hosted):g} s, {statistics.median(h.result_tokens for h in hosted):g} result tokens"
         if hosted else "none", source),
        ("reasoning share of output", f"{sum(t.reasoning_tokens for t in turns) / output:.1%} of {output:,} output tokens"
         if output else "none", source),
        ("tool time", f"{len(calls)} calls, p50 {np.percentile(calls, 50):.3g} s, p90 {np.percentile(calls, 90):.3g} s, "
         f"max {calls.max():.4g} s" if len(calls) else "no client calls", source),
    ]


def parameters(config: BenchConfig) -> list[tuple[str, str, str]]:
    """Every modeled parameter of a run, with its source: printed with the results."""
    params = config.preset if isinstance(config.preset, wl.WorkloadParams) else wl.PRESETS[config.preset]
    name = "custom (preset file)" if isinstance(config.preset, wl.WorkloadParams) else config.preset
    net = config.network
    model = config.latency
    # The coding preset's task shape is calibrated to TraceLab's published medians (docs/parameters.md, Calibration).
    calibrated = "docs/parameters.md Calibration: TraceLab" if config.preset == "coding" else None
    rows = [
        ("workload preset", f"{name}, {config.n_tasks} tasks, seed {config.seed}", "prototype/workload.py"),
        ("turns per task", f"LN({params.turns_median:g}, {params.turns_sigma:g}) in [{params.turns_min}, {params.turns_max}]" if config.fixed_turns is None else f"fixed {config.fixed_turns}", calibrated or "docs/parameters.md §1: Exgentic moment fit, TraceLab p50"),
        ("initial prompt", f"{params.initial_prompt_tokens} tokens, of which {min(params.shared_prefix_tokens, params.initial_prompt_tokens)} common to every task", calibrated or "docs/parameters.md §1 [assumed]"),
        ("common prefix", "Codex's base instructions and tools; the rest of each task from its own content seed; affinity draws per task and turn", "docs/parameters.md §1"),
        ("tokens appended per turn", f"LN({params.appended_median:g}, {params.appended_sigma:g})", "docs/parameters.md §1: TraceLab"),
        ("output tokens per turn", f"LN({params.output_median:g}, {params.output_sigma:g})", calibrated or "docs/parameters.md §1: inference-perf, Exgentic, AgentX"),
        ("parallel client calls", f"{params.parallel_calls_p:.1%} of tool turns, 2/3/4 calls weighted " + "/".join(f"{w:g}" for w in params.parallel_call_weights), "docs/parameters.md §1: yurukusa/cc-multi"),
        ("hosted web_search", f"{params.hosted_call_p:.1%} of tool turns, {params.hosted_seconds:g} s, {params.hosted_result_tokens} tokens", "docs/parameters.md §1: yurukusa/cc-multi [rate]; [assumed latency, size]"),
        ("reasoning share of output", f"uniform {params.reasoning_share[0]:.0%}-{params.reasoning_share[1]:.0%} per turn; encrypted_content >= {ENCRYPTED_CONTENT_MIN_CHARS} chars", "docs/parameters.md §1: public Codex gpt-5.4 trace; LibreChat-AI/agents PR #422"),
        ("tool time", "mixture " + ", ".join(f"{w:g}xLN({m:g} s, {s:g})" for w, m, s in params.tool_mixture) + f", cap {params.tool_cap_seconds:g} s", calibrated or "docs/parameters.md §2: TraceLab quantiles, AgentCgroup centres"),
        ("decode speeds", ", ".join(f"{s:g}" for s in DECODE_SPEEDS) + " tokens/s" if model == latency.LatencyModel()
         else f"{model.decode_tokens_per_s:g} tokens/s unless --speeds", "OpenAI blog: ~65 (GPT-5/5.2), >1000 and bursts to 4000 (Codex-Spark)"
         if model == latency.LatencyModel() else "latency profile (--latency)"),
        ("prefill rate", f"{model.prefill_tokens_per_s:g} tokens/s" + (f" + n*C/{model.cache_attention:.2g}" if model.cache_attention else ""),
         "docs/parameters.md §3 roofline [assumed R, derived Q]" if model == latency.LatencyModel() else "latency profile (--latency)"),
        ("engine request overhead", f"{model.request_overhead * 1000:g} ms",
         "[assumed]; vLLM PR #54628 bounds it (8-12 ms)" if model == latency.LatencyModel() else "latency profile (--latency)"),
        ("prefix cache", f"blocks of {BLOCK_SIZE}, idle TTL {KV_TTL_SECONDS:g} s, http affinity {config.http_affinity:g}", "vLLM APC; vLLM RFC #52113; docs/parameters.md §6 [assumed affinity]"),
        ("network", f"RTT {net.rtt * 1000:g} ms, TCP {net.tcp_round_trips} + TLS {net.tls_round_trips} RTT per new connection", "docs/parameters.md §5: RFC 9293, RFC 8446 [assumed RTT]"),
        ("http connections", "kept alive" if config.keep_alive else "new per request", "[ours]"),
        ("v1 suspension TTL", f"{BENCH_SUSPENSION_TTL:g} s (default 300 s)", "vLLM RFC #52113 maximum; docs/protocol.md"),
        ("delta coalescing", f"{config.flush_interval * 1000:g} ms", "[ours]: first token immediate"),
        ("client reconnects", _describe_policy(config.reconnect), "prototype/client/reconnect.py: openai-python 3.63, Codex CLI"),
    ]
    if config.task_list is not None:  # explicit tasks (a trace): the generator's rows do not apply
        open_loop = bool(config.task_list) and all(t.arrival_s is not None for t in config.task_list)
        # The generator's first ten rows describe the task shape (turns to tool time); the rest, model, network and
        # API, apply to any tasks. What the replay used is measured from the tasks themselves.
        rows = [("workload", f"{len(config.task_list)} tasks from {config.source or 'an explicit task list'}",
                 "open-loop: each task starts at its arrival" if open_loop else "one task after another"),
                *task_list_rows(config.task_list), *rows[10:]]
    # A "before the sprint" profile pays the extra costs of each switch that is off (api/costs.py).
    sprint_rows = [] if config.sprint == AFTER_SPRINT else SprintCosts().describe()
    return rows + config.costs.describe() + sprint_rows
