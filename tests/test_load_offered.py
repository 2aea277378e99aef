"""experiments/load.py `offered_load`: the turns per second the sessions send when nothing queues (session i starts
i x stagger / N in; each next request a modeled turn and a think time after the last), on rates that follow by hand."""

from __future__ import annotations

import pytest

from experiments.load import offered_load


@pytest.mark.parametrize(("turns", "thinks", "sessions", "stagger", "mean", "peak"), [
    # A stagger equal to the think time: 25 requests a second (starts 40 ms apart); the span is the last start
    # (39.96 s) plus a session's life (2 thinks, 3 turns), not sessions x turns / a session's life (37.45).
    ([0.03] * 3, [40.0, 40.0, 0.0], 1000, 40.0, 3000 / (39.96 + 2 * 40.0 + 3 * 0.03), 25),
    # A stagger shorter than the think time sends in waves of 10,000 / 120 s = 83.3 a second: 83 or 84 in a window.
    ([0.01, 0.01], [240.0, 0.0], 10_000, 120.0, 20_000 / (120.0 * 9999 / 10_000 + 240.0 + 0.02), 84),
    ([0.5, 0.25], [5.0], 10, 0.0, 20 / 5.75, 10),  # no stagger: every session at the same instant
    ([0.1, 0.1], [0.2], 10, 0.0, 20 / 0.4, 20),  # a think shorter than a second puts both waves in one window
    ([2.0], [], 4, 3.0, 4 / 4.25, 2),  # one-turn sessions: starts at 0, 0.75, 1.5, 2.25; the last ends at 4.25
], ids=["stagger-as-think", "waves", "no-stagger", "short-think", "one-turn"])
def test_the_offered_load_is_the_turns_over_first_request_to_last_end_and_its_busiest_second(turns, thinks, sessions, stagger,
                                                                                              mean, peak):
    assert offered_load(turns, thinks, sessions, stagger) == (pytest.approx(mean), peak)
