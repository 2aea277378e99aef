"""experiments/load.py `offered_load`: the turns per second the sessions send when nothing queues (session i starts
i x stagger / N in; each next request a modeled turn and a think time after the last), on rates that follow by hand."""

from __future__ import annotations

import pytest

from experiments.load import offered_load


def test_a_stagger_equal_to_the_think_time_offers_one_turn_per_session_per_think_time():
    # 1,000 sessions over 40 s, 40 s think, 3 turns of 30 ms: 25 requests a second from the first
    # to the last; the span is the last start (39.96 s) plus a session's life (2 thinks, 3 turns).
    mean, peak = offered_load([0.03] * 3, [40.0, 40.0, 0.0], 1000, 40.0)
    assert mean == pytest.approx(3000 / (39.96 + 2 * 40.0 + 3 * 0.03))
    assert peak == 25  # starts 40 ms apart
    # What sessions x turns / (one session's modeled life) gives: it leaves out the stagger.
    assert 3000 / (2 * 40.0 + 3 * 0.03) == pytest.approx(37.45, abs=0.01)


def test_a_stagger_shorter_than_the_think_time_sends_in_waves():
    # 10,000 sessions over 120 s, 240 s think, 2 turns: each wave at 10,000 / 120 s = 83.3 a second,
    # the mean over first request to last end 20,000 / (119.988 + 240 + 0.02).
    mean, peak = offered_load([0.01, 0.01], [240.0, 0.0], 10_000, 120.0)
    assert mean == pytest.approx(20_000 / (120.0 * 9999 / 10_000 + 240.0 + 0.02))
    assert peak == 84  # 83.3 a second: a one-second window holds 83 or 84 starts


def test_without_a_stagger_every_session_sends_at_the_same_instant():
    mean, peak = offered_load([0.5, 0.25], [5.0], 10, 0.0)
    assert mean == pytest.approx(20 / 5.75)
    assert peak == 10
    # A think shorter than a second puts both waves in one window.
    assert offered_load([0.1, 0.1], [0.2], 10, 0.0) == (pytest.approx(20 / 0.4), 20.0)


def test_one_turn_sessions_offer_their_starts():
    mean, peak = offered_load([2.0], [], 4, 3.0)  # starts at 0, 0.75, 1.5, 2.25; the last ends at 4.25
    assert mean == pytest.approx(4 / 4.25)
    assert peak == 2
