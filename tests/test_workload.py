"""The workload (prototype/workload.py): the generator's shape and moments (docs/parameters.md §1-2), its exact
arithmetic at zero spread, fixed(), each refusal by the rule it breaks, and the testbed's JSONL trace."""

import io

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
    content_seed_of,
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


def refused(make, *args, error=ValueError) -> str:
    """The message of the `error` that `make(*args)` raises."""
    with pytest.raises(error) as raised:
        make(*args)
    return str(raised.value)


def test_a_seed_makes_the_same_workloads_and_task_i_does_not_depend_on_n_tasks():
    assert generate(seed=7, n_tasks=5) == generate(seed=7, n_tasks=5)
    assert generate(seed=7, n_tasks=5) != generate(seed=8, n_tasks=5)
    first = generate(seed=7, n_tasks=5)
    assert len({w.turns for w in first}) == 5  # tasks within one call differ too
    many = generate(seed=3, n_tasks=6)
    assert generate(seed=3, n_tasks=3) == many[:3] and generate_one(seed=3, index=4) == many[4]
    assert generate_one(seed=3) == many[0] and [w.name for w in many[:2]] == ["coding-0", "coding-1"]
    assert all(w.seed == 3 for w in many)


def test_tool_calls_on_every_turn_but_the_last_in_parallel_and_searched_as_probable():
    for w in generate(seed=0, n_tasks=200, parallel_calls_p=0.5, hosted_call_p=0.5):
        assert (w.turns[-1].tool_seconds, w.turns[-1].hosted_calls) == ((), ())
        assert all(1 <= len(t.tool_seconds) <= 4 for t in w.turns[:-1])
        assert w.turns[0].appended_tokens == PRESETS["coding"].initial_prompt_tokens
    w = generate_one(seed=2, fixed_turns=6, parallel_calls_p=1.0, hosted_call_p=1.0, hosted_result_tokens=99,
                     parallel_call_weights=(1.0,))
    assert [len(t.tool_seconds) for t in w.turns] == [2, 2, 2, 2, 2, 0]
    assert [t.hosted_calls for t in w.turns] == [(HostedCall(1.0, 99),)] * 5 + [()]
    three = generate_one(seed=2, fixed_turns=6, parallel_calls_p=1.0, parallel_call_weights=(0.0, 1.0))
    assert [len(t.tool_seconds) for t in three.turns] == [3, 3, 3, 3, 3, 0]


def test_default_rates_and_moments_follow_their_sources(coding_sample):
    """docs/parameters.md §1: cc-multi's 35.8% parallel turns (21.3/9.4/5.2% two/three/four calls) and 4.8% of
    tool turns with a web search; reasoning 11-45% of each turn's output."""
    tool_turns = [t for w in coding_sample for t in w.turns if t.tool_seconds]
    counts = np.bincount([len(t.tool_seconds) for t in tool_turns], minlength=5) / len(tool_turns)
    assert counts[1] == pytest.approx(0.642, abs=0.01) and counts[2:5] == pytest.approx([0.213, 0.094, 0.052], abs=0.01)
    assert np.mean([bool(t.hosted_calls) for t in tool_turns]) == pytest.approx(0.048, abs=0.005)
    shares = [t.reasoning_tokens / t.output_tokens for w in coding_sample for t in w.turns if t.output_tokens >= 100]
    assert 0.10 <= min(shares) and max(shares) <= 0.46 and np.mean(shares) == pytest.approx(0.28, abs=0.01)
    s = summary(coding_sample)
    assert 18 <= s["turns"]["mean"] <= 26  # docs/parameters.md §1: mean 21.9
    assert s["turns"]["p50"] == 15 and 450 <= s["output_tokens_per_turn"]["mean"] <= 540  # mean ~493
    assert 950 <= s["output_tokens_per_turn"]["p90"] <= 1200  # p90 ~1.08k
    assert 1600 <= s["appended_tokens_per_turn"]["mean"] <= 1860  # mean ~1.73k
    assert 3600 <= s["appended_tokens_per_turn"]["p90"] <= 4400  # p90 4.0k
    assert 0.2 <= s["tool_seconds"]["p50"] <= 0.4


