"""The vLLM boundary's pieces held to exact values without vLLM (docs/mutation.md): the model
configs and engine settings, the worker's command line and environment, the line protocol's
limits, the client's routing of events and failures, and the real engine's records, salts, aborts
and coalesced stream against a scripted fake worker (tests/test_vllm_client.py's FakeWorker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from test_vllm_client import READY, _engine_on_fake

from prototype.engine import memory, vllm_client
from prototype.engine.engine import ModelCall
from prototype.engine.kv import Prompt
from prototype.engine.latency import LatencyModel
from prototype.engine.vllm_client import (
    LineSplitter,
    Ready,
    VllmClient,
    VllmUnavailable,
    WorkerFailed,
    encode,
    vllm_python,
    worker_command,
    worker_environment,
    worker_settings,
)
from prototype.engine.vllm_engine import RealCall, RealEngineError, VllmEngine, _Held, open_vllm_engine
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, MODELS, TINY_CPU, write_model

# --- the models ----------------------------------------------------------------------------------


def test_a_model_config_is_llama_at_the_specs_dimensions():
    assert TINY_CPU.config() == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128_256, "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
    }
    assert TINY_CPU.engine_settings() == {"max_model_len": 131_072, "block_size": 32, "dtype": "float32",
                                          "enforce_eager": True, "gpu_memory_utilization": 0.9}
    assert LLAMA_8B_SHAPE.engine_settings() == {"max_model_len": 131_072, "block_size": 16, "dtype": "bfloat16",
                                                "enforce_eager": False, "gpu_memory_utilization": 0.9}
    assert (TINY_CPU.head_dim, LLAMA_8B_SHAPE.head_dim) == (32, 128)
    # K and V of 2 layers x 2 KV heads x 32 wide, 4 bytes each in float32; 2 bytes in bfloat16.
    assert TINY_CPU.kv_bytes_per_token() == 1024
    assert attrs.evolve(TINY_CPU, dtype="bfloat16").kv_bytes_per_token() == 512
    assert (TINY_CPU.cpu_kv_cache_gib, LLAMA_8B_SHAPE.cpu_kv_cache_gib) == (1, None)
    assert MODELS == {"tiny-llama-cpu": TINY_CPU, "llama-3.1-8b-shape": LLAMA_8B_SHAPE}


def test_a_models_folder_is_named_by_its_config_and_its_config_rewritten_when_it_differs(tmp_path):
    folder = write_model(TINY_CPU, tmp_path)
    config = TINY_CPU.config()
    digest = __import__("hashlib").sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    assert folder == tmp_path / f"tiny-llama-cpu-{digest}"
    assert json.loads((folder / "config.json").read_text()) == config
    assert (folder / "config.json").read_text() == json.dumps(config, indent=1)
    (folder / "config.json").write_text("{}")
    assert write_model(TINY_CPU, tmp_path) == folder and json.loads((folder / "config.json").read_text()) == config
    other = write_model(attrs.evolve(TINY_CPU, layers=3), tmp_path)
    assert other != folder and other.parent == tmp_path and other.name.startswith("tiny-llama-cpu-")
    nested = tmp_path / "a" / "b"
    assert write_model(TINY_CPU, nested).parent == nested  # parents made


def test_models_are_written_under_the_users_cache_by_default(tmp_path, monkeypatch):
    from prototype.engine import vllm_models

    assert vllm_models.MODELS_DIR == Path.home() / ".cache" / "testbed" / "models"
    monkeypatch.setattr(vllm_models, "MODELS_DIR", tmp_path / "models")
    assert write_model(TINY_CPU).parent == tmp_path / "models"


# --- starting the worker -------------------------------------------------------------------------


def test_the_worker_is_the_script_beside_the_client_given_its_settings_as_json(tmp_path):
    settings = worker_settings(TINY_CPU, tmp_path / "m")
    assert settings == {"model": str(tmp_path / "m"), **TINY_CPU.engine_settings()}
    command = worker_command(Path("/opt/py"), settings)
    assert command == ["/opt/py", str(Path(vllm_client.__file__).with_name("vllm_worker.py")), json.dumps(settings)]


def test_the_workers_environment_sizes_the_cpu_kv_cache_and_quiets_vllm(monkeypatch):
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "PYTHONUNBUFFERED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TESTBED_SEEN", "1")
    env = worker_environment(TINY_CPU)
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_LOGGING_LEVEL"], env["PYTHONUNBUFFERED"], env["TESTBED_SEEN"]) == (
        "1", "WARNING", "1", "1")
    assert "VLLM_CPU_KVCACHE_SPACE" not in worker_environment(LLAMA_8B_SHAPE)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("PYTHONUNBUFFERED", "0")
    env = worker_environment(TINY_CPU)
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_LOGGING_LEVEL"], env["PYTHONUNBUFFERED"]) == ("4", "DEBUG", "0")


def test_without_vllm_the_default_environment_is_used_or_its_absence_explained(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.delenv(vllm_client.PYTHON_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(vllm_client, "DEFAULT_VENV", tmp_path / "venv")
    with pytest.raises(VllmUnavailable) as refused:
        vllm_python()
    assert str(refused.value) == (
        f"no interpreter with vLLM: this one cannot import vllm, $TESTBED_VLLM_PYTHON is unset and "
        f"{tmp_path / 'venv' / 'bin' / 'python'} does not exist (docs/real_engine.md installs it)")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    assert vllm_python() == tmp_path / "venv" / "bin" / "python"
    # An explicit interpreter comes first, even when the environment names another; `~` is expanded.
    monkeypatch.setenv(vllm_client.PYTHON_ENV, str(tmp_path / "missing"))
    assert vllm_python(tmp_path / "venv" / "bin" / "python") == tmp_path / "venv" / "bin" / "python"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(vllm_client.PYTHON_ENV)
    assert vllm_python("~/venv/bin/python") == tmp_path / "venv" / "bin" / "python"
    with pytest.raises(VllmUnavailable, match=f"^{tmp_path / 'nope'} does not exist$"):
        vllm_python(tmp_path / "nope")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    assert vllm_python() == Path(sys.executable)


# --- the line protocol ---------------------------------------------------------------------------


def test_lines_are_compact_json_and_an_endless_line_is_refused(monkeypatch):
    assert encode({"op": "close", "rid": "r1"}) == b'{"op":"close","rid":"r1"}\n'
    monkeypatch.setattr(vllm_client, "MAX_LINE_BYTES", 8)
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":1}') == []  # 7 bytes: waiting for the rest
    full = LineSplitter()
    assert full.feed(b'{"a":12}') == []  # exactly the limit without its newline: still waiting
    assert full.feed(b"\n") == [{"a": 12}]
    with pytest.raises(WorkerFailed, match="^a line from the worker exceeds 8 bytes$"):
        splitter.feed(b"23")
    assert LineSplitter().feed(b'{"a":1234}\n') == [{"a": 1234}]  # long, but a whole line
    assert LineSplitter().feed(b'  \n{"b":1}\n \n') == [{"b": 1}]


def test_a_ready_event_is_read_field_by_field_and_an_error_without_a_message_still_fails():
    assert Ready.from_event({**READY, "vocab_size": 7, "device": "cuda"}) == Ready(7, 32, 64, 1.5, "0.32.0", "cuda")
    with pytest.raises(WorkerFailed, match="^the worker failed$"):
        Ready.from_event({"type": "error"})
    with pytest.raises(WorkerFailed) as refused:
        Ready.from_event({"type": "tokens"})
    assert str(refused.value) == "expected the worker's ready event, got {'type': 'tokens'}"


async def test_the_ready_line_is_read_across_reads_and_what_follows_it_is_dispatched(autojump_clock, nursery):
    client_end, worker_end = trio.testing.memory_stream_pair()
    line = encode(READY)
    await worker_end.send_all(line[:10])

    async def rest() -> None:
        await trio.sleep(1)
        await worker_end.send_all(line[10:] + encode({"type": "error", "rid": None, "message": "engine died"}))

    nursery.start_soon(rest)
    async with VllmClient.over_streams(client_end, client_end) as client:
        assert client.ready == Ready.from_event(READY) and trio.current_time() == 1
        with pytest.raises(WorkerFailed, match="^engine died$"):  # the error came in the ready line's read
            await client.generate("a", [1], 1)


async def test_a_worker_that_exits_before_it_is_ready_says_so(autojump_clock):
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(b'{"type":')
    await worker_end.aclose()
    with pytest.raises(WorkerFailed, match=r"^the vLLM worker exited before its engine was ready \(its log says why\)$"):
        async with VllmClient.over_streams(client_end, client_end):
            pass


# --- the client's routing ------------------------------------------------------------------------


class Sent:
    """A send stream that keeps what it is sent."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    async def send_all(self, data: bytes) -> None:
        self.lines += [json.loads(line) for line in bytes(data).splitlines()]


