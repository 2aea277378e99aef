"""Validation and safety classification: the per-request checks, in a full and an incremental form.

Both do real work proportional to what they look at: the full form walks the whole conversation,
the incremental form only the new items, against state kept from earlier turns. That difference is
what the chained cache's switch (1) turns on and off.

The context window check is here too: an input longer than its model's window is refused before any
modeled cost is paid, with the API's `context_length_exceeded`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

import attrs
import numpy as np

from ..engine import tokenizer
from ..engine.streaming import ContextWindowExceeded
from ..protocol.errors import INVALID_FUNCTION_CALL_OUTPUT, ProtocolError, context_length_exceeded
from ..protocol.items import Compaction, FunctionCall, FunctionCallOutput, Item, Message
from . import render

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

    def refolded(self, window: Sequence[Item]) -> CallLedger:
        """The ledger a fold over the whole conversation gives, computed again: the calls before `window` as this
        ledger holds them (a compaction dropped their items, protocol/compaction.py), then `window`'s items."""
        in_window = {item.call_id for item in window if isinstance(item, FunctionCall | FunctionCallOutput)}
        dropped = {call_id: name for call_id, name in self.calls.items() if call_id not in in_window}
        ledger = CallLedger(dropped, {call_id for call_id in self.answered if call_id in dropped})
        ledger.absorb(window)
        return ledger

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


# --- the context window ----------------------------------------------------------------------------

# The context windows of the model names the testbed serves, matched as the decode rate is (engine/latency.py):
# a name with "spark" in it is GPT-5.3-Codex-Spark, "128k context window" at launch (OpenAI, "Introducing
# GPT-5.3-Codex-Spark", openai.com/index/introducing-gpt-5-3-codex-spark), taken as 128,000 tokens; every
# other name, `sim-<N>` included, gets the flagship's, gpt-5.4's 1,050,000-token window (OpenAI's model page,
# as quoted by Vercel's AI Gateway and OpenRouter: 1,050,000 context, 128,000 max output tokens).
SPARK_CONTEXT_WINDOW = 128_000
FLAGSHIP_CONTEXT_WINDOW = 1_050_000
_WINDOW_RULES: tuple[tuple[re.Pattern[str], int], ...] = ((re.compile(r"spark"), SPARK_CONTEXT_WINDOW),)
# The longest token of the tokenizer (cl100k_base) is 128 bytes: a text of B UTF-8 bytes is at least B/128
# tokens, and a string of C characters has at least C bytes. tests/test_limits.py checks the figure.
MAX_TOKEN_BYTES = 128
# Runs of one repeated byte are read in blocks of this many bytes, so the arrays stay small [ours].
RUN_BLOCK_BYTES = 1 << 20


def context_window(model: str) -> int:
    """The context window, in tokens, of the model a name selects."""
    name = model.lower()
    for pattern, window in _WINDOW_RULES:
        if pattern.search(name):
            return window
    return FLAGSHIP_CONTEXT_WINDOW


@functools.cache
def _longest_runs() -> np.ndarray:
    """For each byte value, the longest run of it inside one token of the vocabulary (`x`: 8, a space: 128).
    Read from the tokens joined by a zero byte: a run of zeros may then span two tokens, which can only make
    the figure for the zero byte larger, and a larger figure keeps `_run_floor` a lower bound."""
    encoding = tokenizer.encoding()
    pieces = []
    for token in range(encoding.n_vocab):
        try:
            pieces.append(encoding.decode_single_token_bytes(token))
        except KeyError:
            continue
    _, lengths, values = _runs(np.frombuffer(b"\0".join(pieces), dtype=np.uint8))
    longest = np.ones(256, dtype=np.int64)
    np.maximum.at(longest, values, lengths)
    longest.setflags(write=False)
    return longest


def _runs(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The maximal runs of one repeated byte in `data`: their starts, lengths and byte values."""
    starts = np.concatenate(([0], np.flatnonzero(data[1:] != data[:-1]) + 1))
    return starts, np.diff(np.append(starts, data.size)), data[starts]


def _run_floor(data: bytes) -> int:
    """A lower bound on the tokens of `data` from its runs of one repeated byte: a token covers at most R(b)
    bytes of a run of byte b (R: `_longest_runs`), so a run of n needs ceil(n / R(b)) tokens; runs that
    share a token are counted once by taking one off per run after the first (a token covers at most one
    gap between runs, as tokens do not overlap). Any set of disjoint runs gives a bound, so a run cut by a
    block boundary counts as two."""
    longest = _longest_runs()
    extra, runs = 0, 0
    for begin in range(0, len(data), RUN_BLOCK_BYTES):
        block = np.frombuffer(data, dtype=np.uint8, count=min(RUN_BLOCK_BYTES, len(data) - begin), offset=begin)
        _, lengths, values = _runs(block)
        needed = -(-lengths // longest[values])  # ceil(n / R(b)) for every run
        long = needed > 1  # only the runs a single token cannot cover
        extra += int((needed[long] - 1).sum())
        runs += int(long.any())
    return 1 + extra if runs else 0


def fewest_tokens(texts: Sequence[str], limit: int) -> int:
    """A lower bound on the rendered tokens of items with these texts, without tokenizing: each item's
    separator, at least one token per MAX_TOKEN_BYTES bytes of its text (len() counts characters, never
    more than its UTF-8 bytes: O(1)), and, for a text that could pass `limit` on its own (more than
    `limit` bytes: no text has more tokens than bytes), the bound of its runs of a repeated byte."""
    total = 0
    for text in texts:
        floor = math.ceil(len(text) / MAX_TOKEN_BYTES)
        if 4 * len(text) > limit:  # a character is at most 4 UTF-8 bytes
            floor = max(floor, _run_floor(text.encode("utf-8", "surrogatepass")))
        total += 1 + floor
    return total


def require_fits(input_tokens: int, window: int, *, within_response: bool = False) -> None:
    """Refuse an input of `input_tokens` (exact, or a lower bound) longer than `window`: a request's
    own input with the API's 400; input that joins a response already streaming (injected tool outputs, a
    hosted tool's result) fails that response (ContextWindowExceeded: `server_error`, the API's schema has
    no code of its own for it inside a Response)."""
    if input_tokens <= window:
        return
    if within_response:
        raise ContextWindowExceeded(input_tokens, window)
    raise context_length_exceeded()


def require_appended_fits(prompt_tokens: int, items: Sequence[Item], window: int) -> None:
    """Refuse, with the API's 400 `context_length_exceeded` (param `input`), items that would take a prompt of
    `prompt_tokens` past `window` once appended to it (a v1 `response.append`), before they are taken:
    the API refuses an input too long before any response starts, and its schema has no code for it inside a
    failed Response (openai-python `ResponseError.code`). Exact: the items as rendered. Items that fit by a
    wide margin are not tokenized: an item renders to its separator and at most one token per UTF-8 byte of
    its text, at most 4 bytes a character."""
    room = window - prompt_tokens
    texts = [render.item_text(item) for item in items]
    if sum(1 + 4 * len(text) for text in texts) <= room:
        return
    if fewest_tokens(texts, room) > room or len(render.render_items(items)) > room:
        raise context_length_exceeded()
