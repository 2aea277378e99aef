"""The vLLM boundary's pieces that run without vLLM: the line protocol, the client's routing of
events, the choice of interpreter, the model configs, and the engine's token pacing against a
scripted fake worker (a peer that answers like vllm_worker.py, named fake: it computes nothing)."""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import sys
from types import SimpleNamespace

import attrs
import pytest
import trio
import trio.testing

from prototype import benchmark
from prototype import workload as wl
from prototype.api.costs import ZERO_COSTS
from prototype.engine.engine import ModelCall, PlannedOutput
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel
from prototype.engine.streaming import ContextWindowExceeded
from prototype.engine.vllm_client import (
    DEFAULT_VENV,
    PYTHON_ENV,
    LineSplitter,
    Ready,
    VllmClient,
    VllmUnavailable,
    WorkerFailed,
    encode,
    vllm_python,
)
from prototype.engine.vllm_engine import RealEngineError, VllmEngine, open_vllm_engine
from prototype.engine.vllm_forced import FORCED_IDS, ForcedPlans, check_plan
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, TINY_CPU, to_model_ids, write_model

READY = {"type": "ready", "vocab_size": 1000, "block_size": 32, "kv_blocks": 64, "startup_s": 1.5,
         "vllm_version": "0.32.0", "device": "cpu"}


def test_line_splitter_joins_split_lines_and_skips_blank_ones():
    splitter = LineSplitter()
    assert splitter.feed(b'{"a": 1}\n{"b"') == [{"a": 1}]
    assert splitter.feed(b': 2}\n\n') == [{"b": 2}]
    assert splitter.feed(encode({"c": [1, 2]})) == [{"c": [1, 2]}]


def test_ready_event_parsed_and_errors_raised():
    assert Ready.from_event(READY) == Ready(1000, 32, 64, 1.5, "0.32.0", "cpu")
    with pytest.raises(WorkerFailed, match="engine start failed: boom"):
        Ready.from_event({"type": "error", "rid": None, "message": "engine start failed: boom"})
    with pytest.raises(WorkerFailed, match="expected the worker's ready event"):
        Ready.from_event({"type": "tokens"})


def test_vllm_python_order(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    assert vllm_python(python) == python
    monkeypatch.setenv(PYTHON_ENV, str(python))
    assert vllm_python() == python
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "missing"))
    with pytest.raises(VllmUnavailable, match="does not exist"):
        vllm_python()
    monkeypatch.delenv(PYTHON_ENV)
    assert DEFAULT_VENV == DEFAULT_VENV.home() / ".cache" / "testbed" / "vllm-venv"
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert str(vllm_python()) == sys.executable


def test_model_configs_written_once(tmp_path):
    folder = write_model(TINY_CPU, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["architectures"]) == (2, 128, ["LlamaForCausalLM"])
    assert write_model(TINY_CPU, tmp_path) == folder
    # Llama-3.1-8B's published dimensions; its KV is 128 KiB a token in bf16.
    assert LLAMA_8B_SHAPE.config()["num_key_value_heads"] == 8 and LLAMA_8B_SHAPE.kv_bytes_per_token() == 131_072
    assert to_model_ids([5, 1000, 1001, 100_276], 1000) == [5, 0, 1, 276]


