"""Validation and safety classification: the per-request checks, in a full and an incremental form.

Both do real work proportional to what they look at: the full form walks the whole conversation,
the incremental form only the new items, against state kept from earlier turns. That difference is
what the chained cache's switch (1) turns on and off.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from ..protocol.errors import INVALID_FUNCTION_CALL_OUTPUT, ProtocolError
from ..protocol.items import Compaction, FunctionCall, FunctionCallOutput, Item, Message

# Hashed bag-of-tokens features for the stand-in safety classifier: large enough that the numpy
# work scales with tokens, small enough to keep per connection.
SAFETY_FEATURES = 4096
_WEIGHTS = np.random.default_rng(20260422).normal(0.0, 1e-4, SAFETY_FEATURES)
_WEIGHTS.setflags(write=False)  # shared by every run in the process: read-only


@attrs.define(eq=False)
class CallLedger:
    """Which function calls the conversation has made and answered, and the policy's turn index:
    client tool rounds since the last user message. A fold over items, so incremental equals full."""

    calls: dict[str, str] = attrs.Factory(dict)
    answered: set[str] = attrs.Factory(set)
    turn: int = 0
    last_was_output: bool = False
    offset: int = 0  # items before the latest compaction's window, which call ids still count (protocol/compaction.py)

    def absorb(self, items: Sequence[Item], start: int = 0) -> None:
        """Check and take `items`; raise `invalid_function_call_output` for an output whose call is
        unknown or already answered. `start` is the first item's index in the conversation."""
        for offset, item in enumerate(items):
            if isinstance(item, FunctionCall):
                self.calls[item.call_id] = item.name
                self.last_was_output = False
            elif isinstance(item, FunctionCallOutput):
                if item.call_id in self.answered:
                    raise ProtocolError(
                        INVALID_FUNCTION_CALL_OUTPUT,
                        f"function_call_output for call_id '{item.call_id}' answered twice.",
                        param=f"input[{start + offset}]",
                    )
                if item.call_id not in self.calls:
                    # The public API's message and param for an output whose call it cannot find (seen in
                    # 400 bodies quoted in microsoft/vscode#320060 and continuedev/continue#10092; it sends `code: null`).
                    raise ProtocolError(
                        INVALID_FUNCTION_CALL_OUTPUT,
                        f"No tool call found for function call output with call_id {item.call_id}.",
                        param="input",
                    )
                self.answered.add(item.call_id)
                if not self.last_was_output:
                    self.turn += 1
                self.last_was_output = True
            elif isinstance(item, Compaction):  # the rounds it summarizes still count (protocol/compaction.py)
                self.turn, self.offset = item.rounds, item.offset
                self.last_was_output = False
            else:
                if isinstance(item, Message) and item.role == "user":
                    self.turn = 0
                self.last_was_output = False

    @property
    def unanswered(self) -> list[str]:
        return [call_id for call_id in self.calls if call_id not in self.answered]


def require_answered(ledger: CallLedger) -> None:
    """A model call cannot start while a function call has no output (the public API refuses it)."""
    missing = ledger.unanswered
    if missing:
        raise ProtocolError(
            INVALID_FUNCTION_CALL_OUTPUT, f"No tool output found for function call {missing[0]}.", param="input"
        )


@attrs.define(eq=False)
class SafetyState:
    """Running feature counts of everything classified so far."""

    # int32: 16 KB a session instead of 32 (a conversation would need 2^31 tokens to overflow it).
    counts: np.ndarray = attrs.Factory(lambda: np.zeros(SAFETY_FEATURES, dtype=np.int32))

    def absorb(self, ids: Sequence[int]) -> float:
        """Classify `ids` (added to what was seen before) and return the conversation's score."""
        if len(ids):
            self.counts += np.bincount(np.asarray(ids, dtype=np.int64) % SAFETY_FEATURES, minlength=SAFETY_FEATURES)
        return float(self.counts @ _WEIGHTS)
