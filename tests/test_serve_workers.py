"""`python -m prototype serve --workers N`: N processes on one port sharing one WAL-mode SQLite store, in-process
with `os` a stand-in (fork, the ready pipe, wait statuses, signal handlers), then two real workers on a free port."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import pytest
import trio
import trio.testing
from test_cli_serve import Flushed, assert_stopped, create, open_ws, serve_args, until_terminal

from prototype import workload as wl
from prototype.cli import serve_workers


def test_the_warm_up_runs_one_short_rollout_of_each_design(monkeypatch):
    from prototype import benchmark

    runs = []
    monkeypatch.setattr(benchmark, "run_design_virtual", lambda design, tps, config: runs.append((design, tps, config)))
    serve_workers._warm_up()
    assert [(design, tps) for design, tps, _ in runs] == [(design, 1000.0) for design in benchmark.ALL_DESIGNS]
    for _, _, config in runs:
        (task,) = config.task_list
        assert task == wl.fixed(2, initial_prompt_tokens=200, appended_tokens=20, output_tokens=10, tool_seconds=0.1)


def test_a_reuse_port_socket_is_bound_with_both_reuse_options():
    with serve_workers._reuse_port_socket("127.0.0.1", 0) as sock:
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0


class Exited(Exception):
    pass


class FakeOs:
    """`os` for run_workers: fork gives the next pid from 101 (or 0, the child, when asked), read gives the scripted
    ready bytes, wait the scripted (pid, status) pairs, kill records; the rest is the real `os`."""

    def __init__(self, ready, waits, *, child=False, gone=()):
        self.ready, self.waits, self.child, self.gone = list(ready), list(waits), child, set(gone)
        self.forked, self.killed, self.reads, self.on_wait, self.ready_pipe = [], [], [], None, None

    def __getattr__(self, name):
        return getattr(os, name)

    def pipe(self):
        self.ready_pipe = os.pipe()
        return self.ready_pipe

    def fork(self):
        self.forked.append(101 + len(self.forked))
        return 0 if self.child else self.forked[-1]

    def read(self, fd, n):
        assert fd == self.ready_pipe[0]  # the ready pipe's read end
        self.reads.append(n)
        return self.ready.pop(0) if self.ready else b""

    def wait(self):
        if self.on_wait is not None:
            self.on_wait()
        if not self.waits:
            raise ChildProcessError
        return self.waits.pop(0)

    def kill(self, pid, signum):
        if pid in self.gone:
            raise ProcessLookupError
        self.killed.append((pid, signum))

    def _exit(self, code):
        raise Exited(code)


@pytest.fixture
def workers(monkeypatch):
    """run_workers with the warm-up skipped and its signal handlers recorded, not installed."""
    handlers = {}
    monkeypatch.setattr(serve_workers, "_warm_up", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))

    def with_os(fake):
        monkeypatch.setattr(serve_workers, "os", fake)
        return fake

    return handlers, with_os


EXIT_1 = 256  # os.wait's status of a child that exited with 1


def test_the_workers_are_announced_once_all_listen_and_a_stop_ends_them_even_exiting_non_zero(workers, capsys, tmp_path, monkeypatch):
    handlers, with_os = workers
    fake = with_os(FakeOs([b"1", b"11"], [(102, 0), (101, 0), (103, 0)], gone={103}))
    fake.on_wait = lambda: handlers[signal.SIGINT](signal.SIGINT, None) if not fake.killed else None
    args = serve_args("--workers", "3", "--port", "0", "--quiet")
    assert serve_workers.run_workers(args) == 0
    assert (fake.forked, fake.reads, set(handlers)) == ([101, 102, 103], [3, 3], {signal.SIGINT, signal.SIGTERM})
    assert fake.killed == [(101, signal.SIGINT), (102, signal.SIGINT)]
    out = capsys.readouterr().out.split("\n")
    assert out[0].startswith("listening on http://127.0.0.1:") and out[0].endswith("/v1/responses)  [3 workers]")
    assert int(out[0].split(":")[2].split()[0]) > 0  # the port
    assert out[-2:] == ["stopped", ""]
    # One store for every worker: a temporary file, removed at exit.
    store = args.store
    assert store.endswith("/responses.db") and os.path.basename(os.path.dirname(store)).startswith("testbed-store-")
    assert not os.path.exists(os.path.dirname(store))
    handlers[signal.SIGTERM](signal.SIGTERM, None)
    assert fake.killed[2:] == [(101, signal.SIGTERM), (102, signal.SIGTERM)]  # 103 is gone: skipped
    given = serve_args("--workers", "2", "--port", "0", "--store", str(tmp_path / "s.db"), "--quiet")
    with_os(FakeOs([b"11"], [(101, 0), (102, 0)]))
    assert serve_workers.run_workers(given) == 0 and given.store == str(tmp_path / "s.db")
    assert capsys.readouterr().out.split("\n")[-2] != "stopped"  # ended by themselves: nothing stopped them
    monkeypatch.setattr(sys, "stdout", out := Flushed())
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1), (102, 0)]))
    fake.on_wait = lambda: handlers[signal.SIGTERM](signal.SIGTERM, None) if not fake.killed else None
    assert serve_workers.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 0
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)] and out.getvalue().endswith("stopped\n")
    assert out.flushes == 2  # the announcement, then "stopped": a script reading through a pipe sees each at once


def test_a_worker_that_dies_before_listening_or_fails_while_serving_stops_the_others(workers, capsys):
    _, with_os = workers
    fake = with_os(FakeOs([b"1"], [(102, EXIT_1), (101, 0)]))
    assert serve_workers.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)] and capsys.readouterr().out == ""
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1), (102, 0)]))
    assert serve_workers.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1
    assert fake.killed == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    out = capsys.readouterr().out
    assert out.startswith("listening on ") and "stopped" not in out
    fake = with_os(FakeOs([b"11"], [(101, EXIT_1)]))  # the other already gone: no child left to wait for
    assert serve_workers.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet")) == 1


def test_the_forked_child_runs_its_worker_and_exits_with_its_code(workers, monkeypatch, caplog):
    _, with_os = workers
    fake, ran = with_os(FakeOs([], [], child=True)), []
    monkeypatch.setattr(serve_workers, "_worker", lambda args, index, port, ready: ran.append((args, index, port, ready)) or 5)
    given = serve_args("--workers", "2", "--port", "0", "--quiet")
    with pytest.raises(Exited) as exited:
        serve_workers.run_workers(given)
    assert exited.value.args == (5,)
    ((args, index, port, ready),) = ran
    assert args is given and index == 0 and port > 0 and ready == fake.ready_pipe[1]

    def failing(args, index, port, ready):
        raise RuntimeError("worker broke")

    monkeypatch.setattr(serve_workers, "_worker", failing)
    with pytest.raises(Exited) as exited:
        serve_workers.run_workers(serve_args("--workers", "2", "--port", "0", "--quiet"))
    assert exited.value.args == (1,)
    # The failure is logged with its traceback, naming the worker, by serve's logger.
    (record,) = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert (record.name, record.getMessage()) == ("prototype.cli.serve_workers", "worker 0 failed")
    assert record.exc_info[0] is RuntimeError


def test_a_worker_listens_on_its_own_socket_drains_on_sigterm_says_it_is_ready_and_stops_on_ctrl_c(monkeypatch):
    died, settled, served, drained = [], [], [], []
    monkeypatch.setattr(serve_workers, "_die_with_parent", lambda: died.append(True))
    monkeypatch.setattr(serve_workers, "settle_collector", lambda args: settled.append(args.gc_unfreeze_every))

    async def serve_listeners(handler, listeners, *, task_status):
        (listener,) = listeners
        served.append((handler.__self__, listener.socket.getsockname()))
        task_status.started()
        await trio.testing.wait_all_tasks_blocked()
        raise KeyboardInterrupt

    async def drain_on_sigterm(server, grace, scope):
        drained.append((server, grace, type(scope)))
        await trio.sleep_forever()

    monkeypatch.setattr(trio, "serve_listeners", serve_listeners)
    monkeypatch.setattr(serve_workers, "drain_on_sigterm", drain_on_sigterm)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    read, write = os.pipe()
    try:
        assert serve_workers._worker(serve_args("--quiet", "--gc-unfreeze-every", "9", "--drain-seconds", "7"), 4, 0, write) == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert os.read(read, 10) == b"1"
    os.close(read)
    with pytest.raises(OSError):
        os.close(write)  # the worker closed its end
    ((server, address),) = served
    assert server.config.worker == 4 and address[0] == "127.0.0.1"
    assert drained == [(server, 7.0, trio.CancelScope)] and died == [True] and settled == [9.0]
    with pytest.raises(Exception, match="closed database"):
        server.api.store._db.execute("select 1")


def test_a_worker_asks_the_kernel_to_end_it_with_its_parent(monkeypatch):
    import ctypes

    calls = []

    class Libc:
        def __init__(self, name, use_errno):
            calls.append((name, use_errno))

        def prctl(self, option, signum):
            calls.append((option, signum))

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    serve_workers._die_with_parent()
    assert calls == [(None, True), (1, signal.SIGTERM)]

    def no_libc(name, use_errno):
        raise OSError("no libc")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    serve_workers._die_with_parent()  # not Linux: nothing to ask, and no error


# New connections are spread over the workers by a hash of the client's port: with two workers each
# connect reaches the other worker with probability 1/2, so 40 tries miss it with odds 2**-40.
MAX_CONNECTS = 40


def first_response(ws, **extra) -> dict:
    ws.send(create(**extra))
    events = until_terminal(ws)
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


def connect_to_another_worker(port: int, worker: str):
    """A connection served by a worker other than `worker` (bounded number of tries)."""
    for _ in range(MAX_CONNECTS):
        ws = open_ws(port)
        if ws.response.headers["x-testbed-worker"] != worker:
            return ws
        ws.close()
    pytest.fail(f"{MAX_CONNECTS} connections all reached worker {worker}")


@pytest.mark.slow
def test_a_reconnect_to_another_worker_continues_from_the_shared_store(cli_server, tmp_path):
    store = tmp_path / "responses.db"
    server = cli_server("--costs", "zero", "--workers", "2", "--store", str(store))
    assert server.first_line.rstrip().endswith("[2 workers]")
    with open_ws(server.port) as ws:
        first_worker = ws.response.headers["x-testbed-worker"]
        assert first_worker in ("0", "1")
        stored, unstored = first_response(ws, store=True), first_response(ws, store=False)
    with connect_to_another_worker(server.port, first_worker) as ws:
        # Not in this worker's connection cache, not in the store: not found, as on one server.
        ws.send(create(previous_response_id=unstored["id"], input="next"))
        refused = until_terminal(ws)[-1]
        assert refused["type"] == "error" and refused["error"]["code"] == "previous_response_not_found", refused
        # Stored through the other worker: rebuilt from the shared file, and continued.
        ws.send(create(previous_response_id=stored["id"], input="next", store=True))
        events = until_terminal(ws)
        assert events[-1]["type"] == "response.completed", events[-1]
        assert events[-1]["response"]["previous_response_id"] == stored["id"]
    assert os.path.exists(str(store) + "-wal")  # WAL mode: writers append to the log beside the file
    assert_stopped(server)


@pytest.mark.slow
def test_the_load_experiment_runs_against_two_workers(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments import load

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    rows = load.main(["--sessions", "4", "--turns", "2", "--tool-seconds", "0.05", "--designs", "chained", "--workers", "1", "2"])
    assert [(r["workers"], r["completed"], r["turns"], r["lost"], r["duplicated"]) for r in rows] == [(1, 4, 8, 0, 0), (2, 4, 8, 0, 0)]
    # 4 sessions x 2 turns over (2 modeled turns + one 0.05 s think time)
    modeled = load.reference("chained", *load.task_of(load.LoadRun("chained", 4, 1, 2, 1000, 200, 50, 0.05, 0.0)))
    assert rows[0]["offered_turns_per_s"] == pytest.approx(4 * 2 / (sum(t.ended_at - t.sent_at for t in modeled.turns) + 0.05))
    assert rows[0]["peak_turns_per_s"] == 8  # all 8 requests within one second (no stagger, 0.05 s think)
    assert all(r["server_cpu_ms_per_turn"] > 0 and r["max_open"] == 4 for r in rows)
    assert (tmp_path / "load" / "latest" / "load.csv").exists()  # a new folder per run
