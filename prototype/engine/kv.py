"""KV residency and swap: which prompt each session's KV covers, where that KV is (GPU, on its
way to the host, host), what it costs in memory over time, and when it expires.

What is resident is found by content, as vLLM's automatic prefix caching and SGLang's radix cache
find it: every full block of 16 token ids has a hash chained from the block before it (a block's
hash names the whole prefix up to its end), and the engine keeps a directory from block hash to the
KV entry holding that block. A model call reuses its own session's KV, or the longest run of
leading blocks any entry on this engine holds (so the system prompt and tools that every session of
a preset sends are computed once). With unlimited memory a computed block stays findable until it
has been idle for the TTL, whether or not its session has ended (vLLM keeps the blocks of finished
requests as evictable cache); with a KV budget only blocks of entries the engine still holds count,
so memory accounting stays exact. A session marked `isolate`d (an http request routed to another
engine) neither finds nor leaves blocks.

A session's KV lives under its key as a `KVEntry` over an append-only `Prompt`. Between model
calls the engine's `retention` policy (memory.py's table) decides what happens to it: held, kept as
prefix cache until its idle TTL, swapped to the host over a one-way-at-a-time link, or discarded.
Timers (expiries, finished swap-outs) are applied lazily, in time order, whenever the engine is
asked about a time (`_advance`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType

import attrs
import trio

from . import memory
from .memory import RetentionPolicy
from .stats import EngineStats

# Prefix-cache retention: the vLLM session KV hint defaults to 300 s (vLLM RFC #52113); OpenAI's
# prompt-caching guide says caches clear after 5-10 minutes idle (docs/parameters.md §6).
KV_TTL_SECONDS = 300.0
# vLLM automatic prefix caching matches only full blocks of 16 tokens, and always recomputes at
# least the last token (vllm-project/agentic-api ADR-04).
BLOCK_SIZE = 16

# Where a KV entry is.
GPU = "gpu"
SWAPPING_OUT = "swapping_out"  # still on the GPU until the copy to the host ends
HOST = "host"


def _extend_ids(target: array, ids: Iterable[int]) -> array:
    """`target.extend(ids)`, all or nothing: an id that is not a 64-bit integer raises and leaves
    `target` as it was. Ids that are not an array go in by `array.fromlist`, which reads a list
    directly where `extend` converts it item by item through the iterator protocol (the 8,000 ids of
    a long answer: 70-195 against 190-420 µs, timeit over 3 rounds on the 2-core machine of docs/speed.md)."""
    if isinstance(ids, array):
        target.extend(ids)
    else:
        target.fromlist(ids if isinstance(ids, list) else list(ids))
    return target


@attrs.define(eq=False)
class Prompt:
    """A rendered prompt: token ids, append-only, so a KV entry that points at this object and
    covers its first n ids stays valid however long the prompt grows. The ids are a compact array
    of 64-bit integers (8 bytes a token, not ~36 for a list of int objects): a held session's
    prompt is most of its memory."""

    ids: array = attrs.field(factory=lambda: array("q"), converter=lambda ids: ids if isinstance(ids, array) else _extend_ids(array("q"), ids))
    _hashes: list[int] = attrs.field(factory=list, init=False, repr=False)  # chain hash of each full block so far
    _hash_block: int = attrs.field(default=0, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Iterable[int]) -> None:
        _extend_ids(self.ids, ids)

    def block_hashes(self, block_size: int) -> list[int]:
        """The chain hash of every full block: block i's hash covers ids[0 : (i+1) * block_size]. Computed once per
        block (the prompt only grows), so a long conversation pays for its new blocks only."""
        if self._hash_block != block_size:
            self._hashes, self._hash_block = [], block_size
        hashes, ids = self._hashes, self.ids
        parent = hashes[-1] if hashes else 0
        first, last = len(hashes), len(ids) // block_size
        if last > first:
            # The new blocks' bytes in one copy, then one slice per block: the same bytes, so the
            # same hashes, as copying each block out of the array (a third less time at 8,000 ids).
            data = ids[first * block_size : last * block_size].tobytes()
            width = block_size * ids.itemsize
            for offset in range(0, len(data), width):
                parent = hash((parent, data[offset : offset + width]))
                hashes.append(parent)
        return hashes


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
    serial: int = 0
    """Which of the session's entries this is (the engine numbers them): a timer set for an earlier one does nothing."""
    registered: int = 0
    """Leading full blocks of `prompt` listed in the engine's block directory under this entry."""
    findable: bool = True
    """Its blocks serve other sessions' lookups (False once dropped, or for an isolated session)."""


def common_prefix(a: list[int], b: list[int]) -> int:
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

