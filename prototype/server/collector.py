"""Short full collections for a server that holds many sessions open.

CPython's cyclic garbage collector runs a full (oldest-generation) collection once the objects
that survived younger collections since the last one exceed a quarter of those the last one left
(CPython 3.11, Modules/gcmodule.c: `long_lived_pending` against `long_lived_total / 4`), and after
every tenth middle-generation collection at most (the third threshold of `gc.set_threshold`). A
full collection walks every tracked object, so its pause grows with the sessions held open, and
every turn in flight waits for it: on the
2-core machine of docs/load.md, 1,000 open chained sessions made full collections of 70k, 141k,
211k and 276k objects that took 88, 178, 254 and 327 ms of CPU, which set the per-turn p99.

The policy: the survivors of each full collection are frozen (`gc.freeze`: moved to a permanent
generation that no collection walks), so the next full collection walks only what survived since the
last one. A frozen object that later becomes cyclic garbage (a closed session's tasks and
connection objects reference each other) is not collected while it is frozen, so every
`unfreeze_every` seconds the frozen objects are handed back (`gc.unfreeze`) and the next full
collection walks everything once, as it would without the policy, and collects them. The memory a
closed session holds is therefore kept at most about that long; the long pause comes once per
interval instead of at every quarter's growth.

With the survivors frozen, a full collection walks little more than a middle-generation one does,
so they are allowed after every `oldest_threshold` middle-generation collections instead of every
tenth: each then walks what survived in the last few seconds, not in the last ten collections'
worth of new sessions.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

# Long enough that the full walk is rare under load (one every five minutes), short enough that the
# cyclic garbage of closed sessions is kept only minutes [ours].
DEFAULT_UNFREEZE_EVERY = 300.0
OLDEST_GENERATION = 2  # CPython's generations are 0, 1 and 2


@attrs.define(eq=False)
class FullCollectionPolicy:
    """Installed once per server process (`install`); `uninstall` takes the callback and the threshold
    back (what it froze stays frozen); `installed()` does both around a block and unfreezes after it."""

    unfreeze_every: float = DEFAULT_UNFREEZE_EVERY
    oldest_threshold: int = 1
    clock: Callable[[], float] = time.monotonic
    full_collections: int = 0
    unfreezes: int = 0
    _unfrozen_at: float = attrs.field(init=False, default=0.0)
    _thresholds: tuple[int, ...] = attrs.field(init=False, default=())

    def install(self) -> None:
        self._unfrozen_at = self.clock()
        self._thresholds = gc.get_threshold()
        young, middle, _ = self._thresholds
        gc.set_threshold(young, middle, self.oldest_threshold)
        gc.callbacks.append(self._after_collection)

    def uninstall(self) -> None:
        if self._after_collection in gc.callbacks:
            gc.callbacks.remove(self._after_collection)
            gc.set_threshold(*self._thresholds)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FullCollectionPolicy]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()
            gc.unfreeze()

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != OLDEST_GENERATION:
            return
        self.full_collections += 1
        now = self.clock()
        if now - self._unfrozen_at >= self.unfreeze_every:
            # The next full collection walks everything once: whatever died while frozen is collected.
            gc.unfreeze()
            self._unfrozen_at = now
            self.unfreezes += 1
        else:
            # A full collection leaves the younger generations empty: this freezes its survivors only.
            gc.freeze()


@contextlib.contextmanager
def short_full_collections(unfreeze_every: float = DEFAULT_UNFREEZE_EVERY) -> Iterator[FullCollectionPolicy]:
    """For a real-time run inside a process that did other work first (a benchmark): what exists
    before the run (modules, the tokenizer's tables, the virtual run's leftovers) is frozen, as
    `serve` freezes its startup objects, and the policy holds during the run; afterwards the
    collector is as it was. Without it, one full collection of the tokenizer's tables (~65-75 ms
    on the 2-core machine) lands inside a 17-turn efficiency run."""
    gc.collect()
    gc.freeze()
    with FullCollectionPolicy(unfreeze_every=unfreeze_every).installed() as policy:
        yield policy
