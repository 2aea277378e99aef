"""The cost of holding state: engine KV memory under N concurrent agents, per design and
retention policy.

N agents start together, each running one task of the `compact` workload, over WebSocket
to one in-process server under virtual time. The server's one engine is an H100 serving
Llama-3.1-8B: a fixed KV budget, vLLM's batch limit, one prefill at a time, and a retention policy
for the KV of sessions that wait for a tool (prototype/engine/memory.py):

* suspended + hold: v1 as built, the KV held for the whole pause (InferCept's "preserve");
* suspended + swap / discard: InferCept's other two choices at each pause;
* chained + ttl-<s>: v2's prefix cache, LRU-evicted under pressure, expiring after s idle
  (docs/parameters.md §6's sweep 60, 300, 3600 s);
* chained + pin-<s>: held for s idle, then freed (Continuum / CacheTTL);
* chained + discard / swap.

Each configuration runs under several scheduler seeds (`--scheduler-seeds`, default 0-9): the order
in which tasks runnable at the same virtual instant run, which decides who the engine admits first
when hundreds of agents queue for it. Per (design, policy, N) it reports throughput, end-to-end
time, queueing for the engine, prefill recomputed, and GPU KV memory as the mean over the seeds with
a bootstrap interval over them and the seeds' range, and the throughput ratios between the designs
as paired ratios over the seeds (the designs run the same seeds); prints the tables, writes
kv_memory.csv (a row per run), kv_memory_seeds.csv (a row per configuration), kv_memory.json (the
figures the docs quote) and kv_memory.png into a new folder results/kv_memory/<timestamp>/
(results/kv_memory/latest points at the newest).

    python -m experiments.kv_memory [--agents 10 100] [--configs suspended:hold chained:ttl-300 ...] [--scheduler-seeds 0-9]
    python -m experiments.kv_memory --replot        # redraw the newest run's figure from its CSV
    python -m experiments.kv_memory --cluster local  # on a Dask LocalCluster (or --cluster tcp://host:8786)

The grid goes through prototype/sweep.py: worker processes (one per core) by default, results
cached on disk (--no-cache to recompute).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

import attrs
import numpy as np
import trio

from prototype import headline, sweep, uncertainty, virtual
from prototype.api.costs import ApiCosts
from prototype.api.service import ApiService
from prototype.cli.common import at_least, non_negative, positive
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, SUSPENDED, run_websocket_rollout
from prototype.engine.engine import Engine
from prototype.engine.memory import (
    H100_8B_HOST_BUDGET_TOKENS,
    H100_8B_KV_BUDGET_TOKENS,
    KV_BYTES_PER_TOKEN_8B,
    PCIE_BYTES_PER_S,
    VLLM_MAX_NUM_SEQS,
    parse_policy,
)
from prototype.server.app import ResponsesServer
from prototype.server.config import ServerConfig
from prototype.workload import generate

from .common import add_list, experiment_parser, latest_dir, print_table, run_dir, write_csv

CONFIGS = (
    "suspended:hold", "suspended:swap", "suspended:discard",
    "chained:ttl-60", "chained:ttl-300", "chained:ttl-3600", "chained:pin-300", "chained:discard", "chained:swap",
)
# 1,000 agents take minutes a run; with ten seeds a run each they are an option (`--agents 1000`), not the default.
AGENTS = (10, 100)
# Ten replicates of the scheduler's order, the fewest whose bootstrap interval over seeds the docs quote.
SCHEDULER_SEEDS = tuple(range(10))
# The throughput ratios reported, (numerator, denominator) as (design, policy label): holding and pinning
# against the shipped TTL cache, against each other, and swapping against holding in each design.
RATIOS = (
    (("suspended", "hold"), ("chained", "ttl-300s")),
    (("chained", "pin-300s"), ("chained", "ttl-300s")),
    (("suspended", "hold"), ("chained", "pin-300s")),
    (("suspended", "swap"), ("suspended", "hold")),
    (("chained", "swap"), ("chained", "pin-300s")),
)
# Llama-3.1-8B on one H100 at batch 1 and 32k context: (weights + KV read) / HBM bandwidth gives
# 165 tokens/s [derived, docs/parameters.md §3]; the engine's budget is that GPU's, so is its decode rate.
DECODE_TPS = 165.0
# 10 turns per task, a docs/parameters.md §1 sweep value, below the mean of 21.9 to keep the real time of
# 1,000 agents to minutes (the cost is per turn: ~30 ms of real time). The sampled count (up to 300
# turns) would also give 75 of 1,000 tasks a context over Llama-3.1's 128k window and one over the
# whole KV budget; at 10 turns contexts end at 28.5k tokens on average, 72k at most (seed 0).
TURNS = 10
# Delta coalescing [ours]: at most one delta event per second of decoding keeps the event count, and
# the real time, down. It moves no time: an item's last chunk goes out when its last token is ready.
FLUSH_INTERVAL = 1.0
# v1's suspension TTL is 300 s (docs/protocol.md); docs/parameters.md §6 derives that ~15% of 20-turn tasks
# then hit a tool call longer than it and fail. Raised to 3600 s (the §6 sweep's top) so that
# "hold" holds for every pause and no task fails; tool calls are capped at 600 s (§2).
SUSPENSION_TTL = 3600.0
GIB = 2**30


@attrs.frozen
class KvRun:
    """One point of the grid: a design and retention policy under `agents` concurrent agents, and
    every knob the run depends on (prototype/sweep.py keys the results cache with all of them)."""

    design: str
    policy: str
    agents: int
    turns: int = TURNS
    seed: int = 0
    scheduler_seed: int = 0
    budget: int = H100_8B_KV_BUDGET_TOKENS
    host_budget: int = H100_8B_HOST_BUDGET_TOKENS
    max_batch: int = VLLM_MAX_NUM_SEQS
    swap_gbps: float = PCIE_BYTES_PER_S / 1e9
    decode_tps: float = DECODE_TPS
    flush: float = FLUSH_INTERVAL


def engine_for(run: KvRun) -> Engine:
    return Engine(
        kv_budget_tokens=run.budget,
        max_batch=run.max_batch,
        retention=parse_policy(run.policy),
        serial_prefill=True,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN_8B,
        swap_bytes_per_s=run.swap_gbps * 1e9,
        host_budget_tokens=run.host_budget,
    )


def run_config(run: KvRun) -> dict:
    """One server, `run.agents` concurrent rollouts, under virtual time; one row of results."""
    design, agents = run.design, run.agents
    engine = engine_for(run)
    server = ResponsesServer(
        ApiService(costs=ApiCosts(), engine=engine, flush_interval=run.flush),
        # The WS guide's 60-minute connection limit is lifted: the harness does not reconnect, and
        # queueing for the engine, not reconnection, is what this measures.
        ServerConfig(suspension_ttl=SUSPENSION_TTL, connection_lifetime=math.inf, max_connections=agents + 10),
    )
    tasks = generate("compact", seed=run.seed, n_tasks=agents, fixed_turns=run.turns)
    connector = InMemoryConnector(server)
    records = []

    async def agent(task) -> None:
        metadata = {"testbed_workload": server.api.workloads.register(task), "testbed_decode_tps": f"{run.decode_tps:g}"}
        records.append(await run_websocket_rollout(connector, design, task, metadata=metadata))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for task in tasks:
                nursery.start_soon(agent, task)
        engine.advance(trio.current_time())

    # Tasks that become runnable at the same virtual instant run in an order trio chooses, and with
    # hundreds of agents queueing for one engine that order changes who is admitted first.
    # prototype/virtual.py makes it a function of the run and its scheduler seed alone;
    # --scheduler-seed replicates it (docs/kv_memory.md gives the spread).
    wall = time.perf_counter()
    virtual.run(main, scheduler_seed=run.scheduler_seed)
    wall = time.perf_counter() - wall

    done = [r for r in records if r.status == "completed"]
    makespan = max(r.ended_at for r in records) - min(r.started_at for r in records)
    e2e = np.array([r.seconds for r in done]) if done else np.array([math.nan])
    stats = engine.stats
    queue = np.array(stats.queue_delays) if stats.queue_delays else np.array([0.0])
    to_gib = KV_BYTES_PER_TOKEN_8B / GIB
    return {
        "design": design,
        "policy": engine.retention.label,
        "agents": agents,
        "scheduler_seed": run.scheduler_seed,
        "completed": len(done),
        "failed": len(records) - len(done),
        "makespan_h": makespan / 3600,
        "tasks_per_hour": len(done) * 3600 / makespan,
        "e2e_p50_s": float(np.percentile(e2e, 50)),
        "e2e_p90_s": float(np.percentile(e2e, 90)),
        "mean_queue_s": float(queue.mean()),
        "p90_queue_s": float(np.percentile(queue, 90)),
        "mean_prefill_wait_s": float(np.mean(stats.prefill_waits)) if stats.prefill_waits else 0.0,
        "model_calls": stats.model_calls,
        "prefill_tokens": stats.prefill_tokens,
        "recomputed_tokens": stats.recomputed_tokens,
        "recomputed_share": stats.recomputed_tokens / max(1, stats.prefill_tokens),
        "peak_kv_tokens": stats.peak_resident_tokens,
        "peak_kv_gib": stats.peak_resident_tokens * to_gib,
        "mean_kv_gib": stats.resident_token_seconds / makespan * to_gib,
        "peak_host_gib": stats.peak_host_tokens * to_gib,
        "swap_gib": (stats.swap_in_bytes + stats.swap_out_bytes) / GIB,
        "preempted": stats.preempted,
        "evicted": stats.evicted,
        "expired": stats.expired,
        "swap_dropped": stats.swap_dropped,
        "peak_calls_in_flight": stats.peak_active_calls,
        "real_s": wall,
    }


TABLE = (
    "design", "policy", "agents", "scheduler_seed", "tasks_per_hour", "e2e_p50_s", "e2e_p90_s", "mean_queue_s", "mean_prefill_wait_s",
    "recomputed_tokens", "recomputed_share", "peak_kv_gib", "mean_kv_gib", "swap_gib", "preempted", "evicted",
)


# The columns summed up over the seeds: each a mean over the seeds with a bootstrap interval over them.
OVER_SEEDS = ("tasks_per_hour", "e2e_p50_s", "e2e_p90_s", "mean_queue_s", "mean_prefill_wait_s", "recomputed_share",
              "peak_kv_gib", "mean_kv_gib", "swap_gib", "preempted", "evicted")


def seeds_text(seeds: list[int] | tuple[int, ...]) -> str:
    """`0-9` for a run of consecutive seeds, else the seeds separated by commas."""
    ordered = sorted(seeds)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def by_config(rows: list[dict]) -> dict[tuple[str, str, int], dict[int, dict]]:
    """The runs of each (design, policy, agents), by scheduler seed."""
    groups: dict[tuple[str, str, int], dict[int, dict]] = {}
    for row in rows:
        groups.setdefault((row["design"], row["policy"], row["agents"]), {})[row["scheduler_seed"]] = row
    return groups


def over_seeds(rows: list[dict]) -> list[dict]:
    """One row per (design, policy, agents): each `OVER_SEEDS` column's mean over the scheduler seeds with a bootstrap
    interval over the seeds (`uncertainty.Estimate`, n = seeds), throughput's range over the seeds, and the tasks that
    failed in all the runs together."""
    out = []
    for (design, policy, agents), runs in by_config(rows).items():
        seeds = sorted(runs)
        row: dict = {"design": design, "policy": policy, "agents": agents, "seeds": len(seeds)}
        for column in OVER_SEEDS:
            row[column] = uncertainty.bootstrap([runs[s][column] for s in seeds], of="seeds")
        throughput = [runs[s]["tasks_per_hour"] for s in seeds]
        row["tasks_per_hour_min"], row["tasks_per_hour_max"] = min(throughput), max(throughput)
        row["failed"] = sum(runs[s]["failed"] for s in seeds)
        out.append(row)
    return out


def throughput_ratios(rows: list[dict]) -> list[dict]:
    """Each `RATIOS` pair present at each agent count: the ratio of the two configurations' mean throughput over the
    seeds they both ran, with a paired bootstrap interval over those seeds (the same seed gives both designs the same
    scheduler draws), the range of the per-seed ratios, and in how many seeds the first was ahead."""
    groups = by_config(rows)
    out = []
    for agents in sorted({row["agents"] for row in rows}):
        for (first, second) in RATIOS:
            a, b = groups.get((*first, agents)), groups.get((*second, agents))
            if a is None or b is None:
                continue
            seeds = sorted(set(a) & set(b))
            mine = [a[s]["tasks_per_hour"] for s in seeds]
            theirs = [b[s]["tasks_per_hour"] for s in seeds]
            per_seed = [x / y for x, y in zip(mine, theirs)]
            out.append({
                "agents": agents, "first": "/".join(first), "second": "/".join(second),
                "ratio": uncertainty.paired_bootstrap(mine, theirs, _ratio_of_means, of="seeds"),
                "per_seed_min": min(per_seed), "per_seed_max": max(per_seed),
                "ahead": sum(1 for r in per_seed if r > 1), "seeds": len(seeds),
            })
    return out


def _ratio_of_means(first: np.ndarray, second: np.ndarray) -> float:
    return float(first.mean() / second.mean())


def flat(rows: list[dict]) -> list[dict]:
    """Rows for a CSV: each estimate as its value with `_low`, `_high` and `_n` beside it."""
    out = []
    for row in rows:
        cells: dict = {}
        for key, value in row.items():
            if isinstance(value, uncertainty.Estimate):
                cells.update({key: value.value, f"{key}_low": value.low, f"{key}_high": value.high, f"{key}_n": value.n})
            else:
                cells[key] = value
        out.append(cells)
    return out


SUMMARY = ("design", "policy", "agents", "seeds", "tasks_per_hour", "tasks_per_hour_range", "e2e_p50_s", "e2e_p90_s",
           "mean_queue_s", "recomputed_share", "peak_kv_gib", "mean_kv_gib", "swap_gib", "preempted", "evicted", "failed")
SUMMARY_FORMATS = {
    "tasks_per_hour": lambda e: e.format("{:.0f}"),
    "tasks_per_hour_range": lambda r: r,
    "e2e_p50_s": lambda e: e.format("{:.0f}"),
    "e2e_p90_s": lambda e: e.format("{:.0f}"),
    "mean_queue_s": lambda e: e.format("{:.1f}"),
    "recomputed_share": lambda e: e.format("{:.0%}"),
    "peak_kv_gib": lambda e: e.format("{:.1f}"),
    "mean_kv_gib": lambda e: e.format("{:.1f}"),
    "swap_gib": lambda e: e.format("{:.0f}"),
    "preempted": lambda e: e.format("{:.0f}"),
    "evicted": lambda e: e.format("{:.0f}"),
}
RATIO_COLUMNS = ("agents", "first", "second", "ratio", "per_seed", "ahead")


def print_summary(summary: list[dict], ratios: list[dict], seeds: list[int]) -> None:
    print(f"\nOver the scheduler seeds ({seeds_text(seeds)}): mean [95% bootstrap interval over the seeds], and the "
          f"seeds' range of throughput")
    shown = [{**row, "tasks_per_hour_range": f"{row['tasks_per_hour_min']:.0f}-{row['tasks_per_hour_max']:.0f}"} for row in summary]
    print_table(shown, SUMMARY, SUMMARY_FORMATS)
    if ratios:
        print("\nThroughput, first over second: ratio of the mean over the seeds [95% paired bootstrap interval over the "
              "seeds], the per-seed ratios' range, and the seeds in which the first was ahead")
        print_table([{**r, "per_seed": f"{r['per_seed_min']:.2f}-{r['per_seed_max']:.2f}", "ahead": f"{r['ahead']} of {r['seeds']}"}
                     for r in ratios], RATIO_COLUMNS, {"ratio": lambda e: e.format("{:.2f}")})
    if len(seeds) < len(SCHEDULER_SEEDS):
        print(f"\nNot for conclusions: {len(seeds)} scheduler seed(s); the intervals the docs quote rest on "
              f"{len(SCHEDULER_SEEDS)}.")


def headline_section(summary: list[dict], ratios: list[dict], rows: list[dict], *, name: str, command: str,
                     workload: str) -> dict:
    """What docs/kv_memory.md quotes, as data: each configuration's throughput, median end-to-end time and
    recomputed share over the seeds, each throughput ratio, the tables of both per agent count, and each run's
    throughput by seed (the samples behind the intervals)."""
    data = {"scheduler_seeds": sorted({row["scheduler_seed"] for row in rows}), "tasks_per_hour": {
        f"{agents}.{design}.{policy}": [runs[seed]["tasks_per_hour"] for seed in sorted(runs)]
        for (design, policy, agents), runs in by_config(rows).items()}}
    figures: dict[str, dict] = {}
    tables: dict[str, dict] = {}
    for row in summary:
        key = f"{row['agents']}.{row['design']}.{row['policy']}"
        where = f"{row['design']} / {row['policy']} at {row['agents']} agents, mean over {row['seeds']} scheduler seeds"
        figures[f"{key}.tasks_per_hour"] = headline.figure(row["tasks_per_hour"], "{:.0f}", label=f"tasks per hour, {where}")
        figures[f"{key}.e2e_p50_s"] = headline.figure(row["e2e_p50_s"], "{:.0f} s", label=f"end-to-end p50, {where}")
        figures[f"{key}.tasks_per_hour_range"] = headline.text(f"{row['tasks_per_hour_min']:.0f}-{row['tasks_per_hour_max']:.0f}")
        figures[f"{key}.recomputed_share"] = headline.figure(row["recomputed_share"], "{:.0f}%", scale=100, label=f"prefill recomputed, {where}")
    for ratio in ratios:
        key = f"{ratio['agents']}.{ratio['first'].replace('/', '.')}_over_{ratio['second'].replace('/', '.')}"
        figures[f"{key}.per_seed"] = headline.text(f"{ratio['per_seed_min']:.2f}-{ratio['per_seed_max']:.2f}")
        figures[f"{key}.ahead"] = headline.text(f"{ratio['ahead']} of {ratio['seeds']}")
        figures[key] = headline.figure(
            ratio["ratio"], "{:.2f}x", label=f"throughput, {ratio['first']} over {ratio['second']} at {ratio['agents']} agents, "
            f"paired over {ratio['seeds']} scheduler seeds; per seed {ratio['per_seed_min']:.2f}-{ratio['per_seed_max']:.2f}, "
            f"ahead in {ratio['ahead']} of {ratio['seeds']}")
    for agents in sorted({row["agents"] for row in summary}):
        columns = ["design", "policy", "tasks/h", "seeds' range", "e2e p50 (s)", "e2e p90 (s)", "wait for admission (s/call)",
                   "prefill recomputed", "mean KV (GiB)", "swapped (GiB)", "preempted", "evicted"]
        tables[f"throughput.{agents}"] = headline.table(columns, [
            [row["design"], row["policy"], row["tasks_per_hour"].format("{:.0f}"),
             f"{row['tasks_per_hour_min']:.0f}-{row['tasks_per_hour_max']:.0f}", row["e2e_p50_s"].format("{:.0f}"),
             row["e2e_p90_s"].format("{:.0f}"), row["mean_queue_s"].format("{:.1f}"), row["recomputed_share"].scaled(100).format("{:.0f}%"),
             row["mean_kv_gib"].format("{:.1f}"), row["swap_gib"].format("{:,.0f}"), row["preempted"].format("{:.0f}"),
             row["evicted"].format("{:.0f}")]
            for row in summary if row["agents"] == agents])
        mine = [r for r in ratios if r["agents"] == agents]
        if mine:
            tables[f"ratios.{agents}"] = headline.table(["throughput", "ratio of means", "per seed", "first ahead"], [
                [f"{r['first']} over {r['second']}", r["ratio"].format("{:.2f}"), f"{r['per_seed_min']:.2f}-{r['per_seed_max']:.2f}",
                 f"{r['ahead']} of {r['seeds']} seeds"] for r in mine])
    return headline.section(name, command=command, workload=workload, figures=figures, tables=tables, data=data)


def command_line(argv: list[str]) -> str:
    """The command that makes these figures: the options that change them (the runner's and the output's do not)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--jobs", "--cluster", "--output"):
            skip = True
        elif arg not in ("--in-process", "--no-cache"):
            kept.append(arg)
    return " ".join(["python -m experiments.kv_memory", *kept])