@attrs.define(eq=False)
class KVResidency:
    """Where each session's KV is, and what it costs; the admission queue (admission.py) builds on it."""

    kv_ttl: float = KV_TTL_SECONDS
    block_size: int = BLOCK_SIZE
    kv: dict[Hashable, KVEntry] = attrs.Factory(dict)
    stats: EngineStats = attrs.Factory(EngineStats)
    retention: RetentionPolicy = memory.HOLD_POLICY
    """What happens to a session's KV between its model calls (memory.py)."""
    kv_bytes_per_token: int = memory.KV_BYTES_PER_TOKEN_8B
    swap_bytes_per_s: float = memory.PCIE_BYTES_PER_S
    """Host<->GPU copy rate, each direction; copies in one direction go one at a time."""
    host_budget_tokens: int | None = None
    """KV tokens the host holds for swapped-out sessions; None: unlimited."""

    resident_tokens: int = attrs.field(default=0, init=False)
    host_tokens: int = attrs.field(default=0, init=False)
    _computed: dict[Hashable, int] = attrs.field(factory=dict, init=False)  # tokens each session has computed
    _seq: itertools.count = attrs.field(factory=itertools.count, init=False)
    # (due, sequence, key, entry's serial, entry's version): a timer acts only on the entry it was set for,
    # as it was then; a session's later entry starts its versions afresh, so the version alone could match it.
    _timers: list[tuple[float, int, Hashable, int, int]] = attrs.field(factory=list, init=False)
    _last_t: float | None = attrs.field(default=None, init=False)
    _to_host_free_at: float = attrs.field(default=-math.inf, init=False)
    _to_gpu_free_at: float = attrs.field(default=-math.inf, init=False)
    _blocks: dict[int, KVEntry] = attrs.field(factory=dict, init=False)  # block hash -> the entry that holds it
    _sweep_at: int = attrs.field(default=1 << 16, init=False)
    _directory_last: KVEntry | None = attrs.field(default=None, init=False)  # the entry that changed `_blocks` last
    _isolated: set = attrs.field(factory=set, init=False)

    @property
    def computed_tokens(self) -> Mapping[Hashable, int]:
        """The most tokens each remembered session has computed (read-only): what its recomputation is counted against."""
        return MappingProxyType(self._computed)

    @property
    def block_directory(self) -> Mapping[int, KVEntry]:
        """The prefix-block directory (read-only): block hash -> the KV entry listed as holding that block."""
        return MappingProxyType(self._blocks)

    @property
    def next_sweep_at(self) -> int:
        """Blocks the directory may list before a registration sweeps out those nobody can find any more."""
        return self._sweep_at

    @property
    def idle_ttl(self) -> float:
        """Idle seconds an unpinned entry lives (on the GPU, or on the host after a swap)."""
        policy = self.retention
        return self.kv_ttl if policy.ttl is None else policy.ttl

    def cached_prefix(self, key: Hashable, prompt: Prompt, now: float) -> int:
        """Tokens of `prompt` whose KV this engine's GPU still holds for the session `key`'s call.

        A pinned entry (a live v1 coroutine) covers exactly what it computed. Otherwise hits count
        whole blocks only and never the last token: the session's own entry, or the leading blocks
        the block directory finds in any entry (the prefix cache shared across sessions).
        """
        self._advance(now)
        own = 0
        entry = self.kv.get(key)
        if entry is not None and entry.where != HOST:
            if entry.prompt is prompt:
                own = min(entry.tokens, len(prompt))
            else:
                own = min(entry.tokens, common_prefix(entry.prompt.ids, prompt.ids))
            if entry.pinned:
                return max(own, self._directory_hits(key, prompt, now))
        limit = max(0, len(prompt) - 1)
        own = min(own, limit)
        own -= own % self.block_size
        if own + self.block_size > limit:  # nothing more a lookup could add
            return own
        return max(own, self._directory_hits(key, prompt, now))

    def isolate(self, key: Hashable) -> None:
        """The session's KV is on an engine of its own (an http request routed away from its prefix): it finds
        nothing in the block directory and adds nothing to it, until it is released."""
        self._isolated.add(key)

    def _directory_hits(self, key: Hashable, prompt: Prompt, now: float) -> int:
        """Tokens of `prompt`'s leading full blocks (never its last token) found in the block directory:
        the walk stops at the first block with no holder, or whose holder cannot serve it."""
        if key in self._isolated or not self._blocks:
            return 0
        hashes = prompt.block_hashes(self.block_size)
        usable = min(len(hashes), max(0, len(prompt) - 1) // self.block_size)
        # A long prompt has thousands of blocks but few distinct holders: look the holders up at C
        # speed and judge each distinct one once (a per-block Python loop cost ~1 ms a lookup at 128k tokens).
        holders = list(map(self._blocks.get, itertools.islice(hashes, usable)))
        stops = [holder for holder in set(holders) if holder is None or not self._serves(holder, now)]
        found = min(map(holders.index, stops)) if stops else usable
        return found * self.block_size

    def _serves(self, entry: KVEntry, now: float) -> bool:
        # Idle for the TTL or longer serves nobody: the age at which an entry's own timer drops it.
        return entry.findable and entry.where != HOST and (entry.pinned or now - entry.last_used < self.idle_ttl)

    def _register(self, key: Hashable, entry: KVEntry) -> None:
        """List the entry's full blocks in the block directory, as their holder. The directory keeps one
        holder a block: the entry that used it last, which idle TTLs and LRU eviction keep longest, so
        every use claims all of the entry's blocks, not only the new ones (a prefix another session
        registered since stays findable through this entry after that session's is gone)."""
        if key in self._isolated:
            entry.findable = False
            return
        full = entry.tokens // self.block_size
        hashes = entry.prompt.block_hashes(self.block_size)
        blocks = self._blocks
        # An entry that changed the directory last still holds every block it listed: its own
        # unlisting (`_unregister_after`) lowers `registered` with what it removes, and any other
        # change (another entry's claim, a sweep) makes it not the last. It claims its new blocks
        # only, the same directory as claiming all of them without a pass over the whole prompt on
        # every turn of a lone session.
        start = entry.registered if self._directory_last is entry else 0
        blocks.update(zip(itertools.islice(hashes, start, full), itertools.repeat(entry)))  # C speed: ~0.3 ms at 8,000 blocks
        entry.registered = full
        self._directory_last = entry
        if len(blocks) > self._sweep_at:  # forget blocks nobody can find any more
            now = self._last_t or 0.0
            for h in [h for h, holder in blocks.items() if not self._serves(holder, now)]:
                del blocks[h]
            self._sweep_at = max(1 << 16, 2 * len(blocks))
            self._directory_last = None

    def _unregister_after(self, entry: KVEntry, prompt: Prompt) -> None:
        """The entry now holds `prompt`, which may branch from what it held: unlist its blocks past the branch."""
        old = entry.prompt.block_hashes(self.block_size)[: entry.registered]
        new = prompt.block_hashes(self.block_size)
        keep = common_prefix(old, new[: len(old)])
        for h in old[keep:]:
            if self._blocks.get(h) is entry:
                del self._blocks[h]
        entry.registered = keep

    def _retire(self, key: Hashable, now: float, *, keep_findable: bool) -> None:
        """The session is over: its entry leaves the engine's accounting; with `keep_findable` (unlimited memory)
        its blocks stay findable, unpinned, until idle for the TTL."""
        entry = self.kv.get(key)
        if entry is not None:
            self._drop(key, now)
            if keep_findable and key not in self._isolated and entry.registered and entry.where != HOST:
                entry.findable, entry.pinned, entry.last_used = True, False, now
        self._isolated.discard(key)

    def retain(self, key: Hashable, prompt: Prompt, now: float, *, pinned: bool = False, tokens: int | None = None) -> None:
        """Keep the KV of all of `prompt` under `key` (after a model call computed it); with `tokens`, of its
        first `tokens` ids only."""
        self._advance(now)
        entry = self.kv.get(key)
        if entry is not None and entry.where != GPU:
            self._drop(key, now)
            entry = None
        if entry is None:
            entry = self.kv[key] = KVEntry(prompt, 0, now, pinned, serial=next(self._seq))
        if entry.prompt is not prompt and entry.registered:
            self._unregister_after(entry, prompt)
        entry.prompt, entry.tokens, entry.last_used, entry.pinned = prompt, len(prompt) if tokens is None else tokens, now, pinned
        self._register(key, entry)
        entry.version += 1
        if entry.tokens > entry.gpu_tokens:
            self._add_resident(entry.tokens - entry.gpu_tokens, now)
            entry.gpu_tokens = entry.tokens
        self._computed[key] = max(self._computed.get(key, 0), entry.tokens)
        if entry.active == 0:  # kept outside a call (a direct use): idle from now on
            self._go_idle(key, entry, now, apply_policy=False)

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
        entry.findable = False
        self._add_resident(-entry.gpu_tokens, now)
        self._add_host(-entry.host_tokens)

    def _timer(self, at: float, key: Hashable, entry: KVEntry) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), key, entry.serial, entry.version))
        self._timer_set(at)

    def _timer_set(self, at: float) -> None:
        """A new timer is due `at`: the admission queue's head may need to wake earlier."""

    def _next_timer(self) -> float:
        return self._timers[0][0] if self._timers else math.inf

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

    async def _swap_in(self, tokens: int) -> None:
        """Wait for `tokens` of KV to come back from the host; copies to the GPU go one at a time."""
        now = trio.current_time()
        start = max(now, self._to_gpu_free_at)
        self._to_gpu_free_at = start + self.swap_seconds(tokens)
        self.stats.swap_in_bytes += tokens * self.kv_bytes_per_token
        await trio.sleep_until(self._to_gpu_free_at)
        self.stats.swap_in_seconds += trio.current_time() - now

    def _advance(self, now: float) -> None:
        """Apply the timers due by `now`, in time order: TTL expiries and finished swap-outs."""
        while self._timers and self._timers[0][0] <= now:
            at, _, key, serial, version = heapq.heappop(self._timers)
            entry = self.kv.get(key)
            if entry is None or entry.serial != serial or entry.version != version or entry.active:
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
