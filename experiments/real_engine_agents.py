"""N agents at once on one vLLM whose KV budget binds, each design, beside the simulated engine's
kv_memory model at the same N, budget and workload.

One vLLM worker (the tiny CPU model, prototype/engine/vllm_models.py) with a KV budget of
`--kv-blocks` blocks of 32 tokens (vLLM's num_gpu_blocks_override; one block is vLLM's null block),
smaller than the agents' contexts together. For each N (`--agents`, default 4, 16, 64) and design,
N agents start at once, each one task of a short workload (`WORKLOAD`: a 512-token first prompt of
which 384 are a system prompt every agent shares, 4 turns, ~128-token tool outputs, ~48 sampled
tokens a turn, tools of 0.25 s), over the same harness as `compare` (benchmark.run_design: v1 holds
one vLLM request per rollout across its tools; chained makes a request per turn and finds its
prefix in vLLM's prefix cache; http too, with its routing share sent to an engine that holds
nothing).

From vLLM (prototype/engine/vllm_worker.py's counters, exact for the run since one design runs
at a time on the worker): the prefill its scheduler computed, the preemptions it made and the
tokens the preempted requests computed again, prefix-cache hits, the KV blocks in use over time
(polled every `POLL_S`), requests waiting for admission, each new request's wait from queued to
scheduled (vLLM's own clock) and each call's time to first token. A run whose engine makes no step
for `STALL_S` while agents are left has stalled (vLLM's counters come from its steps, so a stalled
engine's last figures stay as they were): every request still open is aborted, and the run reports
the tasks that completed.

Beside each: the same tasks through the same harness on the simulated engine as
experiments.kv_memory builds it (`kv_memory.engine_for`: the same KV budget in tokens, vLLM's batch
limit, one prefill at a time, v1's KV held across the pause and v2's kept as an LRU prefix cache),
under virtual time, its latency calibrated from a profile of this worker taken first in the same
session (`profile_engine`, `calibrate`: prefill time against uncached and cached tokens, decode
time against batch size).

    python -m experiments.real_engine_agents            # N = 4, 16, 64, the three designs, then v1 with admission capped
    python -m experiments.real_engine_agents --agents 4 16 --designs suspended chained --no-v1-admission-cap

Token counts are the engine's behaviour and hold on any machine; times and tasks per hour are a
tiny model's on a shared CPU (the load average is printed with them). Writes
results/real_engine_agents/<timestamp>/ (the side-by-side rows, the calibration, every call, the KV series,
a figure).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import secrets
import statistics
import time
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from experiments import kv_memory
from experiments.common import experiment_parser, run_dir, write_csv
from prototype import benchmark, netem, uncertainty, virtual
from prototype import workload as wl
from prototype.analysis import print_table
from prototype.api.costs import ZERO_COSTS
from prototype.benchmark import HTTP
from prototype.cli.common import add_list, at_least, non_negative, positive
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord
from prototype.clock import PreciseClock
from prototype.engine import fit
from prototype.engine.admission import EngineCall
from prototype.engine.engine import Engine, ModelCall, Prefilled
from prototype.engine.kv import GPU, Prompt
from prototype.engine.latency import LatencyModel
from prototype.engine.memory import VLLM_MAX_NUM_SEQS
from prototype.engine.stats import sample
from prototype.engine.vllm_client import VllmClient, WorkerProcess, open_vllm_process
from prototype.engine.vllm_engine import VllmEngine
from prototype.engine.vllm_models import TINY_CPU, ModelSpec
from prototype.uncertainty import Estimate

# The workload [ours], sized for a 2-core CPU: contexts of ~1k tokens (~35 blocks of 32), four turns, tools
# short enough that the engine's queue, not the tools, sets the time. The 384-token system prompt is shared by
# every agent (the compact preset shares 7,400 of its 8,000), so chained finds it in the prefix cache across
# agents and a v1 request finds it when it opens. No hosted web_search (its 1,500-token results would
# dominate the contexts).
WORKLOAD = wl.WorkloadParams(
    fixed_turns=4, initial_prompt_tokens=512, shared_prefix_tokens=384,
    appended_median=128, appended_sigma=0.5, appended_min=32, appended_max=512,
    output_median=48, output_sigma=0.5, output_min=8, output_max=128,
    fixed_tool_seconds=0.25, hosted_call_p=0.0,
)
AGENTS = (4, 16, 64)
DESIGNS = (SUSPENDED, CHAINED, HTTP)
# 97 blocks of 32 tokens, 96 usable (vLLM keeps one as its null block): 3,072 tokens, under the ~4 x 1,100
# that 4 agents' final contexts need together, so the budget binds from N = 4 on [ours].
KV_BLOCKS = 97
# The simulated engine's retention policy per design (prototype/engine/memory.py): v1 holds its KV across
# the pause; chained and http keep theirs as prefix cache, evicted least recently used first under pressure
# (vLLM's prefix cache has no time-to-live; 300 s is longer than any run here, so only eviction acts).
SIM_POLICY = {SUSPENDED: "hold", CHAINED: "ttl-300", HTTP: "ttl-300"}
POLL_S = 0.25  # how often vLLM's counters are read for the KV series [ours]
# No engine step for this long while agents are left: the engine cannot go on [ours]. Every step of this
# workload takes milliseconds and every tool 0.25 s; 30 s is far beyond either on a loaded machine.
STALL_S = 30.0
# A bound on one run's real time [ours]: a run that neither finishes nor stalls (it should not happen) stops here.
RUN_LIMIT_S = 1800.0


def agent_tasks(agents: int, seed: int = 0, params: wl.WorkloadParams = WORKLOAD) -> tuple[wl.Workload, ...]:
    """`agents` tasks that all arrive at t = 0."""
    return tuple(attrs.evolve(task, arrival_s=0.0) for task in wl.generate(params, seed=seed, n_tasks=agents))


def bench_config(tasks: Sequence[wl.Workload], latency: LatencyModel | None = None) -> benchmark.BenchConfig:
    """The harness's settings: API stage costs zero and no modeled network (the question is the engine's;
    modeled sleeps would only add time), the simulated engine's latency where it runs."""
    return benchmark.BenchConfig(task_list=tuple(tasks), costs=ZERO_COSTS, network=netem.LOOPBACK, latency=latency or LatencyModel())