class FakeWorker:
    """Answers like vllm_worker.py: every request gets its tokens `per_event` at a time, `gap`
    seconds apart on the trio clock, and its first event reports `prefill` computed tokens (the
    whole prompt unless given) and `prefix_hits` tokens found in the prefix cache. The ids it
    reports are the request's plan (forced decoding), or `free_id` without one or with `off_plan`."""

    def __init__(self, stream: trio.abc.Stream, *, gap: float = 0.01, per_event: int = 1, prefill: int = 0,
                 prefix_hits: int = 0, off_plan: bool = False, free_id: int = 1):
        self.stream, self.gap, self.per_event, self.prefill = stream, gap, per_event, prefill
        self.prefix_hits, self.off_plan, self.free_id = prefix_hits, off_plan, free_id
        self.received: list[dict] = []
        self.lock = trio.Lock()  # one writer at a time, as the worker's single stdout

    async def send(self, event: dict) -> None:
        async with self.lock:
            await self.stream.send_all(encode(event))

    async def serve(self) -> None:
        await self.send(READY)
        splitter = LineSplitter()
        async with trio.open_nursery() as nursery:
            while data := await self.stream.receive_some(65536):
                for message in splitter.feed(data):
                    self.received.append(message)
                    if message["op"] in ("generate", "append"):
                        nursery.start_soon(self.sample, message)
                    elif message["op"] == "counters":
                        await self.send({"type": "counters", "tag": message["tag"], "counters": {"steps": 3}})
                    elif message["op"] in ("close", "abort"):
                        await self.send({"type": "finished", "rid": message["rid"]})
            nursery.cancel_scope.cancel()

    async def sample(self, message: dict) -> None:
        left, first = message["max_tokens"], True
        plan = message.get("forced") if not self.off_plan else None
        ids = plan or [self.free_id] * left
        while left:
            await trio.sleep(self.gap)
            n = min(self.per_event, left)
            done = message["max_tokens"] - left
            event = {"type": "tokens", "rid": message["rid"], "n": n, "ids": ids[done : done + n]}
            if first:
                event["first"] = {"cached_tokens": 0, "prefill_tokens": self.prefill or len(message["prompt"]),
                                  "prefix_hits": self.prefix_hits, "kv_usage": 0.25}
                first = False
            await self.send(event)
            left -= n
        if message["op"] == "generate" and not message.get("held"):
            await self.send({"type": "finished", "rid": message["rid"]})


async def _engine_on_fake(nursery, **fake):
    client_end, worker_end = trio.testing.memory_stream_pair()
    worker = FakeWorker(worker_end, **fake)
    nursery.start_soon(worker.serve)
    return client_end, worker


async def test_client_routes_events_by_request_and_answers_counters(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery, gap=0.01)
    async with VllmClient.over_streams(stream, stream) as client:
        assert client.ready.block_size == 32
        a = await client.generate("a", [1, 2, 3], 2)
        b = await client.generate("b", [4], 3)
        got_b = [event async for event in b]
        got_a = [event async for event in a]
        assert [e["type"] for e in got_a] == ["tokens", "tokens", "finished"]
        assert [e.get("n") for e in got_b] == [1, 1, 1, None]
        assert got_a[0]["first"]["prefill_tokens"] == 3
        assert await client.counters() == {"steps": 3}
        await client.generate("c", [1], 1)
        with pytest.raises(ValueError, match="already open"):
            await client.generate("c", [1], 1)


async def test_client_fails_open_requests_when_the_worker_exits(autojump_clock, nursery):
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(encode(READY))
    async with VllmClient.over_streams(client_end, client_end) as client:
        events = await client.generate("a", [1], 5)
        await worker_end.aclose()
        got = [event async for event in events]
        assert [e["type"] for e in got] == ["error", "finished"] and got[0]["message"] == "the vLLM worker exited"
        with pytest.raises(WorkerFailed):
            await client.generate("b", [1], 1)


async def test_engine_streams_pieces_as_tokens_arrive_and_resumes_held_requests(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery, gap=0.01, per_event=2)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(1200, 1250))
        call = await engine.begin_call("s", prompt, pinned=True)
        start = trio.current_time()
        await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=5), engine_call=call)
        assert trio.current_time() - start == pytest.approx(0.01)  # the first token's arrival
        chunks = [text async for text in engine.stream(latency, list("abcde"), engine_call=call)]
        # Two tokens an event; the first chunk holds the first event's tokens, nothing is lost or repeated.
        assert "".join(chunks) == "abcde" and chunks == ["ab", "cd", "e"]
        engine.end_call(call)
        prompt.extend(range(7, 17))
        call = await engine.begin_call("s", prompt, pinned=True)
        resumed = await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=1), engine_call=call)
        assert resumed.cached == 54  # usage counts what the live request held as cached: all but the 6 sent
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.end_call(call)
        engine.release("s")
        await trio.testing.wait_all_tasks_blocked()
    generate, append, close = worker.received
    # Model ids are the testbed's modulo the vocabulary (1000 here).
    assert (generate["op"], generate["held"], generate["prompt"][:2]) == ("generate", True, [200, 201])
    # The request holds 50 + 5 - 1 = 54 tokens, so the resume sends the prompt's last 6 ids only.
    assert (append["op"], append["prompt"], append["max_tokens"]) == ("append", [11, 12, 13, 14, 15, 16], 1)
    assert close == {"op": "close", "rid": generate["rid"]}
    assert [(r.resumed, r.sent_tokens, r.output_tokens, r.kv_blocks_used) for r in engine.records] == [
        (False, 50, 5, 16), (True, 6, 1, 16)]


