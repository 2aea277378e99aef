"""The side-by-side benchmark (prototype/benchmark.py): a rollout's phases and task row, the summary per (design, speed),
the parameters printed for each kind of configuration, and the runs under virtual time, in real time and on vLLM."""

from __future__ import annotations

import contextlib
import gc
import math

import attrs
import pytest
import trio

from prototype import benchmark, sweep, virtual, workload
from prototype.api.costs import BEFORE_SPRINT, ApiCosts
from prototype.api.workloads import WorkloadCatalog
from prototype.client.harness import RolloutRecord, TurnRecord
from prototype.client.reconnect import CODEX, NEVER, OPENAI_PYTHON
from prototype.clock import PreciseClock
from prototype.engine.engine import Engine
from prototype.engine.latency import LatencyModel
from prototype.engine.vllm_models import TINY_CPU


def a_record() -> RolloutRecord:
    turns = [
        TurnRecord(0, 1.0, first_token_at=1.5, ended_at=2.0, tool_seconds=0.5, bytes_sent=100, bytes_received=1000,
                   server_timing={"phases_ms": {"validate": 100.0, "post": 50.0, "prefill": 200.0, "post_overlapped": 40.0}}),
        TurnRecord(1, 2.5, ended_at=2.6, bytes_sent=301, bytes_received=10, server_timing={"phases_ms": {"route": 300.0}}),
        TurnRecord(2, 3.0, first_token_at=3.25, ended_at=4.5)]
    return RolloutRecord(
        "suspended", "task-7", 1.0, ended_at=4.5, reconnects=2, resent_bytes=30, recovery_seconds=[0.25], fell_back_to_http=True,
        turns=turns, usage={"input_tokens": 500, "cached_tokens": 100, "output_tokens": 40},
        transcript=[{"type": "web_search_call"}, *[{"type": "function_call"}] * 2, {"role": "user"}, {"type": "function_call"}])


def test_a_rollouts_turn_phases_are_the_servers_the_rest_network_and_tool_time_and_its_task_row_holds_its_figures():
    phases = benchmark.turn_phases(a_record())
    assert phases == [pytest.approx({"validate": 0.1, "post": 0.05, "prefill": 0.2, "network_client": 0.65, "tool": 0.5}),
                      {"route": 0.3, "network_client": 0.0, "tool": 0.0}, {"network_client": 1.5, "tool": 0.0}]
    row = benchmark.task_row("suspended", 65.0, a_record())
    assert row.pop("ttft_s") == [0.5, 0.25] and row.pop("recovery_s") == [0.25]
    assert row.pop("phase_totals_s") == pytest.approx(
        {"validate": 0.1, "post": 0.05, "prefill": 0.2, "network_client": 2.15, "tool": 0.5, "route": 0.3})
    assert row == pytest.approx({
        "design": "suspended", "decode_tps": 65.0, "task": "task-7", "turns": 3, "e2e_s": 3.5, "api_overhead_s": 0.1 + 0.05 + 0.3,
        "bytes_sent_per_turn": 401 / 3, "bytes_received_per_turn": 1010 / 3, "input_tokens": 500, "cached_tokens": 100,
        "output_tokens": 40, "reasoning_tokens": 0, "web_searches": 1, "function_calls": 3, "reconnects": 2, "resent_bytes": 30,
        "fell_back_to_http": True})
    record = a_record()
    record.usage["reasoning_tokens"] = 9
    assert benchmark.task_row("x", 1.0, record)["reasoning_tokens"] == 9


def a_row(design, tps, e2e, turns=2, **changes):
    row = {"design": design, "decode_tps": tps, "e2e_s": e2e, "turns": turns, "ttft_s": [e2e / 10], "api_overhead_s": e2e / 4,
           "bytes_sent_per_turn": 100.0, "bytes_received_per_turn": 10.0, "input_tokens": 100, "cached_tokens": 25,
           "output_tokens": 10, "reasoning_tokens": 2, "web_searches": 1, "function_calls": 1, "reconnects": 1}
    row.update(changes)
    return row


