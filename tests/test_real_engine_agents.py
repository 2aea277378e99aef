"""experiments.real_engine_agents: N agents on one vLLM whose KV budget binds, beside the simulated engine.

The pure parts (a run's figures, the KV series, the calibration, the simulated twin) run everywhere; the
tests marked real_engine start a vLLM worker of their own with a KV budget of 65 blocks (the shared session
worker's 1 GiB never binds) and skip, saying why, where no interpreter can import vLLM.
"""

from __future__ import annotations

import math

import attrs
import pytest
import trio

from experiments import real_engine_agents as agents
from experiments.real_engine_agents import AgentsRun, CallFigures, EngineProfile
from prototype.client.harness import CHAINED, SUSPENDED, RolloutRecord
from prototype.engine.engine import ModelCall
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel

# --- a run's figures -----------------------------------------------------------------------------------------------


def test_kv_summary_weights_each_poll_by_how_long_it_held():
    peak, mean_kv, waiting = agents.kv_summary([(0.0, 100, 1, 0), (1.0, 300, 2, 2), (3.0, 0, 0, 0)])
    assert (peak, mean_kv, waiting) == (300, pytest.approx((100 * 1 + 300 * 2) / 3), pytest.approx((0 * 1 + 2 * 2) / 3))


def _record(name: str, seconds: float, status: str = "completed") -> RolloutRecord:
    return RolloutRecord(design=CHAINED, workload=name, started_at=0.0, ended_at=seconds, status=status)


def _run(engine: str, *, prefill: int, recomputed: int, preemptions: int) -> AgentsRun:
    calls = [CallFigures("a", 0, 600, 600, 0.10, 0.0), CallFigures("a", 1, 800, 150, 0.02, None),
             CallFigures("b", 0, 600, 120, 0.05, 0.01), CallFigures("b", 1, 900, 250, 0.04, 0.03)]
    return AgentsRun(engine, CHAINED, 2, [_record("t0", 10.0), _record("t1", 20.0)], calls, makespan_s=20.0,
                     prefill_tokens=prefill, recomputed_tokens=recomputed, preemptions=preemptions,
                     kv_series=[(0.0, 100, 1, 0), (1.0, 300, 2, 2), (3.0, 0, 0, 0)])


def test_vllm_prefill_per_task_is_its_calls_figures_plus_an_equal_share_of_what_the_scheduler_computed_beyond_them():
    # The calls' own figures: task a 750, task b 370 (1,120); vLLM's scheduler computed 1,320: 200 beyond them
    # (a recompute after a first token), 100 a task.
    figures = agents.figures(_run("vllm", prefill=1320, recomputed=200, preemptions=3))
    assert figures["prefill_per_task"].value == pytest.approx(660.0)
    assert (figures["prefill_per_task"].low, figures["prefill_per_task"].high) == pytest.approx((470.0, 850.0))
    assert figures["recomputed_per_task"].value == 100.0
    # Tokens of the prompts the engine did not compute: a 1,400 - 750, b 1,500 - 370.
    assert figures["served_per_task"].value == pytest.approx((650 + 1130) / 2)
    # Preemptions per task and tasks per hour: counts over an exposure, with exact Poisson intervals.
    assert figures["preemptions_per_task"].value == 1.5 and figures["preemptions_per_task"].n == 3
    tasks_per_hour = figures["tasks_per_hour"]
    assert (tasks_per_hour.value, tasks_per_hour.method) == (pytest.approx(2 / (20 / 3600)), "exact Poisson")
    assert figures["ttft_p50_ms"].value == pytest.approx(45.0) and figures["ttft_p50_ms"].n == 4
    # A resumed chunk's admission wait is not known (None): the mean is over the three new requests.
    assert figures["queued_mean_ms"].value == pytest.approx(40 / 3) and figures["queued_mean_ms"].n == 3
    assert figures["kv_peak_tokens"].value == 300


