"""The scripted policy: what the simulated model samples each turn, decided from a seed.

A turn is one model call that ends in client function calls or in the final answer (docs/parameters.md).
The policy reads the turn's spec from the workload and fills in content deterministically from
`(content seed, turn)` (the task's own seed: no two generated tasks share content), so every design,
given the same workload, samples the same items:

* reasoning of exactly `reasoning_tokens` tokens, sampled first and never shown as text;
* text of exactly `output_tokens - reasoning_tokens` tokens (one-token words from the real tokenizer);
* one hosted web_search per spec'd hosted call, if the request offers a web_search tool;
* one call per spec'd tool call to one of the request's own function tools: a well-known agent
  tool (a shell) gets the calls an agent exploring a repository makes, any other tool arguments
  valid for its JSON schema (tool_calls.py); with no function tools offered, the turn is the final
  answer.
"""

from __future__ import annotations

import json

import attrs
import numpy as np

from ..protocol.events import ToolDef
from ..workload import Workload
from . import tokenizer, tool_calls


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
    reasoning: tuple[str, ...] = ()  # the hidden reasoning, one token per word

    @property
    def is_final(self) -> bool:
        return not self.calls


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([k & 0xFFFFFFFF for k in key])


@attrs.frozen
class ScriptedPolicy:
    workload: Workload

    def plan(self, turn: int, tools: tuple[ToolDef, ...], offers_web_search: bool) -> TurnPlan:
        """The turn-th model call of a task (0-based), given what the request offers."""
        turns = self.workload.turns
        spec = turns[min(turn, len(turns) - 1)]
        seed = self.workload.text_seed
        function_tools = [tool for tool in tools if tool.type == "function"]
        final = turn >= len(turns) - 1 or not function_tools
        reasoning = tuple(tokenizer.words(_rng(seed, turn, 5), spec.reasoning_tokens))
        text = tuple(tokenizer.words(_rng(seed, turn, 1), spec.text_tokens))
        searches = ()
        if offers_web_search:  # a final answer may search first too (a replayed trace's last round can)
            searches = tuple(
                PlannedSearch(tokenizer.text_of(_rng(seed, turn, 2, i), 4).strip(), h.seconds, h.result_tokens)
                for i, h in enumerate(spec.hosted_calls)
            )
        calls = ()
        if not final:
            calls_rng = _rng(seed, turn, 3)
            candidates = tool_calls.tools_an_agent_would_call(function_tools)
            chosen = calls_rng.integers(0, len(candidates), size=len(spec.tool_seconds))
            calls = tuple(
                PlannedCall(
                    candidates[int(i)].name,
                    json.dumps(tool_calls.arguments_for(candidates[int(i)], turn + j, _rng(seed, turn, 4, j))),
                )
                for j, i in enumerate(chosen)
            )
        return TurnPlan(text, searches, calls, reasoning)
