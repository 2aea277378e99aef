"""The server one `python -m prototype serve` process runs, and its life: built from the options, announced
(its address, then what a request runs unless it says otherwise and the limits), drained on SIGTERM, stopped
by Ctrl-C in trio's main task, its startup objects kept out of later full garbage collections."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from collections.abc import Awaitable, Callable

import attrs
import trio

from .. import metrics
from ..api.costs import ALL_SWITCHES_OFF, API_PROFILES, ZERO_COSTS, ApiCosts, CacheSwitches
from ..api.render import RenderCache
from ..api.service import ApiService
from ..api.store import ResponseStore
from ..api.workloads import WorkloadCatalog
from ..engine.engine import Engine
from ..engine.latency import FLAGSHIP_TOKENS_PER_S, SPARK_BURST_TOKENS_PER_S, SPARK_TOKENS_PER_S
from ..server.app import ResponsesServer, drain
from ..server.collector import FullCollectionPolicy
from ..server.config import ServerConfig
from .serve_report import AccessLog


def build_server(args: argparse.Namespace, worker: int | None = None) -> ResponsesServer:
    engine_options = {"max_sessions": getattr(args, "engine_sessions", None), "kv_ttl": getattr(args, "kv_ttl", None)}
    api = ApiService(
        engine=Engine(**{name: value for name, value in engine_options.items() if value is not None}),
        render_cache=RenderCache() if args.render_cache_tokens is None else RenderCache(args.render_cache_tokens),
        costs=ZERO_COSTS if args.costs == "zero" else ApiCosts(),
        store=ResponseStore(args.store),
        workloads=WorkloadCatalog(default_workload=args.workload, default_seed=args.seed),
        flush_interval=args.flush_interval,
        flush_tokens=args.flush_tokens,
        sprint=API_PROFILES[args.api_profile],
    )
    server = ResponsesServer(api, server_config(args, worker))
    access_log = None if getattr(args, "quiet", True) else sys.stdout
    max_records = getattr(args, "max_records", None)
    if args.records or access_log is not None or max_records is not None:
        server.records = AccessLog(args.records, access_log, getattr(args, "log_format", "text"), maxlen=max_records or metrics.MAX_CLIENT_RECORDS)
    return server


def server_config(args: argparse.Namespace, worker: int | None = None) -> ServerConfig:
    config = ServerConfig(
        api_keys=frozenset(args.api_key) if args.api_key else None,
        switches=ALL_SWITCHES_OFF if args.switches == "all-off" else CacheSwitches(),
        worker=worker,
    )
    limits = ("suspension_ttl", "connection_lifetime", "max_connections", "max_message_bytes", "max_body_bytes", "max_queued_creates")
    overrides = {name: getattr(args, name) for name in limits if getattr(args, name) is not None}
    return attrs.evolve(config, **overrides)


def announce(args: argparse.Namespace, host: str, port: int, workers: int) -> None:
    suffix = f"  [{workers} workers]" if workers > 1 else ""
    # Tests and scripts parse this first line: keep it first and unchanged. The configuration
    # follows in the same write, so nothing can come between them.
    address = f"listening on http://{host}:{port}  (POST /v1/responses, WebSocket ws://{host}:{port}/v1/responses){suffix}"
    print("\n".join([address, *describe(args)]), flush=True)


def describe(args: argparse.Namespace) -> list[str]:
    """What a request runs unless it says otherwise, and the server's limits: printed at start."""
    config = server_config(args)
    return [
        f"  workload  {args.workload} (seed {args.seed}) unless metadata.testbed_workload / testbed_seed say otherwise",
        f"  speed     by model name: *spark*burst* {SPARK_BURST_TOKENS_PER_S:g} tok/s, *spark* {SPARK_TOKENS_PER_S:g}, "
        f"sim-<N> N, any other name {FLAGSHIP_TOKENS_PER_S:g}; metadata.testbed_decode_tps overrides",
        f"  costs     {args.costs} API stage costs, profile {args.api_profile}, chained cache switches {args.switches}; "
        f"deltas every {args.flush_interval:g} s",
        f"  TTLs      v1 suspension {config.suspension_ttl:g} s, WebSocket connection {config.connection_lifetime:g} s, "
        f"HTTP keep-alive idle {config.http_idle_timeout:g} s",
        f"  limits    {config.max_connections} connections, {config.max_message_bytes} B per WebSocket message, "
        f"{config.max_body_bytes} B per HTTP body, {config.max_queued_creates} queued creates per connection",
        f"  auth      {'any non-empty Bearer key' if config.api_keys is None else f'{len(config.api_keys)} configured key(s)'}",
        f"  store     {args.store}",
    ]


def error(message: str) -> None:
    sys.stderr.write(f"python -m prototype serve: error: {message}\n")


async def drain_on_sigterm(server: ResponsesServer, grace: float, scope: trio.CancelScope) -> None:
    """SIGTERM (what a process manager sends first): drain, then stop (docs/protocol.md)."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            break
    print(f"SIGTERM: draining ({len(server.sessions)} WebSocket connections, {len(server.http_in_flight)} HTTP responses in flight)", flush=True)
    await drain(server, grace)
    print("drained", flush=True)
    scope.cancel()


def run_until_interrupted(main: Callable[[], Awaitable[None]]) -> None:
    """`trio.run(main)`, with Ctrl-C (SIGINT) raised in the main task only, at its next checkpoint.

    By default trio raises KeyboardInterrupt in whatever task is running when the signal arrives.
    In a connection's task it can be lost: trio-websocket's reader task, interrupted in its read as
    the connection closes, closes its channel on the way out with a checkpoint; the connection's
    nursery has been cancelled by then, so that checkpoint raises Cancelled, which replaces the
    KeyboardInterrupt and is absorbed by the nursery, and the server keeps serving
    (trio's documentation of `trio.run`'s `restrict_keyboard_interrupt_to_checkpoints`; the
    hazard is trio issue 1559, which trio-websocket's `_preserve_current_exception` cites). Raised
    in the main task, the interrupt cancels the whole run and reaches the caller."""
    trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)


def settle_collector(args: argparse.Namespace) -> None:
    # Startup objects (modules, the tokenizer's tables, the workload catalog) live for the whole
    # process: keep them out of every later full collection, whose pauses are paid by whichever
    # turns are in flight (docs/speed.md); then keep later full collections to what survived since
    # the last one (prototype/server/collector.py).
    gc.collect()
    gc.freeze()
    if args.gc_unfreeze_every > 0:
        FullCollectionPolicy(unfreeze_every=args.gc_unfreeze_every).install()
