"""The sweep runner outside its cache key, held to exact values (prototype/sweep.py): a script's function taken
from its module, the cache's folder and files, the executor each command-line choice gives, the runner built
from the command line, measured runs, the executor a single pending run takes, and the worker-process and
Dask executors (Dask's workers as threads of this process, which mutmut's runs reach)."""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import os
import pickle
import sys
import types

import pytest

from prototype import analysis, sweep
from prototype.cli import common


def test_a_function_of_a_module_is_itself():
    assert sweep.importable(analysis.format_value) is analysis.format_value


def a_script_function():
    def format_value(value):
        return value

    format_value.__module__ = "__main__"
    format_value.__qualname__ = "format_value"
    return format_value


def test_a_function_of_a_script_run_with_python_m_is_taken_from_its_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=types.SimpleNamespace(name="prototype.analysis")))
    assert sweep.importable(a_script_function()) is analysis.format_value


@pytest.mark.parametrize("spec", [None, types.SimpleNamespace(name="")])
def test_a_function_of_a_plain_script_is_refused(spec, monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=spec))
    with pytest.raises(ValueError) as refused:
        sweep.importable(a_script_function())
    assert str(refused.value) == "format_value is defined in a script: run it with `python -m` or move it to a module"
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace())
    with pytest.raises(ValueError):
        sweep.importable(a_script_function())


def test_the_cache_folder_is_the_environments_else_results_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "c"))
    assert sweep.default_cache_dir() == tmp_path / "c"
    assert sweep.Cache().root == tmp_path / "c"
    monkeypatch.setenv("TESTBED_CACHE", "")
    assert sweep.default_cache_dir() == sweep.REPO / "results" / "cache"
    monkeypatch.delenv("TESTBED_CACHE")
    assert sweep.default_cache_dir() == sweep.REPO / "results" / "cache"
    assert sweep.REPO == sweep.Path(sweep.__file__).resolve().parent.parent
    assert sweep.Cache(str(tmp_path)).root == tmp_path


def test_a_cache_entry_is_one_pickle_in_a_folder_named_by_the_keys_first_two_characters(tmp_path, monkeypatch):
    made = []
    mkstemp = sweep.tempfile.mkstemp

    def recording(**kwargs):
        fd, path = mkstemp(**kwargs)
        made.append(path)
        return fd, path

    monkeypatch.setattr(sweep.tempfile, "mkstemp", recording)
    cache = sweep.Cache(tmp_path)
    cache.put("abcdef", {"row": 1})
    path = tmp_path / "ab" / "abcdef.pickle"
    assert sorted(p.name for p in (tmp_path / "ab").iterdir()) == ["abcdef.pickle"]  # the temporary file was renamed
    [temporary] = made
    assert os.path.dirname(temporary) == str(tmp_path / "ab") and temporary.endswith(".tmp")
    data = path.read_bytes()
    assert data[:2] == b"\x80" + bytes([pickle.HIGHEST_PROTOCOL])
    assert cache.get("abcdef") == (True, {"row": 1})
    cache.put("abcdef", [2])  # overwritten in place
    assert cache.get("abcdef") == (True, [2])
    cache.put("ab0", None)
    assert cache.get("ab0") == (True, None)
    assert cache.get("zz") == (False, None)


def test_a_cache_whose_folder_does_not_exist_yet_makes_every_folder_above_the_entry(tmp_path):
    cache = sweep.Cache(tmp_path / "new" / "cache")
    cache.put("abcdef", 7)
    assert (tmp_path / "new" / "cache" / "ab" / "abcdef.pickle").is_file()
    assert cache.get("abcdef") == (True, 7)


def test_a_value_that_cannot_be_pickled_leaves_neither_a_row_nor_a_temporary_file(tmp_path):
    cache = sweep.Cache(tmp_path)
    with pytest.raises(AttributeError, match="Can't pickle local object"):
        cache.put("abcdef", lambda: None)
    assert list((tmp_path / "ab").iterdir()) == []
    assert cache.get("abcdef") == (False, None)


@pytest.mark.parametrize("cluster, jobs, in_process, kind, name", [
    (None, None, False, sweep.Processes, f"{os.cpu_count()} processes"),
    (None, 3, False, sweep.Processes, "3 processes"),
    (None, 1, False, sweep.InProcess, "in-process"),
    (None, 3, True, sweep.InProcess, "in-process"),
    ("tcp://h:8786", 1, False, sweep.InProcess, "in-process"),
    ("local", None, True, sweep.InProcess, "in-process"),
])
def test_the_executor_each_choice_gives(cluster, jobs, in_process, kind, name):
    executor = sweep.executor_for(cluster, jobs, in_process)
    assert type(executor) is kind and executor.name == name


