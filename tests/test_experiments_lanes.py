"""The subagents and steering experiments run end to end at a tiny size (their figures are in the
README; here only what holds by construction is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import common, steering, subagents
from prototype import netem


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


def test_the_steering_table_of_docs_subagents_is_the_experiments_output():
    """docs/subagents.md quotes `python -m experiments.steering --after 50 250` as it prints: a change to the code
    that moves a number fails here until the table is taken from the experiment again."""
    from tests.conftest import REPO

    rows = steering.main(["--after", "50", "250"])
    printed = {(row["alternative"], row["after_tokens"]): f"{row['steer_to_token_s']:.3f}" for row in rows}
    doc = (REPO / "docs" / "subagents.md").read_text()
    table = doc.split("| alternative | steer after 50 tokens, s | steer after 250 tokens, s |\n")[1].split("\n\n")[0]
    quoted = {}
    for line in table.splitlines()[1:]:  # below the header's rule
        alternative, after_50, after_250 = (cell.strip() for cell in line.strip().strip("|").split("|"))
        quoted[(alternative.split()[0], 50)], quoted[(alternative.split()[0], 250)] = after_50, after_250
    assert quoted == printed


def test_subagents_main_tiny(tmp_path):
    rtt = 0.020
    rows = subagents.main(["--agents", "2", "--turns", "2", "--output-tokens", "20", "--tool-seconds", "0.2", "--no-rss",
                           "--rtt-ms", f"{rtt * 1000:g}"])
    by = {row["arrangement"]: row for row in rows}
    assert [by[a]["connections"] for a in subagents.ARRANGEMENTS] == [1, 2, 2, 1]
    # The lanes' one connection is open before any subagent starts; a connection of its own costs each
    # subagent the TCP and TLS handshakes and the WebSocket upgrade's round trip, and nothing else.
    handshake = netem.NetworkProfile(rtt=rtt).handshake_seconds + rtt
    assert by["v2 socket each"]["task_mean_s"] - by["v2 lanes"]["task_mean_s"] == pytest.approx(handshake, abs=1e-9)
    assert by["v2 lanes"]["task_max_s"] == by["v2 lanes"]["task_mean_s"]  # the same task on every lane, side by side
    # Injected outputs resume the parent response in place: no new response per tool round, so the
    # client sends less than the lanes' creates do.
    assert by["v2 inject"]["sent_kb"] < by["v2 lanes"]["sent_kb"]
    assert (tmp_path / "subagents" / "latest" / "subagents.csv").exists()


@pytest.mark.slow
def test_subagents_real_memory_samples_the_server_process_during_the_run(monkeypatch):
    # What the server's memory does is the experiment's finding; what holds by construction is the
    # measurement: the child server's RSS, sampled while the subagents run, peak less the level before, per agent.
    samples: list[int] = []
    sampled: set[str] = set()

    def fake_rss(pid: int) -> int:
        sampled.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        samples.append(100 * 2**20 + 4096 * (len(samples) % 7))  # a known sequence, not the real RSS
        return samples[-1]

    monkeypatch.setattr(subagents, "rss_bytes", fake_rss)
    agents = 2
    per_agent_kb = subagents.real_memory("v2 lanes", agents, turns=2)
    assert len(samples) >= 2  # the level before, then at least one sample during the run
    assert per_agent_kb == (max(samples) - samples[0]) / 1024 / agents
    assert len(sampled) == 1 and " -m prototype serve " in sampled.pop()