def test_a_simulated_runs_prefill_per_task_is_its_calls_uncached_tokens_alone():
    # The simulated engine knows each call's uncached tokens, recompute included: no share is added.
    figures = agents.figures(_run("sim", prefill=1120, recomputed=90, preemptions=1))
    assert (figures["prefill_per_task"].value, figures["recomputed_per_task"].value) == (pytest.approx(560.0), 45.0)


def test_a_run_that_completed_nothing_has_no_throughput():
    run = attrs.evolve(_run("vllm", prefill=1120, recomputed=0, preemptions=0), makespan_s=math.nan,
                       records=[_record("t0", 0.0, "incomplete")], stalled=True)
    assert math.isnan(agents.figures(run)["tasks_per_hour"].value)


def test_calls_pair_across_engines_by_their_sessions_first_prompt():
    assert agents.fingerprint(Prompt(range(100))) == agents.fingerprint(Prompt(list(range(100))))
    assert agents.fingerprint(Prompt(range(100))) != agents.fingerprint(Prompt(range(1, 101)))
    # An http turn routed away belongs to its home conversation.
    assert agents.session_of(("http-elsewhere", "home", 3)) == "home" and agents.session_of("home") == "home"


# --- the budget ----------------------------------------------------------------------------------------------------


def test_the_budget_spec_gives_vllm_the_blocks_and_a_window_the_budget_holds():
    spec = agents.budget_spec(97, max_num_seqs=3)
    assert (spec.max_model_len, agents.budget_tokens(spec)) == (96 * 32, 96 * 32)
    assert (spec.engine_settings()["num_gpu_blocks_override"], spec.engine_settings()["max_num_seqs"]) == (97, 3)


def test_the_admission_cap_lets_every_active_session_reach_its_longest_context():
    tasks = agents.agent_tasks(8)
    longest = max(sum(t.appended_tokens + t.output_tokens for t in task.turns) for task in tasks)
    cap = agents.admission_cap(agents.budget_spec(97), tasks)
    assert cap * (math.ceil(longest / 32) + 1) <= 96 < (cap + 1) * (math.ceil(longest / 32) + 1)


# --- the calibration -----------------------------------------------------------------------------------------------


def test_the_calibration_recovers_the_terms_a_noiseless_profile_was_made_with():
    overhead, rate, q = 0.01, 20_000.0, 1e7
    base, per_call, busy_per_call = 0.002, 0.0005, 0.001
    model = LatencyModel(prefill_tokens_per_s=rate, cache_attention=q, request_overhead=overhead)
    prefill = tuple((n, c, model.prefill_seconds(n, c)) for n in (32, 128, 512, 1024) for c in (0, 1024))
    decode = tuple((b, base + per_call * b) for b in (1, 2, 4, 8, 16))
    busy = tuple((b, 256, model.prefill_seconds(256, 0) + busy_per_call * b) for b in (0, 2, 4, 8))
    calibration = agents.calibrate(EngineProfile(prefill, decode, busy, (0.0, 0.0)))
    latency = calibration.latency
    assert (latency.request_overhead, latency.prefill_tokens_per_s, latency.cache_attention) == pytest.approx((overhead, rate, q))
    assert 1 / latency.decode_tokens_per_s == pytest.approx(base + per_call)  # one call decoding alone
    assert (calibration.decode_batch_s, calibration.prefill_batch_s) == pytest.approx((per_call, busy_per_call))
    # Too few busy-prefill points to fit a line with one round to spare: no batch term for the prefill.
    few = agents.calibrate(EngineProfile(prefill, decode, busy[:3], (0.0, 0.0)))
    assert (few.prefill_batch_s, few.busy_fit) == (0.0, None)


# --- the simulated twin --------------------------------------------------------------------------------------------


LATENCY = LatencyModel(decode_tokens_per_s=100.0, prefill_tokens_per_s=10_000.0, cache_attention=None, request_overhead=0.01)