def test_the_summary_has_one_row_per_design_and_speed_in_order():
    rows = [a_row("suspended", 1000.0, 2.0, turns=3, bytes_sent_per_turn=50.0, ttft_s=[0.1, 0.3], function_calls=4, reconnects=2),
        a_row("http", 1000.0, 8.0), a_row("suspended", 1000.0, 6.0, turns=1, ttft_s=[0.5], web_searches=2, reasoning_tokens=0),
        a_row("other", 65.0, 1.0), a_row("chained", 65.0, 1.0, cached_tokens=0, input_tokens=0, output_tokens=0),
        a_row("http-stored", 65.0, 3.0)]
    table = benchmark.summarize(rows)
    assert [(r["design"], r["decode_tps"]) for r in table] == [
        ("http-stored", 65.0), ("chained", 65.0), ("other", 65.0), ("http", 1000.0), ("suspended", 1000.0)]
    suspended = table[-1]
    # http ran one task at 1000 tokens/s and suspended two: no ratio between them (they must run the same tasks).
    for name in ("speedup_vs_http", "gain_vs_http", "ttft_p50_ratio_vs_http"):
        assert all(math.isnan(suspended.pop(name + part)) for part in ("", "_low", "_high"))
    intervals = {k: suspended.pop(k) for k in list(suspended) if k.endswith(("_low", "_high"))}
    assert sorted(intervals) == sorted(f"{name}{part}" for name in ("e2e_mean_s", "e2e_p50_s", "ttft_p50_ms") for part in ("_low", "_high"))
    assert suspended == pytest.approx({
        "design": "suspended", "decode_tps": 1000.0, "tasks": 2, "e2e_mean_s": 4.0, "e2e_p50_s": 4.0, "e2e_p90_s": 5.6,
        "ttft_p50_ms": 300.0, "api_overhead_share": 0.25, "bytes_sent_per_turn": (50.0 * 3 + 100.0) / 4,
        "bytes_received_per_turn": 10.0, "cached_share": 0.25, "reasoning_share": 0.1, "web_searches_per_task": 1.5,
        "calls_per_tool_turn": 5 / 2, "reconnects": 3})
    # Two tasks: the mean's interval runs between them; the turns' median between the turns the two tasks hold.
    assert intervals["e2e_mean_s_low"] >= 2.0 and intervals["e2e_mean_s_high"] <= 6.0
    assert 100.0 <= intervals["ttft_p50_ms_low"] <= 300.0 <= intervals["ttft_p50_ms_high"] <= 500.0
    assert isinstance(suspended["reconnects"], int)
    assert math.isnan(table[1]["speedup_vs_http"])  # no http at 65 tokens/s (only http-stored)
    assert math.isnan(table[1]["cached_share"]) and math.isnan(table[1]["reasoning_share"])


