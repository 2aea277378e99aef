"""The simulated inference engine: latency model, scripted policy, tokenizer, paced sampler."""

from .engine import Engine
from .kv import Prompt
from .latency import LatencyModel, decode_rate_for_model
from .policy import ScriptedPolicy, TurnPlan

__all__ = ["Engine", "LatencyModel", "Prompt", "ScriptedPolicy", "TurnPlan", "decode_rate_for_model"]
