"""Forced decoding on vLLM: a request samples exactly the token ids the testbed planned for it.

The scripted policy writes the conversation. With random weights vLLM would sample other ids, and
the next prompt, which renders the policy's output, would carry tokens the engine never computed:
its prefix cache could not find a previous output, and a held (v1) request would hold ids the
transcript does not have. This logits processor closes that gap: for a request whose
`SamplingParams.extra_args` carry a plan under `FORCED_IDS`, every logit of its row except the
planned id's is set to -inf before sampling, so any sampler (greedy or random) picks the planned id.
Requests without a plan sample as vLLM would.

vLLM's v1 logits-processor interface (vllm/v1/sample/logits_processor/interface.py, vLLM 0.32):
one processor object per engine (engine argument `logits_processors`, given here by its qualified
name `vllm_forced:ForcedDecoding`: the worker runs with this folder on its path), told of the
persistent batch's changes in `update_state` (rows removed, rows added with a reference to the
request's live list of output ids, rows moved, in that order), and rewriting the batch's logits in
`apply` before each sampling step. A request's position in its plan is the length of that list.
A streaming-input (resumable, v1) request's next chunk re-enters the batch as an added row, with
that chunk's sampling params and its output list emptied (GPUModelRunner._update_streaming_request),
so each chunk carries a plan of its own.

Only the standard library is imported here at import time: `ForcedPlans`, the bookkeeping, runs and
is tested without vLLM (tests/test_vllm_engine.py); `ForcedDecoding`, the vLLM class, is built on
first access, in vLLM's interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FORCED_IDS = "testbed_forced_ids"
"""The key of a request's plan (a list of token ids) in its `SamplingParams.extra_args`."""
PROCESSOR = "vllm_forced:ForcedDecoding"
"""The processor's qualified name, as vLLM's `logits_processors` engine argument loads it."""


def plan_of(params: Any) -> Sequence[int] | None:
    """The plan a request's sampling params carry, or None."""
    extra = getattr(params, "extra_args", None)
    return extra.get(FORCED_IDS) if extra else None


def check_plan(params: Any) -> None:
    """Raises ValueError unless the params carry no plan or a list of non-negative int ids."""
    plan = plan_of(params)
    if plan is None:
        return
    if not isinstance(plan, list) or not all(type(token) is int and token >= 0 for token in plan):
        raise ValueError(f"extra_args[{FORCED_IDS!r}] must be a list of non-negative token ids")


class ForcedPlans:
    """Which rows of vLLM's persistent batch follow a plan: per row its plan and the request's live
    list of output ids (vLLM extends that list as the request samples)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Sequence[int], Sequence[int]]] = {}

    def update(self, batch_update: Any) -> None:
        """Apply one `BatchUpdate` (None: the batch did not change), in the interface's order."""
        if batch_update is None:
            return
        rows = self.rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            plan = plan_of(params)
            if plan:
                rows[index] = (plan, output_ids)
            else:  # a request without a plan took the row
                rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            from_a, from_b = rows.pop(a, None), rows.pop(b, None)
            if from_a is not None:
                rows[b] = from_a
            if from_b is not None and direction.name == "SWAP":  # a one-way move drops what b held
                rows[a] = from_b

    def next_ids(self) -> tuple[list[int], list[int]]:
        """The rows whose plan goes on, and the id each must sample next. A row past its plan's end
        (a request asked for more tokens than planned) samples freely."""
        rows, ids = [], []
        for index, (plan, output_ids) in self.rows.items():
            position = len(output_ids)
            if position < len(plan):
                rows.append(index)
                ids.append(plan[position])
        return rows, ids


def _processor_class() -> type:
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class ForcedDecoding(LogitsProcessor):
        """Each planned row's logits: -inf everywhere but at the planned id (0 there)."""

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            check_plan(sampling_params)

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.plans = ForcedPlans()

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the argmax

        def update_state(self, batch_update: Any) -> None:
            self.plans.update(batch_update)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            rows, ids = self.plans.next_ids()
            if rows:
                row_index = torch.tensor(rows, dtype=torch.long, device=logits.device)
                id_index = torch.tensor(ids, dtype=torch.long, device=logits.device)
                logits[row_index] = float("-inf")
                logits[row_index, id_index] = 0.0
            return logits

    ForcedDecoding.__module__ = __name__
    ForcedDecoding.__qualname__ = "ForcedDecoding"
    return ForcedDecoding


def __getattr__(name: str) -> Any:
    """`ForcedDecoding`, built on first access (it needs torch and vLLM)."""
    if name == "ForcedDecoding":
        cls = globals()["ForcedDecoding"] = _processor_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
