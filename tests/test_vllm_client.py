"""The vLLM client side without vLLM (prototype/engine/vllm_client.py, vllm_models.py): models and settings, the
worker's command line, environment and interpreter, the line protocol, the client against a scripted fake worker, the
worker's process against stand-in scripts, and the commands that need vLLM saying why they cannot start."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from prototype.engine import vllm_client, vllm_models
from prototype.engine.vllm_client import LineSplitter, Ready, VllmClient, VllmUnavailable, WorkerFailed, WorkerProcess, encode
from prototype.engine.vllm_engine import open_vllm_engine
from prototype.engine.vllm_models import LLAMA_8B_SHAPE, MODELS, TINY_CPU, to_model_ids, write_model

READY = {"type": "ready", "vocab_size": 1000, "block_size": 32, "kv_blocks": 64, "startup_s": 1.5,
         "vllm_version": "0.32.0", "device": "cpu"}


class FakeWorker:
    """Answers like vllm_worker.py: tokens `per_event` at a time, `gap` s apart; the first event reports `prefill`
    computed tokens (else the prompt) and `prefix_hits`; the ids are the plan, or `free_id` without one or `off_plan`."""

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
            n, done = min(self.per_event, left), message["max_tokens"] - left
            event = {"type": "tokens", "rid": message["rid"], "n": n, "ids": ids[done : done + n]}
            if first:
                event["first"] = {"cached_tokens": 0, "prefill_tokens": self.prefill or len(message["prompt"]),
                                  "prefix_hits": self.prefix_hits, "kv_usage": 0.25}
                first = False
            await self.send(event)
            left -= n
        if message["op"] == "generate" and not message.get("held"):
            await self.send({"type": "finished", "rid": message["rid"]})


async def fake_worker(nursery, **fake) -> tuple[trio.abc.Stream, FakeWorker]:
    """A FakeWorker serving the other end of the stream returned."""
    client_end, worker_end = trio.testing.memory_stream_pair()
    worker = FakeWorker(worker_end, **fake)
    nursery.start_soon(worker.serve)
    return client_end, worker


@contextlib.asynccontextmanager
async def engine_on_fake(nursery, spec=TINY_CPU, *, namespace: str | None = None, retention=None, **fake):
    """The real engine (`spec`, with the namespace and retention policy given) on a FakeWorker: (engine, worker)."""
    stream, worker = await fake_worker(nursery, **fake)
    options = {name: value for name, value in (("namespace", namespace), ("retention", retention)) if value is not None}
    async with VllmClient.over_streams(stream, stream) as client, open_vllm_engine(spec, client=client, **options) as engine:
        yield engine, worker
        await trio.testing.wait_all_tasks_blocked()  # the worker has read everything sent before the engine closes


# --- the models --------------------------------------------------------------------------------------------------------


def test_a_model_is_llama_at_the_specs_dimensions_in_a_folder_named_by_its_config_rewritten_when_it_differs(tmp_path, monkeypatch):
    assert TINY_CPU.config() == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128_256, "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}
    assert TINY_CPU.engine_settings() == {"max_model_len": 131_072, "block_size": 32, "dtype": "float32",
                                          "enforce_eager": True, "gpu_memory_utilization": 0.9}
    assert LLAMA_8B_SHAPE.engine_settings() == {"max_model_len": 131_072, "block_size": 16, "dtype": "bfloat16",
                                                "enforce_eager": False, "gpu_memory_utilization": 0.9}
    # A KV budget in blocks and a cap on active requests, where a spec sets them.
    assert attrs.evolve(TINY_CPU, kv_blocks=97, max_num_seqs=4).engine_settings() == {
        **TINY_CPU.engine_settings(), "num_gpu_blocks_override": 97, "max_num_seqs": 4}
    assert (TINY_CPU.head_dim, LLAMA_8B_SHAPE.head_dim) == (32, 128)
    # K and V of 2 layers x 2 KV heads x 32 wide, 4 bytes each in float32; 2 bytes in bfloat16. Llama-3.1-8B's
    # published dimensions: 128 KiB a token in bf16.
    assert (TINY_CPU.kv_bytes_per_token(), attrs.evolve(TINY_CPU, dtype="bfloat16").kv_bytes_per_token()) == (1024, 512)
    assert LLAMA_8B_SHAPE.config()["num_key_value_heads"] == 8 and LLAMA_8B_SHAPE.kv_bytes_per_token() == 131_072
    assert (TINY_CPU.cpu_kv_cache_gib, LLAMA_8B_SHAPE.cpu_kv_cache_gib) == (1, None)
    assert MODELS == {"tiny-llama-cpu": TINY_CPU, "llama-3.1-8b-shape": LLAMA_8B_SHAPE}
    assert to_model_ids([5, 1000, 1001, 100_276], 1000) == [5, 0, 1, 276]  # the testbed's ids modulo the vocabulary
    folder, config = write_model(TINY_CPU, tmp_path), TINY_CPU.config()
    assert folder == tmp_path / f"tiny-llama-cpu-{hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]}"
    assert (folder / "config.json").read_text() == json.dumps(config, indent=1) and write_model(TINY_CPU, tmp_path) == folder
    (folder / "config.json").write_text("{}")
    assert write_model(TINY_CPU, tmp_path) == folder and json.loads((folder / "config.json").read_text()) == config
    other = write_model(attrs.evolve(TINY_CPU, layers=3), tmp_path)
    assert other != folder and other.parent == tmp_path and other.name.startswith("tiny-llama-cpu-")
    assert write_model(TINY_CPU, tmp_path / "a" / "b").parent == tmp_path / "a" / "b"  # parents made
    assert vllm_models.MODELS_DIR == Path.home() / ".cache" / "testbed" / "models"  # by default, under the user's cache
    monkeypatch.setattr(vllm_models, "MODELS_DIR", tmp_path / "models")
    assert write_model(TINY_CPU).parent == tmp_path / "models"


# --- starting the worker -------------------------------------------------------------------------------------------


def test_the_worker_is_the_script_beside_the_client_given_its_settings_and_an_environment_that_quiets_vllm(tmp_path, monkeypatch):
    settings = vllm_client.worker_settings(TINY_CPU, tmp_path / "m")
    assert settings == {"model": str(tmp_path / "m"), **TINY_CPU.engine_settings()}
    command = vllm_client.worker_command(Path("/opt/py"), settings)
    assert command == ["/opt/py", str(Path(vllm_client.__file__).with_name("vllm_worker.py")), json.dumps(settings)]
    names = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "VLLM_USE_V2_MODEL_RUNNER", "PYTHONUNBUFFERED")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TESTBED_SEEN", "1")
    env = vllm_client.worker_environment(TINY_CPU)
    # vLLM's V1 model runner, whose logits-processor interface forced decoding implements.
    assert ([env[name] for name in names], env["TESTBED_SEEN"]) == (["1", "WARNING", "0", "1"], "1")
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_client.worker_environment(LLAMA_8B_SHAPE)
    for name, value in zip(names, ("4", "DEBUG", "1", "0")):
        monkeypatch.setenv(name, value)
    assert [vllm_client.worker_environment(TINY_CPU)[name] for name in names] == ["4", "DEBUG", "1", "0"]


def test_the_interpreter_is_the_one_given_else_the_environments_else_this_one_with_vllm_else_the_default_venv(tmp_path, monkeypatch):
    assert vllm_client.DEFAULT_VENV == Path.home() / ".cache" / "testbed" / "vllm-venv"
    venv_python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # this interpreter cannot import vllm
    monkeypatch.setattr(vllm_client, "DEFAULT_VENV", tmp_path / "venv")
    monkeypatch.delenv(vllm_client.PYTHON_ENV, raising=False)
    with pytest.raises(VllmUnavailable) as refused:
        vllm_client.vllm_python()
    assert str(refused.value) == (
        f"no interpreter with vLLM: this one cannot import vllm, $TESTBED_VLLM_PYTHON is unset and "
        f"{venv_python} does not exist (docs/real_engine.md installs it)")
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert vllm_client.vllm_python() == venv_python
    monkeypatch.setenv(vllm_client.PYTHON_ENV, str(tmp_path / "missing"))  # the environment's comes before the default
    with pytest.raises(VllmUnavailable, match=f"^{tmp_path / 'missing'} does not exist$"):
        vllm_client.vllm_python()
    assert vllm_client.vllm_python(venv_python) == venv_python  # an explicit interpreter comes first
    monkeypatch.setenv(vllm_client.PYTHON_ENV, str(venv_python))
    assert vllm_client.vllm_python() == venv_python
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(vllm_client.PYTHON_ENV)
    assert vllm_client.vllm_python("~/venv/bin/python") == venv_python  # `~` is expanded
    with pytest.raises(VllmUnavailable, match=f"^{tmp_path / 'nope'} does not exist$"):
        vllm_client.vllm_python(tmp_path / "nope")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else None)
    assert vllm_client.vllm_python() == Path(sys.executable)


# --- the line protocol and the client ------------------------------------------------------------------------------


def test_lines_are_compact_json_an_endless_one_refused_and_a_ready_event_read_field_by_field(monkeypatch):
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
    joined = LineSplitter()  # a line split across reads is joined
    assert joined.feed(b'{"a": 1}\n{"b"') == [{"a": 1}] and joined.feed(b': 2}\n\n') == [{"b": 2}]
    assert Ready.from_event(READY) == Ready(1000, 32, 64, 1.5, "0.32.0", "cpu")
    with pytest.raises(WorkerFailed, match="^engine start failed: boom$"):
        Ready.from_event({"type": "error", "rid": None, "message": "engine start failed: boom"})
    assert Ready.from_event({**READY, "vocab_size": 7, "device": "cuda"}) == Ready(7, 32, 64, 1.5, "0.32.0", "cuda")
    with pytest.raises(WorkerFailed, match="^the worker failed$"):
        Ready.from_event({"type": "error"})
    with pytest.raises(WorkerFailed) as refused:
        Ready.from_event({"type": "tokens"})
    assert str(refused.value) == "expected the worker's ready event, got {'type': 'tokens'}"


async def test_the_ready_line_is_read_across_reads_what_follows_it_dispatched_and_an_exit_before_it_said(autojump_clock, nursery):
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
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(b'{"type":')
    await worker_end.aclose()
    with pytest.raises(WorkerFailed, match=r"^the vLLM worker exited before its engine was ready \(its log says why\)$"):
        async with VllmClient.over_streams(client_end, client_end):
            pass


class Sent:
    """A send stream that keeps what it is sent."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    async def send_all(self, data: bytes) -> None:
        self.lines += [json.loads(line) for line in bytes(data).splitlines()]


