"""The GPU run, in one command: the real-engine comparison and the KV memory of N concurrent agents
on vLLM with the Llama-3.1-8B-shaped model (dummy weights), on one GPU.

    python -m experiments.gpu_run
    python -m experiments.gpu_run --agents 10 100   # fewer agents

1. `experiments.real_engine --gpu`: the designs on the same coding tasks; per call the prefill vLLM
   computed against the simulated engine's prediction, time to first token, decode rate.
2. Agents: N chat agents start at once, each one task of a few turns, over v1 (one held request
   per rollout) and chained (a request per turn); per (design, N), vLLM's own peak share of KV
   blocks in use (held requests keep theirs through each tool call; a chained request's blocks
   are free, though still findable, once it ends), against the simulated engine's peak resident
   tokens for the same calls. `experiments.kv_memory` asks the same question under a modeled H100.

Checks first, with the interpreter that will run vLLM, that it imports vLLM and that torch sees a CUDA
GPU, and refuses to start, saying which is missing: it installs nothing (a GPU machine without vLLM,
or without network access, gets the reason, not a plan that cannot run). How long it takes has not
been measured (no GPU was available where it was written). Writes its tables into
results/gpu_run/<timestamp>/ (and real_engine's into results/real_engine*/).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from typing import Any

import attrs
import trio

from experiments import real_engine
from experiments.common import experiment_parser, report
from prototype import benchmark
from prototype import workload as wl
from prototype.api.costs import ZERO_COSTS
from prototype.cli.common import add_list
from prototype.client.harness import CHAINED, SUSPENDED
from prototype.clock import PreciseClock
from prototype.engine.vllm_client import VllmClient, VllmUnavailable, WorkerProcess, open_vllm_process, vllm_python
from prototype.engine.vllm_engine import open_vllm_engine
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, ModelSpec

AGENTS = (10, 100, 1000)
AGENT_TURNS = 5
AGENT_TOOL_SECONDS = 2.0  # each tool call [ours]: long enough that v1's held KV is seen while agents wait
AGENT_DESIGNS = (SUSPENDED, CHAINED)
# Run by the vLLM interpreter: vLLM importable (its version), and the CUDA GPU torch sees (empty: none).
GPU_PROBE = ("import vllm, torch; print(vllm.__version__); "
             "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")


class NotRunnable(Exception):
    """What this machine lacks for the GPU run."""


def gpu_name(python: str | None = None) -> str:
    """The GPU the vLLM interpreter sees. Raises NotRunnable, saying why, where that interpreter is missing, cannot
    import vLLM, or sees no CUDA GPU (no device, or a CPU build of torch)."""
    try:
        interpreter = vllm_python(python)
    except VllmUnavailable as reason:
        raise NotRunnable(str(reason)) from None
    probe = subprocess.run([str(interpreter), "-c", GPU_PROBE], capture_output=True, text=True, timeout=600)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [f"it exited with status {probe.returncode}"])[-1]
        raise NotRunnable(f"{interpreter} cannot import vLLM and torch ({last}); install vLLM's CUDA build there "
                          "(docs/real_engine.md)")
    version, _, name = probe.stdout.strip().partition("\n")
    if not name.strip():
        raise NotRunnable(f"the vLLM interpreter ({interpreter}, vLLM {version}) sees no CUDA GPU; this run needs one "
                          "(docs/real_engine.md)")
    return name.strip()


def agent_tasks(agents: int, turns: int, seed: int) -> tuple[wl.Workload, ...]:
    """`agents` chat tasks that all arrive at once (run_design runs them open-loop, concurrently)."""
    config = real_engine.real_config("chat", agents, turns, seed, AGENT_TOOL_SECONDS)
    return tuple(attrs.evolve(task, arrival_s=0.0) for task in config.tasks())


def agents_rows(agent_counts: list[int], designs: list[str], spec: ModelSpec, *, turns: int = AGENT_TURNS, seed: int = 0,
                python: str | None = None, worker: WorkerProcess | None = None) -> list[dict[str, Any]]:
    """Per (design, N): N agents at once over vLLM; its peak KV blocks against the simulated engine's prediction."""

    async def main() -> list[dict[str, Any]]:
        rows = []
        run = secrets.token_hex(4)  # prefixes that other runs left on the same worker are not found
        connect = VllmClient.over_fds(worker) if worker is not None else open_vllm_process(spec, python=python)
        async with connect as client:
            blocks, block_size = client.ready.kv_blocks, client.ready.block_size
            for agents in agent_counts:
                tasks = agent_tasks(agents, turns, seed)
                config = benchmark.BenchConfig(task_list=tasks, costs=ZERO_COSTS)
                for design in designs:
                    await client.counters(reset_peak=True)
                    started = time.perf_counter()
                    async with open_vllm_engine(spec, client=client, namespace=f"{design}-{agents}-{run}") as engine:
                        records = await benchmark.run_design(design, real_engine.PROFILE_TPS, tasks, config,
                                                             server=benchmark.bench_server(config, engine))
                        counters = await client.counters()
                    peak_blocks = round(counters["kv_usage_max"] * blocks)
                    rows.append({
                        "design": design, "agents": agents, "completed": sum(r.status == "completed" for r in records),
                        "wall_s": time.perf_counter() - started, "model_calls": len(engine.records),
                        "peak_kv_blocks_vllm": peak_blocks, "peak_kv_tokens_vllm": peak_blocks * block_size,
                        "peak_kv_gib_vllm": peak_blocks * block_size * spec.kv_bytes_per_token() / 2**30,
                        "peak_resident_tokens_sim": engine.stats.peak_resident_tokens,
                        "kv_blocks_total": blocks,
                    })
        return rows

    return trio.run(main, clock=PreciseClock())


def main(argv: list[str] | None = None, *, worker: WorkerProcess | None = None, spec: ModelSpec = LLAMA_8B_SHAPE) -> int:
    parser = experiment_parser(__doc__)
    add_list(parser, "--agents", int, AGENTS, "concurrent agents")
    parser.add_argument("--turns", type=int, default=AGENT_TURNS, help=f"turns per agent (default {AGENT_TURNS})")
    parser.add_argument("--vllm-python", default=None, help="the interpreter that has vLLM's CUDA build")
    parser.add_argument("--skip-comparison", action="store_true", help="only the agents run")
    args = parser.parse_args(argv)
    try:
        gpu = gpu_name(args.vllm_python)
    except NotRunnable as reason:
        print(f"gpu_run: {reason}")
        return 2
    print(f"gpu_run on {gpu}")
    if not args.skip_comparison:
        real_engine.main(["--gpu", *(["--vllm-python", args.vllm_python] if args.vllm_python else [])], worker=worker)
    rows = agents_rows(args.agents, list(AGENT_DESIGNS), spec, turns=args.turns, python=args.vllm_python, worker=worker)
    print(f"\nagents on vLLM ({spec.name}, dummy weights) on {gpu}: chat tasks x {args.turns} turns, tools of {AGENT_TOOL_SECONDS:g} s\n")
    report(rows, "gpu_run.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