async def test_requests_are_sent_as_the_worker_reads_them(autojump_clock):
    sent = Sent()
    client = VllmClient(sent, None, Ready.from_event(READY))
    await client.generate("r1", [1, 2], 3)
    await client.generate("r2", [4], 1, salt="s", held=True)
    await client.append("r2", [5], 2)
    await client.close("r2")
    await client.abort("r1")
    await client.shutdown()
    assert sent.lines == [
        {"op": "generate", "rid": "r1", "prompt": [1, 2], "max_tokens": 3, "forced": None, "salt": None, "held": False},
        {"op": "generate", "rid": "r2", "prompt": [4], "max_tokens": 1, "forced": None, "salt": "s", "held": True},
        {"op": "append", "rid": "r2", "prompt": [5], "max_tokens": 2, "forced": None},
        {"op": "close", "rid": "r2"},
        {"op": "abort", "rid": "r1"},
        {"op": "shutdown"},
    ]

    async def answer(tag: int, reset_peak: bool) -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert sent.lines[-1] == {"op": "counters", "tag": tag, "reset_peak": reset_peak}
        client.dispatch({"type": "counters", "tag": 99, "counters": {"late": 1}})  # no waiter: ignored
        client.dispatch({"type": "counters", "tag": tag, "counters": {"tag": tag}})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer, 1, True)
        assert await client.counters(reset_peak=True) == {"tag": 1}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer, 2, False)
        assert await client.counters() == {"tag": 2}


