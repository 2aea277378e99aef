"""Every experiment's main() at a tiny size (their figures are in the README and docs/; here only what holds by
construction)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import compaction, history_cpu, published, steering, subagents, virtual_vs_real
from prototype import netem
from tests.conftest import REPO
from tests.support import run_into_a_closed_pipe

pytestmark = pytest.mark.usefixtures("results_in_tmp")


def test_published_marks_one_calibration_row_solves_implied_overheads_and_has_one_verdict_band_for_every_row(capsys):
    result = published.main(["--tasks", "1", "--rows", "0", "4", "--trend-turns", "4"])
    rows = result["rows"]
    assert [r["role"] for r in rows] == ["calibration", "check"]
    assert rows[0]["implied_vs_calibration"] == rows[0]["verdict"] == "calibration"
    assert rows[0]["residual"] == pytest.approx(rows[0]["measured_gain"] - rows[0]["published_gain"])
    assert rows[1]["metric"] == "ttft" and rows[1]["implied_vs_calibration"] == "-"  # TTFT is not held to an e2e figure
    check = rows[1]
    assert check["verdict"] == published.verdict(check["published_gain"], check["measured_gain"], (check["gain_low"], check["gain_high"]))
    for r in rows:
        assert r["implied_ms_per_turn"] > 0 and r["gain_low"] <= r["measured_gain"] <= r["gain_high"]
    assert [t["tok_s"] for t in result["trends"]] == [65.0, 1000.0, 4000.0]
    printed = capsys.readouterr().out
    assert "Verdict rule:" in printed and "By construction, not evidence" in printed and "Calibration residual" in printed
    assert published.verdict(0.40, 0.36, (0.30, 0.38)) == "agrees"  # within 5 points
    assert published.verdict(0.40, 0.30, (0.20, 0.41)) == "agrees"  # inside the interval
    assert published.verdict(0.40, 0.30, (0.28, 0.33)) == "disagrees"  # "up to 40%" is not met by 30%


def test_history_cpu_runs_at_a_tiny_size():
    rows = history_cpu.main(["--histories", "1000", "4000", "--turns", "3", "--rounds", "1"])
    assert {r["design"] for r in rows} == {"suspended", "chained", "chained, switches off"}
    assert all(r["turns_measured"] == 2 and r["cpu_ms_per_turn_median"] > 0 for r in rows)


def test_virtual_vs_real_reports_its_ratio_for_each_design(capsys):
    # A benchmark: the ratio depends on the machine's load, so it is printed, never bounded here
    # (README's "virtual vs real" section reports it from a quiet run).
    rows = virtual_vs_real.main(["--tasks", "1", "--turns", "2"])
    assert [row["design"] for row in rows] == ["http", "chained", "suspended"]
    for row in rows:
        assert row["ratio_real_over_virtual"] == row["real_e2e_s"] / row["virtual_e2e_s"]
    printed = capsys.readouterr().out
    assert all(f"{row['ratio_real_over_virtual']:.3f}" in printed for row in rows), printed


def test_an_experiment_into_a_pipe_whose_reader_has_gone_ends_without_a_traceback(tmp_path):
    run_into_a_closed_pipe(tmp_path, "experiments.published", "--tasks", "1", "--trend-turns", "2", "--rows", "1", "--in-process")
    assert (tmp_path / "results" / "published" / "latest" / "published.json").is_file()  # its results written all the same


def test_compaction_main_tiny(tmp_path):
    rows = compaction.main(["--turns", "6", "--initial-tokens", "1000", "--appended-tokens", "500", "--output-tokens", "20",
                            "--tool-seconds", "0.1", "--threshold", "2000"])
    by = {(row["design"], row["compaction"]): row for row in rows}
    assert len(rows) == 2 * len(compaction.DESIGNS)
    for design in compaction.DESIGNS:
        off, on = by[(design, "off")], by[(design, "at 2,000")]
        assert off["compactions"] == 0 < on["compactions"]
        # The task reaches its end either way; with compaction the model reads less (what it
        # prefills depends on the cache: a chained turn after a compaction prefills the summary and
        # what follows, which the prefix cache held before).
        assert on["input_mtok"] < off["input_mtok"]
    # A stateless client resends only the compacted window: it sends less.
    assert by[("http stateless", "at 2,000")]["sent_mb"] < by[("http stateless", "off")]["sent_mb"]
    assert (tmp_path / "compaction" / "latest" / "compaction.csv").exists()


def test_steering_prints_the_table_docs_subagents_quotes_and_only_a_steer_skips_the_tool_round(tmp_path):
    rows = steering.main(["--after", "50", "250"])  # as docs/subagents.md quotes it
    printed = {(row["alternative"], row["after_tokens"]): f"{row['steer_to_token_s']:.3f}" for row in rows}
    doc = (REPO / "docs" / "subagents.md").read_text()
    table = doc.split("| alternative | steer after 50 tokens, s | steer after 250 tokens, s |\n")[1].split("\n\n")[0]
    quoted = {}
    for line in table.splitlines()[1:]:  # below the header's rule
        alternative, after_50, after_250 = (cell.strip() for cell in line.strip().strip("|").split("|"))
        quoted[(alternative.split()[0], 50)], quoted[(alternative.split()[0], 250)] = after_50, after_250
    assert quoted == printed and {alternative for alternative, _ in printed} == set(steering.ALTERNATIVES)
    # Waiting for the tool round pays at least the tool (2 s by default); steering pays only the rest of the item.
    seconds = {(row["alternative"], row["after_tokens"]): row["steer_to_token_s"] for row in rows}
    for after in (50, 250):
        for waiting in ("chained+wait", "v1+append", "http+wait"):
            assert seconds[(waiting, after)] > 2.0 > seconds[("chained+steer", after)] > 0
    assert (tmp_path / "steering" / "latest" / "steering.csv").exists()


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
