"""The models the real engine runs: Llama-architecture configs written by the testbed, weights
drawn by vLLM's dummy loader, no tokenizer. Nothing is downloaded.

The weights are random, so what such a model would say means nothing; the testbed's scripted
policy writes the text anyway. What is real is the work: the same layers, attention, KV cache,
prefix cache and scheduler as the named model's, at its dimensions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

MODELS_DIR = Path.home() / ".cache" / "testbed" / "models"


@attrs.frozen
class ModelSpec:
    """A model config and the engine settings it runs with."""

    name: str
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    max_model_len: int
    block_size: int
    dtype: str
    enforce_eager: bool
    cpu_kv_cache_gib: int | None = None
    """KV cache for vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE); None on a GPU."""
    gpu_memory_utilization: float = 0.9
    kv_blocks: int | None = None
    """The KV budget in blocks (vLLM's num_gpu_blocks_override, one of them its null block); None: sized
    from memory (cpu_kv_cache_gib, gpu_memory_utilization)."""
    max_num_seqs: int | None = None
    """Requests vLLM keeps active at once (a held request paused between chunks counts); None: vLLM's 256."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def config(self) -> dict[str, Any]:
        """A Hugging Face config.json for LlamaForCausalLM."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "max_position_embeddings": self.max_model_len,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        }

    def engine_settings(self) -> dict[str, Any]:
        settings = {"max_model_len": self.max_model_len, "block_size": self.block_size, "dtype": self.dtype,
                    "enforce_eager": self.enforce_eager, "gpu_memory_utilization": self.gpu_memory_utilization}
        if self.kv_blocks is not None:
            settings["num_gpu_blocks_override"] = self.kv_blocks
        if self.max_num_seqs is not None:
            settings["max_num_seqs"] = self.max_num_seqs
        return settings

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, at the dtype's width."""
        width = 4 if self.dtype == "float32" else 2
        return 2 * self.layers * self.kv_heads * self.head_dim * width


# A tiny Llama for CPU (tests, CI): 2 layers, 128 wide, Llama 3's 128,256-token vocabulary so the
# testbed's cl100k ids (< 100,277) map to themselves. float32: a dtype every x86 CPU computes
# natively (these machines have no AVX-512, lscpu), and the tiny model's weights are ~140 MB at that
# width. Eager mode: vLLM's default torch.compile warm-up took 2.5 minutes on 2 busy cores
# (docs/real_engine.md) for no effect on what the tests count. Blocks of 32 tokens: the CPU attention backend
# accepts multiples of 32 only (vLLM's CPU_ATTN), the nearest to the GPU default of 16. A context window of
# 131,072 tokens, Llama 3.1's: the coding preset's contexts reach ~90k (its KV, 1 KiB a token here, fits the 1 GiB).
TINY_CPU = ModelSpec(
    name="tiny-llama-cpu", hidden_size=128, intermediate_size=512, layers=2, heads=4, kv_heads=2,
    vocab_size=128_256, max_model_len=131_072, block_size=32, dtype="float32", enforce_eager=True, cpu_kv_cache_gib=1,
)

# Llama-3.1-8B's dimensions (its config.json on Hugging Face: 32 layers, 4096 wide, 14336 MLP,
# 32 heads, 8 KV heads, 128,256 vocabulary), random bf16 weights, for one GPU.
LLAMA_8B_SHAPE = ModelSpec(
    name="llama-3.1-8b-shape", hidden_size=4096, intermediate_size=14_336, layers=32, heads=32, kv_heads=8,
    vocab_size=128_256, max_model_len=131_072, block_size=16, dtype="bfloat16", enforce_eager=False,
)

MODELS = {spec.name: spec for spec in (TINY_CPU, LLAMA_8B_SHAPE)}


def write_model(spec: ModelSpec, root: Path | None = None) -> Path:
    """The model's folder (its config.json only), written once per config; returns its path."""
    config = spec.config()
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    folder = (root if root is not None else MODELS_DIR) / f"{spec.name}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    if not path.exists() or json.loads(path.read_text()) != config:
        path.write_text(json.dumps(config, indent=1))
    return folder


def to_model_ids(ids: Any, vocab_size: int) -> list[int]:
    """The testbed's token ids in the model's vocabulary (modulo its size)."""
    return [int(token) % vocab_size for token in ids]
