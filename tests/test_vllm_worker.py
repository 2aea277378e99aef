"""vLLM's side of the worker (prototype/engine/vllm_worker.py) in-process against a fake `vllm` package that records
what the worker asks and streams what each test scripts: it checks the worker's own logic (line protocol, token
accounting, counters); tests/test_real_engine.py checks it against vLLM itself."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import io
import json
import os
import sys
import threading
import types
from types import SimpleNamespace

import pytest

from prototype.engine import vllm_worker
from prototype.engine.vllm_worker import Worker

END = object()  # a scripted item: the request's output stream ends


class FakeKwargs:
    """vLLM's AsyncEngineArgs and SamplingParams: what they were made with."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs


FakeRequestOutputKind = enum.Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY", start=0)
FakeStreamingInput = collections.namedtuple("StreamingInput", "prompt sampling_params")


class FakeTokensPrompt(dict):
    """vLLM's `TokensPrompt` is a TypedDict: a plain dict at run time."""


FakeStatLoggerBase = type("StatLoggerBase", (), {})


class FakeAsyncLLM:
    instances: list[FakeAsyncLLM] = []
    fail_start: Exception | None = None
    startup_seconds = 12.5

    def __init__(self, args, stat_loggers) -> None:
        self.args = args
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(get_vocab_size=lambda: 151936),
            cache_config=SimpleNamespace(block_size=args.kwargs["block_size"], num_gpu_blocks=4321),
            device_config=SimpleNamespace(device_type="cuda"),
        )
        self.loggers = [factory(self.vllm_config, engine_index=0) for factory in stat_loggers]
        for logger in self.loggers:
            logger.log_engine_initialized()
        self.calls: list[dict] = []
        self.inputs: dict[str, list[FakeStreamingInput]] = {}
        self.inputs_ended: dict[str, bool] = {}
        self.scripts: dict[str, asyncio.Queue] = {}
        self.aborted: list[str] = []
        self.shut_down = 0

    @classmethod
    def from_engine_args(cls, args, stat_loggers=None):
        if cls.fail_start is not None:
            raise cls.fail_start
        _CLOCK[0] += cls.startup_seconds
        engine = cls(args, stat_loggers)
        cls.instances.append(engine)
        return engine

    def script(self, rid: str) -> asyncio.Queue:
        return self.scripts.setdefault(rid, asyncio.Queue())

    def stats(self, **fields) -> None:
        """One engine step's stats, to every stat logger."""
        for logger in self.loggers:
            logger.record(scheduler_stats=_scheduler_stats(**fields), iteration_stats=None)

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        self.calls.append({"prompt": prompt, "params": sampling_params, "rid": request_id, **kwargs})
        if hasattr(prompt, "__aiter__"):  # a held request: vLLM pulls its chunks as they come
            received = self.inputs.setdefault(request_id, [])
            self.inputs_ended[request_id] = False

            async def pull() -> None:
                async for item in prompt:
                    received.append(item)
                self.inputs_ended[request_id] = True

            asyncio.get_running_loop().create_task(pull())
        script = self.script(request_id)
        while (item := await script.get()) is not END:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def abort(self, request_id) -> None:
        self.aborted.append(request_id)

    def shutdown(self) -> None:
        self.shut_down += 1


_CLOCK = [1000.0]


def _scheduler_stats(ctx=0, gen=0, queries=None, hits=0, usage=0.0, details=True):
    return SimpleNamespace(
        iteration_details=SimpleNamespace(num_ctx_tokens=ctx, num_generation_tokens=gen) if details else None,
        prefix_cache_stats=None if queries is None else SimpleNamespace(queries=queries, hits=hits),
        kv_cache_usage=usage,
    )