async def test_a_compacted_prompt_closes_the_held_request_and_opens_one_on_the_whole_prompt(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()

        async def held_call(prompt: Prompt, tokens: int) -> None:
            call = await engine.begin_call("s", prompt, pinned=True)
            await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=tokens), engine_call=call)
            await engine.decode_unstreamed(latency, tokens, start=0.0, engine_call=call)
            engine.end_call(call)

        await held_call(Prompt(range(100, 140)), 3)
        # The same ids in a new object (a context rendered anew with nothing dropped) still extend the request.
        await held_call(Prompt([*range(100, 140), *range(500, 510)]), 2)
        # A compacted context starts otherwise: the request is closed, a new one takes the whole prompt.
        compacted = Prompt(range(700, 720))
        await held_call(compacted, 2)
        compacted.extend(range(800, 805))
        await held_call(compacted, 1)
        engine.release("s")
        await trio.testing.wait_all_tasks_blocked()
    ops = [(m["op"], m.get("rid"), len(m.get("prompt", ()))) for m in worker.received]
    first, second = (m["rid"] for m in worker.received if m["op"] == "generate")
    # 40 + 3 - 1 = 42 held, 50-token prompt: 8 appended; the new request holds 20 + 2 - 1 = 21 of 25: 4 appended.
    assert ops == [("generate", first, 40), ("append", first, 8), ("close", first, 0), ("generate", second, 20),
                   ("append", second, 4), ("close", second, 0)]
    assert [(r.resumed, r.sent_tokens) for r in engine.records] == [(False, 40), (True, 8), (False, 20), (True, 4)]


async def test_a_call_past_the_models_context_window_is_refused_before_vllm_sees_it(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    small = attrs.evolve(TINY_CPU, max_model_len=64)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(small, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 150))
        call = await engine.begin_call("s", prompt, pinned=True)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=14), engine_call=call)  # 64: fits
        await engine.decode_unstreamed(latency, 14, start=0.0, engine_call=call)
        engine.end_call(call)
        prompt.extend(range(200, 210))  # the request holds 63; one id more and 5 tokens out is 69 > 64
        call = await engine.begin_call("s", prompt, pinned=True)
        with pytest.raises(ContextWindowExceeded) as refused:
            await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=5), engine_call=call)
        assert (refused.value.tokens, refused.value.window, refused.value.code) == (69, 64, "context_length_exceeded")
        engine.end_call(call)
        engine.release("s")
        await trio.testing.wait_all_tasks_blocked()
    assert [m["op"] for m in worker.received] == ["generate", "close"]


async def test_engine_aborts_what_a_call_did_not_take_and_salts_isolated_sessions(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        engine.isolate("elsewhere")
        prompt = Prompt([1, 2, 3])
        call = await engine.begin_call("elsewhere", prompt)
        await engine.prefill_call(latency, ModelCall("elsewhere", prompt, held=False, output_tokens=4), engine_call=call)
        engine.end_call(call)  # stopped after the first token (steering, a failure)
        engine.release("elsewhere")
        engine.isolate("elsewhere-too")  # another routed-away session: a salt never used before
        call = await engine.begin_call("elsewhere-too", prompt)
        await engine.prefill_call(latency, ModelCall("elsewhere-too", prompt, held=False, output_tokens=1), engine_call=call)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.end_call(call)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RealEngineError, match="outside a model call"):
            await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
    generate, again = (message for message in worker.received if message["op"] == "generate")
    assert [message for message in worker.received if message["op"] == "abort"] == [{"op": "abort", "rid": generate["rid"]}]
    assert (generate["salt"], again["salt"]) == ("isolated-0", "isolated-1")