async def test_the_simulated_engines_batch_terms_slow_each_call_by_the_others_in_flight(autojump_clock):
    engine = agents.simulated_engine(CHAINED, 2, 100_000, decode_batch_s=0.001, prefill_batch_s=0.05)
    first = await engine.begin_call("a", Prompt(range(1000)))
    # Alone: prefill 10 ms + 1,000 / 10,000 s; 10 tokens at 100 a second.
    await engine.prefill_call(LATENCY, ModelCall("a", Prompt(range(1000)), held=False, output_tokens=10), engine_call=first)
    assert engine.calls[-1].ttft_s == pytest.approx(0.11)
    start = trio.current_time()
    assert await engine.decode_unstreamed(LATENCY, 10, start=start, engine_call=first) == pytest.approx(start + 0.1)
    second = await engine.begin_call("b", Prompt(range(5000, 6000)))
    # With another call in flight: the prefill takes 50 ms more, each token 1 ms more.
    await engine.prefill_call(LATENCY, ModelCall("b", Prompt(range(5000, 6000)), held=False, output_tokens=10), engine_call=second)
    assert engine.calls[-1].ttft_s == pytest.approx(0.16)
    start = trio.current_time()
    assert await engine.decode_unstreamed(LATENCY, 10, start=start, engine_call=second) == pytest.approx(start + 0.11)
    engine.end_call(first)
    engine.end_call(second)


@pytest.mark.parametrize("when_scheduled", [False, True])
async def test_agents_that_start_together_find_the_first_ones_prefix_only_when_looked_up_as_their_prefill_starts(
        autojump_clock, when_scheduled):
    engine = agents.simulated_engine(CHAINED, 2, 100_000, lookup_when_scheduled=when_scheduled)
    shared = list(range(512))
    prompts = {"a": Prompt(shared + list(range(1000, 1100))), "b": Prompt(shared + list(range(2000, 2100)))}

    async def call(key: str) -> None:
        engine_call = await engine.begin_call(key, prompts[key])
        await engine.prefill_call(LATENCY, ModelCall(key, prompts[key], held=False, output_tokens=1), engine_call=engine_call)
        engine.retain(key, prompts[key], trio.current_time())
        engine.end_call(engine_call)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "a")
        nursery.start_soon(call, "b")
    first, second = engine.calls
    assert first.computed == 612
    # Admitted together: the second is looked up before the first has computed anything, unless the lookup
    # waits for its prefill's turn (the one before it then holds the shared 512 tokens: 32 blocks of 16).
    assert second.computed == (100 if when_scheduled else 612)
    # Serial prefill either way: the second's first token comes after the first's prefill and its own.
    assert second.ttft_s == pytest.approx(2 * 0.01 + (612 + second.computed) / 10_000)


def test_the_simulated_engine_preempts_a_held_session_where_vllm_would_stall():
    # Two v1 agents whose contexts together outgrow a 1,536-token budget: the simulated engine's hold policy
    # preempts the younger session's idle KV for the older one, so both finish, the younger computing again.
    tasks = agents.agent_tasks(2)
    run = agents.run_simulated(SUSPENDED, tasks, budget=1536, latency=LATENCY, decode_tps=100.0)
    assert run.completed == 2 and not run.stalled
    assert run.preemptions >= 1 and run.recomputed_tokens > 0
    assert sum(call.computed for call in run.calls) == run.prefill_tokens
    # Every call is paired to a task by its session's first prompt, and both tasks' calls are there.
    assert len({call.task for call in run.calls}) == 2
    assert sorted(call.index for call in run.calls if call.task == run.calls[0].task) == list(range(4))


def test_the_same_tasks_give_the_same_fingerprints_in_every_design():
    tasks = agents.agent_tasks(2)
    suspended = agents.run_simulated(SUSPENDED, tasks, budget=100_000, latency=LATENCY, decode_tps=100.0)
    chained = agents.run_simulated(CHAINED, tasks, budget=100_000, latency=LATENCY, decode_tps=100.0)
    assert {call.task for call in suspended.calls} == {call.task for call in chained.calls}
    # With room to spare v1 recomputes nothing; chained only each hit's last partial block (16-token blocks).
    assert (suspended.recomputed_tokens, suspended.preemptions, chained.preemptions) == (0, 0, 0)
    assert 0 < chained.recomputed_tokens < 16 * len(chained.calls)


