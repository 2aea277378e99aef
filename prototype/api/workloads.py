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
import math

import attrs

from .. import workload as wl
from ..engine.latency import decode_rate_for_model
from ..protocol.errors import (
    DECIMAL_ABOVE_MAX_VALUE,
    DECIMAL_BELOW_MIN_VALUE,
    INTEGER_ABOVE_MAX_VALUE,
    INTEGER_BELOW_MIN_VALUE,
    INVALID_VALUE,
    ProtocolError,
)

WORKLOAD_KEY = "testbed_workload"
SEED_KEY = "testbed_seed"
TASK_KEY = "testbed_task"
DECODE_TPS_KEY = "testbed_decode_tps"
# [ours] The fastest decode rate a request may ask for: 10 million tokens/s, far above any engine, where a token's
# time (0.1 µs) is still well above the clock's resolution.
MAX_DECODE_TPS = 1e7


class WorkloadNameError(ValueError):
    """A workload name that names no workload (`invalid_value`), or a fixed task with a number out of its
    range (the API's range codes: `integer_above_max_value`, ...). The message names no field, so a request
    (`metadata.testbed_workload`) and the command line (`serve --workload`) each say where the name came from."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _metadata_error(key: str, code: str, message: str) -> ProtocolError:
    return ProtocolError(code, f"Invalid 'metadata.{key}': {message}", param=f"metadata.{key}")


def _int_value(metadata: dict[str, str], key: str, default: int) -> int:
    raw = metadata.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _metadata_error(key, INVALID_VALUE, f"{raw[:64]!r} is not an integer.") from None
    if value < 0:
        raise _metadata_error(key, INTEGER_BELOW_MIN_VALUE, f"{value} is out of range: expected an integer >= 0.")
    return value


def decode_rate_override(metadata: dict[str, str]) -> float | None:
    raw = metadata.get(DECODE_TPS_KEY)
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = math.nan
    if math.isnan(rate):
        raise _metadata_error(DECODE_TPS_KEY, INVALID_VALUE, f"{raw[:64]!r} is not a number.")
    if rate <= 0:
        raise _metadata_error(DECODE_TPS_KEY, DECIMAL_BELOW_MIN_VALUE,
                              f"{rate:g} tokens/s is out of range: expected more than 0 and less than {MAX_DECODE_TPS:.0f}.")
    if rate >= MAX_DECODE_TPS:
        raise _metadata_error(DECODE_TPS_KEY, DECIMAL_ABOVE_MAX_VALUE,
                              f"{rate:g} tokens/s is out of range: expected more than 0 and less than {MAX_DECODE_TPS:.0f}.")
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


# A fixed task's numbers after `fixed:`, in order: name, type and range (inclusive) of each.
_FIXED_FIELDS: tuple[tuple[str, type, float, float], ...] = (
    ("turns", int, 1, 1000),
    ("initial_prompt_tokens", int, 0, 1_000_000),
    ("appended_tokens", int, 0, 1_000_000),
    ("output_tokens", int, 1, 100_000),
    ("tool_seconds", float, 0.0, 3600.0),
)
FIXED_FORM = "fixed:<turns>[:<prompt tokens>[:<appended tokens>[:<output tokens>[:<tool seconds>]]]]"


def _fixed_task(name: str) -> wl.Workload:
    """`fixed:<turns>[:<prompt>[:<appended>[:<output>[:<tool s>]]]]`; raises WorkloadNameError."""
    parts = name.split(":")[1:]
    if not 1 <= len(parts) <= len(_FIXED_FIELDS):
        raise WorkloadNameError(INVALID_VALUE, f"{name[:64]!r} is not a fixed task: {FIXED_FORM} takes 1 to 5 numbers.")
    values = {}
    for part, (field, kind, low, high) in zip(parts, _FIXED_FIELDS):
        try:
            value = kind(part)
        except ValueError:
            value = math.nan
        if isinstance(value, float) and not math.isfinite(value):
            raise WorkloadNameError(INVALID_VALUE, f"{name[:64]!r} is not a fixed task: its {field} {part[:16]!r} is not "
                                    f"{'an integer' if kind is int else 'a number'}.")
        if not low <= value <= high:
            codes = (INTEGER_BELOW_MIN_VALUE, INTEGER_ABOVE_MAX_VALUE) if kind is int else (DECIMAL_BELOW_MIN_VALUE, DECIMAL_ABOVE_MAX_VALUE)
            shown = str if kind is int else "{:g}".format
            raise WorkloadNameError(codes[value > high], f"{field} {shown(value)} is out of range: a fixed task's {field} "
                                    f"is {shown(low)} to {shown(high)} (in {name[:64]!r}).")
        values[field] = value
    return wl.fixed(values.pop("turns"), **values)


@attrs.define(eq=False)
class WorkloadCatalog:
    default_workload: str = wl.DEFAULT_PRESET
    default_seed: int = 0
    registered: dict[str, wl.Workload] = attrs.Factory(dict)

    def register(self, workload: wl.Workload) -> str:
        key = f"trace:{len(self.registered)}:{workload.name}"
        self.registered[key] = workload
        return key

    def named(self, name: str, seed: int | None = None, task: int = 0) -> wl.Workload:
        """The workload `name` names (a registered key, a preset's task, a fixed task); raises WorkloadNameError."""
        if name in self.registered:
            return self.registered[name]
        if name in wl.PRESETS:
            return _preset_task(name, self.default_seed if seed is None else seed, task)
        if name.startswith("fixed:"):
            return _fixed_task(name)
        raise WorkloadNameError(INVALID_VALUE, f"{name[:64]!r} names no workload: use a preset ({', '.join(sorted(wl.PRESETS))}), "
                                f"{FIXED_FORM} or a registered trace key.")

    def resolve(self, metadata: dict[str, str]) -> wl.Workload:
        name = metadata.get(WORKLOAD_KEY, self.default_workload)
        seed = _int_value(metadata, SEED_KEY, self.default_seed)
        task = _int_value(metadata, TASK_KEY, 0)
        try:
            return self.named(name, seed, task)
        except WorkloadNameError as error:
            raise _metadata_error(WORKLOAD_KEY, error.code, str(error)) from None
