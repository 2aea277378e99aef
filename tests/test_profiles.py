"""Preset and latency files (prototype/profiles.py): what `calibrate` saves reads back as it was, with its
source, and a file that is no profile is refused naming the file, the line or field, and why."""

from __future__ import annotations

import json

import attrs
import pytest

from prototype import profiles
from prototype import workload as wl
from prototype.engine.latency import LatencyModel


def test_a_saved_preset_and_profile_read_back_and_say_their_source(tmp_path) -> None:
    params = attrs.evolve(wl.PRESETS["chat"], turns_max=4, tool_mixture=((1.0, 0.5, 0.0),))
    path = profiles.save_preset(params, str(tmp_path / "preset.json"), "a test")
    text = path.read_text(encoding="utf-8")
    assert path == tmp_path / "preset.json" and text.endswith("}\n")
    assert text.startswith('{\n "source": "a test",\n "turns_median": 2,') and profiles.load_preset(path) == params
    model = LatencyModel(decode_tokens_per_s=80.0, prefill_tokens_per_s=9000.0, cache_attention=None, request_overhead=0.0)
    path = profiles.save_latency(model, tmp_path / "latency.json", "fit, 12 rounds")
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "source": "fit, 12 rounds", "decode_tokens_per_s": 80.0, "prefill_tokens_per_s": 9000.0, "cache_attention": None,
        "request_overhead": 0.0}
    assert profiles.load_latency(path) == model
    (tmp_path / "partial.json").write_text('{"prefill_tokens_per_s": 5000}')
    assert profiles.load_latency(tmp_path / "partial.json") == LatencyModel(prefill_tokens_per_s=5000)
    (tmp_path / "partial.json").write_text('{"initial_prompt_tokens": 123}')
    assert profiles.load_preset(tmp_path / "partial.json") == attrs.evolve(wl.WorkloadParams(), initial_prompt_tokens=123)


def refusal(load, path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    with pytest.raises(profiles.ProfileError) as refused:
        load(path)
    return str(refused.value)


def test_a_file_that_is_no_profile_is_refused_with_its_name_and_field(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(profiles.ProfileError) as refused:
        profiles.load_preset(missing)
    assert str(refused.value) == f"{missing}: cannot read (No such file or directory)"
    path = tmp_path / "p.json"
    bad = '{\n"turns_max": 3,\n}'
    with pytest.raises(json.JSONDecodeError) as invalid:
        json.loads(bad)
    assert refusal(profiles.load_preset, path, bad) == f"{path}:3: invalid JSON ({invalid.value.msg})"  # the line, and JSON's words
    assert refusal(profiles.load_latency, path, "[1, 2]") == f"{path}: expected a JSON object"
    known = ", ".join(sorted(a.name for a in attrs.fields(LatencyModel)))
    assert refusal(profiles.load_latency, path, '{"source": "x", "zeta": 1, "alpha": 2}') == f"{path}: alpha: unknown field; known: {known}"
    assert refusal(profiles.load_preset, path, '{"turns_min": 0}') == f"{path}: invalid WorkloadParams: 1 <= turns_min <= turns_max"
    assert refusal(profiles.load_preset, path, '{"tool_mixture": 5}') == f"{path}: 'int' object is not iterable"
    assert refusal(profiles.load_latency, path, '{"cache_attention": null, "decode_tokens_per_s": -1}') == (
        f"{path}: decode_tokens_per_s: expected a finite number >= 0, got -1")  # the fields after a null are checked too
    path.write_text('{"request_overhead": 0, "cache_attention": null, "decode_tokens_per_s": 1e-3}')  # no overhead, no cache term
    assert profiles.load_latency(path) == LatencyModel(decode_tokens_per_s=1e-3, cache_attention=None, request_overhead=0)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("decode_tokens_per_s", "true", "expected a finite number >= 0, got True"),
    ("decode_tokens_per_s", '"80"', "expected a finite number >= 0, got '80'"),
    ("prefill_tokens_per_s", "null", "expected a finite number >= 0, got None"),
    ("prefill_tokens_per_s", "Infinity", "expected a finite number >= 0, got inf"),
    ("request_overhead", "-0.001", "expected a finite number >= 0, got -0.001"),
    ("decode_tokens_per_s", "0", "must be > 0"), ("prefill_tokens_per_s", "0.0", "must be > 0"),
    ("cache_attention", "0", "must be > 0"),
])
def test_a_latency_value_that_cannot_time_a_call_is_refused(tmp_path, field: str, value: str, why: str) -> None:
    path = tmp_path / "latency.json"
    assert refusal(profiles.load_latency, path, f'{{"{field}": {value}}}') == f"{path}: {field}: {why}"
