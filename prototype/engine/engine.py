"""The simulated engine (the "GPU"): KV residency, prefix-cache hits, admission, paced token streaming.

The engine keeps, per sampling session, which prompt its KV holds and how many tokens of it. A
model call prefills only what is not resident, then streams tokens on the trio clock at the
profile's decode rate, so under a MockClock a long rollout costs milliseconds of real time.

By default the engine has unlimited memory and batch, and today's timings hold exactly. An
experiment may give it (memory.py has the sourced values):

* `kv_budget_tokens`: KV tokens the GPU holds, shared by all sessions; a model call is admitted
  when its whole prompt fits (vLLM admits a request when its prompt's blocks are free), and its
  decoded tokens are added as they are kept, so the budget can be overrun by in-flight output only;
* `max_batch`: model calls in flight at once (prefill and decode);
* `retention`: what happens to a session's KV between its model calls (memory.py's table);
* `serial_prefill`: prefill is compute-bound, so one engine prefills one call at a time, FIFO.

Calls that cannot be admitted wait in one queue, ordered by session age, then arrival (program-level
first-come-first-serve, as Continuum schedules agent programs, arXiv 2511.02230). The head of the
queue blocks the calls behind it, as vLLM's FCFS scheduler does. Decode speed per token does not
depend on how many calls are in flight: a deliberate simplification (decode reads the weights once
per step for the whole batch; the KV of the batch, which this model leaves out, slows it as the
batch grows: docs/parameters.md §3's roofline).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from array import array
from collections.abc import AsyncIterator, Hashable, Sequence

import attrs
import trio

from . import memory
from .latency import LatencyModel
from .memory import RetentionPolicy

# Prefix-cache retention: the vLLM session KV hint defaults to 300 s (vLLM RFC #52113); OpenAI's
# prompt-caching guide says caches clear after 5-10 minutes idle (docs/parameters.md §6).
KV_TTL_SECONDS = 300.0
# vLLM automatic prefix caching matches only full blocks of 16 tokens, and always recomputes at
# least the last token (vllm-project/agentic-api ADR-04).
BLOCK_SIZE = 16
# Share of http requests routed back to the engine holding their prefix [assumed], docs/parameters.md §6.
HTTP_AFFINITY = 0.9

# Where a KV entry is.
GPU = "gpu"
SWAPPING_OUT = "swapping_out"  # still on the GPU until the copy to the host ends
HOST = "host"


class ContextExceedsBudget(Exception):
    """A model call's prompt alone needs more KV than the engine's whole budget."""


class EngineFailure(Exception):
    """The engine failed mid-response (a fault injected by an experiment or test)."""


@attrs.define(eq=False)
class FaultPlan:
    """Fault injection, for tests and experiments: the engine raises `EngineFailure` at a flush.

    `Engine.stream` calls `on_flush` before it yields each chunk of sampled text; after
    `flushes_before_failure` flushes (counted over every stream of the engine) the next `failures`
    flushes raise. An engine without a plan (the default) pays one attribute check per flush.
    """

    flushes_before_failure: int = 0
    failures: int = 1
    flushes: int = 0  # flushes seen so far
    raised: int = 0  # failures raised so far

    def on_flush(self) -> None:
        self.flushes += 1
        if self.raised < self.failures and self.flushes > self.flushes_before_failure:
            self.raised += 1
            raise EngineFailure("injected engine failure")


@attrs.define(eq=False)
class Prompt:
    """A rendered prompt: token ids, append-only, so a KV entry that points at this object and
    covers its first n ids stays valid however long the prompt grows. The ids are a compact array
    of 64-bit integers (8 bytes a token, not ~36 for a list of int objects): a held session's
    prompt is most of its memory."""

    ids: array = attrs.field(factory=lambda: array("q"), converter=lambda ids: ids if isinstance(ids, array) else array("q", ids))

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)


@attrs.define(eq=False)
class KVEntry:
    prompt: Prompt
    tokens: int
    """KV computed for the first `tokens` ids of `prompt`: what a later call can reuse."""
    last_used: float
    pinned: bool = False  # held by a live coroutine (v1): no idle expiry while pinned
    where: str = GPU
    gpu_tokens: int = 0
    """GPU memory this entry takes, in tokens: `tokens`, or the whole prompt of a call in flight."""
    host_tokens: int = 0
    active: int = 0
    """Model calls in flight on this entry."""
    paused: bool = True
    """Its last call ended at a tool call (the session will be back), not with a final answer."""
    version: int = 0  # bumped on every change, so a stale timer does nothing


@attrs.define
class EngineStats:
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decoded_tokens: int = 0
    model_calls: int = 0
    recomputed_tokens: int = 0
    """Tokens prefilled that the session had computed before (its KV was dropped in between)."""
    queue_delays: list[float] = attrs.Factory(list)
    """Per admitted model call: seconds from asking for admission to getting it."""
    prefill_waits: list[float] = attrs.Factory(list)
    """Per prefill, with `serial_prefill`: seconds waiting for the GPU's compute."""
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    swap_in_seconds: float = 0.0
    """Time calls spent waiting for their KV to come back from the host (link queue included)."""
    peak_resident_tokens: int = 0
    peak_host_tokens: int = 0
    peak_active_calls: int = 0
    resident_token_seconds: float = 0.0
    """Integral of GPU-resident KV tokens over time: divide by a duration for the mean."""
    discarded: int = 0  # entries dropped by the DISCARD policy
    evicted: int = 0  # cache entries dropped to make room
    preempted: int = 0  # held entries dropped to make room for an older session
    expired: int = 0  # entries dropped at the end of their TTL
    swap_dropped: int = 0  # entries dropped because the host was full


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


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # binary search on slice equality: C-speed comparisons
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _now_or(default: float) -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a unit test of the bookkeeping)
        return default