async def test_requests_are_sent_as_the_worker_reads_them_and_an_error_for_no_open_request_fails_them_all(autojump_clock):
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
        {"op": "shutdown"}]

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
    client = VllmClient(Sent(), None, Ready.from_event(READY))
    a = await client.generate("a", [1], 1)
    b = await client.generate("b", [1], 1)
    assert client.open_requests() == ["a", "b"]
    client.dispatch({"type": "tokens", "rid": "gone", "n": 1})  # an event of no open request: dropped
    client.dispatch({"type": "finished", "rid": None})
    client.dispatch({"type": "tokens", "rid": "a", "n": 1})
    client.dispatch({"type": "finished", "rid": "a"})
    assert [event async for event in a] == [{"type": "tokens", "rid": "a", "n": 1}, {"type": "finished", "rid": "a"}]
    assert client.open_requests() == ["b"]  # finished: no longer open
    await client.generate("a", [1], 1)  # its id is free again
    with pytest.raises(ValueError, match="^request 'a' is already open$"):
        await client.generate("a", [1], 1)
    client.dispatch({"type": "error", "rid": "zz"})
    assert [event async for event in b] == [{"type": "error", "rid": "b", "message": "worker error"}, {"type": "finished", "rid": "b"}]
    with pytest.raises(WorkerFailed, match="^worker error$"):
        await client.abort("a")
    other = VllmClient(Sent(), None, Ready.from_event(READY))
    c = await other.generate("c", [1], 1)
    other.dispatch({"type": "error", "rid": None, "message": "engine died"})
    assert [event["message"] async for event in c if event["type"] == "error"] == ["engine died"]