@pytest.mark.parametrize("command", [
    ["serve", "--engine", "vllm", "--port", "0"],
    ["compare", "--engine", "vllm", "--tasks", "1", "--turns", "1", "--out", "{tmp}"],
])
def test_cli_without_vllm_says_why(command, tmp_path):
    import subprocess

    env = dict(os.environ, **{PYTHON_ENV: str(tmp_path / "no-python")})
    argv = [part.replace("{tmp}", str(tmp_path / "out")) for part in command]
    done = subprocess.run([sys.executable, "-m", "prototype", *argv], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert f"--engine vllm: {tmp_path / 'no-python'} does not exist" in done.stderr


def test_compare_refuses_tasks_longer_than_the_models_window_before_starting_vllm(tmp_path, capsys, monkeypatch):
    from prototype.__main__ import main as cli_main

    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "no-python"))  # were vLLM started, this would be the error
    assert cli_main(["compare", "--engine", "vllm", "--preset", "long", "--tasks", "1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "python -m prototype compare: error: --engine vllm: task long-0 reaches 180,116 tokens of context, more than "
        "tiny-llama-cpu's context window of 131,072 (fewer --turns, or another --vllm-model)\n")


def test_serve_on_vllm_refuses_several_workers():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "prototype", "serve", "--engine", "vllm", "--workers", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "one engine, one server" in done.stderr


# --- forced decoding -----------------------------------------------------------------------------


class _Direction(enum.Enum):
    """vLLM's MoveDirectionality, by name."""

    UNIDIRECTIONAL = 0
    SWAP = 1


def _params(plan):
    return SimpleNamespace(extra_args={FORCED_IDS: plan} if plan is not None else None)


def _batch(removed=(), added=(), moved=()):
    """A vLLM BatchUpdate: rows removed, added (index, params, prompt ids, the request's live output ids), moved."""
    return SimpleNamespace(removed=list(removed), added=list(added), moved=list(moved))


def test_forced_plans_give_each_row_its_next_planned_id_through_batch_changes():
    plans = ForcedPlans()
    out_a, out_b = [], []
    plans.update(_batch(added=[(0, _params([5, 6, 7]), [1, 2], out_a), (1, _params([8, 9]), None, out_b),
                               (2, _params(None), [3], [])]))
    assert plans.next_ids() == ([0, 1], [5, 8])  # the row without a plan samples freely
    out_a.append(5)  # vLLM extends each request's own list as it samples: the position follows it
    out_b.append(8)
    assert plans.next_ids() == ([0, 1], [6, 9])
    plans.update(None)  # the batch did not change
    plans.update(_batch(moved=[(0, 1, _Direction.SWAP)]))
    assert sorted(zip(*plans.next_ids())) == [(0, 9), (1, 6)]
    out_b.append(9)  # b's plan is used up: from now on it samples freely
    assert plans.next_ids() == ([1], [6])
    # A request leaves row 0 and the batch is condensed: row 1 moves one way into it.
    plans.update(_batch(removed=[0], moved=[(1, 0, _Direction.UNIDIRECTIONAL)]))
    assert plans.next_ids() == ([0], [6])
    # A held request's next chunk comes back as an added row, with its own plan and its output list emptied.
    out_a.clear()
    plans.update(_batch(added=[(0, _params([4, 3]), [1, 2, 5, 6], out_a)]))
    assert plans.next_ids() == ([0], [4])
    plans.update(_batch(added=[(0, _params(None), [7], [])]))  # a request without a plan takes the row
    assert plans.next_ids() == ([], [])


@pytest.mark.parametrize("plan", ["1 2", [1, -2], [1, 2.0], [True]])
def test_a_plan_that_is_not_a_list_of_token_ids_is_refused(plan):
    with pytest.raises(ValueError, match="must be a list of non-negative token ids"):
        check_plan(_params(plan))
    check_plan(_params([0, 7]))
    check_plan(_params(None))


async def test_a_planned_call_samples_its_whole_plan_and_streams_only_its_text(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery, gap=0.01)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(1200, 1250))
        # Two items: two framing ids then three of text, one framing id then two of text.
        plan = PlannedOutput.of([([1500, 1501, 1007, 1008, 1009], 3), ([1502, 1010, 1011], 2)])
        call = await engine.begin_call("s", prompt, pinned=True)
        asked = trio.current_time()
        await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=5, planned=lambda: plan),
                                  engine_call=call)
        assert trio.current_time() - asked == pytest.approx(0.01)  # vLLM's first token, a framing one: prefill is over
        chunks = [(trio.current_time() - asked, text) async for text in engine.stream(latency, list("abcde"), engine_call=call)]
        # One token every 10 ms; the framing ones (the 1st, 2nd and 6th) stream nothing.
        assert [text for _, text in chunks] == list("abcde")
        assert [t for t, _ in chunks] == pytest.approx([0.03, 0.04, 0.05, 0.07, 0.08])
        engine.end_call(call)
        prompt.extend([*plan.ids, *range(1300, 1304)])  # the output as the transcript renders it, then a tool's output
        call = await engine.begin_call("s", prompt, pinned=True)
        resume = PlannedOutput.of([([1503, 1012], 1)])
        await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=1, planned=lambda: resume),
                                  engine_call=call)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.end_call(call)
        engine.release("s")
        await trio.testing.wait_all_tasks_blocked()
    generate, append, _ = worker.received
    # The plan crosses into the model's vocabulary (1000 here) as the prompt does.
    assert (generate["max_tokens"], generate["forced"]) == (8, [500, 501, 7, 8, 9, 502, 10, 11])
    # The request holds the prompt and every sample but the last (50 + 8 - 1): the resume sends the last planned
    # id, which vLLM never fed back, and the tool's output, with the resume's own plan.
    assert (append["prompt"], append["max_tokens"], append["forced"]) == ([11, 300, 301, 302, 303], 2, [503, 12])
    assert [(r.output_tokens, r.sampled_tokens, r.forced, r.off_plan_tokens) for r in engine.records] == [
        (5, 8, True, 0), (1, 2, True, 0)]