def test_the_summary_gives_each_design_its_gain_over_http_on_the_same_tasks_with_an_interval_over_them():
    http = [a_row("http", 1000.0, e, task=f"t{i}", ttft_s=[e / 10, e / 5]) for i, e in enumerate((10.0, 20.0, 40.0, 80.0))]
    twice = [a_row("chained", 1000.0, e / 2, task=f"t{i}", ttft_s=[e / 20, e / 10]) for i, e in enumerate((10.0, 20.0, 40.0, 80.0))]
    table = {r["design"]: r for r in benchmark.summarize(http + twice)}
    chained = table["chained"]
    # Twice as fast on every task: +50% on the means, 2x, and half the median TTFT, in every resample of the tasks.
    assert [benchmark.interval_of(chained, k) for k in ("gain_vs_http", "speedup_vs_http", "ttft_p50_ratio_vs_http")] == [
        benchmark.Estimate(v, v, v, 4, "tasks", "paired bootstrap") for v in (0.5, 2.0, 0.5)]
    ratios = ("speedup_vs_http", "gain_vs_http", "ttft_p50_ratio_vs_http")
    assert [benchmark.interval_of(table["http"], k) for k in ratios] == [  # http against itself: exactly 1x, no gain
        benchmark.Estimate(v, v, v, 4, "tasks", "paired bootstrap") for v in (1.0, 0.0, 1.0)]
    mean = benchmark.interval_of(chained, "e2e_mean_s")
    assert mean.value == 18.75 and 5.0 <= mean.low < 18.75 < mean.high <= 40.0 and (mean.n, mean.method) == (4, "bootstrap")
    # Faster on three tasks, slower on one: the gain's interval spans the per-task gains' range and the point.
    mixed = [a_row("chained", 1000.0, e * f, task=f"t{i}") for i, (e, f) in enumerate(zip((10.0, 20.0, 40.0, 80.0), (0.5, 0.6, 0.7, 1.2)))]
    gain = benchmark.interval_of(benchmark.summarize(http + mixed)[1], "gain_vs_http")
    assert gain.value == pytest.approx(1 - (5 + 12 + 28 + 96) / 150) and -0.2 <= gain.low < gain.value < gain.high <= 0.5
    # Each estimate carries its n, what n counts and how its interval was made.
    assert {name: (e.n, e.of, e.method) for name, e in benchmark.estimates(mixed, http).items()} == {
        name: (4, "tasks", "paired bootstrap" if name in ratios else "bootstrap") for name in benchmark.ESTIMATED}
    alone, itself = benchmark.estimates(mixed, None), benchmark.estimates(http, http)
    assert all(math.isnan(alone[k].value) and (alone[k].n, alone[k].of, alone[k].method) == (4, "tasks", "paired bootstrap")
               for k in ratios)
    assert [itself[k] for k in ratios] == [benchmark.Estimate(v, v, v, 4, "tasks", "exact") for v in (1.0, 0.0, 1.0)]
    # Another order of the tasks is not the same tasks: no ratio.
    assert math.isnan(benchmark.summarize(http + twice[::-1])[1]["gain_vs_http"])
    # Without intervals the values are the same and the ends NaN.
    bare = {r["design"]: r for r in benchmark.summarize(http + twice, intervals=False)}["chained"]
    assert bare["gain_vs_http"] == 0.5 and math.isnan(bare["gain_vs_http_low"]) and bare["e2e_mean_s"] == 18.75


def test_the_summary_reads_absent_counts_as_zero_and_a_task_without_turns_as_no_per_turn_figure():
    row = a_row("http", 65.0, 1.0, turns=1)
    for key in ("web_searches", "function_calls", "reconnects", "reasoning_tokens"):
        del row[key]
    [summary] = benchmark.summarize([row])
    assert (summary["web_searches_per_task"], summary["calls_per_tool_turn"], summary["reconnects"], summary["reasoning_share"]) == (
        0.0, 0.0, 0, 0.0)
    [summary] = benchmark.summarize([a_row("http", 65.0, 1.0, turns=1, function_calls=3)])
    assert summary["calls_per_tool_turn"] == 3.0  # a single-turn task's calls count as one tool turn's
    no_tokens = a_row("http", 65.0, 1.0)
    del no_tokens["input_tokens"], no_tokens["output_tokens"]
    [summary] = benchmark.summarize([no_tokens], intervals=False)
    assert math.isnan(summary["cached_share"]) and math.isnan(summary["reasoning_share"])  # no tokens counted: no share
    [summary] = benchmark.summarize([a_row("http", 65.0, 1.0, turns=0)])
    assert math.isnan(summary["bytes_sent_per_turn"]) and math.isnan(summary["bytes_received_per_turn"])
    rows = [a_row("http", 65.0, 1.0, turns=1, bytes_sent_per_turn=2.0, bytes_received_per_turn=4.0, cached_tokens=1,
                  input_tokens=4),
            a_row("http", 65.0, 1.0, turns=3, bytes_sent_per_turn=6.0, bytes_received_per_turn=12.0, input_tokens=4)]
    del rows[1]["cached_tokens"]
    [summary] = benchmark.summarize(rows, intervals=False)
    # Bytes per turn weighed by turn, as the figure does: (1 x 2 + 3 x 6) / 4 turns, not the mean of the tasks' means.
    assert (summary["bytes_sent_per_turn"], summary["bytes_received_per_turn"], summary["cached_share"]) == (5.0, 10.0, 0.125)


