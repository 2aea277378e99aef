"""The compaction experiment runs end to end at a tiny size (its figures are in docs/results.md)."""

from __future__ import annotations

import pytest

from experiments import common, compaction


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)


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
