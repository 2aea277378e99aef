"""`python -m prototype serve`: the testbed server on one port, until Ctrl-C.

With `--workers N` (N > 1) the process forks N worker processes, each a whole server with its own
listening socket on the same port (SO_REUSEPORT: the kernel spreads new connections over them by a
hash of the client's address and port), so each connection is served entirely by one worker. The
response store is one SQLite file in WAL mode that every worker opens (a temporary file when
--store is left in memory), so a response stored through one worker can be continued with
previous_response_id over a connection another worker serves: that worker rebuilds it from the
store. Every WebSocket handshake answers with `x-testbed-worker: <worker id>`.

This module holds the options and the one-process run; cli/serve_server.py the server they build and its
life, cli/serve_report.py the access log and stats, cli/serve_workers.py the forked workers. A help text
is wording, not behaviour: its line is left out of mutation testing (`# pragma: no mutate`); the defaults
it states are held by a test to the ones a server runs with.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import signal
import sqlite3

import trio

from .. import workload
from ..api.costs import API_PROFILES
from ..api.workloads import WorkloadCatalog, WorkloadNameError
from ..engine.vllm_client import VllmClient, VllmUnavailable, WorkerFailed
from ..engine.vllm_engine import open_vllm_engine
from ..server.app import ResponsesServer, drain, serve_responses
from ..server.collector import DEFAULT_UNFREEZE_EVERY
from ..server.websocket import CLOSE_HANDSHAKE_SECONDS
from .common import at_least, non_negative, positive
from .engine_options import VLLM, add_engine_arguments, model_spec
from .serve_report import access_line, print_stats  # noqa: F401 - access_line: serve's name, as before its split
from .serve_server import announce, build_server, drain_on_sigterm, error, run_until_interrupted, settle_collector
from .serve_workers import run_workers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host",
                        help="address to bind (default 127.0.0.1)",  # pragma: no mutate
                        default="127.0.0.1")
    parser.add_argument("--port",
                        help="port to bind; 0 picks a free one (default 8000)",  # pragma: no mutate
                        type=at_least(0, at_most=65535), default=8000)
    parser.add_argument("--store",
                        help="SQLite file of the response store (default: in memory)",  # pragma: no mutate
                        default=":memory:")
    parser.add_argument("--api-key",
                        help="accept only this Bearer key (repeatable); default: any non-empty key",  # pragma: no mutate
                        action="append")
    parser.add_argument("--workload",
                        help="default workload when a request names none: a preset or fixed:<turns>",  # pragma: no mutate
                        default=workload.DEFAULT_PRESET)
    parser.add_argument("--seed",
                        help="default workload seed",  # pragma: no mutate
                        type=non_negative(int), default=0)
    parser.add_argument("--costs",
                        help="modeled API stage costs (zero: real CPU work only)",  # pragma: no mutate
                        choices=["default", "zero"], default="default")
    parser.add_argument("--api-profile",
                        help="API profile: before or after the pre-WebSocket single-request speed-ups (default after)",  # pragma: no mutate
                        choices=sorted(API_PROFILES), default="after")
    parser.add_argument("--switches",
                        help="the chained cache's four optimizations (all-off: a cache hit costs a full rebuild)",  # pragma: no mutate
                        choices=["on", "all-off"], default="on")
    # 50 ms by measurement (docs/speed.md, experiments/streaming.py): the lag behind the engine is
    # the same from 2 to 100 ms (the first token goes out at once, the last when ready), and the
    # server's CPU per streamed token falls ~14x from one delta per token.
    parser.add_argument("--flush-interval",
                        help="coalesce text deltas at most this often, in seconds (default 0.05; 0: one per token)",  # pragma: no mutate
                        type=non_negative(float), default=0.05)
    parser.add_argument("--flush-tokens",
                        help="with --flush-interval: at most this many tokens per delta (default: no bound)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--suspension-ttl",
                        help="v1 suspension time-to-live in seconds (default 300)",  # pragma: no mutate
                        type=positive(float), default=None)
    parser.add_argument("--connection-lifetime",
                        help="WebSocket connection limit in seconds (default 3600)",  # pragma: no mutate
                        type=positive(float), default=None)
    parser.add_argument("--max-connections",
                        help="connections served at once; more get 503 (default 10000)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--max-message-bytes",
                        help="largest inbound WebSocket frame; larger closes 1009 (default 16 MiB)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--max-body-bytes",
                        help="largest HTTP request body; larger gets 413 (default 16 MiB)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--records",
                        help="also append the server's client records (one per response: transport, design, "  # pragma: no mutate
                             "chaining, appends, bytes, usage) to this JSONL file as they are made",  # pragma: no mutate
                        default=None)
    parser.add_argument("--workers",
                        help="server processes on the one port (SO_REUSEPORT), "  # pragma: no mutate
                             "sharing the SQLite response store (default 1)",  # pragma: no mutate
                        type=at_least(1), default=1)
    parser.add_argument("--render-cache-tokens",
                        help="tokens the http design's cross-request render cache holds, "  # pragma: no mutate
                             "least recently used dropped first (default 5000000)",  # pragma: no mutate
                        type=non_negative(int), default=None)
    parser.add_argument("--engine-sessions",
                        help="sessions whose engine bookkeeping is kept after their KV is gone, "  # pragma: no mutate
                             "least recently seen forgotten first (default 100000)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--max-records",
                        help="client records kept in memory, oldest dropped first (default 10000)",  # pragma: no mutate
                        type=non_negative(int), default=None)
    parser.add_argument("--kv-ttl",
                        help="seconds an idle prefix-cache KV entry lives (default 300)",  # pragma: no mutate
                        type=non_negative(float), default=None)
    parser.add_argument("--stats-interval",
                        help="print a 'stats {json}' line this often, in seconds: trio tasks, connections, "  # pragma: no mutate
                             "engine and cache sizes (default: never)",  # pragma: no mutate
                        type=positive(float), default=None)
    parser.add_argument("--drain-seconds",
                        help="on SIGTERM: seconds responses in flight get to finish before they are failed (default 30)",  # pragma: no mutate
                        type=non_negative(float), default=30.0)
    parser.add_argument("--max-queued-creates",
                        help="response.create frames waiting per connection (default 32)",  # pragma: no mutate
                        type=at_least(1), default=None)
    parser.add_argument("--gc-unfreeze-every",
                        help="freeze the survivors of each full garbage collection and walk everything again "  # pragma: no mutate
                             "this often, in seconds, so a pause does not grow with the sessions held open "  # pragma: no mutate
                             f"(default {DEFAULT_UNFREEZE_EVERY:g}; 0: the collector's own schedule)",
                        type=non_negative(float), default=DEFAULT_UNFREEZE_EVERY)
    parser.add_argument("--quiet",
                        help="no access log: print only the address and the configuration",  # pragma: no mutate
                        action="store_true")
    add_engine_arguments(parser)
    parser.add_argument("--log-format",
                        help="access log: one text line (default) or one JSON object per response",  # pragma: no mutate
                        choices=["text", "json"], default="text")


class EngineDied(Exception):
    """`--engine vllm`: the engine's worker failed or exited; every request would fail from here on."""


