"""Every [assumed] parameter with its default and plausible range, gathered from where each lives.

The defaults and their `Range`s stay next to each other in the module that uses them (api/costs.py,
engine/latency.py, engine/engine.py, netem/profiles.py, engine/memory.py, workload.py,
traces/base.py); this module lists them for docs/parameters.md's table ("Plausible ranges") and
for `experiments.sensitivity`, and `configure` applies values of the swept ones to a benchmark
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from . import netem
from . import workload as wl
from .api.costs import API_COST_RANGES, SPRINT_COST_RANGES, ApiCosts, SprintCosts, StageCost
from .engine import latency, memory
from .engine.engine import HTTP_AFFINITY, HTTP_AFFINITY_RANGE
from .netem.profiles import RTT_RANGE
from .ranges import Range
from .traces.base import CHARS_PER_TOKEN, CHARS_PER_TOKEN_RANGE


@attrs.frozen
class Assumed:
    """One [assumed] parameter: its default, plausible range, and how to print them."""

    name: str
    """The name docs/parameters.md and the sensitivity tables give it."""
    default: float
    """The default, in the unit the code uses (seconds, shares, tokens/s, ...)."""
    range: Range
    """Its plausible values, in the same unit."""
    unit: str
    """The unit it is printed in."""
    scale: float = 1.0
    """Printed value = value x scale (1000 prints seconds as ms)."""
    where: str = ""
    """The module that holds the default and the range."""

    def __attrs_post_init__(self) -> None:
        if self.default not in self.range:
            raise ValueError(f"{self.name}: default {self.default!r} lies outside its range {self.range.low!r}-{self.range.high!r}")

    def show(self, value: float) -> str:
        return f"{value * self.scale:,.6g}"

    def markdown_row(self) -> str:
        """This parameter's row in docs/parameters.md's "Plausible ranges" table."""
        return (f"| {self.name} | {self.show(self.default)} {self.unit} | {self.show(self.range.low)}-{self.show(self.range.high)} "
                f"{self.unit} | {self.range.why} | {self.where} |")


_COSTS, _SPRINT, _COMPACT = ApiCosts(), SprintCosts(), wl.PRESETS["compact"]
_PER_KTOK = _COSTS.validate.per_ktok + _COSTS.safety.per_ktok + _COSTS.render.per_ktok

ASSUMED: tuple[Assumed, ...] = (
    Assumed("t_fixed_pre", _COSTS.fixed_pre, API_COST_RANGES["t_fixed_pre"], "ms", 1000, "prototype/api/costs.py"),
    Assumed("t_pre_per_ktok", _PER_KTOK, API_COST_RANGES["t_pre_per_ktok"], "ms/1k tokens", 1000, "prototype/api/costs.py"),
    Assumed("t_post", _COSTS.post, API_COST_RANGES["t_post"], "ms", 1000, "prototype/api/costs.py"),
    Assumed("t_store_read", _COSTS.store_read_per_turn, API_COST_RANGES["t_store_read"], "ms/earlier turn", 1000, "prototype/api/costs.py"),
    Assumed("f_ws", _COSTS.cached_fixed_share, API_COST_RANGES["f_ws"], "of t_fixed_pre", 1, "prototype/api/costs.py"),
    Assumed("http_affinity", HTTP_AFFINITY, HTTP_AFFINITY_RANGE, "of http turns", 1, "prototype/engine/engine.py"),
    Assumed("prefill_rate", latency.PREFILL_TOKENS_PER_S, latency.PREFILL_RANGE, "tokens/s", 1, "prototype/engine/latency.py"),
    Assumed("engine_overhead", latency.ENGINE_REQUEST_OVERHEAD_S, latency.ENGINE_OVERHEAD_RANGE, "ms", 1000, "prototype/engine/latency.py"),
    Assumed("rtt", netem.SAME_REGION.rtt, RTT_RANGE, "ms", 1000, "prototype/netem/profiles.py"),
    Assumed("hosted_seconds", _COMPACT.hosted_seconds, wl.WORKLOAD_RANGES["hosted_seconds"], "s", 1, "prototype/workload.py"),
    Assumed("hosted_result_tokens", _COMPACT.hosted_result_tokens, wl.WORKLOAD_RANGES["hosted_result_tokens"], "tokens", 1,
            "prototype/workload.py"),
    Assumed("initial_prompt_tokens (compact)", _COMPACT.initial_prompt_tokens,
            wl.WORKLOAD_RANGES["initial_prompt_tokens (compact)"], "tokens", 1, "prototype/workload.py"),
    Assumed("fixed_tool_seconds (chat)", wl.PRESETS["chat"].fixed_tool_seconds, wl.WORKLOAD_RANGES["fixed_tool_seconds (chat)"],
            "s", 1, "prototype/workload.py"),
    Assumed("turns_median (long)", wl.PRESETS["long"].turns_median, wl.WORKLOAD_RANGES["turns_median (long)"], "turns", 1,
            "prototype/workload.py"),
    Assumed("sprint config_load", _SPRINT.config_load, SPRINT_COST_RANGES["config_load"], "ms", 1000, "prototype/api/costs.py"),
    Assumed("sprint intermediate_hop", _SPRINT.intermediate_hop, SPRINT_COST_RANGES["intermediate_hop"], "ms", 1000,
            "prototype/api/costs.py"),
    Assumed("sprint slow_safety_fixed", _SPRINT.slow_safety_fixed, SPRINT_COST_RANGES["slow_safety_fixed"], "ms", 1000,
            "prototype/api/costs.py"),
    Assumed("sprint slow_safety_per_ktok", _SPRINT.slow_safety_per_ktok, SPRINT_COST_RANGES["slow_safety_per_ktok"], "ms/1k tokens",
            1000, "prototype/api/costs.py"),
    Assumed("host-GPU copy rate", memory.PCIE_BYTES_PER_S, memory.PCIE_RANGE, "GB/s", 1e-9, "prototype/engine/memory.py"),
    Assumed("characters per token (trace results)", CHARS_PER_TOKEN, CHARS_PER_TOKEN_RANGE, "characters", 1,
            "prototype/traces/base.py"),
)
BY_NAME: dict[str, Assumed] = {a.name: a for a in ASSUMED}

# What `experiments.sensitivity` sweeps: every [assumed] value that moves a benchmark of the http, chained and
# suspended designs on the coding preset. Left out, because they move none of its figures: t_store_read (http-stored
# only), the sprint extras (the "before" profile only), the compact/chat/long presets' values, the host copy rate
# (KV swapping, experiments.kv_memory) and the trace reader's characters per token.
SWEPT: tuple[str, ...] = (
    "t_fixed_pre", "t_pre_per_ktok", "t_post", "f_ws", "http_affinity", "prefill_rate", "engine_overhead", "rtt",
    "hosted_seconds", "hosted_result_tokens",
)


def _scaled(stage: StageCost, fixed: float, per_ktok: float) -> StageCost:
    return StageCost(fixed=stage.fixed * fixed, per_ktok=stage.per_ktok * per_ktok)


def configure(config, values: Mapping[str, float]):  # noqa: ANN001, ANN201 - a benchmark.BenchConfig (imported late: no cycle)
    """`config` (a benchmark.BenchConfig) with the swept parameters in `values` set; the others keep
    `config`'s values. `t_fixed_pre` and `t_pre_per_ktok` scale every stage of their split alike.
    The hosted-tool values need a preset given as WorkloadParams, or a preset name."""
    unknown = set(values) - set(SWEPT)
    if unknown:
        raise ValueError(f"not a swept parameter: {', '.join(sorted(unknown))} (swept: {', '.join(SWEPT)})")
    costs, model = config.costs, config.latency
    fixed = values.get("t_fixed_pre", costs.fixed_pre) / costs.fixed_pre if costs.fixed_pre else 1.0
    per_ktok_now = costs.validate.per_ktok + costs.safety.per_ktok + costs.render.per_ktok
    per_ktok = values.get("t_pre_per_ktok", per_ktok_now) / per_ktok_now if per_ktok_now else 1.0
    costs = attrs.evolve(
        costs,
        validate=_scaled(costs.validate, fixed, per_ktok), safety=_scaled(costs.safety, fixed, per_ktok),
        render=_scaled(costs.render, fixed, per_ktok), route=_scaled(costs.route, fixed, per_ktok),
        post=values.get("t_post", costs.post), cached_fixed_share=values.get("f_ws", costs.cached_fixed_share),
    )
    model = attrs.evolve(model, prefill_tokens_per_s=values.get("prefill_rate", model.prefill_tokens_per_s),
                         request_overhead=values.get("engine_overhead", model.request_overhead))
    preset = config.preset
    if "hosted_seconds" in values or "hosted_result_tokens" in values:
        params = preset if isinstance(preset, wl.WorkloadParams) else wl.PRESETS[preset]
        preset = attrs.evolve(params, hosted_seconds=values.get("hosted_seconds", params.hosted_seconds),
                              hosted_result_tokens=int(round(values.get("hosted_result_tokens", params.hosted_result_tokens))))
    return attrs.evolve(
        config, costs=costs, latency=model, preset=preset,
        network=attrs.evolve(config.network, rtt=values.get("rtt", config.network.rtt)),
        http_affinity=values.get("http_affinity", config.http_affinity),
    )


__all__ = ["ASSUMED", "BY_NAME", "SWEPT", "Assumed", "configure"]
