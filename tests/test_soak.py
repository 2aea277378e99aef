"""A long-running server stays bounded (issue 15): every per-conversation structure has a bound
set by a `serve` flag, and the soak experiment runs at a tiny size."""

from __future__ import annotations

import argparse

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