def in_asyncio(test):
    """The worker runs on asyncio (as vLLM does), not trio: the test runs in its own event loop."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


def tokens(rid: str, ids: list[int], first: tuple | None = None, **request_stats) -> dict:
    """A `tokens` event as the worker writes it; a chunk's first carries (cached, prefill, prefix hits, prefix queries,
    KV usage, prompt tokens) and the request's stats."""
    figures = ("cached_tokens", "prefill_tokens", "prefix_hits", "prefix_queries", "kv_usage", "prompt_tokens")
    first = {} if first is None else {"first": {**dict(zip(figures, first)), **request_stats}}
    return {"type": "tokens", "rid": rid, "n": len(ids), "ids": ids, **first}


def output(tokens, cached=None, prompt=None, empty=False, metrics=None):
    return SimpleNamespace(
        outputs=[] if empty else [SimpleNamespace(token_ids=list(tokens))],
        num_cached_tokens=cached,
        prompt_token_ids=prompt,
        metrics=metrics,
    )


@pytest.fixture
def fake_vllm(monkeypatch):
    """A fake `vllm` package in `sys.modules` (vLLM is not installed here) and a clock of the worker's own."""
    modules = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.sampling_params", "vllm.engine", "vllm.engine.protocol", "vllm.inputs", "vllm.v1",
        "vllm.v1.engine", "vllm.v1.engine.async_llm", "vllm.v1.metrics", "vllm.v1.metrics.loggers",
    )}
    modules["vllm"].__version__ = "0.99.1-fake"
    modules["vllm"].AsyncEngineArgs = modules["vllm"].SamplingParams = FakeKwargs
    modules["vllm.sampling_params"].RequestOutputKind = FakeRequestOutputKind
    modules["vllm.engine.protocol"].StreamingInput = FakeStreamingInput
    modules["vllm.inputs"].TokensPrompt = FakeTokensPrompt
    modules["vllm.v1.engine.async_llm"].AsyncLLM = FakeAsyncLLM
    modules["vllm.v1.metrics.loggers"].StatLoggerBase = FakeStatLoggerBase
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(FakeAsyncLLM, "instances", [])
    monkeypatch.setattr(FakeAsyncLLM, "fail_start", None)
    _CLOCK[0] = 1000.0
    monkeypatch.setattr(vllm_worker, "time", SimpleNamespace(monotonic=lambda: _CLOCK[0]))
    return modules