@attrs.define(eq=False)
class Engine:
    """One inference engine shared by every session of a server."""

    kv_ttl: float = KV_TTL_SECONDS
    block_size: int = BLOCK_SIZE
    kv: dict[Hashable, KVEntry] = attrs.Factory(dict)
    stats: EngineStats = attrs.Factory(EngineStats)
    kv_budget_tokens: int | None = None
    """KV tokens the GPU holds for all sessions; None: unlimited (memory.H100_8B_KV_BUDGET_TOKENS
    is one H100 serving Llama-3.1-8B)."""
    max_batch: int | None = None
    """Model calls in flight at once; None: unlimited (memory.VLLM_MAX_NUM_SEQS is vLLM's default)."""
    retention: RetentionPolicy = memory.HOLD_POLICY
    """What happens to a session's KV between its model calls (memory.py)."""
    serial_prefill: bool = False
    """Prefill one call at a time, FIFO: the GPU's compute is shared (docs/parameters.md §3's rate R is
    the whole GPU's)."""
    kv_bytes_per_token: int = memory.KV_BYTES_PER_TOKEN_8B
    swap_bytes_per_s: float = memory.PCIE_BYTES_PER_S
    """Host<->GPU copy rate, each direction; copies in one direction go one at a time."""
    host_budget_tokens: int | None = None
    """KV tokens the host holds for swapped-out sessions; None: unlimited."""
    faults: FaultPlan | None = None
    """Fault injection (tests, experiments); None in normal runs."""

    resident_tokens: int = attrs.field(default=0, init=False)
    host_tokens: int = attrs.field(default=0, init=False)
    active_calls: int = attrs.field(default=0, init=False)
    _computed: dict[Hashable, int] = attrs.field(factory=dict, init=False)  # tokens each session has computed
    _ranks: dict[Hashable, int] = attrs.field(factory=dict, init=False)
    _rank_counter: itertools.count = attrs.field(factory=itertools.count, init=False)
    _seq: itertools.count = attrs.field(factory=itertools.count, init=False)
    _waiting: list[tuple[int, int, EngineCall]] = attrs.field(factory=list, init=False)
    _timers: list[tuple[float, int, Hashable, int]] = attrs.field(factory=list, init=False)
    _last_t: float | None = attrs.field(default=None, init=False)
    _to_host_free_at: float = attrs.field(default=-math.inf, init=False)
    _to_gpu_free_at: float = attrs.field(default=-math.inf, init=False)
    _prefill_lock: trio.Lock | None = attrs.field(default=None, init=False)

    # --- queries ------------------------------------------------------------------------------

    @property
    def idle_ttl(self) -> float:
        """Idle seconds an unpinned entry lives (on the GPU, or on the host after a swap)."""
        policy = self.retention
        return self.kv_ttl if policy.ttl is None else policy.ttl

    @property
    def waiting_calls(self) -> int:
        return sum(1 for *_, call in self._waiting if not call.withdrawn)

    def cached_prefix(self, key: Hashable, prompt: Prompt, now: float) -> int:
        """Tokens of `prompt` whose KV the session `key` still holds on this engine's GPU.

        A pinned entry (a live v1 coroutine) covers exactly what it computed. A prefix-cache entry
        counts whole blocks only and never the last token, and expires after its idle TTL.
        """
        self._advance(now)
        entry = self.kv.get(key)
        if entry is None or entry.where == HOST:
            return 0
        if entry.prompt is prompt:
            common = min(entry.tokens, len(prompt))
        else:
            common = min(entry.tokens, _common_prefix(entry.prompt.ids, prompt.ids))
        if entry.pinned:
            return common
        common = min(common, len(prompt) - 1)
        return max(0, common - common % self.block_size)

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
        if key not in self._ranks:
            self._ranks[key] = next(self._rank_counter)
        call = EngineCall(key, prompt, pinned, self._ranks[key], next(self._seq), now)
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
            self.stats.queue_delays.append(call.queued_s)
            if call.swap_in_tokens:
                await self._swap_in(call)
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

    def retain(self, key: Hashable, prompt: Prompt, now: float, *, pinned: bool = False) -> None:
        """Keep the KV of all of `prompt` under `key` (after a model call computed it)."""
        self._advance(now)
        entry = self.kv.get(key)
        if entry is not None and entry.where != GPU:
            self._drop(key, now)
            entry = None
        if entry is None:
            entry = self.kv[key] = KVEntry(prompt, 0, now, pinned)
        entry.prompt, entry.tokens, entry.last_used, entry.pinned = prompt, len(prompt), now, pinned
        entry.version += 1
        if entry.tokens > entry.gpu_tokens:
            self._add_resident(entry.tokens - entry.gpu_tokens, now)
            entry.gpu_tokens = entry.tokens
        self._computed[key] = max(self._computed.get(key, 0), entry.tokens)
        if entry.active == 0:  # kept outside a call (a direct use): idle from now on
            self._go_idle(key, entry, now, apply_policy=False)

    def release(self, key: Hashable) -> None:
        """The session is over: drop its KV wherever it is, and forget it."""
        now = _now_or(self._last_t or 0.0)
        self._advance(now)
        if key in self.kv:
            self._drop(key, now)
        self._computed.pop(key, None)
        self._ranks.pop(key, None)
        self._schedule(now)

    async def prefill(self, latency: LatencyModel, *, uncached: int, cached: int) -> None:
        self.stats.model_calls += 1
        self.stats.prefill_tokens += uncached
        self.stats.cached_tokens += cached
        seconds = latency.prefill_seconds(uncached, cached)
        if not self.serial_prefill:
            await trio.sleep(seconds)
            return
        if self._prefill_lock is None:
            self._prefill_lock = trio.Lock()  # fair: FIFO
        asked = trio.current_time()
        async with self._prefill_lock:
            self.stats.prefill_waits.append(trio.current_time() - asked)
            await trio.sleep(seconds)

    async def stream(
        self, latency: LatencyModel, pieces: Sequence[str], *, flush_interval: float = 0.0, flush_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """Yield the text of `pieces` (one token each) as it is sampled.

        Token i is ready at start + (i+1)/rate. With `flush_interval` > 0 the first token goes out
        at once and later tokens are coalesced: each chunk carries every token ready at its flush,
        flushes at least `flush_interval` apart, and the last chunk goes out when the last token
        is ready, so coalescing never delays the end of an item. With `flush_tokens` a chunk carries
        at most that many tokens: it goes out as soon as that many are ready, interval or not.
        """
        rate = latency.decode_tokens_per_s
        start = trio.current_time()
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
            self.stats.decoded_tokens += ready - sent
            if self.faults is not None:
                self.faults.on_flush()
            yield "".join(pieces[sent:ready])
            sent = ready

    def advance(self, now: float) -> None:
        """Apply the expiries and finished swap-outs due by `now`, and account memory up to `now`
        (read the statistics after this at the end of a run)."""
        self._advance(now)

    def swap_seconds(self, tokens: int) -> float:
        """Time to copy `tokens` of KV across the host link, one way."""
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    # --- bookkeeping ------------------------------------------------------------------------

    def _account(self, now: float) -> None:
        if self._last_t is not None and now > self._last_t:
            self.stats.resident_token_seconds += self.resident_tokens * (now - self._last_t)
        if self._last_t is None or now > self._last_t:
            self._last_t = now

    def _add_resident(self, tokens: int, now: float) -> None:
        self._account(now)
        self.resident_tokens += tokens
        self.stats.peak_resident_tokens = max(self.stats.peak_resident_tokens, self.resident_tokens)

    def _add_host(self, tokens: int) -> None:
        self.host_tokens += tokens
        self.stats.peak_host_tokens = max(self.stats.peak_host_tokens, self.host_tokens)

    def _drop(self, key: Hashable, now: float) -> None:
        entry = self.kv.pop(key)
        entry.version += 1
        self._add_resident(-entry.gpu_tokens, now)
        self._add_host(-entry.host_tokens)

    def _timer(self, at: float, key: Hashable, entry: KVEntry) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), key, entry.version))
        head = self._head()
        if head is not None and at < head.armed_for:  # the head sleeps too long: wake it to re-arm
            head._wake.set()

    def _next_timer(self) -> float:
        return self._timers[0][0] if self._timers else math.inf

    def _head(self) -> EngineCall | None:
        """The first waiting call (withdrawn ones are dropped on the way)."""
        while self._waiting and self._waiting[0][2].withdrawn:
            heapq.heappop(self._waiting)
        return self._waiting[0][2] if self._waiting else None

    def _holds(self, entry: KVEntry) -> bool:
        """Idle KV the policy holds: not evicted to make room (only preempted by an older session)."""
        return entry.pinned or (self.retention.kind == memory.TTL and self.retention.pin and entry.paused)

    def _go_idle(self, key: Hashable, entry: KVEntry, now: float, *, apply_policy: bool = True, paused: bool = True) -> None:
        entry.version += 1
        entry.paused = paused
        if entry.tokens == 0:  # nothing computed (the call failed before its prefill)
            self._drop(key, now)
            return
        if entry.gpu_tokens > entry.tokens:  # a reservation the call did not use
            self._add_resident(entry.tokens - entry.gpu_tokens, now)
            entry.gpu_tokens = entry.tokens
        kind = self.retention.kind
        if apply_policy and kind == memory.DISCARD:
            self._drop(key, now)
            self.stats.discarded += 1
        elif apply_policy and kind == memory.SWAP and paused:
            self._swap_out(key, entry, now)
        elif not entry.pinned:
            self._timer(max(now, entry.last_used + self.idle_ttl), key, entry)

    def _swap_out(self, key: Hashable, entry: KVEntry, now: float) -> None:
        room = self.host_budget_tokens
        if room is not None:
            while self.host_tokens + entry.tokens > room:
                victims = [(e.last_used, k) for k, e in self.kv.items() if e.where == HOST]
                if not victims:
                    break
                self._drop(min(victims, key=lambda v: v[0])[1], now)
                self.stats.swap_dropped += 1
            if self.host_tokens + entry.tokens > room:
                self._drop(key, now)
                self.stats.swap_dropped += 1
                return
        start = max(now, self._to_host_free_at)
        self._to_host_free_at = start + self.swap_seconds(entry.tokens)
        entry.where = SWAPPING_OUT
        entry.host_tokens = entry.tokens
        self._add_host(entry.tokens)
        self.stats.swap_out_bytes += entry.tokens * self.kv_bytes_per_token
        self._timer(self._to_host_free_at, key, entry)

    async def _swap_in(self, call: EngineCall) -> None:
        now = trio.current_time()
        start = max(now, self._to_gpu_free_at)
        self._to_gpu_free_at = start + self.swap_seconds(call.swap_in_tokens)
        self.stats.swap_in_bytes += call.swap_in_tokens * self.kv_bytes_per_token
        await trio.sleep_until(self._to_gpu_free_at)
        self.stats.swap_in_seconds += trio.current_time() - now

    def _advance(self, now: float) -> None:
        """Apply the timers due by `now`, in time order: TTL expiries and finished swap-outs."""
        while self._timers and self._timers[0][0] <= now:
            at, _, key, version = heapq.heappop(self._timers)
            entry = self.kv.get(key)
            if entry is None or entry.version != version or entry.active:
                continue
            if entry.where == SWAPPING_OUT:  # the copy is done: the GPU copy is freed
                entry.where = HOST
                entry.version += 1
                self._add_resident(-entry.gpu_tokens, at)
                entry.gpu_tokens = 0
                if not entry.pinned:
                    self._timer(max(at, entry.last_used + self.idle_ttl), key, entry)
            else:
                self._drop(key, at)
                self.stats.expired += 1
        self._account(now)

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
            entry = self.kv[call.key] = KVEntry(call.prompt, 0, now, call.pinned)
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