@pytest.mark.parametrize("policy, described", [
    (OPENAI_PYTHON, "openai-python: 5 retries, backoff 0.5 s x2"), (NEVER, "never: never"),  # codex's: DEFAULT_ROWS
])
def test_the_parameters_describe_the_reconnect_policy_by_its_retries_backoff_and_fallback(policy, described):
    rows = {name: value for name, value, _ in benchmark.parameters(benchmark.BenchConfig(reconnect=policy))}
    assert rows["client reconnects"] == described


DEFAULT_ROWS = [
    ("workload preset", "coding, 20 tasks, seed 0", "prototype/workload.py"),
    ("turns per task", "LN(15, 1.4) in [1, 300]", "docs/parameters.md Calibration: TraceLab"),
    ("initial prompt", "30000 tokens, of which 7400 common to every task", "docs/parameters.md Calibration: TraceLab"),
    ("common prefix", "Codex's base instructions and tools; the rest of each task from its own content seed; affinity draws "
     "per task and turn", "docs/parameters.md §1"),
    ("tokens appended per turn", "LN(875, 1.26)", "docs/parameters.md §1: TraceLab"),
    ("output tokens per turn", "LN(214, 1.34)", "docs/parameters.md Calibration: TraceLab"),
    ("parallel client calls", "35.8% of tool turns, 2/3/4 calls weighted 0.213/0.094/0.052", "docs/parameters.md §1: yurukusa/cc-multi"),
    ("hosted web_search", "4.8% of tool turns, 1 s, 1500 tokens", "docs/parameters.md §1: yurukusa/cc-multi [rate]; [assumed latency, size]"),
    ("reasoning share of output", "uniform 11%-45% per turn; encrypted_content >= 1700 chars",
     "docs/parameters.md §1: public Codex gpt-5.4 trace; LibreChat-AI/agents PR #422"),
    ("tool time", "mixture 0.65xLN(0.15 s, 1), 0.315xLN(4 s, 1.5), 0.035xLN(200 s, 1.2), cap 3600 s",
     "docs/parameters.md Calibration: TraceLab"),
    ("decode speeds", "65, 1000, 4000 tokens/s", "OpenAI blog: ~65 (GPT-5/5.2), >1000 and bursts to 4000 (Codex-Spark)"),
    ("prefill rate", "15000 tokens/s + n*C/9.4e+08", "docs/parameters.md §3 roofline [assumed R, derived Q]"),
    ("engine request overhead", "10 ms", "[assumed]; vLLM PR #54628 bounds it (8-12 ms)"),
    ("prefix cache", "blocks of 16, idle TTL 300 s, http affinity 0.9", "vLLM APC; vLLM RFC #52113; docs/parameters.md §6 [assumed affinity]"),
    ("network", "RTT 20 ms, TCP 1 + TLS 1 RTT per new connection", "docs/parameters.md §5: RFC 9293, RFC 8446 [assumed RTT]"),
    ("http connections", "kept alive", "[ours]"),
    ("v1 suspension TTL", "3600 s (default 300 s)", "vLLM RFC #52113 maximum; docs/protocol.md"),
    ("delta coalescing", "50 ms", "[ours]: first token immediate"),
    ("client reconnects", "codex: 5 retries, backoff 0.2 s x2 then HTTP", "prototype/client/reconnect.py: openai-python 3.63, Codex CLI"),
]