async def test_open_requests_fail_when_the_worker_exits_and_no_request_starts_after(autojump_clock):
    client_end, worker_end = trio.testing.memory_stream_pair()
    await worker_end.send_all(encode(READY))
    async with VllmClient.over_streams(client_end, client_end) as client:
        events = await client.generate("a", [1], 5)
        await worker_end.aclose()
        got = [event async for event in events]
        assert [e["type"] for e in got] == ["error", "finished"] and got[0]["message"] == "the vLLM worker exited"
        with pytest.raises(WorkerFailed):
            await client.generate("b", [1], 1)


# --- the worker's process, against stand-in workers (scripts the tests write, passed as the interpreter) -------------

# The hang guard: a stand-in ends itself (SIGALRM) this long after it starts, whatever it was doing.
LIFETIME = 10
PROCESS_READY = {"type": "ready", "vocab_size": 128256, "block_size": 32, "kv_blocks": 2048, "startup_s": 0.25,
         "vllm_version": "0.32.0", "device": "cpu"}
ENVIRONMENT = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "PYTHONUNBUFFERED")

PRELUDE = """
import json, os, signal, sys, time
signal.alarm({lifetime})

def note(**fields):  # what the stand-in saw, one JSON object a line, for the test to read
    with open({record!r}, "a") as record:
        record.write(json.dumps(fields) + "\\n")

def say(*events):  # one write: the events reach the pipe together
    os.write(1, b"".join(json.dumps(event).encode() + b"\\n" for event in events))

note(argv=sys.argv[1:], env={{name: os.environ.get(name) for name in {environment!r}}})
"""