def test_tasks_draw_their_own_content_and_parallel_calls_shift_no_token_draw():
    tasks = generate(seed=0, n_tasks=50)
    assert len({w.content_seed for w in tasks}) == 50  # no two tasks share content
    assert {(w.prefix, w.prefix_tokens) for w in tasks} == {("coding", 7400)}
    assert generate(seed=1, n_tasks=1)[0].content_seed != tasks[0].content_seed
    chat = generate_one("chat", seed=0)
    assert (chat.prefix, chat.prefix_tokens) == ("chat", 300)
    assert generate_one(seed=0, initial_prompt_tokens=64).prefix_tokens == 64  # clipped to the prompt
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
    assert (min(turns), max(turns)) == (10, 12) and (min(appended), max(appended)) == (700, 900)
    assert (min(outputs), max(outputs)) == (250, 350) and 0 < min(seconds) and max(seconds) == 1.0


def test_tool_times_come_from_the_normalised_mixture_and_are_capped():
    seconds = sample_tool_seconds(np.random.default_rng(0), WorkloadParams(), 20_000)
    assert 0.2 <= np.percentile(seconds, 50) <= 0.4  # docs/parameters.md §2: p50 0.29 s
    assert 10 <= np.percentile(seconds, 90) <= 18  # p90 14.1 s
    assert seconds.max() <= 600.0
    assert sample_tool_seconds(np.random.default_rng(0), WorkloadParams(fixed_tool_seconds=2.5), 4).tolist() == [2.5] * 4
    params = WorkloadParams(tool_mixture=((3.0, 1.0, 0.0), (1.0, 50.0, 0.0)), tool_cap_seconds=10.0)
    seconds = sample_tool_seconds(np.random.default_rng(0), params, 4000)
    assert set(seconds.tolist()) == {1.0, 10.0} and np.mean(seconds == 1.0) == pytest.approx(0.75, abs=0.03)
    assert sample_tool_seconds(np.random.default_rng(0), attrs.evolve(params, fixed_tool_seconds=0), 3).tolist() == [0.0] * 3


def test_a_workloads_counts_by_turn_and_a_turn_out_of_range_named():
    w = Workload("w", 0, [TurnSpec(1000, 10, (1.0, 3.0), (HostedCall(2.0, 50),)), TurnSpec(101, 20, (0.5,)),
                          TurnSpec(7, 30, ())])
    assert [w.tool_output_tokens(k) for k in range(3)] == [(51, 50), (7,), ()]
    assert [w.context_before(k) for k in range(4)] == [0, 1060, 1181, 1218]
    assert (w.prompt_tokens(1), w.total_output_tokens, w.total_tool_seconds) == (1161, 60, 3.5)
    with pytest.raises(IndexError):
        w.tool_output_tokens(3)
    w = Workload("w", 0, [TurnSpec(1000, 10, (1.0, 3.0, 2.0)), TurnSpec(101, 20, (0.5,)), TurnSpec(7, 30, ())])
    assert w.tool_output_tokens(0) == (35, 33, 33)  # the remainder on the first call
    for count, turn in ((w.tool_output_tokens, -1), (w.tool_output_tokens, 3), (w.context_before, -1), (w.context_before, 4)):
        assert refused(count, turn, error=IndexError) == f"turn {turn} out of range for 3 turns"
    assert w.context_before(3) == 1000 + 10 + 101 + 20 + 7 + 30
    assert Workload("w", 0, [TurnSpec(1, 1, ())]).total_tool_seconds == 0.0
    assert isinstance(fixed(2, tool_seconds=1).total_tool_seconds, float)