async def test_an_error_for_no_open_request_fails_the_client_and_every_open_request(autojump_clock):
    client = VllmClient(Sent(), None, Ready.from_event(READY))
    a = await client.generate("a", [1], 1)
    b = await client.generate("b", [1], 1)
    client.dispatch({"type": "tokens", "rid": "gone", "n": 1})  # an event of no open request: dropped
    client.dispatch({"type": "finished", "rid": None})
    client.dispatch({"type": "tokens", "rid": "a", "n": 1})
    client.dispatch({"type": "finished", "rid": "a"})
    assert [event async for event in a] == [{"type": "tokens", "rid": "a", "n": 1}, {"type": "finished", "rid": "a"}]
    await client.generate("a", [1], 1)  # its id is free again
    client.dispatch({"type": "error", "rid": "zz"})
    assert [event async for event in b] == [{"type": "error", "rid": "b", "message": "worker error"}, {"type": "finished", "rid": "b"}]
    with pytest.raises(WorkerFailed, match="^worker error$"):
        await client.abort("a")
    other = VllmClient(Sent(), None, Ready.from_event(READY))
    c = await other.generate("c", [1], 1)
    other.dispatch({"type": "error", "rid": None, "message": "engine died"})
    assert [event["message"] async for event in c if event["type"] == "error"] == ["engine died"]


# --- the real engine against the fake worker -----------------------------------------------------


async def test_each_call_is_recorded_with_what_vllm_said_and_what_the_simulator_predicted(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery, gap=0.25, per_event=2, prefill=7, prefix_hits=32)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client, namespace="ns-") as engine:
        latency = LatencyModel()
        prompt = Prompt(range(1000, 1040))
        await trio.sleep(1)  # times are the call's own, not the clock's
        call = await engine.begin_call("s", prompt)
        start = trio.current_time()
        prefilled = await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=5), engine_call=call)
        assert (prefilled.decode_from - start, prefilled.cached) == (0.25, 0)
        assert await engine.decode_unstreamed(latency, 5, start=0.0, engine_call=call) == start + 0.75
        engine.end_call(call)
        assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (1, 7, 0)
        assert await engine.counters() == {"steps": 3}
        await trio.testing.wait_all_tasks_blocked()
    (record,) = engine.records
    assert record == RealCall(
        key="s", held=False, resumed=False, isolated=False, prompt_tokens=40, sent_tokens=40, output_tokens=5,
        sampled_tokens=5, forced=False, off_plan_tokens=0, prefill_tokens=7, prefix_hits=32, vllm_cached_tokens=0, predicted_prefill_tokens=40, ttft_s=0.25,
        decode_s=0.5, kv_usage=0.25, kv_blocks_used=16)
    (generate,) = [m for m in worker.received if m["op"] == "generate"]
    assert (generate["rid"], generate["salt"], generate["held"], generate["max_tokens"]) == ("r0", "ns-", False, 5)
    assert not [m for m in worker.received if m["op"] == "abort"]  # every token taken: nothing to abort