# Logs a line, says it is ready (with an event after its ready line in the same write), then exits
# 0 on the shutdown request (5 on anything else).
OBEDIENT = f"""
sys.stderr.write("engine starting\\n")
sys.stderr.flush()
say({PROCESS_READY!r}, {{"type": "finished", "rid": "after-ready"}})
line = sys.stdin.buffer.readline()
note(stdin=line.decode())
sys.exit(0 if line == b'{{"op":"shutdown"}}\\n' else 5)
"""

# Ready, then reads the shutdown request and goes on running (until SIGTERM).
IGNORES_SHUTDOWN = f"""
say({PROCESS_READY!r})
note(stdin=sys.stdin.buffer.readline().decode())
while True:
    time.sleep(1)
"""

# As above, and SIGTERM is ignored too (SIGKILL is the only way out).
IGNORES_SIGTERM = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + IGNORES_SHUTDOWN

# Closes its stdin before it says it is ready: the shutdown request finds a broken pipe.
CLOSES_STDIN = f"""
os.close(0)
say({PROCESS_READY!r})
while True:
    time.sleep(1)
"""

# Logs why and exits 3 before its ready line.
FAILS_TO_START = """
sys.stderr.write("engine failed: no memory\\n")
sys.exit(3)
"""


def stand_in(folder: Path, body: str, name: str = "python") -> Path:
    """An executable script that takes the interpreter's place in the worker's command line."""
    path, record = folder / name, folder / f"{name}.record"
    prelude = PRELUDE.format(lifetime=LIFETIME, record=str(record), environment=ENVIRONMENT)
    path.write_text(f"#!{sys.executable} -IS\n{prelude}{body}")
    path.chmod(0o755)
    return path


def records(python: Path) -> list[dict]:
    return [json.loads(line) for line in python.with_name(f"{python.name}.record").read_text().splitlines()]


@pytest.fixture
def started(monkeypatch, tmp_path):
    """Models under tmp_path, the worker's variables unset, $TESTBED_VLLM_PYTHON a decoy that exits 7 (a start that
    ignored `python=` fails), and every worker started ended after the test."""
    monkeypatch.setattr(vllm_models, "MODELS_DIR", tmp_path / "models")
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    decoy_folder = tmp_path / "decoy"
    decoy_folder.mkdir()
    monkeypatch.setenv(vllm_client.PYTHON_ENV, str(stand_in(decoy_folder, "sys.exit(7)\n")))
    processes: list[WorkerProcess] = []

    def start(python: Path) -> WorkerProcess:
        process = WorkerProcess.start(TINY_CPU, python=python)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if not isinstance(process.popen, subprocess.Popen):  # a mutant's WorkerProcess without its process
            continue
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()
        for pipe in (process.popen.stdin, process.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):  # a buffered stdin (a mutant's) flushed into a dead worker
                    pipe.close()


def waiting_in_pipe(fd: int) -> bytes:
    """What is in the pipe now, b"" if nothing: no wait, since the stand-in wrote its ready line and the
    event after it in one write (atomic, under PIPE_BUF), so the event is there once the ready line was."""
    readable, _, _ = select.select([fd], [], [], 0)
    return os.read(fd, 1 << 16) if readable else b""


def test_start_reads_the_ready_event_or_the_exit_code_runs_the_worker_as_configured_and_stop_asks_it_to_shut_down(started, tmp_path):
    python, model_dir = stand_in(tmp_path, OBEDIENT), write_model(TINY_CPU)
    log = model_dir / "worker.log"
    log.write_bytes(b"an earlier run\n")
    process = started(python)
    assert process.ready == Ready(128256, 32, 2048, 0.25, "0.32.0", "cpu") and process.log_path == log
    # The pipe is unbuffered on this side: what follows the ready line is still in the pipe, for the
    # client that attaches to it later (VllmClient.over_fds), not in a buffer of this process.
    assert waiting_in_pipe(process.popen.stdout.fileno()) == b'{"type": "finished", "rid": "after-ready"}\n'
    process.stop()
    assert process.popen.returncode == 0  # stop waited for the worker to exit on the request
    seen, shutdown = records(python)
    assert seen == {"argv": [str(vllm_client.WORKER_SCRIPT), json.dumps(vllm_client.worker_settings(TINY_CPU, model_dir))],
                    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}}
    assert shutdown == {"stdin": '{"op":"shutdown"}\n'}
    # The worker's stderr is appended to the log, after what was there.
    assert log.read_bytes() == b"an earlier run\nengine starting\n"
    python = stand_in(tmp_path, FAILS_TO_START)  # exits before it is ready: its exit code and its log say so
    with pytest.raises(WorkerFailed) as failed:
        started(python)
    assert str(failed.value) == f"the vLLM worker exited (3) before it was ready; see {log}"
    assert log.read_bytes() == b"an earlier run\nengine starting\nengine failed: no memory\n"  # appended too


def test_a_launched_worker_no_one_waited_for_is_terminated(started, tmp_path):
    starting = WorkerProcess.launch(TINY_CPU, python=stand_in(tmp_path, IGNORES_SHUTDOWN))
    starting.abandon()
    assert starting.popen.returncode == -signal.SIGTERM
    starting.popen.stdin.close()
    starting.popen.stdout.close()


@pytest.mark.parametrize("body, wait_s, exit_code", [
    (IGNORES_SHUTDOWN, 0.2, -signal.SIGTERM),
    (IGNORES_SIGTERM, 0.2, -signal.SIGKILL),
    (CLOSES_STDIN, LIFETIME * 2, -signal.SIGTERM),  # the request raises BrokenPipeError: terminated without its wait
], ids=["ignores-shutdown", "ignores-sigterm", "stdin-closed"])
def test_stop_terminates_then_kills_a_worker_that_does_not_exit_on_the_shutdown_request(started, tmp_path, monkeypatch, body,
                                                                                           wait_s, exit_code):
    monkeypatch.setattr(vllm_client, "SHUTDOWN_WAIT_S", wait_s)
    monkeypatch.setattr(vllm_client, "TERMINATE_WAIT_S", wait_s)
    process = started(stand_in(tmp_path, body))
    process.stop()
    # stop waits for a terminated worker, not after SIGKILL (the hang guard's SIGALRM would end the stand-in otherwise).
    assert (process.popen.returncode if exit_code == -signal.SIGTERM else process.popen.wait(timeout=LIFETIME + 5)) == exit_code


async def test_open_vllm_process_appends_the_workers_stderr_to_its_log_and_yields_a_ready_client(started, tmp_path):
    python, log = stand_in(tmp_path, OBEDIENT), tmp_path / "given.log"
    log.write_bytes(b"an earlier run\n")
    with trio.fail_after(LIFETIME + 5):
        async with vllm_client.open_vllm_process(TINY_CPU, python=python, log_path=log) as client:
            assert client.ready == Ready(128256, 32, 2048, 0.25, "0.32.0", "cpu")
    assert records(python)[1:] == [{"stdin": '{"op":"shutdown"}\n'}] and log.read_bytes() == b"an earlier run\nengine starting\n"


# --- the commands that need vLLM, without it -------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this interpreter has vLLM: it would start it")
def test_the_real_engine_experiment_and_the_gpu_run_without_vllm_say_why_in_one_line(tmp_path, capsys):
    # This interpreter lacks vLLM: the worker it runs cannot start an engine.
    done = subprocess.run([sys.executable, "-m", "experiments.real_engine", "--vllm-python", sys.executable],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TESTBED_RESULTS=str(tmp_path)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("python -m experiments.real_engine: error: engine start failed: ModuleNotFoundError: "
                           "No module named 'vllm'\n")
    assert not any(tmp_path.iterdir())  # nothing written
    from experiments import gpu_run

    # An interpreter that does not exist, then one without vLLM: each refused before anything starts, with its reason.
    assert gpu_run.main(["--vllm-python", str(tmp_path / "python")]) == 2
    assert capsys.readouterr().out == f"gpu_run: {tmp_path / 'python'} does not exist\n"
    assert gpu_run.main(["--vllm-python", sys.executable]) == 2
    assert capsys.readouterr().out == (
        f"gpu_run: {sys.executable} cannot import vLLM and torch (ModuleNotFoundError: No module named 'vllm'); "
        "install vLLM's CUDA build there (docs/real_engine.md)\n")


