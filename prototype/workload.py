"""Agent-task workloads: sampled from the distributions of docs/parameters.md §1-2, or fixed.

A workload is one agent task: a sequence of model turns. Turn 0's appended tokens are the initial prompt (system +
tools + task); the appended tokens of turn k > 0 are the outputs of turn k-1's client tool calls. Every turn except
the last ends with one or more client function calls (several run concurrently); the last turn is the final answer.
A turn may also make hosted (server-side web_search) calls that the server runs before the turn ends, and spends part
of its output tokens on reasoning that the client never sees as text.

What tasks share and what they do not (docs/parameters.md §1): the first `prefix_tokens` of turn 0 are the preset's
system prompt and tool definitions, the same text for every task of the preset (its `prefix` names it), so a real
prefix cache may share them across sessions. Everything after it (the task's prompt, the tool outputs, the model's
text and arguments) is drawn from the task's own `content_seed`, so two tasks share nothing past the common prefix.

The JSONL trace format that holds workloads exactly is in prototype/traces/native.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np

from .ranges import Range


def _at_least(low: int):
    def check(instance: Any, attribute: attrs.Attribute, value: int) -> None:
        if value < low:
            raise ValueError(f"{attribute.name} must be >= {low}, got {value}")

    return check


def _seconds_ok(instance: Any, attribute: attrs.Attribute, value: float | tuple[float, ...]) -> None:
    for s in value if isinstance(value, tuple) else (value,):
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"{attribute.name} must be finite and >= 0, got {s}")


def _float_tuple(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@attrs.frozen
class HostedCall:
    """A hosted (server-side web_search) call made inside a turn.

    Attributes:
        seconds: Latency of the hosted tool service.
        result_tokens: Tokens of the result put into the model's context.
    """

    seconds: float = attrs.field(converter=float, validator=_seconds_ok)
    result_tokens: int = attrs.field(validator=_at_least(0))


@attrs.frozen
class TurnSpec:
    """One model call.

    Attributes:
        appended_tokens: Tokens appended to the context right before this call: the initial prompt on turn 0, the
            outputs of the previous turn's tool calls otherwise.
        output_tokens: Tokens the model samples in this turn (>= 1).
        tool_seconds: Execution time of each client function call this turn ends with; empty on the final turn.
        hosted_calls: Hosted web_search calls made inside this turn before it ends.
        reasoning_tokens: Of `output_tokens`, those the model spends on reasoning (a reasoning item, sampled before
            the visible text; counted in usage's `reasoning_tokens`). Less than `output_tokens`.
    """

    appended_tokens: int = attrs.field(validator=_at_least(0))
    output_tokens: int = attrs.field(validator=_at_least(1))
    tool_seconds: tuple[float, ...] = attrs.field(converter=_float_tuple, validator=_seconds_ok)
    hosted_calls: tuple[HostedCall, ...] = attrs.field(default=(), converter=tuple)
    reasoning_tokens: int = attrs.field(default=0, validator=_at_least(0))

    @reasoning_tokens.validator
    def _check_reasoning(self, attribute: attrs.Attribute, value: int) -> None:
        if value >= self.output_tokens:
            raise ValueError(f"reasoning_tokens ({value}) must be less than output_tokens ({self.output_tokens})")

    @property
    def text_tokens(self) -> int:
        """Output tokens the client sees as text: `output_tokens` minus the reasoning."""
        return self.output_tokens - self.reasoning_tokens


@attrs.frozen
class Workload:
    """One agent task.

    Attributes:
        name: Task label (generated tasks are named "<preset>-<index>").
        seed: The seed the task was generated from (task i of `generate(..., seed=s)` uses rng [s, i]).
        turns: At least one turn; only the last has no tool calls.
        arrival_s: When the task started, in seconds from the start of its trace; None for a generated task.
            A replay with arrival times is open-loop: each task starts at its arrival, not after the previous one.
        content_seed: Seed of the task's own content (prompt, tool outputs, model text); None: `seed`. Generated tasks
            each draw their own, so no two tasks of a run share content past the common prefix.
        prefix: Name of the common prefix (a preset's system prompt and tools); tasks with the same name share it.
        prefix_tokens: Tokens of turn 0's appended tokens that are the common prefix (at most all of them).
    """

    name: str
    seed: int = attrs.field(validator=_at_least(0))
    turns: tuple[TurnSpec, ...] = attrs.field(converter=tuple)
    arrival_s: float | None = attrs.field(default=None, kw_only=True)
    content_seed: int | None = attrs.field(default=None, kw_only=True)
    prefix: str = attrs.field(default="", kw_only=True)
    prefix_tokens: int = attrs.field(default=0, kw_only=True, validator=_at_least(0))

    @arrival_s.validator
    def _check_arrival(self, attribute: attrs.Attribute, value: float | None) -> None:
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"arrival_s must be finite and >= 0, got {value}")

    @property
    def text_seed(self) -> int:
        """The seed every piece of this task's own content is drawn from."""
        return self.seed if self.content_seed is None else self.content_seed

    @turns.validator
    def _check_turns(self, attribute: attrs.Attribute, turns: tuple[TurnSpec, ...]) -> None:
        if not turns:
            raise ValueError("a workload needs at least one turn")
        if turns[-1].tool_seconds:
            raise ValueError(f"the last turn ({len(turns) - 1}) must not end with tool calls")
        for k, turn in enumerate(turns[:-1]):
            if not turn.tool_seconds:
                raise ValueError(f"turn {k} has no tool calls but is not the last turn")

    def __attrs_post_init__(self) -> None:
        if self.prefix_tokens > self.turns[0].appended_tokens:
            raise ValueError(f"prefix_tokens ({self.prefix_tokens}) exceeds turn 0's {self.turns[0].appended_tokens} tokens")

    def tool_output_tokens(self, turn: int) -> tuple[int, ...]:
        """Sizes of the outputs of `turn`'s tool calls: the next turn's appended tokens split evenly, the
        remainder on the first call; () for the last turn."""
        if not 0 <= turn < len(self.turns):
            raise IndexError(f"turn {turn} out of range for {len(self.turns)} turns")
        if turn == len(self.turns) - 1:
            return ()
        n_calls = len(self.turns[turn].tool_seconds)
        base, rest = divmod(self.turns[turn + 1].appended_tokens, n_calls)
        return (base + rest,) + (base,) * (n_calls - 1)

    def context_before(self, turn: int) -> int:
        """Tokens already in the context when `turn`'s appended tokens arrive: appended, output and hosted-result
        tokens of turns 0..turn-1. `turn` may equal len(turns) (the final context)."""
        if not 0 <= turn <= len(self.turns):
            raise IndexError(f"turn {turn} out of range for {len(self.turns)} turns")
        return sum(
            t.appended_tokens + t.output_tokens + sum(h.result_tokens for h in t.hosted_calls)
            for t in self.turns[:turn]
        )

    def prompt_tokens(self, turn: int) -> int:
        """Length of `turn`'s prompt: `context_before(turn)` plus the turn's appended tokens."""
        return self.context_before(turn) + self.turns[turn].appended_tokens

    @property
    def total_output_tokens(self) -> int:
        """Output tokens summed over all turns."""
        return sum(t.output_tokens for t in self.turns)

    @property
    def total_tool_seconds(self) -> float:
        """Client tool time on the critical path: the sum over turns of the slowest call (calls run concurrently)."""
        return float(sum(max(t.tool_seconds) for t in self.turns if t.tool_seconds))


@attrs.frozen
class WorkloadParams:
    """Every distribution parameter of the generator. LN(m, sigma) is a lognormal with median m, log-sd sigma;
    sampled values are rounded and clipped to [min, max]."""

    # docs/parameters.md §1: LN(15, 0.87) fit to Exgentic agent-llm-traces-v2 (mean 21.9, sd 23.4, max 300) with
    # TraceLab's per-session p50 15.
    turns_median: float = 15
    turns_sigma: float = 0.87
    turns_min: int = 1
    turns_max: int = 300
    fixed_turns: int | None = None  # sweeps: 5, 10, 20, 40, 80 (docs/parameters.md §1)
    # docs/parameters.md §1: 8k [assumed], between inference-perf's 3k system prompt and TraceLab's ~30k first turns.
    initial_prompt_tokens: int = 8000
    # docs/parameters.md §1: of the initial prompt, the system prompt and tool definitions every session of the preset
    # sends: Codex's base instructions with its tools, ~7,400 tokens [derived] (openai/codex
    # codex-rs/core/gpt_5_2_prompt.md, 26,087 characters, plus the tool schemas). Clipped to the initial prompt.
    shared_prefix_tokens: int = 7400
    # docs/parameters.md §1: LN(800, 1.26) from TraceLab's appended-token medians ~0.7-0.95k and p90 3-6k.
    appended_median: float = 800
    appended_sigma: float = 1.26
    appended_min: int = 50
    appended_max: int = 32000
    # docs/parameters.md §1: LN(300, 1.0), mean ~493, against inference-perf mean 425, AgentX median 444, TraceLab ~523.
    output_median: float = 300
    output_sigma: float = 1.0
    output_min: int = 1
    output_max: int = 10000
    # docs/parameters.md §2: (weight, median s, sigma) fit to TraceLab's per-call p50 0.3 s / p90 13.6 s, component centres
    # from AgentCgroup; capped at 600 s it gives p50 0.29 s, p90 14.1 s, mean 10.6 s.
    tool_mixture: tuple[tuple[float, float, float], ...] = attrs.field(
        default=((0.65, 0.15, 1.0), (0.31, 4.0, 1.5), (0.04, 100.0, 1.2)),
        converter=lambda mixture: tuple(_float_tuple(component) for component in mixture),
    )
    tool_cap_seconds: float = 600.0
    fixed_tool_seconds: float | None = None  # sweeps: 0.1, 1, 10, 60 s (docs/parameters.md §2)
    # docs/parameters.md §1: yurukusa/cc-multi over 42,847 tool-using Claude Code turns: 35.8% call 2+ tools at once,
    # split 21.3% two, 9.4% three, 5.2% four or more (taken as four) [src].
    parallel_calls_p: float = 0.358
    parallel_call_weights: tuple[float, ...] = attrs.field(default=(0.213, 0.094, 0.052), converter=_float_tuple)
    """Relative weights of 2, 3, 4, ... calls on a turn that makes parallel calls."""
    # docs/parameters.md §1: the same corpus counts 2,040 WebSearch calls over 42,847 tool-using turns, 4.8% [derived]:
    # the probability a non-final turn first makes one hosted web_search.
    hosted_call_p: float = 0.048
    hosted_seconds: float = 1.0  # [assumed]
    hosted_result_tokens: int = 1500  # [assumed]
    # The model's context window: a task ends (its last turn answers) before a turn whose prompt (appended and output
    # tokens so far) would exceed it, as an agent must stop or compact there. None: no limit.
    context_window_tokens: int | None = None
    # docs/parameters.md §1: reasoning's share of a turn's output tokens, uniform over the range a public Codex trace of
    # gpt-5.4 shows per round (11-45%) [src range, uniform assumed].
    reasoning_share: tuple[float, float] = attrs.field(default=(0.11, 0.45), converter=_float_tuple)

    def __attrs_post_init__(self) -> None:
        checks = {
            "1 <= turns_min <= turns_max": 1 <= self.turns_min <= self.turns_max,
            "fixed_turns >= 1": self.fixed_turns is None or self.fixed_turns >= 1,
            "0 <= appended_min <= appended_max": 0 <= self.appended_min <= self.appended_max,
            "1 <= output_min <= output_max": 1 <= self.output_min <= self.output_max,
            "positive medians": min(self.turns_median, self.appended_median, self.output_median) > 0,
            "initial_prompt_tokens >= 0": self.initial_prompt_tokens >= 0,
            "tool_mixture of (weight >= 0, median > 0, sigma >= 0) with positive total weight": bool(self.tool_mixture)
            and all(len(c) == 3 and c[0] >= 0 and c[1] > 0 and c[2] >= 0 for c in self.tool_mixture)
            and sum(c[0] for c in self.tool_mixture) > 0,
            "fixed_tool_seconds >= 0": self.fixed_tool_seconds is None or self.fixed_tool_seconds >= 0,
            "probabilities in [0, 1]": 0 <= self.parallel_calls_p <= 1 and 0 <= self.hosted_call_p <= 1,
            "shared_prefix_tokens >= 0": self.shared_prefix_tokens >= 0,
            "parallel_call_weights >= 0 with a positive total": bool(self.parallel_call_weights)
            and min(self.parallel_call_weights) >= 0 and sum(self.parallel_call_weights) > 0,
            "reasoning_share (low, high) within [0, 1)": len(self.reasoning_share) == 2
            and 0 <= self.reasoning_share[0] <= self.reasoning_share[1] < 1,
            "hosted_seconds, hosted_result_tokens >= 0": self.hosted_seconds >= 0 and self.hosted_result_tokens >= 0,
            "context_window_tokens > initial_prompt_tokens": self.context_window_tokens is None
            or self.context_window_tokens > self.initial_prompt_tokens,
        }
        failed = [rule for rule, ok in checks.items() if not ok]
        if failed:
            raise ValueError(f"invalid WorkloadParams: {'; '.join(failed)}")


# The coding agent, calibrated to TraceLab (uw-syfi/TraceLab, CC BY 4.0: 357,161 rounds of real Claude Code and Codex
# sessions; its paper's published medians per step), docs/parameters.md "Calibration": the per-step medians of
# appended (~875) and output (~214) tokens; a 30k-token first prompt (TraceLab's Claude first turns are ~27-32k) and
# LN(15, 1.4) turns (TraceLab's per-session p50 15) put the median cached prefix per step at ~119k; output log-sd 1.34
# gives TraceLab's mean output per step (~523 = 186.9M / 357,161). Tool times: the three-component mixture refitted so
# ~4% of calls take over a minute and hold ~85% of tool time (TraceLab), keeping p50 ~0.3 s and p90 ~13.6 s; that
# tail needs a mean of ~390 s per long call, so the cap is 3600 s (vLLM RFC #52113's maximum KV TTL).
CODING = WorkloadParams(
    turns_median=15, turns_sigma=1.4, initial_prompt_tokens=30000,
    appended_median=875, appended_sigma=1.26, output_median=214, output_sigma=1.34,
    tool_mixture=((0.65, 0.15, 1.0), (0.315, 4.0, 1.5), (0.035, 200.0, 1.2)), tool_cap_seconds=3600.0,
)
PRESETS: dict[str, WorkloadParams] = {
    "coding": CODING,
    # The WorkloadParams defaults (docs/parameters.md §1: Exgentic moment fit, an 8k first prompt): a coding agent
    # with contexts of ~30-75k tokens, shorter than TraceLab's. The experiments sized on it (a GPU's KV budget, the
    # published-results conditions) keep using it.
    "compact": WorkloadParams(),
    # [assumed] A short chat: one user request of 1-3 turns (TraceLab's per-user-request p50 is 1 turn,
    # docs/parameters.md §1), a ~500-token prompt, small tool results and a fixed quick tool.
    "chat": WorkloadParams(
        turns_median=2, turns_sigma=0.5, turns_max=3, initial_prompt_tokens=500, shared_prefix_tokens=300,
        appended_median=200, appended_sigma=0.8, appended_max=4000,
        output_median=200, output_sigma=0.8, output_max=4000, fixed_tool_seconds=0.5,
    ),
    # A long-horizon coding session: coding's per-turn sizes and tools over ~60 turns (AgentX median 43; TraceLab's
    # per-session mean 73.6), reaching contexts of ~150-250k tokens; LN(60, 0.5) is [assumed].
    "long": attrs.evolve(CODING, turns_median=60, turns_sigma=0.5),
}
DEFAULT_PRESET = "coding"

# Plausible ranges of the [assumed] generator values above, by field (and preset where one preset's value).
WORKLOAD_RANGES: dict[str, Range] = {
    "initial_prompt_tokens (compact)": Range(3000, 32000, "inference-perf code-generation's 3k system prompt to "
                                             "TraceLab's 27-32k first turns"),
    "hosted_seconds": Range(0.3, 5.0, "one search API call answered from its cache, to a search that fetches and "
                            "reads several pages [assumed]"),
    "hosted_result_tokens": Range(500, 5000, "a few result snippets to several fetched pages [assumed]"),
    "fixed_tool_seconds (chat)": Range(0.1, 2.0, "a file read (TraceLab's quick tools, p50 0.3 s) to a short command "
                                       "[assumed]"),
    "turns_median (long)": Range(43, 74, "AgentX's median 43 turns to TraceLab's per-session mean 73.6"),
}


def sample_tool_seconds(rng: np.random.Generator, params: WorkloadParams, size: int) -> np.ndarray:
    """Draws `size` tool-call durations: `params.fixed_tool_seconds` if set, else the lognormal mixture, capped."""
    if params.fixed_tool_seconds is not None:
        return np.full(size, float(params.fixed_tool_seconds))
    weights, medians, sigmas = np.array(params.tool_mixture).T
    component = rng.choice(len(weights), size=size, p=weights / weights.sum())
    seconds = medians[component] * np.exp(sigmas[component] * rng.standard_normal(size))
    return np.minimum(seconds, params.tool_cap_seconds)


def _lognormal_ints(rng: np.random.Generator, median: float, sigma: float, low: int, high: int, size: int) -> list[int]:
    return np.clip(np.rint(rng.lognormal(math.log(median), sigma, size)), low, high).astype(np.int64).tolist()


def _resolve(params: WorkloadParams | str, overrides: dict[str, Any]) -> tuple[str, WorkloadParams]:
    if isinstance(params, str):
        if params not in PRESETS:
            raise ValueError(f"unknown preset {params!r}; choose one of {sorted(PRESETS)}")
        label, params = params, PRESETS[params]
    else:
        label = "custom"
    return label, attrs.evolve(params, **overrides) if overrides else params


# Stream keys under a task's [seed, index]: the shape draws use the plain pair, as they always have.
_CALL_COUNTS, _REASONING, _CONTENT = 1, 2, 3


def content_seed_of(seed: int, index: int) -> int:
    """Task `index`'s own content seed: independent of the shape draws and of every other task's."""
    return int(np.random.SeedSequence([seed, index, _CONTENT]).generate_state(1)[0])


def _generate_task(p: WorkloadParams, seed: int, index: int, name: str, label: str) -> Workload:
    rng = np.random.default_rng([seed, index])
    n = p.fixed_turns or _lognormal_ints(rng, p.turns_median, p.turns_sigma, p.turns_min, p.turns_max, 1)[0]
    outputs = _lognormal_ints(rng, p.output_median, p.output_sigma, p.output_min, p.output_max, n)
    appended = [p.initial_prompt_tokens]
    appended += _lognormal_ints(rng, p.appended_median, p.appended_sigma, p.appended_min, p.appended_max, n - 1)
    hosted = (rng.random(n - 1) < p.hosted_call_p).tolist() + [False]
    if p.context_window_tokens is not None:
        # Hosted results join the context too (`Workload.context_before`).
        searched = [p.hosted_result_tokens * h for h in hosted[:-1]]
        prompts = np.cumsum(appended) + np.concatenate([[0], np.cumsum(outputs[:-1]) + np.cumsum(searched)])
        n = max(1, int(np.argmax(prompts > p.context_window_tokens)) if prompts[-1] > p.context_window_tokens else n)
        outputs, appended, hosted = outputs[:n], appended[:n], hosted[: n - 1] + [False]
    parallel = (rng.random(n - 1) < p.parallel_calls_p).tolist()
    # How many calls a parallel turn makes, and the reasoning shares, come from their own streams so that they do not
    # move the draws above or the tool times below.
    weights = np.array(p.parallel_call_weights)
    extra = np.random.default_rng([seed, index, _CALL_COUNTS]).choice(len(weights), size=n - 1, p=weights / weights.sum())
    n_calls = [2 + int(e) if par else 1 for par, e in zip(parallel, extra.tolist())] + [0]
    low, high = p.reasoning_share
    shares = np.random.default_rng([seed, index, _REASONING]).uniform(low, high, n)
    seconds = sample_tool_seconds(rng, p, sum(n_calls)).tolist()  # drawn last: only its length varies
    hosted_call = HostedCall(p.hosted_seconds, p.hosted_result_tokens)
    turns, start = [], 0
    for k in range(n):
        calls = seconds[start : start + n_calls[k]]
        start += n_calls[k]
        reasoning = min(outputs[k] - 1, int(round(shares[k] * outputs[k])))
        turns.append(TurnSpec(appended[k], outputs[k], calls, (hosted_call,) if hosted[k] else (), reasoning))
    return Workload(
        name, seed, turns, content_seed=content_seed_of(seed, index), prefix=label,
        prefix_tokens=min(p.shared_prefix_tokens, p.initial_prompt_tokens),
    )


def generate(
    params: WorkloadParams | str = DEFAULT_PRESET, *, seed: int, n_tasks: int = 1, **overrides: Any
) -> list[Workload]:
    """Samples `n_tasks` workloads.

    Args:
        params: A preset name from `PRESETS` or explicit parameters.
        seed: Non-negative seed; task i uses `np.random.default_rng([seed, i])`, so it does not depend on n_tasks.
        n_tasks: Number of tasks.
        **overrides: `WorkloadParams` fields to replace, e.g. `fixed_turns=20`.

    Returns:
        Tasks named "<preset>-<i>" ("custom-<i>" for explicit params), each with `seed` set to `seed`, its own
        `content_seed`, and the preset's common prefix (`prefix` is the preset's name, or "custom").
    """
    label, p = _resolve(params, overrides)
    return [_generate_task(p, seed, i, f"{label}-{i}", label) for i in range(n_tasks)]


def generate_one(
    params: WorkloadParams | str = DEFAULT_PRESET, *, seed: int, index: int = 0, **overrides: Any
) -> Workload:
    """Returns task `index` (default the first) of `generate(params, seed=seed, **overrides)`."""
    label, p = _resolve(params, overrides)
    return _generate_task(p, seed, index, f"{label}-{index}", label)


def fixed(
    n_turns: int, *, initial_prompt_tokens: int = 8000, appended_tokens: int = 800, output_tokens: int = 300,
    tool_seconds: float = 0.3, name: str = "fixed", reasoning_tokens: int = 0, content_seed: int | None = None,
) -> Workload:
    """A deterministic workload (seed 0): `n_turns` turns, each non-final one ending with a single tool call, no
    common prefix, and `reasoning_tokens` of each turn's output spent on reasoning."""
    if n_turns < 1:
        raise ValueError(f"n_turns must be >= 1, got {n_turns}")
    appended = [initial_prompt_tokens] + [appended_tokens] * (n_turns - 1)
    calls = [(tool_seconds,)] * (n_turns - 1) + [()]
    turns = [TurnSpec(a, output_tokens, c, (), reasoning_tokens) for a, c in zip(appended, calls, strict=True)]
    return Workload(name, 0, turns, content_seed=content_seed)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90))}


def summary(workloads: Iterable[Workload]) -> dict[str, dict[str, float]]:
    """Mean, p50 and p90 of turns per task, output tokens per turn, appended tokens per turn (turns > 0, i.e.
    without the initial prompt) and seconds per tool call, to compare with docs/parameters.md's derived moments."""
    workloads = list(workloads)
    turns = [t for w in workloads for t in w.turns]
    return {
        "turns": _stats([len(w.turns) for w in workloads]),
        "output_tokens_per_turn": _stats([t.output_tokens for t in turns]),
        "appended_tokens_per_turn": _stats([t.appended_tokens for w in workloads for t in w.turns[1:]]),
        "tool_seconds": _stats([s for t in turns for s in t.tool_seconds]),
        "calls_per_tool_turn": _stats([len(t.tool_seconds) for t in turns if t.tool_seconds]),
        "hosted_calls_per_tool_turn": _stats([len(t.hosted_calls) for t in turns if t.tool_seconds]),
        "reasoning_share": _stats([t.reasoning_tokens / t.output_tokens for t in turns]),
    }
