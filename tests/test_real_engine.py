"""The designs over vLLM's CPU build (tiny Llama-shaped model, dummy weights, one process per session:
conftest.vllm_worker), read through vLLM's own counters and sampled ids; skipped, saying why, without vLLM."""

from __future__ import annotations

import pytest

from prototype import benchmark
from prototype.api.costs import ZERO_COSTS
from prototype.engine.engine import ModelCall, PlannedOutput
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel
from prototype.engine.vllm_client import VllmClient
from prototype.engine.vllm_engine import open_vllm_engine
from prototype.engine.vllm_models import TINY_CPU

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

LATENCY = LatencyModel()


def model_calls(task) -> int:
    """A turn is one model call, and one more after each hosted web_search it makes."""
    return sum(1 + len(turn.hosted_calls) for turn in task.turns)


async def _call(engine, key, prompt: Prompt, *, held: bool, output_tokens: int, plan: list[int] | None = None):
    """One model call as the sampling loop makes it (sampling `plan`, all of it text, if given); returns vLLM's record of it."""
    planned = (lambda: PlannedOutput.of([(plan, len(plan))])) if plan else None
    call = await engine.begin_call(key, prompt, pinned=held)
    await engine.prefill_call(LATENCY, ModelCall(key, prompt, held=held, output_tokens=output_tokens, planned=planned),
                              engine_call=call)
    await engine.decode_unstreamed(LATENCY, output_tokens, start=0.0, engine_call=call)
    engine.end_call(call, paused=True)
    return engine.records[-1]


async def _sampled(events) -> list[int]:
    """The ids a request's chunk sampled, up to its chunk_done (or the request's end)."""
    ids = []
    async for event in events:
        if event["type"] == "error":
            raise AssertionError(event["message"])
        ids += event.get("ids", [])
        if event["type"] == "chunk_done":
            break
    return ids


async def test_vllm_samples_exactly_the_planned_ids_in_plain_and_held_requests(vllm_worker):
    plan = list(range(60_000, 60_040))
    async with VllmClient.over_fds(vllm_worker) as client:
        # A plain request, and each chunk of a held (streaming-input) request with a plan of its own.
        assert await _sampled(await client.generate("forced-plain", list(range(100, 400)), 40, forced=plan, salt="ids")) == plan
        held = await client.generate("forced-held", list(range(500, 800)), 10, forced=plan[:10], salt="ids", held=True)
        assert await _sampled(held) == plan[:10]
        await client.append("forced-held", [plan[9], 7, 8, 9], 5, forced=plan[20:25])
        assert await _sampled(held) == plan[20:25]
        await client.close("forced-held")
        # Without a plan vLLM samples as its dummy weights say: not the plan.
        assert await _sampled(await client.generate("free", list(range(100, 400)), 40, salt="ids")) != plan


