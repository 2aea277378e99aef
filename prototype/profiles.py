"""Workload presets and latency profiles as small JSON files: what `calibrate` writes and `compare` reads.

A preset file is one JSON object of `WorkloadParams` fields (prototype/workload.py), e.g.
`{"turns_median": 15, "initial_prompt_tokens": 30000, "tool_mixture": [[0.65, 0.15, 1.0], ...]}`; fields it leaves
out keep their defaults. A latency profile holds `LatencyModel` fields (prototype/engine/latency.py):
`decode_tokens_per_s`, `prefill_tokens_per_s`, `cache_attention` (null: no cache-attention term) and
`request_overhead` (seconds per engine call). Both may carry a free-text "source" saying where the values came from.
"""

from __future__ import annotations

import json
import math
from os import PathLike
from pathlib import Path
from typing import Any

import attrs

from . import workload as wl
from .engine.latency import LatencyModel

SOURCE_KEY = "source"


class ProfileError(ValueError):
    """A preset or latency file that cannot be used: names the file and the field."""


def _read(path: str | PathLike[str], kind: type) -> dict[str, Any]:
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ProfileError(f"{path}: expected a JSON object")
    obj.pop(SOURCE_KEY, None)
    known = {f.name for f in attrs.fields(kind)}
    unknown = sorted(obj.keys() - known)
    if unknown:
        raise ProfileError(f"{path}: {unknown[0]}: unknown field; known: {', '.join(sorted(known))}")
    return obj


def load_preset(path: str | PathLike[str]) -> wl.WorkloadParams:
    obj = _read(path, wl.WorkloadParams)
    try:
        return wl.WorkloadParams(**obj)
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{path}: {e}") from None


def load_latency(path: str | PathLike[str]) -> LatencyModel:
    obj = _read(path, LatencyModel)
    for name, value in obj.items():
        if value is None and name == "cache_attention":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"{path}: {name}: expected a finite number >= 0, got {value!r}")
        if value == 0 and name != "request_overhead":
            raise ProfileError(f"{path}: {name}: must be > 0")
    return LatencyModel(**obj)


def _write(path: str | PathLike[str], fields: dict[str, Any], source: str) -> Path:
    path = Path(path)
    path.write_text(json.dumps({SOURCE_KEY: source, **fields}, indent=1) + "\n", encoding="utf-8")
    return path


def save_preset(params: wl.WorkloadParams, path: str | PathLike[str], source: str) -> Path:
    return _write(path, attrs.asdict(params), source)


def save_latency(model: LatencyModel, path: str | PathLike[str], source: str) -> Path:
    return _write(path, attrs.asdict(model), source)
