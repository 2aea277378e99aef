"""The engine's KV memory (budget, batch limit, queue, retention, prefix cache) driven alone under the autojump
clock, exact virtual times; and the kv_memory experiment."""

from __future__ import annotations

import csv
import json
import math
from array import array
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import kv_memory
from prototype.engine import memory
from prototype.engine.admission import ContextExceedsBudget
from prototype.engine.engine import Engine
from prototype.engine.kv import BLOCK_SIZE, Prompt
from prototype.engine.memory import DISCARD_POLICY, HOLD_POLICY, SWAP_POLICY, parse_policy, ttl


def prompt(n: int, start: int = 1000) -> Prompt:
    """`n` token ids; prompts with the same `start` share their prefix (the engine finds blocks by content)."""
    return Prompt(list(range(start, start + n)))


async def call(engine: Engine, key: str, p: Prompt, *, pinned: bool = False, seconds: float = 0.0) -> float:
    """One model call that computes all of `p`, takes `seconds` and ends at a tool call (the session will be back);
    returns its queueing delay."""
    handle = await engine.begin_call(key, p, pinned=pinned)
    await trio.sleep(seconds)
    engine.retain(key, p, trio.current_time(), pinned=pinned)
    engine.end_call(handle)
    return handle.queued_s


async def release_after(engine: Engine, key: str, seconds: float) -> None:
    await trio.sleep(seconds)
    engine.release(key)


def assert_consistent(engine: Engine) -> None:
    assert engine.resident_tokens == sum(e.gpu_tokens for e in engine.kv.values())
    assert engine.host_tokens == sum(e.host_tokens for e in engine.kv.values())
    assert engine.active_calls == sum(e.active for e in engine.kv.values())


def test_derived_defaults_follow_their_arithmetic():
    assert memory.KV_BYTES_PER_TOKEN_8B == 128 * 1024
    assert memory.H100_8B_KV_BUDGET_TOKENS == int((0.9 * 80e9 - 2 * 8.03e9) // (128 * 1024)) == 426_788


async def test_a_full_budget_queues_a_new_session_until_the_holder_releases_and_refuses_a_prompt_larger_than_itself(autojump_clock):
    with pytest.raises(ContextExceedsBudget, match="^a 11-token prompt does not fit a 10-token KV budget$"):
        await Engine(kv_budget_tokens=10).begin_call("s", prompt(11))
    engine = Engine(kv_budget_tokens=100)
    await call(engine, "a", prompt(80), pinned=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_after, engine, "a", 5)
        await trio.sleep(1)
        queued = await call(engine, "b", prompt(50))
    assert queued == 4.0 and trio.current_time() == 5.0
    assert (engine.stats.queue_delays, engine.stats.peak_resident_tokens) == ([0.0, 4.0], 80)
    assert_consistent(engine)


async def test_a_pinned_ttl_holds_until_exactly_its_end_and_a_cache_is_evicted_at_once(autojump_clock):
    held = Engine(kv_budget_tokens=100, retention=ttl(10, pin=True))
    await call(held, "a", prompt(80))
    await trio.sleep(1)
    assert await call(held, "b", prompt(50)) == 9.0  # waits for the pin to expire at t = 0 + 10
    assert held.stats.expired == 1 and trio.current_time() == 10.0

    cache = Engine(kv_budget_tokens=100, retention=ttl(10))
    start = trio.current_time()
    await call(cache, "a", prompt(80))
    await trio.sleep(1)
    assert (await call(cache, "b", prompt(50, start=5000)), cache.stats.evicted, trio.current_time()) == (0.0, 1, start + 1)
    assert cache.cached_prefix("a", prompt(81), trio.current_time()) == 0


async def test_a_pinned_session_swapped_out_to_the_host_comes_back_whole(autojump_clock):
    # The copies' times and bytes are test_kv_swap's; a held (pinned) session's KV comes back exact, not in blocks.
    engine = Engine(retention=SWAP_POLICY)
    p = prompt(1000)
    await call(engine, "s", p, pinned=True)
    await trio.sleep(100)
    assert engine.cached_prefix("s", p, trio.current_time()) == 0 and engine.resident_tokens == 0  # on the host
    p.extend([5] * 10)
    handle = await engine.begin_call("s", p, pinned=True)
    assert engine.cached_prefix("s", p, trio.current_time()) == 1000 and handle.recomputed == 0  # nothing recomputed
    assert engine.resident_tokens == 1010 and engine.host_tokens == 0
    engine.end_call(handle)
    assert_consistent(engine)


async def test_after_a_final_answer_a_pin_leaves_the_kv_as_plain_cache(autojump_clock):
    pin = Engine(kv_budget_tokens=100, retention=ttl(10, pin=True))
    handle = await pin.begin_call("a", prompt(80))
    pin.retain("a", prompt(80), 0.0)
    pin.end_call(handle, paused=False)  # no tool call: the session is not expected back
    assert await call(pin, "b", prompt(50)) == 0.0 and pin.stats.evicted == 1


async def test_discard_drops_kv_at_the_end_of_each_call_and_counts_the_recompute(autojump_clock):
    engine = Engine(retention=DISCARD_POLICY)
    p = prompt(100)
    await call(engine, "s", p)
    assert engine.kv == {} and engine.stats.discarded == 1
    p.extend([5] * 50)
    handle = await engine.begin_call("s", p)
    assert (engine.cached_prefix("s", p, 0.0), handle.recomputed, engine.stats.recomputed_tokens) == (0, 100, 100)
    engine.end_call(handle)
    for key in ("b", "s"):
        await call(engine, key, prompt(100, start={"s": 1000, "b": 50_000}[key]))
    assert (engine.stats.discarded, engine.kv) == (3, {})  # every discard is counted


async def test_an_older_session_preempts_younger_held_kv_and_a_new_session_cannot(autojump_clock):
    engine = Engine(kv_budget_tokens=100)
    a, b = prompt(40), prompt(40)
    await call(engine, "a", a, pinned=True)  # older
    await call(engine, "b", b, pinned=True)
    a.extend([5] * 30)  # a resumes: 30 more tokens do not fit beside b
    assert await call(engine, "a", a, pinned=True) == 0.0
    assert engine.stats.preempted == 1 and "b" not in engine.kv and engine.resident_tokens == 70
    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_after, engine, "a", 3)
        assert await call(engine, "c", prompt(40, start=5000), pinned=True) == 3.0  # younger than a: it waits
    b.extend([5] * 5)
    handle = await engine.begin_call("b", b, pinned=True)  # b lost its KV: 40 tokens computed again
    assert handle.recomputed == 40 and engine.stats.recomputed_tokens == 40
    engine.end_call(handle)
    assert_consistent(engine)