def test_overrides_replace_fields_and_fixed_is_exactly_what_was_asked():
    workloads = generate("coding", seed=9, n_tasks=3, fixed_turns=7, fixed_tool_seconds=2.0, initial_prompt_tokens=64)
    assert all(len(w.turns) == 7 and w.turns[0].appended_tokens == 64 for w in workloads)
    assert {s for w in workloads for t in w.turns for s in t.tool_seconds} == {2.0}
    explicit = attrs.evolve(PRESETS["coding"], fixed_turns=7, fixed_tool_seconds=2.0, initial_prompt_tokens=64)
    assert [w.turns for w in generate(explicit, seed=9, n_tasks=3)] == [w.turns for w in workloads]
    with pytest.raises(TypeError):
        generate(seed=0, no_such_field=1)
    with pytest.raises(ValueError, match="turns_min"):
        generate(seed=0, turns_min=5, turns_max=4)
    w = fixed(3, initial_prompt_tokens=100, appended_tokens=20, output_tokens=5, tool_seconds=1.5, name="f")
    assert w == Workload("f", 0, (TurnSpec(100, 5, (1.5,)), TurnSpec(20, 5, (1.5,)), TurnSpec(20, 5, ())))
    assert fixed(1).turns == (TurnSpec(8000, 300, ()),) and fixed(20).total_tool_seconds == pytest.approx(19 * 0.3)
    # The documented defaults: 8000 tokens, then 800 appended a turn, 300 output tokens, 0.3 s a tool call.
    assert fixed(2) == Workload("fixed", 0, (TurnSpec(8000, 300, (0.3,)), TurnSpec(800, 300, ())))
    assert fixed(2, reasoning_tokens=5, content_seed=9) == Workload(
        "fixed", 0, (TurnSpec(8000, 300, (0.3,), (), 5), TurnSpec(800, 300, (), (), 5)), content_seed=9)
    assert refused(lambda: fixed(0)) == "n_turns must be >= 1, got 0"


def test_presets_exist_differ_and_an_unknown_one_lists_them(coding_sample):
    assert {"coding", "chat", "long"} <= PRESETS.keys() and DEFAULT_PRESET == "coding"
    assert PRESETS["coding"].initial_prompt_tokens == 30_000  # TraceLab-calibrated (tests/test_calibration.py)
    assert len(set(PRESETS.values())) == len(PRESETS)
    chat = generate("chat", seed=0, n_tasks=200)
    assert {len(w.turns) for w in chat} <= {1, 2, 3} and chat[0].turns[0].appended_tokens == 500
    long = generate("long", seed=0, n_tasks=200)
    assert long[0].turns[0].appended_tokens == 30_000
    assert summary(long)["turns"]["p50"] > 3 * summary(generate("coding", seed=0, n_tasks=200))["turns"]["p50"]
    assert refused(lambda: generate("nope", seed=0)) == "unknown preset 'nope'; choose one of ['chat', 'coding', 'compact', 'long']"
    assert refused(lambda: generate_one("nope", seed=0)) == "unknown preset 'nope'; choose one of ['chat', 'coding', 'compact', 'long']"
    assert [(w.name, w.prefix) for w in generate("chat", seed=0, n_tasks=2)] == [("chat-0", "chat"), ("chat-1", "chat")]
    assert generate_one("chat", seed=0, index=1).name == "chat-1" and generate_one(PRESETS["chat"], seed=0).name == "custom-0"
    assert generate(seed=0, n_tasks=0) == []
    assert PRESETS["compact"] == WorkloadParams() and PRESETS["long"] == attrs.evolve(PRESETS["coding"], turns_median=60, turns_sigma=0.5)


_seconds = st.floats(min_value=0, max_value=1e4, allow_nan=False)
_hosted = st.builds(HostedCall, _seconds, st.integers(0, 10**6))


def _turns(final: bool):
    calls = st.just(()) if final else st.lists(_seconds, min_size=1, max_size=3)
    return st.builds(
        lambda appended, output, calls, hosted, share: TurnSpec(appended, output, calls, hosted, int(share * (output - 1))),
        st.integers(0, 10**6), st.integers(1, 10**6), calls, st.lists(_hosted, max_size=2), st.floats(0, 1))


_workloads = st.builds(
    lambda name, seed, body, last, content_seed, prefix: Workload(
        name, seed, [*body, last], content_seed=content_seed, prefix=prefix,
        prefix_tokens=min(5 if prefix else 0, (body or [last])[0].appended_tokens)),
    st.text(max_size=8), st.integers(0, 2**32), st.lists(_turns(False), max_size=4), _turns(True),
    st.none() | st.integers(0, 2**32), st.sampled_from(["", "coding"]))


@settings(max_examples=50, deadline=None)
@given(st.lists(_workloads, max_size=4))
def test_trace_round_trip_property(workloads):
    buffer = io.StringIO()
    write_trace(workloads, buffer)
    buffer.seek(0)
    assert read_trace(buffer) == workloads


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


