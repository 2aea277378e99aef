"""The scripted policy: what the simulated model samples each turn, decided from a seed.

A turn is one model call that ends in client function calls or in the final answer (docs/parameters.md).
The policy reads the turn's spec from the workload and fills in content deterministically from
`(seed, turn)`, so every design, given the same workload and seed, samples the same items:

* text of exactly `output_tokens` tokens (one-token words from the real tokenizer);
* one hosted web_search per spec'd hosted call, if the request offers a web_search tool;
* one call per spec'd tool call to one of the request's own function tools, with arguments valid
  for that tool's JSON schema; with no function tools offered, the turn is the final answer.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import numpy as np

from ..protocol.events import ToolDef
from ..workload import Workload
from . import tokenizer


@attrs.frozen
class PlannedCall:
    name: str
    arguments: str


@attrs.frozen
class PlannedSearch:
    query: str
    seconds: float
    result_tokens: int


@attrs.frozen
class TurnPlan:
    words: tuple[str, ...]  # the text, one token per word
    searches: tuple[PlannedSearch, ...]
    calls: tuple[PlannedCall, ...]

    @property
    def is_final(self) -> bool:
        return not self.calls


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([k & 0xFFFFFFFF for k in key])


def arguments_for_schema(schema: dict[str, Any] | None, rng: np.random.Generator) -> Any:
    """A value valid for a (simple) JSON schema: objects fill their required properties."""
    if not isinstance(schema, dict):
        return {}
    if "enum" in schema and schema["enum"]:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return arguments_for_schema(schema[key][0], rng)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        # Required properties only, as a model mostly does: optional ones (timeouts, flags) keep
        # their defaults on the client side, and real clients' tools then get sane calls.
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        return {name: arguments_for_schema(sub, rng) for name, sub in properties.items() if name in required}
    if kind == "array":
        return [arguments_for_schema(schema.get("items"), rng)]
    if kind == "string":
        return tokenizer.text_of(rng, 2).strip()
    if kind == "integer":
        low = int(schema.get("minimum", 0))
        return low + int(rng.integers(0, 10))
    if kind == "number":
        # Whole values: clients often parse "number" fields into integers (Codex reads yield_time_ms
        # as usize and rejects 0.522).
        return float(schema.get("minimum", 0)) + float(rng.integers(0, 10))
    if kind == "boolean":
        return bool(rng.integers(0, 2))
    return None


@attrs.frozen
class ScriptedPolicy:
    workload: Workload

    def plan(self, turn: int, tools: tuple[ToolDef, ...], offers_web_search: bool) -> TurnPlan:
        """The turn-th model call of a task (0-based), given what the request offers."""
        turns = self.workload.turns
        spec = turns[min(turn, len(turns) - 1)]
        seed = self.workload.seed
        function_tools = [tool for tool in tools if tool.type == "function"]
        final = turn >= len(turns) - 1 or not function_tools
        text = tuple(tokenizer.words(_rng(seed, turn, 1), spec.output_tokens))
        searches = ()
        if offers_web_search and not final:
            searches = tuple(
                PlannedSearch(tokenizer.text_of(_rng(seed, turn, 2, i), 4).strip(), h.seconds, h.result_tokens)
                for i, h in enumerate(spec.hosted_calls)
            )
        calls = ()
        if not final:
            calls_rng = _rng(seed, turn, 3)
            chosen = calls_rng.integers(0, len(function_tools), size=len(spec.tool_seconds))
            calls = tuple(
                PlannedCall(
                    function_tools[int(i)].name,
                    json.dumps(arguments_for_schema(function_tools[int(i)].parameters, _rng(seed, turn, 4, j))),
                )
                for j, i in enumerate(chosen)
            )
        return TurnPlan(text, searches, calls)
