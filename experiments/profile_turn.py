"""Where a turn's real time goes beyond the model: one coding task in real time, split by cause.

The same run as `experiments.efficiency` (task 0 of seed 0 of its preset, tool times x 0.01, loopback,
RTT 0, API stage costs zero, deltas every 50 ms; server and client in this one process), done
twice per design:

1. unprofiled: real time - the virtual-clock limit = the overhead per turn, split into the
   process's CPU time (`time.process_time`), the time it was runnable but waited for a core
   (/proc schedstat: other jobs on the machine) and the rest, time with nothing to run past a
   deadline: timer rounding (epoll's timeout is whole milliseconds, rounded up by CPython) and
   wake-up latency. These overlap (CPU spent while a modeled wait runs costs no time; waiting for
   a core during one does), so they do not add up to the overhead. The median turn's overhead
   (turn plus tool time against the virtual clock's) is less sensitive than the sum to the
   other jobs on a shared machine. `wall` rows: each phase's real time minus its virtual time;
   `network_client` is the turn's time outside the server's phases (the real CPU work of framing,
   parsing, validating, tokenizing and planning; the modeled API stage costs are zero);
2. under cProfile with a CPU-time timer: each function's own CPU time goes to a cause and a side.
   A function in prototype/ has its own cause by module; library and built-in functions (json,
   trio, wsproto, `isinstance`, ...) inherit the cause and the side of their callers in proportion
   to the time each caller spent in them, except the few whose cause is their own (the
   tokenizer's BPE, epoll, socket calls). The shares are applied to the unprofiled CPU time
   (the profiler roughly doubles it).

The table is written to results/profile_turn/<timestamp>/profile_turn.csv.

    python -m experiments.profile_turn [--speeds 1000] [--designs chained suspended] [--top 0]
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prototype import benchmark
from prototype.cli.common import at_least, non_negative, positive

from .common import experiment_parser, report, run_delay_seconds
from .efficiency import bench_config, scaled_tasks

POLICY = "policy+tokenizer"
JSON = "json"
VALIDATION = "validation"
FRAMING = "ws framing"
SOCKET = "socket syscalls"
TRIO = "trio scheduling"
HARNESS = "harness"
SERVER = "server logic"
OTHER = "other"
CAUSES = (POLICY, JSON, VALIDATION, FRAMING, SOCKET, TRIO, HARNESS, SERVER, OTHER)

# (substring of the file name, cause), first match wins; "" = inherit from callers.
_BY_FILE = (
    ("prototype/engine/policy", POLICY), ("prototype/engine/tokenizer", POLICY), ("prototype/api/render", POLICY),
    ("tiktoken", POLICY),
    ("prototype/protocol/codec", JSON), ("/json/", JSON),
    ("prototype/api/checks", VALIDATION), ("prototype/protocol/items", VALIDATION),
    ("wsproto", FRAMING), ("trio_websocket", FRAMING), ("h11", FRAMING),
    ("prototype/clock", TRIO), ("prototype/client/", HARNESS), ("prototype/workload", HARNESS), ("prototype/metrics", SERVER),
    ("prototype/", SERVER),
    ("/trio/", TRIO), ("outcome", TRIO), ("sniffio", TRIO), ("selectors", TRIO),
    ("/attr/", ""), ("/attrs/", ""), ("/enum", ""), ("/typing", ""), ("/abc", ""), ("/contextlib", ""),
    ("/socket.py", SOCKET),
)
# Built-ins (file "~") whose own cause is known by name; other built-ins inherit.
_BY_NAME = (
    ("epoll", TRIO), ("_socket.socket", SOCKET), ("CoreBPE", POLICY), ("_json", JSON), ("json.", JSON),
    ("to_dict", JSON),
)


def own_cause(func: tuple[str, int, str]) -> str:
    filename, _, name = func
    if filename == "~":
        for key, cause in _BY_NAME:
            if key in name:
                return cause
        return ""
    # The wire form of events and responses is JSON work however it is built (to_dict / as_dict).
    if name in ("to_dict", "as_dict", "event_dict") and "prototype/" in filename:
        return JSON
    if "prototype/" in filename and ("parse_" in name or name.startswith("_parse") or name.startswith("check")):
        return VALIDATION
    for key, cause in _BY_FILE:
        if key in filename:
            return cause
    return ""


def own_side(func: tuple[str, int, str]) -> str:
    filename = func[0]
    if "trio/_core/_run.py" in filename or "prototype/benchmark" in filename or "prototype/clock" in filename:
        return "shared"  # the one run loop both sides' tasks take turns on
    if "prototype/client/" in filename or "prototype/workload" in filename:
        return "client"
    if "prototype/" in filename and "prototype/protocol/" not in filename:
        return "server"
    return ""


def inherit(stats: dict, own: dict[Any, str], passes: int = 30) -> dict[Any, dict[str, float]]:
    """Each function's distribution over labels: its own label if it has one, else the mix of its
    callers' distributions weighted by the time spent in it from each caller."""
    dist: dict[Any, dict[str, float]] = {f: ({own[f]: 1.0} if own[f] else {OTHER: 1.0}) for f in stats}
    for _ in range(passes):
        for func, (_, _, _, _, callers) in stats.items():
            if own[func]:
                continue
            mix: dict[str, float] = defaultdict(float)
            total = 0.0
            for caller, entry in callers.items():
                weight = entry[3] if len(entry) > 3 else 0.0  # cumulative time of func under this caller
                if caller == func or weight <= 0:
                    continue
                for label, share in dist.get(caller, {OTHER: 1.0}).items():
                    mix[label] += weight * share
                total += weight
            if total > 0:
                dist[func] = {k: v / total for k, v in mix.items()}
    return dist