def budget_spec(kv_blocks: int, *, max_num_seqs: int | None = None, base: ModelSpec = TINY_CPU) -> ModelSpec:
    """The model with a KV budget of `kv_blocks` blocks; its context window is what the budget holds (vLLM refuses
    to start with a window its KV cannot hold)."""
    return attrs.evolve(base, kv_blocks=kv_blocks, max_model_len=(kv_blocks - 1) * base.block_size,
                        max_num_seqs=max_num_seqs)


def budget_tokens(spec: ModelSpec) -> int:
    """The KV budget the simulated engine gets: vLLM's usable blocks in tokens."""
    assert spec.kv_blocks is not None
    return (spec.kv_blocks - 1) * spec.block_size


def session_of(key: Hashable) -> Hashable:
    """The conversation a call belongs to: an http turn routed elsewhere keys on its home's key."""
    return key[1] if isinstance(key, tuple) and key and key[0] == "http-elsewhere" else key


def fingerprint(prompt: Prompt) -> str:
    """A session's first prompt, hashed: the same task renders the same first prompt on either engine, so
    calls pair across engines by it (engine keys are connection objects, different on every run)."""
    return hashlib.blake2b(prompt.ids.tobytes(), digest_size=8).hexdigest()


# --- one run's figures, from either engine -------------------------------------------------------------------------


@attrs.frozen
class CallFigures:
    """One model call, in the terms both engines give."""

    task: str  # the fingerprint of its session's first prompt
    index: int  # its place among its session's calls, from 0
    prompt_tokens: int
    computed: int  # prompt tokens prefilled when the call was first scheduled (vLLM: its sent ids less its prefix hit)
    ttft_s: float  # from asking the engine to the first token
    queued_s: float | None  # waiting for admission; None where the engine does not say (a vLLM resume)


@attrs.define
class AgentsRun:
    """One (engine, design, N) run."""

    engine: str  # "vllm" or "sim"
    design: str
    agents: int
    records: list[RolloutRecord]
    calls: list[CallFigures]
    stalled: bool = False
    makespan_s: float = math.nan
    prefill_tokens: int = 0  # the engine's own total: what its scheduler computed
    recomputed_tokens: int = 0  # of which computed again after the engine dropped it
    preemptions: int = 0  # vLLM: running requests preempted; sim: held idle KV preempted
    evictions: int = 0  # sim: prefix-cache entries evicted to make room (vLLM reuses free blocks without a count)
    prefix_hits: int | None = None  # vLLM's prefix-cache hits, in tokens
    kv_series: list[tuple[float, int, int, int]] = attrs.Factory(list)  # (s from the start, KV tokens in use, running, waiting)
    wall_s: float = 0.0
    load: tuple[float, float] = (math.nan, math.nan)  # 1-minute load average at the start and the end

    @property
    def completed(self) -> int:
        return sum(record.status == "completed" for record in self.records)


def kv_summary(series: Sequence[tuple[float, int, int, int]]) -> tuple[int, float, float]:
    """(peak KV tokens in use, time-averaged KV tokens in use, time-averaged requests waiting) of a polled series."""
    if not series:
        return 0, math.nan, math.nan
    times = np.array([s[0] for s in series])
    kv, waiting = np.array([s[1] for s in series], dtype=float), np.array([s[3] for s in series], dtype=float)
    if len(series) < 2 or times[-1] <= times[0]:
        return int(kv.max()), float(kv.mean()), float(waiting.mean())
    widths = np.diff(times)  # each poll holds until the next
    span = times[-1] - times[0]
    return int(kv.max()), float((kv[:-1] * widths).sum() / span), float((waiting[:-1] * widths).sum() / span)


def per_task(run: AgentsRun, value: str) -> dict[str, float]:
    """A call attribute summed per task."""
    totals: dict[str, float] = defaultdict(float)
    for call in run.calls:
        totals[call.task] += getattr(call, value)
    return dict(totals)


