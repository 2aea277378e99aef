"""`python -m prototype serve`: the testbed server on one port, until Ctrl-C."""

from __future__ import annotations

import argparse
import functools
import gc
import logging

import attrs
import trio

from .. import metrics, workload
from ..api.costs import ALL_SWITCHES_OFF, API_PROFILES, ZERO_COSTS, ApiCosts, CacheSwitches
from ..api.service import ApiService
from ..api.store import ResponseStore
from ..api.workloads import WorkloadCatalog
from ..server.app import ResponsesServer, serve_responses
from ..server.config import ServerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default 8000)")
    parser.add_argument("--store", default=":memory:", help="SQLite file of the response store (default: in memory)")
    parser.add_argument("--api-key", action="append", help="accept only this Bearer key (repeatable); default: any non-empty key")
    parser.add_argument("--workload", default=workload.DEFAULT_PRESET, help="default workload when a request names none: a preset or fixed:<turns>")
    parser.add_argument("--seed", type=int, default=0, help="default workload seed")
    parser.add_argument("--costs", choices=["default", "zero"], default="default", help="modeled API stage costs (zero: real CPU work only)")
    parser.add_argument("--api-profile", choices=sorted(API_PROFILES), default="after", help="API profile: before or after the pre-WebSocket single-request speed-ups (default after)")
    parser.add_argument("--switches", choices=["on", "all-off"], default="on", help="the chained cache's four optimizations (all-off: a cache hit costs a full rebuild)")
    # 50 ms by measurement (docs/speed.md, experiments/streaming.py): the lag behind the engine is
    # the same from 2 to 100 ms (the first token goes out at once, the last when ready), and the
    # server's CPU per streamed token falls ~14x from one delta per token.
    parser.add_argument("--flush-interval", type=float, default=0.05, help="coalesce text deltas at most this often, in seconds (default 0.05; 0: one per token)")
    parser.add_argument("--flush-tokens", type=int, default=None, help="with --flush-interval: at most this many tokens per delta (default: no bound)")
    parser.add_argument("--suspension-ttl", type=float, default=None, help="v1 suspension time-to-live in seconds (default 300)")
    parser.add_argument("--connection-lifetime", type=float, default=None, help="WebSocket connection limit in seconds (default 3600)")
    parser.add_argument("--max-connections", type=int, default=None, help="connections served at once; more get 503 (default 10000)")
    parser.add_argument("--max-message-bytes", type=int, default=None, help="largest inbound WebSocket frame; larger closes 1009 (default 16 MiB)")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="largest HTTP request body; larger gets 413 (default 16 MiB)")
    parser.add_argument("--records", default=None, help="also append the server's client records (one per response: transport, design, chaining, appends, bytes, usage) to this JSONL file as they are made")
    parser.add_argument("--max-queued-creates", type=int, default=None, help="response.create frames waiting per connection (default 32)")


def build_server(args: argparse.Namespace) -> ResponsesServer:
    api = ApiService(
        costs=ZERO_COSTS if args.costs == "zero" else ApiCosts(),
        store=ResponseStore(args.store),
        workloads=WorkloadCatalog(default_workload=args.workload, default_seed=args.seed),
        flush_interval=args.flush_interval,
        flush_tokens=args.flush_tokens,
        sprint=API_PROFILES[args.api_profile],
    )
    config = ServerConfig(
        api_keys=frozenset(args.api_key) if args.api_key else None,
        switches=ALL_SWITCHES_OFF if args.switches == "all-off" else CacheSwitches(),
    )
    limits = ("suspension_ttl", "connection_lifetime", "max_connections", "max_message_bytes", "max_body_bytes", "max_queued_creates")
    overrides = {name: getattr(args, name) for name in limits if getattr(args, name) is not None}
    server = ResponsesServer(api, attrs.evolve(config, **overrides))
    if args.records:
        server.records = metrics.ClientRecords(args.records)
    return server


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = build_server(args)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(serve_responses, server, args.port, host=args.host))
            host, port = listeners[0].socket.getsockname()[:2]
            # Startup objects (modules, the tokenizer's tables, the workload catalog) live for the
            # whole process: keep them out of every later full collection, whose pauses are paid by
            # whichever turns are in flight (docs/speed.md).
            gc.collect()
            gc.freeze()
            print(f"listening on http://{host}:{port}  (POST /v1/responses, WebSocket ws://{host}:{port}/v1/responses)", flush=True)

    try:
        trio.run(main)
    except* KeyboardInterrupt:  # trio delivers Ctrl-C through the nursery, inside an exception group
        print("stopped", flush=True)
    finally:
        server.api.store.close()
        server.records.close()
    return 0