async def test_room_is_made_from_the_least_recently_used_cache_then_the_youngest_held_kv_and_no_more(autojump_clock):
    async def cached_then(n: int, *, pinned: bool) -> tuple[list[str], int, int]:
        """a, b, c hold 30 tokens each (a used last); then d needs `n` more: what is left, and what went."""
        engine = Engine(kv_budget_tokens=100)
        for key, start in (("a", 1000), ("b", 2000), ("c", 3000)):
            await call(engine, key, prompt(30, start), pinned=pinned)
            await trio.sleep(1)
        await call(engine, "a", prompt(30, 1000), pinned=pinned)  # a, the oldest session, used again
        if pinned:  # held KV gives way only to an older session: a, resuming with n more tokens
            assert await call(engine, "a", prompt(30 + n, 1000), pinned=True) == 0.0  # admitted at once
        else:
            assert await call(engine, "d", prompt(n, 4000)) == 0.0
        assert_consistent(engine)
        return sorted(engine.kv), engine.stats.evicted, engine.stats.preempted

    # Cache: least recently used first (b, then c, then a), exactly as much as the new call needs.
    cache = [await cached_then(n, pinned=False) for n in (40, 41, 100)]
    assert cache == [(["a", "c", "d"], 1, 0), (["a", "d"], 2, 0), (["d"], 3, 0)]
    # Held KV of younger sessions: the youngest first (c, then b); 10 more tokens (100 in all) fit.
    held = [await cached_then(n, pinned=True) for n in (10, 40, 41)]
    assert held == [(["a", "b", "c"], 0, 0), (["a", "b"], 0, 1), (["a"], 0, 2)]


