"""The trio side of the vLLM boundary: find the interpreter that has vLLM, start the worker
(vllm_worker.py) in its own process, and talk to it in JSON lines.

vLLM's engine is asyncio (`AsyncLLM`, which itself runs its engine core in another process); the
testbed is trio. They meet at a pipe: the worker reads requests on stdin and writes events on
stdout, one JSON object a line, as vLLM's own front end and engine core exchange messages. The
client here is a reader task that routes each event to the request it belongs to.

Two ways to own the process: `open_vllm_process` (trio.open_process, for a command that runs
in one trio.run) and `WorkerProcess` (subprocess, for a test session that shares one engine
across many trio.run calls; each run attaches to its pipes with `VllmClient.over_fds`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import trio
import trio.lowlevel

from .vllm_models import ModelSpec, write_model

WORKER_SCRIPT = Path(__file__).with_name("vllm_worker.py")
PYTHON_ENV = "TESTBED_VLLM_PYTHON"
# Where `.ci/run` and docs/real_engine.md install the CPU build of vLLM: outside the repository.
DEFAULT_VENV = Path.home() / ".cache" / "testbed" / "vllm-venv"
# Start-up measured at 2-3 minutes on a busy 2-core machine (docs/real_engine.md); the caller's
# bound for a worker that never says it is ready.
START_TIMEOUT_S = 900.0
# Events waiting per request before the reader blocks: one per sampled token at most.
EVENT_BUFFER = 100_000
MAX_LINE_BYTES = 64 * 1024 * 1024  # the largest event or request: a long prompt's ids as JSON
# On stopping, how long the worker has to exit after the shutdown request, then after SIGTERM
# before it is killed; named so that the tests of stopping (tests/test_vllm_client.py)
# can shorten them.
SHUTDOWN_WAIT_S = 30.0
TERMINATE_WAIT_S = 10.0


class VllmUnavailable(Exception):
    """No interpreter that can import vLLM was found."""


class WorkerFailed(Exception):
    """The vLLM worker reported an error, or exited."""


def vllm_python(explicit: str | os.PathLike | None = None) -> Path:
    """The interpreter that runs the worker: `explicit`, else $TESTBED_VLLM_PYTHON, else this one if
    it can import vllm, else the virtual environment in ~/.cache/testbed/vllm-venv.

    Raises VllmUnavailable, saying what was tried, when none exists."""
    for candidate in (explicit, os.environ.get(PYTHON_ENV)):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.exists():
                raise VllmUnavailable(f"{path} does not exist")
            return path
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    default = DEFAULT_VENV / "bin" / "python"
    if default.exists():
        return default
    raise VllmUnavailable(
        f"no interpreter with vLLM: this one cannot import vllm, ${PYTHON_ENV} is unset and {default} does not exist "
        "(docs/real_engine.md installs it)"
    )


def worker_command(python: Path, settings: dict[str, Any]) -> list[str]:
    return [str(python), str(WORKER_SCRIPT), json.dumps(settings)]


def worker_environment(spec: ModelSpec) -> dict[str, str]:
    env = dict(os.environ)
    if spec.cpu_kv_cache_gib is not None:
        # vLLM's CPU backend sizes its KV cache from this variable (GiB), not from a memory share.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.cpu_kv_cache_gib))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Forced decoding's logits processor (vllm_forced.py) implements the logits-processor interface of
    # vLLM's V1 model runner, the one its CPU backend runs; on a GPU with Triton vLLM 0.32 would pick
    # Model Runner V2, whose processors have an interface of their own and which refuses V1's.
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def worker_settings(spec: ModelSpec, model_dir: Path) -> dict[str, Any]:
    return {"model": str(model_dir), **spec.engine_settings()}


# --- the protocol (sans-IO) ----------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


@attrs.define(eq=False)
class LineSplitter:
    """Bytes in, complete JSON objects out (the worker writes one per line)."""

    _pending: bytearray = attrs.Factory(bytearray)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._pending += data
        if len(self._pending) > MAX_LINE_BYTES and b"\n" not in self._pending:
            raise WorkerFailed(f"a line from the worker exceeds {MAX_LINE_BYTES} bytes")
        *lines, rest = self._pending.split(b"\n")
        self._pending = bytearray(rest)
        return [json.loads(line) for line in lines if line.strip()]


@attrs.frozen
class Ready:
    """What the worker says once its engine is up."""

    vocab_size: int
    block_size: int
    kv_blocks: int
    startup_s: float
    vllm_version: str
    device: str

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Ready:
        if event.get("type") == "error":
            raise WorkerFailed(event.get("message", "the worker failed"))
        if event.get("type") != "ready":
            raise WorkerFailed(f"expected the worker's ready event, got {event!r}")
        return cls(*(event[name] for name in ("vocab_size", "block_size", "kv_blocks", "startup_s", "vllm_version", "device")))


# --- the client ----------------------------------------------------------------------------------


@attrs.define(eq=False)
class VllmClient:
    """Requests to the worker, and a reader task that routes its events: per request id to that
    request's channel, counters replies to their waiter."""

    send_stream: trio.abc.SendStream
    receive_stream: trio.abc.ReceiveStream
    ready: Ready
    _requests: dict[str, trio.MemorySendChannel] = attrs.Factory(dict)
    _waiters: dict[int, trio.MemorySendChannel] = attrs.Factory(dict)
    _tags: int = 0
    _send_lock: trio.Lock = attrs.Factory(trio.Lock)
    _failure: str | None = None
    died: trio.Event = attrs.Factory(trio.Event)  # set when the worker has failed or exited: every request fails from then on

    @property
    def failure(self) -> str | None:
        """Why the worker is gone (None while it serves)."""
        return self._failure

    async def send(self, message: dict[str, Any]) -> None:
        if self._failure is not None:
            raise WorkerFailed(self._failure)
        async with self._send_lock:
            await self.send_stream.send_all(encode(message))

    def _open(self, rid: str) -> trio.MemoryReceiveChannel:
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already open")
        send, receive = trio.open_memory_channel(EVENT_BUFFER)
        self._requests[rid] = send
        return receive

    async def generate(self, rid: str, prompt: list[int], max_tokens: int, *, forced: list[int] | None = None,
                       salt: str | None = None, held: bool = False) -> trio.MemoryReceiveChannel:
        """A new engine request; its events (tokens, chunk_done, error, finished) arrive on the
        returned channel, which closes after `finished`. `forced`: the ids it samples (its plan)."""
        events = self._open(rid)
        await self.send({"op": "generate", "rid": rid, "prompt": prompt, "max_tokens": max_tokens, "forced": forced,
                         "salt": salt, "held": held})
        return events

    async def append(self, rid: str, ids: list[int], max_tokens: int, *, forced: list[int] | None = None) -> None:
        await self.send({"op": "append", "rid": rid, "prompt": ids, "max_tokens": max_tokens, "forced": forced})

    async def close(self, rid: str) -> None:
        await self.send({"op": "close", "rid": rid})

    async def abort(self, rid: str) -> None:
        await self.send({"op": "abort", "rid": rid})

    async def counters(self, *, reset_peak: bool = False) -> dict[str, Any]:
        """vLLM's cumulative counters (vllm_worker.Counters); `reset_peak` restarts the KV peak after reading it."""
        self._tags += 1
        tag = self._tags
        send, receive = trio.open_memory_channel(1)
        self._waiters[tag] = send
        await self.send({"op": "counters", "tag": tag, "reset_peak": reset_peak})
        return (await receive.receive())["counters"]

    async def shutdown(self) -> None:
        await self.send({"op": "shutdown"})

    def open_requests(self) -> list[str]:
        """The ids of the requests not yet finished (an experiment aborts them after stopping a run)."""
        return list(self._requests)

    def dispatch(self, event: dict[str, Any]) -> None:
        """Route one event from the worker."""
        if event.get("type") == "counters":
            waiter = self._waiters.pop(event.get("tag"), None)
            if waiter is not None:
                waiter.send_nowait(event)
            return
        rid = event.get("rid")
        channel = self._requests.get(rid)  # None for an event of no open request, or of none (rid null)
        if channel is None:
            if event.get("type") == "error":
                self._fail(event.get("message", "worker error"))
            return
        channel.send_nowait(event)
        if event.get("type") == "finished":
            del self._requests[rid]
            channel.close()

    def _fail(self, reason: str) -> None:
        self._failure = reason
        self.died.set()
        for rid, channel in list(self._requests.items()):
            channel.send_nowait({"type": "error", "rid": rid, "message": reason})
            channel.send_nowait({"type": "finished", "rid": rid})
            channel.close()
        self._requests.clear()

    async def read_events(self) -> None:
        """The reader task: runs until the worker's stdout ends, then fails what is open."""
        splitter = LineSplitter()
        while data := await self.receive_stream.receive_some(1 << 16):
            for event in splitter.feed(data):
                self.dispatch(event)
        self._fail("the vLLM worker exited")

    @classmethod
    @asynccontextmanager
    async def over_streams(cls, send_stream: trio.abc.SendStream, receive_stream: trio.abc.ReceiveStream,
                           ready: Ready | None = None) -> AsyncIterator[VllmClient]:
        """A client on a worker's pipes; reads its ready event first unless `ready` is known."""
        if ready is None:
            ready, leftover = await _read_ready(receive_stream)
        else:
            leftover = b""
        client = cls(send_stream, receive_stream, ready)
        async with trio.open_nursery() as nursery:
            if leftover:
                for event in LineSplitter().feed(leftover):
                    client.dispatch(event)
            nursery.start_soon(client.read_events)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()

    @classmethod
    @asynccontextmanager
    async def over_fds(cls, process: WorkerProcess) -> AsyncIterator[VllmClient]:
        """A client, inside one trio.run, on the pipes of a worker started outside it."""
        assert process.popen.stdin is not None and process.popen.stdout is not None
        send = trio.lowlevel.FdStream(os.dup(process.popen.stdin.fileno()))
        receive = trio.lowlevel.FdStream(os.dup(process.popen.stdout.fileno()))
        async with send, receive, cls.over_streams(send, receive, process.ready) as client:
            yield client