async def test_a_held_requests_calls_add_up_and_each_sends_only_what_vllm_does_not_hold(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery, gap=0.25)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(1000, 1040))
        seen = []
        for turn in range(3):
            call = await engine.begin_call("s", prompt)
            prefilled = await engine.prefill_call(latency, ModelCall("s", prompt, held=True, output_tokens=3), engine_call=call)
            await engine.decode_unstreamed(latency, 3, start=0.0, engine_call=call)
            engine.retain("s", prompt, trio.current_time())  # as a design keeps the call's KV
            engine.end_call(call)
            seen.append((prefilled.cached, engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens))
            prompt.extend(range(2000 + 10 * turn, 2010 + 10 * turn))  # the next turn's ten new ids
        await trio.testing.wait_all_tasks_blocked()
    # vLLM holds the prompt and every sample but the last: 40 + 3 - 1 = 42 ids, then 42 + 8 + 3 - 1 = 52. Each
    # resume sends the rest (8 ids) and counts the held ones as cached; the engine's counters add up over calls.
    assert [(m["op"], len(m["prompt"])) for m in worker.received] == [("generate", 40), ("append", 8), ("append", 8)]
    assert seen == [(0, 1, 40, 0), (42, 2, 48, 42), (52, 3, 56, 94)]
    assert [(r.held, r.resumed, r.prompt_tokens, r.sent_tokens) for r in engine.records] == [
        (True, False, 40, 40), (True, True, 50, 8), (True, True, 60, 8)]
    # The simulator's prediction for the same key: the retained prompt's whole blocks are cached, in vLLM's
    # blocks (32 tokens, from the worker's ready event).
    assert [r.predicted_prefill_tokens for r in engine.records] == [40, 50 - 32, 60 - 32]


async def test_a_salt_is_the_namespaces_and_new_for_each_isolated_session(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client, namespace="ns-") as engine:
        latency = LatencyModel()
        for key in ("a", "a", "b"):
            engine.isolate(key)
            call = await engine.begin_call(key, Prompt([1, 2, 3]))
            await engine.prefill_call(latency, ModelCall(key, Prompt([1, 2, 3]), held=False, output_tokens=1), engine_call=call)
            await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
            engine.end_call(call)
        engine.release("a")
        engine.isolate("a")
        call = await engine.begin_call("a", Prompt([1, 2, 3]))
        await engine.prefill_call(latency, ModelCall("a", Prompt([1, 2, 3]), held=False, output_tokens=0), engine_call=call)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.end_call(call)
        await trio.testing.wait_all_tasks_blocked()
    generates = [m for m in worker.received if m["op"] == "generate"]
    assert [(m["rid"], m["salt"]) for m in generates] == [
        ("r0", "ns-isolated-0"), ("r1", "ns-isolated-0"), ("r2", "ns-isolated-1"), ("r3", "ns-isolated-2")]
    assert generates[-1]["max_tokens"] == 1  # vLLM samples at least one token
    assert [r.isolated for r in engine.records] == [True] * 4


async def test_a_stream_coalesces_as_the_simulated_engine_does(autojump_clock, nursery):
    stream, _ = await _engine_on_fake(nursery, gap=0.1, per_event=1)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()

        async def chunks(**flush) -> list[tuple[float, str]]:
            prompt = Prompt(range(100, 110))
            call = await engine.begin_call("s", prompt)
            await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=6), engine_call=call)
            start = trio.current_time()
            out = [(round(trio.current_time() - start, 6), text)
                   async for text in engine.stream(latency, list("abcdef"), engine_call=call, **flush)]
            engine.end_call(call)
            return out

        # One token every 0.1 s; the first one is already there.
        assert await chunks() == [(0.0, "a"), (0.1, "b"), (0.2, "c"), (0.3, "d"), (0.4, "e"), (0.5, "f")]
        # A chunk goes out when its interval ends, between vLLM's events; the last one when it is ready.
        assert await chunks(flush_interval=0.22) == [(0.0, "a"), (0.22, "bc"), (0.44, "de"), (0.5, "f")]
        assert await chunks(flush_interval=10.0, flush_tokens=2) == [(0.0, "a"), (0.2, "bc"), (0.4, "de"), (0.5, "f")]
        assert engine.stats.decoded_tokens == 18  # every chunk counted once


