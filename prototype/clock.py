"""A real-time trio clock that wakes at its deadlines, not up to a millisecond after them.

trio waits for I/O and timers in `epoll.poll(timeout)`, and CPython turns that timeout into whole
milliseconds rounded up (Modules/selectmodule.c, `select_epoll_poll_impl`: `_PyTime_AsMilliseconds(
timeout, _PyTime_ROUND_CEILING)`), so every timer of the default clock fires 0-1 ms late, 0.5 ms
on average, plus the kernel's wake-up latency. In a real-time run of the model every modeled wait
(a prefill, the last token of a stream, a client's tool) ends with such a sleep, and the lateness
adds to the turn: a few milliseconds per turn, against a testbed that studies overheads of tens.

`PreciseClock` asks epoll for the whole milliseconds below the deadline and polls without blocking
for the remainder (at most 1 ms of CPU per timer that actually ends an idle wait; none while other
tasks are runnable, since trio only sleeps when nothing is). Same time base as trio's default clock.
Used where the testbed measures itself against the model in real time: the in-process benchmark
runs (`benchmark.run_design_real`) and the load generators' client processes. `serve` keeps trio's
default clock: with many sessions' timers its polling would take CPU from a shared machine.
"""

from __future__ import annotations

import math
import time

import trio

_MS = 1000.0
_LONGEST_SLEEP = 86400.0  # trio passes an infinite deadline when no timer is armed


class PreciseClock(trio.abc.Clock):
    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.perf_counter()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        remaining = deadline - time.perf_counter()
        if remaining >= _LONGEST_SLEEP:
            return _LONGEST_SLEEP
        # Half a millisecond below a whole number so that the rounding up lands on it.
        whole_ms = math.floor(remaining * _MS) - 0.5
        return whole_ms / _MS if whole_ms > 0 else 0.0
