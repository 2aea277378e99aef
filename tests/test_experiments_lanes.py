"""The subagents and steering experiments run end to end at a tiny size (their figures are in the
README; here only what holds by construction is asserted)."""

from __future__ import annotations

import pytest

from experiments import common, steering, subagents


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)


def test_steering_main_tiny(tmp_path):
    rows = steering.main(["--after", "10", "--output-tokens", "40", "--tool-seconds", "0.5", "--rtt-ms", "10"])
    seconds = {row["alternative"]: row["steer_to_token_s"] for row in rows}
    assert set(seconds) == set(steering.ALTERNATIVES)
    # Waiting for the tool round pays at least the tool; steering pays only the rest of the item.
    for waiting in ("chained+wait", "v1+append", "http+wait"):
        assert seconds[waiting] > 0.5 > seconds["chained+steer"] > 0
    assert (tmp_path / "steering" / "latest" / "steering.csv").exists()


def test_subagents_main_tiny(tmp_path):
    rows = subagents.main(["--agents", "2", "--turns", "2", "--output-tokens", "20", "--tool-seconds", "0.2", "--no-rss"])
    by = {row["arrangement"]: row for row in rows}
    assert [by[a]["connections"] for a in subagents.ARRANGEMENTS] == [1, 2, 2, 1]
    # One handshake instead of one per subagent: lanes start their tasks sooner.
    assert by["v2 lanes"]["task_mean_s"] < by["v2 socket each"]["task_mean_s"]
    # Injected outputs resume the parent response in place: no new response per tool round, so the
    # client sends less than the lanes' creates do.
    assert by["v2 inject"]["sent_kb"] < by["v2 lanes"]["sent_kb"]
    assert (tmp_path / "subagents" / "latest" / "subagents.csv").exists()


@pytest.mark.slow
def test_subagents_real_memory_tiny():
    assert subagents.real_memory("v2 lanes", 2, turns=2) >= 0
    assert subagents.real_memory("v2 inject", 2, turns=2) >= 0
