"""Where the sweep runner's runs execute (prototype/sweep.py; the Dask executor is there, beside the code version
its workers must share): `InProcess`, one after another in this process; `Processes`, a pool of local worker
processes; and what both need: the progress a run reports from within (`advance`), and whether this process's
main module is a script that worker processes would run again (`unguarded_main`)."""

from __future__ import annotations

import ast
import concurrent.futures
import contextvars
import multiprocessing
import os
import queue as queues
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# --- progress within a run ----------------------------------------------------------------------

# A worker sends what its run finished at most this often, and the runner looks for it as often: the bar's pace.
REPORT_EVERY = 0.2  # seconds
# Where `advance()` reports, while a runner that counts units runs a configuration (trio's tasks inherit it).
_reporter: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("sweep_reporter", default=None)
_worker_reports: Any = None  # in a worker process of `Processes`: the queue to the runner, when the map counts units


def advance(units: int = 1) -> None:
    """A run says it has finished `units` more of its units (compare: a task), so the progress bar moves within
    the run. Does nothing outside a `Runner.map` that counts units."""
    report = _reporter.get()
    if report is not None:
        report(units)


class _Batched:
    """A worker's reporter: units sum up and go to the runner at most every REPORT_EVERY seconds (the runner counts
    a run's unsent ones when its value arrives)."""

    def __init__(self, reports: Any, index: int) -> None:
        self.reports, self.index, self.units, self.sent = reports, index, 0, time.monotonic()

    def __call__(self, units: int) -> None:
        self.units += units
        if (now := time.monotonic()) - self.sent >= REPORT_EVERY:
            self.reports.put((self.index, self.units))
            self.units, self.sent = 0, now


def _drain(reports: Any, progress: Callable[[int, int], None]) -> None:
    while True:
        try:
            index, units = reports.get_nowait()
        except queues.Empty:
            return
        progress(index, units)


# --- scripts that worker processes would run again ----------------------------------------------


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` (either way round)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return False
    sides = [node.test.left, *node.test.comparators]
    return (any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


def unguarded_main() -> str | None:
    """The file of this process's main module when a worker process would run it again and it has no top-level
    `if __name__ == "__main__":` guard; else None. Follows multiprocessing's own choice (spawn and forkserver:
    `multiprocessing.spawn.get_preparation_data`): a module run with `python -m`, or a script, runs again in each
    worker as `__mp_main__`; a package's `__main__`, an interactive session, `python -c` and a Jupyter kernel's
    main (no file) do not."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    if not path or Path(path).stem == "ipython":  # multiprocessing leaves IPython's launch script alone too
        return None
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    return None if any(_is_main_guard(node) for node in tree.body) else str(path)


# --- executors ---------------------------------------------------------------------------------

Job = tuple[int, Any]  # (index in the grid, configuration)


class InProcess:
    """Runs one after another in this process."""

    name = "in-process"
    starts_processes = False
    workers = 1

    def map_unordered(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
                      progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[int, Any]]:
        for index, config in jobs:
            token = _reporter.set(lambda units, index=index: progress(index, units)) if progress is not None else None
            try:
                value = fn(config)
            finally:
                if token is not None:
                    _reporter.reset(token)
            yield index, value

    def close(self) -> None:
        pass


def _call(fn: Callable[[Any], Any], index: int, config: Any) -> tuple[int, Any]:
    token = _reporter.set(_Batched(_worker_reports, index)) if _worker_reports is not None else None
    try:
        return index, fn(config)
    finally:
        if token is not None:
            _reporter.reset(token)


def _start_worker(reports: Any) -> None:
    """A worker process's first act: Ctrl-C in a terminal reaches the whole process group, and the runner alone
    decides what it stops (a worker's KeyboardInterrupt would print its own traceback); keep the progress queue."""
    global _worker_reports
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_reports = reports


class Processes:
    """A pool of local worker processes (default: one per core), started per map. The "forkserver"
    start method: workers never inherit this process's threads (a notebook kernel's, tqdm's). A map that
    ends early (a failed run, Ctrl-C, a consumer that stops) terminates its workers rather than wait for
    their runs."""

    starts_processes = True

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs or os.cpu_count() or 1
        self.name = f"{self.jobs} processes"

    @property
    def workers(self) -> int:
        return self.jobs

    def map_unordered(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
                      progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[int, Any]]:
        context = multiprocessing.get_context("forkserver")
        reports = context.Queue() if progress is not None else None
        before = set(multiprocessing.active_children())
        with concurrent.futures.ProcessPoolExecutor(min(self.jobs, len(jobs)), mp_context=context,
                                                    initializer=_start_worker, initargs=(reports,)) as pool:
            finished = False
            try:
                waiting = {pool.submit(_call, fn, index, config) for index, config in jobs}  # submitted in the jobs' order
                while waiting:
                    done, waiting = concurrent.futures.wait(waiting, timeout=REPORT_EVERY if reports is not None else None,
                                                            return_when=concurrent.futures.FIRST_COMPLETED)
                    if reports is not None and progress is not None:
                        _drain(reports, progress)
                    for future in done:
                        yield future.result()
                finished = True
            finally:
                if not finished:
                    # The pool's workers are this map's new children (the fork server started them at the submissions).
                    # Not cancelling the futures first: Python 3.11's pool then fails to mark a cancelled one broken
                    # and its manager thread prints a traceback (InvalidStateError).
                    for worker in set(multiprocessing.active_children()) - before:
                        worker.terminate()
        if reports is not None:
            if progress is not None:
                _drain(reports, progress)
            reports.close()

    def close(self) -> None:
        pass