def parameters(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(knob, value, source) rows, printed with the results."""
    return [
        ("KV budget", f"{args.budget:,} tokens = {args.budget * KV_BYTES_PER_TOKEN_8B / GIB:.1f} GiB",
         "(0.9 x 80 GB - 16.06 GB) / 128 KiB [derived]: H100, vLLM default utilization, Llama-3.1-8B BF16"),
        ("KV bytes per token", f"{KV_BYTES_PER_TOKEN_8B // 1024} KiB", "Llama-3.1-8B, docs/parameters.md §3 [derived]"),
        ("batch limit", f"{args.max_batch}", "vLLM max_num_seqs default [src]"),
        ("prefill", "15k tok/s, one call at a time", "testbed default R [assumed, docs/parameters.md §3 sweep middle]"),
        ("decode", f"{args.decode_tps:g} tok/s per call, any batch", "8B on H100 at 32k, batch 1 [derived]; batch effect left out"),
        ("host link", f"{args.swap_gbps:g} GB/s each way", "PCIe Gen4 x16 effective [assumed]"),
        ("host budget", f"{args.host_budget:,} tokens", "DGX H100: 2 TB / 8 GPUs [derived]"),
        ("workload", f"compact, {args.turns} turns, seed {args.seed}", "docs/parameters.md §1-2 defaults; turns a §1 sweep value"),
        ("scheduler seeds", seeds_text(args.scheduler_seeds), "trio's tie-break order; each configuration runs under each"),
        ("API costs", "ApiCosts() defaults", "docs/parameters.md §4 [assumed]"),
        ("v1 suspension TTL", f"{SUSPENSION_TTL:g} s", "raised from 300 s so no rollout fails"),
    ]


def plot(rows: list[dict], path) -> None:
    """Each panel: a column's mean over the scheduler seeds against the agent count, with its 95% interval over the
    seeds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (  # column, title, y scale, linear range of a symlog scale
        ("tasks_per_hour", "throughput (tasks / hour)", "log", None),
        ("e2e_p50_s", "end-to-end p50 (s)", "log", None),
        ("e2e_p90_s", "end-to-end p90 (s)", "log", None),
        ("mean_queue_s", "mean wait for admission per model call (s)", "symlog", 0.1),
        ("recomputed_share", "share of prefill recomputed", "linear", None),
        ("mean_kv_gib", "mean GPU KV resident (GiB)", "linear", None),
    )
    summary = over_seeds(rows)
    configs = list(dict.fromkeys((r["design"], r["policy"]) for r in summary))
    seeds = sorted({r["scheduler_seed"] for r in rows})
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    cmap = plt.get_cmap("tab10")
    for ax, (column, title, scale, linthresh) in zip(axes.flat, panels):
        for i, (design, policy) in enumerate(configs):
            mine = sorted((r for r in summary if (r["design"], r["policy"]) == (design, policy)), key=lambda r: r["agents"])
            ax.errorbar(
                [r["agents"] for r in mine], [r[column].value for r in mine],
                yerr=np.array([r[column].error_bar() for r in mine]).T, capsize=3,
                marker="o" if design == SUSPENDED else "s", linestyle="-" if design == SUSPENDED else "--",
                color=cmap(i % 10), label=f"{design} / {policy}",
            )
        ax.set_xscale("log")
        if scale == "symlog":
            ax.set_yscale(scale, linthresh=linthresh)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale(scale)
        ax.set_title(title)
        ax.set_xlabel("concurrent agents")
        ax.grid(True, which="both", alpha=0.3)
    budget_gib = rows[0]["budget_tokens"] * KV_BYTES_PER_TOKEN_8B / GIB
    axes.flat[5].axhline(budget_gib, color="gray", linewidth=1, linestyle=":", label="KV budget")
    handles, labels = axes.flat[5].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=9)
    fig.suptitle("Engine KV memory under concurrency: one H100, Llama-3.1-8B, compact workload (virtual time); "
                 f"mean and 95% interval over scheduler seeds {seeds_text(seeds)}")
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_rows(path) -> list[dict]:
    """The rows of a CSV this experiment wrote, with numbers as numbers."""
    def value(text: str):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--agents", at_least(1), AGENTS, "concurrent agents")
    add_list(parser, "--configs", str, CONFIGS, "design:policy runs, e.g. chained:ttl-300")
    parser.add_argument("--turns", type=at_least(1), default=TURNS, help=f"turns per agent (default {TURNS})")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed")
    add_list(parser, "--scheduler-seeds", non_negative(int), SCHEDULER_SEEDS, "seeds of trio's order for tasks runnable at the same instant")
    parser.add_argument("--budget", type=at_least(1), default=H100_8B_KV_BUDGET_TOKENS, help="GPU KV budget in tokens")
    parser.add_argument("--host-budget", type=non_negative(int), default=H100_8B_HOST_BUDGET_TOKENS, help="host KV budget in tokens")
    parser.add_argument("--max-batch", type=at_least(1), default=VLLM_MAX_NUM_SEQS, help=f"sequences decoded at once (default {VLLM_MAX_NUM_SEQS}, vLLM's max_num_seqs)")
    parser.add_argument("--swap-gbps", type=positive(float), default=PCIE_BYTES_PER_S / 1e9, help=f"host link for KV swap in GB/s (default {PCIE_BYTES_PER_S / 1e9:g})")
    parser.add_argument("--decode-tps", type=positive(float), default=DECODE_TPS, help=f"decode tokens/s (default {DECODE_TPS:g})")
    parser.add_argument("--flush", type=non_negative(float), default=FLUSH_INTERVAL, help=f"delta coalescing interval in seconds (default {FLUSH_INTERVAL:g})")
    parser.add_argument("--output", default="kv_memory", help="name of the CSV and PNG in results/kv_memory/<timestamp>/ (default kv_memory)")
    parser.add_argument("--replot", action="store_true", help="only redraw the figure from the CSV of results/kv_memory/latest/")
    sweep.add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    workload = f"compact, {args.turns} turns a task, seed {args.seed}; every agent starts at t = 0"
    if args.replot:
        folder = latest_dir("kv_memory")
        rows = read_rows(folder / f"{args.output}.csv")
        made = folder / f"{args.output}.json"
        if made.exists():  # the run's own command and workload, not the replot's
            before = json.loads(made.read_text())["headline"]
            command, workload = before["command"], before["workload"]
        else:
            command = command_line([a for a in argv if a != "--replot"])
        write_outputs(rows, folder, args.output, command=command, workload=workload)
        return rows
    folder = run_dir("kv_memory")
    csv_path = folder / f"{args.output}.csv"

    for knob, value, source in parameters(args):
        print(f"  {knob:<20} {value:<40} {source}")
    knobs = {name: getattr(args, name) for name in (
        "turns", "seed", "budget", "host_budget", "max_batch", "swap_gbps", "decode_tps", "flush")}
    runs = []
    for config in args.configs:
        design, _, policy = config.partition(":")
        if design not in (SUSPENDED, CHAINED):
            raise SystemExit(f"unknown design in {config!r}: use suspended or chained")
        parse_policy(policy)
        runs += [KvRun(design, policy, agents, scheduler_seed=seed, **knobs) for agents in args.agents for seed in args.scheduler_seeds]
    wall = time.perf_counter()
    with sweep.runner_from_args(args) as runner:  # the largest runs first, so that the workers finish together
        rows = runner.map(run_config, runs, desc="kv_memory", first=lambda run: -run.agents)
        print(f"  {len(runs)} runs in {time.perf_counter() - wall:.0f} s real ({runner.executed} computed on "
              f"{runner.executor.name}, {runner.cached} from the cache)")
    for row in rows:
        row["budget_tokens"] = args.budget
    print_table(rows, TABLE)
    write_csv(csv_path, rows)
    write_outputs(rows, folder, args.output, command=command_line(argv), workload=workload)
    return rows


def write_outputs(rows: list[dict], folder, output: str, *, command: str, workload: str) -> None:
    """From the runs' rows: the tables over the seeds printed, <output>_seeds.csv, <output>.json (the headline
    figures) and <output>.png."""
    summary, ratios = over_seeds(rows), throughput_ratios(rows)
    print_summary(summary, ratios, sorted({row["scheduler_seed"] for row in rows}))
    write_csv(folder / f"{output}_seeds.csv", flat(summary))
    section = headline_section(summary, ratios, rows, name=output, command=command, workload=workload)
    headline.write(folder / f"{output}.json", {"headline": section})
    plot(rows, folder / f"{output}.png")
    print(f"wrote {output}.csv, {output}_seeds.csv, {output}.json and {output}.png in {folder}")


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    main()
