"""`python -m prototype serve` as a user runs it: prints its address, answers, stops on Ctrl-C
(exit 0, "stopped"), and refuses a wrong API key at the WebSocket handshake (docs/protocol.md)."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from prototype.cli.serve import run_until_interrupted
from prototype.engine.vllm_engine import RealEngineError

LISTENING = re.compile(r"^listening on http://127\.0\.0\.1:(\d+)\b")
TIMEOUT = 60.0  # a hang guard: on a loaded machine the first turn (tokenizer load) takes seconds
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}


def create(**extra: Any) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": "sim-100000",
            "input": "hello",
            "metadata": {"testbed_workload": "fixed:1"},
            "store": False,
            **extra,
        }
    )


def until_terminal(ws: Any) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(ws.recv(timeout=TIMEOUT))
        events.append(event)
        if event["type"] in TERMINALS or event["type"] == "error":
            return events
        assert len(events) < 5000, "no terminal event"


def open_ws(port: int, key: str | None = "x"):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return ws_connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers, open_timeout=TIMEOUT, close_timeout=2, max_size=None)


def assert_stopped(server) -> None:
    code, out, err = server.stop()
    assert code == 0, f"exit code {code}\nstderr:\n{err}"
    assert out.splitlines()[-1] == "stopped", out
    assert "Traceback" not in err, err


def test_serve_prints_address_answers_and_stops_on_sigint(cli_server):
    server = cli_server()  # default modeled costs
    port = server.port
    assert LISTENING.match(server.first_line)
    assert f"ws://127.0.0.1:{port}/v1/responses" in server.first_line
    with open_ws(port) as ws:
        ws.send(create())
        events = until_terminal(ws)
    assert events[0]["type"] == "response.created", events[0]
    assert events[-1]["type"] == "response.completed", events[-1]
    assert events[-1]["response"]["output"], "a one-turn task ends with a message"
    assert_stopped(server)


def test_serve_stops_on_sigint_with_a_connection_open(cli_server):
    server = cli_server("--costs", "zero")
    with open_ws(server.port) as ws:
        ws.send(create(generate=False))
        assert until_terminal(ws)[-1]["type"] == "response.completed"
        assert_stopped(server)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=TIMEOUT)


def test_wrong_api_key_gets_401_on_the_handshake(cli_server):
    server = cli_server("--costs", "zero", "--api-key", "secret")
    for key in ("wrong", None):
        with pytest.raises(InvalidStatus) as refused:
            open_ws(server.port, key)
        response = refused.value.response
        assert response.status_code == 401, key
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
    with open_ws(server.port, "secret") as ws:  # the configured key is accepted
        ws.send(create(generate=False))
        assert until_terminal(ws)[-1]["type"] == "response.completed"


def post(port: int, body: bytes) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/responses", data=body, method="POST",
        headers={"Authorization": "Bearer x", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for_lines(server, count: int) -> None:
    """Wait (bounded) until the server has printed `count` lines: an access-log line is written
    just after the response's last byte, so it may trail the client's read."""
    import time

    deadline = time.monotonic() + TIMEOUT
    while len(server.stdout) < count and time.monotonic() < deadline:
        time.sleep(0.01)


HTTP_CREATE = json.dumps({"model": "sim-100000", "input": "hi", "metadata": {"testbed_workload": "fixed:1"}}).encode()


def test_serve_prints_its_configuration_after_the_address(cli_server):
    server = cli_server("--costs", "zero", "--workload", "chat", "--seed", "7", "--suspension-ttl", "900")
    code, out, _ = server.stop()
    lines = out.splitlines()
    assert LISTENING.match(lines[0])
    config = {line.split()[0]: line for line in lines[1:8]}
    assert set(config) == {"workload", "speed", "costs", "TTLs", "limits", "auth", "store"}
    assert "chat (seed 7)" in config["workload"]
    assert "*spark* 1000" in config["speed"] and "any other name 65" in config["speed"]
    assert config["costs"].split()[1] == "zero"
    assert "v1 suspension 900 s" in config["TTLs"]
    assert "10000 connections" in config["limits"]


def test_serve_logs_one_line_per_response_and_refusal(cli_server):
    server = cli_server("--costs", "zero")
    assert post(server.port, HTTP_CREATE) == 200
    assert post(server.port, b"{bad") == 400
    with open_ws(server.port) as ws:
        ws.send(create())
        response_id = until_terminal(ws)[-1]["response"]["id"]
    wait_for_lines(server, 8 + 3)
    _, out, _ = server.stop()
    log = [line for line in out.splitlines()[8:] if line != "stopped"]
    assert len(log) == 3, log
    assert log[0].split()[1:3] == ["http", "http-stateless"] and "turns=1 completed" in log[0]
    assert log[1].split()[1:3] == ["http", "http"] and "error:invalid_json" in log[1]
    assert log[2].split()[1:4] == ["websocket", "chained", response_id] and "turns=1 completed" in log[2]
    assert log[2].split()[7] == "ms" and float(log[2].split()[6]) >= 0


def test_serve_json_access_log_and_quiet(cli_server):
    server = cli_server("--costs", "zero", "--log-format", "json")
    assert post(server.port, HTTP_CREATE) == 200
    wait_for_lines(server, 8 + 1)
    _, out, _ = server.stop()
    entry = json.loads(out.splitlines()[8])
    assert entry["transport"] == "http" and entry["design"] == "http-stateless"
    assert entry["status"] == "completed" and entry["turns"] == 1 and entry["ms"] >= 0
    assert entry["response_id"].startswith("resp_")
    quiet = cli_server("--costs", "zero", "--quiet")
    assert post(quiet.port, HTTP_CREATE) == 200
    _, out, _ = quiet.stop()
    assert len(out.splitlines()) == 9 and out.splitlines()[-1] == "stopped"  # address, 7 lines of configuration


def test_port_in_use_and_bad_flags_get_one_line_and_a_nonzero_exit(cli_server):
    import subprocess
    import sys

    from tests.conftest import REPO

    busy = cli_server("--costs", "zero")
    for args, code, says in (
        (["--port", str(busy.port)], 1, f"cannot listen on 127.0.0.1:{busy.port}"),
        (["--port", "0", "--prt", "3"], 2, "unrecognized arguments: --prt"),
        (["--port", "0", "--cost", "zero"], 2, "unrecognized arguments: --cost"),  # no abbreviations
        (["--port", "0", "--workload", "nope"], 2, "--workload"),
    ):
        done = subprocess.run([sys.executable, "-m", "prototype", "serve", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert done.returncode == code, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and says in done.stderr, (args, done.stderr)
        assert done.stdout == ""


@pytest.mark.parametrize(("workload", "says"), [("nosuch", "names no workload"), ("fixed:100000", "1 to 1000")])
def test_a_bad_workload_option_is_named_as_the_option_and_a_range_error_gives_the_range(workload: str, says: str):
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-m", "prototype", "serve", "--port", "0", "--workload", workload], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, len(done.stderr.splitlines())) == (2, "", 1), done.stderr
    assert "--workload" in done.stderr and says in done.stderr, done.stderr
    assert "metadata." not in done.stderr, done.stderr  # a request's field, not this option


# A stand-in for vLLM's worker: it says it is ready, then exits 9 once the test creates the file `trigger`, or at the
# first request it reads (`on_request`: the engine dies under a response); it ends itself after a minute whatever
# happens (a hang guard).
DYING_WORKER = """#!{python} -IS
import json, os, select, signal, sys, time
signal.alarm(60)
os.write(1, json.dumps({{"type": "ready", "vocab_size": 128256, "block_size": 32, "kv_blocks": 2048, "startup_s": 0.25,
                        "vllm_version": "0.32.0", "device": "cpu"}}).encode() + b"\\n")