def figures(run: AgentsRun) -> dict[str, Estimate]:
    """A run's figures, each a value with its n and 95% interval (prototype/uncertainty.py):

    * per task (bootstrap over tasks): prefill computed (on vLLM its calls' own figures, which hold what a
      request computed up to its first token, a recompute after a preemption before it included, plus what the
      scheduler computed beyond them, shared equally: vLLM does not say which request did), prompt tokens the
      engine did not compute (held or found cached);
    * per call (bootstrap over calls): time to first token (median), admission wait (mean);
    * per completed task: end-to-end time (median);
    * counts over the run (exact Poisson): preemptions per task, tasks per hour over the makespan;
    * exact counts (no sampling): recomputed tokens per task, KV peak and time average."""
    n = run.agents
    first_pass = per_task(run, "computed")
    prompts = per_task(run, "prompt_tokens")
    first_total = sum(first_pass.values())
    extra = (run.prefill_tokens - first_total) / n if run.engine != "sim" else 0.0
    prefill = [first_pass[task] + extra for task in first_pass]
    if run.engine == "sim":  # exact per task: each call's uncached tokens, its recompute included
        prefill = list(first_pass.values())
    served = [prompts[task] - first_pass[task] for task in first_pass]
    ttft = [call.ttft_s for call in run.calls if not math.isnan(call.ttft_s)]
    queued = [call.queued_s for call in run.calls if call.queued_s is not None]
    e2e = [record.seconds for record in run.records if record.status == "completed"]
    peak, mean_kv, waiting = kv_summary(run.kv_series)
    # A stalled run's throughput and end-to-end times are not the engine's: it stopped before its tasks did.
    hours = run.makespan_s / 3600 if math.isfinite(run.makespan_s) and run.makespan_s > 0 and not run.stalled else 0.0
    if run.stalled:
        e2e = []
    exact = uncertainty.Estimate
    out = {
        "prefill_per_task": uncertainty.bootstrap(prefill, of="tasks"),
        "recomputed_per_task": exact(run.recomputed_tokens / n, run.recomputed_tokens / n, run.recomputed_tokens / n, n,
                                     "tasks", "exact"),
        "served_per_task": uncertainty.bootstrap(served, of="tasks"),
        "preemptions_per_task": uncertainty.events_per(run.preemptions, n, of="events"),
        "evictions_per_task": uncertainty.events_per(run.evictions, n, of="events") if run.engine == "sim" else exact(
            math.nan, math.nan, math.nan, 0, "events", "exact Poisson"),
        "ttft_p50_ms": uncertainty.bootstrap(ttft, np.median, of="calls").scaled(1000),
        "queued_mean_ms": uncertainty.bootstrap(queued, of="calls").scaled(1000),
        "e2e_p50_s": uncertainty.bootstrap(e2e, np.median, of="tasks"),
        "tasks_per_hour": uncertainty.events_per(run.completed, hours, of="tasks") if hours else exact(
            math.nan, math.nan, math.nan, run.completed, "tasks", "exact Poisson"),
        "kv_peak_tokens": exact(peak, peak, peak, len(run.kv_series), "polls", "exact"),
        "kv_mean_tokens": exact(mean_kv, mean_kv, mean_kv, len(run.kv_series), "polls", "exact"),
        "waiting_mean": exact(waiting, waiting, waiting, len(run.kv_series), "polls", "exact"),
    }
    return out


# --- the real engine -----------------------------------------------------------------------------------------------


@attrs.define(eq=False)
class TracedVllmEngine(VllmEngine):
    """VllmEngine noting each session's first prompt (`fingerprint`), so its calls pair with the simulated
    engine's."""

    sessions: dict[Hashable, str] = attrs.field(factory=dict, init=False)

    async def prefill_call(self, latency: LatencyModel, call: ModelCall, *, start: float | None = None,
                           engine_call: EngineCall | None = None) -> Prefilled:
        self.sessions.setdefault(session_of(call.key), fingerprint(call.prompt))
        return await super().prefill_call(latency, call, start=start, engine_call=engine_call)


def vllm_calls(engine: TracedVllmEngine) -> list[CallFigures]:
    """The engine's records in `CallFigures` terms. A call's prefill is exact per request even with many in
    flight: a resumed chunk computes the ids it sent; a new request its prompt less the prefix vLLM found when it
    first admitted it (its num_cached_tokens), which covers a recompute after a preemption before its first
    token. Only a preemption after a request's first token makes vLLM compute more than its calls say."""
    counts: dict[Hashable, int] = defaultdict(int)
    out = []
    for record in engine.records:
        session = session_of(record.key)
        index = counts[session]
        counts[session] += 1
        computed = record.sent_tokens if record.resumed else record.sent_tokens - record.vllm_cached_tokens
        # A request aborted before its first token (a stalled run's) has no time to first token.
        ttft = math.nan if record.ttft_s == 0.0 and record.output_tokens == 0 else record.ttft_s
        out.append(CallFigures(engine.sessions.get(session, "?"), index, record.prompt_tokens, computed, ttft,
                               record.queued_s))
    return out


def load_average() -> float:
    return os.getloadavg()[0]


async def abort_open(client: VllmClient, wait_s: float = 60.0) -> None:
    """Abort every request still open on the worker and wait until vLLM has finished them."""
    for rid in client.open_requests():
        await client.abort(rid)
    with trio.move_on_after(wait_s):
        while client.open_requests():  # noqa: ASYNC110 - the client routes vLLM's `finished` events; none to wait on
            await trio.sleep(0.05)


async def run_on_vllm(client: VllmClient, spec: ModelSpec, design: str, tasks: Sequence[wl.Workload], *,
                      namespace: str, decode_tps: float = 1000.0, stall_s: float = STALL_S) -> AgentsRun:
    """N agents at once through `design` over the worker; vLLM's counters before and after."""
    config = bench_config(tasks)
    blocks = client.ready.kv_blocks - 1
    records: list[RolloutRecord] = []
    series: list[tuple[float, int, int, int]] = []
    load_start, started = load_average(), trio.current_time()
    before = await client.counters(reset_peak=True)
    stalled = False
    async with trio.open_nursery() as engine_nursery:
        engine = TracedVllmEngine(client=client, nursery=engine_nursery, spec=spec, namespace=namespace)
        server = benchmark.bench_server(config, engine)

        async def agent(task: wl.Workload) -> None:
            (record,) = await benchmark.run_design(design, decode_tps, [task], config, server=server)
            records.append(record)

        async def watch(cancel: trio.CancelScope) -> None:
            nonlocal stalled
            last_steps, last_progress = -1, trio.current_time()
            while True:
                now = await client.counters()
                t = trio.current_time()
                series.append((t - started, round(now["kv_usage"] * blocks) * spec.block_size, now["running"], now["waiting"]))
                if now["steps"] != last_steps:
                    last_steps, last_progress = now["steps"], t
                elif t - last_progress > stall_s:  # agents are left (else this task is cancelled), none can go on
                    stalled = True
                    cancel.cancel()
                    return
                await trio.sleep(POLL_S)

        with trio.move_on_after(RUN_LIMIT_S) as limit:
            async with trio.open_nursery() as agents:
                agents.start_soon(watch, agents.cancel_scope)
                async with trio.open_nursery() as running:
                    for task in tasks:
                        running.start_soon(agent, task)
                agents.cancel_scope.cancel()  # every agent is done: stop watching
        stalled = stalled or limit.cancelled_caught
        ended = trio.current_time()
        await abort_open(client)
        after = await client.counters()
        engine_nursery.cancel_scope.cancel()
    delta = {key: after[key] - before[key] for key in ("prefill_tokens", "preemptions", "recompute_queries",
                                                       "recompute_hits", "prefix_hits")}
    done = [r for r in records if r.status == "completed"]
    makespan = (max(r.ended_at for r in done) - started) if done and not stalled else (
        ended - stall_s - started if stalled else math.nan)
    return AgentsRun(
        "vllm", design, len(tasks), records, vllm_calls(engine), stalled=stalled, makespan_s=makespan,
        prefill_tokens=delta["prefill_tokens"], recomputed_tokens=delta["recompute_queries"] - delta["recompute_hits"],
        preemptions=delta["preemptions"], prefix_hits=delta["prefix_hits"], kv_series=series, wall_s=ended - started,
        load=(load_start, load_average()),
    )


