"""Starting and stopping the vLLM worker's process (`WorkerProcess.start`, `.stop`, and
`open_vllm_process` with its log file) against stand-in workers (docs/mutation.md). Each stand-in is a
small script written by the test into tmp_path and passed as the interpreter (`python=`): it is run as
`<python> vllm_worker.py <settings>`, so it sees the worker's command line, environment, stdin, stdout
and stderr as vLLM's worker would, and behaves as the test scripts it: it says it is ready and obeys
the shutdown request, or exits before its ready line, or ignores the request, SIGTERM, or its stdin.
Nothing here needs vLLM. Every stand-in ends itself (SIGALRM, `LIFETIME` seconds) so that no test can
hang on one; a test's own steps take a fraction of that."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from prototype.engine import vllm_client, vllm_models
from prototype.engine.vllm_client import (
    PYTHON_ENV,
    WORKER_SCRIPT,
    Ready,
    WorkerFailed,
    WorkerProcess,
    open_vllm_process,
    worker_settings,
)
from prototype.engine.vllm_models import TINY_CPU, write_model

# The hang guard: a stand-in ends itself (SIGALRM) this long after it starts, whatever it was doing.
LIFETIME = 10
READY = {"type": "ready", "vocab_size": 128256, "block_size": 32, "kv_blocks": 2048, "startup_s": 0.25,
         "vllm_version": "0.32.0", "device": "cpu"}
ENVIRONMENT = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "PYTHONUNBUFFERED")

PRELUDE = """
import json, os, signal, sys, time
signal.alarm({lifetime})

def note(**fields):  # what the stand-in saw, one JSON object a line, for the test to read
    with open({record!r}, "a") as record:
        record.write(json.dumps(fields) + "\\n")

def say(*events):  # one write: the events reach the pipe together
    os.write(1, b"".join(json.dumps(event).encode() + b"\\n" for event in events))

note(argv=sys.argv[1:], env={{name: os.environ.get(name) for name in {environment!r}}})
"""

# Logs a line, says it is ready (with an event after its ready line in the same write), then exits
# 0 on the shutdown request (5 on anything else).
OBEDIENT = f"""
sys.stderr.write("engine starting\\n")
sys.stderr.flush()
say({READY!r}, {{"type": "finished", "rid": "after-ready"}})
line = sys.stdin.buffer.readline()
note(stdin=line.decode())
sys.exit(0 if line == b'{{"op":"shutdown"}}\\n' else 5)
"""

# Ready, then reads the shutdown request and goes on running (until SIGTERM).
IGNORES_SHUTDOWN = f"""
say({READY!r})
note(stdin=sys.stdin.buffer.readline().decode())
while True:
    time.sleep(1)
"""

# As above, and SIGTERM is ignored too (SIGKILL is the only way out).
IGNORES_SIGTERM = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + IGNORES_SHUTDOWN

# Closes its stdin before it says it is ready: the shutdown request finds a broken pipe.
CLOSES_STDIN = f"""
os.close(0)
say({READY!r})
while True:
    time.sleep(1)
