"""Issue 10's benchmarks at tiny sizes (structure, never a wall-clock bound), and the delta
size bound of the engine's coalescing."""

from __future__ import annotations

import socket

import orjson
import pytest
import trio
import trio.testing

from experiments import concurrency, efficiency, idle_cost, profile_turn, stack_floor, streaming
from prototype.api.costs import ZERO_COSTS
from prototype.api.service import ApiService
from prototype.client.connect import InMemoryConnector
from prototype.client.harness import CHAINED, run_websocket_rollout
from prototype.engine.engine import Engine
from prototype.engine.latency import LatencyModel
from prototype.server.app import ResponsesServer
from prototype.workload import fixed


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return tmp_path


def test_efficiency_runs_at_a_tiny_size(results_in_tmp, capsys):
    rows = efficiency.main(["--max-turns", "2", "--tool-scale", "0.001", "--speeds", "4000", "--designs", "chained", "suspended", "http"])
    assert [r["design"] for r in rows] == ["chained", "suspended", "http"]
    for row in rows:
        assert row["turns"] == 2
        assert row["limit_s"] == pytest.approx(row["phase_sum_s"], rel=1e-6)  # virtual e2e is inference + tool time
        # Efficiency (limit / real time) depends on the machine's load: printed by the benchmark,
        # not bounded here; the virtual limit is exact.
        assert row["efficiency"] == pytest.approx(row["limit_s"] / row["real_s"], rel=1e-9)
        if row["design"] == "http":
            assert (row["target"], row["met"]) == ("", "")
        else:
            assert (row["target"], row["met"]) == (0.997, row["efficiency"] >= 0.997)
    assert "tool times x 0.001" in capsys.readouterr().out
    assert (results_in_tmp / "efficiency" / "latest" / "efficiency.csv").exists()


def test_streaming_runs_at_a_tiny_size(results_in_tmp):
    rows = streaming.main([
        "--sessions", "3", "--output", "200", "--flush-intervals", "0", "0.02", "--flush-tokens", "0", "16", "--client-processes", "2",
    ])
    assert len(rows) == 4
    for row in rows:
        assert row["agg_tokens_per_s"] > 0
        assert row["client_processes"] == 2 and row["client_core_share"] > 0 and row["server_cpu_us_per_token"] > 0
        assert "lag_1" in row  # real-time lag: reported, not bounded
        # The virtual-clock reference: the same sessions with no cost of the server's own, whose
        # request overhead and prefill come before each stream, so it is below the offered rate.
        assert 0 < row["limit_tokens_per_s"] < row["offered_tokens_per_s"] == 3 * 4000
        assert row["connect_s"] > 0
        assert row["limit_share"] == pytest.approx(row["agg_tokens_per_s"] / row["limit_tokens_per_s"], rel=1e-12)
        assert row["met"] == (row["limit_share"] >= 0.97 and row["lag_n_p50"] <= 0.01)
    assert (results_in_tmp / "streaming" / "latest" / "streaming.csv").exists()


@pytest.mark.parametrize(("cores", "expected"), [({0}, 1), ({0, 1}, 1), ({0, 3, 5}, 2), (set(range(16)), 15)])
def test_streaming_spreads_its_sessions_over_the_cores_the_server_leaves_free(monkeypatch, cores, expected):
    seen = []
    monkeypatch.setattr(streaming.os, "sched_getaffinity", lambda pid: cores)
    monkeypatch.setattr(streaming, "measure", lambda flush, flush_tokens, args: seen.append(args.client_processes) or {"client_processes": args.client_processes})
    monkeypatch.setattr(streaming, "report", lambda rows, csv, columns: None)
    streaming.main(["--flush-intervals", "0.05"])
    assert seen == [expected] and streaming.free_cores() == expected
    streaming.main(["--flush-intervals", "0.05", "--client-processes", "3"])  # the option still decides
    assert seen == [expected, 3]


