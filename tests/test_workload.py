"""Tests for prototype.workload: the generator's shape and moments (docs/parameters.md §1-2), fixed(), and the JSONL trace."""

import io
import json

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prototype.traces.native import read_trace, write_trace
from prototype.workload import (
    DEFAULT_PRESET,
    PRESETS,
    HostedCall,
    TurnSpec,
    Workload,
    WorkloadParams,
    fixed,
    generate,
    generate_one,
    sample_tool_seconds,
    summary,
)


@pytest.fixture(scope="module")
def coding_sample() -> list[Workload]:
    """2,000 tasks of the default parameters (docs/parameters.md §1): enough for the turn mean (se ~0.5) and
    per-turn moments."""
    return generate(WorkloadParams(), seed=1, n_tasks=2000)


def test_same_seed_same_workloads_different_seed_differs():
    assert generate(seed=7, n_tasks=5) == generate(seed=7, n_tasks=5)
    assert generate(seed=7, n_tasks=5) != generate(seed=8, n_tasks=5)
    first = generate(seed=7, n_tasks=5)
    assert len({w.turns for w in first}) == 5  # tasks within one call differ too


def test_task_i_does_not_depend_on_n_tasks():
    many = generate(seed=3, n_tasks=6)
    assert generate(seed=3, n_tasks=3) == many[:3]
    assert generate_one(seed=3, index=4) == many[4]
    assert generate_one(seed=3) == many[0]
    assert [w.name for w in many[:2]] == ["coding-0", "coding-1"]
    assert all(w.seed == 3 for w in many)


def test_tool_calls_on_every_turn_but_the_last():
    for w in generate(seed=0, n_tasks=200, parallel_calls_p=0.5, hosted_call_p=0.5):
        assert w.turns[-1].tool_seconds == ()
        assert w.turns[-1].hosted_calls == ()
        assert all(1 <= len(t.tool_seconds) <= 4 for t in w.turns[:-1])
        assert w.turns[0].appended_tokens == PRESETS["coding"].initial_prompt_tokens


def test_parallel_and_hosted_probabilities_one():
    w = generate_one(seed=2, fixed_turns=6, parallel_calls_p=1.0, hosted_call_p=1.0, hosted_result_tokens=99,
                     parallel_call_weights=(1.0,))
    assert [len(t.tool_seconds) for t in w.turns] == [2, 2, 2, 2, 2, 0]
    assert [t.hosted_calls for t in w.turns] == [(HostedCall(1.0, 99),)] * 5 + [()]
    three = generate_one(seed=2, fixed_turns=6, parallel_calls_p=1.0, parallel_call_weights=(0.0, 1.0))
    assert [len(t.tool_seconds) for t in three.turns] == [3, 3, 3, 3, 3, 0]


def test_default_rates_follow_their_sources(coding_sample):
    """docs/parameters.md §1: cc-multi's 35.8% parallel turns (21.3/9.4/5.2% two/three/four calls) and 4.8% of
    tool turns with a web search; reasoning 11-45% of each turn's output."""
    tool_turns = [t for w in coding_sample for t in w.turns if t.tool_seconds]
    counts = np.bincount([len(t.tool_seconds) for t in tool_turns], minlength=5) / len(tool_turns)
    assert counts[1] == pytest.approx(0.642, abs=0.01)
    assert counts[2:5] == pytest.approx([0.213, 0.094, 0.052], abs=0.01)
    assert np.mean([bool(t.hosted_calls) for t in tool_turns]) == pytest.approx(0.048, abs=0.005)
    shares = [t.reasoning_tokens / t.output_tokens for w in coding_sample for t in w.turns if t.output_tokens >= 100]
    assert 0.10 <= min(shares) and max(shares) <= 0.46
    assert np.mean(shares) == pytest.approx(0.28, abs=0.01)


def test_tasks_draw_their_own_content_and_share_the_preset_prefix():
    tasks = generate(seed=0, n_tasks=50)
    assert len({w.content_seed for w in tasks}) == 50  # no two tasks share content
    assert {(w.prefix, w.prefix_tokens) for w in tasks} == {("coding", 7400)}
    assert generate(seed=1, n_tasks=1)[0].content_seed != tasks[0].content_seed
    chat = generate_one("chat", seed=0)
    assert (chat.prefix, chat.prefix_tokens) == ("chat", 300)
    assert generate_one(seed=0, initial_prompt_tokens=64).prefix_tokens == 64  # clipped to the prompt


def test_parallel_calls_do_not_shift_token_draws():
    plain = generate_one(seed=5, fixed_turns=10)
    parallel = generate_one(seed=5, fixed_turns=10, parallel_calls_p=0.5)
    tokens = [(t.appended_tokens, t.output_tokens) for t in plain.turns]
    assert tokens == [(t.appended_tokens, t.output_tokens) for t in parallel.turns]


def test_clipping_bounds_hold_and_are_reached():
    bounds = dict(turns_min=10, turns_max=12, appended_min=700, appended_max=900, output_min=250, output_max=350)
    workloads = generate(seed=4, n_tasks=100, tool_cap_seconds=1.0, **bounds)
    turns = [len(w.turns) for w in workloads]
    appended = [t.appended_tokens for w in workloads for t in w.turns[1:]]
    outputs = [t.output_tokens for w in workloads for t in w.turns]
    seconds = [s for w in workloads for t in w.turns for s in t.tool_seconds]
    assert (min(turns), max(turns)) == (10, 12)
    assert (min(appended), max(appended)) == (700, 900)
    assert (min(outputs), max(outputs)) == (250, 350)
    assert 0 < min(seconds) and max(seconds) == 1.0


def test_tool_mixture_quantiles_match_workload_md():
    seconds = sample_tool_seconds(np.random.default_rng(0), WorkloadParams(), 20_000)
    assert 0.2 <= np.percentile(seconds, 50) <= 0.4  # docs/parameters.md §2: p50 0.29 s
    assert 10 <= np.percentile(seconds, 90) <= 18  # p90 14.1 s
    assert seconds.max() <= 600.0
    fixed_seconds = sample_tool_seconds(np.random.default_rng(0), WorkloadParams(fixed_tool_seconds=2.5), 4)
    assert fixed_seconds.tolist() == [2.5] * 4


def test_summary_reproduces_derived_moments(coding_sample):
    s = summary(coding_sample)
    assert 18 <= s["turns"]["mean"] <= 26  # docs/parameters.md §1: mean 21.9
    assert s["turns"]["p50"] == 15
    assert 450 <= s["output_tokens_per_turn"]["mean"] <= 540  # mean ~493
    assert 950 <= s["output_tokens_per_turn"]["p90"] <= 1200  # p90 ~1.08k
    assert 1600 <= s["appended_tokens_per_turn"]["mean"] <= 1860  # mean ~1.73k
    assert 3600 <= s["appended_tokens_per_turn"]["p90"] <= 4400  # p90 4.0k
    assert 0.2 <= s["tool_seconds"]["p50"] <= 0.4
    assert summary([])["turns"]["mean"] != summary([])["turns"]["mean"]  # NaN when empty


def test_fixed_is_exactly_what_was_asked():
    w = fixed(3, initial_prompt_tokens=100, appended_tokens=20, output_tokens=5, tool_seconds=1.5, name="f")
    assert w == Workload("f", 0, (TurnSpec(100, 5, (1.5,)), TurnSpec(20, 5, (1.5,)), TurnSpec(20, 5, ())))
    assert fixed(1).turns == (TurnSpec(8000, 300, ()),)
    assert fixed(20).total_tool_seconds == pytest.approx(19 * 0.3)
    with pytest.raises(ValueError):
        fixed(0)


def test_workload_helpers():
    w = Workload("w", 0, [TurnSpec(1000, 10, (1.0, 3.0), (HostedCall(2.0, 50),)), TurnSpec(101, 20, (0.5,)),
                          TurnSpec(7, 30, ())])
    assert w.tool_output_tokens(0) == (51, 50)
    assert w.tool_output_tokens(1) == (7,)
    assert w.tool_output_tokens(2) == ()
    assert [w.context_before(k) for k in range(4)] == [0, 1060, 1181, 1218]
    assert w.prompt_tokens(1) == 1161
    assert w.total_output_tokens == 60
    assert w.total_tool_seconds == 3.5
    with pytest.raises(IndexError):
        w.tool_output_tokens(3)


@pytest.mark.parametrize(
    "turns",
    [[], [TurnSpec(1, 1, (1.0,))], [TurnSpec(1, 1, ()), TurnSpec(1, 1, ())]],
    ids=["empty", "last-has-tools", "middle-has-none"],
)
def test_workload_rejects_bad_turns(turns):
    with pytest.raises(ValueError):
        Workload("bad", 0, turns)


def test_overrides_replace_fields():
    workloads = generate("coding", seed=9, n_tasks=3, fixed_turns=7, fixed_tool_seconds=2.0, initial_prompt_tokens=64)
    assert all(len(w.turns) == 7 and w.turns[0].appended_tokens == 64 for w in workloads)
    assert {s for w in workloads for t in w.turns for s in t.tool_seconds} == {2.0}
    explicit = attrs.evolve(PRESETS["coding"], fixed_turns=7, fixed_tool_seconds=2.0, initial_prompt_tokens=64)
    assert [w.turns for w in generate(explicit, seed=9, n_tasks=3)] == [w.turns for w in workloads]
    with pytest.raises(TypeError):
        generate(seed=0, no_such_field=1)
    with pytest.raises(ValueError, match="turns_min"):
        generate(seed=0, turns_min=5, turns_max=4)
    with pytest.raises(ValueError, match="unknown preset"):
        generate("nope", seed=0)


def test_presets_exist_and_differ(coding_sample):
    assert {"coding", "chat", "long"} <= PRESETS.keys() and DEFAULT_PRESET == "coding"
    assert PRESETS["coding"].initial_prompt_tokens == 30_000  # TraceLab-calibrated (tests/test_calibration.py)
    assert len(set(PRESETS.values())) == len(PRESETS)
    chat = generate("chat", seed=0, n_tasks=200)
    assert {len(w.turns) for w in chat} <= {1, 2, 3} and chat[0].turns[0].appended_tokens == 500
    long = generate("long", seed=0, n_tasks=200)
    assert long[0].turns[0].appended_tokens == 30_000
    assert summary(long)["turns"]["p50"] > 3 * summary(generate("coding", seed=0, n_tasks=200))["turns"]["p50"]


def test_trace_round_trip_through_a_file(tmp_path):
    workloads = generate(seed=11, n_tasks=20, parallel_calls_p=0.3, hosted_call_p=0.3) + [fixed(3, reasoning_tokens=7)]
    path = tmp_path / "trace.jsonl"
    write_trace(workloads, path)
    assert read_trace(path) == workloads
    assert read_trace(str(path)) == workloads
    first = json.loads(path.read_text().splitlines()[0])
    assert first["task"] == "coding-0"
    assert first["turn"] == 0 and first["appended_tokens"] == PRESETS["coding"].initial_prompt_tokens


_seconds = st.floats(min_value=0, max_value=1e4, allow_nan=False)
_hosted = st.builds(HostedCall, _seconds, st.integers(0, 10**6))


def _turns(final: bool):
    calls = st.just(()) if final else st.lists(_seconds, min_size=1, max_size=3)
    return st.builds(
        lambda appended, output, calls, hosted, share: TurnSpec(appended, output, calls, hosted, int(share * (output - 1))),
        st.integers(0, 10**6), st.integers(1, 10**6), calls, st.lists(_hosted, max_size=2), st.floats(0, 1),
    )


