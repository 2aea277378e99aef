"""The own-cost benchmarks at tiny sizes (their columns and arithmetic, never a wall-clock bound), and the engine's
schedule they rely on."""

from __future__ import annotations

import socket

import orjson
import pytest
import trio
import trio.testing

from experiments import concurrency, efficiency, idle_cost, profile_turn, stack_floor, streaming
from prototype import metrics, uncertainty
from prototype.analysis import NETWORK_CLIENT, TOOL
from prototype.client.connect import TcpConnector
from prototype.client.harness import RolloutRecord, TurnRecord
from prototype.engine.engine import Engine
from prototype.engine.latency import LatencyModel


def test_efficiency_runs_at_a_tiny_size_and_sets_each_websocket_design_against_its_floor(results_in_tmp, capsys):
    rows = efficiency.main([
        "--max-turns", "2", "--tool-scale", "0.001", "--speeds", "4000", "--designs", "chained", "suspended", "http", "--floor-turns", "3",
    ])
    assert [r["design"] for r in rows] == ["chained", "suspended", "http"]
    assert all(tuple(row) == efficiency.COLUMNS for row in rows)
    for row in rows:
        assert row["turns"] == 2
        assert row["limit_s"] == pytest.approx(row["phase_sum_s"], rel=1e-6)  # virtual e2e is inference + tool time
        # Efficiency and overhead depend on the machine's load: printed, not bounded here; their arithmetic (efficiency.figures)
        # is pinned on known spans below.
        assert row["efficiency_low"] <= row["efficiency"] <= row["efficiency_high"]
        if row["design"] == "http":  # a POST and an SSE stream: not the floor's WebSocket turn
            assert all(row[c] == "" for c in efficiency.COLUMNS[efficiency.COLUMNS.index("floor_ms"):-1])
            continue
        assert row["floor_turns"] == 3 and row["floor_low_ms"] <= row["floor_ms"] <= row["floor_high_ms"]
        assert row["target_ms"] == efficiency.TARGET_BEYOND_FLOOR_MS
        judged = efficiency.verdict(
            uncertainty.Estimate(row["beyond_floor_ms"], row["beyond_floor_low_ms"], row["beyond_floor_high_ms"], 2), row["target_ms"])
        assert row["met"] == ("loaded" if efficiency.machine_loaded(row["load_avg"]) else judged)
    assert "tool times x 0.001" in capsys.readouterr().out
    assert (results_in_tmp / "efficiency" / "latest" / "efficiency.csv").exists()


def _record(started: float, ends: list[float], ended: float) -> RolloutRecord:
    return RolloutRecord("chained", "task", started, ended, "completed", [TurnRecord(i, 0.0, ended_at=end) for i, end in enumerate(ends)])


def test_turn_spans_add_up_to_the_tasks_time_and_the_overhead_beyond_the_floor_is_the_mean_excess_less_the_floors():
    records = [_record(10.0, [10.5, 11.25, 12.0], 12.125), _record(20.0, [21.0], 21.0)]
    assert efficiency.turn_spans(records) == [0.5, 0.75, 0.875, 1.0]
    assert sum(efficiency.turn_spans(records)) == sum(record.seconds for record in records)
    virtual = [0.5, 1.0, 1.5, 2.0]
    real = [0.503, 1.003, 1.503, 2.003]  # 3 ms a turn beyond the model, every turn
    row = efficiency.figures(virtual, real, [0.002] * 5)  # a floor of 2 ms, every turn
    assert (row["turns"], row["limit_s"], row["real_s"]) == (4, 5.0, pytest.approx(5.012))
    assert row["efficiency"] == pytest.approx(5.0 / 5.012)
    assert (row["overhead_low_ms"], row["overhead_ms"], row["overhead_high_ms"]) == pytest.approx((3.0, 3.0, 3.0))
    assert (row["floor_low_ms"], row["floor_ms"], row["floor_high_ms"], row["floor_turns"]) == pytest.approx((2.0, 2.0, 2.0, 5))
    assert row["efficiency_bound"] == pytest.approx(5.0 / (5.0 + 4 * 0.002))
    assert (row["beyond_floor_low_ms"], row["beyond_floor_ms"], row["beyond_floor_high_ms"]) == pytest.approx((1.0, 1.0, 1.0))
    assert efficiency.figures(virtual, [v + 0.0025 for v in virtual], [0.002] * 5)["met"] == "yes"  # 0.5 ms beyond the floor
    assert efficiency.figures(virtual, [v + 0.0032 for v in virtual], [0.002] * 5)["met"] == "no"  # 1.2 ms
    noisy = efficiency.figures(virtual, [0.5012, 1.0045, 1.5009, 2.0049], [0.0018, 0.0022, 0.002, 0.0019, 0.0021])
    assert noisy["beyond_floor_low_ms"] < 1.0 < noisy["beyond_floor_high_ms"] and noisy["met"] == "not separated"
    assert noisy["bound_low"] < noisy["efficiency_bound"] < noisy["bound_high"]  # from the floor's interval
    assert efficiency.figures(virtual, real, None)["floor_ms"] == ""
    with pytest.raises(ValueError, match="3 turns"):
        efficiency.figures(virtual, real[:3], None)