# --- the simulated engine ------------------------------------------------------------------------------------------


@attrs.define(eq=False)
class TracedEngine(Engine):
    """The simulated engine, recording each model call as `CallFigures`. With the batch terms 0 it is the engine
    as kv_memory runs it (a call's prefill and decode take as long whatever else is in flight); with
    `decode_batch_s` > 0 a call's decode slows by that many seconds a token for each other call in flight when it
    starts decoding, and with `prefill_batch_s` > 0 its prefill by that many seconds for each (the profile's
    decode time and time to first token against batch size)."""

    decode_batch_s: float = 0.0
    prefill_batch_s: float = 0.0
    lookup_when_scheduled: bool = False
    """Look the prompt up in the prefix cache when its prefill starts (after waiting for the one before it, whose
    blocks are then kept), as vLLM looks a request up when it schedules it; False: when the call is admitted, as
    the simulated engine does (calls admitted together then all miss what the first of them computes)."""
    calls: list[CallFigures] = attrs.field(factory=list, init=False)
    sessions: dict[Hashable, str] = attrs.field(factory=dict, init=False)
    _counts: dict[Hashable, int] = attrs.field(factory=lambda: defaultdict(int), init=False)
    _asked: dict[int, float] = attrs.field(factory=dict, init=False)

    async def begin_call(self, key: Hashable, prompt: Prompt, *, pinned: bool = False) -> EngineCall:
        asked = trio.current_time()
        call = await super().begin_call(key, prompt, pinned=pinned)
        self._asked[id(call)] = asked
        return call

    async def prefill_call(self, latency: LatencyModel, call: ModelCall, *, start: float | None = None,
                           engine_call: EngineCall | None = None) -> Prefilled:
        session = session_of(call.key)
        task = self.sessions.setdefault(session, fingerprint(call.prompt))
        asked = self._asked.pop(id(engine_call), trio.current_time())
        if self.prefill_batch_s and self.active_calls > 1:
            latency = attrs.evolve(latency, request_overhead=latency.request_overhead
                                   + self.prefill_batch_s * (self.active_calls - 1))
        if self.lookup_when_scheduled and self.serial_prefill:
            prefilled = await self._prefill_when_scheduled(latency, call, start)
        else:
            prefilled = await super().prefill_call(latency, call, start=start, engine_call=engine_call)
        index = self._counts[session]
        self._counts[session] += 1
        queued = engine_call.queued_s if engine_call is not None else 0.0
        self.calls.append(CallFigures(task, index, len(call.prompt), len(call.prompt) - prefilled.cached,
                                      prefilled.decode_from - asked, queued))
        return prefilled

    async def _prefill_when_scheduled(self, latency: LatencyModel, call: ModelCall, start: float | None) -> Prefilled:
        """Engine.prefill with the cache lookup moved after the wait for the serial prefill, and the prompt's KV
        kept (its blocks findable) before the next prefill starts."""
        if self._prefill_lock is None:
            self._prefill_lock = trio.Lock()
        asked = trio.current_time()
        waits = self._prefill_lock.locked()
        async with self._prefill_lock:
            now = trio.current_time()
            sample(self.stats.prefill_waits, now - asked)
            cached = self.cached_prefix(call.key, call.prompt, now)
            uncached = len(call.prompt) - cached
            self.stats.model_calls += 1
            self.stats.prefill_tokens += uncached
            self.stats.cached_tokens += cached
            deadline = (now if waits or start is None else start) + latency.prefill_seconds(uncached, cached)
            await trio.sleep_until(deadline)
            self.retain(call.key, call.prompt, trio.current_time(), pinned=call.held)
        return Prefilled(deadline, cached)

    def _at_batch(self, latency: LatencyModel) -> LatencyModel:
        if not self.decode_batch_s or self.active_calls <= 1:
            return latency
        per_token = 1 / latency.decode_tokens_per_s + self.decode_batch_s * (self.active_calls - 1)
        return attrs.evolve(latency, decode_tokens_per_s=1 / per_token)

    def stream(self, latency: LatencyModel, pieces: Sequence[str], **options: Any):
        return super().stream(self._at_batch(latency), pieces, **options)

    async def decode_unstreamed(self, latency: LatencyModel, tokens: int, *, start: float,
                                engine_call: EngineCall | None = None) -> float:
        return await super().decode_unstreamed(self._at_batch(latency), tokens, start=start, engine_call=engine_call)

    def in_use_tokens(self) -> int:
        """KV tokens held by calls in flight and by held (pinned) sessions: what vLLM counts as blocks in use
        (its prefix cache's free blocks are not)."""
        return sum(entry.gpu_tokens for entry in self.kv.values()
                   if entry.where == GPU and (entry.active or entry.pinned))


