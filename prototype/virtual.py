"""A run under virtual time that is a pure function of its arguments and a scheduler seed.

Under `trio.testing.MockClock(autojump_threshold=0)` every modelled wait is exact, but tasks that
become runnable at the same virtual instant still run in an order trio chooses, and with many agents
queueing for one engine that order decides who is admitted first. Left alone, trio makes that order
depend on the process rather than on the run (trio 0.35, trio/_core/_run.py):

* each batch of runnable tasks is reversed or not by a draw from a module-level `random.Random`
  seeded from the OS;
* tasks woken by deadlines that fall at the same instant enter the run queue in the order of the
  `id()` of their cancel scopes (`Deadlines`, a heap of `(deadline, id(scope), scope)`), that is of
  memory addresses, which depend on everything the process allocated before the run.

So the same configuration gave one row alone and another after a different run in the same process.
trio's deterministic mode (`_ALLOW_DETERMINISTIC_SCHEDULING`, the one importing Hypothesis turns on)
sorts each batch by the order the tasks were spawned before shuffling it with that generator: the
order then depends on the run's own history and the seed only. `run` turns it on and seeds the
generator for the length of one `trio.run`, and puts both back afterwards, whether the run returns or
raises. Both are module-level, so runs in threads of one process (a Dask cluster of threads) take
turns: they share one interpreter lock anyway. Both are private: a trio without them cannot be
seeded, and `run` refuses to start (`UnseededScheduler`) rather than give rows that depend on the
process.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import trio
import trio.testing

T = TypeVar("T")
# One seeded run at a time per process: the scheduler's generator and mode are trio's module globals.
_SCHEDULER = threading.Lock()


class UnseededScheduler(RuntimeError):
    """This trio lacks the private scheduler state a seeded run sets (`trio._core._run._r` and
    `_ALLOW_DETERMINISTIC_SCHEDULING`, trio 0.35)."""


@contextlib.contextmanager
def seeded_scheduler(seed: int) -> Iterator[None]:
    """trio's order for tasks runnable at the same instant: a function of `seed` and the run alone."""
    run_module = trio._core._run
    missing = next((name for name in ("_r", "_ALLOW_DETERMINISTIC_SCHEDULING") if not hasattr(run_module, name)), None)
    if missing is not None:
        raise UnseededScheduler(
            f"trio {trio.__version__} has no trio._core._run.{missing}: its scheduler cannot be seeded, and a virtual run's "
            "order of simultaneous tasks would depend on the process (prototype/virtual.py)")
    generator = run_module._r
    state, deterministic = generator.getstate(), run_module._ALLOW_DETERMINISTIC_SCHEDULING
    generator.seed(seed)
    run_module._ALLOW_DETERMINISTIC_SCHEDULING = True
    try:
        yield
    finally:
        run_module._ALLOW_DETERMINISTIC_SCHEDULING = deterministic
        generator.setstate(state)


def run(async_fn: Callable[..., Awaitable[T]], *args: Any, scheduler_seed: int = 0) -> T:
    """`trio.run(async_fn, *args)` on a fresh autojumping MockClock, with the scheduler seeded."""
    with _SCHEDULER, seeded_scheduler(scheduler_seed):
        return trio.run(async_fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))
