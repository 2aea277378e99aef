"""Admission and batching: a model call waits until the engine has a batch slot and GPU room for
its whole prompt (vLLM admits a request when its prompt's blocks are free).

Calls that cannot be admitted wait in one queue, ordered by session age, then arrival (program-level
first-come-first-serve, as Continuum schedules agent programs, arXiv 2511.02230). The head of the
queue blocks the calls behind it, as vLLM's FCFS scheduler does. To make room for the head, idle
prefix-cache entries are evicted (least recently used first), then the held idle KV of younger
sessions is preempted (youngest first).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Hashable, KeysView

import attrs
import trio

from . import memory
from .kv import GPU, HOST, SWAPPING_OUT, KVEntry, KVResidency, Prompt
from .stats import sample

# Sessions whose bookkeeping (age rank, tokens computed) the engine remembers after their KV is
# gone [ours]: a returning session's recompute is still counted, and a long-running server's
# memory stays bounded (http conversations never get `release`). A few hundred bytes each.
MAX_REMEMBERED_SESSIONS = 100_000


class ContextExceedsBudget(Exception):
    """A model call's prompt alone needs more KV than the engine's whole budget."""


@attrs.define(eq=False)
class EngineCall:
    """One model call's place on the engine, from admission to `Engine.end_call`."""

    key: Hashable
    prompt: Prompt
    pinned: bool
    rank: int  # session age: lower is older
    seq: int
    queued_at: float
    admitted_at: float | None = None
    swap_in_tokens: int = 0
    recomputed: int = 0
    ended: bool = False
    withdrawn: bool = False
    armed_for: float = math.inf  # while waiting: when it wakes by itself
    _wake: trio.Event = attrs.Factory(trio.Event)  # set on admission, or when a new timer comes first

    @property
    def queued_s(self) -> float:
        return 0.0 if self.admitted_at is None else self.admitted_at - self.queued_at


def _now_or(default: float) -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a unit test of the bookkeeping)
        return default


