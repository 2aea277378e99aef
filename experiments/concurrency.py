"""Concurrency: 1,000 WebSocket sessions held by one server process.

A thin wrapper over experiments/load.py (same server child process, same harness, same loss
checks) asking: can one process hold N sessions with a per-turn server overhead
p99 under 20 ms and under 100 KB of server memory per session? Unlike load.py's default (every
session starts at once and runs 0.2 s tools, which saturates the server: its overhead is queueing),
sessions here start spread evenly over `--stagger` seconds and their tools take `--tool-seconds`
(default 20 s; the coding preset's tool calls average ~10 s), so the offered load is N / tool
time turns per second: a held-open population, not a stampede.

    python -m experiments.concurrency [--sessions 1000] [--turns 3] [--tool-seconds 20] [--stagger 20]
"""

from __future__ import annotations

from typing import Any

from prototype.cli.common import at_least, non_negative

from . import load
from .common import add_list, experiment_parser, print_table

P99_TARGET_MS = 20.0
KB_TARGET = 100.0


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = experiment_parser(__doc__)
    add_list(parser, "--sessions", at_least(1), [1000], "concurrent sessions")
    parser.add_argument("--turns", type=at_least(1), default=3, help="turns per rollout (default 3)")
    parser.add_argument("--tool-seconds", type=non_negative(float), default=20.0, help="client tool time per call in seconds (default 20)")
    parser.add_argument("--stagger", type=non_negative(float), default=20.0, help="spread the sessions' starts over this many seconds (default 20)")
    add_list(parser, "--designs", str, load.DESIGNS, "WebSocket designs to run", choices=list(load.DESIGNS))
    add_list(parser, "--workers", at_least(1), [1], "server processes (serve --workers), each in turn")
    parser.add_argument("--csv", default="concurrency.csv", help="CSV file name in results/concurrency/<timestamp>/ (default concurrency.csv)")
    args = parser.parse_args(argv)
    rows = load.main([
        "--sessions", *map(str, args.sessions), "--turns", str(args.turns), "--tool-seconds", f"{args.tool_seconds:g}",
        "--stagger", f"{args.stagger:g}", "--designs", *args.designs, "--workers", *map(str, args.workers), "--csv", args.csv,
    ])
    summary = [
        {
            "design": r["design"], "workers": r["workers"], "sessions": r["sessions"], "offered_turns_per_s": r["offered_turns_per_s"], "overhead_p50_ms": r["overhead_p50_ms"], "overhead_p99_ms": r["overhead_p99_ms"],
            "p99_under_20ms": r["overhead_p99_ms"] < P99_TARGET_MS, "kb_per_session": r["kb_per_session"],
            "under_100kb": r["kb_per_session"] < KB_TARGET, "server_cpu_ms_per_turn": r["server_cpu_ms_per_turn"],
            "lost": r["lost"], "duplicated": r["duplicated"],
        }
        for r in rows
    ]
    print(f"\ntargets: overhead p99 < {P99_TARGET_MS:g} ms, memory < {KB_TARGET:g} KB per session")
    print_table(summary)
    return rows


if __name__ == "__main__":
    from experiments.common import run_as_command

    run_as_command(__spec__.name, main)