@pytest.mark.parametrize("per_event, chunks", [
    (7, (["abc"], ["de"])),  # the call's seven tokens in one event
    (2, (["ab", "c"], ["d", "e"])),  # an event's second token is the next item's (or the unstreamed ones')
])
async def test_each_item_of_a_call_takes_only_its_own_tokens_whatever_vllms_events_bring(autojump_clock, nursery, per_event, chunks):
    stream, _ = await _engine_on_fake(nursery, gap=0.1, per_event=per_event)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 110))
        call = await engine.begin_call("s", prompt)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=7), engine_call=call)
        first = [text async for text in engine.stream(latency, list("abc"), engine_call=call)]
        await engine.decode_unstreamed(latency, 2, start=0.0, engine_call=call)  # reasoning, say
        second = [text async for text in engine.stream(latency, list("de"), engine_call=call)]
        engine.end_call(call)
    assert (first, second) == chunks
    assert engine.records[-1].output_tokens == 7 and engine.stats.decoded_tokens == 5  # the streamed ones


async def test_a_call_stopped_early_is_aborted_unless_its_request_is_held(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        for key, held in (("held", True), ("plain", False)):
            prompt = Prompt(range(10, 20))
            call = await engine.begin_call(key, prompt)
            await engine.prefill_call(latency, ModelCall(key, prompt, held=held, output_tokens=4), engine_call=call)
            await engine.decode_unstreamed(latency, 2, start=0.0, engine_call=call)
            engine.end_call(call)
            engine.end_call(call)  # a second end records and aborts nothing more
        await trio.testing.wait_all_tasks_blocked()
        assert [(r.key, r.output_tokens) for r in engine.records] == [("held", 2), ("plain", 2)]
    assert [m for m in worker.received if m["op"] == "abort"] == [{"op": "abort", "rid": "r1"}]


def test_a_held_request_is_extended_only_by_its_prompt_or_one_that_starts_with_it():
    held = _Held("r0", None)
    assert held.extended_by(Prompt([1, 2]))  # nothing sent yet
    prompt = Prompt([1, 2, 3])
    held.prompt, held.prompt_length = prompt, 3
    prompt.extend([4])
    assert held.extended_by(prompt)
    assert held.extended_by(Prompt([1, 2, 3]))  # as long as it was: the same ids
    assert not held.extended_by(Prompt([1, 2]))
    assert not held.extended_by(Prompt([1, 2, 9, 4]))
    assert held.extended_by(Prompt([1, 2, 3, 7, 8]))


async def test_tokens_outside_a_call_and_a_request_that_ends_early_are_errors(autojump_clock, nursery):
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(encode(READY))
    async with VllmClient.over_streams(client_end, client_end) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        with pytest.raises(RealEngineError, match="^tokens asked for outside a model call$"):
            await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=None)
        prompt = Prompt([1, 2, 3])
        call = await engine.begin_call("s", prompt)

        async def worker() -> None:
            await trio.testing.wait_all_tasks_blocked()
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 1, "first": {"cached_tokens": 2}}))
            await worker_end.send_all(encode({"type": "finished", "rid": "r0"}))

        nursery.start_soon(worker)
        prefilled = await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=call)
        assert prefilled.cached == 2 and engine.stats.cached_tokens == 2
        with pytest.raises(RealEngineError, match="^request r0 ended before its 3 tokens$"):
            await engine.decode_unstreamed(latency, 3, start=0.0, engine_call=call)
        engine.end_call(call)
        call = await engine.begin_call("s", prompt)

        async def failing() -> None:
            await trio.testing.wait_all_tasks_blocked()
            await worker_end.send_all(encode({"type": "error", "rid": "r1", "message": "VLLMValidationError: no"}))

        nursery.start_soon(failing)
        with pytest.raises(RealEngineError, match="^VLLMValidationError: no$"):
            await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=call)
        engine.end_call(call)
    # What a record holds when vLLM said little (only `cached_tokens`) or nothing (a failed request).
    said_little, failed = engine.records
    assert said_little == RealCall(
        key="s", held=False, resumed=False, isolated=False, prompt_tokens=3, sent_tokens=3, output_tokens=1,
        sampled_tokens=1, forced=False, off_plan_tokens=0, prefill_tokens=0, prefix_hits=0, vllm_cached_tokens=2, predicted_prefill_tokens=3, ttft_s=0.0, decode_s=0.0,
        kv_usage=0.0, kv_blocks_used=0)
    assert failed == RealCall(
        key="s", held=False, resumed=False, isolated=False, prompt_tokens=0, sent_tokens=0, output_tokens=0,
        sampled_tokens=0, forced=False, off_plan_tokens=0, prefill_tokens=0, prefix_hits=0, vllm_cached_tokens=0, predicted_prefill_tokens=0, ttft_s=0.0, decode_s=0.0,
        kv_usage=0.0, kv_blocks_used=0)
    assert [type(value) for value in attrs.astuple(failed)[1:]] == [bool] * 3 + [int] * 4 + [bool] + [int] * 5 + [float] * 3 + [int] * 2 + [type(None)]


