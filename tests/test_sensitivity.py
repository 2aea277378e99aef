"""experiments.sensitivity at a tiny size: one-at-a-time and Morris runs, the table, the claims, the tornado figure."""

from __future__ import annotations

import pytest

from experiments import sensitivity


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return tmp_path


def test_sensitivity_sweeps_each_range_and_names_what_drives_each_conclusion(capsys):
    result = sensitivity.main(["--turns", "2", "--speeds", "1000", "--params", "t_fixed_pre", "f_ws",
                               "--trajectories", "2", "--in-process", "--no-cache"])
    oat = result["oat"]
    assert list(oat) == ["default", "t_fixed_pre low", "t_fixed_pre high", "f_ws low", "f_ws high"]
    ttft_http = "TTFT http @1000"
    # http pays the whole fixed pre-inference cost on every turn, and none of it depends on f_ws: 100 to
    # 400 ms moves every turn's TTFT, and so its median, by exactly 300 ms.
    assert oat["t_fixed_pre high"][ttft_http] - oat["t_fixed_pre low"][ttft_http] == pytest.approx(300.0, abs=1e-6)
    assert oat["f_ws low"][ttft_http] == oat["f_ws high"][ttft_http] == oat["default"][ttft_http]
    # A chained turn served from the connection cache pays f_ws of it: a higher f_ws, a later first token.
    assert oat["f_ws low"]["TTFT chained @1000"] < oat["default"]["TTFT chained @1000"] < oat["f_ws high"]["TTFT chained @1000"]
    # No API cost changes what a design sends.
    assert len({v["upload http"] for v in oat.values()}) == 1
    assert len(result["global"]) == 2 * (2 + 1)  # Morris: r (k + 1) runs
    mu_star = result["indices"][ttft_http]["mu_star"]
    assert mu_star[1] == 0 and mu_star[0] == pytest.approx(0.3 * 1000)  # ms per full range of t_fixed_pre
    rows = {r["conclusion"]: r for r in result["table"]}
    assert rows[ttft_http]["drivers (mu_star)"] == "t_fixed_pre (300)"
    assert rows["upload http"]["drivers (mu_star)"] == "none"
    claims = {c["claim"]: c for c in result["claims"]}
    assert claims["upload v1 < v2 < http"]["holds in"] == "11 of 11 runs"
    assert (result["folder"] / "tornado.png").stat().st_size > 10_000
    assert (result["folder"] / "sensitivity.csv").read_text().startswith("conclusion,unit,default")
    printed = capsys.readouterr().out
    assert "What holds in every run" in printed and "t_fixed_pre" in printed