while not os.path.exists({trigger!r}):
    if {on_request!r} and select.select([0], [], [], 0.05)[0]:
        break
    time.sleep(0.05)
sys.exit(9)
"""


@pytest.mark.parametrize("under_a_response", [False, True], ids=["idle", "under-a-response"])
def test_serve_over_vllm_exits_saying_why_when_its_engine_dies(tmp_path, under_a_response: bool):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    trigger = tmp_path / "die"
    worker = tmp_path / "python"
    worker.write_text(DYING_WORKER.format(python=sys.executable, trigger=str(trigger), on_request=under_a_response))
    worker.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path)}  # the model's config.json goes under $HOME/.cache
    proc = subprocess.Popen([sys.executable, "-m", "prototype", "serve", "--port", "0", "--quiet", "--engine", "vllm",
                             "--vllm-python", str(worker)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    received: list[dict[str, Any]] = []
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert LISTENING.match(lines[2]), (lines, proc.stderr.read() if proc.poll() is not None else "")
        with open_ws(int(LISTENING.match(lines[2]).group(1))) as conn:  # a client connected when the engine dies
            if under_a_response:
                conn.send(json.dumps({"type": "response.create", "model": "sim-1000", "input": "hi", "store": False,
                                      "metadata": {"testbed_workload": "fixed:1"}}))
            else:
                trigger.touch()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    received.append(json.loads(conn.recv(timeout=TIMEOUT)))
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # closed as a drain closes: going away
    assert proc.returncode == 1, err
    (line,) = err.splitlines()  # one line, no traceback: the option, and the worker's reason
    assert "--engine vllm" in line and "the vLLM worker exited" in line, err
    assert "stopped\n" not in out
    if under_a_response:
        # The response under way gets an answer before the close: failed as on any engine failure, or, when the
        # server's shutdown reaches it first, the drain's `server_shutting_down` (retry on a new connection).
        last = received[-1]
        assert (last["type"], last.get("response", last).get("error", {}).get("code")) in {
            ("response.failed", RealEngineError.code), ("error", "server_shutting_down")}, received


def test_serve_stops_on_sigint_even_when_started_with_sigint_ignored():
    # A non-interactive shell starts a background command (`serve &`) with SIGINT ignored (POSIX);
    # serve still stops on it, as its help says.
    import signal
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.Popen(
        [sys.executable, "-m", "prototype", "serve", "--port", "0"], cwd=Path(__file__).resolve().parents[1],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert LISTENING.match(proc.stdout.readline())  # an exit instead gives '' and fails here
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "stopped"


def test_ctrl_c_that_lands_in_a_task_whose_way_out_is_cancelled_still_stops_serve():
    """SIGINT arriving while a connection's task runs (trio-websocket's reader, as the connection
    closes) must still end the run. `reader` below does what that task does on its way out: it
    cancels its nursery and passes a checkpoint. Raised inside it, as trio's default does, the
    KeyboardInterrupt is replaced by that checkpoint's Cancelled and the run ends as if nothing
    happened; `serve` raises it in the main task instead, so it reaches `serve`'s handler."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                try:
                    signal.raise_signal(signal.SIGINT)  # its Python handler runs before this returns
                    await trio.sleep_forever()
                finally:
                    nursery.cancel_scope.cancel()
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(reader)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupted = False
    try:
        run_until_interrupted(main)
    except* KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted
