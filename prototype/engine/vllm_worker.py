"""vLLM's asyncio engine in a process of its own, driven by JSON lines on stdin and stdout.

Run as a script by the vLLM client (prototype/engine/vllm_client.py) with the interpreter that has
vLLM installed: `python vllm_worker.py '<settings JSON>'`. It imports only the standard library and
vLLM (never the testbed's package; vllm_forced.py, beside it, is standard library until vLLM
loads its processor), so that interpreter needs nothing else. Token ids go in and come out: the
testbed's scripted policy writes the text and plans each call's ids, vLLM samples exactly those
(forced decoding, vllm_forced.py) and decides when each token is ready.

Requests (one JSON object per line on stdin):

* `{"op": "generate", "rid": R, "prompt": [ids], "max_tokens": N, "forced": [ids] | null, "salt": S | null,
  "held": bool}`: a new engine request. `forced`: the ids it samples, in order (its plan; null: vLLM
  samples freely). `held`: a resumable request (vLLM's session-based streaming input,
  `AsyncLLM.generate` over an async generator of `StreamingInput`) whose first chunk is `prompt`;
  it stays alive, with its KV, after its N tokens, until `close`. `salt`: vLLM's `cache_salt`, so
  the request finds nothing another salt cached (a request routed to an engine that holds nothing).
* `{"op": "append", "rid": R, "prompt": [ids], "max_tokens": N, "forced": [ids] | null}`: the next
  chunk of held request R, with a plan of its own: only these ids are new to the engine.
* `{"op": "close", "rid": R}`: held request R ends (its input stream returns).
* `{"op": "abort", "rid": R}`: request R stops now.
* `{"op": "counters", "tag": T, "reset_peak": bool}`: the engine's counters now; `reset_peak`
  starts `kv_usage_max` again from the current usage.
* `{"op": "shutdown"}`.

Events (one JSON object per line on the original stdout; vLLM's own output goes to stderr):

* `{"type": "ready", ...}`: the engine is up (vocabulary, block size, KV blocks, start-up seconds).
* `{"type": "tokens", "rid": R, "n": k, "ids": [ids], "first": {...}}`: k more tokens of R's current
  chunk are sampled, these ids. The chunk's first carries `first`: the request's
  `num_cached_tokens` (`cached_tokens`; a resumed chunk keeps the first chunk's figure: KV the live
  request holds is not a cache hit), the counters' growth since the chunk was sent
  (`prefill_tokens`, `prefix_hits`, `prefix_queries`: exact when one request is in flight, an upper
  bound otherwise), `kv_usage` and vLLM's `prompt_tokens`.
* `{"type": "chunk_done", "rid": R, "tokens": N, "counters": {...}}`: R's current chunk produced its N tokens.
* `{"type": "finished", "rid": R}`: request R is over (closed, aborted or done).
* `{"type": "error", "rid": R | null, "message": M}`.
* `{"type": "counters", "tag": T, "counters": {...}}`.

Counters are cumulative over the engine's life, from vLLM's own stats (`SchedulerStats` as its
Prometheus logger gets them): `prefill_tokens` (context tokens the scheduler computed: new
requests' uncached prompt and resumed chunks' appended ids), `decode_tokens`, `prefix_queries` and
`prefix_hits` (prefix-cache lookups, in tokens), `kv_usage` (share of the KV blocks in use at the
last step), `kv_usage_max` (the most since the start or the last reset) and `steps`; under a KV budget
that binds, `preemptions` (running requests vLLM preempted, recompute mode), `recompute_queries` and
`recompute_hits` (the prefix-cache lookups of preempted requests coming back, in tokens: what they
had less what they found is what they computed again) and, at the last step, `running` and `waiting`
(requests waiting for admission; a held request paused between chunks is neither). A chunk's
`first` also carries the request's `preemptions` so far and, for a request's first chunk, vLLM's
`queued_s` (from queued to first scheduled, engine-core clock).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

try:
    from . import vllm_forced  # imported as the testbed's module (its tests)
except ImportError:
    import vllm_forced  # run as a script: this folder is on the path, as vLLM's processes find it


def _protocol_stream():
    """The original stdout, for events only; fd 1 then points at stderr, so that whatever vLLM or
    its engine-core process prints (they inherit fd 1) cannot corrupt the protocol."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


class Counters:
    """Cumulative engine counters, fed by a vLLM stat logger on the worker's event loop."""

    def __init__(self) -> None:
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.kv_usage = 0.0
        self.kv_usage_max = 0.0
        self.steps = 0
        self.preemptions = 0
        self.recompute_queries = 0
        self.recompute_hits = 0
        self.running = 0
        self.waiting = 0

    def as_dict(self) -> dict:
        return dict(vars(self))


