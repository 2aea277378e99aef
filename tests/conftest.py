"""Fixtures for the real-socket tests: the server in-process on a port, or `python -m prototype serve`
as a subprocess. Every wait is bounded, so a broken server fails a test instead of hanging it."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
from multiprocessing import forkserver

import pytest

from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.server.app import ResponsesServer, serve_responses

REPO = pathlib.Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"^listening on http://127\.0\.0\.1:(\d+)\b")
START_TIMEOUT = 60.0  # a hang guard for the first stdout line (imports take about 1 s idle, 15+ s on a loaded machine)
STOP_TIMEOUT = 30.0  # a hang guard, generous for a loaded machine


@pytest.fixture(scope="session", autouse=True)
def sweep_cache(tmp_path_factory):
    """The sweep runner's results cache (prototype/sweep.py) in a folder of this test session, never
    the repository's results/cache: a test computes what it asserts."""
    from prototype.sweep import CACHE_ENV

    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("sweep-cache"))
    yield pathlib.Path(os.environ[CACHE_ENV])
    if saved is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = saved


def _forget_the_parents_fork_server_and_dask_thread() -> None:
    """In a forked child: mutmut runs the tests once in its own process, then each mutant's tests in a
    fork of it, which inherits two things that only the parent can use. multiprocessing's fork server
    (started by the sweep runner's `Processes`) is not the fork's child: `os.waitpid` on it raises
    ChildProcessError, so every pool fails, and its workers would carry the first run's environment, not
    the mutant's. Dask's offload executor (`distributed.utils._offload_executor`, one thread that
    (de)serialises messages) believes its thread runs, but a fork has none, so every Dask map waits
    forever. The child starts its own of each on first use."""
    server = forkserver._forkserver
    server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
    utils = sys.modules.get("distributed.utils")
    if utils is not None:
        utils._offload_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="Dask-Offload")


os.register_at_fork(after_in_child=_forget_the_parents_fork_server_and_dask_thread)


@pytest.fixture
async def live_server(nursery):
    """(server, port): a ResponsesServer with zero API costs on 127.0.0.1, cancelled after the test."""
    server = ResponsesServer(ApiService(costs=ZERO_COSTS))
    listeners = await nursery.start(serve_responses, server, 0)
    return server, listeners[0].socket.getsockname()[1]


class CliServer:
    """`python -m prototype serve --port 0 …` in a subprocess; stdout and stderr are drained by
    threads so no read can block the test."""

    def __init__(self, *args: str, **popen) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prototype", "serve", "--port", "0", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout, self.lines), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr, None), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.first_line = self._first_line()
        match = LISTENING.match(self.first_line)
        if match is None:
            self.kill()
            pytest.fail(f"server did not print its address: {self.first_line!r}\nstderr:\n{''.join(self.stderr)}")
        self.port = int(match.group(1))

    @staticmethod
    def _drain(stream, sink: list[str], lines: queue.Queue | None) -> None:
        for line in stream:
            sink.append(line)
            if lines is not None:
                lines.put(line)
        if lines is not None:
            lines.put(None)

    def _first_line(self) -> str:
        try:
            line = self.lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            self.kill()
            pytest.fail(f"server printed nothing within {START_TIMEOUT} s\nstderr:\n{''.join(self.stderr)}")
        if line is None:  # stdout closed: the process died
            self.proc.wait(timeout=STOP_TIMEOUT)
            self._join()
            pytest.fail(f"server exited with {self.proc.returncode} before listening\nstderr:\n{''.join(self.stderr)}")
        return line

    def _join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=STOP_TIMEOUT)

    def stop(self) -> tuple[int, str, str]:
        """SIGINT, then (exit code, all stdout, all stderr); killed if it ignores the signal."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"server did not stop within {STOP_TIMEOUT} s of SIGINT\nstderr:\n{''.join(self.stderr)}")
        self._join()
        return self.proc.returncode, "".join(self.stdout), "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
        self._join()

    def close(self) -> None:
        """Teardown: SIGINT, and SIGKILL if that is not enough; never fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@pytest.fixture
def cli_server():
    """`start(*args, **popen)` runs `python -m prototype serve --port 0 <args>`; each is stopped at teardown."""
    servers: list[CliServer] = []

    def start(*args: str, **popen) -> CliServer:
        server = CliServer(*args, **popen)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


# The real-engine workers the collected tests use, each launched as collection ends so its start-up
# (most of a minute on two cores, per worker) runs beside the tests before the first that needs it.
BUDGET_BLOCKS = 65  # the budget worker's KV: 64 usable blocks of 32 tokens, 2,048 tokens


def _worker_specs() -> dict:
    from experiments.real_engine_agents import budget_spec
    from prototype.engine.vllm_models import TINY_CPU

    return {"vllm_worker": TINY_CPU, "vllm_budget_worker": budget_spec(BUDGET_BLOCKS)}


_launched: dict = {}  # fixture name -> StartingWorker, or the VllmUnavailable that stopped its launch


def pytest_collection_finish(session):
    from prototype.engine.vllm_client import VllmUnavailable, WorkerProcess

    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ()) if name in ("vllm_worker", "vllm_budget_worker")}
    if wanted and not session.config.option.collectonly:
        specs = _worker_specs()
        for name in sorted(wanted):
            try:
                _launched[name] = WorkerProcess.launch(specs[name])
            except VllmUnavailable as reason:
                _launched[name] = reason


def pytest_sessionfinish(session):
    from prototype.engine.vllm_client import StartingWorker

    for starting in _launched.values():  # launched, never waited for (their tests did not run)
        if isinstance(starting, StartingWorker):
            starting.abandon()


def _ready_worker(name: str):
    """The worker launched for `name` once it is ready (launched here if collection did not). Skips,
    saying why, where no interpreter can import vLLM (docs/real_engine.md installs one), unless
    $TESTBED_REQUIRE_VLLM is set (CI sets it once vLLM is installed): then it fails."""
    from prototype.engine.vllm_client import VllmUnavailable, WorkerProcess

    starting = _launched.pop(name, None)
    try:
        if starting is None:
            starting = WorkerProcess.launch(_worker_specs()[name])
        elif isinstance(starting, VllmUnavailable):
            raise starting
    except VllmUnavailable as reason:
        if os.environ.get("TESTBED_REQUIRE_VLLM"):
            pytest.fail(f"real engine required ($TESTBED_REQUIRE_VLLM) but: {reason}")
        pytest.skip(f"real engine: {reason}")
    return starting.wait_ready()


@pytest.fixture(scope="session")
def vllm_worker():
    """One vLLM worker (prototype/engine/vllm_worker.py, the tiny CPU model) for the whole test
    session, shared by every real-engine test."""
    worker = _ready_worker("vllm_worker")
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def vllm_budget_worker():
    """A vLLM worker of the tiny model with a KV budget of BUDGET_BLOCKS blocks (its context window
    what the budget holds), for the tests of what vLLM does when its KV is full."""
    worker = _ready_worker("vllm_budget_worker")
    yield worker
    worker.stop()


@pytest.fixture(params=["pipe", "rtt-20ms"])
def link(request):
    """The link a WebSocket test runs over: a zero-latency pipe (None), or the 20 ms RTT link (support.DELAYED_LINK)."""
    from support import DELAYED_LINK

    return None if request.param == "pipe" else DELAYED_LINK


@pytest.fixture
def results_in_tmp(tmp_path, monkeypatch):
    """experiments/ write their results folders under tmp_path."""
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return tmp_path