def test_streaming_runs_at_a_tiny_size_against_the_testbed_and_its_floor(results_in_tmp):
    rows = streaming.main([
        "--sessions", "3", "--output", "200", "--flush-intervals", "0", "0.02", "--flush-tokens", "16", "--client-processes", "2",
        "--repeats", "2"])
    assert [row["flush_ms"] for row in rows] == [0, 20]
    for row in rows:
        assert tuple(row) == streaming.COLUMNS and row["agg_tokens_per_s"] > 0 and row["repeats"] == 2
        assert row["client_processes"] == 2 and row["client_core_share"] > 0 and row["server_cpu_us_per_token"] > 0
        assert "lag_1" in row  # real-time lag: reported, not bounded
        # The virtual-clock reference: the same sessions with no cost of the server's own, whose
        # request overhead and prefill come before each stream, so it is below the offered rate.
        assert 0 < row["limit_tokens_per_s"] < row["offered_tokens_per_s"] == 3 * 4000 and row["connect_s"] > 0
        assert row["limit_share"] == pytest.approx(row["agg_tokens_per_s"] / row["limit_tokens_per_s"], rel=1e-12)
        if row["flush_ms"] == 0:  # one delta per token: no floor to replay
            assert all(row[column] == "" for column in streaming.FLOOR_COLUMNS)
            continue
        assert row["floor_tokens_per_s"] > 0 and row["floor_cpu_us_per_token"] > 0
        assert row["floor_limit_share"] == pytest.approx(row["floor_tokens_per_s"] / row["limit_tokens_per_s"], rel=1e-12)
        assert row["floor_share"] == pytest.approx(row["agg_tokens_per_s"] / row["floor_tokens_per_s"], rel=1e-12)
        share = uncertainty.Estimate(row["floor_share"], row["floor_share_low"], row["floor_share_high"], 2)
        judged = streaming.at_least_target(share, streaming.TARGET_FLOOR_SHARE)
        assert row["met"] == ("loaded" if efficiency.machine_loaded(row["load_avg"]) else judged)
    assert (results_in_tmp / "streaming" / "latest" / "streaming.csv").exists()


def test_the_streaming_floor_replays_the_testbeds_own_answer_and_a_client_process_that_cannot_connect_fails_the_run():
    answer = streaming.captured_answer(100, 200, 4000.0, 0.02, None)
    _, many = streaming.modeled_runs(100, 200, 4000.0, 4000.0, 2, 0.02, None)
    sent, first, ended = streaming.turn_seconds(many[0])
    types = [orjson.loads(message)["type"] for _, group in answer for message in group]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    first_delta = next(at for at, group in answer if any('"response.output_text.delta"' in m for m in group))
    assert (first_delta, answer[-1][0]) == (pytest.approx(first - sent, abs=1e-9), pytest.approx(ended - sent, abs=1e-9))
    with streaming.floor_process(answer) as (_, port):
        (record,) = trio.run(streaming.run_sessions, TcpConnector("127.0.0.1", port), 1, 100, 200, 4000.0)
    assert record.status == "completed" and record.usage["output_tokens"] == 200
    assert [kind for _, way, kind in record.timeline if way == "recv"] == types
    # A client process that cannot connect fails the streaming run at once.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again: connections are refused
    with pytest.raises(RuntimeError, match="a client process failed"):
        streaming.run_client_processes(port, 2, 3, 100, 20, 4000.0)


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


def test_idle_cost_times_the_way_in_of_a_request_the_server_reads_back_whole(results_in_tmp):
    event = idle_cost.request_event()
    assert 49_000 <= len(orjson.dumps(event)) <= 51_000
    step = idle_cost.way_in(event)
    assert step() == event and step() == event  # one frame after another on the same connection pair
    rows = idle_cost.main(["--waits-ms", "0.5", "--repeats", "2"])
    assert [(r["condition"], r["wait_ms"], r["repeats"]) for r in rows] == [
        ("back to back", 0.0, 2), ("after sleep", 0.5, 2), ("after busy wait", 0.5, 2)]
    assert rows[0]["x_back_to_back"] == 1.0
    assert all(r["median_us"] > 0 and r["x_back_to_back"] == r["median_us"] / rows[0]["median_us"] for r in rows)
    assert (results_in_tmp / "idle_cost" / "latest" / "idle_cost.csv").exists()