async def test_ids_vllm_sampled_off_the_plan_are_counted(autojump_clock, nursery):
    stream, _ = await _engine_on_fake(nursery, off_plan=True, free_id=8)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 110))
        call = await engine.begin_call("s", prompt)
        plan = PlannedOutput.of([([7, 8, 9], 3)])
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=3, planned=lambda: plan),
                                  engine_call=call)
        await engine.decode_unstreamed(latency, 3, start=0.0, engine_call=call)
        engine.end_call(call)
    (record,) = engine.records
    assert (record.forced, record.sampled_tokens, record.off_plan_tokens) == (True, 3, 2)  # 8, 8, 8 against 7, 8, 9


def test_a_rendering_shorter_than_its_text_is_padded_to_the_texts_tokens():
    plan = PlannedOutput.of([([1, 2, 3], 1), ([4, 5], 4)])
    assert (plan.ids, plan.items, plan.text_tokens) == ((1, 2, 3, 4, 5, 5, 5), ((2, 1), (0, 4)), 5)


@pytest.mark.parametrize("design", benchmark.DESIGNS)
async def test_each_calls_plan_is_what_the_next_prompt_renders(design, autojump_clock, nursery, monkeypatch):
    """The invariant forced decoding rests on: what a call samples (its plan) is what the conversation's
    later prompts carry right after its own prompt, so vLLM's KV holds the transcript's ids."""
    stream, _ = await _engine_on_fake(nursery, gap=0.001, per_event=64)
    # Reasoning, a hosted web_search every turn, function calls: every kind of output a call can render.
    preset = attrs.evolve(wl.PRESETS["chat"], hosted_call_p=1.0, parallel_calls_p=1.0)
    config = benchmark.BenchConfig(preset=preset, n_tasks=1, fixed_turns=3, costs=ZERO_COSTS)
    calls: list[tuple] = []
    prefill_call = VllmEngine.prefill_call

    async def recording(self, latency, call, **options):
        calls.append((_conversation(call.key), list(call.prompt.ids), call.planned().ids if call.planned else None))
        return await prefill_call(self, latency, call, **options)

    monkeypatch.setattr(VllmEngine, "prefill_call", recording)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        (record,) = await benchmark.run_design(design, 1000.0, config.tasks(), config, server=benchmark.bench_server(config, engine))
    assert record.status == "completed"
    (task,) = config.tasks()
    assert len(calls) == sum(1 + len(turn.hosted_calls) for turn in task.turns) and all(plan for _, _, plan in calls)
    checked = 0
    for i, (conversation, prompt, plan) in enumerate(calls):
        later = [p for c, p, _ in calls[i + 1 :] if c == conversation]
        if later:
            # The last sampled id is never fed back (a hosted call's, the one before its result, may render otherwise).
            assert later[0][len(prompt) : len(prompt) + len(plan) - 1] == list(plan[:-1])
            checked += 1
    assert checked == len(calls) - 1