# --- on vLLM -------------------------------------------------------------------------------------------------------


async def _tokens(events, first_only: bool = False) -> int:
    """Tokens a request's channel delivers until its chunk is done (or its first, with `first_only`)."""
    got = 0
    async for event in events:
        if event["type"] == "tokens":
            got += event["n"]
            if first_only:
                return got
        elif event["type"] in ("chunk_done", "finished"):
            return got
        elif event["type"] == "error":
            raise AssertionError(event["message"])
    return got


@pytest.mark.real_engine
@pytest.mark.slow
async def test_vllm_never_preempts_a_paused_held_request_so_a_resume_waits_for_its_blocks(vllm_budget_worker):
    from prototype.engine.vllm_client import VllmClient

    async with VllmClient.over_fds(vllm_budget_worker) as client:
        before = await client.counters()
        # Two held (v1) requests that together fill all 64 blocks once they pause.
        a = await client.generate("held-a", list(range(10_000, 11_000)), 4, salt="pause", held=True)
        assert await _tokens(a) == 4  # 1,003 tokens held: 32 blocks
        b = await client.generate("held-b", list(range(20_000, 21_020)), 4, salt="pause", held=True)
        assert await _tokens(b) == 4  # 1,023 tokens held: 32 blocks
        # A's next chunk needs a 33rd block. Nothing runs, nothing is free, and B is paused: vLLM waits for B
        # rather than preempting it (a preempting engine would give A its first token here at once).
        await client.append("held-a", list(range(30_000, 30_040)), 4)
        with trio.move_on_after(2.0) as waited:
            await _tokens(a, first_only=True)
        assert waited.cancelled_caught
        stalled = await client.counters()
        assert stalled["kv_usage"] == 1.0 and stalled["preemptions"] == before["preemptions"]
        # Once B's session ends, A resumes: it computes its 40 appended ids, no more, and nothing was preempted.
        await client.close("held-b")
        assert await _tokens(a) == 4
        after = await client.counters()
        assert after["prefill_tokens"] - stalled["prefill_tokens"] == 40 and after["preemptions"] == before["preemptions"]
        await client.close("held-a")
        with trio.fail_after(120):
            async for _ in a:
                pass
            async for _ in b:
                pass


@pytest.mark.real_engine
@pytest.mark.slow
def test_agents_experiment_at_tiny_size(vllm_budget_worker, monkeypatch, tmp_path, capsys):
    from experiments import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    blocks = vllm_budget_worker.ready.kv_blocks  # 65: 64 usable blocks of 32 tokens
    result = agents.main(["--kv-blocks", str(blocks), "--agents", "2", "--designs", CHAINED, "--profile-reps", "1"],
                         worker=vllm_budget_worker)
    ((real, sim),) = result["pairs"]
    assert (real.engine, sim.engine, real.completed, sim.completed) == ("vllm", "sim", 2, 2)
    # vLLM's scheduler computed each call's own figure (its sent ids less the prefix vLLM found, a recompute before
    # its first token included) and, beyond them, at most what preempted requests computed again.
    assert 0 <= real.prefill_tokens - sum(call.computed for call in real.calls) <= real.recomputed_tokens
    # The same calls on both engines: every vLLM call has its simulated twin, with the same prompt.
    twins = {(call.task, call.index): call for call in sim.calls}
    assert len(twins) == len(real.calls)
    assert all(twins[(call.task, call.index)].prompt_tokens == call.prompt_tokens for call in real.calls)
    assert real.kv_series and max(kv for _, kv, _, _ in real.kv_series) <= agents.budget_tokens(agents.budget_spec(blocks))
    assert "KV (vLLM | simulated engine)" in capsys.readouterr().out
    written = next((tmp_path / "real_engine_agents").glob("2*"))
    assert {path.name for path in written.iterdir()} >= {"real_engine_agents.csv", "real_engine_agents_calls.csv"}
