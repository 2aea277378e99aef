"""PreciseClock (prototype/clock.py): the sleep it asks epoll for, rounded up to whole ms by CPython, never passes the
deadline and falls short by under 1.5 ms (the rest is polled). A virtual run: an autojumping clock from zero, seeded."""

from __future__ import annotations

import math
import re

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from prototype import clock, virtual
from prototype.clock import PreciseClock

NOW = 1000.0


@pytest.fixture
def frozen_time(monkeypatch):
    monkeypatch.setattr(clock.time, "perf_counter", lambda: NOW)


def epoll_rounding(seconds: float) -> float:
    """What CPython hands epoll: whole milliseconds, rounded up (selectmodule.c)."""
    return math.ceil(seconds * 1000) / 1000


@given(remaining=st.floats(min_value=0.0, max_value=3600.0))
def test_the_rounded_sleep_never_passes_the_deadline_and_leaves_under_1_5_ms(remaining):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(clock.time, "perf_counter", lambda: NOW)
        asked = PreciseClock().deadline_to_sleep_time(NOW + remaining)
    assert asked >= 0.0 and epoll_rounding(asked) <= remaining + 1e-9 and remaining - epoll_rounding(asked) < 0.0015 + 1e-9


@pytest.mark.parametrize(("remaining", "asked"), [(0.0053, 0.0045), (0.0015, 0.0005), (0.0008, 0.0), (-0.002, 0.0), (0.0105, 0.0095),
                                                 (86400.0, 86400.0), (math.inf, 86400.0)])  # no timer armed: the longest sleep
def test_exact_sleeps_and_the_time_is_perf_counter(frozen_time, remaining, asked):
    assert PreciseClock().deadline_to_sleep_time(NOW + remaining) == pytest.approx(asked, abs=1e-12)
    assert PreciseClock().current_time() == NOW


def test_a_virtual_run_is_on_an_autojumping_clock_from_zero() -> None:
    async def clock_of_the_run() -> tuple[float, float, float]:
        start = trio.current_time()
        await trio.sleep(3600.0)
        return start, trio.current_time(), trio.lowlevel.current_clock().autojump_threshold

    assert virtual.run(clock_of_the_run) == (0.0, 3600.0, 0)

    async def echo(a: int, b: str) -> tuple[int, str]:
        return a, b

    assert virtual.run(echo, 1, "two", scheduler_seed=5) == (1, "two")


@pytest.mark.parametrize("missing", ["_r", "_ALLOW_DETERMINISTIC_SCHEDULING"])
def test_a_trio_without_the_private_scheduler_refuses_to_run_unseeded(monkeypatch, missing: str) -> None:
    run_module = trio._core._run
    monkeypatch.delattr(run_module, missing)
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(virtual.UnseededScheduler, match=re.escape(f"trio {trio.__version__} has no trio._core._run.{missing}: ")):
        virtual.run(main)
    assert ran == [] and not hasattr(run_module, missing)