async def test_a_chunk_is_due_exactly_one_interval_after_the_last_and_holds_at_most_flush_tokens(autojump_clock, nursery):
    async def chunks(per_event: int, **flush) -> list[tuple[float, str]]:
        stream, _ = await _engine_on_fake(nursery, gap=0.125, per_event=per_event)
        async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
            latency = LatencyModel()
            prompt = Prompt(range(100, 110))
            call = await engine.begin_call("s", prompt)
            await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=6), engine_call=call)
            start = trio.current_time()
            out = [(trio.current_time() - start, text)
                   async for text in engine.stream(latency, list("abcdef"), engine_call=call, **flush)]
            engine.retain("s", prompt, trio.current_time())  # as a design keeps the call's KV
            engine.end_call(call)
            assert "s" in engine.kv
            engine.release("s")
            assert "s" not in engine.kv  # the simulated engine's bookkeeping forgets it too
            return out

    # One token every 1/8 s: a chunk is due when 0.3 s have passed since the last, to the tick, between events.
    assert await chunks(1, flush_interval=0.3) == [(0.0, "a"), (0.3, "bc"), (0.6, "de"), (0.625, "f")]
    # Three tokens an event, two at most a chunk: what is left of an event goes out at once, not with the next event.
    assert await chunks(3, flush_tokens=2) == [(0.0, "ab"), (0.0, "c"), (0.125, "de"), (0.125, "f")]


async def test_a_first_event_that_says_nothing_counts_nothing_cached_or_computed(autojump_clock, nursery):
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(encode(READY))
    async with VllmClient.over_streams(client_end, client_end) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 120))
        call = await engine.begin_call("s", prompt)

        async def worker() -> None:  # a worker whose tokens carry no `first` report at all
            await trio.sleep(0.5)
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 2}))
            await trio.sleep(0.25)
            await worker_end.send_all(encode({"type": "tokens", "rid": "r0", "n": 1}) + encode({"type": "finished", "rid": "r0"}))

        nursery.start_soon(worker)
        prefilled = await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=call)
        assert (prefilled.decode_from, prefilled.cached) == (0.5, 0)
        assert (engine.stats.model_calls, engine.stats.prefill_tokens, engine.stats.cached_tokens) == (1, 0, 0)
        assert await engine.decode_unstreamed(latency, 3, start=0.0, engine_call=call) == 0.75
        engine.end_call(call)
    (record,) = engine.records
    assert record == RealCall(
        key="s", held=False, resumed=False, isolated=False, prompt_tokens=20, sent_tokens=20, output_tokens=3,
        sampled_tokens=3, forced=False, off_plan_tokens=0, prefill_tokens=0, prefix_hits=0, vllm_cached_tokens=0, predicted_prefill_tokens=20, ttft_s=0.5, decode_s=0.25,
        kv_usage=0.0, kv_blocks_used=0)