def simulated_engine(design: str, agents: int, budget: int, *, max_batch: int = VLLM_MAX_NUM_SEQS,
                     decode_batch_s: float = 0.0, prefill_batch_s: float = 0.0,
                     lookup_when_scheduled: bool = False) -> TracedEngine:
    """kv_memory's engine (`kv_memory.engine_for`) for this design at this budget, traced."""
    base = kv_memory.engine_for(kv_memory.KvRun(design, SIM_POLICY[design], agents, budget=budget, max_batch=max_batch))
    settings = {field.alias: getattr(base, field.name) for field in attrs.fields(Engine) if field.init}
    return TracedEngine(**settings, decode_batch_s=decode_batch_s, prefill_batch_s=prefill_batch_s,
                        lookup_when_scheduled=lookup_when_scheduled)


def run_simulated(design: str, tasks: Sequence[wl.Workload], *, budget: int, latency: LatencyModel, decode_tps: float,
                  decode_batch_s: float = 0.0, prefill_batch_s: float = 0.0, lookup_when_scheduled: bool = False,
                  max_batch: int = VLLM_MAX_NUM_SEQS, scheduler_seed: int = 0) -> AgentsRun:
    """The same agents on the simulated engine, under virtual time."""
    engine = simulated_engine(design, len(tasks), budget, max_batch=max_batch, decode_batch_s=decode_batch_s,
                              prefill_batch_s=prefill_batch_s, lookup_when_scheduled=lookup_when_scheduled)
    config = bench_config(tasks, latency)
    records: list[RolloutRecord] = []
    series: list[tuple[float, int, int, int]] = []

    async def main() -> None:
        server = benchmark.bench_server(config, engine)
        started = trio.current_time()

        async def agent(task: wl.Workload) -> None:
            (record,) = await benchmark.run_design(design, decode_tps, [task], config, server=server)
            records.append(record)

        async def watch() -> None:
            while True:
                series.append((trio.current_time() - started, engine.in_use_tokens(), engine.active_calls, engine.waiting_calls))
                await trio.sleep(POLL_S)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as running:
                for task in tasks:
                    running.start_soon(agent, task)
            nursery.cancel_scope.cancel()

    wall = time.perf_counter()
    virtual.run(main, scheduler_seed=scheduler_seed)
    stats = engine.stats
    done = [r for r in records if r.status == "completed"]
    return AgentsRun(
        "sim", design, len(tasks), records, engine.calls,
        makespan_s=max(r.ended_at for r in done) - min(r.started_at for r in records) if done else math.nan,
        prefill_tokens=stats.prefill_tokens, recomputed_tokens=stats.recomputed_tokens, preemptions=stats.preempted,
        evictions=stats.evicted, kv_series=series, wall_s=time.perf_counter() - wall,
    )


# --- the profile the simulated engine is calibrated from ---------------------------------------------------------


PROFILE_UNCACHED = (32, 128, 512, 1024)  # prefill sizes [ours]: a resumed chunk's to a first prompt's
PROFILE_BATCHES = (1, 2, 4, 8, 16)  # decode batch sizes [ours]: up to what the budget holds of these small requests
PROFILE_DECODE_TOKENS = 48  # tokens each decode-profile request samples (this workload's median turn)
PROFILE_DECODE_PROMPT = 16
PROFILE_BUSY_BATCHES = (0, 2, 4, 8, 16)  # requests decoding while a prefill is timed [ours]
PROFILE_BUSY_UNCACHED = 256  # that prefill's size [ours]


@attrs.frozen
class EngineProfile:
    """Timings of requests alone (prefill) and in batches (decode), Vidur's operator profile at request level."""

    prefill: tuple[tuple[int, int, float], ...]  # (uncached tokens, cached tokens, seconds to the first token)
    decode: tuple[tuple[int, float], ...]  # (requests decoding at once, seconds per token after the first)
    busy_prefill: tuple[tuple[int, int, float], ...]  # (requests decoding meanwhile, a prefill's uncached tokens, its seconds)
    load: tuple[float, float]


@attrs.frozen
class Calibration:
    """The simulated engine's timing, fitted to a profile (prototype/engine/fit.py's least squares):

    * time to first token = overhead + uncached / prefill rate + uncached x cached / Q, the latency model's
      terms (round_time_fit's third column carries the cache term: uncached x cached, its rate Q);
    * seconds per decoded token = base + per_call x batch (round_time_fit on the batch size, no third term);
    * a prefill's time to first token while a batch decodes = its time alone + per_call x batch (round_time_fit
      of what the batch adds, on the batch size)."""

    latency: LatencyModel
    decode_batch_s: float
    prefill_batch_s: float
    prefill_fit: fit.RoundTimeFit
    decode_fit: fit.RoundTimeFit
    busy_fit: fit.RoundTimeFit | None  # None: too few busy-prefill points to fit (the term is then 0)

    @property
    def decode_tps(self) -> float:
        """The decode rate of one call alone (batch 1)."""
        return self.latency.decode_tokens_per_s


def _fresh_ids(rng: np.random.Generator, n: int) -> list[int]:
    # Ids in the testbed's cl100k range, random so that no two profile prompts share a block.
    return [int(i) for i in rng.integers(1_000, 100_000, size=n)]


async def _timed(client: VllmClient, rid: str, prompt: list[int], max_tokens: int, salt: str) -> list[float]:
    """Send one request; the time of each of its tokens, from sending it."""
    asked = trio.current_time()
    times: list[float] = []
    events = await client.generate(rid, prompt, max_tokens, salt=salt)
    async for event in events:
        if event["type"] == "tokens":
            times += [trio.current_time() - asked] * event["n"]
        elif event["type"] == "error":
            raise RuntimeError(f"profile request {rid}: {event['message']}")
    return times


