"""The experiments' `serve` child (experiments/common.py:server_process) never blocks on its own output: a pipe
nobody reads holds 64 KiB (pipe(7))."""

from __future__ import annotations

import json
import re

import pytest
from websockets.sync.client import connect as ws_connect

from experiments.common import ServerOutput, server_process
from prototype.protocol import errors

PIPE_BYTES = 64 * 1024  # Linux's default pipe capacity (pipe(7))
# Frames the server refuses: each one is an `error` to the client and an access-log line of about
# 70 characters on serve's stdout, so 2,000 of them print twice what the pipe holds.
REFUSED_FRAMES = 2_000
BATCH = 100  # frames sent before their errors are read, so neither side's socket buffer fills


@pytest.mark.slow
def test_a_server_process_prints_more_than_a_pipe_holds_and_keeps_serving() -> None:
    output = ServerOutput()
    with server_process("--costs", "zero", output=output) as (process, port):
        headers = {"Authorization": "Bearer k"}
        with ws_connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers, open_timeout=30) as conn:
            for _ in range(REFUSED_FRAMES // BATCH):
                for _ in range(BATCH):
                    conn.send(json.dumps({"type": "response.fly"}))
                for _ in range(BATCH):
                    # A serve blocked on a full pipe answers nothing: the timeout fails the test.
                    error = json.loads(conn.recv(timeout=30))
                    assert error["type"] == "error" and error["error"]["code"] == errors.UNKNOWN_EVENT_TYPE
        assert process.poll() is None  # still serving
    # SIGTERM drained it and it exited by itself; its output was read to the end: the address and
    # configuration, one access-log line per refused frame, then the drain's two lines.
    assert process.returncode == 0
    draining, drained = list(output.tail)[-2:]
    # The client's close handshake can end before the server's session has: the drain may still count it.
    assert re.fullmatch(r"SIGTERM: draining \([01] WebSocket connections, 0 HTTP responses in flight\)\n", draining), draining
    assert drained == "drained\n"
    assert output.lines > REFUSED_FRAMES and output.bytes > 2 * PIPE_BYTES
    assert sum("error:unknown_event_type" in line for line in output.tail) == len(output.tail) - 2


def test_a_server_that_exits_before_it_listens_is_reported_with_its_exit_code(tmp_path) -> None:
    # serve refuses a --store whose folder does not exist (exit code 2) and prints nothing on stdout.
    missing = tmp_path / "no-such-folder" / "responses.sqlite"
    with pytest.raises(RuntimeError) as caught:
        with server_process("--costs", "zero", "--store", str(missing)):
            pass
    assert str(caught.value) == "server exited (exit code 2) before it listened; its error output (stderr) says why"