def test_the_parameters_of_the_default_configuration_another_preset_a_preset_file_fixed_turns_and_a_latency_profile():
    assert benchmark.parameters(benchmark.BenchConfig()) == DEFAULT_ROWS + ApiCosts().describe()
    rows = dict((name, (value, source)) for name, value, source in benchmark.parameters(benchmark.BenchConfig(preset="chat")))
    chat = workload.PRESETS["chat"]
    assert rows["workload preset"][0] == "chat, 20 tasks, seed 0"
    assert rows["turns per task"] == (f"LN({chat.turns_median:g}, {chat.turns_sigma:g}) in [{chat.turns_min}, {chat.turns_max}]",
                                      "docs/parameters.md §1: Exgentic moment fit, TraceLab p50")
    assert rows["initial prompt"][1] == "docs/parameters.md §1 [assumed]"
    assert rows["output tokens per turn"][1] == "docs/parameters.md §1: inference-perf, Exgentic, AgentX"
    # The chat preset's tools take a fixed time: that is the parameter in effect, not the mixture.
    assert rows["tool time"] == (f"fixed {chat.fixed_tool_seconds:g} s a call", "prototype/workload.py [assumed]")
    model = LatencyModel(decode_tokens_per_s=321.0, prefill_tokens_per_s=5000.0, cache_attention=None, request_overhead=0.0125)
    config = benchmark.BenchConfig(preset=workload.PRESETS["coding"], fixed_turns=4, n_tasks=3, seed=9, latency=model,
                                   keep_alive=False, flush_interval=0.025, http_affinity=0.5, reconnect=CODEX)
    rows = dict((name, (value, source)) for name, value, source in benchmark.parameters(config))
    assert rows["workload preset"][0] == "custom (preset file), 3 tasks, seed 9"
    assert rows["turns per task"] == ("fixed 4", "docs/parameters.md §1: Exgentic moment fit, TraceLab p50")
    assert rows["tool time"][1] == "docs/parameters.md §2: TraceLab quantiles, AgentCgroup centres"  # the mixture, uncalibrated
    assert rows["decode speeds"] == ("321 tokens/s unless --speeds", "latency profile (--latency)")
    assert rows["prefill rate"] == ("5000 tokens/s", "latency profile (--latency)")
    assert rows["engine request overhead"] == ("12.5 ms", "latency profile (--latency)")
    assert rows["prefix cache"][0] == "blocks of 16, idle TTL 300 s, http affinity 0.5"
    assert (rows["http connections"][0], rows["delta coalescing"][0]) == ("new per request", "25 ms")


def a_task(name, turns, arrival_s=None, prefix=None, prefix_tokens=0):
    return workload.Workload(name, 0, tuple(turns), arrival_s=arrival_s, prefix=prefix, prefix_tokens=prefix_tokens)


def test_a_task_lists_parameters_are_measured_from_its_tasks_open_loop_or_not_and_with_nothing_in_it():
    search = workload.HostedCall(seconds=2.0, result_tokens=300)
    tasks = (
        a_task("a", [workload.TurnSpec(100, 10, (1.0, 3.0), (search,), 4), workload.TurnSpec(10, 30, (9.0,)),
                     workload.TurnSpec(10, 60, ())], prefix="codex", prefix_tokens=64),
        a_task("b", [workload.TurnSpec(100, 100, (), (), 0)], prefix="", prefix_tokens=32),
    )
    config = benchmark.BenchConfig(task_list=tasks, source="trace t.jsonl (codex)")
    rows = benchmark.parameters(config)
    assert rows[:7] == [
        ("workload", "2 tasks from trace t.jsonl (codex)", "one task after another"),
        ("turns per task", "median 2, max 3", "measured from the tasks"),
        ("common prefix", "32 tokens (unnamed), 64 tokens (codex) shared by tasks of one provider and model; the rest of each "
         "task its own content", "the trace's cached first prompts (prototype/traces/base.py)"),
        ("parallel client calls", "50.0% of tool turns, 1.50 calls a tool turn", "measured from the tasks"),
        ("hosted web_search", "1 in 1 turns, median 2 s, 300 result tokens", "measured from the tasks"),
        ("reasoning share of output", "2.0% of 200 output tokens", "measured from the tasks"),
        ("tool time", "3 calls, p50 3 s, p90 7.8 s, max 9 s", "measured from the tasks"),
    ]
    assert rows[7:] == DEFAULT_ROWS[10:] + ApiCosts().describe()
    # An open-loop task list, and one with nothing in it.
    tasks = (a_task("a", [workload.TurnSpec(100, 1, ())], arrival_s=0.0), a_task("b", [workload.TurnSpec(100, 1, ())], arrival_s=5.0))
    rows = benchmark.parameters(benchmark.BenchConfig(task_list=tasks))
    assert rows[:7] == [
        ("workload", "2 tasks from an explicit task list", "open-loop: each task starts at its arrival"),
        ("turns per task", "median 1, max 1", "measured from the tasks"),
        ("common prefix", "none: every task its own content", "the trace's cached first prompts (prototype/traces/base.py)"),
        ("parallel client calls", "none", "measured from the tasks"),
        ("hosted web_search", "none", "measured from the tasks"),
        ("reasoning share of output", "0.0% of 2 output tokens", "measured from the tasks"),
        ("tool time", "no client calls", "measured from the tasks"),
    ]
    mixed = (tasks[0], a_task("c", [workload.TurnSpec(100, 1, ())]))
    assert benchmark.parameters(benchmark.BenchConfig(task_list=mixed))[0][2] == "one task after another"
    empty = benchmark.parameters(benchmark.BenchConfig(task_list=()))
    assert empty[:7] == [("workload", "0 tasks from an explicit task list", "one task after another"),
                         ("turns per task", "none", "measured from the tasks"), *rows[2:5],
                         ("reasoning share of output", "none", "measured from the tasks"), rows[6]]


