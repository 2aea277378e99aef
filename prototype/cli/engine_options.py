"""`--engine` and its options, shared by `compare` and `serve`."""

from __future__ import annotations

import argparse

from ..engine.vllm_client import DEFAULT_VENV, PYTHON_ENV
from ..engine.vllm_models import LLAMA_8B_SHAPE, MODELS, TINY_CPU, ModelSpec

SIMULATED = "simulated"
VLLM = "vllm"


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=[SIMULATED, VLLM], default=SIMULATED,
                        help="simulated: the latency model (default); vllm: a real engine, vLLM in its own process "
                        "with dummy weights, in real time (docs/real_engine.md)")
    parser.add_argument("--vllm-model", choices=sorted(MODELS), default=TINY_CPU.name,
                        help=f"with --engine vllm: the model config (default {TINY_CPU.name}; {LLAMA_8B_SHAPE.name} for a GPU)")
    parser.add_argument("--vllm-python", default=None, help="with --engine vllm: the interpreter that has vLLM "
                        f"(default: ${PYTHON_ENV}, else this one if it imports vllm, else {DEFAULT_VENV}/bin/python)")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    return MODELS[args.vllm_model]