def test_a_turn_a_hosted_call_and_a_workload_name_the_value_they_refuse():
    assert refused(lambda: HostedCall(-1.0, 5)) == "seconds must be finite and >= 0, got -1.0"
    assert refused(lambda: HostedCall(float("inf"), 5)) == "seconds must be finite and >= 0, got inf"
    assert refused(lambda: HostedCall(1.0, -1)) == "result_tokens must be >= 0, got -1"
    assert HostedCall("2", 0) == HostedCall(2.0, 0) and isinstance(HostedCall(2, 0).seconds, float)
    assert refused(lambda: TurnSpec(-1, 1, ())) == "appended_tokens must be >= 0, got -1"
    assert refused(lambda: TurnSpec(0, 0, ())) == "output_tokens must be >= 1, got 0"
    assert refused(lambda: TurnSpec(0, 1, (0.5, -0.1))) == "tool_seconds must be finite and >= 0, got -0.1"
    assert refused(lambda: TurnSpec(0, 1, (float("nan"),))) == "tool_seconds must be finite and >= 0, got nan"
    assert refused(lambda: TurnSpec(0, 5, (), (), -1)) == "reasoning_tokens must be >= 0, got -1"
    assert refused(lambda: TurnSpec(0, 5, (), (), 5)) == "reasoning_tokens (5) must be less than output_tokens (5)"
    turn = TurnSpec(0, 5, [1, 0], [HostedCall(0, 0)], 4)
    assert (turn.tool_seconds, turn.hosted_calls, turn.text_tokens) == ((1.0, 0.0), (HostedCall(0.0, 0),), 1)
    assert all(isinstance(s, float) for s in turn.tool_seconds)
    assert (TurnSpec(0, 1, ()).hosted_calls, TurnSpec(0, 1, ()).reasoning_tokens) == ((), 0)
    last = TurnSpec(100, 1, ())
    assert refused(lambda: Workload("w", -1, [last])) == "seed must be >= 0, got -1"
    assert refused(lambda: Workload("w", 0, [last], arrival_s=-1.0)) == "arrival_s must be finite and >= 0, got -1.0"
    assert refused(lambda: Workload("w", 0, [last], arrival_s=float("inf"))) == "arrival_s must be finite and >= 0, got inf"
    assert refused(lambda: Workload("w", 0, [])) == "a workload needs at least one turn"
    assert refused(lambda: Workload("w", 0, [TurnSpec(1, 1, (1.0,)), TurnSpec(1, 1, (1.0,))])) == (
        "the last turn (1) must not end with tool calls")
    assert refused(lambda: Workload("w", 0, [TurnSpec(1, 1, (1.0,)), TurnSpec(1, 1, ()), last])) == (
        "turn 1 has no tool calls but is not the last turn")
    assert refused(lambda: Workload("w", 0, [last], prefix_tokens=101)) == "prefix_tokens (101) exceeds turn 0's 100 tokens"
    assert refused(lambda: Workload("w", 0, [last], prefix_tokens=-1)) == "prefix_tokens must be >= 0, got -1"
    edge = Workload("w", 0, [last], arrival_s=0.0, prefix_tokens=100)
    assert (edge.turns, edge.arrival_s, edge.content_seed, edge.prefix, edge.prefix_tokens) == ((last,), 0.0, None, "", 100)
    assert Workload("w", 0, [last]).prefix_tokens == 0 and Workload("w", 0, [last]).arrival_s is None
    assert [Workload("w", 7, [last], content_seed=c).text_seed for c in (None, 0, 9)] == [7, 0, 9]


BROKEN_RULES = {  # each rule of WorkloadParams, and values that break it
    "1 <= turns_min <= turns_max": [{"turns_min": 0}, {"turns_min": 5, "turns_max": 4}],
    "fixed_turns >= 1": [{"fixed_turns": 0}],
    "0 <= appended_min <= appended_max": [{"appended_min": -1}, {"appended_min": 11, "appended_max": 10}],
    "1 <= output_min <= output_max": [{"output_min": 0}, {"output_min": 11, "output_max": 10}],
    "positive medians": [{"turns_median": 0}, {"appended_median": -1}, {"output_median": 0}],
    "initial_prompt_tokens >= 0": [{"initial_prompt_tokens": -1, "shared_prefix_tokens": 0}],
    "tool_mixture of (weight >= 0, median > 0, sigma >= 0) with positive total weight": [{"tool_mixture": m} for m in (
        (), ((1.0, 1.0),), ((-0.5, 1.0, 1.0), (1.0, 1.0, 1.0)), ((1.0, 0.0, 1.0),), ((1.0, 1.0, -0.1),), ((0.0, 1.0, 1.0),))],
    "fixed_tool_seconds >= 0": [{"fixed_tool_seconds": -0.5}],
    "probabilities in [0, 1]": [{"parallel_calls_p": -0.1}, {"parallel_calls_p": 1.1}, {"hosted_call_p": -0.1}, {"hosted_call_p": 1.1}],
    "shared_prefix_tokens >= 0": [{"shared_prefix_tokens": -1}],
    "parallel_call_weights >= 0 with a positive total": [{"parallel_call_weights": w} for w in ((), (-1.0, 2.0), (0.0, 0.0))],
    "reasoning_share (low, high) within [0, 1)": [{"reasoning_share": r} for r in ((0.1,), (-0.1, 0.5), (0.6, 0.5), (0.5, 1.0))],
    "hosted_seconds, hosted_result_tokens >= 0": [{"hosted_seconds": -1.0}, {"hosted_result_tokens": -1}],
    "context_window_tokens > initial_prompt_tokens": [{"context_window_tokens": 8000}]}


@pytest.mark.parametrize(("fields", "rule"), [(fields, rule) for rule, cases in BROKEN_RULES.items() for fields in cases])
def test_workload_params_name_the_rule_a_value_breaks(fields, rule):
    assert refused(lambda: WorkloadParams(**fields)) == f"invalid WorkloadParams: {rule}"


def test_workload_params_accept_every_rules_edges_and_name_each_rule_broken():
    WorkloadParams(
        turns_min=1, turns_max=1, fixed_turns=1, appended_min=0, appended_max=0, output_min=1, output_max=1,
        initial_prompt_tokens=0, shared_prefix_tokens=0, tool_mixture=((0.0, 1.0, 0.0), (1.0, 1e-9, 0.0)),
        fixed_tool_seconds=0.0, parallel_calls_p=0.0, hosted_call_p=1.0, parallel_call_weights=(0.0, 1.0),
        reasoning_share=(0.0, 0.0), hosted_seconds=0.0, hosted_result_tokens=0, context_window_tokens=1)
    WorkloadParams(parallel_calls_p=1.0, hosted_call_p=0.0, reasoning_share=(0.5, 0.5))
    assert refused(lambda: WorkloadParams(turns_min=0, hosted_seconds=-1.0)) == (
        "invalid WorkloadParams: 1 <= turns_min <= turns_max; hosted_seconds, hosted_result_tokens >= 0")
    params = WorkloadParams(tool_mixture=[[1, 2, 3]], parallel_call_weights=[1], reasoning_share=[0, 0.5])
    assert (params.tool_mixture, params.parallel_call_weights, params.reasoning_share) == (((1.0, 2.0, 3.0),), (1.0,), (0.0, 0.5))
    assert all(isinstance(v, float) for v in params.tool_mixture[0] + params.parallel_call_weights + params.reasoning_share)


# Every draw of zero spread: the generator's arithmetic, exactly.
EXACT = WorkloadParams(
    turns_median=4, turns_sigma=0.0, initial_prompt_tokens=1000, shared_prefix_tokens=600, appended_median=123,
    appended_sigma=0.0, output_median=57, output_sigma=0.0, tool_mixture=((1.0, 2.5, 0.0),), reasoning_share=(0.25, 0.25),
    parallel_calls_p=0.0, hosted_call_p=0.0)


def test_a_task_of_zero_spread_is_the_medians_exactly():
    # 0.25 of 57 output tokens is 14.25: 14 of them reasoning.
    turns = [TurnSpec(1000, 57, (2.5,), (), 14)] + [TurnSpec(123, 57, (2.5,), (), 14)] * 2 + [TurnSpec(123, 57, (), (), 14)]
    assert generate(EXACT, seed=3, n_tasks=2) == [
        Workload(f"custom-{i}", 3, turns, content_seed=content_seed_of(3, i), prefix="custom", prefix_tokens=600) for i in (0, 1)]
    assert generate_one(EXACT, seed=3, index=1) == generate(EXACT, seed=3, n_tasks=2)[1]
    assert len(generate_one(EXACT, seed=3, fixed_turns=7).turns) == 7
    assert len(generate_one(EXACT, seed=3, turns_median=40, turns_max=9).turns) == 9  # clipped to the bounds
    assert len(generate_one(EXACT, seed=3, turns_median=0.4).turns) == 1
    assert [t.appended_tokens for t in generate_one(EXACT, seed=3, appended_min=200).turns] == [1000, 200, 200, 200]
    assert [t.output_tokens for t in generate_one(EXACT, seed=3, output_max=50).turns] == [50] * 4
    # The reasoning never takes the whole output: 0.9 of 1 token rounds to 1, and 1 token is left as text.
    assert {t.reasoning_tokens for t in generate_one(EXACT, seed=3, output_median=1, reasoning_share=(0.9, 0.9)).turns} == {0}
    assert {t.reasoning_tokens for t in generate_one(EXACT, seed=3, output_median=2, reasoning_share=(0.9, 0.9)).turns} == {1}