def test_a_configurations_tasks_are_its_list_or_the_seeded_preset_and_its_server_has_its_api_and_a_long_suspension_ttl():
    tasks = (a_task("a", [workload.TurnSpec(100, 5, ())]),)
    assert benchmark.BenchConfig(task_list=tasks).tasks() == list(tasks)
    assert benchmark.BenchConfig(n_tasks=2, seed=3).tasks() == workload.generate("coding", seed=3, n_tasks=2)
    fixed = benchmark.BenchConfig(preset="chat", n_tasks=2, fixed_turns=3).tasks()
    assert (fixed, [len(t.turns) for t in fixed]) == (workload.generate("chat", seed=0, n_tasks=2, fixed_turns=3), [3, 3])
    own_turns = attrs.evolve(workload.PRESETS["coding"], fixed_turns=3)  # a preset file's own fixed turns, no --turns
    assert [len(t.turns) for t in benchmark.BenchConfig(preset=own_turns, n_tasks=2).tasks()] == [3, 3]
    config = benchmark.BenchConfig(flush_interval=0.125, http_affinity=0.5, latency=LatencyModel(prefill_tokens_per_s=1234.0),
                                   sprint=BEFORE_SPRINT, costs=ApiCosts(post=0.125))
    server = benchmark.bench_server(config)
    assert server.config.suspension_ttl == 3600.0
    assert (server.api.flush_interval, server.api.sprint, server.api.costs) == (0.125, BEFORE_SPRINT, ApiCosts(post=0.125))
    assert (server.api.latency.prefill_tokens_per_s, server.api.http_affinity) == (1234.0, 0.5)
    engine = server.api.engine
    assert benchmark.bench_server(config, engine).api.engine is engine


def fixed_tasks(n, arrivals=(None, None)):
    return [attrs.evolve(workload.fixed(2, initial_prompt_tokens=200, appended_tokens=20, output_tokens=5, tool_seconds=1.0,
                                        name=f"t{i}", content_seed=i), arrival_s=arrivals[i]) for i in range(n)]


@pytest.mark.parametrize("design", ["http", "http-stored", "chained", "suspended"])
def test_tasks_run_one_after_another_and_each_design_is_its_own(design):
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(2)))
    records = benchmark.run_design_virtual(design, 1000.0, config)
    assert [r.workload for r in records] == ["t0", "t1"] and records[1].started_at >= records[0].ended_at
    wire_name = {"http": "http-stateless"}.get(design, design)
    assert [(r.design, r.status, len(r.turns)) for r in records] == [(wire_name, "completed", 2)] * 2
    assert all(turn.server_timing is not None for r in records for turn in r.turns)  # the server's phases, asked for


def test_a_task_runs_at_the_decode_speed_asked_for_through_the_configurations_network_and_its_keep_alive():
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(1)))
    fast, slow = (benchmark.run_design_virtual("chained", tps, config)[0] for tps in (4000.0, 65.0))
    decode = [benchmark.task_row("chained", 1.0, r)["phase_totals_s"].get("decode", 0.0) for r in (fast, slow)]
    assert decode[1] > 5 * decode[0] > 0  # 10 tokens at 65 tokens/s against 4000
    far = attrs.evolve(config, network=attrs.evolve(config.network, rtt=1.0))
    [record] = benchmark.run_design_virtual("chained", 4000.0, far)
    assert record.seconds - fast.seconds > 2.0  # a handshake and two turns, each a round trip longer
    config = attrs.evolve(config, network=attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=0.1))  # http without keep-alive:
    kept = benchmark.run_design_virtual("http", 4000.0, config)[0]
    new = benchmark.run_design_virtual("http", 4000.0, attrs.evolve(config, keep_alive=False))[0]
    assert new.seconds - kept.seconds >= 0.19  # the second request's TCP and TLS round trips


