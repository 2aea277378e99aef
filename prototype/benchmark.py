"""The side-by-side benchmark: every design on the same tasks, at several decode speeds.

`run_design` drives one design over a set of tasks against an in-process server under virtual
time; `task_row` turns a rollout into the per-task figures the table reports; `summarize` makes the
table. The `compare` command (prototype/cli/compare.py) runs the grid, and notebooks and
experiments import the same functions.

This module runs the designs (under virtual time, in real time over loopback, on vLLM) and makes the
grid's points; what a run is configured with, and the parameters table, are benchmark_config.py's; the
task rows and the table are benchmark_summary.py's. Every name of the three is importable from here.

Where a turn's time goes (per turn, from the client's records and the server's timing events):
server pre-inference by stage (validate, safety, render, route, store_read), queueing, prefill,
decode, hosted tools, blocking post-inference; the rest of the turn is network and client time.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from . import sweep, virtual
from . import workload as wl
from .api.service import ApiService
from .benchmark_config import (
    ALL_DESIGNS,
    API_OVERHEAD_PHASES,
    BENCH_FLUSH_INTERVAL,
    BENCH_SUSPENSION_TTL,
    DECODE_SPEEDS,
    DEFAULT_NETWORK,
    DESIGNS,
    HTTP,
    HTTP_STORED,
    BenchConfig,
    parameters,
    task_list_rows,
)
from .benchmark_config import _describe_policy as _describe_policy
from .benchmark_summary import ESTIMATED, estimates, interval_of, summarize, task_row, turn_phases, with_intervals
from .benchmark_summary import _per_turn as _per_turn
from .benchmark_summary import _ratio as _ratio
from .client.connect import Connector, InMemoryConnector, TcpConnector
from .client.harness import CHAINED, SUSPENDED, RolloutRecord
from .client.http import STATELESS, STORED, run_http_rollout
from .client.reconnecting import run_reconnecting_rollout
from .clock import PreciseClock
from .engine import latency
from .engine.engine import Engine
from .engine.vllm_client import VllmClient, WorkerProcess, open_vllm_process
from .engine.vllm_engine import RealCall, open_vllm_engine
from .engine.vllm_models import ModelSpec
from .server.app import ResponsesServer, serve_responses
from .server.collector import short_full_collections
from .server.config import CONNECTION_LIFETIME_SECONDS, ServerConfig
from .uncertainty import Estimate


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
    sweep.advance()  # a task done: the progress bar of a grid that counts tasks moves
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


__all__ = [
    "ALL_DESIGNS", "API_OVERHEAD_PHASES", "BENCH_FLUSH_INTERVAL", "BENCH_SUSPENSION_TTL", "CHAINED",
    "CONNECTION_LIFETIME_SECONDS", "DECODE_SPEEDS", "DEFAULT_NETWORK", "DESIGNS", "ESTIMATED", "HTTP", "HTTP_STORED",
    "SUSPENDED", "BenchConfig", "DesignRun", "Estimate", "TaskFailed", "bench_server", "design_records", "design_rows",
    "design_sweep", "estimates", "interval_of", "parameters", "run_design", "run_design_real", "run_design_virtual",
    "run_designs_on_vllm", "summarize", "task_list_rows", "task_row", "turn_phases", "with_intervals",
]