async def stop_when_engine_dies(server: ResponsesServer, client: VllmClient) -> None:
    """A server whose engine is gone stops rather than failing every request: once the worker has died
    (the client's `died`), the connections are closed as a drain closes them (no grace: the responses in
    flight have already failed with the engine), then EngineDied ends the run with the worker's reason."""
    await client.died.wait()
    with trio.move_on_after(CLOSE_HANDSHAKE_SECONDS):  # a client that never answers the close cannot hold the exit
        await drain(server, 0.0)
    raise EngineDied(client.failure or "the vLLM worker failed")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a bad --workload fails here, not on the first request
        WorkloadCatalog(default_workload=args.workload, default_seed=args.seed).named(args.workload)
    except WorkloadNameError as e:
        error(f"--workload: {e}")
        return 2
    if args.workers > 1 and args.engine == VLLM:
        error("--engine vllm serves from one process: one engine, one server (use --workers 1)")
        return 2
    if args.workers > 1:
        try:
            return run_workers(args)
        except OSError as e:  # the port is taken, or the address is not this machine's
            error(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
            return 1
    try:
        server = build_server(args)
    except sqlite3.Error as e:  # a --store path that cannot be opened (its folder is missing, say)
        error(f"--store {args.store}: {e}")
        return 2
    except (OSError, ValueError) as e:  # e.g. a --records path that cannot be opened
        error(str(e))
        return 2

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            if args.engine == VLLM:
                print(f"starting vLLM ({args.vllm_model}); this takes minutes on a CPU", flush=True)
                server.api.engine = await stack.enter_async_context(open_vllm_engine(model_spec(args), python=args.vllm_python))
                ready = server.api.engine.client.ready
                print(f"vLLM {ready.vllm_version} ready on {ready.device} in {ready.startup_s:.0f} s", flush=True)
            await serve_on()

    async def serve_on() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(serve_responses, server, args.port, host=args.host))
            host, port = listeners[0].socket.getsockname()[:2]
            nursery.start_soon(drain_on_sigterm, server, args.drain_seconds, nursery.cancel_scope)
            if args.engine == VLLM:
                nursery.start_soon(stop_when_engine_dies, server, server.api.engine.client)
            if args.stats_interval:
                nursery.start_soon(print_stats, server, args.stats_interval)
            settle_collector(args)
            announce(args, host, port, 1)

    status = 0
    # A command started in the background by a non-interactive shell inherits SIGINT ignored (POSIX,
    # "Signals and Error Handling" of the Shell Command Language), and trio then leaves it ignored:
    # serve stops on SIGINT however it was started, as its help says.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_until_interrupted(main)
    except* KeyboardInterrupt:  # trio delivers Ctrl-C through the nursery, inside an exception group
        print("stopped", flush=True)
    except* (VllmUnavailable, WorkerFailed) as group:
        error(f"--engine vllm: {group.exceptions[0]}")
        status = 2
    except* EngineDied as group:
        error(f"--engine vllm: the engine died ({_first_leaf(group)}); the server stopped with it")
        status = 1
    except* OSError as group:  # the port is taken, or the address is not this machine's
        leaf = _first_leaf(group)
        error(f"cannot listen on {args.host}:{args.port}: {getattr(leaf, 'strerror', None) or leaf}")
        status = 1
    finally:
        server.api.store.close()
        server.records.close()
    return status


def _first_leaf(group: BaseException) -> BaseException:
    """The first exception of a (nested) exception group: the one the run ended with."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group