def test_tasks_with_arrivals_start_at_their_arrivals_whether_or_not_earlier_ones_are_done():
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(2, arrivals=[0.0, 0.5])))
    records = benchmark.run_design_virtual("chained", 1000.0, config)
    assert [(r.workload, r.design) for r in records] == [("t0", "chained"), ("t1", "chained")]
    assert records[1].started_at - records[0].started_at == pytest.approx(0.5)
    assert records[1].started_at < records[0].ended_at  # the first task takes over a second (its tool)


def test_a_task_that_does_not_complete_fails_the_run():
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(1)))

    class Catalog(WorkloadCatalog):
        def register(self, task):
            return "no-such-workload"  # the server refuses the request with an error event

    async def main():
        server = benchmark.bench_server(config)
        server.api.workloads = Catalog()
        await benchmark.run_design("suspended", 1000.0, config.tasks(), config, server=server)

    with pytest.raises(benchmark.TaskFailed) as failed:
        virtual.run(main)
    assert str(failed.value) == "suspended at 1000 tokens/s: task t0 ended 'error:invalid_value'"


def test_a_design_run_and_a_sweep_give_the_rows_of_each_design_at_each_value():
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(1)))
    run = benchmark.DesignRun("chained", 1000.0, config)
    assert [(r.workload, r.design) for r in benchmark.design_records(run)] == [("t0", "chained")]
    assert benchmark.design_rows(run) == [benchmark.task_row("chained", 1000.0, r) for r in run.records()]
    descs = []

    class Runner(sweep.Runner):
        def map(self, fn, grid, **kwargs):
            descs.append(kwargs["desc"])
            return super().map(fn, grid, **kwargs)

    with Runner(sweep.InProcess(), cache=None, progress=False) as runner:
        rows = benchmark.design_sweep(runner, "rtt", [1, 2], lambda value: (500 * value, config), designs=["chained", "http"])
    assert descs == ["rtt"]
    assert [(r["rtt"], r["design"], r["decode_tps"]) for r in rows] == [
        (1, "chained", 500.0), (1, "http", 500.0), (2, "chained", 1000.0), (2, "http", 1000.0)]
    assert isinstance(rows[0]["decode_tps"], float)
    assert [r["design"] for r in benchmark.design_sweep(runner, "rtt", [1], lambda value: (500, config))] == list(benchmark.DESIGNS)


def test_a_design_in_real_time_runs_over_loopback_sockets_measured_after_the_collectors_settling(monkeypatch):
    task = workload.fixed(2, initial_prompt_tokens=50, appended_tokens=10, output_tokens=3, tool_seconds=0.01, name="r")
    config = benchmark.BenchConfig(task_list=(task,), network=attrs.evolve(benchmark.DEFAULT_NETWORK, rtt=0.0))
    connectors, ports, opened, clocks, collections, inside = [], [], [], [], [], [False]
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(inside[0]) or collect(*args))

    @contextlib.contextmanager
    def measured():
        inside[0] = True
        yield
        inside[0] = False

    tcp, serve = benchmark.TcpConnector, benchmark.serve_responses

    class Counting(tcp):
        def open_stream(self):
            opened.append(self.port)
            return super().open_stream()

    def connector(host, port, network):
        connectors.append((host, network))
        return Counting(host, port, network)

    async def serving(server, port=0, **kwargs):
        ports.append(port)
        clocks.append(type(trio.lowlevel.current_clock()))  # timers fire at their deadlines, not up to 1 ms after
        return await serve(server, port, **kwargs)

    monkeypatch.setattr(benchmark, "TcpConnector", connector)
    monkeypatch.setattr(benchmark, "serve_responses", serving)
    [record] = benchmark.run_design_real("chained", 4000.0, config, measured=measured)
    # profile_turn measures the run alone: the collector's settling (a full collection, tens of ms) comes before, or it
    # would be charged to the turns as "server logic".
    assert collections == [False]
    assert connectors == [("127.0.0.1", config.network)] and ports == [0]  # a port the system picks
    assert clocks == [PreciseClock]
    assert len(opened) == 1 and opened[0] > 0  # the rollout's connection went over loopback TCP
    assert (record.design, record.workload, record.status, len(record.turns)) == ("chained", "r", "completed", 2)
    assert len(record.response_ids) == 2 and all(turn.server_timing is not None for turn in record.turns)
    calls = []  # a design run goes to the real-time runner when asked, else to the virtual one
    monkeypatch.setattr(benchmark, "run_design_real", lambda *args: calls.append(("real", *args)) or [])
    monkeypatch.setattr(benchmark, "run_design_virtual", lambda *args: calls.append(("virtual", *args)) or [])
    benchmark.DesignRun("chained", 65.0, config, real=True).records()
    benchmark.DesignRun("http", 4000.0, config).records()
    assert calls == [("real", "chained", 65.0, config), ("virtual", "http", 4000.0, config)]