async def test_resume_prefills_appended_ids_chained_hits_cache_routing_miss_recomputes(vllm_worker):
    block = vllm_worker.ready.block_size
    async with VllmClient.over_fds(vllm_worker) as client, open_vllm_engine(TINY_CPU, client=client, namespace="counters") as engine:
        # v1: one held request; its resume sends only the ids past what it holds, and vLLM computes exactly those.
        prompt = Prompt(range(10_000, 10_600))
        opened = await _call(engine, ("suspended", "r1"), prompt, held=True, output_tokens=8)
        assert (opened.resumed, opened.sent_tokens, opened.prefill_tokens) == (False, 600, 600)
        prompt.extend(range(20_000, 20_108))  # the 8 sampled tokens rendered, then a 100-token tool output
        resumed = await _call(engine, ("suspended", "r1"), prompt, held=True, output_tokens=8)
        # The request holds 600 + 8 - 1 tokens (vLLM never feeds back the last sample): 101 are new.
        assert (resumed.resumed, resumed.prompt_tokens, resumed.sent_tokens) == (True, 708, 101) and resumed.prefill_tokens == 101
        # The held KV is not a cache hit: no hit is counted, and num_cached_tokens keeps the first chunk's 0.
        assert resumed.prefix_hits == resumed.vllm_cached_tokens == 0
        # A compacted context is rendered anew: it does not extend what the request holds, so the request is
        # closed and a new one computes the whole compacted prompt (nothing of it was ever computed).
        compacted = Prompt(range(50_000, 50_300))
        reopened = await _call(engine, ("suspended", "r1"), compacted, held=True, output_tokens=8)
        assert (reopened.resumed, reopened.sent_tokens, reopened.prefill_tokens, reopened.prefix_hits) == (False, 300, 300, 0)
        compacted.extend(range(60_000, 60_050))  # and the new request is the one held from then on
        after = await _call(engine, ("suspended", "r1"), compacted, held=True, output_tokens=8)
        assert (after.resumed, after.sent_tokens, after.prefill_tokens) == (True, 43, 43)
        engine.release(("suspended", "r1"))

        # chained: a new request per turn; the second finds the first's prompt and its output, which it sampled
        # to the plan (the transcript's ids), in the prefix cache: every whole block of the 19.5 blocks of prompt
        # and the 60 output tokens (the last sampled one never computed): 21 blocks of 32, where the prompt alone has 19.
        prompt, output = Prompt(range(30_000, 30_000 + 20 * block - block // 2)), list(range(40_000, 40_060))
        first = await _call(engine, ("chained", "c1"), prompt, held=False, output_tokens=60, plan=output)
        assert (first.prefill_tokens, first.prefix_hits, first.off_plan_tokens) == (len(prompt), 0, 0)
        prompt.extend([*output, *range(41_000, 41_100)])  # the output as rendered, then a tool's output
        second = await _call(engine, ("chained", "c1"), prompt, held=False, output_tokens=8)
        found = (first.prompt_tokens + len(output) - 1) // block * block
        assert found > first.prompt_tokens // block * block  # part of the output is found, not the prompt alone
        assert second.prefix_hits == second.vllm_cached_tokens == found and second.prefill_tokens == len(prompt) - found

        # http routed away from its prefix: the same prompt, isolated, finds nothing and is recomputed whole.
        engine.isolate(("http-elsewhere", "h1"))
        miss = await _call(engine, ("http-elsewhere", "h1"), Prompt(prompt.ids), held=False, output_tokens=8)
        assert (miss.isolated, miss.prefix_hits, miss.vllm_cached_tokens) == (True, 0, 0) and miss.prefill_tokens == len(prompt)
        engine.release(("http-elsewhere", "h1"))


@pytest.mark.parametrize("design", benchmark.DESIGNS)
async def test_design_end_to_end_over_vllm(vllm_worker, design):
    config = benchmark.BenchConfig(preset="chat", n_tasks=1, fixed_turns=3, costs=ZERO_COSTS)
    async with VllmClient.over_fds(vllm_worker) as client, open_vllm_engine(TINY_CPU, client=client, namespace=f"e2e-{design}") as engine:
        server = benchmark.bench_server(config, engine=engine)
        (record,) = await benchmark.run_design(design, 1000.0, config.tasks(), config, server=server)
        calls = engine.records
    (task,) = config.tasks()
    assert record.status == "completed" and len(record.turns) == 3
    # Every token the client got was one vLLM sampled: the policy's count, no more, no fewer; and vLLM sampled
    # each call's planned ids (its items' framing besides), not one off the plan.
    assert sum(call.output_tokens for call in calls) == record.usage["output_tokens"] and len(calls) == model_calls(task)
    assert all(call.forced and call.off_plan_tokens == 0 and call.sampled_tokens > call.output_tokens for call in calls)
    if design == "suspended":
        # One live request: opened once, then resumed, each resume computing only what it sent: the ids past
        # the previous call's prompt and its samples but the last.
        assert [call.resumed for call in calls] == [False] + [True] * (len(calls) - 1)
        for previous, call in zip(calls, calls[1:]):
            assert call.prefill_tokens == call.sent_tokens == call.prompt_tokens - (previous.prompt_tokens + previous.sampled_tokens - 1)
    else:
        assert not any(call.held for call in calls)
        block = vllm_worker.ready.block_size
        home = calls[0]  # the last turn served where the conversation's prefix lives
        for call in calls[1:]:
            if call.isolated:  # http routed away from its prefix: found nothing, computed everything
                assert (call.prefix_hits, call.prefill_tokens) == (0, call.prompt_tokens)
                continue
            # The last home turn's prompt and what it sampled (the transcript's ids, the last one never
            # computed) are found in vLLM's prefix cache, in whole blocks.
            assert call.prefix_hits == (home.prompt_tokens + home.sampled_tokens - 1) // block * block
            assert call.prefill_tokens == call.prompt_tokens - call.prefix_hits
            home = call


def test_real_engine_experiment_at_tiny_size(vllm_worker, monkeypatch, tmp_path, capsys):
    from experiments import common, real_engine
    from prototype.engine import fit

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    result = real_engine.main(["--tasks", "1", "--turns", "2"], worker=vllm_worker)
    (task,) = real_engine.real_config("chat", 1, 2, 0, None).tasks()
    summary = {row["design"]: row for row in result["summary"]}
    assert list(summary) == list(benchmark.DESIGNS) and all(row["calls"] == model_calls(task) for row in summary.values())
    # Each design's run finds nothing of earlier runs on the shared worker: its first call computes it all.
    assert all(row["prefill_vllm"] == row["prompt_tokens"] for row in result["calls"] if row["call"] == 1)
    for row in result["calls"]:
        if row["resumed"]:  # v1's second turn: vLLM computed exactly the appended ids
            assert row["prefill_vllm"] == row["sent_tokens"] < row["prompt_tokens"]
    assert [row["resumed"] for row in result["calls"] if row["design"] == "suspended"] == [False] + [True] * (model_calls(task) - 1)
    # Enough calls to fit the latency model and hold some out: the error in-sample per design, and held out with the
    # number of held-out calls behind it (the last 30% of the calls in the order made).
    fitted, held = fit.holdout_split(len(result["calls"]), real_engine.HOLDOUT_SHARE)
    assert all("ttft_fit_error_in_sample" in row for row in result["summary"])
    assert sum(row["held_out_calls"] for row in result["summary"]) == len(held) > 0 and (tmp_path / "real_engine").is_dir()
    # calibrate makes the same fit from the calls file the experiment wrote, and scores it on held-out calls.
    from prototype.__main__ import main as cli_main

    calls_csv = tmp_path / "real_engine_calls" / "latest" / "real_engine_calls.csv"
    assert cli_main(["calibrate", str(calls_csv), "--latency-out", str(tmp_path / "vllm.json")]) == 0
    printed = capsys.readouterr().out
    assert f"real-engine calls, {len(result['calls'])} calls" in printed
    assert f"refitted on the first {len(fitted)} calls, scored on the last {len(held)}" in printed
    assert (tmp_path / "vllm.json").is_file()


def test_gpu_run_agents_at_tiny_size_and_refuses_the_full_run_without_a_gpu(vllm_worker, capsys):
    from experiments import gpu_run

    rows = gpu_run.agents_rows([2], list(gpu_run.AGENT_DESIGNS), TINY_CPU, turns=2, worker=vllm_worker)
    calls = sum(model_calls(task) for task in gpu_run.agent_tasks(2, 2, 0))
    assert [(row["design"], row["agents"], row["completed"], row["model_calls"]) for row in rows] == [
        ("suspended", 2, 2, calls), ("chained", 2, 2, calls)]
    for row in rows:
        # vLLM held KV for the agents at their peak: at least one block per agent.
        assert row["peak_kv_blocks_vllm"] >= 2
        assert row["peak_kv_tokens_vllm"] == row["peak_kv_blocks_vllm"] * vllm_worker.ready.block_size
    # This session's vLLM is the CPU build: the GPU run stops before starting anything, saying why.
    assert gpu_run.main(["--agents", "2"]) == 2 and "sees no CUDA GPU" in capsys.readouterr().out