async def profile_engine(client: VllmClient, *, reps: int = 3, seed: int = 0, window: int | None = None) -> EngineProfile:
    """Prefill: one request at a time, `PROFILE_UNCACHED` new tokens after 0 or up to 1,024 tokens the prefix cache
    holds (a request on the same prefix first); decode: `PROFILE_BATCHES` requests at once, each sampling
    `PROFILE_DECODE_TOKENS`; a prefill timed while `PROFILE_BUSY_BATCHES` requests decode. `window`: the longest
    sequence the worker takes (its max_model_len). Points that would not fit the window, or half the KV budget,
    are left out, so that the profile itself never preempts."""
    rng = np.random.default_rng(seed)
    salt = f"profile-{secrets.token_hex(4)}"
    load_start = load_average()
    block = client.ready.block_size
    usable = client.ready.kv_blocks - 1
    window = min(window or usable * block, usable * block)
    cached_sizes = (0, min(1024, window // 3 // block * block))
    rid = 0
    prefill = []
    for _ in range(reps):
        for cached in dict.fromkeys(cached_sizes):
            for uncached in PROFILE_UNCACHED:
                if cached + uncached + 1 > window:
                    continue
                prefix = _fresh_ids(rng, cached)
                if cached:
                    await _timed(client, f"profile-{rid}", prefix, 1, salt)
                    rid += 1
                times = await _timed(client, f"profile-{rid}", prefix + _fresh_ids(rng, uncached), 1, salt)
                rid += 1
                prefill.append((uncached, cached, times[0]))

    async def one(name: str, per_token: list[float]) -> None:
        times = await _timed(client, name, _fresh_ids(rng, PROFILE_DECODE_PROMPT), PROFILE_DECODE_TOKENS, salt)
        per_token.append((times[-1] - times[0]) / (len(times) - 1))

    request_blocks = math.ceil((PROFILE_DECODE_PROMPT + PROFILE_DECODE_TOKENS) / block)
    decode = []
    for _ in range(reps):
        for batch in PROFILE_BATCHES:
            if batch * request_blocks > usable // 2:
                continue
            per_token: list[float] = []
            async with trio.open_nursery() as nursery:
                for b in range(batch):
                    nursery.start_soon(one, f"profile-{rid}-{b}", per_token)
            rid += 1
            decode.append((batch, statistics.fmean(per_token)))
    probe = min(PROFILE_BUSY_UNCACHED, window // 4)
    busy = []
    for _ in range(reps):
        for batch in PROFILE_BUSY_BATCHES:
            if batch * request_blocks + math.ceil((probe + 1) / block) > usable // 2:
                continue
            ignored: list[float] = []
            async with trio.open_nursery() as nursery:
                for b in range(batch):
                    nursery.start_soon(one, f"profile-{rid}-{b}", ignored)
                await trio.sleep(0.02 * batch)  # the batch has started decoding
                times = await _timed(client, f"profile-{rid}-probe", _fresh_ids(rng, probe), 1, salt)
            rid += 1
            busy.append((batch, probe, times[0]))
    return EngineProfile(tuple(prefill), tuple(decode), tuple(busy), (load_start, load_average()))


def calibrate(profile: EngineProfile) -> Calibration:
    """Fit the simulated engine's timing to a profile (`Calibration`)."""
    uncached = [p[0] for p in profile.prefill]
    prefill_fit = fit.round_time_fit(uncached, [p[0] * p[1] for p in profile.prefill], [p[2] for p in profile.prefill])
    decode_fit = fit.round_time_fit([d[0] for d in profile.decode], [0.0] * len(profile.decode), [d[1] for d in profile.decode])
    per_call = 0.0 if math.isinf(decode_fit.prefill_tokens_per_s) else 1 / decode_fit.prefill_tokens_per_s
    alone = decode_fit.fixed_s + per_call  # seconds per token at batch 1
    if alone <= 0:
        alone = min(d[1] for d in profile.decode)
    cache_q = prefill_fit.decode_tokens_per_s
    latency = LatencyModel(
        decode_tokens_per_s=1 / alone,
        prefill_tokens_per_s=prefill_fit.prefill_tokens_per_s if math.isfinite(prefill_fit.prefill_tokens_per_s) else 1e9,
        cache_attention=cache_q if math.isfinite(cache_q) else None,
        request_overhead=prefill_fit.fixed_s,
    )
    busy_fit, busy_per_call = None, 0.0
    if len(profile.busy_prefill) >= fit.MIN_FIT_ROUNDS:  # else no batch term for the prefill
        busy_fit = fit.round_time_fit([b[0] for b in profile.busy_prefill], [0.0] * len(profile.busy_prefill),
                                      [b[2] - latency.prefill_seconds(b[1], 0) for b in profile.busy_prefill])
        busy_per_call = 0.0 if math.isinf(busy_fit.prefill_tokens_per_s) else 1 / busy_fit.prefill_tokens_per_s
    return Calibration(latency, per_call, busy_per_call, prefill_fit, decode_fit, busy_fit)


def calibration_rows(calibration: Calibration) -> list[dict[str, Any]]:
    latency, prefill, decode = calibration.latency, calibration.prefill_fit, calibration.decode_fit
    return [
        {"term": "request overhead", "value": f"{latency.request_overhead * 1000:.1f} ms", "fit": f"n={prefill.n}, R² {prefill.r2:.2f}"},
        {"term": "prefill rate", "value": f"{latency.prefill_tokens_per_s:,.0f} tokens/s", "fit": ""},
        {"term": "cache attention Q", "value": "none" if latency.cache_attention is None else f"{latency.cache_attention:.3g} tokens²/s", "fit": ""},
        {"term": "decode, one call", "value": f"{1000 / latency.decode_tokens_per_s:.2f} ms/token", "fit": f"n={decode.n}, R² {decode.r2:.2f}"},
        {"term": "decode, per call in the batch", "value": f"+{calibration.decode_batch_s * 1000:.3f} ms/token", "fit": ""},
        {"term": "prefill, per call decoding meanwhile", "value": f"+{calibration.prefill_batch_s * 1000:.2f} ms",
         "fit": "not fitted" if calibration.busy_fit is None else f"n={calibration.busy_fit.n}, R² {calibration.busy_fit.r2:.2f}"},
    ]


# --- the comparison ------------------------------------------------------------------------------------------------


KV_COLUMNS = (
    ("completed", "completed"), ("prefill_per_task", "prefill/task"), ("recomputed_per_task", "recomputed/task"),
    ("preemptions_per_task", "preempted/task"), ("evictions_per_task", "evicted/task"), ("served_per_task", "not computed/task"),
    ("kv_peak_tokens", "KV peak (tok)"), ("kv_mean_tokens", "KV mean (tok)"),
)
TIME_COLUMNS = (
    ("ttft_p50_ms", "TTFT p50 (ms)"), ("queued_mean_ms", "admission wait (ms)"), ("waiting_mean", "waiting (mean)"),
    ("e2e_p50_s", "e2e p50 (s)"), ("tasks_per_hour", "tasks/h"),
)


def _cell(estimate: Estimate, template: str) -> str:
    if math.isnan(estimate.value):
        return "-"
    return estimate.format(template)


def _template(value: float) -> str:
    return "{:,.0f}" if abs(value) >= 100 else "{:.2f}" if abs(value) < 10 else "{:.1f}"


def comparison_rows(pairs: Sequence[tuple[AgentsRun, AgentsRun | None]], columns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """One printed row per (design, N): each figure as `vLLM | sim` (each with its interval)."""
    rows = []
    for real, sim in pairs:
        real_figures, sim_figures = figures(real), figures(sim) if sim is not None else None
        label = real.design + (" (capped)" if real.engine == "vllm-capped" else "")
        row = {"design": label, "N": str(real.agents)}
        for key, title in columns:
            if key == "completed":
                real_text = f"{real.completed}/{real.agents}" + (" STALLED" if real.stalled else "")
                sim_text = f"{sim.completed}/{sim.agents}" if sim is not None else "-"
            else:
                estimate = real_figures[key]
                template = _template(estimate.value if not math.isnan(estimate.value) else 0.0)
                real_text = _cell(estimate, template)
                sim_text = _cell(sim_figures[key], template) if sim_figures is not None else "-"
            row[title] = f"{real_text} | {sim_text}"
        rows.append(row)
    return rows


def figure_rows(runs: Sequence[AgentsRun]) -> list[dict[str, Any]]:
    """Every figure of every run, one CSV row each (value, interval, n, method)."""
    out = []
    for run in runs:
        base = {"engine": run.engine, "design": run.design, "agents": run.agents, "completed": run.completed,
                "stalled": run.stalled, "prefill_tokens": run.prefill_tokens, "recomputed_tokens": run.recomputed_tokens,
                "preemptions": run.preemptions, "evictions": run.evictions,
                "prefix_hits": "" if run.prefix_hits is None else run.prefix_hits,
                "makespan_s": run.makespan_s, "wall_s": run.wall_s, "load_start": run.load[0], "load_end": run.load[1]}
        for name, estimate in figures(run).items():
            base |= {name: estimate.value, f"{name}_low": estimate.low, f"{name}_high": estimate.high, f"{name}_n": estimate.n}
        out.append(base)
    return out


def call_rows(runs: Sequence[AgentsRun]) -> list[dict[str, Any]]:
    return [{"engine": run.engine, "design": run.design, "agents": run.agents, **attrs.asdict(call)}
            for run in runs for call in run.calls]


def series_rows(runs: Sequence[AgentsRun]) -> list[dict[str, Any]]:
    return [{"engine": run.engine, "design": run.design, "agents": run.agents, "t_s": t, "kv_tokens": kv,
             "running": running, "waiting": waiting}
            for run in runs for t, kv, running, waiting in run.kv_series]


def plot_series(runs: Sequence[AgentsRun], budget: int, path) -> None:
    """KV tokens in use over time, per design, vLLM against the simulated engine, at the largest N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    largest = max(run.agents for run in runs)
    designs = list(dict.fromkeys(run.design for run in runs))
    fig, axes = plt.subplots(1, len(designs), figsize=(5 * len(designs), 3.8), squeeze=False)
    for ax, design in zip(axes[0], designs):
        for run in runs:
            if run.design == design and run.agents == largest and run.kv_series:
                ax.step([s[0] for s in run.kv_series], [s[1] for s in run.kv_series], where="post",
                        label=run.engine + (" (stalled)" if run.stalled else ""))
        ax.axhline(budget, color="gray", linestyle=":", linewidth=1, label="KV budget")
        ax.set_title(f"{design}, N = {largest}")
        ax.set_xlabel("s from the start (vLLM: real; sim: virtual)")
        ax.set_ylabel("KV tokens in use")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def workload_line(params: wl.WorkloadParams) -> str:
    """The workload's knobs in one line, printed with the results."""
    return (f"{params.fixed_turns} turns, a {params.initial_prompt_tokens}-token first prompt ({params.shared_prefix_tokens} "
            f"shared), tool outputs LN({params.appended_median:g}, {params.appended_sigma:g}), outputs "
            f"LN({params.output_median:g}, {params.output_sigma:g}), tools {params.fixed_tool_seconds:g} s, "
            f"hosted search p {params.hosted_call_p:g}")


def admission_cap(spec: ModelSpec, tasks: Sequence[wl.Workload]) -> int:
    """The most v1 sessions whose final contexts all fit the budget at once (each context's turns and outputs,
    in whole blocks, plus a block for the rendering's framing): with at most that many requests active, paused
    requests can never hold every block."""
    assert spec.kv_blocks is not None
    longest = max(sum(t.appended_tokens + t.output_tokens for t in task.turns) for task in tasks)
    blocks = math.ceil(longest / spec.block_size) + 1
    return max(1, (spec.kv_blocks - 1) // blocks)


def main(argv: list[str] | None = None, *, worker: WorkerProcess | None = None) -> dict[str, Any]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--agents", at_least(1), AGENTS, "agents at once")
    add_list(parser, "--designs", str, DESIGNS, "designs to run", choices=list(DESIGNS))
    parser.add_argument("--kv-blocks", type=at_least(8), default=KV_BLOCKS, help=f"vLLM's KV budget in blocks of 32 tokens (default {KV_BLOCKS})")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed (default 0)")
    parser.add_argument("--profile-reps", type=at_least(1), default=3, help="repetitions of each profile point (default 3)")
    parser.add_argument("--stall-seconds", type=positive(float), default=STALL_S, help=f"no engine step for this long "
                        f"while agents are left: the run has stalled (default {STALL_S:g})")
    parser.add_argument("--v1-admission-cap", action=argparse.BooleanOptionalAction, default=True,
                        help="then v1 again on a second worker whose active requests are capped so that paused ones "
                        "cannot hold the whole budget (default: on)")
    parser.add_argument("--vllm-python", default=None, help="the interpreter that has vLLM (default: as `compare --engine vllm`)")
    args = parser.parse_args(argv)
    spec = budget_spec(args.kv_blocks)
    budget = budget_tokens(spec)
    folder = run_dir("real_engine_agents")
    runs: list[AgentsRun] = []
    pairs: list[tuple[AgentsRun, AgentsRun | None]] = []
    started = time.perf_counter()

    calibrations: list[Calibration] = []

    async def calibrate_on(client: VllmClient) -> None:
        profile = await profile_engine(client, reps=args.profile_reps, window=spec.max_model_len)
        calibrations.append(calibrate(profile))
        print(f"calibrated on {len(profile.prefill)} prefill, {len(profile.decode)} decode and {len(profile.busy_prefill)} "
              f"busy-prefill profile points (load average {profile.load[0]:.1f} to {profile.load[1]:.1f}):")
        print_table(calibration_rows(calibrations[0]))

    async def agents_on(client: VllmClient, spec: ModelSpec, designs: Sequence[str], engine: str) -> None:
        run_id = secrets.token_hex(4)
        for agents in args.agents:
            tasks = agent_tasks(agents, args.seed)
            for design in designs:
                real = await run_on_vllm(client, spec, design, tasks, namespace=f"{design}-{agents}-{run_id}",
                                         stall_s=args.stall_seconds)
                real.engine = engine
                runs.append(real)
                pairs.append((real, None))
                print(f"  {engine} {design} N={agents}: {real.completed}/{agents} completed"
                      f"{' (stalled)' if real.stalled else ''} in {real.wall_s:.1f} s (load average {real.load[0]:.1f}"
                      f" to {real.load[1]:.1f})", flush=True)

    async def main_async() -> None:
        connect = VllmClient.over_fds(worker) if worker is not None else open_vllm_process(spec, python=args.vllm_python)
        async with connect as client:
            if worker is not None and client.ready.kv_blocks != spec.kv_blocks:
                raise SystemExit(f"the worker given has {client.ready.kv_blocks} KV blocks, not {spec.kv_blocks}")
            print(f"vLLM {client.ready.vllm_version} ({spec.name}, dummy weights) on {client.ready.device}: KV budget "
                  f"{spec.kv_blocks - 1} blocks of {spec.block_size} = {budget:,} tokens; agents {', '.join(map(str, args.agents))}; "
                  f"workload seed {args.seed}: {workload_line(WORKLOAD)}; a stall is {args.stall_seconds:g} s without "
                  f"an engine step\n", flush=True)
            await calibrate_on(client)
            await agents_on(client, spec, args.designs, "vllm")
        if args.v1_admission_cap and SUSPENDED in args.designs:
            cap = admission_cap(spec, agent_tasks(max(args.agents), args.seed))
            capped_spec = budget_spec(args.kv_blocks, max_num_seqs=cap)
            print(f"\nv1 on a worker capped at {cap} active requests (max_num_seqs)", flush=True)
            async with open_vllm_process(capped_spec, python=args.vllm_python) as client:
                await agents_on(client, capped_spec, [SUSPENDED], "vllm-capped")

    trio.run(main_async, clock=PreciseClock())
    (calibration,) = calibrations
    for index, (real, _) in enumerate(pairs):
        if real.engine != "vllm":
            continue
        tasks = agent_tasks(real.agents, args.seed)
        sim = run_simulated(real.design, tasks, budget=budget, latency=calibration.latency, decode_tps=calibration.decode_tps)
        runs.append(sim)
        pairs[index] = (real, sim)
    print(f"\n{len(pairs)} vLLM runs and their simulated twins in {time.perf_counter() - started:.0f} s real\n")
    print("KV (vLLM | simulated engine): per task, 95% intervals in brackets")
    print_table(comparison_rows(pairs, KV_COLUMNS))
    print("\ntime (vLLM | simulated engine, calibrated on this session's profile): a tiny model on a shared CPU")
    print_table(comparison_rows(pairs, TIME_COLUMNS))
    write_csv(folder / "real_engine_agents.csv", figure_rows(runs))
    write_csv(folder / "real_engine_agents_calibration.csv", calibration_rows(calibration))
    write_csv(folder / "real_engine_agents_calls.csv", call_rows(runs))
    series = series_rows(runs)
    if series:
        write_csv(folder / "real_engine_agents_kv.csv", series)
    plot_series([run for run in runs if run.engine in ("vllm", "sim")], budget, folder / "real_engine_agents_kv.png")
    print(f"wrote {folder}/real_engine_agents.csv, _calibration.csv, _calls.csv, _kv.csv and _kv.png")
    return {"runs": runs, "pairs": pairs, "calibration": calibration}


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
