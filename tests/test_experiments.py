"""Every experiment's main() at a tiny size, and the main job's command."""

from __future__ import annotations

import json

import pytest

from experiments import history_cpu, published, virtual_vs_real
from prototype.__main__ import main as cli_main


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return tmp_path


def test_compare_writes_table_figure_and_traces(tmp_path, capsys):
    out = tmp_path / "compare"
    assert cli_main(["compare", "--tasks", "1", "--speeds", "1000", "--turns", "3", "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for design in ("http", "chained", "suspended"):
        assert design in printed
    assert "f_ws" in printed and "tokens/s" in printed  # the parameters, with sources
    table = json.loads((out / "compare.json").read_text())["table"]
    assert {(r["design"], r["decode_tps"]) for r in table} == {("http", 1000.0), ("chained", 1000.0), ("suspended", 1000.0)}
    http = next(r for r in table if r["design"] == "http")
    assert http["speedup_vs_http"] == 1.0
    assert (out / "compare.png").stat().st_size > 10_000
    trace = json.loads((out / "trace_suspended.json").read_text())["traceEvents"]
    spans = {e["name"] for e in trace if e["ph"] == "X"}
    assert {"turn", "time_to_first_token", "validate", "prefill", "decode", "post"} <= spans
    assert all(e["dur"] >= 0 for e in trace if e["ph"] == "X")


def test_published_marks_one_calibration_row_and_solves_implied_overheads(capsys):
    result = published.main(["--tasks", "1", "--rows", "0", "4", "--trend-turns", "4"])
    rows = result["rows"]
    assert [r["role"] for r in rows] == ["calibration", "check"]
    assert rows[0]["implied_vs_calibration"] == "calibration"
    assert rows[1]["implied_vs_calibration"].endswith(("agrees", "DISAGREES"))
    for r in rows:
        assert r["implied_ms_per_turn"] > 0
    assert [t["tok_s"] for t in result["trends"]] == [65.0, 1000.0, 4000.0]
    assert "calibration" in capsys.readouterr().out


def test_history_cpu_runs_at_a_tiny_size():
    rows = history_cpu.main(["--histories", "1000", "4000", "--turns", "3", "--rounds", "1"])
    assert {r["design"] for r in rows} == {"suspended", "chained", "chained, switches off"}
    assert all(r["turns_measured"] == 2 and r["cpu_ms_per_turn_median"] > 0 for r in rows)


def test_virtual_and_real_time_agree_on_the_small_configuration():
    rows = virtual_vs_real.main([])
    for row in rows:
        assert 0.95 <= row["ratio_real_over_virtual"] <= 1.05, row