class Out:
    """The worker's protocol stream: the events it wrote, one JSON object a line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)

    def take(self) -> list[dict]:
        text = "".join(self.lines)
        self.lines.clear()
        assert text == "" or text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]


SETTINGS = {"model": "/models/tiny", "max_model_len": 2048}


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def feed(script: asyncio.Queue, *items) -> None:
    """Scripted outputs for vLLM to stream, then the worker left to write what they make."""
    for item in items:
        script.put_nowait(item)
    await settle()


async def handle(worker: Worker, message: dict) -> bool:
    handled = await worker.handle(message)
    await settle()
    return handled


async def started(settings=SETTINGS) -> tuple[Worker, Out, FakeAsyncLLM]:
    out = Out()
    worker = Worker(settings, out)
    await worker.start()
    assert out.take()[0]["type"] == "ready"
    return worker, out, FakeAsyncLLM.instances[-1]


def params_of(max_tokens: int, forced: list[int] | None = None) -> dict:
    return {
        "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
        "output_kind": FakeRequestOutputKind.DELTA, "detokenize": False,
        "extra_args": {"testbed_forced_ids": forced} if forced else None,
    }


# The counters a binding KV budget moves; 0 in every test that preempts nothing.
UNPREEMPTED = {"preemptions": 0, "recompute_queries": 0, "recompute_hits": 0, "running": 0, "waiting": 0}
ZERO = {"prefill_tokens": 0, "decode_tokens": 0, "prefix_queries": 0, "prefix_hits": 0, "kv_usage": 0.0,
        "kv_usage_max": 0.0, "steps": 0, **UNPREEMPTED}


# --- start-up ------------------------------------------------------------------------------------


DEFAULTS = {"model": "/models/tiny", "load_format": "dummy", "skip_tokenizer_init": True, "enable_prefix_caching": True,
            "max_model_len": 2048, "block_size": 16, "dtype": "auto", "seed": 0, "enable_logging_iteration_details": True,
            "max_num_seqs": 256, "gpu_memory_utilization": 0.9, "enforce_eager": False,
            "logits_processors": ["vllm_forced:ForcedDecoding"]}
GIVEN = {"model": "m", "max_model_len": 512, "block_size": 32, "dtype": "float16", "seed": 7, "max_num_seqs": 8,
         "gpu_memory_utilization": 0.5, "enforce_eager": True}


@pytest.mark.parametrize("settings, engine_args", [
    (SETTINGS, DEFAULTS), (GIVEN, {**DEFAULTS, **GIVEN}),
    ({**SETTINGS, "num_gpu_blocks_override": 97}, {**DEFAULTS, "num_gpu_blocks_override": 97}),  # a KV budget in blocks
], ids=["defaults", "every-setting", "kv-budget"])
@in_asyncio
async def test_the_engine_starts_with_the_settings_given_else_the_defaults_and_says_ready(fake_vllm, settings, engine_args):
    out = Out()
    await Worker(dict(settings), out).start()
    assert FakeAsyncLLM.instances[0].args.kwargs == engine_args
    assert out.lines == [
        f'{{"type":"ready","vocab_size":151936,"block_size":{engine_args["block_size"]},"kv_blocks":4321,"startup_s":12.5,'
        '"vllm_version":"0.99.1-fake","device":"cuda"}\n'
    ]


# --- the counters --------------------------------------------------------------------------------


def test_a_chunks_first_token_carries_the_requests_preemptions_and_a_first_chunk_its_queueing(fake_vllm):
    first = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7])], num_cached_tokens=0, prompt_token_ids=[1],
                            metrics=SimpleNamespace(num_preemptions=1, queued_ts=10.0, scheduled_ts=10.25))
    assert vllm_worker._request_stats(first, first_chunk=True) == {"preemptions": 1, "queued_s": 0.25}
    # A resumed chunk: vLLM keeps the request's first scheduling time, so its queueing is not said.
    assert vllm_worker._request_stats(first, first_chunk=False) == {"preemptions": 1}
    never_scheduled = SimpleNamespace(metrics=SimpleNamespace(num_preemptions=0, queued_ts=10.0, scheduled_ts=0.0))
    assert vllm_worker._request_stats(never_scheduled, first_chunk=True) == {"preemptions": 0}
    assert vllm_worker._request_stats(output([7]), first_chunk=True) == {}  # vLLM gave no metrics


@in_asyncio
async def test_counters_start_at_zero_and_add_up_vllms_scheduler_stats_preemptions_and_queue(fake_vllm):
    worker, out, engine = await started()
    engine.stats(ctx=100, gen=0, queries=112, hits=16, usage=0.25)
    engine.stats(ctx=0, gen=3, queries=None, usage=0.5)  # no prefix-cache lookup this step
    engine.stats(ctx=5, gen=2, queries=4, hits=1, usage=0.125, details=False)  # no iteration details
    for logger in engine.loggers:
        logger.record(None, None)  # a step without scheduler stats changes nothing
    after = {"prefill_tokens": 100, "decode_tokens": 3, "prefix_queries": 116, "prefix_hits": 17, "kv_usage": 0.125,
             "kv_usage_max": 0.5, "steps": 2, **UNPREEMPTED}
    assert worker.counters.as_dict() == after
    assert await worker.handle({"op": "counters", "tag": "t1"}) is True  # the peak is kept without reset_peak
    assert await worker.handle({"op": "counters", "tag": 2, "reset_peak": True}) is True
    engine.stats(usage=0.25)
    assert await worker.handle({"op": "counters"}) is True
    assert out.take() == [
        {"type": "counters", "tag": "t1", "counters": after},
        {"type": "counters", "tag": 2, "counters": after},  # the peak is reset after it is sent
        {"type": "counters", "tag": None, "counters": {**after, "steps": 3, "kv_usage": 0.25, "kv_usage_max": 0.25}},
    ]
    worker, out, engine = await started()

    def step(preempted: int, queries: int, hits: int, running: int, waiting: int) -> None:
        stats = _scheduler_stats(ctx=10, queries=0, usage=0.5)
        stats.prefix_cache_stats.preempted_queries, stats.prefix_cache_stats.preempted_hits = queries, hits
        stats.num_running_reqs, stats.num_waiting_reqs = running, waiting
        for logger in engine.loggers:
            logger.record(scheduler_stats=stats, iteration_stats=SimpleNamespace(num_preempted_reqs=preempted))

    step(preempted=2, queries=0, hits=0, running=3, waiting=4)  # two preempted: they come back later
    step(preempted=0, queries=320, hits=288, running=4, waiting=2)  # back one a step: 64 of their 640 tokens recomputed
    step(preempted=0, queries=320, hits=288, running=5, waiting=1)
    for logger in engine.loggers:  # preemptions with no scheduler stats still count; stats without the figure, none
        logger.record(scheduler_stats=None, iteration_stats=SimpleNamespace(num_preempted_reqs=1))
        logger.record(scheduler_stats=None, iteration_stats=SimpleNamespace())
    counters = worker.counters.as_dict()
    assert {k: counters[k] for k in UNPREEMPTED} == {"preemptions": 3, "recompute_queries": 640, "recompute_hits": 576,
                                                     "running": 5, "waiting": 1}


# --- plain requests ------------------------------------------------------------------------------


@in_asyncio
async def test_a_plain_request_streams_its_tokens_with_the_first_ones_figures_or_zero_without_them(fake_vllm):
    worker, out, engine = await started()
    engine.stats(ctx=50, gen=1, queries=64, hits=32, usage=0.125)  # before the request: not its own
    assert await handle(worker, {"op": "generate", "rid": "r1", "prompt": [1, 2, 3], "max_tokens": 4, "forced": [7, 8, 9, 10],
                                 "salt": "s1", "held": False}) is True
    assert engine.calls == [{"prompt": {"prompt_token_ids": [1, 2, 3], "cache_salt": "s1"},
                             "params": engine.calls[0]["params"], "rid": "r1"}]
    assert type(engine.calls[0]["prompt"]) is FakeTokensPrompt
    assert (engine.calls[0]["params"].kwargs, out.take()) == (params_of(4, [7, 8, 9, 10]), [])
    engine.stats(ctx=3, gen=1, queries=3, hits=0, usage=0.25)
    script = engine.script("r1")
    await feed(script, output([7, 8], cached=16, prompt=[1, 2, 3]))
    assert out.take() == [tokens("r1", [7, 8], (16, 3, 0, 3, 0.25, 3))]
    engine.stats(gen=1, usage=0.25)
    script.put_nowait(output([], empty=True))  # an output without a completion: nothing to say
    script.put_nowait(output([9]))
    engine.stats(gen=1, usage=0.375)
    await settle()
    assert out.take() == [tokens("r1", [9])]
    await feed(script, output([10, 11, 12]))  # past the request's max_tokens: only its own count
    counters = {"prefill_tokens": 53, "decode_tokens": 4, "prefix_queries": 67, "prefix_hits": 32, "kv_usage": 0.375,
                "kv_usage_max": 0.375, "steps": 4, **UNPREEMPTED}
    assert out.take() == [tokens("r1", [10]), {"type": "chunk_done", "rid": "r1", "tokens": 4, "counters": counters}]
    await feed(script, END)
    assert out.lines == ['{"type":"finished","rid":"r1"}\n']
    worker, out, engine = await started()
    await worker.handle({"op": "generate", "rid": "a", "prompt": [5], "max_tokens": 1})
    await handle(worker, {"op": "generate", "rid": "b", "prompt": [6], "max_tokens": 1, "salt": ""})
    assert [call["prompt"] for call in engine.calls] == [{"prompt_token_ids": [5]}, {"prompt_token_ids": [6]}]
    await feed(engine.script("a"), output([1], cached=None, prompt=None), END)
    first = {"cached_tokens": 0, "prefill_tokens": 0, "prefix_hits": 0, "prefix_queries": 0, "kv_usage": 0.0,
             "prompt_tokens": 0}
    assert out.take() == [
        {"type": "tokens", "rid": "a", "n": 1, "ids": [1], "first": first},
        {"type": "chunk_done", "rid": "a", "tokens": 1, "counters": ZERO},
        {"type": "finished", "rid": "a"},
    ]
    assert list(worker.tasks) == ["b"]


@in_asyncio
async def test_a_request_id_in_use_a_failing_request_or_an_unknown_op_is_an_error_and_shutdown_stops_the_worker(fake_vllm):
    worker, out, engine = await started()
    message = {"op": "generate", "rid": "x", "prompt": [1], "max_tokens": 2}
    await worker.handle(message)
    assert await handle(worker, message) is True
    assert (out.take(), len(engine.calls)) == ([{"type": "error", "rid": "x", "message": "request 'x' exists"}], 1)
    await feed(engine.script("x"), END)
    assert out.take() == [{"type": "finished", "rid": "x"}]
    await handle(worker, message)
    assert len(engine.calls) == 2 and "x" in worker.tasks
    worker, out, engine = await started()
    await worker.handle({"op": "generate", "rid": "f", "prompt": [1], "max_tokens": 2})
    await handle(worker, {"op": "generate", "rid": "g", "prompt": [1], "max_tokens": 1})
    await feed(engine.script("f"), ValueError("prompt too long"))
    assert out.take() == [{"type": "error", "rid": "f", "message": "ValueError: prompt too long"},
                          {"type": "finished", "rid": "f"}]
    assert list(worker.tasks) == ["g"]
    await feed(engine.script("g"), output([3]))
    assert [e["type"] for e in out.take()] == ["tokens", "chunk_done"]
    worker, out, engine = await started()
    assert await worker.handle({"op": "explode", "rid": "q"}) is True
    assert await worker.handle({}) is True
    assert await worker.handle({"op": "shutdown"}) is False
    assert out.take() == [{"type": "error", "rid": "q", "message": "unknown op 'explode'"},
                          {"type": "error", "rid": None, "message": "unknown op None"}]


@in_asyncio
async def test_an_abort_stops_the_request_in_vllm_and_finishes_it(fake_vllm):
    worker, out, engine = await started()
    await handle(worker, {"op": "generate", "rid": "a", "prompt": [1], "max_tokens": 5, "held": True})
    assert "a" in worker.inputs
    assert await handle(worker, {"op": "abort", "rid": "a"}) is True
    # No error: an abort is asked for.
    assert (engine.aborted, out.take(), worker.tasks, worker.inputs) == (["a"], [{"type": "finished", "rid": "a"}], {}, {})
    assert await worker.handle({"op": "abort", "rid": "a"}) is True  # already over: nothing to do
    assert await handle(worker, {"op": "abort", "rid": "nobody"}) is True
    assert engine.aborted == ["a"] and out.take() == []


# --- held requests -------------------------------------------------------------------------------


@in_asyncio
async def test_a_held_request_streams_chunk_by_chunk_each_sending_its_new_ids_counted_against_that_chunk(fake_vllm):
    worker, out, engine = await started()
    engine.stats(ctx=40, queries=48, hits=16, usage=0.125)
    await handle(worker, {"op": "generate", "rid": "h", "prompt": [1, 2], "max_tokens": 3, "salt": "k", "held": True})
    (call,) = engine.calls
    assert call["rid"] == "h" and call["session_id"] == "h" and call["params"].kwargs == params_of(3)
    assert set(call) == {"prompt", "params", "rid", "session_id"}
    (first,) = engine.inputs["h"]
    assert type(first) is FakeStreamingInput
    assert (first.prompt, first.sampling_params.kwargs) == ({"prompt_token_ids": [1, 2], "cache_salt": "k"}, params_of(3))
    engine.stats(ctx=2, gen=1, queries=2, hits=0, usage=0.25)
    script = engine.script("h")
    metrics = SimpleNamespace(num_preemptions=0, queued_ts=10.0, scheduled_ts=10.25)  # vLLM's RequestStateStats
    await feed(script, output([9, 9], cached=0, prompt=[1, 2], metrics=metrics))
    assert out.take() == [tokens("h", [9, 9], (0, 2, 0, 2, 0.25, 2), preemptions=0, queued_s=0.25)]
    # The second chunk is sent before the first is done: one output then spans both.
    assert await handle(worker, {"op": "append", "rid": "h", "prompt": [4, 5, 6], "max_tokens": 2, "forced": [8, 7]}) is True
    second = engine.inputs["h"][1]
    assert second.prompt == {"prompt_token_ids": [4, 5, 6]}  # the salt keys only the first block
    assert second.sampling_params.kwargs == params_of(2, [8, 7])  # each chunk with its own plan
    engine.stats(ctx=3, gen=1, queries=5, hits=2, usage=0.5)
    metrics.num_preemptions = 1  # a later chunk: the request's preemptions so far, its first queueing not again
    await feed(script, output([9, 8], cached=0, prompt=[1, 2, 9, 9, 4, 5, 6], metrics=metrics))
    done_first = {"prefill_tokens": 45, "decode_tokens": 2, "prefix_queries": 55, "prefix_hits": 18, "kv_usage": 0.5,
                  "kv_usage_max": 0.5, "steps": 3, **UNPREEMPTED}
    assert out.take() == [
        tokens("h", [9]),
        {"type": "chunk_done", "rid": "h", "tokens": 3, "counters": done_first},
        tokens("h", [8], (0, 3, 2, 5, 0.5, 7), preemptions=1),
    ]
    await feed(script, output([7]))
    assert out.take() == [tokens("h", [7]), {"type": "chunk_done", "rid": "h", "tokens": 2, "counters": done_first}]
    await handle(worker, {"op": "append", "rid": "h", "prompt": [8], "max_tokens": 1})
    assert engine.inputs["h"][2].prompt == {"prompt_token_ids": [8]}
    await feed(script, output([3], cached=0, prompt=[1, 2, 9, 9, 4, 5, 6, 8, 7, 8]))  # the third chunk: its own count
    assert out.take() == [
        tokens("h", [3], (0, 0, 0, 0, 0.5, 10)),
        {"type": "chunk_done", "rid": "h", "tokens": 1, "counters": done_first},
    ]
    assert engine.inputs_ended["h"] is False
    assert await handle(worker, {"op": "close", "rid": "h"}) is True
    assert engine.inputs_ended["h"] is True and len(engine.inputs["h"]) == 3
    await feed(script, END)
    assert (out.take()[-1], worker.inputs, worker.tasks) == ({"type": "finished", "rid": "h"}, {}, {})
    await worker.handle({"op": "append", "rid": "h", "prompt": [1], "max_tokens": 1})
    assert out.take() == [{"type": "error", "rid": "h", "message": "no held request 'h'"}]
    await handle(worker, {"op": "close", "rid": "unknown"})  # nothing held by that id: nothing to do
    assert out.take() == []


# --- the process: its protocol stream and its loop -------------------------------------------------


@contextlib.contextmanager
def redirected_fds(tmp_path, monkeypatch):
    """fd 1 and fd 2 to files of the test's own, sys.stdout and sys.stderr restored afterwards."""
    fds = SimpleNamespace(out_path=tmp_path / "fd1", err_path=tmp_path / "fd2", stderr=io.StringIO())
    saved = os.dup(1), os.dup(2)
    with open(fds.out_path, "w") as out, open(fds.err_path, "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        monkeypatch.setattr(sys, "stdout", sys.stdout)
        monkeypatch.setattr(sys, "stderr", fds.stderr)
        try:
            yield fds
        finally:
            for fd, saved_fd in enumerate(saved, start=1):
                os.dup2(saved_fd, fd)
                os.close(saved_fd)


def test_the_protocol_stream_is_the_original_stdout_and_fd_1_then_goes_to_stderr(tmp_path, monkeypatch):
    with redirected_fds(tmp_path, monkeypatch) as fds:
        stream = vllm_worker._protocol_stream()
        stream.write('{"type":"x"}\n')  # line-buffered: out at once
        assert fds.out_path.read_text() == '{"type":"x"}\n'
        os.write(1, b"engine core noise\n")
        print("python noise")
        assert sys.stdout is sys.stderr is fds.stderr
        stream.close()
    assert (fds.out_path.read_text(), fds.err_path.read_text(), fds.stderr.getvalue()) == (
        '{"type":"x"}\n', "engine core noise\n", "python noise\n")


def test_the_worker_process_answers_its_stdin_until_shutdown_and_says_why_its_engine_cannot_start(fake_vllm, tmp_path, monkeypatch):
    lines = ['{"op": "counters", "tag": "c"}\n', "not json\n", '{"op": "nope"}\n', '{"op": "shutdown"}\n',
             '{"op": "counters", "tag": "after shutdown"}\n']
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(lines)))
    with redirected_fds(tmp_path, monkeypatch) as fds:
        asyncio.run(vllm_worker._main(dict(SETTINGS)))
    events = [json.loads(line) for line in fds.out_path.read_text().splitlines()]
    assert events == [
        {"type": "ready", "vocab_size": 151936, "block_size": 16, "kv_blocks": 4321, "startup_s": 12.5,
         "vllm_version": "0.99.1-fake", "device": "cuda"},
        {"type": "counters", "tag": "c", "counters": ZERO},
        {"type": "error", "rid": None, "message": "not JSON: Expecting value: line 1 column 1 (char 0)"},
        {"type": "error", "rid": None, "message": "unknown op 'nope'"},
    ]
    assert FakeAsyncLLM.instances[0].shut_down == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"op": "counters", "tag": 1}\n'))  # it stops at the end of its stdin too
    with redirected_fds(tmp_path, monkeypatch) as fds:
        asyncio.run(vllm_worker._main(dict(SETTINGS)))
    assert [json.loads(line)["type"] for line in fds.out_path.read_text().splitlines()] == ["ready", "counters"]
    assert FakeAsyncLLM.instances[1].shut_down == 1
    monkeypatch.setattr(FakeAsyncLLM, "fail_start", RuntimeError("no GPU"))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with redirected_fds(tmp_path, monkeypatch) as fds, pytest.raises(RuntimeError, match="no GPU"):
        asyncio.run(vllm_worker._main(dict(SETTINGS)))
    assert fds.out_path.read_text() == '{"type":"error","rid":null,"message":"engine start failed: RuntimeError: no GPU"}\n'


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_stdin_reader_does_not_keep_the_worker_process_alive_after_shutdown(fake_vllm, tmp_path, monkeypatch):
    """The client may keep the worker's stdin open after `shutdown`: the thread blocked reading it must
    be a daemon, or the interpreter would wait for it at exit and the process would not end."""
    read_end, write_end = os.pipe()
    os.write(write_end, b'{"op": "shutdown"}\n')
    stdin = os.fdopen(read_end, "r")
    monkeypatch.setattr(sys, "stdin", stdin)
    before = set(threading.enumerate())
    try:
        with redirected_fds(tmp_path, monkeypatch) as fds:
            asyncio.run(vllm_worker._main(dict(SETTINGS)))
        readers = [thread for thread in threading.enumerate() if thread not in before]
        assert len(readers) == 1 and readers[0].is_alive() and readers[0].daemon
        assert [json.loads(line)["type"] for line in fds.out_path.read_text().splitlines()] == ["ready"]
    finally:
        os.close(write_end)  # the reader sees the end of its stdin and stops
        for thread in set(threading.enumerate()) - before:
            thread.join(10)
        stdin.close()
