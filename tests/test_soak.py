"""The soak experiment at a tiny size: under faults nothing is lost, and the idle server returns to its baseline.
(Each per-conversation structure's bound, and the `serve` flag that sets it: tests/test_kv_memory.py, tests/test_render.py,
tests/test_cli_serve.py.)"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_faulted_soak_breaks_connections_loses_nothing_and_leaves_the_idle_server_at_its_baseline(results_in_tmp) -> None:
    from experiments import soak

    # Codex's short backoff, so that a few seconds hold several reconnects.
    verdict = soak.main(["--seconds", "4", "--concurrency", "3", "--sample", "1", "--csv", "soak_test.csv", "--faults",
                         "--drop-per-chunk", "0.03", "--policy", "codex"])
    assert verdict["reconnects"] >= 1 and verdict["conversations"] >= 3 and (verdict["lost"], verdict["duplicated"]) == (0, 0)
    # No task, connection or descriptor left behind.
    assert verdict["idle_tasks"] == verdict["baseline_tasks"] > 0
    assert verdict["idle_connections"] == 0 and verdict["idle_fds"] <= verdict["baseline_fds"]
    assert verdict["server_exit_code"] == 0  # SIGTERM drained it
    assert verdict["rss_end_mb"] > 0  # memory is reported; its bound is the real soak's (README)
    assert list(results_in_tmp.rglob("soak_test.csv"))  # results/<experiment>/<run>/, wherever the layout puts it