async def test_a_rollout_given_a_connected_hook_starts_its_first_turn_when_the_hook_returns(autojump_clock):
    # experiments/streaming.py opens every session before any streams: the turns leave the handshakes out.
    # Each rollout on a fresh server, so neither finds the other's prompt in the prefix cache.
    workload = fixed(1, initial_prompt_tokens=100, appended_tokens=0, output_tokens=20, tool_seconds=0.0)
    metadata = {"testbed_workload": streaming.spec_of(100, 20)}
    plain = await run_websocket_rollout(InMemoryConnector(ResponsesServer(ApiService(costs=ZERO_COSTS))), CHAINED, workload, metadata=metadata)
    begun = trio.current_time()

    async def connected() -> None:
        await trio.sleep(1.5)

    hooked = await run_websocket_rollout(InMemoryConnector(ResponsesServer(ApiService(costs=ZERO_COSTS))), CHAINED, workload, metadata=metadata, connected=connected)
    assert hooked.started_at == hooked.turns[0].sent_at == begun + 1.5
    assert hooked.turns[0].ended_at - hooked.turns[0].sent_at == pytest.approx(plain.turns[0].ended_at - plain.turns[0].sent_at, abs=1e-12)


def test_a_client_process_that_cannot_connect_fails_the_streaming_run_at_once():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again: connections are refused
    with pytest.raises(RuntimeError, match="a client process failed"):
        streaming.run_client_processes(port, 2, 3, 100, 20, 4000.0)


def test_idle_cost_times_the_way_in_of_a_request_the_server_reads_back_whole(results_in_tmp):
    event = idle_cost.request_event()
    assert 49_000 <= len(orjson.dumps(event)) <= 51_000
    step = idle_cost.way_in(event)
    assert step() == event and step() == event  # one frame after another on the same connection pair
    rows = idle_cost.main(["--waits-ms", "0.5", "--repeats", "2"])
    assert [(r["condition"], r["wait_ms"], r["repeats"]) for r in rows] == [
        ("back to back", 0.0, 2), ("after sleep", 0.5, 2), ("after busy wait", 0.5, 2)
    ]
    assert rows[0]["x_back_to_back"] == 1.0
    assert all(r["median_us"] > 0 and r["x_back_to_back"] == r["median_us"] / rows[0]["median_us"] for r in rows)
    assert (results_in_tmp / "idle_cost" / "latest" / "idle_cost.csv").exists()


def test_stack_floor_times_each_segment_of_a_logic_free_turn_and_bounds_the_efficiency(results_in_tmp):
    rows = stack_floor.main(["--turns", "3", "--wait-s", "0.01"])
    assert [r["segment"] for r in rows] == [*stack_floor.SEGMENTS, "floor (median turn's sum)"]
    assert all(r["turns"] == 3 and r["median_ms"] > 0 for r in rows)
    bounds = [float(rows[-1][column]) for column in stack_floor.BOUND_COLUMNS.values()]
    assert all(0 < bound < 1 for bound in bounds) and bounds[0] > bounds[1]  # the shorter limit loses more to the same floor
    assert all(r[column] == "" for r in rows[:-1] for column in stack_floor.BOUND_COLUMNS.values())
    assert (results_in_tmp / "stack_floor" / "latest" / "stack_floor.csv").exists()


def test_the_efficiency_bound_is_the_limit_over_the_limit_plus_the_floor_every_turn():
    assert stack_floor.efficiency_bound(0.002, 17, 7.384) == pytest.approx(7.384 / 7.418)
    assert stack_floor.efficiency_bound(0.0, 17, 7.384) == 1.0
    turns, limit = stack_floor.compact_limit(4000.0)
    assert (turns, limit) == (17, pytest.approx(7.384, abs=0.0005))  # what experiments.efficiency prints as limit_s


def test_concurrency_runs_at_a_tiny_size(results_in_tmp):
    rows = concurrency.main(["--sessions", "3", "--turns", "2", "--tool-seconds", "0.05", "--stagger", "0.05"])
    assert {r["design"] for r in rows} == {"suspended", "chained"}
    assert all(r["lost"] == 0 and r["duplicated"] == 0 and r["completed"] == 3 for r in rows)


