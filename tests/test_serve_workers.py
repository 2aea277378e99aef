"""`python -m prototype serve --workers N`: N processes on one port, each connection served by one
worker (its id in the handshake's x-testbed-worker header), one SQLite response store in WAL mode
shared by all, so a response stored through one worker continues over another worker's connection."""

from __future__ import annotations

import os

import pytest
from test_cli_serve import assert_stopped, create, open_ws, until_terminal

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
        stored = first_response(ws, store=True)
        unstored = first_response(ws, store=False)
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
