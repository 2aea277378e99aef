"""`python -m prototype serve` as a user runs it: prints its address, answers, stops on Ctrl-C
(exit 0, "stopped"), and refuses a wrong API key at the WebSocket handshake (docs/protocol.md)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

LISTENING = re.compile(r"^listening on http://127\.0\.0\.1:(\d+)\b")
TIMEOUT = 5.0
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