def test_a_cluster_gives_dask_at_its_address_with_the_jobs_asked_for():
    executor = sweep.executor_for("tcp://h:8786", 4)
    assert type(executor) is sweep.Dask
    assert (executor.address, executor.jobs) == ("tcp://h:8786", 4)
    assert type(sweep.executor_for("local")) is sweep.Dask
    assert type(sweep.executor_for()) is sweep.Processes and sweep.executor_for().jobs == (os.cpu_count() or 1)


def test_processes_default_to_one_per_core(monkeypatch):
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: None)
    assert (sweep.Processes().jobs, sweep.Processes().name) == (1, "1 processes")
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 6)
    assert (sweep.Processes().jobs, sweep.Processes(2).jobs) == (6, 2)


def runner_parser():
    parser = common.Parser(prog="t")
    sweep.add_arguments(parser)
    return parser


def test_the_runner_options_their_defaults_and_help():
    parser = runner_parser()
    args = parser.parse_args([])
    assert (args.jobs, args.in_process, args.cluster, args.no_cache) == (None, False, None, False)
    [group] = [g for g in parser._action_groups if g.title == "sweep runner"]
    helps = {a.dest: a.help for a in group._group_actions}
    assert helps == {
        "jobs": "parallel runs (default: one per core; 1: in this process)",
        "in_process": "run the grid in this process, one run at a time",
        "cluster": "run on Dask: a scheduler address (tcp://host:8786) or 'local' for a LocalCluster",
        "no_cache": "compute every run, ignoring and not writing the results cache",
    }
    assert [a.metavar for a in group._group_actions if a.dest == "cluster"] == ["ADDRESS"]
    args = parser.parse_args(["--jobs", "2", "--in-process", "--cluster", "local", "--no-cache"])
    assert (args.jobs, args.in_process, args.cluster, args.no_cache) == (2, True, "local", True)
    with pytest.raises(SystemExit):
        parser.parse_args(["--jobs", "0"])


def test_the_runner_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    runner = sweep.runner_from_args(runner_parser().parse_args(["--jobs", "1"]))
    assert type(runner.executor) is sweep.InProcess and runner.cache.root == tmp_path and runner.progress is True
    runner = sweep.runner_from_args(runner_parser().parse_args(["--no-cache", "--jobs", "5"]), progress=False)
    assert type(runner.executor) is sweep.Processes and runner.executor.jobs == 5
    assert runner.cache is None and runner.progress is False
    runner = sweep.runner_from_args(argparse.Namespace(cluster="tcp://x:1", jobs=None, in_process=False, no_cache=False))
    assert type(runner.executor) is sweep.Dask
    assert type(sweep.runner_from_args(runner_parser().parse_args(["--in-process"])).executor) is sweep.InProcess


def test_a_measured_run_may_be_any_callable_even_a_scripts(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    assert sweep.measured(a_script_function(), [1.5, 2.5], progress=False) == [1.5, 2.5]


def test_measured_runs_go_one_at_a_time_in_this_process_with_progress_and_no_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    seen = []
    assert sweep.measured(lambda x: seen.append(x) or x * 2, [1, 2, 3], desc="timing") == [2, 4, 6]
    assert seen == [1, 2, 3]
    err = capsys.readouterr().err
    assert "timing: 100%" in err and "3/3" in err and "0 cached, in-process" in err
    assert sweep.measured(lambda x: x, [1], progress=False) == [1]
    assert capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


def double(x):
    return 2 * x


def test_a_single_pending_run_goes_in_this_process_whatever_the_executor(capsys, tmp_path):
    class Refusing:
        name = "refusing"

        def map_unordered(self, fn, jobs):
            raise AssertionError("the executor ran")

    runner = sweep.Runner(Refusing(), sweep.Cache(tmp_path), progress=True)
    assert runner.map(double, [21]) == [42]
    assert (runner.cached, runner.executed) == (0, 1)
    err = capsys.readouterr().err
    assert "double: 100%" in err and "0 cached, in-process" in err
    assert runner.map(double, [21, 4]) == [42, 8]  # one cached, the other still in this process
    assert (runner.cached, runner.executed) == (1, 2)
    err = capsys.readouterr().err
    # The bar starts at the cached run (1/2) and counts runs: it ends at 2/2, in runs a second.
    assert "1 cached, in-process" in err and "| 1/2 [" in err and "| 2/2 [" in err and "run/s" in err
    with pytest.raises(AssertionError, match="the executor ran"):
        runner.map(double, [1, 2])


def test_a_grid_of_a_python_m_scripts_function_runs_its_modules_function(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=types.SimpleNamespace(name="prototype.analysis")))
    runner = sweep.Runner(sweep.InProcess(), cache=None, progress=False)
    assert runner.map(a_script_function(), [1.5]) == ["1.500"]  # analysis.format_value, not the script's copy


