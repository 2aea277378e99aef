"""A long-running server stays bounded: every per-conversation structure has a bound set by a `serve` flag, and
the soak experiment runs at a tiny size."""

from __future__ import annotations

import argparse

import pytest
import trio
from test_limits import http

from prototype.cli import serve


def flagged_server(*flags: str):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return serve.build_server(parser.parse_args(["--costs", "zero", *flags]))


async def test_http_conversations_leave_bounded_engine_bookkeeping_and_render_cache(autojump_clock, nursery) -> None:
    server = flagged_server("--engine-sessions", "8", "--render-cache-tokens", "3000")
    engine = server.api.engine
    for n in range(40):
        # Distinct conversations: each one a new routing key, a new engine session, new renders.
        body = {"model": "sim-1000", "input": f"conversation {n}: fix the bug", "store": False, "metadata": {"testbed_workload": "fixed:1"}}
        status, response = await http(server, nursery, body)
        assert status == 200 and response["status"] == "completed"
        await trio.sleep(1 if n < 20 else 301)  # from the 21st on, each conversation's KV expires before the next
        assert len(engine._ranks) <= max(8, len(engine.kv) + 1), (n, len(engine._ranks), len(engine.kv))
        assert set(engine._computed) <= set(engine._ranks), set(engine._computed) - set(engine._ranks)
        assert server.api.render_cache.tokens <= 3000
    engine.advance(trio.current_time())
    assert len(engine.kv) <= 1 and 0 < len(engine._ranks) <= 8  # the KV expired, the bookkeeping is bounded
    server.api.store.close()


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
