"""The simulated engine scored against vLLM: calibrated on a profile of the real engine, then asked to predict
runs it was not fitted on, and its error per metric with a 95% interval.

In one session, on one vLLM worker (the tiny CPU model, a KV budget that does not bind: timing, not memory,
is scored here; experiments.real_engine_agents scores the KV under a budget):

1. **Profile** (experiments.real_engine_agents.profile_engine, as Vidur profiles its operators, at request
   level): time to first token of requests alone against their uncached and cached tokens, decode time per
   token against the number of requests decoding at once, and a prefill's time to first token against the
   number decoding meanwhile.
2. **Calibrate** (`real_engine_agents.calibrate`, prototype/engine/fit.py's least squares): the simulated
   engine's latency model (request overhead, prefill rate, cache-attention term, decode rate) and the two
   batch terms.
3. **Predict** configurations the profile never ran: each design on `--agents` agents at once (default 1, 4,
   16) and two workloads (`WORKLOADS`: the agents workload of real_engine_agents, and a longer one), on vLLM
   and on the simulated engine three ways: as experiments.kv_memory runs it (`kv_memory`: decode and prefill
   take as long whatever else is in flight, and a call looks up the prefix cache when it is admitted), with
   the profile's batch terms (`batched`), and with those and the prefix-cache lookup when the call's prefill
   starts, as vLLM looks a request up when it schedules it (`batched+lookup`).
4. **Score**, per metric, pooled over every configuration, each a value with its n and 95% interval:
   per-call time to first token (absolute percentage error per call, paired by task and call: median and
   p90; targets 10% and 25%), per-task end-to-end time (median absolute percentage error), prefill computed
   (the simulated total against vLLM's, signed; target 2%), tasks per hour (per configuration, signed), and
   whether every design ordering vLLM's intervals separate (tasks per hour, end-to-end median, prefill per
   task) comes out the same on the simulated engine.

    python -m experiments.fidelity                       # N = 1, 4, 16, both workloads, the three designs
    python -m experiments.fidelity --agents 1 4 --workloads agents

The profile and the runs it predicts share the session, so they share the machine's load; the load average
is printed with each. Writes results/fidelity/<timestamp>/ (the scores, every paired call, the calibration).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from experiments import real_engine_agents as agents_experiment
from experiments.common import experiment_parser, run_dir, write_csv
from experiments.real_engine_agents import AgentsRun, Calibration
from prototype import uncertainty
from prototype import workload as wl
from prototype.analysis import print_table
from prototype.benchmark import HTTP
from prototype.cli.common import add_list, at_least, non_negative
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.clock import PreciseClock
from prototype.engine.vllm_client import VllmClient, WorkerProcess, open_vllm_process
from prototype.uncertainty import Estimate

DESIGNS = (SUSPENDED, CHAINED, HTTP)
AGENTS = (1, 4, 16)
# The agents workload of real_engine_agents, and a longer one [ours]: a 2,048-token first prompt (1,536 of it
# shared), three turns of ~384-token tool outputs and ~96 sampled tokens: contexts of ~3-4k tokens.
WORKLOADS: dict[str, wl.WorkloadParams] = {
    "agents": agents_experiment.WORKLOAD,
    "long": attrs.evolve(agents_experiment.WORKLOAD, fixed_turns=3, initial_prompt_tokens=2048, shared_prefix_tokens=1536,
                         appended_median=384, appended_max=1024, output_median=96, output_max=192),
}
# A budget that does not bind for these runs [ours]: 2,048 usable blocks of 32 = 65,536 tokens, more than 16
# agents' longest contexts together; the window is the longest sequence either workload reaches, with room.
KV_BLOCKS = 2049
WINDOW = 8192
# The simulated engine three ways: as kv_memory runs it; with the profile's batch terms; and with those and the
# prefix-cache lookup when a prefill starts rather than when the call is admitted (TracedEngine).
VARIANTS = ("kv_memory", "batched", "batched+lookup")
# The targets (the published simulators' scores against vLLM put TTFT within ~10%): per-call TTFT median and
# p90 absolute error, prefill computed.
TTFT_MEDIAN_TARGET, TTFT_P90_TARGET, PREFILL_TARGET = 10.0, 25.0, 2.0
ORDER_METRICS = {"tasks_per_hour": False, "e2e_p50_s": True, "prefill_per_task": True}  # ascending is better?


# --- scoring (pure) ------------------------------------------------------------------------------------------------


def paired_calls(real: AgentsRun, sim: AgentsRun, metric: str = "ttft_s") -> list[tuple[float, float]]:
    """(vLLM, simulated) values of the same calls: the same task (its first prompt's fingerprint) and place in
    its session. Calls only one engine made (none, when both ran the same tasks to the end) are left out."""
    sim_calls = {(call.task, call.index): getattr(call, metric) for call in sim.calls}
    return [(getattr(call, metric), sim_calls[(call.task, call.index)]) for call in real.calls
            if (call.task, call.index) in sim_calls]


def paired_tasks(real: AgentsRun, sim: AgentsRun) -> list[tuple[float, float]]:
    """(vLLM, simulated) end-to-end seconds of the same completed tasks (by workload name)."""
    sim_e2e = {record.workload: record.seconds for record in sim.records if record.status == "completed"}
    return [(record.seconds, sim_e2e[record.workload]) for record in real.records
            if record.status == "completed" and record.workload in sim_e2e]


def call_pair_rows(real: AgentsRun, sim: AgentsRun) -> list[dict[str, Any]]:
    """Every call both engines made, with both times to first token and both prefills (for the calls CSV)."""
    sim_calls = {(call.task, call.index): call for call in sim.calls}
    return [{"task": call.task, "call": call.index, "vllm_ttft_s": call.ttft_s, "sim_ttft_s": other.ttft_s,
             "vllm_computed": call.computed, "sim_computed": other.computed}
            for call in real.calls if (other := sim_calls.get((call.task, call.index))) is not None]


def absolute_errors(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """|simulated - measured| / measured x 100 per pair; pairs measured at 0 are left out."""
    a = np.array([p for p in pairs if p[0] > 0], dtype=float).reshape(-1, 2)
    return 100 * np.abs(a[:, 1] - a[:, 0]) / a[:, 0]


def quantile_of(q: float):
    def statistic(values: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.quantile(values, q, axis=axis)

    return statistic


def error_quantile(errors: Sequence[float], q: float, *, of: str) -> Estimate:
    """A quantile of absolute percentage errors with its bootstrap interval."""
    return uncertainty.bootstrap(errors, quantile_of(q), of=of)


def signed_total_error(pairs: Sequence[tuple[float, float]], *, of: str) -> Estimate:
    """(sum simulated - sum measured) / sum measured x 100, resampling the paired units together."""
    if not pairs:
        return Estimate(math.nan, math.nan, math.nan, 0, of, "paired bootstrap")
    measured, simulated = zip(*pairs)
    return uncertainty.paired_bootstrap(measured, simulated, lambda m, s, axis=-1: 100 * (s.sum(axis=axis) / m.sum(axis=axis) - 1),
                                        of=of)


def orderings_agree(real: Mapping[str, Estimate], sim: Mapping[str, Estimate]) -> str:
    """Whether the simulated values order every pair of designs that vLLM's intervals separate the same way:
    "yes", "no (a vs b)" naming the first pair reversed, or "none separated" where vLLM separates no pair."""
    names = [name for name in real if name in sim]
    separated = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if not uncertainty.separated(real[a], real[b]):
                continue
            separated += 1
            if (real[a].value < real[b].value) != (sim[a].value < sim[b].value):
                return f"no ({a} vs {b})"
    return "yes" if separated else "none separated"


@attrs.frozen
class Config:
    workload: str
    agents: int


def score(results: Mapping[tuple[Config, str], AgentsRun], sims: Mapping[tuple[Config, str, str], AgentsRun],
          variants: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The score table (one row per metric and variant) and the ordering table (one row per configuration,
    metric and variant), from vLLM's runs keyed by (config, design) and the simulated runs keyed by
    (config, design, variant)."""
    configs = list(dict.fromkeys(config for config, _ in results))
    rows = []
    for variant in variants:
        ttft_errors, e2e_errors, prefill_pairs, throughput = [], [], [], []
        for (config, design), real in results.items():
            sim = sims[(config, design, variant)]
            ttft_errors += list(absolute_errors(paired_calls(real, sim)))
            e2e_errors += list(absolute_errors(paired_tasks(real, sim)))
            prefill_pairs.append((real.prefill_tokens, sim.prefill_tokens))
            real_rate, sim_rate = (agents_experiment.figures(run)["tasks_per_hour"].value for run in (real, sim))
            if real_rate > 0 and math.isfinite(real_rate):
                throughput.append(100 * (sim_rate / real_rate - 1))
        scores = {
            ("per-call TTFT", "median |error| %", TTFT_MEDIAN_TARGET): error_quantile(ttft_errors, 0.5, of="calls"),
            ("per-call TTFT", "p90 |error| %", TTFT_P90_TARGET): error_quantile(ttft_errors, 0.9, of="calls"),
            ("per-task end-to-end", "median |error| %", None): error_quantile(e2e_errors, 0.5, of="tasks"),
            ("prefill computed", "total error %", PREFILL_TARGET): signed_total_error(prefill_pairs, of="runs"),
            ("tasks per hour", "median error %", None): uncertainty.bootstrap(throughput, np.median, of="runs"),
        }
        for (metric, statistic, target), estimate in scores.items():
            met = "-" if target is None or not estimate.has_interval and math.isnan(estimate.value) else (
                "yes" if abs(estimate.value) <= target else "no")
            rows.append({"variant": variant, "metric": metric, "statistic": statistic,
                         "value": estimate.format("{:.1f}"), "n": estimate.n, "target": "-" if target is None else f"{target:g}",
                         "met": met})
    orders = []
    for config in configs:
        for metric, ascending in ORDER_METRICS.items():
            real = {design: agents_experiment.figures(run)[metric] for (c, design), run in results.items() if c == config}
            row = {"workload": config.workload, "N": config.agents, "metric": metric,
                   "vLLM order": uncertainty.order(real, ascending=ascending)}
            for variant in variants:
                sim = {design: agents_experiment.figures(sims[(config, design, variant)])[metric] for design in real}
                row[f"{variant} order"] = uncertainty.order(sim, ascending=ascending)
                row[f"{variant} agrees"] = orderings_agree(real, sim)
            orders.append(row)
    return rows, orders


# --- the runs ------------------------------------------------------------------------------------------------------


def simulate(config: Config, design: str, variant: str, calibration: Calibration, tasks: Sequence[wl.Workload],
             budget: int) -> AgentsRun:
    batched = variant.startswith("batched")
    return agents_experiment.run_simulated(
        design, tasks, budget=budget, latency=calibration.latency, decode_tps=calibration.decode_tps,
        decode_batch_s=calibration.decode_batch_s if batched else 0.0,
        prefill_batch_s=calibration.prefill_batch_s if batched else 0.0,
        lookup_when_scheduled=variant.endswith("+lookup"),
    )


def main(argv: list[str] | None = None, *, worker: WorkerProcess | None = None) -> dict[str, Any]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--agents", at_least(1), AGENTS, "agents at once")
    add_list(parser, "--designs", str, DESIGNS, "designs to run", choices=list(DESIGNS))
    add_list(parser, "--workloads", str, tuple(WORKLOADS), "workloads", choices=list(WORKLOADS))
    parser.add_argument("--seed", type=non_negative(int), default=0, help="workload seed (default 0)")
    parser.add_argument("--profile-reps", type=at_least(1), default=3, help="repetitions of each profile point (default 3)")
    parser.add_argument("--vllm-python", default=None, help="the interpreter that has vLLM (default: as `compare --engine vllm`)")
    args = parser.parse_args(argv)
    spec = attrs.evolve(agents_experiment.budget_spec(KV_BLOCKS), max_model_len=WINDOW)
    budget = agents_experiment.budget_tokens(spec)
    folder = run_dir("fidelity")
    started = time.perf_counter()
    results: dict[tuple[Config, str], AgentsRun] = {}
    calibrations: list[Calibration] = []

    async def session() -> None:
        connect = VllmClient.over_fds(worker) if worker is not None else open_vllm_process(spec, python=args.vllm_python)
        async with connect as client:
            run_id = secrets.token_hex(4)
            profile = await agents_experiment.profile_engine(client, reps=args.profile_reps, window=spec.max_model_len)
            calibrations.append(agents_experiment.calibrate(profile))
            for name in args.workloads:
                print(f"workload {name}: {agents_experiment.workload_line(WORKLOADS[name])}")
            print(f"agents {', '.join(map(str, args.agents))}, seed {args.seed}; KV budget {budget:,} tokens (does not bind)")
            print(f"vLLM {client.ready.vllm_version} ({spec.name}, dummy weights): profile of {len(profile.prefill)} prefill, "
                  f"{len(profile.decode)} decode and {len(profile.busy_prefill)} busy-prefill points "
                  f"(load average {profile.load[0]:.1f} to {profile.load[1]:.1f})")
            print_table(agents_experiment.calibration_rows(calibrations[0]))
            for name in args.workloads:
                for agents in args.agents:
                    tasks = agents_experiment.agent_tasks(agents, args.seed, WORKLOADS[name])
                    for design in args.designs:
                        run = await agents_experiment.run_on_vllm(client, spec, design, tasks,
                                                                  namespace=f"{name}-{design}-{agents}-{run_id}")
                        results[(Config(name, agents), design)] = run
                        print(f"  {name} {design} N={agents}: {run.completed}/{agents} in {run.wall_s:.1f} s "
                              f"(load average {run.load[0]:.1f} to {run.load[1]:.1f})", flush=True)

    trio.run(session, clock=PreciseClock())
    calibration = calibrations[0]
    sims: dict[tuple[Config, str, str], AgentsRun] = {}
    for config, design in results:
        tasks = agents_experiment.agent_tasks(config.agents, args.seed, WORKLOADS[config.workload])
        for variant in VARIANTS:
            sims[(config, design, variant)] = simulate(config, design, variant, calibration, tasks, budget)
    rows, orders = score(results, sims, VARIANTS)
    print(f"\n{len(results)} vLLM runs, each predicted two ways, in {time.perf_counter() - started:.0f} s real\n")
    print("held-out error of the simulated engine against vLLM (95% intervals in brackets)")
    print_table(rows)
    print("\ndesign orderings (`<` where the intervals separate, `~` where not)")
    print_table(orders)
    write_csv(folder / "fidelity.csv", rows)
    write_csv(folder / "fidelity_orderings.csv", orders)
    write_csv(folder / "fidelity_calibration.csv", agents_experiment.calibration_rows(calibration))
    calls = [{"workload": config.workload, "N": config.agents, "design": design, "variant": variant, **pair}
             for (config, design), real in results.items() for variant in VARIANTS
             for pair in call_pair_rows(real, sims[(config, design, variant)])]
    if calls:
        write_csv(folder / "fidelity_calls.csv", calls)
    print(f"wrote {folder}/fidelity.csv, _orderings.csv, _calibration.csv and _calls.csv")
    return {"rows": rows, "orders": orders, "results": results, "sims": sims, "calibration": calibration}


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
