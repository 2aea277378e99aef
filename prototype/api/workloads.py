"""Which workload a request runs: chosen by the request's metadata, or the server's defaults.

Metadata keys (all values are strings, as the public API requires):

* `testbed_workload`: a preset name (`coding`, `compact`, `chat`, `long`), a fixed task
  `fixed:<turns>[:<prompt tokens>[:<appended tokens>[:<output tokens>[:<tool seconds>]]]]`
  (defaults 8000, 800, 300, 0.3: `workload.fixed`), or a key returned by `WorkloadCatalog.register`
  (traces replayed in-process);
* `testbed_seed`: the seed (default: the server's `--seed`);
* `testbed_task`: which task of the seeded preset (default 0);
* `testbed_decode_tps`: the decode rate, overriding the model name's profile.
"""

from __future__ import annotations

import functools

import attrs

from .. import workload as wl
from ..engine.latency import decode_rate_for_model
from ..protocol.errors import INVALID_VALUE, ProtocolError

WORKLOAD_KEY = "testbed_workload"
SEED_KEY = "testbed_seed"
TASK_KEY = "testbed_task"
DECODE_TPS_KEY = "testbed_decode_tps"
# [ours] The fastest decode rate a request may ask for: 10 million tokens/s, far above any engine, where a token's
# time (0.1 µs) is still well above the clock's resolution.
MAX_DECODE_TPS = 1e7


def _int_value(metadata: dict[str, str], key: str, default: int) -> int:
    raw = metadata.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ProtocolError(INVALID_VALUE, f"metadata.{key} must be a non-negative integer.", param=f"metadata.{key}")
    return value


def decode_rate_override(metadata: dict[str, str]) -> float | None:
    raw = metadata.get(DECODE_TPS_KEY)
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = -1.0
    if not 0 < rate < MAX_DECODE_TPS:
        raise ProtocolError(INVALID_VALUE, f"metadata.{DECODE_TPS_KEY} must be a positive number.", param=f"metadata.{DECODE_TPS_KEY}")
    return rate


def decode_rate(model: str, metadata: dict[str, str]) -> float:
    """The request's decode rate: metadata's override, else the rate its model name selects. A `sim-<N>` name
    whose N is not a usable rate is refused as the override is, with a 400, before any work."""
    override = decode_rate_override(metadata)
    if override is not None:
        return override
    rate = decode_rate_for_model(model)
    if not 0 < rate < MAX_DECODE_TPS:
        raise ProtocolError(INVALID_VALUE, f"Invalid 'model': {model[:64]!r} asks for {rate:g} tokens/s; "
                            f"a sim-<N> model needs 0 < N < {MAX_DECODE_TPS:.0f}.", param="model")
    return rate


@functools.lru_cache(maxsize=1024)
def _preset_task(preset: str, seed: int, task: int) -> wl.Workload:
    return wl.generate_one(preset, seed=seed, index=task)


_FIXED_FIELDS = ("initial_prompt_tokens", "appended_tokens", "output_tokens", "tool_seconds")
_FIXED_LIMITS = (1_000_000, 1_000_000, 100_000, 3600.0)


def _fixed_task(name: str) -> wl.Workload | None:
    """`fixed:<turns>[:<prompt>[:<appended>[:<output>[:<tool s>]]]]`, or None if malformed."""
    parts = name.split(":")[1:]
    if not 1 <= len(parts) <= 1 + len(_FIXED_FIELDS):
        return None
    try:
        turns = int(parts[0])
        values = {f: (float(p) if f == "tool_seconds" else int(p)) for f, p in zip(_FIXED_FIELDS, parts[1:])}
    except ValueError:
        return None
    if not 0 < turns <= 1000 or any(not 0 <= values[f] <= limit for f, limit in zip(_FIXED_FIELDS, _FIXED_LIMITS) if f in values):
        return None
    if values.get("output_tokens", 1) < 1:
        return None
    return wl.fixed(turns, **values)


@attrs.define(eq=False)
class WorkloadCatalog:
    default_workload: str = wl.DEFAULT_PRESET
    default_seed: int = 0
    registered: dict[str, wl.Workload] = attrs.Factory(dict)

    def register(self, workload: wl.Workload) -> str:
        key = f"trace:{len(self.registered)}:{workload.name}"
        self.registered[key] = workload
        return key

    def resolve(self, metadata: dict[str, str]) -> wl.Workload:
        name = metadata.get(WORKLOAD_KEY, self.default_workload)
        seed = _int_value(metadata, SEED_KEY, self.default_seed)
        task = _int_value(metadata, TASK_KEY, 0)
        if name in self.registered:
            return self.registered[name]
        if name in wl.PRESETS:
            return _preset_task(name, seed, task)
        if name.startswith("fixed:"):
            task = _fixed_task(name)
            if task is not None:
                return task
        raise ProtocolError(
            INVALID_VALUE,
            f"Unknown metadata.{WORKLOAD_KEY} {name[:64]!r}: use a preset {sorted(wl.PRESETS)}, 'fixed:<turns>' or a registered key.",
            param=f"metadata.{WORKLOAD_KEY}",
        )