def _chunks(pieces, rate, flush_interval, flush_tokens):
    engine = Engine()

    async def run():
        out = []
        async for chunk in engine.stream(LatencyModel(decode_tokens_per_s=rate), pieces, flush_interval=flush_interval, flush_tokens=flush_tokens):
            out.append((trio.current_time(), chunk))
        return out

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def test_flush_tokens_bounds_each_delta_and_keeps_the_end():
    pieces = [f"t{i} " for i in range(100)]
    unbounded = _chunks(pieces, 1000.0, 0.05, None)
    bounded = _chunks(pieces, 1000.0, 0.05, 8)
    assert "".join(c for _, c in bounded) == "".join(pieces)
    assert all(len(c.split()) <= 8 for _, c in bounded)
    assert len(bounded[0][1].split()) == 1  # the first token goes out at once
    assert bounded[-1][0] == pytest.approx(unbounded[-1][0]) == pytest.approx(0.1)  # the end is not delayed
    assert max(len(c.split()) for _, c in unbounded) > 8


def test_profile_split_gives_library_time_to_its_callers():
    json_caller = ("/x/prototype/protocol/codec.py", 1, "encode")
    framing_caller = ("/x/site-packages/wsproto/frame_protocol.py", 2, "_serialize_frame")
    builtin = ("~", 0, "<built-in method builtins.len>")
    stats = {
        json_caller: (1, 1, 0.0, 0.3, {}),
        framing_caller: (1, 1, 0.0, 0.1, {}),
        builtin: (4, 4, 0.4, 0.4, {json_caller: (3, 3, 0.3, 0.3), framing_caller: (1, 1, 0.1, 0.1)}),
    }
    causes = profile_turn.inherit(stats, {f: profile_turn.own_cause(f) for f in stats})
    assert causes[builtin] == pytest.approx({profile_turn.JSON: 0.75, profile_turn.FRAMING: 0.25})
    assert causes[json_caller] == {profile_turn.JSON: 1.0}


def test_profile_turn_runs_at_a_tiny_size(capsys):
    rows = profile_turn.main(["--designs", "chained", "--max-turns", "2", "--tool-scale", "0.001"])
    causes = {row["cause"] for row in rows}
    assert {"overhead (real - limit)", "cpu (process)", "phase prefill", "phase decode", "json", "trio scheduling"} <= causes
    cpu = next(row["ms_per_turn"] for row in rows if row["cause"] == "cpu (process)")
    split = sum(row["ms_per_turn"] for row in rows if row["side"] in ("server", "client", "shared"))
    assert 0 < split <= cpu * 1.0001  # the causes share out the process's CPU (minus rows under 0.05%)


def test_stream_from_the_engine_schedule_catches_up_after_a_late_start():
    """Tokens are due from `start` (the prefill's deadline), not from when the task got to them:
    started 10 ms late at 1000 tokens/s, the first chunk carries the 10 tokens already due and the
    last token still goes out at start + 20 ms."""
    engine = Engine()

    async def run():
        await trio.sleep(0.010)
        out = []
        async for chunk in engine.stream(LatencyModel(decode_tokens_per_s=1000), ["t"] * 20, start=0.0):
            out.append((round(trio.current_time(), 9), len(chunk)))
        return out

    out = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert out[0] == (0.010, 10)
    assert out[1:] == [(round(0.001 * i, 9), 1) for i in range(11, 21)]
    assert engine.stats.decoded_tokens == 20


def test_a_real_runs_measured_window_holds_the_run_and_not_the_collectors_full_collection(monkeypatch):
    """profile_turn's CPU clock and profiler are entered around the run alone: the collector's
    settling (a full collection of everything the process holds, tens of milliseconds) comes
    before, or it would be charged to the 17 turns as "server logic"."""
    import contextlib
    import gc

    from prototype import benchmark, netem, workload

    inside: list[bool] = [False]
    collections: list[bool] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(inside[0]) or real_collect(*a))

    @contextlib.contextmanager
    def measured():
        inside[0] = True
        yield
        inside[0] = False

    task = workload.fixed(2, initial_prompt_tokens=200, appended_tokens=20, output_tokens=10, tool_seconds=0.001)
    config = benchmark.BenchConfig(task_list=(task,), network=netem.LOOPBACK, costs=ZERO_COSTS)
    records = benchmark.run_design_real(benchmark.CHAINED, 100000.0, config, measured=measured)
    assert [len(record.turns) for record in records] == [2]
    assert collections == [False]