_workloads = st.builds(
    lambda name, seed, body, last, content_seed, prefix: Workload(
        name, seed, [*body, last], content_seed=content_seed, prefix=prefix,
        prefix_tokens=min(5 if prefix else 0, (body or [last])[0].appended_tokens),
    ),
    st.text(max_size=8), st.integers(0, 2**32), st.lists(_turns(False), max_size=4), _turns(True),
    st.none() | st.integers(0, 2**32), st.sampled_from(["", "coding"]),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(_workloads, max_size=4))
def test_trace_round_trip_property(workloads):
    buffer = io.StringIO()
    write_trace(workloads, buffer)
    buffer.seek(0)
    assert read_trace(buffer) == workloads


def _line(turn=0, task="t", seed=1, calls=(0.5,), **extra):
    record = {"task": task, "seed": seed, "turn": turn, "appended_tokens": 10, "output_tokens": 5,
              "tool_calls": [{"seconds": s} for s in calls]} | extra
    return json.dumps(record)


_END = _line(1, calls=())
_MALFORMED = {
    "invalid-json": ([_line(), "{not json"], 2),
    "not-an-object": (["[1, 2]"], 1),
    "missing-key": ([json.dumps({"task": "t", "seed": 1, "turn": 0, "appended_tokens": 1, "tool_calls": []})], 1),
    "unknown-key": ([_line(), _line(1, calls=(), colour="red")], 2),
    "wrong-type": ([_line(appended_tokens="10"), _END], 1),
    "bool-as-int": ([_line(output_tokens=True), _END], 1),
    "negative-tokens": ([_line(), _line(1, calls=(), appended_tokens=-1)], 2),
    "zero-output": ([_line(output_tokens=0), _END], 1),
    "negative-seconds": ([_line(calls=(-0.1,)), _END], 1),
    "call-without-seconds": ([_line(tool_calls=[{}]), _END], 1),
    "negative-hosted": ([_line(hosted_calls=[{"seconds": 1.0, "result_tokens": -5}]), _END], 1),
    "negative-seed": ([_line(seed=-1), _line(1, seed=-1, calls=())], 1),
    "non-final-without-tools": ([_line(), _line(1, calls=()), _line(2, calls=())], 2),
    "final-with-tools": ([_line(), _line(1), "", _line(0, task="u", calls=())], 2),
    "truncated-at-eof": ([_line(), _line(1)], 2),
    "turn-skipped": ([_line(), _line(2, calls=())], 2),
    "task-starts-mid-way": ([_line(), _END, _line(1, task="u", calls=())], 3),
}


@pytest.mark.parametrize("lines, bad_line", _MALFORMED.values(), ids=_MALFORMED.keys())
def test_read_trace_rejects_malformed_lines(lines, bad_line):
    with pytest.raises(ValueError, match=rf"^line {bad_line}: "):
        read_trace(io.StringIO("\n".join(lines) + "\n"))


def test_read_trace_accepts_missing_hosted_calls_and_blank_lines():
    (w,) = read_trace(io.StringIO(f"{_line()}\n\n{_END}\n"))
    assert w == Workload("t", 1, (TurnSpec(10, 5, (0.5,)), TurnSpec(10, 5, ())))


def test_context_window_ends_tasks_before_an_overlong_prompt():
    free = generate("coding", seed=0, n_tasks=60)
    capped = generate("coding", seed=0, n_tasks=60, context_window_tokens=200_000)
    assert all(w.prompt_tokens(k) <= 200_000 for w in capped for k in range(len(w.turns)))
    for w, c in zip(free, capped):
        if all(w.prompt_tokens(k) <= 200_000 for k in range(len(w.turns))):
            assert c == w  # tasks within the window are drawn exactly as without one
        else:
            assert len(c.turns) < len(w.turns) and c.turns[-1].tool_seconds == ()
            assert c.prompt_tokens(len(c.turns) - 1) + c.turns[-1].output_tokens + w.turns[len(c.turns)].appended_tokens > 200_000
    assert any(len(c.turns) < len(w.turns) for w, c in zip(free, capped))
    with pytest.raises(ValueError, match="context_window_tokens > initial_prompt_tokens"):
        WorkloadParams(context_window_tokens=1000)