async def _read_ready(stream: trio.abc.ReceiveStream) -> tuple[Ready, bytes]:
    pending = bytearray()
    while b"\n" not in pending:
        data = await stream.receive_some(1 << 16)
        if not data:
            raise WorkerFailed("the vLLM worker exited before its engine was ready (its log says why)")
        pending += data
    line, _, rest = bytes(pending).partition(b"\n")
    return Ready.from_event(json.loads(line)), rest


def _log_file(path: Path) -> BinaryIO:
    """The worker's stderr (vLLM's own log), appended to; opened once, before the process starts."""
    return open(path, "ab")  # the caller's with-block closes it


@asynccontextmanager
async def open_vllm_process(spec: ModelSpec, *, python: str | os.PathLike | None = None,
                            log_path: Path | None = None) -> AsyncIterator[VllmClient]:
    """Start the worker with trio.open_process and yield a client once its engine is ready; on exit
    the worker is asked to shut down, then terminated if it does not."""
    interpreter = vllm_python(python)
    model_dir = write_model(spec)
    log_path = log_path if log_path is not None else model_dir / "worker.log"
    with _log_file(log_path) as log:
        process = await trio.lowlevel.open_process(
            worker_command(interpreter, worker_settings(spec, model_dir)), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, env=worker_environment(spec),
        )
        try:
            assert process.stdin is not None and process.stdout is not None
            with trio.fail_after(START_TIMEOUT_S):
                ready, leftover = await _read_ready(process.stdout)
            async with VllmClient.over_streams(process.stdin, process.stdout, ready) as client:
                if leftover:
                    for event in LineSplitter().feed(leftover):
                        client.dispatch(event)
                try:
                    yield client
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_WAIT_S):
                        try:
                            await client.shutdown()
                        except (WorkerFailed, trio.BrokenResourceError, trio.ClosedResourceError):
                            pass
                        await process.wait()
        finally:
            if process.returncode is None:
                process.terminate()
                with trio.CancelScope(shield=True), trio.move_on_after(TERMINATE_WAIT_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


@attrs.define(eq=False)
class WorkerProcess:
    """A worker owned outside trio (a test session's one engine): started with subprocess, ready
    when `start` returns, attached to from each trio.run with `VllmClient.over_fds`."""

    popen: subprocess.Popen
    ready: Ready
    log_path: Path

    @classmethod
    def start(cls, spec: ModelSpec, *, python: str | os.PathLike | None = None) -> WorkerProcess:
        return cls.launch(spec, python=python).wait_ready()

    @classmethod
    def launch(cls, spec: ModelSpec, *, python: str | os.PathLike | None = None) -> StartingWorker:
        """The worker's process, started and not waited for: its start-up (most of a minute on two
        cores) runs while the caller does other work."""
        interpreter = vllm_python(python)
        model_dir = write_model(spec)
        log_path = model_dir / "worker.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                worker_command(interpreter, worker_settings(spec, model_dir)), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=worker_environment(spec), bufsize=0,
            )
        return StartingWorker(popen, log_path)

    def stop(self) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(encode({"op": "shutdown"}))
            self.popen.stdin.flush()
            self.popen.wait(timeout=SHUTDOWN_WAIT_S)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            _terminate(self.popen)


@attrs.define(eq=False)
class StartingWorker:
    """A worker process launched by `WorkerProcess.launch`, until it says it is ready."""

    popen: subprocess.Popen
    log_path: Path

    def wait_ready(self) -> WorkerProcess:
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            self.popen.wait()
            raise WorkerFailed(f"the vLLM worker exited ({self.popen.returncode}) before it was ready; see {self.log_path}")
        return WorkerProcess(self.popen, Ready.from_event(json.loads(line)), self.log_path)

    def abandon(self) -> None:
        """Stop a worker no one waited for (it may still be starting, so it is not asked to shut down)."""
        _terminate(self.popen)


def _terminate(popen: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the process has not ended within TERMINATE_WAIT_S."""
    popen.terminate()
    try:
        popen.wait(timeout=TERMINATE_WAIT_S)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