"""

# Logs why and exits 3 before its ready line.
FAILS_TO_START = """
sys.stderr.write("engine failed: no memory\\n")
sys.exit(3)
"""


def stand_in(folder: Path, body: str, name: str = "python") -> Path:
    """An executable script that takes the interpreter's place in the worker's command line."""
    path = folder / name
    record = folder / f"{name}.record"
    prelude = PRELUDE.format(lifetime=LIFETIME, record=str(record), environment=ENVIRONMENT)
    path.write_text(f"#!{sys.executable} -IS\n{prelude}{body}")
    path.chmod(0o755)
    return path


def records(python: Path) -> list[dict]:
    path = python.with_name(f"{python.name}.record")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def started(monkeypatch, tmp_path):
    """The model folder under tmp_path, the worker's variables unset (so the values seen are the ones it
    is given), $TESTBED_VLLM_PYTHON naming a decoy that exits 7 (so a start that ignored `python=` would
    fail), and every worker started through `start` ended after the test."""
    monkeypatch.setattr(vllm_models, "MODELS_DIR", tmp_path / "models")
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    decoy_folder = tmp_path / "decoy"
    decoy_folder.mkdir()
    monkeypatch.setenv(PYTHON_ENV, str(stand_in(decoy_folder, "sys.exit(7)\n")))
    processes: list[WorkerProcess] = []

    def start(python: Path) -> WorkerProcess:
        process = WorkerProcess.start(TINY_CPU, python=python)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if not isinstance(process.popen, subprocess.Popen):  # a mutant's WorkerProcess without its process
            continue
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()
        for pipe in (process.popen.stdin, process.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):  # a buffered stdin (a mutant's) flushed into a dead worker
                    pipe.close()


def shorten_waits(monkeypatch) -> None:
    monkeypatch.setattr(vllm_client, "SHUTDOWN_WAIT_S", 0.2)
    monkeypatch.setattr(vllm_client, "TERMINATE_WAIT_S", 0.2)


def waiting_in_pipe(fd: int) -> bytes:
    """What is in the pipe now, b"" if nothing: no wait, since the stand-in wrote its ready line and the
    event after it in one write (atomic, under PIPE_BUF), so the event is there once the ready line was."""
    readable, _, _ = select.select([fd], [], [], 0)
    return os.read(fd, 1 << 16) if readable else b""


def test_start_reads_the_ready_event_runs_the_worker_as_configured_and_stop_asks_it_to_shut_down(started, tmp_path):
    python = stand_in(tmp_path, OBEDIENT)
    model_dir = write_model(TINY_CPU)
    log = model_dir / "worker.log"
    log.write_bytes(b"an earlier run\n")
    process = started(python)
    assert process.ready == Ready(128256, 32, 2048, 0.25, "0.32.0", "cpu")
    assert process.log_path == log
    # The pipe is unbuffered on this side: what follows the ready line is still in the pipe, for the
    # client that attaches to it later (VllmClient.over_fds), not in a buffer of this process.
    assert waiting_in_pipe(process.popen.stdout.fileno()) == b'{"type": "finished", "rid": "after-ready"}\n'
    process.stop()
    assert process.popen.returncode == 0  # stop waited for the worker to exit on the request
    seen, shutdown = records(python)
    assert seen == {"argv": [str(WORKER_SCRIPT), json.dumps(worker_settings(TINY_CPU, model_dir))],
                    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}}
    assert shutdown == {"stdin": '{"op":"shutdown"}\n'}
    # The worker's stderr is appended to the log, after what was there.
    assert log.read_bytes() == b"an earlier run\nengine starting\n"


def test_a_worker_that_exits_before_it_is_ready_fails_with_its_exit_code_and_its_log(started, tmp_path):
    python = stand_in(tmp_path, FAILS_TO_START)
    log = write_model(TINY_CPU) / "worker.log"
    with pytest.raises(WorkerFailed) as failed:
        started(python)
    assert str(failed.value) == f"the vLLM worker exited (3) before it was ready; see {log}"
    assert log.read_bytes() == b"engine failed: no memory\n"


def test_stop_terminates_a_worker_that_ignores_the_shutdown_request(started, tmp_path, monkeypatch):
    shorten_waits(monkeypatch)
    process = started(stand_in(tmp_path, IGNORES_SHUTDOWN))
    process.stop()
    assert process.popen.returncode == -signal.SIGTERM


def test_stop_kills_a_worker_that_ignores_sigterm(started, tmp_path, monkeypatch):
    shorten_waits(monkeypatch)
    process = started(stand_in(tmp_path, IGNORES_SIGTERM))
    process.stop()
    # stop does not wait after SIGKILL; the hang guard's SIGALRM would end the stand-in otherwise.
    assert process.popen.wait(timeout=LIFETIME + 5) == -signal.SIGKILL


def test_stop_terminates_a_worker_whose_stdin_is_closed(started, tmp_path, monkeypatch):
    # The shutdown request raises BrokenPipeError; the worker is terminated without the wait for it.
    monkeypatch.setattr(vllm_client, "SHUTDOWN_WAIT_S", LIFETIME * 2)
    monkeypatch.setattr(vllm_client, "TERMINATE_WAIT_S", LIFETIME * 2)
    process = started(stand_in(tmp_path, CLOSES_STDIN))
    process.stop()
    assert process.popen.returncode == -signal.SIGTERM


async def test_open_vllm_process_appends_the_workers_stderr_to_its_log_and_yields_a_ready_client(started, tmp_path):
    python = stand_in(tmp_path, OBEDIENT)
    log = tmp_path / "given.log"
    log.write_bytes(b"an earlier run\n")
    with trio.fail_after(LIFETIME + 5):
        async with open_vllm_process(TINY_CPU, python=python, log_path=log) as client:
            assert client.ready == Ready(128256, 32, 2048, 0.25, "0.32.0", "cpu")
    assert records(python)[1:] == [{"stdin": '{"op":"shutdown"}\n'}]
    assert log.read_bytes() == b"an earlier run\nengine starting\n"
