"""What a benchmark run is: the designs, the decode speeds and the network it compares them at, `BenchConfig`
(the tasks, the API's costs, the engine's latency, the clients' reconnect policy), and `parameters(config)`, every
modeled parameter of a run with its source, printed with the results."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import attrs
import numpy as np

from . import metrics, netem
from . import workload as wl
from .api.costs import AFTER_SPRINT, ApiCosts, SprintCosts, SprintSwitches
from .cli.common import plural
from .client.harness import CHAINED, SUSPENDED
from .client.reconnect import CODEX, ReconnectPolicy
from .engine import latency
from .engine.engine import HTTP_AFFINITY
from .engine.kv import BLOCK_SIZE, KV_TTL_SECONDS
from .protocol.items import ENCRYPTED_CONTENT_MIN_CHARS

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


def _describe_policy(policy: ReconnectPolicy) -> str:
    if policy.max_retries == 0:
        return f"{policy.name}: never"
    return (f"{policy.name}: {policy.max_retries} retries, backoff {policy.initial_delay:g} s x{policy.backoff_factor:g}"
            + (" then HTTP" if policy.fallback_to_http else ""))


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
        ("workload preset", f"{name}, {plural(config.n_tasks, 'task')}, seed {config.seed}", "prototype/workload.py"),
        ("turns per task", f"LN({params.turns_median:g}, {params.turns_sigma:g}) in [{params.turns_min}, {params.turns_max}]" if config.fixed_turns is None else f"fixed {config.fixed_turns}", calibrated or "docs/parameters.md §1: Exgentic moment fit, TraceLab p50"),
        ("initial prompt", f"{params.initial_prompt_tokens} tokens, of which {min(params.shared_prefix_tokens, params.initial_prompt_tokens)} common to every task", calibrated or "docs/parameters.md §1 [assumed]"),
        ("common prefix", "Codex's base instructions and tools; the rest of each task from its own content seed; affinity draws per task and turn", "docs/parameters.md §1"),
        ("tokens appended per turn", f"LN({params.appended_median:g}, {params.appended_sigma:g})", "docs/parameters.md §1: TraceLab"),
        ("output tokens per turn", f"LN({params.output_median:g}, {params.output_sigma:g})", calibrated or "docs/parameters.md §1: inference-perf, Exgentic, AgentX"),
        ("parallel client calls", f"{params.parallel_calls_p:.1%} of tool turns, 2/3/4 calls weighted " + "/".join(f"{w:g}" for w in params.parallel_call_weights), "docs/parameters.md §1: yurukusa/cc-multi"),
        ("hosted web_search", f"{params.hosted_call_p:.1%} of tool turns, {params.hosted_seconds:g} s, {params.hosted_result_tokens} tokens", "docs/parameters.md §1: yurukusa/cc-multi [rate]; [assumed latency, size]"),
        ("reasoning share of output", f"uniform {params.reasoning_share[0]:.0%}-{params.reasoning_share[1]:.0%} per turn; encrypted_content >= {ENCRYPTED_CONTENT_MIN_CHARS} chars", "docs/parameters.md §1: public Codex gpt-5.4 trace; LibreChat-AI/agents PR #422"),
        ("tool time", "mixture " + ", ".join(f"{w:g}xLN({m:g} s, {s:g})" for w, m, s in params.tool_mixture) + f", cap {params.tool_cap_seconds:g} s"
         if params.fixed_tool_seconds is None else f"fixed {params.fixed_tool_seconds:g} s a call",
         calibrated or ("docs/parameters.md §2: TraceLab quantiles, AgentCgroup centres" if params.fixed_tool_seconds is None
                        else "prototype/workload.py [assumed]")),
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
        rows = [("workload", f"{plural(len(config.task_list), 'task')} from {config.source or 'an explicit task list'}",
                 "open-loop: each task starts at its arrival" if open_loop else "one task after another"),
                *task_list_rows(config.task_list), *rows[10:]]
    # A "before the sprint" profile pays the extra costs of each switch that is off (api/costs.py).
    sprint_rows = [] if config.sprint == AFTER_SPRINT else SprintCosts().describe()
    return rows + config.costs.describe() + sprint_rows