def test_a_callable_without_a_name_and_no_description_is_shown_as_runs(capsys):
    assert sweep.measured(functools.partial(double), [1]) == [2]
    assert "runs: 100%" in capsys.readouterr().err


# --- the worker-process and Dask executors ------------------------------------------------------


def parent_pid(config):
    """A run that answers with its configuration and the process that started its worker."""
    return config, os.getppid()


def fail_on_two(config):
    if config == 2:
        raise ValueError("run 2 failed")
    return 2 * config


def test_worker_processes_come_from_the_fork_server_one_per_job_at_most(monkeypatch):
    made = []

    class Recording(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, max_workers=None, mp_context=None, **kwargs):
            made.append((max_workers, mp_context and mp_context.get_start_method()))
            super().__init__(max_workers, mp_context=mp_context, **kwargs)

    monkeypatch.setattr(sweep.concurrent.futures, "ProcessPoolExecutor", Recording)
    pairs = sorted(sweep.Processes(5).map_unordered(parent_pid, [(0, "a"), (1, "b")]))
    assert [(index, config) for index, (config, _) in pairs] == [(0, "a"), (1, "b")]
    # Started by the fork server, not forked from this process (they inherit none of its threads).
    assert all(ppid != os.getpid() for _, (_, ppid) in pairs)
    assert made == [(2, "forkserver")]  # no more workers than runs
    assert sorted(sweep.Processes(2).map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])) == [(0, 0), (1, 2), (2, 6)]
    assert made[1:] == [(2, "forkserver")]  # no more workers than asked for


def test_a_failing_run_in_a_worker_process_reaches_the_caller():
    with pytest.raises(ValueError, match="^run 2 failed$"):
        list(sweep.Processes(2).map_unordered(fail_on_two, [(0, 1), (1, 2), (2, 3)]))


def test_dask_defaults_and_closing_what_never_started():
    executor = sweep.Dask()
    assert (executor.address, executor.jobs, executor.processes, executor.name) == ("local", None, True, "dask local")
    assert (executor.cluster, executor._client) == (None, None)
    executor.close()  # a grid served from the cache started nothing, and closes nothing
    executor.close()
    assert (executor.cluster, executor._client) == (None, None)
    assert sweep.Dask("tcp://h:8786", jobs=3, processes=False).name == "dask tcp://h:8786"


def test_dask_threads_run_each_job_afresh_cancel_on_an_early_stop_and_close(monkeypatch):
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
        jobs = [(0, 1), (1, 2), (2, 3)]
        assert sorted(executor.map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])) == [(0, 0), (1, 2), (2, 6)]
        first = {future.key for future in submitted}
        assert len(first) == 3 and all(key.startswith("_call-") for key in first)
        submitted.clear()
        assert sorted(executor.map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])) == [(0, 0), (1, 2), (2, 6)]
        # pure=False: each map's runs are new tasks; the cache, not Dask's memory, decides what is computed again.
        assert not first & {future.key for future in submitted}
        with pytest.raises(ValueError, match="^run 2 failed$"):
            list(executor.map_unordered(fail_on_two, jobs))
        submitted.clear()
        runs = executor.map_unordered(fail_on_two, [(0, 0), (1, 1), (2, 3)])
        index, value = next(runs)
        assert value == 2 * [0, 1, 3][index]
        runs.close()  # the consumer stops early: every future of the map is cancelled
        assert [future.status for future in submitted] == ["cancelled"] * 3
    finally:
        executor.close()
    assert (executor.cluster, executor._client) == (None, None)
    assert client.status == "closed" and cluster.status.name == "closed"
    executor.close()
    assert (executor.cluster, executor._client) == (None, None)


def other_code():
    return "other"


def test_dask_workers_running_other_code_are_refused_and_closed(monkeypatch):
    monkeypatch.setattr(sweep, "_worker_code_version", other_code)  # what every worker answers
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
    assert client.status == "closed" and cluster.status.name == "closed"
    assert (executor.cluster, executor._client) == (None, None)
