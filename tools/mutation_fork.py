"""Check mutmut's mutants in forks of one warm pytest process (docs/mutation.md, "A faster check").

mutmut starts pytest afresh for every mutant, which on this suite costs seconds of imports and collection
before the first test runs. This tool, run from the folder mutmut writes its mutated copy to (`mutants/`),
collects the suite once and forks that process for each mutant:

    python ../tools/mutation_fork.py trace OUT.json [pytest arguments]
        runs the tests once, unmutated, and records which mutated functions each test reaches (mutmut's
        trampolines in their "stats" mode), how long it took and whether it passed;
    python ../tools/mutation_fork.py check TRACE.json MUTANTS VERDICTS [--jobs 2] [--cap 20] [--exclude FILE]
                                       [--near-only] [pytest arguments]
        for each mutant in MUTANTS (a file naming one a line, or a glob over mutmut's names such as
        "prototype.engine.kv.*"), forks, turns the mutant on and runs the passing tests
        that reach its function until one fails: first the tests that killed other mutants of that function,
        then the tests of the files that killed the module's mutants or are named after it, then the rest,
        fastest first. Appends `name verdict seconds` to VERDICTS (and `name test` to VERDICTS.killers):
        `killed`; `alive` (every reaching test passed); `timeout` (one test ran past 30 s plus 10 times its
        clean time: a hang); `capped` (not decided within --cap seconds: check it with --near-only and no cap);
        `notests` (no passing test reaches it).

A test that reaches a function only in a child process (the command-line tests) is not in the trace: check
the mutants that survive against the module's own test files as well.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import signal
import sys
import time

import pytest


class Trace:
    """Records, per test, the mutated functions it reaches, its duration and whether it passed."""

    def __init__(self) -> None:
        self.hits: dict[str, list[str]] = {}
        self.duration: dict[str, float] = {}
        self.failed: set[str] = set()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        from mutmut.state import state

        state()._stats.clear()
        start = time.perf_counter()
        yield
        self.duration[item.nodeid] = time.perf_counter() - start
        for function in state()._stats:
            self.hits.setdefault(function, []).append(item.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed or (report.when == "call" and report.skipped):
            self.failed.add(report.nodeid)


def mutant_names(selection: str) -> list[str]:
    """The mutants a file names (one a line), or those of mutmut's `.meta` files that match a glob."""
    if os.path.isfile(selection):
        return [line.split()[0] for line in open(selection) if line.strip()]
    names = []
    for meta in sorted(glob.glob("prototype/**/*.py.meta", recursive=True)):
        names += [name for name in json.load(open(meta))["exit_code_by_key"] if fnmatch.fnmatchcase(name, selection)]
    return names


def function_of(mutant: str) -> str:
    return mutant.rsplit("__mutmut_", 1)[0]


