"""`python -m prototype serve`: the testbed server on one port, until Ctrl-C.

With `--workers N` (N > 1) the process forks N worker processes, each a whole server with its own
listening socket on the same port (SO_REUSEPORT: the kernel spreads new connections over them by a
hash of the client's address and port), so each connection is served entirely by one worker. The
response store is one SQLite file in WAL mode that every worker opens (a temporary file when
--store is left in memory), so a response stored through one worker can be continued with
previous_response_id over a connection another worker serves: that worker rebuilds it from the
store. Every WebSocket handshake answers with `x-testbed-worker: <worker id>`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import attrs
import trio

from .. import metrics, workload
from ..api.costs import ALL_SWITCHES_OFF, API_PROFILES, ZERO_COSTS, ApiCosts, CacheSwitches
from ..api.render import RenderCache
from ..api.service import ApiService
from ..api.store import ResponseStore
from ..api.workloads import WorkloadCatalog, WorkloadNameError
from ..engine.engine import Engine
from ..engine.latency import FLAGSHIP_TOKENS_PER_S, SPARK_BURST_TOKENS_PER_S, SPARK_TOKENS_PER_S
from ..engine.vllm_client import VllmClient, VllmUnavailable, WorkerFailed
from ..engine.vllm_engine import open_vllm_engine
from ..server.app import ResponsesServer, drain, serve_responses
from ..server.collector import DEFAULT_UNFREEZE_EVERY, FullCollectionPolicy
from ..server.config import ServerConfig
from ..server.websocket import CLOSE_HANDSHAKE_SECONDS
from .common import at_least, non_negative, positive
from .engine_options import VLLM, add_engine_arguments, model_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=at_least(0, at_most=65535), default=8000, help="port to bind; 0 picks a free one (default 8000)")
    parser.add_argument("--store", default=":memory:", help="SQLite file of the response store (default: in memory)")
    parser.add_argument("--api-key", action="append", help="accept only this Bearer key (repeatable); default: any non-empty key")
    parser.add_argument("--workload", default=workload.DEFAULT_PRESET, help="default workload when a request names none: a preset or fixed:<turns>")
    parser.add_argument("--seed", type=non_negative(int), default=0, help="default workload seed")
    parser.add_argument("--costs", choices=["default", "zero"], default="default", help="modeled API stage costs (zero: real CPU work only)")
    parser.add_argument("--api-profile", choices=sorted(API_PROFILES), default="after", help="API profile: before or after the pre-WebSocket single-request speed-ups (default after)")
    parser.add_argument("--switches", choices=["on", "all-off"], default="on", help="the chained cache's four optimizations (all-off: a cache hit costs a full rebuild)")
    # 50 ms by measurement (docs/speed.md, experiments/streaming.py): the lag behind the engine is
    # the same from 2 to 100 ms (the first token goes out at once, the last when ready), and the
    # server's CPU per streamed token falls ~14x from one delta per token.
    parser.add_argument("--flush-interval", type=non_negative(float), default=0.05, help="coalesce text deltas at most this often, in seconds (default 0.05; 0: one per token)")
    parser.add_argument("--flush-tokens", type=at_least(1), default=None, help="with --flush-interval: at most this many tokens per delta (default: no bound)")
    parser.add_argument("--suspension-ttl", type=positive(float), default=None, help="v1 suspension time-to-live in seconds (default 300)")
    parser.add_argument("--connection-lifetime", type=positive(float), default=None, help="WebSocket connection limit in seconds (default 3600)")
    parser.add_argument("--max-connections", type=at_least(1), default=None, help="connections served at once; more get 503 (default 10000)")
    parser.add_argument("--max-message-bytes", type=at_least(1), default=None, help="largest inbound WebSocket frame; larger closes 1009 (default 16 MiB)")
    parser.add_argument("--max-body-bytes", type=at_least(1), default=None, help="largest HTTP request body; larger gets 413 (default 16 MiB)")
    parser.add_argument("--records", default=None, help="also append the server's client records (one per response: transport, design, chaining, appends, bytes, usage) to this JSONL file as they are made")
    parser.add_argument("--workers", type=at_least(1), default=1, help="server processes on the one port (SO_REUSEPORT), "
                        "sharing the SQLite response store (default 1)")
    parser.add_argument("--render-cache-tokens", type=non_negative(int), default=None, help="tokens the http design's cross-request render cache holds, least recently used dropped first (default 5000000)")
    parser.add_argument("--engine-sessions", type=at_least(1), default=None, help="sessions whose engine bookkeeping is kept after their KV is gone, least recently seen forgotten first (default 100000)")
    parser.add_argument("--max-records", type=non_negative(int), default=None, help="client records kept in memory, oldest dropped first (default 10000)")
    parser.add_argument("--kv-ttl", type=non_negative(float), default=None, help="seconds an idle prefix-cache KV entry lives (default 300)")
    parser.add_argument("--stats-interval", type=positive(float), default=None, help="print a 'stats {json}' line this often, in seconds: trio tasks, connections, engine and cache sizes (default: never)")
    parser.add_argument("--drain-seconds", type=non_negative(float), default=30.0, help="on SIGTERM: seconds responses in flight get to finish before they are failed (default 30)")
    parser.add_argument("--max-queued-creates", type=at_least(1), default=None, help="response.create frames waiting per connection (default 32)")
    parser.add_argument("--gc-unfreeze-every", type=non_negative(float), default=DEFAULT_UNFREEZE_EVERY,
                        help="freeze the survivors of each full garbage collection and walk everything again this often, in seconds, "
                             f"so a pause does not grow with the sessions held open (default {DEFAULT_UNFREEZE_EVERY:g}; 0: the collector's own schedule)")
    parser.add_argument("--quiet", action="store_true", help="no access log: print only the address and the configuration")
    add_engine_arguments(parser)
    parser.add_argument("--log-format", choices=["text", "json"], default="text", help="access log: one text line (default) or one JSON object per response")


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


def _announce(args: argparse.Namespace, host: str, port: int, workers: int) -> None:
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


class AccessLog(metrics.ClientRecords):
    """The server's client records (`ResponsesServer.records`, also written to `--records` if
    given), printing one line to `out` per record: a finished response (a v1 rollout, a v2 turn, an
    HTTP request) or a refused request or frame."""

    def __init__(self, path: str | None, out: TextIO | None, fmt: str = "text", maxlen: int = metrics.MAX_CLIENT_RECORDS) -> None:
        super().__init__(path, maxlen=maxlen)
        self.out = out
        self.fmt = fmt

    def append(self, record: dict[str, Any]) -> None:
        super().append(record)
        if self.out is None:
            return
        try:
            self.out.write(access_line(record, self.fmt) + "\n")
            self.out.flush()
        except (OSError, ValueError):  # a closed or broken stdout must not fail a response
            pass


def access_line(record: dict[str, Any], fmt: str = "text") -> str:
    """`<time> <transport> <design> <response id> turns=<n> <status> <ms>` (or the same as JSON)."""
    started = record.get("started_at_s")
    elapsed_ms = round(1000 * (record["at_s"] - started), 1) if started is not None else None
    entry = {
        "time": time.strftime("%H:%M:%S"),
        "transport": record.get("transport"),
        "design": record.get("design"),
        "response_id": record.get("response_id"),
        # A v1 rollout is one response over many turns: one per response.append, plus the first.
        "turns": record.get("appends", 0) + 1 if record.get("response_id") else 0,
        "status": record.get("outcome"),
        "ms": elapsed_ms,
        "model": record.get("model"),
    }
    if fmt == "json":
        return json.dumps(entry)
    ms = f"{elapsed_ms:.1f} ms" if elapsed_ms is not None else "-"
    return (f"{entry['time']} {entry['transport']} {entry['design']} {entry['response_id'] or '-'} "
            f"turns={entry['turns']} {entry['status']} {ms} model={entry['model'] or '-'}")


def _error(message: str) -> None:
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


def count_tasks() -> int:
    """Live trio tasks of this run, the root included."""
    count, pending = 0, [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        count += 1
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return count


def stats(server: ResponsesServer) -> dict[str, int]:
    """What a long-running server holds, for experiments/soak.py."""
    engine = server.api.engine
    return {
        "tasks": count_tasks(), "connections": server.connections, "sessions": len(server.sessions),
        "kv_entries": len(engine.kv), "engine_sessions": len(engine._ranks), "render_cache_tokens": server.api.render_cache.tokens,
        "gc_frozen_objects": gc.get_freeze_count(),  # kept out of full collections (server/collector.py)
    }


async def print_stats(server: ResponsesServer, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        print("stats " + json.dumps(stats(server)), flush=True)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a bad --workload fails here, not on the first request
        WorkloadCatalog(default_workload=args.workload, default_seed=args.seed).named(args.workload)
    except WorkloadNameError as error:
        _error(f"--workload: {error}")
        return 2
    if args.workers > 1 and args.engine == VLLM:
        _error("--engine vllm serves from one process: one engine, one server (use --workers 1)")
        return 2
    if args.workers > 1:
        try:
            return run_workers(args)
        except OSError as error:  # the port is taken, or the address is not this machine's
            _error(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}")
            return 1
    try:
        server = build_server(args)
    except sqlite3.Error as error:  # a --store path that cannot be opened (its folder is missing, say)
        _error(f"--store {args.store}: {error}")
        return 2
    except (OSError, ValueError) as error:  # e.g. a --records path that cannot be opened
        _error(str(error))
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
            _settle_collector(args)
            _announce(args, host, port, 1)

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
        _error(f"--engine vllm: {group.exceptions[0]}")
        status = 2
    except* EngineDied as group:
        _error(f"--engine vllm: the engine died ({_first_leaf(group)}); the server stopped with it")
        status = 1
    except* OSError as group:  # the port is taken, or the address is not this machine's
        error = _first_leaf(group)
        _error(f"cannot listen on {args.host}:{args.port}: {getattr(error, 'strerror', None) or error}")
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


def _settle_collector(args: argparse.Namespace) -> None:
    # Startup objects (modules, the tokenizer's tables, the workload catalog) live for the whole
    # process: keep them out of every later full collection, whose pauses are paid by whichever
    # turns are in flight (docs/speed.md); then keep later full collections to what survived since
    # the last one (prototype/server/collector.py).
    gc.collect()
    gc.freeze()
    if args.gc_unfreeze_every > 0:
        FullCollectionPolicy(unfreeze_every=args.gc_unfreeze_every).install()


def _reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _die_with_parent() -> None:
    """Linux prctl(PR_SET_PDEATHSIG, SIGTERM): a worker ends when the parent dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _worker(args: argparse.Namespace, worker: int, port: int, ready: int) -> int:
    """One worker: its own server and SQLite connection (opened after the fork), its own listening
    socket in the port's SO_REUSEPORT group. Writes one byte to `ready` once it listens."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server = build_server(args, worker=worker)
    sock = _reuse_port_socket(args.host, port)
    sock.listen(socket.SOMAXCONN)

    async def main() -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, server.handle_stream, [listener])
            nursery.start_soon(drain_on_sigterm, server, args.drain_seconds, nursery.cancel_scope)
            _settle_collector(args)
            os.write(ready, b"1")
            os.close(ready)

    try:
        run_until_interrupted(main)
    except* KeyboardInterrupt:
        pass
    finally:
        server.api.store.close()
        server.records.close()
    return 0


def _warm_up() -> None:
    """Before forking: load what a worker's first requests would (the tokenizer's tables, lazily
    imported modules and caches) by running one short rollout of each design on a throwaway server
    under a virtual clock. The workers inherit it, sharing the pages, and serve their first turns
    as fast as their later ones."""
    from .. import benchmark

    task = workload.fixed(2, initial_prompt_tokens=200, appended_tokens=20, output_tokens=10, tool_seconds=0.1)
    for design in benchmark.ALL_DESIGNS:
        benchmark.run_design_virtual(design, 1000.0, benchmark.BenchConfig(task_list=(task,)))


def run_workers(args: argparse.Namespace) -> int:
    """Fork `args.workers` workers on one port; forward SIGINT and SIGTERM to them; exit when they
    have all ended (and end them all if one dies)."""
    _warm_up()
    shared_store = None
    if args.store == ":memory:":  # one store for every worker: a temporary file, removed at exit
        shared_store = tempfile.TemporaryDirectory(prefix="testbed-store-")
        args.store = os.path.join(shared_store.name, "responses.db")
    # Bound, never listening: holds the port (and picks it for --port 0) while the workers bind it.
    reservation = _reuse_port_socket(args.host, args.port)
    port = reservation.getsockname()[1]
    ready_read, ready_write = os.pipe()
    pids = []
    for worker in range(args.workers):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                reservation.close()
                os.close(ready_read)
                code = _worker(args, worker, port, ready_write)
            except BaseException:  # noqa: BLE001 - reported, and the parent ends the others
                logging.getLogger(__name__).exception("worker %d failed", worker)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    os.close(ready_write)
    stopping = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    ready = 0
    while ready < args.workers:
        data = os.read(ready_read, args.workers)
        if not data:  # every worker closed its end: at least one died before listening
            break
        ready += len(data)
    os.close(ready_read)
    if ready == args.workers:
        _announce(args, args.host, port, args.workers)
    else:
        forward(signal.SIGTERM, None)
    failed = ready < args.workers
    alive = set(pids)
    while alive:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        alive.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0 and not stopping:
            failed = True
            forward(signal.SIGTERM, None)
    reservation.close()
    if shared_store is not None:
        shared_store.cleanup()
    if stopping and not failed:
        print("stopped", flush=True)
    return 1 if failed else 0