def split(profile: cProfile.Profile) -> tuple[dict[tuple[str, str], float], list[tuple[float, str, str, str]]]:
    """CPU seconds by (side, cause), and the functions with the most own time."""
    stats = pstats.Stats(profile).stats
    causes = inherit(stats, {f: own_cause(f) for f in stats})
    sides = inherit(stats, {f: own_side(f) for f in stats})
    out: dict[tuple[str, str], float] = defaultdict(float)
    top = []
    for func, (_, _, tottime, _, _) in stats.items():
        for cause, c_share in causes[func].items():
            for side, s_share in sides[func].items():
                out[(side if side != OTHER else "shared", cause)] += tottime * c_share * s_share
        top.append((tottime, f"{func[0].split('site-packages/')[-1]}:{func[1]}:{func[2]}", max(causes[func], key=causes[func].get), max(sides[func], key=sides[func].get)))
    top.sort(reverse=True)
    return out, top


def phase_totals(records: list) -> dict[str, float]:
    """Seconds per phase over every turn: the server's phases (queue, prefill, decode, ...),
    `network_client` (the rest of each turn's wall time: framing, parsing, the client) and `tool`."""
    totals: dict[str, float] = defaultdict(float)
    for record in records:
        for phases in benchmark.turn_phases(record):
            for phase, seconds in phases.items():
                totals[phase] += seconds
    return totals


def measure(design: str, tps: float, config: benchmark.BenchConfig, top_n: int) -> list[dict[str, Any]]:
    virtual = benchmark.run_design_virtual(design, tps, config)
    limit = sum(r.seconds for r in virtual)
    turns = sum(len(r.turns) for r in virtual)
    pid = os.getpid()
    spent: dict[str, float] = {}

    @contextlib.contextmanager
    def timed() -> Iterator[None]:
        cpu0, wait0 = time.process_time(), run_delay_seconds(pid)
        yield
        spent["cpu"], spent["wait"] = time.process_time() - cpu0, run_delay_seconds(pid) - wait0

    real = benchmark.run_design_real(design, tps, config, measured=timed)
    cpu, wait = spent["cpu"], spent["wait"]
    real_s = sum(r.seconds for r in real)
    overhead = real_s - limit
    phase_excess = phase_totals(real)
    for phase, seconds in phase_totals(virtual).items():
        phase_excess[phase] = phase_excess.get(phase, 0.0) - seconds
    profile = cProfile.Profile(time.process_time)
    benchmark.run_design_real(design, tps, config, measured=lambda: profile)  # a Profile is a context manager that enables it
    by_cause, top = split(profile)
    profiled_cpu = sum(by_cause.values())
    ms = 1000 / turns
    per_turn = sorted(
        (t.ended_at - t.sent_at) - (v.ended_at - v.sent_at) + (t.tool_seconds - v.tool_seconds)
        for r, rv in zip(real, virtual) for t, v in zip(r.turns, rv.turns)
    )
    rows = [{
        "design": design, "tps": tps, "side": "all", "cause": "overhead (real - limit)", "ms_per_turn": overhead * ms,
        "efficiency": limit / real_s,
    }, {
        "design": design, "tps": tps, "side": "all", "cause": "overhead, median turn", "ms_per_turn": 1000 * per_turn[len(per_turn) // 2],
        "efficiency": "",
    }, {
        "design": design, "tps": tps, "side": "all", "cause": "cpu (process)", "ms_per_turn": cpu * ms, "efficiency": "",
    }, {
        "design": design, "tps": tps, "side": "all", "cause": "waiting for a core", "ms_per_turn": wait * ms, "efficiency": "",
    }, {
        "design": design, "tps": tps, "side": "all", "cause": "idle past deadlines (timers, wake-up)",
        "ms_per_turn": (overhead - cpu - wait) * ms, "efficiency": "",
    }]
    for phase, seconds in sorted(phase_excess.items()):
        if abs(seconds) * ms >= 0.005:
            rows.append({"design": design, "tps": tps, "side": "wall", "cause": f"phase {phase}", "ms_per_turn": seconds * ms, "efficiency": ""})
    for side in ("server", "client", "shared"):
        for cause in CAUSES:
            seconds = by_cause.get((side, cause), 0.0)
            if seconds > 0.0005 * profiled_cpu:
                rows.append({
                    "design": design, "tps": tps, "side": side, "cause": cause,
                    "ms_per_turn": seconds / profiled_cpu * cpu * ms, "efficiency": "",
                })
    if top_n:
        print(f"\n{design} at {tps:g} tokens/s: top functions by own CPU (profiled, ms per turn)")
        for tottime, name, cause, side in top[:top_n]:
            print(f"  {tottime * ms:7.3f}  {side:6s} {cause:18s} {name}")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    parser.add_argument("--speeds", type=positive(float), nargs="+", default=[1000.0], help="decode speeds in tokens/s (default 1000)")
    parser.add_argument("--designs", nargs="+", default=[benchmark.CHAINED, benchmark.SUSPENDED], help="designs to profile (default chained suspended)")
    parser.add_argument("--tool-scale", type=non_negative(float), default=0.01, help="multiply every tool time by this (default 0.01)")
    parser.add_argument("--max-turns", type=at_least(1), default=None, help="cut the task to this many turns (default: all)")
    parser.add_argument("--top", type=non_negative(int), default=0, help="also print the N functions with the most own CPU")
    parser.add_argument("--csv", default="profile_turn.csv", help="CSV file name in results/profile_turn/<timestamp>/ (default profile_turn.csv)")
    args = parser.parse_args(argv)
    tasks = scaled_tasks(1, 0, args.tool_scale, args.max_turns)
    config = bench_config(tasks)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    rows = [row for tps in args.speeds for design in args.designs for row in measure(design, tps, config, args.top)]
    report(rows, args.csv)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