def _conversation(key):
    """An http turn routed away from its prefix keys on its home's key."""
    return key[1] if isinstance(key, tuple) and key and key[0] == "http-elsewhere" else key


@pytest.mark.parametrize("held, predicted", [(True, 80 - 63), (False, 80 - 32)])
async def test_the_simulated_prediction_counts_vllms_blocks_and_leaves_out_the_last_sample(held, predicted,
                                                                                           autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)  # blocks of 32 (its ready event)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 156))
        plan = PlannedOutput.of([(list(range(200, 208)), 8)])
        call = await engine.begin_call("s", prompt, pinned=held)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=held, output_tokens=8, planned=lambda: plan),
                                  engine_call=call)
        await engine.decode_unstreamed(latency, 8, start=0.0, engine_call=call)
        prompt.extend(plan.ids)  # the output joins the context, and the design keeps its KV (SamplingLoop.take_outputs)
        engine.retain("s", prompt, trio.current_time(), pinned=held)
        engine.end_call(call)
        prompt.extend(range(300, 316))  # a tool's output
        call = await engine.begin_call("s", prompt, pinned=held)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=held, output_tokens=1), engine_call=call)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.end_call(call)
        engine.release("s")
    # vLLM holds 56 + 8 - 1 = 63 ids: a held request is sent the other 17; a new request finds one whole block
    # of 32 (the simulated engine's defaults would say 64: the whole output, in blocks of 16).
    assert engine.records[-1].predicted_prefill_tokens == predicted
    if held:
        assert engine.records[-1].sent_tokens == predicted


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this interpreter has vLLM: it would start it")
def test_the_real_engine_experiment_without_vllm_says_why_in_one_line(tmp_path):
    import subprocess

    # This interpreter lacks vLLM: the worker it runs cannot start an engine.
    done = subprocess.run([sys.executable, "-m", "experiments.real_engine", "--vllm-python", sys.executable],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TESTBED_RESULTS=str(tmp_path)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("python -m experiments.real_engine: error: engine start failed: ModuleNotFoundError: "
                           "No module named 'vllm'\n")
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this interpreter has vLLM")
def test_the_gpu_run_refuses_up_front_saying_what_is_missing(tmp_path, capsys):
    from experiments import gpu_run

    # An interpreter that does not exist, then one without vLLM: each refused before anything starts, with its reason.
    assert gpu_run.main(["--vllm-python", str(tmp_path / "python")]) == 2
    assert capsys.readouterr().out == f"gpu_run: {tmp_path / 'python'} does not exist\n"
    assert gpu_run.main(["--vllm-python", sys.executable]) == 2
    assert capsys.readouterr().out == (
        f"gpu_run: {sys.executable} cannot import vLLM and torch (ModuleNotFoundError: No module named 'vllm'); "
        "install vLLM's CUDA build there (docs/real_engine.md)\n")