@attrs.define(eq=False)
class Admission(KVResidency):
    """The admission queue and the batch, over the KV residency they make room in."""

    kv_budget_tokens: int | None = None
    """KV tokens the GPU holds for all sessions; None: unlimited (memory.H100_8B_KV_BUDGET_TOKENS
    is one H100 serving Llama-3.1-8B)."""
    max_batch: int | None = None
    """Model calls in flight at once; None: unlimited (memory.VLLM_MAX_NUM_SEQS is vLLM's default)."""
    max_sessions: int = MAX_REMEMBERED_SESSIONS
    """Sessions remembered at most; the least recently seen one without KV is forgotten first."""

    active_calls: int = attrs.field(default=0, init=False)
    _ranks: dict[Hashable, int] = attrs.field(factory=dict, init=False)  # in order of last call, oldest first
    _rank_counter: itertools.count = attrs.field(factory=itertools.count, init=False)
    _waiting: list[tuple[int, int, EngineCall]] = attrs.field(factory=list, init=False)

    @property
    def waiting_calls(self) -> int:
        return sum(1 for *_, call in self._waiting if not call.withdrawn)

    @property
    def queued_calls(self) -> tuple[EngineCall, ...]:
        """The calls waiting for admission, in the order they will be admitted (withdrawn ones left out)."""
        return tuple(call for *_, call in sorted(self._waiting) if not call.withdrawn)

    @property
    def remembered_sessions(self) -> KeysView[Hashable]:
        """The sessions the engine remembers (at most `max_sessions`), least recently seen first."""
        return self._ranks.keys()

    # --- the life of a model call -----------------------------------------------------------

    async def begin_call(self, key: Hashable, prompt: Prompt, *, pinned: bool = False) -> EngineCall:
        """Wait until the engine admits a model call of session `key` on `prompt`: a batch slot
        and GPU room for the whole prompt; bring the session's KV back from the host if it was
        swapped out. Returns at once, without a checkpoint, when nothing limits the engine.

        Raises ContextExceedsBudget if the prompt alone is larger than the KV budget.
        """
        now = trio.current_time()
        budget = self.kv_budget_tokens
        if budget is not None and len(prompt) > budget:
            raise ContextExceedsBudget(f"a {len(prompt)}-token prompt does not fit a {budget}-token KV budget")
        self._advance(now)
        rank = self._ranks.pop(key, None)
        if rank is None:
            rank = next(self._rank_counter)
            if len(self._ranks) >= self.max_sessions:
                self._forget_idle_sessions(len(self._ranks) + 1 - self.max_sessions)
        self._ranks[key] = rank  # now the most recently seen
        call = EngineCall(key, prompt, pinned, rank, next(self._seq), now)
        heapq.heappush(self._waiting, (call.rank, call.seq, call))
        self._schedule(now)
        try:
            while call.admitted_at is None:
                # Only the head of the queue can be admitted by a timer (an expiry, a finished
                # swap-out): it sleeps until the earliest one; the others until they are woken.
                call._wake = trio.Event()
                call.armed_for = self._next_timer() if self._head() is call else math.inf
                with trio.move_on_at(call.armed_for):
                    await call._wake.wait()
                now = trio.current_time()
                if call.admitted_at is None and now >= call.armed_for:
                    self._advance(now)
                    self._schedule(now)
            sample(self.stats.queue_delays, call.queued_s)
            if call.swap_in_tokens:
                await self._swap_in(call.swap_in_tokens)
        except BaseException:
            if call.admitted_at is None:
                call.withdrawn = True
                self._schedule(trio.current_time())  # the head may have left: the next may fit
            else:
                self.end_call(call)
            raise
        prior = self._computed.get(key, 0)
        cached = self.cached_prefix(key, prompt, trio.current_time())
        call.recomputed = max(0, min(prior, len(prompt)) - cached)
        self.stats.recomputed_tokens += call.recomputed
        return call

    def end_call(self, call: EngineCall, *, paused: bool = True) -> None:
        """The model call is over: free its batch slot and apply the retention policy to the
        session's KV. `paused`: the call ended at a tool call and the session will be back (the
        interception InferCept and Continuum act on); False after a final answer, when SWAP and a
        pinning TTL leave the KV as plain prefix cache. Idempotent."""
        if call.ended or call.admitted_at is None:
            return
        call.ended = True
        now = _now_or(self._last_t or 0.0)
        self._advance(now)
        self.active_calls -= 1
        entry = self.kv.get(call.key)
        if entry is not None and entry.where == GPU and entry.active > 0:
            entry.active -= 1
            if entry.active == 0:
                self._go_idle(call.key, entry, now, paused=paused)
        self._schedule(now)

    def _forget_idle_sessions(self, excess: int) -> None:
        """Forget `excess` of the least recently seen sessions that hold no KV (fewer if the oldest
        ones all hold KV: those are bounded by their time-to-live or by `release`)."""
        for key in list(itertools.islice(self._ranks, 4 * excess + 16)):  # oldest first
            if excess <= 0:
                return
            if key not in self.kv:
                del self._ranks[key]
                self._computed.pop(key, None)
                excess -= 1

    def release(self, key: Hashable) -> None:
        """The session is over: drop its KV wherever it is, and forget it. With unlimited memory (and a
        policy that keeps KV at all) its blocks stay findable by content until idle for the TTL (kv.py)."""
        now = _now_or(self._last_t or 0.0)
        self._advance(now)
        self._retire(key, now, keep_findable=self.kv_budget_tokens is None and self.retention.kind != memory.DISCARD)
        self._computed.pop(key, None)
        self._ranks.pop(key, None)
        self._schedule(now)

    # --- the queue ---------------------------------------------------------------------------

    def _timer_set(self, at: float) -> None:
        head = self._head()
        if head is not None and at < head.armed_for:  # the head sleeps too long: wake it to re-arm
            head._wake.set()

    def _head(self) -> EngineCall | None:
        """The first waiting call (withdrawn ones are dropped on the way)."""
        while self._waiting and self._waiting[0][2].withdrawn:
            heapq.heappop(self._waiting)
        return self._waiting[0][2] if self._waiting else None

    def _need(self, call: EngineCall) -> int:
        """GPU tokens the call adds when admitted."""
        entry = self.kv.get(call.key)
        if entry is None or entry.where == HOST:
            return len(call.prompt)
        return max(0, len(call.prompt) - entry.gpu_tokens)

    def _schedule(self, now: float) -> None:
        """Admit waiting calls in order while the head fits, making room for it if the policy allows."""
        while (call := self._head()) is not None:
            blocked = self.max_batch is not None and self.active_calls >= self.max_batch
            if not blocked:
                need = self._need(call)
                blocked = not self._fits(need) and not self._make_room(call, need, now)
            if blocked:
                if call.armed_for != self._next_timer():
                    call._wake.set()  # a new head, asleep without a timer: it re-arms
                return
            heapq.heappop(self._waiting)
            self._admit(call, now)

    def _fits(self, need: int) -> bool:
        return self.kv_budget_tokens is None or self.resident_tokens + need <= self.kv_budget_tokens

    def _make_room(self, call: EngineCall, need: int, now: float) -> bool:
        """Evict idle cache entries, least recently used first, then preempt the held idle KV of
        younger sessions, youngest first, if that is enough for `call`; otherwise touch nothing."""
        shortfall = self.resident_tokens + need - self.kv_budget_tokens
        cache, held = [], []
        for key, entry in self.kv.items():
            if entry.active or entry.where != GPU or key == call.key:
                continue
            if not self._holds(entry):
                cache.append((entry.last_used, self._ranks.get(key, -1), key, entry.gpu_tokens))
            elif self._ranks.get(key, -1) > call.rank:
                held.append((-self._ranks[key], 0, key, entry.gpu_tokens))
        if sum(v[3] for v in cache) + sum(v[3] for v in held) < shortfall:
            return False
        order = operator.itemgetter(0, 1)  # sort on age or recency only: session keys may not compare
        for victims, counter in ((sorted(cache, key=order), "evicted"), (sorted(held, key=order), "preempted")):
            for *_, key, tokens in victims:
                if shortfall <= 0:
                    return True
                self._drop(key, now)
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)
                shortfall -= tokens
        return shortfall <= 0

    def _admit(self, call: EngineCall, now: float) -> None:
        need = self._need(call)
        entry = self.kv.get(call.key)
        if entry is None:
            entry = self.kv[call.key] = KVEntry(call.prompt, 0, now, call.pinned, serial=next(self._seq))
        elif entry.where == HOST:
            call.swap_in_tokens = entry.tokens
            self._add_host(-entry.host_tokens)
            entry.host_tokens = 0
            entry.where = GPU
        elif entry.where == SWAPPING_OUT:  # back before the copy ended: the GPU copy is still good
            self._add_host(-entry.host_tokens)
            entry.host_tokens = 0
            entry.where = GPU
        self._add_resident(need, now)
        entry.gpu_tokens = max(entry.gpu_tokens, len(call.prompt))
        entry.active += 1
        entry.version += 1
        self.active_calls += 1
        self.stats.peak_active_calls = max(self.stats.peak_active_calls, self.active_calls)
        call.admitted_at = now
        call._wake.set()
