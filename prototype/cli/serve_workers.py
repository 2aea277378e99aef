"""`python -m prototype serve --workers N` (N > 1): N forked worker processes on one port.

Each worker is a whole server with its own listening socket on the same port (SO_REUSEPORT: the kernel
spreads new connections over them by a hash of the client's address and port) and its own connection to the
shared SQLite store. The parent announces the address once every worker listens, forwards SIGINT and SIGTERM
to them, ends them all if one dies, and exits when they have all ended.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile

import trio

from .. import workload
from .serve_server import announce, build_server, drain_on_sigterm, run_until_interrupted, settle_collector


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
            settle_collector(args)
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
        announce(args, args.host, port, args.workers)
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