async def test_a_resume_with_no_new_ids_sends_the_last_one_and_a_plain_call_opens_its_own_request(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()

        async def model_call(prompt: Prompt, tokens: int, held: bool) -> int:
            call = await engine.begin_call("s", prompt, pinned=held)
            prefilled = await engine.prefill_call(latency, ModelCall("s", prompt, held=held, output_tokens=tokens), engine_call=call)
            await engine.decode_unstreamed(latency, tokens, start=0.0, engine_call=call)
            engine.end_call(call)
            return prefilled.cached

        prompt = Prompt(range(100, 140))
        assert await model_call(prompt, 3, held=True) == 0
        prompt.extend([140, 141])  # two of the three samples: vLLM holds 40 + 3 - 1 = 42 ids, all of them
        assert await model_call(prompt, 2, held=True) == 41  # the last id sent again, to sample from
        # A call that is not held (a side request of the same session) is a request of its own on the whole prompt.
        assert await model_call(prompt, 1, held=False) == 0
        engine.release("s")
        await trio.testing.wait_all_tasks_blocked()
    assert [(m["op"], m["rid"], m.get("prompt"), m.get("held")) for m in worker.received] == [
        ("generate", "r0", list(range(100, 140)), True), ("append", "r0", [141], None),
        ("generate", "r1", list(range(100, 142)), False), ("close", "r0", None, None)]
    assert [(r.held, r.resumed, r.prompt_tokens, r.sent_tokens) for r in engine.records] == [
        (True, False, 40, 40), (True, True, 42, 1), (False, False, 42, 42)]


async def test_an_engine_without_a_model_spec_sends_any_length(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, trio.open_nursery() as engine_nursery:
        engine = VllmEngine(client=client, nursery=engine_nursery)
        latency = LatencyModel()
        prompt = Prompt(range(100, 300))
        call = await engine.begin_call("s", prompt)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=2), engine_call=call)
        await engine.decode_unstreamed(latency, 2, start=0.0, engine_call=call)
        engine.end_call(call)
        engine_nursery.cancel_scope.cancel()
    assert [(m["op"], len(m["prompt"])) for m in worker.received] == [("generate", 200)]


@pytest.mark.parametrize("paused, where", [(None, "swapping_out"), (True, "swapping_out"), (False, "gpu")])
async def test_a_calls_end_tells_the_simulated_bookkeeping_whether_the_session_will_be_back(
        autojump_clock, nursery, paused, where):
    stream, _ = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(
            TINY_CPU, client=client, retention=memory.SWAP_POLICY) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 140))
        call = await engine.begin_call("s", prompt)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=1), engine_call=call)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
        engine.retain("s", prompt, trio.current_time())
        # Paused at a tool call (the default) the swap policy copies the KV out; after a final answer it stays.
        engine.end_call(call) if paused is None else engine.end_call(call, paused=paused)
        assert engine.kv["s"].where == where


async def test_the_prediction_is_the_sessions_own_a_pinned_one_exact_an_isolated_one_by_whole_blocks(autojump_clock, nursery):
    stream, _ = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        engine.isolate("isolated")
        for key, pinned in (("pinned", True), ("isolated", False)):
            prompt = Prompt(range(100, 140))
            for _ in range(2):
                call = await engine.begin_call(key, prompt, pinned=pinned)
                await engine.prefill_call(latency, ModelCall(key, prompt, held=pinned, output_tokens=1), engine_call=call)
                await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=call)
                engine.retain(key, prompt, trio.current_time(), pinned=pinned)
                engine.end_call(call)
                prompt.extend(range(200, 210))
    # A pinned session (a live v1 coroutine) holds all 40 tokens it computed; an isolated one finds its own
    # two whole 16-token blocks only, since it shares nothing through the block directory.
    assert [(r.key, r.predicted_prefill_tokens) for r in engine.records] == [
        ("pinned", 40), ("pinned", 10), ("isolated", 40), ("isolated", 50 - 32)]


async def test_a_calls_second_end_leaves_the_sessions_next_call_alone(autojump_clock, nursery):
    stream, worker = await _engine_on_fake(nursery)
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(TINY_CPU, client=client) as engine:
        latency = LatencyModel()
        prompt = Prompt(range(100, 120))
        first = await engine.begin_call("s", prompt)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=1), engine_call=first)
        await engine.decode_unstreamed(latency, 1, start=0.0, engine_call=first)
        engine.end_call(first)
        second = await engine.begin_call("s", prompt)
        await engine.prefill_call(latency, ModelCall("s", prompt, held=False, output_tokens=3), engine_call=second)
        engine.end_call(first)  # late, from a cleanup path: the first call is over already
        assert await engine.decode_unstreamed(latency, 3, start=0.0, engine_call=second) > 0
        engine.end_call(second)
        await trio.testing.wait_all_tasks_blocked()
    assert [(r.key, r.output_tokens) for r in engine.records] == [("s", 1), ("s", 3)]
    assert not [m for m in worker.received if m["op"] == "abort"]