async def test_waiting_calls_are_served_oldest_session_first(autojump_clock):
    engine = Engine(max_batch=1)
    await call(engine, "old", prompt(10))
    order = []

    async def session(key: str, delay: float) -> None:
        await trio.sleep(delay)
        await call(engine, key, prompt(10), seconds=1.0)
        order.append((key, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(session, "first", 0.0)  # holds the one slot from t=0 to 1
        nursery.start_soon(session, "new", 0.1)
        nursery.start_soon(session, "old", 0.2)  # asks later, but its session is older
    assert order == [("first", 1.0), ("old", 2.0), ("new", 3.0)]
    assert engine.stats.queue_delays[1:] == [0.0, pytest.approx(0.8), pytest.approx(1.9)]


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_call_is_admitted(autojump_clock):
    engine = Engine(kv_budget_tokens=100, max_batch=4)
    handle = await engine.begin_call("a", prompt(90))
    with trio.move_on_after(2):
        await engine.begin_call("b", prompt(50))  # blocks the queue until cancelled
    assert (await call(engine, "c", prompt(10)), trio.current_time(), engine.waiting_calls) == (0.0, 2.0, 0)
    engine.end_call(handle)
    assert_consistent(engine)


async def test_resident_memory_is_integrated_over_time(autojump_clock):
    engine = Engine(retention=ttl(5))
    await call(engine, "a", prompt(100))
    await trio.sleep(10)
    engine.cached_prefix("a", prompt(100), trio.current_time())  # the expiry at t=5 is applied
    assert engine.stats.resident_token_seconds == 500.0 and engine.resident_tokens == 0


POLICIES = [HOLD_POLICY, ttl(3), ttl(3, pin=True), DISCARD_POLICY, SWAP_POLICY]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_session_finishes_and_the_books_balance(data):
    """Random sessions on a small engine: no deadlock, the budget holds, the counters equal the entries' sums."""
    policy = data.draw(st.sampled_from(POLICIES))
    budget = data.draw(st.integers(60, 200))
    max_batch = data.draw(st.one_of(st.none(), st.integers(1, 3)))
    sessions = data.draw(st.lists(
        st.tuples(
            st.booleans(),  # pinned (v1) or not
            st.floats(0, 5),  # start
            st.lists(st.tuples(st.integers(1, 20), st.floats(0, 2), st.floats(0, 8)), min_size=1, max_size=5),
        ),
        min_size=1, max_size=6,
    ))
    engine = Engine(kv_budget_tokens=budget, max_batch=max_batch, retention=policy, host_budget_tokens=100)

    async def session(index: int, pinned: bool, start: float, turns) -> None:
        key = f"s{index}"
        p = prompt(20)
        await trio.sleep(start)
        for appended, busy, idle in turns:
            p.extend([index] * appended)
            handle = await engine.begin_call(key, p, pinned=pinned)
            assert engine.resident_tokens <= budget + 20 * 6  # overrun only by in-flight growth
            await trio.sleep(busy)
            p.extend([index] * 10)  # the call's output
            engine.retain(key, p, trio.current_time(), pinned=pinned)
            engine.end_call(handle)
            assert_consistent(engine)
            await trio.sleep(idle)
        if pinned:
            engine.release(key)

    async def main() -> None:
        with trio.fail_after(10_000):
            async with trio.open_nursery() as nursery:
                for i, (pinned, start, turns) in enumerate(sessions):
                    if 20 + sum(a + 10 for a, _, _ in turns) <= budget:
                        nursery.start_soon(session, i, pinned, start, turns)
        await trio.sleep(100)
        engine.cached_prefix("none", prompt(1), trio.current_time())  # apply due expiries
        assert_consistent(engine)
        assert engine.active_calls == 0 and engine.waiting_calls == 0
        if policy.kind != "hold":
            assert engine.resident_tokens == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_experiment_main_runs_at_a_tiny_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import experiments.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    run = tmp_path / "kv_memory" / "latest"  # each run writes a new folder; `latest` points at it
    options = ["--agents", "3", "--configs", "suspended:hold", "chained:ttl-300", "--turns", "3", "--budget", "30000",
               "--scheduler-seeds", "0", "1"]
    rows = kv_memory.main([*options, "--jobs", "1"])
    assert [(r["design"], r["policy"], r["agents"], r["scheduler_seed"]) for r in rows] == [
        ("suspended", "hold", 3, 0), ("suspended", "hold", 3, 1), ("chained", "ttl-300s", 3, 0), ("chained", "ttl-300s", 3, 1)]
    assert all(r["completed"] == 3 and r["tasks_per_hour"] > 0 and r["e2e_p50_s"] <= r["e2e_p90_s"] for r in rows)
    assert rows[0]["recomputed_tokens"] == 0  # v1 keeps its KV resident across every pause
    assert all(r["peak_kv_tokens"] <= 30000 + 3 * 10_000 for r in rows)
    assert len(list(csv.DictReader((run / "kv_memory.csv").read_text().splitlines()))) == 4
    summary = list(csv.DictReader((run / "kv_memory_seeds.csv").read_text().splitlines()))
    assert [(r["design"], r["seeds"], r["tasks_per_hour_n"]) for r in summary] == [("suspended", "2", "2"), ("chained", "2", "2")]
    assert "not for conclusions" in capsys.readouterr().out.lower()  # two seeds, where the docs' figures rest on ten
    headline = json.loads((run / "kv_memory.json").read_text())["headline"]
    assert headline["command"] == "python -m experiments.kv_memory " + " ".join(options)
    ratio = headline["figures"]["3.suspended.hold_over_chained.ttl-300s"]
    assert (ratio["n"], ratio["of"], ratio["method"]) == (2, "seeds", "paired bootstrap")
    hold = [r["tasks_per_hour"] for r in rows[:2]]
    cache = [r["tasks_per_hour"] for r in rows[2:]]
    assert ratio["value"] == pytest.approx(sum(hold) / sum(cache))
    assert (run / "kv_memory.png").stat().st_size > 0
    assert not math.isnan(rows[1]["mean_queue_s"])
    (run / "kv_memory.png").unlink()
    assert kv_memory.main(["--replot"]) == rows  # the figure is redrawn from the CSV alone
    assert (run / "kv_memory.png").exists()


def seed_rows(design: str, policy: str, throughputs: list[float], agents: int = 100) -> list[dict]:
    """Runs as `kv_memory.run_config` writes them, one per scheduler seed, with the columns summed up over seeds."""
    return [{"design": design, "policy": policy, "agents": agents, "scheduler_seed": seed, "failed": 0,
             **{column: 0.0 for column in kv_memory.OVER_SEEDS}, "tasks_per_hour": value, "e2e_p50_s": 3600 / value}
            for seed, value in enumerate(throughputs)]


def test_each_configuration_is_its_mean_over_the_seeds_with_a_bootstrap_interval_over_them():
    spread = [246.0, 314.0, 310.0, 335.0, 250.0, 290.0, 301.0, 268.0, 322.0, 280.0]
    (row,) = kv_memory.over_seeds(seed_rows("suspended", "hold", spread))
    throughput = row["tasks_per_hour"]
    assert row["seeds"] == 10 and (throughput.n, throughput.of, throughput.method) == (10, "seeds", "bootstrap")
    assert throughput.value == pytest.approx(sum(spread) / 10) and throughput.low < throughput.value < throughput.high
    assert 246 < throughput.low and throughput.high < 335  # the mean's interval, narrower than the seeds' range
    assert (row["tasks_per_hour_min"], row["tasks_per_hour_max"]) == (246.0, 335.0)


def test_a_throughput_ratio_is_paired_over_the_scheduler_seeds():
    cache = [189.0, 252.0, 213.0, 283.0, 189.0, 240.0, 201.0, 266.0, 230.0, 195.0]  # the seed moves both designs
    hold = [1.3 * x for x in cache]  # and hold gives 1.3x the cache's throughput under every seed
    pin = [x * f for x, f in zip(cache, (0.9, 1.2, 0.95, 1.1, 0.85, 1.15, 1.0, 0.9, 1.2, 0.95))]
    rows = seed_rows("suspended", "hold", hold) + seed_rows("chained", "ttl-300s", cache) + seed_rows("chained", "pin-300s", pin)
    ratios = {(r["first"], r["second"]): r for r in kv_memory.throughput_ratios(rows)}
    held = ratios[("suspended/hold", "chained/ttl-300s")]
    # Paired, every resample of the seeds gives exactly 1.3; apart, the seeds' spread (189 to 283) would make it wide.
    assert held["ratio"].value == pytest.approx(1.3)
    assert held["ratio"].low == pytest.approx(1.3) and held["ratio"].high == pytest.approx(1.3)
    assert (held["ratio"].n, held["ratio"].of, held["ratio"].method) == (10, "seeds", "paired bootstrap")
    assert (held["per_seed_min"], held["per_seed_max"], held["ahead"]) == (pytest.approx(1.3), pytest.approx(1.3), 10)
    pinned = ratios[("chained/pin-300s", "chained/ttl-300s")]
    assert pinned["ratio"].low < 1 < pinned["ratio"].high and pinned["ahead"] == 4
    assert (pinned["per_seed_min"], pinned["per_seed_max"]) == (pytest.approx(0.85), pytest.approx(1.2))
    assert ("suspended/swap", "suspended/hold") not in ratios  # a pair is reported only where both ran


def test_the_committed_throughput_by_seed_is_what_a_fresh_run_gives():
    """docs/figures/kv_memory.json's samples behind docs/kv_memory.md: a 10-agent configuration run again gives its value."""
    data = json.loads((Path(__file__).resolve().parent.parent / "docs" / "figures" / "kv_memory.json").read_text())["data"]
    row = kv_memory.run_config(kv_memory.KvRun("chained", "ttl-300", 10, scheduler_seed=data["scheduler_seeds"][3]))
    assert row["tasks_per_hour"] == data["tasks_per_hour"]["10.chained.ttl-300s"][3]


# --- the prefix cache finds blocks by content (vLLM's hash chains) --------------------------------


async def test_with_a_budget_a_released_sessions_blocks_are_found_no_more(autojump_clock):
    # Unlimited memory keeps a finished session's blocks findable for the TTL; with a budget only held entries count.
    engine = Engine(kv_budget_tokens=1000)
    shared = list(range(1000, 1000 + 100))
    await call(engine, "a", Prompt(shared + list(range(5000, 5040))))
    b = Prompt(shared + list(range(7000, 7040)))
    assert engine.cached_prefix("b", b, trio.current_time()) == 96
    engine.release("a")
    assert engine.cached_prefix("b", b, trio.current_time()) == 0


async def test_the_directory_finds_whole_blocks_never_the_last_token_and_unlists_what_a_branch_left(autojump_clock):
    engine = Engine()
    held = prompt(100)  # 6 full blocks listed
    await call(engine, "a", held)
    for n in range(1, 101):
        assert engine.cached_prefix("b", Prompt(held.ids[:n]), 0.0) == min((n - 1) // BLOCK_SIZE, 6) * BLOCK_SIZE, n
    # Past what the holder computed, the walk stops at the first block nobody holds.
    assert engine.cached_prefix("b", Prompt(list(held.ids) + list(range(5000, 5100))), 0.0) == 96
    # A session's own KV: only what matches, never the last token's block.
    own = prompt(96, start=20_000)
    await call(engine, "s", own)
    assert engine.cached_prefix("s", own, 1.0) == 80
    assert engine.cached_prefix("s", Prompt([*own.ids[:50], *range(9000, 9046)]), 1.0) == 48
    # An entry that branches unlists the blocks it no longer holds.
    engine.retain("a", Prompt(list(held.ids[:32]) + [9] * 40), 1.0)
    assert engine.cached_prefix("b", Prompt([*held.ids[:64], 1]), 1.0) == 32


async def test_a_block_is_never_found_out_of_its_context(autojump_clock):
    # Block hashes chain (vLLM's prefix caching): a block whose tokens match in another context is never reused.
    engine = Engine()
    first, second, third = (list(range(start, start + 16)) for start in (1000, 2000, 3000))
    await call(engine, "a", Prompt(first + second + third + [1]))
    now = trio.current_time()
    assert engine.cached_prefix("b", Prompt(first + second + [7] * 20), now) == 32  # in context: found
    assert engine.cached_prefix("b", Prompt(second + third + [7] * 20), now) == 0  # a's blocks 2 and 3, shifted
    assert engine.cached_prefix("b", Prompt(second + second + [7] * 20), now) == 0
    assert engine.cached_prefix("b", Prompt(first + third + [7] * 20), now) == 16  # the first block only


async def test_a_released_sessions_blocks_serve_others_until_exactly_the_ttl_after_its_last_use(autojump_clock):
    # Late in the run, so that only the age (now - last use) decides: exactly kv_ttl after the last use.
    engine = Engine(kv_ttl=1.0)
    await trio.sleep(10.0)
    shared = list(range(1000, 1100))
    await call(engine, "a", Prompt(shared + [1] * 40))  # last used at 10.0
    engine.release("a")
    b = Prompt(shared + [2] * 40)
    assert [engine.cached_prefix("b", b, t) for t in (10.5, 10.999, 11.0)] == [96, 96, 0]


@pytest.mark.parametrize("direct", [False, True], ids=["model-call", "kept-outside-a-call"])
async def test_a_released_sessions_old_timer_does_not_expire_its_next_entry(autojump_clock, direct):
    # The first entry's idle timer (due at 300) outlives it; the next entry, last used at 1.0, lives until 301.
    engine, p = Engine(), prompt(100)

    async def use() -> None:
        await call(engine, "s", p) if not direct else engine.retain("s", p, trio.current_time())

    await use()
    engine.release("s")
    await trio.sleep(1.0)
    await use()
    assert (engine.cached_prefix("s", p, 300.5), engine.cached_prefix("s", p, 301.0)) == (96, 0)


async def test_an_isolated_session_neither_finds_nor_lends_blocks_until_released(autojump_clock):
    # An http turn routed away isolates its session's key; once released, its next session finds the blocks again.
    engine = Engine()
    shared = list(range(1000, 1100))
    await call(engine, "other", Prompt(shared + [1] * 40))
    engine.isolate("s")
    assert engine.cached_prefix("s", Prompt(shared + [2] * 40), trio.current_time()) == 0
    engine.release("s")
    assert engine.cached_prefix("s", Prompt(shared + [2] * 40), trio.current_time()) == 96
    engine.isolate("away")
    p = prompt(100, start=7000)
    await call(engine, "away", p)
    assert engine.cached_prefix("other", Prompt([*p.ids[:64], 1]), trio.current_time()) == 0


def test_each_block_hash_chains_the_previous_one_with_the_blocks_own_ids() -> None:
    ids = list(range(1000, 1000 + 16 * 7 + 5))
    prompt = Prompt(ids[:40])
    prompt.block_hashes(16)  # two blocks first, then the rest: a prompt that grew
    prompt.extend(ids[40:])
    parent, expected = 0, []
    for b in range(7):
        parent = hash((parent, array("q", ids[b * 16 : (b + 1) * 16]).tobytes()))
        expected.append(parent)
    assert prompt.block_hashes(16) == expected == Prompt(ids).block_hashes(16)
    # Asked for another block size, the hashes follow it (a cache of the other size is not reused).
    mixed = Prompt(ids[:100])
    mixed.block_hashes(16)
    assert mixed.block_hashes(32) == Prompt(ids[:100]).block_hashes(32)
    assert len(mixed.block_hashes(16)) == 6 and mixed.block_hashes(16) == Prompt(ids[:100]).block_hashes(16)


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
    st.sampled_from([list, tuple, lambda ids: array("q", ids), iter]),
)
def test_a_prompt_holds_the_same_ids_however_they_are_passed(first, more, kind):
    # Lists take a faster path (array.fromlist) than other sequences: the ids must not depend on it.
    prompt = Prompt(kind(first))
    prompt.extend(kind(more))
    assert prompt.ids == array("q", first + more) and prompt.ids.typecode == "q"
    assert prompt.block_hashes(4) == Prompt(array("q", first + more)).block_hashes(4)


@pytest.mark.parametrize("kind", [list, tuple, iter])
@pytest.mark.parametrize("bad", [[1, 2**63], [1, "2"], [1.5]])
def test_an_id_outside_64_bits_or_not_an_integer_is_refused_and_the_prompt_keeps_its_ids(bad, kind):
    prompt = Prompt([7, 8])
    with pytest.raises((OverflowError, TypeError)):
        prompt.extend(kind(bad))
    assert prompt.ids == array("q", [7, 8])


async def test_shared_blocks_stay_findable_through_the_session_that_used_them_last(autojump_clock):
    # Two sessions compute the same 96-token prefix; the one that used it last (idle TTLs) keeps it findable.
    engine = Engine(kv_ttl=100.0)
    shared = list(range(1000, 1096))
    a = Prompt(shared + list(range(5000, 5040)))
    await call(engine, "a", a)  # t=0
    await trio.sleep(10.0)
    await call(engine, "b", Prompt(shared + list(range(6000, 6040))))  # t=10: b registers the prefix too
    await trio.sleep(40.0)
    await call(engine, "a", Prompt(list(a.ids) + list(range(5040, 5056))))  # t=50: a used again
    c = Prompt(shared + list(range(7000, 7040)))
    assert [engine.cached_prefix("c", c, t) for t in (120.0, 150.0)] == [96, 0]  # b expired at 110; a lives until 150


SWEEP_BLOCKS = 1 << 16  # the directory forgets unfindable blocks once it lists more than this


async def test_a_full_directory_forgets_the_blocks_nobody_can_find_and_keeps_the_rest(autojump_clock):
    engine = Engine(kv_ttl=10.0)
    old = Prompt(list(range(1, 1 + 40_000 * 16 + 1)))  # 40,000 full blocks
    await call(engine, "old", old)
    engine.release("old")  # findable until 10 s idle
    await trio.sleep(20.0)
    big = Prompt(list(range(10_000_000, 10_000_000 + (SWEEP_BLOCKS - 40_000) * 16)))
    # (Figures are read into plain ints first: a failing assert would print the engine, a million ids.)
    await call(engine, "big", big)  # exactly the threshold: nothing is forgotten yet
    listed = len(engine.block_directory)
    assert listed == SWEEP_BLOCKS
    await call(engine, "big", Prompt([*big.ids, *range(1, 1 + 100 * 16)]))  # 100 blocks more: past it
    listed, next_sweep = len(engine.block_directory), engine.next_sweep_at
    assert listed == SWEEP_BLOCKS + 100 - 40_000  # old's expired blocks are gone, big's all kept
    assert next_sweep == SWEEP_BLOCKS  # the next sweep: at the threshold again, or when the directory has doubled
    found = engine.cached_prefix("probe", Prompt([*big.ids[: 64 * 16], 5]), trio.current_time())
    assert found == 64 * 16


async def test_a_sweep_at_time_zero_keeps_the_blocks_that_still_serve(autojump_clock):
    engine = Engine(kv_ttl=0.5)
    old = Prompt(list(range(1, 1 + 62 * 16 + 1)))
    await call(engine, "old", old)
    engine.release("old")  # used at 0, findable until 0.5
    await call(engine, "big", Prompt(list(range(10_000_000, 10_000_000 + SWEEP_BLOCKS * 16))))  # a sweep at 0
    found = engine.cached_prefix("probe", Prompt([*old.ids[:-1], 7]), 0.0)
    assert found == 62 * 16
    listed, next_sweep = len(engine.block_directory), engine.next_sweep_at
    assert (listed, next_sweep) == (SWEEP_BLOCKS + 62, 2 * (SWEEP_BLOCKS + 62))  # nothing forgotten: the next sweep at double


async def test_kv_kept_outside_a_call_is_held_under_a_pinning_ttl_as_a_paused_sessions_is(autojump_clock):
    # A direct retain (no model call) leaves the KV idle as a paused session's: the newcomer waits for the pin.
    engine = Engine(kv_budget_tokens=150, retention=parse_policy("pin-300"))
    engine.retain("a", prompt(100), 0.0)
    assert (await engine.begin_call("b", prompt(100, start=50_000))).queued_s == 300.0


async def test_kv_kept_outside_a_call_replaces_a_copy_on_the_host(autojump_clock):
    engine = Engine(retention=SWAP_POLICY)
    await call(engine, "s", prompt(100))  # paused at a tool call: copied out to the host
    await trio.sleep(60.0)
    engine.advance(trio.current_time())
    assert (engine.kv["s"].where, engine.host_tokens) == ("host", 100)
    longer = prompt(120)
    engine.retain("s", longer, trio.current_time())  # computed again on the GPU: the host copy is dropped
    entry = engine.kv["s"]
    assert (entry.where, entry.tokens, engine.host_tokens, engine.resident_tokens) == ("gpu", 120, 0, 120)


async def test_recomputation_is_counted_against_the_most_a_session_ever_computed(autojump_clock):
    engine = Engine(kv_ttl=10.0)
    long = prompt(200)
    await call(engine, "s", long)
    await call(engine, "s", prompt(100, start=50_000))  # a shorter branch of the same session
    await trio.sleep(20.0)  # its KV expires
    assert (await engine.begin_call("s", long)).recomputed == 200  # the session had computed all 200 once


async def test_under_swap_a_host_copy_expires_its_ttl_after_its_own_pause_and_each_expiry_is_counted(autojump_clock):
    engine = Engine(retention=SWAP_POLICY, kv_ttl=100.0)
    for key, start in (("a", 1000), ("b", 50_000), ("s", 90_000)):
        await call(engine, key, prompt(100, start=start))  # paused: copied to the host
    await trio.sleep(50.0)
    engine.advance(trio.current_time())
    assert [entry.where for entry in engine.kv.values()] == ["host"] * 3
    await trio.sleep(10.0)
    # s pauses again at 60: its copy lives until 160, whatever the first pause's timer.
    await call(engine, "s", prompt(100, start=90_000))
    engine.advance(130.0)
    assert (list(engine.kv), engine.kv["s"].where, engine.stats.expired, engine.host_tokens) == (["s"], "host", 2, 100)


async def test_a_server_remembers_at_most_max_sessions_forgetting_the_least_recently_seen_without_kv(autojump_clock):
    # A remembered session that comes back recomputes its 100 tokens (counted); a forgotten one is new again.
    engine = Engine(retention=DISCARD_POLICY, max_sessions=2)
    starts = {"a": 1000, "b": 20_000, "c": 40_000}
    for key in ("a", "b", "c"):  # c is the third: a, the least recently seen, is forgotten
        await call(engine, key, prompt(100, starts[key]))
    assert list(engine.remembered_sessions) == ["b", "c"] and sorted(engine.computed_tokens) == ["b", "c"]
    handle = await engine.begin_call("b", prompt(100, starts["b"]))  # remembered: seen again, no one forgotten
    assert handle.recomputed == 100
    engine.end_call(handle)
    handle = await engine.begin_call("a", prompt(100, starts["a"]))  # forgotten: c goes now
    assert handle.recomputed == 0 and list(engine.remembered_sessions) == ["b", "a"]
    engine.end_call(handle)
    assert engine.stats.recomputed_tokens == 100


async def test_sessions_that_hold_kv_are_not_forgotten_and_those_past_their_ttl_are(autojump_clock):
    engine = Engine(kv_ttl=10.0, max_sessions=2)
    for key, start in (("a", 1000), ("b", 20_000), ("c", 40_000)):
        await call(engine, key, prompt(100, start))
    assert list(engine.remembered_sessions) == ["a", "b", "c"]  # a and b still hold their KV
    await trio.sleep(10.0)  # all three expire; a fourth session forgets the two least recently seen
    await call(engine, "d", prompt(100, 60_000))
    assert list(engine.remembered_sessions) == ["c", "d"] and sorted(engine.computed_tokens) == ["c", "d"]


@pytest.mark.parametrize(("holders", "forgotten"), [(19, True), (20, False)])
async def test_forgetting_looks_at_most_sixteen_plus_four_per_excess_sessions(autojump_clock, holders, forgotten):
    # The scan for sessions to forget is bounded: it looks at the 20 least recently seen only.
    engine = Engine(max_sessions=holders + 1)
    for i in range(holders):
        await call(engine, f"s{i}", prompt(20, 1000 * (i + 1)))
    handle = await engine.begin_call("idle", prompt(20, 500_000))
    engine.end_call(handle)  # ended before its prefill: no KV
    await call(engine, "new", prompt(20, 600_000))
    assert ("idle" in engine.remembered_sessions) is not forgotten
    assert len(engine.remembered_sessions) == holders + 1 + (not forgotten)


async def test_two_calls_of_one_session_wait_in_arrival_order(autojump_clock):
    engine = Engine(max_batch=1)
    holder = await engine.begin_call("x", prompt(10, 90_000))
    admitted = []

    async def one(name: str) -> None:
        handle = await engine.begin_call("s", prompt(60))
        admitted.append((name, trio.current_time()))
        await trio.sleep(5.0)
        engine.end_call(handle)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first")
        await trio.sleep(0.5)
        nursery.start_soon(one, "second")  # the same session, so the same age: arrival decides
        await trio.sleep(0.5)
        engine.end_call(holder)
    assert admitted == [("first", 1.0), ("second", 6.0)]


async def test_a_sessions_kv_stays_in_use_until_all_its_calls_end(autojump_clock):
    engine = Engine(kv_budget_tokens=100, retention=ttl(300))
    p = prompt(60)
    first = await engine.begin_call("s", p)
    second = await engine.begin_call("s", p)  # two calls of one session in flight (lanes)
    engine.retain("s", p, 0.0)
    engine.end_call(first)
    # The second call still runs on the KV: a newcomer waits rather than evict it.
    with trio.move_on_after(1.0):
        await engine.begin_call("n", prompt(50, 50_000))
    assert ("s" in engine.kv, engine.stats.evicted, engine.waiting_calls) == (True, 0, 0)
    engine.end_call(second)
    assert await call(engine, "n", prompt(50, 50_000)) == 0.0 and engine.stats.evicted == 1


# In the way of b and then c: a call in flight (c fits beside it at once), or KV held by a pinning TTL until t = 10
# (c wakes at that expiry; a head left asleep without its timer would wait for ever).
@pytest.mark.parametrize(("in_flight", "c_tokens", "admitted"), [(True, 40, 2.0), (False, 50, 10.0)])
async def test_when_the_head_of_the_queue_leaves_the_next_call_is_admitted_at_once_or_at_its_timer(
        autojump_clock, in_flight, c_tokens, admitted):
    engine = Engine(kv_budget_tokens=100, retention=ttl(10, pin=True))
    await (engine.begin_call("a", prompt(60)) if in_flight else call(engine, "a", prompt(60)))
    got, b_scope = {}, trio.CancelScope()

    async def waiter(key: str, n: int, start: int, scope=None) -> None:
        with scope or trio.CancelScope():
            handle = await engine.begin_call(key, prompt(n, start))
            got[key] = trio.current_time()
            engine.end_call(handle)

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, "b", 50, 20_000, b_scope)
            await trio.sleep(1.0)
            nursery.start_soon(waiter, "c", c_tokens, 40_000)  # younger: behind b, though it may fit
            await trio.sleep(1.0)
            assert engine.waiting_calls == 2
            b_scope.cancel()
    assert got == {"c": admitted}


async def test_a_call_cancelled_while_its_kv_comes_back_from_the_host_frees_its_slot(autojump_clock):
    engine = Engine(retention=SWAP_POLICY, max_batch=1)
    p = prompt(100_000)
    await call(engine, "s", p)  # paused: copied out to the host
    await trio.sleep(60.0)
    engine.advance(trio.current_time())
    assert engine.kv["s"].where == "host"
    with trio.move_on_after(engine.swap_seconds(100_000) / 2) as scope:
        await engine.begin_call("s", p)
    assert scope.cancelled_caught and engine.active_calls == 0
    assert await call(engine, "t", prompt(10, 90_000)) == 0.0  # the one slot is free


async def test_ending_a_call_twice_or_a_call_never_admitted_changes_nothing(autojump_clock):
    engine = Engine(max_batch=1)
    handle = await engine.begin_call("s", prompt(100))
    engine.end_call(handle)  # ended before its prefill: no KV
    assert "s" not in engine.kv and engine.resident_tokens == 0
    handle = await engine.begin_call("s", prompt(100))
    engine.retain("s", prompt(100), 0.0)
    engine.end_call(handle)
    engine.end_call(handle)
    assert (engine.active_calls, engine.kv["s"].active) == (0, 0)
    other = await engine.begin_call("t", prompt(10, 50_000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.begin_call, "u", prompt(10, 60_000))
        await trio.sleep(1.0)
        (withdrawn,) = engine.queued_calls  # u waits for the one slot
        nursery.cancel_scope.cancel()
    engine.end_call(withdrawn)  # cancelled before admission: never admitted
    assert engine.active_calls == 1
    engine.end_call(other)
    assert engine.active_calls == 0


async def test_a_session_released_during_its_call_ends_cleanly_and_its_kv_kept_after_expires(autojump_clock):
    engine = Engine(kv_ttl=10.0)
    p = prompt(100)
    handle = await engine.begin_call("s", p)
    engine.release("s")  # the connection closed while the call ran
    engine.retain("s", p, 0.0)  # the call's prefill ends after: kept outside a call
    engine.end_call(handle)
    assert engine.active_calls == 0 and engine.kv["s"].active == 0
    await trio.sleep(10.0)
    assert engine.cached_prefix("s", p, trio.current_time()) == 0 and "s" not in engine.kv


async def test_a_released_session_that_comes_back_is_new_youngest_and_with_nothing_to_recompute(autojump_clock):
    engine = Engine(retention=DISCARD_POLICY, max_batch=1)
    await call(engine, "a", prompt(100))
    await call(engine, "b", prompt(100, 20_000))
    engine.release("a")
    holder = await engine.begin_call("x", prompt(10, 90_000))
    order = []

    async def session(key: str, start: int) -> None:
        handle = await engine.begin_call(key, prompt(100, start))
        order.append((key, handle.recomputed))
        engine.end_call(handle)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(session, "a", 1000)
        await trio.sleep(0.5)
        nursery.start_soon(session, "b", 20_000)
        await trio.sleep(0.5)
        engine.end_call(holder)
    assert order == [("b", 100), ("a", 0)]  # b is now the older session; a computed nothing it remembers


def test_a_second_use_outside_a_call_renews_the_idle_ttl():
    for now in (399.0, 400.0):
        engine, p = Engine(kv_ttl=300.0), prompt(100)
        engine.retain("s", p, 0.0)
        engine.retain("s", p, 100.0)
        engine.advance(now)  # the first use's timer, due at 300, does nothing; the second's, due at 400, expires it
        assert ("s" in engine.kv, engine.stats.expired) == (now < 400.0, int(now >= 400.0))


def test_outside_trio_a_release_and_a_call_end_happen_at_the_last_time_the_engine_saw():
    engine = Engine(kv_ttl=300.0)
    p = prompt(100)
    engine.retain("s", p, 50.0)
    engine.release("s")  # outside trio: at t = 50, so its blocks serve others until 350
    other = prompt(120)
    assert (engine.cached_prefix("o", other, 349.0), engine.cached_prefix("o", other, 350.0)) == (96, 0)
    engine = Engine(kv_ttl=300.0)
    engine.retain("s", p, 0.0)
    engine.release("s")
    assert engine.cached_prefix("o", other, 300.0) == 0
    # A call ended outside trio ends at t = 0 too: the 40 of its 100 reserved tokens it did not compute go then.
    engine = Engine(kv_ttl=300.0)
    handle = trio.run(engine.begin_call, "s", p, clock=trio.testing.MockClock())
    engine.retain("s", prompt(60), 0.0)
    engine.end_call(handle)
    engine.advance(10.0)
    assert engine.stats.resident_token_seconds == 600.0


async def test_a_call_waiting_on_held_kv_wakes_when_that_kv_is_kept_as_cache_outside_a_call(autojump_clock):
    # Held KV has no timer; kept again unpinned by a direct `retain`, it gets one: the waiter wakes at its expiry.
    engine = Engine(kv_budget_tokens=100, kv_ttl=30.0)
    await call(engine, "a", prompt(80), pinned=True)

    async def unpin_at_1() -> None:
        await trio.sleep(1.0)
        engine.retain("a", prompt(80), trio.current_time())

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(unpin_at_1)
            assert await call(engine, "b", prompt(50, 20_000)) == 31.0


async def test_cache_entries_last_used_at_the_same_instant_are_evicted_direct_ones_first_then_oldest_session_first(autojump_clock):
    async def evicted_for(n: int) -> list[str]:
        engine = Engine(kv_budget_tokens=100, retention=ttl(300))
        handle = await engine.begin_call("old", prompt(20, 1000))
        engine.end_call(handle)  # the oldest session, with no KV yet
        await call(engine, "new", prompt(20, 2000))  # a younger session; its KV is listed first
        await call(engine, "old", prompt(20, 1000))
        engine.retain("direct", prompt(20, 3000), trio.current_time())  # kept outside any call: no session age
        assert list(engine.kv) == ["new", "old", "direct"]
        await call(engine, "newcomer", prompt(n, 4000))
        return sorted({"new", "old", "direct"} - set(engine.kv))

    assert [await evicted_for(n) for n in (60, 80, 100)] == [["direct"], ["direct", "old"], ["direct", "new", "old"]]


def full_claim(engine: Engine, key: str, isolated: set[str]) -> dict:
    """The oracle: the engine's directory with every full block of the key's entry listed as held by it (an isolated
    session, one isolated and not released since, lists nothing)."""
    directory = dict(engine.block_directory)
    if (entry := engine.kv.get(key)) is not None and key not in isolated:
        hashes = entry.prompt.block_hashes(engine.block_size)[: entry.tokens // engine.block_size]
        directory.update(dict.fromkeys(hashes, entry))
    return directory


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(["grow", "grow", "branch", "release", "isolate"]), st.integers(1, 60), st.floats(0, 400)),
        max_size=30,
    ),
)
def test_claiming_only_its_new_blocks_lists_the_directory_that_claiming_all_of_them_lists(ops):
    """An entry claims only its new blocks (kv.py `_register`): the directory equals a claim of all of them."""
    engine = Engine()
    prompts = {key: prompt(20) for key in "abc"}  # a shared first block: sessions claim it from each other
    isolated = set()
    now = 0.0
    for key, action, size, wait in ops:
        now += wait
        if action == "release":
            engine.release(key)
            isolated.discard(key)
        elif action == "isolate":
            engine.isolate(key)
            isolated.add(key)
        else:
            if action == "grow":
                prompts[key].extend(range(size * 7, size * 8))
            else:  # a new prompt that shares the first `size` ids of the old one
                prompts[key] = Prompt(list(prompts[key].ids[:size]) + [size] * 30)
            engine.retain(key, prompts[key], now)
            listed = dict(engine.block_directory)
            claimed = full_claim(engine, key, isolated)
            assert {block: holder.serial for block, holder in listed.items()} == {
                block: holder.serial for block, holder in claimed.items()
            }


async def test_after_a_sweep_took_its_blocks_an_entry_claims_them_all_again(autojump_clock):
    # With a TTL of 0 the sweep after a registration takes the entry's own blocks; its next claim lists them again.
    engine = Engine(kv_ttl=0.0)
    await call(engine, "big", prompt((SWEEP_BLOCKS - 1) * 16, 10_000_000))  # the directory one block short of a sweep
    p = prompt(40)  # 2 full blocks: their registration takes the directory past the threshold, a sweep
    handle = await engine.begin_call("a", p)
    engine.retain("a", p, trio.current_time())
    assert engine.block_directory == {}
    p.extend(range(5000, 5020))  # a 3rd full block
    engine.retain("a", p, trio.current_time())
    assert list(engine.block_directory) == p.block_hashes(engine.block_size)[:3]
    engine.end_call(handle)
