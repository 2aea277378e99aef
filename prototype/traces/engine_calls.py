"""A real engine's calls (`experiments.real_engine`'s `real_engine_calls.csv`): what `calibrate` fits the simulated
engine's latency model to when the timings come from an engine the testbed ran, not from an agent's trace.

One CSV row per model call, in the order the calls were made; the columns read (the file has more):

    design         the design that made the call (http, chained, suspended)
    prompt_tokens  the whole prompt of the call
    prefill_vllm   the prompt tokens the engine computed for it (vLLM's own counters: a prefix-cache hit or the KV a
                   held request keeps is not computed again)
    output_tokens  tokens sampled
    ttft_ms        from the request to its first token, milliseconds
    decode_ms      from its first token to its last, milliseconds
    sampled_tokens (optional) tokens the engine sampled, where it sampled more than the call's text (vLLM with
                   forced decoding samples each output item's framing too): read as the call's output tokens, the
                   ones its decode time covers

Unlike an agent's trace it holds no tasks (no tool times, no user requests): `calibrate` fits and scores the latency
model on it and nothing else. A bad file raises `TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
from os import PathLike

import attrs

from .base import TraceError, open_utf8

FORMAT = "real-engine calls"
COLUMNS = ("design", "prompt_tokens", "prefill_vllm", "output_tokens", "ttft_ms", "decode_ms")
_INTEGERS = ("prompt_tokens", "prefill_vllm", "output_tokens")
SAMPLED = "sampled_tokens"
_MILLISECONDS = ("ttft_ms", "decode_ms")


@attrs.frozen
class EngineCall:
    """One call on the real engine: its design, prompt, the prefill the engine computed, output and timings."""

    design: str
    prompt_tokens: int
    prefill_tokens: int
    output_tokens: int
    ttft_s: float
    decode_s: float


def looks_like(path: str | PathLike[str]) -> bool:
    """A CSV whose header has every column this reader needs (and no JSON: traces are JSONL)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return set(COLUMNS) <= {h.strip() for h in header}


def _number(row: dict[str, str], column: str, path: str | PathLike[str], line: int, kind: type) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = kind(text) if kind is int else float(text)
    except ValueError:
        raise TraceError(path, line, column, f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(path, line, column, f"must be a finite number >= 0, got {text!r}")
    return value


def read(path: str | PathLike[str]) -> list[EngineCall]:
    """The calls of a `real_engine_calls.csv`, in file order (the order they were made)."""
    calls = []
    with open_utf8(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(path, 1, missing[0], f"missing column(s) {', '.join(missing)}: expected {', '.join(COLUMNS)}")
        for row in reader:
            line = reader.line_num  # the record's last physical line: a quoted field may hold a line break
            prompt, prefill, output = (int(_number(row, c, path, line, int)) for c in _INTEGERS)
            if SAMPLED in row:
                output = int(_number(row, SAMPLED, path, line, int))
            ttft_ms, decode_ms = (_number(row, c, path, line, float) for c in _MILLISECONDS)
            if prefill > prompt:
                raise TraceError(path, line, "prefill_vllm", f"{prefill} prefilled of a {prompt}-token prompt")
            if output < 1:
                raise TraceError(path, line, "output_tokens", "a call samples at least one token")
            calls.append(EngineCall(row["design"].strip(), prompt, prefill, output, ttft_ms / 1000, decode_ms / 1000))
    if not calls:
        raise TraceError(path, 1, None, "the file holds no calls")
    return calls