@attrs.define(eq=False)
class StandInEngine(Engine):
    """The simulated engine, with the record of calls a real engine keeps."""

    records: list = attrs.field(factory=list)


@pytest.fixture
def vllm_stand_ins(monkeypatch):
    """vLLM's worker process and engine replaced by stand-ins; what they were asked, in order."""
    events = []

    @contextlib.asynccontextmanager
    async def worker(spec, *, python=None):
        events.append(("worker", spec.name, python))
        yield f"client-{len(events)}"

    @contextlib.asynccontextmanager
    async def engine(spec, *, client, namespace):
        standin = StandInEngine(records=[namespace])
        events.append(("engine", client, namespace, spec, standin))
        yield standin

    monkeypatch.setattr(benchmark, "open_vllm_process", worker)
    monkeypatch.setattr(benchmark, "open_vllm_engine", engine)
    return events


@pytest.mark.parametrize("parallel", [False, True])
def test_each_design_on_the_real_engine_gets_an_engine_of_its_own_in_the_runs_namespace(parallel, vllm_stand_ins):
    options = {"parallel": True} if parallel else {}  # one worker by default, one per design when parallel
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(1)))
    results = benchmark.run_designs_on_vllm(["chained", "http"], config, TINY_CPU, python="/p/python", decode_tps=4000.0, **options)
    assert {design: [(r.design, r.status) for r in records] for design, (records, _) in results.items()} == {
        "chained": [("chained", "completed")], "http": [("http-stateless", "completed")]}
    engines = [e for e in vllm_stand_ins if e[0] == "engine"]
    assert [(spec, standin.stats.model_calls) for *_, spec, standin in engines] == [(TINY_CPU, 2)] * 2  # each design's own
    # Each design's calls under its own name and one suffix for the run (vLLM's prefix cache is not shared across them).
    [chained], [http] = results["chained"][1], results["http"][1]
    assert chained.startswith("chained-") and http == "http-" + chained.removeprefix("chained-") and len(http) == 13
    workers = [e for e in vllm_stand_ins if e[0] == "worker"]
    assert workers == [("worker", "tiny-llama-cpu", "/p/python")] * (2 if parallel else 1)
    assert len({client for _, client, *_ in engines}) == (2 if parallel else 1)


def test_the_real_engine_over_a_running_worker_uses_its_pipes(monkeypatch, vllm_stand_ins):
    @contextlib.asynccontextmanager
    async def over_fds(process):
        vllm_stand_ins.append(("piped", process))
        yield "piped"

    monkeypatch.setattr(benchmark.VllmClient, "over_fds", over_fds)
    config = benchmark.BenchConfig(task_list=tuple(fixed_tasks(1)))
    results = benchmark.run_designs_on_vllm(["suspended"], config, TINY_CPU, worker="the-worker", parallel=True)
    assert [e[:2] for e in vllm_stand_ins] == [("piped", "the-worker"), ("engine", "piped")]  # no new worker
    assert [r.status for r in results["suspended"][0]] == ["completed"] and len(results["suspended"][1]) == 1