def _stat_logger_factory(counters: Counters):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class CountingLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0, **_: object) -> None:
            if iteration_stats is not None:
                counters.preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)
            if scheduler_stats is None:
                return
            details = scheduler_stats.iteration_details
            if details is not None:
                counters.prefill_tokens += details.num_ctx_tokens
                counters.decode_tokens += details.num_generation_tokens
                counters.steps += 1
            cache = scheduler_stats.prefix_cache_stats
            if cache is not None:
                counters.prefix_queries += cache.queries
                counters.prefix_hits += cache.hits
                counters.recompute_queries += getattr(cache, "preempted_queries", 0)
                counters.recompute_hits += getattr(cache, "preempted_hits", 0)
            counters.running = getattr(scheduler_stats, "num_running_reqs", 0)
            counters.waiting = getattr(scheduler_stats, "num_waiting_reqs", 0)
            counters.kv_usage = scheduler_stats.kv_cache_usage
            counters.kv_usage_max = max(counters.kv_usage_max, scheduler_stats.kv_cache_usage)

        def log_engine_initialized(self) -> None:
            pass

    return CountingLogger


class Worker:
    def __init__(self, settings: dict, out) -> None:
        self.settings = settings
        self.out = out
        self.counters = Counters()
        self.inputs: dict[str, asyncio.Queue] = {}  # held requests: their pending chunks (None: close)
        self.tasks: dict[str, asyncio.Task] = {}
        self.engine = None

    def send(self, event: dict) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        s = self.settings
        args = AsyncEngineArgs(
            model=s["model"],
            load_format="dummy",  # weights drawn by vLLM's dummy loader: nothing is downloaded
            skip_tokenizer_init=True,  # token ids in and out
            enable_prefix_caching=True,
            max_model_len=s["max_model_len"],
            block_size=s.get("block_size", 16),
            dtype=s.get("dtype", "auto"),
            seed=s.get("seed", 0),
            enable_logging_iteration_details=True,
            max_num_seqs=s.get("max_num_seqs", 256),
            gpu_memory_utilization=s.get("gpu_memory_utilization", 0.9),
            enforce_eager=s.get("enforce_eager", False),
            logits_processors=[vllm_forced.PROCESSOR],  # a plan in a request's extra_args is what it samples
            # A KV budget in blocks (one of them vLLM's null block), for experiments where memory binds.
            **({"num_gpu_blocks_override": s["num_gpu_blocks_override"]} if "num_gpu_blocks_override" in s else {}),
        )
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self.counters)])
        config = self.engine.vllm_config
        self.send({
            "type": "ready",
            "vocab_size": config.model_config.get_vocab_size(),
            "block_size": config.cache_config.block_size,
            "kv_blocks": config.cache_config.num_gpu_blocks,
            "startup_s": time.monotonic() - started,
            "vllm_version": _vllm_version(),
            "device": config.device_config.device_type,
        })

    def params(self, max_tokens: int, forced: list[int] | None = None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # The policy decides how many tokens a call samples, and which: the engine never stops early
        # (EOS) or late, and a plan's ids are the only ones its logits allow.
        return SamplingParams(
            max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, temperature=0.0,
            output_kind=RequestOutputKind.DELTA, detokenize=False,
            extra_args={vllm_forced.FORCED_IDS: forced} if forced else None,
        )

    async def run_request(self, message: dict) -> None:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        rid = message["rid"]

        def prompt_of(ids: list[int], salt: str | None) -> TokensPrompt:
            prompt = TokensPrompt(prompt_token_ids=ids)
            if salt:
                prompt["cache_salt"] = salt
            return prompt

        salt = message.get("salt")
        first_max = message["max_tokens"]
        first_params = self.params(first_max, message.get("forced"))
        chunks_sent: list[tuple[int, dict]] = []  # per chunk: its tokens, the counters when it was sent
        try:
            if message.get("held"):
                queue: asyncio.Queue = asyncio.Queue()
                self.inputs[rid] = queue
                queue.put_nowait((message["prompt"], first_max, first_params))

                async def chunks():
                    while (chunk := await queue.get()) is not None:
                        ids, max_tokens, params = chunk
                        # The salt keys the request's first block; appended chunks extend its chain.
                        chunk_salt = salt if not chunks_sent else None
                        chunks_sent.append((max_tokens, self.counters.as_dict()))
                        yield StreamingInput(prompt_of(ids, chunk_salt), params)

                stream = self.engine.generate(chunks(), first_params, rid, session_id=rid)
            else:
                chunks_sent.append((first_max, self.counters.as_dict()))
                stream = self.engine.generate(prompt_of(message["prompt"], salt), first_params, rid)
            chunk = 0
            produced = 0  # tokens of the current chunk so far
            async for output in stream:
                ids = list(output.outputs[0].token_ids) if output.outputs else []
                done = 0  # of these ids, those reported so far
                while done < len(ids) and chunk < len(chunks_sent):
                    planned, before = chunks_sent[chunk]
                    take = min(len(ids) - done, planned - produced)
                    event = {"type": "tokens", "rid": rid, "n": take, "ids": ids[done : done + take]}
                    if produced == 0:  # the chunk's first token: its prefill is over
                        now = self.counters
                        event["first"] = {
                            "cached_tokens": output.num_cached_tokens or 0,
                            "prefill_tokens": now.prefill_tokens - before["prefill_tokens"],
                            "prefix_hits": now.prefix_hits - before["prefix_hits"],
                            "prefix_queries": now.prefix_queries - before["prefix_queries"],
                            "kv_usage": now.kv_usage,
                            "prompt_tokens": len(output.prompt_token_ids or ()),
                            **_request_stats(output, first_chunk=chunk == 0),
                        }
                    self.send(event)
                    produced += take
                    done += take
                    if produced == planned:
                        self.send({"type": "chunk_done", "rid": rid, "tokens": planned, "counters": self.counters.as_dict()})
                        chunk += 1
                        produced = 0
        except asyncio.CancelledError:
            pass
        except Exception as error:  # the request fails, the worker keeps serving
            self.send({"type": "error", "rid": rid, "message": f"{type(error).__name__}: {error}"})
        finally:
            self.inputs.pop(rid, None)
            self.tasks.pop(rid, None)
            self.send({"type": "finished", "rid": rid})

    async def handle(self, message: dict) -> bool:
        op = message.get("op")
        rid = message.get("rid")
        if op == "generate":
            if rid in self.tasks:
                self.send({"type": "error", "rid": rid, "message": f"request {rid!r} exists"})
            else:
                self.tasks[rid] = asyncio.create_task(self.run_request(message))
        elif op == "append":
            queue = self.inputs.get(rid)
            if queue is None:
                self.send({"type": "error", "rid": rid, "message": f"no held request {rid!r}"})
            else:
                queue.put_nowait((message["prompt"], message["max_tokens"], self.params(message["max_tokens"], message.get("forced"))))
        elif op == "close":
            queue = self.inputs.get(rid)
            if queue is not None:
                queue.put_nowait(None)
        elif op == "abort":
            if rid in self.tasks:
                await self.engine.abort(rid)
                self.tasks[rid].cancel()
        elif op == "counters":
            self.send({"type": "counters", "tag": message.get("tag"), "counters": self.counters.as_dict()})
            if message.get("reset_peak"):
                self.counters.kv_usage_max = self.counters.kv_usage
        elif op == "shutdown":
            return False
        else:
            self.send({"type": "error", "rid": rid, "message": f"unknown op {op!r}"})
        return True


def _request_stats(output, *, first_chunk: bool) -> dict:
    """vLLM's own figures for one request (RequestOutput.metrics, a RequestStateStats): its preemptions so
    far and, on its first chunk, its wait from queued to scheduled; {} where vLLM gives no metrics."""
    metrics = getattr(output, "metrics", None)
    if metrics is None:
        return {}
    stats = {"preemptions": metrics.num_preemptions}
    if first_chunk and metrics.scheduled_ts and metrics.queued_ts:
        stats["queued_s"] = max(0.0, metrics.scheduled_ts - metrics.queued_ts)
    return stats


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


async def _main(settings: dict) -> None:
    out = _protocol_stream()
    worker = Worker(settings, out)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:  # a thread: stdin's blocking reads stay off the event loop
        try:
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            loop.call_soon_threadsafe(lines.put_nowait, None)
        except RuntimeError:  # the loop closed first (the worker stopped): nobody is left to read
            pass

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        await worker.start()
    except Exception as error:
        worker.send({"type": "error", "rid": None, "message": f"engine start failed: {type(error).__name__}: {error}"})
        raise
    try:
        while (line := await lines.get()) is not None:
            try:
                message = json.loads(line)
            except ValueError as error:
                worker.send({"type": "error", "rid": None, "message": f"not JSON: {error}"})
                continue
            if not await worker.handle(message):
                break
    finally:
        for task in list(worker.tasks.values()):
            task.cancel()
        worker.engine.shutdown()


if __name__ == "__main__":  # vLLM spawns its engine core, which imports this module again
    # vLLM loads the logits processor by name (vllm_forced.PROCESSOR) in each of its processes: they
    # find this folder on their path however they are started.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    asyncio.run(_main(json.loads(sys.argv[1])))