def test_stack_floor_times_each_segment_of_a_logic_free_turn_and_their_sum_playing_messages_of_the_sizes_asked(results_in_tmp):
    rows = stack_floor.main(["--turns", "3", "--wait-s", "0.01", "--request-bytes", "6000"])
    assert [r["segment"] for r in rows] == [*stack_floor.SEGMENTS, stack_floor.FLOOR]
    assert all(r["turns"] == 3 and r["median_ms"] > 0 and r["low_ms"] <= r["mean_ms"] <= r["high_ms"] for r in rows)
    assert rows[-1]["mean_ms"] == pytest.approx(sum(r["mean_ms"] for r in rows[:-1]), rel=1e-9)  # the floor is each turn's sum
    assert (results_in_tmp / "stack_floor" / "latest" / "stack_floor.csv").exists()
    request, closing = stack_floor.turn_messages(6000, 20_000)
    assert 5990 <= len(request) <= 6000 and 19_990 <= len(closing[-1]) - len('{"type":"response.completed","sequence_number":2,"response":}') <= 20_000
    assert [orjson.loads(m)["type"] for m in closing][-1] == "response.completed"


def test_a_target_is_judged_only_within_the_machines_cores_against_the_efficiency_bound():
    assert not efficiency.machine_loaded(1.9, cores=2) and not efficiency.machine_loaded(2.0, cores=2)
    assert efficiency.machine_loaded(2.1, cores=2) and not efficiency.machine_loaded(2.1, cores=4)
    # The efficiency bound: the limit over the limit plus the floor every turn.
    assert stack_floor.efficiency_bound(0.002, 17, 7.384) == pytest.approx(7.384 / 7.418)
    assert stack_floor.efficiency_bound(0.0, 17, 7.384) == 1.0


def test_concurrency_runs_at_a_tiny_size(results_in_tmp):
    rows = concurrency.main(["--sessions", "3", "--turns", "2", "--tool-seconds", "0.05", "--stagger", "0.05"])
    assert {r["design"] for r in rows} == {"suspended", "chained"}
    assert all(r["lost"] == 0 and r["duplicated"] == 0 and r["completed"] == 3 for r in rows)


def test_profile_turn_runs_at_a_tiny_size_giving_library_time_to_its_callers(results_in_tmp):
    json_caller = ("/x/prototype/protocol/codec.py", 1, "encode")
    framing_caller = ("/x/site-packages/wsproto/frame_protocol.py", 2, "_serialize_frame")
    builtin = ("~", 0, "<built-in method builtins.len>")
    stats = {
        json_caller: (1, 1, 0.0, 0.3, {}),
        framing_caller: (1, 1, 0.0, 0.1, {}),
        builtin: (4, 4, 0.4, 0.4, {json_caller: (3, 3, 0.3, 0.3), framing_caller: (1, 1, 0.1, 0.1)})}
    causes = profile_turn.inherit(stats, {f: profile_turn.own_cause(f) for f in stats})
    assert (causes[builtin], causes[json_caller]) == (
        pytest.approx({profile_turn.JSON: 0.75, profile_turn.FRAMING: 0.25}), {profile_turn.JSON: 1.0})
    rows = profile_turn.main(["--designs", "chained", "--max-turns", "2", "--tool-scale", "0.001"])
    assert (results_in_tmp / "profile_turn" / "latest" / "profile_turn.csv").exists()
    causes = {row["cause"] for row in rows}
    assert {"overhead (real - limit)", "cpu (process)", "json", "trio scheduling"} <= causes, sorted(causes)
    # A phase is listed where the real run spent 0.005 ms a turn more or less in it than the limit: on a
    # loaded machine that difference can come out either way, or round to nothing.
    phases = [row for row in rows if row["cause"].startswith("phase ")]
    assert all(abs(row["ms_per_turn"]) >= 0.005 and row["side"] == "wall" for row in phases)
    assert {row["cause"] for row in phases} <= {"phase " + phase for phase in (*metrics.SERVER_PHASES, NETWORK_CLIENT, TOOL)}
    cpu = next(row["ms_per_turn"] for row in rows if row["cause"] == "cpu (process)")
    split = sum(row["ms_per_turn"] for row in rows if row["side"] in ("server", "client", "shared"))
    assert 0 < split <= cpu * 1.0001  # the causes share out the process's CPU (minus rows under 0.05%)


def test_stream_from_the_engine_schedule_catches_up_after_a_late_start():
    """Tokens are due from `start` (the prefill's deadline): started 10 ms late at 1000 tokens/s, the first chunk carries
    the 10 tokens already due and the last still goes out at start + 20 ms."""
    engine = Engine()

    async def run():
        await trio.sleep(0.010)
        out = []
        async for chunk in engine.stream(LatencyModel(decode_tokens_per_s=1000), ["t"] * 20, start=0.0):
            out.append((round(trio.current_time(), 9), len(chunk)))
        return out

    out = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert out[0] == (0.010, 10) and out[1:] == [(round(0.001 * i, 9), 1) for i in range(11, 21)]
    assert engine.stats.decoded_tokens == 20