class Check:
    """Replaces pytest's test loop: one fork per mutant, running only the tests that reach it."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        trace = json.load(open(options.trace))
        self.hits, self.duration, self.failed = trace["hits"], trace["duration"], set(trace["failed"])
        self.excluded = [line.strip() for line in open(options.exclude) if line.strip()] if options.exclude else []
        self.killers_path = options.verdicts + ".killers"
        self.killers: dict[str, list[str]] = {}
        self.killers_read = 0
        self.running: dict[int, tuple[str, float]] = {}
        self.child_failed = False

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.child_failed = True

    def learn_killers(self) -> None:
        if not os.path.exists(self.killers_path):
            return
        lines = open(self.killers_path).read().splitlines()
        for line in lines[self.killers_read:]:
            mutant, test = line.split(" ", 1)
            known = self.killers.setdefault(function_of(mutant), [])
            if test in known:
                known.remove(test)
            known.insert(0, test)
        self.killers_read = len(lines)

    def order(self, mutant: str, tests: list[str]) -> list[str]:
        function = function_of(mutant)
        module = function.rsplit(".", 1)[0]
        near_files = {test.split("::")[0] for f, known in self.killers.items() if f.rsplit(".", 1)[0] == module for test in known}
        stem = module.rsplit(".", 1)[-1]

        def rank(test: str) -> tuple[int, float]:
            path = test.split("::")[0]
            return (0 if path in near_files or stem in path else 1, self.duration.get(test, 1.0))

        tests = sorted(tests, key=rank)
        if self.options.near_only:
            tests = [test for test in tests if rank(test)[0] == 0]
        known = [test for test in self.killers.get(function, ()) if test in tests]
        return known + [test for test in tests if test not in known]

    def run_in_child(self, mutant: str, tests: list[str], items: dict) -> None:
        from mutmut.mutation.trampoline import set_mutant_under_test

        os.setpgid(0, 0)  # the parent kills the whole group: servers and workers a test started go with it
        set_mutant_under_test(mutant)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            for i, test in enumerate(tests):
                following = items[tests[i + 1]] if i + 1 < len(tests) else None
                signal.alarm(int(30 + 10 * self.duration.get(test, 1.0)))
                items[test].ihook.pytest_runtest_protocol(item=items[test], nextitem=following)
                if self.child_failed:
                    with open(self.killers_path, "a") as killers:
                        killers.write(f"{mutant} {test}\n")
                    os._exit(1)
        except BaseException:
            os._exit(1)
        os._exit(0)

    def finish(self, out, pid: int, status: int, verdict: str | None = None) -> None:
        mutant, started = self.running.pop(pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if verdict is None:
            if os.WIFSIGNALED(status):
                verdict = "timeout" if os.WTERMSIG(status) == signal.SIGALRM else f"signal{os.WTERMSIG(status)}"
            else:
                verdict = {0: "alive", 1: "killed"}.get(os.WEXITSTATUS(status), f"exit{os.WEXITSTATUS(status)}")
        out.write(f"{mutant} {verdict} {time.time() - started:.1f}\n")
        out.flush()

    def reap_one(self, out) -> None:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                return self.finish(out, pid, status)
            for pid, (_, started) in list(self.running.items()):
                if time.time() - started > self.options.cap:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return self.finish(out, pid, 0, "capped")
            time.sleep(0.05)

    def pytest_runtestloop(self, session) -> bool:
        items = {item.nodeid: item for item in session.items}
        # pytest's temporary folder, made once here: each fork would otherwise make its own and clean up the
        # older ones, a cost that grows with every mutant.
        session.config._tmp_path_factory.getbasetemp()
        mutants = mutant_names(self.options.mutants)
        with open(self.options.verdicts, "a") as out:
            for mutant in mutants:
                tests = [test for test in self.hits.get(function_of(mutant), ())
                         if test not in self.failed and test in items and not test.startswith(tuple(self.excluded))]
                if not tests:
                    out.write(f"{mutant} notests 0\n")
                    continue
                while len(self.running) >= self.options.jobs:
                    self.reap_one(out)
                self.learn_killers()
                tests = self.order(mutant, tests)
                pid = os.fork()
                if pid == 0:
                    self.run_in_child(mutant, tests, items)
                self.running[pid] = (mutant, time.time())
            while self.running:
                self.reap_one(out)
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    trace = commands.add_parser("trace", help="record which mutated functions each test reaches")
    trace.add_argument("out")
    check = commands.add_parser("check", help="check mutants in forks of one collected test session")
    check.add_argument("trace")
    check.add_argument("mutants", help="a file naming mutants, one a line, or a glob over mutmut's mutant names")
    check.add_argument("verdicts")
    check.add_argument("--jobs", type=int, default=2)
    check.add_argument("--cap", type=float, default=20.0, help="seconds before an undecided mutant is left as `capped`")
    check.add_argument("--exclude", help="a file of test ids (or prefixes) never to run, one a line")
    check.add_argument("--near-only", action="store_true", help="only the tests of the files near the module")
    options, pytest_args = parser.parse_known_args(argv)
    base = ["-q", "-p", "no:cacheprovider", *pytest_args]
    if options.command == "trace":
        from mutmut.mutation.trampoline import set_mutant_under_test

        set_mutant_under_test("stats")
        recorder = Trace()
        status = pytest.main(base, plugins=[recorder])
        with open(options.out, "w") as out:
            json.dump({"hits": recorder.hits, "duration": recorder.duration, "failed": sorted(recorder.failed)}, out)
        return int(status)
    status = pytest.main(base, plugins=[Check(options)])
    return 0 if status == pytest.ExitCode.NO_TESTS_COLLECTED else int(status)  # the forks ran the tests, not pytest's loop


if __name__ == "__main__":
    sys.exit(main())