@pytest.mark.parametrize(("window", "n_turns"), [(1001, 1), (1679, 1), (1680, 2), (2359, 2), (2360, 3), (3039, 3), (3040, 4), (10**6, 4)])
def test_a_task_ends_before_the_first_prompt_past_the_context_window(window, n_turns):
    """Prompts of 1000, 1000 + 123 + 57 + 500 = 1680, 2360 and 3040 tokens (each turn searches, 500 tokens of results)."""
    params = attrs.evolve(EXACT, hosted_call_p=1.0, hosted_result_tokens=500, hosted_seconds=0.5, context_window_tokens=window)
    w, searched = generate_one(params, seed=0), (HostedCall(0.5, 500),)
    assert w.turns == tuple(
        TurnSpec(1000 if k == 0 else 123, 57, (2.5,) if k < n_turns - 1 else (), searched if k < n_turns - 1 else (), 14)
        for k in range(n_turns))
    assert [w.prompt_tokens(k) for k in range(n_turns)] == [1000, 1680, 2360, 3040][:n_turns]


def test_each_tool_call_has_its_own_draw_and_parallel_turns_the_weighted_number():
    w = generate_one(EXACT, seed=2, fixed_turns=12, parallel_calls_p=0.5, tool_mixture=((1.0, 2.5, 1.0),))
    seconds = [s for t in w.turns for s in t.tool_seconds]
    assert len(seconds) > 11 and len(set(seconds)) == len(seconds)  # a continuous draw repeats no value
    assert len(generate(EXACT, seed=2)) == 1  # one task unless asked for more
    four = generate_one(EXACT, seed=1, parallel_calls_p=1.0, parallel_call_weights=(0.0, 0.0, 5.0))
    assert [t.tool_seconds for t in four.turns] == [(2.5,) * 4] * 3 + [()]
    mixed = generate(EXACT, seed=1, n_tasks=300, parallel_calls_p=1.0, parallel_call_weights=(3.0, 1.0))
    calls = np.bincount([len(t.tool_seconds) for w in mixed for t in w.turns[:-1]], minlength=4)
    assert calls[:2].tolist() == [0, 0] and calls[2] / calls.sum() == pytest.approx(0.75, abs=0.04)


def test_summary_gives_mean_p50_and_p90_of_each_measure():
    tasks = [
        Workload("a", 0, [TurnSpec(100, 10, (1.0, 3.0), (HostedCall(1.0, 5),), 5), TurnSpec(20, 30, (2.0,), (), 3), TurnSpec(40, 20, ())]),
        Workload("b", 0, [TurnSpec(100, 40, ())])]
    assert summary(tasks) == {
        "turns": {"mean": 2.0, "p50": 2.0, "p90": pytest.approx(2.8)},
        "output_tokens_per_turn": {"mean": 25.0, "p50": 25.0, "p90": pytest.approx(37.0)},
        "appended_tokens_per_turn": {"mean": 30.0, "p50": 30.0, "p90": pytest.approx(38.0)},
        "tool_seconds": {"mean": 2.0, "p50": 2.0, "p90": pytest.approx(2.8)},
        "calls_per_tool_turn": {"mean": 1.5, "p50": 1.5, "p90": pytest.approx(1.9)},
        "hosted_calls_per_tool_turn": {"mean": 0.5, "p50": 0.5, "p90": pytest.approx(0.9)},
        "reasoning_share": {"mean": pytest.approx((0.5 + 0.1) / 4), "p50": 0.05, "p90": pytest.approx(0.38)}}
    empty = summary([])
    assert list(empty) == list(summary(tasks)) and all(np.isnan(v) for s in empty.values() for v in s.values())
    assert all(list(s) == ["mean", "p50", "p90"] for s in empty.values())
