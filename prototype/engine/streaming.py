"""Paced token streaming: the sampled text of a model call comes out on the trio clock at the
decode rate, optionally coalesced into fewer, larger chunks; and the fault plan that can make a
flush fail (tests and experiments).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence

import attrs
import trio


class EngineFailure(Exception):
    """The engine failed mid-response (a fault injected by an experiment or test, a real engine's error).
    The response fails with `server_error`, the one code of the API's schema for a failure of the server's
    own (designs/emitter.py), and `message`, which says what failed."""

    @property
    def message(self) -> str:
        return f"The engine failed mid-response: {self}" if str(self) else "The engine failed mid-response."


class ContextWindowExceeded(EngineFailure):
    """A model call whose prompt and planned output do not fit the model's context window (a real
    engine's `max_model_len`), or input joining a response under way that takes its context past the
    window, found once the response has started. The API refuses an input too long before a response
    starts (a 400 `context_length_exceeded`, prototype/api/checks.py); once one has started, its schema
    leaves `server_error` (openai-python `ResponseError.code`), with a message saying so."""

    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(f"its context of {tokens:,} tokens exceeds the context window of {window:,} tokens")
        self.tokens, self.window = tokens, window


@attrs.define(eq=False)
class FaultPlan:
    """Fault injection, for tests and experiments: the engine raises `EngineFailure` at a flush.

    `Engine.stream` calls `on_flush` before it yields each chunk of sampled text; after
    `flushes_before_failure` flushes (counted over every stream of the engine) the next `failures`
    flushes raise. With `failure_p` > 0 instead, each flush fails with that probability (seeded by
    `seed`), without limit: failures at a rate, for experiments. An engine without a plan (the
    default) pays one attribute check per flush.
    """

    flushes_before_failure: int = 0
    failures: int = 1
    failure_p: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)])
    seed: int = 0
    flushes: int = 0  # flushes seen so far
    raised: int = 0  # failures raised so far
    _rng: random.Random | None = attrs.field(default=None, init=False)

    def on_flush(self) -> None:
        self.flushes += 1
        if self.failure_p:
            if self._rng is None:
                self._rng = random.Random(f"faultplan:{self.seed}")
            if self._rng.random() < self.failure_p:
                self.raised += 1
                raise EngineFailure("injected engine failure")
            return
        if self.raised < self.failures and self.flushes > self.flushes_before_failure:
            self.raised += 1
            raise EngineFailure("injected engine failure")


async def paced_tokens(
    pieces: Sequence[str],
    rate: float,
    *,
    flush_interval: float = 0.0,
    flush_tokens: int | None = None,
    on_flush: Callable[[int], None],
    start: float | None = None,
) -> AsyncIterator[str]:
    """Yield the text of `pieces` (one token each) as it is sampled at `rate` tokens a second;
    `on_flush(n)` runs before each chunk of `n` tokens goes out (and may raise to fail it).

    Token i is ready at start + (i+1)/rate. With `flush_interval` > 0 the first token goes out
    at once and later tokens are coalesced: each chunk carries every token ready at its flush,
    flushes at least `flush_interval` apart, and the last chunk goes out when the last token
    is ready, so coalescing never delays the end of an item. With `flush_tokens` a chunk carries
    at most that many tokens: it goes out as soon as that many are ready, interval or not.

    `start` (default: now) is when the engine began sampling these pieces on its own schedule,
    e.g. the end of the previous item: every deadline is absolute from it, so in real time a late
    wake-up (timer rounding, a busy CPU) never shifts the tokens after it, and tokens whose time
    has passed go out together in the next chunk.
    """
    start = trio.current_time() if start is None else start
    total = len(pieces)
    end = start + total / rate  # the last token is never held back: coalescing costs no time
    sent = 0
    last_flush = -float("inf")
    while sent < total:
        due = start + (sent + 1) / rate
        if sent and flush_interval > 0:
            due = min(max(due, last_flush + flush_interval), end)
            if flush_tokens:
                due = min(due, start + (sent + flush_tokens) / rate)
        await trio.sleep_until(due)
        now = trio.current_time()
        last_flush = now
        # 1e-6 absorbs float error at exact token boundaries under a virtual clock.
        ready = min(total, max(sent + 1, int((now - start) * rate + 1e-6)))
        if flush_tokens:
            ready = min(ready, sent + flush_tokens)
        on_flush(ready - sent)
        yield "".join(pieces[sent:ready])
        sent = ready
