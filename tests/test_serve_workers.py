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


@pytest.mark.slow
def test_the_load_experiment_runs_against_two_workers(tmp_path, monkeypatch):
    import experiments.common as common
    from experiments import load

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    rows = load.main(["--sessions", "4", "--turns", "2", "--tool-seconds", "0.05", "--designs", "chained", "--workers", "1", "2"])
    assert [(r["workers"], r["completed"], r["turns"], r["lost"], r["duplicated"]) for r in rows] == [(1, 4, 8, 0, 0), (2, 4, 8, 0, 0)]
    # 4 sessions x 2 turns over (2 modeled turns + one 0.05 s think time)
    modeled = load.reference("chained", *load.task_of(load.LoadRun("chained", 4, 1, 2, 1000, 200, 50, 0.05, 0.0)))
    session_s = sum(t.ended_at - t.sent_at for t in modeled.turns) + 0.05
    assert rows[0]["offered_turns_per_s"] == pytest.approx(4 * 2 / session_s)
    assert rows[0]["peak_turns_per_s"] == 8  # all 8 requests within one second (no stagger, 0.05 s think)
    assert all(r["server_cpu_ms_per_turn"] > 0 and r["max_open"] == 4 for r in rows)
    assert (tmp_path / "load" / "latest" / "load.csv").exists()  # a new folder per run
