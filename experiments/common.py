"""What the experiments share: where results go, a server in a child process, /proc readings. Tables are
prototype/analysis.py's (re-exported here), grids go through prototype/sweep.py.

Each run writes into a new folder results/<experiment>/<timestamp>/, and results/<experiment>/latest
points at the newest, so a run never overwrites an earlier one."""

from __future__ import annotations

import collections
import gc
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import attrs

from prototype.analysis import print_table, write_csv  # noqa: F401 - the experiments' table helpers
from prototype.cli.common import Parser, add_list, new_run_folder, run_command
from prototype.server.collector import FullCollectionPolicy

RESULTS = Path(os.environ.get("TESTBED_RESULTS", Path(__file__).resolve().parent.parent / "results"))


def run_dir(experiment: str) -> Path:
    """A new folder results/<experiment>/<timestamp>/ for this run; results/<experiment>/latest
    points at it."""
    return new_run_folder(RESULTS / experiment)


def latest_dir(experiment: str) -> Path:
    """The newest run's folder of an experiment (for redrawing a figure from its CSV)."""
    return RESULTS / experiment / "latest"


def experiment_parser(doc: str | None) -> Parser:
    """The experiments' argument parser: no abbreviations, one-line errors (prototype/cli/common.py)."""
    script = Path(sys.argv[0])
    prog = f"python -m experiments.{script.stem}" if script.parent.name == "experiments" else None
    return Parser(prog=prog, description=(doc or "").split("\n\n")[0])


def report(rows: Sequence[dict[str, Any]], filename: str, columns: Sequence[str] | None = None) -> Path:
    """Print the table, write it as results/<experiment>/<timestamp>/<filename> (CSV; the
    experiment is the file name's stem), and say where."""
    print_table(rows, columns)
    path = run_dir(Path(filename).stem) / filename
    write_csv(path, rows)
    print(f"wrote {path}")
    return path


# How long `serve` may take to print its address: its imports and engine set-up take a few seconds
# on 2 idle cores, several times that on a loaded machine [ours]; past this the run fails instead
# of waiting for a server that will never come up.
SERVER_START_SECONDS = 120.0
# How long `serve` may take to drain and exit after SIGTERM before it is killed (its drain grace,
# `--drain-seconds`, is 30 s by default) [ours].
SERVER_STOP_SECONDS = 45.0


@attrs.define(eq=False)
class ServerOutput:
    """What a `serve` child printed: read to the end by a thread, so the child never blocks on a full
    pipe (a Linux pipe holds 64 KiB, pipe(7); serve prints an access-log line per response)."""

    lines: int = 0
    """Lines read so far, the address line included."""
    bytes: int = 0
    """Characters read so far."""
    tail: collections.deque = attrs.Factory(lambda: collections.deque(maxlen=20))
    """The last lines, for an error message."""

    def drain(self, stream: IO[str], first_line: queue.Queue) -> None:
        """Thread body: hand the first line over, then read and count the rest until end of file."""
        for line in stream:
            if self.lines == 0:
                first_line.put(line)
            self.lines += 1
            self.bytes += len(line)
            self.tail.append(line)
        if self.lines == 0:
            first_line.put("")  # exited before printing anything


@contextmanager
def server_process(*args: str, output: ServerOutput | None = None) -> Iterator[tuple[subprocess.Popen, int]]:
    """`python -m prototype serve --port 0 ...` in a child process; yields (process, port). Its
    output is read to the end by a thread (into `output`, if given), so a long run never blocks it."""
    output = ServerOutput() if output is None else output
    process = subprocess.Popen(
        [sys.executable, "-m", "prototype", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
    )
    first_line: queue.Queue[str] = queue.Queue(maxsize=1)
    reader = threading.Thread(target=output.drain, args=(process.stdout, first_line), name="serve-stdout", daemon=True)
    reader.start()
    try:
        try:
            line = first_line.get(timeout=SERVER_START_SECONDS)
        except queue.Empty:
            raise RuntimeError(f"server printed nothing in {SERVER_START_SECONDS:g} s") from None
        if not line:  # end of file before the address: the server exited (a worker that failed, a bad option)
            try:
                code = process.wait(timeout=SERVER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            raise RuntimeError(f"server exited (exit code {code}) before it listened; its error output (stderr) says why")
        if "listening on" not in line:
            raise RuntimeError(f"server did not start: {line!r}")
        port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        yield process, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=SERVER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=SERVER_STOP_SECONDS)  # the pipe's end of file: the child has exited


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (/proc/<pid>/task/<tid>/children): a `serve --workers N` server
    and its N workers."""
    pids, index = [pid], 0
    while index < len(pids):
        for task in Path(f"/proc/{pids[index]}/task").iterdir():
            pids += [int(child) for child in (task / "children").read_text().split()]
        index += 1
    return pids


def cpu_seconds(pid: int) -> float:
    """CPU time a process's threads have run, in seconds, at nanosecond resolution (/proc schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def settle_client_process() -> None:
    """In a load generator's client process, once everything it needs is loaded: its full garbage
    collections, which pause every session it runs, are kept as short as the server's
    (prototype/server/collector.py), so the figures measure the server and not the generator."""
    gc.collect()
    gc.freeze()
    FullCollectionPolicy().install()


def raise_fd_limit(wanted: int = 65536) -> int:
    """Raise this process's open-file limit towards `wanted` (at most the hard limit); returns it.
    A thousand sessions need a thousand sockets on each side of loopback; a server started
    afterwards by `server_process` inherits the raised limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (/proc/<pid>/status VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def run_delay_seconds(pid: int) -> float:
    """Time a process's threads spent runnable but waiting for a CPU, in seconds (/proc schedstat,
    second field): how much a busy machine held the process back."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


__all__ = [
    "RESULTS", "Parser", "ServerOutput", "add_list", "cpu_seconds", "experiment_parser", "latest_dir", "new_run_folder", "print_table",
    "raise_fd_limit", "report", "rss_bytes", "run_delay_seconds", "run_dir", "server_process", "write_csv",
]


def run_as_command(module: str, main: Callable[[], Any]) -> None:
    """Run an experiment's `main()` as `python -m <module>`: its output safe from a closed pipe (`| head`) and Ctrl-C
    reported in one line (cli/common.py run_command); exits 0 unless main returns a status."""
    result = run_command(f"python -m {module}", main)
    sys.exit(result if isinstance(result, int) and not isinstance(result, bool) else 0)
