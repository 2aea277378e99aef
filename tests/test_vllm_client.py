"""The vLLM boundary's pieces that run without vLLM: the line protocol, the client's routing of
events, the choice of interpreter, the model configs, and the engine's token pacing against a
scripted fake worker (a peer that answers like vllm_worker.py, named fake: it computes nothing)."""

from __future__ import annotations

import json
import os
import sys

import attrs
import pytest
import trio
import trio.testing

from prototype.engine.engine import ModelCall
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
from prototype.engine.vllm_engine import RealEngineError, open_vllm_engine
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
    whole prompt unless given) and `prefix_hits` tokens found in the prefix cache."""

    def __init__(self, stream: trio.abc.Stream, *, gap: float = 0.01, per_event: int = 1, prefill: int = 0,
                 prefix_hits: int = 0):
        self.stream, self.gap, self.per_event, self.prefill = stream, gap, per_event, prefill
        self.prefix_hits = prefix_hits
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
        while left:
            await trio.sleep(self.gap)
            n = min(self.per_event, left)
            event = {"type": "tokens", "rid": message["rid"], "n": n}
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

    done = subprocess.run([sys.executable, "-m", "prototype", "serve", "--engine", "vllm", "--workers", "2", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "one engine, one server" in done.stderr
